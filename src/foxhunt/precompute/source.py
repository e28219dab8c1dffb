"""Reading the ingested dataset: a root's contracts, their partitions, trading dates, events.

The ingested layout is `schema=<s>/symbol=<raw symbol>/date=<UTC date>/part-*.parquet`. A root
(ES) owns the outright contracts whose raw symbol is the root, a CME month code and a year digit
or two (ESH4, ESM24); calendar spreads (ESH4-ESM4) and options are not part of the series.

Trading dates follow CME Globex: the session that opens at 17:00 Central belongs to the next
calendar day, so an event's trading date is the Chicago-local date of `ts_event + 7 h`.
"""

from __future__ import annotations

import datetime as dt
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from foxhunt.errors import StepError
from foxhunt.precompute.orderflow import LEVELS, Events

MONTH_CODES = "FGHJKMNQUVXZ"
CHICAGO = ZoneInfo("America/Chicago")
NS_PER_DAY = 86_400_000_000_000
NS_PER_HOUR = 3_600_000_000_000
SESSION_SHIFT_NS = 7 * NS_PER_HOUR  # 17:00 Central + 7 h = midnight of the trading date

LEVEL_COLUMNS = tuple(
    f"{side}_{kind}_{i:02d}"
    for kind in ("px", "sz")
    for side in ("bid", "ask")
    for i in range(LEVELS)
)
EVENT_COLUMNS = ("ts_event", "action", "side", "price", "size", *LEVEL_COLUMNS)


class SourceError(StepError):
    """The ingested data cannot make a series; the message names the path and the rule."""


@dataclass(frozen=True)
class ContractInfo:
    symbol: str
    year: int
    month: int

    @property
    def order(self) -> tuple[int, int]:
        return (self.year, self.month)


EXPIRY = rf"([{MONTH_CODES}])(\d{{1,2}})"
"""An outright's expiry after its root: a month code, one or two digits of the year."""
OUTRIGHT = re.compile(rf"([A-Z0-9]+?){EXPIRY}")
"""An outright's symbol of any root (ESH4, ESZ24): the root is group 1."""


def parse_contract(root: str, symbol: str, near_year: int) -> ContractInfo | None:
    """ESH4 -> (2024, 3) for data around 2024; None when the symbol is not an outright of root."""
    m = re.fullmatch(rf"{re.escape(root)}{EXPIRY}", symbol)
    if not m:
        return None
    month = MONTH_CODES.index(m.group(1)) + 1
    digits = m.group(2)
    mod = 10 ** len(digits)
    year = near_year - 1 + (int(digits) - (near_year - 1)) % mod  # first match at or after
    return ContractInfo(symbol, year, month)


def partitions(data: Path, schema: str, symbol: str) -> dict[dt.date, list[Path]]:
    """UTC date -> sorted Parquet files of one symbol and schema."""
    base = data / f"schema={schema}" / f"symbol={symbol}"
    out: dict[dt.date, list[Path]] = {}
    if not base.is_dir():
        return out
    for d in sorted(base.iterdir()):
        if not d.name.startswith("date="):
            continue
        files = sorted(d.glob("*.parquet"))
        if files:
            out[dt.date.fromisoformat(d.name[5:])] = files
    return out


def root_contracts(data: Path, root: str) -> list[ContractInfo]:
    base = data / "schema=mbp-10"
    if not base.is_dir():
        raise SourceError(f"{base}: no MBP-10 data ingested (the order-flow features need it)")
    symbols = [d.name[7:] for d in base.iterdir() if d.name.startswith("symbol=")]
    dates = [
        dt.date.fromisoformat(p.name[5:])
        for s in symbols
        for p in (base / f"symbol={s}").iterdir()
        if p.name.startswith("date=")
    ]
    near = min(dates).year if dates else dt.date.today().year
    found = [c for s in symbols if (c := parse_contract(root, s, near)) is not None]
    if not found:
        roots = sorted({m.group(1) for s in symbols if (m := OUTRIGHT.fullmatch(s))})
        present = ", ".join(sorted(symbols)[:12]) or "none"
        if roots:
            present += f"; outrights of {', '.join(roots)}"
        elif symbols:
            present += (
                ", none of them a futures outright: a root, a month code and a year, such as ESH4"
            )
        raise SourceError(
            f"{base}: no outright contracts of root {root!r} (symbols present: {present})"
        )
    return sorted(found, key=lambda c: c.order)


@lru_cache(maxsize=4096)
def _utc_offset_ns(day_ordinal: int) -> int:
    day = dt.date.fromordinal(day_ordinal)
    noon = dt.datetime.combine(day, dt.time(12), tzinfo=dt.UTC).astimezone(CHICAGO)
    return int(noon.utcoffset().total_seconds()) * 1_000_000_000


def trading_date_ns(ts: np.ndarray) -> np.ndarray:
    """Trading date of each timestamp as int64 days since 1970-01-01 (vectorised: one Chicago
    UTC offset per UTC day, which is exact because DST switches at 02:00 Sunday, no session)."""
    utc_day = ts // NS_PER_DAY
    if len(ts) == 0:
        return utc_day
    lo = int(utc_day.min())
    epoch = dt.date(1970, 1, 1).toordinal()
    offs = np.array(
        [_utc_offset_ns(d + epoch) for d in range(lo, int(utc_day.max()) + 1)], dtype=np.int64
    )
    return (ts + offs[utc_day - lo] + SESSION_SHIFT_NS) // NS_PER_DAY


def to_date(days: int) -> dt.date:
    return dt.date(1970, 1, 1) + dt.timedelta(days=int(days))


def read_table(files: list[Path], columns: tuple[str, ...]) -> pa.Table:
    try:
        tables = [pq.read_table(f, columns=list(columns), use_threads=False) for f in files]
    except (pa.ArrowInvalid, OSError, KeyError) as e:
        raise SourceError(f"{files[0].parent}: cannot read {list(columns)}: {e}") from e
    if len(tables) == 1:
        return tables[0]
    try:  # files written by other tools may differ in nullability: unify
        return pa.concat_tables(tables, promote_options="default")
    except pa.ArrowInvalid as e:
        raise SourceError(f"{files[0].parent}: files disagree on their columns: {e}") from e


def _ts(table: pa.Table) -> np.ndarray:
    return table.column("ts_event").cast(pa.int64()).to_numpy()


def _char(table: pa.Table, name: str) -> np.ndarray:
    """A 1-character string column as uint8 codes."""
    col = table.column(name).combine_chunks()
    if len(col) == 0:
        return np.zeros(0, np.uint8)
    offsets = np.frombuffer(col.buffers()[1], np.int32, len(col) + 1, col.offset * 4)
    data = np.frombuffer(col.buffers()[2], np.uint8)
    if not np.array_equal(np.diff(offsets), np.ones(len(col), np.int32)):
        raise SourceError(f"column {name!r} holds values that are not one character")
    return data[offsets[:-1]]


def daily_trades(files: list[Path]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(trading day, volume, last trade price) per trading date in these files (sorted)."""
    t = read_table(files, ("ts_event", "action", "price", "size"))
    trade = pc.equal(t.column("action"), "T")
    t = t.filter(trade)
    if t.num_rows == 0:
        return (np.zeros(0, np.int64),) * 3
    ts = _ts(t)
    order = np.argsort(ts, kind="stable")
    ts = ts[order]
    size = t.column("size").to_numpy().astype(np.int64)[order]
    price = t.column("price").to_numpy()[order]
    day = trading_date_ns(ts)
    starts = np.flatnonzero(np.r_[True, day[1:] != day[:-1]])
    ends = np.r_[starts[1:], len(day)]
    return day[starts], np.add.reduceat(size, starts), price[ends - 1]


def read_events(files: list[Path], trading_day: int) -> Events:
    """One contract's MBP-10 events of one trading date, in time order."""
    t = read_table(files, EVENT_COLUMNS)
    ts = _ts(t)
    keep = trading_date_ns(ts) == trading_day
    if not keep.all():
        t = t.filter(pa.array(keep))
        ts = ts[keep]
    order = None
    if len(ts) > 1 and (np.diff(ts) < 0).any():
        order = np.argsort(ts, kind="stable")
        ts = ts[order]

    def col(name, dtype=np.int64):
        a = t.column(name).to_numpy().astype(dtype, copy=False)
        return a if order is None else a[order]

    def levels(side, kind):
        # [10, n] rows copied contiguously, returned as the [n, 10] (column-major) view
        return np.vstack([col(f"{side}_{kind}_{i:02d}") for i in range(LEVELS)]).T

    action, side = _char(t, "action"), _char(t, "side")
    if order is not None:
        action, side = action[order], side[order]
    return Events(
        ts=ts,
        is_trade=action == ord("T"),
        side=side,
        price=col("price"),
        size=col("size"),
        bid_px=levels("bid", "px"),
        ask_px=levels("ask", "px"),
        bid_sz=levels("bid", "sz"),
        ask_sz=levels("ask", "sz"),
    )
