"""What `foxhunt train` refuses, and how: damaged or nonsensical data, folds and parameters never
reach training silently, and a task that fails leaves no results for the report to count."""

from __future__ import annotations

import dataclasses
import json
import shutil
import time

import numpy as np
import pytest

from foxhunt.cli import main
from foxhunt.fxcache import FxCache, FxCacheError, publish
from foxhunt.report import ReportConfig, ReportError, run_report
from foxhunt.train import DQNConfig, EnvConfig, TrainConfig, run_train
from foxhunt.train.core import TrainError
from foxhunt.train.tracking import NullLogger

TINY = DQNConfig(
    hidden=(16,), head_hidden=8, envs=8, collect_steps=4, learn_steps=2, batch_size=16,
    replay_capacity=256,
)  # fmt: skip


def _cfg(cache, folds, out, **kw) -> TrainConfig:
    base = dict(
        folds=folds, cache=cache, epochs=1, fold_ids=(0,), out=out, tracking="none",
        eval_segments=4, dqn=TINY, env=EnvConfig(episode_bars=64), run_id="run-1",
        baselines=False,
    )  # fmt: skip
    return TrainConfig(**(base | kw))


def _folds_for(src_folds, tmp_path, key=None, edit=None):
    doc = json.loads(src_folds.read_text())
    if key:
        doc["fxcache_key"] = key
    if edit:
        edit(doc["folds"][0])
    out = tmp_path / "folds.json"
    out.write_text(json.dumps(doc))
    return out


def _copy_cache(cache_root, tmp_path, folds):
    key = json.loads(folds.read_text())["fxcache_key"]
    dst = tmp_path / "fxcache"
    shutil.copytree(cache_root / key, dst / key)
    return dst, key


def test_flipped_bytes_in_the_cache_are_refused(demo_es, tmp_path):
    cache_root, folds = demo_es
    root, key = _copy_cache(cache_root, tmp_path, folds)
    f = root / key / "features.npy"
    with open(f, "r+b") as fh:
        fh.seek(f.stat().st_size // 2)
        b = fh.read(1)
        fh.seek(-1, 1)
        fh.write(bytes([b[0] ^ 0x40]))
    with pytest.raises(FxCacheError, match=r"features\.npy: checksum mismatch.*fxcache verify"):
        run_train(_cfg(root, folds, tmp_path / "runs"), NullLogger())
    assert not (tmp_path / "runs").exists()


def test_a_non_finite_input_is_refused_at_load(demo_es, tmp_path):
    cache_root, folds = demo_es
    c = FxCache.open(cache_root, json.loads(folds.read_text())["fxcache_key"])
    arrays = {n: np.array(getattr(c, n)) for n in ("features", "ofi", "targets", "timestamps")}
    arrays["features"][1234, 7] = np.nan
    meta = {k: v for k, v in c.manifest.items() if k not in ("key", "rows", "files")}
    publish(tmp_path / "fxcache", "withnan", arrays, meta)
    f2 = _folds_for(folds, tmp_path, key="withnan")
    name = c.manifest["features"][7]
    with pytest.raises(TrainError, match=rf"features\[1234, 7\] \({name}\) is nan"):
        run_train(_cfg(tmp_path / "fxcache", f2, tmp_path / "runs"), NullLogger())
    assert not (tmp_path / "runs" / "results.json").exists()


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda f: f.update(val_start=f["train_start"] + 10), "val starts at bar"),
        (lambda f: f.update(test_start=f["val_start"] + 5), "test starts at bar"),
        (lambda f: f.update(test_end=f["test_end"] + 10_000_000), "outside the cache"),
        (lambda f: f.update(train_end=f["train_start"]), "fewer than 2 bars"),
        (lambda f: f.update(val_end=str(f["val_end"])), "must be an integer"),
    ],
)
def test_folds_that_break_the_rules_are_refused_before_upload(demo_es, tmp_path, edit, message):
    cache_root, folds = demo_es
    bad = _folds_for(folds, tmp_path, edit=edit)
    t0 = time.perf_counter()
    with pytest.raises(TrainError, match=message):
        run_train(_cfg(cache_root, bad, tmp_path / "runs"), NullLogger())
    assert time.perf_counter() - t0 < 5 and not (tmp_path / "runs").exists()


def test_a_diverging_loss_stops_the_task_and_the_report_refuses_it(demo_es, tmp_path):
    """A learning rate that overflows the weights: the epoch's loss is not a number."""
    cache_root, folds = demo_es
    diverging = dataclasses.replace(TINY, lr=1e30, noisy=False)
    cfg = _cfg(cache_root, folds, tmp_path / "runs", dqn=diverging)
    with pytest.raises(TrainError, match=r"fold 0 epoch 0: non-finite losses/"):
        run_train(cfg, NullLogger())
    (run_dir,) = (tmp_path / "runs" / "run-1").iterdir()
    assert "non-finite" in json.loads((run_dir / "failed.json").read_text())["error"]
    assert not (run_dir / "results.json").exists()
    # results.json of that directory, had one been left, is refused by the report
    (run_dir / "results.json").write_text(json.dumps({"folds": []}))
    with pytest.raises(ReportError, match="its task failed"):
        run_report(ReportConfig(results=(run_dir / "results.json",), out=tmp_path / "rep"))


def test_report_refuses_results_whose_metrics_are_not_numbers(tmp_path):
    doc = {"folds": [{"fold": 0, "val": {"sharpe": 1.0, "sortino": 1.0, "max_drawdown": 0.1,
                                         "turnover": 1.0, "hit_rate": 0.5},
                      "test": {"sharpe": float("nan"), "sortino": 1.0, "max_drawdown": 0.1,
                               "turnover": 1.0, "hit_rate": 0.5}}]}  # fmt: skip
    p = tmp_path / "run" / "results.json"
    p.parent.mkdir()
    p.write_text(json.dumps(doc))
    with pytest.raises(ReportError, match="fold 0 test sharpe is nan"):
        run_report(ReportConfig(results=(p,), out=tmp_path / "rep"))


def test_a_corrupt_resume_file_is_named_with_what_to_do(demo_es, tmp_path):
    cache_root, folds = demo_es
    cfg = _cfg(cache_root, folds, tmp_path / "runs")
    res = run_train(cfg, NullLogger())
    (res.run_dir / "resume.pt").write_bytes(b"\x80\x02not a torch file")
    with pytest.raises(TrainError, match=r"resume.pt: unreadable resume file.*--no-resume"):
        run_train(cfg, NullLogger())
    again = run_train(_cfg(cache_root, folds, tmp_path / "runs", resume=False), NullLogger())
    assert again.aggregate == res.aggregate


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--dqn.n-step", "0"], "n_step = 0: must be at least 1"),
        (["--dqn.gamma", "2"], "gamma = 2.0: must be in [0, 1]"),
        (["--dqn.v-min", "5", "--dqn.v-max", "-5"], "v_max = -5.0: must exceed v_min"),
        (["--dqn.v-min", "-5"], "v_max = None: set both or neither"),
        (["--dqn.batch-size", "0"], "batch_size = 0: must be at least 1"),
        (["--dqn.envs", "0"], "envs = 0: must be at least 1"),
        (["--dqn.lr", "0"], "lr = 0.0: must be > 0"),
        (["--ppo.clip-coef", "0"], "clip_coef = 0.0: must be > 0"),
        (["--ppo.envs", "10", "--ppo.rollout-steps", "3"], "must divide into minibatches"),
        (["--pqn.eps-decay", "0"], "eps_decay = 0.0: must be in (0, 1]"),
        (["--ppo.weight-decay", "-1"], "weight_decay = -1.0: must be >= 0 and finite"),
        (["--dqn.weight-decay", "nan"], "weight_decay = nan: must be >= 0 and finite"),
        (["--epochs", "0"], "epochs = 0: must be at least 1"),
        (["--env.episode-bars", "1"], "episode_bars = 1: must be at least 2"),
        (["--env.memory-decay", "1"], "memory_decay = 1.0: must be in [0, 1), or None"),
    ],
)
def test_parameters_that_cannot_work_get_one_line(capsys, args, message):
    with pytest.raises(SystemExit) as e:
        main(["train", *args])
    err = capsys.readouterr().err
    assert e.value.code == 2 and message in " ".join(err.split()), err
    assert "Traceback" not in err


def test_graph_capture_on_a_cpu_is_refused_before_upload(demo_es, tmp_path, capsys):
    cache_root, folds = demo_es
    rc = main(["train", "--folds", str(folds), "--cache", str(cache_root), "--device", "cpu",
               "--dqn.capture", "graph", "--tracking", "none", "--out", str(tmp_path)])  # fmt: skip
    err = " ".join(capsys.readouterr().err.split())
    assert rc == 1 and "CUDA graphs need a CUDA device" in err and "Traceback" not in err
    assert not list(tmp_path.iterdir())
