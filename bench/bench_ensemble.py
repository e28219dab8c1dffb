"""The ensemble's inference latency: every member predicting a range one after another, eager
(the reference), then each member's forward captured as a CUDA graph, one after another and on
a CUDA stream each (`--modes`; `auto` is vmap over an architecture's seeds with streams across
architectures).

    python3 bench/bench_ensemble.py                  on a CUDA device (goal: >= 3x for 8 models)
    python3 bench/bench_ensemble.py --cpu-smoke      tiny sizes on the CPU: checks the script runs

Members: TLOB, CfC, Mamba-2 and TFT at their GPU defaults, `--seeds` each (2: 8 models), on the
standard workload's 2,000,000 bars (foxhunt.bench.workload.standard_market); the range is
`--bars` bars of val (100,000), predicted in pieces of `--piece` windows of 128 bars (2,048,
what evaluation uses; `--piece 1 --bars 1` times the latency of the latest bar's prediction,
what a live ensemble waits for, the members' graphs then captured over one window). Untrained
weights: the latency does not depend on them. Each mode: one warm-up, then the median of
`--repeats`; every mode's probabilities are compared with the first's (a mode without
`+graph` after one with it would replay the graphs too: list the eager ones first). Prints a
table; JSON to $OUT or /tmp.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_train import sync
from foxhunt.bench.workload import results_path, standard_market
from foxhunt.train.data import MarketData
from foxhunt.train.env import EnvConfig
from foxhunt.train.models.ensemble import EnsembleAgent, EnsembleConfig


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--bars", type=int, default=100_000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--members", default="tlob,cfc,mamba2,tft")
    ap.add_argument(
        "--piece",
        type=int,
        default=None,
        help="windows a prediction piece holds (default: the agents' 2,048)",
    )
    ap.add_argument(
        "--modes",
        default=None,
        help="the forms timed, the first the reference: `parallel` values of EnsembleConfig, "
        "`+graph` for the members' captured forwards (default on a GPU: sequential, "
        "sequential+graph, streams+graph; --cpu-smoke: sequential, vmap)",
    )
    args = ap.parse_args()
    smoke = args.cpu_smoke
    args.modes = args.modes or ("sequential,vmap" if smoke else
                                "sequential,sequential+graph,streams+graph")  # fmt: skip
    dev = torch.device("cpu" if smoke else "cuda")
    n = 20_000 if smoke else 2_000_000
    t_start = time.perf_counter()
    data = MarketData(*standard_market(n), dev)
    # A fixed training batch: the latency does not depend on it, and the device sizer's probes
    # (each member's forward and backward at growing batches) would only add to the set-up.
    small = dict(window=16, batch_size=64) if smoke else dict(batch_size=1024)
    cfg = EnsembleConfig(members=tuple(args.members.split(",")), seeds=args.seeds)
    cfg = dataclasses.replace(cfg, **{m: dataclasses.replace(getattr(cfg, m), **small)
                                      for m in cfg.members})  # fmt: skip
    agent = EnsembleAgent(cfg, EnvConfig(), data, seed=0)
    train = (0, int(n * 0.6))
    agent.reset_fold(*train, seed=1)
    print(f"{len(agent.members)} members built and reset in {time.perf_counter() - t_start:.1f} s",
          flush=True)  # fmt: skip
    for m in agent.members:
        m.predict_batch = args.piece or m.predict_batch
    lo = train[1]
    hi = lo + (2_000 if smoke else args.bars)
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    res: dict = {"device": name, "torch": torch.__version__, "members": len(agent.members),
                 "bars": hi - lo, "piece": agent.members[0].predict_batch}  # fmt: skip
    out = {}
    modes = args.modes.split(",")
    for mode in modes:
        parallel, _, captured = mode.partition("+")
        if captured and not any("predict" in m.graphs for m in agent.members):
            for m in agent.members:  # each member's forward over a piece, as a CUDA graph
                m.capture_predict()
        agent.cfg = dataclasses.replace(agent.cfg, parallel=parallel)
        agent.member_predictions(lo, hi)  # warm-up
        times = []
        for _ in range(1 if smoke else args.repeats):
            sync(dev)
            t0 = time.perf_counter()
            out[mode] = agent.member_predictions(lo, hi)
            sync(dev)
            times.append(time.perf_counter() - t0)
        res[mode] = {"median_s": statistics.median(times), "runs_s": times}
        runs = ", ".join(f"{t * 1e3:.1f}" for t in sorted(times)[:: max(1, len(times) // 5)])
        print(f"{mode:20s} {len(agent.members)} models, {hi - lo:,} bars, pieces of "
              f"{agent.members[0].predict_batch}: "
              f"{statistics.median(times) * 1e3:8.2f} ms (runs, sorted: {runs})",
              flush=True)  # fmt: skip
    first = modes[0]
    for m in modes[1:]:
        res[m]["max_prob_diff"] = float((out[m] - out[first]).abs().max())
        res[m]["speedup"] = res[first]["median_s"] / res[m]["median_s"]
        print(f"{m} against {first}: {res[m]['speedup']:.2f}x faster; the same probabilities "
              f"within {res[m]['max_prob_diff']:.2g}")  # fmt: skip
    piece = f"_piece{args.piece}" if args.piece else ""
    path = results_path(f"bench_ensemble{piece}.json")
    path.write_text(json.dumps(res, indent=2))
    print(f"results in {path}")


if __name__ == "__main__":
    main()
