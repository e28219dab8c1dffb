"""A cohort's start on a GPU: `foxhunt train --seeds` of the demo's DQN, stacked (the default
on a GPU), from the call to each epoch's end, with each seed's evaluation compiled or not.

    python3 bench/bench_seeds_start.py --compile-eval on     on a CUDA device
    python3 bench/bench_seeds_start.py --compile-eval off    (the next process: a warmer cache)
    python3 bench/bench_seeds_start.py --device cpu --seeds 2 --epochs 1 --bars 20000   a check

One fold of the standard synthetic market (foxhunt.bench.workload, 200,000 bars by default,
months 3/1/1), `--epochs` epochs of `--seeds` seeds at the demo's DQN settings
(foxhunt.train.demo.DQN), no tracking or baselines, through `foxhunt.train.core.train_seeds`
as the pipeline's task calls it. Prints the seconds in all and at each epoch's end (one mark a
seed and epoch); JSON to $OUT or /tmp. The compile cache is inductor's default folder (or
TORCHINDUCTOR_CACHE_DIR): run twice for a warm figure.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from foxhunt.bench.workload import results_path, standard_fxcache
from foxhunt.train import demo
from foxhunt.train.core import TrainConfig, train_seeds


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-eval", choices=("on", "off"), default="on")
    ap.add_argument("--seeds", type=int, default=8)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--bars", type=int, default=200_000)
    ap.add_argument(
        "--device",
        choices=("cuda", "cpu"),
        default="cuda",
        help="cpu: a check that the script runs (small --bars, --seeds, --epochs)",
    )
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp())
    folds = standard_fxcache(tmp / "data", args.bars)
    fold = json.loads(folds.read_text())["folds"][0]["fold"]
    cfg = TrainConfig(
        folds=folds, cache=tmp / "data" / "fxcache", out=tmp / "runs", epochs=args.epochs,
        fold_ids=(fold,), device=args.device, tracking="none", baselines=False, run_id="bench",
        seeds=tuple(range(args.seeds)), compile_eval=args.compile_eval == "on",
        dqn=dataclasses.replace(demo.DQN),
    )  # fmt: skip
    t0 = time.perf_counter()
    marks: list[float] = []
    results = train_seeds(cfg, lambda *_: marks.append(time.perf_counter() - t0))
    total = time.perf_counter() - t0
    res = {"seeds": args.seeds, "epochs": args.epochs, "compile_eval": args.compile_eval,
           "total_s": total, "epoch_ends_s": marks,
           "test_sharpe": [r.folds[0]["test"].get("sharpe") for r in results]}  # fmt: skip
    print(f"{args.seeds} seeds, {args.epochs} epochs, compiled evaluation {args.compile_eval}: "
          f"{total:.1f} s in all; the first epoch's end at {marks[0]:.1f} s, the last "
          f"{marks[-1]:.1f} s")  # fmt: skip
    out = results_path("bench_seeds_start.json")
    out.write_text(json.dumps(res, indent=2))
    print(f"results in {out}")


if __name__ == "__main__":
    main()
