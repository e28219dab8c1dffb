"""The supervised path: a sequence model (foxhunt.train.models) trained on windows of the
resident fxcache to predict the direction of the next `horizon` bars, and traded through the
same env, evaluation and metrics as the agents.

Samples. The window of bar t is the last `window` bars of the 50 observable columns ending at
t, normalised on the fold's train range (`MarketData.observe`), gathered on the device by index
arithmetic from the tensors uploaded once: no per-sample copies, no DataLoader. A window may
reach back before the range it belongs to (those bars are in the past); never forward.

Labels. r_h[t] = close[t + h] / close[t] - 1, from the per-bar returns in float64. The class of
bar t is down (r_h < -theta), flat or up (r_h > theta), the FI-2010 and TLOB convention, with
theta the 1/3 quantile of |r_h| over the fold's train samples: flat is a third of them, and up
and down share the rest (evenly but for the range's drift; a symmetric threshold keeps "up" a
rise and "down" a fall). Only bars whose label ends inside the range are samples of it
(t + h <= end - 1): no label crosses into the next range, whatever the folds' purge.

Training. AdamW on one flat parameter buffer; a learning rate held as a device tensor, warmed
up linearly over the first `warmup` of the fold's steps, then cosine towards 0 (never 0 itself:
`step_lr_factor`); cross-entropy in
float32 on bf16 autocast logits; the global gradient norm clipped, the norm before clipping
logged; minibatches shuffled on the device. On a GPU the training step is one CUDA graph, and
so is the network's forward over a piece of `PREDICT_BATCH` windows that evaluation replays
(the last piece of a range padded with its last bar): an eager forward of these narrow models
is hundreds of small kernels, bound by their launches.

A regression target is an option (`target = "return"`): the network forecasts quantiles of
r_h (scaled by its standard deviation on the train samples) under the pinball loss; read as a
normal distribution (`quantile_class_probs`) they give the three classes' probabilities, traded
and scored as the direction target's are.

Trading. Before each evaluation the model predicts every bar of the range at once (under
`torch.inference_mode`); the policy then reads its prediction: long on up, short on down, and
on flat it keeps the position it holds (`flat = "hold"`, the cost-aware reading: a small expected
move is no reason to pay for a trade) or closes it (`"flat"`); full size, or sized by the
predicted class's probability (`sizing = "confidence"`); market orders. Classification metrics
of the range (accuracy, macro F1, per-class precision and recall, the confusion matrix) come
beside the trading metrics.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from foxhunt.train import aot, distributed, scan
from foxhunt.train.agents.common import (
    AgentState,
    Capture,
    FlatGrad,
    Precision,
    autocast,
    capture_graphs,
    capture_restoring,
    clip_and_step,
    compiled,
    copy_weights,
    ensure_adam_state,
    flat_optimiser,
    flatten_into_views,
    mark_step,
    module_weights,
    resolve,
    restart,
)
from foxhunt.train.data import N_MKT, MarketData
from foxhunt.train.env import DIRECTIONS, PORTFOLIO, SIZES, EnvConfig
from foxhunt.train.sizer import Choice, device_size

log = logging.getLogger(__name__)

CLASSES = ("down", "flat", "up")
FLAT = DIRECTIONS.index(0.0)
STATS = ("loss", "grad_norm", "accuracy", "steps", "lr")
SIZES_BY_DEVICE = {"batch_size": (1024, 256)}
PREDICT_BATCH = 2048
"""Windows a prediction piece holds at most (on a GPU, fewer where they do not fit:
SupervisedAgent._device_piece)."""
PREDICT_MIN = 64
"""The smallest piece the device may choose: a model whose forward over it does not fit is
refused, with the sizer's error."""
BATCH_MIN = 32
"""The smallest batch the device may choose for a step (a wide model on a smaller GPU gets
less than the CPU's 256, with a warning; one whose step does not fit at it is refused, with
the sizer's error)."""
PREDICT_SHARE = 0.2
"""Fraction of the free GPU memory the prediction piece may take; the training step's batch is
then sized in what is left (foxhunt.train.sizer.MARGIN of the free memory, less the piece's)."""


@dataclass(frozen=True)
class SupervisedConfig:
    """The supervised path's settings; each model's config (foxhunt.train.models) adds its
    network's sizes and `build`."""

    window: int = 128
    """Bars per sample window (L)."""
    horizon: int = 10
    """Bars the label's return runs over (h)."""
    target: Literal["direction", "return"] = "direction"
    """What the network predicts: direction (the three classes, cross-entropy) or return (the
    `quantiles` of the h-bar return, pinball loss), whose class probabilities come from reading
    the quantiles as a normal distribution."""
    quantiles: tuple[float, float, float] = (0.1, 0.5, 0.9)
    """The return target's quantiles, ascending, the middle one the median traded on."""
    batch_size: int | None = None
    """Samples per optimiser step (default: on a GPU the largest power of two from 32 up to
    `max_batch` whose step fits in half the free memory, foxhunt.train.sizer; 256 on a CPU)."""
    max_batch: int = 4096
    """The largest batch the device sizer may choose."""
    accumulate: int = 1
    """Micro-batches of `batch_size` whose gradients add up before one optimiser step: an
    effective batch of batch_size x accumulate where that many samples do not fit at once."""
    steps: int | None = None
    """Optimiser steps per epoch (default: one pass over the fold's train samples)."""
    lr: float = 1e-3
    """AdamW's peak learning rate."""
    weight_decay: float = 0.01
    """AdamW's decoupled weight decay."""
    warmup: float = 0.05
    """Fraction of the fold's steps over which the learning rate rises linearly to `lr`."""
    grad_clip: float = 1.0
    """Global gradient-norm clip."""
    flat: Literal["hold", "flat"] = "hold"
    """What a flat prediction does: keep the position held, or close it."""
    sizing: Literal["full", "confidence"] = "full"
    """Position size: full, or the predicted class's probability mapped onto the env's sizes."""
    precision: Precision = "auto"
    """Matrix work in bfloat16 autocast (auto: on CUDA)."""
    capture: Capture = "auto"
    """CUDA graphs for the training step and for prediction (auto: on CUDA)."""
    compile: bool | None = None
    """torch.compile the loss (default: on with graphs)."""
    compile_mode: Literal["default", "aot"] = "default"
    """"aot" (which turns `compile` on, on a CPU as well): the whole training step (the
    learning rate's schedule, the loss over the micro-batches, its gradient, clipping and
    AdamW) compiled ahead of time by AOTInductor into the compile cache and loaded from there
    by the task that built it and by every later one, which then traces and compiles nothing
    (foxhunt.train.aot). Not for a model with dropout (its draws would come from inside the
    package). Experimental: its numbers equal the default mode's to float rounding."""

    def __post_init__(self) -> None:
        for k in ("window", "horizon"):
            if getattr(self, k) < 1:
                raise ValueError(f"{k} = {getattr(self, k)}: must be at least 1")
        for k in ("batch_size", "steps", "max_batch", "accumulate"):
            if getattr(self, k) is not None and getattr(self, k) < 1:
                raise ValueError(f"{k} = {getattr(self, k)}: must be at least 1")
        for k in ("lr", "grad_clip"):
            if not (getattr(self, k) > 0 and math.isfinite(getattr(self, k))):
                raise ValueError(f"{k} = {getattr(self, k)}: must be > 0")
        if self.weight_decay < 0:
            raise ValueError(f"weight_decay = {self.weight_decay}: must not be negative")
        if not 0.0 <= self.warmup < 1.0:
            raise ValueError(f"warmup = {self.warmup}: must be in [0, 1)")
        q = tuple(self.quantiles)
        if len(q) != 3 or not 0 < q[0] < q[1] < q[2] < 1:
            raise ValueError(f"quantiles = {q}: three ascending values in (0, 1)")

    def resolved(self, device: torch.device):
        return resolve(self, device, SIZES_BY_DEVICE)

    def check_aot(self) -> None:
        """Refuse compile_mode 'aot' for a model whose training step draws random numbers."""
        if self.compile_mode == "aot" and getattr(self, "dropout", 0.0) > 0:
            raise ValueError(
                f"compile_mode = 'aot' with dropout = {self.dropout}: dropout's draws inside a "
                "step compiled ahead of time would not follow the task's seed as eager ones do "
                "(set dropout 0, or use compile_mode 'default')"
            )

    def build(self, features: int = N_MKT) -> nn.Module:
        raise NotImplementedError(f"{type(self).__name__} builds no network")


# ---------------------------------------------------------------------------------- samples
def windows(data: MarketData, t: torch.Tensor, length: int) -> torch.Tensor:
    """[len(t), length, 50]: the normalised columns of bars t - length + 1 .. t (indices below 0,
    at the start of the data, repeat bar 0)."""
    offs = torch.arange(length - 1, -1, -1, device=t.device)
    idx = (t[:, None] - offs).clamp_min(0)
    return data.observe(idx.reshape(-1)).view(len(t), length, -1)


def horizon_returns(data: MarketData, h: int) -> torch.Tensor:
    """r_h[t] = close[t + h] / close[t] - 1 [N] in float32, from the per-bar returns summed in
    float64 (0 where t + h runs past the data)."""
    logc = scan.cumsum(torch.log1p(data.ret1.double()))  # log close[t + 1] / close[0]
    logc = torch.cat([logc.new_zeros(1), logc[:-1]])  # log close[t] / close[0]
    out = torch.zeros(data.n, dtype=torch.float64, device=data.device)
    out[: data.n - h] = torch.expm1(logc[h:] - logc[: data.n - h])
    return out.float()


def sample_bars(lo: int, hi: int, horizon: int) -> tuple[int, int]:
    """The bars of range [lo, hi) that are samples: their label ends inside the range."""
    return lo, max(lo, hi - horizon)


def label(r: torch.Tensor, theta: torch.Tensor) -> torch.Tensor:
    """0 down, 1 flat, 2 up."""
    return torch.where(r > theta, 2, torch.where(r < -theta, 0, 1))


def pinball(pred: torch.Tensor, y: torch.Tensor, quantiles: torch.Tensor) -> torch.Tensor:
    """The quantile (pinball) loss of predictions [n, Q] of y [n] at `quantiles` [Q]: mean over
    the samples and quantiles of max(q e, (q - 1) e), e = y - prediction."""
    e = y[:, None] - pred
    return torch.maximum(quantiles * e, (quantiles - 1.0) * e).mean()


def quantile_class_probs(q: torch.Tensor, theta: torch.Tensor, quantiles) -> torch.Tensor:
    """Class probabilities [n, 3] (down, flat, up) from return quantiles [n, 3] (in the units
    of theta), reading them as a normal distribution: mean the median, standard deviation
    (q_hi - q_lo) / (z(hi) - z(lo)). P(down) = P(r < -theta), P(up) = P(r > theta). A median
    forecast shrinks towards 0 under noise, so comparing it with theta alone would call nearly
    everything flat; the spread says how sure the forecast is."""
    sd = ((q[:, 2] - q[:, 0]).abs() / normal_spread(quantiles[0], quantiles[2])).clamp_min(1e-6)
    down = normal_cdf((-theta - q[:, 1]) / sd)
    up = 1.0 - normal_cdf((theta - q[:, 1]) / sd)
    return torch.stack([down, (1.0 - down - up).clamp_min(0.0), up], -1)


@functools.cache
def normal_spread(lo: float, hi: float) -> float:
    """z(hi) - z(lo), the standard normal's quantiles (in float32, as torch computes them).
    Cached: a step traced to be compiled ahead of time (foxhunt.train.aot) may create no tensor
    of its own, so an agent asks for it once when it is built."""
    z = torch.distributions.Normal(0.0, 1.0)
    return float(z.icdf(torch.tensor(hi)) - z.icdf(torch.tensor(lo)))


def normal_cdf(x: torch.Tensor) -> torch.Tensor:
    """The standard normal's cdf, the arithmetic of torch.distributions.Normal(0, 1).cdf, whose
    check of the sample's support reads tensors into Python (which a traced step cannot)."""
    return 0.5 * (1 + torch.erf(x / math.sqrt(2)))


def classification_metrics(pred: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    """Accuracy, macro F1, each class's precision and recall, the confusion matrix (rows: the
    true class, columns: the predicted one) of integer classes 0..2."""
    cm = torch.bincount(truth * 3 + pred, minlength=9).view(3, 3).double()
    tp = cm.diagonal()
    prec = tp / cm.sum(0).clamp_min(1)
    rec = tp / cm.sum(1).clamp_min(1)
    f1 = torch.where(prec + rec > 0, 2 * prec * rec / (prec + rec).clamp_min(1e-12), 0.0)
    out = {"accuracy": float(tp.sum() / cm.sum().clamp_min(1)), "macro_f1": float(f1.mean())}
    for i, c in enumerate(CLASSES):
        out[f"precision_{c}"] = float(prec[i])
        out[f"recall_{c}"] = float(rec[i])
    out |= {f"confusion_{a}_{b}": float(cm[i, j]) for i, a in enumerate(CLASSES)
            for j, b in enumerate(CLASSES)}  # fmt: skip
    return out


def forecast_size(probs: torch.Tensor, sizing: str) -> torch.Tensor:
    """Size indices [n] for class probabilities [n, 3]: full, or the predicted class's
    probability (1/3 .. 1) mapped linearly onto the env's sizes (0.2 .. 1)."""
    if sizing != "confidence":
        return torch.full_like(probs[:, 0], len(SIZES) - 1, dtype=torch.long)
    conf = probs.max(-1).values
    return ((conf - 1.0 / 3.0) * 1.5 * len(SIZES)).long().clamp(0, len(SIZES) - 1)


def orders(cls: torch.Tensor, size: torch.Tensor, portfolio: torch.Tensor, flat: str):
    """Branch actions [n, 3] for predicted classes: up -> long, down -> short (the classes are
    ordered as the env's directions), flat -> keep the held position's sign ("hold") or close
    it ("flat"); market orders."""
    direction = cls
    if flat == "hold":
        held = torch.sign(portfolio[:, 0]).long() + FLAT
        direction = torch.where(cls == FLAT, held, cls)
    return torch.stack([direction, size, torch.zeros_like(size)], 1)


def order_from_forecast(probs, portfolio, flat: str, sizing: str) -> torch.Tensor:
    """`orders` straight from class probabilities [n, 3] (a served checkpoint)."""
    return orders(probs.argmax(-1), forecast_size(probs, sizing), portfolio, flat)


def warmup_cosine(frac: torch.Tensor, warmup: float) -> torch.Tensor:
    """The learning-rate factor at fraction `frac` of the fold's steps: linear to 1 over
    `warmup`, then cosine to 0. It is 0 at both ends: `step_lr_factor` evaluates it strictly
    between them."""
    rise = (frac / warmup).clamp(max=1.0) if warmup > 0 else torch.ones_like(frac)
    decay = ((frac - warmup) / (1.0 - warmup)).clamp(0.0, 1.0)
    return rise * 0.5 * (1.0 + torch.cos(math.pi * decay))


def step_lr_factor(k: torch.Tensor, total: torch.Tensor, warmup: float) -> torch.Tensor:
    """The factor at step k of `total` (0-based): the curve at (k + 1) / (total + 1), never 0.
    A learning rate of exactly 0 would be harmless in plain Adam, but the capturable Adam the
    CUDA graphs need divides by it and writes NaN wherever a gradient is exactly 0 (seen on an
    H200: TLOB in fp32, whose first warm-up step at lr 0 left NaN weights)."""
    return warmup_cosine((k + 1) / (total + 1), warmup)


# ---------------------------------------------------------------------------------- agent
class SupervisedAgent(FlatGrad, AgentState):
    """The trainer's state for one task: the network, AdamW, labels, samples and the
    predictions the policy reads. Built once per task, reset in place per fold."""

    RNG_KEY = "order_rng"  # `gen` orders the samples (dropout draws from torch's generator)
    TRAINING_ONLY = ("batch_size", "steps", "lr", "weight_decay", "warmup", "grad_clip", "flat",
                     "sizing")  # fmt: skip
    """Config fields that the memory of a forward pass does not depend on (the size keys)."""

    def __init__(self, cfg: SupervisedConfig, env_cfg: EnvConfig, data: MarketData, seed: int):
        dev = data.device
        auto_batch = cfg.batch_size is None and dev.type == "cuda"
        self.cfg = cfg = cfg.resolved(dev)
        self.data, self.device = data, dev
        torch.manual_seed(seed)
        self.net = cfg.build(N_MKT).to(dev)
        self.sizing: Choice | None = None
        self.predict_batch = PREDICT_BATCH  # windows a prediction piece holds (capture_predict)
        # Sizes from the device, rank 0's on every data-parallel rank (one global batch).
        if dev.type == "cuda":  # a piece that fits beside the step (a wide model's may not)
            self.predict_batch = distributed.shared(self._device_piece().size)
        if auto_batch:  # before any buffer of the batch's size exists
            self.sizing = distributed.shared(self._device_batch())
            self.cfg = cfg = dataclasses.replace(cfg, batch_size=self.sizing.size)
        self.params = [p for p in self.net.parameters() if p.requires_grad]
        self.flat = flatten_into_views(self.params)
        self.init_state = {k: v.clone() for k, v in self.net.state_dict().items()}
        self.lr = torch.full((), cfg.lr, device=dev)
        # The training step compiled ahead of time (`_step`), its loss by torch.compile
        # (below), or neither.
        cfg.check_aot()
        self.aot = cfg.compile and cfg.compile_mode == "aot"
        self.step_aot: aot.Step | None = None  # built at the first step
        # AdamW: torch.optim.AdamW is Adam with decoupled weight decay (the same defaults).
        self.opt = flat_optimiser(self.flat, jit=cfg.compile and not self.aot, aot=self.aot,
                                  lr=self.lr, eps=1e-8, weight_decay=cfg.weight_decay,
                                  decoupled_weight_decay=True, foreach=False)  # fmt: skip
        n = data.n
        self.ret_h = horizon_returns(data, cfg.horizon)
        self.labels = torch.ones(n, dtype=torch.long, device=dev)  # set per fold
        self.theta = torch.zeros((), device=dev)
        # The return target: r_h over its standard deviation on the fold's train samples.
        self.ret_scale = torch.ones((), device=dev)
        self.y_ret = torch.zeros(n, device=dev)
        self.quantiles = torch.tensor(cfg.quantiles, device=dev)
        normal_spread(cfg.quantiles[0], cfg.quantiles[2])  # here, not inside a traced step
        self.train_t = torch.zeros(n, dtype=torch.long, device=dev)  # the fold's samples
        self.n_train = torch.zeros((), dtype=torch.long, device=dev)
        self.batch_t = torch.zeros(cfg.batch_size * cfg.accumulate, dtype=torch.long, device=dev)
        self.step_i = torch.zeros((), device=dev)  # optimiser steps taken in this fold
        self.total = torch.ones((), device=dev)  # steps the fold will take
        self.pred = torch.full((n,), 1, dtype=torch.long, device=dev)  # predicted class per bar
        self.size = torch.full((n,), len(SIZES) - 1, dtype=torch.long, device=dev)
        self.stats = torch.zeros(len(STATS), device=dev)
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.step_marks: list | None = None  # the benchmark's (common.mark_step)
        self.rounds = 1
        self.samples = 0  # host copy of n_train
        # The order of the samples: its own generator, seeded alike on every data-parallel
        # rank (foxhunt.train.distributed), so that the ranks split one global batch.
        self.gen = torch.Generator(dev)
        if cfg.compile and not self.aot:
            self._loss = compiled(self._loss)
        ensure_adam_state(self.opt, self.flat)

    def _autocast(self):
        return autocast(self.cfg.precision, self.device)

    def _memory_key(self) -> dict:
        """The config as the sizer's cache key: the fields a pass's memory depends on."""
        cfg = dataclasses.asdict(self.cfg)
        return {k: v for k, v in cfg.items() if k not in self.TRAINING_ONLY}

    def _predict_probe(self, n: int) -> None:
        """An evaluation forward over `n` random windows (generator of its own)."""
        gen = torch.Generator(self.device).manual_seed(0)
        t = torch.randint(0, self.data.n, (n,), device=self.device, generator=gen)
        with self._evaluating():
            self._forward(t)

    def _device_piece(self) -> Choice:
        """The prediction piece from the device (foxhunt.train.sizer): the largest power of two
        up to PREDICT_BATCH whose evaluation forward fits in PREDICT_SHARE of the free memory.
        At the GPU defaults every model's 2,048 windows fit an H200's share (TFT's, the largest,
        ~20 GiB at window 128); a wide model's may not (TFT at hidden 512: ~160 GB), and a
        smaller GPU's share is smaller. Evaluation then runs in more, smaller pieces."""
        return device_size(self.device, f"{type(self.cfg).__name__} prediction piece",
                           self._memory_key(),
                           self._predict_probe, PREDICT_MIN, PREDICT_BATCH,
                           share=PREDICT_SHARE)  # fmt: skip

    def _device_batch(self) -> Choice:
        """The batch from the device (foxhunt.train.sizer): a probe is a forward and backward
        pass on random windows, drawn from a generator of its own (the task's random stream
        stays as it was). The budget leaves room for the prediction graph, whose pool holds an
        evaluation forward over `predict_batch` windows for the task's life (TFT's takes ~20 GiB
        at the GPU defaults, window 128: beside a step sized to the full budget, batch 4096 and
        ~68 GiB, it ran out of the H200's memory)."""
        cfg, gen = self.cfg, torch.Generator(self.device).manual_seed(0)

        def probe(n: int) -> None:
            t = torch.randint(0, self.data.n, (n,), device=self.device, generator=gen)
            with self._autocast():
                logits = self.net(windows(self.data, t, cfg.window))
            F.cross_entropy(logits.float(), t % 3).backward()
            for p in self.net.parameters():
                p.grad = None

        what = self._memory_key()
        what["predict_batch"] = self.predict_batch  # sizes chosen without its room are not reused
        lo = min(BATCH_MIN, cfg.max_batch)
        got = device_size(self.device, type(cfg).__name__, what, probe, lo, cfg.max_batch,
                          beside=lambda: self._predict_probe(self.predict_batch))  # fmt: skip
        if got.size < SIZES_BY_DEVICE["batch_size"][1] <= cfg.max_batch:
            log.warning("%s: batch %d, the largest whose step fits in %.1f GiB of this GPU; "
                        "for a larger effective batch set `accumulate` (micro-batches a step)",
                        type(cfg).__name__, got.size, got.budget_bytes / 2**30)  # fmt: skip
        return got

    # ------------------------------------------------------------------ fold
    def reset_fold(self, train_lo: int, train_hi: int, seed: int) -> None:
        """Fresh weights and optimiser; the normaliser, the label threshold and the samples of
        this fold's train range (fitted there only)."""
        torch.manual_seed(seed)
        self.gen.manual_seed(distributed.shared_seed(seed))
        restart(self.net, self.init_state, [self.stats, self.step_i], self.opt)
        self.data.fit_normaliser(train_lo, train_hi)
        a, b = sample_bars(train_lo, train_hi, self.cfg.horizon)
        if b - a < len(self.batch_t):
            raise ValueError(
                f"train range [{train_lo}, {train_hi}) holds {b - a} samples at horizon "
                f"{self.cfg.horizon}, fewer than one batch of {len(self.batch_t)}"
            )
        r = self.ret_h[a:b]
        self.theta.copy_(torch.quantile(r.abs().double(), 1.0 / 3.0).float())
        self.labels.copy_(label(self.ret_h, self.theta))
        self.ret_scale.copy_(r.double().std().clamp_min(1e-12).float())
        self.y_ret.copy_(self.ret_h / self.ret_scale)
        self.train_t[: b - a].copy_(torch.arange(a, b, device=self.device))
        self.n_train.fill_(b - a)
        self.samples = b - a

    def steps_per_epoch(self) -> int:
        return self.cfg.steps or max(
            1, self.samples // (len(self.batch_t) * distributed.world()[1])
        )

    def begin_epoch(self, epoch: int, epochs: int) -> None:
        self.total.fill_(epochs * self.steps_per_epoch())

    # ------------------------------------------------------------------ train
    collects = False  # the samples are the fxcache's bars: no collection phase

    def collect(self) -> None:
        """Nothing to collect: the samples are the fxcache's bars."""

    def _loss(self, t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        with self._autocast():
            out = self.net(windows(self.data, t, self.cfg.window)).float()
        y = self.labels.index_select(0, t)
        if self.cfg.target == "return":
            loss = pinball(out, self.y_ret.index_select(0, t), self.quantiles)
        else:
            loss = F.cross_entropy(out, y)
        acc = (self._classes(out)[0] == y).float().mean()
        return loss, acc.detach()

    def _classes(self, out: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Predicted classes and class probabilities of network outputs: a softmax of the
        logits (direction), or read from the forecast quantiles (return)."""
        if self.cfg.target == "return":
            p = quantile_class_probs(out, self.theta / self.ret_scale, self.cfg.quantiles)
        else:
            p = torch.softmax(out, -1)
        return p.argmax(-1), p

    def _step(self) -> None:
        """An optimiser step on the samples in `batch_t` (`_train_step`), compiled ahead of
        time with `compile_mode="aot"` (the package is built or loaded at the first step)."""
        if not self.aot:
            self._train_step()
            return
        if self.step_aot is None:
            name = f"{type(self.cfg).__name__.removesuffix('Config').lower()}-step"
            body = functools.partial(self._traced_step, self._train_step)
            self.step_aot = aot.Step(self, name, body, (), repr(self.cfg), self.snapshot,
                                     self.restore)  # fmt: skip
        self.step_aot()

    def _train_step(self) -> None:
        cfg = self.cfg
        self.lr.copy_(cfg.lr * step_lr_factor(self.step_i, self.total, cfg.warmup))
        self._zero_grad()
        loss = acc = 0.0
        for micro in self.batch_t.view(cfg.accumulate, cfg.batch_size):
            part, part_acc = self._loss(micro)
            self._backward(part / cfg.accumulate)  # gradients add up over the micro-batches
            loss, acc = loss + part.detach() / cfg.accumulate, acc + part_acc / cfg.accumulate
        self._gather_grad()
        gn = clip_and_step(self.flat, self.opt, cfg.grad_clip)
        with torch.no_grad():
            self.step_i += 1
            self.stats += torch.stack([loss.detach(), gn, acc, torch.ones_like(gn), self.lr])

    def learn(self) -> None:
        """One epoch: `steps_per_epoch` minibatches, a fresh permutation of the fold's samples
        for every pass over them (drawn on the device)."""
        B = len(self.batch_t)  # this rank's part of a step: batch_size x accumulate
        rank, ranks = distributed.world()
        G = B * ranks  # the global batch, split between the data-parallel ranks
        per_pass = max(1, self.samples // G)
        g = self.graphs.get("step")
        perm = None
        for k in range(self.steps_per_epoch()):
            j = k % per_pass
            if j == 0:
                u = torch.rand(self.samples, device=self.device, generator=self.gen)
                perm = u.argsort()
            mine = perm[j * G + rank * B : j * G + (rank + 1) * B]
            self.batch_t.copy_(self.train_t.index_select(0, mine))
            if g is not None:
                g.replay()
            else:
                self._step()
            mark_step(self.step_marks, self.device)

    def read_stats(self) -> dict[str, float]:
        v = self.stats.tolist()
        self.stats.zero_()
        k = max(v[3], 1.0)
        return {
            "losses/loss": v[0] / k,
            "losses/grad_norm": v[1] / k,
            "charts/train_accuracy": v[2] / k,
            "charts/lr": v[4] / k,
            "charts/label_threshold_bps": float(self.theta) * 1e4,
        }

    # ------------------------------------------------------------------ evaluate
    @contextlib.contextmanager
    def _evaluating(self):
        """The network in eval mode (no dropout) and no autograd, then back to training."""
        self.net.eval()
        try:
            with torch.inference_mode():
                yield
        finally:
            self.net.train()

    def prepare_eval(self, lo: int, hi: int) -> None:
        """Predict every bar of [lo, hi) at once: the class and the size the policy reads."""
        with self._evaluating():
            self._predict(lo, hi)

    def _predict(self, lo: int, hi: int) -> None:
        for a in range(lo, hi, self.predict_batch):
            t = torch.arange(a, min(a + self.predict_batch, hi), device=self.device)
            cls, p = self._classes(self.forward_bars(t))
            self.pred[t] = cls
            self.size[t] = forecast_size(p, self.cfg.sizing)

    def forward_bars(self, t: torch.Tensor) -> torch.Tensor:
        """The network's outputs (float32) for the windows ending at bars `t` (at most
        `predict_batch` of them), in evaluation mode (`_evaluating`). With the prediction graph
        (`capture_predict`), a replay over the static piece: the result is a view of its output,
        valid until the next call. On a GPU a short piece is padded either way, so that eager
        and captured predictions run the same kernels and agree bit for bit."""
        n, g = len(t), self.graphs.get("predict")
        if g is not None:
            self.predict_t[:n] = t
            self.predict_t[n:] = t[-1]  # padding: its rows are computed and dropped
            g.replay()
            return self.predict_out[:n]
        if self.device.type == "cuda" and n < self.predict_batch:  # the graph's shapes, eager
            t = torch.cat([t, t[-1:].expand(self.predict_batch - n)])
        return self._forward(t)[:n]

    def _forward(self, t: torch.Tensor) -> torch.Tensor:
        """The network over the windows ending at bars `t`, float32 (bf16 autocast aside)."""
        with self._autocast():
            return self.net(windows(self.data, t, self.cfg.window)).float()

    def extra_metrics(self, lo: int, hi: int) -> dict[str, float]:
        """Classification metrics of the range's samples (after `prepare_eval`)."""
        a, b = sample_bars(lo, hi, self.cfg.horizon)
        return classification_metrics(self.pred[a:b], self.labels[a:b])

    def explain(self, lo: int, hi: int) -> dict | None:
        """Which columns the model reads on [lo, hi), where its network can say (TFT's
        variable selection): each column's selection weight, averaged over the range's windows
        and their bars, largest first. None for the other networks."""
        if not getattr(self.net, "explains", False):
            return None
        total = torch.zeros(N_MKT, dtype=torch.float64, device=self.device)
        with self._evaluating():
            for a in range(lo, hi, self.predict_batch):
                t = torch.arange(a, min(a + self.predict_batch, hi), device=self.device)
                seen: dict = {}
                with self._autocast():
                    self.net(windows(self.data, t, self.cfg.window), explain=seen)
                total += seen["variables"].double().mean(1).sum(0)
        w = (total / max(hi - lo, 1)).tolist()
        names = self.data.names or [f"column_{i}" for i in range(N_MKT)]
        ranked = sorted(zip(names, w, strict=True), key=lambda kv: -kv[1])
        what = "mean variable-selection weight over the range's windows and bars"
        return {"variable_importance": dict(ranked), "bars": hi - lo, "what": what}

    def greedy(self, t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        """Branch actions from the predictions (`orders`); graph-safe table reads."""
        return orders(self.pred.index_select(0, t), self.size.index_select(0, t), portfolio,
                      self.cfg.flat)  # fmt: skip

    greedy.portfolio_read = PORTFOLIO[:1]  # type: ignore[attr-defined]  # orders: the position

    def weights(self) -> dict[str, torch.Tensor]:
        """The network's tensors; for the return target also the fold's label threshold and
        return scale, which turn its forecasts into classes."""
        w = module_weights(self.net)
        if self.cfg.target == "return":
            w["target.theta"], w["target.scale"] = self.theta, self.ret_scale
        return w

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        copy_weights(self.weights(), weights)

    # ------------------------------------------------------------------ capture
    def capture(self) -> None:
        """The training step as a CUDA graph (state and RNG restored after the warm-up)."""

        def warmup():
            self.batch_t.copy_(torch.arange(len(self.batch_t), device=self.device))
            for _ in range(3):
                self._step()

        self.graphs.update(capture_restoring(self, warmup, {"step": self._step}))
        self.capture_predict()

    def capture_predict(self) -> None:
        """The forward over one piece of `predict_batch` windows (PREDICT_BATCH for evaluation
        over ranges; 1 for the latest bar alone, bench/bench_ensemble.py --piece 1) as a CUDA
        graph, on a static tensor of bar indices. It reads the weights and the normalised data
        in place, so the graph serves every epoch and fold; evaluation changes no state, so
        nothing is restored."""
        t = self.predict_t = torch.zeros(self.predict_batch, dtype=torch.long, device=self.device)

        def forward():
            self.predict_out = self._forward(t)

        with self._evaluating():
            self.graphs.update(capture_graphs(self.device, forward, {"predict": forward}))

    # ------------------------------------------------------------------ state
    def _state_tensors(self) -> dict[str, torch.Tensor]:
        st = module_weights(self.net)
        st |= {f"opt.{k}": v for k, v in self.opt.state.get(self.flat, {}).items()
               if torch.is_tensor(v)}  # fmt: skip
        st["norm.mean"], st["norm.inv_std"] = self.data.mean, self.data.inv_std
        for k in ("labels", "theta", "ret_scale", "y_ret", "train_t", "n_train", "step_i",
                  "total", "lr", "stats"):  # fmt: skip
            st[k] = getattr(self, k)
        return st

    def restore(self, saved: dict[str, torch.Tensor]) -> None:
        super().restore(saved)
        self.samples = int(self.n_train)


# ---------------------------------------------------------------------------------- serving
def acting_net(cfg: SupervisedConfig, tensors: dict[str, torch.Tensor]):
    """A checkpoint's network on the CPU: windows [n, window, 50] -> class probabilities [n, 3]
    (down, flat, up; read from the quantiles for the return target). A served
    supervised model predicts; turning a prediction into an order depends on the position held
    (`SupervisedAgent.greedy`)."""
    net = cfg.build(N_MKT)
    net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
    net.eval()

    def predict(x: torch.Tensor) -> torch.Tensor:
        with torch.inference_mode():
            out = net(x).float()
            if cfg.target == "return":
                theta = tensors["target.theta"] / tensors["target.scale"]
                return quantile_class_probs(out, theta, cfg.quantiles)
            return torch.softmax(out, -1)

    return predict
