"""Trading metrics of a per-bar return series, computed on the device and read back once.

`returns[k]` is the simple return of bar k's step as a fraction of the notional, net of costs;
`trades[k]` the position change filled at that step. The Sharpe and Sortino ratios are
annualised with the bars a year holds in the data itself (`periods_per_year`): a cache of
regular-hours 1-minute bars has ~98,000 a year, one of 23-hour Globex days ~348,000.
"""

from __future__ import annotations

import math

import torch

from foxhunt.train import scan

YEAR_NS = 365.25 * 86400 * 1e9
METRICS = (
    "sharpe",
    "sortino",
    "profit_factor",
    "max_drawdown",
    "turnover",
    "hit_rate",
    "total_return",
    "bars",
    "short",
    "flat",
    "long",
)


def periods_per_year(timestamps) -> float:
    """Bars per calendar year in a series of bar timestamps (UTC ns): its bar count over its
    span. Holidays, sessions and gaps are priced in, whatever the bar size."""
    n = len(timestamps)
    span = float(timestamps[-1]) - float(timestamps[0])
    if n < 2 or span <= 0:
        raise ValueError("periods per year: need at least 2 increasing timestamps")
    return (n - 1) / (span / YEAR_NS)


def trading_metrics(
    returns: torch.Tensor,
    trades: torch.Tensor,
    periods: float,
    positions: torch.Tensor | None = None,
) -> dict:
    """Sharpe, Sortino (downside deviation about 0), profit factor (gross gains / gross losses),
    max drawdown of the compounded equity curve (fraction of its peak), turnover (mean |position
    change| per bar), hit rate (share of bars with a gain among bars with a non-zero return),
    total compounded return, and, given the positions held, the shares of bars held short, flat
    and long (which directions the policy uses)."""
    r = returns.double()
    n = r.numel()
    if n < 2:
        raise ValueError(f"{n} returns: need at least 2 for a Sharpe ratio")
    ann = math.sqrt(periods)
    mean = r.mean()
    std = r.std()
    down = r.clamp(max=0.0).square().mean().sqrt()
    gains = r.clamp(min=0.0).sum()
    losses = -r.clamp(max=0.0).sum()
    equity = scan.cumprod(1.0 + r)  # the same every run on a GPU, as torch's is not
    peak = torch.cummax(torch.cat([equity.new_ones(1), equity]), 0).values[1:]
    mdd = (1.0 - equity / peak).max()
    nonzero = (r != 0).double().sum()
    wins = (r > 0).double().sum()
    p = positions if positions is not None else torch.full_like(r, math.nan)
    usage = [(p < 0).double().mean(), (p == 0).double().mean(), (p > 0).double().mean()]
    vals = torch.stack(
        [
            mean,
            std,
            down,
            gains,
            losses,
            mdd,
            trades.double().abs().mean(),
            wins,
            nonzero,
            equity[-1] - 1.0,
            *usage,
        ]
    ).tolist()
    mean, std, down, gains, losses, mdd, turnover, wins, nonzero, total, *usage = vals

    def ratio(a: float, b: float) -> float:
        return a / b if b > 0 else 0.0

    return {
        "sharpe": ratio(mean, std) * ann,
        "sortino": ratio(mean, down) * ann,
        "profit_factor": ratio(gains, losses) if losses > 0 else (math.inf if gains > 0 else 0.0),
        "max_drawdown": mdd,
        "turnover": turnover,
        "hit_rate": ratio(wins, nonzero),
        "total_return": total,
        "bars": float(n),
        **(
            dict(zip(("short", "flat", "long"), usage, strict=True))
            if positions is not None
            else {}
        ),
    }
