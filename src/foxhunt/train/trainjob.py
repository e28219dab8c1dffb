"""Training on several nodes: a Kubeflow Trainer v2 TrainJob that runs `foxhunt train` on every
node under torchrun, submitted and followed from a pipeline step.

The step (components/train_job.py) writes the task's TrainConfig as JSON onto the fxcache
volume, creates a TrainJob (trainer.kubeflow.org/v1alpha1) that refers to the `foxhunt-torch`
TrainingRuntime (infra/trainer/), with the GPU image, `nodes` x `gpus_per_node` processes, the
fxcache volume and the MLflow Secret, then follows it until it completes or fails; a failed job
fails the step with the job's reason. Each node's container runs

    torchrun -m foxhunt.train.job <config.json>

(the runtime's torch policy hands torchrun the nodes, ranks and rendezvous), which is
`foxhunt train` for that config (foxhunt.train.distributed: rank 0 writes results.json on the
shared volume, where the step reads it).

Why the Kubernetes API rather than the `kubeflow` SDK's TrainerClient: its CustomTrainer ships
a Python function into the runtime's own image, and we need our image, our command, a PVC and a
Secret on every node, which a TrainJob spec says directly; the API calls are three (create,
get, delete) through the `kubernetes` client KFP already installs.
"""

from __future__ import annotations

import dataclasses
import json
import time
import typing
from collections.abc import Callable
from pathlib import Path

from foxhunt.secrets import MLFLOW_SECRET

GROUP, VERSION, PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
RUNTIME = "foxhunt-torch"
MOUNT = "/data/work"


class TrainJobFailed(RuntimeError):
    pass


# ---------------------------------------------------------------------------------- config
def config_to_json(cfg) -> str:
    return json.dumps(dataclasses.asdict(cfg), default=str, indent=1)


def config_from_dict(cls, d: dict):
    """A (nested) config dataclass from its `asdict` form: nested dataclasses rebuilt, lists
    back to tuples, paths back to Paths."""
    hints = typing.get_type_hints(cls)
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        v, t = d[f.name], hints[f.name]
        if dataclasses.is_dataclass(t) and isinstance(v, dict):
            v = config_from_dict(t, v)
        elif t is Path or (typing.get_origin(t) is typing.Union and Path in typing.get_args(t)):
            v = Path(v) if v is not None else None
        elif isinstance(v, list):
            v = tuple(v)
        kw[f.name] = v
    return cls(**kw)


def load_config(path: Path):
    from foxhunt.train.core import TrainConfig

    return config_from_dict(TrainConfig, json.loads(Path(path).read_text()))


# ---------------------------------------------------------------------------------- the job
def manifest(name: str, namespace: str, image: str, config_path: str, nodes: int,
             gpus_per_node: int, fxcache_pvc: str, mlflow_secret: tuple = MLFLOW_SECRET,
             gpu_resource: str = "nvidia.com/gpu", node_selector: dict | None = None,
             tolerations: list | None = None, labels: dict | None = None,
             runtime: str = RUNTIME) -> dict:  # fmt: skip
    """The TrainJob: `nodes` nodes of `gpus_per_node` processes each, on `runtime`."""
    secret, keys = mlflow_secret
    env = [{"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": key,
                                                        "optional": True}}}
           for key, var in keys.items()]  # fmt: skip
    per_node = {gpu_resource: str(gpus_per_node)}
    mount = {"name": "fxcache", "mountPath": MOUNT}
    override = {"targetJobs": [{"name": "node"}],
                "volumes": [{"name": "fxcache",
                             "persistentVolumeClaim": {"claimName": fxcache_pvc}}],
                "containers": [{"name": "node", "volumeMounts": [mount]}]}  # fmt: skip
    if node_selector:
        override["nodeSelector"] = node_selector
    if tolerations:
        override["tolerations"] = tolerations
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace, "labels": labels or {}},
        "spec": {
            "runtimeRef": {"name": runtime, "apiGroup": GROUP, "kind": "TrainingRuntime"},
            "trainer": {
                "image": image,
                "command": ["torchrun", "-m", "foxhunt.train.job", config_path],
                "numNodes": nodes,
                "numProcPerNode": gpus_per_node,
                "resourcesPerNode": {"requests": per_node, "limits": per_node},
                "env": env,
            },
            "podSpecOverrides": [override],
        },
    }


def condition(job: dict) -> tuple[str, str] | None:
    """('Complete' | 'Failed', reason and message) once the job has ended, else None."""
    for c in job.get("status", {}).get("conditions", []) or []:
        if c.get("type") in ("Complete", "Failed") and c.get("status") == "True":
            why = ": ".join(x for x in (c.get("reason"), c.get("message")) if x)
            return c["type"], why
    return None


def run(api, job: dict, poll_s: float = 15.0, timeout_s: float = 48 * 3600,
        log: Callable[[str], None] = print) -> dict:  # fmt: skip
    """Create the TrainJob and follow it to its end; its last state. A failed job raises
    TrainJobFailed with its reason; one past `timeout_s` is deleted and raises too. `api` is
    a kubernetes.client.CustomObjectsApi."""
    ns, name = job["metadata"]["namespace"], job["metadata"]["name"]
    api.create_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, job)
    log(f"TrainJob {ns}/{name}: {job['spec']['trainer']['numNodes']} node(s) x "
        f"{job['spec']['trainer']['numProcPerNode']} GPU(s) submitted")  # fmt: skip
    start = time.monotonic()
    while True:
        state = api.get_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
        ended = condition(state)
        if ended is not None:
            kind, why = ended
            if kind == "Failed":
                raise TrainJobFailed(f"TrainJob {ns}/{name} failed: {why or 'no reason given'}")
            log(f"TrainJob {ns}/{name} completed")
            return state
        if time.monotonic() - start > timeout_s:
            api.delete_namespaced_custom_object(GROUP, VERSION, ns, PLURAL, name)
            raise TrainJobFailed(f"TrainJob {ns}/{name} ran past {timeout_s:.0f} s: deleted")
        time.sleep(poll_s)


def in_cluster_api():
    """The CustomObjectsApi of the cluster this pod runs in (its service account)."""
    from kubernetes import client, config

    config.load_incluster_config()
    return client.CustomObjectsApi()


def pod_namespace() -> str:
    return Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace").read_text().strip()
