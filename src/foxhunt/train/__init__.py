"""Training on GPU-resident data: the trading env, the agents (Rainbow DQN, PPO, PQN under
agents/), one training loop, evaluation, baselines, tracking.

Importable without polars, mlflow or kfp (the GPU image has torch, numpy and safetensors)."""

from foxhunt.train.agents.dqn import DQNConfig, RainbowAgent
from foxhunt.train.agents.ppo import PPOAgent, PPOConfig
from foxhunt.train.agents.pqn import PQNAgent, PQNConfig
from foxhunt.train.core import TrainConfig, TrainError, TrainResult, run_train, train_seeds
from foxhunt.train.env import EnvConfig, TradingEnv

__all__ = [
    "DQNConfig",
    "EnvConfig",
    "PPOAgent",
    "PPOConfig",
    "PQNAgent",
    "PQNConfig",
    "RainbowAgent",
    "TradingEnv",
    "TrainConfig",
    "TrainError",
    "TrainResult",
    "run_train",
    "train_seeds",
]
