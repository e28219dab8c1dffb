"""gpu-benchmark: `foxhunt bench` on a GPU node, its report in the Kubeflow UI and MLflow."""

from typing import Literal

from kfp import dsl

from components.bench import bench
from pipelines.platform import (
    GPU_NODE_SELECTOR,
    GPU_TOLERATIONS,
    MLFLOW_SECRET,
    WORK_MOUNT,
    Cluster,
    configure,
)


def build_gpu_benchmark(
    platform: Literal["cluster", "local"] = "cluster", cluster: Cluster | None = None
):
    local = platform == "local"
    cluster = cluster or Cluster.from_env()

    @dsl.pipeline(
        name="gpu-benchmark",
        description="Training speed, memory and stability of every model on a GPU node, with "
        "confidence intervals, and what they mean for a training plan",
    )
    def gpu_benchmark(
        models: str = "dqn,ppo,pqn,tlob,cfc,mamba2,tft",
        epochs: int = 10,
        repeats: int = 3,
        sets: str = "",
        fxcache_key: str = "",
        baseline: str = "",
        find_batch: bool = False,
        plan_folds: int = 12,
        plan_epochs: int = 50,
        plan_seeds: int = 3,
        deadline_hours: float = 24.0,
        cloud_usd_per_gpu_hour: float = 3.5,
        work_dir: str = "data" if local else WORK_MOUNT,
        fxcache_pvc: str = "foxhunt-fxcache",
        gpu_node_selector: dict = GPU_NODE_SELECTOR,
        gpu_tolerations: list = GPU_TOLERATIONS,
    ):
        b = bench(
            work_dir=work_dir, models=models, epochs=epochs, repeats=repeats, sets=sets,
            fxcache_key=fxcache_key, baseline=baseline, find_batch=find_batch,
            plan_folds=plan_folds, plan_epochs=plan_epochs, plan_seeds=plan_seeds,
            deadline_hours=deadline_hours,
            cloud_usd_per_gpu_hour=cloud_usd_per_gpu_hour,
            kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        )  # fmt: skip
        b.set_display_name("Benchmark every model").set_caching_options(False)
        if not local:
            configure(
                b, "bench", cluster, work_pvc=fxcache_pvc, secrets=(MLFLOW_SECRET,),
                gpu_node_selector=gpu_node_selector, gpu_tolerations=gpu_tolerations,
            )  # fmt: skip

    return gpu_benchmark
