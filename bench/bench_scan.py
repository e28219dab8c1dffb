"""A float64 running sum on a GPU: torch's (CUB's device-wide scan) against foxhunt.train.scan's
(three Triton kernels) and its fallback where Triton is missing (`scan.rows_scan`, two levels
of torch's row scans), at an evaluation range's length (290k bars), the replay's (1M slots) and
a stack of 8 replays' (8M): docs/gpu-step.md's table.

    python3 bench/bench_scan.py          on a CUDA device

Each form runs 20 times inside a CUDA graph; the figure is the median over 10 replays of the
time a call (foxhunt.bench.graphs). "same every run" says whether 10 more calls gave the first
one's result bit for bit, and the last column how far a form's sums lie from CUB's first call
(float rounding).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from foxhunt.bench.graphs import per_call_us
from foxhunt.train import scan

SIZES = (290_000, 1 << 20, 8 << 20)


def main() -> None:
    if not torch.cuda.is_available():
        sys.exit("bench_scan needs a CUDA device")
    g = torch.Generator(device="cuda").manual_seed(0)
    print(f"{'values':>9}  {'form':<8} {'us a call':>9}  same every run  from CUB's, at most")
    forms = {
        "CUB": lambda x: torch.cumsum(x, 0),
        "Triton": scan.cumsum,
        "rows": lambda x: scan.rows_scan(x, "sum"),
    }
    for n in SIZES:
        x = torch.rand(n, device="cuda", dtype=torch.float64, generator=g)
        cub = torch.cumsum(x, 0)
        for name, form in forms.items():
            us = per_call_us(lambda form=form, x=x: form(x))
            first = form(x)
            same = all(torch.equal(form(x), first) for _ in range(10))
            diff = (first - cub).abs().max().item()
            print(f"{n:9d}  {name:<8} {us:9.1f}  {same!s:<14}  {diff:.1e}", flush=True)


if __name__ == "__main__":
    main()
