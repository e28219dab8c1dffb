"""A trained policy outside the trainer: a fold's best checkpoint acting on observations.

A checkpoint is `best.safetensors` (the network's weights and the train range's normaliser) and
`best.json` beside it (the resolved DQN config and the names of the market columns). `Policy`
rebuilds the network on the CPU and maps raw market columns (the fxcache's 42 features and 8
order-flow values of a bar, unnormalised) and the portfolio state to greedy branch actions, as
the trainer's evaluation does. `foxhunt.train.mlflow_model` wraps it as an MLflow model.

    policy = Policy.load("data/runs/<run>/<task>/fold-0/best.safetensors")
    actions = policy.act(market, portfolio)      # [n, 50], [n, 3] -> [n, 3] branch indices

IQN's greedy action averages quantiles at sampled fractions during training; here the fractions
are fixed midpoints, so a served IQN policy is deterministic.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from foxhunt.train.data import CLIP, N_MKT
from foxhunt.train.dqn import IN_DIM, STATE_DIM, DQNConfig, QNet, expected_q
from foxhunt.train.env import DIRECTIONS, ORDER_TYPES, PORTFOLIO, SIZES, joint_table


class Policy:
    def __init__(self, tensors: dict[str, torch.Tensor], cfg: DQNConfig, columns: list[str]):
        self.cfg, self.columns = cfg, columns
        self.net = QNet(cfg)
        self.net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
        self.net.eval()
        self.mean, self.inv_std = tensors["norm.mean"], tensors["norm.inv_std"]
        self.z = tensors["support.z"]
        self.joint = joint_table()
        self.iqn = cfg.distribution == "iqn"

    @classmethod
    def load(cls, checkpoint: Path | str) -> Policy:
        from safetensors.torch import load_file

        checkpoint = Path(checkpoint)
        doc = json.loads(checkpoint.with_suffix(".json").read_text())
        fields = {f.name for f in dataclasses.fields(DQNConfig)}
        raw = {k: v for k, v in doc["resolved_dqn"].items() if k in fields}
        raw["hidden"] = tuple(raw["hidden"])
        # Sizes and devices of the trainer do not matter for acting: CPU, eager, float32.
        cfg = DQNConfig(**raw | {"capture": "eager", "precision": "fp32", "compile": False})
        return cls(load_file(str(checkpoint)), cfg, doc.get("columns", []))

    def act(self, market: np.ndarray, portfolio: np.ndarray) -> np.ndarray:
        """Greedy actions [n, 3] (direction, size, order type indices) for raw market rows
        [n, 50] and portfolio states [n, 3] (position, unrealised PnL in %, bars in position /
        100, as `foxhunt.train.env.PORTFOLIO`)."""
        x = torch.tensor(np.asarray(market, dtype=np.float32))  # a copy: inputs may be read-only
        p = torch.tensor(np.asarray(portfolio, dtype=np.float32))
        if x.ndim != 2 or x.shape[1] != N_MKT or p.shape != (len(x), len(PORTFOLIO)):
            raise ValueError(
                f"market must be [n, {N_MKT}] and portfolio [n, {len(PORTFOLIO)}]; got "
                f"{tuple(x.shape)} and {tuple(p.shape)}"
            )
        obs = ((x - self.mean) * self.inv_std).clamp(-CLIP, CLIP)
        state = torch.cat([obs, p, x.new_zeros(len(x), IN_DIM - STATE_DIM)], 1)
        taus = None
        if self.iqn:
            k = self.cfg.iqn_quantiles
            taus = ((torch.arange(k) + 0.5) / k).expand(len(x), k)
        with torch.no_grad():
            out = self.net(state, taus, noise=False)
        return self.joint[expected_q(out, self.z, self.iqn).argmax(-1)].numpy()

    @staticmethod
    def describe(actions: np.ndarray) -> dict[str, list]:
        """Branch indices as what they mean: target direction, size fraction, order type."""
        a = np.asarray(actions)
        return {
            "direction": [DIRECTIONS[i] for i in a[:, 0]],
            "size": [SIZES[i] for i in a[:, 1]],
            "order_type": [ORDER_TYPES[i] for i in a[:, 2]],
        }
