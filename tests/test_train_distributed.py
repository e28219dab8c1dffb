"""Data-parallel training on CPU processes with gloo, started through torchrun as on a GPU node
(`foxhunt train --gpus 2`): the ranks' weights stay identical (checked by the job itself at
each fold's end), rank 0 alone writes results and checkpoints while every rank keeps its own
resume file, and two ranks at batch B/2 train a supervised model as one process at batch B."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from foxhunt.train import EnvConfig, TrainConfig, run_train
from foxhunt.train.models.cfc import CfCConfig
from foxhunt.train.tracking import NullLogger


def torchrun_train(demo, out, *args) -> subprocess.CompletedProcess:
    cache, folds = demo
    cmd = [sys.executable, "-m", "foxhunt", "train", "--gpus", "2", "--device", "cpu",
           "--folds", str(folds), "--cache", str(cache), "--out", str(out), "--run-id", "ddp",
           "--tracking", "none", "--no-baselines", "--eval-segments", "16", *args]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return p


def test_two_dqn_ranks_keep_identical_weights_and_rank_0_alone_writes(demo_es, tmp_path):
    """The job checks at each fold's end that the ranks' weights are the same bit for bit
    (distributed.check_same fails the job otherwise), over two folds."""
    p = torchrun_train(demo_es, tmp_path, "--model", "dqn", "--epochs", "2", "--dqn.envs",
                       "64", "--dqn.collect-steps", "8", "--dqn.learn-steps", "8",
                       "--dqn.batch-size", "64", "--dqn.replay-capacity", "4096",
                       "--dqn.hidden", "64", "64", "--fold-ids", "0", "1")  # fmt: skip
    assert p.stdout.count("mean over 2 fold(s)") == 1  # rank 0 alone prints the summary
    (run,) = (tmp_path / "ddp").iterdir()
    assert (run / "results.json").is_file() and (run / "fold-1" / "best.safetensors").is_file()
    # Each rank keeps its own resume file and the one before it (core.read_resume says why).
    assert sorted(x.name for x in run.glob("resume*.pt")) == [
        "resume-rank1.prev.pt",
        "resume-rank1.pt",
        "resume.prev.pt",
        "resume.pt",
    ]
    doc = json.loads((run / "results.json").read_text())
    assert [f["fold"] for f in doc["folds"]] == [0, 1]


def test_two_ppo_ranks_keep_identical_weights(demo_es, tmp_path):
    """PPO's update averages its gradients over the ranks as the DQN's does (the job's own
    check at the fold's end would fail it otherwise)."""
    torchrun_train(demo_es, tmp_path, "--model", "ppo", "--epochs", "1", "--fold-ids", "0",
                   "--ppo.envs", "32", "--ppo.rollout-steps", "8", "--ppo.rounds", "2",
                   "--ppo.hidden", "32", "32")  # fmt: skip
    (run,) = (tmp_path / "ddp").iterdir()
    assert json.loads((run / "results.json").read_text())["model"] == "ppo"


def test_two_ranks_at_half_the_batch_train_as_one_process_at_the_whole(demo_es, tmp_path):
    cache, folds = demo_es
    sizes = ["--cfc.window", "16", "--cfc.units", "16", "--cfc.backbone-units", "32",
             "--cfc.horizon", "5", "--cfc.steps", "6"]  # fmt: skip
    torchrun_train(demo_es, tmp_path / "two", "--model", "cfc", "--epochs", "2",
                   "--fold-ids", "0", "--cfc.batch-size", "32", *sizes)  # fmt: skip
    cfc = CfCConfig(window=16, units=16, backbone_units=32, horizon=5, steps=6, batch_size=64)
    one = run_train(TrainConfig(
        folds=folds, cache=cache, out=tmp_path / "one", run_id="one", model="cfc", epochs=2,
        device="cpu", tracking="none", baselines=False, fold_ids=(0,), eval_segments=16,
        cfc=cfc, env=EnvConfig(),
    ), NullLogger())  # fmt: skip
    (two,) = (tmp_path / "two" / "ddp").iterdir()
    w2 = load_file(str(two / "fold-0" / "best.safetensors"))
    w1 = load_file(str(one.run_dir / "fold-0" / "best.safetensors"))
    assert w1.keys() == w2.keys()
    for k in w1:
        torch.testing.assert_close(w2[k], w1[k], rtol=1e-4, atol=1e-5, msg=k)
    v2 = json.loads((two / "results.json").read_text())["folds"][0]["val"]
    assert v2["accuracy"] == pytest.approx(one.folds[0]["val"]["accuracy"], abs=0.01)


def test_diverged_ranks_are_caught(tmp_path):
    """check_same on two gloo processes whose weights differ in one bit raises."""
    import torch.multiprocessing as mp

    mp.spawn(_diverge, args=(str(tmp_path / "rendezvous"),), nprocs=2, join=True)


def _diverge(rank: int, store: str) -> None:
    import torch.distributed as dist

    from foxhunt.train import distributed

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    w = {"net.w": torch.ones(5)}
    distributed.check_same(w, "same")  # no error
    if rank == 1:
        w["net.w"][2] = torch.nextafter(torch.tensor(1.0), torch.tensor(2.0))
    with pytest.raises(distributed.RanksDiverged, match=r"rank\(s\) \[1\] differ"):
        distributed.check_same(w, "fold 0")
    dist.destroy_process_group()


def test_a_killed_rank_ends_the_job_and_a_restart_resumes_to_the_same_results(demo_es, tmp_path):
    """SIGKILL one rank of a running job: torchrun ends the job (non-zero exit); the same
    command again (same run id) resumes every rank from its own resume files and ends with the
    metrics of a job that was never interrupted. The ranks write their resume files each on
    its own thread, so a killed job can leave one rank's an epoch ahead (seen: the restart then
    hung, its ranks' collectives out of step); the test makes sure it does, and the ranks must
    resume together from the epoch they both saved."""
    import signal
    import time
    from pathlib import Path

    import torch

    from foxhunt.train.core import previous_of, resume_position

    cache, folds = demo_es
    args = ["--model", "dqn", "--epochs", "6", "--fold-ids", "0", "--dqn.envs", "64",
            "--dqn.collect-steps", "8", "--dqn.learn-steps", "16", "--dqn.batch-size", "64",
            "--dqn.replay-capacity", "4096", "--dqn.hidden", "64", "64"]  # fmt: skip
    whole = torchrun_train(demo_es, tmp_path / "whole", *args)
    assert whole.returncode == 0
    cmd = [sys.executable, "-m", "foxhunt", "train", "--gpus", "2", "--device", "cpu",
           "--folds", str(folds), "--cache", str(cache), "--out", str(tmp_path / "cut"),
           "--run-id", "ddp", "--tracking", "none", "--no-baselines", "--eval-segments", "16",
           *args]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    # Its own session, so that a failure below can end the launcher and every rank at once.
    job = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env=env, start_new_session=True)  # fmt: skip
    try:
        deadline = time.time() + 300
        while len(list((tmp_path / "cut").glob("ddp/*/resume*.prev.pt"))) < 2:
            assert job.poll() is None and time.time() < deadline, "the job ended before epoch 2"
            time.sleep(0.05)
        # The ranks are the launcher's children started by multiprocessing's spawn (its resource
        # tracker is a child too): kill the newest rank.
        kids = Path(f"/proc/{job.pid}/task/{job.pid}/children").read_text().split()
        ranks = [int(p) for p in kids if b"spawn_main" in Path(f"/proc/{p}/cmdline").read_bytes()]
        assert len(ranks) == 2, kids
        os.kill(max(ranks), signal.SIGKILL)
        out, _ = job.communicate(timeout=180)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.wait()
    assert job.returncode != 0, out[-2000:]
    (run,) = (tmp_path / "cut" / "ddp").iterdir()
    assert not (run / "results.json").exists()
    files = [run / "resume.pt", run / "resume-rank1.pt"]
    at = [resume_position(torch.load(f, weights_only=False)) for f in files]
    if at[0] == at[1]:  # no skew left: rank 0 goes an epoch back (its previous file as its last)
        os.replace(previous_of(files[0]), files[0])
        at[0] = resume_position(torch.load(files[0], weights_only=False))
    print("resume positions (folds done, epoch) of rank 0 and 1:", at)
    assert at[0] != at[1] and abs(at[0][1] - at[1][1]) == 1, at  # one fold, epochs apart
    retry = torchrun_train(demo_es, tmp_path / "cut", *args)  # the same command again
    assert "continued run ddp" in retry.stdout  # resumed, not trained afresh
    (ref,) = (tmp_path / "whole" / "ddp").iterdir()
    got = json.loads((run / "results.json").read_text())["folds"]
    want = json.loads((ref / "results.json").read_text())["folds"]
    assert [(f["val"], f["test"], f["best_epoch"]) for f in got] == [
        (f["val"], f["test"], f["best_epoch"]) for f in want
    ]
