"""What code produced a result: enough to tell a retry of the same task from a new run.

`code_version()` combines the package version, the git commit an image was built from
(`FOXHUNT_GIT_COMMIT`, set by the images and by `make run`) and a digest of the package's own
source files, which changes with any local edit even where there is no commit to name.
"""

from __future__ import annotations

import datetime as dt
import functools
import hashlib
import os
import uuid
from pathlib import Path

from foxhunt import __version__

PACKAGE = Path(__file__).resolve().parent


@functools.cache
def source_digest() -> str:
    """sha256 over the package's .py files (their paths and bytes), 16 hex digits."""
    h = hashlib.sha256()
    for p in sorted(PACKAGE.rglob("*.py")):
        h.update(str(p.relative_to(PACKAGE)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def code_version() -> str:
    commit = os.environ.get("FOXHUNT_GIT_COMMIT", "")[:12]
    return f"{__version__}+{commit or 'nocommit'}+src.{source_digest()}"


def new_run_id() -> str:
    """An id for a run started from the command line: sortable by time, unique."""
    return f"{dt.datetime.now(dt.UTC):%Y%m%d-%H%M%S}-{uuid.uuid4().hex[:6]}"
