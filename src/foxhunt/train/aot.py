"""Training steps compiled ahead of time: a task on a warm compile cache loads its agent's
steps and runs them, with nothing traced or compiled and no compiler imported to do it.

torch.compile traces each compiled function again in every new process (Dynamo's bytecode
tracing, AOTAutograd) even where inductor's cache holds the code, and imports the compiler to
do so. Here a step is traced once with its gradient and optimiser step (make_fx, at the level
of aten operators), compiled by AOTInductor into a package in the compile cache, and loaded
by torch's C++ loader (`torch._C._aoti`) in every task after: in the task that built it as
well, so that a first run and a retry run the same code and get the same numbers.

A step becomes a function of tensors alone: the tensors reachable from the agent (its
networks' parameters and buffers, the optimiser's state, the replay, envs, data and
statistics, lists and dicts of them) that the step reads are its inputs. Tensors that share
memory are passed once, as a tensor spanning that memory (their base), and inside the trace
each of them is rebound to its view of the base, so that a write through one is read through
the others (an agent's parameters are views of its flat buffer). The step changes its inputs
in place, as eager code does: captured CUDA graphs, checkpoints and resume files see the same
tensors. Python values the step reads (settings, the optimiser's learning rate) are fixed in
the package and are part of its key; a value that changes during training must be a tensor of
the agent's. So is the machine: inductor builds for the CPU it runs on (-march=native), so a
package is kept per CPU model as well as per GPU. A package carries its own C++ runtime
(`OWN_RUNTIME`), so that no other copy of libstdc++ in the process can reach it, and on the
CPU a process that runs packages keeps the memory their buffers take between runs
(`hold_heap`).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from foxhunt.provenance import source_digest
from foxhunt.train import distributed

log = logging.getLogger(__name__)


@dataclass
class Slot:
    """Where a tensor of the agent's lives (`container[key]`), and which base and view of it the
    tensor is."""

    container: Any
    key: Any
    tensor: torch.Tensor
    base: int = -1


def tensor_slots(root: object, optimisers: list | None = None,
                 rnns: list | None = None) -> list[Slot]:  # fmt: skip
    """Every place a tensor is held below `root`: attributes of foxhunt's objects, modules'
    parameters, buffers and tensor attributes, optimisers' state, lists and dicts (and the
    optimisers met, appended to `optimisers`, and the recurrent layers, to `rnns`)."""
    out: list[Slot] = []
    seen: set[int] = set()

    def visit(obj: object, root: bool = False) -> None:
        if obj is None or id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, nn.Module):
            for m in obj.modules():
                if rnns is not None and isinstance(m, nn.RNNBase):
                    rnns.append(m)
                for d in (m._parameters, m._buffers):
                    items(d, d.items())
                items(m.__dict__, [(k, v) for k, v in vars(m).items() if torch.is_tensor(v)])
        elif isinstance(obj, torch.optim.Optimizer):
            if optimisers is not None:
                optimisers.append(obj)
            for st in obj.state.values():
                items(st, st.items())
        elif isinstance(obj, dict):
            items(obj, obj.items())
        elif isinstance(obj, list):
            items(obj, enumerate(obj))
        elif type(obj).__module__ == __name__:  # a step of its own is not its state
            return
        elif (root or type(obj).__module__.startswith("foxhunt.")) and hasattr(obj, "__dict__"):
            items(obj.__dict__, vars(obj).items())

    def items(container: Any, pairs) -> None:
        for k, v in list(pairs):
            if torch.is_tensor(v):
                out.append(Slot(container, k, v))
            else:
                visit(v)

    visit(root, root=True)
    return out


class Bound:
    """An agent's tensors as a step's inputs: one base per block of memory, and each slot's
    view of its base."""

    def __init__(self, root: object):
        self.optimisers: list[torch.optim.Optimizer] = []
        self.rnns: list[nn.RNNBase] = []
        self.slots = tensor_slots(root, self.optimisers, self.rnns)
        blocks: dict[tuple, list[Slot]] = {}
        for s in self.slots:
            t = s.tensor
            blocks.setdefault((t.device, t.untyped_storage().data_ptr()), []).append(s)
        self.bases: list[torch.Tensor] = []
        for i, block in enumerate(blocks.values()):
            self.bases.append(_spanning([s.tensor for s in block]))
            for s in block:
                s.base = i
        for s in self.slots:
            b = self.bases[s.base]
            if s.tensor.dtype != b.dtype:
                raise ValueError(
                    f"aot: a {s.tensor.dtype} tensor {tuple(s.tensor.shape)} at {s.key!r} shares "
                    f"its memory with a {b.dtype} one: a step's inputs need one dtype a block"
                )  # fmt: skip
        # The loader's inputs: the bases without autograd's record (they alias the bases).
        self.inputs = [b.detach() for b in self.bases]
        # The device the step runs on: the GPU where any tensor is on one.
        self.device = next((b.device for b in self.bases if b.device.type == "cuda"),
                           self.bases[0].device if self.bases else torch.device("cpu"))  # fmt: skip

    @staticmethod
    def check(slots: list[Slot]) -> None:
        """Refuse to run on tensors the agent no longer holds (`slots`: those of the bases a
        step reads): a step's package reads the tensors it was given when loaded, so the agent
        must change its own in place (as CUDA graphs need too), never put new ones in their
        place."""
        for s in slots:
            if s.container[s.key] is not s.tensor:
                raise RuntimeError(
                    f"aot: {s.key!r} was replaced by another tensor after the step was loaded; "
                    "a compiled step's tensors must be changed in place"
                )  # fmt: skip

    def geometry(self) -> str:
        """What a package compiled for these tensors assumes of them (part of its key)."""
        return ";".join(
            f"{b.dtype},{tuple(b.shape)},{b.device.type}" for b in self.bases
        ) + "|" + ";".join(
            f"{s.base},{tuple(s.tensor.shape)},{s.tensor.stride()},{s.tensor.storage_offset()}"
            for s in self.slots
        )  # fmt: skip

    @contextlib.contextmanager
    def rebound(self, bases: list[torch.Tensor]) -> Iterator[None]:
        """Within the block every slot holds its view of `bases` (the trace's inputs); the
        tensors it held before come back after."""
        views: dict[int, torch.Tensor] = {}
        for s in self.slots:
            b = bases[s.base]
            if s.tensor is not self.bases[s.base]:
                if id(s.tensor) not in views:
                    t = s.tensor
                    views[id(t)] = b.as_strided(t.shape, t.stride(), t.storage_offset())
                s.container[s.key] = views[id(s.tensor)]
        try:
            yield
        finally:
            for s in self.slots:
                s.container[s.key] = s.tensor


def _spanning(ts: list[torch.Tensor]) -> torch.Tensor:
    """A tensor over the whole of the memory `ts` share: one of them where it spans it (a
    flat buffer whose views the others are), else a new one."""
    t = ts[0]
    n = t.untyped_storage().nbytes()
    for u in ts:
        if u.storage_offset() == 0 and u.is_contiguous() and u.numel() * u.element_size() == n:
            return u
    if n % t.element_size():
        raise ValueError(f"aot: memory of {n} bytes is not a whole number of {t.dtype}")
    base = torch.empty(0, dtype=t.dtype, device=t.device)
    return base.set_(t.untyped_storage(), 0, (n // t.element_size(),))


@contextlib.contextmanager
def _capturable(optimisers: list[torch.optim.Optimizer]) -> Iterator[None]:
    """The optimisers' capturable form for the trace, their step count a tensor on the device
    (on a CPU their uncompiled form reads it into Python, which a trace cannot follow), with
    library code seeing what torch.compile's tracing shows it (`is_compiling`), as torch.optim
    allows that form on a CPU only there."""
    import unittest.mock

    # Modules that bind `is_compiling` by name when imported must be imported before the patch,
    # or they would keep the patched function after it (torch._dynamo's, which make_fx imports
    # at its first trace).
    import torch._dynamo  # noqa: F401

    groups = [g for o in optimisers for g in o.param_groups]
    before = [g["capturable"] for g in groups]
    try:
        for g in groups:
            g["capturable"] = True
        with unittest.mock.patch("torch.compiler.is_compiling", lambda: True):
            yield
    finally:
        for g, c in zip(groups, before, strict=True):
            g["capturable"] = c


@contextlib.contextmanager
def _cell_rnns(rnns: Iterable[nn.RNNBase] = ()) -> Iterator[None]:
    """Recurrent layers (TFT's LSTM) traced as their cells' operators (matrix products and
    pointwise ops: torch._decomp's decomposition of `aten::lstm`, the same on every device)
    rather than as a backend's fused kernels. oneDNN's and cuDNN's backward AOTInductor's
    runtime fails to call (torch 2.13, on the CPU: an internal assert in its proxy executor).
    Without cuDNN, on a GPU, torch's own LSTM runs a fused cell (`_thnn_fused_lstm_cell`)
    whose backward (`_thnn_fused_lstm_cell_backward_impl`) inductor has no lowering for and
    AOTInductor's CUDA runtime no C function for (torch 2.13's headers): inductor calls it as
    it is, and TFT's GPU build hung in that call's message (`short_operator_messages`; which
    operator it was is inferred, not seen). Only the backends' switches are touched (their
    `flags()` would reset their TF32 settings too), and the `_VF.lstm` nn.LSTM calls.

    `rnns`, the agent's recurrent layers, are given their own parameters back before cuDNN is
    switched on again. A layer keeps a list of its weights (`_flat_weights`), which the trace's
    rebinding (`Bound.rebound`) left holding the trace's tensors; at its next call the layer
    would see its weights changed and flatten them for cuDNN, copying them out of the agent's
    flat buffer into memory of its own: the optimiser and the package would then train the
    buffer while the layer computed with the copy (on a GPU TFT's builder predicted 31 of 2,000
    bars otherwise than a task that loaded the package, with equal weights in the buffer). With
    cuDNN off the layer's refresh (`_init_flat_weights`) only re-reads its parameters."""
    from torch._decomp.decompositions import lstm_impl
    from torch.nn.modules import rnn

    vf = rnn._VF

    class CellLSTM:
        def __getattr__(self, name: str) -> Any:
            return getattr(vf, name)

        @staticmethod
        def lstm(*args: Any) -> Any:
            if torch.is_tensor(args[1]):  # the packed sequence's form (data, batch_sizes, ...)
                return vf.lstm(*args)
            return lstm_impl(*args)

    before = torch.backends.mkldnn.enabled, torch.backends.cudnn.enabled
    torch.backends.mkldnn.enabled = torch.backends.cudnn.enabled = False
    rnn._VF = CellLSTM()
    try:
        yield
    finally:
        rnn._VF = vf
        for m in rnns:
            m._init_flat_weights()
        torch.backends.mkldnn.enabled, torch.backends.cudnn.enabled = before


def trace(bound: Bound, body: Callable, args: tuple) -> torch.fx.GraphModule:
    """`body(*args)` as an aten graph of (bases..., args...), gradients and in-place updates
    included. The trace runs the step once for real: the caller restores the state after."""
    from torch.fx.experimental.proxy_tensor import make_fx

    n = len(bound.bases)

    def fn(*xs):
        with bound.rebound(list(xs[:n])):
            out = body(*xs[n:])
        return tuple(out) if isinstance(out, (tuple, list)) else (() if out is None else (out,))

    with _capturable(bound.optimisers), _cell_rnns(bound.rnns):
        gm = make_fx(fn)(*bound.bases, *args)
    # A tensor the step read that is not among its inputs would be fixed in the package with
    # the values it had at the trace (held where tensor_slots does not look: a tuple, a
    # closure, a global).
    fixed = [n.target for n in gm.graph.nodes if n.op == "get_attr"]
    if fixed:
        shapes = [tuple(getattr(gm, t).shape) for t in fixed]
        raise ValueError(
            f"aot: the step reads {len(fixed)} tensor(s) of shapes {shapes} that are not "
            "reachable from the agent's attributes, lists and dicts (a tuple, a closure or a "
            "global holds them); a compiled step would keep their values of the trace"
        )
    return gm


def reshape_read_only_views(gm: torch.fx.GraphModule) -> int:
    """Turn the trace's `view`s into `reshape`s where nothing writes to their memory after
    them; returns how many.

    The trace records a reshape as a view wherever the tensors it ran on allowed one, but
    export traces the graph again with the strides torch's meta functions give, which for
    some operators (TLOB's attention on a CPU) differ from the kernels' own, and the view is
    then refused. A reshape is a view where one is possible and a copy otherwise, the same
    values either way, unless that memory is written after it (through the view, its base or
    any other view of the base: a copy would not see the write). Those views stay views."""
    nodes = list(gm.graph.nodes)

    def viewing(n) -> bool:
        return n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) \
            and n.target.is_view  # fmt: skip

    def root(n):
        while isinstance(n, torch.fx.Node) and viewing(n):
            n = n.args[0]
        return n

    last_write: dict[torch.fx.Node, int] = {}  # the memory's last write, by its root tensor
    for i, n in enumerate(nodes):
        op = n.target
        if n.op != "call_function" or not isinstance(op, torch._ops.OpOverload):
            continue
        if not op._schema.is_mutable:
            continue
        names = [a.name for a in op._schema.arguments]
        given = dict(zip(names[: len(n.args)], n.args, strict=True)) | n.kwargs
        for a in op._schema.arguments:
            if a.alias_info is not None and a.alias_info.is_write and a.name in given:
                written = given[a.name]
                for t in written if isinstance(written, (list, tuple)) else [written]:
                    if isinstance(t, torch.fx.Node):
                        last_write[root(t)] = i
    count = 0
    for i, n in enumerate(nodes):
        if n.op == "call_function" and n.target is torch.ops.aten.view.default \
                and last_write.get(root(n), -1) < i:  # fmt: skip
            n.target = torch.ops.aten.reshape.default
            count += 1
    gm.recompile()
    return count


def drop_unused(gm: torch.fx.GraphModule, n: int) -> list[int]:
    """Remove the inputs among the first `n` (the bases) that the graph does not read (tensors
    of the agent's that the step leaves alone); returns the indices of those it keeps."""
    used = []
    for i, node in enumerate([nd for nd in gm.graph.nodes if nd.op == "placeholder"][:n]):
        if node.users:
            used.append(i)
        else:
            gm.graph.erase_node(node)
    gm.recompile()
    return used


class _Wrap(nn.Module):
    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__()
        self.gm = gm

    def forward(self, *xs):
        return self.gm(*xs)


def build(gm: torch.fx.GraphModule, example: list[torch.Tensor], path: Path,
          metadata: dict[str, str] | None = None, options: dict | None = None) -> Path:  # fmt: skip
    """Export the traced step and compile it with AOTInductor into the package `path`, with
    `metadata` and inductor's `options` over foxhunt's own (written under a temporary name and
    renamed: tasks sharing the cache never read half a package)."""
    ex = tuple(x.detach().clone() for x in example)
    ep = torch.export.export(_Wrap(gm), ex, strict=False)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".pt2")
    os.close(fd)
    # Triton kernels tuned on the example's own values (a first pass that runs the step), not
    # AOTInductor's default of tuning each kernel alone on made-up inputs: an index the step
    # computes (a sampled slot, a chosen action) is then arbitrary, and a kernel reading through
    # it trips its bounds assert and ends the build (pytorch/pytorch#192143; the DQN's build
    # stopped in a device-side assert during that tuning, H100, torch 2.11, 2026-12-05).
    linker = runtime_linker()
    link = OWN_LINK if linker else DEFAULT_LINK
    configs: dict[str, Any] = {"aot_inductor.metadata": {**(metadata or {}), LINK_KEY: link},
                               "triton.autotune_at_compile_time": False,
                               **(options or {})}  # fmt: skip
    if linker:
        configs["cpp.cxx"] = (linker,)
    try:
        try:
            _compile_package(ep, tmp, configs)
        except Exception as e:
            if UNSAVED_KERNEL not in str(e) or configs["triton.autotune_at_compile_time"]:
                raise
            log.warning("%s: inductor's second pass made a kernel its first pass never ran "
                        "(%s); building again with each kernel tuned alone, at compile time",
                        path.name, str(e).rsplit(" ", 1)[-1])  # fmt: skip
            _compile_package(ep, tmp, {**configs, "triton.autotune_at_compile_time": True})
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


UNSAVED_KERNEL = "CudaKernelParamCache not populated"
"""Inductor's error where the C++ wrapper launches a Triton kernel whose binary was never saved.
With tuning on the example's values, inductor lowers the graph twice: a first pass whose Python
wrapper runs the step (each kernel it launches is compiled, tuned and saved) and a second that
writes the C++ wrapper. Where the two passes fuse the graph otherwise, the second asks for a
kernel the first never had: TFT's training step on a GPU, its LSTM unrolled into cells (H100,
torch 2.11, 2026-12-06: 164 kernels saved by the first pass, one fused kernel of its attention's
softmax and layer norm backward missing from them). `build` then builds again with each kernel
tuned alone on inductor's own inputs, in one pass (TFT's package then built in 72 s)."""


def _compile_package(ep: Any, tmp: str, configs: dict[str, Any]) -> None:
    with warnings.catch_warnings(), short_operator_messages():
        # torch's own pytree use, inside its packaging
        warnings.filterwarnings("ignore", r"`isinstance\(treespec, LeafSpec\)`", FutureWarning)
        torch._inductor.aoti_compile_and_package(ep, package_path=tmp, inductor_configs=configs)


@contextlib.contextmanager
def short_operator_messages() -> Iterator[None]:
    """Inductor's messages about an operator it lowers as a call of its own (an implicit
    fallback, logged) or cannot lower (an error) name each argument by `describe`, not by its
    whole IR. Inductor prints every argument's IR there, and an IR node prints each of its
    inputs in full, so a tensor reached by many paths is printed once per path; torch 2.11
    formats the fallback's log line whether or not it is logged (2.13 only when it is). TFT's
    training step on a GPU (H100, torch 2.11, 2026-12-06) was still formatting one after three
    minutes (faulthandler: `OperatorIssue.operator_str` under `GraphLowering.call_function`), so
    its GPU test never finished within 400 s; vLLM meets the same with its custom ops (its
    `_patch_inductor_fallback_allow_list`)."""
    from torch._inductor import exc

    original = exc.OperatorIssue.__dict__.get("operator_str")
    if original is None:  # a torch that formats the error elsewhere
        yield
        return
    exc.OperatorIssue.operator_str = staticmethod(short_operator_str)
    try:
        yield
    finally:
        exc.OperatorIssue.operator_str = original


def short_operator_str(target: Any, args: Any, kwargs: dict[str, Any]) -> str:
    """`OperatorIssue.operator_str`'s lines, each argument `describe`d."""
    lines = [f"target: {target}"] + [f"args[{i}]: {describe(a)}" for i, a in enumerate(args)]
    if kwargs:
        lines.append(
            "kwargs: {" + ", ".join(f"{k}: {describe(v)}" for k, v in kwargs.items()) + "}"
        )
    return "\n".join("  " + ln for ln in lines)


def describe(x: Any, depth: int = 0) -> str:
    """An argument of an inductor lowering in one short line: an IR node by its type, name,
    dtype, size and device (what of them it has), a list by its first items, anything else by
    its repr cut to 200 characters."""
    from torch._inductor import ir

    if isinstance(x, ir.IRNode):
        facts = []
        for what in ("name", "dtype", "size", "device"):
            try:
                facts.append(f"{what}={getattr(x, f'get_{what}')()}")
            except Exception:  # a node without it (an unrealised pointwise has no name)
                continue
        return f"{type(x).__name__}({', '.join(facts)})"
    if isinstance(x, (list, tuple)) and depth < 2:
        items = [describe(v, depth + 1) for v in x[:8]]
        more = [f"... {len(x) - 8} more"] if len(x) > 8 else []
        return "[" + ", ".join(items + more) + "]"
    r = repr(x)
    return r if len(r) <= 200 else r[:200] + "..."


OWN_RUNTIME = ("-static-libstdc++", "-Wl,--exclude-libs,ALL")
"""How a package is linked: with the compiler's own C++ runtime (libstdc++ static), its
symbols hidden. The package then binds none of libstdc++'s symbols in the process, so no
other copy there (another library's, loaded into the global scope; an older system
libstdc++ than the compiler's headers) takes its references; a package linked the default
way fails in its constructor in either case (tests/test_aot_probe.py makes the first). The
package's interface is C: no C++ object crosses it."""


LINK_KEY = "foxhunt_link"
"""A package's metadata entry: how it was linked (`OWN_LINK`, or `DEFAULT_LINK` where the
compiler has no static libstdc++)."""

OWN_LINK = " ".join(OWN_RUNTIME)
DEFAULT_LINK = "inductor's default"


def package_link(path: Path) -> str:
    """How the package `path` was linked: its `LINK_KEY` entry, read from the archive without
    loading it (a package is a zip whose metadata files are JSON). `OWN_LINK` for a package
    without the entry (built before packages kept it) or one that cannot be read."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            meta = next((n for n in z.namelist() if n.endswith("_metadata.json")), None)
            if meta is not None:
                link = json.loads(z.read(meta)).get(LINK_KEY)
                if isinstance(link, str) and link:
                    return link
    except (OSError, zipfile.BadZipFile, ValueError):
        pass
    return OWN_LINK


def compiler_wrapper(folder: Path, cxx: str, flags: tuple[str, ...] | list[str]) -> str:
    """A program in `folder` that runs the compiler `cxx`, adding `flags` where it links a
    shared library; named as `cxx` is, since inductor picks its flags by the compiler's
    name. Written under a temporary name and renamed (tasks sharing the cache)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / Path(cxx).name
    extra = " ".join(flags)
    script = (
        f"#!/bin/sh\n# foxhunt: {cxx}, adding {extra} where it links a shared library\n"
        f'case " $* " in *" -shared "*) exec {cxx} "$@" {extra};; esac\n'
        f'exec {cxx} "$@"\n'
    )
    if not (path.exists() and path.read_text() == script):
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-")
        with os.fdopen(fd, "w") as f:
            f.write(script)
        os.chmod(tmp, 0o755)
        os.replace(tmp, path)
    return str(path)


def compiler_file(cxx: str, name: str) -> str:
    """The library `name` the compiler `cxx` links against (`-print-file-name`), resolved; ""
    where it has none (it prints the bare name back)."""
    out = subprocess.run([cxx, f"-print-file-name={name}"], capture_output=True, text=True)
    path = out.stdout.strip()
    return os.path.realpath(path) if os.path.isabs(path) and os.path.exists(path) else ""


def wrapper_home() -> Path:
    """Where the compiler's wrappers go: beside inductor's precompiled headers, one folder for
    the machine whatever compile cache a task uses. A wrapper's path is part of the key of the
    headers inductor precompiles for a build, so one path a machine lets every compile cache
    built here (the loader's toy check's included) share them; a wrapper inside each cache had
    each precompile them again (11-15 s a cache on the 2-core VM)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    return Path(default_cache_dir()) / "foxhunt-cxx"


def runtime_linker(folder: Path | None = None) -> str | None:
    """Inductor's compiler, linking with `OWN_RUNTIME` (a wrapper under `folder`, by default
    `wrapper_home()`), where it is g++ and has a static libstdc++; else None (inductor's own
    link)."""
    from torch._inductor import cpp_builder

    try:
        cxx = cpp_builder.get_cpp_compiler()
    except Exception:  # check_compiler reports it
        return None
    name = Path(cxx).name
    if "clang" in name or not re.search(r"g\+\+", name):
        return None
    if not compiler_file(cxx, "libstdc++.a"):
        log.info("aot: %s has no static libstdc++: packages linked the default way", cxx)
        return None
    cxx = shutil.which(cxx) or cxx
    # A folder per compiler and flags.
    tag = hashlib.sha256(f"{cxx}\n{OWN_RUNTIME}".encode()).hexdigest()[:12]
    return compiler_wrapper((folder or wrapper_home()) / tag, cxx, OWN_RUNTIME)


def check_compiler(name: str) -> None:
    """AOTInductor builds a package as C++, with inductor's compiler (g++, or $CXX): a task
    without one is stopped before the trace, not after it."""
    from torch._inductor import cpp_builder

    try:
        cpp_builder.get_cpp_compiler()
    except Exception as e:
        raise RuntimeError(
            f"aot: building {name} needs a C++ compiler, and none works here ({e}); install g++ "
            "(foxhunt's GPU image has it), point CXX at one, or train with compile_mode "
            "'default'"
        ) from e


def cache_dir() -> Path:
    """Where packages go: beside inductor's cache (the compile cache a task was pointed at:
    foxhunt.train.core.use_compile_cache), else the system's temporary folder."""
    root = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not root:
        root = str(Path(tempfile.gettempdir()) / f"torchinductor_{os.getuid()}")
    return Path(root) / "foxhunt-aot"


def device_name(device: torch.device) -> str:
    """The device and the host's CPU a package is built for (part of its key)."""
    gpu = ""
    if device.type == "cuda":
        p = torch.cuda.get_device_properties(device)
        gpu = f"cuda:{p.name}:{p.major}.{p.minor} "
    return f"{gpu}{host_cpu()}:{torch.backends.cpu.get_cpu_capability()}"


@functools.cache
def host_cpu() -> str:
    """The CPU's model name (/proc/cpuinfo), else its architecture."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.machine()


def package_path(name: str, settings: str, bound: Bound, args: tuple) -> Path:
    """The package of step `name` in the cache: keyed by the Python values it reads
    (`settings`), torch's version, the device, foxhunt's source and the layout of its
    tensors."""
    dev = bound.device
    sig = ";".join(f"{a.dtype},{tuple(a.shape)},{a.stride()}" for a in args)
    parts = (name, settings, torch.__version__, device_name(dev), source_digest(),
             bound.geometry(), sig)  # fmt: skip
    key = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:24]
    return cache_dir() / f"{name}-{key}.pt2"


KEEP_DAYS_ENV = "FOXHUNT_AOT_KEEP_DAYS"
"""Packages not loaded for this many days (default 14) are removed from the cache when a task
builds a new one; 0 keeps every package."""


def keep_days() -> float:
    value = os.environ.get(KEEP_DAYS_ENV, "14")
    try:
        days = float(value)
    except ValueError:
        days = -1.0
    if not days >= 0:
        raise ValueError(f"{KEEP_DAYS_ENV}={value!r}: expected a number of days >= 0")
    return days


def mark_used(path: Path) -> None:
    """Note that `path` was loaded now (its modification time), for `prune`. A cache mounted
    read-only keeps its times."""
    with contextlib.suppress(OSError):
        os.utime(path)


def prune(folder: Path, days: float, keep: Path | None = None) -> list[Path]:
    """Remove the packages in `folder` not loaded or built for `days` days (0: none), except
    `keep`; returns those removed. Every change of foxhunt's source, torch, the machine or a
    config builds packages of its own, and on a shared cache volume nothing else removes the
    old ones. A task that loads a package as it is removed builds it again."""
    if days <= 0 or not folder.is_dir():
        return []
    cutoff = time.time() - days * 86400
    removed = []
    for path in folder.glob("*.pt2"):
        with contextlib.suppress(OSError):
            if path != keep and path.stat().st_mtime < cutoff:
                path.unlink()
                removed.append(path)
    if removed:
        log.info("aot: removed %d package(s) of %s not used for %g days",
                 len(removed), folder, days)  # fmt: skip
    return removed


def loader_args(path: Path, index: int) -> tuple:
    """torch's package loader's arguments: the model in the package, loaded single-threaded
    (the loader's default runs through a container whose threading a CUDA graph capture
    refuses: "operation not permitted when stream is capturing", pytorch PR 148601, which
    added this form for CUDA graphs), on GPU `index` (-1: the CPU)."""
    return str(path), "model", True, 1, index


class LoaderCrash(RuntimeError):
    """Loading a package ends the process here (torch's loader, not the package, is at fault)."""


LOADER_CHECK = """
import json, sys, torch
torch._C._aoti.AOTIModelPackageLoader(*json.loads(sys.argv[1]))
"""


def check_loader(path: Path, index: int) -> None:
    """Load `path` in a process of its own first, once per torch version, machine and link (a
    marker file after the first success: beside the packages, or in the temporary folder where
    the cache is mounted read-only; the link is the package's own, `package_link`). Where
    torch's loader crashes (the torch 2.11.0+cu130 of the H200 image we measure on ended the
    process with SIGSEGV on any package linked inductor's default way, in the package's own
    constructor) the task stops with an error saying so, rather than dying with the signal on
    every retry; a package that fails to load without a crash is built again by the caller."""
    markers = loader_markers(path.parent, index, package_link(path))
    if any(m.exists() for m in markers):
        return
    args = json.dumps(loader_args(path, index))
    p = subprocess.run([sys.executable, "-c", LOADER_CHECK, args], capture_output=True, text=True)
    if p.returncode < 0:
        raise LoaderCrash(
            f"aot: loading {path.name} ends the process (signal {-p.returncode}) under torch "
            f"{torch.__version__}, checked in a process of its own; its loader cannot run this "
            "machine's packages: train with compile_mode 'default' (`python -m "
            "foxhunt.train.aot_probe --explain` tells why)"
        )
    if p.returncode != 0:
        tail = p.stderr.strip().splitlines()[-1:] or ["no message"]
        raise ValueError(f"{path.name} does not load: {tail[0]}")
    mark(markers)


def loader_markers(folder: Path, index: int, link: str) -> list[Path]:
    """Where a passed check of the loader is marked, for packages linked as `link` that run on
    GPU `index` (-1: the CPU), under this torch on this machine: in `folder`, beside the
    packages, or where that cannot be written (a cache mounted read-only) in the temporary
    folder."""
    machine = device_name(torch.device("cuda" if index >= 0 else "cpu"))
    key = hashlib.sha256(f"{torch.__version__}\n{machine}\n{link}".encode()).hexdigest()[:16]
    return [
        folder / f"loader-ok-{key}",
        Path(tempfile.gettempdir()) / f"foxhunt-aot-loader-ok-{key}",
    ]


def mark(markers: list[Path]) -> None:
    """Leave the first of `markers` that can be written."""
    for marker in markers:
        try:
            marker.parent.mkdir(parents=True, exist_ok=True)
            marker.touch()
            return
        except OSError:
            continue


def unusable(device: torch.device) -> str | None:
    """Why a task on `device` cannot run steps compiled ahead of time, or None where it can
    (`compile_mode="auto"` then chooses them on a GPU): with a C++ compiler to build packages,
    and with a torch whose loader runs them. The loader is known to run where `check_loader`
    left its mark in the cache (any earlier task's package); where there is none yet, a toy
    package is built and loaded, each in a process of its own (foxhunt.train.aot_probe: some
    seconds, once per torch, machine and cache), and a success leaves the mark. Asked once per
    process, device and cache; the reason is logged as a warning."""
    index = -1
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
    return _unusable(index, str(cache_dir()))


@functools.cache
def _unusable(index: int, folder: str) -> str | None:
    why = _why_unusable(index, Path(folder))
    if why is not None:
        log.warning("aot: steps compiled ahead of time cannot run here (compile_mode auto "
                    "then compiles with torch.compile): %s", why)  # fmt: skip
    return why


def _why_unusable(index: int, folder: Path) -> str | None:
    cxx = os.environ.get("CXX") or "g++"
    if shutil.which(cxx) is None:
        return f"no C++ compiler to build packages with ({cxx} is not on the PATH)"
    if any(m.exists() for link in (OWN_LINK, DEFAULT_LINK)
           for m in loader_markers(folder, index, link)):  # fmt: skip
        return None
    from foxhunt.train import aot_probe

    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="foxhunt-aot-check-") as work:
        _, own, rc, said = aot_probe.check(Path(work), index)
    if rc != 0:
        return (f"a toy package under torch {torch.__version__}: {said} (`python -m "
                "foxhunt.train.aot_probe --explain` tells why)")  # fmt: skip
    mark(loader_markers(folder, index, OWN_LINK if own else DEFAULT_LINK))
    log.info("aot: this machine's torch loads packages (a toy built and loaded in %.1f s)",
             time.perf_counter() - t0)  # fmt: skip
    return None


HEAP_HOLD = 1 << 30
"""glibc's thresholds a process running packages on the CPU takes (bytes): allocations up to
this size come from the heap, and the heap is given back to the system only above it."""


@functools.cache
def hold_heap() -> bool:
    """Keep the memory a package's buffers take between its runs (glibc's malloc; elsewhere
    nothing). Inductor plans a step's intermediates into a few large buffers, larger than
    glibc's dynamic mmap threshold (at most 32 MB): each run then maps them afresh and faults
    their pages in again. TLOB's step at window 128, batch 256 (bench_train's
    `tlob-eager-fp32-w128-b256-s8-aot`, 2-core VM, 2026-12-05) took 12.0 s an epoch of 8 steps
    ahead of time, 8.0-8.2 s uncompiled; with both thresholds raised 7.8-8.6 s, the process's
    peak memory the same (1.91 against 1.90 GB). Freed memory up to HEAP_HOLD stays with the
    process. True where glibc took both settings."""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # malloc.h
    return bool(mallopt(m_mmap_threshold, HEAP_HOLD)) and bool(mallopt(m_trim_threshold, HEAP_HOLD))


INPUTS_KEY = "foxhunt_inputs"
"""A package's metadata entry: which of the agent's bases it takes (comma-separated indices)."""


class Step:
    """An agent's step compiled ahead of time: `step(*args)` runs it on the agent's tensors.

    `name` and `settings` (the Python values the step reads: its config) key the package
    together with torch's version, the device, foxhunt's source and the tensors' layout; a
    package that is there is loaded, one that is not is traced and built first. `prepare`
    runs before the trace and `restore` after it (the agent's snapshot and restore: the trace
    runs the step once). `options`: inductor's options for the build, which key the package
    too."""

    def __init__(self, root: object, name: str, body: Callable, args: tuple, settings: str,
                 prepare: Callable[[], Any], restore: Callable[[Any], None],
                 options: dict | None = None):  # fmt: skip
        if distributed.world()[1] > 1:
            raise ValueError(
                f"aot: {name} runs in one of {distributed.world()[1]} data-parallel processes; "
                "a step compiled ahead of time holds no all-reduce of the ranks' gradients "
                "(train data-parallel with compile_mode 'default')"
            )
        self.bound = Bound(root)
        if options:
            settings += f"\ninductor {sorted(options.items())!r}"
        self.path = package_path(name, settings, self.bound, args)
        self.loader = self._load_kept()
        self.built = self.loader is None
        if self.built:
            days = keep_days()  # a bad setting is refused before the build, not after
            check_compiler(name)
            log.info("aot: building %s: no package for this torch, machine, source and "
                     "settings in %s yet", name, self.path.parent)  # fmt: skip
            t0 = time.perf_counter()
            saved = prepare()
            try:
                gm = trace(self.bound, body, args)
            finally:
                restore(saved)
            reshape_read_only_views(gm)
            used = drop_unused(gm, len(self.bound.bases))
            example = [*(self.bound.bases[i] for i in used), *args]
            build(gm, example, self.path, {INPUTS_KEY: ",".join(map(str, used))}, options)
            self.loader = self._load()
            log.info("aot: %s built in %.1f s: %s", name, time.perf_counter() - t0, self.path.name)
            prune(self.path.parent, days, keep=self.path)
        else:
            mark_used(self.path)
        used = self.loader.get_metadata()[INPUTS_KEY]
        self.used = {int(i) for i in used.split(",")} if used else set()
        self.inputs = [t for i, t in enumerate(self.bound.inputs) if i in self.used]
        self.watched = [s for s in self.bound.slots if s.base in self.used]  # what `check` reads

    def _load_kept(self):
        """The package in the cache, None where there is none or it cannot be read (a broken
        file: it is built again)."""
        if not self.path.exists():
            return None
        try:
            return self._load()
        except LoaderCrash:
            raise
        except Exception as e:
            log.warning("aot: %s could not be loaded (%s: %s); building it again",
                        self.path.name, type(e).__name__, e)  # fmt: skip
            return None

    def _load(self):
        dev = self.bound.device
        index = dev.index if dev.type == "cuda" and dev.index is not None else -1
        if dev.type == "cuda" and index < 0:
            index = torch.cuda.current_device()
        check_loader(self.path, index)
        if dev.type == "cpu":
            hold_heap()
        loader = torch._C._aoti.AOTIModelPackageLoader(*loader_args(self.path, index))
        if INPUTS_KEY not in loader.get_metadata():
            raise ValueError(f"the package has no {INPUTS_KEY} entry")
        return loader

    def __call__(self, *args: torch.Tensor) -> list[torch.Tensor]:
        Bound.check(self.watched)
        return self.loader.run([*self.inputs, *args])
