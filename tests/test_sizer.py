"""The device sizer's search and cache (foxhunt.train.sizer), on fake memory: the GPU path
itself runs in tests/test_train_gpu.py on the device."""

from __future__ import annotations

import json

import pytest
import torch

from foxhunt.train import sizer
from foxhunt.train.sizer import Choice, OutOfMemory, SizeCache, largest_fitting, powers_of_two


def fake_gpu(per_item: int, limit: int | None = None):
    """A step that takes `per_item` bytes a sample and runs out of memory above `limit`
    samples, recording the sizes tried."""
    tried: list[int] = []

    def measure(n: int) -> int:
        tried.append(n)
        if limit is not None and n > limit:
            raise torch.cuda.OutOfMemoryError("CUDA out of memory (fake)")
        return per_item * n

    return measure, tried


def test_powers_of_two():
    assert powers_of_two(256, 4096) == [256, 512, 1024, 2048, 4096]
    assert powers_of_two(3, 20) == [4, 8, 16]
    assert powers_of_two(300, 400) == []


def test_the_largest_size_within_the_budget_by_binary_search():
    measure, tried = fake_gpu(per_item=1000)
    sizes = powers_of_two(1, 1 << 20)  # 21 sizes
    assert largest_fitting(measure, sizes, budget=300_000) == (256, 256_000)
    assert len(tried) <= 5  # log2(21) rounded up, not a walk over every size
    assert largest_fitting(measure, sizes, budget=256_000) == (256, 256_000)  # the edge fits
    assert largest_fitting(measure, sizes, budget=255_999)[0] == 128


def test_a_size_that_runs_out_of_memory_counts_as_too_large():
    measure, tried = fake_gpu(per_item=1, limit=700)
    size, peak = largest_fitting(measure, powers_of_two(1, 4096), budget=10**9)
    assert (size, peak) == (512, 512)
    assert any(n > 700 for n in tried)  # it did try above the limit, and went on below it


def test_nothing_fits_says_so():
    measure, _ = fake_gpu(per_item=1000)
    with pytest.raises(OutOfMemory, match="not even size 256 fits"):
        largest_fitting(measure, powers_of_two(256, 4096), budget=1000)


def test_the_cache_keeps_choices_and_survives_a_damaged_file(tmp_path):
    path = tmp_path / "sub" / "sizes.json"
    cache = SizeCache(path)
    assert cache.get("k") is None  # no file yet
    cache.put("k", Choice(1024, 5, 10, "probed"), "TLOBConfig")
    assert SizeCache(path).get("k") == 1024
    assert json.loads(path.read_text())["k"]["what"] == "TLOBConfig"
    path.write_text("{ not json")
    assert SizeCache(path).get("k") is None  # damaged: probe again rather than fail


def test_the_cache_path_comes_from_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FOXHUNT_SIZE_CACHE", str(tmp_path / "x.json"))
    assert SizeCache().path == tmp_path / "x.json"


def test_device_size_probes_once_then_takes_the_cached_size(tmp_path, monkeypatch):
    """device_size with the CUDA calls replaced: 1 GB free, half of it the budget, 1 MB a
    sample -> 256 of [64, 4096]; the second call reads the cache and probes nothing."""
    measure, tried = fake_gpu(per_item=2**20)
    monkeypatch.setattr(sizer, "cuda_peak", lambda device, step: measure)
    monkeypatch.setattr(sizer, "cache_key", lambda device, what, config: f"gpu|{what}|{config}")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2**29 + 2**28, 2**31))
    cache = SizeCache(tmp_path / "sizes.json")
    first = sizer.device_size("cuda", "m", {"a": 1}, None, 64, 4096, cache)
    assert (first.size, first.source) == (256, "probed")
    assert first.budget_bytes == int((2**29 + 2**28) * sizer.MARGIN)
    n = len(tried)
    second = sizer.device_size("cuda", "m", {"a": 1}, None, 64, 4096, cache)
    assert (second.size, second.source) == (256, "cache") and len(tried) == n
    # another configuration probes again; a cached size outside [lo, hi] is not used
    assert sizer.device_size("cuda", "m", {"a": 2}, None, 64, 4096, cache).source == "probed"
    assert sizer.device_size("cuda", "m", {"a": 1}, None, 64, 128, cache).source == "probed"
