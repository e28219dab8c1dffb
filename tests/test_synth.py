"""The demo market: genuine DBN, consistent books, bars that agree with trades, a planted signal."""

from __future__ import annotations

import datetime as dt
import hashlib

import databento as db
import databento_dbn
import numpy as np
import pandas as pd
import pytest

from foxhunt.dbn.io import read_all
from foxhunt.synth.contracts import front_and_next, next_share, third_friday
from foxhunt.synth.generate import DATASET, SynthConfig, generate


def _files(raw, schema):
    return sorted((raw / DATASET).rglob(f"*.{schema}.dbn.zst"))


def test_files_decode_with_databento_readers(small_raw):
    for schema in ("mbp-10", "trades", "ohlcv-1m", "definition"):
        files = _files(small_raw, schema)
        assert len(files) == 6  # 2 roots x 3 days
        for f in files:
            store = db.DBNStore.from_file(f)
            assert str(store.schema) == schema
            df = store.to_df(price_type="fixed")
            assert len(df) > 0
            dec = databento_dbn.DBNDecoder()
            dec.write(f.read_bytes() if f.suffix != ".zst" else _zstd(f))
            recs = dec.decode()
            assert isinstance(recs[0], databento_dbn.Metadata)
            assert len(recs) - 1 == len(df)


def _zstd(path):
    import zstandard

    return zstandard.ZstdDecompressor().stream_reader(open(path, "rb")).read()


def test_books_never_cross_and_levels_are_ordered(small_raw):
    for f in _files(small_raw, "mbp-10"):
        _, r = read_all(f)
        bid = np.stack([r[f"bid_px_{i:02d}"] for i in range(10)], axis=1)
        ask = np.stack([r[f"ask_px_{i:02d}"] for i in range(10)], axis=1)
        bsz = np.stack([r[f"bid_sz_{i:02d}"] for i in range(10)], axis=1)
        asz = np.stack([r[f"ask_sz_{i:02d}"] for i in range(10)], axis=1)
        assert (bid[:, 0] < ask[:, 0]).all(), f"{f}: crossed book"
        assert (np.diff(bid, axis=1) < 0).all() and (np.diff(ask, axis=1) > 0).all()
        assert (bsz > 0).all() and (asz > 0).all()
        # every price sits on the 0.25 tick of the DBN fixed-point scale
        assert (bid % 250_000_000 == 0).all() and (r["price"] % 250_000_000 == 0).all()
        # per instrument, time never goes backwards and sequence numbers increase
        for iid in np.unique(r["instrument_id"]):
            m = r["instrument_id"] == iid
            assert (np.diff(r["ts_event"][m].astype(np.int64)) >= 0).all()
            assert (np.diff(r["sequence"][m].astype(np.int64)) > 0).all()


def test_trades_hit_the_book_they_see(small_raw):
    """A buy-aggressor trade prints at the best ask of the book before it, a sell at the bid."""
    for f in _files(small_raw, "mbp-10"):
        _, r = read_all(f)
        t = r[r["action"] == b"T"]
        buy = t["side"] == b"B"
        assert (t["price"][buy] == t["ask_px_00"][buy]).all()
        assert (t["price"][~buy] == t["bid_px_00"][~buy]).all()
        assert (t["size"] > 0).all()


def test_ohlcv_agrees_with_trades(small_raw):
    for ft, fo in zip(_files(small_raw, "trades"), _files(small_raw, "ohlcv-1m"), strict=True):
        trades = db.DBNStore.from_file(ft).to_df(price_type="fixed", pretty_ts=False).reset_index()
        bars = db.DBNStore.from_file(fo).to_df(price_type="fixed", pretty_ts=False).reset_index()
        trades["minute"] = trades["ts_event"] // 60_000_000_000 * 60_000_000_000
        g = trades.sort_values(["instrument_id", "ts_event"], kind="stable").groupby(
            ["instrument_id", "minute"]
        )
        ref = pd.DataFrame(
            {
                "open": g["price"].first(),
                "high": g["price"].max(),
                "low": g["price"].min(),
                "close": g["price"].last(),
                "volume": g["size"].sum(),
            }
        ).reset_index()
        got = bars.rename(columns={"ts_event": "minute"}).sort_values(["instrument_id", "minute"])
        ref = ref.sort_values(["instrument_id", "minute"])
        for c in ("minute", "instrument_id", "open", "high", "low", "close", "volume"):
            assert got[c].astype("int64").tolist() == ref[c].astype("int64").tolist(), c


def test_roll_period_trades_both_contracts(small_raw):
    # 2024-03-06..08 lies in the 8 trading days before ESH4 expires on 2024-03-15.
    f = sorted((small_raw / DATASET / "ES").glob("*20240308.mbp-10.dbn.zst"))[0]
    store = db.DBNStore.from_file(f)
    df = store.to_df(price_type="fixed")
    assert set(df["symbol"]) == {"ESH4", "ESM4"}
    front, nxt = df[df.symbol == "ESH4"], df[df.symbol == "ESM4"]
    # the next contract trades at a premium (carry) and takes the share the roll rule gives it
    assert nxt["bid_px_00"].median() > front["bid_px_00"].median()
    share = next_share(dt.date(2024, 3, 8), front_and_next("ES", dt.date(2024, 3, 8))[0], 8)
    assert abs(len(nxt) / len(df) - share) < 0.03


def test_contract_calendar():
    assert third_friday(2024, 3) == dt.date(2024, 3, 15)
    front, nxt = front_and_next("ES", dt.date(2024, 3, 15))
    assert (front.symbol, nxt.symbol) == ("ESM4", "ESU4")  # expiry day belongs to the next
    front, _ = front_and_next("ES", dt.date(2024, 3, 14))
    assert front.symbol == "ESH4"
    assert next_share(dt.date(2024, 2, 1), front, 8) == 0.0
    assert 0.0 < next_share(dt.date(2024, 3, 14), front, 8) <= 0.9


def test_same_seed_same_bytes(tmp_path):
    def digest(out):
        h = hashlib.sha256()
        for f in sorted((out / DATASET).rglob("*.dbn.zst")):
            h.update(f.name.encode())
            h.update(f.read_bytes())
        return h.hexdigest()

    kw = dict(start=dt.date(2024, 1, 2), end=dt.date(2024, 1, 4), events_per_bar=5, symbols=("ES",))
    generate(SynthConfig(out=tmp_path / "a", **kw), workers=1)
    generate(SynthConfig(out=tmp_path / "b", **kw), workers=2)
    generate(SynthConfig(out=tmp_path / "c", seed=8, **kw), workers=1)
    assert digest(tmp_path / "a") == digest(tmp_path / "b")
    assert digest(tmp_path / "a") != digest(tmp_path / "c")


def test_rerun_with_same_config_is_skipped(tmp_path):
    cfg = SynthConfig(
        out=tmp_path, start=dt.date(2024, 1, 2), end=dt.date(2024, 1, 3), symbols=("NQ",)
    )
    assert not generate(cfg, workers=1).skipped
    assert generate(cfg, workers=1).skipped
    cfg2 = SynthConfig(
        out=tmp_path, start=dt.date(2024, 1, 3), end=dt.date(2024, 1, 4), symbols=("NQ",)
    )
    generate(cfg2, workers=1)
    names = [f.name for f in (tmp_path / DATASET / "NQ").iterdir()]
    assert all("20240103" in n for n in names), "files of the old config must not linger"


@pytest.mark.slow
def test_planted_signal_order_flow_leads_next_return(tmp_path):
    """Signed trade volume of bar t correlates with the return of bar t+1 (and the generator's
    rho sets how much): the signal later stages should find."""

    def lead_corr(signal, impact=0.1, persistence=0.9):
        out = tmp_path / f"s{signal}-{impact}-{persistence}"
        generate(
            SynthConfig(
                out=out,
                start=dt.date(2024, 4, 1),
                end=dt.date(2024, 5, 1),
                symbols=("ES",),
                signal=signal,
                impact=impact,
                persistence=persistence,
                schemas=("trades", "ohlcv-1m"),
            ),
            workers=2,
        )
        cs = []
        for ft, fo in zip(_files(out, "trades"), _files(out, "ohlcv-1m"), strict=True):
            _, t = read_all(ft)
            _, b = read_all(fo)
            minute = (t["ts_event"] // 60_000_000_000).astype(np.int64)
            signed = np.where(t["side"] == b"B", 1.0, -1.0) * t["size"]
            bm = (b["ts_event"] // 60_000_000_000).astype(np.int64)
            flow = pd.Series(signed).groupby(minute).sum().reindex(bm, fill_value=0.0).to_numpy()
            close = b["close"].astype(np.float64)
            ret = np.diff(np.log(close))
            cs.append(pd.DataFrame({"flow": flow[:-1] / np.std(flow), "next": ret}))
        df = pd.concat(cs)
        return np.corrcoef(df["flow"], df["next"])[0, 1], len(df)

    c, n = lead_corr(0.05)  # the defaults: next-bar loading kappa * phi + rho = 0.14
    # No path from s[t] to r[t+1]: what is left is the trade prices' bid-ask bounce (a bar
    # whose buyers lifted the ask closes on a trade at the ask), a small negative lead (-0.03
    # with no impact at all, -0.04 at the default impact).
    c0, _ = lead_corr(0.0, persistence=0.0)
    se = 1 / np.sqrt(n)
    assert c > 5 * se, (c, n)
    assert c - c0 > 6 * se, (c, c0)
    assert -0.06 < c0 < 2 * se, c0
    assert 0.03 < c < 0.14


def test_planted_pressure_persists_as_documented():
    """The bar path against the model in foxhunt.synth.market's docstring: the pressure is an
    AR(1) with autocorrelation phi, returns have unit variance in units of sigma, and s[t]
    predicts r[t+k] with loading kappa * phi**k + rho * phi**(k-1), estimated by regression."""
    from foxhunt.synth.contracts import ROOTS, trading_days
    from foxhunt.synth.market import MarketParams, bar_path

    p = MarketParams(signal=0.05, impact=0.1, persistence=0.9)
    days = trading_days(dt.date(2024, 1, 2), dt.date(2025, 1, 1))
    path = bar_path(ROOTS["ES"], days, p, seed=3)
    s = path.pressure.reshape(-1)
    assert abs(np.corrcoef(s[1:], s[:-1])[0, 1] - 0.9) < 0.01
    assert abs(s.std() - 1.0) < 0.03
    # Returns inside each day (the first bar carries the overnight gap), in units of sigma;
    # the close is in whole ticks, which adds a little variance.
    ret = np.diff(np.log(path.close_ticks.astype(np.float64)), axis=1)
    assert abs((ret / path.sigma[:, 1:]).std() - 1.0) < 0.05
    for k in (1, 2, 5):
        rk = (ret[:, k - 1 :] / path.sigma[:, k:]).reshape(-1)  # r[t+k] ...
        sk = path.pressure[:, :-k].reshape(-1)  # ... beside s[t]
        beta = (sk * rk).mean() / (sk * sk).mean()
        expected = 0.1 * 0.9**k + 0.05 * 0.9 ** (k - 1)
        assert abs(beta - expected) < 4 / np.sqrt(len(sk)), (k, beta, expected)


# --- the compiled book walk against the vectorised reference it replaced ----------------------
RING, MASK, LEVELS = 16, 15, 10


def _forward_fill(slot, value, mask, init):
    """Reference: vals[last[r, k]] is the size in ring slot k in state r (state 0: start of the
    day; state e + 1: after event e). Event e is assignment RING + e, so a running maximum down
    each column of assignment numbers picks the latest one."""
    n = len(slot)
    last = np.zeros((n + 1, RING), dtype=np.int64)
    last[0] = np.arange(RING)
    rows = np.flatnonzero(mask)
    last[rows + 1, slot[rows]] = RING + rows
    np.maximum.accumulate(last, axis=0, out=last)
    return np.concatenate([init, value])[last]  # [n + 1, RING] sizes per state


def _random_walk(n=3000, seed=0):
    rng = np.random.default_rng(seed)
    side_bid = rng.random(n) < 0.5
    direction = rng.choice([-1, 0, 0, 0, 1], n).astype(np.int64)
    b_after = 20_000 + np.cumsum(direction)
    b_before = b_after - direction
    slot = (b_after + rng.integers(-10, 11, n)) & MASK
    value = rng.integers(1, 500, n).astype(np.int32)
    init = rng.integers(1, 500, (2, RING)).astype(np.int32)
    return side_bid, direction, b_before, b_after, slot, value, init


def test_queue_walk_matches_the_forward_fill_reference():
    from foxhunt.synth.book import queue_sizes

    side_bid, direction, b_before, _, slot, value, init = _random_walk()
    old, left = queue_sizes(slot, value, side_bid, direction, b_before, init[0], init[1], MASK)
    bid = _forward_fill(slot, value, side_bid, init[0])
    ask = _forward_fill(slot, value, ~side_bid, init[1])
    e = np.arange(len(slot))
    np.testing.assert_array_equal(old, np.where(side_bid, bid[e, slot], ask[e, slot]))
    want_left = np.where(direction > 0, ask[e, (b_before + 1) & MASK], bid[e, b_before & MASK])
    np.testing.assert_array_equal(left, want_left)


def test_record_fill_matches_field_by_field_assignment():
    from foxhunt.dbn.layout import MBP10_DTYPE
    from foxhunt.synth.book import fill_records

    side_bid, _, _, b_after, slot, value, init = _random_walk(seed=1)
    rng = np.random.default_rng(2)
    n_ev = len(slot)
    state = np.sort(rng.integers(0, n_ev + 1, 5000))
    b_state = np.concatenate([[b_after[0]], b_after])[state]
    tick_ns = 250_000_000
    px0 = (b_state + 7) * tick_ns
    n = len(state)
    head = {
        "instrument_id": rng.integers(1, 2**31, n),
        "ts_event": rng.integers(0, 2**62, n),
        "price": rng.integers(1, 2**40, n),
        "size": rng.integers(1, 10_000, n),
        "action": rng.choice(np.array([b"A", b"C", b"M", b"T"]), n),
        "side": rng.choice(np.array([b"A", b"B"]), n),
        "flags": rng.integers(0, 256, n),
        "depth": rng.integers(0, 10, n),
        "ts_recv": rng.integers(0, 2**62, n),
        "ts_in_delta": rng.integers(-20_000, 20_000, n),
        "sequence": rng.integers(0, 2**32, n),
    }
    rec = np.zeros(n, dtype=MBP10_DTYPE)
    args = [v.view(np.uint8) if v.dtype.kind == "S" else v for v in head.values()]
    fill_records(
        rec.view(np.uint64).reshape(n, -1), state, b_state, px0, tick_ns, slot, value, side_bid,
        init[0], init[1], MASK, np.uint64(92 | 10 << 8 | 1 << 16), *args,
    )  # fmt: skip
    want = np.zeros(n, dtype=MBP10_DTYPE)
    want["length"], want["rtype"], want["publisher_id"] = 92, 10, 1
    for k, v in head.items():
        want[k] = v
    bid = _forward_fill(slot, value, side_bid, init[0])[state]
    ask = _forward_fill(slot, value, ~side_bid, init[1])[state]
    rows = np.arange(n)[:, None]
    lv = np.arange(LEVELS)
    bid_sz, ask_sz = (
        bid[rows, (b_state[:, None] - lv) & MASK],
        ask[rows, (b_state[:, None] + 1 + lv) & MASK],
    )
    for i in range(LEVELS):
        want[f"bid_px_{i:02d}"] = px0 - i * tick_ns
        want[f"ask_px_{i:02d}"] = px0 + (i + 1) * tick_ns
        want[f"bid_sz_{i:02d}"], want[f"ask_sz_{i:02d}"] = bid_sz[:, i], ask_sz[:, i]
        want[f"bid_ct_{i:02d}"], want[f"ask_ct_{i:02d}"] = (
            bid_sz[:, i] // 8 + 1,
            ask_sz[:, i] // 8 + 1,
        )
    assert rec.tobytes() == want.tobytes()
