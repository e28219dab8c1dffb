from kfp import dsl

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def folds(
    work_dir: str,
    keys: str,
    symbol: str,
    folds_json: dsl.Output[dsl.Artifact],
    train_months: int = 3,
    val_months: int = 1,
    test_months: int = 1,
    step_months: int = 1,
    window: str = "sliding",
    purge: int = -1,
    embargo: int = -1,
):
    """Walk-forward folds of the symbol's cache (keys: precompute's JSON) as a JSON artifact,
    also kept in work_dir/folds. purge/embargo -1: the defaults from the reward horizon."""
    import json
    import shutil
    from pathlib import Path

    from foxhunt.folds import FoldsConfig, FoldSpec, run_folds

    spec = FoldSpec(
        train_months=train_months,
        val_months=val_months,
        test_months=test_months,
        step_months=step_months,
        window=window,
        purge=None if purge < 0 else purge,
        embargo=None if embargo < 0 else embargo,
    )
    key = json.loads(keys)[symbol]
    out = Path(work_dir) / "folds" / f"{symbol}-{key}.json"
    path, doc = run_folds(
        FoldsConfig(cache=Path(work_dir) / "fxcache", key=key, out=out, spec=spec)
    )
    print(doc["picture"])
    shutil.copy(path, folds_json.path)
