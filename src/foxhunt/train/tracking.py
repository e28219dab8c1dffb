"""The trainer's logger interface: a no-op logger and an MLflow logger.

MLflow layout (../shared/docs/DESIGN.md, Tracking): one parent run per training task, one child
run per fold; parameters logged once; metrics `losses/*`, `charts/*`, `eval/*`, `time/*` with
step = epoch; checkpoints as artifacts of the fold's run; the parent carries the aggregate test
metrics. The store is `MLFLOW_TRACKING_URI` when set, else sqlite in the working directory.
mlflow is imported only when this logger is used: the GPU training image can run without it.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Protocol

from foxhunt.errors import StepError


class Logger(Protocol):
    def start_task(
        self, name: str, params: dict, tags: dict, resume_id: str | None, dataset: dict | None
    ) -> str: ...
    def start_fold(
        self, fold: int, tags: dict, resume_id: str | None, name: str | None,
        params: dict | None, dataset: dict | None,
    ) -> str: ...  # fmt: skip
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None: ...
    def log_artifact(self, path: Path, artifact_path: str | None = None) -> None: ...
    def end_fold(self) -> None: ...
    def end_task(self, metrics: dict[str, float]) -> None: ...
    def abort(self, status: str) -> None:
        """End the open runs with `status` (FAILED or KILLED): a task that stops early never
        leaves a run RUNNING."""

    def log_model(self, checkpoint: Path) -> str | None:
        """Log a checkpoint as a model of the open run; its model URI (None: not logged)."""

    def register_model(self, model_uri: str, name: str, tags: dict) -> None:
        """Register a logged model under `name`, its version tagged with `tags`."""


class NullLogger:
    """Logs nothing (tests, benchmarks)."""

    def start_task(self, name, params, tags, resume_id=None, dataset=None) -> str:
        return ""

    def start_fold(self, fold, tags, resume_id=None, name=None, params=None, dataset=None) -> str:
        return ""

    def log_metrics(self, metrics, step=None) -> None:
        pass

    def log_artifact(self, path, artifact_path=None) -> None:
        pass

    def end_fold(self) -> None:
        pass

    def end_task(self, metrics) -> None:
        pass

    def abort(self, status) -> None:
        pass

    def log_model(self, checkpoint) -> None:
        return None

    def register_model(self, model_uri, name, tags) -> None:
        pass


def default_tracking_uri() -> str:
    return os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{Path.cwd() / 'mlflow.db'}"


class TrackingError(StepError):
    pass


def require_tracking_uri() -> str:
    """The tracking server of a pipeline task, from MLFLOW_TRACKING_URI (the foxhunt-mlflow
    Secret on a cluster; `make run` sets a local store). Without it a task would log to a
    sqlite file inside its pod, gone with the pod: that is an error, not a default."""
    uri = os.environ.get("MLFLOW_TRACKING_URI", "")
    if not uri:
        raise TrackingError(
            "MLFLOW_TRACKING_URI is not set, so this task's runs would be lost with its pod. "
            "Create the Secret foxhunt-mlflow (key tracking-uri; infra/secrets/foxhunt-mlflow.yaml"
            ") in the namespace the pipeline runs in, or set MLFLOW_TRACKING_URI"
        )
    return uri


# MLflow 3's UI opens an experiment of this kind in the classic tracking view (runs, metrics,
# the compare view) rather than the GenAI one.
EXPERIMENT_KIND = {"mlflow.experimentKind": "custom_model_development"}


def client_and_experiment(experiment: str, tracking_uri: str | None = None):
    """An MlflowClient on the store and the id of `experiment`, created when missing."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri or default_tracking_uri())
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        try:
            return client, client.create_experiment(experiment, tags=EXPERIMENT_KIND)
        except mlflow.exceptions.MlflowException:
            # Another task created it since (tasks side by side on a new store).
            exp = client.get_experiment_by_name(experiment)
            if exp is None:
                raise
    if "mlflow.experimentKind" not in exp.tags:
        for k, v in EXPERIMENT_KIND.items():
            client.set_experiment_tag(exp.experiment_id, k, v)
    return client, exp.experiment_id


def source_tags(source: str) -> dict[str, str]:
    """MLflow's own tags for who ran what: user, source, code version (its columns in the UI)."""
    from foxhunt.provenance import code_version

    user = os.environ.get("FOXHUNT_USER") or os.environ.get("USER") or "foxhunt"
    tags = {"mlflow.user": user, "mlflow.source.name": source, "mlflow.source.type": "JOB",
            "code_version": code_version()}  # fmt: skip
    if commit := os.environ.get("FOXHUNT_GIT_COMMIT"):
        tags["mlflow.source.git.commit"] = commit
    return tags


def log_params(client, run_id: str, params: dict) -> None:
    """Parameters, flattened (`dqn.lr`), in batches of MLflow's limit of 100."""
    from mlflow.entities import Param

    items = [Param(k, str(v)[:6000]) for k, v in flatten(params).items()]
    for i in range(0, len(items), 100):
        client.log_batch(run_id, params=items[i : i + 100])


def flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out |= flatten(v, key + ".")
        else:
            out[key] = v
    return out


def start_pipeline_run(
    experiment: str, name: str, tags: dict[str, str], params: dict, tracking_uri: str | None = None
) -> str:
    """The parent run of one pipeline run: the training tasks (one per model and seed) are its
    children and their folds its grandchildren; the report step logs the aggregate test metrics,
    the deflated Sharpe ratio and the plots on it. Returns its run id."""
    client, exp_id = client_and_experiment(experiment, tracking_uri)
    commit = os.environ.get("FOXHUNT_GIT_COMMIT")
    tags = {
        "foxhunt.level": "pipeline",
        **source_tags("train-baseline (Kubeflow Pipelines)"),
        **({"git_commit": commit} if commit else {}),
        **tags,
    }
    tags = {k: str(v) for k, v in tags.items()}
    run = client.create_run(exp_id, run_name=name, tags=tags)
    log_params(client, run.info.run_id, params)
    return run.info.run_id


def end_pipeline_run(
    run_id: str, status: str, message: str = "", tracking_uri: str | None = None
) -> None:
    """End the pipeline's parent run (FINISHED, FAILED or KILLED), with the pipeline's error
    message as a tag when it failed. The report step ends it FINISHED when all went well; the
    pipeline's exit handler calls this whatever happened."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri or default_tracking_uri())
    if message:
        client.set_tag(run_id, "foxhunt.error", message[:5000])
    client.set_terminated(run_id, status)


def find_pipeline_run(experiment: str, kfp_run_id: str, tracking_uri: str | None = None) -> str:
    """The run id of the pipeline run's parent (made by `start_pipeline_run`), by its KFP run
    id tag; '' when there is none."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri or default_tracking_uri())
    exp = client.get_experiment_by_name(experiment)
    if exp is None or not kfp_run_id:
        return ""
    runs = client.search_runs(
        [exp.experiment_id],
        filter_string=f"tags.kfp_run_id = '{kfp_run_id}' and tags.`foxhunt.level` = 'pipeline'",
        max_results=1,
    )
    return runs[0].info.run_id if runs else ""


class MlflowLogger:
    def __init__(self, experiment: str = "foxhunt", tracking_uri: str | None = None):
        self.tracking_uri = tracking_uri or default_tracking_uri()
        self.client, self.experiment_id = client_and_experiment(experiment, self.tracking_uri)
        self.parent: str | None = None
        self.child: str | None = None

    def _exists(self, run_id: str | None) -> bool:
        """A resumed task continues its runs only where they live in this store (a resume
        file can outlive a tracking store, or come from another one)."""
        if not run_id:
            return False
        from mlflow.exceptions import MlflowException

        try:
            self.client.get_run(run_id)
            return True
        except MlflowException as e:
            # Absent from this store: a new run. Anything else (the server unreachable, a 5xx
            # after the client's own retries) is raised, so that a retry never forks a run
            # it could have continued.
            if e.error_code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
                return False
            raise

    def start_task(self, name, params, tags, resume_id=None, dataset=None) -> str:
        if self._exists(resume_id):
            self.parent = resume_id
            return resume_id
        tags = {**source_tags("foxhunt train"), **tags}
        tags = {k: str(v) for k, v in tags.items()}  # the REST store wants strings
        run = self.client.create_run(self.experiment_id, run_name=name, tags=tags)
        self.parent = run.info.run_id
        log_params(self.client, self.parent, params)
        if dataset:
            self._log_dataset(self.parent, dataset)
        return self.parent

    def _log_dataset(self, run_id: str, d: dict) -> None:
        """The fxcache the run trained on, as an MLflow dataset input (the Datasets column)."""
        import json

        from mlflow.entities import Dataset, DatasetInput, InputTag

        ds = Dataset(
            name=d["name"], digest=d["digest"], source_type="fxcache",
            source=json.dumps(d["source"]), schema=json.dumps(d["schema"]),
            profile=json.dumps(d["profile"]),
        )  # fmt: skip
        tags = [InputTag(key="mlflow.data.context", value="training")]
        inputs = [DatasetInput(dataset=ds, tags=tags)]
        # Tasks running side by side (seeds, folds) log the same dataset at once, and MLflow's
        # store checks for the dataset and then inserts it: the task that loses the race gets
        # a unique-constraint error. The dataset then exists, and the call is idempotent: log
        # again (a failed task would otherwise retry from the start).
        from mlflow.exceptions import MlflowException

        for attempt in range(3):
            try:
                self.client.log_inputs(run_id, datasets=inputs)
                return
            except MlflowException:
                if attempt == 2:
                    raise
                time.sleep(0.5 * (attempt + 1))

    def start_fold(self, fold, tags, resume_id=None, name=None, params=None, dataset=None) -> str:
        if self._exists(resume_id):
            self.child = resume_id
            return resume_id
        run = self.client.create_run(
            self.experiment_id,
            run_name=name or f"fold-{fold}",
            tags={
                **source_tags("foxhunt train"),
                **{k: str(v) for k, v in tags.items()},
                "fold": str(fold),
                "mlflow.parentRunId": self.parent,
            },
        )
        self.child = run.info.run_id
        if params:
            log_params(self.client, self.child, params)
        if dataset:
            self._log_dataset(self.child, dataset)
        return self.child

    def _run(self) -> str:
        return self.child or self.parent

    def log_metrics(self, metrics, step=None) -> None:
        import time

        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        # An undefined value (a profit factor without a losing bar) is left out, not logged as
        # inf: MLflow's charts and the compare view take numbers.
        items = [
            Metric(k, float(v), now, step or 0) for k, v in metrics.items() if math.isfinite(v)
        ]
        if items:
            self.client.log_batch(self._run(), metrics=items)

    def log_artifact(self, path, artifact_path=None) -> None:
        self.client.log_artifact(self._run(), str(path), artifact_path)

    def end_fold(self) -> None:
        if self.child:
            self.client.set_terminated(self.child)
        self.child = None

    def end_task(self, metrics) -> None:
        if metrics:
            self.log_metrics(metrics)
        self.client.set_terminated(self.parent)

    def log_model(self, checkpoint) -> str:
        """The checkpoint as a pyfunc model of the open run (foxhunt.train.mlflow_model): it
        loads anywhere with torch and acts on raw market rows and portfolio states."""
        import mlflow

        from foxhunt.train.mlflow_model import log_policy_model

        previous = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(self.tracking_uri)  # the fluent API logs models
        try:
            with mlflow.start_run(run_id=self._run()):  # ends it FINISHED; end_fold follows
                return log_policy_model(Path(checkpoint)).model_uri
        finally:
            mlflow.set_tracking_uri(previous)

    def register_model(self, model_uri, name, tags) -> None:
        import mlflow

        previous = mlflow.get_tracking_uri()
        mlflow.set_tracking_uri(self.tracking_uri)
        try:
            mlflow.register_model(model_uri, name, tags={k: str(v) for k, v in tags.items()})
        finally:
            mlflow.set_tracking_uri(previous)

    def abort(self, status) -> None:
        for run_id in (self.child, self.parent):
            if run_id:
                self.client.set_terminated(run_id, status)
        self.child = None
