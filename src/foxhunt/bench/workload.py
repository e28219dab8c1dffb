"""One benchmark workload: a model `foxhunt train` knows, built at given sizes over the
standard synthetic market (or a real fxcache), trained for warm-up and timed epochs.

Per epoch, with CUDA events on a GPU (the host clock on a CPU) and no synchronisation inside:
collection, learning and evaluation of the val range, and each learning step (the agents'
`step_marks` hook: a DQN learning step, a PPO/PQN update, a supervised optimiser step). The
device is synchronised once per epoch, where the agent's statistics are read. Peak GPU memory
is taken per phase (build, fold reset, capture and compilation, collection, learning,
evaluation) from the allocator's counters, reset at each phase's start; host RSS at the end.

Run in a process of its own by `foxhunt bench` (`python -m foxhunt.bench.workload <json>`
prints the result as JSON on its last line), so that repeats are independent processes.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import torch

from foxhunt.bench import stability


def results_path(name: str) -> Path:
    """Where a bench/ script writes its JSON `name`: in $OUT (the folder the device tool brings
    back) or /tmp, the folder made if it is missing."""
    out = Path(os.environ.get("OUT", "/tmp"))
    out.mkdir(parents=True, exist_ok=True)
    return out / name


def child_failure(p: subprocess.CompletedProcess, name: str) -> dict:
    """A benchmark's child process that printed no result: its whole stderr kept beside the
    JSON (`results_path(name + ".err")`), and the lines that name the cause (a kernel's failed
    assertion, the exception's own line) with its exit status, not only the end of its
    traceback."""
    log = results_path(f"{name}.err")
    log.write_text(p.stderr)
    named = [ln.strip() for ln in p.stderr.splitlines()
             if re.search(r"Assertion|^\w+(\.\w+)*(Error|Exception)\b", ln.strip())]  # fmt: skip
    return {"error": " | ".join(dict.fromkeys(named[-4:])) or p.stderr[-800:], "log": str(log),
            "rc": p.returncode}  # fmt: skip


def kernel_profile(step, label: str, steps: int = 20, rows: int = 30) -> dict[str, tuple]:
    """Run `step()` once, then `steps` times under torch's profiler, and print the CUDA kernels'
    time per call by kernel name, the largest `rows` first (outside any graph: the step as it
    is captured). Returns name -> (launches a call, microseconds a call)."""
    from torch.profiler import ProfilerActivity, profile

    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    table: dict[str, tuple[float, float]] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = e.name[:90]
            n, t = table.get(k, (0, 0.0))
            table[k] = (n + 1, t + e.device_time)
    table = {k: (n / steps, t / steps) for k, (n, t) in table.items()}
    total = sum(t for _, t in table.values())
    print(f"profile {label}: {total:.0f} us of kernels per call, "
          f"{sum(n for n, _ in table.values()):.0f} kernels", flush=True)  # fmt: skip
    for k, (n, t) in sorted(table.items(), key=lambda kv: -kv[1][1])[:rows]:
        print(f"  {t:7.1f} us  {n:4.1f}x  {k}", flush=True)
    return table


def standard_market(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The standard workload's market (../shared/bench/README.md): n bars of 42 + 8 i.i.d.
    N(0, 1) features and order-flow columns, closes from a geometric random walk, opens at the
    previous close, highs and lows a little outside them."""
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((n, 42), dtype=np.float32)
    ofi = rng.standard_normal((n, 8), dtype=np.float32)
    close = np.exp(math.log(100.0) + np.cumsum(rng.normal(0, 1e-3, n)))
    openp = np.concatenate([close[:1], close[:-1]])
    sp = rng.uniform(0, 5e-4, (n, 2))
    high = np.maximum(openp, close) * (1 + sp[:, 0])
    low = np.minimum(openp, close) * (1 - sp[:, 1])
    return feats, ofi, np.stack([openp, high, low, close], 1)


STANDARD_DQN = {"noisy": False, "dense_inputs": False}
"""The standard workload's DQN exploration and inputs (../shared/bench/README.md: epsilon-greedy,
the state into the first layer only), which the speed benchmarks keep, where `foxhunt train`'s
GPU defaults add noisy nets and dense inputs (DQNConfig.noisy)."""

STANDARD_SPAN_NS = 2_000_000 * 9 * 10**9
"""The standard market's time span as an fxcache: 2M bars 9 s apart, ~7 months (three folds of
3 months of train, 1 of val and 1 of test, a month apart)."""


def standard_fxcache(root: Path, n: int, months: tuple[int, int, int] = (3, 1, 1)) -> Path:
    """The standard market of n bars published as the fxcache `root/fxcache/standard`, its bars
    spread over the same ~7 months whatever n, and cut by the folds step (train, val and test
    months) into `root/folds.json`; returns the folds file's path."""
    from foxhunt.folds import FoldsConfig, FoldSpec, run_folds
    from foxhunt.fxcache.store import publish

    feats, ofi, ohlc = standard_market(n)
    step = STANDARD_SPAN_NS // n
    ts = np.datetime64("2024-01-01", "ns").astype(np.int64) + np.arange(n, dtype=np.int64) * step
    publish(root / "fxcache", "standard", {"features": feats, "ofi": ofi, "targets": ohlc,
                                           "timestamps": ts},
            {"symbol": "STD", "bar_size": f"{step / 1e9:g}s"})  # fmt: skip
    train, val, test = months
    spec = FoldSpec(train_months=train, val_months=val, test_months=test)
    folds, _ = run_folds(FoldsConfig(cache=root / "fxcache", symbol="STD",
                                     out=root / "folds.json", spec=spec))  # fmt: skip
    return folds


def model_config(model: str, sets: dict):
    """The model's config class at its defaults with `sets` (field -> value) applied."""
    from foxhunt.train.agents import AGENTS

    cls = AGENTS[model].load()[0]
    known = {f.name for f in dataclasses.fields(cls)}
    bad = sorted(set(sets) - known)
    if bad:
        raise ValueError(f"{model} has no field(s) {bad}")
    return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in sets.items()})


def one_epoch(agent, device: torch.device) -> None:
    """One epoch of `agent` (its first of one: collection and learning, its rounds), its
    statistics read and `device` synchronised: what a task's first epoch runs."""
    agent.begin_epoch(0, 1)
    for _ in range(agent.rounds):
        agent.collect()
        agent.learn()
    agent.read_stats()
    if device.type == "cuda":
        torch.cuda.synchronize()


def epoch_sizes(agent) -> tuple[int, int]:
    """Env steps and learner samples of one epoch (the sizes' product, as the agent runs)."""
    from foxhunt.train.agents.dqn import RainbowAgent
    from foxhunt.train.agents.supervised import SupervisedAgent

    c = agent.cfg
    if isinstance(agent, SupervisedAgent):
        return 0, agent.steps_per_epoch() * len(agent.batch_t)
    if isinstance(agent, RainbowAgent):
        return c.envs * c.collect_steps, c.learn_steps * c.batch_size
    if hasattr(c, "rollout_steps"):
        steps = c.envs * c.rollout_steps * c.rounds
        return steps, steps * c.update_epochs
    return 0, 0  # the ensemble: its members' sums are not one batch size


class Clock:
    """Marks on the device's timeline: CUDA events on a GPU, the host clock on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if not self.cuda:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def seconds(self, a, b) -> float:
        return a.elapsed_time(b) / 1e3 if self.cuda else b - a


class Memory:
    """Peak GPU memory per phase, from the allocator (no device synchronisation)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.peaks: dict[str, int] = {}

    def start(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def end(self, phase: str) -> None:
        if self.cuda:
            self.peaks[phase] = max(self.peaks.get(phase, 0), torch.cuda.max_memory_allocated())


def train_flops(agent, rows: int = 64) -> float | None:
    """FLOPs of one supervised optimiser step (forward and backward, eager), by torch's
    FlopCounterMode; None for the agents (their work is not one network's step). Counted over
    the step's first `rows` windows and scaled to its whole batch (all its micro-batches):
    every operation of the supervised models is a window's own, so the count is linear in the
    batch (tests/test_bench.py checks it), and an eager step over a whole batch beside the
    captured graphs' pools can run a wide model out of memory (Mamba-2 at d_model 1,024 and
    batch 1,024 on an H100's 80 GB, 2026-12-06)."""
    from foxhunt.train.agents.supervised import SupervisedAgent

    if not isinstance(agent, SupervisedAgent):
        return None
    from torch.utils.flop_counter import FlopCounterMode

    t = agent.batch_t[:rows]
    with FlopCounterMode(display=False) as fc:
        loss, _ = type(agent)._loss(agent, t)  # the eager loss, not a compiled one
        loss.backward()
    for p in agent.params:
        p.grad = None
    return float(fc.get_total_flops()) * len(agent.batch_t) / len(t)


def run_workload(spec: dict) -> dict:
    """Build, warm up and time one workload; see the module doc. `spec`: model, sets (config
    fields), device, bars, val_bars, warmup, epochs, seed, and optionally fxcache (a cache's
    folder, mapped instead of the synthetic market, checked by the caller) and memory_snapshot
    (a path for torch's memory snapshot of the timed epochs)."""
    from foxhunt.train.agents import AGENTS
    from foxhunt.train.data import MarketData
    from foxhunt.train.env import EnvConfig
    from foxhunt.train.evaluate import Evaluator, default_segments

    dev = torch.device(spec["device"])
    torch.manual_seed(spec.get("seed", 0))
    if spec.get("fxcache"):
        from foxhunt.fxcache import FxCache

        data = MarketData.from_fxcache(FxCache.open(spec["fxcache"], check=False), dev)
    else:
        data = MarketData(*standard_market(spec["bars"], spec.get("data_seed", 0)), dev)
    n, val_bars = data.n, spec["val_bars"]
    train = (0, int(n * 0.6))
    val = (train[1], min(n - 2, train[1] + val_bars))
    cfg = model_config(spec["model"], spec.get("sets", {}))
    mem, clock = Memory(dev), Clock(dev)
    t = {}

    def sync():
        if dev.type == "cuda":
            torch.cuda.synchronize()

    mem.start()
    t0 = time.perf_counter()
    agent = AGENTS[spec["model"]].load()[1](cfg, EnvConfig(), data, spec.get("seed", 0))
    sync()
    t["build_s"] = time.perf_counter() - t0
    mem.end("build")
    graph = agent.cfg.capture == "graph"
    mem.start()
    t0 = time.perf_counter()
    agent.reset_fold(*train, seed=1)
    sync()
    t["fold_reset_s"] = time.perf_counter() - t0
    mem.end("fold_reset")
    mem.start()
    t0 = time.perf_counter()
    if graph:
        agent.capture()  # compilation happens here, at the warm-up runs
    sync()
    t["capture_s"] = time.perf_counter() - t0
    mem.end("capture")
    segments = spec.get("eval_segments") or default_segments(dev)
    evaluator = Evaluator(EnvConfig(), data, segments, capture=graph)
    prepare = getattr(agent, "prepare_eval", None)
    calibrate = getattr(agent, "calibrate", None)
    epochs, history, steps_s = [], [], []
    total = spec["warmup"] + spec["epochs"]
    snapshot = spec.get("memory_snapshot")
    for e in range(total):
        timed = e >= spec["warmup"]
        if timed and snapshot and e == spec["warmup"] and dev.type == "cuda":
            torch.cuda.memory._record_memory_history(max_entries=200_000)
        agent.begin_epoch(e, total)
        marks = {"start": clock.mark()}
        phase_s = {"collect": [], "learn": []}
        step_marks: list = []
        for _ in range(agent.rounds):
            a = clock.mark()
            mem.start()
            agent.collect()
            b = clock.mark()
            mem.end("collect")
            mem.start()
            step_marks.append(b)
            agent.step_marks = step_marks
            agent.learn()
            agent.step_marks = None
            c = clock.mark()
            mem.end("learn")
            phase_s["collect"].append((a, b))
            phase_s["learn"].append((b, c))
            # the next round's first step starts after this round's collection
            step_marks.append(None)
        mem.start()
        if calibrate is not None:
            calibrate(*val)
        if prepare is not None:
            prepare(*val)
        evaluator.run(agent.greedy, *val, graph=graph)
        marks["end"] = clock.mark()
        mem.end("eval")
        stats = agent.read_stats()  # the one synchronisation of the epoch
        sync()
        history.append(stats)
        if not timed:
            continue
        collect = sum(clock.seconds(a, b) for a, b in phase_s["collect"])
        learn = sum(clock.seconds(a, b) for a, b in phase_s["learn"])
        total_s = clock.seconds(marks["start"], marks["end"])
        epochs.append({"collect_s": collect, "learn_s": learn, "train_s": collect + learn,
                       "eval_s": total_s - collect - learn, "epoch_s": total_s})  # fmt: skip
        prev = None
        for m in step_marks:
            if m is not None and prev is not None:
                steps_s.append(clock.seconds(prev, m))
            prev = m
    if snapshot and dev.type == "cuda":
        torch.cuda.memory._dump_snapshot(snapshot)
        torch.cuda.memory._record_memory_history(enabled=None)
    env_steps, samples = epoch_sizes(agent)
    flops = train_flops(agent)
    out = {
        "model": spec["model"], "sets": spec.get("sets", {}), "bars": n,
        "resolved": json.loads(json.dumps(dataclasses.asdict(agent.cfg), default=str)),
        "params": sum(p.numel() for p in agent.params) if hasattr(agent, "params") else None,
        "start": t, "epochs": epochs, "steps_s": steps_s,
        "env_steps_per_epoch": env_steps, "samples_per_epoch": samples,
        "train_flops_per_step": flops, "optimizer_steps_per_epoch": (
            agent.steps_per_epoch() if hasattr(agent, "steps_per_epoch") else None),
        "memory_peak_bytes": mem.peaks,
        "host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "stability": stability.check(history), "history": history,
    }  # fmt: skip
    return out


def main() -> None:
    spec = json.loads(sys.argv[1])
    if spec["device"] == "cpu" and spec.get("threads"):
        torch.set_num_threads(spec["threads"])
    try:
        res = run_workload(spec)
    except torch.cuda.OutOfMemoryError as e:
        res = {"model": spec["model"], "error": f"out of memory: {str(e)[:300]}"}
    except Exception as e:  # reported in the benchmark's table, beside the others' figures
        res = {"model": spec["model"], "error": f"{type(e).__name__}: {str(e)[:500]}"}
    print("\n" + json.dumps(res), flush=True)


if __name__ == "__main__":
    main()
