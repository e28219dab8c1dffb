"""Training on GPU-resident data: the trading env, the agents (Rainbow DQN, PPO, PQN under
agents/), one training loop, evaluation, baselines, tracking.

Importable without polars, mlflow or kfp (the GPU image has torch, numpy and safetensors). The
names below are imported from their modules when first read."""

import importlib

_WHERE = {
    "DQNConfig": "agents.dqn",
    "RainbowAgent": "agents.dqn",
    "PPOAgent": "agents.ppo",
    "PPOConfig": "agents.ppo",
    "PQNAgent": "agents.pqn",
    "PQNConfig": "agents.pqn",
    "TrainConfig": "core",
    "TrainError": "core",
    "TrainResult": "core",
    "run_train": "core",
    "train_seeds": "core",
    "EnvConfig": "env",
    "TradingEnv": "env",
}
__all__ = sorted(_WHERE)


def __getattr__(name: str):
    """The names above, imported when first read: a step that needs only a light module of the
    package (tracking, for one) does not import torch and the agents with it."""
    if name in _WHERE:
        return getattr(importlib.import_module(f"foxhunt.train.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'foxhunt.train' has no attribute {name!r}")
