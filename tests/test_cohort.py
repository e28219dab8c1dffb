"""Agents trained side by side in one process (foxhunt.train.cohort): each trains exactly as it
would alone with the same seed, because every draw comes from its own generator. And what every
agent's optimiser and compiled code do alone: weight decay, Adam's step (`common.adam_step`),
one graph for each compiled update, AOTAutograd's cache for graphs with a custom Function."""

from __future__ import annotations

import dataclasses
import functools

import pytest
import torch

from foxhunt.train.agents import dqn_stacked
from foxhunt.train.agents.common import compiled, ensure_adam_state
from foxhunt.train.agents.dqn import DQNConfig, RainbowAgent
from foxhunt.train.agents.ppo import PPOAgent, PPOConfig
from foxhunt.train.agents.pqn import PQNAgent, PQNConfig
from foxhunt.train.cohort import Cohort
from foxhunt.train.env import EnvConfig
from marketdata import random_market
from trainruns import drive

SMALL_DQN = dict(envs=64, collect_steps=8, learn_steps=6, batch_size=32, replay_capacity=2048,
                 hidden=(32, 32))  # fmt: skip
MODELS = {
    # epsilon-greedy (the default) and noisy nets drawn per env: every kind of draw
    "dqn": (RainbowAgent, [DQNConfig(**SMALL_DQN),
                           DQNConfig(**SMALL_DQN, noisy=True, epsilon=0.0, noise_per_env=True)]),
    "dqn-iqn": (RainbowAgent, [DQNConfig(**SMALL_DQN, distribution="iqn"),
                               DQNConfig(**SMALL_DQN, distribution="iqn", lr=3e-4)]),
    "ppo": (PPOAgent, [PPOConfig(envs=64, rollout_steps=8, hidden=(32, 32))] * 2),
    "pqn": (PQNAgent, [PQNConfig(envs=64, rollout_steps=8, hidden=(32, 32))] * 2),
}  # fmt: skip
FOLDS = [(100, 2000), (600, 2500)]
SEEDS = [11, 12]


def train_alone(cls, cfg, data, seed: int, fold_seeds: list[int]):
    a = cls(cfg, EnvConfig(episode_bars=200), data, seed=seed)
    stats = drive(a, FOLDS, fold_seeds)
    return stats, torch.cat([p.detach().flatten() for p in a.params])


def train_together(cohort: Cohort, seeds: list[int]) -> list[list[dict]]:
    """The cohort's agents over FOLDS, two epochs each (fold k seeded seed * 10 + k, as
    train_alone): each agent's statistics per epoch."""
    together = [[] for _ in seeds]
    for k, (lo, hi) in enumerate(FOLDS):
        cohort.reset_fold(lo, hi, [s * 10 + k for s in seeds])
        for e in range(2):
            cohort.begin_epoch(e, 2)
            cohort.train_epoch()
            for i, st in enumerate(cohort.read_stats()):
                together[i].append(st)
    return together


@pytest.mark.parametrize("model", list(MODELS))
def test_agents_side_by_side_train_as_each_would_alone(model):
    """Two agents (two seeds; for DQN also two configurations) in a cohort: each one's
    statistics every epoch and its final weights equal training it alone, bit for bit."""
    cls, cfgs = MODELS[model]
    data = random_market(3000, 0)
    cohort = Cohort([cls(c, EnvConfig(episode_bars=200), data, seed=s)
                     for c, s in zip(cfgs, SEEDS, strict=True)])  # fmt: skip
    together = train_together(cohort, SEEDS)
    for i, (cfg, seed) in enumerate(zip(cfgs, SEEDS, strict=True)):
        stats, params = train_alone(cls, cfg, data, seed, [seed * 10 + k for k in range(2)])
        assert together[i] == stats, (model, i)
        assert torch.equal(torch.cat([p.detach().flatten() for p in cohort.agents[i].params]),
                           params)  # fmt: skip
    # and the two agents did not train alike
    assert together[0] != together[1]


STACKED = {
    "c51": DQNConfig(**SMALL_DQN),
    "dense-nstep-cql-online-decay": DQNConfig(**SMALL_DQN, dense_inputs=True, n_step=3,
                                              cql_alpha=0.1, act_with="online",
                                              weight_decay=0.5),
    # noisy nets: drawn per env while collecting, and one shared sample with dense inputs
    "noisy-per-env": DQNConfig(**SMALL_DQN, noisy=True, epsilon=0.0, noise_per_env=True),
    "noisy-dense": DQNConfig(**SMALL_DQN, noisy=True, epsilon=0.0, noise_per_env=False,
                             dense_inputs=True),
}  # fmt: skip
# (`distribution="mean"` stacks too, but not bit for bit on a CPU: its value layer is one
# output wide, and a batched product that narrow runs another kernel than a lone one.)


GATHERS = {"backward": False, "compiled-grad-gather": True}  # dqn_stacked.COMPILED_GRAD_GATHER


@pytest.mark.parametrize("gather", list(GATHERS))
@pytest.mark.parametrize("variant", list(STACKED))
def test_stacked_agents_train_as_each_would_alone(variant, gather, monkeypatch):
    """Three DQN agents stacked into one (foxhunt.train.agents.dqn_stacked: each step the lone
    agent's code under vmap): each one's statistics every epoch and final weights equal
    training it alone, bit for bit, with the stack's gradient accumulated by the backward or
    taken by autograd.grad and gathered at once. At one thread: with more, a CPU splits a wide
    matrix product or sum between its threads otherwise than a narrow one, and the last bits
    differ."""
    monkeypatch.setattr(dqn_stacked, "COMPILED_GRAD_GATHER", GATHERS[gather])
    cfg, seeds = STACKED[variant], [11, 12, 13]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = random_market(3000, 0)
        cohort = Cohort([RainbowAgent(cfg, EnvConfig(episode_bars=200), data, seed=s)
                         for s in seeds], stacked=True)  # fmt: skip
        together = train_together(cohort, seeds)
        for i, seed in enumerate(seeds):
            stats, params = train_alone(RainbowAgent, cfg, data, seed,
                                        [seed * 10 + k for k in range(2)])  # fmt: skip
            assert together[i] == stats, (variant, i)
            assert torch.equal(torch.cat([p.detach().flatten()
                                          for p in cohort.agents[i].params]), params)  # fmt: skip
        assert together[0] != together[1]
    finally:
        torch.set_num_threads(threads)


def test_stacked_agents_weights_lie_as_a_lone_agent_s_do():
    """Each stacked agent's weights, its target's, its Adam moments and its noisy layers'
    samples start 64 bytes or a multiple of them into the stack's buffers (aligned as a lone
    agent's own buffers are), its parameters and noise buffers at a lone agent's offsets in
    them: the compiled code that every agent's evaluation step (and an agent's own steps,
    where it trains alone later) shares assumes the alignment its inputs had when compiled.
    Rows as wide as the parameter count put agent 1's weights 4 bytes past it (the demo's
    network), and the compiled step faulted on an H200."""
    data = random_market(3000, 0)
    cfg = DQNConfig(**SMALL_DQN | {"hidden": (32, 16), "envs": 63}, dense_inputs=True,
                    noisy=True)  # fmt: skip
    lone = RainbowAgent(cfg, EnvConfig(episode_bars=200), data, seed=1)
    offsets = [p.data_ptr() - lone.flat.data_ptr() for p in lone.params]

    def noise_at(a):  # where each noisy layer's sample lies in the agent's noise buffer
        return [b.data_ptr() - a.noise_now.data_ptr() for net in (a.net, a.target)
                for m in net.noisy_layers() for b in (m.eps_in, m.eps_out)]  # fmt: skip

    noise_offsets = noise_at(lone)
    assert lone.noise_now.numel() % 4 != 0 and noise_offsets
    assert lone.flat.numel() % 4 != 0  # rows this wide would not start aligned
    cohort = Cohort([RainbowAgent(cfg, EnvConfig(episode_bars=200), data, seed=s)
                     for s in (1, 2, 3)], stacked=True)  # fmt: skip
    for a in cohort.agents:
        moments = [v for k, v in a.opt.state[a.flat].items() if k != "step"]
        for t in (a.flat, a.target_flat, *moments):  # views of the stack's [K, P'] buffers
            assert t.storage_offset() * t.element_size() % 64 == 0
            assert t.numel() == lone.flat.numel()
        assert [p.data_ptr() - a.flat.data_ptr() for p in a.params] == offsets
        assert a.noise_now.storage_offset() * a.noise_now.element_size() % 64 == 0
        assert noise_at(a) == noise_offsets
        for m in a.net.noisy_layers():  # per-env noise, each agent's own buffers
            for b in (m.row_in, m.row_out):
                assert b.storage_offset() * b.element_size() % 64 == 0 and b.is_contiguous()


@pytest.mark.parametrize("gather", list(GATHERS))
def test_stacked_agents_compiled_train_as_uncompiled(gather, monkeypatch):
    """The stack as a GPU runs it (compiled: the collection step, the losses and the update with
    each agent's priorities and statistics, each under vmap; with `compiled-grad-gather` the
    gradient's gather too), on the CPU against the uncompiled stack: one epoch of two agents
    with the GPU defaults' exploration (noisy nets, a block's noise drawn at its start, dense
    inputs), the same statistics and weights to float tolerance. Where two actions' values tie
    to rounding a collection decision may go the other way: the collection's shares within two
    of the epoch's decisions."""
    monkeypatch.setattr(dqn_stacked, "COMPILED_GRAD_GATHER", GATHERS[gather])
    cfg = DQNConfig(**SMALL_DQN, noisy=True, epsilon=0.0, noise_per_env=False, dense_inputs=True)
    data = random_market(3000, 0)
    runs = []
    for compile_ in (False, True):
        c = dataclasses.replace(cfg, compile=compile_)
        cohort = Cohort([RainbowAgent(c, EnvConfig(episode_bars=200), data, seed=s)
                         for s in (11, 12)], stacked=True)  # fmt: skip
        cohort.reset_fold(100, 2000, [1, 2])
        cohort.begin_epoch(0, 1)
        cohort.train_epoch()
        runs.append((cohort.read_stats(), [a.flat.detach().clone() for a in cohort.agents]))
    (plain, w_plain), (comp, w_comp) = runs
    decisions = SMALL_DQN["envs"] * SMALL_DQN["collect_steps"]
    for a, b in zip(plain, comp, strict=True):
        for k in a:
            if k.startswith("charts/collect_"):
                assert abs(a[k] - b[k]) <= 2 / decisions * (20 if k.endswith("bps") else 1), k
            else:
                assert b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k
    for a, b in zip(w_plain, w_comp, strict=True):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-6)
    assert plain[0] != plain[1]


def test_stacked_agents_snapshot_and_restore_each_on_its_own():
    """A stacked agent's resume state is its own slice: restoring one agent's snapshot after
    more training brings back its statistics and weights and leaves the other agent's alone."""
    data = random_market(3000, 0)
    agents = [RainbowAgent(DQNConfig(**SMALL_DQN), EnvConfig(episode_bars=200), data, seed=s)
              for s in (1, 2)]  # fmt: skip
    cohort = Cohort(agents, stacked=True)
    cohort.reset_fold(100, 2000, [1, 2])
    cohort.train_epoch()
    saved = agents[0].snapshot()
    other = agents[1].flat.detach().clone()
    cohort.train_epoch()
    moved = agents[1].flat.detach().clone()
    assert not torch.equal(moved, other)
    agents[0].restore(saved)
    now = agents[0].snapshot()
    assert all(torch.equal(now[k], v) for k, v in saved.items() if k != "rng")
    assert torch.equal(agents[1].flat.detach(), moved)


@pytest.mark.parametrize("parts", ["plain", "compiled"])
def test_the_stacked_sampler_draws_what_each_replay_would(parts):
    """sample_rows (the GPU's one scan over all the agents' priorities) against Replay.sample
    on each row: the same slots and weights, with empty slots and a replay not yet full; its
    work around the scan and the search as the stack runs it uncompiled, and compiled (as a
    compiled stack runs it)."""
    from foxhunt.train.agents.dqn import Replay
    from foxhunt.train.agents.dqn_stacked import sample_points, sample_rows, sampled_slots

    g = torch.Generator().manual_seed(0)
    K, C, B = 5, 3000, 256
    prio = torch.rand(K, C, generator=g) ** 3
    prio[:, 2500:] = 0.0  # not yet written
    prio[2, :100] = 0.0  # incomplete transitions
    u = torch.rand(K, B, generator=g)
    fns = () if parts == "plain" else (compiled(sample_points), compiled(sampled_slots))
    idx, w = sample_rows(prio, u, torch.full((K,), 0.4), *fns)
    for k in range(K):
        r = Replay(C, torch.device("cpu"))
        r.prio.copy_(prio[k])
        r.beta.fill_(0.4)
        i2, w2 = r.sample(u[k])
        assert torch.equal(idx[k], i2)
        torch.testing.assert_close(w[k], w2, rtol=0, atol=0)
        assert bool((prio[k][idx[k]] > 0).all())


def test_what_cannot_be_stacked_is_refused_with_the_reason():
    data = random_market(3000, 0)

    def agent(seed=1, **kw):
        return RainbowAgent(DQNConfig(**SMALL_DQN | kw), EnvConfig(), data, seed=seed)

    with pytest.raises(ValueError, match="configurations differ"):
        Cohort([agent(1), agent(2, lr=3e-4)], stacked=True)
    with pytest.raises(ValueError, match="IQN draws its quantile fractions"):
        Cohort([agent(1, distribution="iqn"), agent(2, distribution="iqn")], stacked=True)
    ppo = PPOAgent(PPOConfig(envs=64, rollout_steps=8), EnvConfig(), data, seed=3)
    with pytest.raises(ValueError, match="Rainbow DQN"):
        Cohort([ppo, ppo], stacked=True)


def test_a_cohort_refuses_what_it_cannot_train_together():
    a = RainbowAgent(DQNConfig(**SMALL_DQN), EnvConfig(), random_market(3000, 0), seed=1)
    b = RainbowAgent(DQNConfig(**SMALL_DQN), EnvConfig(), random_market(3000, 0), seed=2)
    with pytest.raises(ValueError, match="one MarketData"):
        Cohort([a, b])
    with pytest.raises(ValueError, match="at least one agent"):
        Cohort([])
    with pytest.raises(ValueError, match="2 seeds for 1 agents"):
        Cohort([a]).reset_fold(100, 2000, [1, 2])
    with pytest.raises(ValueError, match="needs a CUDA device"):
        Cohort([a], streams=True)
    ppo = PPOAgent(PPOConfig(envs=64, rollout_steps=8, rounds=2), EnvConfig(), a.data, seed=3)
    with pytest.raises(ValueError, match="same rounds"):
        Cohort([a, ppo])


def counting_backend():
    """A torch.compile backend that records each graph Dynamo compiles and runs it eagerly:
    (the list it fills, the backend)."""
    graphs = []

    def backend(gm, inputs):
        graphs.append(gm)
        return gm.forward

    return graphs, backend


def test_compiled_methods_of_many_agents_all_stay_compiled():
    """Dynamo guards an agent's compiled method on the identity of its objects (the optimiser's
    among them), so each agent compiles a version of its own; past torch's default limit of 8
    the further agents would run eagerly. `compiled` leaves room for a cohort and more."""
    import torch._dynamo

    from foxhunt.train.agents.common import compiled

    graphs, backend = counting_backend()

    class Agent:
        def __init__(self):
            self.w = torch.zeros(3, requires_grad=True)
            self.opt = torch.optim.SGD([self.w], lr=0.1)

        def update(self, x):
            self.w.grad = x * 2
            self.opt.step()
            return self.w.sum()

    torch._dynamo.reset()
    agents = [Agent() for _ in range(10)]
    compiled(agents[0].update, backend=backend)(torch.ones(3))
    per_agent = len(graphs)
    assert per_agent >= 1
    for a in agents[1:]:
        assert compiled(a.update, backend=backend)(torch.ones(3)).item() == pytest.approx(-0.6)
    assert len(graphs) == 10 * per_agent  # every agent compiled, none fell back to eager


def test_combo_kernels_join_the_mode_s_options(monkeypatch):
    """A GPU DQN's compiled steps ask inductor for combo kernels on top of their mode's options
    (torch.compile refuses a mode and options together); on a CPU they ask for none."""
    from foxhunt.train.agents import common, dqn

    calls = []
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or fn)
    common.compiled(len, combo=True, mode="max-autotune-no-cudagraphs")
    common.compiled(len, combo=True)
    common.compiled(len, mode="default")
    autotune = {"max_autotune": True, "coordinate_descent_tuning": True}
    assert calls == [
        {"dynamic": False, "options": {**autotune, "combo_kernels": True}},
        {"dynamic": False, "options": {"combo_kernels": True}},
        {"dynamic": False, "mode": "default"},
    ]  # fmt: skip
    calls.clear()
    cfg = DQNConfig(hidden=(16,), head_hidden=8, envs=4, batch_size=8, replay_capacity=64,
                    compile=True)  # fmt: skip
    RainbowAgent(cfg, EnvConfig(episode_bars=32), random_market(), 0)
    assert dqn.COMBO_KERNELS and len(calls) == 3
    assert not any("combo_kernels" in kw.get("options", {}) for kw in calls)  # on the CPU


def test_the_stack_s_loop_reordering_switch_is_an_option_inductor_takes(monkeypatch):
    """The option that keeps torch 2.11's inductor from its assert on combo kernels (the
    stack's, on a GPU) joins the combo options, and inductor takes it: a graph compiled with it
    computes what the function does (torch.compile refuses an option it does not know)."""
    from foxhunt.train.agents import common

    calls = []
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(kw) or real(fn, **kw))
    off = {"loop_ordering_after_fusion": False}
    f = common.compiled(lambda x: (x * 2 + 1).sum(), options=off)
    x = torch.arange(6.0)
    assert f(x).item() == 36.0
    assert calls[0]["options"] == {"combo_kernels": False, **off}
    assert common.NO_LOOP_REORDER in ({}, off)  # on torch 2.13, where it is not needed: {}


@pytest.mark.parametrize("model", ["dqn", "ppo", "pqn"])
def test_weight_decay_is_adamws_and_zero_is_plain_adam(model):
    """`weight_decay` w: each step multiplies the weights by 1 - lr * w before Adam's update.
    The agent takes the same steps as one whose optimiser is torch.optim.AdamW at w, and at 0
    as one with torch.optim.Adam; the decay changes the weights it learns, towards 0."""
    cls, (cfg, _) = MODELS[model]
    data = random_market(3000, 0)

    def run(w, reference=None):
        agent = cls(dataclasses.replace(cfg, weight_decay=w, lr=3e-3), EnvConfig(), data, 0)
        if reference is not None:
            d = agent.opt.defaults
            agent.opt = reference([agent.flat], lr=d["lr"], eps=d["eps"], foreach=d["foreach"])
            ensure_adam_state(agent.opt, agent.flat)
        drive(agent, FOLDS[:1], [1])
        return agent.flat.detach().clone()

    decayed = run(0.5)
    assert torch.equal(decayed, run(0.5, functools.partial(torch.optim.AdamW, weight_decay=0.5)))
    plain = run(0.0)
    assert torch.equal(plain, run(0.0, torch.optim.Adam))
    assert not torch.equal(decayed, plain)
    assert decayed.norm() < plain.norm()


@pytest.mark.parametrize(
    "make",
    [
        functools.partial(torch.optim.Adam, lr=1e-2, foreach=True),
        functools.partial(torch.optim.Adam, lr=1e-2, foreach=False, weight_decay=0.1),
        functools.partial(torch.optim.Adam, lr=1e-2, weight_decay=0.3, decoupled_weight_decay=True),
        functools.partial(torch.optim.AdamW, lr=torch.tensor(3e-3), weight_decay=0.5,
                          foreach=False),
        functools.partial(torch.optim.Adam, lr=1e-2, amsgrad=True, maximize=True, eps=1e-4),
    ],
    ids=["adam-foreach", "adam-l2", "adam-decoupled", "adamw-tensor-lr", "amsgrad"],
)  # fmt: skip
def test_adam_step_takes_torchs_adam_steps_bit_for_bit(make):
    """`common.adam_step` calls the function torch.optim.Adam.step calls, with its arguments:
    the same weights and the same moments as the method's, step after step, whatever the
    optimiser's settings."""
    from foxhunt.train.agents.common import adam_step

    gen = torch.Generator().manual_seed(0)
    w0 = torch.randn(1000, generator=gen)
    flats = [w0.clone().requires_grad_() for _ in range(2)]
    opts = [make([f]) for f in flats]
    for f, o in zip(flats, opts, strict=True):
        ensure_adam_state(o, f)
    for _ in range(5):
        g = torch.randn(1000, generator=gen)
        for f in flats:
            f.grad = g.clone()
        opts[0].step()
        adam_step(opts[1], flats[1])
    assert torch.equal(flats[0], flats[1])
    assert not torch.equal(flats[0].detach(), w0)
    a, b = (o.state[f] for o, f in zip(opts, flats, strict=True))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(ValueError, match="the one flat parameter"):
        adam_step(opts[1], flats[0])  # another tensor than the optimiser's


@pytest.mark.parametrize("model", ["dqn", "dqn-stacked", "ppo", "pqn"])
def test_an_agents_compiled_update_is_one_graph(model):
    """The update an agent compiles (the clipping, Adam, and for the DQN the target network's
    update, the new priorities and the statistics) is one graph without breaks: Adam's step
    through `adam_step`, not torch.optim's method, whose graph breaks cut it in three and
    made Dynamo trace seven frames (H200, 2026-12-04)."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    from foxhunt.train.agents.common import compiled
    from foxhunt.train.agents.dqn_stacked import StackedRainbow

    graphs, backend = counting_backend()

    torch._dynamo.reset()
    counters.clear()
    data = random_market(3000, 0)
    cls, (cfg, _) = MODELS[model.removesuffix("-stacked")]
    agents = [cls(cfg, EnvConfig(episode_bars=200), data, seed=s) for s in (1, 2)]
    for a in agents:
        a.reset_fold(100, 2000, seed=1)
    if model == "dqn-stacked":
        agent = StackedRainbow(agents)
        agent._update = compiled(agent._update_record, backend=backend)
    else:  # the optimiser an agent compiled by torch.compile builds: torch.optim's, Dynamo's
        agent = agents[0]  # to trace (an uncompiled agent's, common.FlatAdam, is not)
        d = agent.opt.defaults
        keys = ("lr", "eps", "weight_decay", "decoupled_weight_decay", "foreach", "capturable")
        opt = torch.optim.Adam([agent.flat], **{k: d[k] for k in keys})
        opt.state[agent.flat] = dict(agent.opt.state[agent.flat])
        agent.opt = opt
        if model == "dqn":
            agent.update_fn = compiled(agent._step_update, backend=backend)
        else:
            agent._step = compiled(agent._step, backend=backend)
    agent.collect()
    agent.learn()
    assert len(graphs) == 1, [g.code[:200] for g in graphs]
    assert not counters["graph_break"], dict(counters["graph_break"])


BACKWARD_SCALE = {"k": 1.0}  # what the toy Function's backward multiplies by (changed mid-test)


class _ScaledReLU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.relu()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return g * (x > 0) * BACKWARD_SCALE["k"]


def test_graphs_with_custom_autograd_functions_are_cached_and_keyed_by_their_backward(
    tmp_path, monkeypatch
):
    """`compiled` lets AOTAutograd's cache keep a graph that holds a custom autograd.Function
    (the GPU agents' `linear_relu`; torch bypasses the cache for them by default, and a task
    on a warm cache then traced its loss's forward and backward again), and the cache's key
    covers the Function's backward: changed, it is traced afresh, not served stale."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    from torch._inductor.runtime.cache_dir_utils import temporary_cache_dir

    from foxhunt.train.agents.common import compiled, linear_relu

    w, b = torch.randn(4, 3), torch.randn(4)

    def loss(x):
        return _ScaledReLU.apply(linear_relu(x, w, b) - 0.5).sum()

    def grad_of_compiled():
        torch._dynamo.reset()
        counters.clear()
        x = torch.linspace(-1, 1, 12).view(4, 3).requires_grad_()
        compiled(loss)(x).backward()
        return x.grad, dict(counters["aot_autograd"])

    # A cache of its own; torch clears its in-memory caches on the way in and out.
    with temporary_cache_dir(str(tmp_path)):
        g1, first = grad_of_compiled()
        g1_again, again = grad_of_compiled()
        monkeypatch.setitem(BACKWARD_SCALE, "k", 3.0)
        g3, changed = grad_of_compiled()
    assert "autograd_cache_bypass" not in first and first.get("autograd_cache_saved") == 1
    assert again.get("autograd_cache_hit") == 1 and torch.equal(g1_again, g1)
    assert changed.get("autograd_cache_miss") == 1 and "autograd_cache_hit" not in changed
    torch.testing.assert_close(g3, 3 * g1)
