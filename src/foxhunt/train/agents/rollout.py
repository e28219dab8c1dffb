"""On-policy rollouts on the device, shared by PPO and PQN: E envs x T steps of the TradingEnv,
the two ways of turning them into targets (GAE for PPO, Q(lambda) returns for PQN), and the
agent skeleton both train through (`OnPolicyAgent`: a round is one rollout and one update,
an update minibatch by minibatch).

A rollout stores what a step needs to be replayed, not the observations: bar indices and
portfolio states (the market rows are gathered again from the device copy of the fxcache when a
minibatch is built, as the DQN's replay does), the branch actions, rewards in learning units, and
where episodes ended. Episode ends are time limits (`episode_bars`, the range's end), not
terminal states: every step also keeps the state the env reached before a restart (`final_t`,
`final_port`), and targets bootstrap from it (Pardo et al. 2018), never from the restarted env.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal, Self

import torch
from torch import nn

from foxhunt.train import aot
from foxhunt.train.agents.common import (
    AgentState,
    Capture,
    FlatGrad,
    Observation,
    Precision,
    autocast,
    capture_restoring,
    clip_and_step,
    compiled,
    copy_weights,
    ensure_adam_state,
    flat_optimiser,
    flatten_into_views,
    mark_step,
    module_weights,
    resolve,
    restart,
    run_state,
    start_fold,
)
from foxhunt.train.agents.common import need as check
from foxhunt.train.data import MarketData
from foxhunt.train.env import EnvConfig, TradingEnv

# (GPU, CPU) defaults of PPO's and PQN's sizes left at None: 16,384 envs x 32 steps x 4 rounds
# (2.1 M env steps an epoch, as the DQN's standard epoch collects 1.6 M) on a GPU.
ONPOLICY_SIZES = {"envs": (16384, 128), "rollout_steps": (32, 64), "rounds": (4, 8)}
COLLECTED = (
    "collect_reward", "collect_trades", "episodes", "collect_short", "collect_flat",
    "collect_long",
)  # fmt: skip
"""The statistics a rollout's steps add up (`OnPolicyAgent._count`), in this order."""


@dataclass(frozen=True)
class OnPolicyConfig:
    """The hyperparameters PPO and PQN share (PPOConfig and PQNConfig add their own). Sizes
    left at None are chosen for the device: a GPU-sized run on CUDA (16,384 envs), a CPU-sized
    one otherwise."""

    hidden: tuple[int, ...] = (256, 256)
    """Widths of the network's hidden layers."""
    envs: int | None = None
    """Parallel environments (default: 16384 on a GPU, 128 on a CPU)."""
    rollout_steps: int | None = None
    """Steps per env in a rollout (default: 32 on a GPU, 64 on a CPU)."""
    rounds: int | None = None
    """Rollouts (each followed by its update) per epoch (default: 4 on a GPU, 8 on a CPU)."""
    update_epochs: int = 4
    """Passes over each rollout."""
    minibatches: int = 4
    """Minibatches per pass (each envs * rollout_steps / minibatches samples)."""
    lr: float = 3e-4
    """Adam learning rate at the start of a fold."""
    anneal_lr: bool = True
    """Anneal the learning rate linearly to 0 over the fold's rounds."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW's; Loshchilov & Hutter, 2019): each step shrinks every
    weight by lr * weight_decay before Adam's update, so it anneals with the learning rate.
    0: plain Adam, bit for bit."""
    max_grad_norm: float = 0.5
    """Global gradient-norm clip."""
    reward_scale: float = 1e4
    """Rewards (returns as fractions of notional) are learned in basis points."""
    precision: Precision = "auto"
    """Matrix work in bfloat16 autocast (auto: on CUDA)."""
    capture: Capture = "auto"
    """CUDA graphs for the rollout and the update (auto: on CUDA)."""
    compile: bool | None = None
    """torch.compile the loss and the optimiser step before capture (default: on with graphs)."""
    compile_mode: Literal["default", "aot"] = "default"
    """"aot" (which turns `compile` on, on a CPU as well): a minibatch's loss, gradient and
    optimiser step, and the evaluation's step, compiled ahead of time by AOTInductor into the
    compile cache and loaded from there by the task that built them and by every later one,
    which then traces and compiles nothing (foxhunt.train.aot). Experimental: its numbers
    equal the default mode's to float rounding."""

    device_sized: ClassVar[tuple[str, ...]] = ("envs",)
    """Sizes that, left at None on a GPU, foxhunt.train.sizer.agent_sizes fits to free memory."""

    micro_batches_are: ClassVar[str] = "minibatches"
    """What `micro_batches` counts, for the error that refuses sizes it does not divide."""

    def resolved(self, device: torch.device) -> Self:
        return resolve(self, device, ONPOLICY_SIZES)

    @property
    def micro_batches(self) -> int:
        """The equal parts an update's pass cuts a rollout into, a gradient each."""
        return self.minibatches

    def __post_init__(self) -> None:
        need = functools.partial(check, self)
        need(len(self.hidden) > 0 and min(self.hidden) >= 1, "hidden", "widths must be >= 1")
        for k in ("envs", "rollout_steps", "rounds"):
            need(getattr(self, k) is None or getattr(self, k) >= 1, k, "must be at least 1")
        for k in ("update_epochs", "minibatches"):
            need(getattr(self, k) >= 1, k, "must be at least 1")
        for k in ("lr", "max_grad_norm", "reward_scale"):
            need(getattr(self, k) > 0 and math.isfinite(getattr(self, k)), k, "must be > 0")
        wd = self.weight_decay
        need(wd >= 0 and math.isfinite(wd), "weight_decay", "must be >= 0 and finite")
        if self.envs is not None and self.rollout_steps is not None:
            n = self.envs * self.rollout_steps
            if n % self.micro_batches:
                raise ValueError(
                    f"envs * rollout_steps = {n} must divide into {self.micro_batches_are} = "
                    f"{self.micro_batches} equal micro-batches"
                )


class Rollout:
    """Buffers [T, E] of one rollout, overwritten in place each round (captured graphs keep
    their addresses)."""

    def __init__(self, steps: int, envs: int, device: torch.device):
        T, E = steps, envs
        self.T, self.E = T, E
        self.bar = torch.zeros(T, E, dtype=torch.long, device=device)
        self.port = torch.zeros(T, E, 3, device=device)
        self.act = torch.zeros(T, E, 3, dtype=torch.long, device=device)
        self.reward = torch.zeros(T, E, device=device)
        self.done = torch.zeros(T, E, dtype=torch.bool, device=device)
        self.final_t = torch.zeros(T, E, dtype=torch.long, device=device)
        self.final_port = torch.zeros(T, E, 3, device=device)
        self.u = torch.zeros(T, E, device=device)  # restart draws, refreshed per rollout

    def step(
        self, k: int, env: TradingEnv, actions: torch.Tensor, reward_scale: float
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Step every env with branch actions [E, 3] and record step k (the bar and portfolio
        must have been recorded by the caller before it chose the actions). Returns (reward,
        filled trade, done) in the env's units, for statistics."""
        t, r, filled, done, fport = env.step(
            actions[:, 0], actions[:, 1], actions[:, 2], self.u[k], final=True
        )
        self.act[k].copy_(actions)
        self.reward[k].copy_(r * reward_scale)
        self.done[k].copy_(done)
        self.final_t[k].copy_(t + 1)
        self.final_port[k].copy_(fport)
        return r, filled, done

    def flat(self, x: torch.Tensor) -> torch.Tensor:
        """[T, E, ...] -> [T E, ...] (step-major)."""
        return x.reshape(self.T * self.E, *x.shape[2:])


def gae(
    reward: torch.Tensor,
    value: torch.Tensor,
    next_value: torch.Tensor,
    done: torch.Tensor,
    gamma: float,
    lam: float,
) -> torch.Tensor:
    """Generalised advantage estimates (Schulman et al. 2016) [T, E] in float32.

    delta_t = r_t + gamma * V(s'_t) - V(s_t), where s'_t is the state step t reached (before a
    restart: `next_value` holds its value), and A_t = delta_t + gamma * lam * A_{t+1}, cut where
    an episode ended at step t (the next step belongs to another episode)."""
    reward, value, next_value = reward.float(), value.float(), next_value.float()
    delta = reward + gamma * next_value - value
    keep = (~done).float() * (gamma * lam)
    adv = torch.zeros_like(delta)
    run = torch.zeros_like(delta[0])
    for k in range(delta.shape[0] - 1, -1, -1):
        run = delta[k] + keep[k] * run
        adv[k] = run
    return adv


def lambda_returns(
    reward: torch.Tensor, next_q: torch.Tensor, done: torch.Tensor, gamma: float, lam: float
) -> torch.Tensor:
    """Peng's Q(lambda) returns [T, E] as PQN computes them (Gallici et al. 2024, after Peng and
    Williams 1996): G_t = r_t + gamma * ((1 - lam) * max_a Q(s'_t, a) + lam * G_{t+1}), with
    G_{t+1} replaced by max_a Q(s'_t, a) where the episode ended at step t and at the rollout's
    last step. `next_q` [T, E] is max_a Q of the state step t reached (before any restart)."""
    reward, next_q = reward.float(), next_q.float()
    out = torch.zeros_like(reward)
    run = next_q[-1]
    for k in range(reward.shape[0] - 1, -1, -1):
        boot = torch.where(done[k], next_q[k], (1.0 - lam) * next_q[k] + lam * run)
        run = reward[k] + gamma * boot
        out[k] = run
    return out


class OnPolicyAgent(FlatGrad, AgentState):
    """The trainer's state for one task of an on-policy agent: its network (`make_net(cfg)`),
    Adam (with decoupled weight decay) over one flat buffer, the env, the rollout buffers, the
    rounds' learning-rate schedule and the CUDA graphs of the rollout and the update. A
    subclass (PPO, PQN) adds `u_act` (the uniform draws its actions take, refreshed each
    rollout) and defines `_rollout` (fill `roll`), `_update` (its targets, then each minibatch
    through `_learn_minibatch`), `_minibatch` (one minibatch's loss, gradient and step, with
    FlatGrad's `_zero_grad` and `_backward`, and `_grad_step`), `_read` (its statistics) and
    `greedy`.

    With `compile_mode="aot"` a minibatch's step is compiled ahead of time
    (foxhunt.train.aot): traced once into a package in the compile cache, loaded from there by
    every later task. The rollout is not compiled in either mode (on a GPU it is one CUDA
    graph)."""

    u_act: torch.Tensor

    def __init__(
        self, cfg, env_cfg: EnvConfig, data: MarketData, seed: int,
        make_net: Callable[..., nn.Module], n_stats: int, adam_eps: float = 1e-8,
    ):  # fmt: skip
        dev = data.device
        self.cfg = cfg = cfg.resolved(dev)
        self.data, self.device = data, dev
        torch.manual_seed(seed)  # the weights' initialisation
        # Every draw of training comes from the agent's own generator (AgentState).
        self.gen = torch.Generator(dev).manual_seed(seed)
        self.net = make_net(cfg).to(dev)
        self.params = list(self.net.parameters())
        self.flat = flatten_into_views(self.params)
        self.init_state = {k: v.clone() for k, v in self.net.state_dict().items()}
        self.lr = torch.full((), cfg.lr, device=dev)  # set per round, read by captured steps
        # A minibatch's step compiled ahead of time (`_aot_step`), by torch.compile (its loss
        # and the optimiser's step, below and in the subclass), or neither.
        self.aot = cfg.compile and cfg.compile_mode == "aot"
        self.minibatch_aot: aot.Step | None = None  # built at the first minibatch
        adam = dict(lr=self.lr, eps=adam_eps, weight_decay=cfg.weight_decay,
                    decoupled_weight_decay=True, foreach=False)  # fmt: skip
        self.opt = flat_optimiser(self.flat, jit=cfg.compile and not self.aot, aot=self.aot,
                                  **adam)  # fmt: skip
        self.env = TradingEnv(env_cfg, cfg.envs, data.close, data.high, data.low, data.ret1)
        self.state = Observation(data, env_cfg.memory_decay, env_cfg.forecast)
        self.roll = Rollout(cfg.rollout_steps, cfg.envs, dev)
        self.n = cfg.rollout_steps * cfg.envs
        self.stats = torch.zeros(n_stats, device=dev)
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.step_marks: list | None = None  # the benchmark's (common.mark_step)
        self.rounds = cfg.rounds
        self.round = 0  # rounds done in this fold (host counter: the schedule is set per round)
        self.total_rounds = 1
        if cfg.compile and not self.aot:
            self._step = compiled(self._step)
        ensure_adam_state(self.opt, self.flat)

    def _autocast(self):
        return autocast(self.cfg.precision, self.device)

    # ------------------------------------------------------------------ fold
    def reset_fold(self, train_lo: int, train_hi: int, seed: int) -> None:
        self.gen.manual_seed(seed)
        restart(self.net, self.init_state, [self.stats], self.opt)
        self.lr.fill_(self.cfg.lr)
        self.round = 0
        start_fold(self.data, self.env, train_lo, train_hi, self.cfg.envs, self.gen)

    def begin_epoch(self, epoch: int, epochs: int) -> None:
        self.total_rounds = epochs * self.rounds
        self.round = epoch * self.rounds

    def _schedule(self, frac: float) -> None:
        """The coming round's settings, in place, at `frac` of the fold's rounds: the learning
        rate annealed linearly to 0 (`anneal_lr`)."""
        cfg = self.cfg
        self.lr.fill_(cfg.lr * (1.0 - frac) if cfg.anneal_lr else cfg.lr)

    # ------------------------------------------------------------------ a round
    def _rollout(self) -> None:
        raise NotImplementedError

    collected_at: ClassVar[int]
    """Where the six statistics of the rollouts' collection (COLLECTED) start in `stats`."""

    def _count(self, a: torch.Tensor, r: torch.Tensor, filled: torch.Tensor,
               done: torch.Tensor) -> None:  # fmt: skip
        """A rollout step's share of the collection statistics (`Rollout.step`'s rewards,
        units filled and episode ends, and the directions of the actions `a`)."""
        s = self.stats[self.collected_at : self.collected_at + len(COLLECTED)]
        s[0] += r.sum()
        s[1] += filled.abs().sum()
        s[2] += done.sum()
        s[3:6] += (a[:, :1] == torch.arange(3, device=a.device)).sum(0)

    def read_stats(self) -> dict[str, float]:
        """The epoch's statistics, read from `stats` (its rounds' sums) and zeroed there: the
        subclass's losses and charts (`_read`), then the collection's."""
        v = self.stats.tolist()
        self.stats.zero_()
        rounds = max(self.rounds, 1)
        steps = rounds * self.cfg.update_epochs * self.cfg.minibatches
        return {**self._read(v, rounds, steps), **self._collected(v, rounds)}

    def _read(self, v: list[float], rounds: int, steps: int) -> dict[str, float]:
        """The subclass's statistics from the sums `v` over the epoch's `rounds` and their
        `steps` (minibatch steps, every pass's over every rollout)."""
        raise NotImplementedError

    def _collected(self, v: list[float], rounds: int) -> dict[str, float]:
        """The charts of the collection's sums in `v` over the epoch's `rounds`: the reward in
        basis points and the units traded a step, episodes ended, and the fraction of steps
        short, flat and long."""
        reward, trades, episodes, *sides = v[self.collected_at : self.collected_at + 6]
        c = rounds * self.n
        return {
            "charts/collect_reward_bps": reward / c * 1e4,
            "charts/collect_turnover": trades / c,
            "charts/episodes": episodes,
            **{f"charts/collect_{d}": n / c for d, n in zip(("short", "flat", "long"), sides,
                                                             strict=True)},
        }  # fmt: skip

    def _update(self) -> None:
        raise NotImplementedError

    def collect(self) -> None:
        self._schedule(self.round / max(self.total_rounds, 1))
        self.roll.u.uniform_(generator=self.gen)
        self.u_act.uniform_(generator=self.gen)
        if "rollout" in self.graphs:
            self.graphs["rollout"].replay()
        else:
            self._rollout()

    def _step(self) -> torch.Tensor:
        """Clip the gradient to the global norm, Adam; the norm before clipping."""
        return clip_and_step(self.flat, self.opt, self.cfg.max_grad_norm)

    # ------------------------------------------------------------------ a minibatch
    def _minibatch(self, idx: torch.Tensor) -> None:
        """Learn from the rollout's rows `idx` (step-major, as `Rollout.flat`): the loss, its
        gradient (`_zero_grad`, `_backward`) and the optimiser's step (`_grad_step`)."""
        raise NotImplementedError

    def _learn_minibatch(self, idx: torch.Tensor) -> None:
        """`_minibatch(idx)`, compiled ahead of time with `compile_mode="aot"`."""
        if not self.aot:
            self._minibatch(idx)
            return
        if self.minibatch_aot is None:
            self._aot_step(idx)
        self.minibatch_aot(idx)

    def _grad_step(self) -> torch.Tensor:
        """The flat gradient clipped and Adam's step (`_step`); the norm before clipping."""
        self._gather_grad()
        return self._step()

    def _aot_step(self, idx: torch.Tensor) -> None:
        """The minibatch's step from the compile cache, traced and built first where it is not
        there (the state is restored after the trace)."""
        name = f"{type(self).__name__.removesuffix('Agent').lower()}-minibatch"
        body = functools.partial(self._traced_step, self._minibatch)
        self.minibatch_aot = aot.Step(self, name, body, (torch.zeros_like(idx),),
                                      repr((self.cfg, self.env.cfg)), self.snapshot,
                                      self.restore)  # fmt: skip

    def learn(self) -> None:
        if "update" in self.graphs:
            self.graphs["update"].replay()
        else:
            self._update()
        mark_step(self.step_marks, self.device)  # a step here: one whole update
        self.round += 1

    # ------------------------------------------------------------------ weights
    def weights(self) -> dict[str, torch.Tensor]:
        return module_weights(self.net)

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        copy_weights(self.weights(), weights)

    # ------------------------------------------------------------------ capture
    def capture(self) -> None:
        """The rollout and the whole update as two CUDA graphs (the state is restored after
        the warm-up: training from here on equals eager training)."""

        def warmup():
            self._rollout()
            for _ in range(2):  # the first backward passes initialise autograd's state
                self._update()

        blocks = {"rollout": self._rollout, "update": self._update}
        self.graphs.update(capture_restoring(self, warmup, blocks))

    # ------------------------------------------------------------------ state
    def _state_tensors(self) -> dict[str, torch.Tensor]:
        st = module_weights(self.net) | run_state(self.env, self.opt, self.flat, self.data)
        st["lr"], st["stats"] = self.lr, self.stats
        return st
