"""The prefix scans that are the same every run on a GPU (foxhunt.train.scan)."""

from __future__ import annotations

import pytest
import torch

from foxhunt.train import scan


@pytest.mark.parametrize("n", [1, 5, 1023, 1024, 1025, 3 * 1024 + 7])
@pytest.mark.parametrize("row", [4, 1024])
def test_the_two_level_scan_gives_the_sequential_sums_and_products(n, row):
    """Integers sum exactly in any order, so the two-level sum equals the sequential one
    exactly; the products of numbers near 1 agree with a slow loop in float64."""
    g = torch.Generator().manual_seed(n)
    ints = torch.randint(-1000, 1000, (n,), generator=g).double()
    assert torch.equal(scan.rows_scan(ints, "sum", row), torch.cumsum(ints, 0))
    x = 1.0 + 1e-3 * torch.randn(n, generator=g, dtype=torch.float64)
    want, acc = [], 1.0
    for v in x.tolist():  # the slow loop
        acc *= v
        want.append(acc)
    got = scan.rows_scan(x, "prod", row)
    assert got.shape == (n,) and got.dtype == torch.float64
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float64), rtol=1e-13, atol=0)
    f = torch.rand(n, generator=g)
    assert torch.allclose(scan.rows_scan(f, "sum", row), torch.cumsum(f, 0), rtol=1e-5)


def test_the_scans_are_torch_s_own_on_the_cpu_and_refuse_other_shapes():
    x = torch.rand(5000, dtype=torch.float64)
    assert torch.equal(scan.cumsum(x), torch.cumsum(x, 0))
    assert torch.equal(scan.cumprod(1 + x), torch.cumprod(1 + x, 0))
    f = x.float()
    assert torch.equal(scan.cumsum(f, torch.float64), torch.cumsum(f, 0, dtype=torch.float64))
    assert scan.rows_scan(x[:0], "sum").numel() == 0
    with pytest.raises(ValueError, match="1-D"):
        scan.cumsum(x.view(50, 100))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("row", [8, scan.ROW])
def test_the_triton_scans_give_the_sequential_sums_and_products(row, monkeypatch):
    """Sizes around a row and around a block of rows' totals: integers sum exactly in any
    order, so they equal the CPU's sequential sums exactly; products of numbers near 1 agree
    with the CPU's in float64, and float32 sums in float32."""
    assert scan._has_triton()
    monkeypatch.setattr(scan, "ROW", row)
    check_row_scans(lambda x, prod: (scan.cumprod if prod else scan.cumsum)(x.cuda()).cpu(), row)


def check_row_scans(run, row: int) -> None:
    """`run(x, prod)` (a scan of the CPU tensor x, returned on the CPU) against torch's
    sequential scans, at sizes around a row and a block of rows' totals: the Triton scans'
    check, compiled on a GPU (above) and in Triton's interpreter
    (tests/test_triton_interpreter.py)."""
    g = torch.Generator().manual_seed(row)
    for n in (1, row - 1, row, row + 1, row * row, row * row + 1, 3 * row * row + 5):
        ints = torch.randint(-1000, 1000, (n,), generator=g).double()
        assert torch.equal(run(ints, False), torch.cumsum(ints, 0)), n
        x = 1.0 + 1e-3 * torch.randn(n, generator=g, dtype=torch.float64)
        got = run(x, True)
        assert got.dtype == torch.float64 and got.shape == (n,)
        assert torch.allclose(got, torch.cumprod(x, 0), rtol=1e-12, atol=0), n
        f = torch.rand(n, generator=g)
        assert torch.allclose(run(f, False), torch.cumsum(f, 0), rtol=1e-5), n


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("triton", [True, False])
def test_the_scans_are_the_same_every_run_on_a_gpu(triton, monkeypatch):
    """Twenty runs of each scan over 1M float64 values give one result, bit for bit, within
    float rounding of the CPU's sequential scan: the Triton form and, where Triton is missing,
    the row scans. (torch's own 1-D scan on CUDA, CUB's, need not: how often it differed is
    printed, not asserted.)"""
    monkeypatch.setattr(scan, "_has_triton", lambda: triton)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1 << 20, generator=g, dtype=torch.float64)
    r = 1e-3 * x
    dx, dr = x.cuda(), r.cuda()
    sums = [scan.cumsum(dx) for _ in range(20)]
    prods = [scan.cumprod(1.0 + dr) for _ in range(20)]
    assert all(torch.equal(s, sums[0]) for s in sums)
    assert all(torch.equal(p, prods[0]) for p in prods)
    assert torch.allclose(sums[0].cpu(), torch.cumsum(x, 0), rtol=0, atol=1e-9)
    assert torch.allclose(prods[0].cpu(), torch.cumprod(1.0 + r, 0), rtol=1e-12, atol=0)
    first = torch.cumsum(dx, 0)
    differ = sum(not torch.equal(torch.cumsum(dx, 0), first) for _ in range(19))
    print(f"torch.cumsum on CUDA differed from its first run in {differ} of 19 runs")


def test_triton_s_key_is_hashed_once_on_a_thread_of_its_own(monkeypatch):
    """`hash_triton_early` runs Triton's `triton_key` (here a stand-in module) on another
    thread, once however often it is called; without Triton it does nothing."""
    import sys
    import threading
    import types

    monkeypatch.setattr(scan, "_hashing", None)
    monkeypatch.setattr(scan, "triton", None)
    scan.hash_triton_early()
    assert scan._hashing is None
    ran = []
    cache = types.ModuleType("triton.runtime.cache")
    cache.triton_key = lambda: ran.append(threading.current_thread().name)
    for name, mod in (("triton", types.ModuleType("triton")),
                      ("triton.runtime", types.ModuleType("triton.runtime")),
                      ("triton.runtime.cache", cache)):  # fmt: skip
        monkeypatch.setitem(sys.modules, name, mod)
    monkeypatch.setattr(scan, "triton", sys.modules["triton"])
    scan.hash_triton_early()
    thread = scan._hashing
    scan.hash_triton_early()
    assert scan._hashing is thread
    thread.join()
    assert ran == ["triton-key"]
