from kfp import dsl

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def plan_tasks(model: str, seeds: list) -> list:
    """The training tasks of a run: every model named in `model` (comma-separated) with every
    seed, as [{"model": ..., "seed": ...}] for the pipeline's fan-out."""
    from foxhunt.train.agents import AGENTS

    models = [m.strip() for m in model.split(",") if m.strip()]
    bad = [m for m in models if m not in AGENTS]
    if bad or not models:
        raise ValueError(f"model {model!r}: name one or more of {', '.join(AGENTS)}, by commas")
    return [{"model": m, "seed": int(s)} for m in models for s in seeds]
