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
    fold: int = -1,
    gpus: int = 1,
    seeds: str = "",
):
    """One training task on this pod's GPUs: every fold of the folds artifact, one upload, one
    model (an agent: dqn, ppo, pqn; a supervised model: tlob, cfc, mamba2, tft; or their
    ensemble) and seed; with gpus > 1, data-parallel through torchrun's launcher.
    `best_model` is the task's best fold's checkpoint (weights, normaliser, config; also an
    MLflow model, its URI in the metadata), `results` its per-fold results. `seeds` ("0,1,2"):
    several seeds trained side by side on this pod's GPU instead of `seed` alone (foxhunt train
    --seeds), each its own task's results, checkpoints and MLflow runs. The parameters:
    foxhunt.train.task.task_config."""
    import dataclasses

    from foxhunt.train import distributed, run_train, train_seeds
    from foxhunt.train.task import task_config, write_outputs
    from foxhunt.train.tracking import find_pipeline_run, require_tracking_uri

    require_tracking_uri()
    # The pipeline's MLflow parent run (start_tracking ran before this task), found by the KFP
    # run id: kfp.local hands a task output passed into a ParallelFor the loop item instead.
    cfg = task_config(
        work_dir=work_dir, folds_path=folds.path, model=model, seed=seed, epochs=epochs,
        kfp_run_id=kfp_run_id, lr=lr, gamma=gamma, n_step=n_step, batch_size=batch_size,
        envs=envs, fee_bps=fee_bps, half_spread_bps=half_spread_bps, overrides=overrides,
        gpus=gpus, parent_run_id=find_pipeline_run("foxhunt", kfp_run_id), fold=fold,
    )  # fmt: skip
    together = [int(s) for s in seeds.split(",") if s.strip()]
    if together:
        done = train_seeds(dataclasses.replace(cfg, seeds=tuple(together)))
    else:
        done = [distributed.run_ranks(cfg) if gpus > 1 else run_train(cfg)]
    tasks = list(zip(together or [seed], done, strict=True))
    for s, res in tasks:
        print(f"seed {s}:\n{res.summary()}")
    write_outputs([(s, res.run_dir) for s, res in tasks], results.path, best_model, metrics)
