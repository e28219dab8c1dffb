"""Precompute throughput and fxcache open time on this machine.

    make bench          (or: .venv/bin/python bench/bench_precompute.py [--data data/ingested])

Precompute: `foxhunt precompute` of the demo set (both roots, 1-minute bars) into an empty cache
root, timed end to end (roll schedule, every front-month MBP-10 event read and aggregated,
features, OFI, publish), repeated; MBP-10 events/s and bars/s. Uses `--data` when it holds an
ingested set, else makes the `make run` demo set in a temporary directory first.

fxcache open: a cache of 2M bars (~0.5 GB) is published once; `FxCache.open` is timed in a fresh
process (first open) and repeatedly in this one. Figures go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from foxhunt.fxcache import FxCache, publish
from foxhunt.ingest.core import IngestConfig, run_ingest
from foxhunt.precompute import PrecomputeConfig, run_precompute
from foxhunt.synth.generate import SynthConfig, generate


def _ci95(xs: list[float]) -> float:
    """Half-width of the Student-t 95% interval of the mean (t values for small n)."""
    t = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}
    n = len(xs)
    return t.get(n, 2.0) * statistics.stdev(xs) / n**0.5 if n > 1 else float("nan")


def bench_precompute(data: Path, repeats: int, tmp: Path) -> None:
    rates, bar_rates, secs = [], [], []
    for i in range(repeats):
        out = tmp / f"fx{i}"
        t = time.perf_counter()
        res = run_precompute(PrecomputeConfig(data=data, out=out))
        sec = time.perf_counter() - t
        bars = sum(s.rows for s in res.symbols)
        secs.append(sec)
        rates.append(res.events / sec)
        bar_rates.append(bars / sec)
        shutil.rmtree(out)
    print(
        f"precompute, {len(res.symbols)} roots, {res.events:,} MBP-10 events, {bars:,} bars, "
        f"{os.cpu_count()} cores, {repeats} runs:"
    )
    print(f"  time        {statistics.mean(secs):6.2f} s   +- {_ci95(secs):.2f} (95% CI)")
    print(
        f"  events/s    {statistics.mean(rates) / 1e6:6.2f} M   +- {_ci95(rates) / 1e6:.2f}"
        f"   (min {min(rates) / 1e6:.2f}, max {max(rates) / 1e6:.2f})"
    )
    print(
        f"  bars/s      {statistics.mean(bar_rates) / 1e3:6.1f} k   +- {_ci95(bar_rates) / 1e3:.1f}"
    )


OPEN_SNIPPET = """
import sys, time
from foxhunt.fxcache import FxCache
check = sys.argv[2] == "1"
t = time.perf_counter(); c = FxCache.open(sys.argv[1], check=check); dt = time.perf_counter() - t
print(dt, len(c))
"""


def bench_open(rows: int, repeats: int, tmp: Path) -> None:
    """Opening maps the arrays (zero-copy) and, by default, reads every file once against its
    manifest CRC-32: both are timed, each in fresh processes and repeatedly in this one."""
    rng = np.random.default_rng(0)
    arrays = {
        "features": rng.standard_normal((rows, 42), dtype=np.float32),
        "ofi": rng.standard_normal((rows, 8), dtype=np.float32),
        "targets": 4800 + rng.standard_normal((rows, 4)),
        "timestamps": np.arange(rows, dtype=np.int64) * 60_000_000_000,
    }
    path = publish(tmp / "open", "k2m", arrays, {"symbol": "ES", "bar_size": "1m"})
    size = sum(f.stat().st_size for f in path.iterdir())
    del arrays
    print(f"fxcache open, {rows:,} bars ({size / 1e6:.0f} MB), page cache warm:")
    for check, label, n in ((False, "map only", repeats), (True, "map + CRC-32 check", 10)):
        fresh = []
        for _ in range(3):
            out = subprocess.run(
                [sys.executable, "-c", OPEN_SNIPPET, str(path), str(int(check))],
                capture_output=True,
                text=True,
            )
            fresh.append(float(out.stdout.split()[0]))
        warm = []
        for _ in range(n):
            t = time.perf_counter()
            c = FxCache.open(path, check=check)
            warm.append(time.perf_counter() - t)
            assert len(c) == rows
        print(
            f"  {label:20} fresh process median {statistics.median(fresh) * 1e3:7.1f} ms (3 runs);"
            f" same process median {statistics.median(warm) * 1e3:7.1f} ms ({n} runs)"
            + (f", {size / statistics.median(warm) / 1e9:.2f} GB/s" if check else "")
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=Path("data/ingested"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--open-rows", type=int, default=2_000_000)
    args = ap.parse_args()
    print(f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory(dir=".") as d:
        tmp = Path(d)
        data = args.data
        if not (data / "manifest.json").is_file():
            print(f"{data} has no ingested set: making the demo set first")
            generate(SynthConfig(out=tmp / "raw"))
            run_ingest(IngestConfig(raw=tmp / "raw", out=tmp / "ingested"))
            data = tmp / "ingested"
        bench_precompute(data, args.repeats, tmp)
        bench_open(args.open_rows, 50, tmp)


if __name__ == "__main__":
    main()
