"""python -m pipelines {compile,run-local,submit}: the pipelines as users run them.

python -m pipelines compile                         build/<pipeline>.yaml (cluster) and
                                                    build/<pipeline>.local.yaml
python -m pipelines run-local train-baseline --demo the pipeline through KFP's local runner
python -m pipelines submit train-baseline epochs=20 seeds=[0,1,2]
                                                    compile and submit to $KFP_HOST
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import warnings
from pathlib import Path

BUILD = Path("build")


def demo_params() -> dict:
    """make run's demo as pipeline parameters: foxhunt.train.demo's settings."""
    from foxhunt.train import demo

    d, e = demo.DQN, demo.ENV
    return {
        "epochs": demo.EPOCHS,
        "seeds": [0],
        "gamma": d.gamma,
        "n_step": d.n_step,
        "lr": d.lr,
        "batch_size": d.batch_size,
        "envs": d.envs,
        "fee_bps": e.fee_bps,
        "half_spread_bps": e.half_spread_bps,
        "overrides": json.dumps(
            {
                "dqn": {
                    "hidden": list(d.hidden),
                    "head_hidden": d.head_hidden,
                    "v_min": d.v_min,
                    "v_max": d.v_max,
                    "collect_steps": d.collect_steps,
                    "learn_steps": d.learn_steps,
                },
                "env": {"episode_bars": e.episode_bars},
                "train": {"eval_segments": demo.EVAL_SEGMENTS},
            }
        ),
    }


class SubmitError(RuntimeError):
    pass


def parse_params(items: list[str], pipeline: str = "train-baseline") -> dict:
    """name=value pairs, typed by the pipeline's parameters: String stays as written (JSON in
    `overrides` too), Integer/Float/Boolean/List parse as JSON. Unknown names are an error."""
    from pipelines import PIPELINES

    if pipeline not in PIPELINES:
        raise SubmitError(f"no pipeline {pipeline!r}; choose from {', '.join(PIPELINES)}")
    types = {k: v.type for k, v in PIPELINES[pipeline]("local").component_spec.inputs.items()}
    out = {}
    for item in items:
        if "=" not in item:
            raise SubmitError(f"parameter {item!r}: expected name=value")
        k, v = item.split("=", 1)
        if k not in types:
            raise SubmitError(f"{pipeline} has no parameter {k!r}; it has {', '.join(types)}")
        if types[k] == "String":
            out[k] = v
            continue
        try:
            out[k] = json.loads(v)
        except json.JSONDecodeError:
            raise SubmitError(f"parameter {k}={v!r}: not a valid {types[k]}") from None
    return out


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


def run_local(name: str, params: dict) -> None:
    from kfp import local

    from pipelines import PIPELINES

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
    t0 = time.perf_counter()
    PIPELINES[name]("local")(**params)
    print(f"\n{name} ran through KFP's local runner in {time.perf_counter() - t0:.0f} s")
    if name == "train-baseline":
        reports = sorted(
            Path(params["work_dir"], "report").glob("*/report.md"), key=os.path.getmtime
        )
        if reports:
            print(f"\n{reports[-1].read_text()}\nreport: {reports[-1].parent}")
        print(f"MLflow: {os.environ['MLFLOW_TRACKING_URI']}; `make ui` serves it on 127.0.0.1:5000")


def submit(name: str, params: dict, experiment: str, run_name: str | None) -> str:
    host = os.environ.get("KFP_HOST")
    if not host:
        raise SubmitError(
            "KFP_HOST is not set: export KFP_HOST=https://<your Kubeflow Pipelines API>"
        )
    from pipelines import PIPELINES

    if name not in PIPELINES:
        raise SubmitError(f"no pipeline {name!r}; choose from {', '.join(PIPELINES)}")
    paths = compile_all()
    package = next(p for p in paths if p.name == f"{name}.yaml")
    import kfp

    try:
        client = kfp.Client(host=host)
        run = client.create_run_from_pipeline_package(
            str(package),
            arguments=params,
            run_name=run_name or f"{name}-{time.strftime('%Y%m%d-%H%M%S')}",
            experiment_name=experiment,
        )
    except Exception as e:  # the client raises urllib3, requests and ApiException errors
        raise SubmitError(
            f"KFP_HOST={host} did not accept the run: {type(e).__name__}: {e}"
        ) from None
    return run.run_id


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pipelines", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    sub = ap.add_subparsers(dest="cmd", required=True)
    sub.add_parser("compile", help="write build/<pipeline>.yaml and .local.yaml")
    rl = sub.add_parser("run-local", help="run a pipeline through KFP's local runner")
    rl.add_argument("pipeline")
    rl.add_argument("params", nargs="*", help="name=value (JSON values)")
    rl.add_argument("--demo", action="store_true", help="make run's CPU-sized demo settings")
    sb = sub.add_parser("submit", help="compile and submit a run to $KFP_HOST")
    sb.add_argument("pipeline")
    sb.add_argument("params", nargs="*", help="name=value (JSON values)")
    sb.add_argument("--experiment", default="foxhunt")
    sb.add_argument("--run-name", default=None)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "compile":
            for p in compile_all():
                print(f"wrote {p}")
        elif args.cmd == "run-local":
            params = parse_params(args.params, args.pipeline)
            run_local(args.pipeline, (demo_params() if args.demo else {}) | params)
        else:
            run_id = submit(
                args.pipeline, parse_params(args.params), args.experiment, args.run_name
            )
            print(f"submitted {args.pipeline} to {os.environ['KFP_HOST']}: run {run_id}")
    except SubmitError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
