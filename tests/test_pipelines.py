"""The compiled pipelines (DAG, images, resources, volumes, secrets, caching) and `submit`
against a small KFP API server on 127.0.0.1 that records what it is sent."""

from __future__ import annotations

import inspect
import json
import re
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
    assert set(t) == {
        "scan-raw", "ingest", "precompute", "folds", "start-tracking", "plan-tasks",
        "for-loop-2", "report",
    }  # fmt: skip
    # KFP's cache sees parameters, not volumes: the scan's digest of the raw files is one of
    # ingest's inputs, and the scan itself is never cached.
    assert t["ingest"]["dependentTasks"] == ["scan-raw"]
    digest = t["ingest"]["inputs"]["parameters"]["raw_digest"]["taskOutputParameter"]
    assert digest["producerTask"] == "scan-raw"
    assert not t["scan-raw"]["cachingOptions"].get("enableCache")
    assert t["precompute"]["dependentTasks"] == ["ingest"]
    # Typed artifacts, so the Kubeflow UI shows lineage: the ingested data and the fxcache are
    # Datasets (passed from step to step), a task's best checkpoint a Model, the report HTML
    # and Markdown.
    comps = doc["components"]

    def out_type(comp, name):
        return comps[comp]["outputDefinitions"]["artifacts"][name]["artifactType"]["schemaTitle"]

    assert out_type("comp-ingest", "ingested") == "system.Dataset"
    assert out_type("comp-precompute", "fxcache") == "system.Dataset"
    assert out_type("comp-train", "best_model") == "system.Model"
    assert out_type("comp-report", "html") == "system.HTML"
    assert out_type("comp-report", "markdown") == "system.Markdown"
    src = t["precompute"]["inputs"]["artifacts"]["ingested"]["taskOutputArtifact"]
    assert src == {"outputArtifactKey": "ingested", "producerTask": "ingest"}
    assert t["folds"]["dependentTasks"] == ["precompute"]
    assert sorted(t["for-loop-2"]["dependentTasks"]) == ["folds", "plan-tasks", "start-tracking"]
    assert sorted(t["report"]["dependentTasks"]) == ["for-loop-2", "start-tracking"]
    assert t["start-tracking"]["dependentTasks"] == ["precompute"]
    # The fan-out: one task per model and seed (plan-tasks), PARALLELISM at a time; each task
    # in a pod (nodes = 1, its GPUs gpus_per_node) or as a TrainJob (nodes > 1).
    items = t["for-loop-2"]["parameterIterator"]["items"]["inputParameter"]
    assert items == "pipelinechannel--plan-tasks-Output"
    assert t["for-loop-2"]["iteratorPolicy"]["parallelismLimit"] == 8
    comps_ = doc["components"]
    branches = comps_["comp-condition-branches-3"]["dag"]["tasks"]
    several, one = (branches[k]["triggerPolicy"]["condition"] for k in sorted(branches))
    assert "pipelinechannel--nodes" in several and "> 1" in several
    assert one.startswith("!(") and "pipelinechannel--nodes" in one  # the Else: not (nodes > 1)
    assert {next(iter(comps_[f"comp-{k}"]["dag"]["tasks"])) for k in branches} == {
        "train",
        "train-job",
    }
    loop = {"train": comps_["comp-condition-5"]["dag"]["tasks"]["train"]}
    # Display names, caching and retries.
    assert all(t[k]["taskInfo"]["name"] for k in t)
    assert not root["end-tracking"]["cachingOptions"].get("enableCache")
    assert t["ingest"]["cachingOptions"]["enableCache"] is True
    assert t["precompute"]["cachingOptions"]["enableCache"] is True
    train = loop["train"]
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
    # the train pod's GPUs are a run parameter (gpus_per_node, default 1)
    count = c["resources"]["accelerator"]["resourceCount"]
    assert count == "{{$.inputs.parameters['pipelinechannel--gpus_per_node']}}"
    assert doc["root"]["inputDefinitions"]["parameters"]["gpus_per_node"]["defaultValue"] == 1
    # the TrainJob step is a CPU pod that submits and follows the job
    tj = executor(doc, "train-job")
    assert tj["image"] == CPU_IMAGE and "accelerator" not in tj["resources"]
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
    assert mounts["exec-scan-raw"] == {"/data/raw": "raw_pvc"}
    for e in ("exec-precompute", "exec-folds", "exec-train", "exec-report"):
        assert mounts[e] == {"/data/work": "fxcache_pvc"}, e
    assert mounts["exec-start-tracking"] == {}
    assert k8s["exec-ingest"]["secretAsEnv"][0]["secretName"] == "foxhunt-databento"
    for e in ("exec-train", "exec-report", "exec-start-tracking", "exec-end-tracking"):
        assert k8s[e]["secretAsEnv"][0]["secretName"] == "foxhunt-mlflow", e
    # GPU placement is a run parameter (JSON), not a GPU model fixed in code.
    train = k8s["exec-train"]
    assert train["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"].endswith(
        "gpu_node_selector"
    )
    assert train["tolerations"][0]["tolerationJson"]["componentInputParameter"].endswith(
        "gpu_tolerations"
    )
    params = doc["root"]["inputDefinitions"]["parameters"]
    assert params["gpu_tolerations"]["defaultValue"][0]["key"] == "nvidia.com/gpu"
    assert params["gpu_node_selector"]["defaultValue"] == {}
    assert "H100" not in text
    # Every step has a time-out.
    assert int(train["activeDeadlineSeconds"]) == 24 * 3600
    assert all("activeDeadlineSeconds" in k8s[e] for e in k8s), sorted(k8s)
    # Values never: the environment's secrets are not baked into the YAML.
    assert "SENTINEL" not in text


def test_local_variant_leaves_out_the_cluster(compiled):
    text, doc = compiled["train-baseline.local.yaml"]
    assert "platforms" not in doc
    assert "accelerator" not in text
    assert doc["root"]["inputDefinitions"]["parameters"]["work_dir"]["defaultValue"] == "data"
    _, pf = compiled["precompute-features.yaml"]
    assert set(tasks(pf)) == {"scan-raw", "ingest", "precompute"}


def test_parse_params_by_the_pipeline_types():
    got = parse_params(
        ["epochs=20", "seeds=[0,1]", "symbol=NQ", "lr=1e-3", 'overrides={"dqn": {"atoms": 21}}']
    )
    assert got == {"epochs": 20, "seeds": [0, 1], "symbol": "NQ", "lr": 1e-3,
                   "overrides": '{"dqn": {"atoms": 21}}'}  # fmt: skip
    assert parse_params(["lr=1"]) == {"lr": 1}  # an integer is a valid Float
    assert parse_params(["model=dqn,ppo,tlob"]) == {"model": "dqn,ppo,tlob"}  # models x seeds
    for bad, message in (
        ("epoch=3", "has no parameter 'epoch'"),
        ("epochs=three", "not a valid Integer"),
        ("epochs=2.5", "wants a Integer"),
        ("lr=true", "wants a Float"),
        ("seeds=0", "wants a List"),
        ("seeds=[0,-1]", "non-negative integers"),
        ("window=expandng", "choose one of sliding, expanding"),
        ("model=ppo2", "choose one of dqn"),
        ("model=dqn,ppo2", "several by commas"),
        ("overrides={dqn: 1}", "overrides: not JSON"),
        ("symbol", "expected name=value"),
    ):
        with pytest.raises(SubmitError, match=message):
            parse_params([bad])
    # Each pipeline is checked against its own parameters.
    with pytest.raises(SubmitError, match="precompute-features has no parameter 'epochs'"):
        parse_params(["epochs=3"], "precompute-features")
    assert parse_params(["symbols=NQ"], "precompute-features") == {"symbols": "NQ"}


def test_choices_are_those_of_the_configs():
    import typing

    from foxhunt.folds import FoldSpec
    from foxhunt.train import TrainConfig
    from pipelines.__main__ import CHOICES

    assert CHOICES["window"] == typing.get_args(typing.get_type_hints(FoldSpec)["window"])
    assert CHOICES["model"] == typing.get_args(typing.get_type_hints(TrainConfig)["model"])


def test_params_given_as_one_string_keep_their_json():
    """make submit PARAMS='...' arrives as one string (the Makefile passes "$$PARAMS")."""
    from pipelines.__main__ import split_params

    text = 'epochs=20  overrides={"dqn": {"atoms": 21, "hidden": [64, 64]}} seeds=[0, 1]'
    assert split_params(text) == [
        "epochs=20", 'overrides={"dqn": {"atoms": 21, "hidden": [64, 64]}}', "seeds=[0, 1]"
    ]  # fmt: skip
    assert split_params("  ") == []
    assert '--params "$$PARAMS"' in (Path(__file__).parents[1] / "Makefile").read_text()


def test_submit_help_lists_the_pipeline_parameters(capsys):
    assert main(["submit", "train-baseline", "--help"]) == 0
    out = capsys.readouterr().out
    assert "epochs             Integer  default 10" in out
    assert 'window             String   default "sliding"  one of: sliding, expanding' in out
    assert main(["submit", "precompute-features", "-h"]) == 0
    assert "epochs" not in capsys.readouterr().out


def test_run_local_takes_options_and_parameters_in_any_order(monkeypatch):
    import pipelines.__main__ as cli

    seen = {}
    monkeypatch.setattr(
        cli, "run_local", lambda name, params, verbose: seen.update(name=name, v=verbose, **params)
    )
    assert main(["run-local", "train-baseline", "--demo", "epochs=3", "seeds=[1]"]) == 0
    assert seen["epochs"] == 3 and seen["seeds"] == [1] and "overrides" in seen
    assert main(["run-local", "train-baseline", "--verbose", "epochs=2"]) == 0 and seen["v"]
    # The demo's epochs are the chosen model's (foxhunt.train.demo), unless given.
    from foxhunt.train import demo

    assert main(["run-local", "train-baseline", "--demo", "model=ppo"]) == 0
    assert seen["epochs"] == demo.epochs("ppo") == 16
    assert main(["run-local", "train-baseline", "--demo", "model=tlob"]) == 0
    assert seen["epochs"] == demo.epochs("tlob") == demo.EPOCHS
    assert main(["run-local", "train-baseline", "--demo"]) == 0
    assert seen["epochs"] == demo.epochs("dqn") == 16  # the default model's
    assert main(["run-local", "train-baseline", "--demo", "model=dqn,ppo", "epochs=4"]) == 0
    assert seen["epochs"] == 4 and demo.epochs("dqn,ppo") == 16


def test_the_local_console_leaves_out_the_executor_json(capsys):
    from pipelines.__main__ import QuietExecutor

    out = QuietExecutor()
    lines = [
        "[KFP Executor 2026-12-01 02:28:38,679 INFO]: Looking for component `train` in ...\n",
        "[KFP Executor 2026-12-01 02:28:38,680 INFO]: Got executor_input:\n",
        "{\n", '    "inputs": {\n', '        "parameterValues": {"epochs": 2}\n', "    }\n",
        "}\n",
        "fold 0 (1/2) epoch 1/2: loss 2.79, val Sharpe -56.29 (best -56.29 @ 1), ETA 0m04s\n",
        "[KFP Executor 2026-12-01 02:28:44,021 INFO]: Wrote executor output file to ...\n",
    ]  # fmt: skip
    for line in lines:
        out(line, end="")
    assert capsys.readouterr().out == lines[7]


def test_a_failed_local_run_ends_with_the_failed_task_and_its_error(monkeypatch, tmp_path, capsys):
    """kfp.local ends a run whose task failed with a traceback of its own; run-local ends it
    instead with one line: the pipeline, the task and the error its log ended with (the log,
    traceback included, stays above). Exit status 1."""
    from kfp.local import subprocess_task_handler

    import pipelines
    import pipelines.__main__ as cli

    def pipeline(platform):
        def run(**params):
            say = subprocess_task_handler.print  # what a task's streamed log goes through
            say("    Traceback (most recent call last):\n", end="")
            say("    foxhunt.precompute.core.PrecomputeError: data: ES has 1 trading day(s)\n",
                end="")  # fmt: skip
            raise RuntimeError("Pipeline \x1b[95m'train-baseline'\x1b[0m finished with status "
                               "\x1b[91mFAILURE\x1b[0m. Inner task failed: \x1b[96m'precompute'"
                               "\x1b[0m inside \x1b[96m'exit-handler-1'\x1b[0m.")  # fmt: skip

        return run

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("FOXHUNT_GIT_COMMIT", "")  # run_local sets both: restored after
    monkeypatch.setattr(subprocess_task_handler, "print", print, raising=False)
    with monkeypatch.context() as m, pytest.raises(cli.LocalRunFailed) as failed:
        m.setitem(pipelines.PIPELINES, "train-baseline", pipeline)
        cli.run_local("train-baseline", {})
    said = r"train-baseline failed after \d+ s, at its task 'precompute': PrecomputeError: "
    assert re.fullmatch(said + r"data: ES has 1 trading day\(s\)", str(failed.value))

    # main prints it alone and exits with 1.
    def fails(*args):
        raise failed.value

    run_local = cli.run_local
    monkeypatch.setattr(cli, "run_local", fails)
    assert main(["run-local", "train-baseline"]) == 1
    assert capsys.readouterr().err.strip() == str(failed.value)

    # Any other error of kfp.local's is left as it is.
    def other(platform):
        def run(**params):
            raise RuntimeError("other")

        return run

    with monkeypatch.context() as m, pytest.raises(RuntimeError, match="other"):
        m.setitem(pipelines.PIPELINES, "train-baseline", other)
        m.setattr(cli, "run_local", run_local)
        cli.run_local("train-baseline", {})


class Recorder(BaseHTTPRequestHandler):
    """A KFP API server on 127.0.0.1 that records what it is sent and answers as KFP does;
    with `token` set it wants that bearer token, like a multi-user Kubeflow."""

    log: list = []  # noqa: RUF012 (set per test by the fixture)
    token: str | None = None
    state: dict = {}  # noqa: RUF012

    def _reply(self, body: dict, code: int = 200) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _handle(self) -> None:
        from urllib.parse import parse_qs, urlparse

        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n) if n else b""
        json_body = "json" in (self.headers.get("Content-Type") or "")
        body = json.loads(raw) if raw and json_body else raw
        url = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(url.query).items()}
        self.log.append((self.command, url.path, body, dict(self.headers), q))
        if self.token and self.headers.get("Authorization") != f"Bearer {self.token}":
            return self._reply({"error": "unauthenticated", "code": 16}, 401)
        st, path = self.state, url.path
        if path == "/apis/v2beta1/healthz":
            return self._reply({"commit_sha": "test"})
        if path == "/apis/v2beta1/pipelines" and self.command == "GET":
            name = json.loads(q["filter"])["predicates"][0]["stringValue"] if "filter" in q else ""
            found = [p for p in st.setdefault("pipelines", []) if p["display_name"] == name]
            return self._reply({"pipelines": found} if found else {})
        if path == "/apis/v2beta1/pipelines/upload":
            p = {"pipeline_id": f"pl-{len(st['pipelines']) + 1}", "display_name": q["name"]}
            st["pipelines"].append(p)
            return self._reply(p)
        if path == "/apis/v2beta1/pipelines/upload_version":
            v = {"pipeline_version_id": f"v-{len(st.setdefault('versions', [])) + 1}",
                 "pipeline_id": q["pipelineid"], "display_name": q["name"]}  # fmt: skip
            st["versions"].append(v)
            return self._reply(v)
        if path.startswith("/apis/v2beta1/pipelines/") and path.endswith("/versions"):
            name = json.loads(q["filter"])["predicates"][0]["stringValue"]
            found = [v for v in st.get("versions", []) if v["display_name"] == name]
            return self._reply({"pipeline_versions": found} if found else {})
        if path.startswith("/apis/v2beta1/experiments"):
            if self.command == "GET":
                return self._reply({"experiments": []})
            return self._reply({"experiment_id": "exp-7", "display_name": body["display_name"]})
        if path.startswith("/apis/v2beta1/runs"):
            return self._reply({"run_id": "run-42", "display_name": body["display_name"]})
        return self._reply({})

    do_GET = do_POST = _handle

    def log_message(self, *args) -> None:
        pass


@pytest.fixture(autouse=True)
def no_registry(monkeypatch, request):
    """Submits in these tests do not ask a registry (one test checks that path itself)."""
    if "image_check" not in request.node.name:
        import pipelines.__main__ as cli

        monkeypatch.setattr(cli, "image_status", lambda image: ("unknown", "not in tests"))


@pytest.fixture
def kfp_server():
    Recorder.log, Recorder.state, Recorder.token = [], {}, None
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{srv.server_address[1]}", Recorder.log
    srv.shutdown()


def _posts(log, path):
    return [(b, h, q) for m, p, b, h, q in log if m == "POST" and p == path]


def test_submit_uploads_a_version_per_commit_and_runs_it(kfp_server, monkeypatch, tmp_path, capsys):
    host, log = kfp_server
    monkeypatch.setenv("KFP_HOST", host)
    for k in ("KFP_TOKEN", "KFP_COOKIES", "KF_PIPELINES_SA_TOKEN_PATH", "KFP_NAMESPACE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)  # build/ goes here
    rc = main(["submit", "train-baseline", "epochs=3", "seeds=[0,1,2]", "--run-name", "r1"])
    assert rc == 0
    out = capsys.readouterr().out
    assert "run run-42" in out and "version " in out
    # The pipeline is uploaded once, with a version named by commit and compiled spec.
    (upload,) = _posts(log, "/apis/v2beta1/pipelines/upload")
    assert upload[2]["name"] == "train-baseline"
    (version,) = _posts(log, "/apis/v2beta1/pipelines/upload_version")
    assert version[2]["pipelineid"] == "pl-1" and version[2]["name"] in out
    (run,) = [b for b, _, _ in _posts(log, "/apis/v2beta1/runs")]
    assert run["display_name"] == "r1" and run["experiment_id"] == "exp-7"
    assert run["pipeline_version_reference"] == {"pipeline_id": "pl-1",
                                                 "pipeline_version_id": "v-1"}  # fmt: skip
    assert run["runtime_config"]["parameters"] == {"epochs": 3, "seeds": [0, 1, 2]}
    assert Path(tmp_path / "build" / "train-baseline.yaml").is_file()
    # The same code again: no new pipeline, no new version; a new run of the same version.
    assert main(["submit", "train-baseline", "--params", "epochs=4 seeds=[0]"]) == 0
    assert len(_posts(log, "/apis/v2beta1/pipelines/upload")) == 1
    assert len(_posts(log, "/apis/v2beta1/pipelines/upload_version")) == 1
    run2 = _posts(log, "/apis/v2beta1/runs")[-1][0]
    assert run2["runtime_config"]["parameters"] == {"epochs": 4, "seeds": [0]}


def test_submit_on_a_multi_user_kubeflow(kfp_server, monkeypatch, tmp_path, capsys):
    """Without credentials: 'not authorised' at once, and how to log in; with a token (or a
    token file, or cookies) the requests carry it, in the namespace asked for."""
    import time

    host, log = kfp_server
    Recorder.token = "s3cret-token"
    monkeypatch.setenv("KFP_HOST", host)
    monkeypatch.chdir(tmp_path)
    for k in ("KFP_TOKEN", "KFP_COOKIES", "KF_PIPELINES_SA_TOKEN_PATH", "KFP_NAMESPACE"):
        monkeypatch.delenv(k, raising=False)
    t0 = time.perf_counter()
    assert main(["submit", "train-baseline"]) == 2
    err = capsys.readouterr().err
    assert "not authorised (401" in err and "KFP_COOKIES" in err and "KFP_TOKEN" in err
    assert time.perf_counter() - t0 < 5
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    monkeypatch.setenv("KF_PIPELINES_SA_TOKEN_PATH", str(token))
    assert main(["submit", "train-baseline", "--namespace", "team-a"]) == 0
    assert "s3cret" not in capsys.readouterr().out
    run = _posts(log, "/apis/v2beta1/runs")[-1]
    assert {k.lower(): v for k, v in run[1].items()}["authorization"] == "Bearer s3cret-token"
    (exp,) = [b for b, _, _ in _posts(log, "/apis/v2beta1/experiments")]
    assert exp["namespace"] == "team-a"
    monkeypatch.setenv("KFP_COOKIES", "authservice_session=abc")
    monkeypatch.setenv("KFP_TOKEN", "s3cret-token")
    assert main(["submit", "train-baseline"]) == 0
    headers = {k.lower(): v for k, v in _posts(log, "/apis/v2beta1/runs")[-1][1].items()}
    assert headers["cookie"] == "authservice_session=abc"


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
    assert f"KFP_HOST=http://127.0.0.1:{port}: cannot reach the KFP API" in capsys.readouterr().err


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
        lambda: train.python_func(
            work_dir=str(tmp_path), folds=None, results=None, metrics=None, best_model=None
        ),
        lambda: report.python_func(work_dir=str(tmp_path), markdown=None, html=None, metrics=None),
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


def test_cluster_settings_from_the_environment(monkeypatch, tmp_path):
    """Pull secrets and time-outs are set where make compile|submit runs; GPU placement is a
    run parameter, given as JSON."""
    from pipelines.platform import Cluster

    monkeypatch.setenv("IMAGE_PULL_SECRETS", "regcred,other")
    monkeypatch.setenv("TIMEOUT_TRAIN", "172800")
    monkeypatch.setenv("PARALLELISM", "3")
    monkeypatch.setenv("KUEUE_QUEUE", "gpu-queue")
    c = Cluster.from_env()
    assert c.image_pull_secrets == ("regcred", "other") and dict(c.timeouts)["train"] == 172800
    paths = compile_all(tmp_path)
    spec, doc = yaml.safe_load_all(next(p for p in paths if p.name == "train-baseline.yaml")
                                   .read_text())  # fmt: skip
    k8s = doc["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert [x["secretName"] for x in k8s["exec-train"]["imagePullSecret"]] == ["regcred", "other"]
    assert k8s["exec-train"]["activeDeadlineSeconds"] == "172800"
    # Kueue admits the GPU pods through the queue; the fan-out runs 3 tasks at a time
    assert k8s["exec-train"]["podMetadata"]["labels"] == {"kueue.x-k8s.io/queue-name": "gpu-queue"}
    loop = spec["components"]["comp-exit-handler-1"]["dag"]["tasks"]["for-loop-2"]
    assert loop["iteratorPolicy"]["parallelismLimit"] == 3
    got = parse_params(['gpu_node_selector={"nvidia.com/gpu.product": "NVIDIA-H200"}'])
    assert got == {"gpu_node_selector": {"nvidia.com/gpu.product": "NVIDIA-H200"}}


def test_submit_image_check_refuses_images_missing_from_the_registry(
    kfp_server, monkeypatch, tmp_path, capsys
):
    """A fake `docker` answers as `docker manifest inspect` does; with none of the tools the
    check says it could not look and goes on."""
    import os
    import shutil

    host, log = kfp_server
    monkeypatch.setenv("KFP_HOST", host)
    monkeypatch.chdir(tmp_path)
    for k in ("KFP_TOKEN", "KFP_COOKIES", "KF_PIPELINES_SA_TOKEN_PATH"):
        monkeypatch.delenv(k, raising=False)
    tools = tmp_path / "bin"
    tools.mkdir()
    os.symlink(shutil.which("git"), tools / "git")
    monkeypatch.setenv("PATH", str(tools))
    docker = tools / "docker"
    docker.write_text("#!/bin/sh\necho 'no such manifest: '$4 >&2\nexit 1\n")
    docker.chmod(0o755)
    assert main(["submit", "train-baseline"]) == 2
    err = capsys.readouterr().err
    assert "is not in its registry (docker)" in err and "foxhunt-cpu:" in err
    assert not _posts(log, "/apis/v2beta1/runs")
    docker.write_text("#!/bin/sh\necho '{}'\n")
    assert main(["submit", "train-baseline"]) == 0
    docker.unlink()
    assert main(["submit", "train-baseline"]) == 0
    assert "could not check that" in capsys.readouterr().err
    assert main(["submit", "train-baseline", "--skip-image-check"]) == 0


def test_one_image_tag_everywhere(tmp_path):
    """make images, the compiled pipelines and infra's MLflow image agree on registry and tag."""
    import subprocess

    from components import images

    want = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], capture_output=True,
                          text=True, cwd=Path(__file__).parent).stdout.strip()  # fmt: skip
    if want:
        assert images.default_tag() == want
    make = (Path(__file__).parents[1] / "Makefile").read_text()
    assert "IMAGE_TAG ?= $(shell git rev-parse --short=12 HEAD)" in make
    assert "--image $(REGISTRY)/foxhunt-mlflow:$(IMAGE_TAG)" in make
    for image in ("foxhunt-cpu", "foxhunt-gpu", "foxhunt-mlflow"):
        assert f"$(REGISTRY)/{image}:$(IMAGE_TAG)" in make


def test_gpu_benchmark_runs_foxhunt_bench_on_a_gpu_node(compiled):
    """One GPU task with the fxcache volume (where report.json of earlier runs, the gate's
    baselines, are kept) and the MLflow Secret; its Markdown report shows in the UI."""
    text, doc = compiled["gpu-benchmark.yaml"]
    assert set(tasks(doc)) == {"bench"}
    c = executor(doc, "bench")
    assert c["image"] == GPU_IMAGE and c["resources"]["accelerator"]["resourceCount"] == "1"
    k8s = doc["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-bench"]
    assert k8s["pvcMount"][0]["mountPath"] == "/data/work"
    assert k8s["secretAsEnv"][0]["secretName"] == "foxhunt-mlflow"
    assert int(k8s["activeDeadlineSeconds"]) == 4 * 3600
    outs = doc["components"]["comp-bench"]["outputDefinitions"]["artifacts"]
    assert outs["markdown"]["artifactType"]["schemaTitle"] == "system.Markdown"
    params = doc["root"]["inputDefinitions"]["parameters"]
    assert params["models"]["defaultValue"] == "dqn,ppo,pqn,tlob,cfc,mamba2,tft"
    assert params["fxcache_key"]["defaultValue"] == ""  # the synthetic market unless a key
    assert 'fxcache=Path(work_dir) / "fxcache" / fxcache_key' in c["command"][-1]
    assert "SENTINEL" not in text


def test_the_fan_out_plans_models_x_seeds_and_folds_when_asked(tmp_path):
    from types import SimpleNamespace

    from components import plan_tasks

    f = tmp_path / "folds.json"
    f.write_text(json.dumps({"folds": [{"fold": 0}, {"fold": 2}]}))
    art = SimpleNamespace(path=str(f))
    got = plan_tasks.python_func(model="dqn, tlob", seeds=[0, 1.0], folds=art, fold_tasks=False,
                                 seeds_together=False)  # fmt: skip
    assert got == [{"model": m, "seed": s, "seeds": "", "fold": -1}
                   for m in ("dqn", "tlob") for s in (0, 1)]  # fmt: skip
    got = plan_tasks.python_func(model="ppo", seeds=[3], folds=art, fold_tasks=True)
    assert got == [{"model": "ppo", "seed": 3, "seeds": "", "fold": k} for k in (0, 2)]
    # By default an agent's seeds are one task; a supervised model's are not (its dropout
    # draws from torch's global generator), nor a data-parallel task's.
    got = plan_tasks.python_func(model="dqn,tlob", seeds=[0, 1.0, 2], folds=art, fold_tasks=True)
    assert got == [{"model": "dqn", "seed": 0, "seeds": "0,1,2", "fold": k} for k in (0, 2)] + [
        {"model": "tlob", "seed": s, "seeds": "", "fold": k} for s in (0, 1, 2) for k in (0, 2)
    ]
    got = plan_tasks.python_func(model="ppo", seeds=list(range(21)), folds=art, fold_tasks=False)
    assert [t["seeds"] for t in got] == ["0,1,2,3,4,5,6,7,8,9", "10,11,12,13,14,15,16,17,18,19",
                                         ""]  # at most 10 a task; the 21st alone  # fmt: skip
    assert got[2]["seed"] == 20
    for many in ({"nodes": 2}, {"gpus_per_node": 4}):
        got = plan_tasks.python_func(model="pqn", seeds=[0, 1], folds=art, fold_tasks=False,
                                     **many)  # fmt: skip
        assert [t["seeds"] for t in got] == ["", ""]
    with pytest.raises(ValueError, match="name one or more of"):
        plan_tasks.python_func(model="dqn,xgb", seeds=[0], folds=art, fold_tasks=False)


def test_a_step_of_seeds_side_by_side_outputs_every_seed_and_the_best_model(tmp_path):
    """write_outputs for two seeds trained in one step: results of both, the best fold over
    both as the Model, each seed's aggregate as metrics of its own; for one seed, as before."""
    from types import SimpleNamespace

    from foxhunt.train.task import write_outputs

    def task(seed: int, vals: list[float]) -> tuple[int, Path]:
        d = tmp_path / f"seed{seed}"
        folds = [{"fold": k, "val": {"sharpe": v}, "test": {"sharpe": v / 2}}
                 for k, v in enumerate(vals)]  # fmt: skip
        for k in range(len(vals)):
            (d / f"fold-{k}").mkdir(parents=True)
            for name in ("best.safetensors", "best.json"):
                (d / f"fold-{k}" / name).write_text(f"{seed}/{k}/{name}")
        agg = {"test_sharpe": sum(vals) / 4, "test_profit_factor": float("inf")}
        (d / "results.json").write_text(json.dumps({"folds": folds, "aggregate": agg}))
        return seed, d

    tasks = [task(0, [1.0, 2.0]), task(1, [3.0, 0.5])]
    logged = {}
    metrics = SimpleNamespace(log_metric=lambda k, v: logged.__setitem__(k, v))
    model = SimpleNamespace(path=str(tmp_path / "model"), metadata={})
    write_outputs(tasks, str(tmp_path / "results.json"), model, metrics)
    doc = json.loads((tmp_path / "results.json").read_text())
    assert sorted(doc["seeds"]) == ["0", "1"]
    assert (model.metadata["seed"], model.metadata["fold"], model.metadata["val_sharpe"]) == (
        1,
        0,
        3.0,
    )
    assert (tmp_path / "model" / "best.safetensors").read_text() == "1/0/best.safetensors"
    assert logged == {"seed0_test_sharpe": 0.75, "seed1_test_sharpe": 0.875}  # no inf
    logged.clear()
    write_outputs(tasks[:1], str(tmp_path / "one.json"), model, metrics)
    assert json.loads((tmp_path / "one.json").read_text())["folds"][1]["val"]["sharpe"] == 2.0
    assert logged == {"test_sharpe": 0.75}
