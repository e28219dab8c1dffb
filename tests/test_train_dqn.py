"""Rainbow DQN parts against exact or slow references."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from foxhunt.train import data as data_module
from foxhunt.train.agents.common import Observation
from foxhunt.train.agents.dqn import (
    IN_DIM,
    N_ACTIONS,
    DQNConfig,
    NoisyLinear,
    QNet,
    RainbowAgent,
    Replay,
    acting_net,
    c51_next_target,
    derived_support,
    project_c51,
    quantile_huber,
)
from foxhunt.train.data import RIDGE_L2, MarketData
from foxhunt.train.env import JOINT, EnvConfig
from marketdata import random_market

CPU = torch.device("cpu")


def tiny(**kw) -> DQNConfig:
    base = dict(
        hidden=(32, 32), head_hidden=16, envs=8, collect_steps=6, learn_steps=3,
        batch_size=32, replay_capacity=512,
    )  # fmt: skip
    return DQNConfig(**(base | kw))


random_data = random_market


# ------------------------------------------------------------------------------ replay
def test_per_sampling_probabilities_and_weights_are_exact():
    cap = 64
    rb = Replay(cap, CPU)
    rng = np.random.default_rng(0)
    prio = np.zeros(cap, np.float32)
    prio[:40] = rng.uniform(0.05, 3.0, 40).astype(np.float32)  # 24 empty slots
    prio[[3, 17]] = 0.0  # incomplete transitions: never sampled
    rb.prio.copy_(torch.from_numpy(prio))
    rb.beta.fill_(0.6)
    counts = np.zeros(cap)
    g = torch.Generator().manual_seed(1)
    B, rounds = 50, 4000
    for _ in range(rounds):
        idx, w = rb.sample(torch.rand(B, generator=g))
        counts += np.bincount(idx.numpy(), minlength=cap)
        # Weights: (N P(i))^-beta over the batch's largest (Schaul et al. 2016, Algorithm 1).
        valid = prio > 0
        P = prio / prio.sum()
        N = valid.sum()
        w_all = np.where(valid, (N * np.where(valid, P, 1.0)) ** -0.6, 0.0)
        w_batch = w_all[idx.numpy()]
        np.testing.assert_allclose(w.numpy(), w_batch / w_batch.max(), rtol=1e-5)
    freq = counts / (B * rounds)
    P = prio / prio.sum()
    assert counts[prio == 0].sum() == 0
    # Stratified sampling: each draw's marginal is exactly P; 200k draws -> tight agreement.
    np.testing.assert_allclose(freq, P, atol=4e-3)
    chi2 = (((counts - P * B * rounds) ** 2) / np.maximum(P * B * rounds, 1e-9))[P > 0].sum()
    assert chi2 < 2 * 37  # stratification makes it far smaller than the multinomial 37 dof


def test_one_near_zero_loss_transition_does_not_shrink_the_weights():
    """A transition predicted almost exactly (a flat market order pays exactly 0) gets a tiny
    priority; normalising by the whole buffer's smallest priority would scale every other
    weight down by (p / p_min)^-beta. Per batch, a batch without it keeps weights near 1."""
    rb = Replay(1000, CPU)
    rb.prio[:999] = 1.5
    rb.prio[999] = 0.024
    rb.beta.fill_(1.0)
    g = torch.Generator().manual_seed(0)
    means = []
    for _ in range(20):
        idx, w = rb.sample(torch.rand(64, generator=g))
        if not (idx == 999).any():
            means.append(float(w.mean()))
    assert means and min(means) == pytest.approx(1.0)  # whole-buffer form: (1.5/0.024)^-1 = 0.016


def test_an_empty_replay_samples_finite_weights():
    """Every slot of an empty replay has priority 0 (a capture's warm-up steps sample one):
    the weights are 1, not 0/0's NaN, so the warm-up's loss and logits stay finite; the one
    sampler over many replays (the stacked agents') does the same for an empty one."""
    from foxhunt.train.agents.dqn_stacked import sample_rows

    u = torch.rand(32, generator=torch.Generator().manual_seed(0))
    idx, w = Replay(100, CPU).sample(u)
    assert bool((idx >= 0).all() and (idx < 100).all()) and torch.equal(w, torch.ones(32))
    prio = torch.zeros(3, 100)
    prio[1, :50] = 1.0  # one replay with transitions between two empty ones
    idx, w = sample_rows(prio, u.expand(3, -1), torch.full((3,), 0.4))
    assert bool((idx >= 0).all() and (idx < 100).all()) and bool(torch.isfinite(w).all())
    assert torch.equal(w[0], torch.ones(32)) and torch.equal(w[2], torch.ones(32))
    assert bool((idx[1] < 50).all())


def test_replay_ring_wraps_and_update_sets_priorities():
    rb = Replay(10, CPU)
    f = torch.arange(18, dtype=torch.float32).view(6, 3)
    i = torch.arange(30).view(6, 5)
    rb.add(f, i, torch.tensor([True, True, False, True, True, True]))
    rb.add(f + 100, i + 100, torch.ones(6, dtype=torch.bool))
    assert int(rb.ptr) == 2
    assert torch.equal(rb.fbuf[0], f[4] + 100) and torch.equal(rb.fbuf[2], f[2])
    assert float(rb.prio[2]) == 0.0 and float(rb.prio[3]) == 1.0
    rb.update(torch.tensor([3, 5]), torch.tensor([3.0, 0.5]), alpha=0.5)
    assert float(rb.prio[3]) == pytest.approx((3.0 + 1e-6) ** 0.5)
    assert float(rb.max_prio) == pytest.approx((3.0 + 1e-6) ** 0.5)
    # A batch of rows of 128 takes its largest in two stages: the same maximum.
    big = Replay(1000, CPU)
    loss = 4 * torch.rand(512, generator=torch.Generator().manual_seed(0))
    big.update(torch.arange(512) + 7, loss, alpha=0.6)
    assert torch.equal(big.prio[7:519], (loss + 1e-6).pow(0.6).double())  # float32 values
    assert float(big.max_prio) == float((loss + 1e-6).pow(0.6).max()) > 1.0  # it starts at 1


# ------------------------------------------------------------------------------ C51
def bellemare_projection(p, R, disc, z):
    """Algorithm 1 of Bellemare, Dabney and Munos (2017), one sample at a time."""
    n = len(z)
    v_min, v_max = z[0], z[-1]
    dz = (v_max - v_min) / (n - 1)
    m = np.zeros(n)
    for j in range(n):
        tz = min(max(R + disc * z[j], v_min), v_max)
        b = (tz - v_min) / dz
        lo, up = math.floor(b), math.ceil(b)
        if lo == up:
            m[lo] += p[j]
        else:
            m[lo] += p[j] * (up - b)
            m[up] += p[j] * (b - lo)
    return m


def test_c51_projection_equals_bellemare_algorithm():
    rng = np.random.default_rng(3)
    B, K, A = 40, 3, 51
    z = torch.linspace(-10, 10, A, dtype=torch.float64)
    p = torch.from_numpy(rng.dirichlet(np.ones(A), size=(B, K)))
    R = torch.from_numpy(rng.normal(0, 6, (B, 1)))
    R[0] = 0.0  # lands exactly on atoms
    R[1] = 25.0  # clipped at v_max
    disc = torch.from_numpy(rng.choice([0.0, 0.99**3, 1.0], (B, 1)))
    m, clipped = project_c51(p, R, disc, z)
    m = m.numpy()
    for b in range(B):
        for k in range(K):
            ref = bellemare_projection(p[b, k].numpy(), float(R[b]), float(disc[b]), z.numpy())
            np.testing.assert_allclose(m[b, k], ref, atol=1e-12)
    np.testing.assert_allclose(m.sum(-1), 1.0, atol=1e-12)
    # The clipped mass: target atoms beyond the support, by a slow count.
    tz = (R + disc * z).numpy()  # [B, atoms]
    out = (tz < -10) | (tz > 10)
    ref = (p.numpy() * out[:, None, :]).sum(-1)
    np.testing.assert_allclose(clipped.numpy(), ref, atol=1e-12)
    assert clipped[1].min() > 0.3  # R = 25 on [-10, 10]: most mass lands beyond v_max


def test_c51_target_takes_the_online_choice_and_projects_the_target_distribution():
    """c51_next_target (what c51_triton fuses on a GPU) against a slow loop: the action of the
    highest expected value under the online logits, the target net's distribution of that
    action, Bellemare et al.'s projection."""
    g = torch.Generator().manual_seed(5)
    B, A, N = 24, 30, 51
    on2, tg2 = (3 * torch.randn(B, A, N, generator=g) for _ in range(2))
    R, disc = torch.randn(B, generator=g), torch.rand(B, 1, generator=g)
    R[0] = 9.0  # beyond v_max: all the mass clipped
    z = torch.linspace(-2, 2, N)
    target, clipped = c51_next_target(on2, tg2, R, disc, z)
    assert target.shape == (B, 1, N) and clipped.shape == (B, 1)
    for b in range(B):
        q = [float((torch.softmax(on2[b, a].double(), 0) * z.double()).sum()) for a in range(A)]
        best = max(range(A), key=q.__getitem__)
        p = torch.softmax(tg2[b, best].double(), 0).numpy()
        ref = bellemare_projection(p, float(R[b]), float(disc[b]), z.double().numpy())
        np.testing.assert_allclose(target[b, 0].numpy(), ref, atol=5e-6)  # float32
    assert clipped[0].item() == pytest.approx(1.0)


def test_fused_c51_target_asked_for_where_it_cannot_run_is_refused():
    with pytest.raises(ValueError, match=r"triton_target = True: .* CUDA device"):
        DQNConfig(triton_target=True).resolved(torch.device("cpu"))
    assert DQNConfig().resolved(torch.device("cpu")).triton_target is False


def test_exploration_and_inputs_default_by_device_and_what_is_set_wins():
    """On a GPU noisy nets with dense inputs and epsilon 0; on a CPU epsilon-greedy 0.1 on the
    first layer's inputs; epsilon follows the exploration unless set; the speed benchmarks'
    standard workload stays epsilon-greedy on a GPU."""
    from foxhunt.bench.workload import STANDARD_DQN

    def got(cfg, dev):
        r = cfg.resolved(torch.device(dev))
        return r.noisy, r.dense_inputs, r.epsilon

    assert got(DQNConfig(), "cuda") == (True, True, 0.0)
    assert got(DQNConfig(), "cpu") == (False, False, 0.1)
    assert got(DQNConfig(noisy=False), "cuda") == (False, True, 0.1)
    assert got(DQNConfig(noisy=True), "cpu") == (True, False, 0.0)
    assert got(DQNConfig(noisy=True, epsilon=0.05, dense_inputs=False), "cuda") == (
        True, False, 0.05)  # fmt: skip
    assert got(DQNConfig(**STANDARD_DQN), "cuda") == (False, False, 0.1)
    with pytest.raises(ValueError, match=r"epsilon = 1.5: must be in \[0, 1\]"):
        DQNConfig(epsilon=1.5)


def test_derived_support_holds_the_discounted_returns_of_a_held_position():
    rng = np.random.default_rng(0)
    r = torch.tensor(rng.standard_t(4, 20_000) * 3.0, dtype=torch.float32)  # fat tails, bp
    for gamma in (0.0, 0.5, 0.9, 0.99):
        half = derived_support(r, gamma)
        # a slow reference: the truncated discounted sum at every start
        H = 1 if gamma == 0 else int(np.ceil(np.log(1e-4) / np.log(gamma)))
        x = r.double().numpy()
        g = np.array(
            [sum(gamma**k * x[t + k] for k in range(H)) for t in range(0, len(x) - H + 1, 97)]
        )
        inside = (np.abs(g) <= half).mean()
        assert inside >= 0.999
        assert half < 3 * np.quantile(np.abs(g), 0.999)  # and not absurdly wide


# ------------------------------------------------------------------------------ n-step
@pytest.mark.parametrize("n_step", [1, 3])
def test_replayed_returns_are_the_env_rewards_and_bootstrap_where_the_episode_ended(n_step):
    """Record the env's rewards, dones and portfolios while collecting, then check what the
    learning step replays for every stored transition: R = sum gamma^k r over the next n steps
    (cut after an episode end), gamma^m, and the bootstrap state, which after an episode end
    is the state that end reached (a time limit, not a terminal), not the restarted env's."""
    data = random_data()
    g, E = 0.8, 5
    cfg = tiny(n_step=n_step, gamma=g, envs=E, collect_steps=40, replay_capacity=1000)
    agent = RainbowAgent(cfg, EnvConfig(episode_bars=7, fee_bps=0.3), data, seed=0)
    agent.reset_fold(0, 500, seed=0)
    log = []
    step, fill = agent.env.step, agent.env.fill

    def spy(*a, **k):
        t, port = agent.env.t.clone(), agent.env.portfolio()
        pstate = (agent.env.pos.clone(), agent.env.entry.clone(), agent.env.hold.clone())
        out = step(*a, **k)
        # the state this step reached, before any restart
        reached = fill(t, *pstate, agent.env.dir_tab[a[0]] * agent.env.size_tab[a[1]], a[2] == 1)
        after = agent.env.portfolio_of(t + 1, *reached[2:])
        log.append((t, out[1].clone(), out[3].clone(), port, after))
        return out

    agent.env.step = spy
    agent.collect()
    slots = torch.arange(len(log) * E)
    R, port2 = agent._replay_return(
        agent.replay.ibuf[slots, 0], agent.replay.ibuf[slots, 1],
        agent.replay.ibuf[slots, 2:].reshape(-1, n_step, 3), agent.replay.fbuf[slots],
    )  # fmt: skip
    ends = 0
    for k in range(len(log)):
        for e in range(E):
            slot = k * E + e
            if k < n_step - 1:
                assert float(agent.replay.prio[slot]) == 0.0  # history not full yet
                continue
            s = k - (n_step - 1)  # the transition written at step k starts at step s
            ret, m = 0.0, 0
            for j in range(n_step):
                ret += g**j * float(log[s + j][1][e]) * cfg.reward_scale
                m += 1
                if log[s + j][2][e]:
                    break
            i = agent.replay.ibuf[slot]
            assert int(i[0]) == int(log[s][0][e]) and int(i[1]) == m
            assert float(R[slot]) == pytest.approx(ret, rel=1e-4, abs=1e-4)
            # bootstrap state: what step s + m - 1 reached
            torch.testing.assert_close(port2[slot], log[s + m - 1][4][e], rtol=1e-4, atol=1e-5)
            ends += bool(log[s + m - 1][2][e])
            assert float(agent.replay.prio[slot]) == 1.0
    assert ends > 5, "the test should cover transitions cut by an episode end"


def test_gamma_zero_is_a_contextual_bandit():
    """gamma = 0: the target is the reward alone (disc 0), whatever the next state's value."""
    data = random_data()
    agent = RainbowAgent(tiny(gamma=0.0, n_step=1), EnvConfig(episode_bars=50), data, seed=0)
    agent.reset_fold(0, 400, seed=0)
    agent.collect()
    agent.learn()
    assert math.isfinite(agent.read_stats()["losses/loss"])


# ------------------------------------------------------------------------------ network
def test_noisy_linear_equals_the_explicit_factorised_formula():
    torch.manual_seed(0)
    layer = NoisyLinear(7, 5, 0.5)
    layer.reset_noise()
    x = torch.randn(4, 7)
    f = lambda e: e  # noqa: E731 (eps buffers already hold f(eps))
    W = layer.weight_mu + layer.weight_sigma * torch.outer(f(layer.eps_out), f(layer.eps_in))
    b = layer.bias_mu + layer.bias_sigma * layer.eps_out
    torch.testing.assert_close(layer(x), x @ W.T + b)
    torch.testing.assert_close(layer(x, noise=False), x @ layer.weight_mu.T + layer.bias_mu)


@pytest.mark.parametrize("rows", [None, 6])
def test_a_networks_noise_is_one_draw_mapped_through_f(rows):
    """QNet draws its shared sample as one flat draw (every noisy layer's eps_in and eps_out
    in turn, views of one buffer) and the per-row samples buffer by buffer (multi-tensor
    kernels): the numbers of a plain draw from the generator mapped through
    f(e) = sign(e) sqrt|e|, bit for bit."""
    net = QNet(tiny(noisy=True))
    layers = net.noisy_layers()
    assert len(layers) == 3
    g = torch.Generator().manual_seed(11)
    if rows is None:
        net.reset_noise(g)
        got = [torch.cat([e.reshape(-1) for m in layers for e in (m.eps_in, m.eps_out)])]
    else:
        net.reset_row_noise(rows, g)
        got = [e.clone() for m in layers for e in (m.row_in, m.row_out)]
    g.manual_seed(11)
    for e in got:
        ref = torch.empty_like(e).normal_(generator=g)
        assert torch.equal(e, ref.sign() * ref.abs().sqrt())


def test_the_noise_buffer_follows_copies_and_moves():
    """A copy's draws land in the copy's layers and leave the original's alone; after `.to`
    (new buffers) the draws land in the moved layers, and the values they held are kept."""
    net = QNet(tiny(noisy=True))
    net.reset_noise(torch.Generator().manual_seed(1))

    def sample(n):
        return torch.cat([e.reshape(-1) for m in n.noisy_layers() for e in (m.eps_in, m.eps_out)])

    before = sample(net).clone()
    twin = copy.deepcopy(net)
    twin.reset_noise(torch.Generator().manual_seed(2))
    assert torch.equal(sample(net), before) and not torch.equal(sample(twin), before)
    moved = net.to(torch.float64)
    assert torch.equal(sample(moved), before.double())
    moved.reset_noise(torch.Generator().manual_seed(3))
    ref = torch.empty(before.numel(), dtype=torch.float64).normal_(
        generator=torch.Generator().manual_seed(3)
    )
    assert torch.equal(sample(moved), ref.sign() * ref.abs().sqrt())


def test_each_step_reads_its_row_of_the_blocks_noise_samples():
    """Noisy nets: a collection block draws its steps' uniforms, then one sample a step; a
    learning block draws each step's online and target samples at its start, and step i's
    networks read row i (their noise buffers views of the one it is copied into): a plain
    draw from a copy of the agent's generator, mapped through f, row by row."""
    agent = RainbowAgent(tiny(noisy=True, epsilon=0.0), EnvConfig(episode_bars=50),
                         random_data(), seed=0)  # fmt: skip
    agent.reset_fold(0, 400, seed=0)

    def f(e):
        return e.sign() * e.abs().sqrt()

    def sample(net):
        return torch.cat([e.reshape(-1) for m in net.noisy_layers() for e in (m.eps_in, m.eps_out)])

    seen, act, loss = [], agent.act_joint, agent._loss
    agent.act_joint = lambda *a, **k: seen.append(sample(agent.net)) or act(*a, **k)
    agent._loss = lambda *a: seen.append(torch.cat([sample(agent.net), sample(agent.target)])) \
        or loss(*a)  # fmt: skip
    for _ in range(2):  # two epochs: the second block draws afresh
        g = torch.Generator().set_state(agent.gen.get_state())
        u = torch.empty_like(agent.u_collect).uniform_(generator=g)
        ref = [*f(torch.empty_like(agent.collect_noise).normal_(generator=g))]
        seen.clear()
        agent.collect()
        assert torch.equal(agent.u_collect, u)
        ref += [*f(torch.empty_like(agent.learn_noise).normal_(generator=g))]
        agent.learn()
        assert len(seen) == len(ref) == 6 + 3
        assert all(torch.equal(a, b) for a, b in zip(seen, ref, strict=True))


@pytest.mark.parametrize("noisy", [False, True], ids=["epsilon", "noisy"])
def test_an_agent_restored_from_an_epochs_end_trains_on_as_the_original(noisy):
    """What a resume file holds (`snapshot`) is all a later epoch draws from: an agent built
    afresh and restored trains its next epoch to the original's weights and statistics, bit
    for bit (noisy nets: the blocks' samples come from the restored generator)."""
    cfg = tiny(noisy=noisy, epsilon=0.0 if noisy else 0.1, dense_inputs=True)

    def agent():
        a = RainbowAgent(cfg, EnvConfig(episode_bars=50), random_data(), seed=3)
        a.reset_fold(0, 400, seed=5)
        return a

    def epoch(a, e):
        a.begin_epoch(e, 3)
        a.collect()
        a.learn()
        return a.read_stats()

    first = agent()
    for e in range(2):
        epoch(first, e)
    saved = first.snapshot()
    torch.rand(7)  # the global generator moves; the agents draw from their own
    went_on = epoch(first, 2)
    second = agent()
    second.restore(saved)
    assert epoch(second, 2) == went_on
    assert torch.equal(second.flat, first.flat)


def test_per_row_noise_is_the_factorised_formula_row_by_row():
    """noise="rows": row i sees its own factorised sample; rows that share the shared sample
    give the shared-noise output exactly."""
    torch.manual_seed(0)
    layer = NoisyLinear(7, 5, 0.5)
    layer.reset_noise()
    layer.reset_row_noise(4)
    x = torch.randn(4, 7)
    y = layer(x, noise="rows")
    for i in range(4):
        W = layer.weight_mu + layer.weight_sigma * torch.outer(layer.row_out[i], layer.row_in[i])
        b = layer.bias_mu + layer.bias_sigma * layer.row_out[i]
        torch.testing.assert_close(y[i], W @ x[i] + b)
    assert not torch.allclose(y, layer(x))  # not the shared sample
    layer.row_in.copy_(layer.eps_in.expand(4, -1))
    layer.row_out.copy_(layer.eps_out.expand(4, -1))
    torch.testing.assert_close(layer(x, noise="rows"), layer(x))
    assert "row_in" not in layer.state_dict()  # redrawn before use: not part of a checkpoint


@pytest.mark.parametrize("align,fold_mean", [(1, False), (1, True), (8, True)])
def test_dueling_joint_head_has_zero_mean_advantage(align, fold_mean):
    """The dueling head against its formula, v + a - mean_a(a), in float64: as written (the
    CPU's form) and with the mean taken out of the advantage layer's weights and the widths
    padded (the GPU's form); the gradients of every weight too."""
    torch.manual_seed(0)
    net = QNet(tiny(noisy=False), align=align, fold_mean=fold_mean).double()
    x = torch.randn(6, 64, dtype=torch.float64)
    out = net(x)  # [6, 30, 51]
    assert out.shape == (6, N_ACTIONS, 51) and N_ACTIONS == len(JOINT) == 30
    h = x
    for layer in net.trunk:
        h = torch.relu(layer(h))
    hv, ha = torch.relu(net.head(h)).chunk(2, 1)
    v = net.value(hv)
    a = net.adv(ha).view(6, N_ACTIONS, 51)
    ref = v[:, None] + a - a.mean(1, keepdim=True)
    torch.testing.assert_close(out, ref)
    g = torch.randn_like(ref)
    params = list(net.parameters())
    got = torch.autograd.grad((out * g).sum(), params)
    want = torch.autograd.grad((ref * g).sum(), params)
    for p, w in zip(got, want, strict=True):
        torch.testing.assert_close(p, w)


@pytest.mark.parametrize("distribution", ["c51", "mean"])
@pytest.mark.parametrize("noisy", [False, True])
@pytest.mark.parametrize("align,fold_mean", [(1, False), (8, False), (8, True)])
def test_the_taken_actions_outputs_are_the_full_outputs_gathered(distribution, noisy, align,
                                                                 fold_mean):  # fmt: skip
    """QNet(..., act=a) (what the loss reads) gives the full output gathered at the taken
    actions, bit for bit, and the same gradients: read in place from the padded advantage
    output where the dueling mean is folded (the GPU's form), gathered otherwise."""
    torch.manual_seed(0)
    net = QNet(tiny(noisy=noisy, distribution=distribution), align=align,
               fold_mean=fold_mean).double()  # fmt: skip
    if noisy:
        net.reset_noise()
    x = torch.randn(9, IN_DIM, dtype=torch.float64)
    act = torch.randint(0, N_ACTIONS, (9, 1))
    out = net.out
    got = net(x, act=act)
    want = net(x).gather(1, act[:, :, None].expand(-1, -1, out))
    assert got.shape == (9, 1, out) and torch.equal(got, want)
    g = torch.randn_like(got)
    params = list(net.parameters())
    for a, b in zip(torch.autograd.grad((got * g).sum(), params),
                    torch.autograd.grad((want * g).sum(), params), strict=True):  # fmt: skip
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_quantile_huber_against_a_loop():
    rng = np.random.default_rng(2)
    B, K, K2, nb = 3, 4, 5, 2
    theta = torch.tensor(rng.normal(size=(B, K, nb)))
    target = torch.tensor(rng.normal(size=(B, K2, nb)) * 2)
    taus = torch.tensor(rng.uniform(size=(B, K)))
    got = quantile_huber(theta, target, taus)
    for b in range(B):
        tot = 0.0
        for br in range(nb):
            s = 0.0
            for i in range(K):
                for j in range(K2):
                    u = float(target[b, j, br] - theta[b, i, br])
                    h = 0.5 * u * u if abs(u) <= 1 else abs(u) - 0.5
                    s += abs(float(taus[b, i]) - (u < 0)) * h / K2
            tot += s
        assert float(got[b]) == pytest.approx(tot / nb)


# ------------------------------------------------------------------------------ options
@pytest.mark.parametrize(
    "opts",
    [
        {},
        {"distribution": "iqn"},
        {"distribution": "mean"},
        {"cql_alpha": 0.5},
        {"noisy": False, "epsilon": 0.1, "double_q": False},
        {"dense_inputs": True},
        {"dense_inputs": True, "distribution": "iqn"},
    ],
)
def test_every_option_learns_a_finite_loss(opts):
    data = random_data()
    agent = RainbowAgent(tiny(**opts), EnvConfig(episode_bars=50), data, seed=0)
    agent.reset_fold(0, 400, seed=0)
    before = [p.detach().clone() for p in agent.params]
    for _ in range(2):
        agent.collect()
        agent.learn()
    stats = agent.read_stats()
    assert math.isfinite(stats["losses/loss"]) and stats["losses/loss"] > 0
    assert any(not torch.equal(a, b) for a, b in zip(before, agent.params, strict=True))
    if opts.get("cql_alpha"):
        assert stats["losses/cql"] > 0


@pytest.mark.parametrize("double_q", [True, False])
def test_the_streamed_loss_s_pieces_give_the_loss_and_its_gradient(double_q):
    """On a GPU under torch.compile the loss runs as pieces, the next states' forward passes on
    CUDA streams of their own (dqn.NEXT_ON_STREAMS, `_streamed_loss`). Composed without streams
    on a CPU, the pieces give `_loss`'s outputs and gradient bit for bit: each network's outputs
    go where `_loss` puts them (the target network's weights moved off the online ones, so that
    the two cannot stand in for each other unseen)."""
    cfg = tiny(noisy=True, epsilon=0.0, dense_inputs=True, n_step=3, double_q=double_q)
    agent = RainbowAgent(cfg, EnvConfig(episode_bars=50), random_data(), seed=0)
    agent.reset_fold(0, 400, seed=0)
    agent.collect()
    with torch.no_grad():
        agent.target_flat.add_(0.05 * torch.randn_like(agent.target_flat))
    agent._pieces = agent._loss_pieces()
    agent.side_streams = None
    u = torch.rand(cfg.batch_size, generator=torch.Generator().manual_seed(1))
    idx, w = agent.replay.sample(u)
    got = []
    for loss in (agent._loss, agent._streamed_loss):
        agent._zero_grad()
        out = loss(idx, w)
        out[0].backward()
        got.append(([x.detach() for x in out], torch.cat([p.grad.flatten() for p in agent.params])))
    (want, g_want), (streamed, g_streamed) = got
    assert all(torch.equal(a, b) for a, b in zip(want, streamed, strict=True))
    assert torch.equal(g_want, g_streamed) and g_want.abs().sum() > 0


def test_epsilon_anneals_over_the_first_part_of_the_fold():
    """epsilon_start -> epsilon linearly over the first epsilon_decay of the epochs, then flat;
    collection explores at that rate (every random action is uniform over the 30)."""
    cfg = tiny(noisy=False, epsilon=0.05, epsilon_start=1.0, epsilon_decay=0.25, envs=64)
    agent = RainbowAgent(cfg, EnvConfig(episode_bars=50), random_data(), seed=0)
    agent.reset_fold(0, 400, seed=0)
    got = []
    for e in range(8):
        agent.begin_epoch(e, 8)
        got.append(float(agent.eps))
    assert got == pytest.approx([1.0, 0.525] + [0.05] * 6)
    agent.begin_epoch(0, 8)
    agent.collect()  # epsilon 1: every action random, about uniform over the 30
    stats = agent.read_stats()
    shares = [stats[f"charts/collect_{d}"] for d in ("short", "flat", "long")]
    assert shares == pytest.approx([1 / 3] * 3, abs=0.1)
    flat = RainbowAgent(tiny(noisy=False, epsilon=0.1), EnvConfig(), random_data(), seed=0)
    flat.begin_epoch(0, 8)
    assert float(flat.eps) == pytest.approx(0.1)  # no schedule: epsilon throughout


def test_the_mean_head_regresses_on_the_double_q_target():
    """`distribution = mean`: per sample 0.5 (Q(s, a) - (R + gamma^m Q_target(s', a')))^2 with
    a' the online net's greedy action at s' (double Q), and |TD error| as the priority; the
    targets recomputed here from the nets' outputs."""
    cfg = tiny(distribution="mean", noisy=False, epsilon=0.1, gamma=0.7, n_step=2)
    agent = RainbowAgent(cfg, EnvConfig(episode_bars=50), random_data(), seed=0)
    agent.reset_fold(0, 400, seed=0)
    agent.collect()
    agent.learn()  # the target net now differs from the online one
    idx = agent.replay.prio.nonzero()[:24, 0]  # complete transitions (never sampled: the rest)
    B = len(idx)
    loss, prio = agent._loss(idx, torch.ones(B))[:2]
    f, i = agent.replay.fbuf[idx], agent.replay.ibuf[idx]
    t, m = i[:, 0], i[:, 1]
    acts = i[:, 2:].reshape(B, cfg.n_step, 3)
    s = agent.state(t, agent.env.portfolio_of(t, f[:, 0], f[:, 1], f[:, 2]))
    R, port2 = agent._replay_return(t, m, acts, f)
    s2 = agent.state(t + m, port2)
    with torch.no_grad():
        q = agent.net(s)[:, :, 0]
        a2 = agent.net(s2)[:, :, 0].argmax(1)
        nxt = agent.target(s2)[torch.arange(B), a2, 0]
    taken = acts[:, 0, 0] * 10 + acts[:, 0, 1] * 2 + acts[:, 0, 2]
    td = q[torch.arange(B), taken] - (R + cfg.gamma ** m.float() * nxt)
    assert torch.allclose(prio, td.abs(), rtol=1e-5, atol=1e-6)
    assert float(loss.detach()) == pytest.approx(float((0.5 * td.square()).mean()), rel=1e-5)
    assert m.max() == 2 and m.min() >= 1  # n-step transitions of both lengths were replayed


@pytest.mark.parametrize("distribution,dense", [("c51", False), ("mean", False), ("c51", True)])
def test_the_served_policy_acts_as_the_trainer(distribution, dense):
    """A checkpoint's greedy policy outside the trainer (`acting_net`) picks the actions the
    trainer's greedy policy picks, for each head, with D2RL's dense inputs too."""
    cfg = tiny(distribution=distribution, noisy=False, epsilon=0.1, dense_inputs=dense)
    agent = RainbowAgent(cfg, EnvConfig(episode_bars=50), random_data(), seed=0)
    agent.reset_fold(0, 400, seed=0)
    agent.collect()
    agent.learn()
    state = torch.randn(64, IN_DIM)
    want = agent.act(state, noise=False, net=agent._acting())
    got = acting_net(cfg, {k: v.clone() for k, v in agent.weights().items()})(state)
    assert torch.equal(got, want) and len(set(map(tuple, want.tolist()))) > 1


@pytest.mark.parametrize("noisy", [False, True])
def test_dense_inputs_add_the_state_beside_each_layer_after_the_first(noisy):
    """D2RL's network with the weights of its state columns zero is the plain network (the
    rest of the weights copied), and those columns do reach the output once they are not."""
    torch.manual_seed(0)
    plain = QNet(tiny(noisy=noisy, hidden=(16, 8))).double()
    plain.reset_noise()
    dense = QNet(tiny(noisy=noisy, hidden=(16, 8), dense_inputs=True)).double()
    with torch.no_grad():
        for t, p in zip(dense.state_dict().values(), plain.state_dict().values(), strict=True):
            t.zero_()  # the state's columns of the wider layers stay 0
            t[..., : p.shape[-1]].copy_(p)  # the first columns read the previous layer
    assert dense.trunk[1].in_features == 16 + IN_DIM and dense.trunk[0].in_features == IN_DIM
    x = torch.randn(5, IN_DIM, dtype=torch.float64)
    torch.testing.assert_close(dense(x), plain(x))
    with torch.no_grad():
        dense.trunk[1].weight[:, 16:].normal_()
    assert not torch.allclose(dense(x), plain(x))


def test_float32_outputs_compute_the_output_layers_outside_bf16_autocast():
    """Under bf16 autocast (the GPU's; here the CPU's), `float32_outputs` gives the value and
    advantage layers' outputs in float32, exactly the float32 product of their inputs (those
    bf16), while the trunk stays bf16; without it the outputs are bf16."""
    torch.manual_seed(0)
    seen = {}
    for f32 in (False, True):
        net = QNet(tiny(noisy=False, float32_outputs=f32))
        for name in ("value", "adv", "head"):
            getattr(net, name).register_forward_hook(
                lambda m, i, o, name=name: seen.__setitem__(name, (i[0], o))
            )
        with torch.autocast("cpu", dtype=torch.bfloat16):
            net(torch.randn(7, IN_DIM))
        assert seen["head"][1].dtype == torch.bfloat16  # the trunk and heads' hidden layer
        for name in ("value", "adv"):
            x, y = seen[name]
            layer = getattr(net, name)
            assert y.dtype == (torch.float32 if f32 else torch.bfloat16)
            if f32:
                assert torch.equal(y, F.linear(x.float(), layer.weight, layer.bias))


@pytest.mark.parametrize("noisy", [False, True])
def test_aligned_heads_give_the_unaligned_outputs_and_gradients(noisy):
    """Padding the output layers' widths inside the matmul (the GPU path) changes no number
    beyond rounding, forward or backward, plain or noisy layers."""
    torch.manual_seed(0)
    net = QNet(tiny(noisy=noisy)).double()
    net.reset_noise()
    padded = QNet(tiny(noisy=noisy), align=8).double()
    padded.load_state_dict(net.state_dict())  # the noise buffers too
    x = torch.randn(5, 64, dtype=torch.float64)
    out, out_p = net(x), padded(x)
    torch.testing.assert_close(out_p, out)
    w = torch.randn_like(out)
    (out * w).sum().backward()
    (out_p * w).sum().backward()
    for (name, a), b in zip(net.named_parameters(), padded.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, msg=name)


@pytest.mark.parametrize("noise", [True, False, "rows"])
@pytest.mark.parametrize("noisy", [False, True])
def test_the_gpu_forms_give_the_cpu_forms_outputs_and_gradients(noisy, noise):
    """The GPU's network (padded widths, the dueling mean out of the advantage weights, noisy
    layers run with their formed weights, the ReLUs in their products' op and its own backward)
    against the CPU's in float64: the same outputs and gradients for the shared noise sample,
    the mean weights and per-row noise (where noisy layers keep their own form), and the taken
    actions' outputs read in place."""
    torch.manual_seed(0)
    cpu = QNet(tiny(noisy=noisy)).double()
    gpu = QNet(tiny(noisy=noisy), align=8, fold_mean=True, noisy_weights=True,
               fused_relu=True).double()  # fmt: skip
    cpu.reset_noise()
    gpu.load_state_dict(cpu.state_dict())  # the shared noise buffers too
    if noisy:
        cpu.reset_row_noise(5)
        for a, b in zip(cpu.noisy_layers(), gpu.noisy_layers(), strict=True):
            b.row_noise(5)
            b.row_in.copy_(a.row_in)
            b.row_out.copy_(a.row_out)
    x = torch.randn(5, IN_DIM, dtype=torch.float64)
    act = torch.randint(0, N_ACTIONS, (5, 1))
    out, got = cpu(x, noise=noise), gpu(x, noise=noise)
    torch.testing.assert_close(got, out, rtol=1e-12, atol=1e-12)
    for net, full in ((cpu, out), (gpu, got)):  # the dueling streams sum to the logits
        v, a = net(x, noise=noise, parts=True)
        torch.testing.assert_close(v + a, full, rtol=1e-12, atol=1e-12)
    # The advantage's hidden layer and the layer's weights with the mean out (dqn.ADV_IN_TARGET:
    # c51_triton forms the advantage from them), where the layer runs formed; the streams else.
    gpu.adv_in_target = True
    hidden = gpu(x, noise=noise, parts="hidden")
    assert len(hidden) == (2 if noisy and noise == "rows" else 4)
    if len(hidden) == 4:
        v, h, wc, bc = hidden
        assert h.shape == (5, tiny().head_hidden) and wc.shape == (N_ACTIONS * gpu.out, h.shape[1])
        torch.testing.assert_close(
            wc.view(N_ACTIONS, gpu.out, -1).sum(0), torch.zeros_like(wc[: gpu.out])
        )
        hidden = (v, F.linear(h, wc, bc).view(5, N_ACTIONS, gpu.out))
    torch.testing.assert_close(hidden[0] + hidden[1], out, rtol=1e-12, atol=1e-12)
    gpu.adv_in_target = False
    taken = gpu(x, noise=noise, act=act)
    torch.testing.assert_close(taken, out.gather(1, act[:, :, None].expand(-1, -1, cpu.out)),
                               rtol=1e-12, atol=1e-12)  # fmt: skip
    w = torch.randn_like(out)
    for want, have in zip(  # the mean weights leave the sigmas without a gradient
        torch.autograd.grad((out * w).sum(), list(cpu.parameters()), allow_unused=True),
        torch.autograd.grad((got * w).sum(), list(gpu.parameters()), allow_unused=True),
        strict=True,
    ):
        assert (want is None) == (have is None)
        if want is not None:
            torch.testing.assert_close(have, want, rtol=1e-12, atol=1e-12)


def test_flat_update_equals_clip_and_adam_per_parameter_and_polyak_target():
    """The agent's update over its flat buffer against torch's own per-parameter pieces:
    clip_grad_norm_, Adam on each tensor, and target <- target + tau (online - target)."""
    data = random_data()
    cfg = tiny(noisy=False, grad_clip=0.5, lr=1e-2)
    agent = RainbowAgent(cfg, EnvConfig(episode_bars=50), data, seed=0)
    ref = [p.detach().clone().requires_grad_() for p in agent.params]
    ref_target = [p.detach().clone() for p in agent.target.parameters()]
    opt = torch.optim.Adam(ref, lr=cfg.lr, eps=cfg.adam_eps, foreach=False)
    gen = torch.Generator().manual_seed(1)
    for step in range(3):
        grads = [torch.randn(p.shape, generator=gen) * (step + 1) for p in ref]
        agent.flat.grad = torch.cat([g.reshape(-1) for g in grads])
        gn = agent._update()
        for p, g in zip(ref, grads, strict=True):
            p.grad = g.clone()
        gn_ref = torch.nn.utils.clip_grad_norm_(ref, cfg.grad_clip)
        opt.step()
        for t, p in zip(ref_target, ref, strict=True):
            t.add_(cfg.tau * (p.detach() - t))
        torch.testing.assert_close(gn, gn_ref)
        for a, b in zip(agent.params, ref, strict=True):
            torch.testing.assert_close(a, b.detach(), rtol=1e-6, atol=1e-7)
        for a, b in zip(agent.target.parameters(), ref_target, strict=True):
            torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    # the modules' parameters are views of the flat buffers
    assert agent.params[0].data_ptr() == agent.flat.data_ptr()
    assert next(agent.target.parameters()).data_ptr() == agent.target_flat.data_ptr()


def test_normaliser_sees_only_the_train_range():
    data = random_data()
    data.use_memory(0.5)
    data.fit_normaliser(100, 300)
    mean, inv = data.mean.clone(), data.inv_std.clone()
    mem_mean, mem_inv = data.memory_mean.clone(), data.memory_inv_std.clone()
    for x in (data.mkt, data.memory):
        x[:100] += 1e3  # outside the train range
        x[300:] *= -7.0
    data.fit_normaliser(100, 300)
    assert torch.equal(mean, data.mean) and torch.equal(inv, data.inv_std)
    assert torch.equal(mem_mean, data.memory_mean) and torch.equal(mem_inv, data.memory_inv_std)
    for x, mu, inv_std in ((data.mkt, data.mean, data.inv_std),
                           (data.memory, data.memory_mean, data.memory_inv_std)):  # fmt: skip
        x = x[100:300].double()
        torch.testing.assert_close(mu.double(), x.mean(0), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(1 / inv_std.double(), x.std(0), rtol=1e-5, atol=1e-6)


def test_the_device_copy_holds_the_cache_s_columns_in_float32_from_read_only_maps(tmp_path):
    """The columns go from the fxcache's read-only memory maps straight into the device tensors:
    the same numbers as casting the concatenated arrays to float32 (the features in float64 as
    well), the return computed in float64 before its cast, and the maps left as they were."""
    rng = np.random.default_rng(7)
    n = 500
    close = 4800.0 * np.exp(np.cumsum(rng.normal(0, 3e-4, n)))
    arrays = {
        "features": rng.normal(size=(n, 42)),  # float64: cast on the way
        "ofi": rng.normal(size=(n, 8)).astype(np.float32),
        "targets": np.stack([close, close * 1.0002, close * 0.9998, close], 1),
    }
    maps = {}
    for k, v in arrays.items():
        np.save(tmp_path / f"{k}.npy", v)
        maps[k] = np.load(tmp_path / f"{k}.npy", mmap_mode="r")
    data = MarketData(maps["features"], maps["ofi"], maps["targets"], torch.device("cpu"))
    mkt = np.concatenate([arrays["features"], arrays["ofi"]], axis=1, dtype=np.float32)
    assert torch.equal(data.mkt, torch.from_numpy(mkt))
    for i, col in enumerate((data.high, data.low, data.close)):
        assert torch.equal(col, torch.from_numpy(arrays["targets"][:, i + 1].astype(np.float32)))
    ret1 = np.append(close[1:] / close[:-1] - 1.0, 0.0).astype(np.float32)
    assert torch.equal(data.ret1, torch.from_numpy(ret1))
    assert data.upload.bytes == n * (50 + 3 + 1) * 4 and not data.upload.pinned
    for k, v in arrays.items():
        assert np.array_equal(np.load(tmp_path / f"{k}.npy"), v)


@pytest.mark.parametrize("decay", [0.0, 0.5, 0.9])
def test_memory_is_the_order_flows_moving_average_up_to_each_bar(decay):
    """Against a loop over the bars; a shorter history gives its bars' memory bit for bit (no
    look-ahead). 1,100 bars: more than SCAN_BLOCK^2, so the scan's carry recurses twice."""
    data = random_market(1100, seed=3)
    data.use_memory(decay)
    flow = data.mkt[:, -8:].double()
    acc, ref = flow[0], []
    for row in flow:
        acc = decay * acc + (1 - decay) * row
        ref.append(acc)
    torch.testing.assert_close(data.memory, torch.stack(ref).float(), rtol=1e-6, atol=1e-6)
    mkt, close = data.mkt[:700].numpy(), data.close[:700].numpy()
    short = MarketData(mkt[:, :42], mkt[:, 42:], np.stack([close] * 4, 1), torch.device("cpu"))
    short.use_memory(decay)
    assert torch.equal(short.memory, data.memory[:700])
    with pytest.raises(ValueError, match="already holds the memory at"):
        data.use_memory(0.25)


def test_the_forecast_is_the_train_range_s_ridge_standardised_and_reads_no_later_bar(monkeypatch):
    """Against numpy's least squares on the ridge's augmented system over the 58 normalised
    columns, standardised on the train range; bars after the range, changed, leave the fit and
    every earlier bar's forecast as they were; the state carries it after the portfolio."""
    base = random_market(900, seed=5)
    mkt, close = base.mkt.numpy(), base.close.numpy()
    lo, hi = 100, 600

    def market(mkt, close):
        data = MarketData(mkt[:, :42], mkt[:, 42:], np.stack([close] * 4, 1), torch.device("cpu"))
        data.use_memory(0.5)
        data.use_forecast()
        data.fit_normaliser(lo, hi)
        return data

    data = market(mkt, close)
    t = torch.arange(data.n)
    x = torch.cat([data.observe(t), data.remember(t)], 1).double().numpy()
    d, rows = x.shape[1], slice(lo, hi - 1)  # the last bar's return lies after the range
    xb = np.c_[x, np.ones(len(x))]
    lam = RIDGE_L2 * (hi - 1 - lo)
    aug = np.r_[xb[rows], np.c_[np.sqrt(lam) * np.eye(d), np.zeros(d)]]
    y = np.r_[data.ret1[rows].double().numpy(), np.zeros(d)]
    score = xb @ np.linalg.lstsq(aug, y, rcond=None)[0]
    want = np.clip((score - score[lo:hi].mean()) / score[lo:hi].std(ddof=1), -10, 10)
    torch.testing.assert_close(data.forecast, torch.tensor(want, dtype=torch.float32),
                               rtol=1e-4, atol=1e-4)  # fmt: skip
    assert data.forecast[lo:hi].std() > 0.5  # a real column, not the zeros it starts as

    rng = np.random.default_rng(1)
    later_mkt, later_close = mkt.copy(), close.copy()
    later_mkt[hi:] = rng.normal(size=later_mkt[hi:].shape).astype(np.float32)
    later_close[hi:] *= np.exp(rng.normal(0, 0.01, len(close) - hi)).astype(np.float32)
    later = market(later_mkt, later_close)
    assert torch.equal(later.forecast_w, data.forecast_w)
    assert torch.equal(later.forecast[:hi], data.forecast[:hi])
    assert not torch.equal(later.forecast[hi:], data.forecast[hi:])

    port = torch.randn(20, 3)
    s = Observation(data, 0.5, forecast=True)(t[5:25], port)
    assert torch.equal(s[:, 58:61], port) and torch.equal(s[:, 61], data.forecast[5:25])
    assert not s[:, 62:].any()
    # After a resume file's fit is restored into new data, the column is scored again from it.
    fresh = market(mkt, close)
    fitted = fresh.forecast.clone()
    fresh.forecast.zero_()
    fresh.score_forecast()
    assert torch.equal(fresh.forecast, fitted)
    bare = MarketData(mkt[:, :42], mkt[:, 42:], np.stack([close] * 4, 1), torch.device("cpu"))
    bare.use_forecast()
    with pytest.raises(ValueError, match="use_memory after use_forecast"):
        bare.use_memory(0.5)
    # In blocks of rows (2M bars' float64 columns at once would take ~1 GB), the same fit.
    monkeypatch.setattr(data_module, "FORECAST_ROWS", 64)
    blocks = market(mkt, close)
    torch.testing.assert_close(blocks.forecast_w, data.forecast_w, rtol=1e-9, atol=1e-12)
    torch.testing.assert_close(blocks.forecast, data.forecast, rtol=1e-5, atol=1e-5)


def test_the_state_is_market_memory_portfolio_then_zeros():
    data = random_data()
    data.fit_normaliser(0, 300)
    t, port = torch.arange(5, 25), torch.randn(20, 3)
    plain = Observation(data, None)(t, port)
    assert torch.equal(plain[:, :50], data.observe(t)) and torch.equal(plain[:, 50:53], port)
    assert plain.shape == (20, IN_DIM) and not plain[:, 53:].any()
    observe = Observation(data, 0.5)  # computes the memory; the normaliser fits it from now on
    data.fit_normaliser(0, 300)
    with_memory = observe(t, port)
    assert torch.equal(with_memory[:, :50], data.observe(t))
    assert torch.equal(with_memory[:, 50:58], data.remember(t))
    assert torch.equal(with_memory[:, 58:61], port) and not with_memory[:, 61:].any()
