"""Task start to first epoch, cold and warm: what torch.compile costs a task and what the
compile cache on the fxcache volume (TrainConfig.compile_cache) saves the next one.

    python3 bench/bench_compile_cache.py [--models dqn,ppo,tlob]     on a CUDA device
    python3 bench/bench_compile_cache.py --cpu-smoke                 tiny sizes on the CPU
    python3 bench/bench_compile_cache.py --models dqn,ppo,tlob --aot the models' steps compiled
                                                                     ahead of time (AOTInductor)

For each model, two fresh processes in turn over one empty cache folder: the first compiles
(cold), the second loads what the first kept (warm). Each builds the model at its GPU defaults
over the standard synthetic market (foxhunt.bench.workload), captures it and runs one epoch,
and reports the seconds from its start (interpreter and imports included) to the end of that
epoch, the hits and misses of inductor's FX graph cache and of AOTAutograd's cache, and the
frames Dynamo traced and the graph breaks it met. Goal (issue 18): warm <= 5 s to the first
epoch. Prints a table; JSON to $OUT or /tmp.
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from foxhunt.bench.workload import STANDARD_DQN, child_failure, results_path, standard_market

CHILD = """
import json, sys, time
t0 = float(sys.argv[1])
marks = {}
def mark(name, t=[t0]):
    now = time.time(); marks[name] = now - t[0]; t[0] = now
sys.path.insert(0, sys.argv[2])
from pathlib import Path
import numpy as np
import torch
mark("torch_import")
from foxhunt.train.core import use_compile_cache
use_compile_cache(Path(sys.argv[3]))  # first, as a task does: the caches' paths are set
mark("foxhunt_import")
model, sets = sys.argv[4], json.loads(sys.argv[5])
if sets.get("compile_mode") != "aot":  # ahead of time, nothing is compiled in this process
    import torch._dynamo, torch._inductor.compile_fx  # what the first torch.compile imports
    mark("compiler_imports")
from foxhunt.bench.workload import model_config, one_epoch
from foxhunt.train.agents import AGENTS
from foxhunt.train.data import MarketData
from foxhunt.train.env import EnvConfig
dev, market = torch.device(sys.argv[6]), np.load(sys.argv[7])
if dev.type == "cuda":
    torch.cuda.init()
mark("modules_and_cuda_init")
data = MarketData(market["feats"], market["ofi"], market["ohlc"], dev)
n = data.n
mark("data")
agent = AGENTS[model].load()[1](model_config(model, sets), EnvConfig(), data, 0)
agent.reset_fold(0, int(n * 0.6), seed=1)
mark("build")
if agent.cfg.capture == "graph":
    agent.capture()
mark("compile_capture")
one_epoch(agent, dev)
mark("epoch")
first_epoch_s, compiler_imported = time.time() - t0, "torch._dynamo" in sys.modules
from torch._dynamo.utils import compilation_time_metrics, counters
# Where compile time went (Dynamo's timers, summed over the process's compiled functions;
# they nest: _compile.compile_inner holds the rest).
spent = sorted(((k, sum(v)) for k, v in compilation_time_metrics.items()), key=lambda kv: -kv[1])
print(json.dumps({"first_epoch_s": first_epoch_s, "phases_s": marks,
                  "compiler_imported": compiler_imported,
                  "fxgraph": {k: v for k, v in counters["inductor"].items() if "fxgraph" in k},
                  "aot_autograd": {k: v for k, v in counters["aot_autograd"].items()
                                   if "cache" in k or "bypass" in k},
                  "frames_traced": counters["frames"]["total"],
                  "graph_breaks": sum(counters["graph_break"].values()),
                  "compile_s": dict(spent[:8])}))
"""


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="dqn,ppo,pqn,tlob")
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--aot", action="store_true",
                    help="the models with compile_mode='aot' (foxhunt.train.aot)")  # fmt: skip
    args = ap.parse_args()
    src = str(Path(__file__).resolve().parents[1] / "src")
    dev = "cpu" if args.cpu_smoke else "cuda"
    n = 20_000 if args.cpu_smoke else 2_000_000
    out = results_path("bench_compile_cache.json")
    res = {}
    work = tempfile.TemporaryDirectory()  # the market (~0.5 GB at 2M bars), removed at exit
    market = Path(work.name) / "market.npz"  # what a task maps from its fxcache, made once
    np.savez(market, **dict(zip(("feats", "ofi", "ohlc"), standard_market(n), strict=True)))
    for model in args.models.split(","):
        sets = {"compile": True} | (STANDARD_DQN if model == "dqn" else {})
        if args.aot:
            sets["compile_mode"] = "aot"
            if model == "tft":  # the mode refuses dropout (its draws would not follow the seed)
                sets["dropout"] = 0.0
        if args.cpu_smoke:
            seq = {"window": 8, "batch_size": 32, "steps": 2}  # the supervised models'
            sets |= {"tlob": seq | {"hidden": 8, "layers": 1}, "cfc": seq, "mamba2": seq,
                     "tft": seq, "ppo": {"envs": 64}, "pqn": {"envs": 64},
                     "dqn": {"envs": 64, "batch_size": 64}}.get(model, {})  # fmt: skip
        with tempfile.TemporaryDirectory() as cache:
            row = {}
            for phase in ("cold", "warm"):
                p = subprocess.run(
                    [sys.executable, "-c", CHILD, str(time.time()), src, cache, model,
                     json.dumps(sets), dev, str(market)],
                    capture_output=True, text=True, env=os.environ.copy(),
                )  # fmt: skip
                lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
                row[phase] = (
                    json.loads(lines[-1])
                    if lines
                    else child_failure(p, f"bench_compile_cache-{model}-{phase}")
                )
            res[model] = row
            for phase, v in row.items():
                if "error" in v:
                    print(f"{model:6s} {phase}: FAILED (rc {v.get('rc')}; {v.get('log')}): "
                          f"{v['error']}", flush=True)  # fmt: skip
                    continue
                parts = " ".join(f"{k} {t:.1f}" for k, t in v["phases_s"].items())
                print(f"{model:6s} {phase}: {v['first_epoch_s']:5.1f} s ({parts}) "
                      f"{v['fxgraph']} {v.get('aot_autograd', {})}, "
                      f"{v.get('frames_traced')} frames traced, {v.get('graph_breaks')} graph "
                      f"breaks, Dynamo imported: {v.get('compiler_imported')}",
                      flush=True)  # fmt: skip
                top = ", ".join(f"{k} {t:.1f}" for k, t in v["compile_s"].items())
                print(f"{'':6s} compile time by Dynamo's timers (s): {top}", flush=True)
            out.write_text(json.dumps(res, indent=1))
    work.cleanup()
    print(f"results in {out}")


if __name__ == "__main__":
    main()
