"""PPO (Schulman et al. 2017) on the GPU-resident env, in the style of cleanrl's ppo.py.

- Policy: a factorised categorical over the env's three branches (direction 3, size 5, order
  type 2): one MLP with 10 logits, log pi(a | s) = the sum of the three branches' log-probs, the
  entropy likewise. The critic is a separate MLP. Orthogonal initialisation, tanh (cleanrl).
- A round: a rollout of `rollout_steps` steps of `envs` envs (agents/rollout.py: bar indices,
  portfolio states, actions, rewards, episode ends, on the device), then GAE(lambda) over it,
  then `update_epochs` passes of `minibatches` shuffled minibatches (the permutation is drawn
  on the device), each split into `accumulate` micro-batches whose gradients add up before one
  step, so the effective batch does not depend on memory.
- Loss: the clipped surrogate on normalised advantages, the value loss (clipped optionally, as
  in the PPO2 baselines), an entropy bonus. The global gradient norm is clipped; the norm before
  clipping is what `losses/grad_norm` shows. The learning rate is a device tensor, annealed
  linearly to 0 over the fold's rounds.
- Episode ends are time limits: the advantage bootstraps from the value of the state the episode
  reached (rollout.py), the GAE recursion is cut there.
- Precision: bf16 autocast for the matrix work on a GPU; logits are cast to float32 before the
  softmax, and rewards, values, advantages, ratios and losses are float32.

Built for capture as the DQN is: static shapes, everything on the device, no host reads inside
an epoch. On a GPU the rollout and the whole update (every epoch and minibatch) are each one CUDA
graph, the loss and the optimiser step compiled inside them.
"""

from __future__ import annotations

import functools
import itertools
import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from foxhunt.train.agents.common import IN_DIM, compiled
from foxhunt.train.agents.common import need as check
from foxhunt.train.agents.rollout import COLLECTED, OnPolicyAgent, OnPolicyConfig, gae
from foxhunt.train.data import MarketData
from foxhunt.train.env import BRANCHES, EnvConfig

N_LOGITS = sum(BRANCHES)
STATS = (
    "pg_loss", "v_loss", "entropy", "approx_kl", "clipfrac", "grad_norm", "loss", *COLLECTED,
    "value", "lr",
)  # fmt: skip


@dataclass(frozen=True)
class PPOConfig(OnPolicyConfig):
    """PPO hyperparameters beside those it shares with PQN (OnPolicyConfig): the actor's and
    the critic's hidden layers are two MLPs of `hidden`'s shape."""

    accumulate: int = 1
    """Micro-batches per minibatch whose gradients are summed before one optimiser step: the
    same updates in less memory."""
    gamma: float = 0.5
    """Discount per bar. The demo market's edge lasts a few bars (foxhunt.synth.market)."""
    gae_lambda: float = 0.9
    """GAE's lambda."""
    clip_coef: float = 0.2
    """Clip range of the probability ratio."""
    clip_vloss: bool = False
    """Clip the value loss around the rollout's values (the PPO2 baselines' variant)."""
    vf_coef: float = 0.5
    """Weight of the value loss."""
    ent_coef: float = 0.01
    """Weight of the entropy bonus."""
    norm_adv: bool = True
    """Normalise advantages per minibatch."""
    adam_eps: float = 1e-5
    """Adam epsilon (cleanrl's)."""

    micro_batches_are: ClassVar[str] = "minibatches * accumulate"

    @property
    def micro_batches(self) -> int:
        return self.minibatches * self.accumulate

    def __post_init__(self) -> None:
        need = functools.partial(check, self)
        need(self.accumulate >= 1, "accumulate", "must be at least 1")
        super().__post_init__()
        need(0.0 <= self.gamma <= 1.0, "gamma", "must be in [0, 1]")
        need(0.0 <= self.gae_lambda <= 1.0, "gae_lambda", "must be in [0, 1]")
        need(self.clip_coef > 0, "clip_coef", "must be > 0")
        for k in ("vf_coef", "ent_coef"):
            need(getattr(self, k) >= 0, k, "must not be negative")
        need(self.adam_eps > 0 and math.isfinite(self.adam_eps), "adam_eps", "must be > 0")


# ---------------------------------------------------------------------------------- network
def mlp(sizes: tuple[int, ...], out: int, out_std: float) -> nn.Sequential:
    """tanh MLP with orthogonal weights (gain sqrt 2) and an output layer of gain `out_std`."""
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.Tanh()]
    layers.append(nn.Linear(sizes[-1], out))
    for m in layers:
        if isinstance(m, nn.Linear):
            nn.init.orthogonal_(m.weight, out_std if m is layers[-1] else math.sqrt(2))
            nn.init.zeros_(m.bias)
    return nn.Sequential(*layers)


class ActorCritic(nn.Module):
    def __init__(self, hidden: tuple[int, ...]):
        super().__init__()
        self.actor = mlp((IN_DIM, *hidden), N_LOGITS, 0.01)
        self.critic = mlp((IN_DIM, *hidden), 1, 1.0)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, 10] (float32) and values [B] (float32)."""
        return self.actor(x).float(), self.critic(x).float().squeeze(-1)


def branch_logp(logits: torch.Tensor) -> list[torch.Tensor]:
    """Per-branch log-probabilities [B, n_b] of the factorised policy."""
    return [F.log_softmax(x, -1) for x in logits.split(BRANCHES, -1)]


def log_prob_entropy(logits: torch.Tensor, actions: torch.Tensor, entropy: bool = True):
    """log pi(a | s) [B] and the policy's entropy [B] (None without `entropy`: the rollout
    needs only the log-probabilities): sums over the three branches."""
    logp = torch.zeros_like(logits[:, 0])
    ent = torch.zeros_like(logp) if entropy else None
    for b, lp in enumerate(branch_logp(logits)):
        logp = logp + lp.gather(1, actions[:, b : b + 1]).squeeze(1)
        if entropy:
            ent = ent - (lp.exp() * lp).sum(-1)
    return logp, ent


def sample(logits: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Branch actions [B, 3] drawn from the factorised policy with the Gumbel-max trick from
    uniforms u [B, 10] (drawn by the caller: graph-safe and reproducible)."""
    g = -torch.log(-torch.log(u.clamp(1e-10, 1.0 - 1e-7)))
    return torch.stack([x.argmax(-1) for x in (logits + g).split(BRANCHES, -1)], 1)


def mode(logits: torch.Tensor) -> torch.Tensor:
    """The most likely branch actions [B, 3]: the greedy policy."""
    return torch.stack([x.argmax(-1) for x in logits.split(BRANCHES, -1)], 1)


def clipped_losses(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    adv: torch.Tensor,
    value: torch.Tensor,
    old_value: torch.Tensor,
    ret: torch.Tensor,
    clip: float,
    clip_vloss: bool,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """PPO's clipped surrogate and value losses (means over the batch), the approximate KL
    (the k3 estimator, cleanrl's `approx_kl`) and the clipped fraction."""
    log_ratio = logp - old_logp
    ratio = log_ratio.exp()
    pg = torch.maximum(-adv * ratio, -adv * ratio.clamp(1.0 - clip, 1.0 + clip)).mean()
    if clip_vloss:
        v_clip = old_value + (value - old_value).clamp(-clip, clip)
        v_loss = 0.5 * torch.maximum((value - ret).square(), (v_clip - ret).square()).mean()
    else:
        v_loss = 0.5 * (value - ret).square().mean()
    with torch.no_grad():
        kl = ((ratio - 1.0) - log_ratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip).float().mean()
    return pg, v_loss, kl, clipfrac


# ---------------------------------------------------------------------------------- agent
class PPOAgent(OnPolicyAgent):
    """PPO's state for one task: the actor-critic, and per rollout step the behaviour's log
    probabilities and the critic's values (OnPolicyAgent has the rest)."""

    collected_at = STATS.index(COLLECTED[0])

    def __init__(self, cfg: PPOConfig, env_cfg: EnvConfig, data: MarketData, seed: int):
        super().__init__(
            cfg, env_cfg, data, seed, lambda c: ActorCritic(c.hidden), len(STATS), cfg.adam_eps
        )
        cfg, dev = self.cfg, self.device
        T, E = cfg.rollout_steps, cfg.envs
        self.logp = torch.zeros(T, E, device=dev)
        self.value = torch.zeros(T, E, device=dev)
        self.next_value = torch.zeros(T, E, device=dev)
        self.u_act = torch.zeros(T, E, N_LOGITS, device=dev)
        self.adv = torch.zeros(T, E, device=dev)  # the rollout's advantages (GAE)
        self.ret = torch.zeros(T, E, device=dev)  # and the critic's targets
        self.micro = self.n // (cfg.minibatches * cfg.accumulate)
        if cfg.compile and not self.aot:
            self._micro_loss = compiled(self._micro_loss)

    # ------------------------------------------------------------------ rollout
    def _rollout(self) -> None:
        roll, env, s = self.roll, self.env, self.stats
        for k in range(roll.T):
            t, port = env.t.clone(), env.portfolio()
            roll.bar[k].copy_(t)
            roll.port[k].copy_(port)
            with torch.no_grad(), self._autocast():
                logits, value = self.net(self.state(t, port))
            a = sample(logits, self.u_act[k])
            logp, _ = log_prob_entropy(logits, a, entropy=False)
            r, filled, done = roll.step(k, env, a, self.cfg.reward_scale)
            with torch.no_grad(), self._autocast():
                next_value = self.net.critic(self.state(roll.final_t[k], roll.final_port[k]))
            self.logp[k].copy_(logp)
            self.value[k].copy_(value)
            self.next_value[k].copy_(next_value.float().squeeze(-1))
            self._count(a, r, filled, done)
            s[13] += value.mean()

    # ------------------------------------------------------------------ update
    def _micro_loss(self, bar, port, act, old_logp, adv, old_value, ret):
        cfg = self.cfg
        with self._autocast():
            logits, value = self.net(self.state(bar, port))
        logp, ent = log_prob_entropy(logits, act)
        pg, v_loss, kl, clipfrac = clipped_losses(
            logp, old_logp, adv, value, old_value, ret, cfg.clip_coef, cfg.clip_vloss
        )
        ent = ent.mean()
        loss = pg - cfg.ent_coef * ent + cfg.vf_coef * v_loss
        return loss, torch.stack([pg, v_loss, ent, kl, clipfrac]).detach()

    def _update(self) -> None:
        cfg, roll = self.cfg, self.roll
        with torch.no_grad():
            adv = gae(
                roll.reward, self.value, self.next_value, roll.done, cfg.gamma, cfg.gae_lambda
            )
            self.adv.copy_(adv)
            torch.add(self.adv, self.value, out=self.ret)
        rows = self.micro * cfg.accumulate
        for _ in range(cfg.update_epochs):
            perm = torch.rand(self.n, device=self.device, generator=self.gen).argsort()
            for mb in range(cfg.minibatches):
                self._learn_minibatch(perm[mb * rows : (mb + 1) * rows])
        self.stats[14] += self.lr

    def _minibatch(self, idx: torch.Tensor) -> None:
        cfg, roll = self.cfg, self.roll
        M, A = self.micro, cfg.accumulate
        data = [roll.flat(x) for x in (roll.bar, roll.port, roll.act, self.logp, self.adv,
                                       self.value, self.ret)]  # fmt: skip
        self._zero_grad()
        # Advantages are normalised over the whole minibatch, so that its micro-batches add up
        # to the gradient of the minibatch taken at once.
        a_mb = data[4].index_select(0, idx)
        mu, sd = (a_mb.mean(), a_mb.std() + 1e-8) if cfg.norm_adv else (0.0, 1.0)
        for j in range(A):
            b = [x.index_select(0, idx[j * M : (j + 1) * M]) for x in data]
            b[4] = (b[4] - mu) / sd
            loss, parts = self._micro_loss(*b)
            self._backward(loss / A)
            self.stats[0:5] += parts / A
            self.stats[6] += loss.detach() / A
        self.stats[5] += self._grad_step()

    def _read(self, v: list[float], rounds: int, steps: int) -> dict[str, float]:
        return {
            "losses/loss": v[6] / steps,
            "losses/pg_loss": v[0] / steps,
            "losses/v_loss": v[1] / steps,
            "losses/entropy": v[2] / steps,
            "losses/approx_kl": v[3] / steps,
            "losses/clipfrac": v[4] / steps,
            "losses/grad_norm": v[5] / steps,
            "losses/value": v[13] / (rounds * self.cfg.rollout_steps),
            "charts/lr": v[14] / rounds,
        }

    # ------------------------------------------------------------------ act
    def greedy(self, t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        with torch.no_grad(), self._autocast():
            logits = self.net.actor(self.state(t, portfolio)).float()
        return mode(logits)


# ---------------------------------------------------------------------------------- serving
def acting_net(cfg: PPOConfig, tensors: dict[str, torch.Tensor]):
    """A checkpoint's greedy policy (the mode of each branch) on the CPU: states [n, IN_DIM]
    -> branch actions [n, 3]."""
    net = ActorCritic(cfg.hidden)
    net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
    net.eval()

    def act(state: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return mode(net.actor(state).float())

    return act
