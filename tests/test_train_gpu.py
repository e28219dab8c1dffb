"""GPU-only checks (marker `gpu`; CI has no GPU, the device machine runs them):
the captured CUDA-graph path gives the same numbers as the eager path."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from foxhunt.train.agents.dqn import IN_DIM, DQNConfig, QNet, RainbowAgent
from foxhunt.train.env import EnvConfig
from marketdata import random_market
from trainruns import drive

pytestmark = pytest.mark.gpu


def gpu_data(n: int = 20_000, seed: int = 0):
    return random_market(n, seed, "cuda")


def run_epochs(
    capture: str,
    precision: str,
    distribution: str = "c51",
    epochs: int = 3,
    learn_steps: int = 24,
    compile_: bool = False,
    triton_target: bool | None = None,
    compile_mode: str = "default",
    forecast: bool | None = None,
    streams: bool | None = None,
    adv_in_target: bool | None = None,
):
    data = gpu_data()
    cfg = DQNConfig(
        hidden=(256, 128), envs=1024, collect_steps=16, learn_steps=learn_steps, batch_size=512,
        replay_capacity=32_768, capture=capture, compile=compile_, precision=precision,
        distribution=distribution, noisy=True, epsilon=0.0, n_step=3, dense_inputs=False,
        triton_target=triton_target, compile_mode=compile_mode,
    )  # fmt: skip
    env = EnvConfig(episode_bars=300)
    if forecast is not None:
        env = dataclasses.replace(env, forecast=forecast)
    agent = RainbowAgent(cfg, env, data, seed=7)
    if streams is not None:  # the compiled loss's pieces (dqn.NEXT_ON_STREAMS) on streams
        assert agent._loss == agent._streamed_loss, "the agent's loss is not the streamed one"
        if not streams:  # the same pieces on the step's own stream
            agent.side_streams = None
    if adv_in_target is not None:  # C51's target given the hidden layers (dqn.ADV_IN_TARGET)
        assert agent.net.adv_in_target == agent.target.adv_in_target == adv_in_target
    agent.ensure_optimizer_state()
    if capture == "graph":  # before the first fold is set, as foxhunt train does
        agent.capture()
    agent.reset_fold(1000, 15000, seed=3)
    stats = []
    for _ in range(epochs):
        agent.collect()
        agent.learn()
        stats.append(agent.read_stats())
    params = torch.cat([p.detach().flatten() for p in agent.params]).cpu()
    return stats, params, agent.replay.prio.cpu()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision,forecast", [("fp32", False), ("bf16", False), ("fp32", True)])
def test_captured_graphs_give_the_eager_numbers(precision, forecast):
    """C51: three epochs of collection and learning, bit for bit; with the forecast column too
    (the graphs read the column the fold's fit writes after the capture)."""
    s_e, p_e, pr_e = run_epochs("eager", precision, forecast=forecast)
    s_g, p_g, pr_g = run_epochs("graph", precision, forecast=forecast)
    assert s_e == s_g, (s_e, s_g)
    assert torch.equal(p_e, p_g)
    assert torch.equal(pr_e, pr_g)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_iqn_step_matches_eager_within_float_tolerance():
    """IQN multiplies the rows by the quantiles (8192 rows at B = 512): at such sizes cuBLAS may
    choose other kernels inside a capture (the anchor sees 1.6e-6 relative update differences
    in fp32), and training amplifies any difference through argmax and sampling. So one epoch
    with one learning step, compared within float tolerance."""
    s_e, p_e, pr_e = run_epochs("eager", "fp32", "iqn", epochs=1, learn_steps=1)
    s_g, p_g, pr_g = run_epochs("graph", "fp32", "iqn", epochs=1, learn_steps=1)
    for k in s_e[0]:
        assert s_g[0][k] == pytest.approx(s_e[0][k], rel=1e-4, abs=1e-6), k
    torch.testing.assert_close(p_g, p_e, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(pr_g, pr_e, rtol=1e-4, atol=1e-6)


def assert_compiled_step_matches_eager(forecast: bool | None = None, **compiled) -> None:
    """One epoch with one learning step (fp32), captured and compiled as `compiled` says,
    against the eager agent's: its statistics within float tolerance (inductor fuses
    differently), and its weights within float tolerance but for a few.

    Why a few: Adam's eps (1.5e-4) is far above most gradients at the first step, so such a
    weight moves by lr * g / eps, linear in g, and a gradient that is a sum nearly cancelling
    keeps few correct digits under another summation order; a ReLU at its boundary, which the
    two kernels may resolve either way, can change a whole row of them. On an H100 (2026-12-07,
    the forecast column on) 6 of 523,482 weights fell outside, at most 5e-6 apart, the two
    farthest in one row of the second layer. A wrong compiled step moves most weights by up to
    2 lr, a tie only a few, so: at most 1 in 10,000 outside float tolerance, none more than lr
    apart."""
    kw = dict(epochs=1, learn_steps=1, forecast=forecast)
    s_e, p_e, _ = run_epochs("eager", "fp32", **kw)
    s_c, p_c, _ = run_epochs("graph", "fp32", compile_=True, **kw, **compiled)
    for k in s_e[0]:
        assert s_c[0][k] == pytest.approx(s_e[0][k], rel=1e-4, abs=1e-6), k
    outside = int((~torch.isclose(p_c, p_e, rtol=1e-4, atol=1e-6)).sum())
    assert outside <= p_e.numel() // 10_000, f"{outside} of {p_e.numel()} weights differ"
    torch.testing.assert_close(p_c, p_e, rtol=0.0, atol=DQNConfig.lr)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("forecast", [False, True])
def test_compiled_and_captured_step_matches_eager_within_float_tolerance(forecast):
    """The GPU default path (torch.compile'd loss and update inside CUDA graphs): inductor
    fuses differently, so within float tolerance, one epoch with one learning step; with the
    forecast column and without."""
    assert_compiled_step_matches_eager(forecast)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_next_states_forwards_on_streams_give_the_one_stream_numbers(precision, monkeypatch):
    """dqn.NEXT_ON_STREAMS: the compiled loss runs as pieces, the next states' two forward
    passes each on a CUDA stream of its own beside the online network's forward. Three epochs,
    captured, give the numbers of the same pieces on the step's one stream, and of the streams
    launched without CUDA graphs, bit for bit: the streams change when kernels run, not what
    they compute. And one step (fp32) within float tolerance of the eager agent's, as the loss
    compiled as one graph is."""
    from foxhunt.train.agents import dqn

    monkeypatch.setattr(dqn, "NEXT_ON_STREAMS", True)
    if precision == "fp32":
        assert_compiled_step_matches_eager()
    kw = dict(compile_=True)
    s_s, p_s, pr_s = run_epochs("graph", precision, streams=True, **kw)
    for capture, streams in (("graph", False), ("eager", True)):
        s_o, p_o, pr_o = run_epochs(capture, precision, streams=streams, **kw)
        assert s_o == s_s, (capture, streams, s_o, s_s)
        assert torch.equal(p_o, p_s) and torch.equal(pr_o, pr_s), (capture, streams)
    assert s_s[-1]["losses/loss"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_c51_target_from_the_advantage_hidden_layers_matches_the_streams():
    """c51_triton.next_target given each network's value logits, advantage hidden layer and
    advantage layer (`QNet(..., parts="hidden")`, dqn.ADV_IN_TARGET) against the same networks'
    dueling streams, bf16 at the standard workload's batch: the kernel forms each action's
    logits in registers, rounded as the product and the streams' sum round theirs, so the
    targets agree wherever the double-Q choice is not a near tie."""
    from foxhunt.train.agents import c51_triton
    from foxhunt.train.agents.dqn import N_ACTIONS

    torch.manual_seed(0)
    cfg = DQNConfig(hidden=(512, 256), noisy=False, dense_inputs=False, precision="bf16")
    nets = [QNet(cfg, align=8, fold_mean=True, fused_relu=True).cuda() for _ in range(2)]
    for net in nets:
        net.adv_in_target = True
    B, N = 8192, cfg.atoms
    s2 = torch.randn(B, IN_DIM, device="cuda")
    R, disc = torch.randn(B, device="cuda"), torch.full((B, 1), 0.97, device="cuda")
    z = torch.linspace(-3, 3, N, device="cuda")
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        hidden = [net(s2, parts="hidden") for net in nets]
        streams = [net(s2, parts=True) for net in nets]
    assert len(hidden[0]) == 4 and hidden[0][1].dtype == torch.bfloat16
    got, got_clip = c51_triton.next_target(*hidden, R, disc, z)
    want, want_clip = c51_triton.next_target(*streams, R, disc, z)
    v, a = streams[0]
    ev = (torch.softmax((v + a).float(), -1) * z).sum(-1).sort(-1, descending=True).values
    # The two forms' products sum in another order: a logit rounded to bf16 now and then lands
    # on the other side of a rounding step (~4e-5 in the target), and the choice between two
    # actions closer than that can differ. Where the two best are 1e-3 apart, the choice holds.
    clear = (ev[:, 0] - ev[:, 1]) > 1e-3
    assert clear.float().mean() > 0.5 and a.shape[1] == N_ACTIONS
    torch.testing.assert_close(got[clear], want[clear], rtol=0, atol=2e-4)
    torch.testing.assert_close(got_clip[clear], want_clip[clear], rtol=0, atol=2e-4)
    off = (got - want).abs().amax((1, 2)) > 2e-4
    assert off.float().mean() < 0.01, off.float().mean()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_advantage_in_the_target_keeps_captured_runs_bit_identical(monkeypatch):
    """dqn.ADV_IN_TARGET: three epochs (bf16, noisy nets) captured and eager, bit for bit, and
    compiled with the next states' forwards on streams against one stream; the agent's networks
    hand the target their hidden layers."""
    from foxhunt.train.agents import dqn

    monkeypatch.setattr(dqn, "ADV_IN_TARGET", True)
    kw = dict(adv_in_target=True)
    s_e, p_e, pr_e = run_epochs("eager", "bf16", **kw)
    s_g, p_g, pr_g = run_epochs("graph", "bf16", **kw)
    assert s_e == s_g and torch.equal(p_e, p_g) and torch.equal(pr_e, pr_g)
    s_s, p_s, _ = run_epochs("graph", "bf16", compile_=True, streams=True, **kw)
    s_o, p_o, _ = run_epochs("graph", "bf16", compile_=True, streams=False, **kw)
    assert s_s == s_o and torch.equal(p_s, p_o)
    assert all(math.isfinite(st["losses/loss"]) for st in s_e + s_s), (s_e, s_s)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_steps_compiled_ahead_of_time_match_eager_and_reload(precision, tmp_path, monkeypatch):
    """compile_mode="aot" on the GPU (foxhunt.train.aot): noisy nets, C51's Triton target inside
    the package, inductor's combo kernels (dqn.AOT_COMBO_KERNELS), captured in CUDA graphs. One
    epoch with one learning step within float tolerance of the eager agent (fp32); three epochs
    of a second agent that loads the packages the first built, bit for bit against the first
    (both precisions)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    kw = dict(compile_=True, compile_mode="aot")
    if precision == "fp32":
        assert_compiled_step_matches_eager(compile_mode="aot")
    built = run_epochs("graph", precision, **kw)
    assert len(list((tmp_path / "foxhunt-aot").glob("*.pt2"))) == 2 + (precision == "fp32") * 2
    loaded = run_epochs("graph", precision, **kw)
    assert built[0] == loaded[0]
    assert torch.equal(built[1], loaded[1]) and torch.equal(built[2], loaded[2])
    assert built[0][-1]["losses/loss"] > 0


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_steps_compiled_ahead_of_time_without_combo_kernels_match_eager(tmp_path, monkeypatch):
    """dqn.AOT_COMBO_KERNELS off (bench_train's `-nocombo`): the packages built without
    inductor's combo kernels give the eager step's numbers to float tolerance (fp32, one epoch
    with one learning step), as the default packages with them do
    (`test_steps_compiled_ahead_of_time_match_eager_and_reload`). Written the other way round, with
    them on, this test passed on an H100 (2026-12-05), and they became the default."""
    from foxhunt.train.agents import dqn

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(dqn, "AOT_COMBO_KERNELS", False)
    assert_compiled_step_matches_eager(compile_mode="aot")
    assert len(list((tmp_path / "foxhunt-aot").glob("*.pt2"))) == 2  # learning, collection


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_triton_c51_target_computes_the_torch_forms_numbers(dtype):
    """c51_triton.next_target against dqn.c51_next_target (the torch form, itself tested
    against Bellemare et al.'s projection), given the logits or the dueling streams (value and
    advantage, the advantage a view with the heads' padded row stride): the same targets to
    float rounding on every sample whose best two actions' expected values are not within
    float rounding of each other, and on the others the target of one of those two; targets
    inside and outside the support, and at the standard batch."""
    from foxhunt.train.agents import c51_triton
    from foxhunt.train.agents.dqn import c51_next_target, expected_q, project_c51

    g = torch.Generator("cuda").manual_seed(0)
    for B, A, N in ((8192, 30, 51), (1000, 30, 51), (77, 5, 11)):

        def streams(B=B, A=A, N=N):
            pad = torch.randn(B, A * N + 6, device="cuda", generator=g, dtype=dtype) * 3
            v = torch.randn(B, N + 5, device="cuda", generator=g).to(dtype)[:, None, :N]
            return v, pad[:, : A * N].view(B, A, N)  # a view with the heads' row stride

        on, tg = streams(), streams()
        on2, tg2 = on[0] + on[1], tg[0] + tg[1]  # the logits, as torch adds the streams
        R = torch.randn(B, device="cuda", generator=g) * 0.7
        R[:5] = torch.tensor([5.0, -5.0, 0.0, 1.0, -1.0])  # wholly or exactly at the ends
        disc = torch.rand(B, 1, device="cuda", generator=g)
        z = torch.linspace(-1.0, 1.0, N, device="cuda")
        ref, ref_clip = c51_next_target(on2, tg2, R, disc, z)
        # The target of the runner-up action, for samples whose best two are a near tie.
        top = expected_q(on2, z, "c51").topk(2, -1)
        near = (top.values[:, 0] - top.values[:, 1]) < 1e-5
        p2 = torch.softmax(tg2.float().gather(1, top.indices[:, 1:, None].expand(-1, -1, N)), -1)
        alt, _ = project_c51(p2, R[:, None], disc, z)
        assert near.float().mean() < 1e-3
        for given in ((on2, tg2), (on, tg)):
            target, clip = c51_triton.next_target(*given, R, disc, z)
            assert target.shape == ref.shape and clip.shape == ref_clip.shape
            same = ((target - ref).abs() <= 1e-5).all(-1)[:, 0]
            other = near & ((target - alt).abs() <= 1e-5).all(-1)[:, 0]
            assert bool((same | other).all()), (~(same | other)).nonzero()[:5]
            torch.testing.assert_close(clip[same], ref_clip[same], rtol=0, atol=1e-5)
            torch.testing.assert_close(target.sum(-1), torch.ones(B, 1, device="cuda"),
                                       rtol=0, atol=1e-5)  # fmt: skip
            assert clip[0].item() == pytest.approx(1.0) and clip[1].item() == pytest.approx(1.0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_triton_c51_target_reads_a_real_action_where_the_online_logits_are_nan():
    """Online logits of NaN (what a capture's warm-up on an empty replay computes) leave the
    choice undefined, but the target must still be one real action's projection: a choice
    past the 30 actions would read the next row (here a row of other values) or past the
    tensor's end."""
    from foxhunt.train.agents import c51_triton
    from foxhunt.train.agents.dqn import project_c51

    g = torch.Generator("cuda").manual_seed(0)
    B, A, N = 64, 30, 51
    on = torch.full((B, A * N + 6), float("nan"), device="cuda")[:, : A * N].view(B, A, N)
    tg = torch.randn(B, A * N + 6, device="cuda", generator=g)[:, : A * N].view(B, A, N)
    R = torch.randn(B, device="cuda", generator=g) * 0.3
    disc = torch.full((B, 1), 0.9, device="cuda")
    z = torch.linspace(-1.0, 1.0, N, device="cuda")
    target, _ = c51_triton.next_target(on, tg, R, disc, z)
    each = torch.stack([project_c51(torch.softmax(tg[:, k : k + 1], -1), R[:, None], disc, z)[0]
                        for k in range(A)], 1)  # [B, A, 1, N]  # fmt: skip
    close = ((each - target[:, None]).abs() <= 1e-5).all(-1)[..., 0]  # [B, A]
    assert bool(close.any(1).all()), (~close.any(1)).nonzero()[:5]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_triton_c51_target_trains_as_the_torch_form_within_float_tolerance():
    """One epoch with one learning step, the agent with the fused target against the torch
    form (as the compiled check above)."""
    s_t, p_t, _ = run_epochs("eager", "fp32", epochs=1, learn_steps=1)
    s_r, p_r, _ = run_epochs("eager", "fp32", epochs=1, learn_steps=1, triton_target=False)
    for k in s_t[0]:
        assert s_r[0][k] == pytest.approx(s_t[0][k], rel=1e-4, abs=1e-6), k
    torch.testing.assert_close(p_r, p_t, rtol=1e-4, atol=1e-6)


def run_onpolicy(capture: str, model: str, precision: str = "fp32", epochs: int = 3,
                 compile_mode: str = "default"):  # fmt: skip
    """Three epochs of PPO or PQN (two rounds of rollout and update each) at small sizes:
    statistics per epoch and the final weights."""
    from foxhunt.train.agents.ppo import PPOAgent, PPOConfig
    from foxhunt.train.agents.pqn import PQNAgent, PQNConfig

    data = gpu_data()
    cls, agent_cls = (PPOConfig, PPOAgent) if model == "ppo" else (PQNConfig, PQNAgent)
    aot = compile_mode == "aot"  # which turns compile on
    cfg = cls(hidden=(256, 128), envs=1024, rollout_steps=16, rounds=2, capture=capture,
              precision=precision, compile=None if aot else False,
              compile_mode=compile_mode)  # fmt: skip
    agent = agent_cls(cfg, EnvConfig(episode_bars=300), data, seed=7)
    if capture == "graph":
        agent.capture()
    stats = drive(agent, [(1000, 15000)], [3], epochs)
    return stats, agent.flat.detach().cpu().clone()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model", ["ppo", "pqn"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_ppo_and_pqn_captured_graphs_give_the_eager_numbers(model, precision):
    """The rollout and the whole update captured: three epochs, bit for bit."""
    s_e, p_e = run_onpolicy("eager", model, precision)
    s_g, p_g = run_onpolicy("graph", model, precision)
    assert s_e == s_g, (s_e, s_g)
    assert torch.equal(p_e, p_g)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model", ["ppo", "pqn"])
def test_ppo_and_pqn_minibatches_compiled_ahead_of_time_match_eager_and_reload(
    model, tmp_path, monkeypatch
):
    """compile_mode="aot" on the GPU: the minibatch step's package run inside the captured
    update. One epoch within float tolerance of the eager agent (fp32; later rollouts would
    part where rounding flips an action), and three epochs of a second agent that loads the
    package the first built, bit for bit against the first."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    s_e, p_e = run_onpolicy("eager", model, epochs=1)
    s_a, p_a = run_onpolicy("graph", model, epochs=1, compile_mode="aot")
    for k in s_e[0]:
        assert s_a[0][k] == pytest.approx(s_e[0][k], rel=1e-3, abs=1e-5), k
    torch.testing.assert_close(p_a, p_e, rtol=1e-3, atol=1e-4)
    assert len(list((tmp_path / "foxhunt-aot").glob(f"{model}-minibatch-*.pt2"))) == 1
    built = run_onpolicy("graph", model, compile_mode="aot")
    loaded = run_onpolicy("graph", model, compile_mode="aot")
    assert built[0] == loaded[0] and torch.equal(built[1], loaded[1])
    assert built[0][-1]["losses/grad_norm"] > 0


def run_supervised(capture: str, model: str, precision: str = "fp32", compile_: bool = False,
                   epochs: int = 2, steps: int = 8, compile_mode: str = "default"):  # fmt: skip
    """Epochs of a supervised model (`steps` optimiser steps each) at small sizes: statistics
    per epoch, the final weights and the predictions of a range after each epoch (captured:
    the prediction graph replayed between the step's replays)."""
    from foxhunt.train.agents.supervised import SupervisedAgent
    from foxhunt.train.models.cfc import CfCConfig
    from foxhunt.train.models.mamba2 import Mamba2Config
    from foxhunt.train.models.tft import TFTConfig
    from foxhunt.train.models.tlob import TLOBConfig

    data = gpu_data()
    sizes = dict(window=32, batch_size=256, steps=steps, capture=capture, precision=precision,
                 compile=None if compile_mode == "aot" else compile_,
                 compile_mode=compile_mode)  # fmt: skip
    cfg = {"tlob": lambda: TLOBConfig(hidden=64, layers=2, **sizes),
           "cfc": lambda: CfCConfig(**sizes), "mamba2": lambda: Mamba2Config(**sizes),
           "tft": lambda: TFTConfig(dropout=0.0, **sizes)}[model]()  # fmt: skip
    agent = SupervisedAgent(cfg, EnvConfig(), data, seed=7)
    if capture == "graph":
        agent.capture()
    agent.reset_fold(1000, 15000, seed=3)
    stats, preds = [], []
    for e in range(epochs):
        agent.begin_epoch(e, epochs)
        agent.collect()
        agent.learn()
        stats.append(agent.read_stats())
        agent.prepare_eval(15000, 17000)
        preds.append(agent.pred[15000:17000].cpu())
    return stats, agent.flat.detach().cpu().clone(), torch.stack(preds)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model", ["tlob", "cfc"])
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_supervised_captured_step_gives_the_eager_numbers(model, precision):
    """The supervised training step (window gather, forward, loss, backward, clipping, AdamW)
    as one CUDA graph: two epochs, bit for bit, and the same predictions."""
    s_e, p_e, y_e = run_supervised("eager", model, precision)
    s_g, p_g, y_g = run_supervised("graph", model, precision)
    assert s_e == s_g, (s_e, s_g)
    assert torch.equal(p_e, p_g)
    assert torch.equal(y_e, y_g)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model", ["tlob", "cfc", "mamba2", "tft"])
def test_captured_prediction_gives_the_eager_outputs(model):
    """Evaluation's forward as a CUDA graph, replayed per piece of PREDICT_BATCH windows (the
    last one padded): the eager forward's outputs bit for bit, bf16 autocast, over two and a
    half pieces, and again after the weights change in place (the graph reads them live)."""
    from foxhunt.train.agents.supervised import PREDICT_BATCH, SupervisedAgent
    from foxhunt.train.models.cfc import CfCConfig
    from foxhunt.train.models.mamba2 import Mamba2Config
    from foxhunt.train.models.tft import TFTConfig
    from foxhunt.train.models.tlob import TLOBConfig

    small = dict(window=32, batch_size=256, steps=2, capture="eager", precision="bf16")
    cfg = {"tlob": lambda: TLOBConfig(hidden=64, layers=2, **small),
           "cfc": lambda: CfCConfig(**small),
           "mamba2": lambda: Mamba2Config(d_model=64, headdim=32, d_state=16, chunk=16, **small),
           "tft": lambda: TFTConfig(hidden=64, heads=4, **small)}[model]()  # fmt: skip
    agent = SupervisedAgent(cfg, EnvConfig(), gpu_data(), seed=7)
    agent.reset_fold(1000, 12000, seed=3)
    lo, hi = 12000, 12000 + 2 * PREDICT_BATCH + 500

    def predict():
        outs = []
        with agent._evaluating():
            for a in range(lo, hi, PREDICT_BATCH):
                t = torch.arange(a, min(a + PREDICT_BATCH, hi), device="cuda")
                outs.append(agent.forward_bars(t).clone())
        return torch.cat(outs)

    eager = predict()
    agent.capture_predict()
    assert "predict" in agent.graphs
    assert torch.equal(predict(), eager)
    with torch.no_grad():  # in place, as the optimiser and load_weights change them
        for p in agent.net.parameters():
            p.mul_(0.5)
    captured = predict()
    agent.graphs.pop("predict")
    assert torch.equal(captured, predict()) and not torch.equal(captured, eager)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model", ["tlob", "cfc"])
def test_supervised_compiled_and_captured_step_matches_eager_within_float_tolerance(model):
    """The GPU default (compiled loss inside the graph): three steps (the first at the warm-up's
    learning rate 0), fp32, within float tolerance: inductor fuses differently."""
    s_e, p_e, _ = run_supervised("eager", model, epochs=1, steps=3)
    s_c, p_c, _ = run_supervised("graph", model, compile_=True, epochs=1, steps=3)
    for k in ("losses/loss", "losses/grad_norm"):
        assert s_c[0][k] == pytest.approx(s_e[0][k], rel=1e-4, abs=1e-6), k
    torch.testing.assert_close(p_c, p_e, rtol=1e-4, atol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("model", ["tlob", "cfc", "mamba2", "tft"])
def test_supervised_steps_compiled_ahead_of_time_match_eager_and_reload(
    model, tmp_path, monkeypatch
):
    """compile_mode="aot" on the GPU: the training step's package captured in a CUDA graph,
    within float tolerance of the eager model (fp32), and a second model that loads the
    package the first built, bit for bit against the first (TFT without dropout, which the
    mode refuses)."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    s_e, p_e, _ = run_supervised("eager", model)
    built = run_supervised("graph", model, compile_mode="aot")
    loaded = run_supervised("graph", model, compile_mode="aot")
    assert len(list((tmp_path / "foxhunt-aot").glob(f"{model}-step-*.pt2"))) == 1
    assert built[0] == loaded[0] and torch.equal(built[1], loaded[1])
    for k in s_e[-1]:
        assert built[0][-1][k] == pytest.approx(s_e[-1][k], rel=1e-3, abs=1e-5), k
    assert_close_under_adam(built[1], p_e, lr=1e-3)
    assert torch.equal(built[2], loaded[2]), "the same predicted classes"


def assert_close_under_adam(got: torch.Tensor, want: torch.Tensor, lr: float) -> None:
    """Weights after Adam steps, within float tolerance of the reference but for at most one
    element in 10,000, and each of those within the learning rate. Adam's step is scale-free
    (m / sqrt(v)): where a gradient is near zero, its rounding can turn its sign, and that
    weight moves by up to lr the other way. TFT's package (its LSTM run as its cells) against
    eager (cuDNN's LSTM kernel): 6 of 1,317,005 weights outside rtol 1e-3 / atol 1e-4, the
    largest difference 6.6e-4 (H100, torch 2.11, 2026-12-06)."""
    off = ~torch.isclose(got, want, rtol=1e-3, atol=1e-4)
    assert off.sum().item() <= got.numel() // 10_000, f"{off.sum().item()} of {got.numel()}"
    assert (got - want).abs().max().item() <= lr


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_supervised_batch_from_the_device(tmp_path, monkeypatch):
    """Left to the device, the batch is the largest power of two up to max_batch whose step
    fits (an H200 fits 2048 windows of 32 bars easily); the next task takes it from the cache;
    a batch the user sets wins and nothing is probed."""
    from foxhunt.train.agents.supervised import SupervisedAgent
    from foxhunt.train.models.tlob import TLOBConfig

    monkeypatch.setenv("FOXHUNT_SIZE_CACHE", str(tmp_path / "sizes.json"))
    data = gpu_data()
    cfg = TLOBConfig(window=32, hidden=64, layers=2, max_batch=2048, capture="eager")
    a = SupervisedAgent(cfg, EnvConfig(), data, seed=0)
    rng_probed = torch.cuda.get_rng_state()
    assert (a.cfg.batch_size, a.sizing.source) == (2048, "probed")
    assert 0 < a.sizing.peak_bytes <= a.sizing.budget_bytes
    b = SupervisedAgent(cfg, EnvConfig(), data, seed=0)
    assert (b.cfg.batch_size, b.sizing.source) == (2048, "cache")
    # the probe drew from a generator of its own: the task's random stream is where it would
    # be without one
    assert torch.equal(torch.cuda.get_rng_state(), rng_probed)
    c = SupervisedAgent(TLOBConfig(window=32, hidden=64, layers=2, batch_size=512,
                                   capture="eager"), EnvConfig(), data, seed=0)  # fmt: skip
    assert c.cfg.batch_size == 512 and c.sizing is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_agent_sizes_from_the_device(tmp_path, monkeypatch):
    """A DQN with its envs, batch and replay left to the device: an H200 fits the GPU defaults
    (64/64) with the probe's peak inside the budget; the next task reads the cache; the chosen
    config trains."""
    from foxhunt.train.sizer import agent_sizes

    monkeypatch.setenv("FOXHUNT_SIZE_CACHE", str(tmp_path / "sizes.json"))
    data = gpu_data()
    cfg = DQNConfig(learn_steps=8, collect_steps=4, noisy=False, dense_inputs=False)
    got, chosen = agent_sizes(RainbowAgent, cfg, EnvConfig(), data)
    assert chosen.source == "probed" and 0 < chosen.peak_bytes <= chosen.budget_bytes
    if torch.cuda.get_device_properties(0).total_memory > 100 * 2**30:
        assert chosen.fraction == "64/64"
    _, cached = agent_sizes(RainbowAgent, cfg, EnvConfig(), data)
    assert cached.source == "cache" and cached.sizes == chosen.sizes
    agent = RainbowAgent(dataclasses.replace(got, capture="eager"), EnvConfig(), data, 0)
    agent.reset_fold(0, 10_000, seed=1)
    agent.collect()
    agent.learn()
    assert all(torch.isfinite(v).all() for v in agent.weights().values())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ensemble_members_on_streams_give_the_sequential_probabilities():
    """Every member's captured prediction replayed on a CUDA stream of its own: the eager
    one-after-another probabilities bit for bit (each graph captured on its own stream, so
    no two share cuBLAS's workspace; on one shared capture stream the H200 gave NaNs)."""
    from foxhunt.train.agents.supervised import PREDICT_BATCH
    from foxhunt.train.models.cfc import CfCConfig
    from foxhunt.train.models.ensemble import EnsembleAgent, EnsembleConfig
    from foxhunt.train.models.mamba2 import Mamba2Config
    from foxhunt.train.models.tft import TFTConfig
    from foxhunt.train.models.tlob import TLOBConfig

    small = dict(window=32, batch_size=256, steps=2, capture="eager", precision="bf16")
    cfg = EnsembleConfig(
        members=("tlob", "cfc", "mamba2", "tft"), seeds=2, capture="eager",
        tlob=TLOBConfig(hidden=64, layers=2, **small), cfc=CfCConfig(**small),
        mamba2=Mamba2Config(d_model=64, headdim=32, d_state=16, chunk=16, **small),
        tft=TFTConfig(hidden=64, heads=4, **small),
    )  # fmt: skip
    agent = EnsembleAgent(cfg, EnvConfig(), gpu_data(), seed=7)
    agent.reset_fold(1000, 12000, seed=3)
    lo, hi = 12000, 12000 + 2 * PREDICT_BATCH + 500
    eager = agent.member_predictions(lo, hi)
    for m in agent.members:
        m.capture_predict()
    for parallel in ("sequential", "streams"):
        agent.cfg = dataclasses.replace(agent.cfg, parallel=parallel)
        for _ in range(3):  # replays racing for a workspace would not agree every time
            got = agent.member_predictions(lo, hi)
            torch.cuda.synchronize()
            assert torch.isfinite(got).all(), parallel
            assert torch.equal(got, eager), parallel


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_wide_tft_predicts_in_pieces_that_fit(tmp_path, monkeypatch):
    """TFT at hidden 512, window 128 (its forward over the default 2,048 windows needs ~160 GB):
    the device chooses a smaller prediction piece, the batch is sized beside it (256 or more
    on an H200; on an H100, whose budget there is ~28 GiB, 128), and the captured step and
    prediction graphs train and evaluate without running out of memory."""
    from foxhunt.train.agents.supervised import BATCH_MIN, PREDICT_BATCH, SupervisedAgent
    from foxhunt.train.models.tft import TFTConfig

    monkeypatch.setenv("FOXHUNT_SIZE_CACHE", str(tmp_path / "sizes.json"))
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()  # the peak of this test, not of those before it
    cfg = TFTConfig(hidden=512, heads=4, window=128, steps=2, capture="graph", compile=False,
                    max_batch=512)  # fmt: skip
    agent = SupervisedAgent(cfg, EnvConfig(), gpu_data(), seed=0)
    assert 64 <= agent.predict_batch < PREDICT_BATCH and agent.sizing.size >= BATCH_MIN
    if torch.cuda.get_device_properties(0).total_memory > 100 * 2**30:
        assert agent.sizing.size >= 256
    agent.capture()
    agent.reset_fold(1000, 12000, seed=1)
    agent.begin_epoch(0, 1)
    agent.collect()
    agent.learn()
    agent.prepare_eval(12000, 16000)
    torch.cuda.synchronize()
    assert torch.isfinite(torch.tensor(agent.read_stats()["losses/loss"]))
    assert agent.pred[12000:16000].min() >= 0 and agent.pred[12000:16000].max() <= 2
    peak = torch.cuda.max_memory_allocated() / torch.cuda.get_device_properties(0).total_memory
    assert peak < 0.9
    del agent
    torch.cuda.empty_cache()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("compile_", [False, True])
def test_captured_evaluation_in_pieces_gives_the_sequential_walk(compile_):
    """1,024 pieces, the step captured as a CUDA graph and replayed over the passes, against
    one piece walked step by step: a policy that reads the whole portfolio and holds across the
    pieces. Compiled, against the one piece walked with the same compiled step (inductor may
    round the env's arithmetic otherwise than eager kernels)."""
    from foxhunt.train.evaluate import Evaluator
    from test_evaluate import COSTS, portfolio_rule

    data = gpu_data()
    score = torch.randn(data.n, generator=torch.Generator().manual_seed(4)).cuda()
    policy = portfolio_rule(score)
    walk = Evaluator(COSTS, data, 1, compile=compile_)
    r1, tr1 = (x.clone() for x in walk.run(policy, 1000, 15000, graph=compile_))
    pieces = Evaluator(COSTS, data, 1024, capture=True, compile=compile_)
    for _ in range(2):  # captured on the first run, replayed on the second
        r, tr = pieces.run(policy, 1000, 15000, graph=True)
        assert pieces.last_passes > 1
        assert torch.equal(r, r1) and torch.equal(tr, tr1)
        assert torch.equal(pieces.last_positions, walk.last_positions)


def aot_evaluation_walks(device: str, segments: int, n: int = 20_000):
    """A DQN trained two epochs (fp32, eager), then its greedy walk over bars
    [n - 5000, n - 1000) evaluated in `segments` pieces (captured on a GPU) three times: with
    the step uncompiled, then with it compiled ahead of time by one evaluator and loaded from
    the cache by the next. Returns the three (returns, trades, positions) and the packages in
    the cache."""
    from foxhunt.train.aot import cache_dir
    from foxhunt.train.evaluate import Evaluator

    data = random_market(n, 0, device)
    cfg = DQNConfig(
        hidden=(256, 128), envs=1024, collect_steps=16, learn_steps=24, batch_size=512,
        replay_capacity=32_768, capture="eager", precision="fp32", noisy=False, n_step=3,
        dense_inputs=False,
    )  # fmt: skip
    agent = RainbowAgent(cfg, EnvConfig(episode_bars=300), data, seed=7)
    agent.reset_fold(1000, n - 6000, seed=3)
    for _ in range(2):
        agent.collect()
        agent.learn()
    walks = []
    for compile_ in (False, "aot", "aot"):
        capture = device == "cuda"  # (a CPU run checks the helper itself)
        ev = Evaluator(EnvConfig(episode_bars=300), data, segments, capture, compile=compile_)
        ev.reserve(4000)
        r, f = ev.run(agent.greedy, n - 5000, n - 1000, graph=True)
        walks.append((r.cpu().clone(), f.cpu().clone(), ev.last_positions.cpu().clone()))
    return walks, sorted(cache_dir().glob("eval-RainbowAgent.greedy-*.pt2"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_evaluation_step_compiled_ahead_of_time_walks_as_the_uncompiled_one(
    tmp_path, monkeypatch
):
    """Evaluator(compile="aot") on the GPU (what `foxhunt train` builds for an agent whose
    steps are compiled ahead of time): a DQN's greedy walk in 1,024 captured pieces gives the
    uncompiled captured walk's positions and trades, its returns to float tolerance (fp32);
    the walk from the package another evaluator built gives the first's bit for bit."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    ((r0, f0, p0), (r1, f1, p1), (r2, f2, p2)), packages = aot_evaluation_walks("cuda", 1024)
    assert len(packages) == 1, "one package, built once and then loaded"
    assert torch.equal(r1, r2) and torch.equal(f1, f2) and torch.equal(p1, p2)
    assert torch.equal(p1, p0) and torch.equal(f1, f0)
    torch.testing.assert_close(r1, r0, rtol=1e-5, atol=1e-9)
    assert p0.abs().sum() > 0, "the policy holds positions"


NOISY = {"noisy": True, "epsilon": 0.0, "noise_per_env": True}  # per-env noise collecting
NOISY_SHARED = {"noisy": True, "epsilon": 0.0}  # one shared sample a collection step


def run_stacked(capture: str, precision: str, seeds=(7, 8, 9), epochs: int = 3, learn_steps=24,
                **kw):  # fmt: skip
    """Agents of one configuration stacked (foxhunt.train.agents.dqn_stacked), epsilon-greedy
    C51 with 3-step returns (or `kw` over it): each agent's statistics per epoch and final
    weights."""
    from foxhunt.train.cohort import Cohort

    data = gpu_data()
    cfg = DQNConfig(
        hidden=(256, 128), envs=1024, collect_steps=16, learn_steps=learn_steps, batch_size=512,
        replay_capacity=32_768, capture=capture, precision=precision, n_step=3,
        **({"noisy": False, "dense_inputs": False, "compile": False} | kw),
    )  # fmt: skip
    agents = [RainbowAgent(cfg, EnvConfig(episode_bars=300), data, seed=s) for s in seeds]
    cohort = Cohort(agents, stacked=len(seeds) > 1)
    if capture == "graph":
        cohort.capture()
    cohort.reset_fold(1000, 15000, [3 + s for s in seeds])
    stats = []
    for e in range(epochs):
        cohort.begin_epoch(e, epochs)
        cohort.train_epoch()
        stats.append(cohort.read_stats())
    return stats, [a.flat.detach().cpu().clone() for a in agents]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("kw", [{}, NOISY, NOISY_SHARED], ids=["epsilon", "noisy", "noisy-shared"])
def test_stacked_agents_captured_give_the_eager_numbers(precision, kw):
    """Three stacked agents, three epochs: captured as eager, bit for bit."""
    s_e, p_e = run_stacked("eager", precision, **kw)
    s_g, p_g = run_stacked("graph", precision, **kw)
    assert s_e == s_g
    assert all(torch.equal(a, b) for a, b in zip(p_e, p_g, strict=True))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kw", [{}, NOISY, NOISY_SHARED], ids=["epsilon", "noisy", "noisy-shared"])
def test_stacked_agents_match_each_alone_within_float_tolerance(kw):
    """On a GPU the stacked kernels are other (wider) ones than a lone agent's, so each agent
    matches its lone self to float tolerance (bit for bit on a CPU: tests/test_cohort.py); one
    epoch with one learning step, as the compiled check above."""
    stacked, w_stacked = run_stacked("eager", "fp32", epochs=1, learn_steps=1, **kw)
    for i, s in enumerate((7, 8, 9)):
        alone, w_alone = run_stacked("eager", "fp32", seeds=(s,), epochs=1, learn_steps=1, **kw)
        for k in alone[0][0]:
            assert stacked[0][i][k] == pytest.approx(alone[0][0][k], rel=1e-4, abs=1e-6), k
        torch.testing.assert_close(w_stacked[i], w_alone[0], rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("kw", [{}, NOISY_SHARED], ids=["epsilon", "noisy-shared"])
def test_stacked_agents_compiled_match_each_alone_within_float_tolerance(kw):
    """Compiled and captured, as `foxhunt train --seeds` runs them: the stack's collection and
    learning steps compiled under vmap (C51's Triton target through its vmap rule) against
    each agent compiled alone, after one epoch of one learning step."""
    kw = kw | {"compile": True}
    stacked, w_stacked = run_stacked("graph", "fp32", seeds=(7, 8), epochs=1, learn_steps=1, **kw)
    for i, s in enumerate((7, 8)):
        alone, w_alone = run_stacked("graph", "fp32", seeds=(s,), epochs=1, learn_steps=1, **kw)
        for k in alone[0][0]:
            if k.startswith("charts/collect_"):
                # Compiled, the stacked and the lone forward round otherwise, and where two
                # actions' values tie to rounding one of the epoch's 16,384 decisions may go the
                # other way (seen once, noisy nets: one env-step flat rather than long): the
                # shares of directions within two decisions, the reward within two bars' returns.
                assert abs(stacked[0][i][k] - alone[0][0][k]) <= 2 / (1024 * 16) * (
                    1e4 * 2e-3 if k.endswith("reward_bps") else 1), k  # fmt: skip
                continue
            assert stacked[0][i][k] == pytest.approx(alone[0][0][k], rel=1e-4, abs=1e-6), k
        torch.testing.assert_close(w_stacked[i], w_alone[0], rtol=1e-4, atol=1e-6)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_the_c51_target_kernel_under_vmap_is_each_batch_s_own():
    """c51_triton's vmap rule (the stacked agents' step): K batches as one of K * B samples
    give what K calls of the kernel give, bit for bit, for streams of either dtype."""
    from torch.func import vmap

    from foxhunt.train.agents import c51_triton

    g = torch.Generator("cuda").manual_seed(5)
    K, B, A, N = 3, 64, 30, 51
    z = torch.linspace(-4, 4, N, device="cuda")
    for dtype in (torch.float32, torch.bfloat16):
        v_on, v_tg = (torch.randn(K, B, 1, N, device="cuda", generator=g).to(dtype)
                      for _ in range(2))  # fmt: skip
        a_on, a_tg = (torch.randn(K, B, A, N, device="cuda", generator=g).to(dtype)
                      for _ in range(2))  # fmt: skip
        R = torch.randn(K, B, device="cuda", generator=g)
        disc = torch.rand(K, B, 1, device="cuda", generator=g)

        def one(von, aon, vtg, atg, r, d):
            return c51_triton.next_target((von, aon), (vtg, atg), r, d, z)

        out, clip = vmap(one)(v_on, a_on, v_tg, a_tg, R, disc)
        for k in range(K):
            o, c = one(v_on[k], a_on[k], v_tg[k], a_tg[k], R[k], disc[k])
            assert torch.equal(out[k], o) and torch.equal(clip[k], c), (dtype, k)


def small_standard_task(tmp_path, dense_inputs: bool):
    """A small `foxhunt train` task on the GPU: the standard market of 60,000 bars published as
    an fxcache with its folds, the first fold's id, and a DQN config of small sizes whose
    network (epsilon-greedy) has a parameter count that is not a multiple of 4 (81,101 with
    dense inputs)."""
    import json

    from foxhunt.bench.workload import standard_fxcache

    folds = standard_fxcache(tmp_path / "data", 60_000)
    fold = json.loads(folds.read_text())["folds"][0]["fold"]
    dqn = DQNConfig(
        hidden=(128, 64), head_hidden=32, envs=1024, collect_steps=16, learn_steps=16,
        batch_size=512, replay_capacity=32_768, n_step=3, noisy=False, dense_inputs=dense_inputs,
    )  # fmt: skip
    return folds, fold, dqn


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("mode", ["auto", "default"])
def test_a_compiled_task_killed_mid_fold_resumes_to_the_uninterrupted_results(tmp_path, mode):
    """`foxhunt train`'s GPU path end to end: compiled and captured steps (by torch.compile,
    the default; with compile_mode auto, ahead of time), the compiled evaluation
    (`compile_eval`), resume files written through page-locked memory. Killed after its second
    epoch and run again, a task ends with the metrics of one never killed."""
    from foxhunt.train.core import TrainConfig, run_train
    from foxhunt.train.tracking import NullLogger
    from trainruns import Killed, metrics_of

    folds, fold, dqn = small_standard_task(tmp_path, dense_inputs=False)
    dqn = dataclasses.replace(dqn, compile_mode=mode)

    def cfg(out: str) -> TrainConfig:
        return TrainConfig(
            folds=folds, cache=tmp_path / "data" / "fxcache", out=tmp_path / out, epochs=3,
            fold_ids=(fold,), device="cuda", tracking="none", baselines=False, run_id="r",
            compile_eval=True, dqn=dqn,
        )  # fmt: skip

    full = run_train(cfg("full"), NullLogger())

    def kill(fold: int, epoch: int) -> None:
        if epoch == 1:
            raise Killed

    with pytest.raises(Killed):
        run_train(cfg("killed"), NullLogger(), on_epoch_end=kill)

    class Params(NullLogger):
        def start_task(self, name, params, tags, resume_id=None, dataset=None) -> str:
            self.params = params
            return ""

    logger = Params()
    resumed = run_train(cfg("killed"), logger)
    assert resumed.resumed
    assert metrics_of(resumed) == metrics_of(full)
    # The params name the mode that ran (auto: ahead of time, the device having g++).
    assert logger.params["dqn"]["compile_mode"] == ("aot" if mode == "auto" else "default")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_seeds_compiled_ahead_of_time_train_on_streams_as_each_alone(tmp_path, monkeypatch):
    """A DQN task's seeds side by side in one process on a GPU with compile_mode auto: their
    steps compiled ahead of time, so each agent on a CUDA stream of its own, not stacked
    (stack_seeds auto); each seed's evaluation compiled ahead of time too. Each seed ends with
    the metrics of its own task trained alone, bit for bit (the same packages, each agent's
    own kernels)."""
    from foxhunt.train.core import TrainConfig, run_train, train_seeds
    from foxhunt.train.tracking import NullLogger
    from trainruns import metrics_of, spy_training

    folds, fold, dqn = small_standard_task(tmp_path, dense_inputs=True)
    dqn = dataclasses.replace(dqn, compile_mode="auto")

    def cfg(out: str, **kw) -> TrainConfig:
        return TrainConfig(
            folds=folds, cache=tmp_path / "data" / "fxcache", out=tmp_path / out, epochs=2,
            fold_ids=(fold,), device="cuda", tracking="none", baselines=False, dqn=dqn, **kw,
        )  # fmt: skip

    kinds, stacks = spy_training(monkeypatch)
    together = train_seeds(cfg("together", seeds=(0, 1)))
    assert not stacks and kinds and all(k == ("RainbowAgent", 2) for k in kinds), kinds
    for seed, res in zip((0, 1), together, strict=True):
        alone = run_train(cfg(f"alone{seed}", seed=seed), NullLogger())
        assert metrics_of(res) == metrics_of(alone), seed
    assert metrics_of(together[0]) != metrics_of(together[1])  # two seeds, two policies


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_seeds_side_by_side_evaluate_with_their_steps_compiled_by_default(tmp_path):
    """The pipeline's default on a GPU: a DQN task's seeds stacked into one agent, and each
    seed's evaluation compiled (`compile_eval` left at None: on for the RL models). Every seed
    ends with finite metrics of its own, and its results record the compiled evaluation. The
    network has 81,101 parameters, a count that is not a multiple of 4 (as the demo's 160,493):
    rows of the stack that wide put seed 1's weights 4 bytes past the alignment its compiled
    evaluation step assumed, which faulted (dqn_stacked.ROW_ALIGN)."""
    import json
    import math

    from foxhunt.train.core import TrainConfig, train_seeds

    folds, fold, dqn = small_standard_task(tmp_path, dense_inputs=True)
    results = train_seeds(TrainConfig(
        folds=folds, cache=tmp_path / "data" / "fxcache", out=tmp_path / "runs", epochs=2,
        fold_ids=(fold,), device="cuda", tracking="none", baselines=False, seeds=(0, 1), dqn=dqn,
    ))  # fmt: skip
    tests = []
    for res in results:
        doc = json.loads((res.run_dir / "results.json").read_text())
        assert doc["config"]["compile_eval"] is True
        (f,) = res.folds
        assert all(math.isfinite(v) for part in ("val", "test") for v in f[part].values())
        tests.append(f["test"])
    assert tests[0] != tests[1]  # two seeds, two policies


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_stacked_seeds_resumed_apart_meet_and_train_stacked(tmp_path, monkeypatch):
    """Seeds on a GPU (compiled and captured, each seed's evaluation compiled), killed when seed
    0's first epoch was saved and seed 1's was not. Run again, the task stacks their agents,
    seed 1 trains its first epoch alone, its own compiled steps over its rows of the stack's
    buffers, while seed 0 waits, and the two then train stacked. The network has 81,101
    parameters (not a multiple of 4), so that rows as wide as that would start seed 1's
    weights 4 bytes past the alignment compiled code assumes (dqn_stacked.ROW_ALIGN). Both
    seeds end with finite metrics."""
    import math

    from foxhunt.train import core
    from trainruns import Killed, spy_training

    kinds, stacks = spy_training(monkeypatch)
    folds, fold, dqn = small_standard_task(tmp_path, dense_inputs=True)
    cfg = core.TrainConfig(
        folds=folds, cache=tmp_path / "data" / "fxcache", out=tmp_path / "runs", epochs=2,
        fold_ids=(fold,), device="cuda", tracking="none", baselines=False, run_id="r",
        seeds=(0, 1), dqn=dqn,
    )  # fmt: skip

    def kill(fold: int, epoch: int) -> None:
        raise Killed  # at the first epoch's end: seed 0's is saved, seed 1's is not

    with pytest.raises(Killed):
        core.train_seeds(cfg, on_epoch_end=kill)
    kinds.clear()
    stacks.clear()
    results = core.train_seeds(cfg)
    assert stacks == [2] and kinds == [("RainbowAgent", 1), ("StackedRainbow", 1)], kinds
    assert [r.resumed for r in results] == [True, False]
    for res in results:
        (f,) = res.folds
        assert all(math.isfinite(v) for part in ("val", "test") for v in f[part].values())
