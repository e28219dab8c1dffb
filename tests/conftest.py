from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest

from foxhunt.synth.generate import SynthConfig, generate

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("FOXHUNT_SHARED", REPO.parent / "shared"))
SAMPLES = SHARED / "data" / "databento-samples"


@pytest.fixture(scope="session")
def samples() -> Path:
    if not SAMPLES.is_dir():
        pytest.skip(f"Databento samples not found at {SAMPLES} (set FOXHUNT_SHARED)")
    return SAMPLES


@pytest.fixture(scope="session")
def small_raw(tmp_path_factory) -> Path:
    """Three trading days of ES and NQ across the March 2024 roll, few events per bar."""
    out = tmp_path_factory.mktemp("raw")
    generate(
        SynthConfig(out=out, start=dt.date(2024, 3, 6), end=dt.date(2024, 3, 9), events_per_bar=8),
        workers=1,
    )
    return out


@pytest.fixture(scope="session")
def demo_es(tmp_path_factory) -> tuple[Path, Path]:
    """The demo set's ES (6 months, planted signal): fxcache root and folds file."""
    from foxhunt.folds import FoldsConfig, run_folds
    from foxhunt.ingest.core import IngestConfig, run_ingest
    from foxhunt.precompute import PrecomputeConfig, run_precompute

    root = tmp_path_factory.mktemp("demo")
    generate(SynthConfig(out=root / "raw", symbols=("ES",)), workers=2)
    run_ingest(IngestConfig(raw=root / "raw", out=root / "ingested"))
    run_precompute(PrecomputeConfig(data=root / "ingested", out=root / "fxcache", symbols=("ES",)))
    folds, _ = run_folds(FoldsConfig(cache=root / "fxcache", symbol="ES", out=root / "ES.json"))
    return root / "fxcache", folds
