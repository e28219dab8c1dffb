"""The evaluator's pieces give the one sequential walk's result, bit for bit, for policies that
hold positions across piece boundaries and read the whole portfolio (position, unrealised PnL,
bars held); the walk itself (one piece) is checked against hand-computed returns in
test_baselines."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from foxhunt.train.baselines import FLAT, FULL, constant_policy, signal_policy
from foxhunt.train.env import EnvConfig
from foxhunt.train.evaluate import Evaluator, random_policy
from marketdata import random_market

COSTS = EnvConfig(fee_bps=0.1, half_spread_bps=0.25)


def actions(direction: torch.Tensor, size: int = FULL, passive: bool = False) -> torch.Tensor:
    return torch.stack(
        [direction, torch.full_like(direction, size), torch.full_like(direction, int(passive))], 1
    )


def buy_and_hold(t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
    return actions(torch.full_like(t, FLAT + 1))


def portfolio_rule(score: torch.Tensor):
    """Enters on |score| > 0.8, adds size while the trade runs (a partial size first, passive
    limit orders every other bar), takes profit or stops out on the unrealised PnL, and goes
    flat after 12 bars held: every part of the portfolio changes what it does."""

    def act(t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        pos, upnl, held = portfolio.unbind(1)
        s = score.index_select(0, t)
        want = torch.where(s.abs() > 0.8, torch.sign(s), torch.sign(pos)).long() + FLAT
        exit_ = (held * 100 >= 12) | (upnl.abs() > 0.03)
        direction = torch.where(exit_, torch.full_like(want, FLAT), want)
        size = torch.where(pos.abs() < 0.5, torch.full_like(t, 1), torch.full_like(t, FULL))
        passive = (t % 2 == 0).long()
        return torch.stack([direction, size, passive], 1)

    return act


def walk(policy, segments: int, lo: int = 20, hi: int = 620, env: EnvConfig = COSTS):
    data = random_market(640, seed=3)
    ev = Evaluator(env, data, segments)
    r, tr = ev.run(policy, lo, hi)
    return r.clone(), tr.clone(), ev.last_positions.clone(), ev.last_passes


@pytest.mark.parametrize("segments", [3, 16, 599])
@pytest.mark.parametrize("name", ["buy_and_hold", "signal", "signal_threshold", "portfolio"])
def test_pieces_give_the_sequential_walk_bit_for_bit(name, segments):
    score = torch.tensor(np.random.default_rng(4).normal(size=640), dtype=torch.float32)
    policy = {
        "buy_and_hold": buy_and_hold,
        "signal": signal_policy(score),
        "signal_threshold": signal_policy(score, 1.5),
        "portfolio": portfolio_rule(score),
    }[name]
    r1, tr1, pos1, passes1 = walk(policy, 1)
    assert passes1 == 1
    r, tr, pos, _ = walk(policy, segments)
    assert torch.equal(r, r1) and torch.equal(tr, tr1) and torch.equal(pos, pos1)


def test_a_held_position_needs_the_later_passes():
    """The first pass alone (every piece flat) pays an entry at each piece's start: what the
    evaluator returned before its pieces carried their state, and what the passes correct."""
    r1, _, pos1, _ = walk(buy_and_hold, 1)
    r, tr, pos, passes = walk(buy_and_hold, 16)
    assert passes > 1 and torch.equal(r, r1) and torch.equal(pos, pos1) and (pos == 1.0).all()
    assert tr.abs().sum() == 1.0  # one entry, at the range's first bar

    def first_pass_only(t, portfolio):  # marked stochastic: run once, from flat pieces
        return buy_and_hold(t, portfolio)

    first_pass_only.deterministic = False
    ra, tra, _, passes = walk(first_pass_only, 16)
    assert passes == 1 and tra.abs().sum() == 16.0  # an entry at every piece's start
    assert ra.sum() < r1.sum() - 10 * 0.35e-4


def test_a_shorter_range_after_a_longer_one_takes_a_fresh_walk_s_passes():
    """An evaluator's buffers keep the size of the longest range it walked (or `reserve`d): a
    shorter range's passes read its own rows alone. Buy and hold after a walk that stayed short
    over more rows settles in the passes it takes on a fresh evaluator (stale rows read as its
    own would have kept its pieces from passing their starts on: a pass a piece)."""
    data = random_market(640, seed=3)
    fresh = Evaluator(COSTS, data, 16)
    r1, tr1 = (x.clone() for x in fresh.run(buy_and_hold, 300, 620))
    assert fresh.last_passes == 3

    def short_and_hold(t, portfolio):
        return actions(torch.full_like(t, FLAT - 1))

    ev = Evaluator(COSTS, data, 16)
    ev.run(short_and_hold, 20, 620)
    r, tr = ev.run(buy_and_hold, 300, 620)
    assert ev.last_passes == fresh.last_passes
    assert torch.equal(r, r1) and torch.equal(tr, tr1)
    reserved = Evaluator(COSTS, data, 16)
    reserved.reserve(600)  # the longest range up front: one size, one trace and capture
    rows = reserved.rets.shape[0]
    reserved.run(buy_and_hold, 300, 620)
    assert reserved.rets.shape[0] == rows and reserved.last_passes == fresh.last_passes


def test_a_sizeable_trade_run_settles_in_a_few_short_passes():
    score = torch.tensor(np.random.default_rng(5).normal(size=640), dtype=torch.float32)
    data = random_market(640, seed=3)
    ev = Evaluator(COSTS, data, 16)
    steps = []
    ev._step, step = (lambda p: (steps.append(1), step(p))[1]), ev._step
    ev.run(signal_policy(score, 1.0), 20, 620)
    n, L = 599, 38
    assert ev.last_passes == 2 and len(steps) <= L + 2 * 16  # the second pass: a chunk or two
    assert len(steps) < 2 * L and n > L


def test_a_stochastic_policy_runs_once():
    data = random_market(640, seed=3)
    ev = Evaluator(COSTS, data, 16)
    ev.run(random_policy(torch.Generator().manual_seed(0)), 20, 620)
    assert ev.last_passes == 1


def test_a_policy_blind_to_the_portfolio_rejoins_its_path_with_its_position():
    """Buy and hold from foxhunt.train.baselines reads nothing of the portfolio: its pieces
    agree with the walk once their position does (two passes), where the same policy reading
    everything needs a pass a piece (its bars held differ until the range's end)."""
    hold_long = constant_policy(FLAT + 1)
    r1, tr1, pos1, _ = walk(hold_long, 1)
    r, tr, pos, passes = walk(hold_long, 16)
    assert passes == 2 and torch.equal(r, r1) and torch.equal(tr, tr1) and torch.equal(pos, pos1)
    assert walk(buy_and_hold, 16)[3] == 3


def test_declared_portfolio_reads_are_all_a_policy_reads():
    """A policy that declares `portfolio_read` acts the same whatever the columns it leaves out
    hold: the evaluator's early stop relies on it. The baselines and the supervised models'
    greedy policy (their forecasts turned into orders; `flat="hold"` reads the position)."""
    from types import SimpleNamespace

    from foxhunt.train.agents.supervised import SupervisedAgent
    from foxhunt.train.env import PORTFOLIO

    g = torch.Generator().manual_seed(6)
    t = torch.arange(64)
    score = torch.randn(64, generator=g)
    fake = SimpleNamespace(
        pred=torch.randint(0, 3, (64,), generator=g),
        size=torch.randint(0, FULL + 1, (64,), generator=g),
        cfg=SimpleNamespace(flat="hold"),
    )

    def supervised(t, portfolio):
        return SupervisedAgent.greedy(fake, t, portfolio)

    supervised.portfolio_read = SupervisedAgent.greedy.portfolio_read
    for policy in (constant_policy(FLAT + 1), signal_policy(score, 0.5), supervised):
        read = [PORTFOLIO.index(c) for c in policy.portfolio_read]
        port = torch.randn(64, 3, generator=g).round()
        other = torch.randn(64, 3, generator=g) * 5
        other[:, read] = port[:, read]
        assert torch.equal(policy(t, port), policy(t, other))
    assert SupervisedAgent.greedy.portfolio_read == ("position",)


def clocked(period: int):
    """Long or short by turns, flipping after `period` bars held: a path started in another
    phase never rejoins the walk's (its flips stay apart), so only the passes make it exact."""

    def act(t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        pos, _, held = portfolio.unbind(1)
        side = torch.where(pos == 0, torch.ones_like(pos), torch.sign(pos))
        flip = torch.round(held * 100) >= period
        return actions((torch.where(flip, -side, side)).long() + FLAT)

    return act


def test_a_policy_with_its_own_clock_is_exact_and_a_pass_cap_says_how_much_is():
    r1, tr1, pos1, _ = walk(clocked(7), 1)
    r, tr, pos, passes = walk(clocked(7), 16)
    assert passes > 8 and torch.equal(r, r1) and torch.equal(tr, tr1) and torch.equal(pos, pos1)
    data = random_market(640, seed=3)
    ev = Evaluator(COSTS, data, 16)
    rc, _ = ev.run(clocked(7), 20, 620, max_passes=3)
    assert ev.last_passes == 3 and 0 < ev.last_exact < 1
    exact = round(ev.last_exact * len(r1))
    assert exact >= 3 * 38 and torch.equal(rc[:exact], r1[:exact])  # 38 bars a piece
    assert not torch.equal(rc, r1)
    ev.run(clocked(7), 20, 620, max_passes=50)
    assert ev.last_exact == 1.0


def carried_by_loop(state: torch.Tensor, live: int, L: int) -> torch.Tensor:
    """The next pass's starts as the evaluator computed them before, one piece at a time."""
    used, end = state[0].T.tolist(), state[L].T.tolist()
    side = torch.sign(state[:, 0, :live])
    held = ((side == side[0]).all(0) & (side[0] != 0)).tolist()
    start = list(used)
    for k in range(1, live):
        s, u, e = start[k - 1], used[k - 1], end[k - 1]
        if held[k - 1] and (s[0] > 0) == (u[0] > 0) and s[0] != 0 and s != u:
            start[k] = [e[0], s[1], s[2] + e[2] - u[2]]
        else:
            start[k] = e
    return torch.tensor(start, dtype=state.dtype).T


def pass_states(g: torch.Generator, K: int, L: int) -> torch.Tensor:
    """[L + 1, 3, K] states of a pass as the env makes them: each piece from a random start,
    sizes changed at random, on one side all along for ~60% of the pieces (so that runs of
    them pass their starts on), else flipping or going flat now and then; the entry price is set
    where a position opens, the bars held count on it and restart at 0 flat, 1 on opening."""
    state = torch.zeros(L + 1, 3, K)
    for k in range(K):
        pos = float(torch.randint(-2, 3, (), generator=g)) / 2
        entry = 100.0 + float(torch.randint(0, 9, (), generator=g)) if pos else 0.0
        hold = float(torch.randint(1, 40, (), generator=g)) if pos else 0.0
        one_side = pos != 0 and bool(torch.rand((), generator=g) < 0.6)
        for t in range(L + 1):
            state[t, :, k] = torch.tensor([pos, entry, hold])
            size = float(torch.randint(1, 3, (), generator=g)) / 2
            new = (
                (1 if pos > 0 else -1) * size
                if one_side
                else size * float(torch.randint(-1, 2, (), generator=g))
            )
            if new != 0 and (pos == 0 or (new > 0) != (pos > 0)):
                entry, hold = 100.0 + float(torch.randint(0, 9, (), generator=g)), 1.0
            elif new == 0:
                entry, hold = 0.0, 0.0
            else:
                hold += 1.0
            pos = new
    return state


@pytest.mark.parametrize("seed", range(6))
def test_the_next_pass_starts_are_the_piece_by_piece_loop_s(seed):
    """`_carried` (segmented on the device) against the loop over pieces it replaced, on pass
    states the env could make, a few pieces past the range's live ones."""
    g = torch.Generator().manual_seed(seed)
    K, L = 40, 6
    live = K - seed
    state = pass_states(g, K, L)
    ev = Evaluator(COSTS, random_market(64, seed=1), K)
    ev.state = state
    got = ev._carried(live, L)
    assert torch.equal(got, carried_by_loop(state, live, L))
    assert (got[:, live:] == state[0][:, live:]).all()
    held = (torch.sign(state[:, 0]) == torch.sign(state[0, 0])).all(0) & (state[0, 0] != 0)
    assert held.sum() > K // 3 and not torch.equal(
        got, torch.cat([state[0, :, :1], state[L, :, :-1]], 1)
    )


def test_a_compiled_step_gives_the_sequential_walk():
    """Evaluator(compile=True) compiles its step (policy, env step, writes) for runs whose
    policy is graph-safe (`graph=True`): the pieces still give the sequential walk's returns
    (the uncompiled walk in one piece), bit for bit on the CPU. A policy that reads the whole
    portfolio and holds positions across pieces, so that the later passes run compiled too."""
    score = torch.tensor(np.random.default_rng(4).normal(size=640), dtype=torch.float32)
    policy = portfolio_rule(score)
    r1, tr1, pos1, _ = walk(policy, 1)
    ev = Evaluator(COSTS, random_market(640, seed=3), 16, compile=True)
    compiled_step, calls = ev._compiled_step, []
    ev._compiled_step = lambda p: (calls.append(p), compiled_step(p))[1]
    r, tr = ev.run(policy, 20, 620, graph=True)
    assert ev.last_passes > 1 and len(calls) > 38  # every step of the passes, compiled
    assert torch.equal(r, r1) and torch.equal(tr, tr1) and torch.equal(ev.last_positions, pos1)


def side_by_side(policies, chain: torch.Tensor):
    """One policy for an evaluator's chains: env k acts as policies[chain[k]]."""

    def act(t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        a = torch.stack([p(t, portfolio) for p in policies])  # [P, K, 3]
        return a.gather(0, chain.view(1, -1, 1).expand(1, -1, 3))[0]

    return act


@pytest.mark.parametrize("segments", [3, 16, 599])
def test_chains_side_by_side_each_give_their_own_sequential_walk(segments):
    """Five policies in one walk (buy and hold, a signal with and without a threshold, the
    portfolio rule, a clock that never rejoins its path): each chain's returns, trades and
    positions are its policy's own sequential walk, bit for bit, whatever passes the others
    need; a pass cap says how much of the least exact chain is exact."""
    score = torch.tensor(np.random.default_rng(4).normal(size=640), dtype=torch.float32)
    policies = [buy_and_hold, signal_policy(score), signal_policy(score, 1.5),
                portfolio_rule(score), clocked(7)]  # fmt: skip
    ev = Evaluator(COSTS, random_market(640, seed=3), segments, chains=len(policies))
    r, tr = ev.run(side_by_side(policies, ev.chain), 20, 620)
    pos = ev.last_positions
    assert r.shape == tr.shape == pos.shape == (len(policies), 599)
    for c, p in enumerate(policies):
        r1, tr1, pos1, _ = walk(p, 1)
        assert torch.equal(r[c], r1) and torch.equal(tr[c], tr1) and torch.equal(pos[c], pos1), c
    if segments == 16:
        assert ev.last_passes == max(walk(p, 16)[3] for p in policies) > 8  # the clock's
        capped = []
        for p in policies:
            one = Evaluator(COSTS, random_market(640, seed=3), 16)
            one.run(p, 20, 620, max_passes=3)
            capped.append(one.last_exact)
        ev.run(side_by_side(policies, ev.chain), 20, 620, max_passes=3)
        assert ev.last_passes == 3 and ev.last_exact == min(capped) < 1


@pytest.mark.parametrize("seed", range(3))
def test_the_next_pass_starts_of_chains_are_each_chain_s_own(seed):
    """`_carried` over three chains side by side: each chain's starts as the loop over its own
    pieces gives them, its piece 0 never taking the chain before it's end."""
    g = torch.Generator().manual_seed(seed)
    K, L, P = 40, 6, 3
    live = K - seed
    states = [pass_states(g, K, L) for _ in range(P)]
    ev = Evaluator(COSTS, random_market(64, seed=1), K, chains=P)
    ev.state = torch.cat(states, 2)
    got = ev._carried(live, L)
    for c, state in enumerate(states):
        assert torch.equal(got[:, c * K : (c + 1) * K], carried_by_loop(state, live, L)), c
