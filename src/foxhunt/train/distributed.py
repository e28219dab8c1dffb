"""Data-parallel training on the GPUs of one node, started by torchrun.

    foxhunt train --gpus 2 ...
    torchrun --nproc-per-node 2 -m foxhunt train ...    (the same, started by hand)

torchrun starts one process per GPU and sets RANK, WORLD_SIZE and LOCAL_RANK; `foxhunt train
--gpus N` (and the pipeline's train step) runs the task through torchrun's launcher API
(torch.distributed.launcher.elastic_launch), nothing home-made. Each process (rank):

- uploads the fxcache once to its own GPU (cuda:LOCAL_RANK) and builds the same agent from the
  same seed, so the weights start identical;
- collects with its own randomness (its envs' restarts, exploration, replay sampling: the
  fold's seed offset by `rank_seed`), so the ranks see different data; the supervised models
  instead draw one shared order of the samples (`shared_seed`) and each rank takes its slice of
  every global batch (batch_size samples each), so N ranks equal one process at N x batch_size;
- averages the flat gradient over the ranks before clipping and the optimiser step (one
  all-reduce per step, in `common.clip_and_step`: NCCL on GPUs, gloo on CPUs), so the weights
  and the optimiser state stay identical on every rank.

Rank 0 alone writes: checkpoints, results, test returns, MLflow. Every rank keeps its own resume
file (its envs and replay are its own), and the one before it, so a job that a killed rank ended
resumes, when torchrun or the pipeline restarts it, from the last epoch every rank saved.
"""

from __future__ import annotations

import datetime as dt
import logging
import os

import torch
import torch.distributed as dist

RANK_SEED_STRIDE = 7_919_993  # ranks' seeds lie this far apart (no two ranks' streams meet)


def world() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) outside a process group."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def is_main() -> bool:
    return world()[0] == 0


def rank_seed(seed: int) -> int:
    """A rank's own seed for a task's seed: rank 0 keeps it, so one process trains as before."""
    return seed + world()[0] * RANK_SEED_STRIDE


def shared_seed(seed: int) -> int:
    """The seed every rank shares, from a rank's own (`rank_seed`'s inverse)."""
    return seed - world()[0] * RANK_SEED_STRIDE


def launched_rank() -> int:
    """This process's rank as torchrun set it (0 outside a job, and after it ended)."""
    return int(os.environ.get("RANK", "0"))


def launched() -> bool:
    """Started by torchrun (or another launcher that sets WORLD_SIZE)."""
    return int(os.environ.get("WORLD_SIZE", "1")) > 1


def init(device: str) -> torch.device:
    """Join the job torchrun started: the process group (NCCL on GPUs, gloo on CPUs) and this
    rank's device. Outside torchrun: nothing to join, the device as asked."""
    if not launched():
        return torch.device(device)
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = device in ("auto", "cuda") and torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(local)
    if launched_rank() != 0:  # one rank tells the story: the others say only what goes wrong
        logging.getLogger("foxhunt").setLevel(logging.WARNING)
    if not dist.is_initialized():
        # A rank that stops (killed, failed) ends the others' collectives within the timeout;
        # torchrun then ends the job with that rank's exit code.
        dist.init_process_group("nccl" if cuda else "gloo", timeout=dt.timedelta(minutes=10))
    return torch.device(f"cuda:{local}") if cuda else torch.device("cpu")


def shared(value):
    """Rank 0's `value` on every rank (a run id drawn at random, say)."""
    if world()[1] == 1:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0)
    return box[0]


def common(keys: set) -> set:
    """The keys every rank holds (`keys` itself for one process). One small all-gather."""
    if world()[1] == 1:
        return keys
    everyone: list = [None] * world()[1]
    dist.all_gather_object(everyone, keys)
    return set.intersection(*everyone)


class RanksDiverged(RuntimeError):
    pass


def fingerprint(tensors: dict[str, torch.Tensor]) -> str:
    """A digest of the tensors' bytes, in name order."""
    import hashlib

    h = hashlib.sha256()
    for k in sorted(tensors):
        h.update(k.encode())
        h.update(tensors[k].detach().contiguous().cpu().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def check_same(tensors: dict[str, torch.Tensor], what: str) -> None:
    """Every rank holds the same `tensors` (the weights, after a fold), bit for bit; else
    `RanksDiverged` naming the ranks that differ from rank 0. One small all-gather."""
    if world()[1] == 1:
        return
    mine = fingerprint(tensors)
    everyone: list = [None] * world()[1]
    dist.all_gather_object(everyone, mine)
    odd = [r for r, f in enumerate(everyone) if f != everyone[0]]
    if odd:
        raise RanksDiverged(
            f"{what}: the weights of rank(s) {odd} differ from rank 0's ({everyone}); "
            "data-parallel ranks must take the same steps"
        )


def resume_name() -> str:
    """This rank's resume file: `resume.pt` for rank 0 (and one process), `resume-rank<r>.pt`
    for the others."""
    r = world()[0]
    return "resume.pt" if r == 0 else f"resume-rank{r}.pt"


def finish() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def average_(t: torch.Tensor) -> torch.Tensor:
    """`t` replaced by its mean over the ranks, in place (nothing to do for one process)."""
    if world()[1] > 1:
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        t.div_(world()[1])
    return t


def _rank_main(cfg):
    """What each rank of `run_ranks` runs (importable: the ranks are spawned processes)."""
    from foxhunt.train.core import run_train

    return run_train(cfg)


def run_ranks(cfg):
    """Train `cfg` in `cfg.gpus` processes on this node through torchrun's launcher
    (torch.distributed.launcher, the API behind torchrun: a local rendezvous, one process per
    GPU, the job ended when a rank fails); rank 0's TrainResult. A failed rank raises
    torch's ChildFailedError naming it."""
    import uuid

    from torch.distributed.launcher.api import LaunchConfig, elastic_launch

    launch_cfg = LaunchConfig(
        min_nodes=1, max_nodes=1, nproc_per_node=cfg.gpus, run_id=uuid.uuid4().hex,
        rdzv_backend="c10d", rdzv_endpoint="localhost:0", max_restarts=0,
        monitor_interval=0.2, start_method="spawn",
    )  # fmt: skip
    return elastic_launch(launch_cfg, _rank_main)(cfg)[0]
