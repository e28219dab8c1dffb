"""C51's next-state target in one Triton kernel (CUDA only).

`next_target` computes what `dqn.c51_next_target` does in torch, for each sample in one
program: the double-Q choice of the next action (the online logits' expected value under the
support, argmax over the actions), the target network's distribution of that action (gather
and softmax), and its projection onto the support shifted to R + disc * z (Bellemare et al.'s
Algorithm 1, in the dense form of `dqn.project_c51`). In torch the projection writes a
[B, 51, 51] weight matrix to memory and multiplies it by a batched matrix-vector kernel (~100 us
a learning step on an H200 at batch 8,192), and the choice reads the online logits whole
([B, 30, 51], formed from the dueling streams first: a 54 us kernel, inductor's, on the same
machine, 2026-12-04). Here each sample's weights are computed in registers where they are used,
and only the [B, 51] target is written.

The networks' outputs may come as their dueling streams, a pair (value [B, 1, atoms],
advantage [B, A, atoms] with the dueling mean already out: `QNet(..., parts=True)`), which the
kernel adds as torch would (in their dtype: a bf16 sum is rounded to bf16), so that the logits
[B, A, atoms] are never written; or as the logits themselves.

Same arithmetic as the torch form in float32, summed in another order: the targets agree to
float rounding, and the choice too except where two actions' expected values are that close
(tests/test_train_gpu.py). The kernel has no atomics, so a run is as deterministic as the torch
form, and eager and captured runs stay bit-identical (both launch this kernel; tested).
Registered as a `torch.library.triton_op` (at its first use, `register`), so torch.compile
traces through it, AOTInductor compiles it into a package and CUDA graphs capture it. Under
vmap (the stacked agents of dqn_stacked) the K agents' samples run as one batch of K * B
programs. The kernel alone: `bench/bench_c51_kernel.py`.

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


NUM_WARPS = 1
"""Warps a program (one sample). See bench/bench_c51_kernel.py."""
HIDDEN_BLOCK, HIDDEN_WARPS = 64, 8
"""Samples and warps a program of the choice from the advantage hidden layers (`next_target`
given them): the fastest of 32-128 samples and 4-8 warps (bench/bench_c51_fused_adv.py, H100,
2026-12-07)."""

if triton is not None:

    @triton.jit
    def _project(p, z, n, nm, b, r_ptr, disc_ptr, z_ptr, out_ptr, clip_ptr, N):
        """Sample b's target distribution p [BLOCK_N] (0 on the padded atoms) projected onto z
        from the support shifted to R + disc * z, stored with the mass clipped at its ends."""
        r = tl.load(r_ptr + b)
        d = tl.load(disc_ptr + b)
        v_min = tl.load(z_ptr)
        v_max = tl.load(z_ptr + N - 1)
        dz = (v_max - v_min) / (N - 1)
        tz = r + d * z  # [BN(j)]
        outside = ((tz < v_min) | (tz > v_max)) & nm
        clip = tl.sum(tl.where(outside, p, 0.0), 0)
        pos = (tl.minimum(tl.maximum(tz, v_min), v_max) - v_min) / dz
        i = n.to(tl.float32)
        w = tl.maximum(1.0 - tl.abs(pos[:, None] - i[None, :]), 0.0)  # [j, i]
        proj = tl.sum(p[:, None] * w, 0)  # [BN(i)]
        tl.store(out_ptr + b * N + n, proj, mask=nm)
        tl.store(clip_ptr + b, clip)

    @triton.jit
    def _target_kernel(
        von_ptr, aon_ptr, vtg_ptr, atg_ptr, r_ptr, disc_ptr, z_ptr, out_ptr, clip_ptr, A, N,
        s_von_b, s_von_n, s_aon_b, s_aon_a, s_aon_n,
        s_vtg_b, s_vtg_n, s_atg_b, s_atg_a, s_atg_n,
        BLOCK_A: tl.constexpr, BLOCK_N: tl.constexpr, ROUND: tl.constexpr,
    ):  # fmt: skip
        b = tl.program_id(0).to(tl.int64)
        a = tl.arange(0, BLOCK_A)  # the actions
        n = tl.arange(0, BLOCK_N)  # the atoms, as j (source) and as i (target)
        am, nm = a < A, n < N
        z = tl.load(z_ptr + n, mask=nm, other=0.0)
        # The double-Q choice: the online logits' expected value under z, argmax over actions.
        v = tl.load(von_ptr + b * s_von_b + n * s_von_n, mask=nm, other=0.0).to(tl.float32)
        q = v[None, :] + tl.load(
            aon_ptr + b * s_aon_b + a[:, None] * s_aon_a + n[None, :] * s_aon_n,
            mask=am[:, None] & nm[None, :], other=0.0,
        ).to(tl.float32)  # fmt: skip
        if ROUND:  # the streams' sum in bf16, as torch adds them
            q = q.to(tl.bfloat16).to(tl.float32)
        q = tl.where(nm[None, :], q, float("-inf"))
        e = tl.exp(q - tl.max(q, 1)[:, None])
        ev = tl.sum(e / tl.sum(e, 1)[:, None] * z[None, :], 1)  # [BA]
        a2 = tl.argmax(tl.where(am, ev, float("-inf")), 0)  # the first of equal maxima
        # Never past the actions: where the logits hold a NaN (a capture's warm-up steps on an
        # empty replay train on 0/0 importance weights; their state is restored after) the
        # argmax may land on a padded row, and its read would leave the tensor.
        a2 = tl.minimum(a2, A - 1)
        # The target net's distribution of the chosen action.
        t = tl.load(vtg_ptr + b * s_vtg_b + n * s_vtg_n, mask=nm, other=0.0).to(tl.float32)
        t += tl.load(atg_ptr + b * s_atg_b + a2 * s_atg_a + n * s_atg_n, mask=nm,
                     other=0.0).to(tl.float32)  # fmt: skip
        if ROUND:
            t = t.to(tl.bfloat16).to(tl.float32)
        t = tl.where(nm, t, float("-inf"))
        e = tl.exp(t - tl.max(t, 0))
        p = e / tl.sum(e, 0)  # [BN(j)]; 0 on the padded atoms
        _project(p, z, n, nm, b, r_ptr, disc_ptr, z_ptr, out_ptr, clip_ptr, N)

    @triton.jit
    def _choice_kernel(
        von_ptr, hon_ptr, won_ptr, bon_ptr, vtg_ptr, htg_ptr, wtg_ptr, btg_ptr, z_ptr, p_ptr,
        B, A, N, H, s_von_b, s_von_n, s_hon, s_vtg_b, s_vtg_n, s_htg,
        BM: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, ROUND: tl.constexpr,
    ):  # fmt: skip
        """`_target_kernel`'s choice and softmax from each network's advantage hidden layer
        [B, H] and its advantage layer (weights [A N, H] and bias [A N], the dueling mean out),
        BM samples a program: each action's logits are formed in registers by a tensor-core
        product, rounded as torch rounds the layer's output and the streams' sum (`ROUND`),
        and never written. Writes the chosen action's target distribution [B, BLOCK_N]."""
        rows = tl.program_id(0) * BM + tl.arange(0, BM)
        rm = rows < B
        k = tl.arange(0, BLOCK_H)
        n = tl.arange(0, BLOCK_N)
        km, nm = k < H, n < N
        hm, vm = rm[:, None] & km[None, :], rm[:, None] & nm[None, :]
        h_on = tl.load(hon_ptr + rows[:, None] * s_hon + k[None, :], mask=hm, other=0.0)
        h_tg = tl.load(htg_ptr + rows[:, None] * s_htg + k[None, :], mask=hm, other=0.0)
        v_on = tl.load(von_ptr + rows[:, None] * s_von_b + n[None, :] * s_von_n, mask=vm,
                       other=0.0).to(tl.float32)  # fmt: skip
        v_tg = tl.load(vtg_ptr + rows[:, None] * s_vtg_b + n[None, :] * s_vtg_n, mask=vm,
                       other=0.0).to(tl.float32)  # fmt: skip
        z = tl.load(z_ptr + n, mask=nm, other=0.0)
        wm = nm[:, None] & km[None, :]
        best = tl.full([BM], float("-inf"), tl.float32)
        chosen = tl.zeros([BM, BLOCK_N], tl.float32)
        for a in range(A):
            w_at = (a * N + n[:, None]) * H + k[None, :]  # [BLOCK_N, BLOCK_H]
            q = tl.dot(h_on, tl.trans(tl.load(won_ptr + w_at, mask=wm, other=0.0)))
            q += tl.load(bon_ptr + a * N + n, mask=nm, other=0.0).to(tl.float32)[None, :]
            if ROUND:  # the advantage layer's output in bf16, as the product writes it
                q = q.to(tl.bfloat16).to(tl.float32)
            q += v_on
            if ROUND:  # the streams' sum in bf16, as torch adds them
                q = q.to(tl.bfloat16).to(tl.float32)
            q = tl.where(nm[None, :], q, float("-inf"))
            e = tl.exp(q - tl.max(q, 1)[:, None])
            ev = tl.sum(e / tl.sum(e, 1)[:, None] * z[None, :], 1)  # [BM]
            better = ev > best  # strictly: the first of equal maxima stays, as an argmax
            best = tl.where(better, ev, best)
            t = tl.dot(h_tg, tl.trans(tl.load(wtg_ptr + w_at, mask=wm, other=0.0)))
            t += tl.load(btg_ptr + a * N + n, mask=nm, other=0.0).to(tl.float32)[None, :]
            if ROUND:
                t = t.to(tl.bfloat16).to(tl.float32)
            t += v_tg
            if ROUND:
                t = t.to(tl.bfloat16).to(tl.float32)
            chosen = tl.where(better[:, None], t, chosen)
        t = tl.where(nm[None, :], chosen, float("-inf"))
        e = tl.exp(t - tl.max(t, 1)[:, None])
        tl.store(p_ptr + rows[:, None] * BLOCK_N + n[None, :], e / tl.sum(e, 1)[:, None],
                 mask=rm[:, None])  # fmt: skip

    @triton.jit
    def _projection_kernel(
        p_ptr, r_ptr, disc_ptr, z_ptr, out_ptr, clip_ptr, N, BLOCK_N: tl.constexpr
    ):  # fmt: skip
        """`_choice_kernel`'s distributions projected, one sample a program."""
        b = tl.program_id(0).to(tl.int64)
        n = tl.arange(0, BLOCK_N)
        nm = n < N
        z = tl.load(z_ptr + n, mask=nm, other=0.0)
        p = tl.load(p_ptr + b * BLOCK_N + n, mask=nm, other=0.0)
        _project(p, z, n, nm, b, r_ptr, disc_ptr, z_ptr, out_ptr, clip_ptr, N)


_target_op = None  # the op, once registered (`register`)
_hidden_op = None  # ... and the op given the advantage hidden layers


def register():
    """The kernel as the op `foxhunt::c51_target`, registered at the first call (later calls
    return it). Not at import: registering a `triton_op` imports torch's compiler
    (torch._dynamo and torch._inductor, seconds on the H200's hosts), which a task whose steps
    were compiled ahead of time never needs (foxhunt.train.aot: the package holds the kernel).
    An agent that torch.compile traces registers it when built, so that the trace never meets
    the registration."""
    global _target_op, _hidden_op
    if _target_op is not None:
        return _target_op

    @torch.library.triton_op("foxhunt::c51_target", mutates_args=())
    def op(
        v_on: torch.Tensor, a_on: torch.Tensor, v_tg: torch.Tensor, a_tg: torch.Tensor,
        R: torch.Tensor, disc: torch.Tensor, z: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        B, A, N = a_on.shape
        out = torch.empty(B, 1, N, device=a_on.device, dtype=torch.float32)
        clip = torch.empty(B, 1, device=a_on.device, dtype=torch.float32)
        rounds = torch.promote_types(v_on.dtype, a_on.dtype) == torch.bfloat16
        torch.library.wrap_triton(_target_kernel)[(B,)](
            v_on, a_on, v_tg, a_tg, R, disc, z, out, clip, A, N,
            v_on.stride(0), v_on.stride(2), *a_on.stride(),
            v_tg.stride(0), v_tg.stride(2), *a_tg.stride(),
            BLOCK_A=triton.next_power_of_2(A), BLOCK_N=triton.next_power_of_2(N),
            ROUND=rounds, num_warps=NUM_WARPS,
        )  # fmt: skip
        return out, clip

    @op.register_vmap
    def _vmap(info, in_dims, v_on, a_on, v_tg, a_tg, R, disc, z):
        """The op over K stacked agents (dqn_stacked's vmap): every sample is one program
        whichever agent it belongs to, so the K batches run as one batch of K * B samples. The
        agents share the support z (one fold, one configuration)."""
        if in_dims[-1] is not None:
            raise NotImplementedError("c51_triton.next_target: one support for all agents")
        K = info.batch_size

        def rows(x: torch.Tensor, dim: int | None) -> torch.Tensor:  # [K, B, ...] -> [K B, ...]
            x = x.movedim(dim, 0) if dim is not None else x.expand(K, *x.shape)
            return x.reshape(-1, *x.shape[2:])

        tensors = (v_on, a_on, v_tg, a_tg, R, disc)
        args = [rows(x, d) for x, d in zip(tensors, in_dims[:-1], strict=True)]
        out, clip = op(*args, z)
        return (out.view(K, -1, *out.shape[1:]), clip.view(K, -1, *clip.shape[1:])), (0, 0)

    @torch.library.triton_op("foxhunt::c51_target_hidden", mutates_args=())
    def hidden_op(
        v_on: torch.Tensor, h_on: torch.Tensor, w_on: torch.Tensor, b_on: torch.Tensor,
        v_tg: torch.Tensor, h_tg: torch.Tensor, w_tg: torch.Tensor, b_tg: torch.Tensor,
        R: torch.Tensor, disc: torch.Tensor, z: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
        (B, H), N = h_on.shape, v_on.shape[2]
        block_n = triton.next_power_of_2(N)
        p = torch.empty(B, block_n, device=h_on.device, dtype=torch.float32)
        out = torch.empty(B, 1, N, device=h_on.device, dtype=torch.float32)
        clip = torch.empty(B, 1, device=h_on.device, dtype=torch.float32)
        torch.library.wrap_triton(_choice_kernel)[(triton.cdiv(B, HIDDEN_BLOCK),)](
            v_on, h_on, w_on, b_on, v_tg, h_tg, w_tg, b_tg, z, p, B, w_on.shape[0] // N, N, H,
            v_on.stride(0), v_on.stride(2), h_on.stride(0),
            v_tg.stride(0), v_tg.stride(2), h_tg.stride(0),
            BM=HIDDEN_BLOCK, BLOCK_H=max(16, triton.next_power_of_2(H)), BLOCK_N=block_n,
            ROUND=h_on.dtype == torch.bfloat16, num_warps=HIDDEN_WARPS,
        )  # fmt: skip
        torch.library.wrap_triton(_projection_kernel)[(B,)](
            p, R, disc, z, out, clip, N, BLOCK_N=block_n, num_warps=NUM_WARPS
        )  # fmt: skip
        return out, clip

    _target_op, _hidden_op = op, hidden_op
    return op


Logits = torch.Tensor | tuple[torch.Tensor, torch.Tensor]
Hidden = tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]


def _streams(x: Logits) -> tuple[torch.Tensor, torch.Tensor]:
    """(value [B, 1, N], advantage [B, A, N]) of a network's output: the pair itself, or the
    logits beside a value of zeros (no memory: stride 0), whose sum is the logits exactly."""
    if isinstance(x, tuple):
        return x
    return x.new_zeros(1, 1, x.shape[2]).expand(x.shape[0], 1, -1), x


def next_target(
    on2: Logits | Hidden,
    tg2: Logits | Hidden,
    R: torch.Tensor,
    disc: torch.Tensor,
    z: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """`dqn.c51_next_target` in one kernel: on2, tg2 the online and target networks' logits
    [B, A, atoms] or their dueling streams (see the module docstring; any float dtype, any
    strides), R [B], disc [B, 1], z [atoms] float32. Returns the target distribution
    [B, 1, atoms] and the target mass clipped at the support's ends [B, 1], float32.

    Or on2, tg2 each network's value logits, advantage hidden layer and advantage layer
    (`QNet(..., parts="hidden")`, `_from_hidden`): two kernels then, the choice with each
    action's logits formed in registers (tensor-core products, a block of samples a program)
    and never written, and the projection."""
    # Checked where the call runs eagerly: a compiled step traces this function, and Dynamo
    # warns at each trace that it ignores the cache around `available`.
    if not torch.compiler.is_compiling() and not available():
        raise RuntimeError("c51_triton.next_target needs Triton and a CUDA device")
    if isinstance(on2, tuple) and len(on2) == 4:
        return _from_hidden(on2, tg2, R, disc, z)
    (v_on, a_on), (v_tg, a_tg) = _streams(on2), _streams(tg2)
    if {v_on.dtype, a_on.dtype} != {v_tg.dtype, a_tg.dtype}:
        raise ValueError("c51_triton.next_target: the online and target logits' dtypes differ")
    op = register() if _target_op is None else _target_op
    return op(v_on, a_on, v_tg, a_tg, R.float().contiguous(),
                      disc.float().reshape(-1).contiguous(), z.float().contiguous())  # fmt: skip


def _from_hidden(on2: Hidden, tg2: Hidden, R, disc, z) -> tuple[torch.Tensor, torch.Tensor]:
    """`next_target` given each network's value logits [B, 1, atoms], advantage hidden layer
    [B, H] and advantage layer (weights [A atoms, H] and bias [A atoms], the dueling mean out):
    `QNet(..., parts="hidden")`. The layer's weights and bias are cast to the hidden layer's
    dtype, as autocast casts them for the product."""
    if len(tg2) != 4:
        raise ValueError("c51_triton.next_target: one network's hidden parts and the other's "
                         "streams or logits; give both hidden parts or neither")  # fmt: skip

    def parts(v, h, w, b):
        h = h if h.stride(1) == 1 else h.contiguous()
        return v, h, w.to(h.dtype).contiguous(), b.to(h.dtype).contiguous()

    on2, tg2 = parts(*on2), parts(*tg2)
    if on2[1].dtype != tg2[1].dtype or on2[1].shape != tg2[1].shape:
        raise ValueError("c51_triton.next_target: the two networks' hidden layers differ in "
                         f"dtype or shape ({on2[1].dtype} {tuple(on2[1].shape)} against "
                         f"{tg2[1].dtype} {tuple(tg2[1].shape)})")  # fmt: skip
    if _hidden_op is None:
        register()
    return _hidden_op(*on2, *tg2, R.float().contiguous(), disc.float().reshape(-1).contiguous(),
              z.float().contiguous())  # fmt: skip
