"""CME equity-index futures as the demo data knows them: roots, contracts, sessions, rolls.

Contracts expire on the third Friday of March, June, September and December (month codes H, M, U,
Z). The demo market trades the front contract alone until `roll_days` trading days before its
expiry; during that roll period both the expiring and the next contract trade, the next one's
share of the activity rising linearly from about 10% to 90%, as volume migrates on CME around the
second Thursday before expiry. On expiry day and after, only the next contract trades.
"""

from __future__ import annotations

import datetime as dt
import zlib
from dataclasses import dataclass
from zoneinfo import ZoneInfo

import numpy as np

MONTH_CODES = {3: "H", 6: "M", 9: "U", 12: "Z"}
CHICAGO = ZoneInfo("America/Chicago")


@dataclass(frozen=True)
class RootSpec:
    """One futures root (ES, NQ, ...) and the demo market's parameters for it."""

    root: str
    tick: float
    """Minimum price increment in index points."""
    multiplier: float
    """Contract multiplier (dollars per index point)."""
    start_price: float
    """Front-month price on the first generated day."""
    annual_vol: float
    """Unconditional annualised volatility of the bar returns."""
    basis_per_quarter: float
    """Next contract's premium over the front, as a fraction of price (carry)."""
    base_size: int
    """Typical resting size at the best level, in contracts."""


ROOTS: dict[str, RootSpec] = {
    "ES": RootSpec("ES", 0.25, 50.0, 4800.0, 0.10, 0.012, 40),
    "NQ": RootSpec("NQ", 0.25, 20.0, 17000.0, 0.14, 0.012, 12),
}


@dataclass(frozen=True)
class Contract:
    root: str
    symbol: str
    """Raw CME symbol, e.g. ESH4."""
    expiry: dt.date
    instrument_id: int

    @property
    def expiry_ns(self) -> int:
        # CME equity index futures stop trading at 08:30 CT on expiry day.
        t = dt.datetime.combine(self.expiry, dt.time(8, 30), tzinfo=CHICAGO)
        return int(t.timestamp()) * 1_000_000_000


def third_friday(year: int, month: int) -> dt.date:
    first = dt.date(year, month, 1)
    offset = (4 - first.weekday()) % 7  # Friday = 4
    return first + dt.timedelta(days=offset + 14)


def instrument_id(symbol: str) -> int:
    """A stable synthetic instrument id per raw symbol (Databento ids are opaque integers)."""
    return 1000 + zlib.crc32(symbol.encode()) % 9_000_000


def contract_for(root: str, year: int, month: int) -> Contract:
    symbol = f"{root}{MONTH_CODES[month]}{year % 10}"
    return Contract(root, symbol, third_friday(year, month), instrument_id(symbol))


def front_and_next(root: str, day: dt.date) -> tuple[Contract, Contract]:
    """The contract expiring next on or after `day` (the front) and the one after it."""
    year, month = day.year, ((day.month - 1) // 3 + 1) * 3
    front = contract_for(root, year, month)
    if front.expiry <= day:  # expiry day itself belongs to the next contract
        month += 3
        if month > 12:
            year, month = year + 1, 3
        front = contract_for(root, year, month)
    n_month, n_year = (front.expiry.month + 3, front.expiry.year)
    if n_month > 12:
        n_year, n_month = n_year + 1, 3
    return front, contract_for(root, n_year, n_month)


def trading_days(start: dt.date, end: dt.date) -> list[dt.date]:
    """Weekdays in [start, end); the demo market has no holidays."""
    days = []
    d = start
    while d < end:
        if d.weekday() < 5:
            days.append(d)
        d += dt.timedelta(days=1)
    return days


def next_share(day: dt.date, front: Contract, roll_days: int) -> float:
    """Share of the activity in the next contract on `day` (0 outside the roll period)."""
    left = np.busday_count(day, front.expiry)  # trading days from day until expiry
    if left > roll_days or roll_days <= 0:
        return 0.0
    return float(0.1 + 0.8 * (roll_days - left) / max(roll_days - 1, 1))


SESSIONS = {
    # regular trading hours of the CME equity index pit session: 08:30-15:00 Central
    "rth": (dt.time(8, 30), 390),
    # Globex electronic session 17:00 (previous day) - 16:00 Central, less the 15:15-15:30 halt
    # is simplified to a continuous 23-hour session
    "eth": (dt.time(17, 0), 1380),
}


def session_open_ns(day: dt.date, session: str) -> int:
    """UTC nanoseconds of the first bar's open for the session that belongs to `day`."""
    start, _ = SESSIONS[session]
    d = day - dt.timedelta(days=1) if session == "eth" else day
    t = dt.datetime.combine(d, start, tzinfo=CHICAGO)
    return int(t.timestamp()) * 1_000_000_000
