"""Atomic publication of files and directories: nothing half-written is ever visible."""

from __future__ import annotations

import os
import shutil
import uuid
from pathlib import Path


def staging_dir(final: Path) -> Path:
    """A fresh temporary directory beside `final` (same filesystem, so rename is atomic)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = final.parent / f".{final.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    return tmp


def publish_dir(staging: Path, final: Path) -> None:
    """Replace `final` with `staging`. The old content is moved aside first and removed only
    after the new one is in place, so a crash leaves either the old or the new directory."""
    old = None
    if final.exists():
        old = final.parent / f".{final.name}.old-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        os.replace(final, old)
    os.replace(staging, final)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def write_text_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    tmp.write_text(text)
    os.replace(tmp, path)
