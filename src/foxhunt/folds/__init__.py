"""Walk-forward folds: train/val/test index ranges into an fxcache.

`walkforward` needs numpy only (the trainer checks folds with it on the GPU image); the
`foxhunt folds` step (`FoldsConfig`, `run_folds`) is imported on first use.
"""

from foxhunt.folds.walkforward import (
    Fold,
    FoldError,
    FoldSpec,
    check_folds,
    fold_ranges,
    make_folds,
)

__all__ = [
    "Fold", "FoldError", "FoldSpec", "FoldsConfig", "check_folds", "fold_ranges", "make_folds",
    "run_folds",
]  # fmt: skip


def __getattr__(name: str):
    if name in ("FoldsConfig", "run_folds"):
        from foxhunt.folds import core

        return getattr(core, name)
    raise AttributeError(f"module 'foxhunt.folds' has no attribute {name!r}")
