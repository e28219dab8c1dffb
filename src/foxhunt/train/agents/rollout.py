"""On-policy rollouts on the device, shared by PPO and PQN: E envs x T steps of the TradingEnv,
and the two ways of turning them into targets (GAE for PPO, Q(lambda) returns for PQN).

A rollout stores what a step needs to be replayed, not the observations: bar indices and
portfolio states (the market rows are gathered again from the device copy of the fxcache when a
minibatch is built, as the DQN's replay does), the branch actions, rewards in learning units, and
where episodes ended. Episode ends are time limits (`episode_bars`, the range's end), not
terminal states: every step also keeps the state the env reached before a restart (`final_t`,
`final_port`), and targets bootstrap from it (Pardo et al. 2018), never from the restarted env.
"""

from __future__ import annotations

import torch

from foxhunt.train.env import TradingEnv

# (GPU, CPU) defaults of PPO's and PQN's sizes left at None: 16,384 envs x 32 steps x 4 rounds
# (2.1 M env steps an epoch, as the DQN's standard epoch collects 1.6 M) on a GPU.
ONPOLICY_SIZES = {"envs": (16384, 128), "rollout_steps": (32, 64), "rounds": (4, 8)}


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
