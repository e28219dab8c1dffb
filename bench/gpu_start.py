"""What a training task pays before its first epoch, on the device: the fxcache opened with its
CRC-32 check, the upload with the value check, for the standard 2M-bar workload.

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
        up = []
        for _ in range(3):
            t0 = time.perf_counter()
            MarketData.from_fxcache(c, dev)
            up.append(time.perf_counter() - t0)
        rows_out.append((f"MarketData on {dev.type} (concat, pin, upload, value check)", up))
    print(f"{rows:,} bars, {size / 1e6:.0f} MB, page cache warm")
    for name, t in rows_out:
        print(f"  {name:58} median {statistics.median(t) * 1e3:8.1f} ms  min {min(t) * 1e3:8.1f}")


if __name__ == "__main__":
    main()
