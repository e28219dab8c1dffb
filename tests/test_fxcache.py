"""fxcache store: atomic publish, zero-copy open, hit/miss, races, corruption, listing."""

from __future__ import annotations

import json
import logging
import multiprocessing as mp
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from foxhunt.fxcache import (
    FxCache,
    FxCacheError,
    cache_key,
    get_or_compute,
    list_caches,
    lookup,
    publish,
    verify,
)


def _arrays(n=1000, seed=0):
    rng = np.random.default_rng(seed)
    return {
        "features": rng.standard_normal((n, 42)).astype(np.float32),
        "ofi": rng.standard_normal((n, 8)).astype(np.float32),
        "targets": 5000 + rng.standard_normal((n, 4)),
        "timestamps": np.arange(n, dtype=np.int64) * 60_000_000_000,
    }


META = {"symbol": "ES", "bar_size": "1m", "start": "2024-01-02", "end": "2024-07-01"}


def test_key_is_stable_and_input_sensitive():
    a = cache_key({"inputs": ["x", "y"], "bar": "1m", "catalogue": 1})
    assert a == cache_key({"catalogue": 1, "bar": "1m", "inputs": ["x", "y"]})
    assert a != cache_key({"inputs": ["x", "y"], "bar": "1m", "catalogue": 2})


def test_publish_then_open_gives_read_only_memory_maps(tmp_path):
    arrs = _arrays()
    path = publish(tmp_path, "k1", arrs, META)
    c = FxCache.open(tmp_path, "k1")
    assert len(c) == 1000 and c.manifest["symbol"] == "ES" and c.key == "k1"
    for name, a in arrs.items():
        got = getattr(c, name)
        assert isinstance(got, np.memmap) and not got.flags.writeable
        np.testing.assert_array_equal(got, a)
    assert verify(path) == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


def test_bad_arrays_are_refused_and_leave_nothing(tmp_path):
    arrs = _arrays()
    arrs["ofi"] = arrs["ofi"][:10]
    with pytest.raises(FxCacheError, match="ofi"):
        publish(tmp_path, "k", arrs, META)
    assert list(tmp_path.iterdir()) == []


def test_hit_does_no_work_and_logs(tmp_path, caplog):
    caplog.set_level(logging.INFO)
    calls = []

    def compute():
        calls.append(1)
        return _arrays(), META

    _, hit = get_or_compute(tmp_path, "abc", compute)
    assert not hit and "fxcache miss abc" in caplog.text
    c, hit = get_or_compute(tmp_path, "abc", compute)
    assert hit and len(calls) == 1 and "fxcache hit abc" in caplog.text
    assert len(c) == 1000


def _race(root, key, barrier):
    barrier.wait()
    c, _ = get_or_compute(root, key, lambda: (_arrays(20_000, seed=1), META))
    return len(c)


def test_racing_writers_end_with_one_valid_cache(tmp_path):
    ctx = mp.get_context("fork")
    barrier = ctx.Manager().Barrier(4)
    with ctx.Pool(4) as pool:
        rows = pool.starmap(_race, [(tmp_path, "same", barrier)] * 4)
    assert rows == [20_000] * 4
    assert [p.name for p in tmp_path.iterdir()] == ["same"]
    assert verify(tmp_path / "same") == []


def test_corruption_is_reported_and_recomputed(tmp_path, caplog):
    path = publish(tmp_path, "k", _arrays(), META)
    f = path / "features.npy"
    data = bytearray(f.read_bytes())
    data[-5] ^= 0xFF  # same size, one flipped byte: only the checksum sees it
    f.write_bytes(bytes(data))
    problems = verify(path)
    assert problems and "features.npy: checksum mismatch" in problems[0]
    f.write_bytes(bytes(data[:-100]))  # truncated: the cheap structure check sees it
    caplog.set_level(logging.INFO)
    c, hit = get_or_compute(tmp_path, "k", lambda: (_arrays(), META))
    assert not hit and "damaged" in caplog.text and verify(c.path) == []
    with pytest.raises(FxCacheError, match="no such cache"):
        FxCache.open(tmp_path, "missing")


def test_list_caches(tmp_path):
    publish(tmp_path, "k1", _arrays(10), META)
    publish(tmp_path, "k2", _arrays(20), {**META, "symbol": "NQ"})
    rows = list_caches(tmp_path)
    assert [(r["key"], r["symbol"], r["rows"]) for r in rows] == [
        ("k1", "ES", 10),
        ("k2", "NQ", 20),
    ]
    assert all(r["bytes"] > 0 for r in rows)


@pytest.mark.slow
def test_opening_a_large_cache_is_zero_copy(tmp_path):
    """A cache of >= 1 GB raises the opening process's RSS by far less than its size."""
    n = 6_400_000  # features alone: 6.4e6 x 42 x 4 B = 1.07 GB
    big = tmp_path / "big"
    arrays = {  # in memory, not in a file beside the cache: the disk holds the cache alone
        "features": np.ones((n, 42), np.float32),
        "ofi": np.zeros((n, 8), np.float32),
        "targets": np.ones((n, 4)),
        "timestamps": np.arange(n, dtype=np.int64),
    }
    publish(big, "k", arrays, META)
    del arrays
    size = sum(f.stat().st_size for f in (big / "k").iterdir())
    assert size > 1_000_000_000
    probe = textwrap.dedent(
        f"""
        import os
        from foxhunt.fxcache import FxCache
        def rss():
            return int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        before = rss()
        c = FxCache.open({str(big)!r}, "k")
        x = float(c.features[123, 5]) + float(c.targets[-1, 3])
        print(rss() - before, x)
        """
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    grew, x = out.stdout.split()
    assert float(x) == 2.0
    assert int(grew) < 50_000_000, f"RSS grew by {int(grew):,} B for a {size:,} B cache"


def test_cli_ls_and_verify(tmp_path):
    publish(tmp_path, "k1", _arrays(10), META)
    run = [sys.executable, "-m", "foxhunt.cli", "fxcache"]
    out = subprocess.run([*run, "ls", "--root", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0 and "k1" in out.stdout and "ES" in out.stdout
    assert "10 rows" in out.stdout
    out = subprocess.run([*run, "verify", "--root", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 0 and "k1  ok" in out.stdout
    f = tmp_path / "k1" / "ofi.npy"
    data = bytearray(f.read_bytes())
    data[-1] ^= 1
    f.write_bytes(bytes(data))
    out = subprocess.run([*run, "verify", "--root", str(tmp_path)], capture_output=True, text=True)
    assert out.returncode == 1 and "DAMAGED" in out.stdout and "ofi.npy: checksum mi" in out.stdout
    # moved aside, so the next lookup is a miss and the cache is computed again
    assert not (tmp_path / "k1").exists() and list(tmp_path.glob(".corrupt-k1-*"))
    c, hit = get_or_compute(tmp_path, "k1", lambda: (_arrays(10), META))
    assert not hit and verify(c.path) == []


def test_verify_judges_only_fxcaches_and_says_when_there_is_none(tmp_path):
    """`verify --root data` must not move `data/ingested` (a directory with a manifest.json of
    another kind) aside as a damaged cache."""
    data = tmp_path / "data"
    publish(data / "fxcache", "k1", _arrays(10), META)
    (data / "ingested").mkdir()
    (data / "ingested" / "manifest.json").write_text('{"inputs": [], "settings": {}}')
    (data / "folds").mkdir()
    run = [sys.executable, "-m", "foxhunt.cli", "fxcache", "verify"]
    out = subprocess.run([*run, "--root", str(data)], capture_output=True, text=True)
    assert out.returncode == 1 and "no fxcache there" in out.stderr, out.stderr
    assert sorted(p.name for p in data.iterdir()) == ["folds", "fxcache", "ingested"]
    for args, what in (
        (["--root", str(tmp_path / "nowhere")], "no such cache root"),
        (["--root", str(data / "fxcache"), "--key", "nokey"], "no fxcache nokey"),
    ):
        out = subprocess.run([*run, *args], capture_output=True, text=True)
        assert out.returncode == 1 and what in out.stderr, out.stderr
    # --root naming one cache verifies it
    out = subprocess.run([*run, "--root", str(data / "fxcache" / "k1")], capture_output=True,
                         text=True)  # fmt: skip
    assert out.returncode == 0 and "k1  ok" in out.stdout
    assert [r["key"] for r in list_caches(data)] == []  # `data` itself holds no cache


def test_open_refuses_flipped_bytes_and_names_the_command(tmp_path):
    path = publish(tmp_path, "k", _arrays(), META)
    f = path / "targets.npy"
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x10
    f.write_bytes(bytes(data))
    with pytest.raises(FxCacheError, match=r"targets.npy: checksum mismatch.*fxcache verify"):
        FxCache.open(tmp_path, "k")
    # a lookup (precompute's hit test) reads the same checksums: a miss, moved aside
    assert lookup(tmp_path, "k") is None and not path.exists()


def test_a_manifest_without_crc32_is_checked_by_sha256(tmp_path):
    """Caches written before the CRC-32 was recorded are still verified on open."""
    path = publish(tmp_path, "k", _arrays(), META)
    m = json.loads((path / "manifest.json").read_text())
    for info in m["files"].values():
        del info["crc32"]
    (path / "manifest.json").write_text(json.dumps(m))
    FxCache.open(tmp_path, "k")
    f = path / "ofi.npy"
    data = bytearray(f.read_bytes())
    data[-3] ^= 1
    f.write_bytes(bytes(data))
    with pytest.raises(FxCacheError, match=r"ofi\.npy: checksum mismatch, sha256"):
        FxCache.open(tmp_path, "k")
