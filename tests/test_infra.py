"""infra/: the kustomize base and the Secret templates, validated offline against Kubernetes
1.31's schemas (kubernetes-validate), plus the rules the cluster relies on."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from pipelines.platform import DATABENTO_SECRET, MLFLOW_SECRET

REPO = Path(__file__).resolve().parents[1]
BASE = REPO / "infra" / "base"
K8S_VERSION = "1.31.0"


def base_docs(root: Path = BASE) -> list[dict]:
    """The manifests a kustomization lists, following directories that are kustomizations."""
    kust = yaml.safe_load((root / "kustomization.yaml").read_text())
    docs = []
    for res in kust["resources"]:
        path = (root / res).resolve()
        if path.is_dir():
            docs += base_docs(path)
        else:
            docs += [d for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


def secret_templates() -> list[dict]:
    return [
        yaml.safe_load(p.read_text()) for p in sorted((REPO / "infra" / "secrets").glob("*.yaml"))
    ]


def by_kind(docs, kind):
    return [d for d in docs if d["kind"] == kind]


def test_every_manifest_validates_against_the_kubernetes_schemas():
    docs = base_docs() + secret_templates()
    assert len(docs) >= 10
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl (kustomize) not installed")
def test_kustomize_renders_the_base_and_the_result_validates():
    out = subprocess.run(["kubectl", "kustomize", str(BASE)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert {d["kind"] for d in docs} >= {"Namespace", "PersistentVolumeClaim", "Deployment",
                                         "Service", "NetworkPolicy"}  # fmt: skip
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        if d["kind"] != "Namespace":
            assert d["metadata"]["namespace"] == "foxhunt"
    (dep,) = by_kind(docs, "Deployment")
    assert dep["spec"]["template"]["spec"]["containers"][0]["image"].startswith("ghcr.io/")


def test_volumes_and_secret_names_match_the_pipelines():
    from pipelines.train_baseline import build_train_baseline

    inputs = build_train_baseline("cluster").component_spec.inputs
    pvcs = {d["metadata"]["name"] for d in by_kind(base_docs(), "PersistentVolumeClaim")}
    assert pvcs == {inputs["raw_pvc"].default, inputs["fxcache_pvc"].default}
    templates = {d["metadata"]["name"]: d for d in secret_templates()}
    for name, keys in (DATABENTO_SECRET, MLFLOW_SECRET):
        assert set(keys) <= set(templates[name]["stringData"]), name


def test_secret_templates_hold_no_values():
    for d in secret_templates():
        assert "data" not in d
        assert all(v == "" for v in d["stringData"].values()), d["metadata"]["name"]
    assert not by_kind(base_docs(), "Secret"), "applying the base must not overwrite Secrets"


def test_mlflow_runs_non_root_behind_allowed_hosts_and_a_network_policy():
    docs = base_docs()
    (dep,) = by_kind(docs, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    (script,) = c["args"]
    assert c["command"] == ["/bin/sh", "-c"] and "--app-name basic-auth" in script
    assert "--allowed-hosts=" in script and "backend-store-uri" in script
    env = {e["name"]: e for e in c["env"]}
    hosts = env["MLFLOW_SERVICE_HOSTS"]["value"].split(",")
    assert "mlflow.foxhunt.svc.cluster.local:5000" in hosts and "mlflow" in hosts
    for k in (
        "MLFLOW_ADMIN_PASSWORD",
        "MLFLOW_AUTH_DATABASE_URI",
        "MLFLOW_FLASK_SERVER_SECRET_KEY",
    ):
        assert "secretKeyRef" in env[k]["valueFrom"], k
    assert "secretKeyRef" in str(c["env"])  # store settings come from a Secret
    (svc,) = by_kind(docs, "Service")
    (np_,) = by_kind(docs, "NetworkPolicy")
    labels = pod_labels = dep["spec"]["template"]["metadata"]["labels"]
    assert np_["spec"]["podSelector"]["matchLabels"].items() <= pod_labels.items()
    assert svc["spec"]["selector"].items() <= labels.items()
    assert np_["spec"]["ingress"][0]["ports"][0]["port"] == 5000


def test_rendered_overlays_name_the_image_and_put_the_volumes_in_a_profile(tmp_path):
    import sys

    sys.path.insert(0, str(REPO / "infra"))
    import render

    kust = render.render_base("registry.example/team/foxhunt-mlflow:0123456789ab", tmp_path / "b")
    doc = yaml.safe_load(kust.read_text())
    (image,) = doc["images"]
    assert image["name"] == "foxhunt-mlflow" and image["newTag"] == "0123456789ab"
    assert image["newName"] == "registry.example/team/foxhunt-mlflow"
    assert (kust.parent / doc["resources"][0]).resolve() == BASE
    paths = render.render_volumes("team-a", "efs-sc", tmp_path / "v")
    docs = [yaml.safe_load(p.read_text()) for p in paths]
    assert {d["metadata"]["name"] for d in docs} == {"foxhunt-raw", "foxhunt-fxcache"}
    for d in docs:
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
        assert d["metadata"]["namespace"] == "team-a" and d["spec"]["storageClassName"] == "efs-sc"
        assert d["spec"]["accessModes"] == ["ReadWriteMany"]
    with pytest.raises(SystemExit, match="expected"):
        render.render_base("no-tag", tmp_path / "c")


def test_the_deployed_mlflow_server_answers_only_its_users(tmp_path):
    """The Deployment's own start script, run here with local stores: /health is open, the API
    wants a user (401 without, 200 with the admin's), and the password is in a mode-600 file
    under /tmp, not in the manifest; the Host header of a port-forward is accepted."""
    import os
    import signal
    import socket
    import sys
    import time
    import urllib.error
    import urllib.request

    (dep,) = by_kind(base_docs(), "Deployment")
    (c,) = dep["spec"]["template"]["spec"]["containers"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fixed = {e["name"]: e["value"] for e in c["env"] if "value" in e}
    env = os.environ | fixed | {
        "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}",
        "MLFLOW_AUTH_CONFIG_PATH": str(tmp_path / "basic_auth.ini"),
        "MLFLOW_AUTH_DATABASE_URI": f"sqlite:///{tmp_path / 'auth.db'}",
        "MLFLOW_ADMIN_USERNAME": "admin", "MLFLOW_ADMIN_PASSWORD": "pass-4-test-only",
        "MLFLOW_FLASK_SERVER_SECRET_KEY": "0123456789abcdef",
        "MLFLOW_BACKEND_STORE_URI": f"sqlite:///{tmp_path / 'mlflow.db'}",
        "MLFLOW_ARTIFACTS_DESTINATION": str(tmp_path / "artifacts"),
        "MLFLOW_HOST": "127.0.0.1", "MLFLOW_PORT": str(port),
    }  # fmt: skip
    log = open(tmp_path / "server.log", "w")
    proc = subprocess.Popen(["/bin/sh", "-c", c["args"][0]], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def get(path, user=None):
        req = urllib.request.Request(url + path)
        if user:
            import base64

            token = base64.b64encode(f"{user[0]}:{user[1]}".encode()).decode()
            req.add_header("Authorization", f"Basic {token}")
        try:
            with urllib.request.urlopen(req, timeout=60) as r:  # a loaded machine is slow
                return r.status
        except urllib.error.HTTPError as e:
            return e.code

    try:
        deadline = time.time() + 120
        while True:
            try:
                if get("/health") == 200:
                    break
            except OSError:
                pass
            if proc.poll() is not None or time.time() > deadline:
                pytest.fail("server did not start:\n" + (tmp_path / "server.log").read_text())
            time.sleep(0.5)
        api = "/api/2.0/mlflow/experiments/search?max_results=1"
        assert get(api) == 401
        assert get(api, ("admin", "wrong")) == 401
        assert get(api, ("admin", "pass-4-test-only")) == 200
        ini = tmp_path / "basic_auth.ini"
        assert ini.stat().st_mode & 0o077 == 0 and "pass-4-test-only" in ini.read_text()
        manifest = (BASE / "mlflow-deployment.yaml").read_text()
        assert "pass-4-test-only" not in manifest and "admin_password = $" in manifest
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
        log.close()


def test_the_trainer_runtime_and_rbac_validate():
    """infra/trainer: the TrainingRuntime multi-node training refers to (its pod template
    validated as the batch/v1 Job the Trainer makes of it; the torch policy; non-root) and the
    Role that lets the pipeline's service account create and follow TrainJobs."""
    docs = [d for p in sorted((REPO / "infra" / "trainer").glob("*.yaml"))
            for d in yaml.safe_load_all(p.read_text()) if d]  # fmt: skip
    (rt,) = by_kind(docs, "TrainingRuntime")
    assert rt["apiVersion"] == "trainer.kubeflow.org/v1alpha1"
    assert rt["metadata"]["name"] == "foxhunt-torch"  # foxhunt.train.trainjob.RUNTIME
    assert rt["spec"]["mlPolicy"]["torch"]["numProcPerNode"] == "auto"
    (rj,) = rt["spec"]["template"]["spec"]["replicatedJobs"]
    assert rj["name"] == "node"  # the name the TrainJob's podSpecOverrides target
    job = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "node"},
           "spec": rj["template"]["spec"]}  # fmt: skip
    kubernetes_validate.validate(job, K8S_VERSION, strict=True)
    pod = rj["template"]["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] and pod["containers"][0]["name"] == "node"
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["NCCL_NVLS_ENABLE"] == "0"
    for d in by_kind(docs, "Role") + by_kind(docs, "RoleBinding"):
        kubernetes_validate.validate(d, K8S_VERSION, strict=True)
    (role,) = by_kind(docs, "Role")
    assert role["rules"][0]["resources"] == ["trainjobs"]
    assert {"create", "get", "delete"} <= set(role["rules"][0]["verbs"])


def test_a_trainjob_s_pod_parts_validate():
    """The volumes, mounts and Secret-backed environment foxhunt puts into a TrainJob are
    valid pod fields (checked inside a Pod)."""
    from foxhunt.train.trainjob import manifest

    m = manifest(name="j", namespace="ns", image="img", config_path="/data/work/c.json",
                 nodes=2, gpus_per_node=4, fxcache_pvc="foxhunt-fxcache",
                 tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists"}])  # fmt: skip
    t, (o,) = m["spec"]["trainer"], m["spec"]["podSpecOverrides"]
    container = {"name": "node", "image": t["image"], "command": t["command"], "env": t["env"],
                 "resources": t["resourcesPerNode"],
                 "volumeMounts": o["containers"][0]["volumeMounts"]}  # fmt: skip
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "node"},
           "spec": {"volumes": o["volumes"], "tolerations": o["tolerations"],
                    "containers": [container]}}  # fmt: skip
    kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
    assert {e["valueFrom"]["secretKeyRef"]["name"] for e in t["env"]} == {MLFLOW_SECRET[0]}
