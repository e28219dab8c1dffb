"""`foxhunt folds`: the walk-forward folds of one fxcache, written as JSON."""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path

from foxhunt import __version__
from foxhunt.folds.walkforward import (
    FoldError,
    FoldSpec,
    make_folds,
    picture,
    with_difficulty,
)
from foxhunt.fsutil import write_json_atomic
from foxhunt.fxcache import FxCache, is_fxcache, list_caches
from foxhunt.precompute.features import ADX_INDEX

log = logging.getLogger(__name__)


@dataclass
class FoldsConfig:
    """Walk-forward fold index ranges (train/val/test) from an fxcache's timestamps."""

    cache: Path = Path("data/fxcache")
    """Cache root (or one cache directory)."""
    symbol: str = "ES"
    """Root symbol whose cache to use (ignored when --key is given)."""
    key: str | None = None
    """Cache key (default: the only cache of --symbol)."""
    out: Path | None = None
    """Output JSON (default: data/folds/<symbol>.json, where `foxhunt train` looks)."""
    spec: FoldSpec = field(default_factory=FoldSpec)
    """Fold lengths, window and gaps."""


def find_cache(root: Path, symbol: str, key: str | None) -> FxCache:
    if is_fxcache(root):
        return FxCache.open(root)
    if key:
        return FxCache.open(root, key)
    caches = [r for r in list_caches(root) if r["symbol"] == symbol]
    if not caches:
        raise FoldError(f"{root}: no fxcache for symbol {symbol!r}; run `foxhunt precompute`")
    if len(caches) > 1:
        keys = ", ".join(f"{r['key']} ({r['bar_size']})" for r in caches)
        raise FoldError(f"{root}: several caches for {symbol!r}: {keys}; choose one with --key")
    return FxCache.open(root, caches[0]["key"])


def run_folds(cfg: FoldsConfig) -> tuple[Path, dict]:
    cache = find_cache(cfg.cache, cfg.symbol, cfg.key)
    folds, dropped = make_folds(cache.timestamps, cfg.spec)
    folds = with_difficulty(folds, cache.features[:, ADX_INDEX])
    doc = {
        "foxhunt_version": __version__,
        "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "fxcache_key": cache.key,
        "symbol": cache.manifest.get("symbol"),
        "bar_size": cache.manifest.get("bar_size"),
        "rows": len(cache),
        "spec": asdict(cfg.spec)
        | {
            "purge_bars": cfg.spec.purge_bars,
            "embargo_bars": cfg.spec.embargo_bars,
        },
        "folds": [f.as_json() for f in folds],
        "dropped": dropped,
    }
    out = cfg.out or Path("data/folds") / f"{doc['symbol']}.json"
    write_json_atomic(out, doc)
    log.info("%d folds of %s written to %s", len(folds), cache.key, out)
    doc["picture"] = picture(folds, len(cache))
    return out, doc
