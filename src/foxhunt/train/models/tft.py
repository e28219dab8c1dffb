"""The Temporal Fusion Transformer (Lim, Arik, Loeff and Pfister 2021, "Temporal Fusion
Transformers for interpretable multi-horizon time series forecasting"), written from the paper
for foxhunt's windows: 50 observed past inputs per bar, no static covariates, no known future
inputs, one forecast (the h-bar return's quantiles) at the window's last bar.

    x [B, L, 50]
      -> per-variable embeddings (each column its own linear map to `hidden`)
      -> variable selection network: softmax weights over the 50 variables from a GRN of all
         of them, each variable through its own GRN, the weighted sum        [B, L, hidden]
      -> LSTM encoder; gated skip (GLU) + add & LayerNorm around it
      -> static enrichment (a GRN; no static context here)
      -> interpretable multi-head attention (per-head queries and keys, one value projection
         shared by the heads, the heads' outputs averaged), causal; gated add & norm
      -> position-wise GRN; gated add & norm with the LSTM block's output
      -> a linear map to the quantiles

GRN(a) = LayerNorm(skip(a) + GLU(W2 ELU(W1 a + b1) + b2)) (the paper's eq. 2-5). Only the last
bar's forecast is trained and traded, so after the LSTM (which needs every bar) the attention
is computed for the last bar's query over all the bars, and the layers after it for the last
bar alone: the same output as the full sequence's last row, at a fraction of the work.

The variable-selection weights say which of the 50 columns the model reads (`importance`);
training logs their mean over the test range per fold (`explain`), and the report shows them.
The default target is the return's quantiles (`target = "return"`): what the paper's TFT
forecasts, turned into the traded direction by the median.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

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

__all__ = ["TFT", "GatedResidual", "SupervisedAgent", "TFTConfig", "acting_net"]


@dataclass(frozen=True)
class TFTConfig(SupervisedConfig):
    """TFT's sizes, beside the supervised path's settings (window, horizon, optimiser)."""

    target: Literal["direction", "return"] = "return"
    """The return's quantiles by default (the paper's TFT); direction trains the classes."""
    hidden: int | None = None
    """Width d of every layer (default: 64 on a GPU, 16 on a CPU)."""
    heads: int = 4
    """Attention heads (the interpretable attention shares its values across them)."""
    dropout: float = 0.1
    """Dropout inside the GRNs and on the attention output."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.heads < 1:
            raise ValueError(f"heads = {self.heads}: must be at least 1")
        if self.hidden is not None and (self.hidden < 1 or self.hidden % self.heads):
            raise ValueError(f"hidden = {self.hidden}: must be a positive multiple of heads")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"dropout = {self.dropout}: must be in [0, 1)")

    def resolved(self, device):
        return resolve(self, device, SIZES_BY_DEVICE | {"hidden": (64, 16)})

    def build(self, features: int = N_MKT) -> TFT:
        if self.hidden is None:
            raise ValueError("TFTConfig.build needs a resolved config (hidden is None)")
        return TFT(features, self.hidden, self.heads, self.dropout)


class GatedResidual(nn.Module):
    """The gated residual network (GRN), eq. 2-5: ELU layer, linear layer, GLU gate, residual
    (through a linear map where the widths differ), LayerNorm."""

    def __init__(self, d_in: int, d_hidden: int, d_out: int, dropout: float = 0.0):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_hidden)
        self.gate = nn.Linear(d_hidden, 2 * d_out)
        self.skip = nn.Linear(d_in, d_out) if d_in != d_out else nn.Identity()
        self.norm = nn.LayerNorm(d_out)
        self.dropout = nn.Dropout(dropout)

    def forward(self, a: torch.Tensor) -> torch.Tensor:
        h = self.fc2(F.elu(self.fc1(a)))
        return self.norm(self.skip(a) + F.glu(self.gate(self.dropout(h)), -1))


class VariableGRNs(nn.Module):
    """One GRN per variable (same widths, own weights), run for all variables at once with
    batched matrix products: x [..., V, d] -> [..., V, d]."""

    def __init__(self, variables: int, d: int, dropout: float):
        super().__init__()

        def w(a: int, b: int) -> nn.Parameter:
            bound = 1.0 / math.sqrt(a)  # nn.Linear's default initialisation
            return nn.Parameter(torch.empty(variables, a, b).uniform_(-bound, bound))

        def b(a: int, n: int) -> nn.Parameter:
            bound = 1.0 / math.sqrt(a)
            return nn.Parameter(torch.empty(variables, n).uniform_(-bound, bound))

        self.w1, self.b1 = w(d, d), b(d, d)
        self.w2, self.b2 = w(d, d), b(d, d)
        self.wg, self.bg = w(d, 2 * d), b(d, 2 * d)
        self.norm = nn.LayerNorm(d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.elu(torch.einsum("...vi,vio->...vo", x, self.w1) + self.b1)
        h = torch.einsum("...vi,vio->...vo", h, self.w2) + self.b2
        g = torch.einsum("...vi,vio->...vo", self.dropout(h), self.wg) + self.bg
        return self.norm(x + F.glu(g, -1))


class VariableSelection(nn.Module):
    """Weights over the variables (softmax of a GRN of their flattened embeddings) and the
    weighted sum of each variable's own GRN output (eq. 6-8)."""

    def __init__(self, variables: int, d: int, dropout: float):
        super().__init__()
        self.weights = GatedResidual(variables * d, d, variables, dropout)
        self.each = VariableGRNs(variables, d, dropout)

    def forward(self, e: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """e [B, L, V, d] -> (selected [B, L, d], weights [B, L, V])."""
        v = torch.softmax(self.weights(e.flatten(-2)), -1)
        return (v[..., None] * self.each(e)).sum(-2), v


class InterpretableAttention(nn.Module):
    """Multi-head attention whose heads share one value projection and are averaged (eq.
    14-16), so that the averaged attention weights say which bars the forecast reads."""

    def __init__(self, d: int, heads: int, dropout: float):
        super().__init__()
        self.heads, self.dk = heads, d // heads
        self.q = nn.Linear(d, heads * self.dk)
        self.k = nn.Linear(d, heads * self.dk)
        self.v = nn.Linear(d, self.dk)  # shared by every head
        self.out = nn.Linear(self.dk, d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, query: torch.Tensor, keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """query [B, d] (the last bar), keys [B, L, d] (every bar up to it) -> ([B, d],
        attention [B, heads, L])."""
        B, L, _ = keys.shape
        q = self.q(query).view(B, self.heads, 1, self.dk)
        k = self.k(keys).view(B, L, self.heads, self.dk).transpose(1, 2)
        att = torch.softmax((q @ k.transpose(-1, -2)) / math.sqrt(self.dk), -1)  # [B, H, 1, L]
        v = self.v(keys)  # [B, L, dk]
        mixed = (att @ v[:, None]).mean(1)[:, 0]  # heads averaged: [B, dk]
        return self.dropout(self.out(mixed)), att[:, :, 0]


class GateAddNorm(nn.Module):
    """LayerNorm(residual + GLU(x)): the paper's gated skip connection."""

    def __init__(self, d: int, dropout: float = 0.0):
        super().__init__()
        self.gate = nn.Linear(d, 2 * d)
        self.norm = nn.LayerNorm(d)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        return self.norm(residual + F.glu(self.gate(self.dropout(x)), -1))


class TFT(nn.Module):
    explains = True  # forward(x, explain=dict) reports the variable-selection weights
    vmap_ok = False  # nn.LSTM has no vmap batching rule: an ensemble runs its seeds one by one

    def __init__(self, features: int, d: int, heads: int, dropout: float, outputs: int = 3):
        super().__init__()
        self.embed_w = nn.Parameter(torch.randn(features, d) * 0.1)  # each column's own map
        self.embed_b = nn.Parameter(torch.zeros(features, d))
        self.select = VariableSelection(features, d, dropout)
        self.lstm = nn.LSTM(d, d, batch_first=True)
        self.after_lstm = GateAddNorm(d, dropout)
        self.enrich = GatedResidual(d, d, d, dropout)
        self.attention = InterpretableAttention(d, heads, dropout)
        self.after_attention = GateAddNorm(d)
        self.positionwise = GatedResidual(d, d, d, dropout)
        self.after_block = GateAddNorm(d)
        self.head = nn.Linear(d, outputs)

    def forward(self, x: torch.Tensor, explain: dict | None = None) -> torch.Tensor:
        """Outputs [B, 3] (quantiles, or class logits) of windows x [B, L, F]; with `explain`
        (a dict), the variable-selection weights [B, L, F] and the attention [B, heads, L] of
        the last bar are put in it."""
        e = x[..., None] * self.embed_w + self.embed_b  # [B, L, F, d]
        s, weights = self.select(e)
        h, _ = self.lstm(s)
        h = self.after_lstm(h, s)  # [B, L, d]
        enriched = self.enrich(h)
        a, att = self.attention(enriched[:, -1], enriched)
        last = self.after_attention(a, enriched[:, -1])
        out = self.after_block(self.positionwise(last), h[:, -1])
        if explain is not None:
            explain["variables"], explain["attention"] = weights, att
        return self.head(out).float()
