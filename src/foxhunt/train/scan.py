"""Prefix sums and products of a 1-D tensor that are the same every run on a GPU.

torch scans a 1-D CUDA tensor with CUB's device-wide scan, whose decoupled look-back combines
the tiles' partial results in an order that depends on which tile finishes first: a float
result can differ in its last bits from one run to the next (pytorch/pytorch#75240, NVIDIA/cub
#454). Seen in foxhunt on an H100: the compounded equity of an evaluation walk gave total
returns and drawdowns that differed in their 16th digit between runs of the same walk.

On a GPU `cumsum` and `cumprod` here cut the tensor into rows and scan each with torch's row
kernel (one block a row, walked in a fixed order, no look-back); a second such scan carries the
rows' totals, and each row is combined with the total of the rows before it. On the CPU they
are torch's own scans, which walk the tensor in order. Slower than CUB's (62 against 9 us for
1M float64 values on an H100): for what runs once an evaluation, not for a learning step. The
replay's running sum of its priorities, each learning step, stays CUB's (agents.dqn.Replay):
over 1M float64 values it differed from its first run in 19 of 19 runs on an H100, which
moves a sample's slot only where a point falls within those last bits of a slot's edge.
"""

from __future__ import annotations

import math

import torch

ROW = 1024
"""Elements a row of the two-level scan."""


def cumsum(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.cumsum(x, 0, dtype=dtype) of a 1-D tensor, the same every run on a GPU."""
    x = x if dtype is None else x.to(dtype)
    if not _ordered(x):
        return torch.cumsum(x, 0)
    return rows_scan(x, "sum")


def cumprod(x: torch.Tensor) -> torch.Tensor:
    """torch.cumprod(x, 0) of a 1-D tensor, the same every run on a GPU."""
    if not _ordered(x):
        return torch.cumprod(x, 0)
    return rows_scan(x, "prod")


def _ordered(x: torch.Tensor) -> bool:
    """Whether x needs the scan here: a float tensor on a GPU (integer sums are exact in any
    order; the CPU's scans walk in order)."""
    if x.dim() != 1:
        raise ValueError(f"scan: a 1-D tensor, not {tuple(x.shape)}")
    return x.is_cuda and x.is_floating_point()


def _row_scan(x: torch.Tensor, op: str) -> torch.Tensor:
    """The scan along the last dim of a 2-D tensor of two rows or more: torch's row kernel on a
    GPU (a tensor of one row would go to CUB's device-wide scan)."""
    return torch.cumsum(x, 1) if op == "sum" else torch.cumprod(x, 1)


def rows_scan(x: torch.Tensor, op: str, row: int = ROW) -> torch.Tensor:
    """The two-level scan of 1-D x ("sum" or "prod") on any device: x cut into rows of `row`
    elements (the last padded with the identity, and one row of it more, so that there are
    always two rows), each row scanned, the rows' totals scanned as one row beside a row of
    the identity, and each row combined with the total of the rows before it."""
    n = x.numel()
    if n == 0:
        return x.clone()
    unit = 0.0 if op == "sum" else 1.0
    rows = math.ceil(n / row) + 1
    grid = torch.cat([x, x.new_full((rows * row - n,), unit)]).view(rows, row)
    inner = _row_scan(grid, op)
    totals = torch.stack([inner[:, -1], torch.full_like(inner[:, -1], unit)])
    before = torch.cat([x.new_full((1,), unit), _row_scan(totals, op)[0, :-1]])
    out = inner + before[:, None] if op == "sum" else inner * before[:, None]
    return out.view(-1)[:n]
