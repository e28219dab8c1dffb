from kfp import dsl

from components.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def train(
    work_dir: str,
    folds: dsl.Input[dsl.Artifact],
    results: dsl.Output[dsl.Artifact],
    metrics: dsl.Output[dsl.Metrics],
    best_model: dsl.Output[dsl.Model],
    model: str = "dqn",
    seed: int = 0,
    epochs: int = 10,
    kfp_run_id: str = "",
    lr: float = 0.0,
    gamma: float = -1.0,
    n_step: int = 0,
    batch_size: int = 0,
    envs: int = 0,
    fee_bps: float = 0.1,
    half_spread_bps: float = 0.25,
    overrides: str = "{}",
):
    """One training task: every fold of the folds artifact, one upload, one model (an agent:
    dqn, ppo, pqn; a supervised model: tlob, cfc, mamba2, tft; or their ensemble) and seed.
    `best_model` is the task's best fold's checkpoint (weights, normaliser, config; also an
    MLflow model, its URI in the metadata), `results` its per-fold results.
    lr 0, gamma -1, n_step 0: the model's own default; batch_size/envs 0: sized for the device;
    each applies to the models that have it (n_step and batch_size: dqn). overrides: JSON of
    further fields per config, e.g. {"dqn": {"hidden": [128, 128]}, "ppo": {"ent_coef": 0.02},
    "env": {"episode_bars": 512}, "train": {"eval_segments": 16}}; only the chosen model's
    section is used."""
    import dataclasses
    import json
    import math
    import shutil
    from pathlib import Path

    from foxhunt.train import EnvConfig, TrainConfig, run_train
    from foxhunt.train.agents import AGENTS
    from foxhunt.train.tracking import find_pipeline_run, require_tracking_uri

    require_tracking_uri()
    # The pipeline's MLflow parent run (start_tracking ran before this task), found by the KFP
    # run id: kfp.local hands a task output passed into a ParallelFor the loop item instead.
    parent_run_id = find_pipeline_run("foxhunt", kfp_run_id)

    extra = json.loads(overrides or "{}")
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {
        "folds", "cache", "out", "env", *AGENTS,
    }  # fmt: skip
    if model not in AGENTS:
        raise ValueError(f"model {model!r}: choose one of {', '.join(AGENTS)}")
    config_cls = AGENTS[model].load()[0]
    own = {f.name for f in dataclasses.fields(config_cls)}
    given = {
        "lr": lr if lr > 0 else None,
        "gamma": gamma if gamma >= 0 else None,
        "n_step": n_step or None,
        "batch_size": batch_size or None,
        "envs": envs or None,
    }
    agent = {k: v for k, v in given.items() if v is not None and k in own}
    agent |= extra.get(model, {})
    agent = {k: tuple(v) if isinstance(v, list) else v for k, v in agent.items()}
    env = {"fee_bps": fee_bps, "half_spread_bps": half_spread_bps, **extra.get("env", {})}
    cfg = TrainConfig(
        folds=Path(folds.path),
        cache=Path(work_dir) / "fxcache",
        model=model,
        epochs=epochs,
        seed=seed,
        out=Path(work_dir) / "runs",
        # A retry of this task (same KFP run) resumes; a new pipeline run trains afresh.
        run_id=kfp_run_id,
        tracking="mlflow",
        tags={
            **({"kfp_run_id": kfp_run_id} if kfp_run_id else {}),
            **({"mlflow.parentRunId": parent_run_id} if parent_run_id else {}),
        },
        **{model: config_cls(**agent)},
        env=EnvConfig(**env),
        **{k: v for k, v in extra.get("train", {}).items() if k in fields},
    )
    res = run_train(cfg)
    print(res.summary())
    shutil.copy(res.run_dir / "results.json", results.path)
    best = max(res.folds, key=lambda f: f["val"]["sharpe"])
    Path(best_model.path).mkdir(parents=True, exist_ok=True)
    for name in ("best.safetensors", "best.json"):
        shutil.copy(res.run_dir / f"fold-{best['fold']}" / name, Path(best_model.path) / name)
    best_model.metadata.update(
        fold=best["fold"], seed=seed, val_sharpe=best["val"]["sharpe"],
        test_sharpe=best["test"]["sharpe"], mlflow_model_uri=best.get("model_uri") or "",
        run_dir=str(res.run_dir),
    )  # fmt: skip
    flat = {k: v for k, v in res.aggregate.items() if k != "baselines_test_sharpe"}
    flat |= {f"baseline_{k}_test_sharpe": v
             for k, v in res.aggregate.get("baselines_test_sharpe", {}).items()}  # fmt: skip
    for k, v in flat.items():
        if math.isfinite(v):  # KFP's metrics JSON takes numbers only (no inf profit factor)
            metrics.log_metric(k, v)
