"""The torch trading env against a slow single-env numpy reference written from the rules in
env.py's docstring, on random actions, with episode restarts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from foxhunt.train.env import DIRECTIONS, SIZES, EnvConfig, TradingEnv


def market(n: int, seed: int):
    rng = np.random.default_rng(seed)
    close = 4800.0 * np.exp(np.cumsum(rng.normal(0, 3e-4, n)))
    close = np.round(close / 0.25) * 0.25
    high = close * (1 + rng.uniform(0, 2e-4, n))
    low = close * (1 - rng.uniform(0, 2e-4, n))
    return close, high, low


class RefEnv:
    """One env, plain Python floats (float64), following the documented rules."""

    def __init__(self, cfg: EnvConfig, close, high, low, lo, hi):
        self.cfg, self.c, self.h, self.l, self.lo, self.hi = cfg, close, high, low, lo, hi
        self.ret1 = np.append(close[1:] / close[:-1] - 1.0, 0.0)

    def start(self, t: int, steps: int):
        self.t, self.pos, self.entry, self.hold, self.eq, self.steps = (
            t,
            0.0,
            self.c[t],
            0.0,
            0.0,
            steps,
        )

    def restart_bar(self, u: float) -> int:
        span = np.float32(self.hi - 1 - self.lo)
        return self.lo + min(int(np.float32(u) * span), self.hi - 2 - self.lo)

    def step(self, d: int, s: int, o: int, u: float):
        cfg, t = self.cfg, self.t
        trade = DIRECTIONS[d] * SIZES[s] - self.pos
        c0 = self.c[t]
        if o == 0:
            filled, rate = trade, (cfg.fee_bps + cfg.half_spread_bps) * 1e-4
        else:
            off = cfg.limit_offset_bps * 1e-4
            hit = self.l[t + 1] < c0 * (1 - off) if trade > 0 else self.h[t + 1] > c0 * (1 + off)
            filled, rate = (trade if hit else 0.0), (cfg.fee_bps - cfg.limit_offset_bps) * 1e-4
        new = self.pos + filled
        reward = new * self.ret1[t] - rate * abs(filled)
        opened = np.sign(new) != np.sign(self.pos) and new != 0
        if opened:
            self.entry = c0
        self.hold = 0.0 if new == 0 else (1.0 if opened else self.hold + 1)
        self.eq += reward
        self.steps += 1
        self.pos = new
        done = self.steps >= cfg.episode_bars or t + 1 >= self.hi - 1
        if done:
            self.start(self.restart_bar(u), 0)
        else:
            self.t = t + 1
        return reward, filled, done

    def portfolio(self):
        upnl = self.pos * (self.c[self.t] / self.entry - 1.0)
        return [self.pos, upnl * 100, self.hold / 100]


@pytest.mark.parametrize("seed", [0, 1])
def test_env_matches_numpy_reference_on_random_actions(seed):
    cfg = EnvConfig(episode_bars=37, fee_bps=0.2, half_spread_bps=0.5, limit_offset_bps=0.7)
    n, lo, hi, E, steps = 400, 50, 300, 24, 200
    close, high, low = market(n, seed)
    f32 = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    ret1 = torch.tensor(np.append(close[1:] / close[:-1] - 1.0, 0.0), dtype=torch.float32)
    env = TradingEnv(cfg, E, f32(close), f32(high), f32(low), ret1)
    env.set_range(lo, hi)
    g = torch.Generator().manual_seed(seed)
    u0 = torch.rand(E, generator=g)
    env.reset(u0)
    # The reference uses float32-rounded prices, as the env sees them.
    c32, h32, l32 = (np.float32(a).astype(np.float64) for a in (close, high, low))
    refs = []
    for e in range(E):
        r = RefEnv(cfg, c32, h32, l32, lo, hi)
        r.ret1 = ret1.double().numpy()
        r.start(int(env.t[e]), int(env.steps[e]))
        refs.append(r)
    restarts = 0
    for _ in range(steps):
        d = torch.randint(0, 3, (E,), generator=g)
        s = torch.randint(0, 5, (E,), generator=g)
        o = torch.randint(0, 2, (E,), generator=g)
        u = torch.rand(E, generator=g)
        port = env.portfolio()
        t, reward, filled, done = env.step(d, s, o, u)
        for e, ref in enumerate(refs):
            assert int(t[e]) == ref.t
            np.testing.assert_allclose(port[e].numpy(), ref.portfolio(), rtol=1e-4, atol=2e-5)
            rr, ff, dd = ref.step(int(d[e]), int(s[e]), int(o[e]), float(u[e]))
            assert float(filled[e]) == pytest.approx(ff, abs=1e-6)
            assert float(reward[e]) == pytest.approx(rr, rel=1e-4, abs=1e-9)
            assert bool(done[e]) == dd
            assert float(env.pos[e]) == pytest.approx(ref.pos, abs=1e-6)
            assert int(env.t[e]) == ref.t
            restarts += dd
    assert restarts > E, "the test should cover episode restarts"
    assert (env.t >= lo).all() and (env.t < hi - 1).all()


def test_passive_order_fills_only_when_the_next_bar_trades_through():
    close = np.array([100.0, 100.0, 100.0, 100.0])
    high = np.array([100.0, 100.02, 100.0, 100.0])
    low = np.array([100.0, 99.995, 99.9, 100.0])
    cfg = EnvConfig(fee_bps=0.0, half_spread_bps=0.0, limit_offset_bps=1.0)  # 1 bp = 0.01
    f32 = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    env = TradingEnv(cfg, 1, f32(close), f32(high), f32(low), torch.zeros(4))
    env.set_range(0, 4)
    env.start_at(torch.tensor([0]))
    one = torch.tensor([1])
    # Buy limit at 99.99; bar 1's low 99.995 does not reach it: no fill.
    _, _, filled, _ = env.step(torch.tensor([2]), torch.tensor([4]), one, torch.zeros(1))
    assert float(filled[0]) == 0.0 and float(env.pos[0]) == 0.0
    # Buy limit at 99.99; bar 2's low 99.9 trades through: filled, earning the 1 bp offset.
    _, reward, filled, _ = env.step(torch.tensor([2]), torch.tensor([4]), one, torch.zeros(1))
    assert float(filled[0]) == 1.0 and float(reward[0]) == pytest.approx(1e-4)


def test_full_market_orders_ignore_size_and_order_type():
    """orders=full_market: any size and order type behave as a full-size market order, i.e.
    exactly as the branches env does with size 1.0 and a market order."""
    close, high, low = market(300, 3)
    f32 = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    ret1 = torch.tensor(np.append(close[1:] / close[:-1] - 1.0, 0.0), dtype=torch.float32)
    E, g = 16, torch.Generator().manual_seed(3)
    envs = {}
    for orders in ("full_market", "branches"):
        env = TradingEnv(EnvConfig(orders=orders, episode_bars=50), E, f32(close), f32(high),
                         f32(low), ret1)  # fmt: skip
        env.set_range(10, 290)
        env.reset(torch.rand(E, generator=torch.Generator().manual_seed(0)))
        envs[orders] = env
    full, market_ = torch.full((E,), len(SIZES) - 1), torch.zeros(E, dtype=torch.long)
    for _ in range(120):
        d = torch.randint(0, 3, (E,), generator=g)
        s = torch.randint(0, 5, (E,), generator=g)
        o = torch.randint(0, 2, (E,), generator=g)
        u = torch.rand(E, generator=g)
        got = envs["full_market"].step(d, s, o, u)
        want = envs["branches"].step(d, full, market_, u)
        for a, b in zip(got, want, strict=True):
            assert torch.equal(a, b)
    assert set(envs["full_market"].pos.abs().unique().tolist()) <= {0.0, 1.0}
    with pytest.raises(ValueError, match="orders = 'limit'"):
        EnvConfig(orders="limit")


def test_bars_in_position_count_up_to_the_training_episode_length():
    """A walk longer than a training episode (the evaluator's pieces, a served policy) shows
    the network no more bars in position than an episode can hold: the feature stops at
    episode_bars / 100, while the position itself is held on."""
    n = 40
    close = 100.0 + 0.01 * np.arange(n)
    f32 = lambda a: torch.tensor(a, dtype=torch.float32)  # noqa: E731
    cfg = EnvConfig(episode_bars=8, fee_bps=0.0, half_spread_bps=0.0)
    env = TradingEnv(cfg, 1, f32(close), f32(close), f32(close), torch.zeros(n))
    env.set_range(0, n)
    env.start_at(torch.tensor([0]))
    env.episode_bars.fill_(n)  # as the evaluator sets it: pieces never end by the clock
    held, raw = [], []
    long_full, market = torch.tensor([2]), torch.tensor([0])
    for _ in range(20):
        held.append(float(env.portfolio()[0, 2]))
        raw.append(float(env.hold[0]))
        env.step(long_full, torch.tensor([4]), market, torch.zeros(1))
    assert raw == list(range(20))
    assert held == pytest.approx([min(k, 8) / 100 for k in range(20)])
