"""The cluster side of a task: volumes, resources, GPU scheduling and secrets (kfp-kubernetes).

Names of Secrets and their keys (values never appear in code, YAML or logs):
    foxhunt-databento   api-key -> DATABENTO_API_KEY                        (ingest)
    foxhunt-mlflow      tracking-uri -> MLFLOW_TRACKING_URI, username, password,
                        s3-endpoint, s3-access-key, s3-secret-key           (train, report)
infra/ holds templates of both without values.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from kfp import kubernetes
from kfp.dsl import PipelineTask

from components import ingest, precompute, scan_raw
from foxhunt.secrets import DATABENTO_SECRET, MLFLOW_SECRET  # noqa: F401 (the pipelines' too)

RAW_MOUNT = "/data/raw"
WORK_MOUNT = "/data/work"


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
    "train_job": Resources("500m", "1G"),
    "bench": Resources("8", "64G", gpu=1),
    "report": Resources("1", "4G"),
}


# Where the train step may run is a run parameter (a Kubeflow UI rerun can pick other GPU
# nodes): the nodes' labels to select and the taints to tolerate, as JSON. By default any node
# offering the GPU resource, tolerating the usual nvidia.com/gpu taint.
GPU_NODE_SELECTOR: dict = {}
GPU_TOLERATIONS: list = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]

# Steps that run longer than this are stopped (and their retries begin), in seconds.
TIMEOUTS = {
    "scan": 600,
    "ingest": 6 * 3600,
    "precompute": 6 * 3600,
    "folds": 600,
    "tracking": 600,
    "train": 24 * 3600,
    "train_job": 48 * 3600,
    "bench": 4 * 3600,
    "report": 1800,
}


@dataclass(frozen=True)
class Cluster:
    """Cluster settings fixed at compile time (volumes and GPU placement are run parameters).
    `from_env` reads them from the environment `make compile|submit` runs in."""

    gpu_type: str = "nvidia.com/gpu"
    """Accelerator resource of the train task."""
    image_pull_secrets: tuple[str, ...] = ()
    """Secrets (in the pipeline's namespace) to pull the images from a private registry."""
    timeouts: tuple[tuple[str, int], ...] = tuple(TIMEOUTS.items())
    """Seconds each step may run."""
    parallelism: int = 8
    """Training tasks (models x seeds) of a run that run at once."""
    kueue_queue: str = ""
    """Kueue LocalQueue the training pods are labelled for (empty: no label)."""

    @classmethod
    def from_env(cls) -> Cluster:
        """GPU_RESOURCE, IMAGE_PULL_SECRETS (comma-separated), TIMEOUT_<STEP> (seconds, e.g.
        TIMEOUT_TRAIN=172800), PARALLELISM and KUEUE_QUEUE override the defaults."""
        timeouts = {k: int(os.environ.get(f"TIMEOUT_{k.upper()}", v)) for k, v in TIMEOUTS.items()}
        secrets = tuple(x for x in os.environ.get("IMAGE_PULL_SECRETS", "").split(",") if x)
        return cls(
            gpu_type=os.environ.get("GPU_RESOURCE", cls.gpu_type),
            image_pull_secrets=secrets,
            timeouts=tuple(timeouts.items()),
            parallelism=int(os.environ.get("PARALLELISM", cls.parallelism)),
            kueue_queue=os.environ.get("KUEUE_QUEUE", ""),
        )


def configure(
    task: PipelineTask,
    step: str,
    cluster: Cluster,
    raw_pvc=None,
    work_pvc=None,
    secrets: tuple = (),
    gpu_node_selector=None,
    gpu_tolerations=None,
    gpus=None,
) -> PipelineTask:
    """Resources, time-out, pull secrets, volumes and Secrets of a step; GPU steps get the
    accelerator and the node selector and tolerations passed in (run parameters)."""
    r = RESOURCES[step]
    task.set_cpu_request(r.cpu).set_cpu_limit(r.cpu)
    task.set_memory_request(r.memory).set_memory_limit(r.memory)
    kubernetes.set_timeout(task, dict(cluster.timeouts)[step])
    if cluster.image_pull_secrets:
        kubernetes.set_image_pull_secrets(task, list(cluster.image_pull_secrets))
    if r.gpu:
        # GPUs of the step: a run parameter where one is passed (gpus_per_node), else one.
        task.set_accelerator_type(cluster.gpu_type).set_accelerator_limit(gpus or r.gpu)
        if cluster.kueue_queue:  # Kueue admits the GPU pods through this LocalQueue
            kubernetes.add_pod_label(task, "kueue.x-k8s.io/queue-name", cluster.kueue_queue)
        if gpu_node_selector is not None:
            kubernetes.add_node_selector_json(task, gpu_node_selector)
        if gpu_tolerations is not None:
            kubernetes.add_toleration_json(task, gpu_tolerations)
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
    pre = precompute(ingested=ing.outputs["ingested"], work_dir=work_dir, symbols=symbols,
                     bar_size=bar_size)  # fmt: skip
    pre.set_display_name("Bars, features, order flow -> fxcache").set_caching_options(True)
    if not local:
        configure(scan, "scan", cluster, raw_pvc)
        configure(ing, "ingest", cluster, raw_pvc, fxcache_pvc, (DATABENTO_SECRET,))
        configure(pre, "precompute", cluster, work_pvc=fxcache_pvc)
    return ing, pre
