"""`foxhunt train`: an agent trained over the walk-forward folds of one fxcache.

One task = one model and seed over every fold: the cache is uploaded to the device once, the
agent (and its CUDA graphs) is built once and reset in place per fold. The loop knows agents only
through `foxhunt.train.agents.Agent` (DQN, PPO, PQN: one file each under agents/). Per epoch:
collect, learn, evaluate the greedy policy on the val range; the best epoch by val Sharpe is
checkpointed (safetensors + config + normalisation statistics) and evaluated once on the test
range. A resume file written after every epoch (by a thread of its own, while the next epoch
trains: `ResumeWriter`) lets a killed task continue where it stopped and end with the same
metrics as an uninterrupted run.

Only a retry of the same task resumes: the run id (the pipeline's KFP run id, or a fresh one
per command) names the run directory, and a resume file is used only when the same code wrote
it for the same configuration. A new pipeline run computes afresh; reusing finished results
across runs is KFP's step cache's job.

    <out>/<run id>/<symbol>-<model>-seed<seed>-<config digest>/
        resume.pt                 everything training changes, after the last finished epoch
        fold-<k>/best.safetensors best epoch's weights and normalisation statistics
        fold-<k>/best.json        its config, epoch and val metrics
        results.json              per-fold val/test metrics and the aggregate
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import hashlib
import itertools
import json
import logging
import math
import os
import re
import signal
import threading
import time
from collections.abc import Callable, Generator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from foxhunt import __version__
from foxhunt.errors import StepError, Terminated
from foxhunt.folds.walkforward import FoldError, check_folds, fold_ranges
from foxhunt.fsutil import clean_stale, temp_path, write_json_atomic
from foxhunt.fxcache import FxCache, is_fxcache
from foxhunt.provenance import code_version, new_run_id
from foxhunt.train import distributed, scan
from foxhunt.train.agents import AGENTS, SUPERVISED, Agent, agent_class
from foxhunt.train.agents.dqn import DQNConfig
from foxhunt.train.agents.dqn_stacked import StackedRainbow, stackable
from foxhunt.train.agents.ppo import PPOConfig
from foxhunt.train.agents.pqn import PQNConfig
from foxhunt.train.baselines import evaluate_baselines
from foxhunt.train.cohort import train_epoch
from foxhunt.train.data import DataError, MarketData
from foxhunt.train.env import EnvConfig
from foxhunt.train.evaluate import VAL_PASSES, Evaluator, default_segments, random_policy
from foxhunt.train.metrics import periods_per_year, trading_metrics
from foxhunt.train.models.cfc import CfCConfig
from foxhunt.train.models.ensemble import EnsembleConfig
from foxhunt.train.models.mamba2 import Mamba2Config
from foxhunt.train.models.tft import TFTConfig
from foxhunt.train.models.tlob import TLOBConfig
from foxhunt.train.sizer import agent_sizes
from foxhunt.train.tracking import Logger, MlflowLogger, NullLogger

log = logging.getLogger(__name__)


class TrainError(StepError):
    pass


MODELS = tuple(AGENTS)  # TrainConfig.model's choices, each a config field of its own
MAX_SEEDS = 10  # seeds side by side: their streams and capture streams stay within torch's 32


@dataclass
class TrainConfig:
    """Train a model (an RL agent, a supervised forecaster or an ensemble) over the walk-forward
    folds of one fxcache."""

    folds: Path = Path("data/folds/ES.json")
    """Folds file written by `foxhunt folds` (it names the fxcache key)."""
    cache: Path = Path("data/fxcache")
    """Cache root (or the cache directory itself)."""
    model: Literal["dqn", "ppo", "pqn", "tlob", "cfc", "mamba2", "tft", "ensemble"] = "dqn"
    """Agent: dqn (Rainbow DQN over the joint actions), ppo (PPO, factorised policy over the
    branches), pqn (Q(lambda) on PPO's rollouts, no replay), or a supervised sequence model
    trading its direction forecasts: tlob (dual-attention transformer), cfc (liquid / CfC),
    mamba2 (state-space layers), tft (Temporal Fusion Transformer, return quantiles), or
    ensemble (supervised models trained side by side, their forecasts combined).
    Its settings: --dqn.*, --ppo.*, --pqn.*, --tlob.*, --cfc.*, --mamba2.*, --tft.*,
    --ensemble.* (the members' own: --ensemble.tlob.*, ...)."""
    epochs: int = 10
    """Epochs per fold; the best by val Sharpe is kept."""
    seed: int = 0
    """Seed of everything random: the same seed, data and device give the same metrics."""
    seeds: tuple[int, ...] = ()
    """Train these seeds side by side in this one process instead of `seed` alone: one upload
    of the data, on a GPU the DQN's agents stacked into one (`stack_seeds`), other agents each
    on a CUDA stream of its own (foxhunt.train.cohort). Each seed trains as its own task with
    --seed would (bit for bit unless stacked), into its own run directory, checkpoints, resume
    file and MLflow runs. The agents only (dqn, ppo, pqn: every draw of
    theirs comes from their own generator; the supervised models' dropout draws from torch's
    global one); at most MAX_SEEDS (10)."""
    stack_seeds: Literal["auto", "on", "off"] = "auto"
    """With `seeds`, DQN agents that can be (all but IQN's, and those whose steps are compiled
    ahead of time) are stacked into one (foxhunt.train.agents.dqn_stacked): each collection and
    learning step runs once for every seed, in kernels as many times wider, instead of once per
    seed (on a GPU, on streams). auto: on a GPU, where the steps are torch.compile's (the
    DQN's default compile_mode; with the steps compiled ahead of time the seeds run on streams).
    on: stacked, a compile_mode of auto then choosing torch.compile. Stacked, each seed's metrics
    equal its own task's to float rounding, not bit for bit (a wider kernel sums in another
    order; on a CPU at one thread, bit for bit); off keeps each seed's own kernels, bit for
    bit as alone."""
    fold_ids: tuple[int, ...] = ()
    """Train only these folds (default: all)."""
    device: Literal["auto", "cuda", "cpu"] = "auto"
    """Training device (auto: CUDA when present, else the CPU)."""
    compile_cache: Path | None = None
    """Where torch.compile keeps what it compiled (inductor's FX graph and kernel caches, Triton's
    kernels, the packages of steps compiled ahead of time: foxhunt.train.aot), below a folder
    per torch version: a later task of the same model on the same kind
    of GPU (a retry, a rerun, the next seed) loads instead of compiling. The pipeline puts it on
    the fxcache volume; None: torch's default (the pod's /tmp, lost with it)."""
    gpus: int = 1
    """Data-parallel processes on this node, one GPU each (foxhunt.train.distributed): above 1,
    `foxhunt train` starts them through torchrun. On CPUs, processes (gloo)."""
    out: Path = Path("data/runs")
    """Where run directories (checkpoints, resume files, results) go."""
    run_id: str = ""
    """The run this task belongs to (the pipeline passes its KFP run id). A task continues
    from a resume file only in the same run: pass a run id printed by an interrupted
    `foxhunt train` to continue it. Empty: a new run (UTC time and a random suffix)."""
    resume: bool = True
    """Continue from the run directory's resume file when the same code wrote it for this
    configuration (a retry); --no-resume trains afresh even then."""
    patience: int = 0
    """Early stopping: end a fold's training when its val Sharpe has not improved for this many
    epochs (0: train every epoch). The best epoch is what is tested either way."""
    eval_segments: int | None = None
    """Pieces the val/test range is evaluated in, side by side (default: 4,096 on a GPU, 64 on a
    CPU). Speed only: the pieces carry their positions across their boundaries, so any count
    gives the one sequential walk's result (foxhunt.train.evaluate)."""
    compile_eval: bool | None = None
    """torch.compile the evaluation's step (the greedy policy, the env step, the writes) where
    the agent's own steps are compiled (on a GPU by default), before it is captured. None: on
    for the reinforcement-learning models (dqn, ppo, pqn), off for the supervised ones, whose
    compiled evaluation is not measured. Each seed of `seeds` compiles its own evaluator's
    step (the inductor cache makes the others' builds a trace each). The DQN's plan
    of 3 folds x 50 epochs on an H200 spends 4.6 s evaluating with it against 14.1 s without
    (docs/task-start.md); the compiled step rounds its bf16 forward otherwise, so a few
    bars' returns differ."""
    baselines: bool = True
    """Evaluate the baseline policies (flat, buy and hold, random, ridge and logistic on the
    observable columns, cost-aware variants; foxhunt.train.baselines) on each fold's val and
    test ranges beside the agent, with the same env, costs and metrics."""
    tracking: Literal["mlflow", "none"] = "mlflow"
    """Log to MLflow (MLFLOW_TRACKING_URI, else sqlite in the working directory) or not at all."""
    experiment: str = "foxhunt"
    """MLflow experiment name."""
    tags: dict[str, str] = field(default_factory=dict)
    """Extra MLflow tags of the task's run (the pipeline passes its KFP run id)."""
    env: EnvConfig = field(default_factory=EnvConfig)
    """Trading environment: episodes, costs, fills."""
    dqn: DQNConfig = field(default_factory=DQNConfig)
    """Rainbow DQN hyperparameters (model dqn)."""
    ppo: PPOConfig = field(default_factory=PPOConfig)
    """PPO hyperparameters (model ppo)."""
    pqn: PQNConfig = field(default_factory=PQNConfig)
    """PQN hyperparameters (model pqn)."""
    tlob: TLOBConfig = field(default_factory=TLOBConfig)
    """TLOB and supervised-path settings (model tlob)."""
    cfc: CfCConfig = field(default_factory=CfCConfig)
    """CfC and supervised-path settings (model cfc)."""
    mamba2: Mamba2Config = field(default_factory=Mamba2Config)
    """Mamba-2 and supervised-path settings (model mamba2)."""
    tft: TFTConfig = field(default_factory=TFTConfig)
    """TFT and supervised-path settings (model tft)."""
    ensemble: EnsembleConfig = field(default_factory=EnsembleConfig)
    """The ensemble: its members, their settings and the combination rule (model ensemble)."""

    def __post_init__(self) -> None:
        if self.epochs < 1:
            raise ValueError(f"epochs = {self.epochs}: must be at least 1")
        if self.seed < 0:
            raise ValueError(f"seed = {self.seed}: must not be negative")
        if self.seeds:
            if min(self.seeds) < 0 or len(set(self.seeds)) != len(self.seeds):
                raise ValueError(f"seeds = {self.seeds}: distinct non-negative integers")
            if len(self.seeds) > MAX_SEEDS:
                raise ValueError(
                    f"seeds: {len(self.seeds)} side by side, at most {MAX_SEEDS}: each agent's "
                    "graphs are captured on a CUDA stream of its own, from torch's 32 side "
                    "streams taken in turn, so that no two share cuBLAS's workspace; split them "
                    "over tasks (the pipeline: seeds_together=false)"
                )
            if self.model in SUPERVISED:
                raise ValueError(
                    f"seeds: {self.model} is a supervised model, whose dropout draws from "
                    "torch's global generator: its seeds side by side would not train as each "
                    "alone does; train one seed per task (--seed)"
                )
            if self.gpus > 1:
                raise ValueError("seeds with gpus > 1: one or the other (a seed per GPU job)")
        if self.patience < 0:
            raise ValueError(f"patience = {self.patience}: must not be negative")
        if self.gpus < 1:
            raise ValueError(f"gpus = {self.gpus}: must be at least 1")
        if self.eval_segments is not None and self.eval_segments < 1:
            raise ValueError(f"eval_segments = {self.eval_segments}: must be at least 1")

    def agent_config(self):
        """The chosen model's config (dqn, ppo or pqn)."""
        return getattr(self, self.model)

    def for_seeds(self, n: int) -> TrainConfig:
        """The config `n` seeds side by side train with: where their DQN agents are to be
        stacked (`stack_seeds` on), its compile_mode auto takes torch.compile's steps, which
        stack, rather than those compiled ahead of time, which do not."""
        stacked = n > 1 and self.stack_seeds == "on" and self.model == "dqn"
        if not (stacked and self.dqn.compile_mode == "auto"):
            return self
        return dataclasses.replace(self, dqn=dataclasses.replace(self.dqn, compile_mode="default"))

    def resolved_compile_eval(self) -> bool:
        """`compile_eval` as set, else on for the RL models (see the field)."""
        if self.compile_eval is not None:
            return self.compile_eval
        return self.model not in SUPERVISED

    def digest(self, folds_doc: dict) -> str:
        """What the results depend on: the settings of the chosen model and the folds (their
        content, which names the cache), not where files are nor how runs are logged."""
        d = dataclasses.asdict(self)
        skip = ("folds", "cache", "out", "run_id", "resume", "tracking", "experiment", "tags",
                "compile_cache", "seeds")  # fmt: skip
        others = [m for m in MODELS if m != self.model]
        for k in (*skip, "baselines", *others):
            d.pop(k)
        d["gpus"] = distributed.world()[1]  # the ranks there are: they set the global batch
        d["folds_content"] = {
            k: folds_doc[k] for k in ("fxcache_key", "folds", "spec") if k in folds_doc
        }
        blob = json.dumps(d, sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


@dataclass
class TrainResult:
    """A task's results (results.json). Each fold's `best_epoch` counts from 0, as MLflow's
    steps do; `summary()` prints it counted from 1, as the progress lines do."""

    run_id: str
    run_dir: Path
    folds: list[dict]
    aggregate: dict
    device: str
    upload_ms: float
    resumed: bool

    def summary(self) -> str:
        lines = []
        for f in self.folds:
            v, t = f["val"], f["test"]
            lines.append(
                f"fold {f['fold']:2d}  best epoch {f['best_epoch'] + 1:3d}  "
                f"val Sharpe {v['sharpe']:7.2f}  test Sharpe {t['sharpe']:7.2f}  "
                f"test max DD {t['max_drawdown']:.2%}  "
                f"short/flat/long {t['short']:.0%}/{t['flat']:.0%}/{t['long']:.0%}  "
                f"random val Sharpe {f['random_val']['sharpe']:7.2f}"
            )
        a = self.aggregate
        lines.append(
            f"mean over {len(self.folds)} fold(s): val Sharpe {a['val_sharpe']:.2f}, test Sharpe "
            f"{a['test_sharpe']:.2f} (device {self.device}; upload {self.upload_ms:.1f} ms)"
        )
        if "baselines_test_sharpe" in a:
            b = a["baselines_test_sharpe"]
            ridge = b.get("ridge", 0.0)
            vs = f" ({a['test_sharpe'] / ridge:.2f}x ridge's)" if ridge > 0 else ""
            lines.append(
                f"baselines, test Sharpe: {', '.join(f'{k} {v:.2f}' for k, v in b.items())}; "
                f"the agent {a['test_sharpe']:.2f}{vs}"
            )
        if self.resumed:
            lines.append(f"continued run {self.run_id} from {self.run_dir / 'resume.pt'}")
        lines.append(f"run {self.run_id}: checkpoints and results in {self.run_dir}")
        return "\n".join(lines)


def load_folds(path: Path) -> dict:
    try:
        doc = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise TrainError(f"{path}: no such folds file; run `foxhunt folds` first") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise TrainError(f"{path}: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise TrainError(f"{path}: not a `foxhunt folds` file (a JSON object)")
    for k in ("fxcache_key", "folds", "bar_size"):
        if k not in doc:
            raise TrainError(f"{path}: field {k!r} missing; not a `foxhunt folds` file")
    if not isinstance(doc["folds"], list) or not doc["folds"]:
        raise TrainError(f"{path}: no folds")
    return doc


def check_folds_fit(path: Path, doc: dict, cache: FxCache) -> None:
    """The folds file against the cache it names, before anything is uploaded: the same
    number of bars, and ranges that keep train, val and test apart (`check_folds`)."""
    if doc.get("rows", len(cache)) != len(cache):
        raise TrainError(f"{path}: made for {doc['rows']} bars, the cache has {len(cache)}")
    try:
        check_folds(doc["folds"], len(cache), doc.get("spec"))
    except FoldError as e:
        raise TrainError(f"{path}: {e}") from None


def load_resume(path: Path) -> dict:
    """The resume file's state; an unreadable one is named with what to do about it."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except Exception as e:  # torch raises many types for a damaged file
        raise TrainError(
            f"{path}: unreadable resume file ({type(e).__name__}: {e}). Delete it to train "
            "this configuration from the start, or pass --no-resume"
        ) from None
    if not isinstance(state, dict) or "digest" not in state:
        raise TrainError(
            f"{path}: not a foxhunt resume file. Delete it to train this configuration from "
            "the start, or pass --no-resume"
        )
    return state


def open_cache(root: Path, key: str) -> FxCache:
    if is_fxcache(root):
        cache = FxCache.open(root)
        if cache.key != key:
            raise TrainError(f"{root} is cache {cache.key}, the folds file wants {key}")
        return cache
    if not (root / key).is_dir():
        raise TrainError(f"{root}: no fxcache {key} (the folds file's cache); run precompute")
    return FxCache.open(root, key)


def pick_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cuda" and not torch.cuda.is_available():
        raise TrainError("--device cuda: no CUDA device here (use --device auto or cpu)")
    return torch.device(name)


class Eta:
    """Time left in a task, from the mean epoch time so far and the epochs still to run."""

    def __init__(self, epochs_left: int):
        self.left, self.seconds, self.done = epochs_left, 0.0, 0

    def epoch_done(self, seconds: float) -> None:
        self.left, self.seconds, self.done = self.left - 1, self.seconds + seconds, self.done + 1

    def eta(self) -> str:
        s = round(self.seconds / max(self.done, 1) * max(self.left, 0))
        return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def process_age() -> float | None:
    """Seconds since this process started (its interpreter's start and imports included), from
    Linux's /proc to its clock's tick (10 ms); None where /proc does not tell."""
    try:
        with open("/proc/self/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22, starttime
        with open("/proc/uptime") as f:
            uptime = float(f.read().split()[0])
        return uptime - start_ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


class Clock:
    """Phase timer: CUDA events on a GPU (read once per epoch), wall time on a CPU."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, object]] = []

    def mark(self, name: str) -> None:
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self.marks.append((name, e))
        else:
            self.marks.append((name, time.perf_counter()))

    def read(self) -> dict[str, float]:
        """Seconds between consecutive marks, summed by the later mark's name."""
        if self.cuda:
            self.marks[-1][1].synchronize()
        out: dict[str, float] = {}
        for (_, a), (name, b) in itertools.pairwise(self.marks):
            out[name] = out.get(name, 0.0) + (a.elapsed_time(b) / 1e3 if self.cuda else b - a)
        self.marks = []
        return out


def _save_atomic(obj, path: Path, keep_previous: bool = False) -> None:
    """`obj` to `path` whole or not at all; with `keep_previous`, the file it replaces stays as
    `previous_of(path)` (a hard link, so that at every moment both names hold a whole file)."""
    tmp = temp_path(path)
    torch.save(obj, tmp)
    if keep_previous and path.exists():
        prev = previous_of(path)
        link = temp_path(prev)
        link.unlink(missing_ok=True)
        os.link(path, link)
        os.replace(link, prev)
    os.replace(tmp, path)


def previous_of(path: Path) -> Path:
    """Where a rank keeps its resume file of the epoch before (`resume-rank1.prev.pt`)."""
    return path.with_name(f"{path.stem}.prev{path.suffix}")


def resume_position(state: dict) -> tuple[int, int]:
    """How far a resume state got: (folds finished, the epoch of the fold in progress, or -1
    between folds). Later positions compare greater."""
    return len(state["results"]), state["epoch"] if state.get("fold") is not None else -1


def read_resume(run_dir: Path, resume: bool) -> dict | None:
    """This rank's resume state in `run_dir`, if any (None with `resume` off).

    In a data-parallel job every rank resumes from the same epoch, else their collectives no
    longer pair up and the job hangs. The ranks' resume files are written each on its own
    thread, so a job ended by a killed rank can leave one rank's file an epoch ahead of
    another's: each rank keeps the file before its last (`previous_of`), and the ranks take the
    latest position they all have, or start afresh together where they share none."""
    path = run_dir / distributed.resume_name()
    if not resume:
        return None
    if distributed.world()[1] == 1:
        return load_resume(path) if path.exists() else None
    found: dict[tuple[int, int], dict] = {}
    for p in (path, previous_of(path)):
        if p.exists():
            state = load_resume(p)
            found.setdefault(resume_position(state), state)
    common = distributed.common(set(found))
    if not common:
        if found:
            log.warning(
                "%s: the ranks' resume files share no epoch (this rank's: %s): starting afresh",
                path, sorted(found),
            )  # fmt: skip
        return None
    return found[max(common)]


class ResumeWriter:
    """Writes resume files on a thread of its own. The state is copied to the host when it is
    handed over (a consistent snapshot of the epoch just finished); torch.save, which releases
    the GIL, and the disk write then overlap the next epoch's training (at the standard DQN
    sizes the state is ~110 MB: writing it here saved ~0.07 s an epoch on the H200). One write
    at a time, in order; each lands whole or not at all (a temporary file, then a rename), so a
    task killed mid-write resumes from the epoch before. What is handed over must not change
    afterwards: the caller passes host copies (tensors) and deep copies (the dicts it keeps
    updating)."""

    def __init__(self) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="foxhunt-resume-writer")
        self._pending: Future | None = None

    def save(self, obj, path: Path) -> None:
        """`obj` to `path` after the previous write; in a job of several ranks the file it
        replaces is kept (`read_resume` says why)."""
        self.wait()
        keep = distributed.world()[1] > 1
        self._pending = self._pool.submit(_save_atomic, obj, path, keep)

    def wait(self) -> None:
        """Until the last write has landed; a failed write is raised here."""
        pending, self._pending = self._pending, None
        if pending is not None:
            pending.result()

    def close(self) -> None:
        """Let the writer's thread go (after `wait`: a pending write still lands)."""
        self._pool.shutdown()


@contextlib.contextmanager
def resume_writer() -> Generator[ResumeWriter, None, None]:
    """A `ResumeWriter` whose last write has landed when the block is left; if the block
    raised, that exception wins over a failed write (which is logged)."""
    w = ResumeWriter()
    try:
        yield w
    except BaseException:
        try:
            w.wait()
        except Exception as e:
            log.error("the last resume file could not be written: %s", e)
        raise
    else:
        w.wait()
    finally:
        w.close()


def host_copy(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """`tensors` copied to the host, for a resume file. From a GPU into page-locked memory
    (torch's caching host allocator keeps it for the next epoch's copy): the standard DQN's
    ~110 MB state took 90 ms an epoch into pageable memory on the H200 host, 2 ms pinned.
    (`snapshot()` has already cloned an agent's state on the device; copying it from there
    costs one more device copy, ~50 us for that state, and keeps the Agent interface one
    method.)"""
    out, cuda = {}, False
    for k, v in tensors.items():
        if v.device.type == "cuda":
            out[k] = torch.empty(v.shape, dtype=v.dtype, pin_memory=True).copy_(
                v, non_blocking=True
            )
            cuda = True
        else:
            out[k] = v.cpu()
    if cuda:
        torch.cuda.synchronize()  # the copies have landed before the writer reads them
    return out


def save_checkpoint(
    agent: Agent, data: MarketData, cfg: TrainConfig, path: Path, meta: dict
) -> None:
    """Best-epoch weights and normalisation statistics (safetensors); config, metrics (JSON)."""
    from safetensors.torch import save_file

    tensors = {k: v.detach().cpu().contiguous() for k, v in agent.weights().items()}
    tensors |= {k: v.cpu() for k, v in data.statistics().items()}
    if data.memory_decay is not None:  # what `foxhunt.train.policy` computes the memory with
        tensors["norm.memory_decay"] = torch.tensor(data.memory_decay, dtype=torch.float64)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    save_file(tensors, str(tmp), metadata={"foxhunt_version": __version__})
    os.replace(tmp, path)
    doc = {
        "config": dataclasses.asdict(cfg),
        "model": cfg.model,
        "resolved": dataclasses.asdict(agent.cfg),
        "columns": data.names,  # the market columns the policy reads, in order
        **meta,
    }
    write_json_atomic(path.with_suffix(".json"), doc)


def fxcache_dataset(cache: FxCache, symbol: str, bar_size: str) -> dict:
    """The cache as an MLflow dataset input: named by what it holds, digested by its key."""
    m = cache.manifest
    return {
        "name": f"fxcache {symbol} {bar_size} {m.get('start', '?')[:10]}..{m.get('end', '?')[:10]}",
        "digest": cache.key[:36],
        "source": {"fxcache_key": cache.key, "path": str(cache.path)},
        "schema": {
            "features": m.get("features", []),
            "ofi": m.get("ofi", []),
            "targets": m.get("targets", []),
        },
        "profile": {
            "rows": len(cache),
            "start": m.get("start"),
            "end": m.get("end"),
            "feature_version": m.get("feature_version"),
        },
    }


def fold_description(fold: dict, timestamps) -> dict:
    """A fold's ranges as MLflow parameters: UTC dates of each range's first and last bar, and
    its half-open bar indices."""

    def day(i: int) -> str:
        return str(np.datetime64(int(timestamps[i]), "ns").astype("datetime64[D]"))

    out: dict = {"id": fold["fold"]}
    for p in ("train", "val", "test"):
        lo, hi = fold[f"{p}_start"], fold[f"{p}_end"]
        out[p] = f"{day(lo)}..{day(hi - 1)}"
        out[f"{p}_bars"] = f"[{lo}, {hi})"
    return out


def check_finite(stats: dict[str, float], val: dict[str, float], fold: int, epoch: int) -> None:
    """Stop a task whose losses or val metrics stopped being numbers: it has diverged, and
    nothing after this epoch would mean anything."""
    bad = {k: v for k, v in stats.items() if k.startswith("losses/") and not math.isfinite(v)}
    bad |= {f"eval/val_{k}": v for k, v in val.items() if k != "profit_factor" and not
            math.isfinite(v)}  # fmt: skip
    if bad:
        terms = ", ".join(f"{k} = {v}" for k, v in bad.items())
        raise TrainError(
            f"fold {fold} epoch {epoch}: non-finite {terms}; training diverged (try a lower "
            "--lr or --grad-clip) and the task is stopped"
        )


def run_train(
    cfg: TrainConfig,
    logger: Logger | None = None,
    on_epoch_end: Callable[[int, int], None] | None = None,
) -> TrainResult:
    """One task: `cfg.model` with `cfg.seed` over the folds (`train_seeds` for cfg.seeds)."""
    if cfg.seeds:
        raise TrainError(f"seeds = {cfg.seeds}: several seeds train through train_seeds")
    return _run(cfg, [cfg.seed], [logger], on_epoch_end)[0]


def train_seeds(
    cfg: TrainConfig, on_epoch_end: Callable[[int, int], None] | None = None
) -> list[TrainResult]:
    """The tasks of `cfg.seeds` (or of `cfg.seed` alone) side by side in this process: each
    one's result as `run_train` of that seed would give it."""
    seeds = list(cfg.seeds or (cfg.seed,))
    return _run(cfg, seeds, [None] * len(seeds), on_epoch_end)


def _run(
    cfg: TrainConfig,
    seeds: list[int],
    loggers: list[Logger | None],
    on_epoch_end: Callable[[int, int], None] | None,
) -> list[TrainResult]:
    # Everything that can be checked is checked before the data is uploaded.
    if len(seeds) > 1 and distributed.launched():
        raise TrainError("seeds side by side under torchrun: one or the other (a seed per job)")
    cfg = cfg.for_seeds(len(seeds))
    doc = load_folds(cfg.folds)
    if cfg.compile_cache is not None:
        use_compile_cache(Path(cfg.compile_cache))
    # Under torchrun: join the job (process group, this rank's GPU); else the device asked for.
    device = distributed.init(cfg.device) if distributed.launched() else pick_device(cfg.device)
    if device.type == "cuda":
        scan.hash_triton_early()  # while the cache is checked and uploaded
    try:
        cfg.agent_config().resolved(device)
    except ValueError as e:
        raise TrainError(str(e)) from None
    cache = open_cache(Path(cfg.cache), doc["fxcache_key"])
    check_folds_fit(cfg.folds, doc, cache)
    folds = [f for f in doc["folds"] if not cfg.fold_ids or f["fold"] in cfg.fold_ids]
    if not folds:
        raise TrainError(f"{cfg.folds}: none of folds {list(cfg.fold_ids)} in the file")
    symbol = doc.get("symbol") or cache.manifest.get("symbol", "?")
    # One directory per run and configuration: a retried task (same run id) finds its resume
    # file there; a new run starts in a directory of its own.
    run_id = cfg.run_id or distributed.shared(new_run_id())  # rank 0's draw on every rank
    if cfg.run_id and not re.fullmatch(r"[A-Za-z0-9._-]+", run_id):
        raise TrainError(f"run_id {run_id!r}: only letters, digits, '.', '_' and '-'")
    main = distributed.is_main()  # rank 0 alone writes results, checkpoints, MLflow
    # Each seed is a task of its own: its config, digest, run directory and resume file.
    compile_eval = cfg.resolved_compile_eval()
    tasks = []
    for seed in seeds:
        tcfg = dataclasses.replace(cfg, seed=seed, seeds=(), compile_eval=compile_eval)
        digest = tcfg.digest(doc)
        run_dir = cfg.out / run_id / f"{symbol}-{cfg.model}-seed{seed}-{digest[:10]}"
        log.info("run %s: %s", run_id, run_dir)
        run_dir.mkdir(parents=True, exist_ok=True)
        if main:
            clean_stale(run_dir)
        tasks.append((tcfg, digest, run_dir))
    with contextlib.ExitStack() as notes:
        for _, digest, run_dir in tasks if main else ():
            notes.enter_context(failure_note(run_dir, digest))
        states = [read_resume(run_dir, cfg.resume) for _, _, run_dir in tasks]
        try:
            data = MarketData.from_fxcache(cache, device)
        except DataError as e:
            raise TrainError(
                f"fxcache {cache.path}: {e}. A cache `foxhunt precompute` wrote never holds "
                "such values: delete the cache directory and run precompute again"
            ) from None
        mlflow = cfg.tracking == "mlflow" and main
        loggers = [lg or (MlflowLogger(cfg.experiment) if mlflow else NullLogger())
                   for lg in loggers]  # fmt: skip
        try:
            with sigterm_raises(), resume_writer() as writer:
                known: dict = {}  # the folds' deterministic baselines, shared by the seeds
                results = _drive(
                    [_task(tcfg, doc, folds, cache, data, device, digest, run_id, run_dir,
                           state, logger, writer, on_epoch_end, known)
                     for (tcfg, digest, run_dir), state, logger in zip(tasks, states, loggers,
                                                                       strict=True)],
                    device, stack={"auto": device.type == "cuda", "on": True,
                                   "off": False}[cfg.stack_seeds],
                )  # fmt: skip
        except BaseException as e:
            # Killed (SIGTERM from Kubernetes, Ctrl-C) or failed: the MLflow runs say which.
            killed = isinstance(e, KeyboardInterrupt | SystemExit | Terminated)
            for lg in loggers:
                lg.abort("KILLED" if killed else "FAILED")
            raise
    if distributed.launched():
        distributed.finish()
    return results


@dataclass
class _Train:
    """What a task yields for each epoch's training: its agent, its clock to mark, and the
    epoch (stacked agents train together only at the same epoch)."""

    agent: Agent
    clock: Clock
    epoch: int


@dataclass
class _Built:
    """What a task yields once its agent is built, before capturing its graphs; `_drive` sends
    back whether it stacked the agent with the other tasks' (then the task captures nothing)."""

    agent: Agent


@dataclass
class _Fold:
    """What a task yields before it starts a fold (and refits the shared normaliser): the
    fold's position in the folds trained."""

    position: int


def _drive(tasks: list, device: torch.device, stack: bool = False) -> list[TrainResult]:
    """Run the tasks (`_task` generators) in step and return their results. A task yields
    `_Built` once its agent is built, `_Train` for each epoch's collection and learning, which
    run here for every task that asks at once (foxhunt.train.cohort; on a GPU, with more than
    one task, each on a CUDA stream of its own), and `_Fold` before it starts a fold. It waits
    there while any task trains, and then until the tasks at earlier folds are done with them:
    the tasks share the data and its normaliser, so they train one fold at a time (a task that
    stopped early, or that resumed past a fold, waits for the others).

    With `stack`, agents that can be stacked (foxhunt.train.agents.dqn_stacked) are,
    before any captures its graphs: an epoch that every task trains, all at the same epoch, is
    then one stacked epoch. When only some train (the others finished, stopped early or wait at
    another fold), those run on their own, each capturing its graphs the first time; when all
    train but resumed at different epochs, the ones behind train on their own until all stand
    at one epoch, and the rest train stacked."""
    n = len(tasks)
    streams = (
        [torch.cuda.Stream(device) for _ in tasks] if device.type == "cuda" and n > 1 else None
    )
    wants: list = [None] * n
    out: list = [None] * n

    def advance(i: int, value=None) -> None:
        try:
            wants[i] = tasks[i].send(value)
        except StopIteration as stop:
            wants[i], out[i] = None, stop.value

    for i in range(n):
        advance(i)  # each task builds its agent
    built = [w.agent for w in wants]
    stacked = None
    why = stackable(built) if stack and n > 1 else None
    if why is not None:
        if isinstance(built[0].cfg, DQNConfig):  # the others never stack
            log.info("the %d seeds' agents train side by side, not stacked: %s", n, why)
    elif stack and n > 1:
        stacked = StackedRainbow(built)
        log.info("the %d seeds' agents stacked into one (foxhunt.train.agents.dqn_stacked)", n)
        if built[0].cfg.capture == "graph":
            capture_logged(stacked)
    for i in range(n):
        advance(i, stacked is not None)
    while any(w is not None for w in wants):
        ready = [i for i in range(n) if isinstance(wants[i], _Train)]
        if stacked is not None and len(ready) == n:
            # Every task trains, at different epochs (resumed apart): the ones behind go first,
            # alone, and the others wait, so that they meet at one epoch and train stacked from
            # there, rather than an epoch apart, each on its own, to the fold's end.
            first = min(wants[i].epoch for i in ready)
            ready = [i for i in ready if wants[i].epoch == first]
        if ready:
            clocks = [wants[i].clock for i in ready]

            def mark(name: str, clocks: list[Clock] = clocks) -> None:
                for c in clocks:
                    c.mark(name)

            agents = [wants[i].agent for i in ready]
            if stacked is not None and len(ready) == n:  # all at one epoch (above)
                train_epoch([stacked], None, mark)
            else:
                for a in agents:
                    if stacked is not None and a.cfg.capture == "graph" and not a.graphs:
                        capture_logged(a)
                train_epoch(agents, streams and [streams[i] for i in ready], mark)
        else:  # every task left waits at a fold's start: the earliest fold's go on together
            first = min(w.position for w in wants if w is not None)
            ready = [i for i in range(n) if wants[i] is not None and wants[i].position == first]
        for i in ready:
            advance(i)
    return out


def capture_logged(agent) -> None:
    """`agent.capture()` (its steps compiled where they are, warmed up and captured in CUDA
    graphs) between two log lines, with its time: on a cold compile cache it takes a minute
    or more, which a task's log should not pass over in silence."""
    if getattr(agent.cfg, "compile", False):
        log.info("compiling and capturing the training steps (minutes on a cold compile cache, "
                 "seconds on a warm one)")  # fmt: skip
        done = "compiled and captured"
    else:
        log.info("capturing the training steps")
        done = "captured"
    t0 = time.perf_counter()
    agent.capture()
    log.info("training steps %s in %.1f s", done, time.perf_counter() - t0)


def use_compile_cache(root: Path) -> Path:
    """Point inductor's and Triton's caches at `root`/torch-<version> (before anything is
    compiled in this process). Entries are written to a temporary name and renamed, so tasks
    sharing the folder (the fxcache volume) do not corrupt each other's. The sizes the device
    chose (foxhunt.train.sizer) are kept beside them, unless FOXHUNT_SIZE_CACHE says where."""
    path = root / f"torch-{torch.__version__}"
    path.mkdir(parents=True, exist_ok=True)
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(path)
    os.environ["TRITON_CACHE_DIR"] = str(path / "triton")
    os.environ.setdefault("FOXHUNT_SIZE_CACHE", str(root / "sizes.json"))
    return path


@contextlib.contextmanager
def sigterm_raises():
    """Within the block, SIGTERM raises `Terminated`, so that cleanup (the failure note, the
    runs' KILLED status) happens before the process ends; the previous handler comes back
    after. Only the main thread can set handlers: elsewhere this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum, frame):
        raise Terminated(f"signal {signum}")

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


@contextlib.contextmanager
def failure_note(run_dir: Path, digest: str):
    """A task that fails leaves `failed.json` (the error) and no `results.json`, so that the
    report never counts it; a later success removes the note."""
    try:
        yield
    except BaseException as e:
        (run_dir / "results.json").unlink(missing_ok=True)
        note = {"error": f"{type(e).__name__}: {e}", "config_digest": digest}
        write_json_atomic(run_dir / "failed.json", note)
        raise
    (run_dir / "failed.json").unlink(missing_ok=True)


def _usable_resume(state: dict | None, digest: str, agent: Agent, path: Path) -> dict | None:
    """`state` if this task can go on from it: written for the same configuration, by the same
    code and the same trainer. Otherwise None, with a warning that says why it starts afresh."""
    if state is None:
        return None
    why = None
    if state.get("digest") != digest:
        why = "belongs to another configuration"
    elif state.get("code") != code_version():
        why = f"was written by other code ({state.get('code')}, this is {code_version()})"
    elif state.get("agent") is not None and (mismatch := agent.state_mismatch(state["agent"])):
        why = f"was written by another trainer ({mismatch})"
    if why is None:
        return state
    log.warning("%s %s: starting afresh", path, why)
    return None


def _resume_doc(
    digest: str, results: list[dict], run_ids: dict, fold: int | None = None, **mid_fold
) -> dict:
    """What a task's resume file holds: the folds' results so far and the MLflow run ids, and
    inside a fold (`fold` set) the epoch, agent, best epoch and weights and RNG states."""
    return {
        "digest": digest,
        "code": code_version(),
        "fold": fold,
        "results": copy.deepcopy(results),
        "run_ids": copy.deepcopy(run_ids),
        **mid_fold,
    }


def _run_tags(
    cfg: TrainConfig, key: str, symbol: str, device: torch.device, run_id: str, task_digest: str
) -> dict[str, str]:
    """The MLflow tags of a task's runs: what it trained on, with which code, in which run."""
    commit = os.environ.get("FOXHUNT_GIT_COMMIT")
    return {
        "fxcache_key": key,
        "symbol": symbol,
        "model": cfg.model,
        "seed": str(cfg.seed),
        "device": str(device),
        "foxhunt_version": __version__,
        "foxhunt_run_id": run_id,
        "code_version": code_version(),
        "task_digest": task_digest,
        **({"git_commit": commit} if commit is not None else {}),
        **cfg.tags,
    }


def _run_params(cfg: TrainConfig, agent: Agent, bars: int, bar_size: str, sizing) -> dict:
    """The MLflow params of a task: the training, env and model configs (the model's as the
    device resolved it), the data's size and the sizes the device chose."""
    params = {
        "train": {
            k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("env", "tags", *MODELS)
        },
        "env": dataclasses.asdict(cfg.env),
        cfg.model: dataclasses.asdict(agent.cfg),
        "bars": bars,
        "bar_size": bar_size,
    }
    if sizing is not None:  # sizes the device chose (foxhunt.train.sizer)
        params["sizing"] = dataclasses.asdict(sizing)
    if hasattr(agent, "predict_batch"):  # windows a prediction piece holds (supervised)
        params["predict_batch"] = agent.predict_batch
    return params


def _aggregate(results: list[dict]) -> dict:
    """A task's figures over its folds (their means), the baselines' test Sharpe beside them."""

    def mean(key: str, part: str) -> float:
        return sum(r[part][key] for r in results) / len(results)

    aggregate = {
        "val_sharpe": mean("sharpe", "val"),
        "test_sharpe": mean("sharpe", "test"),
        "test_sortino": mean("sortino", "test"),
        "test_max_drawdown": mean("max_drawdown", "test"),
        "test_profit_factor": mean("profit_factor", "test"),
        "test_turnover": mean("turnover", "test"),
        "random_val_sharpe": mean("sharpe", "random_val"),
    }
    if all(r.get("baselines") for r in results):
        aggregate["baselines_test_sharpe"] = {
            name: sum(r["baselines"][name]["test"]["sharpe"] for r in results) / len(results)
            for name in results[0]["baselines"]
        }
    return aggregate


def _task(
    cfg: TrainConfig,
    doc: dict,
    folds: list[dict],
    cache: FxCache,
    data: MarketData,
    device: torch.device,
    digest: str,
    run_id: str,
    run_dir: Path,
    state: dict | None,
    logger: Logger,
    writer: ResumeWriter,
    on_epoch_end: Callable[[int, int], None] | None,
    known_baselines: dict | None = None,
) -> Generator[_Built | _Train | _Fold, bool | None, TrainResult]:
    """The task once everything is checked and uploaded: build the agent, then each fold. A
    generator that `_drive` runs: it yields `_Built` once its agent is built, `_Fold` before
    each fold it trains and `_Train` where an epoch's collection and learning go, and returns
    the task's result. `known_baselines`: the dict its process's tasks share the folds'
    deterministic baselines in (foxhunt.train.baselines.evaluate_baselines)."""
    # ---- setup: the agent, its evaluators, the resume state, the MLflow runs
    symbol = doc.get("symbol") or cache.manifest.get("symbol", "?")
    ppy = periods_per_year(cache.timestamps)
    resume_path = run_dir / distributed.resume_name()
    main = distributed.is_main()
    # The task whichever folds this call trains: a pipeline that trains each fold as a task of
    # its own gives the report pieces of one task to put back together.
    task_digest = dataclasses.replace(cfg, fold_ids=()).digest(doc)
    log.info(
        "uploaded %d bars (%.0f MB) to %s in %.1f ms",
        data.n,
        data.upload.bytes / 1e6,
        device,
        data.upload.seconds * 1e3,
    )
    # Sizes left to the device (envs, batch, replay on a GPU) fitted to its free memory.
    agent_cfg, sizing = agent_sizes(agent_class(cfg.model), cfg.agent_config(), cfg.env, data)
    if sizing is not None:
        log.info("sizes from the device: %s (%s of the GPU defaults, %s)", sizing.sizes,
                 sizing.fraction, sizing.source)  # fmt: skip
    agent: Agent = agent_class(cfg.model)(agent_cfg, cfg.env, data, cfg.seed)
    sizing = sizing or getattr(agent, "sizing", None)  # the supervised batch sizes itself
    stacked = yield _Built(agent)  # stacked with the other tasks' agents (`_drive`)?
    if agent.cfg.capture == "graph" and not stacked:
        capture_logged(agent)
    segments = cfg.eval_segments or default_segments(device)
    compile_eval = cfg.resolved_compile_eval() and bool(getattr(agent.cfg, "compile", False))
    if compile_eval and getattr(agent.cfg, "compile_mode", None) == "aot":
        compile_eval = "aot"  # as the agent's own steps
    evaluator = Evaluator(
        cfg.env, data, segments, capture=agent.cfg.capture == "graph", compile=compile_eval
    )
    # Sized for the task's longest val or test range at once: its step is traced (compiled)
    # and captured once for every range, not again at the first longer one.
    evaluator.reserve(max(hi - lo for f in folds for part, (lo, hi) in fold_ranges(f).items()
                          if part != "train"))  # fmt: skip
    # The baselines step through the same env, costs and metrics in at least 64 pieces (the
    # same result in fewer steps than a test's 4).
    base_eval = Evaluator(cfg.env, data, max(segments, 64)) if cfg.baselines and main else None

    greedy = agent.greedy
    # Optional parts of the interface (supervised models): predict a range before it is
    # traded, and classification metrics beside the trading ones.
    prepare = getattr(agent, "prepare_eval", None)
    extra = getattr(agent, "extra_metrics", None)
    explain = getattr(agent, "explain", None)  # what the model reads (TFT), per fold
    calibrate = getattr(agent, "calibrate", None)  # fitted on val (the ensemble's weights)

    state = _usable_resume(state, digest, agent, resume_path)
    resumed = state is not None
    results: list[dict] = state["results"] if state else []
    run_ids = state["run_ids"] if state else {"parent": None, "child": None}
    tags = _run_tags(cfg, cache.key, symbol, device, run_id, task_digest)
    params = _run_params(cfg, agent, data.n, doc["bar_size"], sizing)
    task_name = f"{symbol} {cfg.model} seed{cfg.seed}"
    dataset = fxcache_dataset(cache, symbol, doc["bar_size"])
    run_ids["parent"] = logger.start_task(task_name, params, tags, run_ids["parent"], dataset)
    if not resumed:
        logger.log_metrics({"time/upload_ms": data.upload.seconds * 1e3})

    done = {r["fold"] for r in results}
    trained: list[int] = []  # folds finished by this call (not read back from a resume file)
    left = sum(cfg.epochs for f in folds if f["fold"] not in done)
    if state is not None and state.get("fold") is not None:
        left -= state["epoch"] + 1
    progress = Eta(left)
    for fold in folds:
        k = fold["fold"]
        if k in done:
            continue
        # ---- a fold: reset the agent (or restore it mid-fold), train its epochs, test the best
        yield _Fold(folds.index(fold))
        ranges = fold_ranges(fold)
        clock = Clock(device)
        clock.mark("start")
        mid_fold = state is not None and state.get("fold") == k
        if mid_fold:
            agent.restore(state["agent"])
            data.score_forecast()  # the forecast column from the restored fit (if any)
            best = state["best"]
            best_weights = state["best_weights"]
            best_weights = best_weights and {n: v.to(device) for n, v in best_weights.items()}
            first_epoch = state["epoch"] + 1
            torch.set_rng_state(state["rng_cpu"])
            if device.type == "cuda":
                torch.cuda.set_rng_state(state["rng_cuda"], device)
            run_ids["child"] = logger.start_fold(k, tags, state["run_ids"]["child"])
        else:
            fold_params = params | {"fold": fold_description(fold, cache.timestamps)}
            month = fold["periods"]["test"][0][:7] if "periods" in fold else ""
            # Each data-parallel rank collects with its own randomness (rank 0: the task's).
            agent.reset_fold(*ranges["train"], seed=distributed.rank_seed(cfg.seed * 100_003 + k))
            best = {"sharpe": -float("inf"), "epoch": -1}
            best_weights = None
            first_epoch = 0
            run_ids["child"] = logger.start_fold(
                k, tags, None, f"{task_name} fold{k} {month}".strip(), fold_params, dataset
            )
        state = None
        clock.mark("fold_reset")
        reset_s = clock.read()["fold_reset"]
        if first_epoch == 0:
            logger.log_metrics({"time/fold_reset_ms": reset_s * 1e3}, step=0)
        if not trained and (age := process_age()) is not None:
            # How long this process took to reach its first epoch: the interpreter, imports,
            # data, build, compile or packages loaded, capture (a warm start's cost).
            log.info("first epoch begins %.1f s after the process started", age)
            logger.log_metrics({"time/task_start_s": age}, step=first_epoch)

        for epoch in range(first_epoch, cfg.epochs):
            # Early stopping, decided from the epochs done (so a resumed fold stops where an
            # uninterrupted one did).
            if cfg.patience and epoch - 1 - best["epoch"] >= cfg.patience:
                log.info("fold %d: val Sharpe not improved for %d epochs; stopping at epoch %d",
                         k, cfg.patience, epoch)  # fmt: skip
                break
            agent.begin_epoch(epoch, cfg.epochs)
            clock.mark("start")
            # Collection and learning (DQN: one round; PPO, PQN: rollouts and updates), with
            # the other tasks' side by side: `_drive` runs them and marks the clock.
            yield _Train(agent, clock, epoch)
            if calibrate is not None:
                calibrate(*ranges["val"])
            if prepare is not None:
                prepare(*ranges["val"])  # a supervised model predicts the range at once
            # At most VAL_PASSES passes: near exact where a policy's own clock keeps its pieces
            # apart (evaluate.VAL_PASSES); the fold's reported val is exact (below).
            val_r, val_tr = evaluator.run(greedy, *ranges["val"], graph=True,
                                          max_passes=VAL_PASSES)  # fmt: skip
            clock.mark("eval")
            times = clock.read()
            stats = agent.read_stats()
            val = trading_metrics(val_r, val_tr, ppy, evaluator.last_positions)
            val["exact"] = evaluator.last_exact
            if extra is not None:
                val |= extra(*ranges["val"])
            check_finite(stats, val, k, epoch)
            metrics = {**stats, **{f"eval/val_{m}": v for m, v in val.items()}}
            metrics["eval/val_passes"] = evaluator.last_passes  # what the validation cost
            metrics |= {f"time/{p}_s": s for p, s in times.items()}
            metrics["time/epoch_s"] = sum(times.values())
            if val["sharpe"] > best["sharpe"]:
                best = {"sharpe": val["sharpe"], "epoch": epoch, "val": val}
                best_weights = {n: v.detach().clone() for n, v in agent.weights().items()}
                if main:  # rank 0 alone writes: the ranks' weights are the same
                    save_checkpoint(
                        agent,
                        data,
                        cfg,
                        run_dir / f"fold-{k}" / "best.safetensors",
                        {"fold": fold, "epoch": epoch, "val": val},
                    )
            logger.log_metrics(metrics, step=epoch)
            progress.epoch_done(metrics["time/epoch_s"])
            log.info(
                "fold %d (%d/%d) epoch %d/%d: loss %.4f, val Sharpe %.2f (best %.2f @ %d), "
                "%.2f s (%s), ETA %s",
                k, folds.index(fold) + 1, len(folds), epoch + 1, cfg.epochs,
                stats["losses/loss"], val["sharpe"], best["sharpe"], best["epoch"] + 1,
                metrics["time/epoch_s"], ", ".join(f"{p} {s:.2f}" for p, s in times.items()),
                progress.eta(),
            )  # fmt: skip
            rng_cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
            writer.save(
                _resume_doc(
                    digest, results, run_ids, k, epoch=epoch, agent=host_copy(agent.snapshot()),
                    best=copy.deepcopy(best), best_weights=best_weights and host_copy(best_weights),
                    rng_cpu=torch.get_rng_state(), rng_cuda=rng_cuda,
                ),
                resume_path,
            )  # fmt: skip
            if on_epoch_end is not None:
                on_epoch_end(k, epoch)

        # ---- the fold's report: its best epoch on val (exact) and test, the baselines
        # The ranks of a data-parallel job took the same steps: checked, bit for bit.
        distributed.check_same(agent.weights(), f"fold {k}")
        # The best epoch, once on the test range; and a random policy for scale.
        live = {n: v.clone() for n, v in agent.weights().items()}
        agent.load_weights(best_weights)
        # Chosen on a near-exact val where the cap bound: the fold reports the exact one.
        if best["val"].get("exact", 1.0) < 1.0:
            if prepare is not None:
                prepare(*ranges["val"])
            val_r, val_tr = evaluator.run(greedy, *ranges["val"], graph=True)
            val = trading_metrics(val_r, val_tr, ppy, evaluator.last_positions)
            best["val"] = {**best["val"], **val, "exact": 1.0}
            best["sharpe"] = val["sharpe"]
            if main:
                meta = {"fold": fold, "epoch": best["epoch"], "val": best["val"]}
                save_checkpoint(agent, data, cfg, run_dir / f"fold-{k}" / "best.safetensors", meta)
        if prepare is not None:
            prepare(*ranges["test"])
        test_r, test_tr = evaluator.run(greedy, *ranges["test"], graph=True)
        test = trading_metrics(test_r, test_tr, ppy, evaluator.last_positions)
        if extra is not None:
            test |= extra(*ranges["test"])
        explained = explain(*ranges["test"]) if explain is not None else None
        if explained is not None and main:
            write_json_atomic(run_dir / f"fold-{k}" / "explain.json", explained)
        lo, hi = ranges["test"]
        if main:
            np.savez(
                run_dir / f"fold-{k}" / "test_returns.npz",
                timestamps=cache.timestamps[lo + 1 : hi],
                strategy=test_r.double().cpu().numpy(),
                trades=test_tr.double().cpu().numpy(),
                buy_and_hold=data.ret1[lo : hi - 1].double().cpu().numpy(),
            )
        agent.load_weights(live)
        gen = torch.Generator(device=device).manual_seed(cfg.seed * 7919 + k)
        rnd_r, rnd_tr = evaluator.run(random_policy(gen), *ranges["val"])
        rnd = trading_metrics(rnd_r, rnd_tr, ppy)
        logger.log_metrics({f"eval/test_{m}": v for m, v in test.items()}, step=cfg.epochs)
        logger.log_metrics(
            {"eval/random_val_sharpe": rnd["sharpe"], "eval/best_epoch": best["epoch"]}
        )
        base = (evaluate_baselines(base_eval, data, ranges, ppy, cfg.seed, known_baselines)
                if base_eval else {})  # fmt: skip
        logger.log_metrics(
            {f"baselines/{name}_{part}_sharpe": b[part]["sharpe"]
             for name, b in base.items() for part in ("val", "test")}
        )  # fmt: skip
        ckpt = run_dir / f"fold-{k}" / "best.safetensors"
        logger.log_artifact(ckpt, "checkpoint")
        logger.log_artifact(ckpt.with_suffix(".json"), "checkpoint")
        if explained is not None:
            logger.log_artifact(run_dir / f"fold-{k}" / "explain.json", "explain")
        model_uri = logger.log_model(ckpt)  # the checkpoint as an MLflow model that acts
        logger.end_fold()
        trained.append(k)
        results.append(
            {
                "fold": k,
                "best_epoch": best["epoch"],
                "val": best["val"],
                "test": test,
                "random_val": rnd,
                "baselines": base,
                "fold_reset_ms": reset_s * 1e3,
                "ranges": ranges,
                "test_returns": f"fold-{k}/test_returns.npz",
                **({"explain": f"fold-{k}/explain.json"} if explained is not None else {}),
                "model_uri": model_uri,
            }
        )
        writer.save(_resume_doc(digest, results, run_ids), resume_path)  # between folds

    # ---- the task's result: the folds' means, the registered model, results.json
    aggregate = _aggregate(results)
    if trained:
        # The task's best fold by val Sharpe goes to the Model Registry, with its metrics.
        top = max(results, key=lambda r: r["val"]["sharpe"])
        if top.get("model_uri"):
            logger.register_model(
                top["model_uri"],
                f"foxhunt-{symbol}-{cfg.model}",
                {"foxhunt_run_id": run_id, "fold": top["fold"], "seed": cfg.seed,
                 "val_sharpe": top["val"]["sharpe"], "test_sharpe": top["test"]["sharpe"],
                 "fxcache_key": cache.key},
            )  # fmt: skip
    logger.end_task(
        {f"eval/mean_{k}": v for k, v in aggregate.items() if k != "baselines_test_sharpe"}
        | {f"baselines/mean_{k}_test_sharpe": v
           for k, v in aggregate.get("baselines_test_sharpe", {}).items()}
    )  # fmt: skip
    out = {
        "foxhunt_version": __version__,
        "config": dataclasses.asdict(cfg),
        "fxcache_key": cache.key,
        "symbol": symbol,
        "device": str(device),
        "mlflow_run_id": run_ids["parent"],
        "run_id": run_id,
        "code_version": code_version(),
        "run_dir": str(run_dir.resolve()),
        "config_digest": digest,
        "task_digest": task_digest,
        "seed": cfg.seed,
        "model": cfg.model,
        "periods_per_year": ppy,
        "folds": results,
        "aggregate": aggregate,
    }
    if main:
        write_json_atomic(run_dir / "results.json", out)
    return TrainResult(
        run_id, run_dir, results, aggregate, str(device), data.upload.seconds * 1e3, resumed
    )
