"""python -m pipelines {compile,run-local,submit}: the pipelines as users run them.

python -m pipelines compile                         build/<pipeline>.yaml (cluster) and
                                                    build/<pipeline>.local.yaml
python -m pipelines run-local train-baseline --demo the pipeline through KFP's local runner
python -m pipelines submit train-baseline epochs=20 seeds=[0,1,2]
                                                    compile and submit to $KFP_HOST
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import unittest.mock
import warnings
from pathlib import Path

BUILD = Path("build")


def demo_params(model: str = "dqn") -> dict:
    """make run's demo as pipeline parameters: foxhunt.train.demo's settings, each model's in
    its own section of `overrides` (the train step reads the chosen model's), and the epochs
    of `model`, so that `run-local train-baseline --demo model=ppo` trains PPO at its demo
    settings."""
    import dataclasses

    from foxhunt.train import demo

    def changed(cfg) -> dict:
        """The fields where a demo config differs from its class's defaults (JSON-ready)."""
        default = type(cfg)()

        def plain(v):
            if dataclasses.is_dataclass(v):  # the ensemble's members' settings
                return changed(v)
            return list(v) if isinstance(v, tuple) else v

        return {
            f.name: plain(v)
            for f in dataclasses.fields(cfg)
            if (v := getattr(cfg, f.name)) != getattr(default, f.name)
        }

    e = demo.ENV
    return {
        "epochs": demo.epochs(model),
        "seeds": [0],
        "fee_bps": e.fee_bps,
        "half_spread_bps": e.half_spread_bps,
        "overrides": json.dumps(
            {
                "dqn": changed(demo.DQN),
                "ppo": changed(demo.PPO),
                "pqn": changed(demo.PQN),
                "tlob": changed(demo.TLOB),
                "cfc": changed(demo.CFC),
                "mamba2": changed(demo.MAMBA2),
                "tft": changed(demo.TFT),
                "ensemble": changed(demo.ENSEMBLE),
                "env": {"episode_bars": e.episode_bars},
                "train": {"eval_segments": demo.EVAL_SEGMENTS},
            }
        ),
    }


class SubmitError(RuntimeError):
    pass


class LocalRunFailed(RuntimeError):
    """A pipeline run through KFP's local runner ended with a failed task."""


# Values a parameter may take where its type alone does not say (the Literal types of FoldSpec
# and TrainConfig; a test keeps them equal).
CHOICES = {
    "window": ("sliding", "expanding"),
    "model": ("dqn", "ppo", "pqn", "tlob", "cfc", "mamba2", "tft", "ensemble"),
}
_JSON_TYPES = {
    "Integer": (int,),
    "Float": (int, float),
    "Boolean": (bool,),
    "List": (list,),
    "Struct": (dict,),
}


def pipeline_inputs(pipeline: str) -> dict:
    """name -> KFP input spec (type, default) of a pipeline's parameters."""
    from pipelines import PIPELINES

    if pipeline not in PIPELINES:
        raise SubmitError(f"no pipeline {pipeline!r}; choose from {', '.join(PIPELINES)}")
    return dict(PIPELINES[pipeline]("local").component_spec.inputs)


def split_params(text: str) -> list[str]:
    """'a=1 overrides={"dqn": {"atoms": 21}}' -> ['a=1', 'overrides={...}']: a new parameter
    starts at whitespace followed by a name and '=', so JSON values may hold spaces (make
    passes PARAMS as one string)."""
    return [p for p in re.split(r"\s+(?=[A-Za-z_][A-Za-z0-9_]*=)", text.strip()) if p]


def parse_params(items: list[str], pipeline: str = "train-baseline") -> dict:
    """name=value pairs checked against the pipeline's own parameters: String stays as written
    (JSON in `overrides` too); Integer, Double, Boolean and List parse as JSON of exactly that
    type (epochs=2.5, lr=true and seeds=0 are refused); a few strings take named choices."""
    inputs = pipeline_inputs(pipeline)
    out = {}
    for item in items:
        if "=" not in item:
            raise SubmitError(f"parameter {item!r}: expected name=value")
        k, v = item.split("=", 1)
        if k not in inputs:
            raise SubmitError(f"{pipeline} has no parameter {k!r}; it has {', '.join(inputs)}")
        kind = inputs[k].type
        if kind == "String":
            # model may name several models, by commas: each trains with every seed
            given = [x.strip() for x in v.split(",")] if k == "model" else [v]
            if k in CHOICES and not all(x in CHOICES[k] for x in given):
                many = " (several by commas)" if k == "model" else ""
                raise SubmitError(
                    f"parameter {k}={v!r}: choose one of {', '.join(CHOICES[k])}{many}"
                )
            if k == "overrides":
                try:
                    json.loads(v)
                except json.JSONDecodeError as e:
                    raise SubmitError(f"parameter overrides: not JSON ({e})") from None
            out[k] = v
            continue
        try:
            value = json.loads(v)
        except json.JSONDecodeError:
            raise SubmitError(f"parameter {k}={v!r}: not a valid {kind}") from None
        ok = isinstance(value, _JSON_TYPES.get(kind, (object,)))
        if isinstance(value, bool) and kind != "Boolean":
            ok = False
        if not ok:
            raise SubmitError(f"parameter {k}={v!r}: {pipeline} wants a {kind} here")
        if k == "seeds" and not all(type(x) is int and x >= 0 for x in value):
            raise SubmitError(f"parameter seeds={v!r}: a list of non-negative integers")
        out[k] = value
    return out


def describe_params(pipeline: str) -> str:
    """The pipeline's parameters with their types and defaults (submit PIPELINE --help)."""
    lines = [f"parameters of {pipeline} (name=value; JSON for lists and numbers):", ""]
    for name, spec in pipeline_inputs(pipeline).items():
        default = json.dumps(spec.default) if spec.default is not None else "(required)"
        extra = f"  one of: {', '.join(CHOICES[name])}" if name in CHOICES else ""
        lines.append(f"  {name:18} {spec.type:8} default {default}{extra}")
    return "\n".join(lines)


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=Path(__file__).resolve().parent,  # the checkout, wherever the run starts
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def compile_all(out: Path = BUILD) -> list[Path]:
    from kfp import compiler

    from pipelines import PIPELINES

    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, build in PIPELINES.items():
        for platform, suffix in (("cluster", ""), ("local", ".local")):
            path = out / f"{name}{suffix}.yaml"
            compiler.Compiler().compile(build(platform), str(path))
            paths.append(path)
    return paths


class QuietExecutor:
    """Prints what a local task prints, less KFP's executor chatter: the executor input as
    indented JSON (tens of lines per task) and the component-loading messages. `run-local
    --verbose` prints everything."""

    NOISE = ("Looking for component", "Loading KFP component", "Wrote executor output file")
    ERROR = re.compile(r"^\s*(?:\w+\.)*(\w+(?:Error|Exception)): (.*\S)")
    """A traceback's last line: the exception's class (its module left out) and message."""

    def __init__(self) -> None:
        self.in_json = False
        self.error: str | None = None  # the last exception a task's log ended with

    def __call__(self, *args, **kwargs) -> None:
        line = " ".join(map(str, args))
        if m := self.ERROR.match(line):
            self.error = f"{m.group(1)}: {m.group(2)}"
        if self.in_json:
            self.in_json = line.rstrip("\n") != "}"  # the dump ends with an unindented brace
            return
        if "Got executor_input:" in line:
            self.in_json = True
            return
        if not any(n in line for n in self.NOISE):
            print(*args, **kwargs)


@contextlib.contextmanager
def tasks_tmpdir():
    """The tasks' temporary files in one folder, removed after them: each KFP lightweight step
    writes its code to a folder of `mktemp -d` and leaves it (a pod's disk goes with the pod),
    which on this machine would leave a folder in /tmp per task and run."""
    with tempfile.TemporaryDirectory(prefix="foxhunt-run-local-") as tmp:
        with unittest.mock.patch.dict(os.environ, TMPDIR=tmp):
            yield


def run_local(name: str, params: dict, verbose: bool = False) -> None:
    from kfp import local
    from kfp.local import subprocess_task_handler

    from pipelines import PIPELINES

    console = QuietExecutor()
    if not verbose:  # the handler prints each task's lines with print(): filter those
        subprocess_task_handler.print = console

    os.environ.setdefault("MLFLOW_TRACKING_URI", f"sqlite:///{Path('mlflow.db').resolve()}")
    if commit := git_commit():
        os.environ["FOXHUNT_GIT_COMMIT"] = commit
    params = {
        "raw_dir": str(Path("data/raw").resolve()),
        "work_dir": str(Path("data").resolve()),
    } | params
    local.init(
        runner=local.SubprocessRunner(use_venv=False),  # the project's venv runs every step
        pipeline_root=str((BUILD / "local_outputs").resolve()),
        raise_on_error=True,
    )
    warnings.filterwarnings("ignore", message="You may be attemping")
    if not verbose:  # each task's display name is for the Kubeflow UI; the local runner says so
        warnings.filterwarnings("ignore", message=r".*settings \['display_name'\] have no effect")
    t0 = time.perf_counter()
    try:
        with tasks_tmpdir():
            PIPELINES[name]("local")(**params)
    except RuntimeError as e:  # kfp.local's report of a failed task, with its colour codes
        said = re.sub(r"\x1b\[[0-9;]*m", "", str(e))
        if not (
            m := re.search(r"finished with status FAILURE\. Inner task failed: '([^']+)'", said)
        ):
            raise
        why = console.error or "its log above says why"
        raise LocalRunFailed(
            f"{name} failed after {time.perf_counter() - t0:.0f} s, at its task '{m.group(1)}': "
            f"{why}"
        ) from None
    print(f"\n{name} ran through KFP's local runner in {time.perf_counter() - t0:.0f} s")
    if name == "train-baseline":
        reports = sorted(
            Path(params["work_dir"], "report").glob("*/report.md"), key=os.path.getmtime
        )
        if reports:
            print(f"\n{reports[-1].read_text()}\nreport: {reports[-1].parent}")
        print(f"MLflow: {os.environ['MLFLOW_TRACKING_URI']}; `make ui` serves it on 127.0.0.1:5000")


LOGIN_HELP = (
    "log in first: for a Kubeflow behind Dex/oauth2-proxy, KFP_COOKIES='authservice_session=<the "
    "cookie of a logged-in browser tab>' (or 'oauth2_proxy=...'); with a bearer token, "
    "KFP_TOKEN=<token> (e.g. `kubectl create token <service account> -n <profile namespace>`); "
    "inside the cluster, KF_PIPELINES_SA_TOKEN_PATH names the projected token file; and "
    "KFP_NAMESPACE (or --namespace) your profile namespace"
)


def auth() -> dict:
    """How to authenticate to KFP_HOST, from the environment: a bearer token (KFP_TOKEN, or the
    file KF_PIPELINES_SA_TOKEN_PATH names), or session cookies (KFP_COOKIES, for Dex)."""
    token = os.environ.get("KFP_TOKEN", "")
    path = os.environ.get("KF_PIPELINES_SA_TOKEN_PATH", "")
    if not token and path:
        try:
            token = Path(path).read_text().strip()
        except OSError as e:
            raise SubmitError(f"KF_PIPELINES_SA_TOKEN_PATH={path}: cannot read it ({e})") from None
    return {"token": token or None, "cookies": os.environ.get("KFP_COOKIES") or None}


def preflight(host: str, creds: dict, timeout: float = 10.0) -> None:
    """One request to the API's health endpoint with the credentials, so that a refusal says
    'not authorised' at once instead of the client's retries timing out half a minute later."""
    import urllib.error
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args, **kwargs):
            return None

    req = urllib.request.Request(f"{host.rstrip('/')}/apis/v2beta1/healthz")
    if creds["token"]:
        req.add_header("Authorization", f"Bearer {creds['token']}")
    if creds["cookies"]:
        req.add_header("Cookie", creds["cookies"])
    opener = urllib.request.build_opener(NoRedirect)
    try:
        with opener.open(req, timeout=timeout) as r:
            kind = r.headers.get("Content-Type", "")
            if "html" in kind:  # a login page served in place of the API
                raise SubmitError(f"KFP_HOST={host} answered with a web page, not the API: "
                                  f"not authorised; {LOGIN_HELP}")  # fmt: skip
    except urllib.error.HTTPError as e:
        if e.code in (401, 403) or 300 <= e.code < 400:
            what = "redirected to a login page" if e.code < 400 else f"{e.code} {e.reason}"
            raise SubmitError(f"KFP_HOST={host}: not authorised ({what}); {LOGIN_HELP}") from None
        raise SubmitError(f"KFP_HOST={host}: the API answered {e.code} {e.reason}") from None
    except (urllib.error.URLError, TimeoutError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise SubmitError(f"KFP_HOST={host}: cannot reach the KFP API ({reason})") from None


def image_status(image: str) -> tuple[str, str]:
    """('present' | 'missing' | 'unknown', how it was told) for an image in its registry, asked
    with the first of docker, skopeo or crane found here (their own login is used)."""
    tools = (
        ("docker", ["docker", "manifest", "inspect", image]),
        ("skopeo", ["skopeo", "inspect", "--raw", f"docker://{image}"]),
        ("crane", ["crane", "manifest", image]),
    )
    for tool, cmd in tools:
        if shutil.which(tool) is None:
            continue
        try:
            r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired) as e:
            return "unknown", f"{tool}: {e}"
        if r.returncode == 0:
            return "present", tool
        err = (r.stderr or r.stdout).strip().lower()
        if any(m in err for m in ("no such manifest", "manifest unknown", "not found")):
            return "missing", tool
        return "unknown", f"{tool}: {err.splitlines()[-1] if err else r.returncode}"
    return "unknown", "no docker, skopeo or crane here"


def check_images(images: list[str]) -> None:
    """Refuse to submit a pipeline whose images are not in their registry (pods would sit in
    ImagePullBackOff); when it cannot be told from here, say so and go on."""
    for image in images:
        status, how = image_status(image)
        if status == "missing":
            raise SubmitError(
                f"image {image} is not in its registry ({how}): build and push it "
                "(make images REGISTRY=... IMAGE_TAG=...), or set IMAGE_TAG to a tag that exists"
            )
        if status == "unknown":
            print(f"note: could not check that {image} exists ({how})", file=sys.stderr)


def submit(
    name: str,
    params: dict,
    experiment: str,
    run_name: str | None,
    namespace: str | None = None,
    check: bool = True,
) -> tuple[str, str]:
    """Compile `name`, upload it as a version of the pipeline `name` (one version per commit and
    compiled spec, so the Kubeflow UI lists it and can rerun any version), then start a run of
    that version in `experiment`. Returns (run id, version name)."""
    host = os.environ.get("KFP_HOST")
    if not host:
        raise SubmitError("KFP_HOST is not set: export KFP_HOST=https://<your Kubeflow>/pipeline")
    namespace = namespace or os.environ.get("KFP_NAMESPACE") or None
    creds = auth()
    preflight(host, creds)
    if check:
        from components.images import CPU_IMAGE, GPU_IMAGE

        check_images([CPU_IMAGE] if name == "precompute-features" else [CPU_IMAGE, GPU_IMAGE])
    paths = compile_all()
    package = next(p for p in paths if p.name == f"{name}.yaml")
    commit = (git_commit() or "nocommit")[:12]
    version = f"{commit}-{hashlib.sha256(package.read_bytes()).hexdigest()[:8]}"
    import kfp

    try:
        client = kfp.Client(
            host=host, existing_token=creds["token"], cookies=creds["cookies"],
            **({"namespace": namespace} if namespace else {}),
        )  # fmt: skip
        pipeline_id = client.get_pipeline_id(name)
        if pipeline_id is None:
            pipeline_id = client.upload_pipeline(
                str(package), pipeline_name=name, description=f"foxhunt {name}"
            ).pipeline_id
        version_id = _find_version(client, pipeline_id, version)
        if version_id is None:
            version_id = client.upload_pipeline_version(
                str(package), pipeline_version_name=version, pipeline_id=pipeline_id,
                description=f"commit {commit}",
            ).pipeline_version_id  # fmt: skip
        exp = client.create_experiment(experiment, namespace=namespace)
        run = client.run_pipeline(
            exp.experiment_id,
            run_name or f"{name} {time.strftime('%Y-%m-%d %H:%M:%S')}",
            params=params, pipeline_id=pipeline_id, version_id=version_id,
        )  # fmt: skip
    except Exception as e:  # the client raises urllib3, requests and ApiException errors
        status = getattr(e, "status", None)
        if status in (401, 403):
            raise SubmitError(f"KFP_HOST={host}: not authorised ({status}); {LOGIN_HELP}") from None
        raise SubmitError(
            f"KFP_HOST={host} did not accept the run: {type(e).__name__}: {e}"
        ) from None
    return run.run_id, version


def _find_version(client, pipeline_id: str, version: str) -> str | None:
    flt = json.dumps(
        {"predicates": [{"operation": "EQUALS", "key": "display_name", "stringValue": version}]}
    )
    found = client.list_pipeline_versions(pipeline_id, filter=flt).pipeline_versions or []
    return found[0].pipeline_version_id if found else None


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    # `submit PIPELINE --help` (or run-local): the pipeline's own parameters, typed, defaults.
    if len(argv) >= 3 and argv[0] in ("submit", "run-local") and set(argv[2:]) & {"-h", "--help"}:
        try:
            print(describe_params(argv[1]))
        except SubmitError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    ap = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("compile", help="write build/<pipeline>.yaml and .local.yaml")
    for cmd, text in (("run-local", "run a pipeline through KFP's local runner"),
                      ("submit", "upload a pipeline version and run it on $KFP_HOST")):  # fmt: skip
        p = sub.add_parser(cmd, help=text)
        p.add_argument("pipeline", help="train-baseline or precompute-features")
        p.add_argument("params", nargs="*", help="name=value (JSON for numbers and lists); "
                       "`PIPELINE --help` lists them")  # fmt: skip
        p.add_argument(
            "--params", dest="params_text", default="",
            help="the same as one string (as `make submit PARAMS=...` passes them)",
        )  # fmt: skip
    sub.choices["run-local"].add_argument(
        "--demo", action="store_true", help="make run's CPU-sized demo settings"
    )
    sub.choices["run-local"].add_argument(
        "--verbose", action="store_true", help="also KFP's executor input JSON and messages"
    )
    sb = sub.choices["submit"]
    sb.add_argument("--experiment", default="foxhunt")
    sb.add_argument("--run-name", default=None)
    sb.add_argument("--namespace", default=None, help="Kubeflow profile namespace "
                    "(default: $KFP_NAMESPACE)")  # fmt: skip
    sb.add_argument("--skip-image-check", action="store_true",
                    help="do not ask the registry whether the images exist")  # fmt: skip
    # name=value items may come before or after the options (argparse leaves the later ones over)
    args, extra = ap.parse_known_args(argv)
    stray = [x for x in extra if x.startswith("-") or "=" not in x]
    if stray or (extra and args.cmd == "compile"):
        ap.error(f"unrecognized arguments: {' '.join(stray or extra)}")
    try:
        if args.cmd == "compile":
            for p in compile_all():
                print(f"wrote {p}")
            return 0
        items = [*args.params, *extra, *split_params(args.params_text)]
        params = parse_params(items, args.pipeline)
        if args.cmd == "run-local":
            demo = demo_params(str(params.get("model", "dqn"))) if args.demo else {}
            run_local(args.pipeline, demo | params, args.verbose)
        else:
            run_id, version = submit(
                args.pipeline, params, args.experiment, args.run_name, args.namespace,
                check=not args.skip_image_check,
            )  # fmt: skip
            print(
                f"submitted {args.pipeline} version {version} to {os.environ['KFP_HOST']}: "
                f"run {run_id}"
            )
    except SubmitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except LocalRunFailed as e:
        print(f"\n{e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
