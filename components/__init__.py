"""Thin KFP v2 lightweight components: each maps its parameters and artifacts to one call of a
`foxhunt` step function. Their images carry kfp and foxhunt (`install_kfp_package=False`), so a
pod starts without pip. Data lives on volumes: `raw_dir` (the raw-data PVC) and `work_dir` (the
fxcache PVC: ingested/, fxcache/, folds/, runs/, report/); artifacts carry the small files."""

from components.bench import bench
from components.folds import folds
from components.images import CPU_IMAGE, GPU_IMAGE
from components.ingest import ingest, scan_raw
from components.plan import plan_tasks
from components.precompute import precompute
from components.report import report
from components.tracking import end_tracking, start_tracking
from components.train import train
from components.train_job import train_job

__all__ = [
    "CPU_IMAGE",
    "GPU_IMAGE",
    "bench",
    "end_tracking",
    "folds",
    "ingest",
    "plan_tasks",
    "precompute",
    "report",
    "scan_raw",
    "start_tracking",
    "train",
    "train_job",
]
