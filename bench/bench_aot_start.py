"""Where a cold start of the DQN's steps compiled ahead of time goes: one process over an empty
compile cache, each phase timed.

    python3 bench/bench_aot_start.py                      the standard workload on a CUDA device
    python3 bench/bench_aot_start.py --device cpu --bars 20000 --small   a check on a CPU

Builds the DQN (`--compile-mode`, `auto` by default, which checks the loader on a toy package
first; `aot` skips that check) at its GPU sizes with the standard workload's exploration and
inputs (foxhunt.bench.workload.STANDARD_DQN) over the standard synthetic market, captures it
on a GPU and runs one epoch. Prints the seconds of the process's phases and, inside them, of
the loader's toy check (`aot_probe.check`), the steps' traces (`aot.trace`), their exports and
AOTInductor builds, and g++'s calls by kind (precompiled headers, compiles, links: the calls of
this process; the toy's build runs in a process of its own). JSON to $OUT or /tmp. The
headers inductor precompiles live in torch's default cache folder, not in the compile cache:
set TMPDIR to an empty folder as well for a machine's first build.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

T0 = time.perf_counter()
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch  # noqa: E402
import torch._inductor  # noqa: E402
from torch._inductor import cpp_builder  # noqa: E402

from foxhunt.bench.workload import (  # noqa: E402
    STANDARD_DQN,
    model_config,
    one_epoch,
    results_path,
    standard_market,
)
from foxhunt.train import aot, aot_probe  # noqa: E402
from foxhunt.train.core import use_compile_cache  # noqa: E402

spent: dict[str, float] = collections.defaultdict(float)
calls: collections.Counter = collections.Counter()


def timed(owner: object, name: str, label: str) -> None:
    """Time every call of `owner.name` under `label` (g++'s by the kind of call)."""
    orig = getattr(owner, name)

    def run(*a, **k):
        t = time.perf_counter()
        try:
            return orig(*a, **k)
        finally:
            key = label
            if owner is cpp_builder:
                cmd = str(a[0])
                kind = ("headers" if "c++-header" in cmd
                        else "compile" if ".cpp" in cmd else "link")  # fmt: skip
                key = f"{label} {kind}"
            spent[key] += time.perf_counter() - t
            calls[key] += 1

    setattr(owner, name, run)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-mode", choices=("auto", "aot"), default="auto")
    ap.add_argument("--bars", type=int, default=2_000_000)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--small", action="store_true", help="the tests' tiny network and sizes")
    args = ap.parse_args()
    use_compile_cache(Path(tempfile.mkdtemp(prefix="foxhunt-aot-start-")))
    timed(cpp_builder, "run_compile_cmd", "g++")
    timed(aot, "trace", "the steps' traces")
    timed(aot, "build", "the steps' builds")
    timed(torch.export, "export", "  of which torch.export")
    timed(torch._inductor, "aoti_compile_and_package", "  of which AOTInductor")
    timed(aot_probe, "check", "the loader's toy check")
    from foxhunt.train.agents.dqn import RainbowAgent
    from foxhunt.train.data import MarketData
    from foxhunt.train.env import EnvConfig

    dev = torch.device(args.device)
    if dev.type == "cuda":
        torch.cuda.init()
    marks = {"imports": time.perf_counter() - T0}
    data = MarketData(*standard_market(args.bars), dev)
    sets = {"compile": True, "compile_mode": args.compile_mode, **STANDARD_DQN}
    if args.small:
        sets |= dict(hidden=[32, 32], head_hidden=16, envs=8, collect_steps=6, learn_steps=4,
                     batch_size=32, replay_capacity=512)  # fmt: skip
    t = time.perf_counter()
    agent = RainbowAgent(model_config("dqn", sets), EnvConfig(), data, 0)
    agent.reset_fold(0, int(args.bars * 0.6), seed=1)
    marks["the agent built (the toy check under auto)"] = time.perf_counter() - t
    t = time.perf_counter()
    if dev.type == "cuda":
        agent.capture()  # builds the steps' packages in its warm-up
        torch.cuda.synchronize()
    marks["captured (the steps built)"] = time.perf_counter() - t
    t = time.perf_counter()
    one_epoch(agent, dev)
    marks["the first epoch (on a CPU, the steps built)"] = time.perf_counter() - t
    marks["in all"] = time.perf_counter() - T0
    mode = agent.cfg.compile_mode
    print(f"DQN, compile_mode {args.compile_mode} (chose {mode}), {args.bars:,} bars, {dev}:")
    for k, v in marks.items():
        print(f"  {v:7.1f} s  {k}")
    print("inside them:")
    for k in sorted(spent, key=lambda k: -spent[k]):
        print(f"  {spent[k]:7.1f} s  {k} ({calls[k]} calls)")
    out = results_path("bench_aot_start.json")
    out.write_text(json.dumps({"mode": mode, "phases_s": marks, "inside_s": dict(spent),
                               "calls": dict(calls)}, indent=1))  # fmt: skip
    print(f"results in {out}")


if __name__ == "__main__":
    main()
