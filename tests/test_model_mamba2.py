"""Mamba-2's SSD layer: the chunked algorithm against the step-by-step recurrence and against
the quadratic ("attention") form of the same operator, forward and gradients, with and without
chunk boundaries inside the sequence; the network is causal and the chunked and scanned
networks agree."""

from __future__ import annotations

import pytest
import torch

from foxhunt.train.models.mamba2 import (
    Mamba2,
    Mamba2Config,
    segment_sums,
    ssd_chunked,
    ssd_last,
    ssd_scan,
)


def random_ssd(b=2, L=24, h=3, p=4, n=5, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, L, h, p, generator=g, dtype=dtype)
    dt = torch.nn.functional.softplus(torch.randn(b, L, h, generator=g, dtype=dtype))
    A = -torch.rand(h, generator=g, dtype=dtype) * 2 - 0.1
    B = torch.randn(b, L, h, n, generator=g, dtype=dtype)
    C = torch.randn(b, L, h, n, generator=g, dtype=dtype)
    return x, dt, A, B, C


def quadratic(x, dt, A, B, C):
    """y_i = sum_{j <= i} (C_i . B_j) exp(sum_{k=j+1..i} dt_k A) dt_j x_j, by explicit loops over
    the pairs: the semiseparable matrix the paper's duality is about."""
    L = x.shape[1]
    y = torch.zeros_like(x)
    for i in range(L):
        for j in range(i + 1):
            decay = torch.exp((dt[:, j + 1 : i + 1] * A).sum(1))  # [b, h]
            w = (C[:, i] * B[:, j]).sum(-1) * decay * dt[:, j]  # [b, h]
            y[:, i] += w[..., None] * x[:, j]
    return y


def test_segment_sums_by_hand():
    a = torch.tensor([1.0, 2.0, 3.0])
    s = segment_sums(a)
    inf = float("-inf")
    want = torch.tensor([[0.0, inf, inf], [2.0, 0.0, inf], [5.0, 3.0, 0.0]])
    assert torch.equal(s, want)


def test_the_scan_is_the_quadratic_form():
    args = random_ssd(L=9)
    torch.testing.assert_close(ssd_scan(*args), quadratic(*args))


@pytest.mark.parametrize("chunk", [24, 8, 6, 5, 1])  # one chunk; 3; 4; 24 = 4 x 5 + pad 1; 24
@pytest.mark.parametrize("last", [False, True], ids=["every-step", "last-step"])
def test_chunked_equals_the_scan_forward_and_gradients(chunk, last):
    """ssd_chunked against the recurrence; with `last`, ssd_last (the network's last block: the
    state after every step, no other output) against the recurrence's last output."""
    args = [a.requires_grad_() for a in random_ssd(L=24, seed=chunk)]
    y_scan = ssd_scan(*args)[:, -1] if last else ssd_scan(*args)
    y_chunk = ssd_last(*args, chunk=chunk) if last else ssd_chunked(*args, chunk=chunk)
    torch.testing.assert_close(y_chunk, y_scan, rtol=1e-10, atol=1e-10)
    w = torch.randn_like(y_scan)
    g_scan = torch.autograd.grad((y_scan * w).sum(), args)
    g_chunk = torch.autograd.grad((y_chunk * w).sum(), args)
    for name, a, b in zip("x dt A B C".split(), g_chunk, g_scan, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, msg=name)


def test_chunked_in_float32_stays_close_over_a_long_window():
    """At the GPU default (window 128, chunk 64) in float32, as training runs it."""
    x, dt, A, B, C = random_ssd(b=4, L=128, h=4, p=8, n=16, seed=3)
    want = ssd_scan(x, dt, A, B, C)
    got = ssd_chunked(*(v.float() for v in (x, dt, A, B, C)), chunk=64).double()
    assert ((got - want).norm() / want.norm()) < 1e-5


def test_the_network_is_causal_and_its_chunked_and_scanned_forms_agree():
    torch.manual_seed(0)
    net = Mamba2(features=7, d_model=16, layers=2, d_state=8, headdim=8, expand=2, conv=4,
                 chunk=5).double()  # fmt: skip
    x = torch.randn(3, 17, 7, dtype=torch.float64)
    torch.testing.assert_close(net(x), net(x, scan=True), rtol=1e-9, atol=1e-9)
    # a block's outputs up to bar 9 are the same whatever comes after bar 9 (the convolution
    # and the SSD read only the past), and the same as those of the sequence cut after bar 9
    u = net.embed(x)
    block = net.blocks[0]
    u2 = u.clone()
    u2[:, 10:] += 5.0
    full, moved = block(u), block(u2)
    torch.testing.assert_close(moved[:, :10], full[:, :10], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(block(u[:, :10]), full[:, :10], rtol=1e-12, atol=1e-12)
    assert not torch.allclose(moved[:, 10:], full[:, 10:])
    # the last block's form for the readout: the last bar's row of the full form
    torch.testing.assert_close(block(u, last=True), full[:, -1], rtol=1e-12, atol=1e-12)


def test_config_sizes_resolve_per_device_and_are_checked():
    cpu = Mamba2Config().resolved(torch.device("cpu"))
    assert (cpu.d_model, cpu.headdim) == (32, 16)
    net = cpu.build()
    assert net(torch.randn(2, cpu.window, 50)).shape == (2, 3)
    with pytest.raises(ValueError, match="headdim = 48: must divide"):
        Mamba2Config(d_model=32, headdim=48)
