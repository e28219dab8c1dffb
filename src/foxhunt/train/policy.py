"""A trained policy outside the trainer: a fold's best checkpoint acting on observations.

A checkpoint is `best.safetensors` (the agent's weights and the train range's normaliser) and
`best.json` beside it (the model, its resolved config and the names of the market columns).
`Policy` rebuilds the agent's acting network on the CPU (`acting_net` of the agent's module) and
maps raw market columns (the fxcache's 42 features and 8 order-flow values of a bar,
unnormalised) and the portfolio state to greedy branch actions, as the trainer's evaluation
does. `foxhunt.train.mlflow_model` wraps it as an MLflow model.

    policy = Policy.load("data/runs/<run>/<task>/fold-0/best.safetensors")
    actions = policy.act(market, portfolio)      # [n, 50], [n, 3] -> [n, 3] branch indices

An agent's rows are independent states, unless it remembers the recent order flow (the env's
`memory_decay`, on by default): then its rows are consecutive bars in time order, and the
memory of row i averages the order flow of the rows up to i, seeded with the first row as
training seeds it with the first bar of the data (after about 20 rows at the default decay
the seed no longer shows: 0.5^20 ~ 1e-6). A supervised model (tlob, cfc, mamba2, tft) reads
windows: its rows are consecutive bars in time order, and the action of row i comes from the
window of the `window` rows ending at i (rows before the first repeat it, as training does at
the start of the data); its orders follow the trainer's rule (up long, down short, flat holds
the position).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import torch

from foxhunt.train.agents import AGENTS, SUPERVISED, policy_module
from foxhunt.train.agents.common import state, uncompiled
from foxhunt.train.data import N_MEMORY, N_MKT, ema, linear_score, normalise, standardised
from foxhunt.train.env import DIRECTIONS, HOLD_SCALE, ORDER_TYPES, PORTFOLIO, SIZES


class Policy:
    def __init__(
        self, tensors: dict[str, torch.Tensor], model: str, cfg, columns: list[str],
        episode_bars: int | None = None,
    ):  # fmt: skip
        self.model, self.cfg, self.columns = model, cfg, columns
        # Bars in position count up to the training episode's length, as the env counts them.
        self.hold_cap = None if episode_bars is None else episode_bars / HOLD_SCALE
        self._act = policy_module(model).acting_net(cfg, tensors)
        self.mean, self.inv_std = tensors["norm.mean"], tensors["norm.inv_std"]
        self.memory_decay = None  # checkpoints of agents without the memory hold none of it
        if "norm.memory_decay" in tensors:
            self.memory_decay = float(tensors["norm.memory_decay"])
            self.memory_mean = tensors["norm.memory_mean"]
            self.memory_inv_std = tensors["norm.memory_inv_std"]
        self.forecast_w = tensors.get("norm.forecast_w")  # agents that see the forecast
        if self.forecast_w is not None:
            self.forecast_mean = tensors["norm.forecast_mean"]
            self.forecast_std = tensors["norm.forecast_std"]

    @staticmethod
    def config_of(checkpoint: Path | str) -> tuple[str, object, dict]:
        """A checkpoint's model, its config for acting (the trainer's sizes and devices do not
        matter there: eager, float32) and its `best.json`."""
        doc = json.loads(Path(checkpoint).with_suffix(".json").read_text())
        # Checkpoints written before the agent interface name no model: they are DQN's.
        model = doc.get("model", "dqn")
        resolved = doc.get("resolved") or doc["resolved_dqn"]
        config_cls = AGENTS[model].load()[0]
        fields = {f.name for f in dataclasses.fields(config_cls)}
        raw = {k: tuple(v) if isinstance(v, list) else v for k, v in resolved.items()
               if k in fields}  # fmt: skip
        cfg = config_cls(**raw | {"precision": "fp32"} | uncompiled(raw.get("compile_mode")))
        return model, cfg, doc

    @classmethod
    def load(cls, checkpoint: Path | str) -> Policy:
        from safetensors.torch import load_file

        model, cfg, doc = cls.config_of(checkpoint)
        episode_bars = doc.get("config", {}).get("env", {}).get("episode_bars")
        return cls(load_file(str(checkpoint)), model, cfg, doc.get("columns", []), episode_bars)

    def act(self, market: np.ndarray, portfolio: np.ndarray) -> np.ndarray:
        """Greedy actions [n, 3] (direction, size, order type indices) for raw market rows
        [n, 50] and portfolio states [n, 3] (position, unrealised PnL in %, bars in position /
        100, as `foxhunt.train.env.PORTFOLIO`; bars beyond the training episode's length count
        as that length, as in training)."""
        x = torch.tensor(np.asarray(market, dtype=np.float32))  # a copy: inputs may be read-only
        p = torch.tensor(np.asarray(portfolio, dtype=np.float32))
        if x.ndim != 2 or x.shape[1] != N_MKT or p.shape != (len(x), len(PORTFOLIO)):
            raise ValueError(
                f"market must be [n, {N_MKT}] and portfolio [n, {len(PORTFOLIO)}]; got "
                f"{tuple(x.shape)} and {tuple(p.shape)}"
            )
        if self.hold_cap is not None:
            p[:, 2].clamp_(max=self.hold_cap)
        obs = normalise(x, self.mean, self.inv_std)
        if self.model in SUPERVISED:
            return self._act_supervised(obs, p).numpy()
        memory = None
        if self.memory_decay is not None:
            m = ema(x[:, -N_MEMORY:], self.memory_decay)
            memory = normalise(m, self.memory_mean, self.memory_inv_std)
        forecast = None
        if self.forecast_w is not None:  # as MarketData.fit_normaliser computes it
            cols = obs if memory is None else torch.cat([obs, memory], 1)
            score = linear_score(cols, self.forecast_w)
            forecast = standardised(score, self.forecast_mean, self.forecast_std)[:, None]
        return self._act(state(obs, memory, p, forecast)).numpy()

    def _act_supervised(self, obs: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        from foxhunt.train.agents.supervised import order_from_forecast

        L = self.cfg.window
        idx = (torch.arange(len(obs))[:, None] - torch.arange(L - 1, -1, -1)).clamp_min(0)
        probs = self._act(obs[idx])  # [n, L, 50] -> [n, 3]
        return order_from_forecast(probs, portfolio, self.cfg.flat, self.cfg.sizing)

    @staticmethod
    def describe(actions: np.ndarray) -> dict[str, list]:
        """Branch indices as what they mean: target direction, size fraction, order type."""
        a = np.asarray(actions)
        return {
            "direction": [DIRECTIONS[i] for i in a[:, 0]],
            "size": [SIZES[i] for i in a[:, 1]],
            "order_type": [ORDER_TYPES[i] for i in a[:, 2]],
        }
