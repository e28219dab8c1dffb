"""The device sizer's search and cache (foxhunt.train.sizer), on fake memory: the GPU path
itself runs in tests/test_train_gpu.py on the device."""

from __future__ import annotations

import dataclasses
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


def test_what_the_task_holds_beside_the_step_comes_off_the_budget(tmp_path, monkeypatch):
    """1 GiB free, half of it the budget, 1 MiB a sample: 512 fits alone; beside a prediction
    graph holding 200 MiB (its peak measured once), 512 MiB does not fit the 312 MiB left and
    256 is chosen, with the smaller budget recorded."""
    # the fake measures a 'step' by what it returns: its peak in bytes
    monkeypatch.setattr(sizer, "cuda_peak", lambda device, step: step)
    monkeypatch.setattr(sizer, "cache_key", lambda device, what, config: f"gpu|{what}|{config}")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2**30, 2**31))
    cache = SizeCache(tmp_path / "sizes.json")
    per_sample = lambda n: n * 2**20  # noqa: E731
    alone = sizer.device_size("cuda", "m", {"a": 1}, per_sample, 64, 4096, cache)
    assert (alone.size, alone.budget_bytes) == (512, 2**29)
    held = []
    beside = sizer.device_size("cuda", "m", {"a": 2}, per_sample, 64, 4096, cache,
                               beside=lambda: held.append(1) or 200 * 2**20)  # fmt: skip
    assert (beside.size, beside.budget_bytes, len(held)) == (256, 2**29 - 200 * 2**20, 1)


def fake_agent_gpu(monkeypatch) -> list[int]:
    """agent_sizes on a 'GPU' whose probes are real (the agent built at the sizes and run, here
    on the CPU) but whose memory is faked: 1 MB per 64th of the defaults, 40.5 MB free (a 20 MB
    budget). Returns the list the probed scales are appended to."""
    probed: list[int] = []

    def fake_peak(device, step):
        def measure(scale):
            step(scale)  # builds and runs the agent: the sizes must make a valid agent
            probed.append(scale)
            return scale * 2**20

        return measure

    monkeypatch.setattr(sizer, "on_gpu", lambda device: True)
    monkeypatch.setattr(sizer, "cuda_peak", fake_peak)
    monkeypatch.setattr(sizer, "cache_key", lambda device, what, config: f"gpu|{what}|{config}")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (int(40.5 * 2**20), 2**31))
    return probed


def test_agent_sizes_halve_together_until_the_probe_fits_and_explicit_sizes_win(
    tmp_path, monkeypatch
):
    """agent_sizes with the CUDA calls replaced (the probes are real: a DQN built at the
    sizes, a fold reset, one collection and one learning phase, here on the CPU): 1 MB of
    'memory' per 64th of the defaults and a 20 MB budget -> 16/64 of every size left to the
    device; the cache answers the next task; a size the user set is not touched."""
    from foxhunt.train.agents.dqn import DQNConfig, RainbowAgent
    from foxhunt.train.env import EnvConfig
    from marketdata import random_market

    probed = fake_agent_gpu(monkeypatch)
    data = random_market(3000, 0)
    cfg = DQNConfig(hidden=(16, 16), head_hidden=16, collect_steps=4, learn_steps=2)
    full = cfg.resolved(data.device)  # "the GPU defaults" of this test: the CPU's
    cache = SizeCache(tmp_path / "sizes.json")
    got, chosen = sizer.agent_sizes(RainbowAgent, cfg, EnvConfig(), data, cache)
    want = {k: getattr(full, k) // 4 for k in ("envs", "batch_size", "replay_capacity")}
    assert chosen.sizes == want and chosen.fraction == "16/64" and chosen.source == "probed"
    assert {k: getattr(got, k) for k in want} == want and max(probed) > 16  # backed off
    agent = RainbowAgent(got, EnvConfig(), data, 0)  # the chosen config trains
    agent.reset_fold(0, 2000, seed=1)
    agent.collect()
    agent.learn()
    n = len(probed)
    _, cached = sizer.agent_sizes(RainbowAgent, cfg, EnvConfig(), data, cache)
    assert cached.source == "cache" and cached.sizes == want and len(probed) == n
    mine = dataclasses.replace(cfg, batch_size=32)  # the user's size wins, the rest is fitted
    got, chosen = sizer.agent_sizes(RainbowAgent, mine, EnvConfig(), data, cache)
    assert got.batch_size == 32 and "batch_size" not in chosen.sizes
    every = dataclasses.replace(cfg, envs=8, batch_size=32, replay_capacity=4096)
    assert sizer.agent_sizes(RainbowAgent, every, EnvConfig(), data, cache) == (every, None)
    monkeypatch.setattr(sizer, "on_gpu", lambda device: False)  # a CPU: its defaults apply
    assert sizer.agent_sizes(RainbowAgent, cfg, EnvConfig(), data, cache) == (cfg, None)


@pytest.mark.parametrize("model", ["dqn", "ppo"])
def test_an_agent_compiled_ahead_of_time_is_sized_by_eager_probes(model, tmp_path, monkeypatch):
    """A config set to compile ahead of time (`compile_mode="aot"`) is probed eager and
    uncompiled like any other, and keeps its mode: the probe once turned compile off and left
    the mode, which the config refuses (bench_plan --aot on an H200 stopped there, 2026-12-05)."""
    from foxhunt.train.agents import AGENTS
    from foxhunt.train.env import EnvConfig
    from marketdata import random_market

    probed = fake_agent_gpu(monkeypatch)
    config_cls, agent_cls = AGENTS[model].load()
    data = random_market(3000, 0)
    small = {"dqn": {"head_hidden": 16, "collect_steps": 4, "learn_steps": 2},
             "ppo": {"rollout_steps": 4}}[model]  # fmt: skip
    cfg = config_cls(hidden=(16, 16), compile_mode="aot", **small)
    got, chosen = sizer.agent_sizes(agent_cls, cfg, EnvConfig(), data, SizeCache(tmp_path / "s"))
    assert probed and chosen.fraction == "16/64"
    assert got.compile_mode == "aot" and got.compile is None  # the task's own mode is kept


@pytest.mark.parametrize("model", ["ppo", "pqn"])
def test_on_policy_agents_fit_their_envs(model, tmp_path, monkeypatch):
    from foxhunt.train.agents import AGENTS
    from foxhunt.train.env import EnvConfig
    from marketdata import random_market

    fake_agent_gpu(monkeypatch)
    config_cls, agent_cls = AGENTS[model].load()
    data = random_market(3000, 0)
    cfg = config_cls(hidden=(16, 16), rollout_steps=4)
    got, chosen = sizer.agent_sizes(agent_cls, cfg, EnvConfig(), data, SizeCache(tmp_path / "s"))
    assert chosen.sizes == {"envs": cfg.resolved(data.device).envs // 4}
    assert got.envs == chosen.sizes["envs"]


def test_a_wide_models_prediction_piece_shrinks_the_batch_fits_beside(
    tmp_path, monkeypatch, caplog
):
    """The supervised agent's prediction piece from the 'device' (the probes are real: TLOB's
    forward over n windows, here on the CPU; memory faked at 1 MiB a window the network sees):
    1 GiB free, PREDICT_SHARE of it -> the largest power of two within, not PREDICT_BATCH.
    The batch's probe then has MARGIN of the free memory less the piece's forward. On a
    'GPU' with a quarter of that free, the batch goes below the CPU's 256, with a warning."""
    from foxhunt.train.agents import supervised
    from foxhunt.train.agents.supervised import PREDICT_SHARE, SupervisedAgent
    from foxhunt.train.env import EnvConfig
    from foxhunt.train.models.tlob import TLOBConfig
    from marketdata import random_market

    seen: list[int] = []  # the windows of each forward the network ran

    def fake_peak(device, step):
        def measure(n):
            seen.clear()
            step(n)  # the model's forward (or its training step) at size n, for real
            return max(seen, default=0) * 2**20

        return measure

    monkeypatch.setattr(sizer, "cuda_peak", fake_peak)
    monkeypatch.setattr(sizer, "cache_key", lambda device, what, config: f"gpu|{what}|{config}")
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2**30, 2**31))
    monkeypatch.setenv("FOXHUNT_SIZE_CACHE", str(tmp_path / "sizes.json"))
    agent = SupervisedAgent(TLOBConfig(window=8, hidden=8, layers=1, batch_size=16, steps=1),
                            EnvConfig(), random_market(3000, 0), seed=0)  # fmt: skip
    assert agent.predict_batch == supervised.PREDICT_BATCH  # on a CPU: not sized
    agent.net.register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    piece = agent._device_piece()
    budget = int(2**30 * PREDICT_SHARE)  # 204.8 MiB: 128 windows fit, 256 do not
    assert (piece.size, piece.budget_bytes, piece.source) == (128, budget, "probed")
    agent.predict_batch = piece.size
    batch = agent._device_batch()  # MARGIN of 1 GiB less the piece's 128 MiB: 256 fit
    assert (batch.size, batch.budget_bytes) == (256, int(2**30 * sizer.MARGIN) - 128 * 2**20)
    again = agent._device_piece()  # the next task of this configuration: from the cache
    assert (again.size, again.source) == (128, "cache")
    assert "batch" not in caplog.text
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (2**28, 2**31))
    agent.predict_batch = 64
    small = agent._device_batch()  # MARGIN of 256 MiB less the piece's 64 MiB: 64 fit
    assert (small.size, small.source) == (64, "probed")
    assert "TLOBConfig: batch 64, the largest whose step fits in 0.1 GiB" in caplog.text
