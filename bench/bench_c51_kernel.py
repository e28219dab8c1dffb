"""C51's next-state target alone: the torch form (eager and compiled) against the Triton kernel
of foxhunt.train.agents.c51_triton at each warps-a-program choice, at the standard workload's
batch.

    python3 bench/bench_c51_kernel.py          on a CUDA device with Triton

Inputs as the learning step's loss sees them: the target and online networks' bf16 dueling
streams, the value [8192, 1, 51] and the advantage [8192, 30, 51] as slices of [.., 56]- and
[.., 1536]-wide outputs (the heads' padded strides), rewards N(0, 0.5^2), discount 0.99^3, the
support [-10, 10]. The torch form is given the logits (the streams' sum, formed first as in
the network: its time includes forming them) and includes the double-Q argmax, as the kernel
does. Each variant runs 20 times inside a CUDA graph; the figure is the median over 10
replays of the time a call. The kernel's rows also give the share of samples whose target
differs from the torch form's by more than float rounding (an action chosen otherwise on a
near tie of expected values) and the largest difference on the rest.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from foxhunt.bench.graphs import per_call_us
from foxhunt.train.agents import c51_triton as ct
from foxhunt.train.agents.dqn import c51_next_target, expected_q

B, A, N = 8192, 30, 51


def time_streams(on, tg, R, disc, z) -> None:
    def torch_form():
        return c51_next_target(on[0] + on[1], tg[0] + tg[1], R, disc, z)

    ref, _ = torch_form()
    eager = per_call_us(torch_form)
    compiled = per_call_us(torch.compile(torch_form))
    argmax = per_call_us(lambda: expected_q(on[0] + on[1], z, "c51").argmax(-1))
    print(f"torch form {eager:.1f} us eager, {compiled:.1f} us compiled (forming the online "
          f"logits and the argmax alone, eager: {argmax:.1f} us)")  # fmt: skip
    default = ct.NUM_WARPS
    for nw in (1, 2, 4, 8):
        ct.NUM_WARPS = nw
        t = per_call_us(lambda: ct.next_target(on, tg, R, disc, z))
        out, _ = ct.next_target(on, tg, R, disc, z)
        bad = ((out - ref).abs() > 1e-5).any(-1)[:, 0]
        err = (out - ref).abs()[~bad].max().item()
        print(f"kernel, {nw} warp(s) a program: {t:6.1f} us ({bad.float().mean():.2%} of the "
              f"samples choose otherwise; largest difference on the rest {err:.1e})",
              flush=True)  # fmt: skip
    ct.NUM_WARPS = default


def main() -> None:
    if not ct.available():
        sys.exit("bench_c51_kernel needs a CUDA device and Triton")
    torch.manual_seed(0)
    dev = torch.device("cuda")

    def streams():
        v = torch.randn(B, 56, device=dev, dtype=torch.bfloat16)[:, None, :N]
        a = torch.randn(B, 1536, device=dev, dtype=torch.bfloat16)[:, : A * N].view(B, A, N)
        return v, a

    on, tg = streams(), streams()
    R = torch.randn(B, device=dev) * 0.5
    disc = torch.full((B, 1), 0.99**3, device=dev)
    z = torch.linspace(-10, 10, N, device=dev)
    print(f"the default: {ct.NUM_WARPS} warp(s) a program")
    time_streams(on, tg, R, disc, z)


if __name__ == "__main__":
    main()
