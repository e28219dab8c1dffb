"""`foxhunt report`: what a training run achieved out of sample, across folds and seeds.

Input: one or more `results.json` files of `foxhunt train` (one per model and seed). Output,
in `--out`: `report.md` (per-fold and aggregate test metrics, the deflated Sharpe ratio),
`report.html` (the same with the equity curves inlined, for the Kubeflow UI), one PNG per fold
and seed of the strategy's test equity curve against buy-and-hold, and `report.json`.

The deflated Sharpe ratio (Bailey and Lopez de Prado 2014, "The Deflated Sharpe Ratio:
Correcting for Selection Bias, Backtest Overfitting and Non-Normality") is the probability that
the best trial's true Sharpe ratio is above the Sharpe ratio the best of N unskilled trials would
show by luck:

    SR0 = sqrt(V[SR_n]) * ((1 - g) * Z^-1(1 - 1/N) + g * Z^-1(1 - 1/(N e))),  g = 0.5772...
    DSR = Z( (SR - SR0) * sqrt(T - 1) / sqrt(1 - skew * SR + (kurt - 1) / 4 * SR^2) )

with per-bar (not annualised) Sharpe ratios, T the best trial's number of returns, skew and
kurt (not excess) its returns' moments, V[SR_n] the variance of the trials' Sharpe ratios.

A trial is one training task: a configuration and a seed, whose test series is its folds' test
ranges one after the other (walk-forward test months follow each other). N counts every task
tried on this symbol and fxcache (the same bars and date range): with tracking on, the task runs
the MLflow experiment holds for that cache (this run's among them), whose Sharpe ratios give
V[SR_n]; without, this run's tasks alone. `--extra-trials` adds trials made elsewhere
(notebooks, other tools) to N. The report says what N was and where it came from. The folds of
one task are not separate trials: they are periods of one backtest.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from statistics import NormalDist

import numpy as np

from foxhunt.errors import StepError
from foxhunt.fsutil import write_json_atomic, write_text_atomic

EULER_GAMMA = 0.5772156649015329
_N = NormalDist()


class ReportError(StepError):
    pass


@dataclass
class ReportConfig:
    """Per-fold and aggregate test metrics, deflated Sharpe ratio and equity curves."""

    results: tuple[Path, ...] = ()
    """results.json files of `foxhunt train` (default: those of the newest run under --runs)."""
    out: Path = Path("data/report")
    """Directory for report.md, report.html, report.json and the plots."""
    runs: Path = Path("data/runs")
    """Where `foxhunt train` puts its runs (`<runs>/<run id>/<task>/results.json`)."""
    tracking: str = "none"
    """'mlflow': also log the report as an MLflow run (MLFLOW_TRACKING_URI or ./mlflow.db)."""
    experiment: str = "foxhunt"
    """MLflow experiment name."""
    tags: dict[str, str] = field(default_factory=dict)
    """Extra MLflow tags (the pipeline passes the KFP run id)."""
    run_id: str | None = None
    """Log into this MLflow run (the pipeline run's parent) and end it; default: a new run."""
    extra_trials: int = 0
    """Trials made elsewhere on this symbol and date range (notebooks, other tools, other MLflow
    experiments): added to N, the number of trials the deflated Sharpe ratio corrects for."""

    def __post_init__(self) -> None:
        if self.extra_trials < 0:
            raise ValueError(f"extra_trials = {self.extra_trials}: must not be negative")


def moments(r: np.ndarray) -> tuple[float, float, float]:
    """Per-bar Sharpe ratio, skewness and kurtosis (not excess) of a return series."""
    r = np.asarray(r, dtype=np.float64)
    mu, sd = r.mean(), r.std(ddof=1)
    if sd == 0:
        return 0.0, 0.0, 3.0
    z = (r - mu) / r.std(ddof=0)
    return mu / sd, float(np.mean(z**3)), float(np.mean(z**4))


def expected_max_sharpe(var_sr: float, n_trials: int) -> float:
    """SR0: the expected maximum per-bar Sharpe ratio of N unskilled trials."""
    if n_trials < 2:
        return 0.0
    a = _N.inv_cdf(1.0 - 1.0 / n_trials)
    b = _N.inv_cdf(1.0 - 1.0 / (n_trials * math.e))
    return math.sqrt(max(var_sr, 0.0)) * ((1.0 - EULER_GAMMA) * a + EULER_GAMMA * b)


def probabilistic_sharpe(sr: float, sr0: float, t: int, skew: float, kurt: float) -> float:
    """P(true SR > sr0) given the observed per-bar sr over t returns (Bailey and Lopez de Prado
    2012), adjusted for skewness and kurtosis."""
    den = 1.0 - skew * sr + (kurt - 1.0) / 4.0 * sr * sr
    if t < 2 or den <= 0:
        return float("nan")
    return _N.cdf((sr - sr0) * math.sqrt(t - 1) / math.sqrt(den))


def deflated_sharpe(
    trials: list[np.ndarray],
    population: list[float] | None = None,
    extra: int = 0,
    source: str = "",
) -> dict:
    """DSR of the best of `trials` (per-bar return series). N and V[SR_n] come from
    `population` (per-bar Sharpe ratios of every trial made, these among them) when given, else
    from `trials`; `extra` trials made elsewhere are added to N."""
    if not trials:
        raise ReportError("deflated Sharpe ratio: no trials")
    srs = [moments(r)[0] for r in trials]
    best = int(np.argmax(srs))
    sr, skew, kurt = moments(trials[best])
    pop = list(population) if population else srs
    var = float(np.var(pop, ddof=1)) if len(pop) > 1 else 0.0
    n = len(pop) + extra
    sr0 = expected_max_sharpe(var, n)
    return {
        "dsr": probabilistic_sharpe(sr, sr0, len(trials[best]), skew, kurt),
        "best_trial": best,
        "best_sharpe_per_bar": sr,
        "sr0_per_bar": sr0,
        "trials": n,
        "trials_source": source or f"the {len(pop)} trial(s) given",
        "var_sharpe_per_bar": var,
        "skew": skew,
        "kurtosis": kurt,
    }


def mlflow_trials(cfg: ReportConfig, docs: list[dict]) -> tuple[list[float], str] | None:
    """Per-bar Sharpe ratios of every training task the MLflow experiment holds for the caches
    of `docs` (each task's mean test Sharpe over its folds, de-annualised), or None when the
    store has none of them (nothing logged yet)."""
    from foxhunt.train.tracking import client_and_experiment

    client, exp_id = client_and_experiment(cfg.experiment)
    keys = sorted({d["fxcache_key"] for d in docs if d.get("fxcache_key")})
    ppy = {d["fxcache_key"]: d.get("periods_per_year") for d in docs}
    srs = []
    for key in keys:
        if not ppy.get(key):
            return None
        runs = client.search_runs([exp_id], f"tags.fxcache_key = '{key}'", max_results=50_000)
        # A task trained fold by fold (the pipeline's fold fan-out) logged one run per fold:
        # one trial, its folds' figures averaged.
        tasks: dict[tuple, list[float]] = {}
        for r in runs:
            t, m = r.data.tags, r.data.metrics
            if "seed" in t and "model" in t and "eval/mean_test_sharpe" in m:
                task = (t.get("task_digest") or r.info.run_id, t["seed"])
                tasks.setdefault(task, []).append(m["eval/mean_test_sharpe"])
        srs += [sum(v) / len(v) / math.sqrt(ppy[key]) for v in tasks.values()]
    if not srs:
        return None
    what = f"{len(srs)} training task(s) (configuration x seed) on fxcache {', '.join(keys)}"
    return srs, f"{what} in MLflow experiment '{cfg.experiment}'"


def _plot(
    path: Path, ts: np.ndarray, strat: np.ndarray, bh: np.ndarray, title: str, costs: str
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = ts.astype("datetime64[ns]")
    fig, ax = plt.subplots(figsize=(8, 3.2), dpi=100)
    ax.plot(x, np.cumprod(1.0 + strat) - 1.0, label=f"strategy ({costs})", lw=1.2)
    ax.plot(x, np.cumprod(1.0 + bh) - 1.0, label="buy and hold", lw=1.0, alpha=0.8)
    ax.set_title(title, fontsize=10)
    ax.set_ylabel("cumulative return")
    ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="upper left")
    fig.autofmt_xdate()
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp)
    plt.close(fig)
    tmp.replace(path)


def find_results(cfg: ReportConfig) -> list[Path]:
    """--results, or every task's results.json of the newest run under --runs."""
    paths = list(cfg.results)
    if not paths and cfg.runs.is_dir():
        runs = [d for d in cfg.runs.iterdir() if d.is_dir() and list(d.glob("*/results.json"))]
        if runs:
            newest = max(runs, key=lambda d: max(p.stat().st_mtime for p in d.glob("*/*.json")))
            paths = sorted(newest.glob("*/results.json"))
    if not paths:
        raise ReportError(f"no results.json given and none under {cfg.runs}; run `foxhunt train`")
    for p in paths:
        if not Path(p).is_file():
            raise ReportError(f"{p}: no such results file")
    return [Path(p) for p in paths]


def _load_results(path: Path) -> dict:
    """A results.json, refused when its task failed or its metrics are not numbers."""
    failed = path.parent / "failed.json"
    if failed.is_file():
        raise ReportError(f"{path}: its task failed ({failed}); train it again or leave it out")
    try:
        doc = json.loads(path.read_text())
        folds = doc["folds"]
    except (ValueError, KeyError, TypeError) as e:
        raise ReportError(f"{path}: not a results file of `foxhunt train` ({e})") from None
    for f in folds:
        for part in ("val", "test"):
            for m in ("sharpe", "sortino", "max_drawdown", "turnover", "hit_rate"):
                v = f.get(part, {}).get(m)
                if not isinstance(v, int | float) or not math.isfinite(v):
                    raise ReportError(
                        f"{path}: fold {f.get('fold')} {part} {m} is {v!r}, not a finite number; "
                        "a task whose metrics are not numbers is not reported"
                    )
    return doc


METRIC_COLS = ("sharpe", "sortino", "profit_factor", "max_drawdown", "turnover", "hit_rate")


def run_report(cfg: ReportConfig) -> dict:
    paths = find_results(cfg)
    cfg.out.mkdir(parents=True, exist_ok=True)
    rows, trials, plots, docs = [], [], [], []
    tasks = merge_fold_tasks([(p, _load_results(p)) for p in paths])
    for p, doc in tasks:
        docs.append(doc)
        series = []  # the task's test series: its folds' test ranges one after the other
        for f in doc["folds"]:
            rpath = Path(f.get("_dir", p.parent)) / f["test_returns"]
            if not rpath.is_file():
                raise ReportError(f"{p}: fold {f['fold']}'s test returns {rpath} are missing")
            z = np.load(rpath)
            series.append(z["strategy"])
            bh = float(np.prod(1.0 + z["buy_and_hold"]) - 1.0)
            name = f"equity-{doc['symbol']}-{doc['model']}-seed{doc['seed']}-fold{f['fold']}.png"
            title = f"{doc['symbol']} {doc['model']} seed {doc['seed']} fold {f['fold']}: test"
            costs = costs_label(doc)
            _plot(cfg.out / name, z["timestamps"], z["strategy"], z["buy_and_hold"], title, costs)
            plots.append(name)
            rows.append(
                {
                    "symbol": doc["symbol"],
                    "model": doc["model"],
                    "seed": doc["seed"],
                    "fold": f["fold"],
                    "costs": costs,
                    **{m: f["test"][m] for m in METRIC_COLS},
                    "total_return": f["test"]["total_return"],
                    "buy_and_hold": bh,
                    "val_sharpe": f["val"]["sharpe"],
                    "plot": name,
                }
            )
        trials.append(np.concatenate(series))
    agg = {f"mean_test_{m}": _mean([r[m] for r in rows]) for m in METRIC_COLS}
    found = mlflow_trials(cfg, docs) if cfg.tracking == "mlflow" else None
    if found is not None:
        population, source = found
    else:
        population, source = (
            None,
            (f"the {len(trials)} task(s) (seed) of this run alone; no MLflow experiment read"),
        )
    if cfg.extra_trials:
        source += f", plus {cfg.extra_trials} made elsewhere (--extra-trials)"
    dsr = deflated_sharpe(trials, population, cfg.extra_trials, source)
    report = {
        "rows": rows,
        "aggregate": agg,
        "comparison": comparison(docs),
        "importance": importance(tasks),
        "deflated_sharpe": dsr,
        "results": [str(p) for p in paths],
    }
    md = _markdown(report)
    write_text_atomic(cfg.out / "report.md", md)
    write_text_atomic(cfg.out / "report.html", _html(report, cfg.out))
    write_json_atomic(cfg.out / "report.json", report)
    if cfg.tracking == "mlflow":
        _log_mlflow(cfg, report)
    return report


def merge_fold_tasks(loaded: list[tuple[Path, dict]]) -> list[tuple[Path, dict]]:
    """One task trained as several (one per fold, by the pipeline's fold fan-out) put back
    together: results of the same task (`task_digest`) and seed become one document whose
    folds, in fold order, remember the directory their files are in (`_dir`)."""
    groups: dict[tuple, list[tuple[Path, dict]]] = {}
    for p, doc in loaded:
        key = (doc.get("task_digest") or str(p), doc.get("seed"))
        groups.setdefault(key, []).append((p, doc))
    out = []
    for items in groups.values():
        p, first = items[0]
        if len(items) == 1:
            out.append((p, first))
            continue
        folds = [f | {"_dir": str(q.parent)} for q, d in items for f in d["folds"]]
        out.append((p, first | {"folds": sorted(folds, key=lambda f: f["fold"])}))
    return out


def comparison(docs: list[dict]) -> list[dict]:
    """Each model's test Sharpe beside the baselines', per symbol and cost setting: the model's
    as the mean over seeds of each seed's mean over folds, with its standard error over seeds;
    a baseline's as its mean over the same folds (it does not depend on the seed, bar random's
    draws). `vs_ridge` and `vs_ridge_cost` are the ratios to the ridge baseline's and to its
    cost-aware variant's (the one to beat when costs are charged) where those are positive."""
    groups: dict[tuple, list[dict]] = {}
    for d in docs:
        groups.setdefault((d["symbol"], d["model"], costs_label(d)), []).append(d)
    out = []
    for (symbol, model, costs), ds in groups.items():
        per_seed = [float(np.mean([f["test"]["sharpe"] for f in d["folds"]])) for d in ds]
        se = float(np.std(per_seed, ddof=1) / np.sqrt(len(per_seed))) if len(ds) > 1 else None
        rows = [{"policy": model, "test_sharpe": float(np.mean(per_seed)), "se": se,
                 "seeds": len(ds)}]  # fmt: skip
        folds = [f for d in ds for f in d["folds"] if f.get("baselines")]
        if folds and len(folds) == sum(len(d["folds"]) for d in ds):
            for name in folds[0]["baselines"]:
                v = float(np.mean([f["baselines"][name]["test"]["sharpe"] for f in folds]))
                rows.append({"policy": name, "test_sharpe": v, "se": None, "seeds": None})
        for ref in ("ridge", "ridge_cost"):
            v = next((r["test_sharpe"] for r in rows if r["policy"] == ref), None)
            for r in rows:
                r[f"vs_{ref}"] = r["test_sharpe"] / v if v and v > 0 else None
        out.append({"symbol": symbol, "model": model, "costs": costs, "rows": rows})
    return out


def importance(tasks: list[tuple[Path, dict]], top: int = 10) -> list[dict]:
    """Which columns each model reads, where it says (TFT's variable selection, a fold's
    explain.json): per symbol and model, each column's weight averaged over the folds and
    seeds, the `top` largest."""
    groups: dict[tuple, list[dict]] = {}
    for path, doc in tasks:
        for f in doc["folds"]:
            file = Path(f.get("_dir", path.parent)) / f.get("explain", "")
            if f.get("explain") and file.is_file():
                w = json.loads(file.read_text())["variable_importance"]
                groups.setdefault((doc["symbol"], doc["model"]), []).append(w)
    out = []
    for (symbol, model), ws in groups.items():
        mean = {k: float(np.mean([w.get(k, 0.0) for w in ws])) for k in ws[0]}
        ranked = sorted(mean.items(), key=lambda kv: -kv[1])[:top]
        out.append({"symbol": symbol, "model": model, "folds": len(ws), "columns": ranked,
                    "uniform": 1.0 / len(mean)})  # fmt: skip
    return out


def _importance_md(rep: dict) -> list[str]:
    lines = []
    for g in rep.get("importance", []):
        lines += [
            "",
            f"### What {g['model']} reads ({g['symbol']})",
            "",
            f"Variable-selection weight on the test ranges, mean over {g['folds']} fold(s) and "
            f"seeds; {len(g['columns'])} largest of {round(1 / g['uniform'])} columns "
            f"(uniform: {g['uniform']:.3f}).",
            "",
            "| column | weight |",
            "| --- | --- |",
        ]
        lines += [f"| {name} | {w:.3f} |" for name, w in g["columns"]]
    return lines


def _comparison_md(rep: dict) -> list[str]:
    """The comparison as Markdown: one table per symbol, model and cost setting."""
    lines = []
    for g in rep.get("comparison", []):
        if len(g["rows"]) < 2:
            continue  # no baselines were evaluated
        n = g["rows"][0]["seeds"]
        lines += [
            "",
            f"### {g['symbol']} {g['model']} beside the baselines ({g['costs']})",
            "",
            f"Test Sharpe, mean over the folds; {g['model']}'s over {n} seed(s) "
            "(± standard error over seeds).",
            "",
            "| policy | test Sharpe | of ridge's | of ridge_cost's |",
            "| --- | --- | --- | --- |",
        ]
        for r in g["rows"]:
            se = f" ± {r['se']:.2f}" if r["se"] is not None else ""
            vs = " | ".join(_ratio(r.get(k)) for k in ("vs_ridge", "vs_ridge_cost"))
            lines.append(f"| {r['policy']} | {r['test_sharpe']:.2f}{se} | {vs} |")
        if any(r["policy"] == "ridge_memory" for r in g["rows"]):
            lines += [
                "",
                "ridge and ridge_cost read the bar's 50 columns; ridge_memory and "
                "ridge_memory_cost read what the agent sees, the 50 columns and its memory of "
                "the order flow (the env's `memory_decay`). With the env's `forecast` (the "
                "default) an RL agent also sees ridge_memory's forecast as a column of its "
                "state.",
            ]
    return lines


def _ratio(v: float | None) -> str:
    return f"{v:.2f}x" if v is not None else "n/a"


def _finite(v) -> bool:
    return isinstance(v, int | float) and math.isfinite(v)


def _mean(values: list) -> float | None:
    """The mean of the finite values (a profit factor is undefined, null in JSON, for a range
    without a losing bar); None when there is none."""
    ok = [v for v in values if _finite(v)]
    return float(np.mean(ok)) if ok else None


def _fmt(v: float | None, pct: bool = False, digits: int = 2) -> str:
    if not _finite(v):
        return "n/a"  # undefined: e.g. the profit factor of a range without a losing bar
    return f"{v:.{digits}%}" if pct else f"{v:.{digits}f}"


def costs_label(doc: dict) -> str:
    """What a task's returns were charged: 'net of 0.1 bp fee + 0.25 bp half spread' (per unit
    traded; the half spread on market orders) or 'costs off'."""
    env = doc.get("config", {}).get("env", {})
    fee, half = env.get("fee_bps", 0.0), env.get("half_spread_bps", 0.0)
    if not fee and not half:
        return "costs off"
    return f"net of {fee:g} bp fee + {half:g} bp half spread"


# The table of test ranges: header, and the cell of a row.
COLUMNS = (
    ("symbol", lambda r: r["symbol"]),
    ("model", lambda r: r["model"]),
    ("seed", lambda r: str(r["seed"])),
    ("fold", lambda r: str(r["fold"])),
    ("costs", lambda r: r["costs"]),
    ("Sharpe", lambda r: _fmt(r["sharpe"])),
    ("Sortino", lambda r: _fmt(r["sortino"])),
    ("profit factor", lambda r: _fmt(r["profit_factor"])),
    ("max DD", lambda r: _fmt(r["max_drawdown"], True)),
    ("turnover", lambda r: f"{r['turnover']:.3f}"),
    ("hit rate", lambda r: _fmt(r["hit_rate"], True)),
    ("return", lambda r: _fmt(r["total_return"], True)),
    ("buy & hold", lambda r: _fmt(r["buy_and_hold"], True)),
    ("val Sharpe", lambda r: _fmt(r["val_sharpe"])),
)


def _summary(rep: dict) -> list[str]:
    """The aggregate and the deflated Sharpe ratio, as sentences (Markdown emphasis)."""
    a, d = rep["aggregate"], rep["deflated_sharpe"]
    return [
        f"Mean over {len(rep['rows'])} test range(s): Sharpe {_fmt(a['mean_test_sharpe'])}, "
        f"Sortino {_fmt(a['mean_test_sortino'])}, max drawdown "
        f"{_fmt(a['mean_test_max_drawdown'], True)}, turnover {a['mean_test_turnover']:.3f}.",
        f"Deflated Sharpe ratio (Bailey and Lopez de Prado 2014) of this run's best task: "
        f"**{_fmt(d['dsr'], digits=3)}** (per-bar Sharpe {d['best_sharpe_per_bar']:.4f} against "
        f"SR0 {d['sr0_per_bar']:.4f}, the best of N = {d['trials']} unskilled trials by luck; "
        f"skew {d['skew']:.2f}, kurtosis {d['kurtosis']:.2f}). N counts {d['trials_source']}.",
    ]


def _markdown(rep: dict) -> str:
    lines = [
        "# foxhunt report: test ranges",
        "",
        "| " + " | ".join(h for h, _ in COLUMNS) + " |",
        "| " + " | ".join("---" for _ in COLUMNS) + " |",
    ]
    lines += ["| " + " | ".join(cell(r) for _, cell in COLUMNS) + " |" for r in rep["rows"]]
    for sentence in _summary(rep):
        lines += ["", sentence]
    lines += _comparison_md(rep)
    lines += _importance_md(rep)
    return "\n".join([*lines, ""])


_CSS = """
body { font-family: system-ui, sans-serif; margin: 1rem auto; max-width: 62rem; padding: 0 1rem;
       line-height: 1.4; color: #222; }
.wide { overflow-x: auto; }
table { border-collapse: collapse; font-size: 0.9rem; white-space: nowrap; }
th, td { padding: 0.3rem 0.6rem; border-bottom: 1px solid #ddd; text-align: right; }
th:nth-child(-n+5), td:nth-child(-n+5) { text-align: left; }
thead th { border-bottom: 2px solid #999; }
figure { margin: 1.5rem 0; }
img { max-width: 100%; height: auto; }
"""


def _html(rep: dict, out: Path) -> str:
    """The report as a page: the table, the summary and the equity curves inline, readable on a
    phone (the table scrolls sideways, the plots shrink)."""
    import html
    import re

    def md(text: str) -> str:
        return re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", html.escape(text))

    head = "".join(f"<th>{html.escape(h)}</th>" for h, _ in COLUMNS)
    rows = "".join(
        "<tr>" + "".join(f"<td>{html.escape(cell(r))}</td>" for _, cell in COLUMNS) + "</tr>"
        for r in rep["rows"]
    )
    body = [
        "<h1>foxhunt report: test ranges</h1>",
        f'<div class="wide"><table><thead><tr>{head}</tr></thead>',
        f"<tbody>{rows}</tbody></table></div>",
        *(f"<p>{md(s)}</p>" for s in _summary(rep)),
    ]
    for g in rep.get("comparison", []):
        if len(g["rows"]) < 2:
            continue
        title = f"{g['symbol']} {g['model']} beside the baselines ({g['costs']})"
        cells = "".join(
            "<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in (
                r["policy"],
                f"{r['test_sharpe']:.2f}" + (f" ± {r['se']:.2f}" if r["se"] is not None else ""),
                _ratio(r.get("vs_ridge")),
                _ratio(r.get("vs_ridge_cost")),
            )) + "</tr>"
            for r in g["rows"]
        )  # fmt: skip
        body += [
            f"<h2>{html.escape(title)}</h2>",
            f"<p>Test Sharpe, mean over the folds; {html.escape(g['model'])}'s over "
            f"{g['rows'][0]['seeds']} seed(s), ± standard error over seeds.</p>",
            "<table><thead><tr><th>policy</th><th>test Sharpe</th><th>of ridge's</th>"
            "<th>of ridge_cost's</th></tr>"
            f"</thead><tbody>{cells}</tbody></table>",
        ]
    for g in rep.get("importance", []):
        cells = "".join(f"<tr><td>{html.escape(n)}</td><td>{w:.3f}</td></tr>"
                        for n, w in g["columns"])  # fmt: skip
        body += [
            f"<h2>What {html.escape(g['model'])} reads ({html.escape(g['symbol'])})</h2>",
            f"<p>Variable-selection weight on the test ranges, mean over {g['folds']} fold(s) "
            f"and seeds; the {len(g['columns'])} largest of {round(1 / g['uniform'])} columns "
            f"(uniform: {g['uniform']:.3f}).</p>",
            "<table><thead><tr><th>column</th><th>weight</th></tr></thead>"
            f"<tbody>{cells}</tbody></table>",
        ]
    body.append("<h2>Equity curves (test ranges)</h2>")
    for r in rep["rows"]:
        data = base64.b64encode((out / r["plot"]).read_bytes()).decode()
        caption = html.escape(f"{r['symbol']} {r['model']} seed {r['seed']} fold {r['fold']}, "
                              f"{r['costs']}")  # fmt: skip
        body.append(
            f'<figure><img alt="{caption}" src="data:image/png;base64,{data}"/>'
            f"<figcaption>{caption}</figcaption></figure>"
        )
    return (
        '<!doctype html>\n<html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>foxhunt report</title><style>{_CSS}</style></head>\n<body>\n"
        + "\n".join(body)
        + "\n</body></html>\n"
    )


def _log_mlflow(cfg: ReportConfig, rep: dict) -> None:
    from foxhunt.train.tracking import client_and_experiment

    client, exp_id = client_and_experiment(cfg.experiment)
    if cfg.run_id:
        rid = cfg.run_id
        for k, v in cfg.tags.items():
            client.set_tag(rid, k, v)
    else:
        tags = {"foxhunt.step": "report", **cfg.tags}
        rid = client.create_run(exp_id, run_name="report", tags=tags).info.run_id
    metrics = {f"eval/{k}": v for k, v in rep["aggregate"].items()}
    metrics["eval/deflated_sharpe"] = rep["deflated_sharpe"]["dsr"]
    for k, v in metrics.items():
        if _finite(v):
            client.log_metric(rid, k, v)
    for name in ("report.md", "report.html", "report.json"):
        client.log_artifact(rid, str(cfg.out / name))
    for r in rep["rows"]:
        client.log_artifact(rid, str(cfg.out / r["plot"]), "plots")
    client.set_terminated(rid)
