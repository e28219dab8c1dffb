"""Order flow: MBP-10 events -> per-bar aggregates -> the eight `ofi` features.

Two steps, both vectorised (numpy; no per-event Python loop):

1. `aggregate_bars(events, bar_ns)` turns one trading day of one contract's MBP-10 events into
   per-bar sums: trade OHLCV, aggressor volumes, the per-level order-flow imbalance of every event
   summed over the bar, depth sums, and the 10-level book at the bar's close. A bar closing at `t`
   holds the events with `t - bar_ns < ts_event <= t`.
2. `ofi_features(bars, close, bucket_volume, params)` turns the day-concatenated aggregates into
   the eight features: ofi_l1 (Cont, Kukanov, Stoikov 2014), ofi_sum_l1_5 (the per-level OFIs
   of Xu, Gould, Howison 2019, summed with equal weights), depth_imbalance, vpin (Easley, Lopez
   de Prado, O'Hara 2012), kyle_impact_1sd (Kyle's lambda times the flow's standard deviation),
   bid_depth_slope, ask_depth_slope (a variant of Naes and Skjeltorp's book slope),
   trade_imbalance. Their definitions, and how each differs from what it follows, are in
   docs/features.md.

The event OFI of Cont, Kukanov and Stoikov at a level, between events n-1 and n, is

    e_n = 1{Pb_n >= Pb_n-1} qb_n - 1{Pb_n <= Pb_n-1} qb_n-1
        - 1{Pa_n <= Pa_n-1} qa_n + 1{Pa_n >= Pa_n-1} qa_n-1

with an empty level read as price -inf (bid) or +inf (ask) and size 0. Xu, Gould and Howison
apply the same formula to each of the first levels; `ofi_sum_l1_5` weights the five levels
equally (their integrated OFI weights them by the first principal component instead).
The first event of a trading day has no predecessor in that day and contributes 0: the overnight
change of the book is not order flow.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from foxhunt.dbn.layout import LEVELS, UNDEF_PRICE
from foxhunt.precompute.features import window_sum

OFI_LEVELS = 5
PRICE_SCALE = 1e-9  # quote currency per fixed-point price unit
OFI_NAMES = (
    "ofi_l1",
    "ofi_sum_l1_5",
    "depth_imbalance",
    "vpin",
    "kyle_impact_1sd",
    "bid_depth_slope",
    "ask_depth_slope",
    "trade_imbalance",
)


@dataclass(frozen=True)
class OrderFlowParams:
    vpin_buckets: int = 50
    """VPIN window: number of volume buckets (ELO 2012 use 50)."""
    vpin_buckets_per_day: int = 50
    """Bucket size = volume of the first trading day / this (calibrated on the warm-up day)."""
    vpin_sigma_bars: int = 60
    """Bars in the rolling std of bar price changes that bulk volume classification scales by."""
    kyle_bars: int = 30
    """Bars in the rolling Kyle's-lambda regression."""


@dataclass
class Events:
    """One contract's MBP-10 events for one trading day, in time order (columns as numpy).
    Prices are DBN fixed-point int64; level arrays are [n, 10]."""

    ts: np.ndarray  # int64 ns
    is_trade: np.ndarray  # bool: action 'T'
    side: np.ndarray  # uint8 ASCII: 'B' buy aggressor / bid, 'A' sell aggressor / ask, 'N'
    price: np.ndarray  # int64
    size: np.ndarray  # int64
    bid_px: np.ndarray  # int64 [n, 10], UNDEF_PRICE where empty
    ask_px: np.ndarray
    bid_sz: np.ndarray  # int64 [n, 10]
    ask_sz: np.ndarray

    def __len__(self) -> int:
        return len(self.ts)


# Per-bar aggregate columns (all int64) and the [n, 10] snapshot arrays.
AGG_SCALARS = (
    "ts",
    "open",
    "high",
    "low",
    "close",
    "volume",
    "buy_volume",
    "sell_volume",
    "n_trades",
    "n_events",
    "depth_l1",
    "depth_5",
)
AGG_LEVELS = ("ofi_levels",)  # [n, 5]
AGG_BOOK = ("bid_px", "ask_px", "bid_sz", "ask_sz")  # [n, 10] at the bar's close


def event_ofi(bid_px, bid_sz, ask_px, ask_sz) -> np.ndarray:
    """e_n per event and level ([n, L] int64; row 0 is 0). Inputs are [n, L]."""
    bp = np.where(bid_px == UNDEF_PRICE, np.iinfo(np.int64).min, bid_px)
    ap = ask_px
    e = np.zeros(bp.shape, dtype=np.int64)
    if len(bp) < 2:
        return e
    b_up = bp[1:] >= bp[:-1]
    b_dn = bp[1:] <= bp[:-1]
    a_dn = ap[1:] <= ap[:-1]
    a_up = ap[1:] >= ap[:-1]
    e[1:] = b_up * bid_sz[1:] - b_dn * bid_sz[:-1] - a_dn * ask_sz[1:] + a_up * ask_sz[:-1]
    return e


def aggregate_bars(ev: Events, bar_ns: int) -> dict[str, np.ndarray]:
    """Per-bar aggregates of one day of one contract's events (bars with at least one event).
    Bars without a trade have open..close = -1 and n_trades = 0 (filled later from the past)."""
    n = len(ev)
    if n == 0:
        return {k: np.zeros(0, np.int64) for k in AGG_SCALARS} | {
            "ofi_levels": np.zeros((0, OFI_LEVELS), np.int64),
            **{k: np.zeros((0, LEVELS), np.int64) for k in AGG_BOOK},
        }
    label = -((-ev.ts) // bar_ns) * bar_ns  # ceil: the bar (t - bar, t] is labelled t
    starts = np.flatnonzero(np.r_[True, label[1:] != label[:-1]])
    ends = np.r_[starts[1:], n]
    out: dict[str, np.ndarray] = {"ts": label[starts], "n_events": ends - starts}

    # Trades: OHLCV and aggressor volumes.
    ti = np.flatnonzero(ev.is_trade)
    nb = len(starts)
    for k in ("open", "high", "low", "close"):
        out[k] = np.full(nb, -1, np.int64)
    for k in ("volume", "buy_volume", "sell_volume", "n_trades"):
        out[k] = np.zeros(nb, np.int64)
    if len(ti):
        tbar = np.searchsorted(starts, ti, side="right") - 1  # bar of each trade
        ts_ = np.flatnonzero(np.r_[True, tbar[1:] != tbar[:-1]])
        te = np.r_[ts_[1:], len(ti)]
        bars = tbar[ts_]
        px, sz, sd = ev.price[ti], ev.size[ti], ev.side[ti]
        out["open"][bars] = px[ts_]
        out["close"][bars] = px[te - 1]
        out["high"][bars] = np.maximum.reduceat(px, ts_)
        out["low"][bars] = np.minimum.reduceat(px, ts_)
        out["volume"][bars] = np.add.reduceat(sz, ts_)
        out["buy_volume"][bars] = np.add.reduceat(np.where(sd == ord("B"), sz, 0), ts_)
        out["sell_volume"][bars] = np.add.reduceat(np.where(sd == ord("A"), sz, 0), ts_)
        out["n_trades"][bars] = te - ts_

    # Order-flow imbalance per level, summed per bar; depth sums for the normalisation.
    lv = slice(0, OFI_LEVELS)
    e = event_ofi(ev.bid_px[:, lv], ev.bid_sz[:, lv], ev.ask_px[:, lv], ev.ask_sz[:, lv])
    out["ofi_levels"] = np.add.reduceat(e, starts, axis=0)
    depth = ev.bid_sz[:, lv] + ev.ask_sz[:, lv]
    out["depth_l1"] = np.add.reduceat(depth[:, 0], starts)
    out["depth_5"] = np.add.reduceat(depth.sum(axis=1), starts)

    last = ends - 1
    for k in AGG_BOOK:
        out[k] = np.ascontiguousarray(getattr(ev, k)[last])
    return out


def concat_aggregates(days: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([d[k] for d in days]) for k in days[0]}


# ---- per-bar features ------------------------------------------------------------------------


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    out = np.zeros(np.broadcast(num, den).shape, dtype=np.float64)
    np.divide(num, den, out=out, where=den != 0)
    return out


def depth_imbalance(bid_sz: np.ndarray, ask_sz: np.ndarray) -> np.ndarray:
    b = bid_sz.sum(axis=1).astype(np.float64)
    a = ask_sz.sum(axis=1).astype(np.float64)
    return _safe_div(b - a, b + a)


def book_slope(px: np.ndarray, sz: np.ndarray, mid: np.ndarray, side: int) -> np.ndarray:
    """OLS slope of ln(cumulative depth) on distance from mid in basis points, over the levels
    that hold size (empty levels skipped). side +1: bid (distance mid - px), -1: ask. 0 when
    fewer than two levels hold size or the mid is undefined."""
    valid = (sz > 0) & (px != UNDEF_PRICE) & (mid > 0)[:, None]
    pxf = px.astype(np.float64) * PRICE_SCALE
    with np.errstate(divide="ignore", invalid="ignore"):
        d = np.where(valid, side * (mid[:, None] - pxf) / mid[:, None] * 1e4, 0.0)
        y = np.where(valid, np.log(np.maximum(np.cumsum(sz, axis=1), 1)), 0.0)
    w = valid.astype(np.float64)
    n = w.sum(axis=1)
    sd, sy = d.sum(axis=1), y.sum(axis=1)
    sdd, sdy = (d * d).sum(axis=1), (d * y).sum(axis=1)
    den = n * sdd - sd * sd
    ok = (n >= 2) & (den > 1e-12 * np.maximum(n * sdd, 1e-300))
    return np.where(ok, _safe_div(n * sdy - sd * sy, np.where(ok, den, 1.0)), 0.0)


def kyle_lambda(ret_bp: np.ndarray, signed_vol: np.ndarray, w: int) -> np.ndarray:
    """Rolling OLS slope of return on signed volume over w bars, times the window's std of the
    signed volume: the price impact (bp) of a one-sigma flow. 0 where the volume is constant."""
    x, y = signed_vol.astype(np.float64), ret_bp
    sx, sy = window_sum(x, w), window_sum(y, w)
    sxx, sxy = window_sum(x * x, w), window_sum(x * y, w)
    cov = sxy / w - (sx / w) * (sy / w)
    var = sxx / w - (sx / w) ** 2
    ok = var > 1e-12 * np.maximum(sxx / w, 1e-300)
    with np.errstate(invalid="ignore", divide="ignore"):
        lam = np.where(ok, cov / np.where(ok, var, 1.0) * np.sqrt(np.where(ok, var, 0.0)), 0.0)
    return np.where(np.isnan(sx), np.nan, lam)


def _norm_cdf(z: np.ndarray) -> np.ndarray:
    erf = np.frompyfunc(math.erf, 1, 1)
    return 0.5 * (1.0 + erf(z / math.sqrt(2.0)).astype(np.float64))


def vpin(
    volume: np.ndarray,
    dprice: np.ndarray,
    bucket_volume: float,
    n_buckets: int,
    sigma_bars: int,
) -> np.ndarray:
    """VPIN per bar (NaN until `n_buckets` buckets are complete or sigma is defined).

    Bulk volume classification: bar t's buy volume is V_t * Phi(dP_t / sigma_t), sigma_t the
    std of the bar price changes over the last `sigma_bars` bars (0.5 when sigma is 0). Volume
    fills buckets of `bucket_volume` in time order; a bar's volume is spread uniformly, so a bar
    may feed several buckets. VPIN_t = sum over the last n completed buckets of
    |V_buy - V_sell| / (n * bucket_volume)."""
    v = volume.astype(np.float64)
    s2 = window_sum(dprice * dprice, sigma_bars) / sigma_bars
    s1 = window_sum(dprice, sigma_bars) / sigma_bars
    sigma = np.sqrt(np.maximum(s2 - s1 * s1, 0.0))
    z = np.where(sigma > 0, dprice / np.where(sigma > 0, sigma, 1.0), 0.0)
    frac = np.where(np.isnan(sigma), np.nan, _norm_cdf(np.nan_to_num(z)))
    buy = v * np.nan_to_num(frac)
    cv = np.cumsum(v)
    cb = np.cumsum(buy)
    out = np.full(len(v), np.nan)
    if bucket_volume <= 0 or len(v) == 0:
        return out
    k_total = int(cv[-1] // bucket_volume)
    if k_total < 1:
        return out
    bounds = bucket_volume * np.arange(0, k_total + 1)
    # cumulative buy volume at each bucket boundary, linear inside a bar
    xp, fp = np.r_[0.0, cv], np.r_[0.0, cb]
    b_at = np.interp(bounds, xp, fp)
    oi = np.abs(2.0 * np.diff(b_at) - bucket_volume)  # |buy - sell| per bucket
    coi = np.r_[0.0, np.cumsum(oi)]
    k_t = np.floor(cv / bucket_volume).astype(np.int64)  # buckets complete at bar t
    ok = k_t >= n_buckets
    # Buckets that took volume from a bar before sigma was defined are not classified.
    first_sigma = np.flatnonzero(~np.isnan(sigma))
    if len(first_sigma) == 0:
        return out
    start_vol = cv[first_sigma[0]] - v[first_sigma[0]]
    first_clean = int(np.ceil(start_vol / bucket_volume))
    ok &= k_t - n_buckets >= first_clean
    kt = k_t[ok]
    out[ok] = (coi[kt] - coi[kt - n_buckets]) / (n_buckets * bucket_volume)
    return out


def ofi_features(
    bars: dict[str, np.ndarray],
    close: np.ndarray,
    bucket_volume: float,
    params: OrderFlowParams = OrderFlowParams(),
) -> np.ndarray:
    """The [N, 8] ofi features (float64; NaN where a lookback is not yet satisfied).
    `close` is the adjusted close (float); `bucket_volume` the VPIN bucket size."""
    n = len(bars["ts"])
    out = np.empty((n, 8), dtype=np.float64)
    ne = bars["n_events"].astype(np.float64)
    # mean depths per side and level over the bar's events
    mean_l1 = bars["depth_l1"] / (2.0 * ne)
    mean_l5 = bars["depth_5"] / (2.0 * OFI_LEVELS * ne)
    out[:, 0] = _safe_div(bars["ofi_levels"][:, 0].astype(np.float64), mean_l1)
    out[:, 1] = _safe_div(bars["ofi_levels"].sum(axis=1).astype(np.float64), mean_l5)
    out[:, 2] = depth_imbalance(bars["bid_sz"], bars["ask_sz"])
    dprice = np.r_[0.0, np.diff(close)]
    out[:, 3] = vpin(
        bars["volume"], dprice, bucket_volume, params.vpin_buckets, params.vpin_sigma_bars
    )
    ret_bp = np.r_[np.nan, np.diff(np.log(close))] * 1e4
    signed = (bars["buy_volume"] - bars["sell_volume"]).astype(np.float64)
    out[:, 4] = kyle_lambda(np.nan_to_num(ret_bp), signed, params.kyle_bars)
    out[: params.kyle_bars, 4] = np.nan  # the first window includes the undefined first return
    b0, a0 = bars["bid_px"][:, 0], bars["ask_px"][:, 0]
    both = (b0 != UNDEF_PRICE) & (a0 != UNDEF_PRICE) & (bars["bid_sz"][:, 0] > 0)
    both &= bars["ask_sz"][:, 0] > 0
    mid = np.where(both, (b0.astype(np.float64) + a0.astype(np.float64)) * 0.5 * PRICE_SCALE, 0)
    out[:, 5] = book_slope(bars["bid_px"], bars["bid_sz"], mid, +1)
    out[:, 6] = book_slope(bars["ask_px"], bars["ask_sz"], mid, -1)
    bv, sv = bars["buy_volume"].astype(np.float64), bars["sell_volume"].astype(np.float64)
    out[:, 7] = _safe_div(bv - sv, bv + sv)
    return out
