"""KFP pipelines: `train-baseline` (ingest -> precompute -> folds -> train per seed -> report)
and `precompute-features` (ingest -> precompute). Each has one builder with a platform switch:
"cluster" adds the Kubernetes config (volumes, GPU, resources, secrets), "local" leaves out what
KFP's local runner cannot run."""

from pipelines.precompute_features import build_precompute_features
from pipelines.train_baseline import build_train_baseline

PIPELINES = {
    "train-baseline": build_train_baseline,
    "precompute-features": build_precompute_features,
}

__all__ = ["PIPELINES", "build_precompute_features", "build_train_baseline"]
