from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs a worker per core: one thread each (and in the processes they start), so
    # that the workers do not fight over the cores.
    os.environ["OMP_NUM_THREADS"] = "1"
    import torch

    torch.set_num_threads(1)

from foxhunt.synth.generate import SynthConfig, generate

REPO = Path(__file__).resolve().parents[1]
SAMPLES = REPO / "tests" / "databento-samples"  # Databento's own test files (its README)


def built_once(tmp_path_factory, name: str, build) -> Path:
    """A folder `build(folder)` fills once per test session: under pytest-xdist the workers share
    it (the first builds it under a file lock, the others wait and reuse it)."""
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        out = tmp_path_factory.mktemp(name)
        build(out)
        return out
    from filelock import FileLock

    out = tmp_path_factory.getbasetemp().parent / name  # the session's folder, above the workers'
    with FileLock(f"{out}.lock"):
        if not (out / ".built").is_file():
            if out.exists():  # a worker that failed half-way
                import shutil

                shutil.rmtree(out)
            out.mkdir()
            build(out)
            (out / ".built").touch()
    return out


@pytest.fixture(scope="session")
def toy_packages(tmp_path_factory) -> dict[str, Path]:
    """foxhunt.train.aot_probe's toy package for the CPU, linked inductor's default way
    ("default") and with its own C++ runtime as foxhunt links a step's ("own"; the machine's
    wrapper, `aot.runtime_linker`), built once for the session, side by side. Tests that
    write beside a package copy it first."""
    import shutil
    from concurrent.futures import ThreadPoolExecutor

    from foxhunt.train import aot, aot_probe

    if not shutil.which("g++"):
        pytest.skip("needs g++")

    def build(out: Path) -> None:
        linker = aot.runtime_linker()
        assert linker, "g++ with a static libstdc++ here"
        with ThreadPoolExecutor(2) as pool:  # each builds in a process of its own
            done = [pool.submit(aot_probe.build, out, "default", "cpu"),
                    pool.submit(aot_probe.build, out, "own", "cpu", linker, True)]  # fmt: skip
        for f in done:
            assert not f.result()[1], f.result()[1]

    out = built_once(tmp_path_factory, "aot-toys", build)
    return {"default": out / "default.pt2", "own": out / "own.pt2"}


@pytest.fixture(scope="session")
def samples() -> Path:
    return SAMPLES


@pytest.fixture(scope="session")
def small_raw(tmp_path_factory) -> Path:
    """Three trading days of ES and NQ across the March 2024 roll, few events per bar."""
    return built_once(
        tmp_path_factory, "raw",
        lambda out: generate(
            SynthConfig(out=out, start=dt.date(2024, 3, 6), end=dt.date(2024, 3, 9),
                        events_per_bar=8),
            workers=1,
        ),
    )  # fmt: skip


@pytest.fixture(scope="session")
def demo_es(tmp_path_factory) -> tuple[Path, Path]:
    """The demo set's ES (6 months, planted signal): fxcache root and folds file."""
    from foxhunt.folds import FoldsConfig, run_folds
    from foxhunt.ingest.core import IngestConfig, run_ingest
    from foxhunt.precompute import PrecomputeConfig, run_precompute

    def build(root: Path) -> None:
        generate(SynthConfig(out=root / "raw", symbols=("ES",)), workers=2)
        run_ingest(IngestConfig(raw=root / "raw", out=root / "ingested"))
        run_precompute(
            PrecomputeConfig(data=root / "ingested", out=root / "fxcache", symbols=("ES",))
        )
        run_folds(FoldsConfig(cache=root / "fxcache", symbol="ES", out=root / "ES.json"))

    root = built_once(tmp_path_factory, "demo", build)
    return root / "fxcache", root / "ES.json"
