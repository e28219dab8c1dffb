"""The ahead-of-time loader's probe (foxhunt.train.aot_probe), and the link foxhunt.train.aot
gives its packages (`aot.OWN_RUNTIME`). A failure of the kind the probe was written for is made
here: a library carrying its own copy of libstdc++'s locale code, opened into the global scope,
takes the locale references of a package linked inductor's default way, which then fails in
its constructor; preloading the system's libstdc++ mends that one, and a package linked with
its own C++ runtime, as foxhunt links them, is not touched by it."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

from foxhunt.train import aot, aot_probe

DUP = r"""
#include <locale>
#include <string>
extern "C" int dup_transform() {
    const auto& c = std::use_facet<std::collate<char>>(std::locale::classic());
    std::string s = "ab";
    return (int)c.transform(s.data(), s.data() + 2).size();
}
"""


def second_stdcxx(folder) -> str:
    """A shared library linked with libstdc++ static: its locale symbols are its own, exported."""
    if not shutil.which("g++"):
        pytest.skip("no g++")
    src, lib = folder / "dup.cpp", folder / "libdup.so"
    src.write_text(DUP)
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", "-static-libstdc++", "-o", str(lib),
                    str(src)], check=True)  # fmt: skip
    return str(lib)


def system_stdcxx() -> str:
    return aot_probe.compiler_facts()["compiler's libstdc++"]


def test_the_toy_package_loads_here_and_the_loaders_bindings_are_read(toy_packages, tmp_path):
    pkg = toy_packages["default"]
    assert aot_probe.load(pkg, -1) == (0, "")
    lines = aot_probe.bindings_before_crash(pkg, -1, tmp_path / "ld" / "log")
    assert lines and all(" -> " in ln for ln in lines)
    assert any(ln.endswith("-> the package") for ln in lines)  # its own regex code
    assert any("std::locale" in ln and "libstdc++.so" in ln for ln in lines)


def test_a_second_copy_of_libstdcxx_in_the_global_scope_is_found_and_breaks_the_load(
        toy_packages, tmp_path, monkeypatch):  # fmt: skip
    """A library with its own locale code, opened into the global scope after torch (as torch
    opens its CUDA libraries), takes the package's references to the symbols it defines; the
    rest go to the system's libstdc++, and the two copies' locale ids disagree. A package
    linked as foxhunt links them (its own C++ runtime) is not touched."""
    pkg = toy_packages["default"]
    dup = second_stdcxx(tmp_path)
    opened = f"import ctypes, os; ctypes.CDLL({dup!r}, mode=os.RTLD_NOW | os.RTLD_GLOBAL)\n"
    code = "from foxhunt.train import aot_probe; print(aot_probe.second_copies())"
    found = subprocess.run([sys.executable, "-c", "import torch\n" + opened + code],
                           capture_output=True, text=True, check=True).stdout  # fmt: skip
    assert "libdup.so" in found and "_ZNSt7collateIcE2idE" in found
    clean = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout  # fmt: skip
    assert "libdup.so" not in clean

    monkeypatch.setattr(aot_probe, "LOAD", "import torch\n" + opened + aot_probe.LOAD)
    rc, tail = aot_probe.load(pkg, -1)
    assert rc != 0 and ("bad_cast" in tail or rc < 0), (rc, tail)
    assert aot_probe.load(pkg, -1, {"LD_PRELOAD": system_stdcxx()}) == (0, "")

    own = toy_packages["own"]
    assert aot_probe.load(own, -1) == (0, ""), "linked as foxhunt links packages, it loads"


def test_a_load_that_crashes_is_reported_not_suffered(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        aot_probe, "build", lambda work, name, device, cxx=None, own_runtime=False: (work / "x", "")
    )
    monkeypatch.setattr(
        aot_probe, "LOAD", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    )
    assert aot_probe.main(["--device", "cpu", "--keep", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert "CRASH (signal 11)" in out and "--explain" in out


def test_a_link_flag_wrapper_adds_its_flags_to_shared_links_only(tmp_path):
    log = tmp_path / "args"
    fake = tmp_path / "fake" / "g++"
    fake.parent.mkdir()
    fake.write_text(f'#!/bin/sh\necho "$*" >> {log}\n')
    fake.chmod(0o755)
    w = aot.compiler_wrapper(tmp_path / "w", str(fake), ["-Wl,-Bsymbolic"])
    assert w.endswith("/g++")  # inductor picks its flags by the compiler's name
    subprocess.run([w, "-c", "a.cpp", "-o", "a.o"], check=True)
    subprocess.run([w, "a.o", "-shared", "-o", "a.so"], check=True)
    assert log.read_text().splitlines() == ["-c a.cpp -o a.o", "a.o -shared -o a.so -Wl,-Bsymbolic"]


def test_packages_are_linked_the_default_way_where_no_static_libstdcxx_is_there(
    tmp_path, monkeypatch
):
    """Only g++ with a static libstdc++ (what `g++ -print-file-name=libstdc++.a` finds) links
    a package with its own runtime: clang++, or a g++ that finds no archive (it prints the bare
    name back), leaves inductor's link as it is."""
    from torch._inductor import cpp_builder

    fake = tmp_path / "bin" / "g++"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\necho "${1#-print-file-name=}"\n')
    fake.chmod(0o755)
    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", lambda: str(fake))
    assert aot.runtime_linker(tmp_path) is None
    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", lambda: "/usr/bin/clang++")
    assert aot.runtime_linker(tmp_path) is None
    if shutil.which("g++"):
        monkeypatch.setattr(cpp_builder, "get_cpp_compiler", lambda: "g++")
        w = aot.runtime_linker(tmp_path)
        assert w and w.endswith("/g++") and "-static-libstdc++" in open(w).read()


@pytest.mark.skipif(not shutil.which("g++"), reason="needs g++")
def test_every_compile_cache_on_a_machine_builds_with_one_wrapper(tmp_path, monkeypatch):
    """The wrapper's path keys the headers inductor precompiles, so it is the machine's, not
    a compile cache's: builds into two caches, and the loader's toy check, share them."""
    from torch._inductor import cpp_builder

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", lambda: "g++")
    seen = []
    for cache in ("a", "b"):
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / cache))
        seen.append(aot.runtime_linker())
    assert seen[0] == seen[1] and seen[0].startswith(str(aot.wrapper_home()))
    assert not seen[0].startswith(str(tmp_path))
    toy = []
    monkeypatch.setattr(
        aot_probe,
        "build",
        lambda work, name, device, cxx=None, own_runtime=False: (
            toy.append((cxx, own_runtime)) or (work, "no")
        ),
    )
    aot_probe.check(tmp_path / "toy", -1)
    assert toy == [(seen[0], True)]  # recorded as linked with its own runtime


def test_a_child_that_does_not_end_is_stopped_and_said_so():
    rc, said = aot_probe.run([sys.executable, "-c", "import time; time.sleep(30)"], timeout=1)
    assert (rc, said) == (124, "no end within 1 s")
    assert aot_probe.outcome(rc, said) == "fails (exit 124): no end within 1 s"
