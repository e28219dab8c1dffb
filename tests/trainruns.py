"""Helpers of the training tests: what two runs must share to count as the same, and the
exception a test raises from `on_epoch_end` to stand for a killed task."""

from __future__ import annotations


def metrics_of(res) -> list:
    """Per fold: its id, best epoch, val, test and random-policy metrics."""
    return [(f["fold"], f["best_epoch"], f["val"], f["test"], f["random_val"]) for f in res.folds]


class Killed(Exception):
    pass
