"""Walk-forward folds: properties over random calendars (hypothesis), gaps, errors, the CLI."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from foxhunt.folds import FoldError, FoldSpec, check_folds, make_folds
from foxhunt.fxcache import publish

MIN = 60_000_000_000
DAY = 1440 * MIN


def _month_start(ns: int) -> int:
    m = np.datetime64(int(ns), "ns").astype("datetime64[M]")
    return int(m.astype("datetime64[ns]").astype(np.int64))


def calendar(days: int, start="2023-10-18", bars_per_day=30, holes=()) -> np.ndarray:
    """Bar closes on weekdays (a few per day), minus the (first day, length) holes."""
    t0 = int(np.datetime64(start, "ns").astype(np.int64)) + 14 * 60 * MIN
    d = np.arange(days)
    weekday = (np.datetime64(start, "D") + d).astype("datetime64[D]").view("int64")
    keep = ((weekday + 3) % 7) < 5
    for first, length in holes:
        keep[first : first + length] = False
    d = d[keep]
    return (t0 + d[:, None] * DAY + np.arange(bars_per_day)[None, :] * 13 * MIN).reshape(-1)


specs = st.builds(
    FoldSpec,
    train_months=st.integers(1, 6),
    val_months=st.integers(1, 3),
    test_months=st.integers(1, 3),
    step_months=st.integers(1, 3),
    window=st.sampled_from(["sliding", "expanding"]),
    n_step=st.integers(0, 20),
    lookback=st.integers(0, 200),
    min_train_bars=st.integers(0, 400),
    min_eval_bars=st.integers(0, 100),
)


@settings(max_examples=150, deadline=None)
@given(
    spec=specs,
    days=st.integers(60, 900),
    holes=st.lists(st.tuples(st.integers(0, 900), st.integers(1, 60)), max_size=4),
)
def test_fold_properties(spec, days, holes):
    ts = calendar(days, holes=holes)
    if len(ts) == 0:
        return
    try:
        folds, dropped = make_folds(ts, spec)
    except FoldError as e:
        assert "month" in str(e) or "dropped" in str(e)
        return
    n = len(ts)
    for f in folds:
        # ordered, inside the data, non-overlapping, with the gaps
        assert 0 <= f.train_start < f.train_end <= f.val_start < f.val_end
        assert f.val_end <= f.test_start < f.test_end <= n
        assert f.val_start - f.train_end >= spec.purge_bars
        assert f.test_start - f.val_end >= spec.embargo_bars
        assert f.train_end - f.train_start >= spec.min_train_bars
        assert min(f.val_end - f.val_start, f.test_end - f.test_start) >= spec.min_eval_bars
        # each range holds only bars of its calendar period
        tr0, tr1 = (np.datetime64(x, "ns").astype(np.int64) for x in f.periods["train"])
        te0, te1 = (np.datetime64(x, "ns").astype(np.int64) for x in f.periods["test"])
        assert tr0 <= ts[f.train_start] and ts[f.train_end - 1] < tr1
        assert te0 <= ts[f.test_start] and ts[f.test_end - 1] < te1
        if spec.window == "expanding":
            assert f.train_start == 0
    # test periods of consecutive folds advance by the step (in calendar months)
    for a, b in itertools.pairwise(folds):
        ma = np.datetime64(a.periods["test"][0], "M").astype(np.int64)
        mb = np.datetime64(b.periods["test"][0], "M").astype(np.int64)
        assert (mb - ma) == (b.fold - a.fold) * spec.step_months
    assert sorted([f.fold for f in folds] + [d["fold"] for d in dropped]) == list(
        range(len(folds) + len(dropped))
    )


def test_gaps_drop_folds_with_a_reason_and_defaults_come_from_the_horizon(caplog):
    # two years with a missing quarter: folds whose test falls in the hole are dropped
    ts = calendar(730, holes=[(300, 95)])
    spec = FoldSpec(train_months=6, n_step=5, lookback=30, min_eval_bars=50)
    assert (spec.purge_bars, spec.embargo_bars) == (5, 30)
    caplog.set_level("INFO")
    folds, dropped = make_folds(ts, spec)
    assert folds and dropped
    assert all("bars (<" in d["reason"] for d in dropped)
    assert "dropped" in caplog.text
    f = folds[0]
    assert f.val_start - f.train_end == 5 and f.test_start - f.val_end == 30


def test_dst_change_does_not_move_month_boundaries():
    # US DST starts 2024-03-10: bars around it stay in their UTC months
    ts = calendar(200, start="2024-01-02")
    folds, _ = make_folds(ts, FoldSpec(train_months=2, min_train_bars=10, min_eval_bars=10))
    for f in folds:
        assert _month_start(ts[f.val_start]) == np.datetime64(f.periods["val"][0], "ns").astype(
            np.int64
        )


def test_too_short_is_a_clear_error():
    ts = calendar(80)
    with pytest.raises(FoldError, match="one fold needs 5"):
        make_folds(ts, FoldSpec())
    with pytest.raises(FoldError, match=r"all .* dropped"):
        make_folds(calendar(400), FoldSpec(min_train_bars=10**6))
    with pytest.raises(FoldError, match="must be at least 1"):
        FoldSpec(train_months=0)


def test_cli_writes_json_with_difficulty(tmp_path):
    ts = calendar(400, bars_per_day=20)
    n = len(ts)
    rng = np.random.default_rng(0)
    feats = rng.random((n, 42), dtype=np.float32)
    feats[:, 40] = np.linspace(10, 50, n, dtype=np.float32)  # ADX rising through the series
    arrays = {"features": feats, "ofi": np.zeros((n, 8), np.float32),
              "targets": np.ones((n, 4)), "timestamps": ts}  # fmt: skip
    publish(tmp_path / "fx", "k", arrays, {"symbol": "ES", "bar_size": "1m"})
    out = tmp_path / "folds.json"
    args = ["folds", "--cache", str(tmp_path / "fx"), "--symbol", "ES", "--out", str(out)]
    res = subprocess.run(
        [sys.executable, "-m", "foxhunt.cli", *args], capture_output=True, text=True
    )
    assert res.returncode == 0, res.stderr
    assert "mean ADX" in res.stdout and "fold   0 |" in res.stdout
    doc = json.loads(out.read_text())
    assert doc["fxcache_key"] == "k" and doc["folds"]
    for f in doc["folds"]:
        want = float(np.mean(feats[f["train_start"] : f["train_end"], 40], dtype=np.float64))
        assert f["difficulty"] == pytest.approx(want, abs=1e-4)
    diffs = [f["difficulty"] for f in doc["folds"]]
    assert diffs == sorted(diffs)  # later train ranges see the higher ADX
    bad = subprocess.run([sys.executable, "-m", "foxhunt.cli", "folds", "--cache", str(tmp_path),
                          "--symbol", "NQ"], capture_output=True, text=True)  # fmt: skip
    assert bad.returncode == 1 and "no fxcache for symbol 'NQ'" in bad.stderr


def test_folds_write_by_default_where_train_looks(tmp_path, monkeypatch):
    from foxhunt.folds import FoldsConfig, run_folds
    from foxhunt.train import TrainConfig

    ts = calendar(400, bars_per_day=20)
    n = len(ts)
    arrays = {"features": np.ones((n, 42), np.float32), "ofi": np.zeros((n, 8), np.float32),
              "targets": np.ones((n, 4)), "timestamps": ts}  # fmt: skip
    publish(tmp_path / "data" / "fxcache", "k", arrays, {"symbol": "ES", "bar_size": "1m"})
    monkeypatch.chdir(tmp_path)
    out, _ = run_folds(FoldsConfig())
    assert out == TrainConfig().folds and out.is_file()


def _folds_doc(n=10_000):
    spec = FoldSpec(min_train_bars=10, min_eval_bars=10)
    folds, _ = make_folds(calendar(400, bars_per_day=20)[:n], spec)
    doc = {"folds": [f.as_json() for f in folds], "spec": {"purge_bars": 3, "embargo_bars": 60}}
    return doc, len(calendar(400, bars_per_day=20)[:n])


def test_check_folds_accepts_what_make_folds_writes_and_names_each_broken_rule():
    doc, n = _folds_doc()
    check_folds(doc["folds"], n, doc["spec"])
    f0 = doc["folds"][0]
    cases = [
        ({"val_start": f0["train_end"] + 1}, "purge must be at least 3"),
        ({"test_start": f0["val_end"]}, "embargo must be at least 60"),
        ({"val_start": f0["train_start"] + 5}, "val starts at bar"),
        ({"test_end": n + 1}, "outside the cache"),
        ({"train_start": -1}, "outside the cache"),
        ({"val_end": f0["val_start"] + 1}, "fewer than 2 bars"),
        ({"train_end": 1.5}, "must be an integer"),
    ]
    for change, message in cases:
        bad = [{**f0, **change}, *doc["folds"][1:]]
        with pytest.raises(FoldError, match=message):
            check_folds(bad, n, doc["spec"])
    with pytest.raises(FoldError, match="appears twice"):
        check_folds([f0, f0], n, doc["spec"])
