"""Mamba-2's SSD layer, forward + backward: foxhunt's chunked algorithm (eager and compiled)
against the step-by-step scan and, where it runs, `mamba-ssm`'s Triton kernel
(mamba_chunk_scan_combined), on the same inputs in one call; each checked against the others.

    python3 bench/bench_ssd.py [--mamba-ssm .ref/mamba_ssm]      on a CUDA device
    python3 bench/bench_ssd.py --cpu-smoke

Shapes: Mamba-2's GPU defaults in foxhunt (d_model 128, expand 2: 4 heads of 64 channels,
state 64, one group, chunks of 64) on windows of 128 bars, batch 1024. mamba-ssm's package
__init__ imports its CUDA extension; without it (the wheel built with MAMBA_SKIP_CUDA_BUILD)
only the Triton SSD is imported, from its source folder (`--mamba-ssm`). Goals (issue 17):
ours within 1.5x of mamba-ssm's kernel, >= 20x the sequential scan. Prints a table; JSON to
$OUT or /tmp.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from foxhunt.bench.workload import results_path
from foxhunt.train.models.mamba2 import ssd_chunked, ssd_scan


def mamba_ssm_kernel(src: Path | None):
    """mamba_chunk_scan_combined from a mamba_ssm source folder, without its package
    __init__ (which needs the CUDA extension); None where it does not import."""
    if src is None:
        return None
    try:
        pkg = types.ModuleType("mamba_ssm")
        pkg.__path__ = [str(src)]
        sys.modules["mamba_ssm"] = pkg
        from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

        return mamba_chunk_scan_combined
    except Exception as e:
        print(f"mamba-ssm not usable here: {type(e).__name__}: {str(e)[:300]}")
        return None


def inputs(b, L, h, p, n, dev, seed=0):
    g = torch.Generator(dev).manual_seed(seed)
    x = torch.randn(b, L, h, p, device=dev, generator=g)
    dt = F.softplus(torch.randn(b, L, h, device=dev, generator=g) - 2.0)
    A = -torch.rand(h, device=dev, generator=g) * 4 - 0.5
    B = torch.randn(b, L, 1, n, device=dev, generator=g)
    C = torch.randn(b, L, 1, n, device=dev, generator=g)
    return x, dt, A, B, C


def timed(fn, args, dev, reps: int) -> tuple[float, torch.Tensor]:
    """Median seconds of forward + backward (a fixed random cotangent), and the output."""
    leaves = [a.detach().clone().requires_grad_() for a in args]
    out = fn(*leaves)
    w = torch.randn_like(out)
    times = []
    for _ in range(reps + 2):
        leaves = [a.detach().clone().requires_grad_() for a in args]
        if dev.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = fn(*leaves)
        (out * w).sum().backward()
        if dev.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return sorted(times[2:])[len(times[2:]) // 2], out.detach()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--mamba-ssm", type=Path, default=None, help="mamba_ssm source folder")
    ap.add_argument("--batch", type=int, default=1024)
    args = ap.parse_args()
    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    b, L, h, p, n, chunk = (4, 32, 2, 8, 8, 16) if args.cpu_smoke else (args.batch, 128, 4, 64,
                                                                        64, 64)  # fmt: skip
    x, dt, A, B, C = inputs(b, L, h, p, n, dev)

    def ours(x, dt, A, B, C):
        return ssd_chunked(x, dt, A, B.expand(-1, -1, h, -1), C.expand(-1, -1, h, -1), chunk)

    def scan(x, dt, A, B, C):
        return ssd_scan(x, dt, A, B.expand(-1, -1, h, -1), C.expand(-1, -1, h, -1))

    # The scan first (every other row's reference), then each row printed as it is timed.
    rows = {"sequential scan": scan, "ours (eager)": ours}
    kernel = mamba_ssm_kernel(args.mamba_ssm) if dev.type == "cuda" else None
    if kernel is not None:
        rows["mamba-ssm Triton"] = lambda x, dt, A, B, C: kernel(x, dt, A, B, C, chunk_size=chunk)
    rows["ours (torch.compile)"] = torch.compile(ours)
    res = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
           "shape": dict(batch=b, L=L, heads=h, headdim=p, state=n, chunk=chunk)}  # fmt: skip
    out_path = results_path("bench_ssd.json")
    ref = None
    for name, fn in rows.items():
        reps = 3 if name == "sequential scan" else 20
        try:
            s, out = timed(fn, (x, dt, A, B, C), dev, 1 if args.cpu_smoke else reps)
        except Exception as e:
            res[name] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
            print(f"{name:24s} FAILED {res[name]['error']}", flush=True)
            continue
        out = out.float()
        ref = out if ref is None else ref
        err = float((out - ref).norm() / ref.norm())
        res[name] = {"fwd_bwd_ms": s * 1e3, "rel_err_vs_scan": err}
        print(f"{name:24s} {s * 1e3:9.3f} ms forward + backward   "
              f"rel. error vs the scan {err:.2e}", flush=True)  # fmt: skip
        out_path.write_text(json.dumps(res, indent=1))
    base = res["ours (torch.compile)"].get("fwd_bwd_ms") or res["ours (eager)"]["fwd_bwd_ms"]
    for name in rows:
        if "fwd_bwd_ms" in res.get(name, {}):
            print(f"  {name} / ours compiled: {res[name]['fwd_bwd_ms'] / base:.2f}x")
    out_path.write_text(json.dumps(res, indent=1))
    print(f"results in {out_path}")


if __name__ == "__main__":
    main()
