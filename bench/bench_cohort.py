"""Many agents on one GPU: the epoch of K agents trained side by side (foxhunt.train.cohort)
against one agent's, on the standard workload (../shared/bench/README.md: 2,000,000 bars, the
model's GPU defaults).

    python3 bench/bench_cohort.py                   on a CUDA device (goal: 8 agents <= 2x one)
    python3 bench/bench_cohort.py --sizes demo      the demo's sizes (512 DQN envs, batch 256):
                                                    agents small enough to share the GPU
    python3 bench/bench_cohort.py --cpu-smoke       tiny sizes on the CPU: checks the script runs
    python3 bench/bench_cohort.py --set noisy=true epsilon=0     config fields over the sizes
    python3 bench/bench_cohort.py --sizes demo --compile --forms stacked --profile
                                                    the kernels of one agent's steps and the stack's
    python3 bench/bench_cohort.py --sizes demo --compile --forms stacked --uncompiled-sample
                                                    the stack's replay sample uncompiled
    python3 bench/bench_cohort.py --sizes demo --compile --forms stacked --no-compiled-grad-gather
                                                    the stack's gradient accumulated by backward
                                                    and concatenated, not gathered by one compiled
                                                    function (dqn_stacked.COMPILED_GRAD_GATHER)

Forms: one agent alone; K agents one after another on the default stream (`sequential`); K
agents each on a CUDA stream of its own (`streams`); for the DQN, K agents stacked into one
(`stacked`, foxhunt.train.agents.dqn_stacked: each step vmapped over the agents). Each: the
agents built (seeds 0..K-1), captured as CUDA graphs (uncompiled by default: K compiled
agents compile K times; `--compile` to include it), a fold reset, `--warmup` epochs, then the
median of `--epochs` timed epochs (collection and learning of every agent; evaluation is not
part of it, as in `foxhunt bench`'s train_s). `--forms` picks forms. Prints a table, and whether
the unstacked forms trained alike (every agent's statistics of the last epoch the same in each,
agent 0's the same as the lone agent's); JSON to $OUT or /tmp.
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

from foxhunt.bench.workload import (
    STANDARD_DQN,
    kernel_profile,
    model_config,
    results_path,
    standard_market,
)
from foxhunt.train import demo
from foxhunt.train.agents import AGENTS, dqn_stacked
from foxhunt.train.cohort import Cohort
from foxhunt.train.data import MarketData
from foxhunt.train.env import EnvConfig


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def time_form(model: str, cfg, data: MarketData, k: int, form: str, args) -> dict:
    dev = data.device
    t0 = time.perf_counter()
    agents = [AGENTS[model].load()[1](cfg, EnvConfig(), data, seed=s) for s in range(k)]
    cohort = Cohort(agents, streams=form == "streams", stacked=form == "stacked")
    if cohort.stack is not None and args.uncompiled_sample:
        cohort.stack._sample_parts = ()  # the sample's work around its scan in torch's kernels
    if agents[0].cfg.capture == "graph":
        cohort.capture()
    train = (0, int(data.n * 0.6))
    cohort.reset_fold(*train, list(range(1, k + 1)))
    sync(dev)
    setup = time.perf_counter() - t0
    times = []
    total = args.warmup + args.epochs
    for e in range(total):
        cohort.begin_epoch(e, total)
        sync(dev)
        t0 = time.perf_counter()
        cohort.train_epoch()
        sync(dev)
        if e >= args.warmup:
            times.append(time.perf_counter() - t0)
        stats = cohort.read_stats()
    if args.profile and dev.type == "cuda" and (k == 1 or form == "stacked"):  # one, the stack
        one = cohort.stack if cohort.stack is not None else agents[0]
        label = f"{model} {k} {form}"
        kernel_profile(one._learn_step, f"{label}: a learning step", rows=args.profile_rows)
        kernel_profile(one._collect_block, f"{label}: a collection block", steps=3,
                       rows=args.profile_rows)  # fmt: skip
    del cohort, agents
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    return {"median_s": statistics.median(times), "epochs_s": times, "setup_s": setup,
            "last_stats": stats}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--model", default="dqn", choices=("dqn", "ppo", "pqn"))
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--epochs", type=int, default=5)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--profile", action="store_true",
                    help="the CUDA kernels of a learning step and a collection block, by name, "
                    "for one agent and the stack (outside their graphs)")  # fmt: skip
    ap.add_argument("--profile-rows", type=int, default=25, help="kernels the profile lists")
    ap.add_argument(
        "--forms",
        default="one,sequential,streams,stacked",
        help="the forms to time, of one,sequential,streams,stacked",
    )
    ap.add_argument("--uncompiled-sample", action="store_true",
                    help="the stack's replay sample without its two compiled parts "
                    "(dqn_stacked.sample_points, sampled_slots): what they buy")  # fmt: skip
    ap.add_argument("--no-compiled-grad-gather", action="store_true",
                    help="the stack's gradient accumulated by backward and concatenated, "
                    "not gathered by one compiled function "
                    "(dqn_stacked.COMPILED_GRAD_GATHER)")  # fmt: skip
    ap.add_argument("--sizes", choices=("default", "demo"), default="default",
                    help="the model's GPU defaults (the standard workload) or the demo's sizes "
                    "(foxhunt.train.demo: 512 DQN envs, batch 256, ...)")  # fmt: skip
    ap.add_argument("--set", nargs="*", default=[], metavar="FIELD=VALUE",
                    help="the model config's fields over the chosen sizes (JSON values), "
                    "e.g. noisy=true epsilon=0")  # fmt: skip
    args = ap.parse_args()
    dqn_stacked.COMPILED_GRAD_GATHER = not args.no_compiled_grad_gather
    smoke = args.cpu_smoke
    dev = torch.device("cpu" if smoke else "cuda")
    n = 20_000 if smoke else 2_000_000
    data = MarketData(*standard_market(n), dev)
    sets: dict = {"compile": args.compile}
    if smoke:
        args.agents, args.warmup, args.epochs = 2, 0, 1
        small = {"envs": 256, "collect_steps": 8, "learn_steps": 8, "batch_size": 64,
                 "replay_capacity": 8192, "rollout_steps": 8}  # fmt: skip
        known = {f for f in model_config(args.model, {}).__dataclass_fields__}
        sets |= {k: v for k, v in small.items() if k in known}
    if args.sizes == "demo":  # the demo's config, captured (and compiled) as on a GPU
        cfg = dataclasses.replace(getattr(demo, args.model.upper()), compile=args.compile)
    else:
        cfg = model_config(args.model, sets | (STANDARD_DQN if args.model == "dqn" else {}))
    over = {}
    for kv in args.set:
        field, sep, value = kv.partition("=")
        if not sep:
            sys.exit(f"--set {kv!r}: expected field=value")
        over[field] = json.loads(value)
    if over:
        cfg = dataclasses.replace(cfg, **over)
    forms = [("one agent", 1, "sequential"),
             (f"{args.agents} sequential", args.agents, "sequential")]  # fmt: skip
    if dev.type == "cuda":
        forms.append((f"{args.agents} streams", args.agents, "streams"))
    if args.model == "dqn":
        forms.append((f"{args.agents} stacked", args.agents, "stacked"))
    name = torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"
    res: dict = {"device": name, "torch": torch.__version__, "model": args.model,
                 "compile": args.compile, "sizes": args.sizes, "forms": {}}  # fmt: skip
    chosen = set(args.forms.split(","))
    forms = [f for f in forms if f[0] == "one agent" or f[2] in chosen]
    for label, k, form in forms:
        r = time_form(args.model, cfg, data, k, form, args)
        res["forms"][label] = r | {"agents": k}
        one = res["forms"]["one agent"]["median_s"]
        print(f"{label:14s} epoch {r['median_s'] * 1e3:8.1f} ms = {r['median_s'] / one:5.2f}x one "
              f"agent's, {k * one / r['median_s']:4.2f} agents' epochs per one agent's epoch time "
              f"(set-up {r['setup_s']:.1f} s)", flush=True)  # fmt: skip
    # The agents train alike in every unstacked form: the same statistics, bit for bit (each
    # one's own generator; the same kernels on another stream), agent 0 as the lone agent.
    # Stacked, the kernels are other (wider) ones, and training carries their last bits'
    # differences on: tests/test_cohort.py (CPU, bit for bit) and tests/test_train_gpu.py
    # (GPU, to float tolerance) check it.
    one = res["forms"]["one agent"]["last_stats"][0]
    exact = [f["last_stats"] for k, f in res["forms"].items()
             if f["agents"] == args.agents and not k.endswith("stacked")]  # fmt: skip
    same = all(s == exact[0] for s in exact) and all(s[0] == one for s in exact)
    res["same_stats"] = same
    print(f"the unstacked forms' agents end their last epoch with the same statistics: {same}")
    path = results_path("bench_cohort.json")
    path.write_text(json.dumps(res, indent=2))
    print(f"results in {path}")


if __name__ == "__main__":
    main()
