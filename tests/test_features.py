"""The 42 market features: TA-Lib-backed ones equal TA-Lib on the same input, the others equal a
slow loop written from the formula in docs/features.md; the catalogue and the docs agree."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import talib

from foxhunt.precompute import features as F

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def ohlcv():
    rng = np.random.default_rng(11)
    n = 1500
    c = 4800 * np.exp(np.cumsum(rng.normal(0, 3e-4, n)))
    o = np.r_[c[0], c[:-1]] * np.exp(rng.normal(0, 5e-5, n))
    h = np.maximum(o, c) * np.exp(np.abs(rng.normal(0, 2e-4, n)))
    lo = np.minimum(o, c) * np.exp(-np.abs(rng.normal(0, 2e-4, n)))
    h[100] = lo[100] = o[100] = c[100] = c[99]  # a bar without range
    v = rng.integers(0, 500, n).astype(float)
    v[200:260] = 7.0  # constant volume: the z-score's std is 0
    return o, h, lo, c, v, F.market_features(o, h, lo, c, v)


def test_talib_features_equal_talib(ohlcv):
    _, h, lo, c, v, out = ohlcv
    macd, sig, hist = talib.MACD(c, 12, 26, 9)
    up, mid, low = talib.BBANDS(c, 20, 2.0, 2.0, 0)
    k, d = talib.STOCH(h, lo, c, 14, 3, 0, 3, 0)
    expect = {
        "mfi_14": talib.MFI(h, lo, c, v, 14),
        "rsi_14": talib.RSI(c, 14),
        "rsi_6": talib.RSI(c, 6),
        "macd": macd / c,
        "macd_signal": sig / c,
        "macd_hist": hist / c,
        "bb_pctb_20": (c - low) / (up - low),
        "bb_width_20": (up - low) / mid,
        "natr_14": talib.NATR(h, lo, c, 14),
        "stoch_k": k,
        "stoch_d": d,
        "cci_20": talib.CCI(h, lo, c, 20),
        "willr_14": talib.WILLR(h, lo, c, 14),
        "ultosc": talib.ULTOSC(h, lo, c, 7, 14, 28),
        "aroonosc_14": talib.AROONOSC(h, lo, 14),
        "plus_di_14": talib.PLUS_DI(h, lo, c, 14),
        "minus_di_14": talib.MINUS_DI(h, lo, c, 14),
        "close_sma_60": np.log(c / talib.SMA(c, 60)),
        "adx_14": talib.ADX(h, lo, c, 14),
        "rel_volume_20": v / talib.SMA(v, 20),
    }
    talib_backed = {f.name for f in F.CATALOGUE if f.source.startswith("TA-Lib")}
    assert talib_backed == set(expect)
    for name, want in expect.items():
        i = F.NAMES.index(name)
        ok = np.isfinite(want)
        np.testing.assert_array_equal(np.isnan(out[:, i]), ~ok, err_msg=name)
        np.testing.assert_allclose(out[ok, i], want[ok], rtol=1e-12, err_msg=name)
    assert F.NAMES[40] == "adx_14" and F.ADX_INDEX == 40


def _window(x, t, w):
    return [x[j] for j in range(t - w + 1, t + 1)] if t >= w - 1 else None


def cusum_ref(r, h):
    """Lopez de Prado (2018), snippet 2.4, with the threshold per bar."""
    sp = sn = 0.0
    state, events = [], []
    for ri, hi in zip(r, h, strict=True):
        if math.isnan(hi) or math.isnan(ri):
            state.append(math.nan)
            events.append(0)
            continue
        sp, sn = max(0.0, sp + ri), min(0.0, sn + ri)
        ev = 0
        if hi > 0 and sn < -hi:
            sn, ev = 0.0, -1
        elif hi > 0 and sp > hi:
            sp, ev = 0.0, 1
        state.append((sp + sn) / hi if hi > 0 else 0.0)
        events.append(ev)
    return state, events


def test_numpy_features_equal_slow_formulas(ohlcv):
    o, h, lo, c, v, out = ohlcv
    n = len(c)
    ln = math.log
    r = [math.nan] + [ln(c[t] / c[t - 1]) for t in range(1, n)]

    def rv(t, w):
        win = _window(r, t, w)
        if win is None or any(math.isnan(x) for x in win):
            return math.nan
        return math.sqrt(sum(x * x for x in win) / w)

    rv60 = [rv(t, 60) for t in range(n)]
    state, events = cusum_ref(r, [F.CUSUM_K * x for x in rv60])
    for t in range(n):
        want = {}
        for k in F.RET_HORIZONS:
            want[f"ret_{k}"] = ln(c[t] / c[t - k]) if t >= k else math.nan
        want["range"] = ln(h[t] / lo[t])
        want["body"] = ln(c[t] / o[t])
        want["gap"] = ln(o[t] / c[t - 1]) if t else math.nan
        want["upper_shadow"] = ln(h[t] / max(o[t], c[t]))
        want["lower_shadow"] = ln(min(o[t], c[t]) / lo[t])
        want["close_location"] = (c[t] - lo[t]) / (h[t] - lo[t]) if h[t] > lo[t] else 0.5
        want["rv_20"], want["rv_60"] = rv(t, 20), rv60[t]
        if t >= 19:
            js = range(t - 19, t + 1)
            want["parkinson_20"] = math.sqrt(
                sum(ln(h[j] / lo[j]) ** 2 for j in js) / 20 / (4 * ln(2))
            )
            gk = sum(
                0.5 * ln(h[j] / lo[j]) ** 2 - (2 * ln(2) - 1) * ln(c[j] / o[j]) ** 2 for j in js
            )
            want["garman_klass_20"] = math.sqrt(max(0.0, gk / 20))
            want["rogers_satchell_20"] = math.sqrt(
                sum(
                    ln(h[j] / c[j]) * ln(h[j] / o[j]) + ln(lo[j] / c[j]) * ln(lo[j] / o[j])
                    for j in js
                )
                / 20
            )
        else:
            want["parkinson_20"] = want["garman_klass_20"] = want["rogers_satchell_20"] = math.nan
        r20, r60 = want["rv_20"], rv60[t]
        want["vol_ratio"] = math.nan if math.isnan(r60) else (r20 / r60 if r60 else 1.0)
        want["log_volume"] = ln(1 + v[t])
        if t >= 59:
            win = v[t - 59 : t + 1]
            m = sum(win) / 60
            sd = math.sqrt(max(sum(x * x for x in win) / 60 - m * m, 0.0))
            want["volume_z_60"] = (v[t] - m) / sd if sd > 1e-9 else 0.0
        else:
            want["volume_z_60"] = math.nan
        want["cusum_state"] = state[t]
        valid = [j for j in range(t - F.CUSUM_WINDOW + 1, t + 1) if j >= 0]
        full = len(valid) == F.CUSUM_WINDOW and not math.isnan(state[valid[0]])
        want["cusum_net_120"] = sum(events[j] for j in valid) if full else math.nan
        for name, w in want.items():
            got = out[t, F.NAMES.index(name)]
            if math.isnan(w):
                assert math.isnan(got), (name, t)
            else:
                # the CUSUM state is a difference of running sums: absolute tolerance
                tol = 1e-9 if name == "cusum_state" else 1e-12
                assert got == pytest.approx(w, rel=1e-9, abs=tol), (name, t)
    assert sum(e != 0 for e in events) > 20  # the CUSUM filter fired, both ways
    assert min(events) == -1 and max(events) == 1


def test_lookbacks_in_the_catalogue_are_where_values_start(ohlcv):
    *_, out = ohlcv
    for f in F.CATALOGUE:
        first = int(np.argmax(np.isfinite(out[:, f.index])))
        assert first == f.lookback, (f.name, first, f.lookback)
    assert F.WARMUP == max(f.lookback for f in F.CATALOGUE)


def test_docs_table_is_the_catalogue():
    doc = (REPO / "docs" / "features.md").read_text()
    assert F.markdown_table() in doc, (
        "docs/features.md is stale: regenerate its table with `make features-doc`"
    )
