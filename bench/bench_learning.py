"""How well does the DQN trade the demo market, beside the baselines it must beat?

    python bench/bench_learning.py [--data data] [--seeds 0,1,2] [--costs off,on]
                                   [--device cpu|cuda] [--sizes demo|default]

(after `make run`; CPU demo sizes: ~3 minutes a seed and cost setting on 2 cores.)

Trains the DQN with the demo settings (foxhunt.train.demo; `--sizes default` takes the GPU
defaults of DQNConfig instead) on the ES demo cache and its folds, once per seed and cost
setting, and puts beside it, on the same val and test ranges, env, costs and metrics code
(foxhunt.train.baselines): flat, buy and hold, random, ridge and logistic regressions on the 50
observable columns (sign traded, and cost-aware with a threshold chosen on val), and the oracle
that knows the latent order-flow pressure s[t] that synth planted (rebuilt from synth.json's seed
and parameters) and holds sign(s[t]) (cost-aware variant too). Sharpe ratios are annualised,
the mean over the folds; the DQN's is the mean over seeds with its standard error. "costs off"
charges nothing; "costs on" the env's defaults (0.1 bp fee + 0.25 bp half spread per unit
traded by market orders).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from foxhunt.fxcache import FxCache
from foxhunt.train import TrainConfig, demo, run_train
from foxhunt.train.agents.dqn import DQNConfig
from foxhunt.train.baselines import evaluate_baselines, signal_policy
from foxhunt.train.data import MarketData
from foxhunt.train.env import EnvConfig
from foxhunt.train.evaluate import Evaluator
from foxhunt.train.metrics import periods_per_year, trading_metrics
from foxhunt.train.tracking import NullLogger

COSTS = {
    "off": {"fee_bps": 0.0, "half_spread_bps": 0.0},
    "on": {"fee_bps": EnvConfig.fee_bps, "half_spread_bps": EnvConfig.half_spread_bps},
}


def pressure_by_timestamp(raw: Path, root: str) -> dict[int, float]:
    """synth's latent pressure s of every bar, keyed by the fxcache bar label (bar end, UTC ns);
    empty without synth.json (or without synth's dependencies, as on the GPU image)."""
    try:
        from foxhunt.synth.contracts import ROOTS, SESSIONS, trading_days
        from foxhunt.synth.generate import SynthConfig
        from foxhunt.synth.market import bar_path
    except ImportError:
        return {}
    if not (raw / "GLBX.MDP3" / "synth.json").exists():
        return {}
    meta = json.loads((raw / "GLBX.MDP3" / "synth.json").read_text())["config"]
    cfg = SynthConfig(
        start=dt.date.fromisoformat(meta["start"]), end=dt.date.fromisoformat(meta["end"]),
        seed=meta["seed"], session=meta["session"], signal=meta["signal"],
        impact=meta["impact"], flow=meta["flow"], events_per_bar=meta["events_per_bar"],
    )  # fmt: skip
    days = trading_days(cfg.start, cfg.end)
    path = bar_path(ROOTS[root], days, cfg.params(), cfg.seed)
    open_t, bars = SESSIONS[cfg.session]
    chicago = ZoneInfo("America/Chicago")
    out = {}
    for d, day in enumerate(days):
        o = dt.datetime.combine(day, open_t, tzinfo=chicago)
        o_ns = int(o.timestamp()) * 10**9
        for m in range(bars):
            out[o_ns + (m + 1) * 60 * 10**9] = float(path.pressure[d, m])
    return out


def oracle_rows(evaluator, data, folds, pressure, ppy) -> dict[str, list[dict]]:
    """The oracle (sign of the planted pressure) and its cost-aware variant, per fold."""
    score = torch.tensor(np.nan_to_num(pressure), dtype=torch.float32, device=data.device)
    out = {"oracle": [], "oracle_cost": []}
    for f in folds:

        def run(thr, part, f=f):
            r, tr = evaluator.run(signal_policy(score, thr), f[f"{part}_start"], f[f"{part}_end"])
            return trading_metrics(r, tr, ppy, evaluator.last_positions)

        out["oracle"].append({"val": run(0.0, "val"), "test": run(0.0, "test")})
        best = max((run(q, "val")["sharpe"], q) for q in (0.0, 0.5, 1.0, 1.5, 2.0))
        out["oracle_cost"].append({"val": run(best[1], "val"), "test": run(best[1], "test")})
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("data"))
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--costs", default="off,on", help="off, on or both (off,on)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", choices=("demo", "default"), default="demo")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument(
        "--set",
        nargs="*",
        default=[],
        metavar="FIELD=VALUE",
        help="DQNConfig fields over the chosen sizes, e.g. gamma=0.9 n_step=1",
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_learning"))
    args = ap.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(2)
    seeds = [int(s) for s in args.seeds.split(",")]
    # `make folds` writes folds/ES.json, the pipeline folds/ES-<key>.json: take the newest.
    candidates = sorted((args.data / "folds").glob("ES*.json"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        sys.exit(f"no ES folds under {args.data / 'folds'}: run `make run` first")
    folds_path = candidates[-1]
    doc = json.loads(folds_path.read_text())
    cache = FxCache.open(args.data / "fxcache", doc["fxcache_key"])
    device = torch.device(args.device)
    data = MarketData.from_fxcache(cache, device)
    ppy = periods_per_year(cache.timestamps)
    s_of = pressure_by_timestamp(args.data / "raw", "ES")
    pressure = np.array([s_of.get(int(ts), np.nan) for ts in cache.timestamps])
    if args.sizes == "demo":
        dqn, env0, epochs, segments = demo.DQN, demo.ENV, demo.EPOCHS, demo.EVAL_SEGMENTS
    else:
        dqn, env0, epochs, segments = DQNConfig(), EnvConfig(), 10, None
    epochs = args.epochs or epochs
    fields = {f.name: f.type for f in dataclasses.fields(DQNConfig)}
    for kv in args.set:
        k, _, v = kv.partition("=")
        if k not in fields:
            sys.exit(f"--set {kv}: DQNConfig has no field {k!r}")
        dqn = dataclasses.replace(dqn, **{k: json.loads(v)})
    print(f"ES demo cache {cache.key}: {len(cache)} bars, {len(doc['folds'])} folds; "
          f"{np.isfinite(pressure).mean():.1%} matched to synth's pressure; "
          f"DQN {args.sizes} sizes {' '.join(args.set)}, {epochs} epochs, seeds {seeds}, "
          f"device {device}")  # fmt: skip
    for costs in args.costs.split(","):
        env = dataclasses.replace(env0, **COSTS[costs])
        rows: dict[str, list] = {}
        t0 = time.perf_counter()
        for seed in seeds:
            res = run_train(
                TrainConfig(folds=folds_path, cache=args.data / "fxcache", epochs=epochs,
                            seed=seed, device=args.device, tracking="none", out=args.out,
                            resume=False, eval_segments=segments, env=env, dqn=dqn,
                            baselines=False),  # evaluated below, once for all seeds
                NullLogger(),
            )  # fmt: skip
            rows.setdefault("dqn", []).append(res.folds)
        train_s = (time.perf_counter() - t0) / len(seeds)
        evaluator = Evaluator(env, data, 64)
        base = []
        for f in doc["folds"]:
            ranges = {p: (f[f"{p}_start"], f[f"{p}_end"]) for p in ("train", "val", "test")}
            base.append(evaluate_baselines(evaluator, data, ranges, ppy, 0))
        table = {"dqn": rows["dqn"]}
        for name in base[0]:
            table[name] = [[b[name] for b in base]]
        if np.isfinite(pressure).any():
            oracle = oracle_rows(evaluator, data, doc["folds"], pressure, ppy)
            table |= {k: [v] for k, v in oracle.items()}
        report(costs, env, table, train_s)


def report(costs: str, env: EnvConfig, table: dict, train_s: float) -> None:
    """One row per policy: mean over folds, then mean and standard error over seeds."""
    charged = (
        "costs off"
        if costs == "off"
        else f"costs on: {env.fee_bps} bp fee + {env.half_spread_bps} bp half spread per unit"
    )
    print(f"\n{charged}; DQN {train_s:.0f} s per seed")
    print(f"{'policy':15s} {'val Sharpe':>16s} {'test Sharpe':>16s}  {'test short/flat/long':>20s}"
          f"  {'test vs ridge':>13s}  seeds")  # fmt: skip

    def fold_mean(folds, part, key):
        return statistics.mean(f[part][key] for f in folds)

    ridge_test = fold_mean(table["ridge"][0], "test", "sharpe")
    for name, runs in table.items():
        val = [fold_mean(r, "val", "sharpe") for r in runs]
        test = [fold_mean(r, "test", "sharpe") for r in runs]

        def ms(x):
            if len(x) == 1:
                return f"{x[0]:7.2f}        "
            se = statistics.stdev(x) / len(x) ** 0.5
            return f"{statistics.mean(x):7.2f} ± {se:5.2f}"

        usage = ""
        if "short" in runs[0][0]["test"]:
            u = [statistics.mean(fold_mean(r, "test", k) for r in runs) for k in
                 ("short", "flat", "long")]  # fmt: skip
            usage = f"{u[0]:.0%}/{u[1]:.0%}/{u[2]:.0%}"
        vs = statistics.mean(test) / ridge_test if ridge_test > 0 else float("nan")
        seeds = " ".join(f"{t:.1f}" for t in test) if len(test) > 1 else ""
        print(f"{name:15s} {ms(val):>16s} {ms(test):>16s}  {usage:>20s}  {vs:13.2f}  {seeds}")


if __name__ == "__main__":
    main()
