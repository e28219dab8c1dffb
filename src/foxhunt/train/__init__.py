"""Training on GPU-resident data: the trading env, Rainbow DQN, evaluation, tracking.

Importable without polars, mlflow or kfp (the GPU image has torch, numpy and safetensors)."""

from foxhunt.train.core import TrainConfig, TrainError, TrainResult, run_train
from foxhunt.train.dqn import DQNConfig, RainbowAgent
from foxhunt.train.env import EnvConfig, TradingEnv

__all__ = [
    "DQNConfig",
    "EnvConfig",
    "RainbowAgent",
    "TradingEnv",
    "TrainConfig",
    "TrainError",
    "TrainResult",
    "run_train",
]
