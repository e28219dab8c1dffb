"""What a training task pays before its first epoch, on the device: the fxcache opened with its
CRC-32 check, the device copy of its arrays (straight from the map, or through page-locked
memory) with the value check, for the standard 2M-bar workload.

    python3 bench/gpu_start.py          (needs numpy and torch; CUDA when present)
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from foxhunt.fxcache import FxCache, publish
from foxhunt.train.data import MarketData


def main(rows: int = 2_000_000) -> None:
    rng = np.random.default_rng(0)
    arrays = {
        "features": rng.standard_normal((rows, 42), dtype=np.float32),
        "ofi": rng.standard_normal((rows, 8), dtype=np.float32),
        "targets": 4800 + rng.random((rows, 4)),
        "timestamps": np.arange(rows, dtype=np.int64) * 60_000_000_000,
    }
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    with tempfile.TemporaryDirectory() as d:
        path = publish(Path(d), "k", arrays, {"symbol": "ES", "bar_size": "1m"})
        del arrays
        size = sum(f.stat().st_size for f in path.iterdir())
        rows_out = []
        for check in (False, True):
            t = []
            for _ in range(5):
                t0 = time.perf_counter()
                c = FxCache.open(path, check=check)
                t.append(time.perf_counter() - t0)
            rows_out.append((f"open, {'map + CRC-32' if check else 'map only'}", t))
        if dev.type == "cuda":  # CUDA's initialisation, outside the rows below
            torch.ones(1, device=dev).sum().item()
        for pin in (False, True) if dev.type == "cuda" else (False,):
            # The first build in a process pins fresh host memory; later ones reuse the
            # caching host allocator's blocks, as a task never does: the first is its own row.
            t = []
            for _ in range(4):
                t0 = time.perf_counter()
                MarketData.from_fxcache(c, dev, pin=pin)
                t.append(time.perf_counter() - t0)
            what = "pinned" if pin else "pageable, the default"
            rows_out.append((f"MarketData on {dev.type}, {what}: first build", t[:1]))
            rows_out.append((f"MarketData on {dev.type}, {what}: builds 2-4", t[1:]))
    print(f"{rows:,} bars, {size / 1e6:.0f} MB, page cache warm")
    for name, t in rows_out:
        print(f"  {name:58} median {statistics.median(t) * 1e3:8.1f} ms  min {min(t) * 1e3:8.1f}")


if __name__ == "__main__":
    main()
