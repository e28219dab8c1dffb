"""`foxhunt precompute`: ingested market data -> one fxcache per root symbol.

    ingested Parquet --daily volumes--> roll schedule (front contract and price factor per day)
                     --MBP-10 events, one task per trading day--> per-bar aggregates
                     --concatenate, ratio-adjust, features[42] + ofi[8]--> drop warm-up --> fxcache

Trading days are independent tasks on a process pool (each reads only its front contract's
columns), so every core works even for a single symbol. The cache key digests the ingested
inputs, the parameters and the feature catalogue version; a hit reads nothing but the manifest.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import logging
import multiprocessing as mp
import os
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from foxhunt import __version__
from foxhunt.errors import StepError
from foxhunt.fxcache import FxCache, cache_key, lookup, publish
from foxhunt.precompute import features as F
from foxhunt.precompute.orderflow import (
    OFI_NAMES,
    PRICE_SCALE,
    OrderFlowParams,
    aggregate_bars,
    concat_aggregates,
    ofi_features,
)
from foxhunt.precompute.roll import Schedule, front_schedule
from foxhunt.precompute.source import (
    NS_PER_DAY,
    daily_trades,
    partitions,
    read_events,
    root_contracts,
    to_date,
    trading_date_ns,
)

log = logging.getLogger(__name__)

# Bump when the meaning of any cached value changes (features, OFI, bars, roll rule).
FEATURE_VERSION = f"{F.CATALOGUE_VERSION}.2"  # .2: order-flow columns renamed
_UNITS = {"s": 1_000_000_000, "m": 60_000_000_000, "h": 3_600_000_000_000}


class PrecomputeError(StepError):
    """Precompute stopped; the message says what is missing or wrong."""


def parse_bar_size(text: str) -> int:
    """'30s', '1m', '5m', '1h' -> nanoseconds. Between 1 second and 1 day, dividing the day."""
    m = re.fullmatch(r"\s*(\d+)\s*([smh])\s*", text)
    if not m:
        raise PrecomputeError(f"bar size {text!r}: expected a number and a unit s, m or h (1m)")
    ns = int(m.group(1)) * _UNITS[m.group(2)]
    if not (1_000_000_000 <= ns <= NS_PER_DAY) or NS_PER_DAY % ns:
        raise PrecomputeError(f"bar size {text!r}: must be between 1s and 24h and divide a day")
    return ns


@dataclass
class PrecomputeConfig:
    """Turn ingested market data into the fxcache: bars, features[42], ofi[8], targets, times."""

    data: Path = Path("data/ingested")
    """Ingested dataset (the output of `foxhunt ingest`)."""
    out: Path = Path("data/fxcache")
    """Cache root: one directory per key (the fxcache volume in the cluster)."""
    symbols: tuple[str, ...] = ("ES", "NQ")
    """Root symbols; each gets its own continuous front-month series and cache."""
    bar_size: str = "1m"
    """Time bar length: 30s, 1m, 5m, 1h, ... (a bar closing at t holds events with ts <= t)."""
    workers: int = 0
    """Processes for the per-day work (0: one per CPU core)."""
    orderflow: OrderFlowParams = field(default_factory=OrderFlowParams)
    """Order-flow feature parameters."""

    def __post_init__(self) -> None:
        if self.workers < 0:
            raise ValueError(f"workers = {self.workers}: must not be negative")
        try:
            parse_bar_size(self.bar_size)
        except PrecomputeError as e:
            raise ValueError(str(e)) from None


@dataclass
class SymbolResult:
    symbol: str
    key: str
    hit: bool
    rows: int
    start: str
    end: str
    rolls: list[dict]
    events: int = 0
    seconds: float = 0.0
    path: Path | None = None


@dataclass
class PrecomputeResult:
    out: Path
    symbols: list[SymbolResult]
    seconds: float

    @property
    def events(self) -> int:
        return sum(s.events for s in self.symbols)

    def summary(self) -> str:
        lines = []
        for s in self.symbols:
            rolls = ", ".join(f"{r['date']} {r['from']}->{r['to']}" for r in s.rolls) or "none"
            what = "hit " if s.hit else "miss"
            lines.append(
                f"{s.symbol}: fxcache {what} {s.key}  {s.rows:,} bars {s.start} .. {s.end}; "
                f"rolls: {rolls}"
            )
        computed = [s for s in self.symbols if not s.hit]
        if computed:
            ev = sum(s.events for s in computed)
            rate = ev / self.seconds if self.seconds else 0.0
            bars = sum(s.rows for s in computed)
            lines.append(
                f"computed {len(computed)} cache(s) under {self.out} in {self.seconds:.1f} s: "
                f"{ev:,} MBP-10 events ({rate / 1e6:.2f} M events/s), {bars:,} bars"
            )
        else:
            lines.append(f"all caches present under {self.out}; no work")
        return "\n".join(lines)


def source_digest(data: Path) -> dict:
    """Digest of the ingested dataset from its manifest (content digests of every input file
    and the ingest settings): a rerun of ingest over the same inputs keeps it."""
    mf = data / "manifest.json"
    if not mf.is_file():
        raise PrecomputeError(f"{mf}: not found; run `foxhunt ingest` first")
    m = json.loads(mf.read_text())
    inputs = sorted((i["path"], i["digest"]) for i in m.get("inputs", []))
    blob = json.dumps({"inputs": inputs, "settings": m.get("settings")}, sort_keys=True)
    return {
        "digest": hashlib.sha256(blob.encode()).hexdigest()[:32],
        "files": len(inputs),
        "records": m.get("validation", {}).get("records_written"),
    }


def key_inputs(cfg: PrecomputeConfig, symbol: str, source: dict) -> dict:
    return {
        "source": source["digest"],
        "symbol": symbol,
        "bar_ns": parse_bar_size(cfg.bar_size),
        "orderflow": asdict(cfg.orderflow),
        "feature_version": FEATURE_VERSION,
    }


# ---- pool tasks (module level so that forked workers find them) -----------------------------


def _daily_task(args):
    symbol, files = args
    return symbol, daily_trades(files)


def _day_task(args):
    idx, files, day, bar_ns = args
    ev = read_events(files, day)
    return idx, len(ev), aggregate_bars(ev, bar_ns)


def _map(pool, func, tasks):
    if pool is None:
        return [func(t) for t in tasks]
    return pool.imap_unordered(func, tasks)


def _files_for_day(parts: dict[dt.date, list[Path]], day: int) -> list[Path]:
    """The partitions (UTC dates) that can hold events of trading day `day`: the UTC date
    itself and the one before (a Globex session opens the evening before)."""
    d = to_date(day)
    out = []
    for utc in (d - dt.timedelta(days=1), d):
        for f in parts.get(utc, []):
            if utc < d and not _may_hold(f, day):
                continue
            out.append(f)
    return out


def _may_hold(path: Path, day: int) -> bool:
    """From the Parquet statistics alone: can this file hold events of trading day `day`?"""
    md = pq.ParquetFile(path).metadata
    idx = md.schema.names.index("ts_event")
    hi = []
    for rg in range(md.num_row_groups):
        st = md.row_group(rg).column(idx).statistics
        if st is None or not st.has_min_max:
            return True
        hi.append(st.max_raw)  # the stored int64 nanoseconds
    return not hi or int(trading_date_ns(np.array([max(hi)]))[0]) >= day


def run_precompute(cfg: PrecomputeConfig, progress=None) -> PrecomputeResult:
    t0 = time.perf_counter()
    bar_ns = parse_bar_size(cfg.bar_size)
    source = source_digest(cfg.data)
    results: dict[str, SymbolResult] = {}
    todo: dict[str, str] = {}
    for sym in cfg.symbols:
        key = cache_key(key_inputs(cfg, sym, source))
        cache = lookup(cfg.out, key)
        if cache is not None:
            results[sym] = _result(sym, cache, hit=True)
        else:
            todo[sym] = key
    if todo:
        workers = cfg.workers or os.cpu_count() or 1
        pool = mp.get_context("fork").Pool(workers) if workers > 1 else None
        try:
            for sym, res in _compute(cfg, todo, bar_ns, source, pool, progress):
                results[sym] = res
        finally:
            if pool is not None:
                pool.terminate()
                pool.join()
    return PrecomputeResult(cfg.out, [results[s] for s in cfg.symbols], time.perf_counter() - t0)


def _result(sym: str, cache: FxCache, hit: bool, events: int = 0, seconds: float = 0.0):
    m = cache.manifest
    return SymbolResult(
        sym, cache.key, hit, len(cache), m.get("start", "?"), m.get("end", "?"),
        m.get("rolls", []), events, seconds, cache.path,
    )  # fmt: skip


def _compute(cfg, todo, bar_ns, source, pool, progress):
    t0 = time.perf_counter()
    contracts = {sym: root_contracts(cfg.data, sym) for sym in todo}
    # 1. daily volume and last price per contract -> the roll schedule per root
    tasks = []
    for cs in contracts.values():
        for c in cs:
            schema = "trades" if partitions(cfg.data, "trades", c.symbol) else "mbp-10"
            files = [f for fs in partitions(cfg.data, schema, c.symbol).values() for f in fs]
            if files:
                tasks.append((c.symbol, files))
    daily = dict(_map(pool, _daily_task, tasks))
    schedules: dict[str, Schedule] = {}
    for sym, cs in contracts.items():
        sched = front_schedule(cs, {c.symbol: daily[c.symbol] for c in cs if c.symbol in daily})
        if len(sched.days) < 2:
            raise PrecomputeError(
                f"{cfg.data}: {sym} has {len(sched.days)} trading day(s) with trades; a series "
                "needs at least two (the first one is warm-up)"
            )
        schedules[sym] = sched

    # 2. per trading day: the front contract's events -> per-bar aggregates
    parts = {
        c.symbol: partitions(cfg.data, "mbp-10", c.symbol) for cs in contracts.values() for c in cs
    }
    day_tasks, owner = [], []
    for sym, sched in schedules.items():
        for i, (day, front) in enumerate(zip(sched.days.tolist(), sched.front, strict=True)):
            files = _files_for_day(parts[front], day)
            if files:
                day_tasks.append((len(day_tasks), files, day, bar_ns))
                owner.append((sym, i))
    task = progress.add_task("precompute", total=len(day_tasks)) if progress else None
    per_day: list = [None] * len(day_tasks)
    n_events = dict.fromkeys(schedules, 0)
    for idx, n, agg in _map(pool, _day_task, day_tasks):
        per_day[idx] = agg
        n_events[owner[idx][0]] += n
        if progress:
            progress.advance(task)

    # 3. per root: assemble, features, warm-up, publish
    for sym, sched in schedules.items():
        ts0 = time.perf_counter()
        idx = [k for k, (s, _) in enumerate(owner) if s == sym]
        days = [per_day[k] for k in idx]
        factors = [sched.factor[owner[k][1]] for k in idx]
        arrays, info = assemble(days, factors, cfg.orderflow)
        rolls = [r.as_json() for r in sched.rolls]
        manifest = {
            "foxhunt_version": __version__,
            "catalogue_version": F.CATALOGUE_VERSION,
            "feature_version": FEATURE_VERSION,
            "created": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
            "symbol": sym,
            "bar_size": cfg.bar_size,
            "bar_ns": bar_ns,
            "start": _iso(arrays["timestamps"][0]),
            "end": _iso(arrays["timestamps"][-1]),
            "source": {"path": str(cfg.data), **source},
            "contracts": [c.symbol for c in contracts[sym]],
            "rolls": rolls,
            "roll_rule": "volume switch decided on the previous trading date; ratio adjustment "
            "anchored at the first contract (see foxhunt.precompute.roll)",
            "orderflow": asdict(cfg.orderflow),
            "features": list(F.NAMES),
            "ofi": list(OFI_NAMES),
            "targets": ["open", "high", "low", "close"],
            "mbp10_events": n_events[sym],
            **info,
        }
        key = todo[sym]
        path = publish(cfg.out, key, arrays, manifest)
        cache = FxCache.open(path, check=False)  # just written and checksummed
        log.info("fxcache %s: %s, %d bars, published", key, sym, len(cache))
        yield sym, _result(sym, cache, False, n_events[sym], time.perf_counter() - ts0)
    log.info("precompute took %.1f s", time.perf_counter() - t0)


def _iso(ns: int) -> str:
    return np.datetime64(int(ns), "ns").astype("datetime64[s]").item().isoformat() + "Z"


def assemble(
    days: list[dict[str, np.ndarray]], factors: list[float], params: OrderFlowParams
) -> tuple[dict[str, np.ndarray], dict]:
    """Day aggregates (in order) and their price factors -> the four cache arrays (warm-up
    dropped, everything finite) and facts for the manifest."""
    bars = concat_aggregates(days)
    n = len(bars["ts"])
    fac = np.repeat(np.asarray(factors, np.float64), [len(d["ts"]) for d in days])
    # Bars without a trade take the last close before them (the past only); bars before the
    # first trade are dropped.
    traded = bars["n_trades"] > 0
    if not traded.any():
        raise PrecomputeError("no trades in the data: cannot form bars")
    last = np.maximum.accumulate(np.where(traded, np.arange(n), -1))
    keep = last >= 0
    src = np.maximum(last, 0)  # the bar whose prices a bar shows (itself when it traded)
    scale = fac[src] * PRICE_SCALE  # each price adjusted by the factor of the bar it came from
    px = {
        k: np.where(traded, bars[k], bars["close"][src]).astype(np.float64) * scale
        for k in ("open", "high", "low", "close")
    }
    first = int(np.argmax(keep))
    sl = slice(first, n)
    bars = {k: v[sl] for k, v in bars.items()}
    o, h, lo, c = (px[k][sl] for k in ("open", "high", "low", "close"))
    v = bars["volume"].astype(np.float64)
    day_lens = np.array([len(d["ts"]) for d in days])
    first_day_bars = max(int(day_lens[0]) - first, 0)
    first_day_volume = float(v[:first_day_bars].sum())
    bucket = first_day_volume / params.vpin_buckets_per_day
    feats = F.market_features(o, h, lo, c, v)
    ofi = ofi_features(bars, c, bucket, params)
    # Warm-up: the first trading day (it seeds the roll rule and calibrates VPIN) and, per
    # column, the bars before its lookback is satisfied.
    allv = np.concatenate([feats, ofi], axis=1)
    fin = np.isfinite(allv)
    first_valid = np.where(fin.any(axis=0), fin.argmax(axis=0), len(c))
    warm = max(first_day_bars, int(first_valid.max()))
    if warm >= len(c):
        raise PrecomputeError(
            f"only {len(c)} bars: not enough to fill the warm-up of {warm} bars (the first "
            "trading day, the longest lookback and the VPIN window)"
        )
    bad = np.flatnonzero(~fin[warm:].all(axis=1))
    if len(bad):
        j = warm + int(bad[0])
        cols = np.flatnonzero(~fin[j]).tolist()
        names = [(F.NAMES + OFI_NAMES)[k] for k in cols]
        raise PrecomputeError(f"non-finite {names} at bar {_iso(bars['ts'][j])} after warm-up")
    keep = slice(warm, None)
    arrays = {
        "features": feats[keep].astype(np.float32),
        "ofi": ofi[keep].astype(np.float32),
        "targets": np.stack([o, h, lo, c], axis=1)[keep],
        "timestamps": bars["ts"][keep].astype(np.int64),
    }
    for name in ("features", "ofi"):  # float32 overflow would be inf
        if not np.isfinite(arrays[name]).all():
            raise PrecomputeError(f"{name}: values beyond float32 range")
    info = {
        "warmup_bars": int(warm + first),
        "vpin_bucket_volume": bucket,
        "bars_total": int(n),
    }
    return arrays, info
