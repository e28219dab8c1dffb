"""TLOB (Berti and Kasneci 2025, "TLOB: a novel transformer model with dual attention for stock
price trend prediction with limit order book data"), written from the paper and its reference
code (github.com/LeonardoBerti00/TLOB, models/tlob.py; read, not copied).

A window [B, L, F] of L bars and F columns goes through:

- BiN (bilinear normalisation, Tran et al. 2021): the window normalised along time (per
  column) and along the columns (per bar), each with learned scales and shifts, mixed by two
  learned non-negative weights;
- a linear embedding of each bar's F columns into `hidden` and a sinusoidal position encoding;
- `layers` pairs of transformer layers: the first attends over time (L tokens of width
  `hidden`), the second, on the transposed tensor, over the features (`hidden` tokens of width
  L). The last pair narrows both widths by 4;
- the flattened [hidden/4 x L/4] map through linear layers that shrink it by 4 until it is at
  most 128 wide, then the 3 class logits (down, flat, up).

A transformer layer as the reference code has it: q, k and v projections of width
`width x heads`, PyTorch's multi-head attention on them (its own in- and out-projections
included), a projection back to `width`, a residual and LayerNorm, then an MLP (width -> 4 width
-> out, GELU, a residual where the widths agree, LayerNorm, GELU) and a residual around it where
the widths agree. With the reference configuration (hidden 40, 4 layers, 1 head, L 128) and our
50 columns the network has 1,136,391 parameters: the reference code's 1,136,394 less its
order-type embedding (3), which only LOBSTER's message data uses (tested).
"""

from __future__ import annotations

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

__all__ = ["TLOB", "SupervisedAgent", "TLOBConfig", "acting_net"]


@dataclass(frozen=True)
class TLOBConfig(SupervisedConfig):
    """TLOB's sizes, beside the supervised path's settings (window, horizon, optimiser)."""

    hidden: int | None = None
    """Width of a bar's embedding (default: 64 on a GPU, a multiple of 64 for the tensor cores;
    the reference configuration's 40 on a CPU)."""
    layers: int = 4
    """Pairs of transformer layers (over time, then over features)."""
    heads: int = 1
    """Attention heads (the reference's 1)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for k in ("layers", "heads"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} = {getattr(self, k)}: must be at least 1")
        for k in ("hidden", "window"):
            if getattr(self, k) is None:
                continue
            if getattr(self, k) % 4 or getattr(self, k) < 8:
                raise ValueError(
                    f"{k} = {getattr(self, k)}: must be a multiple of 4 and at least 8 (the last "
                    "layer pair narrows it by 4)"
                )

    def resolved(self, device):
        return resolve(self, device, SIZES_BY_DEVICE | {"hidden": (64, 40)})

    def build(self, features: int = N_MKT) -> TLOB:
        if self.hidden is None:
            raise ValueError("TLOBConfig.build needs a resolved config (hidden is None)")
        return TLOB(features, self.window, self.hidden, self.layers, self.heads)


class BiN(nn.Module):
    """Bilinear normalisation of x [B, F, L]: y1 * (feature-wise) + y2 * (time-wise) z-scores,
    each scaled and shifted per bar or per feature (the reference code's BiN). A standard
    deviation below 1e-4 is taken as 1 (the reference does so along time; along the features
    too here, where it would divide by zero on a constant bar)."""

    def __init__(self, features: int, window: int):
        super().__init__()
        self.l1 = nn.Parameter(nn.init.xavier_normal_(torch.empty(window, 1)))
        self.b1 = nn.Parameter(torch.zeros(window, 1))
        self.l2 = nn.Parameter(nn.init.xavier_normal_(torch.empty(features, 1)))
        self.b2 = nn.Parameter(torch.zeros(features, 1))
        self.y1 = nn.Parameter(torch.full((1,), 0.5))
        self.y2 = nn.Parameter(torch.full((1,), 0.5))

    @staticmethod
    def _z(x: torch.Tensor, dim: int) -> torch.Tensor:
        std, mean = torch.std_mean(x, dim=dim, keepdim=True)
        return (x - mean) / torch.where(std < 1e-4, torch.ones_like(std), std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        across_features = self._z(x, 1) * self.l1.T + self.b1.T  # per bar: [1, L] scales
        along_time = self._z(x, 2) * self.l2 + self.b2  # per feature: [F, 1] scales
        # The reference resets a weight that went negative to 0.01 (a new parameter in the
        # forward pass); the same value, without touching the parameter:
        y1 = torch.where(self.y1 < 0, torch.full_like(self.y1, 0.01), self.y1)
        y2 = torch.where(self.y2 < 0, torch.full_like(self.y2, 0.01), self.y2)
        return y1 * across_features + y2 * along_time


class MLP(nn.Module):
    def __init__(self, width: int, hidden: int, out: int):
        super().__init__()
        self.fc, self.fc2 = nn.Linear(width, hidden), nn.Linear(hidden, out)
        self.norm = nn.LayerNorm(out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.fc2(F.gelu(self.fc(x)))
        if y.shape[-1] == x.shape[-1]:
            y = y + x
        return F.gelu(self.norm(y))


class TransformerLayer(nn.Module):
    """Attention over the tokens of x [B, tokens, width], then the MLP (see the module doc)."""

    def __init__(self, width: int, heads: int, out: int):
        super().__init__()
        inner = width * heads
        self.q, self.k, self.v = (nn.Linear(width, inner) for _ in range(3))
        self.attention = nn.MultiheadAttention(inner, heads, batch_first=True)
        self.w0 = nn.Linear(inner, width)
        self.norm = nn.LayerNorm(width)
        self.mlp = MLP(width, 4 * width, out)

    def forward(self, x: torch.Tensor, need_weights: bool = False):
        a, weights = self.attention(
            self.q(x), self.k(x), self.v(x), need_weights=need_weights,
            average_attn_weights=False,
        )  # fmt: skip
        h = self.norm(self.w0(a) + x)
        y = self.mlp(h)
        if y.shape[-1] == x.shape[-1]:
            y = y + x
        return y, weights


def sinusoidal_positions(length: int, width: int) -> torch.Tensor:
    """[length, width]: sin at even, cos at odd columns, frequencies 10000^(-2i / width)."""
    pos = torch.arange(length, dtype=torch.float32)[:, None]
    freq = torch.pow(10000.0, 2 * torch.arange(width // 2, dtype=torch.float32) / width)
    out = torch.zeros(length, width)
    out[:, 0::2] = torch.sin(pos / freq)
    out[:, 1::2] = torch.cos(pos / freq)
    return out


class TLOB(nn.Module):
    def __init__(self, features: int, window: int, hidden: int, layers: int, heads: int):
        super().__init__()
        self.norm = BiN(features, window)
        self.embed = nn.Linear(features, hidden)
        self.register_buffer("positions", sinusoidal_positions(window, hidden), persistent=False)
        blocks = []
        for i in range(layers):
            last = i == layers - 1
            blocks.append(TransformerLayer(hidden, heads, hidden // 4 if last else hidden))
            blocks.append(TransformerLayer(window, heads, window // 4 if last else window))
        self.blocks = nn.ModuleList(blocks)
        width = (hidden // 4) * (window // 4)
        head: list[nn.Module] = []
        while width > 128:
            head += [nn.Linear(width, width // 4), nn.GELU()]
            width //= 4
        head.append(nn.Linear(width, 3))
        self.head = nn.Sequential(*head)

    def forward(self, x: torch.Tensor, attention: list | None = None) -> torch.Tensor:
        """Class logits [B, 3] of windows x [B, L, F]; with `attention` (a list), each layer's
        attention weights [B, heads, tokens, tokens] are appended to it (over time, then over
        features, alternately)."""
        x = self.norm(x.transpose(1, 2)).transpose(1, 2)
        x = self.embed(x) + self.positions
        for block in self.blocks:
            x, w = block(x, need_weights=attention is not None)
            if attention is not None:
                attention.append(w)
            x = x.transpose(1, 2)  # time <-> features
        # [B, L/4, hidden/4] here; the reference flattens it feature-major
        return self.head(x.transpose(1, 2).reshape(len(x), -1)).float()
