"""Safe publication of outputs: nothing half-written is ever visible, nothing foxhunt did not
write is ever replaced, and what a killed run left behind is cleaned by the next one.

Temporary files and directories are hidden siblings of their final path, named after their
owner so that a later run can tell whether that owner is still alive:

    .<name>.tmp-h<host>-<pid>-<random>     being written (a staging directory or a file)
    .<name>.old-h<host>-<pid>-<random>     the previous output, moved aside during a swap

`<host>` is a short digest of the host name (a pod's name in Kubernetes). On the same host a
process that no longer exists owns nothing; an entry of another host (another pod on a shared
volume) counts as abandoned once nothing in it has changed for `STALE_AFTER_S`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import re
import shutil
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

from foxhunt.errors import StepError

log = logging.getLogger(__name__)

# Another host's temporary entry is abandoned when nothing in it changed for this long. Writers
# touch their staging continuously (every Parquet part, every cache array), so an hour of
# silence is already a dead writer; six leave a wide margin.
STALE_AFTER_S = 6 * 3600

HOST = hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]
_TEMP = re.compile(
    r"^\.(?P<name>.+)\.(?P<kind>tmp|old)-(?:h(?P<host>[0-9a-f]{8})-)?(?P<pid>\d+)"
    r"(?:-(?P<tag>[0-9a-f]{8}))?$"
)


class OutputError(StepError):
    """An output path that cannot be written without destroying something; says which."""


def _owner_tag() -> str:
    return f"h{HOST}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def temp_path(final: Path, kind: str = "tmp") -> Path:
    """A hidden sibling of `final` for writing it (same filesystem, so rename is atomic)."""
    return final.parent / f".{final.name}.{kind}-{_owner_tag()}"


def staging_dir(final: Path) -> Path:
    """A fresh temporary directory beside `final`, after removing what dead runs left there."""
    final.parent.mkdir(parents=True, exist_ok=True)
    clean_stale(final.parent)
    tmp = temp_path(final)
    tmp.mkdir()
    return tmp


def publish_dir(staging: Path, final: Path) -> None:
    """Replace `final` with `staging`. The old content is moved aside first and removed only
    after the new one is in place, so a crash leaves either the old or the new directory (and a
    crash between the two renames leaves the old one aside, which `clean_stale` puts back)."""
    old = None
    if final.exists():
        old = temp_path(final, "old")
        os.replace(final, old)
    os.replace(staging, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path(path)
    tmp.write_text(text)
    os.replace(tmp, path)


def json_text(doc) -> str:
    """Strict JSON (RFC 8259) of a step's output: a value that is not a finite number (a profit
    factor with no losing bar, a ratio of two zeros) is written as null, never as the bare
    Infinity or NaN that Python's json writes and other readers refuse. Paths, dates and the
    like are written as strings."""
    return json.dumps(_finite(doc), indent=2, allow_nan=False, default=str)


def _finite(x):
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {k: _finite(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [_finite(v) for v in x]
    return x


def write_json_atomic(path: Path, doc) -> None:
    write_text_atomic(path, json_text(doc))


# ------------------------------------------------------------------------- what may be replaced
def check_output_dir(
    out: Path, *, what: str, owned: Callable[[Path], bool], inputs: Iterable[Path] = ()
) -> None:
    """Raise `OutputError` unless publishing a new directory at `out` is safe: `out` does not
    exist, is an empty directory, or is a directory `what` wrote (`owned(out)`); and it neither
    is, holds nor lies inside any of `inputs`."""
    here = out.resolve()
    for inp in inputs:
        there = Path(inp).resolve()
        if here == there or here in there.parents:
            raise OutputError(
                f"output {out} holds the input {inp}: replacing it would delete the input. "
                "Choose an output directory outside the input."
            )
        if there in here.parents:
            raise OutputError(
                f"output {out} lies inside the input directory {inp}: outputs and inputs must "
                "not mix. Choose an output directory outside the input."
            )
    if not out.exists() and not out.is_symlink():
        return
    if not out.is_dir():
        raise OutputError(
            f"output {out} exists and is not a directory; {what} replaces only a directory it "
            "wrote itself. Choose another output path or move the file."
        )
    if not any(out.iterdir()) or owned(out):
        return
    raise OutputError(
        f"output {out} exists and was not written by {what} (no manifest of {what} in it); "
        f"{what} replaces only its own output. Choose another output directory, or empty or "
        f"remove {out} yourself."
    )


def manifest_has(path: Path, keys: Iterable[str]) -> bool:
    """True when `path` is a JSON object holding every one of `keys`."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(doc, dict) and all(k in doc for k in keys)


# ------------------------------------------------------------------------------ stale entries
def _alive(host: str | None, pid: int) -> bool | None:
    """Whether the owner runs: True/False on this host, None when it is another host's."""
    if host != HOST:
        return None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _newest_mtime(path: Path) -> float:
    newest = path.lstat().st_mtime
    if path.is_dir() and not path.is_symlink():
        for root, dirs, files in os.walk(path):
            for n in dirs + files:
                try:
                    newest = max(newest, os.lstat(os.path.join(root, n)).st_mtime)
                except OSError:
                    continue
    return newest


def clean_stale(parent: Path) -> list[Path]:
    """Remove the temporary entries of dead owners in `parent`; an `.old-` directory whose
    final path is missing (a crash mid-swap) is renamed back instead. Returns what it removed."""
    removed = []
    try:
        entries = list(os.scandir(parent))
    except OSError:
        return removed
    now = time.time()
    for e in entries:
        m = _TEMP.match(e.name)
        if m is None:
            continue
        path = Path(e.path)
        alive = _alive(m["host"], int(m["pid"]))
        if alive or (alive is None and now - _newest_mtime(path) < STALE_AFTER_S):
            continue
        final = parent / m["name"]
        if m["kind"] == "old" and not final.exists():
            os.replace(path, final)
            log.warning("%s: restored from %s, left by a run that died mid-swap", final, e.name)
            continue
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        log.info("removed %s, left by a run that no longer runs", path)
        removed.append(path)
    return removed
