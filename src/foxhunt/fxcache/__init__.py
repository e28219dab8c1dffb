"""The fxcache: precomputed features, order flow, targets and timestamps, memory-mapped."""

from foxhunt.fxcache.store import (
    FxCache,
    FxCacheError,
    cache_key,
    check_structure,
    get_or_compute,
    is_fxcache,
    list_caches,
    lookup,
    publish,
    verify,
)

__all__ = [
    "FxCache",
    "FxCacheError",
    "cache_key",
    "check_structure",
    "get_or_compute",
    "is_fxcache",
    "list_caches",
    "lookup",
    "publish",
    "verify",
]
