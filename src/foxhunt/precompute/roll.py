"""The continuous front-month series: which contract is the front on each trading date, and the
price factors that remove the roll gaps.

Roll rule (a volume switch, as CME traders roll): the front on trading date D is decided before
D opens, from D-1 alone. It stays the front unless, on D-1, a later-expiring contract traded more
volume than it; then that contract becomes the front from D on, and the switch is never undone.
When the front has no data on D at all (it expired), the next contract that does becomes the
front. The first trading date seeds the rule with its most active contract; it is warm-up and
never reaches the cache.

Adjustment (ratio): at a roll to contract B on D, B's prices are multiplied by the running factor
times last(A) / last(B), the last trade prices of the old and new contract on D-1. Ratio
adjustment keeps every return exactly as the contract traded it, and no return, range or
indicator spans the roll unadjusted. The factors are anchored at the first contract (factor 1)
and only ever use data up to the roll, so a bar's values never depend on later rolls: that is
what lets the no-look-ahead test hold for the targets too. A series anchored at the latest
contract (classic back-adjustment) is this one divided by the last factor, a single constant
(the manifest records every roll and factor).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from itertools import pairwise

import numpy as np

from foxhunt.precompute.orderflow import PRICE_SCALE
from foxhunt.precompute.source import ContractInfo, to_date

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Roll:
    date: int  # trading day (days since epoch) from which `to` is the front
    frm: str
    to: str
    frm_price: int  # last trade prices on the previous trading date (fixed-point)
    to_price: int
    factor: float  # the new contract's cumulative price factor

    def as_json(self) -> dict:
        return {
            "date": to_date(self.date).isoformat(),
            "from": self.frm,
            "to": self.to,
            "from_last_price": self.frm_price * PRICE_SCALE,
            "to_last_price": self.to_price * PRICE_SCALE,
            "factor": self.factor,
        }


@dataclass
class Schedule:
    days: np.ndarray  # trading days (int64 days since epoch), ascending
    front: list[str]  # front contract per day
    factor: np.ndarray  # price factor per day (float64)
    rolls: list[Roll]


def front_schedule(
    contracts: list[ContractInfo],
    daily: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]],
) -> Schedule:
    """`daily[symbol]` = (trading days, volume, last trade price), as `source.daily_trades`."""
    order = {c.symbol: i for i, c in enumerate(sorted(contracts, key=lambda c: c.order))}
    vol: dict[tuple[str, int], int] = {}
    last: dict[tuple[str, int], int] = {}
    for sym, (days, v, p) in daily.items():
        for d, vv, pp in zip(days.tolist(), v.tolist(), p.tolist(), strict=True):
            vol[sym, d], last[sym, d] = vv, pp
    all_days = sorted({d for (_, d) in vol})
    if not all_days:
        return Schedule(np.zeros(0, np.int64), [], np.zeros(0), [])
    d0 = all_days[0]
    front = max((s for s in order if (s, d0) in vol), key=lambda s: (vol[s, d0], -order[s]))
    fronts, factors, rolls = [front], [1.0], []
    factor = 1.0
    for prev, day in pairwise(all_days):
        later = [s for s in order if order[s] > order[front] and (s, prev) in vol]
        best = max(later, key=lambda s: (vol[s, prev], -order[s]), default=None)
        to = None
        if best is not None and vol[best, prev] > vol.get((front, prev), 0):
            to = best
        elif (front, day) not in vol:
            to = next((s for s in sorted(later, key=order.get) if (s, day) in vol), None)
            if to is None:
                to = next((s for s in order if order[s] > order[front] and (s, day) in vol), None)
        if to is not None:
            p_old = _last_on_or_before(last, front, prev)
            p_new = _last_on_or_before(last, to, prev)
            if p_old is None or p_new is None or p_new <= 0:
                log.warning(
                    "roll %s -> %s on %s: no overlapping prices; factor carried unchanged",
                    front,
                    to,
                    to_date(day),
                )
                ratio = 1.0
            else:
                ratio = p_old / p_new
            factor *= ratio
            rolls.append(Roll(day, front, to, p_old or 0, p_new or 0, factor))
            front = to
        fronts.append(front)
        factors.append(factor)
    return Schedule(np.array(all_days, np.int64), fronts, np.array(factors), rolls)


def _last_on_or_before(last: dict, sym: str, day: int) -> int | None:
    cands = [d for (s, d) in last if s == sym and d <= day]
    return last[sym, max(cands)] if cands else None
