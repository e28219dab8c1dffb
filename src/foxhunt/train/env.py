"""A vectorised trading environment in torch: E parallel envs stepping through bars of one range.

Every env holds a position in one instrument. At bar t the agent sees the normalised market
features of bar t, an average of the recent order flow (`EnvConfig.memory_decay`) and its
portfolio state, and picks three branched actions:

    direction  {short, flat, long}            -> sign of the target position
    size       {0.2, 0.4, 0.6, 0.8, 1.0}      -> fraction of the allowed notional
    order type {market, passive limit}

The trade is target - position. A market order fills at bar t's close and pays the fee plus half
the spread. A passive limit order rests `limit_offset_bps` better than bar t's close and fills
only when bar t+1 trades through it (its low below a buy limit, its high above a sell limit): it
pays the fee and earns the offset, or does not fill and the position stays. The reward of the
step is the simple return earned over bar t -> t+1, as a fraction of the notional:

    reward = new_position * (close[t+1] / close[t] - 1) - cost_rate * |filled trade|

The three branches form 30 joint actions (`JOINT`), which is what the agents choose among. The
arithmetic of a step is `TradingEnv.fill`, a pure function of the bar, the position state and
the order, broadcast over any shape: the agent's replay stores states and actions, and replays
the rewards with it.

Episodes start at random bars of the range (flat) and end after `episode_bars` steps or at the
end of the range. Both are time limits, not terminal states: the agent bootstraps through them
(Pardo et al. 2018), and the state holds nothing that a time limit resets. An ended env
restarts at once at a new random bar, so every env steps on every call and the shapes never
change. All state lives in persistent device tensors that are updated in place, so a block of
steps can be captured as a CUDA graph; the range bounds are device tensors too, so moving to
another fold does not invalidate a captured graph.

The random numbers of a step (restart bars) come in as an argument: the step itself draws none,
which keeps it deterministic for a test against a slow numpy reference
(`tests/test_train_env.py`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

DIRECTIONS = (-1.0, 0.0, 1.0)
SIZES = (0.2, 0.4, 0.6, 0.8, 1.0)
ORDER_TYPES = ("market", "passive_limit")
BRANCHES = (len(DIRECTIONS), len(SIZES), len(ORDER_TYPES))
JOINT = tuple(
    (d, s, o) for d in range(BRANCHES[0]) for s in range(BRANCHES[1]) for o in range(BRANCHES[2])
)
"""The 30 joint actions, as (direction, size, order type) branch indices."""
PORTFOLIO = ("position", "unrealised_pnl_pct", "bars_in_position_100")
HOLD_SCALE = 100.0
"""Bars in position are given in hundreds (up to the config's `episode_bars`)."""


def joint_table(device: torch.device | str = "cpu") -> torch.Tensor:
    """[30, 3] branch indices of the joint actions."""
    return torch.tensor(JOINT, dtype=torch.long, device=device)


@dataclass(frozen=True)
class EnvConfig:
    """The trading environment: episodes, costs and fills."""

    episode_bars: int = 2048
    """Steps per training episode before an env restarts at a random bar of the range."""
    fee_bps: float = 0.1
    """Exchange and clearing fee per unit of notional traded, in basis points."""
    half_spread_bps: float = 0.25
    """Half the bid-ask spread, paid by market orders, in basis points (ES: 1 tick ~ 0.5 bp)."""
    limit_offset_bps: float = 0.5
    """Distance of a passive limit order from the close, in basis points (earned when it fills)."""
    orders: Literal["branches", "full_market"] = "branches"
    """branches: every order as chosen (direction, size, order type); full_market: every order
    at full size as a market order, the size and order-type choices ignored (a simpler market,
    where only the direction matters)."""
    memory_decay: float | None = 0.5
    """What the agents remember of recent order flow: beside bar t's 50 columns they see each
    order-flow column's exponential moving average over the bars up to t, decaying by this
    factor a bar (`foxhunt.train.data.ema`; 0.5: half the weight on bar t itself). The order
    flow shows a persistent pressure only in part each bar, so its recent average estimates
    the pressure better than one bar does. None: the bar's columns alone."""
    forecast: bool = True
    """The agents also see a linear forecast of the next bar's return: a ridge regression of
    it on the columns they see (the 50 and the memory), fitted in closed form on each fold's
    train range and standardised there (`foxhunt.train.data.MarketData.use_forecast`; the
    `ridge_memory` baseline's forecast). A network then need not find that linear read by
    gradient steps on noisy rewards, where the closed form does better on the demo market
    (docs/features.md has each agent with and without it). False (`--env.no-forecast`): the
    state without it, as before 2026-12-07."""

    def __post_init__(self) -> None:
        if self.orders not in ("branches", "full_market"):
            raise ValueError(f"orders = {self.orders!r}: choose branches or full_market")
        if self.memory_decay is not None and not 0.0 <= self.memory_decay < 1.0:
            raise ValueError(f"memory_decay = {self.memory_decay}: must be in [0, 1), or None")
        if self.episode_bars < 2:
            raise ValueError(f"episode_bars = {self.episode_bars}: must be at least 2")
        for k in ("fee_bps", "half_spread_bps", "limit_offset_bps"):
            if getattr(self, k) < 0:
                raise ValueError(f"{k} = {getattr(self, k)}: must not be negative")


class TradingEnv:
    """E envs over bars [lo, hi) of `close`, `high`, `low` (float32 device tensors [N]).

    `ret1[t]` is close[t+1]/close[t] - 1, computed once in float64 by the caller (MarketData).
    """

    def __init__(
        self,
        cfg: EnvConfig,
        n_envs: int,
        close: torch.Tensor,
        high: torch.Tensor,
        low: torch.Tensor,
        ret1: torch.Tensor,
    ):
        dev = close.device
        self.cfg, self.E, self.device = cfg, n_envs, dev
        self.close, self.high, self.low, self.ret1 = close, high, low, ret1
        self.dir_tab = torch.tensor(DIRECTIONS, device=dev)
        self.size_tab = torch.tensor(SIZES, device=dev)
        bp = 1e-4
        self.market_cost = (cfg.fee_bps + cfg.half_spread_bps) * bp
        self.passive_cost = (cfg.fee_bps - cfg.limit_offset_bps) * bp
        self.offset = cfg.limit_offset_bps * bp
        # Range bounds: device scalars, so a captured graph survives a fold change.
        self.lo = torch.zeros((), dtype=torch.long, device=dev)
        self.hi = torch.zeros((), dtype=torch.long, device=dev)
        # Episode length: a device scalar too (evaluation sets it per fold).
        self.episode_bars = torch.full((), cfg.episode_bars, dtype=torch.long, device=dev)
        E = n_envs
        self.t = torch.zeros(E, dtype=torch.long, device=dev)
        self.pos = torch.zeros(E, device=dev)
        self.entry = torch.zeros(E, device=dev)  # close where the position was opened
        self.hold = torch.zeros(E, device=dev)  # bars in the current position
        self.steps = torch.zeros(E, dtype=torch.long, device=dev)

    # ------------------------------------------------------------------ state
    def set_range(self, lo: int, hi: int) -> None:
        if hi - lo < 3:
            raise ValueError(f"range [{lo}, {hi}) is too short for an episode (3 bars at least)")
        self.lo.fill_(lo)
        self.hi.fill_(hi)

    def reset(self, u: torch.Tensor, stagger: bool = True) -> None:
        """Flat envs at random bars of the range; `u` uniform [E] picks them. With `stagger`,
        episode clocks start at random points so that the envs do not all restart together."""
        self.start_at(self._start(u))
        if stagger:
            self.steps.copy_((u * 7919.0).frac().mul(self.episode_bars).long())

    def start_at(self, starts: torch.Tensor) -> None:
        """Flat envs at the given bars (evaluation segments); clocks at zero."""
        self.t.copy_(starts)
        self.pos.zero_()
        self.entry.copy_(self.close.index_select(0, self.t))
        self.hold.zero_()
        self.steps.zero_()

    def _start(self, u: torch.Tensor) -> torch.Tensor:
        # Any bar of [lo, hi - 2] can start an episode (a step at t reads bar t + 1).
        span = (self.hi - 1 - self.lo).to(u.dtype)
        return self.lo + (u * span).long().clamp(max=self.hi - 2 - self.lo)

    def portfolio(self) -> torch.Tensor:
        """[E, 3]: position, unrealised PnL (%), bars in position (up to episode_bars) / 100."""
        return self.portfolio_of(self.t, self.pos, self.entry, self.hold)

    # ------------------------------------------------------------------ step
    def order(self, a_dir: torch.Tensor, a_size: torch.Tensor, a_type: torch.Tensor):
        """(target position, passive?) of branch actions, as the env executes them."""
        if self.cfg.orders == "full_market":
            return self.dir_tab[a_dir], torch.zeros_like(a_type, dtype=torch.bool)
        return self.dir_tab[a_dir] * self.size_tab[a_size], a_type == 1

    def _at(self, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        return x.index_select(0, t.reshape(-1)).reshape(t.shape)

    def fill(
        self,
        t: torch.Tensor,
        pos: torch.Tensor,
        entry: torch.Tensor,
        hold: torch.Tensor,
        target: torch.Tensor,
        passive: torch.Tensor,
    ) -> tuple[torch.Tensor, ...]:
        """One step's arithmetic at bars `t` from (position, entry price, bars held) towards
        `target` with a market (passive False) or passive limit order; every argument broadcasts
        against the others. Returns (reward, filled trade, position, entry, bars held) after."""
        trade = target - pos
        c0 = self._at(self.close, t)
        t1 = t + 1
        through = torch.where(
            trade > 0,
            self._at(self.low, t1) < c0 * (1.0 - self.offset),
            self._at(self.high, t1) > c0 * (1.0 + self.offset),
        )
        filled = torch.where(~passive | through, trade, torch.zeros_like(trade))
        new_pos = pos + filled
        rate = torch.where(passive, self.passive_cost, self.market_cost)
        reward = new_pos * self._at(self.ret1, t) - rate * filled.abs()
        opened = (torch.sign(new_pos) != torch.sign(pos)) & (new_pos != 0)
        entry = torch.where(opened, c0, entry)
        hold = torch.where(new_pos == 0, 0.0, torch.where(opened, 1.0, hold + 1.0))
        return reward, filled, new_pos, entry, hold

    def portfolio_of(
        self, t: torch.Tensor, pos: torch.Tensor, entry: torch.Tensor, hold: torch.Tensor
    ) -> torch.Tensor:
        """[..., 3] portfolio features (PORTFOLIO) of positions held at bars `t`. Bars in
        position count up to the config's `episode_bars`: no training episode holds longer, so
        a longer walk (evaluation, serving) shows the network no value it never learned from
        (a position held through a month's ~8,000 test bars read 80, where training never saw more
        than 5.12 at the demo's 512-bar episodes)."""
        upnl = pos * (self._at(self.close, t) / entry - 1.0)
        held = hold.clamp(max=float(self.cfg.episode_bars)) / HOLD_SCALE
        return torch.stack([pos, upnl * 100.0, held], -1)

    def step(
        self,
        a_dir: torch.Tensor,
        a_size: torch.Tensor,
        a_type: torch.Tensor,
        u_restart: torch.Tensor,
        restart: bool = True,
        final: bool = False,
    ) -> tuple[torch.Tensor, ...]:
        """One step of every env. Returns (t, reward, filled trade, done) of this step;
        the env state moves on to the next bar (or a restart when `done` and `restart`).
        With `final`, also the portfolio features [E, 3] at bar t + 1 before any restart: the
        state a time-limited episode reached, which on-policy agents bootstrap from."""
        t = self.t.clone()
        target, passive = self.order(a_dir, a_size, a_type)
        reward, filled, new_pos, entry, hold = self.fill(
            t, self.pos, self.entry, self.hold, target, passive
        )
        t1 = t + 1
        steps = self.steps + 1
        done = (steps >= self.episode_bars) | (t1 >= self.hi - 1)
        if restart:
            t_next = torch.where(done, self._start(u_restart), t1)
        else:
            t_next = torch.where(done, t, t1)
        self.t.copy_(t_next)
        self.pos.copy_(torch.where(done, 0.0, new_pos))
        self.entry.copy_(torch.where(done, self.close.index_select(0, t_next), entry))
        self.hold.copy_(torch.where(done, 0.0, hold))
        self.steps.copy_(torch.where(done, 0, steps))
        if final:
            return t, reward, filled, done, self.portfolio_of(t1, new_pos, entry, hold)
        return t, reward, filled, done
