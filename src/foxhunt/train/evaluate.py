"""Evaluation of a policy over one range (val or test), all segments in parallel.

The range's bars are cut into `segments` contiguous pieces of equal length, and one env walks
each piece, starting flat; the per-bar returns of the pieces, put back in time order, are the
range's return series. With segments = 1 this is one sequential walk through the range; more
segments trade exactness at the piece boundaries (each starts flat) for speed on a GPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from foxhunt.train.env import BRANCHES, EnvConfig, TradingEnv

# A policy maps (bars [K], portfolio [K, 4]) to branch actions [K, 3].
Policy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Evaluator:
    def __init__(self, env_cfg: EnvConfig, data, segments: int):
        self.data, self.segments = data, segments
        self.env = TradingEnv(env_cfg, segments, data.close, data.high, data.low, data.ret1)

    def run(self, policy: Policy, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-bar returns and filled trades over steps t = lo .. hi - 2 (each reads bar t+1)."""
        n = hi - 1 - lo
        if n < 2:
            raise ValueError(f"range [{lo}, {hi}) is too short to evaluate")
        K = self.segments
        L = math.ceil(n / K)
        dev = self.data.device
        env = self.env
        env.set_range(lo, hi)
        starts = (lo + torch.arange(K, device=dev) * L).clamp(max=hi - 2)
        env.start_at(starts)
        env.episode_bars.fill_(L + 1)  # pieces end by their length, never by the clock
        rets = torch.zeros(L, K, device=dev)
        trades = torch.zeros(L, K, device=dev)
        for k in range(L):
            a = policy(env.t, env.portfolio())
            _, r, f, _ = env.step(a[:, 0], a[:, 1], a[:, 2], starts, restart=False)
            rets[k] = r
            trades[k] = f
        return rets.T.reshape(-1)[:n], trades.T.reshape(-1)[:n]


def random_policy(generator: torch.Generator) -> Policy:
    """Uniformly random branch actions (the baseline a learned policy must beat)."""

    def act(t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        u = torch.rand(len(t), len(BRANCHES), device=t.device, generator=generator)
        n = torch.tensor(BRANCHES, device=t.device)
        return (u * n).long().minimum(n - 1)

    return act
