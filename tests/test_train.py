"""`foxhunt train` on the demo set: determinism, resume, learning, tracking, checkpoints."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from foxhunt.cli import main
from foxhunt.fxcache import FxCache
from foxhunt.train import DQNConfig, EnvConfig, TrainConfig, demo, run_train, train_seeds
from foxhunt.train.core import (
    ResumeWriter,
    TrainError,
    capture_logged,
    process_age,
    resume_writer,
)
from foxhunt.train.evaluate import VAL_PASSES
from foxhunt.train.policy import Policy
from foxhunt.train.tracking import MlflowLogger, NullLogger
from trainruns import (
    EpochRecorder,
    Killed,
    load_normaliser,
    metrics_of,
    served_and_trained_orders,
    spy_training,
)

TINY = DQNConfig(
    hidden=(32, 32), head_hidden=16, envs=16, collect_steps=8, learn_steps=4, batch_size=64,
    replay_capacity=4096,
)  # fmt: skip


def tiny_cfg(demo, out: Path, **kw) -> TrainConfig:
    cache, folds = demo
    base = dict(
        folds=folds, cache=cache, epochs=3, out=out, tracking="none", eval_segments=64, dqn=TINY,
        env=EnvConfig(episode_bars=256), run_id="run-1", baselines=False,
    )  # fmt: skip
    return TrainConfig(**(base | kw))


def test_same_seed_same_metrics_and_another_seed_differs(demo_es, tmp_path):
    a = run_train(tiny_cfg(demo_es, tmp_path / "a", fold_ids=(0,)), NullLogger())
    b = run_train(tiny_cfg(demo_es, tmp_path / "b", fold_ids=(0,)), NullLogger())
    c = run_train(tiny_cfg(demo_es, tmp_path / "c", fold_ids=(0,), seed=1), NullLogger())
    assert metrics_of(a) == metrics_of(b)
    assert metrics_of(a) != metrics_of(c)


@pytest.mark.skipif(process_age() is None, reason="needs Linux's /proc")
def test_process_age_counts_from_the_processs_start():
    """process_age in a fresh interpreter that sleeps 0.6 s first: at least that, and no more
    than the parent's own clock saw from before the child's start to its answer."""
    code = ("import time; time.sleep(0.6); from foxhunt.train.core import process_age; "
            "print(process_age())")  # fmt: skip
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    wall = time.monotonic() - t0
    age = float(out.stdout)
    assert 0.6 <= age <= wall + 0.05  # /proc counts in ticks of 10 ms


def test_compiling_and_capturing_a_tasks_steps_is_logged_with_its_time(caplog):
    """On a GPU a task compiles and captures its steps before its first epoch (a minute or more
    on a cold compile cache): the log says so before the capture and how long it took after."""
    for compiles, first, done in ((True, "compiling and capturing the training steps (minutes",
                                   "compiled and captured"),
                                  (False, "capturing the training steps", "captured")):  # fmt: skip
        seen: list[int] = []  # the log's records when the capture ran
        cfg = types.SimpleNamespace(compile=compiles)
        agent = types.SimpleNamespace(cfg=cfg, capture=lambda s=seen: s.append(len(caplog.records)))
        caplog.clear()
        with caplog.at_level("INFO", logger="foxhunt.train.core"):
            capture_logged(agent)
        lines = [r.getMessage() for r in caplog.records]
        assert seen == [1] and len(lines) == 2, (seen, lines)  # captured once, between the lines
        assert lines[0].startswith(first), lines
        assert re.fullmatch(rf"training steps {done} in \d+\.\d s", lines[1]), lines


def test_the_task_logs_when_its_first_epoch_begins(demo_es, tmp_path, caplog):
    """`time/task_start_s`, the process's age as the first epoch this call trains begins, is
    logged once (not again at the second fold), with the progress line."""
    logged = []

    class Starts(NullLogger):
        def log_metrics(self, metrics, step=None):
            if "time/task_start_s" in metrics:
                logged.append((metrics["time/task_start_s"], step))

    before = process_age()
    with caplog.at_level("INFO", logger="foxhunt.train.core"):
        run_train(tiny_cfg(demo_es, tmp_path, epochs=1), Starts())
    after = process_age()
    if before is None:  # no /proc: nothing to log
        assert logged == []
        return
    ((age, step),) = logged
    assert before <= age <= after and step == 0
    assert f"first epoch begins {age:.1f} s after the process started" in caplog.text


NOISY_DENSE = dataclasses.replace(TINY, noisy=True, epsilon=0.0, dense_inputs=True)
"""The GPU defaults' exploration and inputs at tiny sizes: a block's noise drawn at its start."""


@pytest.mark.parametrize("dqn", [TINY, NOISY_DENSE], ids=["epsilon", "noisy-dense"])
def test_killed_mid_fold_then_resumed_ends_like_an_uninterrupted_run(demo_es, tmp_path, dqn):
    """The resumed run's results, and every epoch it trains (its losses, collection statistics
    and val metrics), are the uninterrupted run's. The results alone miss a resume that draws
    otherwise: with the agent's generator left unrestored they still agreed (the tiny agents'
    greedy policies hardly move), while the next epoch's statistics did not."""
    full_log = EpochRecorder()
    full = run_train(tiny_cfg(demo_es, tmp_path / "full", dqn=dqn), full_log)
    assert len(full.folds) == 2

    def kill(fold, epoch):
        if (fold, epoch) == (0, 1):
            raise Killed

    cfg = tiny_cfg(demo_es, tmp_path / "killed", dqn=dqn)
    with pytest.raises(Killed):
        run_train(cfg, NullLogger(), on_epoch_end=kill)
    log = EpochRecorder()
    resumed = run_train(cfg, log)
    assert resumed.resumed
    assert metrics_of(resumed) == metrics_of(full)
    assert sorted(log.epochs) == [(0, 2), (1, 0), (1, 1), (1, 2)]
    assert all(s["eval/val_passes"] in range(1, VAL_PASSES + 1) for s in full_log.epochs.values())
    for key, stats in log.epochs.items():
        assert stats == full_log.epochs[key], key
    # A finished run resumes to its results at once; another config starts afresh.
    again = run_train(cfg, NullLogger())
    assert again.resumed and metrics_of(again) == metrics_of(full)
    other = run_train(dataclasses.replace(cfg, epochs=2), NullLogger())
    assert not other.resumed


def test_a_task_compiled_ahead_of_time_resumes_and_retries_from_the_cache(demo_es, tmp_path):
    """`foxhunt train` with the DQN's steps compiled ahead of time (compile_mode="aot"; the
    evaluation's step too): killed mid-fold and resumed, it ends with the uninterrupted run's
    results, and the runs after the first build nothing (the packages in the compile cache
    are loaded as they are)."""
    dqn = dataclasses.replace(TINY, compile=True, compile_mode="aot")
    kw = dict(dqn=dqn, compile_cache=tmp_path / "cc", fold_ids=(0,))
    full = run_train(tiny_cfg(demo_es, tmp_path / "full", **kw), NullLogger())
    # Its checkpoint serves as any other's: eager and uncompiled, ahead of time or not.
    policy = Policy.load(next((tmp_path / "full").rglob("best.safetensors")))
    assert (policy.cfg.compile, policy.cfg.compile_mode) == (False, "default")
    assert policy.cfg.resolved(torch.device("cpu")).compile is False  # a config that holds
    # A package built again replaces the file (temporary name, then rename): a new inode. Its
    # modification time moves at each load (aot.mark_used).
    packages = {p: p.stat().st_ino for p in (tmp_path / "cc").rglob("*.pt2")}
    assert sorted(p.name.split("-")[1] for p in packages) == ["RainbowAgent.greedy", "collect",
                                                              "learn"]  # fmt: skip

    def kill(fold, epoch):
        if (fold, epoch) == (0, 1):
            raise Killed

    cfg = tiny_cfg(demo_es, tmp_path / "killed", **kw)
    with pytest.raises(Killed):
        run_train(cfg, NullLogger(), on_epoch_end=kill)
    resumed = run_train(cfg, NullLogger())
    assert resumed.resumed
    assert metrics_of(resumed) == metrics_of(full)
    assert {p: p.stat().st_ino for p in (tmp_path / "cc").rglob("*.pt2")} == packages


class _SlowToPickle:
    """Pickles after `delay` seconds (as a large state's write takes time)."""

    def __init__(self, delay: float):
        self.delay = delay

    def __reduce__(self):
        time.sleep(self.delay)
        return (dict, ())


def test_resume_files_are_written_beside_training_in_order_and_land_before_an_error_escapes(
    tmp_path,
):
    path = tmp_path / "resume.pt"
    w = ResumeWriter()
    t0 = time.perf_counter()
    w.save({"epoch": 0, "slow": _SlowToPickle(0.5)}, path)
    assert time.perf_counter() - t0 < 0.25  # handed over: the write goes on beside training
    w.save({"epoch": 1}, path)  # waits for the first: one write at a time, in order
    w.wait()
    assert torch.load(path)["epoch"] == 1
    assert [p.name for p in tmp_path.iterdir()] == ["resume.pt"]  # no temporary file left
    # A failed write is raised in the training thread, at the next save or wait.
    w.save({"epoch": 2}, tmp_path / "no-such-dir" / "resume.pt")
    with pytest.raises(RuntimeError, match="no-such-dir does not exist"):
        w.wait()
    # Leaving the block, by an error too, waits for the last write; the error wins.
    with pytest.raises(Killed), resume_writer() as w:
        w.save({"epoch": 3, "slow": _SlowToPickle(0.3)}, path)
        raise Killed
    assert torch.load(path, weights_only=False)["epoch"] == 3  # (the slow object: a dict)


def test_early_stopping_ends_a_fold_after_patience_epochs_without_a_better_val(
    demo_es, tmp_path, monkeypatch
):
    """With patience 2 and val Sharpe ratios 1, 3, 2, 2.5, 4, ... the fold trains epochs 0-3
    and stops (epoch 1 was the best, 2 and 3 did not improve on it), the best epoch is tested;
    a task killed at epoch 2 and resumed stops at the same place."""
    from foxhunt.train import core

    real = core.trading_metrics
    script = [1.0, 3.0, 2.0, 2.5, 4.0, 5.0, 6.0, 7.0]

    def scripted(r, tr, ppy, positions=None):
        m = real(r, tr, ppy, positions)
        if positions is not None and len(r) == scripted.val_bars and scripted.n < len(script):
            m["sharpe"] = script[scripted.n]
            scripted.n += 1
        return m

    monkeypatch.setattr(core, "trading_metrics", scripted)
    folds = json.loads(demo_es[1].read_text())["folds"]
    scripted.val_bars = folds[0]["val_end"] - folds[0]["val_start"] - 1
    epochs = []

    def count(fold, epoch):
        epochs.append(epoch)

    cfg = tiny_cfg(demo_es, tmp_path / "a", epochs=8, patience=2, fold_ids=(0,))
    scripted.n = 0
    res = run_train(cfg, NullLogger(), on_epoch_end=count)
    assert epochs == [0, 1, 2, 3] and res.folds[0]["best_epoch"] == 1
    # results and MLflow's steps count epochs from 0; the printed lines count from 1, as the
    # progress lines do ("epoch 2/8 ... best 3.00 @ 2")
    assert "best epoch   2  " in res.summary()

    def kill(fold, epoch):
        if epoch == 2:
            raise Killed

    cfg = tiny_cfg(demo_es, tmp_path / "b", epochs=8, patience=2, fold_ids=(0,))
    scripted.n = 0
    with pytest.raises(Killed):
        run_train(cfg, NullLogger(), on_epoch_end=kill)
    epochs.clear()
    resumed = run_train(cfg, NullLogger(), on_epoch_end=count)
    assert resumed.resumed and epochs == [3] and resumed.folds[0]["best_epoch"] == 1


def test_seeds_side_by_side_train_as_their_own_tasks(demo_es, tmp_path):
    """--seeds 0 1 in one process: each seed's results (every fold's best epoch, val, test and
    random-policy metrics), run directory and checkpoints are those of its own task."""
    both = train_seeds(tiny_cfg(demo_es, tmp_path / "both", seeds=(0, 1)))
    for seed, res in zip((0, 1), both, strict=True):
        alone = run_train(tiny_cfg(demo_es, tmp_path / f"alone{seed}", seed=seed), NullLogger())
        assert metrics_of(res) == metrics_of(alone), seed
        assert res.run_dir.name == alone.run_dir.name  # same seed, same config digest
        assert (res.run_dir / "results.json").exists()
        assert (res.run_dir / "fold-1" / "best.safetensors").exists()
    assert metrics_of(both[0]) != metrics_of(both[1])


def test_seeds_side_by_side_walk_a_fold_s_deterministic_baselines_once(
    demo_es, tmp_path, monkeypatch
):
    """--seeds 0 1 with the baselines on: each seed's baselines are those of its own task (the
    random policy's its seed's own), and the deterministic ones are walked once a fold."""
    from foxhunt.train import baselines

    walked = []
    walk = baselines._deterministic_baselines

    def counted(evaluator, data, ranges, periods):
        walked.append(ranges["val"])
        return walk(evaluator, data, ranges, periods)

    monkeypatch.setattr(baselines, "_deterministic_baselines", counted)
    kw = dict(baselines=True, fold_ids=(1,), epochs=1)
    both = train_seeds(tiny_cfg(demo_es, tmp_path / "both", seeds=(0, 1), **kw))
    assert len(walked) == 1
    for seed, res in zip((0, 1), both, strict=True):
        alone = run_train(tiny_cfg(demo_es, tmp_path / f"alone{seed}", seed=seed, **kw),
                          NullLogger())  # fmt: skip
        assert res.folds[0]["baselines"] == alone.folds[0]["baselines"], seed
    assert len(walked) == 3  # each task alone walks its own
    rnd = [r.folds[0]["baselines"]["random"] for r in both]
    assert rnd[0] != rnd[1]
    ridge = [r.folds[0]["baselines"]["ridge"] for r in both]
    assert ridge[0] == ridge[1] and ridge[0]["val"] is not ridge[1]["val"]  # a copy each


def test_seeds_killed_together_resume_to_the_uninterrupted_results(demo_es, tmp_path):
    """Seeds side by side, killed mid-fold (one seed's epoch done, the other's not), resume to
    what the uninterrupted run gives; one seed trained with patience stops early and waits for
    the other at the next fold."""
    full = train_seeds(tiny_cfg(demo_es, tmp_path / "full", seeds=(0, 1)))
    calls = []

    def kill(fold, epoch):
        calls.append((fold, epoch))
        if len(calls) == 3:  # seed 0's epoch 1 of fold 0 is saved, seed 1's is not
            raise Killed

    cfg = tiny_cfg(demo_es, tmp_path / "killed", seeds=(0, 1))
    with pytest.raises(Killed):
        train_seeds(cfg, on_epoch_end=kill)
    resumed = train_seeds(cfg)
    assert [r.resumed for r in resumed] == [True, True]
    assert [metrics_of(r) for r in resumed] == [metrics_of(r) for r in full]
    early = train_seeds(tiny_cfg(demo_es, tmp_path / "early", seeds=(0, 1), epochs=6, patience=1))
    for seed, res in zip((0, 1), early, strict=True):
        alone = run_train(tiny_cfg(demo_es, tmp_path / f"e{seed}", seed=seed, epochs=6,
                                   patience=1), NullLogger())  # fmt: skip
        assert metrics_of(res) == metrics_of(alone), seed


def test_stacked_seeds_train_as_their_own_tasks(demo_es, tmp_path, monkeypatch):
    """--seeds 0 1 11 with the DQN agents stacked into one (stack_seeds on; the default on a
    GPU): at one thread each seed's results equal its own task's, bit for bit, also through
    the epochs where a seed has stopped early (patience) and the others train on their own
    (the first fold, where two do at once)."""
    kinds, _ = spy_training(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        kw = dict(stack_seeds="on", epochs=4, patience=2, fold_ids=(0,))
        # Seeds whose val figures stop one of them early and leave two training on their own
        # (which seeds do depends on the val figures: with the forecast column seed 0 stops
        # after its third epoch, 1 and 11 train all four, as of the twelve seeds 0-11 only
        # 1 and 11 did).
        both = train_seeds(tiny_cfg(demo_es, tmp_path / "both", seeds=(0, 1, 11), **kw))
        # both paths were taken, the second with two agents at once
        assert {("StackedRainbow", 1), ("RainbowAgent", 2)} <= set(kinds), kinds
        for seed, res in zip((0, 1, 11), both, strict=True):
            alone = run_train(tiny_cfg(demo_es, tmp_path / f"alone{seed}", seed=seed, **kw),
                              NullLogger())  # fmt: skip
            assert metrics_of(res) == metrics_of(alone), seed
    finally:
        torch.set_num_threads(threads)


def test_stacked_seeds_resumed_apart_meet_and_train_to_the_uninterrupted_results(
    demo_es, tmp_path, monkeypatch
):  # fmt: skip
    """Stacked seeds killed when seed 0's first epoch was saved and seed 1's was not: run
    again, the task stacks their agents, seed 1 trains its first epoch alone (a lone agent
    over its rows of the stack's buffers) while seed 0 waits, and the two then train stacked;
    each ends with the metrics of the uninterrupted run, bit for bit at one thread.
    (tests/test_train_gpu.py runs the same on a GPU, compiled.)"""
    kinds, stacks = spy_training(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        kw = dict(seeds=(0, 1), stack_seeds="on", epochs=2, fold_ids=(0,))
        full = train_seeds(tiny_cfg(demo_es, tmp_path / "full", **kw))
        cfg = tiny_cfg(demo_es, tmp_path / "killed", **kw)

        def kill(fold, epoch):
            raise Killed  # at the first epoch's end: seed 0's is saved, seed 1's is not

        with pytest.raises(Killed):
            train_seeds(cfg, on_epoch_end=kill)
        kinds.clear()
        stacks.clear()
        resumed = train_seeds(cfg)
        assert stacks == [2] and kinds == [("RainbowAgent", 1), ("StackedRainbow", 1)], kinds
        assert [r.resumed for r in resumed] == [True, False]
        assert [metrics_of(r) for r in resumed] == [metrics_of(r) for r in full]
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("per_env", [True, False], ids=["per-env", "shared"])
def test_stacked_noisy_seeds_train_as_their_own_tasks(demo_es, tmp_path, monkeypatch, per_env):
    """Noisy nets (noise drawn per env while collecting, or a block's shared samples) stack
    too: --seeds 1 2 stacked, each seed's results through `foxhunt train` (its evaluation,
    checkpoints, resume files) equal its own task's, bit for bit at one thread."""
    kinds, _ = spy_training(monkeypatch)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        noisy = dataclasses.replace(TINY, noisy=True, epsilon=0.0, noise_per_env=per_env)
        kw = dict(stack_seeds="on", epochs=2, fold_ids=(0,), dqn=noisy)
        both = train_seeds(tiny_cfg(demo_es, tmp_path / "both", seeds=(1, 2), **kw))
        assert {k for k, _ in kinds} == {"StackedRainbow"}, kinds  # stacked, not side by side
        for seed, res in zip((1, 2), both, strict=True):
            alone = run_train(tiny_cfg(demo_es, tmp_path / f"alone{seed}", seed=seed, **kw),
                              NullLogger())  # fmt: skip
            assert metrics_of(res) == metrics_of(alone), seed
        assert metrics_of(both[0]) != metrics_of(both[1])
    finally:
        torch.set_num_threads(threads)


def test_seeds_are_refused_where_they_cannot_train_as_alone(demo_es, tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="supervised model"):
        TrainConfig(model="tlob", seeds=(0, 1))
    with pytest.raises(ValueError, match="distinct non-negative"):
        TrainConfig(seeds=(1, 1))
    with pytest.raises(ValueError, match="at most 10"):
        TrainConfig(seeds=tuple(range(11)))
    with pytest.raises(ValueError, match="gpus > 1"):
        TrainConfig(seeds=(0, 1), gpus=2)
    with pytest.raises(TrainError, match="train_seeds"):
        run_train(tiny_cfg(demo_es, tmp_path, seeds=(0, 1)), NullLogger())
    monkeypatch.setenv("WORLD_SIZE", "2")  # as torchrun starts a rank
    with pytest.raises(TrainError, match="under torchrun"):
        train_seeds(tiny_cfg(demo_es, tmp_path, seeds=(0, 1)))


def test_a_new_run_trains_afresh_and_only_a_retry_resumes(demo_es, tmp_path, monkeypatch):
    """Results are keyed by the run, not by the configuration alone: a second run with the
    same parameters but changed code computes new numbers under new MLflow runs."""
    import mlflow

    from foxhunt.train import core

    cfg = tiny_cfg(demo_es, tmp_path / "runs", epochs=1, fold_ids=(0,))
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    first = run_train(cfg, MlflowLogger("x", tracking_uri=uri))
    retry = run_train(cfg, MlflowLogger("x", tracking_uri=uri))
    assert retry.resumed and metrics_of(retry) == metrics_of(first)

    # The code changes (a metric computed differently), then a new pipeline run.
    real = core.trading_metrics
    monkeypatch.setattr(core, "trading_metrics", lambda *a: real(*a) | {"sharpe": 123.0})
    monkeypatch.setattr(core, "code_version", lambda: "changed")
    second = run_train(
        dataclasses.replace(cfg, run_id="run-2"), MlflowLogger("x", tracking_uri=uri)
    )
    assert not second.resumed and second.run_dir != first.run_dir
    assert [f["test"]["sharpe"] for f in second.folds] == [123.0]
    assert [f["test"]["sharpe"] for f in first.folds] != [123.0]
    # A retry of the first run under the changed code does not resume its files either.
    assert not run_train(cfg, NullLogger()).resumed

    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("x").experiment_id])
    tasks = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert sorted(t.data.tags["foxhunt_run_id"] for t in tasks) == ["run-1", "run-2"]
    for t in tasks:
        kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == t.info.run_id]
        assert len(kids) == 1  # the fold's run, in each run


def test_resume_file_of_another_trainer_layout_starts_afresh(demo_es, tmp_path, caplog):
    """A mid-fold resume file whose agent state does not fit (written by an older version:
    other keys or shapes) is set aside with a warning, not restored and not a crash."""

    def kill(fold, epoch):
        if (fold, epoch) == (0, 0):
            raise Killed

    cfg = tiny_cfg(demo_es, tmp_path / "old", fold_ids=(0,), epochs=2)
    with pytest.raises(Killed):
        run_train(cfg, NullLogger(), on_epoch_end=kill)
    (resume,) = (tmp_path / "old").glob("*/*/resume.pt")
    state = torch.load(resume, weights_only=False)
    state["agent"] = {k.replace("opt.", "opt.0."): v for k, v in state["agent"].items()}
    torch.save(state, resume)
    res = run_train(cfg, NullLogger())
    assert not res.resumed
    assert "written by another trainer" in caplog.text
    fresh = run_train(tiny_cfg(demo_es, tmp_path / "new", fold_ids=(0,), epochs=2), NullLogger())
    assert metrics_of(res) == metrics_of(fresh)


def test_the_forecast_column_resumes_mid_fold_and_serves_as_in_training(demo_es, tmp_path):
    """An agent that sees the ridge forecast (EnvConfig.forecast): killed mid-fold, it resumes
    to the uninterrupted run's results (the column is scored again from the restored fit); its
    checkpoint, served by `Policy`, orders what the trainer's policy orders; and the column
    moves the results."""
    from foxhunt.train.agents.dqn import RainbowAgent

    env = EnvConfig(episode_bars=256, forecast=True)
    full = run_train(tiny_cfg(demo_es, tmp_path / "full", env=env, fold_ids=(0,)), NullLogger())
    off = EnvConfig(episode_bars=256, forecast=False)
    plain = run_train(tiny_cfg(demo_es, tmp_path / "plain", env=off, fold_ids=(0,)), NullLogger())
    assert metrics_of(plain) != metrics_of(full)

    def kill(fold, epoch):
        if (fold, epoch) == (0, 1):
            raise Killed

    cfg = tiny_cfg(demo_es, tmp_path / "killed", env=env, fold_ids=(0,))
    with pytest.raises(Killed):
        run_train(cfg, NullLogger(), on_epoch_end=kill)
    resumed = run_train(cfg, NullLogger())
    assert resumed.resumed and metrics_of(resumed) == metrics_of(full)
    ckpt = full.run_dir / "fold-0" / "best.safetensors"
    got, want = served_and_trained_orders(
        demo_es, ckpt, lambda data: RainbowAgent(TINY, env, data, seed=0), lo=1000, n=400
    )
    assert (got == want).all() and len({tuple(r) for r in want.tolist()}) > 1


@pytest.mark.parametrize("val_passes", [None, 1])
def test_best_checkpoint_reproduces_the_val_and_test_metrics(
    demo_es, tmp_path, monkeypatch, val_passes
):
    """The fold's reported val and test metrics are the checkpoint's, evaluated exactly; also
    where the epochs' validation was cut to one pass (val_passes 1: the pieces start flat, as
    the cap on VAL_PASSES leaves a policy with its own clock), so that the choice of the epoch
    was made on a near-exact value."""
    from safetensors.torch import load_file

    from foxhunt.train import core
    from foxhunt.train.agents.dqn import RainbowAgent
    from foxhunt.train.data import MarketData
    from foxhunt.train.evaluate import Evaluator
    from foxhunt.train.metrics import periods_per_year, trading_metrics

    exact = []
    if val_passes is not None:
        monkeypatch.setattr(core, "VAL_PASSES", val_passes)
        run = Evaluator.run

        def spy(self, *a, **kw):
            out = run(self, *a, **kw)
            if kw.get("max_passes") is not None:
                exact.append(self.last_exact)
            return out

        monkeypatch.setattr(Evaluator, "run", spy)
    cfg = tiny_cfg(demo_es, tmp_path, fold_ids=(1,))
    res = run_train(cfg, NullLogger())
    assert val_passes is None or max(exact) < 1.0  # the cap bound at every epoch, the best too
    ckpt = res.run_dir / "fold-1" / "best.safetensors"
    meta = json.loads(ckpt.with_suffix(".json").read_text())
    assert meta["epoch"] == res.folds[0]["best_epoch"]
    tensors = load_file(str(ckpt))
    cache = FxCache.open(demo_es[0], json.loads(demo_es[1].read_text())["fxcache_key"])
    data = MarketData.from_fxcache(cache, torch.device("cpu"))
    agent = RainbowAgent(
        TINY, cfg.env, data, seed=123
    )  # other init: the weights must come from disk
    agent.net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
    load_normaliser(data, tensors)
    agent.z.copy_(tensors["support.z"])
    fold = next(f for f in json.loads(demo_es[1].read_text())["folds"] if f["fold"] == 1)
    ev = Evaluator(cfg.env, data, cfg.eval_segments)
    for part in ("val", "test"):
        r, tr = ev.run(
            lambda t, p: agent.act(agent.state(t, p), noise=False),
            fold[f"{part}_start"], fold[f"{part}_end"],
        )  # fmt: skip
        got = trading_metrics(r, tr, periods_per_year(cache.timestamps), ev.last_positions)
        assert got == {k: v for k, v in res.folds[0][part].items() if k != "exact"}
    assert res.folds[0]["val"]["exact"] == 1.0
    # The normaliser is the train range's.
    x = data.mkt[fold["train_start"] : fold["train_end"]].double()
    torch.testing.assert_close(data.mean.double(), x.mean(0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("model", ["dqn", "ppo", "pqn"])
def test_it_learns_the_planted_signal(demo_es, tmp_path, model):
    """Each model at its CPU-sized demo settings (foxhunt.train.demo, what `make run` trains) on
    the demo set, with the env's default costs (0.35 bp per unit traded by market orders): the
    greedy policy must beat a random one and zero on val (its best epoch) and on test (never
    seen in training or selection). docs/performance.md has the figures over seeds beside the
    baselines'; this is seed 0, on the second fold alone, to keep the suite within CI's time
    (bench/bench_learning.py trains both folds over seeds)."""
    cfg = tiny_cfg(
        demo_es, tmp_path, model=model, epochs=demo.epochs(model), eval_segments=demo.EVAL_SEGMENTS,
        env=demo.ENV, dqn=demo.DQN, ppo=demo.PPO, pqn=demo.PQN,
        fold_ids=(1,),
    )  # fmt: skip
    assert cfg.env.fee_bps > 0 and cfg.env.half_spread_bps > 0
    res = run_train(cfg, NullLogger())
    a = res.aggregate
    print(res.summary())
    assert a["val_sharpe"] > 4.0, a
    assert a["val_sharpe"] > a["random_val_sharpe"] + 10.0, a
    assert a["test_sharpe"] > 3.0, a


def test_each_fold_reports_the_baselines_beside_the_agent(demo_es, tmp_path):
    """Flat earns exactly 0, buy and hold what the market did; every baseline has val and test
    metrics from the same evaluator, and the aggregate says how the agent compares."""
    from foxhunt.train.baselines import NAMES

    res = run_train(tiny_cfg(demo_es, tmp_path, epochs=1, baselines=True), NullLogger())
    for f in res.folds:
        assert set(f["baselines"]) == set(NAMES)
        assert f["baselines"]["flat"]["test"]["sharpe"] == 0.0
        assert f["baselines"]["buy_and_hold"]["test"]["long"] == 1.0
        assert f["baselines"]["ridge"]["test"]["bars"] == f["test"]["bars"]
    agg = res.aggregate["baselines_test_sharpe"]
    assert agg["ridge"] == pytest.approx(
        sum(f["baselines"]["ridge"]["test"]["sharpe"] for f in res.folds) / len(res.folds)
    )
    assert "baselines, test Sharpe: flat 0.00" in res.summary()


def test_mlflow_layout(demo_es, tmp_path):
    mlflow = pytest.importorskip("mlflow")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    logger = MlflowLogger("foxhunt-test", tracking_uri=uri)
    cfg = tiny_cfg(demo_es, tmp_path / "runs", epochs=2)
    res = run_train(cfg, logger)
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("foxhunt-test")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    parent = parents[0]
    assert parent.data.tags["fxcache_key"] == json.loads(demo_es[1].read_text())["fxcache_key"]
    assert parent.data.tags["model"] == "dqn" and parent.data.tags["symbol"] == "ES"
    assert parent.data.params["dqn.batch_size"] == "64"
    assert parent.data.metrics["eval/mean_test_sharpe"] == pytest.approx(
        res.aggregate["test_sharpe"]
    )
    for child in children:
        assert child.data.tags["mlflow.parentRunId"] == parent.info.run_id
        hist = client.get_metric_history(child.info.run_id, "losses/loss")
        assert sorted(m.step for m in hist) == [0, 1]
        for key in ("eval/val_sharpe", "eval/val_max_drawdown", "time/learn_s", "time/collect_s",
                    "time/eval_s", "charts/collect_turnover", "eval/test_sharpe"):  # fmt: skip
            assert key in child.data.metrics, key
        arts = [a.path for a in client.list_artifacts(child.info.run_id, "checkpoint")]
        assert "checkpoint/best.safetensors" in arts and "checkpoint/best.json" in arts
    # What tells runs apart in the compare view, names a person can read, who ran what, and
    # the fxcache as the runs' dataset; the experiment opens in the classic view.
    assert parent.info.run_name == "ES dqn seed0" and parent.data.tags["mlflow.user"]
    assert parent.data.tags["mlflow.source.name"] == "foxhunt train"
    assert parent.data.tags["foxhunt_run_id"] == "run-1" and parent.data.tags["code_version"]
    assert exp.tags["mlflow.experimentKind"] == "custom_model_development"
    doc = json.loads(demo_es[1].read_text())
    for child in children:
        p = child.data.params
        f = next(x for x in doc["folds"] if x["fold"] == int(p["fold.id"]))
        assert child.info.run_name == f"ES dqn seed0 fold{f['fold']} {f['periods']['test'][0][:7]}"
        assert p["fold.test"].startswith(f["periods"]["test"][0][:7])
        assert p["fold.train_bars"] == f"[{f['train_start']}, {f['train_end']})"
        for key in ("train.model", "train.seed", "dqn.lr", "dqn.gamma", "env.fee_bps",
                    "dqn.batch_size", "dqn.envs"):  # fmt: skip
            assert p[key] == parent.data.params[key], key
    for run in (parent, *children):
        (inp,) = client.get_run(run.info.run_id).inputs.dataset_inputs
        assert inp.dataset.digest == doc["fxcache_key"][:36]
        assert inp.dataset.name.startswith("fxcache ES 1m ")


def test_a_task_that_loses_the_race_to_create_the_experiment_uses_it(tmp_path, monkeypatch):
    """Two tasks on a new store: both look for the experiment and find none; the other
    creates it first. This one uses it instead of failing."""
    mlflow = pytest.importorskip("mlflow")
    from foxhunt.train.tracking import client_and_experiment

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    other = mlflow.MlflowClient(uri).create_experiment("foxhunt")
    real, looked = mlflow.MlflowClient.get_experiment_by_name, []

    def before_the_other_created_it(self, name):
        looked.append(name)
        return None if len(looked) == 1 else real(self, name)

    monkeypatch.setattr(mlflow.MlflowClient, "get_experiment_by_name", before_the_other_created_it)
    assert client_and_experiment("foxhunt", uri)[1] == other
    assert len(looked) == 2


def test_a_task_that_loses_the_dataset_race_logs_its_dataset(tmp_path, monkeypatch):
    """Two tasks side by side (the pipeline's seeds) log the same fxcache dataset at once;
    MLflow's store checks for it and then inserts it, so the loser's insert breaks the unique
    constraint. Played here against a real store: the other task's insert lands between this
    task's check and its insert. The task logs its dataset all the same, and the store keeps
    one dataset for both runs."""
    mlflow = pytest.importorskip("mlflow")
    from mlflow.store.tracking.dbmodels.models import SqlDataset
    from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    a, b = MlflowLogger("race", tracking_uri=uri), MlflowLogger("race", tracking_uri=uri)
    d = {"name": "fxcache ES 1m", "digest": "0" * 36, "source": {}, "schema": {},
         "profile": {}}  # fmt: skip
    run_a, run_b = a.start_task("a", {}, {}), b.start_task("b", {}, {})
    real, raced = SqlAlchemyStore._log_inputs_impl, []

    def lose_the_race(self, experiment_id, run_id, *args, **kwargs):
        if raced:
            return real(self, experiment_id, run_id, *args, **kwargs)
        raced.append(run_id)
        real(self, experiment_id, run_a, *args, **kwargs)  # the other task, first
        with self.ManagedSessionMaker() as session:  # this task's insert, after its check
            session.add(SqlDataset(dataset_uuid="f" * 32, experiment_id=int(experiment_id),
                                   name=d["name"], digest=d["digest"],
                                   dataset_source_type="fxcache", dataset_source="{}"))  # fmt: skip

    monkeypatch.setattr(SqlAlchemyStore, "_log_inputs_impl", lose_the_race)
    b._log_dataset(run_b, d)
    assert raced == [run_b]
    client = mlflow.MlflowClient(uri)
    for run in (run_a, run_b):
        (inp,) = client.get_run(run).inputs.dataset_inputs
        assert inp.dataset.digest == d["digest"]
    with SqlAlchemyStore(uri, str(tmp_path / "artifacts")).ManagedSessionMaker() as session:
        assert session.query(SqlDataset).count() == 1


def test_runs_end_killed_on_sigterm_and_failed_on_an_error(demo_es, tmp_path):
    """SIGTERM (Kubernetes stopping the pod) mid-training: the CLI exits 143 and the task's
    MLflow runs end KILLED; a task that fails ends its runs FAILED. None stays RUNNING."""
    import os
    import signal
    import time

    import mlflow

    cache, folds = demo_es
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cmd = [sys.executable, "-m", "foxhunt.cli", "train", "--folds", str(folds), "--cache",
           str(cache), "--epochs", "500", "--out", str(tmp_path / "runs"), "--run-id", "r",
           "--dqn.envs", "8", "--dqn.collect-steps", "4", "--dqn.learn-steps", "2",
           "--dqn.batch-size", "16", "--dqn.hidden", "16", "--dqn.replay-capacity", "256",
           "--eval-segments", "4"]  # fmt: skip
    env = os.environ | {"MLFLOW_TRACKING_URI": uri}
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.time() + 120
    while not list((tmp_path / "runs").glob("r/*/resume.pt")) and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 143, out[-2000:]
    client = mlflow.MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("foxhunt").experiment_id])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"KILLED"}, runs
    (note,) = (tmp_path / "runs" / "r").glob("*/failed.json")
    assert "Terminated" in note.read_text()

    diverging = dataclasses.replace(TINY, lr=1e30, noisy=False)
    cfg = tiny_cfg(demo_es, tmp_path / "runs2", epochs=1, dqn=diverging)
    with pytest.raises(TrainError):
        run_train(cfg, MlflowLogger("failing", tracking_uri=uri))
    runs = client.search_runs([client.get_experiment_by_name("failing").experiment_id])
    assert len(runs) == 2 and {r.info.status for r in runs} == {"FAILED"}


def test_training_imports_without_polars_mlflow_kfp_or_talib(demo_es, tmp_path):
    """The GPU image has torch, numpy, pyarrow and safetensors only: the folds step and
    training run there (bench/bench_plan.py runs both)."""
    code = f"""
import sys
for m in ("polars", "mlflow", "kfp", "talib", "databento", "databento_dbn", "tyro", "rich"):
    sys.modules[m] = None
from pathlib import Path
from foxhunt.folds import FoldsConfig, run_folds
run_folds(FoldsConfig(cache=Path({str(demo_es[0])!r}), symbol="ES",
                      out=Path({str(tmp_path / "folds.json")!r})))
from foxhunt.train import TrainConfig, DQNConfig, run_train
from foxhunt.train.tracking import NullLogger
cfg = TrainConfig(folds=Path({str(demo_es[1])!r}), cache=Path({str(demo_es[0])!r}), epochs=1,
    fold_ids=(0,), out=Path({str(tmp_path)!r}), tracking="none", eval_segments=4,
    dqn=DQNConfig(hidden=(16,), head_hidden=8, envs=4, collect_steps=4, learn_steps=1,
                  batch_size=8, replay_capacity=64))
print(run_train(cfg, NullLogger()).aggregate["val_sharpe"])
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-2000:]


def test_cli_train_and_its_errors(demo_es, tmp_path, capsys):
    cache, folds = demo_es
    rc = main([
        "train", "--folds", str(folds), "--cache", str(cache), "--epochs", "1", "--fold-ids", "0",
        "--out", str(tmp_path), "--tracking", "none", "--dqn.envs", "8",
        "--dqn.collect-steps", "4", "--dqn.learn-steps", "2", "--dqn.batch-size", "16",
        "--dqn.hidden", "16", "16", "--dqn.replay-capacity", "256",
    ])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0 and "fold  0" in out and "test Sharpe" in out
    assert main(["train", "--folds", str(tmp_path / "nope.json")]) == 1
    assert "nope.json: no such folds file" in capsys.readouterr().err
    with pytest.raises(ValueError, match="epochs = 0"):
        TrainConfig(folds=folds, cache=cache, epochs=0, tracking="none")


def test_resume_file_from_another_tracking_store_starts_new_runs(demo_es, tmp_path):
    pytest.importorskip("mlflow")
    cfg = tiny_cfg(demo_es, tmp_path / "runs", epochs=1, fold_ids=(0,))
    a = run_train(cfg, MlflowLogger("x", tracking_uri=f"sqlite:///{tmp_path / 'a.db'}"))
    # Same run directory (finished resume file), another store: its run ids do not exist there.
    b = run_train(cfg, MlflowLogger("x", tracking_uri=f"sqlite:///{tmp_path / 'b.db'}"))
    assert b.resumed and metrics_of(a) == metrics_of(b)


def test_each_fold_s_best_checkpoint_is_an_mlflow_model_that_acts_as_in_training(demo_es, tmp_path):
    """Loaded back from MLflow (by the fold's model URI and from the Model Registry), the
    model gives the same greedy actions as the trainer's own evaluation of that checkpoint."""
    import mlflow
    import pandas as pd
    from safetensors.torch import load_file

    from foxhunt.train.agents.dqn import RainbowAgent
    from foxhunt.train.data import MarketData
    from foxhunt.train.env import PORTFOLIO

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    cfg = tiny_cfg(demo_es, tmp_path / "runs", epochs=2)
    res = run_train(cfg, MlflowLogger("models", tracking_uri=uri))
    cache = FxCache.open(demo_es[0], json.loads(demo_es[1].read_text())["fxcache_key"])
    data = MarketData.from_fxcache(cache, torch.device("cpu"))
    agent = RainbowAgent(TINY, cfg.env, data, seed=5)
    rng = np.random.default_rng(0)
    t = torch.arange(256)  # consecutive bars from the first: the memory's seed in training
    port = torch.as_tensor(rng.normal(0, 0.5, (256, 3)), dtype=torch.float32)
    frame = pd.DataFrame(data.mkt[t].numpy(), columns=data.names)
    frame[list(PORTFOLIO)] = port.numpy()
    mlflow.set_tracking_uri(uri)
    for f in res.folds:
        tensors = load_file(str(res.run_dir / f"fold-{f['fold']}" / "best.safetensors"))
        agent.net.load_state_dict({k[4:]: v for k, v in tensors.items() if k.startswith("net.")})
        load_normaliser(data, tensors)
        agent.z.copy_(tensors["support.z"])  # the fold's derived C51 support
        want = agent.act(agent.state(t, port), noise=False).numpy()
        got = mlflow.pyfunc.load_model(f["model_uri"]).predict(frame)
        assert list(got.columns) == ["direction", "size", "order_type"]
        # stored as code (MLflow's models from code), not as a pickled object
        files = {
            p.name for p in Path(mlflow.artifacts.download_artifacts(f["model_uri"])).iterdir()
        }
        assert "mlflow_entry.py" in files and not any(n.endswith(".pkl") for n in files), files
        assert got.to_dict("list") == Policy.describe(want)
    # The task's best fold (by val Sharpe) is registered, its version tagged with its metrics.
    client = mlflow.MlflowClient(uri)
    (mv,) = client.search_model_versions("name='foxhunt-ES-dqn'")
    best = max(res.folds, key=lambda f: f["val"]["sharpe"])
    assert mv.tags["fold"] == str(best["fold"]) and float(mv.tags["val_sharpe"]) == pytest.approx(
        best["val"]["sharpe"]
    )
    registered = mlflow.pyfunc.load_model(f"models:/foxhunt-ES-dqn/{mv.version}")
    assert registered.predict(frame).equals(
        mlflow.pyfunc.load_model(best["model_uri"]).predict(frame)
    )


def test_evaluation_is_compiled_by_default_for_the_rl_models():
    """compile_eval left at None: on for the RL models (where the agent's own steps are
    compiled, on a GPU), off for the supervised ones; what is set wins. The resolved value is
    part of the task's config digest."""
    for model in ("dqn", "ppo", "pqn"):
        assert TrainConfig(model=model).resolved_compile_eval() is True
        assert TrainConfig(model=model, compile_eval=False).resolved_compile_eval() is False
    assert TrainConfig(model="tlob").resolved_compile_eval() is False
    assert TrainConfig(model="tlob", compile_eval=True).resolved_compile_eval() is True
    doc = {"fxcache_key": "k", "folds": []}
    assert TrainConfig(compile_eval=True).digest(doc) != TrainConfig(compile_eval=False).digest(doc)


def test_the_compile_cache_goes_where_the_config_says(tmp_path, monkeypatch):
    """compile_cache points inductor's and Triton's caches below a folder per torch version
    (a cold and a warm start through it: bench/bench_compile_cache.py); it does not change
    what the task computes (not in the config digest)."""
    import torch

    from foxhunt.train.core import use_compile_cache

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("FOXHUNT_SIZE_CACHE", raising=False)
    path = use_compile_cache(tmp_path / "cc")
    assert path == tmp_path / "cc" / f"torch-{torch.__version__}" and path.is_dir()
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(path)
    assert os.environ["TRITON_CACHE_DIR"] == str(path / "triton")
    assert os.environ["FOXHUNT_SIZE_CACHE"] == str(tmp_path / "cc" / "sizes.json")  # beside
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    assert cache_dir() == str(path)
    doc = {"fxcache_key": "k", "folds": []}
    a = TrainConfig(compile_cache=tmp_path / "a").digest(doc)
    assert a == TrainConfig(compile_cache=None).digest(doc)
