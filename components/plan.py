from kfp import dsl

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def plan_tasks(model: str, seeds: list, folds: dsl.Input[dsl.Artifact], fold_tasks: bool) -> list:
    """The training tasks of a run: every model named in `model` (comma-separated) with every
    seed, as [{"model": ..., "seed": ..., "fold": -1}] for the pipeline's fan-out; with
    `fold_tasks`, every fold of the folds file a task of its own too ("fold": k)."""
    import json

    from foxhunt.train.agents import AGENTS

    models = [m.strip() for m in model.split(",") if m.strip()]
    bad = [m for m in models if m not in AGENTS]
    if bad or not models:
        raise ValueError(f"model {model!r}: name one or more of {', '.join(AGENTS)}, by commas")
    ks = [f["fold"] for f in json.loads(open(folds.path).read())["folds"]] if fold_tasks else [-1]
    return [{"model": m, "seed": int(s), "fold": k} for m in models for s in seeds for k in ks]
