"""The demo training settings: CPU-sized, trading costs off so that the demo set's planted
signal (worth ~0.2 bp a bar) pays. `make run`, the CI learning test and bench_learning.py all
train with these (docs/performance.md)."""

from foxhunt.train.agents.dqn import DQNConfig
from foxhunt.train.env import EnvConfig

EPOCHS = 8
EVAL_SEGMENTS = 16
ENV = EnvConfig(episode_bars=512, fee_bps=0.0, half_spread_bps=0.0)
DQN = DQNConfig(
    hidden=(128, 128), head_hidden=64, gamma=0.5, n_step=1,
    envs=64, collect_steps=64, learn_steps=256, batch_size=256, lr=1e-3,
)  # fmt: skip
