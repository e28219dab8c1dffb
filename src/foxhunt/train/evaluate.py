"""Evaluation of a policy over one range (val or test), all segments in parallel.

The range's bars are cut into `segments` contiguous pieces of equal length, and one env walks
each piece, starting flat; the per-bar returns of the pieces, put back in time order, are the
range's return series. With segments = 1 this is one sequential walk through the range; more
segments trade exactness at the piece boundaries (each starts flat) for speed on a GPU.

On a GPU one evaluation step (policy, env step, and writing its row of returns at a device-side
step counter) can be captured as a CUDA graph and replayed once per step of the pieces.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from foxhunt.train.agents.common import capture_graphs
from foxhunt.train.env import BRANCHES, EnvConfig, TradingEnv

# A policy maps (bars [K], portfolio [K, 4]) to branch actions [K, 3].
Policy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class Evaluator:
    def __init__(self, env_cfg: EnvConfig, data, segments: int, capture: bool = False):
        self.data, self.segments, self.capture = data, segments, capture
        self.env = TradingEnv(env_cfg, segments, data.close, data.high, data.low, data.ret1)
        dev = data.device
        self.k = torch.zeros((), dtype=torch.long, device=dev)  # step counter
        self.starts = torch.zeros(segments, dtype=torch.long, device=dev)
        self.rets = self.trades = None
        self.last_positions: torch.Tensor | None = None  # positions held over the last run
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def _step(self, policy: Policy) -> None:
        env = self.env
        a = policy(env.t, env.portfolio())
        _, r, f, _ = env.step(a[:, 0], a[:, 1], a[:, 2], self.starts, restart=False)
        self.rets.index_copy_(0, self.k.view(1), r[None])
        self.trades.index_copy_(0, self.k.view(1), f[None])
        self.k.add_(1)

    def _buffers(self, L: int) -> None:
        if self.rets is None or self.rets.shape[0] < L:
            K, dev = self.segments, self.data.device
            self.rets = torch.zeros(L, K, device=dev)
            self.trades = torch.zeros(L, K, device=dev)
            self.graphs.clear()  # captured against the old buffers

    def run(
        self, policy: Policy, lo: int, hi: int, graph: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-bar returns and filled trades over steps t = lo .. hi - 2 (each reads bar t+1);
        the positions held over them are in `last_positions` after the call.
        With `graph` (and `capture` on), the policy's step is captured the first time and
        replayed after: the policy must be graph-safe (device tensors only, no host reads), as
        the greedy policy is."""
        n = hi - 1 - lo
        if n < 2:
            raise ValueError(f"range [{lo}, {hi}) is too short to evaluate")
        K = self.segments
        L = math.ceil(n / K)
        self._buffers(L)
        env = self.env
        env.set_range(lo, hi)
        dev = self.data.device
        self.starts.copy_((lo + torch.arange(K, device=dev) * L).clamp(max=hi - 2))
        env.start_at(self.starts)
        env.episode_bars.fill_(L + 1)  # pieces end by their length, never by the clock
        self.k.zero_()
        key = id(policy)
        graph = graph and self.capture
        if graph and key not in self.graphs:
            self.graphs[key] = self._capture(policy)
            env.start_at(self.starts)
            self.k.zero_()
        g = self.graphs.get(key) if graph else None
        for _ in range(L):
            if g is not None:
                g.replay()
            else:
                self._step(policy)
        self.last_positions = self.trades[:L].cumsum(0).T.reshape(-1)[:n]  # pieces start flat
        return self.rets[:L].T.reshape(-1)[:n], self.trades[:L].T.reshape(-1)[:n]

    def _capture(self, policy: Policy) -> torch.cuda.CUDAGraph:
        def step() -> None:
            self._step(policy)  # the warm-up's effects are reset by the caller

        return capture_graphs(self.data.device, step, {"step": step})["step"]


def random_policy(generator: torch.Generator) -> Policy:
    """Uniformly random branch actions (the baseline a learned policy must beat)."""

    n = torch.tensor(BRANCHES, device=generator.device)

    def act(t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        u = torch.rand(len(t), len(BRANCHES), device=t.device, generator=generator)
        return (u * n).long().minimum(n - 1)

    return act
