"""Sizes from the device: the largest batch whose training step fits in the GPU's free memory
(the supervised models), and the largest fraction of their GPU defaults an agent's envs, batch
and replay may take (`agent_sizes`).

A model's `probe(n)` runs what a training step at size n allocates (forward and backward on
random inputs); `largest_fitting` searches the powers of two between a floor and a cap for the
largest size whose peak allocation stays within a budget, a fraction of the memory free when
the search starts. A size that runs out of memory counts as too large (the allocator's cache is
emptied and the search goes on below it), so the search itself never fails a task for memory.

The choice is cached per GPU model, torch version and configuration (`SizeCache`, a JSON file
under $FOXHUNT_SIZE_CACHE, by default ~/.cache/foxhunt/sizes.json; on a cluster point it at the
fxcache volume): the next task on the same kind of GPU takes the same size without probing,
and so trains the same way, whatever else happens to occupy the GPU that day. A size the user
sets always wins; the sizer runs only for sizes left to the device.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from foxhunt.fsutil import write_json_atomic
from foxhunt.train import distributed
from foxhunt.train.agents.common import uncompiled

log = logging.getLogger(__name__)

MARGIN = 0.5
"""Fraction of the free memory a probed step may use: the rest is left for what the probe does
not allocate (the CUDA graph's own pool, compiled kernels' workspaces, evaluation)."""


@dataclass(frozen=True)
class Choice:
    size: int
    peak_bytes: int  # the probe's peak at that size (0 when it came from the cache)
    budget_bytes: int
    source: str  # "probed" or "cache"


class OutOfMemory(Exception):
    """What a probe raises (or torch.cuda.OutOfMemoryError) when a size does not fit."""


def powers_of_two(lo: int, hi: int) -> list[int]:
    out, n = [], 1
    while n <= hi:
        if n >= lo:
            out.append(n)
        n *= 2
    return out


def largest_fitting(
    measure: Callable[[int], int], sizes: list[int], budget: int
) -> tuple[int, int]:
    """The largest of `sizes` (ascending) whose `measure(n)` (peak bytes of a step at size n)
    is at most `budget`, by binary search (memory grows with the size), and its peak. A measure
    that raises `OutOfMemory` or torch's out-of-memory error counts as too large. Raises
    `OutOfMemory` when not even the smallest fits."""
    best: tuple[int, int] | None = None
    lo, hi = 0, len(sizes) - 1
    while lo <= hi:
        mid = (lo + hi) // 2
        try:
            peak = measure(sizes[mid])
        except (OutOfMemory, torch.cuda.OutOfMemoryError):
            peak = None
        if peak is not None and peak <= budget:
            best = (sizes[mid], peak)
            lo = mid + 1
        else:
            hi = mid - 1
    if best is None:
        raise OutOfMemory(
            f"not even size {sizes[0]} fits in {budget / 2**30:.2f} GiB (its share of the free "
            "GPU memory): free the GPU or set a smaller size"
        )
    return best


def cuda_peak(device: torch.device, step: Callable[[int], None]) -> Callable[[int], int]:
    """`measure` for `largest_fitting`: the peak bytes allocated while `step(n)` runs on
    `device`, above what was allocated before it; memory is released after each try."""

    def measure(n: int) -> int:
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        try:
            step(n)
            torch.cuda.synchronize(device)
            return torch.cuda.max_memory_allocated(device) - base
        finally:
            torch.cuda.empty_cache()

    return measure


class SizeCache:
    """Sizes chosen before, by GPU model, torch version and configuration digest."""

    def __init__(self, path: Path | None = None):
        default = Path.home() / ".cache" / "foxhunt" / "sizes.json"
        self.path = path or Path(os.environ.get("FOXHUNT_SIZE_CACHE") or default)

    def _read(self) -> dict:
        with contextlib.suppress(OSError, ValueError):
            doc = json.loads(self.path.read_text())
            if isinstance(doc, dict):
                return doc
        return {}

    def get(self, key: str) -> int | None:
        v = self._read().get(key)
        return v["size"] if isinstance(v, dict) and isinstance(v.get("size"), int) else None

    def put(self, key: str, choice: Choice, what: str) -> None:
        doc = self._read()
        doc[key] = {"size": choice.size, "peak_bytes": choice.peak_bytes,
                    "budget_bytes": choice.budget_bytes, "what": what}  # fmt: skip
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(self.path, doc)
        except OSError as e:  # a read-only home: the choice stands, it is just not kept
            log.warning("size cache %s not written: %s", self.path, e)


def cache_key(device: torch.device, what: str, config: dict) -> str:
    """GPU model and memory, torch version, and a digest of what the step depends on."""
    p = torch.cuda.get_device_properties(device)
    blob = json.dumps(config, sort_keys=True, default=str)
    digest = hashlib.sha256(blob.encode()).hexdigest()[:12]
    return f"{p.name}|{p.total_memory // 2**20}MiB|torch {torch.__version__}|{what}|{digest}"


def device_size(device: torch.device, what: str, config: dict, step: Callable[[int], None],
                lo: int, hi: int, cache: SizeCache | None = None,
                beside: Callable[[], None] | None = None,
                share: float = MARGIN) -> Choice:  # fmt: skip
    """The size for `what` at `config` on this GPU: from the cache, else the largest power of
    two in [lo, hi] whose `step` fits in `share` of the free memory (then cached). `beside`
    runs what the task holds besides the step whatever the size (the supervised models'
    prediction graph): its peak, measured once, comes off the budget."""
    cache = cache or SizeCache()
    key = cache_key(device, what, config)
    hit = cache.get(key)
    if hit is not None and lo <= hit <= hi:
        return Choice(hit, 0, 0, "cache")
    free, _ = torch.cuda.mem_get_info(device)
    held = cuda_peak(device, lambda _: beside())(0) if beside is not None else 0
    budget = int(free * share) - held
    size, peak = largest_fitting(cuda_peak(device, step), powers_of_two(lo, hi), budget)
    choice = Choice(size, peak, budget, "probed")
    log.info("%s: size %d from the device (peak %.2f GiB of a %.2f GiB budget)", what, size,
             peak / 2**30, budget / 2**30)  # fmt: skip
    cache.put(key, choice, what)
    return choice


# ------------------------------------------------------------------------- the agents' sizes
SCALES = powers_of_two(1, 64)
"""Fractions of the GPU defaults an agent's sizes may take, in 64ths: 64 is the defaults
themselves (what the figures in docs/performance.md were measured at), 1 is 1/64 of them."""


def on_gpu(device: torch.device) -> bool:
    return device.type == "cuda"


@dataclass(frozen=True)
class AgentSizes:
    sizes: dict[str, int]  # the fields the device chose
    fraction: str  # of the GPU defaults, in 64ths: "16/64"
    peak_bytes: int
    budget_bytes: int
    source: str  # "probed", "cache" or "rank 0"


def agent_sizes(agent_cls, cfg, env_cfg, data, cache: SizeCache | None = None):
    """`cfg` with the sizes it leaves to the device filled in, and what was chosen (None when
    nothing was left to the device, or on a CPU, where the CPU defaults apply).

    The fields an agent's config names in `device_sized` (DQN: envs, batch and replay
    capacity; PPO and PQN: envs) and leaves at None take the largest fraction of their GPU
    defaults, halving all of them together so that their ratios (and the config's checks)
    hold, whose probe fits in MARGIN of the free memory: a probe builds the agent at those
    sizes on the task's data, resets a fold and runs one collection and one learning phase,
    eager. A probe that runs out of memory counts as too large. The choice is cached per GPU
    model, torch version and configuration like the supervised batch (`device_size`); on
    several data-parallel ranks rank 0's choice is every rank's."""
    dev = data.device
    fields = [f for f in getattr(cfg, "device_sized", ()) if getattr(cfg, f) is None]
    if not on_gpu(dev) or not fields:
        return cfg, None
    full = cfg.resolved(dev)
    defaults = {f: getattr(full, f) for f in fields}
    top = SCALES[-1]

    def at(scale: int) -> dict[str, int]:
        return {f: max(1, d * scale // top) for f, d in defaults.items()}

    eager = uncompiled(getattr(cfg, "compile_mode", None))  # a probe compiles nothing

    def probe(scale: int) -> None:
        c = dataclasses.replace(cfg, **at(scale), **eager)
        agent = agent_cls(c, env_cfg, data, 0)
        agent.reset_fold(0, data.n, seed=0)
        agent.begin_epoch(0, 1)
        agent.collect()
        agent.learn()
        del agent

    what = {k: v for k, v in dataclasses.asdict(cfg).items() if k not in ("lr", "tags")}
    what["bars"] = data.n  # the probe's fold spans the data; its size is in the footprint
    choice = device_size(dev, type(cfg).__name__, what, probe, SCALES[0], top, cache)
    sizes = AgentSizes(at(choice.size), f"{choice.size}/{top}", choice.peak_bytes,
                       choice.budget_bytes, choice.source)  # fmt: skip
    first = distributed.shared(sizes)
    if first != sizes:
        sizes = dataclasses.replace(first, source="rank 0")
    torch.cuda.empty_cache()
    return dataclasses.replace(cfg, **sizes.sizes), sizes
