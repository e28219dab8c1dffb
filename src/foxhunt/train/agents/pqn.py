"""PQN (Gallici et al. 2024, "Simplifying Deep Temporal Difference Learning"): Q-learning on
on-policy rollouts, with no replay buffer and no target network, stabilised by LayerNorm.

- Q-network: an MLP with LayerNorm before each ReLU, one Q-value per joint action (the env's 30:
  direction x size x order type, as the DQN's head).
- A round: a rollout of `rollout_steps` steps of `envs` envs with epsilon-greedy actions on the
  current network (agents/rollout.py, shared with PPO), Peng's Q(lambda) returns computed
  backwards over it from max_a Q of each state a step reached, then `update_epochs` passes of
  `minibatches` shuffled minibatches of 1/2 (Q(s, a) - G)^2 (regression onto fixed targets).
- Epsilon is annealed linearly from `eps_start` to `eps_end` over the first `eps_decay` of the
  fold's rounds, the learning rate linearly to 0; both are device tensors set per round.
- Episode ends are time limits: the returns bootstrap from the state the episode reached.

As PPO: static shapes, all on the device, the rollout and the update each one CUDA graph on a
GPU, bf16 autocast for the matrix work and float32 targets and losses.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn

from foxhunt.train.agents.common import IN_DIM, compiled
from foxhunt.train.agents.common import need as check
from foxhunt.train.agents.rollout import (
    COLLECTED,
    OnPolicyAgent,
    OnPolicyConfig,
    lambda_returns,
)
from foxhunt.train.data import MarketData
from foxhunt.train.env import JOINT, EnvConfig, joint_table

N_ACTIONS = len(JOINT)
STATS = ("loss", "grad_norm", "q_taken", *COLLECTED, "epsilon", "lr")


@dataclass(frozen=True)
class PQNConfig(OnPolicyConfig):
    """PQN hyperparameters beside those it shares with PPO (OnPolicyConfig): `hidden` are the
    Q-network's hidden layers, each LayerNorm + ReLU."""

    update_epochs: int = 2
    """Passes over each rollout."""
    max_grad_norm: float = 10.0
    """Global gradient-norm clip."""
    gamma: float = 0.9
    """Discount per bar. The demo market's edge has a half-life of ~7 bars, and PQN's
    Q(lambda) targets at 0.9 beat 0.5 there (docs/learning-notes.md)."""
    q_lambda: float = 0.65
    """lambda of the Q(lambda) returns (purejaxql's Atari value)."""
    eps_start: float = 1.0
    """Epsilon at the start of a fold."""
    eps_end: float = 0.05
    """Epsilon after the decay."""
    eps_decay: float = 0.25
    """Fraction of the fold's rounds over which epsilon decays."""

    def __post_init__(self) -> None:
        super().__post_init__()
        need = functools.partial(check, self)
        for k in ("gamma", "q_lambda", "eps_start", "eps_end"):
            need(0.0 <= getattr(self, k) <= 1.0, k, "must be in [0, 1]")
        need(0.0 < self.eps_decay <= 1.0, "eps_decay", "must be in (0, 1]")


# ---------------------------------------------------------------------------------- network
class QNet(nn.Module):
    """Linear -> LayerNorm -> ReLU per hidden layer, then Q-values of the 30 joint actions."""

    def __init__(self, hidden: tuple[int, ...]):
        super().__init__()
        layers: list[nn.Module] = []
        for a, b in zip((IN_DIM, *hidden[:-1]), hidden, strict=True):
            layers += [nn.Linear(a, b), nn.LayerNorm(b), nn.ReLU()]
        layers.append(nn.Linear(hidden[-1], N_ACTIONS))
        self.net = nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x).float()


# ---------------------------------------------------------------------------------- agent
class PQNAgent(OnPolicyAgent):
    """PQN's state for one task: the Q-network, the exploration rate and the next states'
    values of a rollout (OnPolicyAgent has the rest)."""

    collected_at = STATS.index(COLLECTED[0])

    def __init__(self, cfg: PQNConfig, env_cfg: EnvConfig, data: MarketData, seed: int):
        super().__init__(cfg, env_cfg, data, seed, lambda c: QNet(c.hidden), len(STATS))
        cfg, dev = self.cfg, self.device
        T, E = cfg.rollout_steps, cfg.envs
        self.eps = torch.full((), cfg.eps_start, device=dev)
        self.next_q = torch.zeros(T, E, device=dev)
        self.u_act = torch.zeros(T, E, 2, device=dev)  # explore?, which random action
        self.joint = joint_table(dev)
        self.joint_stride = torch.tensor([10, 2, 1], device=dev)  # branches -> joint index
        self.returns = torch.zeros(T, E, device=dev)  # the rollout's Q(lambda) returns
        self.taken = torch.zeros(T, E, dtype=torch.long, device=dev)  # its joint actions
        self.mb = self.n // cfg.minibatches
        if cfg.compile and not self.aot:
            self._loss = compiled(self._loss)

    def _q(self, t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), self._autocast():
            return self.net(self.state(t, portfolio))

    def _schedule(self, frac: float) -> None:
        """The learning rate (OnPolicyAgent) and epsilon, decayed linearly from eps_start to
        eps_end over the first eps_decay of the fold's rounds."""
        super()._schedule(frac)
        cfg = self.cfg
        self.eps.fill_(
            cfg.eps_start + (cfg.eps_end - cfg.eps_start) * min(1.0, frac / cfg.eps_decay)
        )

    # ------------------------------------------------------------------ rollout
    def _rollout(self) -> None:
        roll, env, s = self.roll, self.env, self.stats
        for k in range(roll.T):
            t, port = env.t.clone(), env.portfolio()
            roll.bar[k].copy_(t)
            roll.port[k].copy_(port)
            q = self._q(t, port)
            u = self.u_act[k]
            rnd = (u[:, 1] * N_ACTIONS).long().clamp(max=N_ACTIONS - 1)
            j = torch.where(u[:, 0] < self.eps, rnd, q.argmax(-1))
            a = self.joint.index_select(0, j)
            r, filled, done = roll.step(k, env, a, self.cfg.reward_scale)
            self.next_q[k].copy_(self._q(roll.final_t[k], roll.final_port[k]).max(-1).values)
            s[2] += q.gather(1, j[:, None]).mean()
            self._count(a, r, filled, done)

    # ------------------------------------------------------------------ update
    def _loss(self, bar, port, joint, target) -> torch.Tensor:
        with self._autocast():
            q = self.net(self.state(bar, port))
        return 0.5 * (q.gather(1, joint[:, None]).squeeze(1) - target).square().mean()

    def _update(self) -> None:
        cfg, roll = self.cfg, self.roll
        with torch.no_grad():
            self.returns.copy_(
                lambda_returns(roll.reward, self.next_q, roll.done, cfg.gamma, cfg.q_lambda)
            )
            self.taken.copy_((roll.act * self.joint_stride).sum(-1))
        for _ in range(cfg.update_epochs):
            perm = torch.rand(self.n, device=self.device, generator=self.gen).argsort()
            for mb in range(cfg.minibatches):
                self._learn_minibatch(perm[mb * self.mb : (mb + 1) * self.mb])
        self.stats[9] += self.eps
        self.stats[10] += self.lr

    def _read(self, v: list[float], rounds: int, steps: int) -> dict[str, float]:
        return {
            "losses/loss": v[0] / steps,
            "losses/grad_norm": v[1] / steps,
            "losses/q_taken": v[2] / (rounds * self.cfg.rollout_steps),
            "charts/epsilon": v[9] / rounds,
            "charts/lr": v[10] / rounds,
        }

    def _minibatch(self, idx: torch.Tensor) -> None:
        roll = self.roll
        self._zero_grad()
        data = (roll.bar, roll.port, self.taken, self.returns)
        loss = self._loss(*(roll.flat(x).index_select(0, idx) for x in data))
        self._backward(loss)
        gn = self._grad_step()
        self.stats[0:2] += torch.stack([loss.detach(), gn])

    # ------------------------------------------------------------------ act
    def greedy(self, t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        return self.joint.index_select(0, self._q(t, portfolio).argmax(-1))

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        return super()._state_tensors() | {"eps": self.eps}


# ---------------------------------------------------------------------------------- serving
def acting_net(cfg: PQNConfig, tensors: dict[str, torch.Tensor]):
    """A checkpoint's greedy policy on the CPU: states [n, IN_DIM] -> branch actions [n, 3]."""
    net = QNet(cfg.hidden)
    net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
    net.eval()
    joint = joint_table()

    def act(state: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return joint[net(state).argmax(-1)]

    return act
