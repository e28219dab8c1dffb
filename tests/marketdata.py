"""Random market data on a device, for the training tests: a geometric random walk of closes
with a fixed 2 bp high-low range and N(0, 1) features and order flow."""

from __future__ import annotations

import numpy as np
import torch

from foxhunt.train.data import MarketData


def random_market(n: int = 600, seed: int = 0, device: str = "cpu") -> MarketData:
    rng = np.random.default_rng(seed)
    close = 4800.0 * np.exp(np.cumsum(rng.normal(0, 3e-4, n)))
    targets = np.stack([close, close * 1.0002, close * 0.9998, close], 1)
    feats = rng.normal(size=(n, 42)).astype(np.float32)
    ofi = rng.normal(size=(n, 8)).astype(np.float32)
    return MarketData(feats, ofi, targets, torch.device(device))
