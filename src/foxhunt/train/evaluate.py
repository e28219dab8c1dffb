"""Evaluation of a policy over one range (val or test), all segments in parallel.

The range's bars are cut into `segments` contiguous pieces of equal length, and one env walks
each piece; the per-bar returns of the pieces, put back in time order, are the range's return
series. The result is the one a sequential walk through the range gives, whatever the number of
pieces (which sets the speed alone):

- A first pass starts every piece flat. Each further pass starts piece k in the state
  (position, entry price, bars held) in which piece k - 1 ended the pass before, until every
  piece starts where its predecessor ends. Piece 0 starts where the walk does, so each pass
  makes at least one more piece exact.
- A pass stops as soon as every piece is back on the path it took the pass before: a
  deterministic policy in the same state at the same bar repeats itself. A policy usually
  changes its position within a few bars of a piece's start, and its path then joins the true
  one: two passes, the second a few bars long.
- A policy that stays on one side (long or short) across many pieces never rejoins its path
  (its bars held differ), so a piece that stayed on one side all along passes on its start
  moved by its length (`_carried`): three passes rather than one a piece.
- A policy function may say which portfolio columns it reads (`portfolio_read`, a subset of
  PORTFOLIO; all by default). The position always decides the rewards, the entry price and
  the bars held only what such a policy does, so one blind to them (a constant or a signal,
  foxhunt.train.baselines) rejoins its path as soon as its position does.
- A stochastic policy (`deterministic = False` on the function, as random_policy) is run once
  from flat pieces: its draws differ from pass to pass.

Several walks of one range can run side by side (`chains`): env c * segments + i walks piece i
of chain c, and a policy reads its envs' chains from `chain` (the baselines: every policy and
threshold in one walk, foxhunt.train.baselines). Each chain's pieces join up as above, its
piece 0 starting flat; each chain's result is the one its own sequential walk gives.

On a GPU one evaluation step (policy, env step, and writing its row of returns at a device-side
step counter) can be captured as a CUDA graph and replayed once per step of the pieces. With
`compile`, that step is also torch.compile'd for policies run with `graph=True` (the caller's
word that the policy is graph-safe): the policy's forward, the env step and the writes fused
into a few kernels. With `compile="aot"` it is compiled ahead of time instead, for a policy
that is a method of an agent (foxhunt.train.aot: a package per policy and buffer size in the
compile cache, loaded by later tasks without tracing).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal

import torch

from foxhunt.train import aot
from foxhunt.train.agents.common import capture_graphs, compiled
from foxhunt.train.env import BRANCHES, PORTFOLIO, EnvConfig, TradingEnv

# A policy maps (bars [K], portfolio [K, 3]) to branch actions [K, 3].
Policy = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

SYNC_STEPS = 16
"""Steps a further pass runs between its checks whether every piece is back on its old path."""

VAL_PASSES = 8
"""Passes the training loop's per-epoch validation may take (`run`'s max_passes). A policy that
keeps an internal clock (its exits and flips timed by the bars held or the unrealised PnL) can
follow a path from a wrong start that never rejoins the true one, each further pass then makes
only one more piece exact, and the walk costs as many steps as a sequential one: up to 35 s
for a 290k-bar range on an H200, where 2-3 passes take ~50 ms. The epochs are chosen on such a
near-exact value; what a fold reports is evaluated exactly (foxhunt.train.core)."""


def default_segments(device: torch.device) -> int:
    """Pieces a range is evaluated in unless a task says otherwise: 4,096 on a GPU (one
    captured step drives them all; over a 290k-bar range on an H200 a trained DQN's exact
    evaluation took 44 ms at 4,096, 56 at 2,048, 76 at 1,024 and 53 at 8,192, which needs a
    third pass), 64 on a CPU (short pieces settle in few steps)."""
    return 4096 if device.type == "cuda" else 64


class Evaluator:
    def __init__(
        self, env_cfg: EnvConfig, data, segments: int, capture: bool = False,
        compile: bool | Literal["aot"] = False, chains: int = 1,
    ):  # fmt: skip
        self.data, self.segments, self.capture, self.chains = data, segments, capture, chains
        self._compiled_step = compiled(self._step) if compile is True else None
        self.aot = compile == "aot"
        self._aot: dict[int, Callable[[Policy], None]] = {}  # by policy, for these buffers
        K = segments * chains
        self.env = TradingEnv(env_cfg, K, data.close, data.high, data.low, data.ret1)
        dev = data.device
        self.k = torch.zeros((), dtype=torch.long, device=dev)  # step counter
        self.starts = torch.zeros(K, dtype=torch.long, device=dev)
        self.chain = torch.arange(K, device=dev) // segments  # each env's chain
        self.piece = torch.arange(K, device=dev) % segments  # its piece in the chain
        self.rets = self.trades = None
        # The state after each step (row 0: before the first) as [steps + 1, 3, K]: position,
        # entry price while in a position (0 flat: a flat env's entry is never read), bars held.
        self.state: torch.Tensor | None = None
        self.last_positions: torch.Tensor | None = None  # positions held over the last run
        self.last_passes = 0  # passes the last run took
        self.last_exact = 1.0  # the fraction of the last run's bars known exact
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}

    def _step(self, policy: Policy) -> None:
        env = self.env
        a = policy(env.t, env.portfolio())
        _, r, f, _ = env.step(a[:, 0], a[:, 1], a[:, 2], self.starts, restart=False)
        self.rets.index_copy_(0, self.k.view(1), r[None])
        self.trades.index_copy_(0, self.k.view(1), f[None])
        self.k.add_(1)
        self.state.index_copy_(0, self.k.view(1), self._key(policy)[None])

    def _key(self, policy: Policy) -> torch.Tensor:
        """[3, K]: the env state that decides the rest of a piece's path for `policy` (see
        `state`; a column the policy does not read is 0)."""
        env = self.env
        read = getattr(policy, "portfolio_read", PORTFOLIO)
        zero = torch.zeros_like(env.entry)
        entry = env.entry if PORTFOLIO[1] in read else zero
        hold = env.hold if PORTFOLIO[2] in read else zero
        return torch.stack([env.pos, torch.where(env.pos != 0, entry, zero), hold])

    def reserve(self, bars: int) -> None:
        """Size the buffers for ranges of up to `bars` bars now (a task's longest val or test
        range), so that every range reuses them: a compiled step is traced, and a captured
        one captured, once rather than again for each longer range."""
        self._buffers(math.ceil((bars - 1) / self.segments))

    def _buffers(self, L: int) -> None:
        if self.rets is None or self.rets.shape[0] < L:
            K, dev = self.segments * self.chains, self.data.device
            self.rets = torch.zeros(L, K, device=dev)
            self.trades = torch.zeros(L, K, device=dev)
            self.state = torch.zeros(L + 1, 3, K, device=dev)
            self.graphs.clear()  # captured against the old buffers
            self._aot.clear()  # compiled for them

    def run(
        self,
        policy: Policy,
        lo: int,
        hi: int,
        graph: bool = False,
        max_passes: int | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-bar returns and filled trades over steps t = lo .. hi - 2 (each reads bar t+1),
        as one sequential walk from flat at `lo` gives them (see the module docstring); the
        positions held over them are in `last_positions` after the call. With `chains`, each
        of the three is [chains, bars], a row a chain.
        With `graph` (and `capture` on), the policy's step is captured the first time and
        replayed after: the policy must be graph-safe (device tensors only, no host reads), as
        the greedy policy is.
        With `max_passes`, the walk stops after that many passes even where pieces are not yet
        exact: `last_exact` says what fraction of the bars is (the pieces up to the first
        whose start is not its predecessor's end; the rest start where the pass before left
        them). A stochastic policy's single pass counts as exact: it has no one walk."""
        n = hi - 1 - lo
        if n < 2:
            raise ValueError(f"range [{lo}, {hi}) is too short to evaluate")
        S, P = self.segments, self.chains
        L = math.ceil(n / S)
        live = math.ceil(n / L)  # pieces that hold bars of the range; the rest repeat its end
        self._buffers(L)
        env = self.env
        env.set_range(lo, hi)
        self.starts.copy_((lo + self.piece * L).clamp(max=hi - 2))
        env.episode_bars.fill_(L + 1)  # pieces end by their length, never by the clock
        key = id(policy)
        step = self._compiled_step if graph and self._compiled_step is not None else self._step
        if graph and self.aot:
            step = self._aot_step(policy)
        graph = graph and self.capture
        if graph and key not in self.graphs:
            self._begin(policy, None)
            self.graphs[key] = self._capture(policy, step)
        g = self.graphs.get(key) if graph else None

        def steps(k: int) -> None:
            for _ in range(k):
                if g is not None:
                    g.replay()
                else:
                    step(policy)

        self._begin(policy, None)
        steps(L)
        self.last_passes, self.last_exact = 1, 1.0
        exact = getattr(policy, "deterministic", True)
        while exact and live > 1:
            begin, end = self.state[0].view(3, P, S), self.state[L].view(3, P, S)
            if torch.equal(begin[..., 1:live], end[..., : live - 1]):
                break
            if max_passes is not None and self.last_passes >= max_passes:
                exact_bars = []
                for joined in (begin[..., 1:live] == end[..., : live - 1]).all(0).tolist():
                    pieces = 1 + (joined.index(False) if False in joined else len(joined))
                    exact_bars.append(min(pieces * L, n))
                self.last_exact = min(exact_bars) / n
                break
            carried = self._carried(live, L)
            old = self.state.clone()
            self._begin(policy, carried)
            done = 0
            while done < L:
                k = min(SYNC_STEPS, L - done)
                steps(k)
                done += k
                if torch.equal(self.state[done], old[done]):
                    break  # every piece is back on its old path: the rest of the rows stand
            self.last_passes += 1
        pos0 = self.state[0, 0]

        def bars(x: torch.Tensor) -> torch.Tensor:  # [L, K] -> [chains, bars] in time order
            out = x.view(L, P, S).permute(1, 2, 0).reshape(P, S * L)[:, :n]
            return out[0] if P == 1 else out

        self.last_positions = bars(pos0 + self.trades[:L].cumsum(0))
        return bars(self.rets[:L]), bars(self.trades[:L])

    def _aot_step(self, policy: Policy) -> Callable[[Policy], None]:
        """`_step` for `policy` compiled ahead of time, where the policy is a method of an
        agent whose tensors it reads (those and the evaluator's are the package's inputs);
        `_step` itself for any other policy (a closure's tensors would be fixed in it)."""
        owner = getattr(policy, "__self__", None)
        if owner is None or not type(owner).__module__.startswith("foxhunt."):
            return self._step
        if id(policy) not in self._aot:
            read = getattr(policy, "portfolio_read", PORTFOLIO)
            settings = repr(
                (getattr(owner, "cfg", None), self.env.cfg, self.segments, self.chains, read)
            )
            name = f"eval-{type(owner).__name__}.{policy.__name__}"
            # The trace runs a step: `run` starts every range from `_begin` after it.
            one = aot.Step([self, owner], name, lambda: self._step(policy), (), settings,
                           lambda: None, lambda _: None)  # fmt: skip
            self._aot[id(policy)] = lambda _policy: one()
        return self._aot[id(policy)]

    def _carried(self, live: int, L: int) -> torch.Tensor:
        """[3, K] each piece's start for the next pass: piece 0's own; piece k's the end of
        piece k - 1 in this pass, or, where piece k - 1 starts the next pass elsewhere than it
        started this one but on the same side, and stayed on that side all along (long or
        short, whatever its size: the entry price stays, the bars held count on), that start
        moved on by the piece: the same entry, as many more bars held, this pass's end
        position. A policy that holds one side across many pieces then needs one more pass,
        not one a piece. The next pass checks the guess like any other start.

        On the device, without a loop over pieces: every start's position is its predecessor's
        end position, so whether piece k - 1 passes its start on (it stayed on one side, and
        starts the next pass on that side) is known for every k at once; a start that is passed
        on keeps the entry of the last piece that took its predecessor's end (a segmented
        carry: the index of that piece by a running maximum) and adds the bars each piece held
        since (a difference of running sums: bars held are whole numbers, exact in float32).
        Where the start is the one this pass used, passing it on gives the predecessor's end
        (the entry stayed, the bars held counted on), as the loop this replaces did.
        Chains side by side are segmented alike, each from its own piece 0."""
        P, S = self.chains, self.segments
        used, end = self.state[0].view(3, P, S), self.state[L].view(3, P, S)
        # This run's rows alone: past row L the buffer holds a longer range's earlier walk.
        side = torch.sign(self.state[: L + 1, 0].view(L + 1, P, S)[..., :live])
        held = (side == side[0]).all(0) & (side[0] != 0)  # [P, live]
        start = used.clone()
        if live < 2:
            return start.view(3, P * S)
        pos = torch.cat([used[0, :, :1], end[0, :, : live - 1]], -1)  # the next pass's starts
        carry = held[:, :-1] & (torch.sign(pos[:, :-1]) == side[0, :, :-1])  # k - 1 passes on
        k = torch.arange(live, device=used.device).expand(P, live)
        took = torch.cat([torch.ones_like(carry[:, :1]), ~carry], -1)
        last = torch.cummax(torch.where(took, k, torch.zeros_like(k)), -1).values
        base = torch.cat([used[..., :1], end[..., : live - 1]], -1)  # a start that took its own
        more = torch.cumsum(end[2, :, : live - 1] - used[2, :, : live - 1], -1)  # bars held
        bars = torch.cat([used.new_zeros(P, 1), more], -1)
        start[0, :, :live] = pos
        start[1, :, :live] = base[1].gather(-1, last)
        start[2, :, :live] = base[2].gather(-1, last) + bars - bars.gather(-1, last)
        return start.view(3, P * S)

    def _begin(self, policy: Policy, state: torch.Tensor | None) -> None:
        """Every piece at its first bar, flat (None) or in `state` [3, K] (see `_key`; a column
        the policy does not read starts as it would flat); step counter at 0."""
        env = self.env
        env.start_at(self.starts)
        if state is not None:
            pos, entry, hold = state
            read = getattr(policy, "portfolio_read", PORTFOLIO)
            env.pos.copy_(pos)
            if PORTFOLIO[1] in read:
                env.entry.copy_(torch.where(pos != 0, entry, env.entry))
            if PORTFOLIO[2] in read:
                env.hold.copy_(hold)
        self.state[0].copy_(self._key(policy))
        self.k.zero_()

    def _capture(self, policy: Policy, step: Callable) -> torch.cuda.CUDAGraph:
        def one() -> None:
            step(policy)  # the warm-up's effects are reset by the caller's _begin

        return capture_graphs(self.data.device, one, {"step": one})["step"]


def random_policy(generator: torch.Generator) -> Policy:
    """Uniformly random branch actions (the baseline a learned policy must beat)."""

    n = torch.tensor(BRANCHES, device=generator.device)

    def act(t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        u = torch.rand(len(t), len(BRANCHES), device=t.device, generator=generator)
        return (u * n).long().minimum(n - 1)

    act.deterministic = False  # type: ignore[attr-defined]
    return act
