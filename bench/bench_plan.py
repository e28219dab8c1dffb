"""A training plan end to end: 3 folds x 50 epochs of the standard workload through `foxhunt
train`'s own path, timed from the process's start to its results, with a cold and then a warm
compile cache.

    python3 bench/bench_plan.py [--model dqn] [--epochs 50]     on a CUDA device (goal, issue
                                [--eval-segments N]              18: <= 30 s on one H200)
                                [--compile-eval {on,off,both}]
                                [--compile-mode {default,aot,auto}]  the agent's steps by
                                                                 torch.compile (the default), ahead
                                                                 of time (AOTInductor; --aot), or
                                                                 the DQN's auto (aot where it can)
                                [--onegraph]                     torch.compile's DQN loss as one
                                                                 graph, not as pieces with the
                                                                 next states' forwards on streams
                                                                 of their own (dqn.NEXT_ON_STREAMS)
                                [--profile-start]                then a third process, warm,
                                                                 under cProfile: 1 epoch of the
                                                                 first fold, the functions that
                                                                 took longest
    python3 bench/bench_plan.py --cpu-smoke                      tiny sizes on the CPU

The standard market (foxhunt.bench.workload: 2,000,000 bars) is published as an fxcache with
bars 9 s apart, so that the folds step (3 months of train, 1 of val, 1 of test, sliding by a
month) cuts it into 3 folds of ~860k train bars. Two fresh processes in turn then run
`run_train` over it at the model's GPU defaults (no MLflow, no baselines, no resume), sharing
one compile cache folder: each maps the cache, uploads it once, builds, compiles and captures,
and trains every fold with a validation pass each epoch, the best checkpoint and the test.
Reported per process: seconds from its start to the end of its imports (the interpreter's
start, torch's and foxhunt's imports), to the start of its first epoch (the goal's
"starts its first epoch"), to the end of that epoch (its validation and checkpoint included),
and to its results,
the epochs' phases summed over all epochs (collection, learning, each epoch's validation: the
times `foxhunt train` logs), the passes each epoch's validation took (`eval/val_passes`; at most
evaluate.VAL_PASSES), the start (to the first epoch), the rest (fold resets, each fold's
exact val and test, checkpoints), and the test Sharpe (which says nothing here: the market is
noise).
The evaluation's step is compiled (TrainConfig.compile_eval: the RL models' default) unless
`--compile-eval off`; `--compile-eval both` runs the cold and warm processes with it compiled
and then a third, warm, without: the A/B in one call.
Prints a table; JSON to $OUT or /tmp.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from foxhunt.bench.workload import STANDARD_DQN, child_failure, results_path, standard_fxcache
from foxhunt.train.evaluate import VAL_PASSES

CHILD = """
import json, sys, time
t0 = float(sys.argv[1])
sys.path.insert(0, sys.argv[2])
from pathlib import Path
from foxhunt.bench.workload import model_config
from foxhunt.train.core import TrainConfig, run_train
from foxhunt.train.tracking import NullLogger
cfg, marks = json.loads(sys.argv[3]), {"imports_s": time.time() - t0}  # torch's, foxhunt's
NOT_PHASES = ("time/epoch_s", "time/task_start_s")  # their sum; the start, in the marks
class Phases(NullLogger):  # each epoch's phases (collection, learning, validation), summed
    def __init__(self):
        self.s, self.passes = {}, []
    def start_task(self, name, params, tags, resume_id=None, dataset=None):
        marks["compile_mode"] = params[cfg["model"]].get("compile_mode")  # as resolved
        return ""
    def log_metrics(self, metrics, step=None):
        if "time/fold_reset_ms" in metrics:  # logged as a fold's first epoch is about to start
            marks.setdefault("first_epoch_start_s", time.time() - t0)
        for k, v in metrics.items():
            if k.startswith("time/") and k.endswith("_s") and k not in NOT_PHASES:
                self.s[k[5:-2]] = self.s.get(k[5:-2], 0.0) + v
        if "eval/val_passes" in metrics:  # the passes each epoch's validation took
            self.passes.append(metrics["eval/val_passes"])
phases = Phases()
if not cfg.pop("next_on_streams"):  # --onegraph (imported here alone: the marks' imports)
    from foxhunt.train.agents import dqn
    dqn.NEXT_ON_STREAMS = False
if cfg["model"] in cfg:  # sizes over the model's defaults (the CPU smoke's)
    cfg[cfg["model"]] = model_config(cfg["model"], cfg[cfg["model"]])
cfg["fold_ids"] = tuple(cfg["fold_ids"])
def on_epoch_end(fold, epoch):
    marks.setdefault("first_epoch_s", time.time() - t0)
    marks["epochs"] = marks.get("epochs", 0) + 1
res = run_train(TrainConfig(folds=Path(cfg.pop("folds")), cache=Path(cfg.pop("cache")),
                            out=Path(cfg.pop("out")), compile_cache=Path(cfg.pop("cc")),
                            tracking="none", baselines=False, resume=False, **cfg),
                phases, on_epoch_end=on_epoch_end)
print(json.dumps({"total_s": time.time() - t0, **marks, "upload_ms": res.upload_ms,
                  "test_sharpe": res.aggregate["test_sharpe"], "folds": len(res.folds),
                  "phases_s": phases.s, "val_passes": phases.passes}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--model", default="dqn", choices=("dqn", "ppo", "pqn"))
    ap.add_argument("--epochs", type=int, default=50)
    ap.add_argument("--folds", type=int, default=3)
    ap.add_argument(
        "--eval-segments", type=int, default=None, help="pieces of a val/test range (the default's)"
    )
    ap.add_argument(
        "--compile-eval", default="on", choices=("on", "off", "both"),
        help="TrainConfig.compile_eval (both: cold and warm on, then warm off)",
    )  # fmt: skip
    ap.add_argument("--compile-mode", default="default", choices=("default", "aot", "auto"),
                    help="the agent's compile_mode: torch.compile's default, 'aot' "
                    "(foxhunt.train.aot) or the DQN's 'auto' ('aot' on a GPU where it can run, "
                    "else torch.compile; the mode chosen is printed)")  # fmt: skip
    ap.add_argument("--aot", action="store_const", const="aot", dest="compile_mode",
                    help="--compile-mode aot")  # fmt: skip
    ap.add_argument(
        "--onegraph",
        action="store_true",
        help="torch.compile's DQN loss as one graph (dqn.NEXT_ON_STREAMS off)",
    )
    ap.add_argument("--profile-start", action="store_true",
                    help="after the warm process, a third under cProfile (1 epoch of the first "
                    "fold): where a warm task's start goes")  # fmt: skip
    args = ap.parse_args()
    if args.compile_mode == "auto" and args.model != "dqn":
        ap.error("--compile-mode auto: the DQN's alone")
    src = str(Path(__file__).resolve().parents[1] / "src")
    out = results_path("bench_plan.json")
    smoke = args.cpu_smoke
    n = 20_000 if smoke else 2_000_000
    res: dict = {"model": args.model, "epochs": args.epochs, "bars": n}
    with tempfile.TemporaryDirectory() as work:  # the cache (~0.5 GB at 2M bars), removed
        root = Path(work)
        t0 = time.perf_counter()
        folds = standard_fxcache(root, n)
        doc = json.loads(folds.read_text())
        fold_ids = [f["fold"] for f in doc["folds"]][: args.folds]
        res["data_s"] = time.perf_counter() - t0
        res["folds"] = [{k: f[k] for k in ("train_start", "train_end", "val_start", "test_end")}
                        for f in doc["folds"][: args.folds]]  # fmt: skip
        print(f"standard market as an fxcache, {len(fold_ids)} folds: {res['data_s']:.1f} s "
              f"(not part of the figures)", flush=True)  # fmt: skip
        cfg = {"folds": str(folds), "cache": str(root / "fxcache"), "cc": str(root / "cc"),
               "model": args.model, "epochs": args.epochs, "fold_ids": fold_ids,
               "device": "cpu" if smoke else "cuda",
               "eval_segments": args.eval_segments,
               "compile_eval": args.compile_eval != "off",
               "next_on_streams": not args.onegraph}  # fmt: skip
        if args.model == "dqn":  # the standard workload's exploration, not the GPU defaults
            cfg["dqn"] = dict(STANDARD_DQN)
        # (compile itself left to the device: on a GPU, on; "aot" turns it on anywhere)
        cfg[args.model] = cfg.get(args.model, {}) | {"compile_mode": args.compile_mode}
        if smoke:
            small = ({"envs": 64, "batch_size": 64, "learn_steps": 8, "collect_steps": 8,
                      "replay_capacity": 4096} if args.model == "dqn" else
                     {"envs": 64, "rollout_steps": 8, "rounds": 1})  # fmt: skip
            cfg[args.model] = cfg.get(args.model, {}) | small
        phases = {"cold cache": cfg["compile_eval"], "warm cache": cfg["compile_eval"]}
        if args.compile_eval == "both":
            phases["warm cache again"] = False
        for phase, compile_eval in phases.items():
            run_cfg = cfg | {"out": str(root / f"runs-{len(res)}"), "compile_eval": compile_eval}
            p, r = run_child(["-c", CHILD], run_cfg, src)
            r = r or child_failure(p, f"bench_plan-{phase.replace(' ', '-')}")
            res[phase] = r
            if "error" in r:
                print(f"{phase}: FAILED (rc {r['rc']}; {r['log']}): {r['error']}", flush=True)
            else:
                how = {"aot": ", steps compiled ahead of time",
                       "auto": f" (compile_mode auto: {r.get('compile_mode')})"}.get(
                           args.compile_mode, "")  # fmt: skip
                how += " (the loss as one graph)" if args.onegraph else ""
                print(f"{args.model}{how} {len(fold_ids)} folds x {args.epochs} epochs, {phase} "
                      f"(evaluation {'compiled' if compile_eval else 'not compiled'}): "
                      f"{r['total_s']:.1f} s from the process's start to its "
                      f"results (imports done at {r['imports_s']:.2f} s, first epoch began at "
                      f"{r['first_epoch_start_s']:.2f} s, "
                      f"done at {r['first_epoch_s']:.2f} s; {r['epochs']} "
                      f"epochs; upload {r['upload_ms']:.0f} ms)", flush=True)  # fmt: skip
                ph = r["phases_s"]
                rest = r["total_s"] - sum(ph.values()) - r["first_epoch_start_s"]
                print("  the epochs' phases summed: " + ", ".join(
                    f"{k} {v:.1f} s" for k, v in ph.items()) + f"; the start "
                    f"{r['first_epoch_start_s']:.1f} s; the rest {rest:.1f} s (each fold's "
                    "reset, exact val and test, checkpoints)", flush=True)  # fmt: skip
                vp = r["val_passes"]
                if vp:
                    print(f"  each epoch's validation: {sum(vp) / len(vp):.2f} passes on average, "
                          f"{max(vp)} at most, {vp.count(VAL_PASSES)} of {len(vp)} epochs at the "
                          f"cap of {VAL_PASSES}", flush=True)  # fmt: skip
            out.write_text(json.dumps(res, indent=1))
        if args.profile_start:
            profile_start(root, cfg | {"out": str(root / "runs-profiled"), "epochs": 1,
                                       "fold_ids": fold_ids[:1]}, src)  # fmt: skip
    print(f"results in {out}")


def run_child(how: list[str], cfg: dict, src: str) -> tuple[subprocess.CompletedProcess, dict]:
    """The training process (`CHILD`, run as `python3 *how`) over `cfg`, timed from now: the
    process and the marks it printed (empty where it printed none)."""
    p = subprocess.run(
        [sys.executable, *how, str(time.time()), src, json.dumps(cfg)],
        capture_output=True, text=True, env=os.environ.copy(),
    )  # fmt: skip
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    return p, json.loads(lines[-1]) if lines else {}


def profile_start(root: Path, cfg: dict, src: str, rows: int = 30) -> None:
    """A warm process under cProfile (`cfg`: 1 epoch of one fold): foxhunt's functions with the
    largest cumulative times, and all functions with the largest own times. The profiler slows
    Python code, so its times are for finding where the start goes, not figures."""
    import pstats

    child, prof = root / "child.py", root / "start.prof"
    child.write_text(CHILD)
    p, r = run_child(["-m", "cProfile", "-o", str(prof), str(child)], cfg, src)
    if p.returncode or not r or not prof.exists():
        print(f"profiled start: FAILED (rc {p.returncode}): {p.stderr[-2000:]}", flush=True)
        return
    print(f"profiled warm process (1 epoch of one fold): imports done at {r['imports_s']:.2f} s, "
          f"first epoch began at {r['first_epoch_start_s']:.2f} s, results at "
          f"{r['total_s']:.2f} s", flush=True)  # fmt: skip
    stats = pstats.Stats(str(prof))
    stats.sort_stats("cumulative").print_stats("foxhunt", rows)
    stats.sort_stats("tottime").print_stats(rows // 2)


if __name__ == "__main__":
    main()
