"""The compiled pipelines (DAG, images, resources, volumes, secrets, caching) and `submit`
against a small KFP API server on 127.0.0.1 that records what it is sent."""

from __future__ import annotations

import inspect
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from components.images import CPU_IMAGE, GPU_IMAGE
from pipelines.__main__ import SubmitError, compile_all, main, parse_params


@pytest.fixture(scope="module")
def compiled(tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("DATABENTO_API_KEY", "db-SENTINEL-KEY-0123456789")
    monkeypatch_module.setenv("MLFLOW_TRACKING_PASSWORD", "SENTINEL-PASSWORD")
    out = tmp_path_factory.mktemp("build")
    paths = compile_all(out)
    out = {}
    for p in paths:
        docs = list(yaml.safe_load_all(p.read_text()))  # pipeline spec [, platform spec]
        out[p.name] = (p.read_text(), {k: v for d in docs for k, v in d.items()})
    return out


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def tasks(doc: dict) -> dict:
    return doc["root"]["dag"]["tasks"]


def executor(doc: dict, name: str) -> dict:
    return doc["deploymentSpec"]["executors"][f"exec-{name}"]["container"]


def test_train_baseline_dag(compiled):
    _, doc = compiled["train-baseline.yaml"]
    # The steps run inside an exit handler whose exit task ends the MLflow parent run with the
    # pipeline's outcome, whatever stopped it.
    root = tasks(doc)
    assert set(root) == {"exit-handler-1", "end-tracking"}
    assert root["end-tracking"]["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert root["end-tracking"]["dependentTasks"] == ["exit-handler-1"]
    status = root["end-tracking"]["inputs"]["parameters"]["status"]["taskFinalStatus"]
    assert status == {"producerTask": "exit-handler-1"}
    t = doc["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    assert set(t) == {"ingest", "precompute", "folds", "start-tracking", "for-loop-2", "report"}
    assert t["precompute"]["dependentTasks"] == ["ingest"]
    assert t["folds"]["dependentTasks"] == ["precompute"]
    assert sorted(t["for-loop-2"]["dependentTasks"]) == ["folds", "start-tracking"]
    assert sorted(t["report"]["dependentTasks"]) == ["for-loop-2", "start-tracking"]
    assert t["start-tracking"]["dependentTasks"] == ["precompute"]
    loop = doc["components"]["comp-for-loop-2"]
    assert set(loop["dag"]["tasks"]) == {"train"}
    assert (
        t["for-loop-2"]["parameterIterator"]["items"]["inputParameter"] == "pipelinechannel--seeds"
    )
    # Display names, caching and retries.
    assert all(t[k]["taskInfo"]["name"] for k in t)
    assert not root["end-tracking"]["cachingOptions"].get("enableCache")
    assert t["ingest"]["cachingOptions"]["enableCache"] is True
    assert t["precompute"]["cachingOptions"]["enableCache"] is True
    train = loop["dag"]["tasks"]["train"]
    assert train["cachingOptions"] == {} or not train["cachingOptions"].get("enableCache")
    assert train["retryPolicy"]["maxRetryCount"] == 2
    assert t["ingest"]["retryPolicy"]["maxRetryCount"] == 2
    assert not t["report"]["cachingOptions"].get("enableCache")
    # Every pipeline parameter reaches the MLflow parent run.
    logged = set(t["start-tracking"]["inputs"]["parameters"]) - {"kfp_run_id", "keys"}
    assert logged == set(doc["root"]["inputDefinitions"]["parameters"])
    # Parameters a user reruns with from the UI.
    params = doc["root"]["inputDefinitions"]["parameters"]
    for p in ("symbol", "bar_size", "start", "end", "train_months", "val_months", "test_months",
              "purge", "embargo", "model", "epochs", "seeds", "lr", "gamma", "n_step",
              "raw_pvc", "fxcache_pvc"):  # fmt: skip
        assert p in params, p


def test_images_and_resources(compiled):
    _, doc = compiled["train-baseline.yaml"]
    for step in ("ingest", "precompute", "folds", "start-tracking", "report"):
        assert executor(doc, step)["image"] == CPU_IMAGE
    c = executor(doc, "train")
    assert c["image"] == GPU_IMAGE
    assert c["resources"]["accelerator"]["resourceType"] == "nvidia.com/gpu"
    assert c["resources"]["accelerator"]["resourceCount"] == "1"
    for step in ("ingest", "precompute", "folds", "train", "report"):
        r = executor(doc, step)["resources"]
        assert r["resourceCpuLimit"] and r["resourceMemoryLimit"], step
    # No pip at pod start: the image carries kfp and foxhunt.
    for step in ("ingest", "train"):
        assert "pip install" not in " ".join(executor(doc, step)["command"])


def test_volumes_and_secrets_by_name_only(compiled):
    text, doc = compiled["train-baseline.yaml"]
    k8s = doc["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    # Inside the seeds loop a pipeline parameter arrives as pipelinechannel--<name>.
    mounts = {e: {m["mountPath"]: m["pvcNameParameter"]["componentInputParameter"]
                  .removeprefix("pipelinechannel--")
                  for m in k8s[e].get("pvcMount", [])} for e in k8s}  # fmt: skip
    assert mounts["exec-ingest"] == {"/data/raw": "raw_pvc", "/data/work": "fxcache_pvc"}
    for e in ("exec-precompute", "exec-folds", "exec-train", "exec-report"):
        assert mounts[e] == {"/data/work": "fxcache_pvc"}, e
    assert mounts["exec-start-tracking"] == {}
    assert k8s["exec-ingest"]["secretAsEnv"][0]["secretName"] == "foxhunt-databento"
    for e in ("exec-train", "exec-report", "exec-start-tracking", "exec-end-tracking"):
        assert k8s[e]["secretAsEnv"][0]["secretName"] == "foxhunt-mlflow", e
    assert k8s["exec-train"]["nodeSelector"]["labels"]["nvidia.com/gpu.product"]
    assert k8s["exec-train"]["tolerations"][0]["key"] == "nvidia.com/gpu"
    # Values never: the environment's secrets are not baked into the YAML.
    assert "SENTINEL" not in text


def test_local_variant_leaves_out_the_cluster(compiled):
    text, doc = compiled["train-baseline.local.yaml"]
    assert "platforms" not in doc
    assert "accelerator" not in text
    assert doc["root"]["inputDefinitions"]["parameters"]["work_dir"]["defaultValue"] == "data"
    _, pf = compiled["precompute-features.yaml"]
    assert set(tasks(pf)) == {"ingest", "precompute"}


def test_parse_params_by_the_pipeline_types():
    got = parse_params(
        ["epochs=20", "seeds=[0,1]", "symbol=NQ", "lr=1e-3", 'overrides={"dqn": {"atoms": 21}}']
    )
    assert got == {"epochs": 20, "seeds": [0, 1], "symbol": "NQ", "lr": 1e-3,
                   "overrides": '{"dqn": {"atoms": 21}}'}  # fmt: skip
    with pytest.raises(SubmitError, match="has no parameter 'epoch'"):
        parse_params(["epoch=3"])
    with pytest.raises(SubmitError, match="not a valid Integer"):
        parse_params(["epochs=three"])


class Recorder(BaseHTTPRequestHandler):
    log: list = []  # noqa: RUF012 (set per test by the fixture)

    def _reply(self, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        body = json.loads(self.rfile.read(n)) if n else None
        self.log.append((self.command, self.path, body))
        if self.path.startswith("/apis/v2beta1/experiments"):
            if self.command == "GET":
                return self._reply({"experiments": []})
            return self._reply({"experiment_id": "exp-7", "display_name": body["display_name"]})
        if self.path.startswith("/apis/v2beta1/runs"):
            return self._reply({"run_id": "run-42", "display_name": body["display_name"]})
        return self._reply({})

    do_GET = do_POST = _handle

    def log_message(self, *args) -> None:
        pass


@pytest.fixture
def kfp_server():
    Recorder.log = []
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", Recorder.log
    srv.shutdown()


def test_submit_sends_spec_platform_and_parameters(kfp_server, monkeypatch, tmp_path, capsys):
    host, log = kfp_server
    monkeypatch.setenv("KFP_HOST", host)
    monkeypatch.chdir(tmp_path)  # build/ goes here
    (tmp_path / ".git").mkdir()
    rc = main(["submit", "train-baseline", "epochs=3", "seeds=[0,1,2]", "--run-name", "r1"])
    assert rc == 0
    assert "run run-42" in capsys.readouterr().out
    runs = [b for m, p, b in log if m == "POST" and p.startswith("/apis/v2beta1/runs")]
    assert len(runs) == 1
    run = runs[0]
    assert run["display_name"] == "r1" and run["experiment_id"] == "exp-7"
    spec = run["pipeline_spec"]
    assert spec["pipeline_spec"]["pipelineInfo"]["name"] == "train-baseline"
    assert "kubernetes" in spec["platform_spec"]["platforms"]
    assert run["runtime_config"]["parameters"] == {"epochs": 3, "seeds": [0, 1, 2]}
    assert Path(tmp_path / "build" / "train-baseline.yaml").is_file()


def test_submit_errors(monkeypatch, tmp_path, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KFP_HOST", raising=False)
    assert main(["submit", "train-baseline"]) == 2
    assert "KFP_HOST is not set" in capsys.readouterr().err
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("KFP_HOST", f"http://127.0.0.1:{port}")
    assert main(["submit", "train-baseline"]) == 2
    assert f"KFP_HOST=http://127.0.0.1:{port} did not accept the run" in capsys.readouterr().err
    monkeypatch.setenv("KFP_HOST", "http://127.0.0.1:1")
    assert main(["submit", "no-such-pipeline"]) == 2
    assert "no pipeline 'no-such-pipeline'" in capsys.readouterr().err


def test_tasks_that_track_refuse_to_run_without_a_tracking_server(monkeypatch, tmp_path):
    """On a cluster without the foxhunt-mlflow Secret, MLflow would log into a sqlite file in
    the pod, lost with it: the tasks fail first, saying which Secret is missing."""
    from components import report, start_tracking, train
    from foxhunt.train.tracking import TrackingError

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.chdir(tmp_path)
    calls = [
        lambda: start_tracking.python_func(
            **dict.fromkeys(inspect.signature(start_tracking.python_func).parameters, "")
        ),
        lambda: train.python_func(work_dir=str(tmp_path), folds=None, results=None, metrics=None),
        lambda: report.python_func(
            work_dir=str(tmp_path), results=[], markdown=None, html=None, metrics=None
        ),
    ]
    for call in calls:
        with pytest.raises(TrackingError, match="Secret foxhunt-mlflow"):
            call()
    assert not list(tmp_path.iterdir())  # no mlflow.db left behind


def test_the_exit_task_ends_the_parent_run_with_the_pipeline_outcome(monkeypatch, tmp_path):
    import mlflow
    from kfp import dsl

    from components import end_tracking
    from foxhunt.train.tracking import start_pipeline_run

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    client = mlflow.MlflowClient(uri)
    for state, want in (("FAILED", "FAILED"), ("CANCELLED", "KILLED"), ("SUCCEEDED", "FINISHED")):
        rid = start_pipeline_run("foxhunt", "p", {"kfp_run_id": f"kfp-{state}"}, {})
        status = dsl.PipelineTaskFinalStatus(
            state=state, pipeline_job_resource_name="x", pipeline_task_name="train",
            error_code=1, error_message="train: non-finite losses/loss" * (want == "FAILED"),
        )  # fmt: skip
        end_tracking.python_func(kfp_run_id=f"kfp-{state}", status=status)
        run = client.get_run(rid)
        assert run.info.status == want, state
        if state == "FAILED":
            assert run.data.tags["foxhunt.error"] == "train: non-finite losses/loss"
    # No parent (the pipeline stopped before start_tracking): nothing to end, no error.
    end_tracking.python_func(kfp_run_id="kfp-none", status=status)
