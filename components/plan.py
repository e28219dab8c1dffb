from kfp import dsl

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def plan_tasks(
    model: str, seeds: list, folds: dsl.Input[dsl.Artifact], fold_tasks: bool,
    seeds_together: bool = True, nodes: int = 1, gpus_per_node: int = 1,
) -> list:  # fmt: skip
    """The training tasks of a run, as [{"model", "seed", "seeds", "fold"}] for the pipeline's
    fan-out: every model named in `model` (comma-separated); with `seeds_together` (the
    default) an agent's seeds (dqn, ppo, pqn) are one task that trains them side by side on its
    GPU ("seeds": "0,1,2", foxhunt train --seeds; at most MAX_SEEDS a task), else one task per
    seed ("seeds": ""), as the supervised models always are and a data-parallel task (nodes or
    gpus_per_node above 1) is; with `fold_tasks`, every fold of the folds file a task of its
    own too ("fold": k)."""
    import json

    from foxhunt.train.agents import AGENTS, SUPERVISED
    from foxhunt.train.core import MAX_SEEDS

    models = [m.strip() for m in model.split(",") if m.strip()]
    bad = [m for m in models if m not in AGENTS]
    if bad or not models:
        raise ValueError(f"model {model!r}: name one or more of {', '.join(AGENTS)}, by commas")
    seeds = [int(s) for s in seeds]  # a list parameter's numbers arrive as floats
    ks = [f["fold"] for f in json.loads(open(folds.path).read())["folds"]] if fold_tasks else [-1]
    single = nodes == 1 and gpus_per_node == 1
    out = []
    for m in models:
        if seeds_together and single and m not in SUPERVISED and len(seeds) > 1:
            chunks = [seeds[i : i + MAX_SEEDS] for i in range(0, len(seeds), MAX_SEEDS)]
            groups = [(c[0], ",".join(map(str, c)) if len(c) > 1 else "") for c in chunks]
        else:
            groups = [(s, "") for s in seeds]
        out += [{"model": m, "seed": s, "seeds": g, "fold": k} for s, g in groups for k in ks]
    return out
