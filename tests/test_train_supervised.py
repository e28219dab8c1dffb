"""The supervised path (windows, labels, metrics, schedule, the policy that trades forecasts)
and its models: TLOB against its reference configuration's parameter count and a hand-computed
attention, CfC against the authors' ncps package; determinism, resume and learning through
`foxhunt train`."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from foxhunt.train import EnvConfig, TrainConfig, demo, run_train
from foxhunt.train.agents.supervised import (
    SupervisedAgent,
    classification_metrics,
    horizon_returns,
    label,
    orders,
    sample_bars,
    step_lr_factor,
    warmup_cosine,
    windows,
)
from foxhunt.train.models.cfc import CfC, CfCConfig
from foxhunt.train.models.mamba2 import Mamba2Config
from foxhunt.train.models.tft import TFTConfig
from foxhunt.train.models.tlob import TLOB, TLOBConfig
from foxhunt.train.tracking import NullLogger
from marketdata import random_market
from trainruns import Killed, metrics_of, served_and_trained_orders

TLOB_TINY = TLOBConfig(window=16, hidden=16, layers=1, horizon=5, batch_size=64, steps=8)
CFC_TINY = CfCConfig(window=16, units=16, backbone_units=32, horizon=5, batch_size=64, steps=8)
MAMBA2_TINY = Mamba2Config(window=16, d_model=16, headdim=8, d_state=8, chunk=8, layers=1,
                           horizon=5, batch_size=64, steps=8)  # fmt: skip
TFT_TINY = TFTConfig(window=16, hidden=8, heads=2, horizon=5, batch_size=64, steps=8)


# ------------------------------------------------------------------------------ samples
def test_windows_are_the_normalised_bars_up_to_t_in_order():
    data = random_market(300, 0)
    data.fit_normaliser(0, 200)
    t = torch.tensor([0, 3, 50, 299])
    w = windows(data, t, 8)
    assert w.shape == (4, 8, 50)
    for i, ti in enumerate(t.tolist()):
        for j in range(8):
            src = max(ti - 7 + j, 0)  # oldest first; before the data's start, bar 0
            want = ((data.mkt[src] - data.mean) * data.inv_std).clamp(-10, 10)
            torch.testing.assert_close(w[i, j], want)


def test_horizon_returns_are_the_h_bar_close_to_close_returns():
    data = random_market(200, 1)
    close = torch.tensor(np.exp(np.cumsum(np.r_[0, np.log1p(data.ret1.double().numpy()[:-1])])))
    for h in (1, 5):
        r = horizon_returns(data, h)
        want = (close[h:] / close[:-h] - 1).float()
        torch.testing.assert_close(r[: 200 - h], want, rtol=1e-5, atol=1e-8)
        assert (r[200 - h :] == 0).all()


def test_labels_balance_on_train_and_never_end_past_the_range():
    data = random_market(3000, 2)
    agent = SupervisedAgent(TLOB_TINY, EnvConfig(), data, seed=0)
    agent.reset_fold(100, 2100, seed=1)
    h = TLOB_TINY.horizon
    samples = agent.train_t[: agent.samples]
    assert int(samples.max()) + h <= 2100 - 1 and int(samples.min()) == 100
    counts = torch.bincount(agent.labels[samples], minlength=3).double() / agent.samples
    # A symmetric threshold: flat is a third of the train samples, up and down share the rest
    # as the range's drift has it (random_market's walk drifts here: 37% / 29%).
    assert abs(counts[1] - 1 / 3) < 0.005 and (counts[[0, 2]] > 0.25).all(), counts
    # The threshold is the train range's: labels elsewhere are not refitted.
    r = agent.ret_h
    assert torch.equal(agent.labels, label(r, agent.theta))
    theta = torch.quantile(r[100 : 2100 - h].abs().double(), 1 / 3).float()
    assert float(agent.theta) == pytest.approx(float(theta))
    assert sample_bars(0, 50, 10) == (0, 40)


def test_classification_metrics_by_hand():
    truth = torch.tensor([0, 0, 1, 1, 1, 2, 2, 2, 2, 0])
    pred = torch.tensor([0, 1, 1, 1, 2, 2, 2, 0, 2, 0])
    m = classification_metrics(pred, truth)
    cm = np.zeros((3, 3))
    for a, b in zip(truth.tolist(), pred.tolist(), strict=True):
        cm[a, b] += 1
    prec = cm.diagonal() / cm.sum(0)
    rec = cm.diagonal() / cm.sum(1)
    f1 = 2 * prec * rec / (prec + rec)
    assert m["accuracy"] == pytest.approx(7 / 10)
    assert m["macro_f1"] == pytest.approx(f1.mean())
    assert m["precision_up"] == pytest.approx(prec[2]) and m["recall_down"] == pytest.approx(rec[0])
    assert m["confusion_up_down"] == 1.0 and m["confusion_flat_flat"] == 2.0


def test_warmup_then_cosine():
    f = torch.tensor([0.0, 0.05, 0.1, 0.55, 1.0])  # 0.55: halfway through the decay
    got = warmup_cosine(f, 0.1)
    want = [0.0, 0.5, 1.0, 0.5 * (1 + math.cos(math.pi * 0.5)), 0.0]
    torch.testing.assert_close(got, torch.tensor(want), atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("total", [1, 2, 7, 100])
def test_no_step_has_a_learning_rate_of_zero(total):
    """Capturable Adam (the CUDA graphs') divides by the learning rate: every step's factor is
    in (0, 1], rising over the warm-up and falling after it."""
    k = torch.arange(total, dtype=torch.float32)
    f = step_lr_factor(k, torch.tensor(float(total)), 0.1)
    assert (f > 0).all() and (f <= 1).all()
    if total == 100:
        assert f[:9].diff().gt(0).all() and f[10:].diff().lt(0).all()
        assert f[0] == pytest.approx(1 / 101 / 0.1) and f[-1] < 1e-3


def test_forecasts_become_orders_flat_holds_or_closes():
    cls = torch.tensor([2, 0, 1, 1, 1])
    size = torch.full((5,), 4)
    port = torch.tensor([[0.0, 0, 0], [0.6, 0, 0], [0.6, 0, 0], [-0.2, 0, 0], [0.0, 0, 0]])
    hold = orders(cls, size, port, "hold")
    assert hold[:, 0].tolist() == [2, 0, 2, 0, 1]  # flat keeps long, short and flat
    assert orders(cls, size, port, "flat")[:, 0].tolist() == [2, 0, 1, 1, 1]
    assert (hold[:, 1] == 4).all() and (hold[:, 2] == 0).all()  # full size, market


# ------------------------------------------------------------------------------ TLOB
@pytest.mark.parametrize(
    ("hidden", "window", "layers", "heads", "params"),
    # From the reference code (github.com/LeonardoBerti00/TLOB, models/tlob.py at aedcf83,
    # TLOB(hidden, layers, window, 50 features, heads, sinusoidal, "FI_2010")), counted with
    # sum(p.numel() for p in model.parameters()); the first is the paper's configuration.
    [
        (40, 128, 4, 1, 1_136_394),
        (128, 128, 4, 1, 2_301_612),
        (32, 32, 2, 1, 63_420),
        (64, 64, 2, 2, 525_708),
    ],
)
def test_tlob_has_the_reference_configurations_parameters(hidden, window, layers, heads, params):
    net = TLOB(50, window, hidden, layers, heads)
    # The reference also counts its order-type embedding (nn.Embedding(3, 1): 3 parameters),
    # used only on LOBSTER's message data, where one column is an order type; ours has none.
    assert sum(p.numel() for p in net.parameters()) == params - 3
    assert net(torch.randn(3, window, 50)).shape == (3, 3)


def test_tlob_attends_over_time_then_over_features_as_computed_by_hand():
    """The first layer's attention weights are softmax(q' k'^T / sqrt(d)) over the window's
    bars, the second's over the embedding's features, with q' = W_in_q (W_q x + b_q) + b_in_q
    (TLOB's projections, then multi-head attention's own), computed here by hand."""
    torch.manual_seed(0)
    L, H = 8, 12
    net = TLOB(5, L, H, 2, 1)  # the first pair keeps its widths (the last narrows them)
    x = torch.randn(2, L, 5)
    att: list = []
    net(x, attention=att)
    assert att[0].shape == (2, 1, L, L) and att[1].shape == (2, 1, H, H)

    def by_hand(layer, z):
        mha = layer.attention
        d = mha.embed_dim
        wq, wk, _ = mha.in_proj_weight.split(d)
        bq, bk, _ = mha.in_proj_bias.split(d)
        q = (layer.q(z) @ wq.T + bq) / math.sqrt(d)
        k = layer.k(z) @ wk.T + bk
        return torch.softmax(q @ k.transpose(1, 2), -1)

    z = net.norm(x.transpose(1, 2)).transpose(1, 2)
    z = net.embed(z) + net.positions  # [B, L, H]: bars are the first layer's tokens
    torch.testing.assert_close(att[0][:, 0], by_hand(net.blocks[0], z))
    z2, _ = net.blocks[0](z)
    z2 = z2.transpose(1, 2)  # [B, H, L]: features are the second layer's tokens
    torch.testing.assert_close(att[1][:, 0], by_hand(net.blocks[1], z2))


# ------------------------------------------------------------------------------ CfC
def test_cfc_equals_the_ncps_reference_with_the_same_weights():
    ncps = pytest.importorskip("ncps.torch")
    torch.manual_seed(0)
    F_, U, BU = 7, 6, 10
    ref = ncps.CfC(F_, U, proj_size=3, return_sequences=False, backbone_units=BU,
                   backbone_layers=2)  # fmt: skip
    ours = CfC(F_, U, BU, 2)
    cell = ref.rnn_cell
    with torch.no_grad():
        w0 = cell.backbone[0].weight  # [BU, F + U] on cat([input, hx])
        ours.inp.weight.copy_(w0[:, :F_])
        ours.rec.weight.copy_(w0[:, F_:])
        ours.inp.bias.copy_(cell.backbone[0].bias)
        ours.backbone[0].load_state_dict(cell.backbone[2].state_dict())
        heads = (cell.ff1, cell.ff2, cell.time_a, cell.time_b)
        ours.heads.weight.copy_(torch.cat([m.weight for m in heads]))
        ours.heads.bias.copy_(torch.cat([m.bias for m in heads]))
        ours.readout.load_state_dict(ref.fc.state_dict())
    assert sum(p.numel() for p in ours.parameters()) == sum(p.numel() for p in ref.parameters())
    x = torch.randn(4, 9, F_)
    want, _ = ref(x)
    torch.testing.assert_close(ours(x), want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------------------ train
def tiny(demo, out, model, **kw) -> TrainConfig:
    cache, folds = demo
    base = dict(
        folds=folds, cache=cache, epochs=2, out=out, tracking="none", eval_segments=64,
        tlob=TLOB_TINY, cfc=CFC_TINY, mamba2=MAMBA2_TINY, tft=TFT_TINY,
        env=EnvConfig(episode_bars=256), run_id="run-1",
        baselines=False, model=model,
    )  # fmt: skip
    return TrainConfig(**(base | kw))


@pytest.mark.parametrize("model", ["tlob", "cfc", "mamba2", "tft"])
def test_same_seed_same_metrics_and_a_killed_task_resumes_to_them(demo_es, tmp_path, model):
    a = run_train(tiny(demo_es, tmp_path / "a", model, fold_ids=(0,)), NullLogger())
    b = run_train(tiny(demo_es, tmp_path / "b", model, fold_ids=(0,)), NullLogger())
    assert metrics_of(a) == metrics_of(b)
    assert {"accuracy", "macro_f1", "recall_up", "sharpe"} <= set(a.folds[0]["test"])

    def kill(fold, epoch):
        if (fold, epoch) == (0, 0):
            raise Killed

    cfg = tiny(demo_es, tmp_path / "k", model, fold_ids=(0,))
    with pytest.raises(Killed):
        run_train(cfg, NullLogger(), on_epoch_end=kill)
    resumed = run_train(cfg, NullLogger())
    assert resumed.resumed and metrics_of(resumed) == metrics_of(a)


def test_an_epoch_logs_learning_and_evaluation_and_no_collection(demo_es, tmp_path, caplog):
    """A supervised model steps no env: its epochs log `time/learn_s` and `time/eval_s` and no
    collection phase, in MLflow's metrics and the progress line (the RL agents log all three:
    tests/test_train.py)."""
    logged = set()

    class Keys(NullLogger):
        def log_metrics(self, metrics, step=None):
            if "eval/val_sharpe" in metrics:  # an epoch's metrics
                logged.update(metrics)

    with caplog.at_level("INFO", logger="foxhunt.train.core"):
        run_train(tiny(demo_es, tmp_path, "tlob", fold_ids=(0,), epochs=1), Keys())
    assert {"time/learn_s", "time/eval_s", "time/epoch_s"} <= logged
    assert "time/collect_s" not in logged
    (line,) = [r.getMessage() for r in caplog.records if "epoch 1/1" in r.getMessage()]
    assert "(learn " in line and "collect" not in line, line


def test_a_served_checkpoint_trades_as_the_trainer_does(demo_es, tmp_path):
    """Policy.load of a TLOB checkpoint, given consecutive bars, orders what the trainer's
    policy orders with the same weights (rows with a full window inside the frame)."""

    cfg = tiny(demo_es, tmp_path, "tlob", fold_ids=(1,), epochs=1)
    res = run_train(cfg, NullLogger())
    got, want = served_and_trained_orders(
        demo_es, res.run_dir / "fold-1" / "best.safetensors",
        lambda data: SupervisedAgent(cfg.tlob, cfg.env, data, 0), lo=1000,
    )  # fmt: skip
    L = cfg.tlob.window
    assert (got[L - 1 :] == want[L - 1 :]).all()


@pytest.mark.parametrize("model", ["tlob", "cfc", "mamba2", "tft"])
def test_it_learns_the_planted_signal(demo_es, tmp_path, model):
    """At the demo's CPU sizes (foxhunt.train.demo), two epochs, costs on: the forecasts beat
    chance (accuracy over the three classes) on test, and trading them beats zero and a random
    policy. On the demo's second fold alone, to keep the suite within CI's time (bench_learning
    measures both folds over seeds: docs/performance.md)."""
    cfg = {"tlob": demo.TLOB, "cfc": demo.CFC, "mamba2": demo.MAMBA2, "tft": demo.TFT}[model]
    res = run_train(
        tiny(demo_es, tmp_path, model, epochs=2, fold_ids=(1,), **{model: cfg}), NullLogger()
    )
    print(res.summary())
    acc = np.mean([f["test"]["accuracy"] for f in res.folds])
    assert acc > 0.36, acc
    assert res.aggregate["test_sharpe"] > 3.0, res.aggregate
    assert res.aggregate["val_sharpe"] > res.aggregate["random_val_sharpe"] + 10.0


def test_tft_forecasts_quantiles_and_says_which_columns_it_reads(demo_es, tmp_path):
    """TFT's default target is the return's quantiles: its checkpoint carries the fold's label
    threshold and scale, a served checkpoint trades as the trainer does, and each fold leaves
    explain.json: a selection weight for each of the 50 columns, summing to 1."""
    from safetensors.torch import load_file

    cfg = tiny(demo_es, tmp_path, "tft", fold_ids=(1,), epochs=1)
    res = run_train(cfg, NullLogger())
    fold = res.run_dir / "fold-1"
    doc = json.loads((fold / "explain.json").read_text())
    w = doc["variable_importance"]
    assert len(w) == 50 and sum(w.values()) == pytest.approx(1.0, abs=1e-6)
    assert list(w.values()) == sorted(w.values(), reverse=True)
    assert res.folds[0]["explain"] == "fold-1/explain.json"
    assert {"target.theta", "target.scale"} <= set(load_file(str(fold / "best.safetensors")))
    got, want = served_and_trained_orders(
        demo_es, fold / "best.safetensors", lambda data: SupervisedAgent(cfg.tft, cfg.env, data, 0)
    )
    L = cfg.tft.window
    assert (got[L - 1 :] == want[L - 1 :]).all()
    assert len(set(want[:, 0].tolist())) > 1  # the forecasts are not all one class


def test_two_accumulated_micro_batches_step_as_one_batch_of_both():
    """accumulate = 2 at batch B takes the optimiser steps one batch of 2B takes (the same
    samples, the same order): same weights and statistics within float tolerance."""
    data = random_market(2000, 4)
    runs = {}
    for B, acc in ((64, 2), (128, 1)):
        cfg = TLOBConfig(**{**vars(TLOB_TINY), "batch_size": B, "accumulate": acc, "steps": 3})
        a = SupervisedAgent(cfg, EnvConfig(), data, seed=5)
        a.reset_fold(100, 1500, seed=2)
        a.begin_epoch(0, 1)
        torch.manual_seed(9)  # the same permutation of the samples
        a.learn()
        runs[B] = (a.flat.detach().clone(), a.read_stats())
    (p1, s1), (p2, s2) = runs[64], runs[128]
    torch.testing.assert_close(p1, p2, rtol=1e-4, atol=1e-5)  # Adam: lr-sized steps
    for k in ("losses/loss", "losses/grad_norm", "charts/train_accuracy"):
        assert s1[k] == pytest.approx(s2[k], rel=1e-5), k
