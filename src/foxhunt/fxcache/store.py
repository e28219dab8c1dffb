"""The fxcache: precomputed training arrays, one directory per key, memory-mapped on open.

    <root>/<key>/features.npy     float32 [N, 42]
                 ofi.npy          float32 [N, 8]
                 targets.npy      float64 [N, 4]   open, high, low, close (back-adjusted)
                 timestamps.npy   int64   [N]      bar close, UTC nanoseconds
                 manifest.json    schema and catalogue versions, inputs, checksums, ...

The key is a digest of everything the arrays depend on (source data digests, parameters, the
feature catalogue version), so equal inputs find the same directory. A cache is written to a
temporary directory beside its final place and renamed into it: readers never see half a cache,
and when two writers race for one key the first rename wins and the second finds the key taken,
drops its copy and uses the winner's. `.npy` files open as zero-copy memory maps.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
ARRAYS = {
    "features": (np.float32, 2),
    "ofi": (np.float32, 2),
    "targets": (np.float64, 2),
    "timestamps": (np.int64, 1),
}
MANIFEST = "manifest.json"


class FxCacheError(RuntimeError):
    pass


def cache_key(inputs: dict) -> str:
    """A stable digest of the inputs (JSON-serialisable: digests, parameters, versions)."""
    blob = json.dumps({"schema": SCHEMA_VERSION, **inputs}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@dataclass
class FxCache:
    """An opened cache: arrays are read-only memory maps over the files."""

    path: Path
    manifest: dict
    features: np.ndarray
    ofi: np.ndarray
    targets: np.ndarray
    timestamps: np.ndarray

    @property
    def key(self) -> str:
        return self.path.name

    def __len__(self) -> int:
        return len(self.timestamps)

    @classmethod
    def open(cls, root: Path | str, key: str | None = None) -> FxCache:
        """Open `root/key` (or `root` itself when it is a cache directory)."""
        path = Path(root) / key if key else Path(root)
        problems = check_structure(path)
        if problems:
            raise FxCacheError(f"fxcache {path}: " + "; ".join(problems))
        manifest = json.loads((path / MANIFEST).read_text())
        arrays = {n: np.load(path / f"{n}.npy", mmap_mode="r") for n in ARRAYS}
        return cls(path=path, manifest=manifest, **arrays)


def check_structure(path: Path) -> list[str]:
    """Cheap checks (no data read): files present with the shapes and dtypes the manifest says."""
    if not (path / MANIFEST).is_file():
        return ["no manifest.json (not a cache, or an interrupted write)"]
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except json.JSONDecodeError as e:
        return [f"manifest.json is not valid JSON: {e}"]
    problems = []
    if manifest.get("schema_version") != SCHEMA_VERSION:
        problems.append(f"schema_version {manifest.get('schema_version')} != {SCHEMA_VERSION}")
    rows = manifest.get("rows")
    for name, (dtype, ndim) in ARRAYS.items():
        f = path / f"{name}.npy"
        if not f.is_file():
            problems.append(f"{name}.npy missing")
            continue
        info = manifest.get("files", {}).get(f"{name}.npy", {})
        if f.stat().st_size != info.get("bytes"):
            problems.append(
                f"{name}.npy is {f.stat().st_size} bytes, manifest says {info.get('bytes')}"
            )
            continue
        try:
            arr = np.load(f, mmap_mode="r")
        except ValueError as e:
            problems.append(f"{name}.npy unreadable: {e}")
            continue
        if arr.dtype != dtype or arr.ndim != ndim or len(arr) != rows:
            problems.append(
                f"{name}.npy has {arr.dtype}{list(arr.shape)}, "
                f"expected {np.dtype(dtype)} with {rows} rows"
            )
    return problems


def verify(path: Path) -> list[str]:
    """Full check: structure, then every file's sha256 against the manifest."""
    problems = check_structure(path)
    if problems:
        return problems
    manifest = json.loads((path / MANIFEST).read_text())
    for name, info in manifest["files"].items():
        got = _sha256(path / name)
        if got != info["sha256"]:
            problems.append(f"{name}: checksum {got[:12]}... != manifest {info['sha256'][:12]}...")
    return problems


def publish(root: Path, key: str, arrays: dict[str, np.ndarray], manifest: dict) -> Path:
    """Write a cache atomically under `root/key`; returns its path. If another writer published
    the key first, its cache is kept and this one is discarded."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    stage = root / f".{key}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    stage.mkdir()
    try:
        rows = len(arrays["timestamps"])
        files = {}
        for name, (dtype, ndim) in ARRAYS.items():
            a = np.ascontiguousarray(arrays[name], dtype=dtype)
            if a.ndim != ndim or len(a) != rows:
                raise FxCacheError(
                    f"array {name} has shape {a.shape}; expected {ndim}-D with {rows} rows"
                )
            f = stage / f"{name}.npy"
            np.save(f, a)
            files[f.name] = {
                "bytes": f.stat().st_size,
                "sha256": _sha256(f),
                "shape": list(a.shape),
            }
        full = {
            **manifest,
            "schema_version": SCHEMA_VERSION,
            "key": key,
            "rows": rows,
            "files": files,
        }
        (stage / MANIFEST).write_text(json.dumps(full, indent=2, default=str))
        for f in stage.iterdir():  # data on disk before the directory becomes visible
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
        try:
            os.rename(stage, final)
        except OSError:
            if not (final / MANIFEST).is_file():
                raise
            log.info("fxcache %s: published concurrently by another writer; using theirs", key)
            shutil.rmtree(stage, ignore_errors=True)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return final


def lookup(root: Path, key: str) -> FxCache | None:
    """The cache under `root/key` after cheap structure checks (logged as a hit), or None (a
    miss). A cache that fails the checks is moved aside, logged, and counts as a miss."""
    path = root / key
    if path.exists():
        problems = check_structure(path)
        if not problems:
            log.info("fxcache hit %s", key)
            return FxCache.open(path)
        log.warning("fxcache %s is damaged (%s); recomputing", key, "; ".join(problems))
        quarantine(path)
    log.info("fxcache miss %s", key)
    return None


def get_or_compute(
    root: Path, key: str, compute: Callable[[], tuple[dict[str, np.ndarray], dict]]
) -> tuple[FxCache, bool]:
    """(cache, hit). A hit does no work beyond cheap structure checks; a damaged cache is moved
    aside and computed again."""
    cache = lookup(root, key)
    if cache is not None:
        return cache, True
    arrays, manifest = compute()
    return FxCache.open(publish(root, key, arrays, manifest)), False


def quarantine(path: Path) -> Path:
    """Move a damaged cache out of the way (kept for inspection, ignored by lookups)."""
    dest = path.parent / f".corrupt-{path.name}-{uuid.uuid4().hex[:6]}"
    os.replace(path, dest)
    return dest


def list_caches(root: Path) -> list[dict]:
    rows = []
    if not root.is_dir():
        return rows
    for d in sorted(root.iterdir()):
        if d.name.startswith(".") or not (d / MANIFEST).is_file():
            continue
        try:
            m = json.loads((d / MANIFEST).read_text())
        except json.JSONDecodeError:
            m = {}
        rows.append(
            {
                "key": d.name,
                "symbol": m.get("symbol", "?"),
                "bar_size": m.get("bar_size", "?"),
                "start": m.get("start", "?"),
                "end": m.get("end", "?"),
                "rows": m.get("rows", 0),
                "bytes": sum(f.stat().st_size for f in d.iterdir()),
            }
        )
    return rows
