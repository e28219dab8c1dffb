"""Baseline policies against independent references: numpy least squares, a logistic fit by
plain gradient descent, and the returns of simple positions computed by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from foxhunt.train.baselines import (
    DIRECTIONS,
    FLAT,
    NAMES,
    THRESHOLD_QUANTILES,
    constant_policy,
    evaluate_baselines,
    fit_logistic,
    scores,
    signal_policy,
)
from foxhunt.train.data import RIDGE_L2, fit_ridge
from foxhunt.train.env import EnvConfig
from foxhunt.train.evaluate import Evaluator, random_policy
from foxhunt.train.metrics import trading_metrics
from marketdata import random_market


def test_ridge_equals_numpy_regularised_least_squares():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(500, 6))
    y = x @ rng.normal(size=6) * 1e-4 + 3e-5 + rng.normal(size=500) * 1e-4
    w = fit_ridge(torch.tensor(x), torch.tensor(y)).numpy()
    # min |Xb w - y|^2 + lambda |w[:-1]|^2: augment the rows with sqrt(lambda) I (bias free)
    lam = RIDGE_L2 * len(x)
    xb = np.c_[x, np.ones(len(x))]
    aug = np.r_[xb, np.c_[np.sqrt(lam) * np.eye(6), np.zeros(6)]]
    ref = np.linalg.lstsq(aug, np.r_[y, np.zeros(6)], rcond=None)[0]
    np.testing.assert_allclose(w, ref, rtol=1e-8, atol=1e-14)


def test_logistic_reaches_the_gradient_descent_optimum():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(2000, 4))
    y = x @ np.array([1.0, -0.5, 0.0, 0.3]) + rng.normal(size=2000)
    w = fit_logistic(torch.tensor(x), torch.tensor(y)).numpy()
    # the same objective minimised by plain full-batch gradient descent
    lab = (y > 0).astype(float)
    xb = np.c_[x, np.ones(len(x))]
    v = np.zeros(5)
    for _ in range(5000):
        p = 1 / (1 + np.exp(-xb @ v))
        g = xb.T @ (p - lab) / len(x)
        g[:4] += 2e-4 * v[:4]
        v -= 1.0 * g
    np.testing.assert_allclose(w, v, atol=1e-4)
    # The optimum itself: the objective's gradient vanishes there (to float64 rounding), which
    # gradient descent's 5,000 steps reach only to ~1e-5 (and torch's L-BFGS, tried, as well).
    wt = torch.tensor(w, requires_grad=True)
    xt = torch.tensor(xb)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(xt @ wt, torch.tensor(lab))
    (loss + 1e-4 * wt[:4].square().sum()).backward()
    assert wt.grad.abs().max() < 1e-10


def test_logistic_fit_stays_finite_on_separable_labels():
    """Labels a column separates exactly: the unregularised optimum is at infinity; the L2
    term keeps it finite, and the fit reaches it (the objective's gradient vanishes there)."""
    x = torch.linspace(-1, 1, 200, dtype=torch.float64)[:, None]
    y = x[:, 0] + 1e-3
    w = fit_logistic(x, y).requires_grad_()
    assert torch.isfinite(w).all() and w[0] > 10, w
    xb = torch.cat([x, torch.ones(200, 1, dtype=x.dtype)], 1)
    loss = torch.nn.functional.binary_cross_entropy_with_logits(xb @ w, (y > 0).double())
    (loss + 1e-4 * w[:1].square().sum()).backward()
    assert w.grad.abs().max() < 1e-10


def test_signal_policy_holds_the_sign_and_keeps_its_position_below_the_threshold():
    data = random_market(400)
    env = EnvConfig(fee_bps=0.0, half_spread_bps=0.0)
    ev = Evaluator(env, data, 1)
    score = torch.tensor(np.random.default_rng(2).normal(size=data.n), dtype=torch.float32)
    r, _ = ev.run(signal_policy(score), 10, 200)
    pos = torch.sign(score[10:199])
    torch.testing.assert_close(ev.last_positions, pos)
    torch.testing.assert_close(r, pos * data.ret1[10:199])
    # threshold 1: trade only on |score| > 1, otherwise hold (starting flat)
    ev.run(signal_policy(score, 1.0), 10, 200)
    held, ref = 0.0, []
    for s in score[10:199].tolist():
        if abs(s) > 1.0:
            held = math.copysign(1.0, s)
        ref.append(held)
    torch.testing.assert_close(ev.last_positions, torch.tensor(ref))


def test_baselines_on_a_fold_flat_zero_buy_and_hold_the_market():
    data = random_market(900)
    ev = Evaluator(EnvConfig(fee_bps=0.1, half_spread_bps=0.25), data, 1)
    ranges = {"train": (0, 500), "val": (520, 700), "test": (720, 900)}
    out = evaluate_baselines(ev, data, ranges, 98_000.0, seed=0)
    assert out["flat"]["test"]["sharpe"] == 0.0 and out["flat"]["test"]["flat"] == 1.0
    # buy and hold: long from the first bar, paying the market cost once
    r = data.ret1[720:899].double().clone()
    r[0] -= 0.35e-4
    trades = torch.zeros_like(r)
    trades[0] = 1.0
    ref = trading_metrics(r, trades, 98_000.0)
    assert out["buy_and_hold"]["test"]["sharpe"] == pytest.approx(ref["sharpe"], rel=1e-4)
    for name in ("ridge", "ridge_cost", "logistic", "logistic_cost", "random"):
        assert math.isfinite(out[name]["test"]["sharpe"]), name
    assert out["ridge_cost"]["threshold"] >= 0.0


def test_ridge_memory_reads_the_agents_columns_and_only_where_the_data_holds_them():
    data = random_market(900)
    ev = Evaluator(EnvConfig(), data, 1)
    ranges = {"train": (0, 500), "val": (520, 700), "test": (720, 900)}
    assert "ridge_memory" not in evaluate_baselines(ev, data, ranges, 98_000.0, seed=0)
    data.use_memory(0.5)
    out = evaluate_baselines(ev, data, ranges, 98_000.0, seed=0)
    assert {"ridge_memory", "ridge_memory_cost"} <= out.keys()
    # its positions are the signs of numpy's ridge on the 58 normalised columns
    t = torch.arange(data.n)
    x = torch.cat([data.observe(t), data.remember(t)], 1).double().numpy()
    lam, d = RIDGE_L2 * 499, x.shape[1]
    xb = np.c_[x, np.ones(len(x))]
    aug = np.r_[xb[:499], np.c_[np.sqrt(lam) * np.eye(d), np.zeros(d)]]
    w = np.linalg.lstsq(aug, np.r_[data.ret1[:499].double().numpy(), np.zeros(d)], rcond=None)[0]
    want = trading_metrics(*ev.run(signal_policy(torch.tensor(xb @ w, dtype=torch.float32)),
                                   *ranges["test"]), 98_000.0, ev.last_positions)  # fmt: skip
    assert out["ridge_memory"]["test"]["sharpe"] == pytest.approx(want["sharpe"], rel=1e-6)


def test_the_statistics_know_the_range_they_were_fitted_on_until_written():
    data = random_market(900)
    data.use_memory(0.5)
    assert not data.fitted_on(0, 500)  # never fitted
    data.fit_normaliser(0, 500)
    assert data.fitted_on(0, 500) and not data.fitted_on(0, 501)
    data.use_forecast()  # a new column, not fitted yet
    assert not data.fitted_on(0, 500)
    data.fit_normaliser(0, 500)
    assert data.fitted_on(0, 500)
    for name, t in data.statistics().items():  # a restored resume file writes each in place
        t.copy_(t.clone())
        assert not data.fitted_on(0, 500), name
        data.fit_normaliser(0, 500)
    data.forecast.copy_(data.forecast.clone())
    assert not data.fitted_on(0, 500)
    with torch.inference_mode():  # tensors that keep no version counter: never taken as fitted
        made = random_market(900)
        made.fit_normaliser(0, 500)
    assert not made.fitted_on(0, 500)


def test_the_baselines_fit_the_statistics_only_where_they_are_not_the_train_ranges(monkeypatch):
    data = random_market(900)
    data.use_memory(0.5)
    data.use_forecast()
    ev = Evaluator(EnvConfig(), data, 1)
    ranges = {"train": (0, 500), "val": (520, 700), "test": (720, 900)}
    want = evaluate_baselines(ev, data, ranges, 98_000.0, seed=0)  # fits them
    fits = []
    fit = data.fit_normaliser
    monkeypatch.setattr(data, "fit_normaliser", lambda lo, hi: fits.append((lo, hi)) or fit(lo, hi))
    assert evaluate_baselines(ev, data, ranges, 98_000.0, seed=0) == want and fits == []
    data.fit_normaliser(0, 400)  # another fold's range: fitted again, the same figures
    fits.clear()
    assert evaluate_baselines(ev, data, ranges, 98_000.0, seed=0) == want
    assert fits == [(0, 500)]
    data.mean.copy_(data.mean + 1.0)  # written since: fitted again
    fits.clear()
    assert evaluate_baselines(ev, data, ranges, 98_000.0, seed=0) == want
    assert fits == [(0, 500)]


@pytest.mark.parametrize(
    "segments, device",
    [(1, "cpu"), (7, "cpu"), (64, "cpu"), pytest.param(64, "cuda", marks=pytest.mark.gpu)],
)
def test_the_baselines_walked_together_are_each_walked_alone(segments, device):
    """Every baseline's val and test metrics, and the cost-aware thresholds chosen, as each
    policy walked alone gives them (one evaluator run a policy and range, the thresholds tried
    one by one on val): the same figures, whatever the pieces, on the CPU and on a GPU."""
    data = random_market(1400, device=device)
    data.use_memory(0.5)
    env = EnvConfig(fee_bps=0.1, half_spread_bps=0.25)
    ranges = {"train": (0, 800), "val": (820, 1100), "test": (1120, 1400)}
    got = evaluate_baselines(Evaluator(env, data, segments), data, ranges, 98_000.0, seed=3)

    ev = Evaluator(env, data, segments)
    gen = torch.Generator(device=device).manual_seed(3 * 7919 + 0)

    def alone(policy, part):
        r, tr = ev.run(policy, *ranges[part])
        return trading_metrics(r, tr, 98_000.0, ev.last_positions)

    policies = {
        "flat": lambda: constant_policy(FLAT),
        "buy_and_hold": lambda: constant_policy(DIRECTIONS.index(1.0)),
        "random": lambda: random_policy(gen),
    }
    want = {name: {p: alone(make(), p) for p in ("val", "test")} for name, make in policies.items()}
    t = torch.arange(0, 799, device=device)
    y = data.ret1[:799]
    fits = {"ridge": scores(data, fit_ridge(data.columns(t), y)),
            "logistic": scores(data, fit_logistic(data.columns(t), y)),
            "ridge_memory": scores(data, fit_ridge(data.columns(t, True), y), True)}  # fmt: skip
    for name, s in fits.items():
        want[name] = {p: alone(signal_policy(s), p) for p in ("val", "test")}
        mags = s[820:1100].abs().double()
        tried = [(float(torch.quantile(mags, q)) if q else 0.0) for q in THRESHOLD_QUANTILES]
        val = [alone(signal_policy(s, thr), "val") for thr in tried]
        best = max(range(len(tried)), key=lambda i: (val[i]["sharpe"], -i))  # the first best
        want[f"{name}_cost"] = {"val": val[best], "test": alone(signal_policy(s, tried[best]),
                                "test"), "threshold": tried[best]}  # fmt: skip
    assert list(got) == [n for n in NAMES if n in want] and set(got) == set(want)
    for name in want:
        assert got[name] == want[name], name
    assert len({got[f"{n}_cost"]["threshold"] for n in fits}) > 1


@pytest.mark.parametrize(
    "device, bars, pieces",
    [("cpu", 6000, (16, 64)), pytest.param("cuda", 400_000, (1024, 4096), marks=pytest.mark.gpu)],
)
def test_the_baselines_figures_are_the_same_whatever_the_pieces_and_the_run(device, bars, pieces):
    """A fold's deterministic baselines at two piece counts, and twice at the first: the same
    figures each time (the random policy's draws depend on the pieces and are left out)."""
    data = random_market(bars, device=device)
    data.use_memory(0.5)
    cut = [int(bars * f) for f in (0.6, 0.8)]
    ranges = {"train": (0, cut[0]), "val": (cut[0], cut[1]), "test": (cut[1], bars)}

    def figures(k: int) -> dict:
        out = evaluate_baselines(Evaluator(EnvConfig(), data, k), data, ranges, 98_000.0, seed=0)
        return {name: b for name, b in out.items() if name != "random"}

    first = figures(pieces[0])
    assert figures(pieces[0]) == first
    assert figures(pieces[1]) == first
