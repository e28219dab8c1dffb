"""C51's target projection alone: the torch form (eager and compiled) against the Triton kernel
of foxhunt.train.agents.c51_triton at each samples-a-program / warps pair, at the standard
workload's batch.

    python3 bench/bench_c51_kernel.py          on a CUDA device with Triton

Inputs as the learning step's loss sees them: the target and online networks' bf16 logits
[8192, 30, 51], once as a slice of a [.., 64]-wide output (padded strides) and once contiguous,
rewards N(0, 0.5^2), discount 0.99^3, the support [-10, 10]. Each variant runs 20 times inside
a CUDA graph; the figure is the median over 10 replays of the time a call. The kernel's rows
also give its largest difference from the torch form (float rounding: the same arithmetic
summed in another order). The torch form's time includes the double-Q argmax, which the
kernel's caller (`c51_triton.next_target`) leaves to torch; its time alone is printed beside.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from foxhunt.train.agents import c51_triton as ct
from foxhunt.train.agents.dqn import c51_next_target, expected_q

B, A, N = 8192, 30, 51


def per_call_us(fn, calls: int = 20, replays: int = 10) -> float:
    for _ in range(3):
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


def time_layout(layout: str, tg, on, R, disc, z) -> None:
    import triton

    ref, _ = c51_next_target(on, tg, R, disc, z)
    a2 = expected_q(on, z, "c51").argmax(-1)
    eager = per_call_us(lambda: c51_next_target(on, tg, R, disc, z))
    argmax = per_call_us(lambda: expected_q(on, z, "c51").argmax(-1))
    compiled = per_call_us(torch.compile(lambda: c51_next_target(on, tg, R, disc, z)))
    print(f"{layout}: torch form {eager:.1f} us eager, {compiled:.1f} us compiled "
          f"(the argmax alone, eager: {argmax:.1f} us)")  # fmt: skip
    out = torch.empty(B, 1, N, device=tg.device)
    clip = torch.empty(B, 1, device=tg.device)
    for bb in (1, 2, 4, 8):
        for nw in (1, 2, 4, 8):
            if bb * 64 * 64 > nw * 32 * 512:  # more than 512 weights a thread
                continue

            def kernel(bb=bb, nw=nw):
                ct._project_kernel[(triton.cdiv(B, bb),)](
                    tg, a2, R, disc.reshape(-1), z, out, clip, B, N, *tg.stride(),
                    BLOCK_B=bb, BLOCK_N=64, num_warps=nw,
                )  # fmt: skip

            t = per_call_us(kernel)
            err = (out - ref).abs().max().item()
            print(f"{layout}: kernel, {bb} sample(s) and {nw} warp(s) a program: "
                  f"{t:6.1f} us (largest difference {err:.1e})", flush=True)  # fmt: skip


def main() -> None:
    if not ct.available():
        sys.exit("bench_c51_kernel needs a CUDA device and Triton")
    torch.manual_seed(0)
    dev = torch.device("cuda")
    tg_pad = torch.randn(B, A, 64, device=dev, dtype=torch.bfloat16)[:, :, :N]
    on_pad = torch.randn(B, A, 64, device=dev, dtype=torch.bfloat16)[:, :, :N]
    R = torch.randn(B, device=dev) * 0.5
    disc = torch.full((B, 1), 0.99**3, device=dev)
    z = torch.linspace(-10, 10, N, device=dev)
    print(f"the default: {ct.BLOCK_B} sample(s) and {ct.NUM_WARPS} warp(s) a program")
    time_layout("padded", tg_pad, on_pad, R, disc, z)
    time_layout("contiguous", tg_pad.contiguous(), on_pad.contiguous(), R, disc, z)


if __name__ == "__main__":
    main()
