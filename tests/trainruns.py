"""Helpers of the training tests: what two runs must share to count as the same, the
exception a test raises from `on_epoch_end` to stand for a killed task, and an agent driven
alone through folds and epochs."""

from __future__ import annotations

from foxhunt.train.tracking import NullLogger


def metrics_of(res) -> list:
    """Per fold: its id, best epoch, val, test and random-policy metrics."""
    return [(f["fold"], f["best_epoch"], f["val"], f["test"], f["random_val"]) for f in res.folds]


class Killed(Exception):
    pass


class EpochRecorder(NullLogger):
    """A tracking logger that logs nothing and keeps each epoch's training statistics and val
    metrics by (fold, epoch): what two runs compare epoch by epoch, where a run's final metrics
    may not move with a change in what an epoch draws."""

    def __init__(self) -> None:
        self.epochs: dict[tuple[int, int], dict[str, float]] = {}
        self.fold = -1

    def start_fold(self, fold, tags, resume_id=None, name=None, params=None, dataset=None) -> str:
        self.fold = fold
        return ""

    def log_metrics(self, metrics, step=None) -> None:
        if "eval/val_sharpe" in metrics:  # an epoch's line
            self.epochs[(self.fold, step)] = {
                k: v for k, v in metrics.items() if not k.startswith("time/")
            }


def drive(agent, folds, fold_seeds: list[int], epochs: int = 2) -> list[dict]:
    """Train `agent` alone over `folds` (fold k seeded fold_seeds[k]), `epochs` each: its
    statistics per epoch."""
    stats = []
    for (lo, hi), s in zip(folds, fold_seeds, strict=True):
        agent.reset_fold(lo, hi, s)
        for e in range(epochs):
            agent.begin_epoch(e, epochs)
            for _ in range(agent.rounds):
                agent.collect()
                agent.learn()
            stats.append(agent.read_stats())
    return stats


def load_normaliser(data, tensors) -> None:
    """A checkpoint's normaliser into `data`: the tensors `MarketData.statistics` names for
    what the data holds (its memory's and forecast's statistics too), the forecast column
    scored again from them."""
    for name, t in data.statistics().items():
        t.copy_(tensors[name])
    data.score_forecast()


def served_and_trained_orders(demo, ckpt, build, lo: int = 2000, n: int = 300):
    """(the served checkpoint's orders, the trainer's with the same weights) for bars
    [lo, lo + n) and positions from short to long: `Policy.load(ckpt).act` against
    `build(data).greedy` after the checkpoint's weights and normaliser are loaded. A supervised
    model's first window - 1 rows lack a full window in the served frame. An agent that
    remembers the order flow is served the bars from the data's first (its memory's seed in
    training), the orders of the last n compared."""
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
    load_normaliser(data, tensors)
    if hasattr(agent, "prepare_eval"):  # the supervised models' (optional in the interface)
        agent.prepare_eval(lo, lo + n)
    t = torch.arange(lo, lo + n)
    port = torch.stack([torch.linspace(-1, 1, n), torch.zeros(n), torch.zeros(n)], 1)
    want = agent.greedy(t, port).numpy()
    policy = Policy.load(ckpt)
    first = 0 if policy.memory_decay is not None else lo
    served = torch.cat([torch.zeros(lo - first, 3), port])
    got = policy.act(data.mkt[first : lo + n].numpy(), served.numpy())[-n:]
    return got, want


def spy_training(monkeypatch) -> tuple[list[tuple[str, int]], list[int]]:
    """Record what foxhunt train's loop trains: for each `train_epoch` call, the kind of
    agent it gets (RainbowAgent, alone or side by side; StackedRainbow) and how many, and the
    size of each stack the loop builds. Returns the two lists, filled as it runs."""
    from foxhunt.train import core

    kinds: list[tuple[str, int]] = []
    stacks: list[int] = []
    real_epoch, real_stack = core.train_epoch, core.StackedRainbow

    def spy(agents, streams, mark=None):
        kinds.append((type(agents[0]).__name__, len(agents)))
        return real_epoch(agents, streams, mark)

    def stack(agents):
        stacks.append(len(agents))
        return real_stack(agents)

    monkeypatch.setattr(core, "train_epoch", spy)
    monkeypatch.setattr(core, "StackedRainbow", stack)
    return kinds, stacks
