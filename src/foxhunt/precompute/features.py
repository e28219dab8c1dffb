"""The 42 market features, computed per bar from the back-adjusted OHLCV series.

`CATALOGUE` is the single source of truth: index, name, formula, lookback and source of every
feature. The table in `docs/features.md` is generated from it (`make features-doc`), and a
test checks that the two agree. Technical indicators come from TA-Lib where TA-Lib has them;
everything else is plain numpy written from the formula. Every value at bar t uses bars <= t only;
the lookback column says how many earlier bars it needs (warm-up rows are dropped later).

Oscillators keep TA-Lib's native scale (RSI 0..100, CCI around +-100, ...); indicators measured
in price units (MACD) are divided by the close so that the features do not depend on the price
level. Normalisation for training happens later, on each fold's train range only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

CATALOGUE_VERSION = 1
ADX_INDEX = 40


@dataclass(frozen=True)
class Feature:
    index: int
    name: str
    formula: str
    lookback: int
    source: str


def _f(i, name, formula, lookback, source="numpy"):
    return Feature(i, name, formula, lookback, source)


RET_HORIZONS = (1, 5, 15, 30, 60, 120)
CUSUM_K = 2.0
CUSUM_WINDOW = 120

CATALOGUE: tuple[Feature, ...] = (
    *(
        _f(i, f"ret_{h}", f"ln(C[t] / C[t-{h}])", h)
        for i, h in enumerate(RET_HORIZONS)  # 0..5
    ),
    _f(6, "range", "ln(H / L)", 0),
    _f(7, "body", "ln(C / O)", 0),
    _f(8, "gap", "ln(O[t] / C[t-1])", 1),
    _f(9, "upper_shadow", "ln(H / max(O, C))", 0),
    _f(10, "lower_shadow", "ln(min(O, C) / L)", 0),
    _f(11, "close_location", "(C - L) / (H - L); 0.5 when H = L", 0),
    _f(12, "rv_20", "sqrt(mean of r^2 over 20 bars), r = ret_1", 20),
    _f(13, "rv_60", "sqrt(mean of r^2 over 60 bars)", 60),
    _f(14, "parkinson_20", "sqrt(mean of ln(H/L)^2 / (4 ln 2) over 20 bars) (Parkinson 1980)", 19),
    _f(
        15,
        "garman_klass_20",
        "sqrt(max(0, mean of 0.5 ln(H/L)^2 - (2 ln 2 - 1) ln(C/O)^2 over 20 bars)) "
        "(Garman, Klass 1980)",
        19,
    ),
    _f(
        16,
        "rogers_satchell_20",
        "sqrt(mean of ln(H/C) ln(H/O) + ln(L/C) ln(L/O) over 20 bars) (Rogers, Satchell 1991)",
        19,
    ),
    _f(17, "vol_ratio", "rv_20 / rv_60; 1 when rv_60 = 0", 60),
    _f(18, "log_volume", "ln(1 + V)", 0),
    _f(19, "rel_volume_20", "V / SMA(V, 20); 1 when the SMA is 0", 19, "TA-Lib SMA"),
    _f(20, "volume_z_60", "(V - mean) / std of V over 60 bars; 0 when std = 0", 59),
    _f(21, "mfi_14", "MFI(H, L, C, V, 14)", 14, "TA-Lib MFI"),
    _f(22, "rsi_14", "RSI(C, 14)", 14, "TA-Lib RSI"),
    _f(23, "rsi_6", "RSI(C, 6)", 6, "TA-Lib RSI"),
    _f(24, "macd", "MACD(C, 12, 26, 9) line / C", 33, "TA-Lib MACD"),
    _f(25, "macd_signal", "MACD(C, 12, 26, 9) signal / C", 33, "TA-Lib MACD"),
    _f(26, "macd_hist", "MACD(C, 12, 26, 9) histogram / C", 33, "TA-Lib MACD"),
    _f(
        27,
        "bb_pctb_20",
        "(C - lower) / (upper - lower), BBANDS(C, 20, 2, 2); 0.5 when upper = lower",
        19,
        "TA-Lib BBANDS",
    ),
    _f(28, "bb_width_20", "(upper - lower) / middle, BBANDS(C, 20, 2, 2)", 19, "TA-Lib BBANDS"),
    _f(29, "natr_14", "NATR(H, L, C, 14) = 100 ATR / C", 14, "TA-Lib NATR"),
    _f(30, "stoch_k", "STOCH(H, L, C, 14, 3, 3) slow %K", 17, "TA-Lib STOCH"),
    _f(31, "stoch_d", "STOCH(H, L, C, 14, 3, 3) slow %D", 17, "TA-Lib STOCH"),
    _f(32, "cci_20", "CCI(H, L, C, 20)", 19, "TA-Lib CCI"),
    _f(33, "willr_14", "WILLR(H, L, C, 14)", 13, "TA-Lib WILLR"),
    _f(34, "ultosc", "ULTOSC(H, L, C, 7, 14, 28)", 28, "TA-Lib ULTOSC"),
    _f(35, "aroonosc_14", "AROONOSC(H, L, 14)", 14, "TA-Lib AROONOSC"),
    _f(36, "plus_di_14", "PLUS_DI(H, L, C, 14)", 14, "TA-Lib PLUS_DI"),
    _f(37, "minus_di_14", "MINUS_DI(H, L, C, 14)", 14, "TA-Lib MINUS_DI"),
    _f(38, "close_sma_60", "ln(C / SMA(C, 60))", 59, "TA-Lib SMA"),
    _f(
        39,
        "cusum_state",
        f"(S+ + S-) / h after the update: symmetric CUSUM filter on r = ret_1 with threshold "
        f"h = {CUSUM_K:g} rv_60, S+ = max(0, S+ + r), S- = min(0, S- + r), a side reset to 0 "
        "when it crosses h (Lopez de Prado 2018, 2.5.2.1); 0 when h = 0",
        60,
    ),
    _f(40, "adx_14", "ADX(H, L, C, 14)", 27, "TA-Lib ADX"),
    _f(
        41,
        "cusum_net_120",
        f"(up events - down events) of the CUSUM filter over the last {CUSUM_WINDOW} bars",
        60 + CUSUM_WINDOW - 1,
    ),
)
assert [f.index for f in CATALOGUE] == list(range(42))
assert CATALOGUE[ADX_INDEX].name == "adx_14"
NAMES = tuple(f.name for f in CATALOGUE)
WARMUP = max(f.lookback for f in CATALOGUE)


def window_sum(x: np.ndarray, w: int) -> np.ndarray:
    """Sum of x[t-w+1..t]; NaN before the first full window. Each window is reduced on its own,
    so a value is exact to its window and never depends on anything after t."""
    out = np.full(len(x), np.nan)
    if len(x) >= w:
        out[w - 1 :] = sliding_window_view(x, w).sum(axis=1)
    return out


def _window_mean(x: np.ndarray, w: int) -> np.ndarray:
    return window_sum(x, w) / w


def _ratio(num, den, default):
    out = np.full(np.broadcast(num, den).shape, float(default))
    np.divide(num, den, out=out, where=(den != 0) & ~np.isnan(den))
    return np.where(np.isnan(num) | np.isnan(den), np.nan, out)


def cusum(r: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Symmetric CUSUM filter (Lopez de Prado 2018, snippet 2.4) with a time-varying threshold.
    Returns (state (S+ + S-)/h after resets, event: +1 up, -1 down, 0 none). NaN/0 until h is
    defined. A recursion with resets: one pass over the bars (not the events)."""
    n = len(r)
    state = np.full(n, np.nan)
    event = np.zeros(n, np.int8)
    valid = np.flatnonzero(~np.isnan(h) & ~np.isnan(r))
    if len(valid) == 0:
        return state, event
    t0 = int(valid[0])
    sp = sn = 0.0
    rl, hl = r[t0:].tolist(), h[t0:].tolist()
    st, evl = [0.0] * len(rl), [0] * len(rl)
    for i, (ri, hi) in enumerate(zip(rl, hl, strict=True)):
        sp = max(0.0, sp + ri)
        sn = min(0.0, sn + ri)
        if hi > 0:
            if sn < -hi:
                sn = 0.0
                evl[i] = -1
            elif sp > hi:
                sp = 0.0
                evl[i] = 1
            st[i] = (sp + sn) / hi
    state[t0:] = st
    event[t0:] = evl
    return state, event


def market_features(o, h, l, c, v) -> np.ndarray:  # noqa: E741 - OHLC names
    """[N, 42] float64 (NaN inside a feature's lookback). Inputs: float64 arrays."""
    # Imported here: the catalogue (ADX_INDEX, NAMES, WARMUP) serves the folds step and the
    # trainer on the GPU image, which has no TA-Lib.
    import talib

    n = len(c)
    out = np.full((n, 42), np.nan)
    lc = np.log(c)
    for i, k in enumerate(RET_HORIZONS):
        out[k:, i] = lc[k:] - lc[:-k]
    r = out[:, 0]
    out[:, 6] = np.log(h / l)
    out[:, 7] = np.log(c / o)
    out[1:, 8] = np.log(o[1:] / c[:-1])
    out[:, 9] = np.log(h / np.maximum(o, c))
    out[:, 10] = np.log(np.minimum(o, c) / l)
    out[:, 11] = _ratio(c - l, h - l, 0.5)
    r2 = np.where(np.isnan(r), np.nan, r * r)
    rv20 = np.sqrt(_window_mean(np.nan_to_num(r2), 20))
    rv60 = np.sqrt(_window_mean(np.nan_to_num(r2), 60))
    rv20[:20], rv60[:60] = np.nan, np.nan  # windows must not include the undefined first return
    out[:, 12], out[:, 13] = rv20, rv60
    hl2 = np.log(h / l) ** 2
    out[:, 14] = np.sqrt(_window_mean(hl2 / (4.0 * math.log(2.0)), 20))
    gk = 0.5 * hl2 - (2.0 * math.log(2.0) - 1.0) * np.log(c / o) ** 2
    out[:, 15] = np.sqrt(np.maximum(_window_mean(gk, 20), 0.0))
    rs = np.log(h / c) * np.log(h / o) + np.log(l / c) * np.log(l / o)
    out[:, 16] = np.sqrt(_window_mean(rs, 20))
    out[:, 17] = _ratio(rv20, rv60, 1.0)
    out[:, 18] = np.log1p(v)
    out[:, 19] = _ratio(v, talib.SMA(v, 20), 1.0)
    vm = _window_mean(v, 60)
    vs = np.full(n, np.nan)
    if n >= 60:
        vs[59:] = sliding_window_view(v, 60).std(axis=1)  # two-pass: exactly 0 when constant
    out[:, 20] = np.where(np.isnan(vm), np.nan, _ratio(v - vm, vs, 0.0))
    out[:, 21] = talib.MFI(h, l, c, v, 14)
    out[:, 22] = talib.RSI(c, 14)
    out[:, 23] = talib.RSI(c, 6)
    macd, sig, hist = talib.MACD(c, 12, 26, 9)
    out[:, 24], out[:, 25], out[:, 26] = macd / c, sig / c, hist / c
    up, mid, lo = talib.BBANDS(c, 20, 2.0, 2.0, 0)
    out[:, 27] = _ratio(c - lo, up - lo, 0.5)
    out[:, 28] = (up - lo) / mid
    out[:, 29] = talib.NATR(h, l, c, 14)
    out[:, 30], out[:, 31] = talib.STOCH(h, l, c, 14, 3, 0, 3, 0)
    out[:, 32] = talib.CCI(h, l, c, 20)
    out[:, 33] = talib.WILLR(h, l, c, 14)
    out[:, 34] = talib.ULTOSC(h, l, c, 7, 14, 28)
    out[:, 35] = talib.AROONOSC(h, l, 14)
    out[:, 36] = talib.PLUS_DI(h, l, c, 14)
    out[:, 37] = talib.MINUS_DI(h, l, c, 14)
    out[:, 38] = np.log(c / talib.SMA(c, 60))
    state, event = cusum(r, CUSUM_K * rv60)
    out[:, 39] = state
    out[:, 40] = talib.ADX(h, l, c, 14)
    net = np.full(n, np.nan)
    first = np.flatnonzero(~np.isnan(state))
    if len(first) and n - first[0] >= CUSUM_WINDOW:
        e = event[first[0] :].astype(np.float64)
        net[first[0] + CUSUM_WINDOW - 1 :] = sliding_window_view(e, CUSUM_WINDOW).sum(axis=1)
    out[:, 41] = net
    return out


def markdown_table() -> str:
    lines = [
        "| index | name | formula | lookback (bars) | source |",
        "| ---: | --- | --- | ---: | --- |",
    ]
    for f in CATALOGUE:
        formula = f.formula.replace("|", "\\|")
        lines.append(f"| {f.index} | `{f.name}` | {formula} | {f.lookback} | {f.source} |")
    return "\n".join(lines) + "\n"


def write_docs(path: str = "docs/features.md") -> None:
    """Replace the generated table in docs/features.md (between its catalogue markers)."""
    doc = Path(path).read_text()
    begin = doc.index("<!-- catalogue:begin")
    begin = doc.index("\n", begin) + 1
    end = doc.index("<!-- catalogue:end -->")
    Path(path).write_text(doc[:begin] + markdown_table() + doc[end:])
