"""C51's next-state target with the two advantage output layers folded in: a candidate kernel
against the learning step's current form, at the standard workload's batch. Nothing in foxhunt
uses the candidate yet. On an H100 (2026-12-07) it took 83.4 us at 64 samples and 8 warps a
program against 130.4 us for the current form (both with their weights' preparation; the table:
docs/gpu-step.md).

    python3 bench/bench_c51_fused_adv.py          on a CUDA device with Triton

The current form: each network's advantage layer ([8192, 128] x [128, 1530], the dueling mean
out of its weights, padded to 1536) writes [8192, 30, 51] bf16 (25 MB a network), and
foxhunt.train.agents.c51_triton's kernel reads both to choose the action (double Q) and project
the target's distribution of it. Of the target network's 30 actions it reads one. In a learning
step the two products took ~13.6 us each and the kernel ~48 us (gpu-step.md).

The candidate: kernel A reads each network's advantage hidden [8192, 128] and value logits
[8192, 51] and the centred advantage weights (bf16, [30, 51, 128]), and for BM samples a
program forms each action's logits with tl.dot in registers: the online network's expected
value under the support (the choice, the first of equal maxima as torch's argmax) and the
target network's logits, kept for the action chosen so far. It writes the chosen action's
probabilities [8192, 64]; kernel B projects them (one sample a program, as c51_triton's
projection). Neither network's [8192, 30, 51] outputs are written. The target network's logits
are formed for all 30 actions (tensor-core work, ~4 GFLOP a step for both networks) rather than
gathered per sample.

Prints the microseconds a call (foxhunt.bench.graphs.per_call_us: inside a CUDA graph, the
median of 10 replays) of the current form and of the candidate at each block of samples and
warps a program, with the largest difference of the candidate's target from the current form's
and the share of samples off by more than 1e-2 (a choice made otherwise on a near tie: the
candidate sums the logits in float32, where the current form rounds the products' outputs to
bf16 first).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from foxhunt.bench.graphs import per_call_us
from foxhunt.train.agents import c51_triton as ct

B, H, A, N = 8192, 128, 30, 51

if ct.triton is not None:
    import triton
    import triton.language as tl

    @triton.jit
    def choose_kernel(
        ho_ptr, s_ho, vo_ptr, s_vo, ht_ptr, s_ht, vt_ptr, s_vt,
        wo_ptr, bo_ptr, wt_ptr, bt_ptr, z_ptr, p_ptr, B,
        NA: tl.constexpr, N: tl.constexpr, H: tl.constexpr, BM: tl.constexpr,
        BN: tl.constexpr,
    ):  # fmt: skip
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        rm = rows < B
        k = tl.arange(0, H)
        j = tl.arange(0, BN)
        jm = j < N
        m2 = rm[:, None] & jm[None, :]
        ho = tl.load(ho_ptr + rows[:, None] * s_ho + k[None, :], mask=rm[:, None], other=0.0)
        ht = tl.load(ht_ptr + rows[:, None] * s_ht + k[None, :], mask=rm[:, None], other=0.0)
        vo = tl.load(vo_ptr + rows[:, None] * s_vo + j[None, :], mask=m2, other=0.0)
        vt = tl.load(vt_ptr + rows[:, None] * s_vt + j[None, :], mask=m2, other=0.0)
        vo, vt = vo.to(tl.float32), vt.to(tl.float32)
        z = tl.load(z_ptr + j, mask=jm, other=0.0)
        best = tl.full([BM], float("-inf"), tl.float32)
        chosen = tl.zeros([BM, BN], tl.float32)
        for a in range(NA):
            w_at = (a * N + j[:, None]) * H + k[None, :]
            wo = tl.load(wo_ptr + w_at, mask=jm[:, None], other=0.0)
            lo = tl.dot(ho, tl.trans(wo)) + vo
            lo += tl.load(bo_ptr + a * N + j, mask=jm, other=0.0)[None, :]
            lo = tl.where(jm[None, :], lo, float("-inf"))
            e = tl.exp(lo - tl.max(lo, 1)[:, None])
            q = tl.sum(e * z[None, :], 1) / tl.sum(e, 1)
            better = q > best  # strictly: the first of equal maxima stays
            best = tl.where(better, q, best)
            wt = tl.load(wt_ptr + w_at, mask=jm[:, None], other=0.0)
            lt = tl.dot(ht, tl.trans(wt)) + vt
            lt += tl.load(bt_ptr + a * N + j, mask=jm, other=0.0)[None, :]
            chosen = tl.where(better[:, None], lt, chosen)
        t = tl.where(jm[None, :], chosen, float("-inf"))
        e = tl.exp(t - tl.max(t, 1)[:, None])
        tl.store(p_ptr + rows[:, None] * BN + j[None, :], e / tl.sum(e, 1)[:, None],
                 mask=rm[:, None])  # fmt: skip

    @triton.jit
    def project_kernel(p_ptr, r_ptr, disc_ptr, z_ptr, out_ptr, clip_ptr, N, BN: tl.constexpr):
        b = tl.program_id(0).to(tl.int64)
        n = tl.arange(0, BN)
        nm = n < N
        z = tl.load(z_ptr + n, mask=nm, other=0.0)
        p = tl.load(p_ptr + b * BN + n, mask=nm, other=0.0)
        r = tl.load(r_ptr + b)
        d = tl.load(disc_ptr + b)
        v_min = tl.load(z_ptr)
        v_max = tl.load(z_ptr + N - 1)
        tz = r + d * z
        clip = tl.sum(tl.where(((tz < v_min) | (tz > v_max)) & nm, p, 0.0), 0)
        pos = (tl.minimum(tl.maximum(tz, v_min), v_max) - v_min) / ((v_max - v_min) / (N - 1))
        w = tl.maximum(1.0 - tl.abs(pos[:, None] - n.to(tl.float32)[None, :]), 0.0)
        tl.store(out_ptr + b * N + n, tl.sum(p[:, None] * w, 0), mask=nm)
        tl.store(clip_ptr + b, clip)


def centred(w: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The advantage layer's weights and bias less their mean over the actions (QNet._out)."""
    wa, ba = w.view(A, N, -1), b.view(A, N)
    return wa - wa.mean(0, keepdim=True), ba - ba.mean(0, keepdim=True)


def main() -> None:
    if not ct.available():
        sys.exit("bench_c51_fused_adv needs a CUDA device and Triton")
    ct.register()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    nets = ("online", "target")
    # The head's output [B, 256] (value hidden | advantage hidden) and the value logits padded
    # to 56, as QNet's forward leaves them; the advantage layer's weights and bias.
    head = {k: torch.randn(B, 2 * H, device=dev, dtype=torch.bfloat16) for k in nets}
    value = {k: torch.randn(B, 56, device=dev, dtype=torch.bfloat16) for k in nets}
    W = {k: torch.randn(A * N, H, device=dev) * 0.1 for k in nets}
    bias = {k: torch.randn(A * N, device=dev) * 0.1 for k in nets}
    R = torch.randn(B, device=dev) * 0.5
    disc = torch.full((B, 1), 0.99**3, device=dev)
    z = torch.linspace(-10, 10, N, device=dev)

    def current():
        parts = []
        for k in nets:
            wc, bc = centred(W[k], bias[k])
            wc = F.pad(wc.reshape(A * N, H), (0, 0, 0, 6)).to(torch.bfloat16)
            y = F.linear(head[k][:, H:], wc, F.pad(bc.reshape(-1), (0, 6)).to(torch.bfloat16))
            parts.append((value[k][:, None, :N], y[:, : A * N].view(B, A, N)))
        return ct.next_target(parts[0], parts[1], R, disc, z)

    def candidate(bm: int, warps: int):
        w = {k: [x.contiguous() for x in centred(W[k], bias[k])] for k in nets}
        w = {k: (wc.to(torch.bfloat16), bc) for k, (wc, bc) in w.items()}
        p = torch.empty(B, 64, device=dev)
        choose_kernel[(triton.cdiv(B, bm),)](
            head["online"][:, H:], 2 * H, value["online"], 56,
            head["target"][:, H:], 2 * H, value["target"], 56,
            *w["online"], *w["target"], z, p, B, NA=A, N=N, H=H, BM=bm, BN=64, num_warps=warps,
        )  # fmt: skip
        out = torch.empty(B, N, device=dev)
        clip = torch.empty(B, device=dev)
        project_kernel[(B,)](p, R, disc, z, out, clip, N, BN=64, num_warps=1)
        return out[:, None], clip[:, None]

    ref, _ = current()
    print(f"current form (two products, c51_triton's kernel): {per_call_us(current):6.1f} us")
    for bm in (32, 64, 128):
        for warps in (4, 8):
            try:
                out, _ = candidate(bm, warps)
                t = per_call_us(lambda bm=bm, warps=warps: candidate(bm, warps))
            except Exception as e:  # a block too large for the registers, say
                print(f"candidate, {bm} samples and {warps} warps a program: failed ({e!r:.120})")
                continue
            d = (out - ref).abs()[:, 0]
            print(f"candidate, {bm} samples and {warps} warps a program: {t:6.1f} us (largest "
                  f"difference {d.max().item():.1e}; {(d.amax(1) > 1e-2).float().mean():.2%} of "
                  f"the samples off by more than 1e-2)", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
