"""Precompute end to end on demo data: the fxcache it writes, hits, the roll, no look-ahead, the
planted order-flow signal, bar sizes and errors."""

from __future__ import annotations

import datetime as dt
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from foxhunt.fxcache import FxCache, verify
from foxhunt.ingest.core import IngestConfig, run_ingest
from foxhunt.precompute import PrecomputeConfig, PrecomputeError, parse_bar_size, run_precompute
from foxhunt.precompute import core as precompute_core
from foxhunt.synth.contracts import ROOTS, session_open_ns, trading_days
from foxhunt.synth.generate import SynthConfig, generate
from foxhunt.synth.market import bar_path

MIN = 60_000_000_000


def _ingested(out: Path, **synth) -> Path:
    generate(SynthConfig(out=out / "raw", events_per_bar=8, **synth), workers=2)
    run_ingest(IngestConfig(raw=out / "raw", out=out / "ingested"))
    return out / "ingested"


@pytest.fixture(scope="module")
def roll_data(tmp_path_factory) -> Path:
    """ES and NQ over the March 2024 roll: the volume switch falls on 2024-03-12."""
    return _ingested(
        tmp_path_factory.mktemp("roll"), start=dt.date(2024, 3, 7), end=dt.date(2024, 3, 15)
    )


@pytest.fixture(scope="module")
def computed(roll_data, tmp_path_factory):
    out = tmp_path_factory.mktemp("fxcache")
    res = run_precompute(PrecomputeConfig(data=roll_data, out=out))
    return res, {s.symbol: FxCache.open(s.path) for s in res.symbols}


def test_caches_hold_the_documented_arrays_and_manifest(computed, roll_data):
    res, caches = computed
    assert [s.symbol for s in res.symbols] == ["ES", "NQ"] and not any(s.hit for s in res.symbols)
    for sym, c in caches.items():
        assert verify(c.path) == []
        n = len(c)
        assert n > 1500
        assert c.features.shape == (n, 42) and c.features.dtype == np.float32
        assert c.ofi.shape == (n, 8) and c.ofi.dtype == np.float32
        assert c.targets.shape == (n, 4) and c.targets.dtype == np.float64
        assert c.timestamps.dtype == np.int64
        assert np.isfinite(c.features).all() and np.isfinite(c.ofi).all()
        assert (np.diff(c.timestamps) > 0).all() and (c.timestamps % MIN == 0).all()
        o, h, lo, cl = c.targets.T
        assert (h >= np.maximum(o, cl)).all() and (lo <= np.minimum(o, cl)).all() and (lo > 0).all()
        m = c.manifest
        for k in ("schema_version", "catalogue_version", "feature_version", "source", "symbol",
                  "bar_size", "start", "end", "rows", "rolls", "files", "contracts"):  # fmt: skip
            assert k in m, k
        assert m["symbol"] == sym and m["rows"] == n and m["bar_size"] == "1m"
        assert m["source"]["digest"] and m["source"]["files"] > 0
        assert all(len(f["sha256"]) == 64 for f in m["files"].values())
        # the first trading day is warm-up; the cache starts on the second one
        assert m["start"].startswith("2024-03-08")
        assert len(m["features"]) == 42 and m["features"][40] == "adx_14"


def test_second_run_is_a_hit_and_does_no_work(computed, roll_data, monkeypatch, caplog):
    res, _ = computed
    out = res.out

    def no_work(*a, **k):
        raise AssertionError("a hit must not compute")

    monkeypatch.setattr(precompute_core, "_compute", no_work)
    monkeypatch.setattr(precompute_core, "read_events", no_work)
    caplog.set_level(logging.INFO)
    again = run_precompute(PrecomputeConfig(data=roll_data, out=out))
    assert all(s.hit for s in again.symbols)
    assert [s.key for s in again.symbols] == [s.key for s in res.symbols]
    for s in res.symbols:
        assert f"fxcache hit {s.key}" in caplog.text
    assert "no work" in again.summary()


def test_a_cache_with_flipped_bytes_is_no_hit(computed, roll_data, tmp_path, caplog):
    """Same size, one byte changed: the checksum sees it, and precompute computes afresh."""
    import shutil

    res, _ = computed
    out = tmp_path / "fxcache"
    shutil.copytree(res.out, out)
    key = res.symbols[0].key
    f = out / key / "ofi.npy"
    data = bytearray(f.read_bytes())
    data[-7] ^= 0x01
    f.write_bytes(bytes(data))
    caplog.set_level(logging.INFO)
    again = run_precompute(PrecomputeConfig(data=roll_data, out=out, symbols=("ES",)))
    assert not again.symbols[0].hit and f"fxcache {key} is damaged" in caplog.text
    assert verify(out / key) == [] and list(out.glob(f".corrupt-{key}-*"))


def test_key_changes_with_parameters(computed, roll_data):
    res, _ = computed
    cfg = PrecomputeConfig(data=roll_data, out=res.out)
    src = precompute_core.source_digest(roll_data)
    base = precompute_core.key_inputs(cfg, "ES", src)
    cfg5 = PrecomputeConfig(data=roll_data, out=res.out, bar_size="5m")
    assert precompute_core.key_inputs(cfg5, "ES", src) != base
    assert precompute_core.key_inputs(cfg, "NQ", src) != base


def test_roll_switches_on_volume_and_leaves_no_jump(computed, roll_data):
    _, caches = computed
    es = caches["ES"]
    rolls = es.manifest["rolls"]
    assert [(r["date"], r["from"], r["to"]) for r in rolls] == [("2024-03-12", "ESH4", "ESM4")]
    r = rolls[0]
    assert r["factor"] == pytest.approx(r["from_last_price"] / r["to_last_price"])
    raw_gap = abs(np.log(r["to_last_price"] / r["from_last_price"]))
    close = es.targets[:, 3]
    rets = np.diff(np.log(close))
    day = (es.timestamps // 86_400_000_000_000).astype("datetime64[D]")
    first_roll_bar = int(np.argmax(day == np.datetime64("2024-03-12")))
    roll_ret = abs(rets[first_roll_bar - 1])
    typical = np.median(np.abs(rets))
    assert raw_gap > 20 * typical  # the contracts are ~1% apart ...
    # ... but across the roll the series moves exactly as the new contract did that night
    t = pq.read_table(roll_data / "schema=trades" / "symbol=ESM4").to_pandas()
    ts = t["ts_event"].astype("int64").to_numpy()
    prev_last = t["price"].to_numpy()[ts < es.timestamps[first_roll_bar - 1] + 1].take(-1)
    in_bar = (ts > es.timestamps[first_roll_bar] - MIN) & (ts <= es.timestamps[first_roll_bar])
    first_close = t["price"].to_numpy()[in_bar].take(-1)
    assert rets[first_roll_bar - 1] == pytest.approx(np.log(first_close / prev_last), abs=1e-12)
    assert roll_ret < raw_gap / 2
    # before the roll the targets are the old contract's prices as traded (factor 1) ...
    before = es.targets[:first_roll_bar]
    np.testing.assert_allclose(before / 0.25, np.rint(before / 0.25), atol=1e-6)
    # ... after it the new contract's prices times the factor
    after = es.targets[first_roll_bar:] / r["factor"]
    np.testing.assert_allclose(after / 0.25, np.rint(after / 0.25), atol=1e-6)


def _perturb_after(src: Path, dst: Path, t_ns: int, seed: int) -> None:
    """Copy the ingested dataset, changing every event after t_ns: sizes, prices (whole book
    moved by ticks), trade sides, and every seventh event removed."""
    shutil.copytree(src, dst)
    rng = np.random.default_rng(seed)
    for schema in ("mbp-10", "trades"):
        for f in sorted((dst / f"schema={schema}").rglob("*.parquet")):
            t = pq.read_table(f)
            ts = t.column("ts_event").cast(pa.int64()).to_numpy()
            after = ts > t_ns
            if not after.any():
                continue
            cols = {}
            shift = rng.integers(-8, 9, len(ts)) * 250_000_000
            for name in t.column_names:
                a = t.column(name)
                if name == "size" or "_sz_" in name:
                    v = a.to_numpy().astype(np.int64)
                    v = np.where(after, v * 3 + 1, v)
                    a = pa.array(v.astype(np.uint32))
                elif name == "price" or "_px_" in name:
                    v = a.to_numpy()
                    undef = v == np.iinfo(np.int64).max
                    a = pa.array(np.where(after & ~undef, v + shift, v))
                elif name == "side":
                    flipped = pc.if_else(
                        pc.equal(a, "A"),
                        "B",
                        pc.if_else(pc.equal(a, "B"), "A", a),
                    )
                    a = pc.if_else(pa.array(after), flipped, a)
                cols[name] = a
            keep = ~after | (np.arange(len(ts)) % 7 != 0)
            table = pa.Table.from_arrays(list(cols.values()), schema=t.schema)
            pq.write_table(table.filter(pa.array(keep)), f)


@pytest.mark.parametrize(
    "cut",
    [
        "2024-03-11T18:00:00",  # before the roll: the perturbed volumes could move it
        "2024-03-12T16:45:30",  # after it, mid-bar
    ],
)
def test_no_look_ahead_perturbing_the_future_leaves_the_past_bit_identical(
    computed, roll_data, tmp_path, cut
):
    _, caches = computed
    t_ns = int(np.datetime64(cut, "ns").astype(np.int64))
    pert = tmp_path / "ingested"
    _perturb_after(roll_data, pert, t_ns, seed=3)
    res = run_precompute(PrecomputeConfig(data=pert, out=tmp_path / "fx", symbols=("ES",)))
    got = FxCache.open(res.symbols[0].path)
    ref = caches["ES"]
    past_ref = ref.timestamps <= t_ns
    past_got = got.timestamps <= t_ns
    assert past_ref.sum() > 300 and past_ref.sum() == past_got.sum()
    for name in ("timestamps", "features", "ofi", "targets"):
        a, b = getattr(ref, name)[past_ref], getattr(got, name)[past_got]
        assert a.tobytes() == b.tobytes(), f"{name} changed at or before {cut}"
    # the perturbation is real: later bars do change
    fut = min(len(ref), len(got))
    assert not np.array_equal(
        ref.features[past_ref.sum() : fut], got.features[past_got.sum() : fut]
    )


@pytest.fixture(scope="module")
def signal_data(tmp_path_factory):
    out = tmp_path_factory.mktemp("signal")
    cfg = dict(
        symbols=("ES",), start=dt.date(2024, 1, 8), end=dt.date(2024, 1, 29), signal=0.5, impact=0.5
    )
    return _ingested(out, **cfg), cfg


def test_ofi_l1_carries_the_planted_signal(signal_data, tmp_path):
    data, synth = signal_data
    res = run_precompute(PrecomputeConfig(data=data, out=tmp_path, symbols=("ES",)))
    c = FxCache.open(res.symbols[0].path)
    # the generator's latent order-flow pressure s[t] of every cached bar
    cfg = SynthConfig(out=tmp_path, events_per_bar=8, **synth)
    days = trading_days(cfg.start, cfg.end)
    path = bar_path(ROOTS["ES"], days, cfg.params(), cfg.seed)
    closes = np.array([session_open_ns(d, "rth") + (i + 1) * MIN for d in days for i in range(390)])
    idx = np.searchsorted(closes, c.timestamps)
    assert (closes[idx] == c.timestamps).all()
    s = path.pressure.reshape(-1)[idx]
    same_day = np.diff(idx) == 1  # bar t and t+1 in one session (no overnight gap)
    ofi = c.ofi[:-1, 0].astype(np.float64)[same_day]
    nxt = np.diff(np.log(c.targets[:, 3]))[same_day]
    n = len(ofi)
    lead = np.corrcoef(ofi, nxt)[0, 1]
    carried = np.corrcoef(ofi, s[:-1][same_day])[0, 1]
    # OFI of bar t predicts bar t+1 only through the pressure, which loads r[t+1] with
    # kappa * phi + rho (foxhunt.synth.market): corr = (kappa phi + rho) * corr(OFI, s) (the
    # GARCH volatility makes it a little smaller); 4 standard errors of significance
    assert lead > 4 / np.sqrt(n)
    loading = cfg.impact * cfg.persistence + cfg.signal
    assert 0.6 * loading * carried < lead < 1.2 * loading * carried + 2 / np.sqrt(n)


def test_bar_size_is_a_parameter(computed, roll_data, tmp_path):
    res = run_precompute(
        PrecomputeConfig(data=roll_data, out=tmp_path, symbols=("NQ",), bar_size="5m")
    )
    c = FxCache.open(res.symbols[0].path)
    one = computed[1]["NQ"]
    assert (c.timestamps % (5 * MIN) == 0).all() and c.manifest["bar_size"] == "5m"
    assert 0.15 < len(c) / len(one) < 0.21
    # a 5-minute bar's high is the highest of its 1-minute bars (same contract and factor)
    t = c.timestamps[100]
    inside = (one.timestamps > t - 5 * MIN) & (one.timestamps <= t)
    assert c.targets[100, 1] == one.targets[inside, 1].max()
    assert parse_bar_size("30s") == 30_000_000_000 and parse_bar_size("1h") == 60 * MIN
    for bad in ("7m", "0s", "2d", "fast"):
        with pytest.raises(PrecomputeError, match="bar size"):
            parse_bar_size(bad)


def test_an_outrights_symbol_gives_its_root_and_contract():
    """A root, a CME month code, one or two digits of the year: ESH4, MESZ24, 6EM5; a spread
    or a continuous symbol is not an outright."""
    from foxhunt.precompute.source import OUTRIGHT, parse_contract

    symbols = ("ESH4", "MESZ24", "6EM5", "ESH4-ESM4", "ES.c.0", "ES.FUT", "ESH")
    roots = {s: (m.group(1) if (m := OUTRIGHT.fullmatch(s)) else None) for s in symbols}
    assert roots == {"ESH4": "ES", "MESZ24": "MES", "6EM5": "6E", "ESH4-ESM4": None,
                     "ES.c.0": None, "ES.FUT": None, "ESH": None}  # fmt: skip
    c = parse_contract("ES", "ESH4", 2024)
    assert (c.year, c.month) == (2024, 3)
    assert parse_contract("ES", "ESZ9", 2024).year == 2029  # the first at or after the data's
    assert parse_contract("ES", "MESH4", 2024) is None  # another root


def test_data_without_futures_outrights_is_refused_with_what_it_holds(tmp_path):
    """Equities (Databento's XNAS sample: NVDA) have no outrights to build a continuous series
    from; the error says what the data holds and what an outright looks like."""
    from foxhunt.precompute.source import SourceError, root_contracts

    (tmp_path / "schema=mbp-10" / "symbol=NVDA" / "date=2024-01-02").mkdir(parents=True)
    said = r"root 'ES' \(symbols present: NVDA, none of them a futures outright: a root, "
    with pytest.raises(SourceError, match=said + r"a month code and a year, such as ESH4\)"):
        root_contracts(tmp_path, "ES")


def test_errors_name_what_is_missing(tmp_path, roll_data):
    with pytest.raises(PrecomputeError, match=r"manifest\.json: not found"):
        run_precompute(PrecomputeConfig(data=tmp_path / "nothing", out=tmp_path / "fx"))
    from foxhunt.precompute.source import SourceError

    # The data's ES and NQ contracts around the roll, and the roots a user could ask for.
    with pytest.raises(
        SourceError,
        match=r"no outright contracts of root 'ZN' \(symbols present: ESH4, ESM4, NQH4, NQM4; "
        r"outrights of ES, NQ\)",
    ):
        run_precompute(PrecomputeConfig(data=roll_data, out=tmp_path / "fx", symbols=("ZN",)))


def test_cli_precompute_then_ls(roll_data, tmp_path):
    run = [sys.executable, "-m", "foxhunt.cli"]
    args = ["precompute", "--data", str(roll_data), "--out", str(tmp_path), "--symbols", "ES"]
    out = subprocess.run([*run, *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert "ES: fxcache miss" in out.stdout and "M events/s" in out.stdout
    out = subprocess.run([*run, *args], capture_output=True, text=True)
    assert "ES: fxcache hit" in out.stdout and "no work" in out.stdout
    ls = subprocess.run(
        [*run, "fxcache", "ls", "--root", str(tmp_path)], capture_output=True, text=True
    )
    assert "ES" in ls.stdout and "1m" in ls.stdout and "rows" in ls.stdout
    missing = ["precompute", "--data", str(tmp_path / "x"), "--out", str(tmp_path)]
    bad = subprocess.run([*run, *missing], capture_output=True, text=True)
    assert bad.returncode == 1 and "manifest.json: not found" in bad.stderr
    assert json.loads((roll_data / "manifest.json").read_text())["inputs"]
