"""Precompute: ingested market data -> bars, features[42], ofi[8], targets[4] -> the fxcache.

The step (`PrecomputeConfig`, `run_precompute`) is imported on first use: the feature catalogue
(`foxhunt.precompute.features`: names, lookbacks, ADX's column) serves the folds step and the
trainer on the GPU image, which has neither TA-Lib nor databento.
"""

__all__ = [
    "PrecomputeConfig",
    "PrecomputeError",
    "PrecomputeResult",
    "parse_bar_size",
    "run_precompute",
]


def __getattr__(name: str):
    if name in __all__:
        from foxhunt.precompute import core

        return getattr(core, name)
    raise AttributeError(f"module 'foxhunt.precompute' has no attribute {name!r}")
