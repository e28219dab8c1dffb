"""The report step: deflated Sharpe ratio against the paper's worked example, and the files."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest

from foxhunt.report.core import (
    ReportConfig,
    ReportError,
    deflated_sharpe,
    expected_max_sharpe,
    moments,
    probabilistic_sharpe,
    run_report,
)


def test_deflated_sharpe_matches_bailey_lopez_de_prado_example():
    """Bailey and Lopez de Prado (2014), section 'A numerical example': 100 trials, annualised
    Sharpe variance 0.5 and best Sharpe 2.5 over 5 years of daily returns (T = 1250, 250 a
    year), skewness -3, kurtosis 10: SR0 = 0.1132 per day and DSR = 0.9004."""
    sr0 = expected_max_sharpe(0.5 / 250, 100)
    assert sr0 == pytest.approx(0.1132, abs=5e-4)
    dsr = probabilistic_sharpe(2.5 / math.sqrt(250), sr0, 1250, -3.0, 10.0)
    assert dsr == pytest.approx(0.9004, abs=1e-3)


def test_one_trial_is_the_probabilistic_sharpe_against_zero():
    rng = np.random.default_rng(0)
    r = rng.normal(2e-4, 1e-3, 5000)
    d = deflated_sharpe([r])
    sr, skew, kurt = moments(r)
    assert d["sr0_per_bar"] == 0.0
    assert d["dsr"] == pytest.approx(probabilistic_sharpe(sr, 0.0, 5000, skew, kurt))
    # Normal returns: skew ~0, kurtosis ~3.
    assert abs(skew) < 0.1 and kurt == pytest.approx(3.0, abs=0.2)


def test_more_trials_deflate_more():
    """For one observed Sharpe ratio, the bar set by luck rises with the number of trials (and
    with their dispersion), so the DSR falls."""
    sr0s = [expected_max_sharpe(1e-4, n) for n in (2, 10, 100, 1000)]
    assert sr0s == sorted(sr0s) and sr0s[0] > 0
    assert expected_max_sharpe(4e-4, 10) == pytest.approx(2 * expected_max_sharpe(1e-4, 10))
    dsrs = [probabilistic_sharpe(0.05, s, 2000, 0.0, 3.0) for s in sr0s]
    assert dsrs == sorted(dsrs, reverse=True)


def write_results(root, seed, sharpe_sign=1.0):
    rng = np.random.default_rng(seed)
    run = root / f"ES-key-dqn-seed{seed}"
    folds = []
    for k in range(2):
        (run / f"fold-{k}").mkdir(parents=True)
        n = 500
        ts = np.arange(n, dtype=np.int64) * 60_000_000_000 + 1_704_290_400_000_000_000
        strat = rng.normal(sharpe_sign * 1e-4, 1e-3, n)
        np.savez(run / f"fold-{k}" / "test_returns.npz", timestamps=ts, strategy=strat,
                 trades=np.zeros(n), buy_and_hold=rng.normal(0, 1e-3, n))  # fmt: skip
        m = {"sharpe": 1.0 + k, "sortino": 2.0, "profit_factor": 1.1, "max_drawdown": 0.01,
             "turnover": 0.2, "hit_rate": 0.5, "total_return": 0.02, "bars": n}  # fmt: skip
        folds.append({"fold": k, "val": m, "test": m, "test_returns": f"fold-{k}/test_returns.npz"})
    doc = {"symbol": "ES", "model": "dqn", "seed": seed, "folds": folds}
    (run / "results.json").write_text(json.dumps(doc))
    return run / "results.json"


def test_report_files_and_rows(tmp_path):
    runs = tmp_path / "runs"
    old = write_results(runs / "20261130-000000-aaaaaa", 0, sharpe_sign=-1.0)
    os.utime(old, (0, 0))
    write_results(runs / "20261201-000000-bbbbbb", 0)
    write_results(runs / "20261201-000000-bbbbbb", 1)
    # by default the newest run's tasks (two seeds), not an older run's
    rep = run_report(ReportConfig(runs=runs, out=tmp_path / "report"))
    # a trial is a task (configuration x seed), its folds one test series: 2 here
    assert len(rep["rows"]) == 4 and rep["deflated_sharpe"]["trials"] == 2
    assert "this run alone" in rep["deflated_sharpe"]["trials_source"]
    assert all("bbbbbb" in p for p in rep["results"])
    assert rep["aggregate"]["mean_test_sharpe"] == pytest.approx(1.5)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "Deflated Sharpe ratio" in md and md.count("| ES | dqn |") == 4
    html = (tmp_path / "report" / "report.html").read_text()
    assert html.count("data:image/png;base64,") == 4
    for r in rep["rows"]:
        assert (tmp_path / "report" / r["plot"]).read_bytes()[:4] == b"\x89PNG"


def test_report_errors_name_the_file(tmp_path):
    with pytest.raises(ReportError, match="none under"):
        run_report(ReportConfig(runs=tmp_path, out=tmp_path / "r"))
    p = write_results(tmp_path, 3)
    (p.parent / "fold-1" / "test_returns.npz").unlink()
    with pytest.raises(ReportError, match="fold 1's test returns"):
        run_report(ReportConfig(results=(p,), out=tmp_path / "r"))


def _strict(text: str):
    def refuse(name):
        raise ValueError(f"bare {name} in JSON")

    return json.loads(text, parse_constant=refuse)


def test_undefined_values_are_null_in_json_and_n_a_in_the_report(tmp_path):
    """A profit factor with no losing bar is not a number: strict JSON gets null, the tables
    n/a, and the mean is over the folds where it is defined."""
    from foxhunt.fsutil import json_text

    assert _strict(json_text({"a": float("inf"), "b": [1.0, float("nan")], "c": 2})) == {
        "a": None, "b": [1.0, None], "c": 2
    }  # fmt: skip
    path = write_results(tmp_path / "runs" / "r", 0)
    doc = json.loads(path.read_text())
    doc["folds"][0]["test"]["profit_factor"] = None  # as train writes an infinite one
    path.write_text(json.dumps(doc))
    rep = run_report(ReportConfig(results=(path,), out=tmp_path / "report"))
    assert rep["aggregate"]["mean_test_profit_factor"] == pytest.approx(1.1)
    assert "| n/a |" in (tmp_path / "report" / "report.md").read_text()
    _strict((tmp_path / "report" / "report.json").read_text())


def test_report_html_is_a_page_and_says_what_costs_were_charged(tmp_path):
    from html.parser import HTMLParser

    off = write_results(tmp_path / "runs" / "r", 0)
    on = write_results(tmp_path / "runs" / "r", 1)
    doc = json.loads(on.read_text())
    doc["config"] = {"env": {"fee_bps": 0.1, "half_spread_bps": 0.25}}
    on.write_text(json.dumps(doc))
    run_report(ReportConfig(results=(off, on), out=tmp_path / "report"))

    class Page(HTMLParser):
        def __init__(self):
            super().__init__()
            self.tags, self.cells, self.meta, self.row = [], [], {}, None

        def handle_starttag(self, tag, attrs):
            self.tags.append(tag)
            if tag == "meta":
                self.meta.update({a.get("name") or "charset": a.get("content") or a.get("charset")
                                  for a in [dict(attrs)]})  # fmt: skip
            if tag == "tr":
                self.row = []
                self.cells.append(self.row)

        def handle_data(self, data):
            if self.tags and self.tags[-1] == "td":
                self.row.append(data)

    page = Page()
    page.feed((tmp_path / "report" / "report.html").read_text())
    assert page.meta["viewport"].startswith("width=device-width")
    rows = [r for r in page.cells if r]  # the header row has th, not td
    assert len(rows) == 4 and page.tags.count("img") == 4 and page.tags.count("figcaption") == 4
    costs = {r[2]: r[4] for r in rows}  # seed -> costs column
    assert costs == {"0": "costs off", "1": "net of 0.1 bp fee + 0.25 bp half spread"}
    md = (tmp_path / "report" / "report.md").read_text()
    assert "| costs off |" in md and "net of 0.1 bp fee" in md


def test_the_model_beside_the_baselines_over_seeds(tmp_path):
    """The model's test Sharpe as the mean over seeds of each seed's fold mean, with the
    standard error over seeds; each baseline as its mean over the folds; ratios to ridge."""
    runs = tmp_path / "runs" / "20261201-000000-cccccc"
    sharpes = {0: (3.0, 5.0), 1: (1.0, 2.0), 2: (6.0, 4.0)}  # per seed, per fold
    for seed, (a, b) in sharpes.items():
        path = write_results(runs, seed)
        doc = json.loads(path.read_text())
        for f, s in zip(doc["folds"], (a, b), strict=True):
            f["test"] = f["test"] | {"sharpe": s}
            f["baselines"] = {
                "ridge": {"val": f["test"], "test": f["test"] | {"sharpe": 8.0 + f["fold"]}},
                "flat": {"val": f["test"], "test": f["test"] | {"sharpe": 0.0}},
            }
        path.write_text(json.dumps(doc))
    rep = run_report(ReportConfig(runs=tmp_path / "runs", out=tmp_path / "report"))
    (g,) = rep["comparison"]
    per_seed = [4.0, 1.5, 5.0]
    model, ridge, flat = g["rows"]
    assert model["policy"] == "dqn" and model["seeds"] == 3
    assert model["test_sharpe"] == pytest.approx(np.mean(per_seed))
    assert model["se"] == pytest.approx(np.std(per_seed, ddof=1) / np.sqrt(3))
    assert ridge["test_sharpe"] == pytest.approx(8.5) and flat["test_sharpe"] == 0.0
    assert model["vs_ridge"] == pytest.approx(np.mean(per_seed) / 8.5)
    assert model["vs_ridge_cost"] is None  # no cost-aware ridge among these baselines
    md = (tmp_path / "report" / "report.md").read_text()
    assert "ES dqn beside the baselines (costs off)" in md
    assert f"| dqn | {np.mean(per_seed):.2f} ± " in md and "| ridge | 8.50 | 1.00x |" in md
    assert "beside the baselines" in (tmp_path / "report" / "report.html").read_text()


def test_the_deflated_sharpe_counts_every_task_the_experiment_holds(tmp_path, monkeypatch):
    """N = the task runs MLflow holds for this cache (other configurations and seeds tried
    before, this run's too) + the trials declared elsewhere; V[SR_n] from their Sharpe ratios."""
    pytest.importorskip("mlflow")
    from foxhunt.report.core import expected_max_sharpe
    from foxhunt.train.tracking import client_and_experiment

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    client, exp = client_and_experiment("trials")
    ppy = 98_000.0
    tried = [3.0, -1.0, 7.5, 0.5, 2.0]  # annualised mean test Sharpe of five task runs
    for k, sharpe in enumerate(tried):
        tags = {"fxcache_key": "key-a", "seed": str(k), "model": "dqn"}
        rid = client.create_run(exp, tags=tags).info.run_id
        client.log_metric(rid, "eval/mean_test_sharpe", sharpe)
    other = client.create_run(exp, tags={"fxcache_key": "key-b", "seed": "0", "model": "dqn"})
    client.log_metric(other.info.run_id, "eval/mean_test_sharpe", 50.0)  # another cache
    fold = client.create_run(exp, tags={"fxcache_key": "key-a", "seed": "0", "model": "dqn"})
    client.log_metric(fold.info.run_id, "eval/test_sharpe", 40.0)  # a fold run: no task mean
    runs = tmp_path / "runs" / "20261201-000000-dddddd"
    path = write_results(runs, 0)
    doc = json.loads(path.read_text()) | {"fxcache_key": "key-a", "periods_per_year": ppy}
    path.write_text(json.dumps(doc))
    cfg = ReportConfig(runs=tmp_path / "runs", out=tmp_path / "report", tracking="mlflow",
                       experiment="trials", extra_trials=3)  # fmt: skip
    d = run_report(cfg)["deflated_sharpe"]
    per_bar = np.array(tried) / math.sqrt(ppy)
    assert d["trials"] == 8
    assert d["var_sharpe_per_bar"] == pytest.approx(np.var(per_bar, ddof=1))
    assert d["sr0_per_bar"] == pytest.approx(expected_max_sharpe(np.var(per_bar, ddof=1), 8))
    assert "5 training task(s)" in d["trials_source"] and "3 made elsewhere" in d["trials_source"]
    assert "N = 8" in (tmp_path / "report" / "report.md").read_text()


def test_the_columns_a_model_reads_averaged_over_folds_and_seeds(tmp_path):
    """Folds that carry explain.json (TFT's variable selection) give the report a table of the
    columns with the largest mean weight; tasks without it give none."""
    runs = tmp_path / "runs" / "20261202-000000-cccccc"
    weights = {0: {"ofi_l1": 0.5, "rsi_14": 0.3, "adx_14": 0.2},
               1: {"ofi_l1": 0.7, "rsi_14": 0.2, "adx_14": 0.1}}  # fmt: skip
    for seed in (0, 1):
        path = write_results(runs, seed)
        doc = json.loads(path.read_text())
        doc["model"] = "tft"
        for f in doc["folds"]:
            rel = f"fold-{f['fold']}/explain.json"
            (path.parent / rel).write_text(json.dumps({"variable_importance": weights[f["fold"]]}))
            f["explain"] = rel
        path.write_text(json.dumps(doc))
    rep = run_report(ReportConfig(runs=tmp_path / "runs", out=tmp_path / "report"))
    (g,) = rep["importance"]
    assert (g["model"], g["folds"]) == ("tft", 4)
    assert [n for n, _ in g["columns"]] == ["ofi_l1", "rsi_14", "adx_14"]
    assert g["columns"][0][1] == pytest.approx(0.6) and g["columns"][1][1] == pytest.approx(0.25)
    md = (tmp_path / "report" / "report.md").read_text()
    assert "### What tft reads (ES)" in md and "| ofi_l1 | 0.600 |" in md
    assert "What tft reads (ES)</h2>" in (tmp_path / "report" / "report.html").read_text()


def test_a_task_trained_fold_by_fold_is_one_task_again(tmp_path):
    """The pipeline's fold fan-out trains each fold as a task of its own: results of one task
    (the same task digest and seed) are put back together, one trial with its folds in order,
    each fold's files read from its own directory."""
    runs = tmp_path / "runs" / "20261202-000000-dddddd"
    for k in (1, 0):
        path = write_results(runs / f"fold{k}", 0)
        doc = json.loads(path.read_text())
        doc["task_digest"] = "abc"
        doc["folds"] = [f for f in doc["folds"] if f["fold"] == k]
        path.write_text(json.dumps(doc))
        (path.parent.parent / path.parent.name).rename(runs / f"ES-dqn-seed0-fold{k}")
    paths = sorted(runs.glob("*/results.json"))
    assert len(paths) == 2
    rep = run_report(ReportConfig(results=tuple(paths), out=tmp_path / "report"))
    assert [r["fold"] for r in rep["rows"]] == [0, 1]
    assert rep["deflated_sharpe"]["trials"] == 1  # one task, not two
    (g,) = rep["comparison"]
    assert g["rows"][0]["seeds"] == 1
