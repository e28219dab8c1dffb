from kfp import dsl

from components.images import CPU_IMAGE, GPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def train_job(
    work_dir: str,
    folds: dsl.Input[dsl.Artifact],
    results: dsl.Output[dsl.Artifact],
    metrics: dsl.Output[dsl.Metrics],
    best_model: dsl.Output[dsl.Model],
    nodes: int,
    gpus_per_node: int,
    fxcache_pvc: str,
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
    gpu_node_selector: dict = {},  # noqa: B006 (KFP reads the default)
    gpu_tolerations: list = [],  # noqa: B006
    gpu_image: str = GPU_IMAGE,
    gpu_resource: str = "nvidia.com/gpu",
    runtime: str = "foxhunt-torch",
    kueue_queue: str = "",
):
    """One training task on `nodes` nodes of `gpus_per_node` GPUs: a Kubeflow Trainer v2
    TrainJob (foxhunt.train.trainjob) submitted from this CPU pod and followed to its end; the
    step fails with the job's reason when the job fails. The outputs are the train step's."""
    import json
    from pathlib import Path

    from foxhunt.fsutil import write_text_atomic
    from foxhunt.train import trainjob
    from foxhunt.train.task import task_config, write_outputs
    from foxhunt.train.tracking import find_pipeline_run, require_tracking_uri

    require_tracking_uri()
    cfg = task_config(
        work_dir=work_dir, folds_path=folds.path, model=model, seed=seed, epochs=epochs,
        kfp_run_id=kfp_run_id, lr=lr, gamma=gamma, n_step=n_step, batch_size=batch_size,
        envs=envs, fee_bps=fee_bps, half_spread_bps=half_spread_bps, overrides=overrides,
        gpus=gpus_per_node, parent_run_id=find_pipeline_run("foxhunt", kfp_run_id), fold=fold,
    )  # fmt: skip
    # The folds file lives in this step's artifact store: the nodes read a copy on the volume.
    jobs = Path(work_dir) / "runs" / (kfp_run_id or "local") / "trainjobs"
    jobs.mkdir(parents=True, exist_ok=True)
    tag = f"{model}-seed{seed}" + (f"-fold{fold}" if fold >= 0 else "")
    write_text_atomic(jobs / f"{tag}-folds.json", Path(folds.path).read_text())
    cfg.folds = jobs / f"{tag}-folds.json"
    write_text_atomic(jobs / f"{tag}.json", trainjob.config_to_json(cfg))
    name = f"foxhunt-{(kfp_run_id or 'local')[:20]}-{tag}".lower().replace("_", "-")[:63]
    job = trainjob.manifest(
        name=name, namespace=trainjob.pod_namespace(), image=gpu_image,
        config_path=str(jobs / f"{tag}.json"), nodes=nodes, gpus_per_node=gpus_per_node,
        fxcache_pvc=fxcache_pvc, gpu_resource=gpu_resource,
        node_selector=gpu_node_selector, tolerations=gpu_tolerations,
        labels={"foxhunt.io/kfp-run-id": (kfp_run_id or "local")[:63]}
        | ({"kueue.x-k8s.io/queue-name": kueue_queue} if kueue_queue else {}),
        runtime=runtime,
    )  # fmt: skip
    trainjob.run(trainjob.in_cluster_api(), job)
    run_dir = next(p.parent for p in (Path(work_dir) / "runs" / cfg.run_id).glob(
        f"*-{model}-seed{seed}-*/results.json"))  # fmt: skip
    print(json.loads((run_dir / "results.json").read_text())["aggregate"])
    write_outputs([(seed, run_dir)], results.path, best_model, metrics)
