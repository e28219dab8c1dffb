"""Walk-forward folds: train/val/test index ranges into an fxcache."""

from foxhunt.folds.core import FoldsConfig, run_folds
from foxhunt.folds.walkforward import Fold, FoldError, FoldSpec, make_folds

__all__ = ["Fold", "FoldError", "FoldSpec", "FoldsConfig", "make_folds", "run_folds"]
