"""The cluster side of a task: volumes, resources, GPU scheduling and secrets (kfp-kubernetes).

Names of Secrets and their keys (values never appear in code, YAML or logs):
    foxhunt-databento   api-key -> DATABENTO_API_KEY                        (ingest)
    foxhunt-mlflow      tracking-uri -> MLFLOW_TRACKING_URI, username, password,
                        s3-endpoint, s3-access-key, s3-secret-key           (train, report)
infra/ holds templates of both without values.
"""

from __future__ import annotations

from dataclasses import dataclass

from kfp import kubernetes
from kfp.dsl import PipelineTask

from components import ingest, precompute, scan_raw

RAW_MOUNT = "/data/raw"
WORK_MOUNT = "/data/work"

DATABENTO_SECRET = ("foxhunt-databento", {"api-key": "DATABENTO_API_KEY"})
MLFLOW_SECRET = (
    "foxhunt-mlflow",
    {
        "tracking-uri": "MLFLOW_TRACKING_URI",
        "username": "MLFLOW_TRACKING_USERNAME",
        "password": "MLFLOW_TRACKING_PASSWORD",
        "s3-endpoint": "MLFLOW_S3_ENDPOINT_URL",
        "s3-access-key": "AWS_ACCESS_KEY_ID",
        "s3-secret-key": "AWS_SECRET_ACCESS_KEY",
    },
)


@dataclass(frozen=True)
class Resources:
    cpu: str
    memory: str
    gpu: int = 0


RESOURCES = {
    "scan": Resources("500m", "1G"),
    "ingest": Resources("4", "16G"),
    "precompute": Resources("8", "32G"),
    "folds": Resources("1", "4G"),
    "tracking": Resources("500m", "1G"),
    "train": Resources("8", "64G", gpu=1),
    "report": Resources("1", "4G"),
}


@dataclass(frozen=True)
class Cluster:
    """Cluster settings fixed at compile time (PVC names are run parameters)."""

    gpu_type: str = "nvidia.com/gpu"
    """Accelerator resource of the train task."""
    gpu_product: str = "NVIDIA-H100-80GB-HBM3"
    """Node label nvidia.com/gpu.product the train task is scheduled on ('' for any)."""


def configure(
    task: PipelineTask,
    step: str,
    cluster: Cluster,
    raw_pvc=None,
    work_pvc=None,
    secrets: tuple = (),
) -> PipelineTask:
    r = RESOURCES[step]
    task.set_cpu_request(r.cpu).set_cpu_limit(r.cpu)
    task.set_memory_request(r.memory).set_memory_limit(r.memory)
    if r.gpu:
        task.set_accelerator_type(cluster.gpu_type).set_accelerator_limit(r.gpu)
        kubernetes.add_toleration(
            task, key=cluster.gpu_type, operator="Exists", effect="NoSchedule"
        )
        if cluster.gpu_product:
            kubernetes.add_node_selector(task, "nvidia.com/gpu.product", cluster.gpu_product)
    if raw_pvc is not None:
        kubernetes.mount_pvc(task, pvc_name=raw_pvc, mount_path=RAW_MOUNT)
    if work_pvc is not None:
        kubernetes.mount_pvc(task, pvc_name=work_pvc, mount_path=WORK_MOUNT)
    for name, keys in secrets:
        kubernetes.use_secret_as_env(task, secret_name=name, secret_key_to_env=keys, optional=True)
    return task


def ingest_and_precompute(
    local: bool, cluster: Cluster, raw_dir, work_dir, download_symbols, start, end, symbols,
    bar_size, raw_pvc, fxcache_pvc,
) -> tuple[PipelineTask, PipelineTask]:  # fmt: skip
    """The first steps, as both pipelines run them: a scan of the raw files (never cached), then
    ingest and precompute, cached while the scan's digest and the parameters are the same;
    ingest retried (downloads)."""
    scan = scan_raw(raw_dir=raw_dir)
    scan.set_display_name("Scan raw DBN files").set_caching_options(False)
    ing = ingest(raw_dir=raw_dir, work_dir=work_dir, raw_digest=scan.output,
                 download_symbols=download_symbols, start=start, end=end)  # fmt: skip
    ing.set_display_name("Ingest DBN files").set_caching_options(True)
    ing.set_retry(num_retries=2, backoff_duration="60s")
    pre = precompute(ingested=ing.outputs["Output"], work_dir=work_dir, symbols=symbols,
                     bar_size=bar_size)  # fmt: skip
    pre.set_display_name("Bars, features, order flow -> fxcache").set_caching_options(True)
    if not local:
        configure(scan, "scan", cluster, raw_pvc)
        configure(ing, "ingest", cluster, raw_pvc, fxcache_pvc, (DATABENTO_SECRET,))
        configure(pre, "precompute", cluster, work_pvc=fxcache_pvc)
    return ing, pre
