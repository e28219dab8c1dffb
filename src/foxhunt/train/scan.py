"""Prefix sums and products of a 1-D tensor that are the same every run on a GPU.

torch scans a 1-D CUDA tensor with CUB's device-wide scan, whose decoupled look-back combines
the tiles' partial results in an order that depends on which tile finishes first: a float
result can differ in its last bits from one run to the next (pytorch/pytorch#75240, NVIDIA/cub
#454). Seen in foxhunt on an H100: the compounded equity of an evaluation walk gave total
returns and drawdowns that differed in their 16th digit between runs of the same walk, and the
float64 running sum of 1M replay priorities differed from its first run in each of 19 runs
after it, where a replay sample draws another slot for a point that falls between two runs'
sums.

On a GPU `cumsum` and `cumprod` here run three Triton kernels in a fixed order: each row of ROW
elements scanned in its program (a block's scan, a fixed tree), the rows' totals scanned in one
program, block after block, and each row scanned again and combined with the total of the rows
before it. On an H100 that took 10.1 us over 1M float64 values against CUB's 9.1 us
(`bench/bench_scan.py`; docs/gpu-step.md), fast enough for the replay's scan each learning
step. Where Triton is missing on a GPU, `rows_scan` does the same with torch's row kernels (two
levels, one block a row, no look-back): the same every run too, six times slower. On the CPU
they are torch's own scans, which walk the tensor in order.
"""

from __future__ import annotations

import math
import threading

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # torch's CPU builds ship without Triton
    triton = None

ROW = 1024
"""Elements a row of the scans (a Triton program's, or a row of `rows_scan`)."""


def cumsum(x: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """torch.cumsum(x, 0, dtype=dtype) of a 1-D tensor, the same every run on a GPU."""
    x = x if dtype is None else x.to(dtype)
    if not _ordered(x):
        return torch.cumsum(x, 0)
    return _scan(x, prod=False) if _has_triton() else rows_scan(x, "sum")


def cumprod(x: torch.Tensor) -> torch.Tensor:
    """torch.cumprod(x, 0) of a 1-D tensor, the same every run on a GPU."""
    if not _ordered(x):
        return torch.cumprod(x, 0)
    return _scan(x, prod=True) if _has_triton() else rows_scan(x, "prod")


def _ordered(x: torch.Tensor) -> bool:
    """Whether x needs the scan here: a float tensor on a GPU (integer sums are exact in any
    order; the CPU's scans walk in order)."""
    if x.dim() != 1:
        raise ValueError(f"scan: a 1-D tensor, not {tuple(x.shape)}")
    return x.is_cuda and x.is_floating_point()


def _has_triton() -> bool:
    return triton is not None


def _torch_row_scan(x: torch.Tensor, op: str) -> torch.Tensor:
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
    inner = _torch_row_scan(grid, op)
    totals = torch.stack([inner[:, -1], torch.full_like(inner[:, -1], unit)])
    before = torch.cat([x.new_full((1,), unit), _torch_row_scan(totals, op)[0, :-1]])
    out = inner + before[:, None] if op == "sum" else inner * before[:, None]
    return out.view(-1)[:n]


_hashing: threading.Thread | None = None  # `hash_triton_early`'s thread, until joined


def hash_triton_early() -> None:
    """Start Triton's hash of its own installation (`triton_key`: every module's source and its
    ~0.3 GB compiler library, part of the cache key of any kernel it launches) on a thread of
    its own, to be done by the time this process first launches a kernel through Triton's
    runtime. A process computes it once; at the first launch of these scans it took 0.39 s of
    0.47 s on a warm Triton cache (H100, 2026-12-07), reading files and hashing them, both done
    without the GIL, so that it overlaps a task's own start (the cache's CRC-32 check, the
    upload). A call while the thread runs starts none; one after the first scan has joined it
    starts a thread that finds the key in Triton's own per-process cache. A no-op without
    Triton or where its key function is elsewhere."""
    global _hashing
    if triton is None or _hashing is not None:
        return
    try:
        from triton.runtime.cache import triton_key
    except ImportError:
        return
    _hashing = threading.Thread(target=triton_key, name="triton-key", daemon=True)
    _hashing.start()


def _scan(x: torch.Tensor, prod: bool) -> torch.Tensor:
    global _hashing
    if _hashing is not None:  # its key cached, rather than computed a second time here
        _hashing.join()
        _hashing = None
    x = x.contiguous()
    n = x.numel()
    out = torch.empty_like(x)
    if n == 0:
        return out
    rows = triton.cdiv(n, ROW)
    totals = torch.empty(rows, dtype=x.dtype, device=x.device)
    _row_totals[(rows,)](x, totals, n, ROW=ROW, PROD=prod)
    _scan_totals[(1,)](totals, rows, BLOCK=ROW, PROD=prod)
    _rows[(rows,)](x, totals, out, n, ROW=ROW, PROD=prod)
    return out


if triton is not None:

    @triton.jit
    def _combine(a, b, PROD: tl.constexpr):
        return a * b if PROD else a + b

    @triton.jit
    def _row_scan(x, PROD: tl.constexpr):
        return tl.cumprod(x, 0) if PROD else tl.cumsum(x, 0)

    @triton.jit
    def _load_row(x_ptr, r, n, ROW: tl.constexpr, PROD: tl.constexpr):
        k = r * ROW + tl.arange(0, ROW)
        unit = 1.0 if PROD else 0.0
        return tl.load(x_ptr + k, mask=k < n, other=unit).to(x_ptr.dtype.element_ty), k

    @triton.jit
    def _row_totals(x_ptr, tot_ptr, n, ROW: tl.constexpr, PROD: tl.constexpr):
        """totals[r] = row r's scan's last element (the row as `_rows` scans it)."""
        r = tl.program_id(0).to(tl.int64)
        x, _ = _load_row(x_ptr, r, n, ROW, PROD)
        s = _row_scan(x, PROD)
        last = tl.arange(0, ROW) == ROW - 1
        tl.store(tot_ptr + r, tl.sum(tl.where(last, s, tl.zeros_like(s)), 0))

    @triton.jit
    def _scan_totals(tot_ptr, rows, BLOCK: tl.constexpr, PROD: tl.constexpr):
        """The totals' inclusive scan in place, in one program, BLOCK at a time in order."""
        carry = tl.full((), 1.0 if PROD else 0.0, tot_ptr.dtype.element_ty)
        for start in range(0, rows, BLOCK):
            k = start + tl.arange(0, BLOCK)
            t = tl.load(tot_ptr + k, mask=k < rows, other=1.0 if PROD else 0.0)
            s = _combine(_row_scan(t, PROD), carry, PROD)
            tl.store(tot_ptr + k, s, mask=k < rows)
            carry = tl.sum(tl.where(tl.arange(0, BLOCK) == BLOCK - 1, s, tl.zeros_like(s)), 0)

    @triton.jit
    def _rows(x_ptr, inc_ptr, out_ptr, n, ROW: tl.constexpr, PROD: tl.constexpr):
        """Row r's scan combined with the inclusive total of the rows before it."""
        r = tl.program_id(0).to(tl.int64)
        x, k = _load_row(x_ptr, r, n, ROW, PROD)
        s = _row_scan(x, PROD)
        if r > 0:
            s = _combine(s, tl.load(inc_ptr + r - 1), PROD)
        tl.store(out_ptr + k, s, mask=k < n)
