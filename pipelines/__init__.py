"""KFP pipelines: `train-baseline` (ingest -> precompute -> folds -> train per seed -> report),
`precompute-features` (ingest -> precompute) and `gpu-benchmark` (foxhunt bench on a GPU node).
Each has one builder with a platform switch: "cluster" adds the Kubernetes config (volumes, GPU,
resources, secrets), "local" leaves out what KFP's local runner cannot run."""

from pipelines.gpu_benchmark import build_gpu_benchmark
from pipelines.precompute_features import build_precompute_features
from pipelines.train_baseline import build_train_baseline

PIPELINES = {
    "train-baseline": build_train_baseline,
    "precompute-features": build_precompute_features,
    "gpu-benchmark": build_gpu_benchmark,
}

__all__ = ["PIPELINES", "build_gpu_benchmark", "build_precompute_features", "build_train_baseline"]
