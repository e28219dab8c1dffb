"""The eight order-flow features against slow references written straight from their papers,
on small order books that the test builds and trades (level shifts, empty levels, trades)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from foxhunt.precompute.orderflow import (
    UNDEF_PRICE,
    Events,
    OrderFlowParams,
    aggregate_bars,
    ofi_features,
    vpin,
)

TICK = 250_000_000  # 0.25 in DBN fixed point
BAR = 60_000_000_000
INF = float("inf")


def _levels(book: dict[int, int], bid: bool) -> list[tuple[int, int]]:
    prices = sorted(book, reverse=bid)[:10]
    out = [(p, book[p]) for p in prices]
    return out + [(UNDEF_PRICE, 0)] * (10 - len(out))


def build_book_events(seed: int, n: int = 400, bars: int = 8) -> tuple[Events, list[dict]]:
    """A price-level order book (dict price -> size per side) driven by random adds, cancels and
    trades, starting thin (empty levels) and moving (new best levels shift the others). Returns
    the events as `Events` plus the same as a list of plain dicts for the references."""
    rng = np.random.default_rng(seed)
    bids = {400 * TICK: 5}
    asks = {401 * TICK: 3, 403 * TICK: 2}
    rows = []
    ts = np.sort(rng.integers(1, bars * BAR, n))
    ts[5] = ts[4] = BAR  # events exactly at a bar's close belong to that bar
    for i in range(n):
        u = rng.random()
        best_b, best_a = max(bids, default=None), min(asks, default=None)
        is_trade, side, price, size = False, ord("N"), 0, 0
        if u < 0.35:  # add, sometimes inside the spread (a new best level shifts the rest)
            on_bid = rng.random() < 0.5
            ref = best_b if on_bid else best_a
            if ref is None:
                ref = (best_a - TICK) if on_bid else (best_b + TICK)
            off = int(rng.integers(-1, 6)) * TICK
            p = ref - off if on_bid else ref + off
            if on_bid and best_a is not None and p >= best_a:
                p = best_a - TICK
            if not on_bid and best_b is not None and p <= best_b:
                p = best_b + TICK
            book = bids if on_bid else asks
            q = int(rng.integers(1, 8))
            book[p] = book.get(p, 0) + q
            side, price, size = ord("B" if on_bid else "A"), p, q
        elif u < 0.7:  # cancel part or all of a level
            on_bid = rng.random() < 0.5
            book = bids if on_bid else asks
            if len(book) > 1:
                p = list(book)[int(rng.integers(len(book)))]
                q = int(rng.integers(1, book[p] + 1))
                book[p] -= q
                if book[p] == 0:
                    del book[p]
                side, price, size = ord("B" if on_bid else "A"), p, q
        else:  # trade at the best: a buy lifts the ask, a sell hits the bid
            buy = rng.random() < 0.5
            book = asks if buy else bids
            if len(book) > 1:
                p = min(book) if buy else max(book)
                q = int(rng.integers(1, book[p] + 1))
                book[p] -= q
                if book[p] == 0:
                    del book[p]
                is_trade, side, price, size = True, ord("B" if buy else "A"), p, q
        bl, al = _levels(bids, True), _levels(asks, False)
        rows.append(
            {
                "ts": int(ts[i]),
                "trade": is_trade,
                "side": side,
                "price": price,
                "size": size,
                "bid": bl,
                "ask": al,
            }
        )
    ev = Events(
        ts=np.array([r["ts"] for r in rows], np.int64),
        is_trade=np.array([r["trade"] for r in rows]),
        side=np.array([r["side"] for r in rows], np.uint8),
        price=np.array([r["price"] for r in rows], np.int64),
        size=np.array([r["size"] for r in rows], np.int64),
        bid_px=np.array([[p for p, _ in r["bid"]] for r in rows], np.int64),
        ask_px=np.array([[p for p, _ in r["ask"]] for r in rows], np.int64),
        bid_sz=np.array([[q for _, q in r["bid"]] for r in rows], np.int64),
        ask_sz=np.array([[q for _, q in r["ask"]] for r in rows], np.int64),
    )
    return ev, rows


def _px(p: int, bid: bool) -> float:
    if p == UNDEF_PRICE:
        return -INF if bid else INF
    return float(p)


def ofi_event_ref(prev: dict, cur: dict, level: int) -> float:
    """Cont, Kukanov, Stoikov (2014), eq. (2), at one level (Xu, Gould, Howison 2019 for m > 1):
    e_n = I{Pb_n >= Pb_n-1} qb_n - I{Pb_n <= Pb_n-1} qb_n-1
          - I{Pa_n <= Pa_n-1} qa_n + I{Pa_n >= Pa_n-1} qa_n-1"""
    pb0, qb0 = _px(prev["bid"][level][0], True), prev["bid"][level][1]
    pb1, qb1 = _px(cur["bid"][level][0], True), cur["bid"][level][1]
    pa0, qa0 = _px(prev["ask"][level][0], False), prev["ask"][level][1]
    pa1, qa1 = _px(cur["ask"][level][0], False), cur["ask"][level][1]
    e = 0.0
    if pb1 >= pb0:
        e += qb1
    if pb1 <= pb0:
        e -= qb0
    if pa1 <= pa0:
        e -= qa1
    if pa1 >= pa0:
        e += qa0
    return e


def bars_ref(rows: list[dict]) -> list[dict]:
    """Per bar, by a plain loop: which events, the OFI sums, depths, the closing book."""
    out: dict[int, dict] = {}
    for i, r in enumerate(rows):
        label = math.ceil(r["ts"] / BAR) * BAR
        b = out.setdefault(
            label, {"ofi": [0.0] * 5, "d1": 0.0, "d5": 0.0, "n": 0, "buy": 0, "sell": 0}
        )
        if i > 0:
            for m in range(5):
                b["ofi"][m] += ofi_event_ref(rows[i - 1], r, m)
        b["d1"] += r["bid"][0][1] + r["ask"][0][1]
        b["d5"] += sum(r["bid"][m][1] + r["ask"][m][1] for m in range(5))
        b["n"] += 1
        if r["trade"]:
            b["buy" if r["side"] == ord("B") else "sell"] += r["size"]
        b["last"] = r
    return [out[k] | {"ts": k} for k in sorted(out)]


def slope_ref(levels, mid: float, bid: bool) -> float:
    """OLS slope of ln(cumulative size) on distance from the mid in basis points, over the
    levels that hold size."""
    xs, ys, cum = [], [], 0
    for p, q in levels:
        cum += q
        if q > 0 and p != UNDEF_PRICE:
            d = (mid - p * 1e-9) if bid else (p * 1e-9 - mid)
            xs.append(d / mid * 1e4)
            ys.append(math.log(cum))
    if len(xs) < 2 or np.ptp(xs) == 0:
        return 0.0
    return float(np.polyfit(xs, ys, 1)[0])


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_ofi_l1_mlofi_depth_slopes_and_trade_imbalance_match_the_papers(seed):
    ev, rows = build_book_events(seed)
    # the generated books really have empty levels and level shifts
    assert (ev.bid_px == UNDEF_PRICE).any() and (ev.ask_sz == 0).any()
    assert (np.diff(ev.bid_px[:, 0]) != 0).sum() > 10
    agg = aggregate_bars(ev, BAR)
    ref = bars_ref(rows)
    assert agg["ts"].tolist() == [b["ts"] for b in ref]
    close = 100.0 + np.arange(len(ref)) * 0.25
    got = ofi_features(agg, close, bucket_volume=1e9, params=OrderFlowParams(kyle_bars=3))
    for t, b in enumerate(ref):
        mean_l1 = b["d1"] / (2 * b["n"])
        want0 = b["ofi"][0] / mean_l1 if mean_l1 else 0.0
        mean_l5 = b["d5"] / (10 * b["n"])
        want1 = sum(b["ofi"]) / mean_l5 if mean_l5 else 0.0
        assert got[t, 0] == pytest.approx(want0, rel=1e-12, abs=1e-12)
        assert got[t, 1] == pytest.approx(want1, rel=1e-12, abs=1e-12)
        last = b["last"]
        sb = sum(q for _, q in last["bid"])
        sa = sum(q for _, q in last["ask"])
        assert got[t, 2] == pytest.approx((sb - sa) / (sb + sa) if sb + sa else 0.0)
        (bp, bq), (ap, aq) = last["bid"][0], last["ask"][0]
        if bq and aq:
            mid = (bp + ap) / 2 * 1e-9
            assert got[t, 5] == pytest.approx(slope_ref(last["bid"], mid, True), abs=1e-9)
            assert got[t, 6] == pytest.approx(slope_ref(last["ask"], mid, False), abs=1e-9)
        else:
            assert got[t, 5] == got[t, 6] == 0.0
        tot = b["buy"] + b["sell"]
        assert got[t, 7] == pytest.approx((b["buy"] - b["sell"]) / tot if tot else 0.0)


def test_first_event_of_a_day_has_no_predecessor():
    ev, rows = build_book_events(4, n=50, bars=2)
    agg = aggregate_bars(ev, BAR)
    first = sum(ofi_event_ref(rows[i - 1], rows[i], 0) for i in range(1, agg["n_events"][0]))
    assert agg["ofi_levels"][0, 0] == first


def vpin_ref(volume, dprice, vb, n, sigma_bars):
    """Easley, Lopez de Prado, O'Hara (2012): bulk volume classification with a normal CDF of
    the standardised price change, volume buckets of size vb filled in time order, VPIN = mean
    |V_S - V_B| / vb over the last n buckets. A bucket touched by a bar without sigma is dirty."""
    out = [math.nan] * len(volume)
    buckets, dirty = [], []
    fill, buy, is_dirty = 0.0, 0.0, False
    for t in range(len(volume)):
        if t >= sigma_bars - 1:
            w = dprice[t - sigma_bars + 1 : t + 1]
            sig = float(np.std(w))
            z = dprice[t] / sig if sig > 0 else 0.0
            frac, undefined = 0.5 * (1 + math.erf(z / math.sqrt(2))), False
        else:
            frac, undefined = 0.0, True
        left = float(volume[t])
        while left > 1e-12:
            take = min(left, vb - fill)
            fill += take
            buy += take * frac
            is_dirty |= undefined
            left -= take
            if fill >= vb - 1e-9:
                buckets.append(abs(2 * buy - vb))
                dirty.append(is_dirty)
                fill, buy, is_dirty = 0.0, 0.0, False
        if len(buckets) >= n and not any(dirty[-n:]):
            out[t] = sum(buckets[-n:]) / (n * vb)
    return np.array(out)


def test_vpin_matches_a_bucket_by_bucket_loop():
    rng = np.random.default_rng(5)
    volume = rng.integers(0, 40, 300).astype(np.int64)
    volume[10:14] = 0
    dprice = np.round(rng.normal(0, 1, 300) * 4) * 0.25
    got = vpin(volume, dprice, bucket_volume=25.0, n_buckets=10, sigma_bars=20)
    want = vpin_ref(volume, dprice, 25.0, 10, 20)
    assert np.isnan(got).sum() == np.isnan(want).sum() > 0
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)
    assert 0 < np.nanmin(got) and np.nanmax(got) <= 1


def test_kyle_lambda_matches_a_rolling_polyfit():
    ev, _ = build_book_events(6, n=3000, bars=60)
    agg = aggregate_bars(ev, BAR)
    rng = np.random.default_rng(6)
    close = 100 * np.exp(np.cumsum(rng.normal(0, 1e-3, len(agg["ts"]))))
    w = 10
    got = ofi_features(agg, close, 1e9, OrderFlowParams(kyle_bars=w))[:, 4]
    ret = np.r_[np.nan, np.diff(np.log(close))] * 1e4
    x = (agg["buy_volume"] - agg["sell_volume"]).astype(float)
    for t in range(len(close)):
        if t < w:
            assert np.isnan(got[t])
            continue
        xs, ys = x[t - w + 1 : t + 1], ret[t - w + 1 : t + 1]
        want = 0.0 if np.ptp(xs) == 0 else np.polyfit(xs, ys, 1)[0] * np.std(xs)
        assert got[t] == pytest.approx(want, rel=1e-7, abs=1e-9)


def test_docs_name_the_order_flow_columns_in_order():
    """docs/features.md's ofi table lists OFI_NAMES, index by index."""
    import re
    from pathlib import Path

    from foxhunt.precompute.orderflow import OFI_NAMES

    doc = (Path(__file__).resolve().parents[1] / "docs" / "features.md").read_text()
    section = doc.split("## ofi[8]", 1)[1]
    rows = re.findall(r"^\| (\d+) \| `([a-z0-9_]+)` \|", section, flags=re.M)
    assert [(int(i), n) for i, n in rows] == list(enumerate(OFI_NAMES))
