"""Baseline policies beside every trained model: what a learned policy must beat.

Each baseline is a `Policy` (bars, portfolio -> branch actions) evaluated by an `Evaluator` with
the same env, costs and metrics code as the trained agent, on the same val and test ranges (in
at least 64 pieces, each starting flat, where the agent's evaluation may use fewer):

    flat            never trades (Sharpe 0: the floor)
    buy_and_hold    long at full size with market orders from the first bar
    random          uniform branch actions
    ridge           ridge regression of the next bar's return on the 50 observable columns
                    (features and order flow, normalised on the train range), fitted on the
                    train range; holds sign(prediction) at full size with market orders
    logistic        logistic regression of the next return's sign, same columns; holds
                    sign(p - 1/2)
    ridge_cost / logistic_cost
                    cost-aware: move to sign(prediction) only when |prediction| exceeds a
                    threshold, otherwise keep the position; the threshold is the one of a
                    fixed grid (quantiles of |prediction| on the val range) with the best val
                    Sharpe, so the val figure is optimistic and the test figure honest
    ridge_memory / ridge_memory_cost
                    ridge and its cost-aware variant on what the agents see: the 50 columns
                    and the memory of the order flow (`MarketData.use_memory`); only where the
                    data holds the memory (an agent's task)

Fits use bars [train_start, train_end - 1) only: the label of bar t is bar t+1's return, so the
last train bar's label would read past the range. Nothing is fitted on val or test except the
cost-aware threshold, chosen on val as a hyperparameter is.
"""

from __future__ import annotations

import copy
import math

import torch

from foxhunt.train.data import fit_ridge, linear_score
from foxhunt.train.env import DIRECTIONS, PORTFOLIO, SIZES
from foxhunt.train.evaluate import Evaluator, Policy, random_policy
from foxhunt.train.metrics import trading_metrics

FULL = SIZES.index(1.0)
MARKET = 0
FLAT = DIRECTIONS.index(0.0)
THRESHOLD_QUANTILES = (0.0, 0.25, 0.5, 0.75, 0.9, 0.95)
NAMES = ("flat", "buy_and_hold", "random", "ridge", "ridge_cost", "logistic", "logistic_cost",
         "ridge_memory", "ridge_memory_cost")  # fmt: skip


def constant_policy(direction: int) -> Policy:
    def act(t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        a = torch.tensor([direction, FULL, MARKET], device=t.device)
        return a.expand(len(t), 3)

    act.portfolio_read = ()  # type: ignore[attr-defined]
    return act


def hold_sign(
    s: torch.Tensor, threshold: float | torch.Tensor, portfolio: torch.Tensor
) -> torch.Tensor:
    """Branch actions that move to sign(s) at full size by market orders where |s| exceeds the
    threshold, and keep the current position's side otherwise."""
    want = torch.sign(s).long() + FLAT  # 0 short, 1 flat, 2 long
    keep = torch.sign(portfolio[:, 0]).long() + FLAT
    direction = torch.where(s.abs() > threshold, want, keep)
    full = torch.full_like(direction, FULL)
    return torch.stack([direction, full, torch.full_like(direction, MARKET)], 1)


def signal_policy(score: torch.Tensor, threshold: float = 0.0) -> Policy:
    """Hold sign(score[t]) at full size; with a threshold, trade only when |score[t]| exceeds
    it and keep the current position otherwise. `score` [N] covers every bar of the data."""

    def act(t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        return hold_sign(score.index_select(0, t), threshold, portfolio)

    act.portfolio_read = PORTFOLIO[:1]  # type: ignore[attr-defined]
    return act


def fit_logistic(x: torch.Tensor, y: torch.Tensor, steps: int = 50) -> torch.Tensor:
    """Weights [d + 1] (bias last) of L2-regularised logistic regression of y > 0, by Newton's
    method with a backtracking line search, in float64 (a strictly convex problem: the optimum
    does not depend on the start; up to `steps` iterations, stopping when a step no longer
    moves the weights). Not torch.optim's L-BFGS: constructing a torch optimiser imports
    torch._dynamo, seconds on a GPU host, in a task that needs it for nothing else (one whose
    steps are compiled ahead of time, foxhunt.train.aot)."""
    x = x.double()
    keep = y != 0
    x, lab = x[keep], (y[keep] > 0).double()
    n, d = x.shape
    xb = torch.cat([x, x.new_ones(n, 1)], 1)
    l2 = torch.full((d + 1,), 1e-4, dtype=x.dtype, device=x.device)
    l2[d] = 0.0  # the bias is not penalised

    def loss(w: torch.Tensor) -> torch.Tensor:
        bce = torch.nn.functional.binary_cross_entropy_with_logits(xb @ w, lab)
        return bce + (l2 * w.square()).sum()

    w = x.new_zeros(d + 1)
    f = loss(w)
    for _ in range(steps):
        p = torch.sigmoid(xb @ w)
        grad = xb.T @ (p - lab) / n + 2 * l2 * w
        hess = (xb.T * (p * (1 - p))) @ xb / n + torch.diag(2 * l2)
        step = torch.linalg.solve(hess, grad)
        t = 1.0
        while True:  # halve the step until the objective does not rise
            w_new = w - t * step
            f_new = loss(w_new)
            if f_new <= f or t < 1e-8:
                break
            t /= 2
        settled = (w_new - w).abs().max() <= 1e-12 * (1 + w.abs().max())
        w, f = w_new, f_new
        if settled:  # the step no longer moves the weights
            break
    return w


def scores(data, w: torch.Tensor, memory: bool = False) -> torch.Tensor:
    """Prediction for every bar, float32 [N]."""
    return linear_score(data.columns(torch.arange(data.n, device=data.device), memory), w).float()


def signals_policy(
    signals: torch.Tensor, row: torch.Tensor, threshold: torch.Tensor, chain: torch.Tensor
) -> Policy:
    """`signal_policy` for an evaluator's chains side by side: env k holds the sign of
    signals[row[c], t] with threshold[c], c = chain[k]. `signals` [S, N] covers every bar."""
    n = signals.shape[1]
    at = row.index_select(0, chain) * n  # each env's signal row, as an offset
    thr = threshold.index_select(0, chain)
    flat = signals.reshape(-1)

    def act(t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        return hold_sign(flat.index_select(0, at + t), thr, portfolio)

    act.portfolio_read = PORTFOLIO[:1]  # type: ignore[attr-defined]
    return act


def evaluate_baselines(
    evaluator: Evaluator,
    data,
    ranges: dict[str, tuple[int, int]],
    periods: float,
    seed: int,
    known: dict | None = None,
) -> dict[str, dict[str, dict]]:
    """Every baseline's val and test metrics on one fold: {name: {"val": m, "test": m}}.
    With the data's normaliser fitted on the train range (as the agent's fold reset fits it:
    fitted again only where it was not, `MarketData.fitted_on`).

    The deterministic baselines walk each range together, one chain each (`Evaluator`'s
    chains, in `evaluator`'s pieces): flat and buy and hold as the signals 0 and 1, each signal
    at each of the cost-aware thresholds (the first, 0, is the plain signal policy). Each
    chain's figures are its own walk's; on test, only the chains reported are read (the
    plain policies and each signal's threshold chosen on val). The random policy walks alone,
    in `evaluator`, from the seed's generator.

    `known`: a dict that the tasks of one process share (seeds side by side, over the one
    data). The deterministic baselines do not depend on the seed: a fold's are walked by the
    first task that asks and read from it by the others (a copy each)."""
    lo, hi = ranges["train"]
    if not data.fitted_on(lo, hi):  # the agent's fold reset fitted them there, as a rule
        data.fit_normaliser(lo, hi)
    gen = torch.Generator(device=data.device).manual_seed(seed * 7919 + lo)
    out = {"random": {}}
    for part in ("val", "test"):  # val then test, from one generator
        r, tr = evaluator.run(random_policy(gen), *ranges[part])
        out["random"][part] = trading_metrics(r, tr, periods, evaluator.last_positions)
    key = (id(data), tuple(sorted(ranges.items())), periods, repr(evaluator.env.cfg),
           evaluator.segments)  # fmt: skip
    fixed = None if known is None else known.get(key)
    if fixed is None:
        fixed = _deterministic_baselines(evaluator, data, ranges, periods)
        if known is not None:
            known[key] = fixed
    out |= copy.deepcopy(fixed)
    return {k: out[k] for k in NAMES if k in out}


def _deterministic_baselines(
    evaluator: Evaluator, data, ranges: dict[str, tuple[int, int]], periods: float
) -> dict[str, dict]:
    """`evaluate_baselines`' figures but the random policy's, the normaliser fitted on the
    train range."""
    lo, hi = ranges["train"]
    t = torch.arange(lo, hi - 1, device=data.device)
    x, y = data.columns(t), data.ret1.index_select(0, t)
    ridge = scores(data, fit_ridge(x, y))
    logit = scores(data, fit_logistic(x, y))
    signals = {"ridge": ridge, "logistic": logit}
    if data.memory is not None:
        signals["ridge_memory"] = scores(data, fit_ridge(data.columns(t, True), y), True)

    # The chains: (name, signal row, threshold); rows 0 and 1 the constants 0 and 1.
    vlo, vhi = ranges["val"]
    chains = [("flat", 0, 0.0), ("buy_and_hold", 1, 0.0)]
    for i, (base, s) in enumerate(signals.items()):
        mags = s[vlo:vhi].abs().double()
        for q in THRESHOLD_QUANTILES:
            chains.append((base, 2 + i, float(torch.quantile(mags, q)) if q > 0 else 0.0))
    rows = torch.stack([torch.zeros_like(ridge), torch.ones_like(ridge), *signals.values()])
    chained = Evaluator(evaluator.env.cfg, data, evaluator.segments, chains=len(chains))
    dev = data.device
    policy = signals_policy(
        rows,
        torch.tensor([c[1] for c in chains], device=dev),
        torch.tensor([c[2] for c in chains], device=dev, dtype=ridge.dtype),
        chained.chain,
    )

    def walk(part: str, read: list[int]) -> dict[int, dict]:
        """The metrics of chains `read` over the range `part`, all chains walked at once."""
        r, tr = chained.run(policy, *ranges[part])
        pos = chained.last_positions
        return {c: trading_metrics(r[c], tr[c], periods, pos[c]) for c in read}

    # Val: every chain (the thresholds are chosen on it); test: what is reported alone.
    val = walk("val", list(range(len(chains))))
    first = {}  # the constants, and each signal's first chain (threshold 0: the plain policy)
    best = {}  # each signal's chain of the best val Sharpe, the first of equals
    for c, (name, _, _) in enumerate(chains):
        first.setdefault(name, c)
        if name in signals and (name not in best or val[c]["sharpe"] > val[best[name]]["sharpe"]):
            best[name] = c
    test = walk("test", sorted({*first.values(), *best.values()}))
    out = {}
    for name, c in first.items():
        out[name] = {"val": val[c], "test": test[c]}
    for name, c in best.items():
        out[f"{name}_cost"] = {"val": val[c], "test": test[c], "threshold": chains[c][2]}
    return out


def compare(model_sharpe: float, baseline_sharpe: float) -> str:
    """'0.52 of ridge's' style ratio, or a difference where the ratio would mislead."""
    if baseline_sharpe > 0 and math.isfinite(model_sharpe):
        return f"{model_sharpe / baseline_sharpe:.2f}x"
    return f"{model_sharpe - baseline_sharpe:+.2f}"
