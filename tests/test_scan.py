"""The prefix scans that are the same every run on a GPU (foxhunt.train.scan)."""

from __future__ import annotations

import pytest
import torch

from foxhunt.train import scan


def test_the_scans_are_torch_s_own_on_the_cpu_and_refuse_other_shapes():
    x = torch.rand(5000, dtype=torch.float64)
    assert torch.equal(scan.cumsum(x), torch.cumsum(x, 0))
    assert torch.equal(scan.cumprod(1 + x), torch.cumprod(1 + x, 0))
    f = x.float()
    assert torch.equal(scan.cumsum(f, torch.float64), torch.cumsum(f, 0, dtype=torch.float64))
    with pytest.raises(ValueError, match="1-D"):
        scan.cumsum(x.view(50, 100))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("row", [8, scan.ROW])
def test_the_gpu_scans_give_the_sequential_sums_and_products(row, monkeypatch):
    """Sizes around a row and around a block of rows' totals: integers sum exactly in any
    order, so they equal the CPU's sequential sums exactly; products of numbers near 1 agree
    with the CPU's in float64, and float32 sums in float32."""
    monkeypatch.setattr(scan, "ROW", row)
    g = torch.Generator().manual_seed(row)
    for n in (1, row - 1, row, row + 1, row * row, row * row + 1, 3 * row * row + 5):
        ints = torch.randint(-1000, 1000, (n,), generator=g).double()
        assert torch.equal(scan.cumsum(ints.cuda()).cpu(), torch.cumsum(ints, 0)), n
        x = 1.0 + 1e-3 * torch.randn(n, generator=g, dtype=torch.float64)
        got = scan.cumprod(x.cuda())
        assert got.dtype == torch.float64 and got.shape == (n,)
        assert torch.allclose(got.cpu(), torch.cumprod(x, 0), rtol=1e-12, atol=0), n
        f = torch.rand(n, generator=g)
        assert torch.allclose(scan.cumsum(f.cuda()).cpu(), torch.cumsum(f, 0), rtol=1e-5), n


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_scans_are_the_same_every_run_on_a_gpu():
    """Twenty runs of each scan over 1M float64 values give one result, bit for bit. (torch's
    own 1-D scan on CUDA, CUB's, need not: how often it differed is printed, not asserted.)"""
    g = torch.Generator().manual_seed(0)
    x = torch.rand(1 << 20, generator=g, dtype=torch.float64).cuda()
    sums = [scan.cumsum(x) for _ in range(20)]
    prods = [scan.cumprod(1.0 + 1e-3 * (x - 0.5)) for _ in range(20)]
    assert all(torch.equal(s, sums[0]) for s in sums)
    assert all(torch.equal(p, prods[0]) for p in prods)
    first = torch.cumsum(x, 0)
    differ = sum(not torch.equal(torch.cumsum(x, 0), first) for _ in range(19))
    print(f"torch.cumsum on CUDA differed from its first run in {differ} of 19 runs")
