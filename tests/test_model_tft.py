"""The Temporal Fusion Transformer's parts against the paper's equations computed by hand: the
gated residual network, per-variable GRNs, variable selection, the interpretable attention
(values shared by the heads, heads averaged); the quantile (pinball) loss by hand."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from foxhunt.train.agents.supervised import pinball, quantile_class_probs
from foxhunt.train.models.tft import (
    TFT,
    GatedResidual,
    InterpretableAttention,
    TFTConfig,
    VariableGRNs,
    VariableSelection,
)


def grn_by_hand(a, fc1, fc2, gate, skip, norm):
    """eq. 2-5: eta2 = ELU(W2 a + b2); eta1 = W1 eta2 + b1; GLU(eta1) = sigma(W4 eta1 + b4) *
    (W5 eta1 + b5); LayerNorm(skip(a) + GLU)."""
    eta2 = F.elu(a @ fc1.weight.T + fc1.bias)
    eta1 = eta2 @ fc2.weight.T + fc2.bias
    g = eta1 @ gate.weight.T + gate.bias
    d = g.shape[-1] // 2
    glu = g[..., :d] * torch.sigmoid(g[..., d:])
    r = skip(a) + glu
    mu, var = r.mean(-1, keepdim=True), r.var(-1, unbiased=False, keepdim=True)
    return (r - mu) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


@pytest.mark.parametrize("d_in,d_out", [(6, 6), (6, 4)])
def test_grn_is_the_papers_equations(d_in, d_out):
    torch.manual_seed(0)
    grn = GatedResidual(d_in, 5, d_out).double()
    with torch.no_grad():
        grn.norm.weight.uniform_(0.5, 1.5)
        grn.norm.bias.normal_()
    a = torch.randn(3, 7, d_in, dtype=torch.float64)
    want = grn_by_hand(a, grn.fc1, grn.fc2, grn.gate, grn.skip, grn.norm)
    torch.testing.assert_close(grn(a), want)


def test_per_variable_grns_are_separate_grns_with_their_own_weights():
    torch.manual_seed(1)
    V, d = 4, 6
    many = VariableGRNs(V, d, 0.0).double()
    x = torch.randn(2, 5, V, d, dtype=torch.float64)
    got = many(x)
    for v in range(V):
        one = GatedResidual(d, d, d).double()
        with torch.no_grad():
            one.fc1.weight.copy_(many.w1[v].T), one.fc1.bias.copy_(many.b1[v])
            one.fc2.weight.copy_(many.w2[v].T), one.fc2.bias.copy_(many.b2[v])
            one.gate.weight.copy_(many.wg[v].T), one.gate.bias.copy_(many.bg[v])
            one.norm.load_state_dict(many.norm.state_dict())
        torch.testing.assert_close(got[..., v, :], one(x[..., v, :]))


def test_variable_selection_weights_sum_to_one_and_weight_the_processed_variables():
    torch.manual_seed(2)
    vsn = VariableSelection(5, 4, 0.0).double()
    e = torch.randn(3, 6, 5, 4, dtype=torch.float64)
    out, w = vsn(e)
    assert w.shape == (3, 6, 5) and (w > 0).all()
    torch.testing.assert_close(w.sum(-1), torch.ones(3, 6, dtype=torch.float64))
    want = (w[..., None] * vsn.each(e)).sum(-2)
    torch.testing.assert_close(out, want)
    # the weights come from the flattened embeddings through the selection GRN, softmaxed
    torch.testing.assert_close(w, torch.softmax(vsn.weights(e.flatten(-2)), -1))


def test_interpretable_attention_shares_values_and_averages_the_heads():
    torch.manual_seed(3)
    d, H, L = 8, 2, 5
    att = InterpretableAttention(d, H, 0.0).double()
    keys = torch.randn(3, L, d, dtype=torch.float64)
    query = keys[:, -1]
    out, weights = att(query, keys)
    dk = d // H
    v = keys @ att.v.weight.T + att.v.bias  # [B, L, dk]: one projection for every head
    heads = []
    for h in range(H):
        wq = att.q.weight[h * dk : (h + 1) * dk]
        wk = att.k.weight[h * dk : (h + 1) * dk]
        q = query @ wq.T + att.q.bias[h * dk : (h + 1) * dk]
        k = keys @ wk.T + att.k.bias[h * dk : (h + 1) * dk]
        a = torch.softmax((k @ q[..., None])[..., 0] / math.sqrt(dk), -1)  # [B, L]
        torch.testing.assert_close(weights[:, h], a)
        heads.append((a[..., None] * v).sum(1))
    want = torch.stack(heads).mean(0) @ att.out.weight.T + att.out.bias
    torch.testing.assert_close(out, want)


def test_pinball_loss_by_hand():
    pred = torch.tensor([[0.0, 1.0, 2.0], [-1.0, 0.0, 1.0]])
    y = torch.tensor([1.5, -2.0])
    q = torch.tensor([0.1, 0.5, 0.9])
    # sample 0: e = 1.5, 0.5, -0.5 -> 0.15, 0.25, 0.05; sample 1: e = -1, -2, -3 -> 0.9, 1, 0.3
    want = (0.15 + 0.25 + 0.05 + 0.9 + 1.0 + 0.3) / 6
    assert float(pinball(pred, y, q)) == pytest.approx(want)


def test_the_network_explains_and_its_config_resolves():
    cfg = TFTConfig(window=8).resolved(torch.device("cpu"))
    assert (cfg.hidden, cfg.target) == (16, "return")
    net = cfg.build(features=50)
    assert isinstance(net, TFT)
    seen: dict = {}
    out = net(torch.randn(4, 8, 50), explain=seen)
    assert out.shape == (4, 3)
    assert seen["variables"].shape == (4, 8, 50) and seen["attention"].shape == (4, 4, 8)
    with pytest.raises(ValueError, match="multiple of heads"):
        TFTConfig(hidden=10, heads=4)
    with pytest.raises(ValueError, match="quantiles"):
        TFTConfig(quantiles=(0.5, 0.1, 0.9))


def test_quantiles_read_as_a_normal_give_the_class_probabilities():
    from statistics import NormalDist

    q = torch.tensor([[-1.0, 0.5, 2.0], [-3.0, -2.0, -1.0]])
    p = quantile_class_probs(q, torch.tensor(0.3), (0.1, 0.5, 0.9))
    z = NormalDist()
    for row, (lo, mid, hi) in zip(p, q.tolist(), strict=True):
        sd = (hi - lo) / (z.inv_cdf(0.9) - z.inv_cdf(0.1))
        want_down = z.cdf((-0.3 - mid) / sd)
        want_up = 1 - z.cdf((0.3 - mid) / sd)
        assert row.tolist() == pytest.approx([want_down, 1 - want_down - want_up, want_up],
                                             abs=1e-6)  # fmt: skip
    assert p.argmax(-1).tolist() == [2, 0]
