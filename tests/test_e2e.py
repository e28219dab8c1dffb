"""End to end: train-baseline through KFP's local runner on a tiny config, tracked to a real
`mlflow server` on 127.0.0.1 (sqlite backend, local artifact store); the runs are read back;
a second pipeline run hits the fxcache and trains afresh."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
import warnings
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
TINY = {
    "epochs": 2,
    "seeds": [0, 1],
    "batch_size": 16,
    "envs": 8,
    "overrides": json.dumps(
        {
            "dqn": {
                "hidden": [16],
                "head_hidden": 8,
                "collect_steps": 4,
                "learn_steps": 2,
                "replay_capacity": 256,
            },
            "ppo": {"hidden": [16], "envs": 8, "rollout_steps": 8, "rounds": 1},
            "train": {"eval_segments": 64},
        }
    ),
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    root = tmp_path_factory.mktemp("mlflow")
    port = free_port()
    mlflow_bin = Path(sys.executable).with_name("mlflow")
    cmd = [str(mlflow_bin), "server", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}"]
    cmd += ["--artifacts-destination", str(root / "artifacts"), "--workers", "1"]
    log = open(root / "server.log", "w")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.time() + 120
    while True:
        try:
            urllib.request.urlopen(f"{url}/health", timeout=2)
            break
        except OSError:
            if proc.poll() is not None or time.time() > deadline:
                proc.kill()
                pytest.fail("mlflow server did not start:\n" + (root / "server.log").read_text())
            time.sleep(0.5)
    yield url
    os.killpg(proc.pid, signal.SIGTERM)  # the server and its workers, by the server's PID
    proc.wait(timeout=30)
    log.close()


def excerpt(log: str, marker: str, before: int = 25, after: int = 5) -> str:
    """The log's lines around the first `marker` (or its end): what a failure message shows."""
    rows = log.splitlines()
    at = next((i for i, r in enumerate(rows) if marker in r), len(rows))
    return "\n".join(rows[max(0, at - before) : at + after])


def run_pipeline(raw: Path, work: Path, tracking: str, cwd: Path, **change) -> str:
    params = [
        f"{k}={json.dumps(v) if not isinstance(v, str) else v}" for k, v in (TINY | change).items()
    ]
    params += [f"raw_dir={raw}", f"work_dir={work}"]
    tmp = cwd / "tmp"  # the run's temporary files: none left after it (KFP's steps leave some)
    tmp.mkdir(exist_ok=True)
    env = os.environ | {
        "MLFLOW_TRACKING_URI": tracking,
        "PYTHONPATH": str(REPO),
        "TMPDIR": str(tmp),
    }
    out = subprocess.run(
        [sys.executable, "-m", "pipelines", "run-local", "train-baseline", *params],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert not list(tmp.iterdir()), f"the run left temporary files: {list(tmp.iterdir())}"
    return out.stdout + out.stderr


def test_train_baseline_local_run_tracked_to_an_mlflow_server(demo_es, mlflow_server, tmp_path):
    import mlflow

    raw = demo_es[0].parent / "raw"
    work = tmp_path / "work"
    log1 = run_pipeline(raw, work, mlflow_server, tmp_path)
    assert "fxcache miss" in log1
    # A readable console: one line per epoch with its place and the time left, and none of
    # KFP's executor-input JSON (run-local --verbose shows it).
    assert "epoch 2/2" in log1 and "ETA " in log1 and "Got executor_input" not in log1
    assert "Pipeline 'train-baseline' finished with status SUCCESS" in log1.replace(
        "\x1b[95m", ""
    ).replace("\x1b[0m", "").replace("\x1b[92m", "")
    report = next((work / "report").glob("*/report.md")).read_text()
    assert report.count("| ES | dqn |") == 4  # 2 folds x 2 seeds
    assert "Deflated Sharpe ratio" in report

    client = mlflow.MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("foxhunt")
    runs = client.search_runs([exp.experiment_id])
    (parent,) = [r for r in runs if r.data.tags.get("foxhunt.level") == "pipeline"]
    tasks = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == parent.info.run_id]
    # A task that failed is retried (set_retry; KFP's local runner honours it too): a retry
    # continues the task's runs from its resume file, and an attempt that failed before its
    # first resume file leaves its runs FAILED beside the retry's. Such a retry is legitimate
    # but says something went wrong: it is reported with the attempt's error.
    failed = [t for t in tasks if t.info.status == "FAILED"]
    if failed:
        assert "Retrying in" in log1, [t.info for t in failed]
        warnings.warn("a task was retried:\n" + excerpt(log1, "Retrying in"), stacklevel=1)
    tasks = [t for t in tasks if t.info.status != "FAILED"]
    folds = [
        r for r in runs if r.data.tags.get("mlflow.parentRunId") in {t.info.run_id for t in tasks}
    ]
    assert len(tasks) == 2, ([t.info for t in tasks], excerpt(log1, "Retrying in"))
    assert len(folds) == 4
    # The parent: one per pipeline run, tagged, carrying the aggregate and the report.
    tags = parent.data.tags
    assert tags["kfp_run_id"] and tags["git_commit"] and tags["fxcache_key"]
    assert tags["symbol"] == "ES" and tags["model"] == "dqn"
    # Every pipeline parameter, as the user gave it, and a readable name.
    assert parent.data.params["epochs"] == "2" and parent.data.params["seeds"] == "[0, 1]"
    assert json.loads(parent.data.params["overrides"]) == json.loads(TINY["overrides"])
    assert parent.info.run_name.startswith("ES dqn ")
    for k in ("eval/mean_test_sharpe", "eval/mean_test_max_drawdown", "eval/deflated_sharpe"):
        assert k in parent.data.metrics, k
    plots = [a.path for a in client.list_artifacts(parent.info.run_id, "plots")]
    assert len(plots) == 4 and all(p.endswith(".png") for p in plots)
    assert "report.html" in [a.path for a in client.list_artifacts(parent.info.run_id)]
    assert parent.info.status == "FINISHED"
    for t in tasks:
        assert t.data.tags["kfp_run_id"] == tags["kfp_run_id"]
        assert "eval/mean_test_sharpe" in t.data.metrics and "dqn.lr" in t.data.params
    for c in folds:
        hist = client.get_metric_history(c.info.run_id, "losses/loss")
        assert sorted(m.step for m in hist) == [0, 1]
        assert "eval/val_sharpe" in c.data.metrics and "time/learn_s" in c.data.metrics
        local = client.download_artifacts(
            c.info.run_id, "checkpoint/best.safetensors", str(tmp_path)
        )
        assert Path(local).stat().st_size > 1000

    # Every JSON file the steps wrote is strict JSON (no bare Infinity or NaN).
    def bare(name):
        raise ValueError(f"bare {name}")

    for p in [*work.rglob("*.json"), *(tmp_path / "build").rglob("*.json")]:
        try:
            json.loads(p.read_text(), parse_constant=bare)
        except ValueError as e:
            pytest.fail(f"{p}: {e}")

    # A second run, a rerun with model=ppo as from the Kubeflow UI: the ingested data and the
    # cache are found, nothing is recomputed before training; training runs afresh (a new
    # run, not a retry) and trains PPO, under new MLflow runs that carry the DQN's metric keys
    # for what the two share. (One seed and one epoch: what is checked is that it trains.)
    # With fold_tasks each of the 2 folds is a task of its own; the report joins them again.
    log2 = run_pipeline(raw, work, mlflow_server, tmp_path, seeds=[0], epochs=1, model="ppo",
                        fold_tasks=True)  # fmt: skip
    assert "fxcache hit" in log2 and "fxcache miss" not in log2
    assert "continued run" not in log2
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("foxhunt.level") == "pipeline"]
    assert len(parents) == 2 and len({p.data.tags["kfp_run_id"] for p in parents}) == 2
    assert sorted(p.data.tags["model"] for p in parents) == ["dqn", "ppo"]
    for p in parents:
        tasks = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == p.info.run_id
                 and r.info.status != "FAILED"]  # fmt: skip
        per_seed = 2 if p.data.params["fold_tasks"] == "True" else 1  # the demo's 2 folds
        assert len(tasks) == len(json.loads(p.data.params["seeds"])) * per_seed
        assert all(t.data.tags["foxhunt_run_id"] for t in tasks)
        assert p.info.status == "FINISHED"
        for t in tasks:
            model = p.data.tags["model"]
            assert t.data.tags["model"] == model and f"{model}.lr" in t.data.params
            assert t.data.params["train.model"] == model
            kids = [r for r in runs if r.data.tags.get("mlflow.parentRunId") == t.info.run_id]
            for k in kids:
                for key in (
                    "losses/loss",
                    "losses/grad_norm",
                    "eval/val_sharpe",
                    "eval/test_sharpe",
                    "charts/collect_turnover",
                    "time/learn_s",
                ):
                    assert key in k.data.metrics, (model, key)  # fmt: skip
    assert (work / "report").glob("*/report.md")
    ppo_report = max((work / "report").glob("*/report.md"), key=lambda p: p.stat().st_mtime)
    assert ppo_report.read_text().count("| ES | ppo |") == 2  # its 2 folds, one task again
    assert "ppo's over 1 seed(s)" in ppo_report.read_text()
