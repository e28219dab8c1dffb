"""Precompute: ingested market data -> bars, features[42], ofi[8], targets[4] -> the fxcache."""

from foxhunt.precompute.core import (
    PrecomputeConfig,
    PrecomputeError,
    PrecomputeResult,
    parse_bar_size,
    run_precompute,
)

__all__ = [
    "PrecomputeConfig",
    "PrecomputeError",
    "PrecomputeResult",
    "parse_bar_size",
    "run_precompute",
]
