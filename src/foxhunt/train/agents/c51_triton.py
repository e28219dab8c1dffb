"""C51's projection of the next-state distribution in one Triton kernel (CUDA only).

`next_target` computes what `dqn.c51_next_target` does in torch: the double-Q choice of the
next action (the online logits' expected value under the support, argmax over the actions;
left to torch, which inductor fuses into one kernel when the loss is compiled), then in one
kernel the target network's distribution of that action (gather and softmax) and its
projection onto the support shifted to R + disc * z (Bellemare et al.'s Algorithm 1, in the
dense form of `dqn.project_c51`). In torch that part writes a [B, 51, 51] weight matrix to
memory and multiplies it by a batched matrix-vector kernel: ~100 us a learning step on an H200
at batch 8,192 (a 60 us gemv, a 24 us kernel for the matrix, 16 us for the gather and
softmax). Here each sample's weights are computed in registers where they are used, and only
the [B, 51] target is written. The standard epoch (H200, 2026-12-03, one call, each variant
built twice and timed in turn, `bench/bench_train.py --variants
graph-bf16-compile-torchtarget,graph-bf16-compile,...`): 0.342 s against 0.367 s with the
torch form, at 2 samples and 4 warps a program; 0.336 s at 1 sample and 1 warp (BLOCK_B;
a later call). The kernel alone: `bench/bench_c51_kernel.py`.

Same arithmetic as the torch form in float32, summed in another order: the targets agree to
float rounding (tests/test_train_gpu.py). The kernel has no atomics, so a run is as
deterministic as the torch form, and eager and captured runs stay bit-identical (both launch
this kernel; tested). Registered as a `torch.library.triton_op`, so torch.compile traces
through it and CUDA graphs capture it. There is no vmap rule: the stacked agents (dqn_stacked)
use the torch form.

`available()` says whether it can run: Triton installed (it ships with torch's CUDA builds)
and a CUDA device.
"""

from __future__ import annotations

import functools

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # torch's CPU builds ship without Triton
    triton = None


@functools.cache
def available() -> bool:
    return triton is not None and torch.cuda.is_available()


BLOCK_B = 1
"""Samples a program projects: a [1, 64, 64] tile of weights in the registers of one warp
(NUM_WARPS). At batch 8,192 on an H200 (2026-12-03, the network's bf16 output with padded
strides and contiguous, in a CUDA graph; `bench/bench_c51_kernel.py`): 12.5 us; 1 sample and
2-8 warps 20-50 us; 2 samples and 1-4 warps 12.4-22 us (4 warps was the first choice: 22 us);
4 and 8 samples 19-565 us."""
NUM_WARPS = 1

if triton is not None:

    @triton.jit
    def _project_kernel(
        tg_ptr, a_ptr, r_ptr, disc_ptr, z_ptr, out_ptr, clip_ptr,
        B, N, s_tb, s_ta, s_tn,
        BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0) * BLOCK_B + tl.arange(0, BLOCK_B)  # [BB]
        n = tl.arange(0, BLOCK_N)  # [BN]: the atoms, as j (source) and as i (target)
        bm, nm = b < B, n < N
        # The target net's distribution of the chosen action.
        a2 = tl.load(a_ptr + b, mask=bm, other=0)
        t = tl.load(
            tg_ptr + b[:, None] * s_tb + a2[:, None] * s_ta + n[None, :] * s_tn,
            mask=bm[:, None] & nm[None, :], other=-1e30,
        ).to(tl.float32)  # fmt: skip
        e = tl.exp(t - tl.max(t, 1)[:, None])
        p = e / tl.sum(e, 1)[:, None]  # [BB, BN(j)]; 0 on the padded atoms
        # Projection onto z of the support shifted to R + disc * z.
        r = tl.load(r_ptr + b, mask=bm, other=0.0)
        d = tl.load(disc_ptr + b, mask=bm, other=0.0)
        z = tl.load(z_ptr + n, mask=nm, other=0.0)
        v_min = tl.load(z_ptr)
        v_max = tl.load(z_ptr + N - 1)
        dz = (v_max - v_min) / (N - 1)
        tz = r[:, None] + d[:, None] * z[None, :]  # [BB, BN(j)]
        outside = ((tz < v_min) | (tz > v_max)) & nm[None, :]
        clip = tl.sum(tl.where(outside, p, 0.0), 1)
        pos = (tl.minimum(tl.maximum(tz, v_min), v_max) - v_min) / dz
        i = n.to(tl.float32)
        w = tl.maximum(1.0 - tl.abs(pos[:, :, None] - i[None, None, :]), 0.0)  # [BB, j, i]
        proj = tl.sum(p[:, :, None] * w, 1)  # [BB, BN(i)]
        tl.store(out_ptr + b[:, None] * N + n[None, :], proj, mask=bm[:, None] & nm[None, :])
        tl.store(clip_ptr + b, clip, mask=bm)

    @torch.library.triton_op("foxhunt::c51_project", mutates_args=())
    def _project_op(
        tg2: torch.Tensor, a2: torch.Tensor, R: torch.Tensor, disc: torch.Tensor, z: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        B, _, N = tg2.shape
        out = torch.empty(B, 1, N, device=tg2.device, dtype=torch.float32)
        clip = torch.empty(B, 1, device=tg2.device, dtype=torch.float32)
        torch.library.wrap_triton(_project_kernel)[(triton.cdiv(B, BLOCK_B),)](
            tg2, a2, R, disc, z, out, clip, B, N, *tg2.stride(),
            BLOCK_B=BLOCK_B, BLOCK_N=triton.next_power_of_2(N), num_warps=NUM_WARPS,
        )  # fmt: skip
        return out, clip


def next_target(
    on2: torch.Tensor, tg2: torch.Tensor, R: torch.Tensor, disc: torch.Tensor, z: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`dqn.c51_next_target` with the gather, softmax and projection in one kernel: on2, tg2
    [B, A, atoms] (any float dtype, any strides), R [B], disc [B, 1], z [atoms] float32.
    Returns the target distribution [B, 1, atoms] and the target mass clipped at the support's
    ends [B, 1], float32."""
    if not available():
        raise RuntimeError("c51_triton.next_target needs Triton and a CUDA device")
    from foxhunt.train.agents.dqn import expected_q  # dqn imports this module

    a2 = expected_q(on2, z, "c51").argmax(-1)  # [B]
    return _project_op(tg2, a2, R.float().contiguous(), disc.float().reshape(-1).contiguous(),
                       z.float().contiguous())  # fmt: skip
