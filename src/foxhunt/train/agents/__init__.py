"""The agents `foxhunt train` knows, one file each, behind one small interface.

    dqn   Rainbow DQN over the env's 30 joint actions, prioritised replay (agents/dqn.py)
    ppo   PPO with GAE and a factorised categorical policy over the three branches (agents/ppo.py)
    pqn   PQN: Q(lambda) on the PPO rollout path, no replay, no target network (agents/pqn.py)
    tlob  TLOB, a dual-attention transformer, trained supervised (models/tlob.py)
    cfc   CfC, a closed-form continuous-time (liquid) network, trained supervised (models/cfc.py)
    mamba2  Mamba-2, state-space layers by the chunked SSD algorithm, supervised (models/mamba2.py)
    tft   the Temporal Fusion Transformer, quantile forecasts, supervised (models/tft.py)
    ensemble  supervised models trained side by side, forecasts combined (models/ensemble.py)

The supervised models share one agent (agents/supervised.py: windows, labels, the optimiser,
the policy that trades their predictions); each model file holds its network and config.

The training loop (foxhunt.train.core) builds an agent once per task and drives it through the
`Agent` protocol below; it never looks inside. A new agent is a new file with a config dataclass
and a class that has these methods, plus a line in `AGENTS`; the loop, evaluation, checkpoints,
resume files, baselines and MLflow come with it.

Every agent steps the same `TradingEnv` over the same device copy of the fxcache and sees the
same observation (`common.Observation`): the 50 market columns normalised on the fold's train
range, the three portfolio columns, zero padding to 64.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol

import torch


class Agent(Protocol):
    """What the training loop needs of a model.

    Built once per task (`__init__(cfg, env_cfg, data, seed)`, which also resolves the config's
    device-dependent sizes: `cfg` is the resolved config afterwards), captured once
    (`capture`, only when `cfg.capture == "graph"`), then per fold: `reset_fold`, and per epoch
    `begin_epoch`, `collect`, `learn`, `read_stats`. Collection and learning must not read
    anything back to the host: the loop times them with CUDA events and reads the statistics
    once per epoch."""

    cfg: Any
    """The resolved config (a dataclass): logged as the model's parameters, saved with each
    checkpoint. It has `capture` ("eager" or "graph") and `precision`."""

    collects: bool
    """Whether it steps the env (the RL agents) or not (the supervised models, whose samples
    are the fxcache's bars): without, the loop calls no `collect` and times and logs no
    collection phase."""

    def capture(self) -> None:
        """Capture collection and learning as CUDA graphs (state restored afterwards)."""

    def reset_fold(self, train_lo: int, train_hi: int, seed: int) -> None:
        """Fresh weights, optimiser, buffers and envs for a fold, in place, and the data's
        normaliser fitted on bars [train_lo, train_hi)."""

    def begin_epoch(self, epoch: int, epochs: int) -> None:
        """Schedules that move per epoch (PER's beta, a learning rate): device tensors, set in
        place so that captured graphs see them."""

    def collect(self) -> None:
        """The epoch's environment steps."""

    def learn(self) -> None:
        """The epoch's learning steps."""

    def read_stats(self) -> dict[str, float]:
        """The epoch's statistics (`losses/*`, `charts/*`), one device read, then zeroed."""

    def greedy(self, t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        """Greedy branch actions [K, 3] at bars `t` [K] for portfolio states [K, 3]; graph-safe
        (the evaluator may capture it)."""

    def weights(self) -> dict[str, torch.Tensor]:
        """The tensors acting needs (the checkpoint), live: the loop copies them."""

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        """Copy `weights` (from `weights()`) back in place."""

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Every tensor training changes, copied: for resume files."""

    def restore(self, saved: dict[str, torch.Tensor]) -> None: ...

    def state_mismatch(self, saved: dict[str, torch.Tensor]) -> str | None:
        """Why `saved` does not fit this agent (another version's layout), or None."""

    # Optional (the supervised models have them; the loop calls them where they exist):
    #   calibrate(lo, hi): fit what is fitted on val (the ensemble's weights), each epoch
    #     before the val range is traded;
    #   prepare_eval(lo, hi): predict every bar of a range before the evaluator trades it;
    #   extra_metrics(lo, hi) -> dict: metrics of the range beside the trading ones;
    #   explain(lo, hi) -> dict | None: what the model reads on a range (TFT), per fold.


@dataclass(frozen=True)
class AgentSpec:
    """Where an agent lives: its module and the names of its config and agent classes. Modules
    are imported on use, so `foxhunt train --help` loads none of them twice."""

    module: str
    config: str
    agent: str

    def load(self) -> tuple[type, type]:
        mod = importlib.import_module(self.module)
        return getattr(mod, self.config), getattr(mod, self.agent)


AGENTS: dict[str, AgentSpec] = {
    "dqn": AgentSpec("foxhunt.train.agents.dqn", "DQNConfig", "RainbowAgent"),
    "ppo": AgentSpec("foxhunt.train.agents.ppo", "PPOConfig", "PPOAgent"),
    "pqn": AgentSpec("foxhunt.train.agents.pqn", "PQNConfig", "PQNAgent"),
    "tlob": AgentSpec("foxhunt.train.models.tlob", "TLOBConfig", "SupervisedAgent"),
    "cfc": AgentSpec("foxhunt.train.models.cfc", "CfCConfig", "SupervisedAgent"),
    "mamba2": AgentSpec("foxhunt.train.models.mamba2", "Mamba2Config", "SupervisedAgent"),
    "tft": AgentSpec("foxhunt.train.models.tft", "TFTConfig", "SupervisedAgent"),
    "ensemble": AgentSpec("foxhunt.train.models.ensemble", "EnsembleConfig", "EnsembleAgent"),
}
# The models that predict from windows rather than act on states:
SUPERVISED = ("tlob", "cfc", "mamba2", "tft", "ensemble")


def agent_class(model: str) -> type:
    if model not in AGENTS:
        raise ValueError(f"model {model!r}: choose one of {', '.join(AGENTS)}")
    return AGENTS[model].load()[1]


def policy_module(model: str):
    """The module of an agent (for `acting_net`, which a served checkpoint uses)."""
    return importlib.import_module(AGENTS[model].module)
