"""How well do the agents trade the demo market, beside the baselines they must beat?

    python bench/bench_learning.py [--data data] [--models dqn,ppo,pqn] [--seeds 0,1,2]
                                   [--costs on,off] [--jobs 2] [--device cpu|cuda]
                                   [--sizes demo|default] [--set pqn.gamma=0.95 ...]
                                   [--epoch-log] [--ensemble 3]

(after `make run`; on 2 cores with --jobs 2, about 12 minutes for the three models, three seeds
and both cost settings. `--models none` evaluates the baselines alone, in seconds: with `--set
env.memory_decay=0.7`, say, the ridge on the agents' memory at another decay.)

Trains each model with the demo settings (foxhunt.train.demo; `--sizes default` takes each
config's defaults, i.e. the GPU sizes on a GPU) on the ES demo cache and its folds, once per
seed and cost setting, and puts beside them, on the same val and test ranges, env, costs and
metrics code (foxhunt.train.baselines): flat, buy and hold, random, ridge and logistic
regressions on the 50 observable columns (sign traded, and cost-aware with a threshold chosen on
val), and the oracle that knows the latent order-flow pressure s[t] that synth planted (rebuilt
from synth.json's seed and parameters) and holds sign(s[t]) (cost-aware variant too). Sharpe
ratios are annualised, the mean over the folds; a model's is the mean over seeds with its
standard error, and each fold's test figure (mean over seeds) is printed beside. "costs on"
charges the env's defaults (0.1 bp fee + 0.25 bp half spread per unit traded by market orders),
"costs off" nothing. With --jobs N the tasks run in N processes of one thread each (a seed's
figures depend on the thread count: compare on one setting).

`--ensemble N` (DQN) adds the row `dqn_ensemble<N>`: the seeds taken N at a time in their order,
each group acting greedily on the mean of its members' expected Q-values (each fold's best
checkpoints), evaluated as the rest; mean and standard error over the groups.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import logging
import statistics
import sys
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from foxhunt.folds import fold_ranges
from foxhunt.fxcache import FxCache
from foxhunt.train import TrainConfig, demo, run_train
from foxhunt.train.agents import AGENTS
from foxhunt.train.agents.common import Observation
from foxhunt.train.baselines import evaluate_baselines, signal_policy
from foxhunt.train.data import MarketData
from foxhunt.train.env import EnvConfig, joint_table
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
        impact=meta["impact"], persistence=meta.get("persistence", 0.0), flow=meta["flow"],
        events_per_bar=meta["events_per_bar"],
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


def train_one(job: dict) -> tuple[str, str, list, float, Path]:
    """One training task (a process of its own with --jobs): (model, costs, folds, seconds, the
    run's directory)."""
    if job["device"] == "cpu":
        torch.set_num_threads(job["threads"])
    if job.get("epoch_log"):  # foxhunt.train's epoch lines, each with its task's name
        tag = f"{job['model']}-{job['costs']}-s{job['cfg']['seed']}"
        fmt = f"{tag} %(message)s"
        logging.basicConfig(level=logging.INFO, format=fmt, stream=sys.stdout, force=True)
        for name in ("torch", "torch._dynamo", "torch._inductor"):
            logging.getLogger(name).setLevel(logging.ERROR)
    t0 = time.perf_counter()
    res = run_train(TrainConfig(**job["cfg"]), NullLogger())
    s = time.perf_counter() - t0
    test = statistics.mean(f["test"]["sharpe"] for f in res.folds)
    print(f"  {job['model']} costs {job['costs']} seed {job['cfg']['seed']}: test Sharpe "
          f"{test:.2f} ({s:.0f} s)", flush=True)  # fmt: skip
    return job["model"], job["costs"], res.folds, s, res.run_dir


def q_ensemble(checkpoints: list[Path], obs: Observation, device: torch.device):
    """The greedy policy on the mean expected Q-value of DQN checkpoints (one fold's, one per
    seed; each as a served checkpoint values states), as the evaluator calls a policy: (bars,
    portfolios) -> branch actions."""
    from safetensors.torch import load_file

    from foxhunt.train.agents.dqn import served_q_values
    from foxhunt.train.policy import Policy

    members = [served_q_values(Policy.config_of(ck)[1], load_file(str(ck), device=str(device)))
               for ck in checkpoints]  # fmt: skip
    joint = joint_table(device)

    def act(t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        x = obs(t, portfolio)
        q = torch.stack([q_values(x) for q_values in members]).mean(0)
        return joint.index_select(0, q.argmax(-1))

    return act


def ensemble_rows(evaluator, data, folds, run_dirs: list[Path], n: int, env, ppy) -> list:
    """Each group of n runs' (seeds') mean-Q policy on every fold: [[{val, test} per fold]]."""
    obs = Observation(data, env.memory_decay, env.forecast)
    rows = []
    for g in range(0, len(run_dirs) - n + 1, n):
        group = run_dirs[g : g + n]
        per_fold = []
        for f in folds:
            ranges = fold_ranges(f)
            data.fit_normaliser(*ranges["train"])  # the normaliser each member trained with
            ckpts = [d / f"fold-{f['fold']}" / "best.safetensors" for d in group]
            policy = q_ensemble(ckpts, obs, data.device)
            per_fold.append({p: trading_metrics(*evaluator.run(policy, *ranges[p]), ppy,
                                                evaluator.last_positions)
                             for p in ("val", "test")})  # fmt: skip
        rows.append(per_fold)
    return rows


def env_sets(env: EnvConfig, sets: list[str]) -> tuple[EnvConfig, list[str]]:
    """`env.field=value` of --set applied to the env config; the other --set items returned."""
    rest = []
    for kv in sets:
        k, _, v = kv.partition("=")
        if not k.startswith("env."):
            rest.append(kv)
            continue
        env = dataclasses.replace(env, **{k.removeprefix("env."): set_value(v)})
    return env, rest


def set_value(v: str):
    """A --set value: JSON (numbers, booleans, lists), else the bare string (full_market)."""
    try:
        return json.loads(v)
    except ValueError:
        return v


def model_configs(sizes: str, sets: list[str]) -> dict:
    """Each model's config at the chosen sizes, with --set fields applied: `model.field=value`
    for one model, `field=value` for every model that has the field."""
    if sizes == "demo":
        cfgs = {"dqn": demo.DQN, "ppo": demo.PPO, "pqn": demo.PQN, "tlob": demo.TLOB,
                "cfc": demo.CFC, "mamba2": demo.MAMBA2, "tft": demo.TFT,
                "ensemble": demo.ENSEMBLE}  # fmt: skip
    else:
        cfgs = {m: AGENTS[m].load()[0]() for m in AGENTS}
    for kv in sets:
        k, _, v = kv.partition("=")
        model, _, name = k.rpartition(".")
        targets = [model] if model else list(cfgs)
        hit = False
        for m in targets:
            if name in {f.name for f in dataclasses.fields(cfgs[m])}:
                value = set_value(v)
                cfgs[m] = dataclasses.replace(
                    cfgs[m], **{name: tuple(value) if isinstance(value, list) else value}
                )
                hit = True
        if not hit:
            sys.exit(f"--set {kv}: no config of {', '.join(targets)} has a field {name!r}")
    return cfgs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("data"))
    ap.add_argument(
        "--models", default="dqn,ppo,pqn", help="comma-separated; none: the baselines alone"
    )
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--costs", default="on,off", help="on, off or both (on,off)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--sizes", choices=("demo", "default"), default="demo")
    ap.add_argument("--epochs", type=int, default=None)
    ap.add_argument(
        "--jobs", type=int, default=1, help="tasks in parallel processes (CPU: 1 thread each)"
    )
    ap.add_argument(
        "--set",
        nargs="+",
        action="extend",  # --set a=1 --set b=2 == --set a=1 b=2
        default=[],
        metavar="[MODEL.]FIELD=VALUE",
        help="config fields over the chosen sizes, e.g. dqn.gamma=0.9 pqn.q_lambda=0.8; "
        "env.<field> for the env, e.g. env.orders=full_market",
    )
    ap.add_argument("--out", type=Path, default=Path("/tmp/bench_learning"))
    ap.add_argument(
        "--epoch-log", action="store_true", help="each task's epoch lines (val Sharpe by epoch)"
    )
    ap.add_argument(
        "--ensemble", type=int, default=0, metavar="N",
        help="DQN: also evaluate the mean-Q policy of each N seeds in turn (dqn_ensemble<N>)",
    )  # fmt: skip
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    models = [] if args.models == "none" else args.models.split(",")
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
        env0, segments = demo.ENV, demo.EVAL_SEGMENTS
        epochs_of = {m: demo.epochs(m) for m in models}
    else:
        env0, segments = EnvConfig(), None
        epochs_of = dict.fromkeys(models, 10)
    env0, model_sets = env_sets(env0, args.set)
    if env0.memory_decay is not None:
        data.use_memory(env0.memory_decay)  # the baselines on the agents' inputs too
    cfgs = model_configs(args.sizes, model_sets)
    if args.epochs:
        epochs_of = dict.fromkeys(models, args.epochs)
    epochs = ", ".join(f"{m} {e}" for m, e in epochs_of.items())
    threads = 1 if args.jobs > 1 else 2
    print(f"ES demo cache {cache.key}: {len(cache)} bars, {len(doc['folds'])} folds; "
          f"{np.isfinite(pressure).mean():.1%} matched to synth's pressure; models {models} "
          f"at {args.sizes} sizes {' '.join(args.set)}, epochs: {epochs}, seeds {seeds}, device "
          f"{device}" + (f", {threads} thread(s) a task" if device.type == "cpu" else ""),
          flush=True)  # fmt: skip
    jobs = []
    for costs in args.costs.split(","):
        env = dataclasses.replace(env0, **COSTS[costs])
        for model in models:
            for seed in seeds:
                cfg = dict(folds=folds_path, cache=args.data / "fxcache", epochs=epochs_of[model],
                           seed=seed, device=args.device, tracking="none",
                           out=args.out / f"{model}-{costs}", resume=False,
                           eval_segments=segments, env=env, model=model, baselines=False,
                           **{model: cfgs[model]})  # baselines: below, once for all  # fmt: skip
                jobs.append({"cfg": cfg, "model": model, "costs": costs, "device": args.device,
                             "threads": threads, "epoch_log": args.epoch_log})  # fmt: skip
    if args.jobs > 1:
        import multiprocessing as mp

        with mp.get_context("spawn").Pool(args.jobs) as pool:
            done = list(pool.imap(train_one, jobs))  # in the jobs' order: seeds in order
    else:
        done = [train_one(j) for j in jobs]
    for costs in args.costs.split(","):
        env = dataclasses.replace(env0, **COSTS[costs])
        table = {m: [f for mm, c, f, _, _ in done if mm == m and c == costs] for m in models}
        secs = {m: statistics.mean(s for mm, c, _, s, _ in done if mm == m and c == costs)
                for m in models}  # fmt: skip
        evaluator = Evaluator(env, data, 64)
        if args.ensemble and "dqn" in models:
            runs = [d for mm, c, _, _, d in done if mm == "dqn" and c == costs]
            table[f"dqn_ensemble{args.ensemble}"] = ensemble_rows(
                evaluator, data, doc["folds"], runs, args.ensemble, env, ppy
            )
        base = []
        for f in doc["folds"]:
            ranges = fold_ranges(f)
            base.append(evaluate_baselines(evaluator, data, ranges, ppy, 0))
        for name in base[0]:
            table[name] = [[b[name] for b in base]]
        if np.isfinite(pressure).any():
            oracle = oracle_rows(evaluator, data, doc["folds"], pressure, ppy)
            table |= {k: [v] for k, v in oracle.items()}
        report(costs, env, table, secs)


def report(costs: str, env: EnvConfig, table: dict, secs: dict[str, float]) -> None:
    """One row per policy: mean over folds, then mean and standard error over seeds; and each
    fold's test Sharpe, the mean over seeds (where a model gains or loses against a baseline)."""
    charged = (
        "costs off"
        if costs == "off"
        else f"costs on: {env.fee_bps} bp fee + {env.half_spread_bps} bp half spread per unit"
    )
    per = ", ".join(f"{m} {s:.0f} s" for m, s in secs.items())
    print(f"\n{charged}" + (f"; training time per seed: {per}" if per else ""))
    # The issue's bars (ridge and ridge_cost on the 50 columns) and, where the agents remember
    # the order flow, the same regressions on what the agents see.
    bars = [k for k in ("ridge", "ridge_cost", "ridge_memory", "ridge_memory_cost") if k in table]
    print(f"{'policy':17s} {'val Sharpe':>16s} {'test Sharpe':>16s}  {'test short/flat/long':>20s}"
          + "".join(f"  {'of ' + k:>{max(8, len(k) + 3)}s}" for k in bars)
          + f"  {'test by fold':>13s}  seeds")  # fmt: skip

    def fold_mean(folds, part, key):
        return statistics.mean(f[part][key] for f in folds)

    refs = [fold_mean(table[k][0], "test", "sharpe") for k in bars]
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
        vs = [statistics.mean(test) / r if r > 0 else float("nan") for r in refs]
        seeds = " ".join(f"{t:.1f}" for t in test) if len(test) > 1 else ""
        by_fold = " / ".join(f"{statistics.mean(r[i]['test']['sharpe'] for r in runs):.1f}"
                             for i in range(len(runs[0])))  # fmt: skip
        ratios = "".join(f"  {v:{max(8, len(k) + 3)}.2f}" for k, v in zip(bars, vs, strict=True))
        print(f"{name:17s} {ms(val):>16s} {ms(test):>16s}  {usage:>20s}{ratios}  {by_fold:>13s}  "
              f"{seeds}")  # fmt: skip


if __name__ == "__main__":
    main()
