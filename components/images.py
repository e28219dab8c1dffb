"""The images components run in (images/Dockerfile.cpu and images/Dockerfile.gpu), named from
REGISTRY and IMAGE_TAG at compile time. One rule everywhere: IMAGE_TAG defaults to the commit
(12 characters), as `make images` tags, `make deploy-infra` names the MLflow image and
`make compile|submit` writes into the pipelines; without git, the package version."""

import os
import subprocess
from pathlib import Path

from foxhunt import __version__


def default_tag() -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=Path(__file__).resolve().parent,
            capture_output=True, text=True, check=True, timeout=10,
        ).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return __version__.replace("+", "-")


REGISTRY = os.environ.get("REGISTRY", "ghcr.io/foxhunt")
TAG = os.environ.get("IMAGE_TAG") or default_tag()
CPU_IMAGE = f"{REGISTRY}/foxhunt-cpu:{TAG}"
GPU_IMAGE = f"{REGISTRY}/foxhunt-gpu:{TAG}"
MLFLOW_IMAGE = f"{REGISTRY}/foxhunt-mlflow:{TAG}"
