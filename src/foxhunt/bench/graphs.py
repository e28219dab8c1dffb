"""The time of one call of a small GPU operation, without the CPU's launch cost: `calls` calls
captured in a CUDA graph, the graph replayed `replays` times between CUDA events, the median
replay over `calls`. For the kernel benches (bench/bench_c51_kernel.py, bench/bench_scan.py)."""

from __future__ import annotations

import torch


def per_call_us(fn, calls: int = 20, replays: int = 10) -> float:
    """Microseconds a call of `fn` (no arguments; its outputs are the graph's to keep)."""
    for _ in range(3):  # warm-up: allocations, lazy initialisation, JIT compilation
        fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for _ in range(replays):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end) * 1e3 / calls)
    return sorted(ts)[len(ts) // 2]
