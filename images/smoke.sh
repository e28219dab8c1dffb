#!/bin/sh
# Smoke test run inside a built image (images/build-local.sh runs it as uid 10001): the CPU
# image's steps chained on a tiny demo set, each writing only under one work directory (the
# root filesystem may be read-only in a pod; caches go to /tmp by the image's environment).
#   images/smoke.sh cpu [WORK]     synth -> ingest -> precompute -> folds -> train -> report
#   images/smoke.sh gpu            the imports the train step needs (torch, triton), its C++
#                                  compiler, a toy package compiled ahead of time and loaded
#   images/smoke.sh mlflow         the MLflow server's command line
#   images/smoke.sh bytecode PKG.. every module of these packages has bytecode that an import
#                                  uses without checking its source (the cpu and gpu runs
#                                  check torch's and foxhunt's)
set -eu
what=${1:?cpu, gpu, mlflow or bytecode PKG...}

bytecode() {
    python - "$@" <<'PY'
import importlib.util, sys
from pathlib import Path
bad, n = [], 0
for name in sys.argv[1:]:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"bytecode: {name} is not an importable package")
    for root in spec.submodule_search_locations:
        for py in sorted(Path(root).rglob("*.py")):
            pyc = Path(importlib.util.cache_from_source(str(py)))
            if pyc.exists():
                with open(pyc, "rb") as f:
                    flags = int.from_bytes(f.read(8)[4:8], "little")
                n += 1
                if flags != 1:  # PEP 552: 1 = hash-based, not checked against the source
                    bad.append(f"{py}: its bytecode is checked against the source at import "
                               f"(flags {flags}; compileall --invalidation-mode unchecked-hash)")
                continue
            try:  # a file this Python cannot parse stays source (compileall skips it too)
                compile(py.read_bytes(), str(py), "exec")
            except (SyntaxError, ValueError):
                continue
            bad.append(f"{py}: no bytecode ({pyc.name})")
if bad:
    sys.exit("bytecode: " + str(len(bad)) + " of the modules of " + ", ".join(sys.argv[1:])
             + " lack bytecode used unchecked at import:\n  " + "\n  ".join(bad[:20]))
print(f"bytecode: {n} modules of {', '.join(sys.argv[1:])}, each used unchecked at import")
PY
}

case "$what" in
bytecode)
    shift
    bytecode "$@"
    ;;
cpu)
    work=${2:-$(mktemp -d)}
    foxhunt --help >/dev/null
    bytecode torch foxhunt
    python -c "import kfp.dsl.executor_main, polars, databento_dbn, talib, torch, mlflow, foxhunt.cli; print('imports: kfp executor, polars, databento_dbn, talib, torch', torch.__version__, 'mlflow', mlflow.__version__)"
    foxhunt synth --out "$work/raw" --symbols ES --start 2024-01-02 --end 2024-04-01 \
        --events-per-bar 5 >/dev/null
    foxhunt ingest --raw "$work/raw" --out "$work/ingested" >/dev/null
    foxhunt precompute --data "$work/ingested" --out "$work/fxcache" --symbols ES >/dev/null
    foxhunt folds --cache "$work/fxcache" --symbol ES --out "$work/folds.json" \
        --train-months 1 >/dev/null
    foxhunt train --folds "$work/folds.json" --cache "$work/fxcache" --epochs 1 --fold-ids 0 \
        --out "$work/runs" --tracking none --dqn.envs 8 --dqn.collect-steps 4 \
        --dqn.learn-steps 2 --dqn.batch-size 16 --dqn.hidden 16 16 --dqn.replay-capacity 256 \
        | grep "test Sharpe"
    foxhunt report --runs "$work/runs" --out "$work/report" >/dev/null
    test -s "$work/report/report.md"
    echo "cpu chain: synth, ingest, precompute, folds, train (1 epoch), report: ok"
    ;;
gpu)
    foxhunt --help >/dev/null
    bytecode torch foxhunt
    python -c "import torch, triton, kfp.dsl.executor_main, foxhunt.train; print('imports: torch', torch.__version__, 'CUDA', torch.version.cuda, 'triton', triton.__version__, '; CUDA device here:', torch.cuda.is_available())"
    # The compiler AOTInductor builds the steps compiled ahead of time with, and torch's loader
    # of what it builds: a toy package built and loaded, each in a process of its own.
    python -c "from torch._inductor.cpp_builder import get_cpp_compiler; print('C++ compiler:', get_cpp_compiler())"
    python -m foxhunt.train.aot_probe
    ;;
mlflow)
    mlflow server --help >/dev/null
    python -c "import mlflow, psycopg2, boto3; print('mlflow', mlflow.__version__, 'server --help: ok')"
    # The server itself, on a throwaway SQLite store, until it answers /health.
    work=$(mktemp -d)
    port=$(python -c "import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); print(s.getsockname()[1])")
    mlflow server --backend-store-uri "sqlite:///$work/mlflow.db" --host 127.0.0.1 \
        --port "$port" --workers 1 >"$work/server.log" 2>&1 &
    pid=$!
    python - "$port" <<'PY' || { kill "$pid"; tail -20 "$work/server.log"; exit 1; }
import sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}/health"
for _ in range(120):
    try:
        body = urllib.request.urlopen(url, timeout=2).read().decode()
        print("mlflow server answered /health:", body)
        break
    except OSError:
        time.sleep(0.5)
else:
    sys.exit("mlflow server did not answer /health within 60 s")
PY
    kill "$pid"
    ;;
*)
    echo "unknown image kind: $what" >&2
    exit 2
    ;;
esac
