"""PPO and PQN parts against hand computation and slow references; their rollouts against the
env; gradient accumulation; determinism, resume and learning through `foxhunt train`."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from foxhunt.train import EnvConfig, PPOConfig, PQNConfig, TrainConfig, run_train
from foxhunt.train.agents.ppo import (
    PPOAgent,
    clipped_losses,
    log_prob_entropy,
    mode,
    sample,
)
from foxhunt.train.agents.pqn import PQNAgent
from foxhunt.train.agents.rollout import gae, lambda_returns
from foxhunt.train.env import BRANCHES, DIRECTIONS, SIZES
from foxhunt.train.tracking import NullLogger
from marketdata import random_market
from trainruns import EpochRecorder, Killed, metrics_of, served_and_trained_orders

PPO_TINY = PPOConfig(
    hidden=(32, 32), envs=16, rollout_steps=16, rounds=2, minibatches=2, update_epochs=2
)
PQN_TINY = PQNConfig(hidden=(32, 32), envs=16, rollout_steps=16, rounds=2, minibatches=2)


# ------------------------------------------------------------------------------ targets
def episodes(T: int, E: int, seed: int):
    g = np.random.default_rng(seed)
    reward = g.normal(size=(T, E))
    value = g.normal(size=(T, E))
    next_value = g.normal(size=(T, E))
    done = g.random((T, E)) < 0.2
    return reward, value, next_value, done


def test_gae_equals_the_sum_of_discounted_deltas_up_to_each_episode_end():
    """A_t = sum_l (gamma lam)^l delta_{t+l}, l up to the step where the episode ended (that
    step's delta included) or the rollout's last step; delta_t = r_t + gamma V(s'_t) - V(s_t)
    with s'_t the state step t reached."""
    T, E, gamma, lam = 13, 5, 0.9, 0.8
    r, v, nv, done = episodes(T, E, 0)
    delta = r + gamma * nv - v
    want = np.zeros((T, E))
    for e in range(E):
        for t in range(T):
            for ll in range(T - t):
                want[t, e] += (gamma * lam) ** ll * delta[t + ll, e]
                if done[t + ll, e]:
                    break
    got = gae(*(torch.tensor(x, dtype=torch.float32) for x in (r, v, nv)),
              torch.tensor(done), gamma, lam)  # fmt: skip
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)
    assert got.dtype == torch.float32


def test_lambda_returns_equal_the_weighted_n_step_returns():
    """Peng's Q(lambda) return as the lambda-weighted mixture of n-step returns:
    G = (1 - lam) sum_{n<N} lam^(n-1) G(n) + lam^(N-1) G(N), where G(n) = sum_{i<n} gamma^i
    r_{t+i} + gamma^n max Q(s'_{t+n-1}) and N runs to the episode's end or the rollout's."""
    T, E, gamma, lam = 11, 4, 0.8, 0.65
    r, _, q, done = episodes(T, E, 1)
    want = np.zeros((T, E))
    for e in range(E):
        for t in range(T):
            N = 1
            while t + N - 1 < T - 1 and not done[t + N - 1, e]:
                N += 1

            def G(n, t=t, e=e):
                disc = sum(gamma**i * r[t + i, e] for i in range(n))
                return disc + gamma**n * q[t + n - 1, e]

            want[t, e] = (1 - lam) * sum(lam ** (n - 1) * G(n) for n in range(1, N))
            want[t, e] += lam ** (N - 1) * G(N)
    got = lambda_returns(torch.tensor(r), torch.tensor(q), torch.tensor(done), gamma, lam)
    np.testing.assert_allclose(got.numpy(), want, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------ policy
def test_factorised_log_probs_and_entropy_by_hand():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(6, sum(BRANCHES), generator=g)
    actions = torch.tensor([[0, 4, 1], [2, 0, 0], [1, 2, 1], [0, 0, 0], [2, 4, 1], [1, 3, 0]])
    logp, ent = log_prob_entropy(logits, actions)
    for i in range(6):
        lp, h, off = 0.0, 0.0, 0
        for b, n in enumerate(BRANCHES):
            x = logits[i, off : off + n].double().numpy()
            p = np.exp(x - x.max())
            p /= p.sum()
            lp += math.log(p[actions[i, b]])
            h -= float((p * np.log(p)).sum())
            off += n
        assert logp[i].item() == pytest.approx(lp, abs=1e-5)
        assert ent[i].item() == pytest.approx(h, abs=1e-5)


def test_sampling_draws_each_branch_from_its_softmax_and_the_mode_is_the_argmax():
    logits = torch.tensor([[0.3, -1.0, 1.2, 0.0, 0.5, -0.5, 2.0, 0.1, 0.7, -0.2]])
    n = 200_000
    u = torch.rand(n, sum(BRANCHES), generator=torch.Generator().manual_seed(1))
    a = sample(logits.expand(n, -1), u)
    off = 0
    for b, k in enumerate(BRANCHES):
        p = torch.softmax(logits[0, off : off + k], 0).numpy()
        freq = np.bincount(a[:, b].numpy(), minlength=k) / n
        np.testing.assert_allclose(freq, p, atol=4 * np.sqrt(0.25 / n))
        off += k
    assert mode(logits).tolist() == [[2, 3, 0]]


def test_clipped_surrogate_and_value_loss_by_hand():
    logp = torch.tensor([0.0, -0.5, -1.0, -2.0])
    old = torch.tensor([-0.3, -0.5, -0.6, -1.9])
    adv = torch.tensor([1.0, -2.0, 0.5, -1.0])
    value = torch.tensor([0.5, 1.0, -1.0, 2.0])
    old_v = torch.tensor([0.0, 1.1, -0.5, 1.0])
    ret = torch.tensor([1.0, 0.0, 0.0, 1.5])
    clip = 0.2
    pg, vl, kl, cf = clipped_losses(logp, old, adv, value, old_v, ret, clip, False)
    ratio = np.exp(logp.numpy() - old.numpy())
    terms = []
    for r, a in zip(ratio, adv.numpy(), strict=True):
        unclipped, clipped = -a * r, -a * min(max(r, 1 - clip), 1 + clip)
        terms.append(max(unclipped, clipped))
    assert pg.item() == pytest.approx(np.mean(terms), rel=1e-6)
    assert vl.item() == pytest.approx(0.5 * np.mean((value.numpy() - ret.numpy()) ** 2))
    assert cf.item() == pytest.approx(np.mean(np.abs(ratio - 1) > clip))
    lr = logp.numpy() - old.numpy()
    assert kl.item() == pytest.approx(np.mean(np.exp(lr) - 1 - lr), rel=1e-5)
    _, vl_c, _, _ = clipped_losses(logp, old, adv, value, old_v, ret, clip, True)
    vc = old_v.numpy() + np.clip(value.numpy() - old_v.numpy(), -clip, clip)
    want = 0.5 * np.mean(np.maximum((value.numpy() - ret.numpy()) ** 2, (vc - ret.numpy()) ** 2))
    assert vl_c.item() == pytest.approx(want, rel=1e-6)


# ------------------------------------------------------------------------------ rollouts
@pytest.mark.parametrize("agent_cls", [PPOAgent, PQNAgent])
def test_rollouts_record_what_the_env_paid_and_where_episodes_ended(agent_cls):
    """Replaying the recorded actions through `TradingEnv.fill` from the recorded portfolio gives
    the recorded rewards; at an episode end the recorded final state is the one that bar's
    order reached, not the restarted env's."""
    data = random_market(3000, 0)
    env_cfg = EnvConfig(episode_bars=5, fee_bps=0.3)
    cfg = PPO_TINY if agent_cls is PPOAgent else PQN_TINY
    agent = agent_cls(dataclasses.replace(cfg, envs=32, rollout_steps=20), env_cfg, data, 0)
    agent.reset_fold(100, 2500, seed=1)
    # The env's entry prices and bars held are not in the rollout: follow them alongside.
    entry, hold = agent.env.entry.clone(), agent.env.hold.clone()
    agent.collect()
    roll, env = agent.roll, agent.env
    pos = roll.port[0, :, 0].clone()
    assert roll.done.any()
    for k in range(roll.T):
        a = roll.act[k]
        target = torch.tensor(DIRECTIONS)[a[:, 0]] * torch.tensor(SIZES)[a[:, 1]]
        r, _, p2, e2, h2 = env.fill(roll.bar[k], pos, entry, hold, target, a[:, 2] == 1)
        torch.testing.assert_close(roll.reward[k], r * cfg.reward_scale)
        final = env.portfolio_of(roll.bar[k] + 1, p2, e2, h2)
        torch.testing.assert_close(roll.final_port[k], final)
        assert torch.equal(roll.final_t[k], roll.bar[k] + 1)
        if k + 1 < roll.T:
            d = roll.done[k]
            # Where the episode went on, the next step starts where this one ended.
            assert torch.equal(roll.bar[k + 1][~d], roll.bar[k][~d] + 1)
            torch.testing.assert_close(roll.port[k + 1][~d], roll.final_port[k][~d])
            assert (roll.port[k + 1][d] == 0).all()  # restarted flat
            pos = torch.where(d, 0.0, p2)
            entry = torch.where(d, data.close[roll.bar[k + 1]], e2)
            hold = torch.where(d, 0.0, h2)


def test_gradient_accumulation_gives_the_update_of_the_whole_minibatch():
    """accumulate=2 splits each minibatch in two and sums the gradients: the same update as one
    pass over the minibatch (advantages normalised over the whole minibatch), within float
    tolerance."""
    data = random_market(3000, 0)

    def run(accumulate):
        cfg = dataclasses.replace(PPO_TINY, accumulate=accumulate)
        agent = PPOAgent(cfg, EnvConfig(episode_bars=64), data, 0)
        agent.reset_fold(100, 2500, seed=1)
        agent.begin_epoch(0, 2)
        agent.collect()
        agent.learn()
        return agent.flat.detach().clone(), agent.read_stats()

    p1, s1 = run(1)
    p2, s2 = run(2)
    torch.testing.assert_close(p2, p1, rtol=1e-4, atol=1e-6)
    assert s2["losses/grad_norm"] == pytest.approx(s1["losses/grad_norm"], rel=1e-4)
    assert s2["losses/pg_loss"] == pytest.approx(s1["losses/pg_loss"], rel=1e-3, abs=1e-6)


def test_ppo_learning_rate_anneals_to_zero_over_the_fold():
    data = random_market(2000, 0)
    agent = PPOAgent(PPO_TINY, EnvConfig(episode_bars=64), data, 0)
    agent.reset_fold(100, 1800, seed=1)
    lrs = []
    for epoch in range(3):
        agent.begin_epoch(epoch, 3)
        for _ in range(agent.rounds):
            agent.collect()
            agent.learn()
            lrs.append(agent.lr.item())
    n = 3 * agent.rounds
    assert lrs == pytest.approx([PPO_TINY.lr * (1 - i / n) for i in range(n)])


# ------------------------------------------------------------------------------ train
def tiny(demo, out, model, **kw) -> TrainConfig:
    cache, folds = demo
    base = dict(
        folds=folds, cache=cache, epochs=3, out=out, tracking="none", eval_segments=64,
        ppo=PPO_TINY, pqn=PQN_TINY, env=EnvConfig(episode_bars=256), run_id="run-1",
        baselines=False, model=model,
    )  # fmt: skip
    return TrainConfig(**(base | kw))


@pytest.mark.parametrize("model", ["ppo", "pqn"])
def test_same_seed_same_metrics_and_a_killed_task_resumes_to_them(demo_es, tmp_path, model):
    """Same seed, same results; a killed task resumes to them, and every epoch it trains after
    the restart to the uninterrupted run's statistics and val metrics."""
    a_log = EpochRecorder()
    a = run_train(tiny(demo_es, tmp_path / "a", model, fold_ids=(0,)), a_log)
    b = run_train(tiny(demo_es, tmp_path / "b", model, fold_ids=(0,)), NullLogger())
    c = run_train(tiny(demo_es, tmp_path / "c", model, fold_ids=(0,), seed=1), NullLogger())
    assert metrics_of(a) == metrics_of(b)
    assert metrics_of(a) != metrics_of(c)

    def kill(fold, epoch):
        if (fold, epoch) == (0, 1):
            raise Killed

    cfg = tiny(demo_es, tmp_path / "k", model, fold_ids=(0,))
    with pytest.raises(Killed):
        run_train(cfg, NullLogger(), on_epoch_end=kill)
    log = EpochRecorder()
    resumed = run_train(cfg, log)
    assert resumed.resumed and metrics_of(resumed) == metrics_of(a)
    assert log.epochs and all(fold == 0 and epoch >= 2 for fold, epoch in log.epochs)
    for key, stats in log.epochs.items():
        assert stats == a_log.epochs[key], key


@pytest.mark.parametrize("model", ["ppo", "pqn"])
def test_checkpoint_acts_as_in_training(demo_es, tmp_path, model):
    """The fold's best checkpoint, loaded by `Policy` outside the trainer, gives the greedy
    actions the trainer's own policy gives with the same weights and normaliser; the memory of
    the order flow runs from the data's first bar in both."""
    from foxhunt.train.agents import agent_class
    from foxhunt.train.policy import Policy

    cfg = tiny(demo_es, tmp_path, model, fold_ids=(1,), epochs=2)
    res = run_train(cfg, NullLogger())
    ckpt = res.run_dir / "fold-1" / "best.safetensors"
    policy = Policy.load(ckpt)
    assert policy.model == model and policy.memory_decay == cfg.env.memory_decay is not None
    got, want = served_and_trained_orders(
        demo_es, ckpt, lambda data: agent_class(model)(cfg.agent_config(), cfg.env, data, 0),
        lo=1000, n=400,
    )  # fmt: skip
    assert (got == want).all()
    # Bars in position beyond a training episode count as one episode's, as the env counts them.
    assert policy.hold_cap == cfg.env.episode_bars / 100
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 50)).astype(np.float32)
    p = np.stack([rng.choice([-1.0, 1.0], 64), rng.normal(size=64), np.full(64, 40.0)], 1)
    capped = p.copy()
    capped[:, 2] = policy.hold_cap
    assert (policy.act(x, p) == policy.act(x, capped)).all()
