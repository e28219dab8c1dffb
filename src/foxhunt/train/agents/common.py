"""Pieces every agent uses the same way: the observation, device-dependent defaults, one flat
parameter buffer, bf16 autocast, an optimiser whose state exists before capture.

Functions, not a base class: each agent file reads top to bottom on its own (cleanrl's style),
and what is shared is what must not differ between agents (what they observe, what a
precision or capture setting means)."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence
from typing import Literal

import torch
import torch.nn.functional as F
from torch.optim.adam import adam

from foxhunt.train import distributed
from foxhunt.train.data import N_MEMORY, N_MKT, MarketData
from foxhunt.train.env import PORTFOLIO

STATE_DIM = N_MKT + N_MEMORY + len(PORTFOLIO)
IN_DIM = 64  # the state (61) zero-padded to a tensor-core friendly width

Precision = Literal["auto", "fp32", "bf16"]
Capture = Literal["auto", "eager", "graph"]


class Observation:
    """What an agent sees at bar t (`state`): the 50 market columns normalised on the fold's
    train range (`MarketData.observe`), the memory of the 8 order-flow columns
    (`MarketData.remember`, unless `memory_decay` is None), the portfolio state (position,
    unrealised PnL in %, bars held / 100) and, with `forecast`, the train range's ridge
    forecast of the next bar's return (`MarketData.use_forecast`)."""

    def __init__(self, data: MarketData, memory_decay: float | None, forecast: bool = False):
        self.data = data
        self.memory = memory_decay is not None
        self.forecast = forecast
        if self.memory:
            data.use_memory(memory_decay)
        if forecast:  # after the memory, which it reads
            data.use_forecast()

    def __call__(self, t: torch.Tensor, portfolio: torch.Tensor) -> torch.Tensor:
        memory = self.data.remember(t) if self.memory else None
        forecast = self.data.forecast.index_select(0, t)[:, None] if self.forecast else None
        return state(self.data.observe(t), memory, portfolio, forecast)


def state(
    market: torch.Tensor,
    memory: torch.Tensor | None,
    portfolio: torch.Tensor,
    forecast: torch.Tensor | None = None,
) -> torch.Tensor:
    """The network's input [n, IN_DIM]: normalised market columns [n, 50], memory [n, 8] or
    None, portfolio [n, 3], forecast [n, 1] or None, zeros up to IN_DIM. (The zeros are made
    per call, not kept per batch size: a cache filled inside a compiled step would make
    torch.compile trace that step again, and a second trace inside a CUDA graph capture
    fails.)"""
    parts = [market, *([] if memory is None else [memory]), portfolio]
    parts += [] if forecast is None else [forecast]
    width = sum(p.shape[1] for p in parts)
    return torch.cat([*parts, portfolio.new_zeros(len(market), IN_DIM - width)], 1)


def mark_step(marks: list | None, device: torch.device) -> None:
    """The benchmark's hook (foxhunt.bench): when `marks` is a list, record the end of a step
    in it, a CUDA event on a GPU (no synchronisation: read after the epoch) or the host clock
    on a CPU. Training leaves `marks` None and pays one comparison a step."""
    if marks is None:
        return
    if device.type == "cuda":
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        marks.append(e)
    else:
        marks.append(time.perf_counter())


def need(cfg, ok: bool, name: str, rule: str) -> None:
    """Refuse a config value that cannot work, naming the field, its value and the rule."""
    if not ok:
        raise ValueError(f"{name} = {getattr(cfg, name)!r}: {rule}")


def resolve(cfg, device: torch.device, sizes: dict[str, tuple[int, int]]):
    """`cfg` with its device-dependent fields filled in: each size left at None takes its
    (GPU, CPU) default from `sizes`, and precision, capture and compile their runtime values.
    A `compile_mode` of "aot" (steps compiled ahead of time, foxhunt.train.aot) turns compile
    on by itself, on a CPU as well, and is refused with compile = False. replace() runs
    __post_init__, so the filled-in sizes are checked too."""
    gpu = device.type == "cuda"
    fill = {k: v[0] if gpu else v[1] for k, v in sizes.items() if getattr(cfg, k) is None}
    compile_ = requested_compile(getattr(cfg, "compile_mode", None), cfg.compile)
    precision, capture, compile_ = resolve_runtime(device, cfg.precision, cfg.capture, compile_)
    return dataclasses.replace(cfg, precision=precision, capture=capture, compile=compile_, **fill)


def requested_compile(compile_mode: str | None, compile_: bool | None) -> bool | None:
    """The compile setting a config asks for: a `compile_mode` of "aot" turns it on, and is
    refused with compile = False; otherwise `compile_` (None: the device decides)."""
    if compile_mode != "aot":
        return compile_
    if compile_ is False:
        raise ValueError(
            "compile_mode = 'aot' with compile = False: nothing would be compiled ahead of "
            "time (leave compile unset, or set it on)"
        )
    return True


def uncompiled(compile_mode: str | None) -> dict:
    """The settings that run a config eager and uncompiled (the device sizer's probes, a
    served policy, the batch search of `foxhunt bench`): capture and compile off, and a config
    set to compile ahead of time back to the default mode, which `requested_compile` would
    otherwise refuse with compile off."""
    out: dict = {"capture": "eager", "compile": False}
    if compile_mode == "aot":
        out["compile_mode"] = "default"
    return out


def resolve_runtime(
    device: torch.device, precision: str, capture: str, compile_: bool | None
) -> tuple[str, str, bool]:
    """auto -> bf16 and CUDA graphs on a GPU, fp32 and eager on a CPU; compile defaults to on
    with graphs. Graphs on a CPU are refused with the option to use."""
    gpu = device.type == "cuda"
    precision = precision if precision != "auto" else ("bf16" if gpu else "fp32")
    capture = capture if capture != "auto" else ("graph" if gpu else "eager")
    if capture == "graph" and not gpu:
        raise ValueError(
            "capture = 'graph': CUDA graphs need a CUDA device, and training runs on "
            f"{device.type} (use --capture auto or eager)"
        )
    return precision, capture, compile_ if compile_ is not None else capture == "graph"


COMPILED_PER_PROCESS = 64
"""Compiled versions of one agent method a process may hold (see `compiled`)."""


def compiled(fn: Callable, combo: bool = False, options: dict | None = None, **kw) -> Callable:
    """torch.compile(fn, dynamic=False, **kw) for an agent's bound method; `combo` adds
    inductor's combo kernels (a graph's independent small kernels launched as one kernel: a
    Triton option, which the DQN takes on a GPU), and `options` further inductor options.

    Static shapes: another agent in the process, at other sizes, compiles its own (automatic
    dynamic shapes hit a Dynamo guard error in torch 2.11). Dynamo guards a method on the
    identity of some objects it reads (an update, on its agent's optimiser), so each agent of
    a process compiles its own version of such a method (one that reads only tensors and
    settings serves every agent of one configuration); past `recompile_limit` (8 by default)
    Dynamo runs the method eagerly, with one warning. Raised here, so that a cohort (`foxhunt
    train --seeds`, up to 10 agents on a GPU) and a benchmark's further agents all stay
    compiled.

    AOTAutograd's cache also keeps graphs that hold a custom autograd.Function (`linear_relu`'s,
    in a GPU agent's loss), which torch leaves out by default: without it a task on a warm
    compile cache traces that graph's forward and backward again. Dynamo traces the Function's
    forward and backward into the graph, from which the cache's key is computed, so a changed
    Function is a new key (checked: tests/test_cohort.py)."""
    import torch._dynamo
    import torch._functorch.config

    cfg = torch._dynamo.config
    cfg.recompile_limit = max(cfg.recompile_limit, COMPILED_PER_PROCESS)
    torch._functorch.config.autograd_cache_allow_custom_autograd_functions = True
    if combo or options:  # torch.compile takes a mode or options, not both
        import torch._inductor

        mode = kw.pop("mode", None) or "default"
        kw["options"] = {**torch._inductor.list_mode_options(mode), "combo_kernels": combo,
                         **(options or {})}  # fmt: skip
    return torch.compile(fn, dynamic=False, **kw)


COMBO_REORDER_ASSERTS = torch.__version__ < (2, 13)
"""Torch before 2.13 (the GPU machines' 2.11): inductor asserts where it weighs reordering the
loops of a fused node that holds a combo kernel (`FusedSchedulerNode.reorder_loops_by_dep_pair`;
2.13 declines the reordering there instead). The stacked DQN's update at two agents stopped
there (H200, torch 2.11, 2026-12-05; at eight agents it compiled). `NO_LOOP_REORDER` turns that
reordering off for a graph with combo kernels on such a torch; so compiled, the stacked GPU
tests pass (H100, torch 2.11, 2026-12-05)."""

NO_LOOP_REORDER = {"loop_ordering_after_fusion": False} if COMBO_REORDER_ASSERTS else {}

COMBO_NO_REORDER = {"combo_kernels": True, **NO_LOOP_REORDER}
"""Inductor's options for a graph with combo kernels where that assert must not be met: the
stacked DQN's compiled steps, and the DQN's packages built ahead of time with combo kernels."""


def autocast(precision: str, device: torch.device):
    """bf16 autocast for matrix work; the callers keep softmax, returns, rewards and losses in
    float32 themselves."""
    if precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16, cache_enabled=False)
    return contextlib.nullcontext()


class _LinearReLU(torch.autograd.Function):
    """relu(x w^T + b) as one matrix product with the ReLU in its epilogue (cuBLASLt's
    RELU_BIAS, through aten._addmm_activation, which inductor calls as it is), and the
    backward of `F.relu(F.linear(x, w, b))`: threshold_backward, then the two products and
    the bias's sum."""

    @staticmethod
    def forward(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch._addmm_activation(b, x, w.t())

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, w, _ = inputs
        ctx.save_for_backward(x, w, output)

    @staticmethod
    def backward(ctx, g: torch.Tensor):
        x, w, y = ctx.saved_tensors
        g = torch.ops.aten.threshold_backward(g, y, 0)
        dx, dw, db = ctx.needs_input_grad
        return g @ w if dx else None, g.t() @ x if dw else None, g.sum(0) if db else None


def linear_relu(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """F.relu(F.linear(x, w, b)); for a 2-D x, on a CUDA device one cuBLASLt call
    whose epilogue adds the bias and applies the ReLU, where inductor otherwise runs the ReLU
    as a kernel of its own over the product's output (a pass over [8192, 512] bf16 per trunk
    layer and network at the standard workload's sizes). Under bf16 autocast it casts x, w
    and b as autocast casts them for F.linear (aten._addmm_activation is not on autocast's
    list). ReLU and rounding commute, so the output is the unfused form's wherever cuBLAS
    picks the same product. On a CPU the same op is a product, then the ReLU (what the tests
    check the backward on). Not under vmap: dqn_stacked turns QNet's `fused_relu` off."""
    if x.dim() != 2:
        return F.relu(F.linear(x, w, b))
    dev = x.device.type
    if torch.is_autocast_enabled(dev):
        dt = torch.get_autocast_dtype(dev)
        x, w, b = x.to(dt), w.to(dt), b.to(dt)
    return _LinearReLU.apply(x, w, b)


def flatten_into_views(params: list[torch.Tensor]) -> torch.Tensor:
    """Copy the parameters into one flat leaf tensor and make each a view of its slice: clipping,
    Adam and a target update are then one kernel over one tensor (on a GPU, multi-tensor kernels
    over a few small tensors occupy only a few SMs)."""
    flat = torch.cat([p.detach().reshape(-1) for p in params]).requires_grad_()
    view_params(params, flat)
    return flat


def view_params(params: list[torch.Tensor], flat: torch.Tensor) -> None:
    """Make each parameter a view of its slice of `flat`, in order."""
    off = 0
    for p in params:
        p.data = flat.detach()[off : off + p.numel()].view_as(p)
        off += p.numel()


def ensure_adam_state(opt: torch.optim.Optimizer, flat: torch.Tensor) -> None:
    """Adam creates its state lazily at the first step; resume files and capture need it to
    exist beforehand, so take one zero-gradient step and undo it (weights and state as before)."""
    if opt.state:
        return
    saved = flat.detach().clone()
    flat.grad = torch.zeros_like(flat)
    opt.step()
    with torch.no_grad():
        flat.copy_(saved)
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v):
                v.zero_()


class FlatAdam:
    """Adam's settings and state for one flat parameter, held as torch.optim.Adam holds them
    (`defaults`, `param_groups`, `state`, the state made at once), for a step that is not
    compiled by torch.compile: uncompiled, or compiled ahead of time (foxhunt.train.aot, where
    it is traced into the package). Building a torch optimiser imports torch._dynamo (a second
    on the 2-core VM, about five on the H200's hosts), which such a task needs for nothing
    else. Its step is `adam_step`'s, torch.optim.adam.adam with the arguments torch's Adam
    passes, so the same arithmetic bit for bit; `capturable` as torch's (on a GPU and ahead
    of time the step count a tensor on the device, else on the host). Its settings and state
    equal torch.optim.Adam's (tests/test_aot.py)."""

    def __init__(self, flat: torch.Tensor, *, lr: float | torch.Tensor, eps: float,
                 weight_decay: float, decoupled_weight_decay: bool, foreach: bool | None,
                 capturable: bool = True):  # fmt: skip
        self.defaults = dict(
            lr=lr, betas=(0.9, 0.999), eps=eps, weight_decay=weight_decay, amsgrad=False,
            maximize=False, foreach=foreach, capturable=capturable, differentiable=False,
            fused=None, decoupled_weight_decay=decoupled_weight_decay,
        )  # fmt: skip
        self.param_groups = [{"params": [flat], **self.defaults}]
        zeros = functools.partial(torch.zeros_like, flat, memory_format=torch.preserve_format)
        scalar = torch.get_default_dtype()  # torch.optim's scalar dtype for the step count
        step = torch.zeros((), dtype=scalar, device=flat.device if capturable else "cpu")
        self.state = {flat: {"step": step, "exp_avg": zeros(), "exp_avg_sq": zeros()}}


def flat_optimiser(
    flat: torch.Tensor, *, jit: bool, aot: bool, **adam
) -> torch.optim.Adam | FlatAdam:
    """An agent's Adam over its flat parameter `flat` (`adam`: lr, eps, weight_decay,
    decoupled_weight_decay, foreach): torch.optim.Adam where torch.compile traces the step
    (`jit`: Dynamo knows torch's optimisers), else FlatAdam (uncompiled, or ahead of time:
    no torch._dynamo import). Capturable (the step count on the device) on a GPU and ahead of
    time. Either is stepped by `adam_step`: the same arithmetic."""
    capturable = aot or flat.device.type == "cuda"
    if jit:
        return torch.optim.Adam([flat], capturable=capturable, **adam)
    return FlatAdam(flat, capturable=capturable, **adam)


def adam_step(opt: torch.optim.Adam | FlatAdam, flat: torch.Tensor) -> None:
    """`opt.step()` for an Adam (or AdamW) over the one parameter `flat`, whose state exists
    (`ensure_adam_state`): the function `torch.optim.Adam.step` calls, with the arguments it
    passes, so the same arithmetic bit for bit. Not the method itself, which breaks a compiled
    graph before and after the step (torch.optim's `_use_grad_for_differentiable`; pytorch
    issue 104053): inside a compiled update the clipping before it, the step and what follows
    (the target network's update, the priorities, the statistics) are then one graph rather
    than three."""
    group = opt.param_groups[0]
    if len(opt.param_groups) != 1 or len(group["params"]) != 1 or group["params"][0] is not flat:
        raise ValueError("adam_step: the optimiser must hold the one flat parameter")
    st = opt.state[flat]
    beta1, beta2 = group["betas"]
    with torch.no_grad():
        adam(
            [flat], [flat.grad], [st["exp_avg"]], [st["exp_avg_sq"]],
            [st["max_exp_avg_sq"]] if group["amsgrad"] else [], [st["step"]],
            amsgrad=group["amsgrad"], has_complex=flat.is_complex(), beta1=beta1, beta2=beta2,
            lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"],
            maximize=group["maximize"], foreach=group["foreach"], capturable=group["capturable"],
            differentiable=group["differentiable"], fused=group["fused"], grad_scale=None,
            found_inf=None, decoupled_weight_decay=group["decoupled_weight_decay"],
        )  # fmt: skip


class FlatGrad:
    """The gradient of an agent whose parameters (`params`) are views of one flat buffer
    (`flat`), in either of two forms. Eagerly (and under torch.compile), backward fills the
    parameters' gradients, which `_gather_grad` copies into the flat buffer's. Inside a step
    traced to be compiled ahead of time (`aot`, foxhunt.train.aot), the parameters are views
    of the flat buffer to autograd as well (not leaves, so backward fills no `.grad` of
    theirs): the gradient is taken for them and concatenated into the flat buffer's.

    Taken for the flat buffer itself instead, autograd's backward of each view writes the
    view's gradient into a zero buffer of the flat's size and adds those up, and inductor keeps
    many of them as buffers: the DQN's learning step built for a CPU wrote 11 buffers of its
    434,349 floats a step that way, against the one concatenation now (the same numbers bit
    for bit). On a GPU the DQN's standard epoch took 0.246 s against 0.257 s that way (learning
    227.9 against 239.1 ms; H100, 2026-12-05, one call); bench_train's `-flatgrad` switch
    restores the other."""

    aot = False
    flat: torch.Tensor
    params: list[torch.Tensor]

    def _zero_grad(self) -> None:
        if self.aot:
            self.flat.grad = None
            return
        for p in self.params:  # backward hands over fresh gradient buffers
            p.grad = None

    def _backward(self, loss: torch.Tensor) -> None:
        """Add `loss`'s gradient to what the step has gathered so far."""
        if not self.aot:
            loss.backward()
            return
        grads = torch.autograd.grad(loss, self.params, allow_unused=True, materialize_grads=True)
        g = torch.cat([x.reshape(-1) for x in grads])
        self.flat.grad = g if self.flat.grad is None else self.flat.grad + g

    def _gather_grad(self) -> None:
        """The step's gradient into `flat.grad` (where it is not there already)."""
        if not self.aot:
            self.flat.grad = torch.cat([p.grad.reshape(-1) for p in self.params])

    def _traced_step(self, step: Callable[..., None], *args: torch.Tensor) -> None:
        """`step(*args)` as a step compiled ahead of time is traced: with gradients on (it may
        be traced inside a no_grad block), and no gradient left on the flat buffer after it."""
        with torch.enable_grad():
            step(*args)
        self.flat.grad = None


def clip_and_step(flat: torch.Tensor, opt: torch.optim.Optimizer, max_norm: float) -> torch.Tensor:
    """Average the flat gradient over the data-parallel ranks (foxhunt.train.distributed; one
    all-reduce, nothing for one process), clip it to the global norm `max_norm` (as
    clip_grad_norm_ does), take the optimiser's step (`adam_step`); returns the norm before
    clipping (what losses/grad_norm logs)."""
    g = distributed.average_(flat.grad)
    gn = torch.linalg.vector_norm(g)
    g.mul_((max_norm / (gn + 1e-6)).clamp(max=1.0))
    adam_step(opt, flat)
    return gn


def restart(net: torch.nn.Module, init: dict[str, torch.Tensor], zero: list[torch.Tensor],
            opt: torch.optim.Optimizer) -> None:  # fmt: skip
    """The network back to its initial weights, the optimiser's state and `zero` to zeros, in
    place (captured graphs keep their addresses)."""
    with torch.no_grad():
        for k, v in net.state_dict().items():
            v.copy_(init[k])
        for st in opt.state.values():
            for v in st.values():
                if torch.is_tensor(v):
                    v.zero_()
        for v in zero:
            v.zero_()


def start_fold(
    data: MarketData, env, train_lo: int, train_hi: int, envs: int, gen: torch.Generator
) -> None:
    """A fold's normaliser fitted on its train range (only there: no look-ahead), and the envs
    restarted at random bars of that range (drawn from the agent's generator)."""
    data.fit_normaliser(train_lo, train_hi)
    env.set_range(train_lo, train_hi)
    env.reset(torch.rand(envs, device=data.device, generator=gen))


class AgentState:
    """An agent's snapshot, restore and resume check, from its `_state_tensors()` (every tensor
    training changes, live) and `gen`, a random generator of its own whose state goes with them
    (under RNG_KEY), so that a resumed agent draws on where it stopped. The RL agents take every
    draw of their training from `gen` (seeded per fold): agents trained side by side in one
    process draw what each would alone."""

    RNG_KEY = "rng"
    gen: torch.Generator
    collects = True  # the Agent protocol's: it steps the env (SupervisedAgent: no)

    def _state_tensors(self) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def snapshot(self) -> dict[str, torch.Tensor]:
        """Every tensor that training changes, copied, and the generator's state (for capture
        and for resume files)."""
        out = {k: v.detach().clone() for k, v in self._state_tensors().items()}
        return out | {self.RNG_KEY: self.gen.get_state()}

    def state_mismatch(self, saved: dict[str, torch.Tensor]) -> str | None:
        """Why `saved` cannot be restored into this agent (another version's layout), or None."""
        if self.RNG_KEY not in saved:
            return f"it lacks {self.RNG_KEY}"
        return state_mismatch(self._state_tensors(), saved)

    def restore(self, saved: dict[str, torch.Tensor]) -> None:
        copy_state(self._state_tensors(), {k: v for k, v in saved.items() if k != self.RNG_KEY})
        self.gen.set_state(saved[self.RNG_KEY].cpu())


def module_weights(net: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A network's tensors as a checkpoint names them (`net.<name>`), live."""
    return {f"net.{k}": v for k, v in net.state_dict().items()}


def copy_weights(cur: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for k, v in cur.items():
            v.copy_(weights[k])


def run_state(env, opt: torch.optim.Optimizer, flat: torch.Tensor, data: MarketData):
    """The tensors of a resume file every agent has: the envs' positions and clocks, the
    optimiser's state, the fold's normaliser."""
    st = {f"opt.{k}": v for k, v in opt.state.get(flat, {}).items() if torch.is_tensor(v)}
    for k in ("t", "pos", "entry", "hold", "steps", "lo", "hi", "episode_bars"):
        st[f"env.{k}"] = getattr(env, k)
    return st | data.statistics()


def state_mismatch(cur: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> str | None:
    """Why `saved` cannot be copied into `cur` (missing keys, other shapes), or None."""
    missing = set(cur) - set(saved)
    if missing:
        return f"it lacks {sorted(missing)[:5]}"
    for k, v in cur.items():
        if saved[k].shape != v.shape:
            return f"{k} has shape {tuple(saved[k].shape)}, this trainer {tuple(v.shape)}"
    return None


def copy_state(cur: dict[str, torch.Tensor], saved: dict[str, torch.Tensor]) -> None:
    why = state_mismatch(cur, saved)
    if why is not None:
        raise ValueError(f"resume state does not fit this trainer: {why}")
    with torch.no_grad():
        for k, v in cur.items():
            v.copy_(saved[k].to(v.device))


def beside(streams: Sequence | None, fns: Sequence[Callable], *args) -> list:
    """[fn(*args) for fn in fns], each launched on its own CUDA stream of `streams` once that
    stream has waited for the current stream's work so far (one after another where `streams`
    is None). The current stream goes on at once; `joined` makes it wait for the results."""
    if streams is None:
        return [fn(*args) for fn in fns]
    main = torch.cuda.current_stream(streams[0].device)
    out = []
    for fn, s in zip(fns, streams, strict=False):  # as many streams as fns, or more
        s.wait_stream(main)
        with torch.cuda.stream(s):
            out.append(fn(*args))
    return out


def joined(streams: Sequence | None, results: list) -> list:
    """The current stream waits for the streams that made `results` (`beside`'s: tensors or
    tuples of them), and marks each result's memory as in use on the current stream too, so
    that its own stream's allocator does not hand it out again while the current stream may
    still read it. Returns `results`."""
    if streams is None:
        return results
    main = torch.cuda.current_stream(streams[0].device)
    for s in streams[: len(results)]:
        main.wait_stream(s)
    for r in results:
        for t in r if isinstance(r, (tuple, list)) else (r,):
            t.record_stream(main)
    return results


def on_streams(items: Sequence, streams: Sequence | None, fn: Callable) -> None:
    """fn(item) for every item: each on its own CUDA stream where `streams` are given (the
    current stream waits for all of them before this returns), else one after another."""
    if streams is None:
        for x in items:
            fn(x)
        return
    main = torch.cuda.current_stream(streams[0].device)
    for x, s in zip(items, streams, strict=True):
        s.wait_stream(main)
        with torch.cuda.stream(s):
            fn(x)
    for s in streams:
        main.wait_stream(s)


def capture_restoring(agent, warmup, blocks: dict[str, object]) -> dict[str, torch.cuda.CUDAGraph]:
    """Capture an agent's blocks as CUDA graphs. The warm-up and capture runs change the state,
    so the state (`agent.snapshot()`, with the agent's own generator where it has one) and the
    CUDA RNG are saved before and restored after:
    training from here on equals eager training. An agent's envs need a valid range even before
    the first fold is set (it is restored afterwards too). `agent` may be a list of agents whose
    blocks run together (foxhunt.train.agents.dqn_stacked)."""
    agents = agent if isinstance(agent, list) else [agent]
    dev = agents[0].device
    if dev.type != "cuda":
        raise RuntimeError("CUDA graphs need a CUDA device")
    saved = [a.snapshot() for a in agents]
    rng = torch.cuda.get_rng_state(dev)
    for a in agents:
        env = getattr(a, "env", None)  # the supervised models step no env
        if env is not None:
            env.set_range(0, a.data.n)
            env.reset(torch.rand(a.cfg.envs, device=dev))
    gens = [g for a in agents if (g := getattr(a, "gen", None)) is not None]
    graphs = capture_graphs(dev, warmup, blocks, gens)
    for a, s in zip(agents, saved, strict=True):
        a.restore(s)
    torch.cuda.set_rng_state(rng, dev)
    return graphs


def capture_graphs(
    device: torch.device, warmup, blocks: dict[str, object], generators=()
) -> dict[str, torch.cuda.CUDAGraph]:
    """Run `warmup` on a side stream (allocations and autotuning happen there), then capture each
    of `blocks` (name -> callable) as a CUDA graph sharing one memory pool, on that stream.

    Two things the caller need not know about:
    - The warm-up's cached memory goes back to the device before capturing: while a capture is
      under way the allocator cannot free cached blocks to make room for the graph's pool, so a
      step that takes half the GPU would find no room for its graph.
    - Each call captures on a stream of its own (torch's pool of side streams, 32 of them, in
      turn), not torch's one shared capture stream: cuBLAS keeps a workspace per (handle,
      stream), and a graph bakes in the workspace of the stream it was captured on, so graphs
      captured on one stream and replayed side by side (the ensemble's members on streams of
      their own) would write the same workspace at once.

    `generators`: the blocks' own random generators besides torch's default (an agent's), each
    registered with every graph so that a replay draws fresh numbers from it, as eager code
    would."""
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        warmup()
    torch.cuda.current_stream(device).wait_stream(s)
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    pool = torch.cuda.graph_pool_handle()
    graphs = {}
    for name, fn in blocks.items():
        g = torch.cuda.CUDAGraph()
        for gen in generators:
            g.register_generator_state(gen)
        with torch.cuda.graph(g, pool=pool, stream=s):
            fn()
        graphs[name] = g
    torch.cuda.synchronize(device)
    return graphs
