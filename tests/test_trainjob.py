"""Training on several nodes: the TrainJob foxhunt creates, followed against a recording
Kubernetes API server on 127.0.0.1 (what it sends; a completed job, a failed one whose reason
fails the step, one past its time that is deleted), the config that travels to the nodes, and
the nodes' entry point."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from foxhunt.train import EnvConfig, TrainConfig
from foxhunt.train import trainjob as tj
from foxhunt.train.models.cfc import CfCConfig


class KubeAPI(BaseHTTPRequestHandler):
    """The TrainJob endpoints of an API server: records requests; GETs answer the next of the
    scripted states (the last one repeats)."""

    requests: ClassVar[list] = []
    states: ClassVar[list] = []

    def _send(self, code: int, doc: dict) -> None:
        body = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):
        n = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(n))
        type(self).requests.append(("POST", self.path, body))
        self._send(201, body)

    def do_GET(self):
        type(self).requests.append(("GET", self.path, None))
        states = type(self).states
        self._send(200, states.pop(0) if len(states) > 1 else states[0])

    def do_DELETE(self):
        type(self).requests.append(("DELETE", self.path, None))
        self._send(200, {"status": "Success"})

    def log_message(self, *a):
        pass


@pytest.fixture
def api():
    from kubernetes import client

    KubeAPI.requests, KubeAPI.states = [], []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), KubeAPI)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    conf = client.Configuration()
    conf.host = f"http://127.0.0.1:{srv.server_address[1]}"
    yield client.CustomObjectsApi(client.ApiClient(conf))
    srv.shutdown()


def job(**kw) -> dict:
    args = dict(name="foxhunt-run1-dqn-seed0", namespace="team-a", image="reg/foxhunt-gpu:abc",
                config_path="/data/work/runs/run1/trainjobs/dqn-seed0.json", nodes=3,
                gpus_per_node=8, fxcache_pvc="foxhunt-fxcache",
                node_selector={"nvidia.com/gpu.product": "NVIDIA-H200"},
                tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}],
                labels={"kueue.x-k8s.io/queue-name": "gpu"})  # fmt: skip
    return tj.manifest(**(args | kw))


def state(kind: str | None, reason: str = "", message: str = "") -> dict:
    conds = [] if kind is None else [{"type": kind, "status": "True", "reason": reason,
                                      "message": message}]  # fmt: skip
    return {"metadata": {"name": "x"}, "status": {"conditions": conds}}


def test_the_trainjob_names_our_image_command_gpus_volume_and_secret_by_name():
    m = job()
    assert (m["apiVersion"], m["kind"]) == ("trainer.kubeflow.org/v1alpha1", "TrainJob")
    s = m["spec"]
    assert s["runtimeRef"] == {"name": "foxhunt-torch", "apiGroup": "trainer.kubeflow.org",
                               "kind": "TrainingRuntime"}  # fmt: skip
    t = s["trainer"]
    assert t["image"] == "reg/foxhunt-gpu:abc" and (t["numNodes"], t["numProcPerNode"]) == (3, 8)
    assert t["command"] == ["torchrun", "-m", "foxhunt.train.job",
                            "/data/work/runs/run1/trainjobs/dqn-seed0.json"]  # fmt: skip
    assert t["resourcesPerNode"]["limits"] == {"nvidia.com/gpu": "8"}
    secret_refs = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in t["env"]}
    assert secret_refs["MLFLOW_TRACKING_URI"] == {"name": "foxhunt-mlflow", "key": "tracking-uri",
                                                  "optional": True}  # fmt: skip
    assert all("value" not in e for e in t["env"])  # names of Secrets only, never values
    (o,) = s["podSpecOverrides"]
    claim = {"claimName": "foxhunt-fxcache"}
    assert o["volumes"] == [{"name": "fxcache", "persistentVolumeClaim": claim}]
    assert o["containers"][0]["volumeMounts"] == [{"name": "fxcache", "mountPath": "/data/work"}]
    assert o["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-H200"}
    assert m["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu"


def test_a_completed_job_is_followed_to_its_end(api):
    KubeAPI.states = [state(None), state(None), state("Complete", "JobsCompleted")]
    end = tj.run(api, job(), poll_s=0.01, log=lambda s: None)
    assert tj.condition(end) == ("Complete", "JobsCompleted")
    method, path, body = KubeAPI.requests[0]
    assert (method, path) == ("POST", "/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/"
                                      "trainjobs")  # fmt: skip
    assert body["spec"]["trainer"]["numNodes"] == 3
    gets = [r for r in KubeAPI.requests if r[0] == "GET"]
    assert len(gets) == 3 and gets[0][1].endswith("/trainjobs/foxhunt-run1-dqn-seed0")


def test_a_failed_job_fails_the_step_with_its_reason(api):
    KubeAPI.states = [state(None), state("Failed", "BackoffLimitExceeded",
                                         "node-1: exit code 1: CUDA out of memory")]  # fmt: skip
    with pytest.raises(tj.TrainJobFailed, match="BackoffLimitExceeded: node-1: exit code 1"):
        tj.run(api, job(), poll_s=0.01, log=lambda s: None)


def test_a_job_past_its_time_is_deleted(api):
    KubeAPI.states = [state(None)]
    with pytest.raises(tj.TrainJobFailed, match="ran past"):
        tj.run(api, job(), poll_s=0.01, timeout_s=0.05, log=lambda s: None)
    assert KubeAPI.requests[-1][0] == "DELETE"


def test_the_config_travels_to_the_nodes_whole_and_the_entry_point_trains_it(demo_es, tmp_path):
    cache, folds = demo_es
    cfg = TrainConfig(folds=folds, cache=cache, out=tmp_path / "runs", run_id="nodes",
                      model="cfc", epochs=1, device="cpu", tracking="none", baselines=False,
                      fold_ids=(0,), eval_segments=16, env=EnvConfig(episode_bars=256),
                      cfc=CfCConfig(window=8, units=8, backbone_units=16, steps=2, batch_size=32),
                      tags={"kfp_run_id": "r1"})  # fmt: skip
    path = tmp_path / "cfg.json"
    path.write_text(tj.config_to_json(cfg))
    back = tj.load_config(path)
    assert back == cfg and isinstance(back.folds, Path) and isinstance(back.cfc, CfCConfig)
    p = subprocess.run([sys.executable, "-m", "foxhunt.train.job", str(path)],
                       capture_output=True, text=True, timeout=600)  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    assert "mean over 1 fold(s)" in p.stdout
    assert list((tmp_path / "runs" / "nodes").glob("*/results.json"))


def test_the_step_submits_the_task_and_fails_with_the_job_s_reason(api, tmp_path, monkeypatch):
    """components/train_job.py as a pod runs it, against the recording API server: it writes
    the task's config and folds onto the volume, creates the TrainJob that names them, and a
    failed job fails the step with the job's reason."""
    from types import SimpleNamespace

    from components import train_job

    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setattr(tj, "in_cluster_api", lambda: api)
    monkeypatch.setattr(tj, "pod_namespace", lambda: "team-a")
    run = tj.run  # its default poll waits 15 s between the job's states
    monkeypatch.setattr(tj, "run", lambda api, job: run(api, job, poll_s=0.01))
    folds = tmp_path / "folds.json"
    folds.write_text(json.dumps({"fxcache_key": "k", "folds": [{"fold": 0}]}))
    KubeAPI.states = [state(None), state("Failed", "PodFailed", "node-0: OOMKilled")]
    with pytest.raises(tj.TrainJobFailed, match="PodFailed: node-0: OOMKilled"):
        train_job.python_func(
            work_dir=str(tmp_path), folds=SimpleNamespace(path=str(folds)), results=None,
            metrics=None, best_model=None, nodes=2, gpus_per_node=8,
            fxcache_pvc="foxhunt-fxcache", model="ppo", seed=3, kfp_run_id="run-7", fold=0,
            gpu_image="reg/foxhunt-gpu:abc",
        )  # fmt: skip
    (_, path, body) = KubeAPI.requests[0]
    assert path.endswith("/namespaces/team-a/trainjobs")
    cfg_path = body["spec"]["trainer"]["command"][-1]
    cfg = tj.load_config(cfg_path)
    assert (cfg.model, cfg.seed, cfg.fold_ids, cfg.gpus, cfg.run_id) == ("ppo", 3, (0,), 8,
                                                                          "run-7")  # fmt: skip
    assert cfg.folds.read_text() == folds.read_text()  # a copy on the volume the nodes read
    assert body["spec"]["trainer"]["image"] == "reg/foxhunt-gpu:abc"
    assert body["metadata"]["name"] == "foxhunt-run-7-ppo-seed3-fold0"
