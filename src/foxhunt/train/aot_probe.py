"""Can this machine's torch load the packages of `compile_mode="aot"`, and if not, why not.

    python -m foxhunt.train.aot_probe            # build a toy package, load it in a child process
    python -m foxhunt.train.aot_probe --explain  # and the facts and variants below

A toy package (one elementwise op) is built as foxhunt.train.aot builds a step's (inductor's
C++ compiler, the package linked with its own C++ runtime: `aot.OWN_RUNTIME`) and loaded as a
task loads one (`aot.loader_args`), each in a process of its own, so that a crash is reported,
not suffered: for the GPU and for the CPU where there is a GPU, else for the CPU. Exit status
0 when every toy loads, 1 when one does not.

`--explain` prints what tells the usual causes apart, for a loader that dies in the package's
own constructor (as torch 2.11.0+cu130 does on the H200 image foxhunt is measured on, in the C++
standard library's regex and locale code the package carries, with inductor's default link):

- the facts: torch, the compiler and the libstdc++ it links against, the libstdc++ this
  process runs with, the dynamic loader's environment, the locale;
- the libraries mapped into a torch process that define libstdc++'s locale symbols
  themselves (a second copy of them, in the global scope, takes the references of a package
  linked the default way: its locale ids then index another copy's tables);
- the toy linked inductor's default way, loaded as it is, in the C locale, and with the
  compiler's libstdc++ preloaded; linked with -Bsymbolic (its own template code bound to
  itself); built with clang++ where there is one;
- the dynamic loader's last bindings of the failing package's symbols (LD_DEBUG=bindings).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

LOCALE_SYMBOLS = ("_ZNSt6locale7classicEv", "_ZNSt7collateIcE2idE", "_ZNSt5ctypeIcE2idE")
"""std::locale::classic(), std::collate<char>::id, std::ctype<char>::id."""

BUILD = """
import sys, torch
class Toy(torch.nn.Module):
    def forward(self, x):
        return (x * 2).relu()
x = torch.randn(4, 4, device=sys.argv[2])
ep = torch.export.export(Toy(), (x,))
configs = {"aot_inductor.metadata": {sys.argv[3]: sys.argv[4]}}
torch._inductor.aoti_compile_and_package(ep, package_path=sys.argv[1], inductor_configs=configs)
"""

LOAD = """
import sys, torch
from foxhunt.train import aot
path, index = sys.argv[1], int(sys.argv[2])
m = torch._C._aoti.AOTIModelPackageLoader(*aot.loader_args(path, index))
dev = torch.device("cpu" if index < 0 else f"cuda:{index}")
(y,) = m.run([torch.ones(4, 4, device=dev)])
assert float(y.sum()) == 32.0, float(y.sum())
"""


def run(
    code: list[str], env: dict[str, str] | None = None, timeout: float = 600
) -> tuple[int, str]:
    """Run a child process; its return code (negative: the signal that ended it; 124: stopped
    after `timeout` s) and the last lines of its output (and a C++ exception's message, which
    the loader prints before)."""
    try:
        p = subprocess.run(code, capture_output=True, text=True, env={**os.environ, **(env or {})},
                           timeout=timeout)  # fmt: skip
    except subprocess.TimeoutExpired:
        return 124, f"no end within {timeout:.0f} s"
    lines = (p.stdout + p.stderr).strip().splitlines()
    said = [ln for ln in lines[:-2] if ln.startswith("Error: ")][-1:]  # the C++ exception's
    return p.returncode, " | ".join(said + lines[-2:])


def outcome(rc: int, tail: str) -> str:
    if rc == 0:
        return "loads"
    if rc < 0:
        return f"CRASH (signal {-rc})"
    return f"fails (exit {rc}): {tail[:300]}"


def compiler_facts() -> dict[str, str]:
    """The compiler inductor builds with and the libstdc++ it links against."""
    from torch._inductor import cpp_builder

    facts: dict[str, str] = {}
    try:
        cxx = cpp_builder.get_cpp_compiler()
    except Exception as e:
        return {"compiler": f"none works ({e})"}
    version = subprocess.run([cxx, "--version"], capture_output=True, text=True).stdout
    facts["compiler"] = f"{cxx}: {version.splitlines()[0] if version else '?'}"
    from foxhunt.train import aot

    facts["compiler's libstdc++"] = aot.compiler_file(cxx, "libstdc++.so.6") or "none found"
    return facts


def mapped_libraries() -> list[str]:
    """The shared libraries mapped into this process (Linux)."""
    libs: list[str] = []
    with contextlib.suppress(OSError), open("/proc/self/maps") as f:
        for line in f:
            path = line.split()[-1]
            if ".so" in path and path.startswith("/") and path not in libs:
                libs.append(path)
    return libs


def process_facts() -> dict[str, str]:
    import platform

    import torch

    facts = {
        "torch": f"{torch.__version__} (CUDA {torch.version.cuda}), {Path(torch.__file__).parent}",
        "python": f"{sys.version.split()[0]} at {sys.executable}",
        "glibc": " ".join(platform.libc_ver()),
        "kernel": platform.release(),
    }
    stdcxx = [p for p in mapped_libraries() if re.search(r"/libstdc\+\+\.so", p)]
    facts["libstdc++ in this process"] = ", ".join(os.path.realpath(p) for p in stdcxx) or "none"
    for var in ("LD_LIBRARY_PATH", "LD_PRELOAD", "LANG", "LC_ALL", "CXX"):
        facts[var] = os.environ.get(var, "(unset)")
    return facts


def second_copies() -> list[str]:
    """Libraries mapped into this torch process, other than libstdc++, that define libstdc++'s
    locale symbols themselves (nm -D)."""
    import torch  # noqa: F401 - the libraries a torch process maps

    nm = shutil.which("nm")
    if nm is None:
        return ["(nm not found: not checked)"]
    found = []
    for lib in mapped_libraries():
        if "libstdc++" in lib:
            continue
        out = subprocess.run([nm, "-D", "--defined-only", lib], capture_output=True,
                             text=True).stdout  # fmt: skip
        hits = [s for s in LOCALE_SYMBOLS if re.search(rf"\s{re.escape(s)}$", out, re.M)]
        if hits:
            found.append(f"{lib}: {', '.join(hits)}")
    return found


def build(work: Path, name: str, device: str, cxx: str | None = None,
          own_runtime: bool = False) -> tuple[Path, str]:  # fmt: skip
    """Build the toy package `name` in a process of its own, on a cache of its own, with the
    compiler `cxx` (default: inductor's). Its metadata says how it is linked, as a step's
    package's does (`aot.LINK_KEY`): with its own C++ runtime where `own_runtime` (`cxx` is
    `aot.runtime_linker`'s wrapper), else inductor's default way."""
    from foxhunt.train import aot

    pkg = work / f"{name}.pt2"
    env = {"TORCHINDUCTOR_CACHE_DIR": str(work / f"cache-{name}")}
    code = BUILD
    if cxx:
        code = f"import torch._inductor.config as c; c.cpp.cxx = ({cxx!r},)\n" + BUILD
    link = aot.OWN_LINK if own_runtime else aot.DEFAULT_LINK
    rc, tail = run([sys.executable, "-c", code, str(pkg), device, aot.LINK_KEY, link], env)
    return pkg, "" if rc == 0 else outcome(rc, tail)


def load(pkg: Path, index: int, env: dict[str, str] | None = None) -> tuple[int, str]:
    return run([sys.executable, "-c", LOAD, str(pkg), str(index)], env, timeout=300)


def check(work: Path, index: int) -> tuple[Path | None, bool, int, str]:
    """The toy package built in `work` as a task builds a step's (linked with its own C++
    runtime where the compiler can) and loaded as a task loads one, on GPU `index` (-1: the
    CPU), each in a process of its own: the package (None where it did not build), whether it
    has its own runtime, the load's return code (1 where it did not build) and what became of
    it."""
    from foxhunt.train import aot

    linker = aot.runtime_linker()  # the tasks' own wrapper: their precompiled headers too
    pkg, err = build(work, "foxhunt", "cpu" if index < 0 else "cuda", linker, linker is not None)
    if err:
        return None, linker is not None, 1, f"does not build: {err}"
    rc, tail = load(pkg, index)
    return pkg, linker is not None, rc, outcome(rc, tail)


BINDING = re.compile(r"binding file (\S+) \[\d+\] to (\S+) \[\d+\]: normal symbol `([^']+)'")


def bindings_before_crash(pkg: Path, index: int, log: Path) -> list[str]:
    """The dynamic loader's last bindings of the package's symbols before the load's end
    (`symbol -> the library that defines it`), those of libstdc++'s locale and regex code
    where there are any."""
    log.parent.mkdir(parents=True, exist_ok=True)
    load(pkg, index, {"LD_DEBUG": "bindings", "LD_DEBUG_OUTPUT": str(log)})
    found: list[tuple[str, str]] = []
    for f in sorted(log.parent.glob(log.name + ".*")):
        for m in BINDING.finditer(f.read_text(errors="replace")):
            if "aotinductor" in m.group(1):
                found.append((m.group(3), m.group(2)))
    names = [sym for sym, _ in found]
    if shutil.which("c++filt") and names:
        out = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True, text=True)
        names = out.stdout.splitlines() if out.returncode == 0 else names
    lines = [f"{n[:110]} -> {'the package' if 'aotinductor' in lib else Path(lib).name}"
             for n, (_, lib) in zip(names, found, strict=False)]  # fmt: skip
    keep = [ln for ln in lines if re.search(r"locale|collate|ctype|regex|facet", ln)]
    return (keep or lines)[-12:]


def explain(work: Path, pkg: Path, rc: int, index: int, device: str) -> None:
    """The facts and variants (module docstring) for the toy `pkg`, whose load ended with `rc`."""
    from foxhunt.train import aot

    print("\nfacts:")
    facts = {**process_facts(), **compiler_facts()}
    for k, v in facts.items():
        print(f"  {k}: {v}")
    print("libraries in a torch process that define libstdc++'s locale symbols themselves:")
    for line in second_copies() or ["none"]:
        print(f"  {line}")
    default, err = build(work, "default", device)
    variants: list[tuple[str, Path | None, dict[str, str], str]] = [
        ("linked inductor's default way", None if err else default, {}, err)
    ]
    if not err:
        variants.append(("the same, in the C locale (LC_ALL=C)", default,
                         {"LC_ALL": "C", "LANG": "C"}, ""))  # fmt: skip
        lib = facts.get("compiler's libstdc++", "")
        if lib and os.path.exists(lib):
            variants.append((f"the same, LD_PRELOAD={lib}", default, {"LD_PRELOAD": lib}, ""))
    cxx = shutil.which(facts.get("compiler", "").split(":")[0])
    if cxx:
        wrapped = aot.compiler_wrapper(work / "cxx-bsymbolic", cxx, ["-Wl,-Bsymbolic"])
        built, err = build(work, "bsymbolic", device, wrapped)
        variants.append(("linked -Wl,-Bsymbolic", None if err else built, {}, err))
    clang = shutil.which("clang++")
    if clang:
        built, err = build(work, "clang", device, clang)
        variants.append((f"built with {clang}", None if err else built, {}, err))
    else:
        print("  (no clang++ here: that variant not tried)")
    print("\nthe toy otherwise:")
    for label, path, env, err in variants:
        print(f"  {label}: {err if path is None else outcome(*load(path, index, env))}")
    failing = pkg if rc != 0 else default
    print(f"\nthe dynamic loader's last bindings of {failing.stem}'s symbols (LD_DEBUG=bindings):")
    for line in bindings_before_crash(failing, index, work / "ld-debug" / "log"):
        print(f"  {line}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m foxhunt.train.aot_probe",
                                 description=__doc__.split("\n\n")[0])  # fmt: skip
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto",
                    help="the package's device (auto: the GPU, then the CPU; the CPU alone "
                    "where there is no GPU)")  # fmt: skip
    ap.add_argument("--explain", action="store_true",
                    help="the facts, and the load's variants that tell why it crashes")  # fmt: skip
    ap.add_argument("--keep", type=Path, default=None,
                    help="work in this folder, and keep it (default: a temporary one)")  # fmt: skip
    args = ap.parse_args(argv)
    import torch

    devices = [args.device]
    if args.device == "auto":
        devices = ["cuda", "cpu"] if torch.cuda.is_available() else ["cpu"]
    root = args.keep or Path(tempfile.mkdtemp(prefix="foxhunt-aot-probe-"))
    failed = 0
    try:
        for device in devices:
            work = root / device
            work.mkdir(parents=True, exist_ok=True)
            index = 0 if device == "cuda" else -1
            pkg, own, rc, said = check(work, index)
            how = ("linked with its own C++ runtime" if own else
                   "linked inductor's default way (no static libstdc++ here)")  # fmt: skip
            print(f"aot probe: torch {torch.__version__}, a toy package for {device}, {how}: "
                  f"{said}")  # fmt: skip
            failed += rc != 0
            if args.explain and pkg is not None:
                explain(work, pkg, rc, index, device)
        if failed and not args.explain:
            print("run `python -m foxhunt.train.aot_probe --explain` for why")
        return 1 if failed else 0
    finally:
        if args.keep is None:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
