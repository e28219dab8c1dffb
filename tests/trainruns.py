"""Helpers of the training tests: what two runs must share to count as the same, and the
exception a test raises from `on_epoch_end` to stand for a killed task."""

from __future__ import annotations


def metrics_of(res) -> list:
    """Per fold: its id, best epoch, val, test and random-policy metrics."""
    return [(f["fold"], f["best_epoch"], f["val"], f["test"], f["random_val"]) for f in res.folds]


class Killed(Exception):
    pass


def served_and_trained_orders(demo, ckpt, build, lo: int = 2000, n: int = 300):
    """(the served checkpoint's orders, the trainer's with the same weights) for bars
    [lo, lo + n) and positions from short to long: `Policy.load(ckpt).act` against
    `build(data).greedy` after the checkpoint's weights and normaliser are loaded. A supervised
    model's first window - 1 rows lack a full window in the served frame."""
    import json

    import torch
    from safetensors.torch import load_file

    from foxhunt.fxcache import FxCache
    from foxhunt.train.data import MarketData
    from foxhunt.train.policy import Policy

    cache = FxCache.open(demo[0], json.loads(demo[1].read_text())["fxcache_key"])
    data = MarketData.from_fxcache(cache, torch.device("cpu"))
    agent = build(data)
    tensors = load_file(str(ckpt))
    agent.load_weights({k: v for k, v in tensors.items() if not k.startswith("norm.")})
    data.mean.copy_(tensors["norm.mean"])
    data.inv_std.copy_(tensors["norm.inv_std"])
    agent.prepare_eval(lo, lo + n)
    t = torch.arange(lo, lo + n)
    port = torch.stack([torch.linspace(-1, 1, n), torch.zeros(n), torch.zeros(n)], 1)
    want = agent.greedy(t, port).numpy()
    got = Policy.load(ckpt).act(data.mkt[t].numpy(), port.numpy())
    return got, want
