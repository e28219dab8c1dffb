"""Several agents trained side by side in one process: seeds (or hyperparameter variants) of
one model on one fold, over the one resident copy of the data.

A `Cohort` drives its agents through the `Agent` interface (foxhunt.train.agents) as the
training loop drives one: a fold, then per epoch each round's collection and learning. Each
agent draws every random number of its training from its own generator (the RL agents'
`AgentState`), so an agent in a cohort trains exactly as it would alone with the same seed
(tests/test_cohort.py checks the statistics and weights bit for bit). On a GPU each agent's
collection and learning run on a CUDA stream of its own: an agent's step is hundreds of small
kernels that leave most of the SMs idle, and the streams let the other agents' kernels fill
them. With captured graphs (each captured on a stream of its own, so that no two share
cuBLAS's workspace: foxhunt.train.agents.common.capture_graphs) an agent's epoch is a few
graph replays on its stream.

Rainbow DQN agents of one configuration can instead be stacked into one (`stacked=True`,
foxhunt.train.agents.dqn_stacked): one set of kernels as many times wider, rather than
overlapping kernels on streams; `foxhunt train --seeds` stacks them on a GPU.

The agents share the data and so its normaliser, which `reset_fold` fits on the fold's train
range: a cohort trains one fold at a time (folds side by side would need a normaliser each).

`foxhunt train --seeds` (foxhunt.train.core's `_drive`) runs its seeds' epochs with
`train_epoch`; `Cohort` puts a fold, the epochs and the statistics together for a script or a
benchmark (bench/bench_cohort.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from foxhunt.train.agents.common import on_streams
from foxhunt.train.agents.dqn_stacked import StackedRainbow


class Cohort:
    def __init__(self, agents: Sequence, streams: bool | None = None, stacked: bool = False):
        """`agents`: built over one `MarketData`, with the same number of rounds per epoch.
        `streams`: each agent on a CUDA stream of its own (default: on a GPU). `stacked`: the
        agents trained as one (foxhunt.train.agents.dqn_stacked: Rainbow DQN agents of one
        configuration, not yet captured), their steps vmapped into wide kernels; streams are
        then not used."""
        if not agents:
            raise ValueError("a cohort needs at least one agent")
        data = agents[0].data
        if any(a.data is not data for a in agents):
            raise ValueError("a cohort's agents must share one MarketData (one resident copy)")
        rounds = {a.rounds for a in agents}
        if len(rounds) > 1:
            raise ValueError(f"a cohort's agents must run the same rounds per epoch, not {rounds}")
        self.agents = list(agents)
        self.device = data.device
        on_gpu = self.device.type == "cuda"
        if streams and not on_gpu:
            raise ValueError("streams = True needs a CUDA device")
        use = on_gpu if streams is None else streams
        self.stack = StackedRainbow(agents) if stacked else None
        use = use and self.stack is None
        self.streams = [torch.cuda.Stream(self.device) for _ in agents] if use else None

    def __len__(self) -> int:
        return len(self.agents)

    def capture(self) -> None:
        if self.stack is not None:
            self.stack.capture()
            return
        for a in self.agents:
            a.capture()

    def reset_fold(self, train_lo: int, train_hi: int, seeds: Sequence[int]) -> None:
        """Each agent's fold with its own seed (on the default stream: the shared normaliser
        is refitted by each, to the same values)."""
        if len(seeds) != len(self.agents):
            raise ValueError(f"{len(seeds)} seeds for {len(self.agents)} agents")
        for a, s in zip(self.agents, seeds, strict=True):
            a.reset_fold(train_lo, train_hi, s)

    def begin_epoch(self, epoch: int, epochs: int) -> None:
        for a in self.agents:
            a.begin_epoch(epoch, epochs)

    def train_epoch(self, mark: Callable[[str], None] | None = None) -> None:
        if self.stack is not None:
            train_epoch([self.stack], None, mark)
        else:
            train_epoch(self.agents, self.streams, mark)

    def read_stats(self) -> list[dict[str, float]]:
        return [a.read_stats() for a in self.agents]


def train_epoch(
    agents: Sequence, streams: Sequence | None, mark: Callable[[str], None] | None = None
) -> None:
    """One epoch of `agents`: per round each one's collection (where they collect: the
    supervised models do not), then each one's learning (each agent on its stream where there
    are streams: `on_streams`), with `mark("collect")` and `mark("learn")` after them (the
    training loop's phase clocks)."""
    for _ in range(agents[0].rounds):
        if agents[0].collects:
            on_streams(agents, streams, lambda a: a.collect())
            if mark is not None:
                mark("collect")
        on_streams(agents, streams, lambda a: a.learn())
        if mark is not None:
            mark("learn")
