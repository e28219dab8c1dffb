"""The images components run in (images/Dockerfile.cpu and images/Dockerfile.gpu), named from
REGISTRY and IMAGE_TAG at compile time (`make images` pushes them under the same names)."""

import os

from foxhunt import __version__

REGISTRY = os.environ.get("REGISTRY", "ghcr.io/foxhunt")
TAG = os.environ.get("IMAGE_TAG", __version__.replace("+", "-"))
CPU_IMAGE = f"{REGISTRY}/foxhunt-cpu:{TAG}"
GPU_IMAGE = f"{REGISTRY}/foxhunt-gpu:{TAG}"
