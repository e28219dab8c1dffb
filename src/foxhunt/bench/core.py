"""`foxhunt bench`: how fast each model trains on this machine, with the statistics to trust
the figure, its memory, whether it trains at all, and what it means for a training plan.

For each model (every one `foxhunt train` knows, by default), `repeats` processes each build
the model over the standard synthetic market or a real fxcache (`--fxcache`;
foxhunt.bench.workload), warm it up and time
`epochs` epochs. Their epochs are pooled and summarised (foxhunt.bench.stats: outliers beyond
1.5 IQR excluded, mean with a Student-t 95% interval, median, P50/P95/P99 of the learning steps),
and the spread of the per-process medians says how repeatable the figure is. A model whose
training is not healthy (foxhunt.bench.stability) is reported as failing, without a speed.

Modes beside the plain run:
- `--compare 'field=value ...'`: a variant B of every model, run interleaved with A (A, B, A,
  B, ... each a process of its own, so that drifts hit both), judged by the ratio of medians
  and a two-sided Mann-Whitney test on the epoch times.
- `--baseline old.json`: the regression gate: a model whose median epoch is slower than the
  stored report's by more than `gate_factor` with p < `gate_p` fails the command (exit 1).
- `--find-batch`: the largest batch (the model's batch field) whose training step fits in
  the free GPU memory with a margin (foxhunt.train.sizer), and the gradient accumulation that
  reaches `--effective-batch`.

Out: report.json (everything, every sample), report.md (a summary table and the decision),
and with tracking one MLflow run per workload in the experiment `foxhunt-bench`.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

from foxhunt.bench import hardware
from foxhunt.bench.decide import CostAssumptions, TrainingPlan, decide
from foxhunt.bench.stats import mann_whitney, summarize
from foxhunt.errors import StepError
from foxhunt.fsutil import write_json_atomic, write_text_atomic

MODELS = ("dqn", "ppo", "pqn", "tlob", "cfc", "mamba2", "tft")  # the ensemble is its members


class BenchError(StepError):
    pass


@dataclass
class BenchConfig:
    """Training speed, memory and stability of foxhunt's models on this machine."""

    models: tuple[str, ...] = MODELS
    """Models to benchmark (any `foxhunt train --model`)."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """auto: the GPU when there is one; on a CPU every workload runs at small sizes."""
    fxcache: Path | None = None
    """A real fxcache to train on instead of the synthetic market: a cache's folder, or a folder
    holding exactly one (`foxhunt fxcache ls` lists them). Its bars in order: the first 60% are
    the train range, the `val_bars` after them the val range; `bars` does not apply."""
    bars: int | None = None
    """Bars of the synthetic market (default: 2,000,000 on a GPU, the standard workload;
    20,000 on a CPU)."""
    val_bars: int | None = None
    """Bars of the val range evaluated each epoch (default: 100,000 on a GPU, 2,000 on a CPU)."""
    warmup: int = 2
    """Epochs run before the timed ones (compilation and caches settle), not counted."""
    epochs: int = 10
    """Timed epochs per process."""
    repeats: int = 3
    """Processes per model (independent builds: their spread is the run-to-run spread)."""
    set: tuple[str, ...] = ()
    """Config fields of a model, `model.field=value` (JSON values), e.g. dqn.noisy=true
    tlob.hidden=128; `field=value` sets it for every model that has it."""
    supervised_steps: int | None = 200
    """Optimiser steps in a supervised model's epoch (None: a pass over the train range)."""
    compare: str = ""
    """Variant B of every model, as `field=value ...` over A's settings: A and B run
    interleaved and are compared (ratio of medians, Mann-Whitney)."""
    baseline: Path | None = None
    """A report.json of an earlier run: fail when a model got slower (the regression gate)."""
    gate_factor: float = 1.1
    """The gate fails a median epoch slower than the baseline's by more than this factor..."""
    gate_p: float = 0.01
    """... when the Mann-Whitney test gives p below this."""
    find_batch: bool = False
    """Find each model's largest batch that fits (a GPU only), and the accumulation for
    `effective_batch`."""
    effective_batch: int | None = None
    """The batch the plan wants (default: the model's own); accumulation reaches it."""
    memory_snapshot: bool = False
    """Write torch's CUDA memory snapshot of each workload's timed epochs (open it in
    pytorch.org/memory_viz)."""
    plan: TrainingPlan = field(default_factory=TrainingPlan)
    """The training plan the decision is for."""
    costs: CostAssumptions = field(default_factory=CostAssumptions)
    """Prices and power behind the decision."""
    out: Path = Path("data/bench")
    """Where report.json and report.md go."""
    tracking: Literal["mlflow", "none"] = "none"
    """One MLflow run per workload in the experiment `foxhunt-bench`."""
    in_process: bool = False
    """Run the workloads in this process (tests; repeats are then not independent)."""
    threads: int | None = None
    """CPU threads of each workload process (default: torch's)."""

    def __post_init__(self) -> None:
        for k in ("epochs", "repeats"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} = {getattr(self, k)}: must be at least 1")
        if self.warmup < 0:
            raise ValueError(f"warmup = {self.warmup}: must not be negative")
        if self.gate_factor < 1.0:
            raise ValueError(f"gate_factor = {self.gate_factor}: must be at least 1")


def parse_sets(items, models) -> dict[str, dict]:
    """`model.field=value` / `field=value` items -> {model: {field: value}} for `models`."""
    out: dict[str, dict] = {m: {} for m in models}
    for kv in items:
        k, sep, v = kv.partition("=")
        if not sep:
            raise BenchError(f"--set {kv!r}: expected field=value")
        try:
            value = json.loads(v)
        except ValueError:
            value = v  # a bare string
        model, _, name = k.rpartition(".")
        for m in [model] if model else models:
            if m in out:
                out[m][name] = value
    return out


def _known_fields(model: str) -> set[str]:
    import dataclasses

    from foxhunt.train.agents import AGENTS

    return {f.name for f in dataclasses.fields(AGENTS[model].load()[0])}


def _spec(
    cfg: BenchConfig,
    model: str,
    sets: dict,
    device: str,
    label: str,
    r: int,
    cache: tuple[Path, int] | None = None,
) -> dict:
    from foxhunt.bench.workload import STANDARD_DQN

    gpu = device == "cuda"
    sets = (STANDARD_DQN if model == "dqn" else {}) | dict(sets)  # the standard workload's
    if (
        cfg.supervised_steps
        and "steps" in _known_fields(model)
        and "window" in _known_fields(model)
    ):
        sets.setdefault("steps", cfg.supervised_steps)
    if not gpu:  # every workload small on a CPU (a supervised epoch: 4 steps at most)
        small = {"envs": 256, "collect_steps": 8, "learn_steps": 8, "batch_size": 64,
                 "replay_capacity": 8192, "rollout_steps": 8, "rounds": 2,
                 "window": 32}  # fmt: skip
        known = _known_fields(model)
        sets = {k: v for k, v in small.items() if k in known} | sets
        if "steps" in sets:
            sets["steps"] = min(sets["steps"], 4)
    snap = None
    if cfg.memory_snapshot and gpu:
        snap = str(cfg.out / f"memory-{model}-{label}-{r}.pickle")
    bars = cache[1] if cache else synthetic_bars(cfg, device)
    return {"model": model, "sets": sets, "device": device, "bars": bars,
            "fxcache": str(cache[0]) if cache else None, "val_bars": cfg.val_bars or
            (100_000 if gpu else 2_000), "warmup": cfg.warmup, "epochs": cfg.epochs, "seed": 0,
            "memory_snapshot": snap, "threads": cfg.threads}  # fmt: skip


def synthetic_bars(cfg: BenchConfig, device: str) -> int:
    """Bars of the synthetic market: `bars`, else the standard workload's on a GPU."""
    return cfg.bars or (2_000_000 if device == "cuda" else 20_000)


def bench_cache(path: Path) -> tuple[Path, int]:
    """The fxcache `--fxcache` names (a cache's folder, or a folder holding one), checked once
    here against its checksums (the workloads then map it unchecked), and its bars."""
    from foxhunt.fxcache import FxCache
    from foxhunt.fxcache.store import list_caches

    rows = list_caches(Path(path))
    if not rows:
        raise BenchError(f"fxcache {path}: no fxcache there (`foxhunt fxcache ls` lists them)")
    if len(rows) > 1:
        keys = ", ".join(r["key"] for r in rows)
        raise BenchError(f"fxcache {path} holds {len(rows)} caches ({keys}): name one, "
                         f"{path}/<key>")  # fmt: skip
    cache = FxCache.open(rows[0]["path"])
    return cache.path, len(cache)


def run_one(spec: dict, in_process: bool) -> dict:
    """One workload: in this process, or in a fresh `python -m foxhunt.bench.workload`."""
    if in_process:
        from foxhunt.bench.workload import run_workload

        try:
            return run_workload(spec)
        except Exception as e:
            return {"model": spec["model"], "error": f"{type(e).__name__}: {str(e)[:500]}"}
    proc = subprocess.run(
        [sys.executable, "-m", "foxhunt.bench.workload", json.dumps(spec)],
        capture_output=True, text=True, env=os.environ.copy(),
    )  # fmt: skip
    lines = [ln for ln in proc.stdout.strip().splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        return {"model": spec["model"], "error": f"exit {proc.returncode}: {' | '.join(tail)}"}
    return json.loads(lines[-1])


def summarise_runs(runs: list[dict]) -> dict:
    """Pooled statistics of a workload's processes (those that ran and trained healthily)."""
    errors = [r["error"] for r in runs if "error" in r]
    ok = [r for r in runs if "error" not in r]
    unstable = [r for r in ok if not r["stability"]["ok"]]
    out: dict = {"processes": len(runs), "errors": errors}
    if ok:
        out["stability"] = ok[0]["stability"] if not unstable else unstable[0]["stability"]
        out["resolved"], out["params"] = ok[0]["resolved"], ok[0]["params"]
    if errors or unstable or not ok:
        out["status"] = "error" if errors or not ok else "unstable"
        return out
    out["status"] = "ok"
    epochs = [e for r in ok for e in r["epochs"]]
    for k in ("train_s", "epoch_s", "collect_s", "learn_s", "eval_s"):
        out[k] = summarize([e[k] for e in epochs]).as_dict()
    steps = [s for r in ok for s in r["steps_s"]]
    if steps:
        out["step_s"] = summarize(steps).as_dict()
    medians = [statistics.median(e["train_s"] for e in r["epochs"]) for r in ok]
    out["process_medians_s"] = medians
    out["spread"] = (max(medians) - min(medians)) / statistics.median(medians)
    out["samples_train_s"] = [e["train_s"] for e in epochs]
    r0, med = ok[0], out["train_s"]["median"]
    out["env_steps_per_s"] = r0["env_steps_per_epoch"] / med if med else None
    out["samples_per_s"] = r0["samples_per_epoch"] / med if med else None
    if r0.get("train_flops_per_step") and r0.get("optimizer_steps_per_epoch"):
        out["tflops"] = r0["train_flops_per_step"] * r0["optimizer_steps_per_epoch"] / med / 1e12
    out["start_s"] = statistics.median(sum(r["start"].values()) for r in ok)
    out["memory_peak_bytes"] = {k: max(r["memory_peak_bytes"].get(k, 0) for r in ok)
                                for k in ok[0]["memory_peak_bytes"]}  # fmt: skip
    out["host_rss_bytes"] = max(r["host_rss_bytes"] for r in ok)
    return out


def judge(a: list[float], b: list[float]) -> dict:
    """B against A: the ratio of median epoch times and a two-sided Mann-Whitney test."""
    mw = mann_whitney(a, b)
    ratio = statistics.median(b) / statistics.median(a)
    return {"ratio_b_over_a": ratio, "p": mw.p, "u": mw.u, "method": mw.method}


def gate(current: dict, baseline: dict, factor: float, p_max: float) -> list[str]:
    """Models slower than the baseline's report beyond the gate (see BenchConfig)."""
    failures = []
    for m, w in current.items():
        old = baseline.get("workloads", {}).get(m, {})
        if w.get("status") != "ok" or old.get("status") != "ok":
            continue
        j = judge(old["samples_train_s"], w["samples_train_s"])
        w["vs_baseline"] = j
        if j["ratio_b_over_a"] > factor and j["p"] < p_max:
            failures.append(f"{m}: median epoch {j['ratio_b_over_a']:.2f}x the baseline's "
                            f"(p = {j['p']:.2g})")  # fmt: skip
    return failures


def find_batch(cfg: BenchConfig, model: str, sets: dict, device: str) -> dict:
    """The largest batch of `model` whose training step fits (the sizer's search, each try a
    build and a step in this process), and the accumulation reaching the effective batch. A
    try that fails other than for memory ends the search: the result is then its error."""
    import torch

    from foxhunt.train.agents.common import uncompiled
    from foxhunt.train.sizer import MARGIN, cuda_peak, largest_fitting, powers_of_two

    known = _known_fields(model)
    name = "batch_size" if "batch_size" in known else ("envs" if "envs" in known else None)
    if name is None or device != "cuda":
        return {"skipped": "needs a GPU and a model with a batch size"}
    from foxhunt.bench.workload import run_workload

    def step(n: int) -> None:
        spec = _spec(cfg, model, sets | {name: n}, device, "find", 0)
        spec |= {"warmup": 0, "epochs": 1, "bars": 200_000, "val_bars": 2_000}
        spec["sets"] |= uncompiled(spec["sets"].get("compile_mode"))
        if "error" in (r := run_workload(spec)):
            if "memory" in r["error"]:
                raise torch.cuda.OutOfMemoryError(r["error"])
            # Any other failure says nothing about the size: counted as fitting, it would
            # steer the search to the largest batch.
            raise BenchError(f"{name} = {n}: the try failed, not for memory: {r['error']}")

    free, _ = torch.cuda.mem_get_info()
    budget = int(free * MARGIN)
    try:
        size, peak = largest_fitting(cuda_peak(torch.device("cuda"), step),
                                     powers_of_two(256, 1 << 22), budget)  # fmt: skip
    except BenchError as e:  # run_bench prints it with the workload's line
        return {"field": name, "error": str(e)}
    return {"field": name, "largest": size, "peak_bytes": peak, "budget_bytes": budget,
            **accumulation(size, cfg.effective_batch or size)}  # fmt: skip


def accumulation(largest: int, effective: int) -> dict:
    """Micro-batches that reach an effective batch when at most `largest` fit at once: the
    fewest, of equal size (the micro-batch rounded up, so the effective batch may grow a
    little to be a multiple of it)."""
    accumulate = max(1, math.ceil(effective / largest))
    micro = math.ceil(effective / accumulate)
    return {"effective": effective, "accumulate": accumulate, "micro_batch": micro,
            "effective_run": micro * accumulate}  # fmt: skip


def run_bench(cfg: BenchConfig) -> dict:
    import torch

    device = cfg.device if cfg.device != "auto" else ("cuda" if torch.cuda.is_available() else
                                                      "cpu")  # fmt: skip
    if device == "cuda" and not torch.cuda.is_available():
        raise BenchError("device = cuda: no CUDA device here (use --device auto or cpu)")
    from foxhunt.train.agents import AGENTS

    unknown = [m for m in cfg.models if m not in AGENTS]
    if unknown:
        raise BenchError(f"models {unknown}: choose among {', '.join(AGENTS)}")
    sets = parse_sets(cfg.set, cfg.models)
    for m, s in sets.items():
        bad = set(s) - _known_fields(m)
        if bad and any(kv.startswith(f"{m}.") for kv in cfg.set):
            raise BenchError(f"--set: {m} has no field(s) {sorted(bad)}")
        sets[m] = {k: v for k, v in s.items() if k in _known_fields(m)}
    variant = parse_sets(cfg.compare.split(), cfg.models) if cfg.compare else None
    cache = bench_cache(cfg.fxcache) if cfg.fxcache else None
    cfg.out.mkdir(parents=True, exist_ok=True)
    data = ({"fxcache": str(cache[0]), "key": cache[0].name, "bars": cache[1]} if cache else
            {"synthetic": "the standard market", "bars": synthetic_bars(cfg, device)})  # fmt: skip
    report: dict = {"hardware": hardware.detect(device), "device": device,
                    "config": json.loads(json.dumps(asdict(cfg), default=str)), "data": data,
                    "workloads": {}}  # fmt: skip
    for m in cfg.models:
        runs_a, runs_b = [], []
        for r in range(cfg.repeats):  # A and B interleaved: drifts hit both alike
            runs_a.append(run_one(_spec(cfg, m, sets[m], device, "a", r, cache),
                                  cfg.in_process))  # fmt: skip
            progress(m, "a", r, cfg.repeats, runs_a[-1])
            if variant is not None:
                vb = {k: v for k, v in variant[m].items() if k in _known_fields(m)}
                runs_b.append(run_one(_spec(cfg, m, sets[m] | vb, device, "b", r, cache),
                                      cfg.in_process))  # fmt: skip
                progress(m, "b", r, cfg.repeats, runs_b[-1])
            # Each process as it ends, kept if the run is stopped before the workload's summary.
            report["workloads"][m] = {"status": "running", "runs": runs_a, "runs_b": runs_b}
            write_json_atomic(cfg.out / "report.partial.json", report)
        w = summarise_runs(runs_a)
        if variant is not None:
            wb = summarise_runs(runs_b)
            w["variant"] = wb
            if w["status"] == "ok" and wb["status"] == "ok":
                w["compare"] = judge(w["samples_train_s"], wb["samples_train_s"])
        if cfg.find_batch:
            w["batch_finder"] = find_batch(cfg, m, sets[m], device)
        report["workloads"][m] = w
        print(row(m, w), flush=True)
        if "batch_finder" in w:
            found = ", ".join(c for c in batch_cells(w["batch_finder"]) if c != "-")
            print(f"{m:8s} batch finder: {found}", flush=True)
        # What is measured so far, kept if the run is stopped (the full report follows).
        write_json_atomic(cfg.out / "report.partial.json", report)
    timed = {m: w for m, w in report["workloads"].items() if w["status"] == "ok"}
    if timed:
        report["decision"] = decide({m: w["epoch_s"]["median"] for m, w in timed.items()},
                                    {m: w["start_s"] for m, w in timed.items()},
                                    cfg.plan, cfg.costs)  # fmt: skip
    failures = []
    if cfg.baseline:
        try:
            base = json.loads(Path(cfg.baseline).read_text())
        except (OSError, ValueError) as e:
            raise BenchError(
                f"baseline {cfg.baseline}: not a report of foxhunt bench ({e})"
            ) from None
        failures = gate(report["workloads"], base, cfg.gate_factor, cfg.gate_p)
        report["gate"] = {"baseline": str(cfg.baseline), "factor": cfg.gate_factor,
                          "p": cfg.gate_p, "failures": failures}  # fmt: skip
    write_json_atomic(cfg.out / "report.json", report)
    write_text_atomic(cfg.out / "report.md", markdown(report))
    (cfg.out / "report.partial.json").unlink(missing_ok=True)
    if cfg.tracking == "mlflow":
        log_mlflow(report)
    return report


def _ms(s: dict | None, key: str = "median") -> str:
    return f"{s[key] * 1e3:.1f}" if s else "-"


def progress(model: str, label: str, r: int, repeats: int, run: dict) -> None:
    """One line on stderr as each process ends: a long workload shows it is moving."""
    if "error" in run:
        what = f"error: {run['error'][:200]}"
    else:
        med = statistics.median(e["train_s"] for e in run["epochs"])
        what = (f"median epoch {med * 1e3:.1f} ms, start {sum(run['start'].values()):.1f} s "
                f"({', '.join(f'{k} {v:.1f}' for k, v in run['start'].items())})")  # fmt: skip
    print(f"  {model} {label} {r + 1}/{repeats}: {what}", file=sys.stderr, flush=True)


def row(model: str, w: dict) -> str:
    if w["status"] != "ok":
        why = "; ".join(w.get("errors") or w.get("stability", {}).get("problems", []))
        return f"{model:8s} {w['status'].upper()}: {why}"
    e = w["train_s"]
    extra = f", {w['tflops']:.1f} TFLOP/s" if w.get("tflops") else ""
    cmp_ = ""
    if "compare" in w:
        c = w["compare"]
        cmp_ = f"; B/A {c['ratio_b_over_a']:.3f} (p = {c['p']:.2g})"
    return (f"{model:8s} epoch {e['mean'] * 1e3:.1f} ms +- {e['ci95'] * 1e3:.1f} (median "
            f"{e['median'] * 1e3:.1f}, {e['outliers']} outliers), step P50/P95/P99 "
            f"{_ms(w.get('step_s'), 'p50')}/{_ms(w.get('step_s'), 'p95')}/"
            f"{_ms(w.get('step_s'), 'p99')} ms, spread {w['spread']:.1%}{extra}{cmp_}")  # fmt: skip


def vram_gb(w: dict) -> tuple[float, float]:
    """Peak GPU memory (GB) of a workload's training phases (fold reset, capture, collection,
    learning, evaluation) and of its build, where the supervised models' sizer probes larger
    batches than it keeps."""
    peaks = w.get("memory_peak_bytes", {})
    train = max((v for k, v in peaks.items() if k != "build"), default=0)
    return train / 1e9, peaks.get("build", 0) / 1e9


def _data_line(data: dict) -> str:
    if "fxcache" in data:
        return f"fxcache {data['key']} ({data['bars']:,} bars)"
    return f"the standard synthetic market ({data.get('bars', 0):,} bars)"


def markdown(report: dict) -> str:
    h = report["hardware"]
    if h["kind"] == "gpu":
        what = (f"{h['name']} (GPU, {h['memory_bytes'] / 2**30:.0f} GiB, compute capability "
                f"{h['compute_capability']}, driver {h.get('driver', '?')})")  # fmt: skip
    else:
        what = f"{h.get('name', '?')} (CPU, {h.get('threads')} threads)"
    lines = [
        "# foxhunt bench",
        "",
        f"{what}, torch {h['host']['torch']}; {_data_line(report.get('data', {}))}.",
        "",
        "| model | status | train epoch, median (ms) | mean ± 95% CI (ms) | outliers | step "
        "P50 / P95 / P99 (ms) | run-to-run spread | env-steps/s | samples/s | peak VRAM, "
        "training (GB) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for m, w in report["workloads"].items():
        if w["status"] != "ok":
            why = "; ".join(w.get("errors") or w.get("stability", {}).get("problems", []))
            lines.append(f"| {m} | {w['status']}: {why} | | | | | | | | |")
            continue
        e, s = w["train_s"], w.get("step_s")
        train_gb, build_gb = vram_gb(w)
        vram = f"{train_gb:.2f}" + (f" (build {build_gb:.2f})" if build_gb > train_gb else "")
        steps = f"{_ms(s, 'p50')} / {_ms(s, 'p95')} / {_ms(s, 'p99')}" if s else "-"
        eps = f"{w['env_steps_per_s'] / 1e6:.2f} M" if w.get("env_steps_per_s") else "-"
        sps = f"{w['samples_per_s'] / 1e6:.2f} M" if w.get("samples_per_s") else "-"
        lines.append(
            f"| {m} | ok | {e['median'] * 1e3:.1f} | {e['mean'] * 1e3:.1f} ± "
            f"{e['ci95'] * 1e3:.1f} | {e['outliers']} | {steps} | {w['spread']:.1%} | {eps} | "
            f"{sps} | {vram} |"
        )
    cmps = {m: w for m, w in report["workloads"].items() if "compare" in w}
    if cmps:
        lines += ["", f"Variant B ({report['config']['compare']}) against A, interleaved:", "",
                  "| model | B / A median | Mann-Whitney p |", "| --- | --- | --- |"]  # fmt: skip
        for m, w in cmps.items():
            c = w["compare"]
            lines.append(f"| {m} | {c['ratio_b_over_a']:.3f} | {c['p']:.3g} |")
    found = {m: w["batch_finder"] for m, w in report["workloads"].items() if "batch_finder" in w}
    if found:
        lines += ["", "Largest batch whose training step fits (`--find-batch`):", "",
                  "| model | field | largest | peak / budget | effective batch |",
                  "| --- | --- | --- | --- | --- |"]  # fmt: skip
        for m, b in found.items():
            cells = [*batch_cells(b), "", "", ""][:4]
            lines.append(f"| {m} | {' | '.join(cells)} |")
    if "gate" in report:
        g = report["gate"]
        verdict = "; ".join(g["failures"]) if g["failures"] else "no model slower"
        lines += ["", f"Regression gate against {g['baseline']} (slower than {g['factor']}x "
                  f"with p < {g['p']}): {verdict}."]  # fmt: skip
    if "decision" in report:
        d = report["decision"]
        a = d["assumptions"]
        lines += [
            "",
            f"**Decision for {d['tasks']} task(s) x {d['plan']['folds']} folds x "
            f"{d['plan']['epochs']} epochs: {d['recommendation']}** ({d['reason']}). Assumed: "
            f"cloud ${a['cloud_usd_per_gpu_hour']}/GPU-hour at {a['cloud_slowdown']}x this "
            f"machine's epoch time; here {a['local_power_kw']} kW at "
            f"${a['energy_usd_per_kwh']}/kWh + ${a['local_usd_per_hour']}/h.",
        ]
    return "\n".join([*lines, ""])


def batch_cells(b: dict) -> list[str]:
    """A `find_batch` result as the report's cells: the field, the largest batch, its peak
    memory of the budget, and the micro-batches reaching the effective batch; or the field and
    why there is none."""
    if "largest" not in b:
        return [b.get("field", "-"), b.get("error") or b.get("skipped", "")]
    return [b["field"], f"{b['largest']:,}",
            f"{b['peak_bytes'] / 1e9:.2f} / {b['budget_bytes'] / 1e9:.2f} GB",
            f"{b['effective_run']:,} = {b['accumulate']} x {b['micro_batch']:,}"]  # fmt: skip


def log_mlflow(report: dict) -> None:
    """One MLflow run per workload (experiment foxhunt-bench): its settings and hardware as
    parameters, its figures as metrics, the whole report as an artifact."""
    from foxhunt.train.tracking import client_and_experiment, log_params

    client, exp = client_and_experiment("foxhunt-bench")
    h = report["hardware"]
    for m, w in report["workloads"].items():
        run = client.create_run(exp, run_name=f"bench {m} {h.get('name', '?')}",
                                tags={"model": m, "device": h.get("name", "?"),
                                      "status": w["status"]})  # fmt: skip
        rid = run.info.run_id
        log_params(client, rid, {"model": m, "hardware": {k: v for k, v in h.items()
                                                          if k != "host"},
                                 "resolved": w.get("resolved", {}),
                                 "data": report.get("data", {})})  # fmt: skip
        if w["status"] == "ok":
            metrics = {"epoch_median_s": w["train_s"]["median"], "epoch_mean_s":
                       w["train_s"]["mean"], "epoch_ci95_s": w["train_s"]["ci95"],
                       "spread": w["spread"], "start_s": w["start_s"]}  # fmt: skip
            for k in ("env_steps_per_s", "samples_per_s", "tflops"):
                if w.get(k):
                    metrics[k] = w[k]
            if "step_s" in w:
                metrics |= {f"step_{q}_s": w["step_s"][q] for q in ("p50", "p95", "p99")}
            metrics |= {f"vram_peak_{k}_gb": v / 1e9 for k, v in w["memory_peak_bytes"].items()}
            metrics["host_rss_gb"] = w["host_rss_bytes"] / 1e9
            for k, v in metrics.items():
                client.log_metric(rid, k, float(v))
        client.log_text(rid, json.dumps(w, default=str, indent=1), "workload.json")
        client.set_terminated(rid, "FINISHED" if w["status"] == "ok" else "FAILED")
