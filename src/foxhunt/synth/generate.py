"""`foxhunt synth`: write the demo market as genuine DBN files.

Layout of the output, one file per root, trading day and schema, as a Databento Historical
download split by day would be:

    <out>/GLBX.MDP3/<ROOT>/glbx-mdp3-<YYYYMMDD>.<schema>.dbn.zst
    <out>/GLBX.MDP3/synth.json          what was generated, with which parameters

Each file's metadata maps the raw contract symbols (ESH4, ESM4 during a roll) to their
instrument ids, as a `stype_in=raw_symbol` request does.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import multiprocessing as mp
import os
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

import databento_dbn as dbn
import numpy as np

from foxhunt import __version__
from foxhunt.dbn.io import encode_metadata, write_dbn
from foxhunt.errors import StepError
from foxhunt.fsutil import check_output_dir, manifest_has, publish_dir, staging_dir
from foxhunt.synth.contracts import ROOTS, Contract, front_and_next, trading_days
from foxhunt.synth.market import (
    NS_PER_MIN,
    MarketParams,
    bar_path,
    day_records,
    noise_loading,
    ohlcv_from_trades,
    quarter_index,
    trades_from_mbp,
)

log = logging.getLogger(__name__)

DATASET = "GLBX.MDP3"
ALL_SCHEMAS = ("mbp-10", "trades", "ohlcv-1m", "definition")
NS_PER_DAY = 86_400_000_000_000


class SynthError(StepError, ValueError):
    """Synth cannot make the data asked for; the message says why."""


@dataclass
class SynthConfig:
    """Generate demo CME futures market data as DBN files."""

    out: Path = Path("data/raw")
    """Directory to write into (the raw-data volume in the cluster)."""
    symbols: tuple[str, ...] = ("ES", "NQ")
    """Root symbols to generate; known: ES, NQ."""
    start: dt.date = dt.date(2024, 1, 2)
    """First trading day (inclusive)."""
    end: dt.date = dt.date(2024, 7, 1)
    """Last day (exclusive)."""
    seed: int = 7
    """Random seed: the same seed and parameters give byte-identical files."""
    session: Literal["rth", "eth"] = "rth"
    """Trading session per day: 'rth' 08:30-15:00 Central (390 bars), 'eth' 23 hours."""
    events_per_bar: float = 40.0
    """Mean MBP-10 book events per 1-minute bar, before price moves."""
    signal: float = 0.05
    """Planted signal (rho): loading of the next bar's return on a bar's order-flow pressure."""
    impact: float = 0.1
    """Price impact of a bar's pressure on its own return (kappa): order-flow imbalance (OFI)
    moves with the price, so it carries the pressure and, through it, the next bars' returns."""
    persistence: float = 0.9
    """Autocorrelation of the pressure from bar to bar (phi): how long the planted edge lasts
    (half-life ln 0.5 / ln phi bars; 6.6 at 0.9). foxhunt.synth.market has the model."""
    flow: float = 1.0
    """How strongly the pressure shows in the bar's own trades (aggressor side)."""
    roll_days: int = 8
    """Trading days before expiry during which both the expiring and next contract trade."""
    schemas: tuple[str, ...] = ALL_SCHEMAS
    """Schemas to write: mbp-10, trades, ohlcv-1m, definition."""
    compress: bool = True
    """Write .dbn.zst (zstd level 1) rather than plain .dbn."""
    force: bool = False
    """Regenerate even if the output already holds this exact data set."""

    def __post_init__(self) -> None:
        unknown = set(self.symbols) - set(ROOTS)
        if unknown:
            raise ValueError(f"unknown root symbol(s) {sorted(unknown)}; known: {sorted(ROOTS)}")
        bad = set(self.schemas) - set(ALL_SCHEMAS)
        if bad:
            raise ValueError(f"unknown schema(s) {sorted(bad)}; synth writes {ALL_SCHEMAS}")
        if self.end <= self.start:
            raise ValueError(f"end {self.end} must be after start {self.start}")
        if not 0.0 <= self.persistence < 1.0:
            raise ValueError(f"persistence = {self.persistence}: must be in [0, 1)")
        noise_loading(self.impact, self.signal, self.persistence)  # raises when out of range

    def params(self) -> MarketParams:
        return MarketParams(
            events_per_bar=self.events_per_bar,
            signal=self.signal,
            impact=self.impact,
            persistence=self.persistence,
            flow=self.flow,
            roll_days=self.roll_days,
            session=self.session,
        )

    def identity(self) -> dict:
        d = asdict(self)
        for k in ("out", "force"):
            d.pop(k)
        d["start"], d["end"] = str(self.start), str(self.end)
        d["symbols"], d["schemas"] = list(self.symbols), list(self.schemas)
        return d


@dataclass
class SynthResult:
    out: Path
    files: int = 0
    mbp10_records: int = 0
    bytes_written: int = 0
    seconds: float = 0.0
    skipped: bool = False
    per_schema: dict[str, int] = field(default_factory=dict)


def file_name(root: str, day: dt.date, schema: str, compress: bool) -> str:
    ext = ".dbn.zst" if compress else ".dbn"
    return f"{root}/glbx-mdp3-{day:%Y%m%d}.{schema}{ext}"


def definition_records(
    contracts: list[Contract], day: dt.date, tick: float, multiplier: float
) -> bytes:
    ts = int(dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC).timestamp()) * 1_000_000_000
    out = []
    for c in contracts:
        msg = dbn.InstrumentDefMsg(
            publisher_id=1,
            instrument_id=c.instrument_id,
            ts_event=ts,
            ts_recv=ts,
            min_price_increment=round(tick * dbn.FIXED_PRICE_SCALE),
            display_factor=dbn.FIXED_PRICE_SCALE,
            raw_symbol=c.symbol,
            asset=c.root,
            security_type="FUT",
            instrument_class=dbn.InstrumentClass.FUTURE,
            security_update_action=dbn.SecurityUpdateAction.ADD,
            expiration=c.expiry_ns,
            activation=ts - 400 * NS_PER_DAY,
            unit_of_measure_qty=round(multiplier * dbn.FIXED_PRICE_SCALE),
            currency="USD",
            exchange="XCME",
            group=c.root,
            cfi="FFIXSX",
            unit_of_measure="IPNT",
        )
        b = bytes(msg)
        out.append(b[: msg.record_size()] if hasattr(msg, "record_size") else b)
    return b"".join(out)


def _write_day(cfg: SynthConfig, stage: Path, root: str, day_idx: int) -> dict[str, int]:
    """Generate and write one root's files for one day; returns records and bytes per schema."""
    spec = ROOTS[root]
    path = _PATHS[root]
    day = path.days[day_idx]
    base_q = quarter_index(front_and_next(root, path.days[0])[0])
    dr = day_records(spec, path, day_idx, cfg.params(), cfg.seed, base_q)
    symbols = {c.symbol: c.instrument_id for c in dr.contracts}
    t0 = int(dt.datetime.combine(day, dt.time(), tzinfo=dt.UTC).timestamp()) * 10**9
    meta_args = (t0, t0 + NS_PER_DAY, symbols, day, day + dt.timedelta(days=1))
    payloads: dict[str, np.ndarray | bytes] = {}
    if "mbp-10" in cfg.schemas:
        payloads["mbp-10"] = dr.mbp10
    if "trades" in cfg.schemas or "ohlcv-1m" in cfg.schemas:
        trades = trades_from_mbp(dr.mbp10)
        if "trades" in cfg.schemas:
            payloads["trades"] = trades
        if "ohlcv-1m" in cfg.schemas:
            payloads["ohlcv-1m"] = ohlcv_from_trades(trades, NS_PER_MIN)
    if "definition" in cfg.schemas:
        payloads["definition"] = definition_records(dr.contracts, day, spec.tick, spec.multiplier)
    counts: dict[str, int] = {"bytes": 0, "files": 0}
    for schema, recs in payloads.items():
        meta = encode_metadata(DATASET, schema, *meta_args)
        counts["bytes"] += write_dbn(stage / file_name(root, day, schema, cfg.compress), meta, recs)
        counts["files"] += 1
        counts[schema] = len(recs) if isinstance(recs, np.ndarray) else len(dr.contracts)
    return counts


# Bar paths of the roots being generated, set before the worker processes fork.
_PATHS: dict = {}


def generate(cfg: SynthConfig, workers: int | None = None, progress=None) -> SynthResult:
    """Write the demo data set; skip when `out` already holds the same one.

    Days are independent once each root's bar path is drawn, so they are generated by a pool
    of `workers` processes (default: one per core); the files are the same for any count.
    """
    root_dir = cfg.out / DATASET
    marker = root_dir / "synth.json"
    res = SynthResult(out=root_dir)
    check_output_dir(
        root_dir,
        what="foxhunt synth",
        owned=lambda d: manifest_has(d / "synth.json", ("config", "planted_signal")),
    )
    if not cfg.force and marker.exists():
        try:
            if json.loads(marker.read_text()).get("config") == cfg.identity():
                res.skipped = True
                return res
        except (json.JSONDecodeError, OSError):
            pass  # unreadable marker: regenerate
    t_start = time.perf_counter()
    days = trading_days(cfg.start, cfg.end)
    if not days:
        raise SynthError(f"no trading days in [{cfg.start}, {cfg.end}): choose --start/--end")
    # Everything goes to a staging directory that replaces the old data set at the end, so an
    # interrupted run leaves the previous data intact and no files of another config linger.
    stage = staging_dir(root_dir)
    try:
        for root in cfg.symbols:
            _PATHS[root] = bar_path(ROOTS[root], days, cfg.params(), cfg.seed)
        jobs = [(root, i) for root in cfg.symbols for i in range(len(days))]
        task = progress.add_task("synth", total=len(jobs)) if progress else None
        workers = workers or os.cpu_count() or 1
        totals: dict[str, int] = {}

        def add(counts: dict[str, int]) -> None:
            for k, v in counts.items():
                totals[k] = totals.get(k, 0) + v
            if progress:
                progress.advance(task)

        if workers == 1:
            for root, i in jobs:
                add(_write_day(cfg, stage, root, i))
        else:
            ctx = mp.get_context("fork")  # workers inherit _PATHS
            with ctx.Pool(workers) as pool:
                for counts in pool.imap_unordered(
                    _write_day_star, [(cfg, stage, r, i) for r, i in jobs]
                ):
                    add(counts)
        res.files = totals.pop("files", 0)
        res.bytes_written = totals.pop("bytes", 0)
        res.per_schema = totals
        res.mbp10_records = totals.get("mbp-10", 0)
        res.seconds = time.perf_counter() - t_start
        (stage / "synth.json").write_text(
            json.dumps(
                {
                    "config": cfg.identity(),
                    "foxhunt_version": __version__,
                    "files": res.files,
                    "records": res.per_schema,
                    "planted_signal": {
                        "rho": cfg.signal,
                        "kappa": cfg.impact,
                        "phi": cfg.persistence,
                        "meaning": "pressure s[t] = phi * s[t-1] + sqrt(1 - phi^2) * noise; "
                        "return r[t] = sigma * (kappa * s[t] + rho * s[t-1] + c * noise), so "
                        "E[r[t+k] | s[t]] = sigma * (kappa * phi^k + rho * phi^(k-1)) * s[t] "
                        "(foxhunt.synth.market)",
                    },
                },
                indent=2,
            )
        )
        publish_dir(stage, root_dir)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    finally:
        _PATHS.clear()
    return res


def _write_day_star(args) -> dict[str, int]:
    return _write_day(*args)
