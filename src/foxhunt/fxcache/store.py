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

Opening a cache checks every file against the CRC-32 its manifest records (one read at ~1 GB/s,
cheap beside a training task), so flipped bytes are refused before anything trains on them;
`foxhunt fxcache verify` checks the SHA-256 digests as well. A directory is judged as a cache
only when its manifest is an fxcache manifest: nothing else under a root is ever touched.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import uuid
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from foxhunt.errors import StepError
from foxhunt.fsutil import json_text, staging_dir

log = logging.getLogger(__name__)

SCHEMA_VERSION = 1
ARRAYS = {
    "features": (np.float32, 2),
    "ofi": (np.float32, 2),
    "targets": (np.float64, 2),
    "timestamps": (np.int64, 1),
}
MANIFEST = "manifest.json"
# Keys every fxcache manifest has (and an ingest manifest or any other JSON does not).
MANIFEST_KEYS = ("schema_version", "key", "rows", "files")


class FxCacheError(StepError):
    pass


def cache_key(inputs: dict) -> str:
    """A stable digest of the inputs (JSON-serialisable: digests, parameters, versions)."""
    blob = json.dumps({"schema": SCHEMA_VERSION, **inputs}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def _digests(path: Path, sha256: bool = True) -> dict[str, str]:
    """CRC-32 (and SHA-256) of a file, in one pass."""
    crc, sha = 0, hashlib.sha256() if sha256 else None
    buf = bytearray(1 << 22)
    with open(path, "rb", buffering=0) as f, memoryview(buf) as view:
        while k := f.readinto(buf):
            crc = zlib.crc32(view[:k], crc)
            if sha is not None:
                sha.update(view[:k])
    out = {"crc32": f"{crc:08x}"}
    if sha is not None:
        out["sha256"] = sha.hexdigest()
    return out


def read_manifest(path: Path) -> dict | None:
    """The fxcache manifest of directory `path`, or None when `path` is not an fxcache."""
    try:
        m = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(m, dict) or not all(k in m for k in MANIFEST_KEYS):
        return None
    return m


def is_fxcache(path: Path) -> bool:
    return path.is_dir() and read_manifest(path) is not None


def verify_hint(path: Path) -> str:
    return (
        f"run `foxhunt fxcache verify --root {path.parent} --key {path.name}` (it moves a damaged "
        "cache aside; the next precompute computes it again)"
    )


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
    def open(cls, root: Path | str, key: str | None = None, check: bool = True) -> FxCache:
        """Open `root/key` (or `root` itself when it is a cache directory). With `check`, every
        file is read once against its manifest checksum: a damaged cache is refused."""
        path = Path(root) / key if key else Path(root)
        if not path.is_dir():
            raise FxCacheError(f"fxcache {path}: no such cache (`foxhunt fxcache ls` lists them)")
        problems = check_structure(path)
        if not problems and check:
            problems = check_checksums(path, full=False)
        if problems:
            problems_text = "; ".join(problems)
            raise FxCacheError(f"fxcache {path} is damaged: {problems_text}; {verify_hint(path)}")
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
    if read_manifest(path) is None:
        return [f"manifest.json is not an fxcache manifest (it lacks {', '.join(MANIFEST_KEYS)})"]
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


def check_checksums(path: Path, full: bool) -> list[str]:
    """Every file against its manifest checksums: the CRC-32 (the SHA-256 too when `full`, or
    when the manifest predates the CRC-32)."""
    problems = []
    for name, info in read_manifest(path)["files"].items():
        want = {k: info[k] for k in ("crc32", "sha256") if k in info}
        if not full and "crc32" in want:
            want.pop("sha256", None)
        got = _digests(path / name, sha256="sha256" in want)
        for k, v in want.items():
            if got[k] != v:
                problems.append(
                    f"{name}: checksum mismatch, {k} {got[k][:12]} != manifest {v[:12]} (bytes "
                    "changed)"
                )
    return problems


def verify(path: Path) -> list[str]:
    """Full check: structure, then every file's CRC-32 and SHA-256 against the manifest."""
    return check_structure(path) or check_checksums(path, full=True)


def publish(root: Path, key: str, arrays: dict[str, np.ndarray], manifest: dict) -> Path:
    """Write a cache atomically under `root/key`; returns its path. If another writer published
    the key first, its cache is kept and this one is discarded."""
    final = root / key
    stage = staging_dir(final)  # also removes what killed writers left under root
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
            files[f.name] = {"bytes": f.stat().st_size, **_digests(f), "shape": list(a.shape)}
        full = {
            **manifest,
            "schema_version": SCHEMA_VERSION,
            "key": key,
            "rows": rows,
            "files": files,
        }
        (stage / MANIFEST).write_text(json_text(full))
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
    """The cache under `root/key` after its structure and checksum checks (logged as a hit), or
    None (a miss). A cache that fails them is moved aside, logged, and counts as a miss."""
    path = root / key
    if path.exists():
        problems = check_structure(path) or check_checksums(path, full=False)
        if not problems:
            log.info("fxcache hit %s", key)
            return FxCache.open(path, check=False)
        log.warning("fxcache %s is damaged (%s); recomputing", key, "; ".join(problems))
        quarantine(path)
    log.info("fxcache miss %s", key)
    return None


def get_or_compute(
    root: Path, key: str, compute: Callable[[], tuple[dict[str, np.ndarray], dict]]
) -> tuple[FxCache, bool]:
    """(cache, hit). A hit does no work beyond the structure and checksum checks; a damaged
    cache is moved aside and computed again."""
    cache = lookup(root, key)
    if cache is not None:
        return cache, True
    arrays, manifest = compute()
    return FxCache.open(publish(root, key, arrays, manifest), check=False), False


def quarantine(path: Path) -> Path:
    """Move a damaged cache out of the way (kept for inspection, ignored by lookups)."""
    dest = path.parent / f".corrupt-{path.name}-{uuid.uuid4().hex[:6]}"
    os.replace(path, dest)
    return dest


def list_caches(root: Path) -> list[dict]:
    """One row per fxcache under `root` (or `root` itself when it is one); other directories and
    files are not caches and are left out."""
    if not root.is_dir():
        return []
    dirs = [root] if is_fxcache(root) else sorted(d for d in root.iterdir() if d.is_dir())
    rows = []
    for d in dirs:
        if d.name.startswith(".") or (m := read_manifest(d)) is None:
            continue
        rows.append(
            {
                "key": d.name,
                "path": d,
                "symbol": m.get("symbol", "?"),
                "bar_size": m.get("bar_size", "?"),
                "start": m.get("start", "?"),
                "end": m.get("end", "?"),
                "rows": m.get("rows", 0),
                "bytes": sum(f.stat().st_size for f in d.iterdir()),
            }
        )
    return rows
