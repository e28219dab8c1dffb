"""Is a benchmarked model training, or only spending time? A model that fails is reported as
such and its times are not taken as its speed.

Checks over the per-epoch statistics the agent reports (`losses/loss`, `losses/grad_norm`):

    finite      every loss and gradient norm is a number
    gradients   no explosion (the largest norm within EXPLODE x the median) and no vanishing
                (the median above VANISH)
    trend       the least-squares slope of the loss over the epochs, relative to its mean:
                falling, flat or rising (reported; a rise alone is no failure: a Q-learner's
                loss grows as its values do)
    divergence  the loss ends above DIVERGE x its smallest value
"""

from __future__ import annotations

import math
import statistics

EXPLODE = 1e3
VANISH = 1e-10
DIVERGE = 10.0
FLAT = 0.01  # |relative slope per epoch| below this: flat


def check(history: list[dict[str, float]]) -> dict:
    """The verdict (`ok`) and each check's finding for per-epoch statistics."""
    loss = [h.get("losses/loss", math.nan) for h in history]
    grad = [h["losses/grad_norm"] for h in history if "losses/grad_norm" in h]
    out: dict = {"epochs": len(history)}
    problems = []
    if not all(math.isfinite(v) for v in loss + grad):
        problems.append("non-finite loss or gradient norm")
    finite_loss = [v for v in loss if math.isfinite(v)]
    if grad and all(math.isfinite(g) for g in grad):
        med = statistics.median(grad)
        out["grad_norm_median"], out["grad_norm_max"] = med, max(grad)
        if med < VANISH:
            problems.append(f"vanishing gradients (median norm {med:.3g})")
        elif max(grad) > EXPLODE * med:
            problems.append(f"exploding gradients (max norm {max(grad):.3g}, median {med:.3g})")
    if len(finite_loss) >= 2:
        n = len(finite_loss)
        xm, ym = (n - 1) / 2.0, statistics.fmean(finite_loss)
        slope = sum((i - xm) * (y - ym) for i, y in enumerate(finite_loss))
        slope /= sum((i - xm) ** 2 for i in range(n))
        rel = slope / abs(ym) if ym else 0.0
        out["loss_slope_rel"] = rel
        out["loss_trend"] = "flat" if abs(rel) < FLAT else ("falling" if rel < 0 else "rising")
        lo = min(finite_loss)
        if lo > 0 and finite_loss[-1] > DIVERGE * lo:
            problems.append(f"diverged (loss {finite_loss[-1]:.3g}, its minimum {lo:.3g})")
    out["problems"] = problems
    out["ok"] = not problems
    return out
