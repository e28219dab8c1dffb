"""Liquid / CfC: closed-form continuous-time networks (Hasani et al. 2022, "Closed-form
continuous-time neural networks", Nature Machine Intelligence), the "default" (gated) CfC cell of
the authors' `ncps` package, written here so that its time loop is cheap:

    z_t   = lecun_tanh(W_x x_t + W_h h_{t-1} + b)          the backbone (1 layer by default)
    f1    = tanh(A1 z_t),  f2 = tanh(A2 z_t)
    gate  = sigmoid(T_a(z_t) * dt + T_b(z_t))               dt = 1 bar
    h_t   = f1 * (1 - gate) + gate * f2

with lecun_tanh(u) = 1.7159 tanh(0.666 u). The class logits are a linear readout of the last
h_t. The same parameters and the same numbers as `ncps.torch.CfC(50, units, proj_size=3,
return_sequences=False, backbone_units=..., backbone_layers=...)` (tested against it), laid out
differently: the backbone's input half W_x x_t is one matrix product over the whole window
before the loop, and the four heads (A1, A2, T_a, T_b) are one [units x 4] product per step, so
a step is two small matrix products and a few elementwise kernels. Why not use ncps itself: its
loop recomputes the input half at every step, and these layouts let torch.compile fuse a step.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from foxhunt.train.agents.supervised import SupervisedAgent, SupervisedConfig, acting_net
from foxhunt.train.data import N_MKT

__all__ = ["CfC", "CfCConfig", "SupervisedAgent", "acting_net"]


@dataclass(frozen=True)
class CfCConfig(SupervisedConfig):
    """CfC's sizes, beside the supervised path's settings (window, horizon, optimiser)."""

    units: int = 64
    """Hidden state width of the CfC cell."""
    backbone_units: int = 128
    """Width of the backbone layers (ncps's default 128)."""
    backbone_layers: int = 1
    """Backbone layers (ncps's default 1)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        for k in ("units", "backbone_units", "backbone_layers"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} = {getattr(self, k)}: must be at least 1")

    def build(self, features: int = N_MKT) -> CfC:
        return CfC(features, self.units, self.backbone_units, self.backbone_layers)


def lecun_tanh(x: torch.Tensor) -> torch.Tensor:
    return 1.7159 * torch.tanh(0.666 * x)


class CfC(nn.Module):
    def __init__(self, features: int, units: int, backbone_units: int, backbone_layers: int):
        super().__init__()
        self.units = units
        self.inp = nn.Linear(features, backbone_units)  # W_x and b of the first backbone layer
        self.rec = nn.Linear(units, backbone_units, bias=False)  # W_h
        self.backbone = nn.ModuleList(
            nn.Linear(backbone_units, backbone_units) for _ in range(backbone_layers - 1)
        )
        self.heads = nn.Linear(backbone_units, 4 * units)  # A1 | A2 | T_a | T_b
        self.readout = nn.Linear(units, 3)
        # ncps initialises every matrix Xavier-uniform (its first backbone layer as one
        # [backbone, features + units] matrix, each head as its own [units, backbone]).
        w = nn.init.xavier_uniform_(torch.empty(backbone_units, features + units))
        with torch.no_grad():
            self.inp.weight.copy_(w[:, :features])
            self.rec.weight.copy_(w[:, features:])
            for m in self.backbone:
                nn.init.xavier_uniform_(m.weight)
            for part in self.heads.weight.view(4, units, backbone_units):
                nn.init.xavier_uniform_(part)
            nn.init.xavier_uniform_(self.readout.weight)

    def forward(self, x: torch.Tensor, dt: float = 1.0) -> torch.Tensor:
        """Class logits [B, 3] of windows x [B, L, F]."""
        B, L, _ = x.shape
        xin = self.inp(x)  # [B, L, backbone]: the input half of every step at once
        h = x.new_zeros(B, self.units, dtype=xin.dtype)
        for t in range(L):
            z = lecun_tanh(xin[:, t] + self.rec(h))
            for m in self.backbone:
                z = lecun_tanh(m(z))
            f1, f2, ta, tb = self.heads(z).chunk(4, -1)
            gate = torch.sigmoid(ta * dt + tb)
            h = torch.tanh(f1) * (1.0 - gate) + gate * torch.tanh(f2)
        return self.readout(h).float()
