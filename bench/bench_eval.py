"""Exact evaluation's time by piece count: a DQN's greedy policy (two epochs of training at the
GPU defaults, so that it trades) and a thresholded signal, walked over a val range of the
standard market (29% of the 2M bars: a month of the plan's folds) in K pieces that carry their
state (foxhunt.train.evaluate). Every K must give the same returns; the fastest sets the GPU's
default piece count.

    python3 bench/bench_eval.py                 on a CUDA device (captured steps)
    python3 bench/bench_eval.py --cpu-smoke     20k bars, tiny DQN, eager

Prints policy, pieces, median ms an evaluation (of 7), passes, and whether the returns equal
the first piece count's. `--compile` adds the DQN's rows with the evaluation's step compiled
(Evaluator(compile=True), `foxhunt train --compile-eval`), whose returns are compared with the
uncompiled first row's.

    python3 bench/bench_eval.py --baselines     a fold's baselines (foxhunt.train.baselines:
                                                fits, val and test of every policy, the
                                                thresholds chosen on val), the memory on

Prints pieces, median seconds a fold (of 3), whether the 3 runs gave the same figures, and
whether every deterministic baseline's figures equal the first piece count's, naming each that
differs.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from foxhunt.bench.workload import STANDARD_DQN, standard_market
from foxhunt.train.agents.dqn import DQNConfig, RainbowAgent
from foxhunt.train.baselines import evaluate_baselines, signal_policy
from foxhunt.train.data import MarketData
from foxhunt.train.env import EnvConfig
from foxhunt.train.evaluate import Evaluator

TINY = {"envs": 64, "batch_size": 64, "collect_steps": 8, "learn_steps": 8,
        "replay_capacity": 4096}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--pieces", default=None, help="comma-separated piece counts")
    ap.add_argument("--compile", action="store_true", help="also the DQN's step compiled")
    ap.add_argument("--baselines", action="store_true", help="a fold's baselines instead")
    args = ap.parse_args()
    smoke = args.cpu_smoke
    dev = torch.device("cpu" if smoke else "cuda")
    n = 20_000 if smoke else 2_000_000
    feats, ofi, ohlc = standard_market(n)
    data = MarketData(feats, ofi, ohlc, dev)
    train = (0, int(n * 0.6))
    val = (train[1], train[1] + n * 29 // 200)
    if args.baselines:
        test = (val[1], val[1] + n * 29 // 200)
        baselines(data, {"train": train, "val": val, "test": test}, args.pieces, smoke)
        return
    cfg = DQNConfig(capture="eager", compile=False, **STANDARD_DQN, **(TINY if smoke else {}))
    agent = RainbowAgent(cfg, EnvConfig(), data, 0)
    agent.reset_fold(*train, seed=1)
    for e in range(2):
        agent.begin_epoch(e, 2)
        agent.collect()
        agent.learn()
    # name -> (policy, the evaluation's step compiled, the row whose returns it must give)
    policies = {
        "dqn": (agent.greedy, False, "dqn"),
        "signal": (signal_policy(torch.tensor(feats[:, 0], device=dev), 1.0), False, "signal"),
    }
    if args.compile:
        policies["dqn-comp"] = (agent.greedy, True, "dqn")
    default = "16,64,256" if smoke else "1024,2048,4096,8192,16384"
    counts = [int(k) for k in (args.pieces or default).split(",")]
    capture = not smoke  # CUDA graphs on a GPU

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    print(f"{val[1] - val[0]} val bars on {dev}")
    print(f"{'policy':8s} {'pieces':>7s} {'ms':>8s} {'passes':>6s}  same returns")
    firsts: dict[str, torch.Tensor] = {}
    for name, (policy, comp, same_as) in policies.items():
        for k in counts:
            ev = Evaluator(EnvConfig(), data, k, capture=capture, compile=comp)
            # graph=True: the policies are graph-safe (captured on a GPU; compiled with comp)
            ev.run(policy, *val, graph=True)
            times = []
            for _ in range(3 if smoke else 7):
                sync()
                t0 = time.perf_counter()
                r, _ = ev.run(policy, *val, graph=True)
                sync()
                times.append(time.perf_counter() - t0)
            r = r.clone()
            same = torch.equal(r, firsts.setdefault(same_as, r))
            print(f"{name:8s} {k:7d} {statistics.median(times) * 1e3:8.1f} {ev.last_passes:6d}  "
                  f"{same}", flush=True)  # fmt: skip


def baselines(data: MarketData, ranges: dict, pieces: str | None, smoke: bool) -> None:
    """A fold's baselines at each piece count: median seconds of 3; whether the 3 runs gave
    the same figures, and whether those are the first piece count's (any that differ named)."""
    data.use_memory(0.5)  # as an agent's task has it (EnvConfig's memory_decay)
    counts = [int(k) for k in (pieces or ("16,64,256" if smoke else "1024,4096")).split(",")]
    print(f"{ranges['val'][1] - ranges['val'][0]} val and test bars on {data.device}")
    print(f"{'pieces':>7s} {'s a fold':>9s}  {'repeatable':10s}  same figures")
    first = None
    for k in counts:
        ev = Evaluator(EnvConfig(), data, k)
        times, runs = [], []
        for _ in range(3):
            t0 = time.perf_counter()
            out = evaluate_baselines(ev, data, ranges, 98_280.0, seed=0)  # 1-min bars' year
            if data.device.type == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
            runs.append({name: b for name, b in out.items() if name != "random"})
        figures = runs[0]
        first = first or figures
        repeats = [f"run {n} against run 1: {where}" for n, run in enumerate(runs[1:], 2)
                   for where in differences(figures, run)]  # fmt: skip
        against = [f"against {counts[0]} pieces: {w}" for w in differences(first, figures)]
        print(f"{k:7d} {statistics.median(times):9.3f}  {not repeats!s:10s}  {not against}",
              flush=True)  # fmt: skip
        for where in repeats + against:
            print(f"        {where}")


def differences(a: dict, b: dict) -> list[str]:
    """'name.part.metric: a against b' for each figure of two baseline results that differs."""
    out = []
    for name, parts in a.items():
        for part, m in parts.items():
            o = b[name][part]
            if isinstance(m, dict):
                out += [f"{name}.{part}.{f}: {v!r} against {o.get(f)!r}"
                        for f, v in m.items() if o.get(f) != v]  # fmt: skip
            elif m != o:  # the threshold chosen on val
                out.append(f"{name}.{part}: {m!r} against {o!r}")
    return out


if __name__ == "__main__":
    main()
