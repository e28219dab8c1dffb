"""Mamba-2 (Dao and Gu 2024, "Transformers are SSMs: Generalized Models and Efficient Algorithms
Through Structured State Space Duality"), written from the paper.

The layer's state-space model, per head h with a scalar decay a_t = exp(dt_t A_h) < 1:

    H_t = a_t H_{t-1} + (dt_t x_t) B_t^T        H_t [headdim x d_state]
    y_t = H_t C_t + D_h x_t

`ssd_scan` runs that recurrence step by step (the reference). `ssd_chunked` computes the same
outputs with the paper's state-space-duality algorithm: the sequence is cut into chunks of Q
steps; inside a chunk the outputs are a masked attention-like product C^T B weighted by the
decays between the steps (matrix products on the tensor cores); each chunk's final state is
carried to the next by a short recurrence over the chunks (one step per chunk, not per time
step). The work is O(L Q) matrix multiply-adds instead of L sequential steps. A sequence whose
length is not a multiple of Q is padded at its end (the recurrence is causal: the pad changes
no earlier output).

A block, as in the paper's Mamba-2 architecture: one input projection to (z, x, B, C, dt), a
causal depthwise convolution of width `conv` over (x, B, C) and SiLU, the SSD with dt =
softplus(. + dt_bias) and A = -exp(A_log), the skip D, a gated RMSNorm of y * SiLU(z), and the
output projection; blocks are pre-normed residual layers. The class logits are a linear readout
of the last bar's representation, so the last block computes that bar's output alone: its SSD
output is C . H with H the state after every step (`ssd_last`: the chunked algorithm's carry
across the chunks, without their quadratic part), its norm and output projection one row a
window (the demo's epoch about a quarter shorter on a CPU, with its two blocks).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from foxhunt.train.agents.common import resolve
from foxhunt.train.agents.supervised import (
    SIZES_BY_DEVICE,
    SupervisedAgent,
    SupervisedConfig,
    acting_net,
)
from foxhunt.train.data import N_MKT

__all__ = [
    "Mamba2",
    "Mamba2Config",
    "SupervisedAgent",
    "acting_net",
    "ssd_chunked",
    "ssd_last",
    "ssd_scan",
]


@dataclass(frozen=True)
class Mamba2Config(SupervisedConfig):
    """Mamba-2's sizes, beside the supervised path's settings (window, horizon, optimiser)."""

    d_model: int | None = None
    """Width of the residual stream (default: 128 on a GPU, 32 on a CPU)."""
    layers: int = 2
    """Mamba-2 blocks."""
    d_state: int = 64
    """State size N of each head (the paper's 64-128)."""
    headdim: int | None = None
    """Channels per head P (default: 64 on a GPU, 16 on a CPU); heads = expand x d_model / P."""
    expand: int = 2
    """Inner width over d_model."""
    conv: int = 4
    """Width of the causal depthwise convolution."""
    chunk: int = 64
    """Chunk length Q of the SSD algorithm."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for k in ("layers", "d_state", "expand", "conv", "chunk", "d_model", "headdim"):
            v = getattr(self, k)
            if v is not None and v < 1:
                raise ValueError(f"{k} = {v}: must be at least 1")
        if self.d_model is not None and self.headdim is not None:
            if (self.expand * self.d_model) % self.headdim:
                raise ValueError(
                    f"headdim = {self.headdim}: must divide expand x d_model = "
                    f"{self.expand * self.d_model}"
                )

    def resolved(self, device):
        return resolve(self, device, SIZES_BY_DEVICE | {"d_model": (128, 32), "headdim": (64, 16)})

    def build(self, features: int = N_MKT) -> Mamba2:
        if self.d_model is None or self.headdim is None:
            raise ValueError("Mamba2Config.build needs a resolved config (d_model is None)")
        return Mamba2(features, self.d_model, self.layers, self.d_state, self.headdim,
                      self.expand, self.conv, self.chunk)  # fmt: skip


# ---------------------------------------------------------------------------------- the SSD
def ssd_scan(x, dt, A, B, C):
    """The recurrence step by step. x [b, L, h, p], dt [b, L, h] (> 0), A [h] (< 0),
    B and C [b, L, h, n] -> y [b, L, h, p] (without the D skip)."""
    b, L, h, p = x.shape
    state = x.new_zeros(b, h, p, B.shape[-1])
    ys = []
    for t in range(L):
        a = torch.exp(dt[:, t] * A)  # [b, h]
        inflow = (dt[:, t, :, None] * x[:, t])[..., None] * B[:, t, :, None, :]  # [b, h, p, n]
        state = a[..., None, None] * state + inflow
        ys.append(torch.einsum("bhpn,bhn->bhp", state, C[:, t]))
    return torch.stack(ys, 1)


def segment_sums(a: torch.Tensor) -> torch.Tensor:
    """[..., T] -> [..., T, T]: entry (i, j) = a[j+1] + ... + a[i] for j <= i (0 on the
    diagonal), -inf above it; exp of it is the decay from step j to step i. Summed from a
    masked copy rather than as a difference of cumulative sums, which loses precision."""
    T = a.shape[-1]
    x = a[..., :, None].expand(*a.shape, T)  # x[..., i, j] = a[i]
    strict = torch.ones(T, T, dtype=torch.bool, device=a.device).tril(-1)
    x = x.masked_fill(~strict, 0.0).cumsum(-2)
    return x.masked_fill(~strict.logical_or(torch.eye(T, dtype=torch.bool, device=a.device)),
                         -math.inf)  # fmt: skip


def _chunks(x, dt, A, chunk: int, *per_step):
    """The inputs padded to whole chunks and cut into them: dt x [b, c, Q, h, p], the
    log-decays [b, h, c, Q], and each of `per_step` (B, C: [b, L, h, n]) as [b, c, Q, h, n]."""
    b, L, h, p = x.shape
    pad = (-L) % chunk
    if pad:  # zeros at the end: dt = 0 there, so nothing flows and no earlier output moves
        x, dt, *per_step = (F.pad(v, (0, 0) * (v.dim() - 2) + (0, pad)) for v in (x, dt, *per_step))
    c = x.shape[1] // chunk
    xs = (x * dt[..., None]).view(b, c, chunk, h, p)
    a = (dt * A).view(b, c, chunk, h).permute(0, 3, 1, 2)
    return xs, a, *(v.view(b, c, chunk, h, -1) for v in per_step)


def _carried_states(xs, Bc, a_cum):
    """The state entering each chunk, then the state after the last: [b, c + 1, h, p, n]."""
    # each chunk's final state from its own inputs
    to_end = torch.exp(a_cum[..., -1:] - a_cum)  # [b, h, c, Q]
    states = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bc, to_end, xs)
    # the states carried across chunks: one step per chunk
    states = torch.cat([torch.zeros_like(states[:, :1]), states], 1)  # [b, c + 1, h, p, n]
    across = torch.exp(segment_sums(F.pad(a_cum[..., -1], (1, 0))))  # [b, h, c + 1, c + 1]
    return torch.einsum("bhzc,bchpn->bzhpn", across, states)


def ssd_chunked(x, dt, A, B, C, chunk: int):
    """The same outputs as `ssd_scan` by the chunked SSD algorithm (see the module doc)."""
    b, L, h, p = x.shape
    xs, a, Bc, Cc = _chunks(x, dt, A, chunk, B, C)
    a_cum = a.cumsum(-1)  # [b, h, c, Q]
    # 1. inside each chunk: y_i = sum_{j <= i} (C_i . B_j) exp(a_{j+1..i}) x_j
    decay = torch.exp(segment_sums(a))  # [b, h, c, Q, Q]
    scores = torch.einsum("bclhn,bcshn->bhcls", Cc, Bc) * decay
    y = torch.einsum("bhcls,bcshp->bclhp", scores, xs)
    # 2. and 3. each chunk's own final state, carried across the chunks
    states = _carried_states(xs, Bc, a_cum)[:, :-1]
    # 4. what the carried-in state adds to each output of the chunk
    y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", Cc, states, torch.exp(a_cum))
    return y.reshape(b, -1, h, p)[:, :L]


def ssd_last(x, dt, A, B, C, chunk: int):
    """`ssd_chunked`'s output at the last step alone, [b, h, p]: C_L . H_L, with H_L the state
    after every step, carried across the chunks as there (steps 2 and 3), without the
    chunks' quadratic part or any other step's output. What the network's last block needs:
    its readout reads the last bar alone."""
    xs, a, Bc = _chunks(x, dt, A, chunk, B)  # C's last row alone is read
    final = _carried_states(xs, Bc, a.cumsum(-1))[:, -1]  # [b, h, p, n]
    return torch.einsum("bhpn,bhn->bhp", final, C[:, -1])


# ---------------------------------------------------------------------------------- network
class GatedRMSNorm(nn.Module):
    """RMSNorm(y * SiLU(z)) with a learned scale (the paper's gated normalisation)."""

    def __init__(self, width: int, eps: float = 1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(width))
        self.eps = eps

    def forward(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(y * F.silu(z), (y.shape[-1],), self.weight, self.eps)


class Mamba2Block(nn.Module):
    def __init__(self, d_model: int, d_state: int, headdim: int, expand: int, conv: int,
                 chunk: int):  # fmt: skip
        super().__init__()
        inner = expand * d_model
        self.inner, self.heads, self.headdim, self.d_state, self.chunk = (
            inner, inner // headdim, headdim, d_state, chunk
        )  # fmt: skip
        self.xbc = inner + 2 * d_state  # x, and B and C shared by the heads (one group)
        self.in_proj = nn.Linear(d_model, inner + self.xbc + self.heads, bias=False)
        self.conv = nn.Conv1d(self.xbc, self.xbc, conv, groups=self.xbc, padding=conv - 1)
        # dt initialised log-uniformly in [1e-3, 1e-1] through softplus^-1; A in [1, 16].
        dt = torch.exp(torch.rand(self.heads) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        self.dt_bias = nn.Parameter(dt + torch.log(-torch.expm1(-dt)))
        self.A_log = nn.Parameter(torch.log(torch.empty(self.heads).uniform_(1, 16)))
        self.D = nn.Parameter(torch.ones(self.heads))
        self.norm = GatedRMSNorm(inner)
        self.out_proj = nn.Linear(inner, d_model, bias=False)

    def forward(self, u: torch.Tensor, scan: bool = False, last: bool = False) -> torch.Tensor:
        """u [b, L, d_model] -> [b, L, d_model], or with `last` the last bar's output alone
        [b, d_model] (from the SSD's final state: `ssd_last`); `scan` runs the step-by-step
        reference."""
        b, L, _ = u.shape
        z, xbc, dt = self.in_proj(u).split([self.inner, self.xbc, self.heads], -1)
        # The weights cast to the input's dtype by hand: autocast casts conv1d's bias only
        # outside vmap (the ensemble vmaps over seeds), so this is what autocast does, always.
        w, bias = self.conv.weight.to(xbc.dtype), self.conv.bias.to(xbc.dtype)
        xbc = F.conv1d(
            xbc.transpose(1, 2), w, bias, padding=self.conv.padding, groups=self.conv.groups
        )
        xbc = F.silu(xbc[..., :L].transpose(1, 2))  # causal: the first L outputs
        x, B, C = xbc.split([self.inner, self.d_state, self.d_state], -1)
        x = x.reshape(b, L, self.heads, self.headdim)
        # The SSD in float32 (or wider): decays are exponentials of sums, which bf16 cannot
        # carry.
        f = torch.promote_types(u.dtype, torch.float32)
        dt = F.softplus(dt.to(f) + self.dt_bias)
        A = -torch.exp(self.A_log.to(f))
        B = B.to(f)[:, :, None, :].expand(b, L, self.heads, self.d_state)
        C = C.to(f)[:, :, None, :].expand(b, L, self.heads, self.d_state)
        x = x.to(f)
        with torch.autocast(u.device.type, enabled=False):
            if scan:  # the reference computes every step, whose last is taken where asked
                y = ssd_scan(x, dt, A, B, C)
                y = y[:, -1] if last else y
            elif last:
                y = ssd_last(x, dt, A, B, C, self.chunk)
            else:
                y = ssd_chunked(x, dt, A, B, C, self.chunk)
            if last:
                x, z = x[:, -1], z[:, -1]
            y = y + self.D[:, None] * x
            y = self.norm(y.reshape(*y.shape[:-2], self.inner), z.to(f))
        return self.out_proj(y)


class Mamba2(nn.Module):
    def __init__(self, features: int, d_model: int, layers: int, d_state: int, headdim: int,
                 expand: int, conv: int, chunk: int):  # fmt: skip
        super().__init__()
        self.embed = nn.Linear(features, d_model)
        self.norms = nn.ModuleList(nn.RMSNorm(d_model) for _ in range(layers))
        self.blocks = nn.ModuleList(
            Mamba2Block(d_model, d_state, headdim, expand, conv, chunk) for _ in range(layers)
        )
        self.final = nn.RMSNorm(d_model)
        self.head = nn.Linear(d_model, 3)

    def forward(self, x: torch.Tensor, scan: bool = False) -> torch.Tensor:
        """Class logits [B, 3] of windows x [B, L, F], read from the last bar's representation:
        the last block computes that bar's output alone."""
        h = self.embed(x)
        *before, (norm, block) = zip(self.norms, self.blocks, strict=True)
        for norm_i, block_i in before:
            h = h + block_i(norm_i(h), scan=scan)
        h = h[:, -1] + block(norm(h), scan=scan, last=True)
        return self.head(self.final(h)).float()
