"""Rainbow DQN over the env's 30 joint actions, on GPU-resident data and a vectorised env.

The parts (Hessel et al. 2018, "Rainbow"), each switchable where it makes sense:

- A dueling head over the joint actions (direction 3 x size 5 x order type 2 = 30): the return
  distribution of action a is V + A_a - mean A. The branches interact in this env (the order type
  decides whether the direction is executed at all, the size scales its reward), so one Q per
  branch, each averaged over the behaviour's other branches, has no consistent greedy action;
  a joint Q has.
- Distributional returns: C51 (Bellemare et al. 2017) on `atoms` atoms over [v_min, v_max], or
  IQN (Dabney et al. 2018) with sampled quantile fractions and the quantile Huber loss.
- Noisy nets (Fortunato et al. 2018): factorised Gaussian noise in the head layers, fresh noise at
  every collection and learning step, switched off for greedy evaluation.
- n-step returns, double Q (the online net picks a*, the target net values it), a soft target
  update (Polyak, `tau`), and CQL (Kumar et al. 2020) as an optional conservative penalty.
  Episode ends are time limits: returns bootstrap through them from the state the last step
  reached (Pardo et al. 2018), never from the restarted env.
- The C51 support is derived per fold from the train range (`v_min`/`v_max` None): the 99.9th
  percentile of the discounted return of holding a full position at this gamma, with a margin;
  the share of target mass that still falls outside it is logged (`charts/support_clipped`).
- Prioritised replay (Schaul et al. 2016), proportional: P(i) = p_i / sum_j p_j with
  p_i = (loss_i + 1e-6)^alpha, stratified sampling through a cumulative sum, importance weights
  w_i = (N P(i))^-beta normalised by the batch's largest (as in Schaul et al.'s Algorithm 1), so
  one near-perfectly predicted transition elsewhere in the buffer cannot shrink every update.
  The ring buffer stores bar indices, position states and the behaviour's actions, not full
  states: the market rows are gathered from the device copy.

Built for capture: every shape is static, the replay buffer, the RNG and every counter live on
the device, and nothing reads a value back to the host inside an epoch. Losses and statistics
accumulate in a device tensor that is read once per epoch. On a GPU the collection block (all
`collect_steps` steps) and the learning step are each captured once as a CUDA graph and replayed;
moving to another fold only rewrites tensors in place, so the graphs survive it.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import ClassVar, Literal

import torch
import torch.nn.functional as F
from torch import nn

from foxhunt.train import aot, distributed, scan
from foxhunt.train.agents import c51_triton
from foxhunt.train.agents.common import (
    COMBO_NO_REORDER,
    IN_DIM,
    STATE_DIM,
    AgentState,
    Capture,
    FlatGrad,
    Observation,
    Precision,
    autocast,
    beside,
    capture_restoring,
    clip_and_step,
    compiled,
    copy_weights,
    ensure_adam_state,
    flat_optimiser,
    flatten_into_views,
    joined,
    linear_relu,
    mark_step,
    module_weights,
    resolve,
    run_state,
)
from foxhunt.train.agents.common import need as check
from foxhunt.train.data import MarketData
from foxhunt.train.env import (
    JOINT,
    EnvConfig,
    TradingEnv,
    joint_table,
)

__all__ = [
    "IN_DIM", "STATE_DIM", "DQNConfig", "QNet", "RainbowAgent", "acting_net", "served_q_values",
]  # fmt: skip

N_ACTIONS = len(JOINT)
# (GPU, CPU) defaults of the sizes left at None: the standard workload on a GPU.
SIZES_BY_DEVICE = {
    "envs": (16384, 128),
    "collect_steps": (100, 64),
    "learn_steps": (488, 96),
    "batch_size": (8192, 256),
    "replay_capacity": (1_000_000, 65_536),
}
# ... and the exploration and inputs left at None (see DQNConfig.noisy).
DEFAULTS_BY_DEVICE = SIZES_BY_DEVICE | {"noisy": (True, False), "dense_inputs": (True, False)}
SUPPORT_QUANTILE = 0.999  # derived support: this quantile of |discounted full-position return|
SUPPORT_MARGIN = 1.5  # ... times this
COMBO_KERNELS = True
"""A GPU agent's compiled steps launch a graph's independent small kernels as one (inductor's
combo kernels, common.compiled); bench_train's `-nocombo` turns it off."""
NEXT_ON_STREAMS = True
"""Whether a C51 agent's learning step under torch.compile on a GPU runs as compiled pieces,
the next states' two forward passes (target and online networks) each on a CUDA stream of its
own while the online network's forward on the states runs on the step's own (`_streamed_loss`;
the loss waits for both). At the standard workload's sizes each network's kernels leave most of
the GPU idle, so the three overlap: the standard epoch took 0.230 s against 0.242 s with the
loss as one compiled graph, and 0.265 s against 0.272 s at the GPU defaults (noisy nets, dense
inputs; H100, 2026-12-07, one call, `bench_train.py --epochs 5 --variants
graph-bf16-compile,graph-bf16-compile-onegraph`). The same pieces in turn on one stream took
0.243 s (a probe, the same day). The pieces launch the same kernels on either stream, so a run
gives the same numbers on streams or on one, captured or not (tests/test_train_gpu.py, bit for
bit). A step compiled ahead of time (`compile_mode="aot"`) stays one package, which runs on one
stream: its online forward, inside the package with its backward, cannot start before the next
states' outputs it takes as inputs. bench_train's `-onegraph` turns it off, `-streams` on."""
ADV_IN_TARGET = False
"""Whether a C51 agent's learning step on a GPU (bf16, C51's Triton target) hands C51's target
the next states' advantage hidden layers and the advantage layers' weights rather than the
layers' outputs (`QNet(..., parts="hidden")`, c51_triton's `_choice_kernel`): each action's
logits are formed in registers and never written, where today each network's advantage layer
writes [8192, 30, 51] bf16 (25 MB) a step of which the target reads one action's. The chain
alone (bench/bench_c51_fused_adv.py, H100, 2026-12-07) took 83.4 us against 130.4 us. The
kernels were checked on a CPU in Triton's interpreter (bf16 values in float32, the
interpreter's bf16 products being wrong); off until their GPU tests have run
(tests/test_train_gpu.py) and bench_train's `-advtarget` has timed an epoch with it. The
stacked agents keep the outputs (the op has no vmap rule)."""
AOT_COMBO_KERNELS = True
"""The same for the steps compiled ahead of time (a GPU's AOTInductor build with
`combo_kernels`): an epoch of 0.268 s against 0.293 s without them (learning 249 against
270 ms; H100, 2026-12-05, `bench_train --variants graph-bf16-aot,graph-bf16-aot-nocombo`, one
call). bench_train's `-nocombo` turns both off."""
AOT_COMBO_SETTINGS = ("combo_kernel_per_subkernel_blocks",)
"""Inductor's combo-kernel settings turned on for those packages, where the torch has them: a
block size for each subkernel of a combo kernel rather than one for all. The package's learning
step is one graph (torch.compile's is three), so its combo kernels group more kernels of unlike
sizes: the standard epoch took 0.241-0.242 s with it against 0.253 s without (413 against
434-437 us of kernels a learning step; torch.compile's 0.241 s), the GPU defaults 0.272 s
against 0.287 s (H100, torch 2.11, 2026-12-06, two calls, the setting then a bench_train
switch beside the default of the day; torch.compile's graphs gained nothing from it, 0.242
against 0.241 s). bench_train's `-nosubblocks` leaves it out."""


def aot_options(device: torch.device) -> dict | None:
    """Inductor's options for the DQN's packages on `device`: combo kernels and
    `AOT_COMBO_SETTINGS` on a GPU (the options key the packages), none on a CPU."""
    if device.type != "cuda" or not AOT_COMBO_KERNELS:
        return None
    import torch._inductor.config

    known = torch._inductor.config._config
    return {**COMBO_NO_REORDER, **{k: True for k in AOT_COMBO_SETTINGS if k in known}}


@dataclass(frozen=True)
class DQNConfig:
    """Rainbow DQN hyperparameters. Sizes left at None are chosen for the device: the standard
    GPU workload (../shared/bench/README.md) on CUDA, a CPU-sized run otherwise."""

    hidden: tuple[int, ...] = (512, 256)
    """Widths of the shared trunk's layers."""
    head_hidden: int = 128
    """Width of the hidden layer of the value stream and of each advantage branch."""
    dense_inputs: bool | None = None
    """D2RL (Sinha et al., 2020): the state is also an input of every trunk layer after the
    first and of the heads' hidden layer (concatenated to the previous layer's output), a
    direct path from the inputs to the Q-values beside the deep one. Default: on a GPU, with
    noisy nets (see `noisy`); off on a CPU."""
    distribution: Literal["c51", "iqn", "mean"] = "c51"
    """Return distribution: C51 (categorical, fixed atoms), IQN (implicit quantiles), or none:
    `mean` learns the expected return alone (one output an action, squared TD error, as DQN
    before distributional RL)."""
    atoms: int = 51
    """C51: number of atoms of the support."""
    v_min: float | None = None
    """C51: lowest atom (in scaled reward units); None: derived from each fold's train range
    (the return of holding a full position at this gamma; see the module docstring)."""
    v_max: float | None = None
    """C51: highest atom; None with v_min."""
    iqn_quantiles: int = 16
    """IQN: quantile fractions sampled per state, for the online and the target net alike."""
    iqn_embedding: int = 64
    """IQN: cosine features of a quantile fraction."""
    noisy: bool | None = None
    """Factorised Gaussian noisy layers in the heads (Rainbow's exploration; epsilon then
    defaults to 0). Default: on a GPU, with `dense_inputs`; epsilon-greedy on a CPU. On the
    demo market at the GPU sizes, costs on, noisy nets with dense inputs earned a test Sharpe of
    22.64 +- 0.37 over six seeds against 18.76 +- 0.58 for epsilon-greedy without (1.15 and
    0.95 of the cost-aware ridge); with costs off both earn ridge's figure. They cost 6% more
    an epoch of the standard workload (0.252 s against 0.238 s on an H200, 2026-12-05). At the
    CPU sizes epsilon-greedy 0.1 earns as much, for two thirds of the time
    (docs/learning-notes.md)."""
    noisy_sigma0: float = 0.5
    """Initial noise scale sigma_0 of the noisy layers (sigma = sigma_0 / sqrt(fan_in))."""
    noise_per_env: bool = False
    """Collection draws the noisy layers' noise per env, so that each env explores with its own
    perturbed network, instead of one sample shared by every env of a step (C51; IQN, whose
    rows are quantile samples, shares one). Learning uses one sample per step either way. Off
    by default: on the demo market it lowered the test Sharpe (docs/learning-notes.md)."""
    double_q: bool = True
    """Double Q: the online net chooses the next action, the target net values it."""
    cql_alpha: float = 0.0
    """Weight of the CQL penalty logsumexp_a Q(s,a) - Q(s,a_taken) (0: off)."""
    gamma: float = 0.5
    """Discount per bar (0: a contextual bandit, each bar's reward alone). 0.5: the demo
    market's order flow predicts the next bar's return, and at 0.9 or 0.99 the returns of bars
    far ahead drown it (docs/learning-notes.md)."""
    n_step: int = 1
    """Steps of the n-step return (3 earned less with costs on, docs/learning-notes.md)."""
    reward_scale: float = 1e4
    """Rewards (returns as fractions of notional) are learned in basis points by default."""
    epsilon: float | None = None
    """Probability of a uniformly random joint action while collecting (default: 0 with noisy
    nets, else 0.1); with `epsilon_start`, the value the schedule ends at."""
    epsilon_start: float | None = None
    """Epsilon at the start of a fold, annealed linearly to `epsilon` over the first
    `epsilon_decay` of the fold's epochs (None: `epsilon` throughout)."""
    epsilon_decay: float = 0.25
    """Fraction of the fold's epochs over which epsilon anneals (with `epsilon_start`)."""
    envs: int | None = None
    """Parallel environments (default: 16384 on a GPU, 128 on a CPU)."""
    collect_steps: int | None = None
    """Collection steps per epoch (default: 100 on a GPU, 64 on a CPU)."""
    learn_steps: int | None = None
    """Learning steps per epoch (default: 488 on a GPU, 96 on a CPU)."""
    batch_size: int | None = None
    """Transitions per learning step (default: 8192 on a GPU, 256 on a CPU)."""
    replay_capacity: int | None = None
    """Transitions the replay ring holds (default: 1,000,000 on a GPU, 65,536 on a CPU)."""
    per_alpha: float = 0.6
    """Priority exponent alpha (0: uniform sampling)."""
    per_beta: float = 0.4
    """Importance-weight exponent beta at the first epoch; annealed linearly to 1 at the last."""
    lr: float = 1e-4
    """Adam learning rate."""
    adam_eps: float = 1.5e-4
    """Adam epsilon (Rainbow's value)."""
    weight_decay: float = 0.0
    """Decoupled weight decay (AdamW's; Loshchilov & Hutter, 2019): each step shrinks every
    weight by lr * weight_decay before Adam's update. 0: plain Adam, bit for bit."""
    grad_clip: float = 10.0
    """Global gradient-norm clip."""
    tau: float = 0.005
    """Soft target update rate per learning step."""
    act_with: Literal["online", "target"] = "target"
    """The network the greedy policy (evaluation, checkpoints) acts with: the target network, a
    Polyak average of the online weights over ~1/tau steps (the default: on the demo market it
    earned more with less spread between seeds, costs on and off, docs/learning-notes.md), or the
    online network itself."""
    precision: Precision = "auto"
    """Matrix work in bfloat16 autocast (auto: on CUDA). Softmax, returns, rewards, the C51
    projection and the losses stay float32."""
    float32_outputs: bool = False
    """The value and advantage output layers in float32 outside the bf16 autocast: with costs
    on, holding and trading can differ by a fraction of a basis point, less than bf16 logits
    resolve (docs/learning-notes.md, "GPU sizes, without the memory"). No effect in float32
    (on a CPU)."""
    capture: Capture = "auto"
    """CUDA graphs for the collection block and the learning step (auto: on CUDA)."""
    compile: bool | None = None
    """torch.compile the collection step, the loss and the optimiser update (kernel fusion)
    before capture (default: on with CUDA graphs). Costs about half a minute at the start of a
    task on a cold compile cache."""
    compile_mode: Literal["default", "max-autotune-no-cudagraphs", "aot", "auto"] = "default"
    """How the steps are compiled when `compile` is on: torch.compile's "default" mode or
    "max-autotune-no-cudagraphs" (tunes the matmuls: minutes at the start); "aot" (which turns
    `compile` on, on a CPU as well): the collection step, the learning step after its replay
    sample (loss, gradient, update) and the evaluation's step compiled ahead of time by
    AOTInductor into the compile cache and loaded from there, by the task that built them and
    by every later one of the same config, data and machine, which then traces and compiles
    nothing (foxhunt.train.aot); its numbers equal torch.compile's to float rounding. "auto":
    "aot" on a GPU for C51 where a step compiled ahead of time can run (a C++ compiler, a
    torch whose loader runs packages, one process; `aot.unusable` says why not), else
    "default"; the params logged name the choice. Ahead of time pays off for a config run
    again and again (retries, reruns, seeds): on an H200 (docs/performance.md) a warm task's
    first epoch began 4.3 s after its start against torch.compile's 9.2 s, but the first task
    of a config, data or machine took 2.5 times as long (3 folds x 50 epochs of the standard
    workload: 216 s against 88 s cold, 45.6 s against 49.9 s warm; its epoch is now within 1%
    of torch.compile's, `AOT_COMBO_SETTINGS`)."""
    triton_target: bool | None = None
    """C51's next-state target distribution gathered, softmaxed and projected in one Triton
    kernel, `c51_triton` (default: on a CUDA device where Triton is installed): 8% off the
    standard epoch. The same numbers as the torch form to float rounding."""

    device_sized: ClassVar[tuple[str, ...]] = ("envs", "batch_size", "replay_capacity")
    """Sizes that, left at None on a GPU, foxhunt.train.sizer.agent_sizes fits to free memory."""

    def resolved(self, device: torch.device) -> DQNConfig:
        cfg = resolve(self, device, DEFAULTS_BY_DEVICE)
        if cfg.epsilon is None:
            cfg = dataclasses.replace(cfg, epsilon=0.0 if cfg.noisy else 0.1)
        if cfg.compile_mode == "auto":
            cfg = dataclasses.replace(cfg, compile_mode=auto_compile_mode(cfg, device))
        fused = device.type == "cuda" and self.distribution == "c51" and c51_triton.available()
        if self.compile_mode == "aot" and self.distribution == "iqn":
            raise ValueError(
                "compile_mode = 'aot': IQN draws its quantile fractions inside the learning "
                "step, which a step compiled ahead of time cannot; use 'default' for IQN"
            )
        if self.triton_target and not fused:
            raise ValueError(
                "triton_target = True: the fused C51 target needs distribution 'c51', Triton "
                f"and a CUDA device (training runs on {device.type}; leave it unset)"
            )
        return dataclasses.replace(cfg, triton_target=fused if self.triton_target is None
                                   else self.triton_target)  # fmt: skip

    def __post_init__(self) -> None:
        self.check()

    def check(self) -> None:
        """Refuse values that cannot work, naming the parameter and its range."""

        need = functools.partial(check, self)
        need(len(self.hidden) > 0 and min(self.hidden) >= 1, "hidden", "widths must be >= 1")
        need(self.atoms >= 2, "atoms", "must be at least 2")
        for k in ("head_hidden", "iqn_quantiles", "iqn_embedding", "n_step"):
            need(getattr(self, k) >= 1, k, "must be at least 1")
        for k in ("envs", "collect_steps", "batch_size", "replay_capacity"):
            need(getattr(self, k) is None or getattr(self, k) >= 1, k, "must be at least 1")
        need(self.learn_steps is None or self.learn_steps >= 0, "learn_steps", "must be >= 0")
        need((self.v_min is None) == (self.v_max is None), "v_max", "set both or neither")
        if self.v_min is not None:
            need(math.isfinite(self.v_min), "v_min", "must be finite")
            need(
                math.isfinite(self.v_max) and self.v_max > self.v_min, "v_max", "must exceed v_min"
            )
        need(0.0 <= self.gamma <= 1.0, "gamma", "must be in [0, 1]")
        need(self.epsilon is None or 0.0 <= self.epsilon <= 1.0, "epsilon", "must be in [0, 1]")
        need(self.epsilon_start is None or 0.0 <= self.epsilon_start <= 1.0, "epsilon_start",
             "must be in [0, 1]")  # fmt: skip
        need(0.0 < self.epsilon_decay <= 1.0, "epsilon_decay", "must be in (0, 1]")
        need(0.0 <= self.per_beta <= 1.0, "per_beta", "must be in [0, 1]")
        need(0.0 < self.tau <= 1.0, "tau", "must be in (0, 1]")
        for k in ("noisy_sigma0", "cql_alpha", "per_alpha"):
            need(getattr(self, k) >= 0.0, k, "must not be negative")
        for k in ("reward_scale", "lr", "adam_eps", "grad_clip"):
            need(getattr(self, k) > 0.0 and math.isfinite(getattr(self, k)), k, "must be > 0")
        wd = self.weight_decay
        need(wd >= 0 and math.isfinite(wd), "weight_decay", "must be >= 0 and finite")
        if self.collect_steps is not None and self.collect_steps < self.n_step:
            raise ValueError(
                f"collect_steps = {self.collect_steps} < n_step = {self.n_step}: "
                "the first epoch would store no complete transition"
            )
        if None not in (self.envs, self.replay_capacity) and self.replay_capacity < self.envs:
            raise ValueError(
                f"replay_capacity = {self.replay_capacity} < envs = {self.envs}: one "
                "collection step must fit in the replay ring"
            )


def auto_compile_mode(cfg: DQNConfig, device: torch.device) -> str:
    """compile_mode "auto"'s choice for `cfg` (its compile setting resolved) on `device`: the
    steps compiled ahead of time on a GPU where they can run, else torch.compile's default (in
    a data-parallel process as well: a package holds no all-reduce of the ranks' gradients)."""
    lone = device.type == "cuda" and distributed.world()[1] == 1
    if not (cfg.compile and cfg.distribution == "c51" and lone) or aot.unusable(device):
        return "default"
    return "aot"


# ---------------------------------------------------------------------------------- network
def centred(w: torch.Tensor, b: torch.Tensor, n_actions: int) -> tuple[torch.Tensor, torch.Tensor]:
    """An advantage layer's weights [A out, in] and bias [A out] less their mean over the A
    actions: the layer's outputs less their dueling mean, as one product (`QNet._out`)."""
    wa, ba = w.view(n_actions, -1, w.shape[1]), b.view(n_actions, -1)
    wc, bc = wa - wa.mean(0, keepdim=True), ba - ba.mean(0, keepdim=True)
    return wc.view_as(w), bc.view_as(b)


@torch.no_grad()
def factorise_(e: torch.Tensor) -> None:
    """f(e) = sign(e) sqrt|e| in place (factorised Gaussian noise), four kernels."""
    torch.mul(e.abs().sqrt_(), e.sign(), out=e)


def factorised_noise_(eps: list[torch.Tensor], generator: torch.Generator | None) -> None:
    """Draw each tensor of `eps` from N(0, 1), in turn, and map it through f in place (five
    multi-tensor kernels over all of them): the per-row buffers' draw (the shared sample is one
    flat buffer, QNet.noise_buffer)."""
    if not eps:  # a network without noisy layers
        return
    for e in eps:
        e.normal_(generator=generator)
    mag = torch._foreach_abs(eps)
    torch._foreach_sqrt_(mag)
    torch._foreach_mul_(mag, torch._foreach_sign(eps))
    torch._foreach_copy_(eps, mag)


def next_noise_row_(dest: torch.Tensor, bank: torch.Tensor, i: torch.Tensor, steps: int,
                    dim: int = 0) -> None:  # fmt: skip
    """A learning step's noise: row `i` (a device-side counter) of a block's samples `bank`
    along `dim` copied into `dest`, and `i` moved on to the next row, wrapping at `steps`
    (graph-safe: a captured step replays over the rows)."""
    dest.copy_(bank.index_select(dim, i).squeeze(dim))
    i.add_(1).remainder_(steps)


class NoisyLinear(nn.Module):
    """y = (mu_W + sigma_W * (f(e_out) f(e_in)^T)) x + mu_b + sigma_b * f(e_out),
    f(e) = sign(e) sqrt|e| (factorised Gaussian noise, Fortunato et al. 2018). The noise matrix is
    never formed: the noisy part is ((x * f(e_in)) sigma_W^T) * f(e_out)."""

    def __init__(self, n_in: int, n_out: int, sigma0: float):
        super().__init__()
        bound = 1.0 / math.sqrt(n_in)
        self.weight_mu = nn.Parameter(torch.empty(n_out, n_in).uniform_(-bound, bound))
        self.weight_sigma = nn.Parameter(torch.full((n_out, n_in), sigma0 * bound))
        self.bias_mu = nn.Parameter(torch.empty(n_out).uniform_(-bound, bound))
        self.bias_sigma = nn.Parameter(torch.full((n_out,), sigma0 * bound))
        self.register_buffer("eps_in", torch.zeros(n_in))
        self.register_buffer("eps_out", torch.zeros(n_out))
        # Per-row noise (one sample per env while collecting): allocated at the first call of
        # reset_row_noise, kept out of the state dict (it is redrawn before every use). Buffers
        # all the same, so that stacked agents (dqn_stacked) pass their own to functional_call.
        self.register_buffer("row_in", None, persistent=False)
        self.register_buffer("row_out", None, persistent=False)

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        factorised_noise_([self.eps_in, self.eps_out], generator)

    def row_noise(self, rows: int) -> list[torch.Tensor]:
        """The per-row noise buffers for `rows` inputs (forward with noise="rows"), allocated
        at the first call: the same buffers every call, so a captured graph can redraw them."""
        if self.row_in is None or self.row_in.shape[0] != rows:
            dev = self.eps_in.device
            self.row_in = torch.zeros(rows, self.eps_in.numel(), device=dev)
            self.row_out = torch.zeros(rows, self.eps_out.numel(), device=dev)
        return [self.row_in, self.row_out]

    def reset_row_noise(self, rows: int, generator: torch.Generator | None = None) -> None:
        """Draw an independent noise sample for each of `rows` inputs."""
        factorised_noise_(self.row_noise(rows), generator)

    @property
    def out_features(self) -> int:
        return self.weight_mu.shape[0]

    def weights(self, noise: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """The weight and bias of the shared sample (noise=True) or the mean weights (False):
        mu_W + sigma_W * f(e_out) f(e_in)^T, formed at the weights' size. For a batch larger
        than the layer (a learning step's 8,192 rows against its 128 inputs) one matmul with
        them costs less than the two of `forward` and their passes over the outputs."""
        if not noise:
            return self.weight_mu, self.bias_mu
        return (self.weight_mu + self.weight_sigma * torch.outer(self.eps_out, self.eps_in),
                self.bias_mu + self.bias_sigma * self.eps_out)  # fmt: skip

    def forward(self, x: torch.Tensor, noise: bool | str = True, pad: int = 0) -> torch.Tensor:
        """noise: False (the mean weights), True (the shared sample) or "rows" (row i of x
        with its own sample, from reset_row_noise). `pad` extra output rows of zeros inside the
        matmuls (see QNet._out)."""
        rows = noise == "rows"
        eps_in, eps_out = (self.row_in, self.row_out) if rows else (self.eps_in, self.eps_out)
        w_mu, b_mu, w_sigma, b_sigma = (
            self.weight_mu, self.bias_mu, self.weight_sigma, self.bias_sigma
        )  # fmt: skip
        if pad:
            w_mu, w_sigma = (F.pad(w, (0, 0, 0, pad)) for w in (w_mu, w_sigma))
            b_mu, b_sigma, eps_out = (F.pad(b, (0, pad)) for b in (b_mu, b_sigma, eps_out))
        y = F.linear(x, w_mu, b_mu)
        if noise:
            y = y + F.linear(x * eps_in, w_sigma) * eps_out
            y = y + b_sigma * eps_out
        return y[:, : self.out_features] if pad else y


class QNet(nn.Module):
    """Trunk -> value stream + advantage stream over the joint actions (dueling).

    C51: returns logits [B, A, atoms] for the A = 30 joint actions.
    IQN: takes quantile fractions taus [B, K] and returns quantiles [B, K, A].

    align > 1 pads the output layers' widths inside their matmuls; fold_mean takes the dueling
    mean out of the advantage layer's weights (see _out); noisy_weights forms a noisy layer's
    weights for the shared sample and runs one matmul with them (NoisyLinear.weights);
    fused_relu runs each ReLU layer as one product with the ReLU in its epilogue
    (common.linear_relu). All four are for a GPU: they compute the same function, rounded
    otherwise, so that on a CPU the network stays as it was."""

    def __init__(
        self, cfg: DQNConfig, n_actions: int = N_ACTIONS, align: int = 1, fold_mean: bool = False,
        noisy_weights: bool = False, fused_relu: bool = False,
    ):  # fmt: skip
        super().__init__()
        self.cfg, self.n_act, self.align, self.fold_mean = cfg, n_actions, align, fold_mean
        self.noisy_weights, self.fused_relu = noisy_weights, fused_relu
        self.adv_in_target = False  # forward's parts="hidden" honoured (ADV_IN_TARGET)
        self._noise: torch.Tensor | None = None  # noise_buffer's: the layers' buffers are views
        self.iqn = cfg.distribution == "iqn"
        self.out = cfg.atoms if cfg.distribution == "c51" else 1
        dims = (IN_DIM, *cfg.hidden)
        extra = IN_DIM if cfg.dense_inputs else 0  # D2RL: the state beside each layer's input
        self.trunk = nn.ModuleList(
            nn.Linear(a + (extra if i else 0), b)
            for i, (a, b) in enumerate(itertools.pairwise(dims))
        )
        h, hh = dims[-1], cfg.head_hidden
        if self.iqn:
            self.embed = nn.Linear(cfg.iqn_embedding, h + extra)
            self.register_buffer("cos_i", torch.arange(cfg.iqn_embedding) * math.pi)

        def lin(a, b):
            return NoisyLinear(a, b, cfg.noisy_sigma0) if cfg.noisy else nn.Linear(a, b)

        self.head = lin(h + extra, 2 * hh)  # the value's hidden layer and the advantage's, as one
        self.value = lin(hh, self.out)
        self.adv = lin(hh, n_actions * self.out)

    def noisy_layers(self) -> list[NoisyLinear]:
        return [m for m in self.modules() if isinstance(m, NoisyLinear)]

    def noise_buffer(self) -> torch.Tensor | None:
        """The flat buffer that every noisy layer's shared sample (eps_in, eps_out, layer by
        layer) is a view of, None without noisy layers. Made at the first call, and again
        where the layers' buffers were moved or replaced since (`.to`, a copy), their values
        kept: a draw of the network's sample is then one kernel and f one pass, and an agent
        copies a step's samples of both its networks in one (RainbowAgent._noise_banks)."""
        layers = self.noisy_layers()
        flat = self._noise
        if not layers or (flat is not None and layers[0].eps_in.data_ptr() == flat.data_ptr()
                          and layers[0].eps_in.device == flat.device):  # fmt: skip
            return flat
        self.view_noise(torch.cat([e.reshape(-1) for m in layers for e in (m.eps_in, m.eps_out)]))
        return self._noise

    def view_noise(self, flat: torch.Tensor) -> None:
        """Make the noisy layers' shared-sample buffers views of `flat`, in order (its values
        are theirs from then on)."""
        off = 0
        for m in self.noisy_layers():
            for name in ("eps_in", "eps_out"):
                n = getattr(m, name).numel()
                setattr(m, name, flat[off : off + n])
                off += n
        self._noise = flat  # not a buffer: the layers' views are

    def reset_noise(self, generator: torch.Generator | None = None) -> None:
        """Every noisy layer's shared sample: one draw into the flat buffer, then f (an agent
        draws a block of steps' samples at once instead: RainbowAgent._noise_banks)."""
        flat = self.noise_buffer()
        if flat is not None:
            flat.normal_(generator=generator)
            factorise_(flat)

    def reset_row_noise(self, rows: int, generator: torch.Generator | None = None) -> None:
        factorised_noise_([e for m in self.noisy_layers() for e in m.row_noise(rows)], generator)

    def _formed(self, layer: nn.Module, noise: bool | str) -> bool:
        """Whether `layer` runs as one matmul with its weight and bias (`_weights`): a plain
        layer, or a noisy one with noisy_weights outside per-row noise."""
        return not isinstance(layer, NoisyLinear) or (self.noisy_weights and noise != "rows")

    def _weights(self, layer: nn.Module, noise: bool | str) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(layer, NoisyLinear):
            return layer.weights(bool(noise))
        return layer.weight, layer.bias

    def _call(self, layer: nn.Module, x: torch.Tensor, noise: bool | str) -> torch.Tensor:
        if not isinstance(layer, NoisyLinear):
            return layer(x)
        if not self._formed(layer, noise):
            return layer(x, noise)
        return F.linear(x, *self._weights(layer, noise))

    def _out(
        self,
        layer: nn.Module,
        x: torch.Tensor,
        noise: bool | str,
        center: bool = False,
        sliced: bool = True,
    ) -> torch.Tensor:
        """A head's output layer. With align > 1 its width (51, 1530 for C51) is padded to a
        multiple of align inside the matmul: on unaligned widths cuBLAS falls back to slow
        kernels, in the backward pass as well. In float32 with `float32_outputs`.

        center (the advantage layer, run as one matmul: `_formed`): the layer's outputs less
        their mean over the actions, a - mean_a(a), computed as one matmul with the mean taken
        out of the weights and bias first (the mean is linear in them). The same function as
        the dueling mean taken after the layer, without the passes over the [B, actions, out]
        outputs it costs in the forward and the backward. A noisy layer with per-row noise
        takes the mean after (its weights differ between rows). sliced=False: the padded
        output is returned whole."""
        if self.cfg.float32_outputs and torch.is_autocast_enabled(x.device.type):
            with torch.autocast(x.device.type, enabled=False):
                return self._out(layer, x.float(), noise, center, sliced)
        pad = -layer.out_features % self.align
        if not self._formed(layer, noise):
            return layer(x, noise, pad)
        w, b = self._weights(layer, noise)
        if not (pad or center):
            return F.linear(x, w, b) if isinstance(layer, NoisyLinear) else layer(x)
        if center:
            w, b = centred(w, b, self.n_act)
        if not pad:
            return F.linear(x, w, b)
        y = F.linear(x, F.pad(w, (0, 0, 0, pad)), F.pad(b, (0, pad)))
        return y[:, : layer.out_features] if sliced else y

    def forward(
        self,
        x: torch.Tensor,
        taus: torch.Tensor | None = None,
        noise: bool | str = True,
        act: torch.Tensor | None = None,
        parts: bool | Literal["hidden"] = False,
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """Logits [R, A, out] (C51; values for `mean`; quantiles [B, K, A] for IQN), or with
        `act` [R, 1] (joint actions; C51 and `mean`) only the taken action's, [R, 1, out]: the
        same numbers as gathering them from the full output, without forming it where the
        dueling mean is folded (the loss's backward then writes one action's gradient, not 30).
        With `parts` (C51 and `mean`), the dueling streams whose sum the logits are: the value
        [R, 1, out] and the advantage less its mean over the actions [R, A, out], which is
        where the mean is folded a view of the advantage layer's (padded) output
        (c51_triton.next_target reads them so). With `parts="hidden"` where `adv_in_target`
        (and the mean folded, C51): the value [R, 1, out], the advantage's hidden layer [R, hh]
        and the advantage layer's weights and bias with the mean out, from which
        c51_triton.next_target forms the advantage itself; the streams otherwise."""
        s = x
        for i, layer in enumerate(self.trunk):
            x = torch.cat((x, s), 1) if i and self.cfg.dense_inputs else x
            x = linear_relu(x, layer.weight, layer.bias) if self.fused_relu else F.relu(layer(x))
        if self.cfg.dense_inputs:
            x = torch.cat((x, s), 1)
        if self.iqn:
            assert taus is not None
            B, K = taus.shape
            phi = F.relu(self.embed(torch.cos(taus.unsqueeze(-1) * self.cos_i)))  # [B, K, h]
            x = (x.unsqueeze(1) * phi).reshape(B * K, -1)
        if self.fused_relu and self._formed(self.head, noise):
            h = linear_relu(x, *self._weights(self.head, noise))
        else:
            h = F.relu(self._call(self.head, x, noise))
        hv, ha = h.chunk(2, dim=1)
        v = self._out(self.value, hv, noise).unsqueeze(1)  # [R, 1, out]
        folded = self.fold_mean and self._formed(self.adv, noise)
        if parts == "hidden" and self.adv_in_target and folded and not self.iqn:
            # In the hidden layer's dtype, as autocast casts them for the product: the cast
            # fused with the centring, where the forward runs (a side stream: _streamed_loss).
            wc, bc = centred(*self._weights(self.adv, noise), self.n_act)
            return v, ha, wc.to(ha.dtype), bc.to(ha.dtype)
        if act is not None and folded and not self.iqn:
            # The taken action's outputs, read from the (padded) advantage output in place.
            cols = act * self.out + torch.arange(self.out, device=act.device)  # [R, out]
            a = self._out(self.adv, ha, noise, center=True, sliced=False).gather(1, cols)
            return v + a.unsqueeze(1)
        parts = parts and not self.iqn
        if folded:  # see _out
            a = self._out(self.adv, ha, noise, center=True).view(-1, self.n_act, self.out)
            if parts:
                return v, a
            q = v + a
        else:
            a = self._out(self.adv, ha, noise).view(-1, self.n_act, self.out)
            if parts:
                return v, a - a.mean(1, keepdim=True)
            q = v + a - a.mean(1, keepdim=True)  # [R, A, out]
        if self.iqn:
            return q.view(B, K, self.n_act)
        if act is not None:
            return q.gather(1, act[:, :, None].expand(-1, -1, self.out))
        return q


# ---------------------------------------------------------------------------------- pieces
def expected_q(out: torch.Tensor, z: torch.Tensor, distribution: str) -> torch.Tensor:
    """Expected return of every action, [B, A], from C51 logits [B, A, atoms] on support z,
    IQN quantiles [B, K, A] or the means themselves [B, A, 1]."""
    if distribution == "iqn":
        return out.float().mean(1)
    if distribution == "mean":
        return out.float().squeeze(-1)
    return torch.matmul(F.softmax(out.float(), -1), z)


def project_c51(p_next: torch.Tensor, R: torch.Tensor, disc: torch.Tensor, z: torch.Tensor):
    """Project the distribution p_next [B, K, atoms] on support z, shifted to R + disc * z
    (R, disc [B, 1]), back onto z. Dense form: target atom j puts weight
    max(0, 1 - |b_j - i|) on atom i, where b_j is its fractional position; the same numbers as
    Bellemare et al.'s Algorithm 1 (tested against it), with no atomics, so it is deterministic.
    Returns the projection and the target mass that fell outside [z_0, z_-1] (clipped) [B, K]."""
    n = z.numel()
    v_min, v_max = z[0], z[-1]
    dz = (v_max - v_min) / (n - 1)
    tz = R + disc * z  # [B, atoms]
    outside = ((tz < v_min) | (tz > v_max)).to(p_next.dtype)
    b = (tz.clamp(v_min, v_max) - v_min) / dz
    i = torch.arange(n, device=z.device, dtype=b.dtype)
    hat = (1.0 - (b.unsqueeze(-1) - i).abs()).clamp_min(0.0)  # [B, j, i]
    return torch.bmm(p_next, hat), (p_next * outside.unsqueeze(1)).sum(-1)


def c51_next_target(on2: torch.Tensor, tg2: torch.Tensor, R: torch.Tensor, disc: torch.Tensor,
                    z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """C51's target distribution for sampled transitions: the next action chosen by the
    expected values of on2 (the online net's logits [B, A, atoms] for double Q, else the
    target's), the target net's distribution tg2 of that action, projected onto z shifted to
    R + disc * z (R [B], disc [B, 1]). Returns the target [B, 1, atoms] and the mass clipped at
    the support's ends [B, 1]. On a GPU `c51_triton.next_target` projects in one kernel."""
    a2 = expected_q(on2, z, "c51").argmax(-1, keepdim=True)  # [B, 1]
    A = on2.shape[-1]
    p2 = F.softmax(tg2.float().gather(1, a2[:, :, None].expand(-1, -1, A)), -1)
    return project_c51(p2, R[:, None], disc, z)


def quantile_huber(theta: torch.Tensor, target: torch.Tensor, taus: torch.Tensor, kappa=1.0):
    """IQN loss per sample: theta [B, K, nb] at fractions taus [B, K], target [B, K', nb].
    Sum over K of the mean over K' of |tau - 1{u < 0}| * Huber_kappa(u) / kappa, mean over nb."""
    u = target.unsqueeze(1) - theta.unsqueeze(2)  # [B, K, K', nb]
    huber = torch.where(u.abs() <= kappa, 0.5 * u * u, kappa * (u.abs() - 0.5 * kappa))
    w = (taus[:, :, None, None] - (u.detach() < 0).to(u.dtype)).abs()
    return (w * huber / kappa).mean(2).sum(1).mean(-1)


def derived_support(ret1: torch.Tensor, gamma: float, horizon_cap: int = 4096) -> float:
    """Half-width of a C51 support that holds the returns of this range: the SUPPORT_QUANTILE
    of |sum_k gamma^k r[t+k]| (a full position held, the discount's horizon truncated where
    gamma^k < 1e-4), times SUPPORT_MARGIN. `ret1` is the range's scaled per-bar returns."""
    n = ret1.numel()
    if gamma <= 0.0:
        horizon = 1
    elif gamma >= 1.0:
        horizon = horizon_cap
    else:
        horizon = min(horizon_cap, max(1, math.ceil(math.log(1e-4) / math.log(gamma))))
    horizon = min(horizon, n)
    kernel = gamma ** torch.arange(horizon, device=ret1.device, dtype=torch.float32)
    g = F.conv1d(ret1.float().view(1, 1, -1), kernel.view(1, 1, -1)).view(-1)  # valid windows
    k = max(1, min(g.numel(), math.ceil(SUPPORT_QUANTILE * g.numel())))
    return float(g.abs().kthvalue(k).values) * SUPPORT_MARGIN


def importance_weights(p: torch.Tensor, p_min: torch.Tensor, beta: torch.Tensor) -> torch.Tensor:
    """PER's importance weights of sampled priorities p, (p / p_min)^-beta; 1 where p_min is 0
    (only an empty replay yields one: its every slot is 0), not 0/0's NaN."""
    return torch.where(p_min > 0, (p / p_min).pow(-beta), torch.ones_like(p))


class Replay:
    """Proportional prioritised replay in a ring on the device.

    fbuf [C, 3] float32: the position state of s (position, entry price, bars held).
    ibuf [C, 2 + 3 n] int64: bar t of s, the steps m <= n the return runs for (fewer when the
    episode ended inside the window), and the behaviour's branch actions of the n steps.
    prio [C] float64: p_i^alpha, a float32 value held exactly; 0 for empty slots and incomplete
    transitions (never sampled). Held in float64 so that the sample's float64 cumulative sum
    reads it as it is, where from float32 it first converted the whole buffer (a kernel of its
    own over the 1M slots each learning step); the sums, slots and weights are the same.
    """

    cumsum = staticmethod(scan.cumsum)
    """The priorities' running sum, the same every run on a GPU (foxhunt.train.scan): CUB's
    scan, torch's on a 1-D CUDA tensor, may draw another slot from one run to the next where a
    point lies within a rounding of a slot's edge."""

    def __init__(self, capacity: int, device: torch.device, n_step: int = 1):
        self.capacity = capacity
        self.fbuf = torch.zeros(capacity, 3, device=device)
        self.ibuf = torch.zeros(capacity, 2 + 3 * n_step, dtype=torch.long, device=device)
        self.prio = torch.zeros(capacity, device=device, dtype=torch.float64)
        self.ptr = torch.zeros((), dtype=torch.long, device=device)
        self.max_prio = torch.ones((), device=device)
        self.beta = torch.full((), 0.4, device=device)

    def clear(self) -> None:
        self.prio.zero_()
        self.ptr.zero_()
        self.max_prio.fill_(1.0)

    def add(self, f: torch.Tensor, i: torch.Tensor, valid: torch.Tensor) -> None:
        n = f.shape[0]
        idx = (self.ptr + torch.arange(n, device=f.device)) % self.capacity
        # index_put_ rather than index_copy_: the same writes, and vmap batches it
        # (foxhunt.train.agents.dqn_stacked) where index_copy_ falls back to a loop.
        self.fbuf.index_put_((idx,), f)
        self.ibuf.index_put_((idx,), i)
        self.prio.index_put_((idx,), torch.where(valid, self.max_prio, 0.0).to(self.prio.dtype))
        self.ptr.copy_((self.ptr + n) % self.capacity)

    def sample(self, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Stratified proportional sample of len(u) slots (u uniform in [0, 1)) and their
        importance weights (N P(i))^-beta normalised by the largest in the batch:
        (p_i / min_batch p)^-beta, so the largest weight is 1. A slot of priority 0 is never
        drawn while any has more; from an empty replay (what a capture's warm-up steps draw
        from) the last slot is, with weight 1 rather than 0/0."""
        B = u.shape[0]
        cdf = self.cumsum(self.prio, torch.float64)
        x = (torch.arange(B, device=u.device, dtype=torch.float64) + u.double()) / B * cdf[-1]
        idx = torch.searchsorted(cdf, x, right=True).clamp(max=self.capacity - 1)
        p = self.prio.index_select(0, idx).float()
        return idx, importance_weights(p, p.min(), self.beta)

    def update(self, idx: torch.Tensor, loss: torch.Tensor, alpha: float) -> None:
        p = (loss.detach().float() + 1e-6).pow(alpha)
        self.prio.index_put_((idx,), p.to(self.prio.dtype))
        # The batch's largest in two stages, rows of 128 first. Taken in one, inductor fused
        # the write-back into that reduction's single program (17.5 us a step on an H200 at
        # batch 8,192); split, it is not among the step's 40 largest kernels. The same maximum.
        rows = p.view(-1, 128).amax(1) if p.numel() % 128 == 0 else p
        self.max_prio.copy_(torch.maximum(self.max_prio, rows.max()))


# ---------------------------------------------------------------------------------- agent
# Slots of the per-epoch statistics accumulator (read once per epoch).
STATS = (
    "loss", "grad_norm", "q_taken", "cql", "collect_reward", "collect_trades", "episodes",
    "support_clipped", "collect_short", "collect_flat", "collect_long",
)  # fmt: skip


class RainbowAgent(FlatGrad, AgentState):
    """The trainer's state for one task: networks, optimiser, replay, env and captured graphs.
    Built once per task; `reset_fold` rewrites it in place for the next fold."""

    def __init__(self, cfg: DQNConfig, env_cfg: EnvConfig, data: MarketData, seed: int):
        dev = data.device
        self.cfg = cfg = cfg.resolved(dev)
        self.data, self.device = data, dev
        torch.manual_seed(seed)  # the weights' initialisation
        # Every draw of training (the envs' starts, exploration, noise, replay samples) comes
        # from the agent's own generator, seeded per fold: agents trained side by side in one
        # process draw what each would alone.
        self.gen = torch.Generator(dev).manual_seed(seed)
        # On a GPU the heads' output widths are padded inside their matmuls, the dueling mean
        # is taken out of the advantage layer's weights, noisy layers form their weights and
        # the ReLUs run in their products' epilogues (see QNet).
        gpu = dev.type == "cuda"
        self.net = QNet(cfg, align=8 if gpu else 1, fold_mean=gpu, noisy_weights=gpu,
                        fused_relu=gpu).to(dev)  # fmt: skip
        self.params = list(self.net.parameters())
        # All weights live in one flat buffer and the modules' parameters are views of it, so
        # that clipping, Adam and the target update are each one kernel over one tensor (on a
        # GPU, multi-tensor kernels over a few small tensors occupy only a few SMs).
        self.flat = flatten_into_views(self.params)
        self.target = copy.deepcopy(self.net).requires_grad_(False)
        # C51's target from the next states' advantage hidden layers (ADV_IN_TARGET).
        self.net.adv_in_target = self.target.adv_in_target = (
            ADV_IN_TARGET and bool(cfg.triton_target) and cfg.precision == "bf16"
            and not cfg.float32_outputs
        )  # fmt: skip
        self.target_flat = flatten_into_views(list(self.target.parameters()))
        self._noise_banks(cfg, dev)
        self.init_state = {k: v.clone() for k, v in self.net.state_dict().items()}
        # Steps compiled ahead of time (`_aot_steps`) or by torch.compile (below), or neither.
        self.aot = cfg.compile and cfg.compile_mode == "aot"
        self.learn_aot: aot.Step | None = None  # built at the first step
        jit = cfg.compile and not self.aot
        # Adam's foreach form is what inductor fuses when compiled; uncompiled on a GPU the
        # one-op-at-a-time form runs full-grid kernels over the flat buffer and is faster.
        adam = dict(
            lr=cfg.lr,
            eps=cfg.adam_eps,
            weight_decay=cfg.weight_decay,
            decoupled_weight_decay=True,
            foreach=cfg.compile or dev.type != "cuda",
        )
        self.opt = flat_optimiser(self.flat, jit=jit, aot=self.aot, **adam)
        # On a GPU inductor launches a compiled graph's independent small kernels as one (its
        # combo kernels): the standard epoch 0.229 s against 0.252 s, 0.253 s against 0.285 s
        # at the GPU defaults (H200, 2026-12-05, bench_train's -nocombo).
        combo = dev.type == "cuda" and COMBO_KERNELS
        self.update_fn = compiled(self._step_update, combo=combo) if jit else self._step_update
        # C51's next-state target: one Triton kernel on a GPU, the torch form elsewhere.
        self.next_target = c51_triton.next_target if cfg.triton_target else c51_next_target
        if cfg.triton_target and jit:
            c51_triton.register()  # before torch.compile traces a call of it
        self.replay = Replay(cfg.replay_capacity, dev, cfg.n_step)
        self.env = TradingEnv(env_cfg, cfg.envs, data.close, data.high, data.low, data.ret1)
        # The support: fixed by the config, or rewritten in place per fold (reset_fold).
        lo, hi = (cfg.v_min, cfg.v_max) if cfg.v_min is not None else (-1.0, 1.0)
        self.z = torch.linspace(lo, hi, cfg.atoms, device=dev)
        E, n = cfg.envs, cfg.n_step
        # n-step history (oldest first): bar and branch actions | position state | done | valid.
        self.h_i = torch.zeros(n, E, 4, dtype=torch.long, device=dev)
        self.h_s = torch.zeros(n, E, 3, device=dev)
        self.h_d = torch.zeros(n, E, dtype=torch.bool, device=dev)
        self.h_v = torch.zeros(n, E, dtype=torch.bool, device=dev)
        self.u_collect = torch.zeros(cfg.collect_steps, E, 5, device=dev)
        self.stats = torch.zeros(len(STATS), device=dev)
        # The collection's statistics summed per env, into `stats` once an epoch (read_stats):
        # a collection step then has no reduction, whose one-block kernel at a few hundred envs
        # cost more than the rest of the step (reward, |trade|, episode ends, short/flat/long).
        self.collect_sums = torch.zeros(6, E, device=dev)
        self.eps = torch.full((), cfg.epsilon, device=dev)  # set per epoch (begin_epoch)
        # state(t, portfolio) -> [B, IN_DIM]
        self.state = Observation(data, env_cfg.memory_decay, env_cfg.forecast)
        self.joint = joint_table(dev)  # [30, 3] branch indices of the joint actions
        # Branch indices -> joint index: direction * 10 + size * 2 + order type.
        self.joint_stride = torch.tensor([10, 2, 1], device=dev)
        self.graphs: dict[str, torch.cuda.CUDAGraph] = {}
        self.rounds = 1  # an epoch is one collection block and one block of learning steps
        self.step_marks: list | None = None  # the benchmark's (common.mark_step)
        self._reset_lists = None
        # The collection step compiled as well: its env step, n-step window and replay write
        # are elementwise work over all envs that inductor fuses (the stack compiles the plain
        # `_collect_act` under its vmap).
        self.collect_fn = compiled(self._collect_act, combo=combo) if jit else self._collect_act
        if jit and dev.type == "cuda" and NEXT_ON_STREAMS and cfg.distribution == "c51":
            self._pieces = self._loss_pieces(
                functools.partial(compiled, mode=cfg.compile_mode, combo=combo)
            )
            self.side_streams = (torch.cuda.Stream(dev), torch.cuda.Stream(dev))
            self._loss = self._streamed_loss
        elif jit:
            self._loss = compiled(self._loss, mode=cfg.compile_mode, combo=combo)
        self.ensure_optimizer_state()

    def _noise_banks(self, cfg: DQNConfig, dev: torch.device) -> None:
        """Noisy nets: the shared noise samples of a block of steps are drawn at its start, one
        draw a block from the agent's generator with f applied once (`collect_noise`, one
        sample a collection step; `learn_noise`, the online and the target network's samples
        of each learning step), and each step copies its row into `noise_now`, the buffer the
        layers' noise is a view of (online, then target): two kernels a learning step and two
        to advance its row (`learn_i`), against a draw and f for each network, and for stacked
        agents the same few kernels for all of them (dqn_stacked). Per-env noise is drawn
        each collection step (`reset_row_noise`)."""
        self.noise_now = self.collect_noise = self.learn_noise = self.learn_i = None
        if not cfg.noisy:
            return
        n_net = self.net.noise_buffer().numel()
        self.noise_now = torch.zeros(n_net + self.target.noise_buffer().numel(), device=dev)
        self.net.view_noise(self.noise_now[:n_net])
        self.target.view_noise(self.noise_now[n_net:])
        if not (cfg.noise_per_env and cfg.distribution == "c51"):
            self.collect_noise = torch.zeros(cfg.collect_steps, n_net, device=dev)
        self.learn_noise = torch.zeros(cfg.learn_steps, len(self.noise_now), device=dev)
        self.learn_i = torch.zeros(1, dtype=torch.long, device=dev)

    # ------------------------------------------------------------------ helpers
    def _autocast(self):
        return autocast(self.cfg.precision, self.device)

    def q_values(self, out: torch.Tensor) -> torch.Tensor:
        """Expected return of every action, [B, A], from logits (C51) or quantiles (IQN)."""
        return expected_q(out, self.z, self.cfg.distribution)

    def _taus(self, n: int) -> torch.Tensor | None:
        if self.cfg.distribution != "iqn":
            return None
        return torch.rand(n, self.cfg.iqn_quantiles, device=self.device, generator=self.gen)

    def act_joint(self, state: torch.Tensor, noise: bool | str, net=None) -> torch.Tensor:
        """Greedy joint actions [B] (noise: sample the noisy layers' current noise)."""
        with torch.no_grad(), self._autocast():
            out = (net or self.net)(state, self._taus(len(state)), noise=noise)
        return self.q_values(out).argmax(-1)

    def act(self, state: torch.Tensor, noise: bool, net=None) -> torch.Tensor:
        """Greedy branch actions [B, 3] (direction, size, order type)."""
        return self.joint.index_select(0, self.act_joint(state, noise, net))

    def _acting(self):
        return self.target if self.cfg.act_with == "target" else self.net

    def greedy(self, t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        """The evaluation policy: greedy on the mean weights (no noise) of the acting network
        (`act_with`)."""
        return self.act(self.state(t, portfolio), noise=False, net=self._acting())

    def weights(self) -> dict[str, torch.Tensor]:
        """The acting network and the support its atoms sit on (C51's z, derived per fold)."""
        return {**module_weights(self._acting()), "support.z": self.z}

    def load_weights(self, weights: dict[str, torch.Tensor]) -> None:
        copy_weights(self.weights(), weights)

    def begin_epoch(self, epoch: int, epochs: int) -> None:
        """PER's importance exponent beta, annealed linearly from per_beta to 1 at the last
        epoch (Schaul et al. 2016), and epsilon's schedule (`epsilon_start`)."""
        cfg = self.cfg
        frac = epoch / max(epochs - 1, 1)
        self.replay.beta.fill_(cfg.per_beta + (1.0 - cfg.per_beta) * frac)
        eps = cfg.epsilon
        if cfg.epsilon_start is not None:
            left = max(0.0, 1.0 - epoch / max(epochs, 1) / cfg.epsilon_decay)
            eps += (cfg.epsilon_start - cfg.epsilon) * left
        self.eps.fill_(eps)

    # ------------------------------------------------------------------ fold
    def reset_fold(self, train_lo: int, train_hi: int, seed: int) -> None:
        """Fresh weights, optimiser, replay and envs for a fold, all in place: a few batched
        (foreach) kernels, so that a fold transition costs about a millisecond on a GPU (and a
        derived support one pass over the train range)."""
        self.gen.manual_seed(seed)
        if self._reset_lists is None:
            self.ensure_optimizer_state()
            nets = [*self.net.state_dict().values(), *self.target.state_dict().values()]
            init = [*self.init_state.values(), *self.init_state.values()]
            zero = [v for st in self.opt.state.values() for v in st.values() if torch.is_tensor(v)]
            zero += [self.replay.prio, self.replay.ptr, self.h_i, self.h_s, self.h_d, self.h_v]
            zero += [self.stats, self.collect_sums]
            self._reset_lists = (nets, init, zero)
        nets, init, zero = self._reset_lists
        with torch.no_grad():
            torch._foreach_copy_(nets, init)
            torch._foreach_zero_(zero)
            self.replay.max_prio.fill_(1.0)
        self.data.fit_normaliser(train_lo, train_hi)
        if self.cfg.v_min is None:
            r = self.data.ret1[train_lo : train_hi - 1] * self.cfg.reward_scale
            half = derived_support(r, self.cfg.gamma)
            self.z.copy_(torch.linspace(-half, half, self.cfg.atoms, device=self.device))
        self.env.set_range(train_lo, train_hi)
        self.env.reset(torch.rand(self.cfg.envs, device=self.device, generator=self.gen))

    # ------------------------------------------------------------------ collect
    def _collect_noise(self, k: int) -> bool | str:
        """The noise of collection step k for the noisy layers (outside the compiled step):
        per-env samples drawn now from the agent's generator, or the block's shared sample k
        (`_noise_banks`); the forward's noise mode."""
        if self.cfg.noisy and self.collect_noise is None:
            self.net.reset_row_noise(self.cfg.envs, self.gen)
            return "rows"
        if self.cfg.noisy:
            self.net.noise_buffer().copy_(self.collect_noise[k])
        return True

    def _collect_act(self, u: torch.Tensor, noise: bool | str) -> None:
        cfg, env = self.cfg, self.env
        t = env.t.clone()
        pstate = torch.stack([env.pos, env.entry, env.hold], 1)
        a = self.act_joint(self.state(t, env.portfolio()), noise=noise)
        if cfg.epsilon > 0 or cfg.epsilon_start:
            rnd = (u[:, 1] * len(JOINT)).long().clamp(max=len(JOINT) - 1)
            a = torch.where(u[:, 0] < self.eps, rnd, a)
        ab = self.joint.index_select(0, a)
        _, reward, filled, done = env.step(ab[:, 0], ab[:, 1], ab[:, 2], u[:, 4])
        # Shift the n-step history and append this step.
        self.h_i.copy_(torch.cat([self.h_i[1:], torch.cat([t[:, None], ab], 1)[None]]))
        self.h_s.copy_(torch.cat([self.h_s[1:], pstate[None]]))
        self.h_d.copy_(torch.cat([self.h_d[1:], done[None]]))
        self.h_v.copy_(torch.cat([self.h_v[1:], torch.ones_like(done)[None]]))
        # The oldest step's return runs until the first episode end in the window (included).
        alive = torch.cumprod((~self.h_d[:-1]).long(), 0)  # [n - 1, E]
        m = 1 + alive.sum(0)
        acts = self.h_i[:, :, 1:].permute(1, 0, 2).reshape(cfg.envs, -1)  # [E, 3 n]
        i = torch.cat([self.h_i[0, :, :1], m[:, None], acts], 1)
        self.replay.add(self.h_s[0], i, self.h_v[0])
        side = ab[:, 0] == self.joint[::10, 0, None]  # [3, E]: the direction taken
        self.collect_sums += torch.cat([torch.stack([reward, filled.abs(), done.float()]), side])

    def _collect_block(self) -> None:
        if self.aot and self.learn_aot is None:
            self._aot_steps()
        for k in range(self.cfg.collect_steps):
            self.collect_fn(self.u_collect[k], self._collect_noise(k))

    def _draw_collect(self, factorise: bool = True) -> None:
        """A collection block's draws: each step's uniforms, then the noisy layers' shared
        samples (without `factorise` left as drawn: stacked agents apply f to all at once)."""
        self.u_collect.uniform_(generator=self.gen)
        if self.collect_noise is not None:
            self.collect_noise.normal_(generator=self.gen)
            if factorise:
                factorise_(self.collect_noise)

    def collect(self) -> None:
        self._draw_collect()
        if "collect" in self.graphs:
            self.graphs["collect"].replay()
        else:
            self._collect_block()

    # ------------------------------------------------------------------ learn
    def _replay_return(self, t, m, acts, pstate):
        """The n-step return of sampled transitions, replayed from the data.

        t, m [B]: first bar and steps; acts [B, n, 3]: the behaviour's branch actions; pstate
        [B, 3]: position, entry price and bars held at bar t. Steps 1..m re-run `TradingEnv.fill`
        over bars t .. t + m - 1 (the env's own arithmetic, so the rewards are the ones it paid).
        Returns the discounted scaled reward sum [B] and the portfolio features at bar t + m
        [B, 3], the state the return bootstraps from: for a transition cut by an episode end,
        the state that end reached, not the restarted env's."""
        cfg, env = self.cfg, self.env
        pos, entry, hold = pstate.unbind(1)
        G = torch.zeros_like(pos)
        last = self.data.n - 2  # a masked step past the data reads a valid bar all the same
        for k in range(cfg.n_step):
            live = k < m
            tk = (t + k).clamp(max=last)
            a = acts[:, k]
            target, passive = env.order(a[:, 0], a[:, 1], a[:, 2])
            r, _, p2, e2, h2 = env.fill(tk, pos, entry, hold, target, passive)
            G = G + torch.where(live, (cfg.gamma**k) * cfg.reward_scale * r, 0.0)
            pos, entry, hold = (torch.where(live, x2, x) for x2, x in
                                ((p2, pos), (e2, entry), (h2, hold)))  # fmt: skip
        return G, env.portfolio_of(t + m, pos, entry, hold)

    def _sampled(self, idx: torch.Tensor):
        """A learning step's sampled transitions `idx`, read from the replay: the states, the
        next states, the n-step returns R [B], the discounts [B, 1] and the joint actions
        taken [B, 1]."""
        cfg, env, B = self.cfg, self.env, idx.shape[0]
        f = self.replay.fbuf.index_select(0, idx)
        i = self.replay.ibuf.index_select(0, idx)
        t, m = i[:, 0], i[:, 1]
        acts = i[:, 2:].reshape(B, cfg.n_step, 3)
        s = self.state(t, env.portfolio_of(t, f[:, 0], f[:, 1], f[:, 2]))
        R, port2 = self._replay_return(t, m, acts, f)
        s2 = self.state(t + m, port2)
        disc = torch.pow(cfg.gamma, m.float())[:, None]  # [B, 1]; gamma^0 never occurs (m >= 1)
        act = (acts[:, 0] * self.joint_stride).sum(1)[:, None]  # [B, 1] joint action taken
        return s, s2, R, disc, act

    def _taken(self) -> bool:
        """Whether the loss reads the taken action's outputs alone: unless CQL's penalty needs
        them all (or IQN, whose quantiles come whole)."""
        return self.cfg.distribution != "iqn" and self.cfg.cql_alpha == 0

    def _online(self, s: torch.Tensor, act: torch.Tensor, taus: torch.Tensor | None):
        """The online network's outputs on the states, with their gradient."""
        with self._autocast():
            return self.net(s, taus, act=act if self._taken() else None)

    def _next(self, net: nn.Module, s2: torch.Tensor) -> torch.Tensor | tuple:
        """`net`'s outputs on the next states, without gradient: C51's Triton target reads
        their dueling streams rather than their logits."""
        # The hidden layers where the network gives them (QNet.adv_in_target), else the streams.
        triton = self.cfg.distribution == "c51" and self.next_target is c51_triton.next_target
        parts = "hidden" if triton else False
        with torch.no_grad(), self._autocast():
            return net(s2, self._taus(s2.shape[0]), parts=parts)

    def _next_target(self, s2: torch.Tensor):
        return self._next(self.target, s2)

    def _next_online(self, s2: torch.Tensor):
        return self._next(self.net, s2)

    def _loss(self, idx: torch.Tensor, w: torch.Tensor):
        s, s2, R, disc, act = self._sampled(idx)
        taus = self._taus(idx.shape[0])
        out = self._online(s, act, taus)
        tg2 = self._next_target(s2)
        on2 = self._next_online(s2) if self.cfg.double_q else tg2
        return self._loss_of(out, tg2, on2, R, disc, act, taus, w)

    def _loss_pieces(self, wrap: Callable = lambda f: f) -> SimpleNamespace:
        """`_loss`'s pieces for `_streamed_loss`, each wrapped (compiled, on a GPU)."""
        return SimpleNamespace(
            sampled=wrap(self._sampled), online=wrap(self._online),
            next_target=wrap(self._next_target), next_online=wrap(self._next_online),
            loss_of=wrap(self._loss_of),
        )  # fmt: skip

    def _streamed_loss(self, idx: torch.Tensor, w: torch.Tensor):
        """`_loss` as compiled pieces on a GPU (C51), the next states' forward passes each on
        a CUDA stream of its own beside the online network's forward (`NEXT_ON_STREAMS`). The
        same kernels as the pieces launched on one stream, `side_streams` None (the tests)."""
        p, side = self._pieces, self.side_streams
        s, s2, R, disc, act = p.sampled(idx)
        nets = (p.next_target, p.next_online) if self.cfg.double_q else (p.next_target,)
        nxt = beside(side, nets, s2)
        out = p.online(s, act, None)
        tg2, *on2 = joined(side, nxt)
        on2 = on2[0] if on2 else tg2
        return p.loss_of(out, tg2, on2, R, disc, act, None, w)

    def _loss_of(self, out, tg2, on2, R, disc, act, taus, w):
        """The loss from the networks' outputs (`_online`, `_next`), and what a step records:
        the loss, the replay's new priorities, the taken action's expected value, CQL's
        penalty and the target mass clipped at the support's ends."""
        cfg = self.cfg
        taken = self._taken()
        with torch.no_grad():
            a2 = None if cfg.distribution == "c51" else self.q_values(on2).argmax(-1, keepdim=True)
        clipped = torch.zeros((), device=self.device)
        prio = None  # the replay priority: the loss per sample, or |TD error| for `mean`
        if cfg.distribution == "iqn":
            theta = out.float().gather(2, act[:, None, :].expand(-1, out.shape[1], -1))
            with torch.no_grad():
                nxt = tg2.float().gather(2, a2[:, None, :].expand(-1, tg2.shape[1], -1))
                target = R[:, None, None] + disc[:, :, None] * nxt  # [B, K', 1]
            per = quantile_huber(theta, target, taus)
            q_taken = theta.detach().mean()
        elif cfg.distribution == "mean":
            q = (out if taken else out.gather(1, act[:, :, None])).float()[:, 0, 0]
            with torch.no_grad():
                target = R + disc[:, 0] * tg2.float()[:, :, 0].gather(1, a2)[:, 0]
            td = q - target
            per, prio = 0.5 * td.square(), td.detach().abs()
            q_taken = q.detach().mean()
        else:
            A = cfg.atoms
            chosen = out if taken else out.gather(1, act[:, :, None].expand(-1, -1, A))
            logp = F.log_softmax(chosen.float(), -1)  # [B, 1, A]
            with torch.no_grad():
                target, clip = self.next_target(on2, tg2, R, disc, self.z)
                clipped = clip.mean()
                q_taken = torch.matmul(logp.detach().exp(), self.z).mean()
            per = -(target * logp).sum(-1).mean(1)
        loss = (w * per).mean()
        cql = torch.zeros((), device=self.device)
        if cfg.cql_alpha > 0:
            q = self.q_values(out)
            cql = (torch.logsumexp(q, -1) - q.gather(1, act)[:, 0]).mean()
            loss = loss + cfg.cql_alpha * cql
        return loss, per.detach() if prio is None else prio, q_taken, cql.detach(), clipped

    def _learn_step(self) -> None:
        cfg = self.cfg
        if cfg.noisy:  # this step's row of the block's samples; the row after it next
            next_noise_row_(self.noise_now, self.learn_noise, self.learn_i, cfg.learn_steps)
        u = torch.rand(cfg.batch_size, device=self.device, generator=self.gen)
        idx, w = self.replay.sample(u)
        if self.aot:
            if self.learn_aot is None:
                self._aot_steps()
            self.learn_aot(idx, w)
            return
        self._learn_body(idx, w)

    def _learn_body(self, idx: torch.Tensor, w: torch.Tensor) -> None:
        """A learning step after its replay sample: the loss, its gradient (FlatGrad's eager or
        traced form) and the update. With `compile_mode="aot"` this is what is traced; the
        sample stays outside, as with torch.compile (its scan over the priorities,
        foxhunt.train.scan's, is faster than inductor's)."""
        self._zero_grad()
        loss, per, q_taken, cql, clipped = self._loss(idx, w)
        self._backward(loss)
        self._gather_grad()
        self.update_fn(idx, per, loss.detach(), q_taken, cql, clipped)

    def _aot_steps(self) -> None:
        """The learning and collection steps from the compile cache, traced and built first
        where they are not there (foxhunt.train.aot; the state is restored after the trace)."""
        settings = repr((self.cfg, self.env.cfg))
        options = aot_options(self.device)
        noise = "rows" if self.cfg.noisy and self.collect_noise is None else True
        if noise == "rows":  # the per-env noise buffers, drawn into before each step
            for m in self.net.noisy_layers():
                m.row_noise(self.cfg.envs)
        B = self.cfg.batch_size
        sample = (torch.zeros(B, dtype=torch.long, device=self.device),
                  torch.ones(B, device=self.device))  # fmt: skip
        # The module's switches the learning step reads key its package too (bench_train's).
        keyed = f"{settings} adv_in_target={self.net.adv_in_target}"
        self.learn_aot = aot.Step(self, "dqn-learn",
                                  functools.partial(self._traced_step, self._learn_body), sample,
                                  keyed, self._before_trace, self.restore, options)  # fmt: skip
        collect = aot.Step(self, f"dqn-collect-{noise}",
                           lambda u: self._collect_act(u, noise), (self.u_collect[0],), settings,
                           self._before_trace, self.restore, options)  # fmt: skip
        self.collect_fn = lambda u, _noise: collect(u)

    def _before_trace(self) -> dict[str, torch.Tensor]:
        """Before a step is traced to be built ahead of time: C51's Triton op registered (not
        inside the trace), and the state to restore after it."""
        if self.cfg.triton_target:
            c51_triton.register()
        return self.snapshot()

    def _step_update(self, idx, per, loss, q_taken, cql, clipped) -> None:
        """The update (`_update`), then the sampled slots' new priorities and the step's
        statistics, compiled as one function (the priorities' write-back and the statistics
        then run as inductor's kernels, not as a dozen eager ones)."""
        self._record(idx, per, loss, self._update(), q_taken, cql, clipped)

    def _record(self, idx, per, loss, gn, q_taken, cql, clipped) -> None:
        """A learning step's new priorities for its sampled slots, and its statistics."""
        with torch.no_grad():
            self.replay.update(idx, per, self.cfg.per_alpha)
            self.stats[0:4] += torch.stack([loss, gn, q_taken, cql])
            self.stats[7] += clipped

    def _update(self) -> torch.Tensor:
        """Clip the gradient to the global norm (as clip_grad_norm_), Adam, soft target update.
        Returns the norm before clipping."""
        gn = clip_and_step(self.flat, self.opt, self.cfg.grad_clip)
        with torch.no_grad():
            self.target_flat.lerp_(self.flat, self.cfg.tau)
        return gn

    def _draw_learn(self, factorise: bool = True) -> None:
        """A learning block's noise samples, drawn before its steps (which draw their replay
        samples' uniforms each); `factorise` as in `_draw_collect`."""
        if self.learn_noise is not None:
            self.learn_noise.normal_(generator=self.gen)
            if factorise:
                factorise_(self.learn_noise)
            self.learn_i.zero_()

    def learn(self) -> None:
        self._draw_learn()
        g = self.graphs.get("learn")
        for _ in range(self.cfg.learn_steps):
            if g is not None:
                g.replay()
            else:
                self._learn_step()
            mark_step(self.step_marks, self.device)

    def read_stats(self) -> dict[str, float]:
        """The epoch's accumulated statistics (one device -> host read), then zeroed."""
        sums = self.collect_sums.sum(1)
        self.stats[4:7] += sums[:3]
        self.stats[8:11] += sums[3:]
        self.collect_sums.zero_()
        v = self.stats.tolist()
        self.stats.zero_()
        k, c = max(self.cfg.learn_steps, 1), max(self.cfg.collect_steps * self.cfg.envs, 1)
        return {
            "losses/loss": v[0] / k,
            "losses/grad_norm": v[1] / k,
            "losses/q_taken": v[2] / k,
            "losses/cql": v[3] / k,
            "charts/collect_reward_bps": v[4] / c * 1e4,
            "charts/collect_turnover": v[5] / c,
            "charts/episodes": v[6],
            "charts/support_clipped": v[7] / k,
            "charts/support_v_max": float(self.z[-1]),
            **{
                f"charts/collect_{d}": v[8 + i] / max(self.cfg.collect_steps * self.cfg.envs, 1)
                for i, d in enumerate(("short", "flat", "long"))
            },
        }

    # ------------------------------------------------------------------ capture
    def capture(self) -> None:
        """Capture the collection block and the learning step as CUDA graphs (the state is
        restored after the warm-up: training from here on equals eager training)."""

        def warmup():
            for _ in range(3):
                self._learn_step()
            self.collect_fn(self.u_collect[0], self._collect_noise(0))

        blocks = {"learn": self._learn_step, "collect": self._collect_block}
        self.graphs.update(capture_restoring(self, warmup, blocks))

    # ------------------------------------------------------------------ state
    def _state_tensors(self) -> dict[str, torch.Tensor]:
        st = module_weights(self.net)
        st |= {f"target.{k}": v for k, v in self.target.state_dict().items()}
        st |= run_state(self.env, self.opt, self.flat, self.data)
        for k in ("fbuf", "ibuf", "prio", "ptr", "max_prio", "beta"):
            st[f"replay.{k}"] = getattr(self.replay, k)
        st["hist.i"], st["hist.s"], st["hist.d"], st["hist.v"] = (
            self.h_i, self.h_s, self.h_d, self.h_v
        )  # fmt: skip
        st["support.z"], st["stats"], st["stats.collect"] = self.z, self.stats, self.collect_sums
        return st

    def ensure_optimizer_state(self) -> None:
        ensure_adam_state(self.opt, self.flat)


# ---------------------------------------------------------------------------------- serving
def served_q_values(cfg: DQNConfig, tensors: dict[str, torch.Tensor]):
    """A checkpoint's expected Q-values outside the trainer (float32, on the tensors' device):
    states [n, IN_DIM] -> [n, 30], one column a joint action. IQN's expectation averages
    quantiles at sampled fractions in training; here the fractions are fixed midpoints, so a
    served IQN network is deterministic."""
    dev = tensors["support.z"].device
    net = QNet(cfg).to(dev)
    net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
    net.eval()
    z, iqn = tensors["support.z"], cfg.distribution == "iqn"

    def q_values(state: torch.Tensor) -> torch.Tensor:
        taus = None
        if iqn:
            k = cfg.iqn_quantiles
            taus = ((torch.arange(k, device=dev) + 0.5) / k).expand(len(state), k)
        with torch.no_grad():
            return expected_q(net(state, taus, noise=False), z, cfg.distribution)

    return q_values


def acting_net(cfg: DQNConfig, tensors: dict[str, torch.Tensor]):
    """A checkpoint's greedy policy outside the trainer (CPU, float32): states [n, IN_DIM] ->
    branch actions [n, 3], greedy on `served_q_values`."""
    q_values, joint = served_q_values(cfg, tensors), joint_table()

    def act(state: torch.Tensor) -> torch.Tensor:
        return joint[q_values(state).argmax(-1)]

    return act
