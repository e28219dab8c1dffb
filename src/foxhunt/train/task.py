"""What the pipeline's training steps share (components/train.py, components/train_job.py): the
task's TrainConfig from the step's parameters, and the step's outputs from its results."""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
from pathlib import Path


def task_config(*, work_dir: str, folds_path: str, model: str, seed: int, epochs: int,
                kfp_run_id: str, lr: float, gamma: float, n_step: int, batch_size: int,
                envs: int, fee_bps: float, half_spread_bps: float, overrides: str,
                gpus: int = 1, parent_run_id: str | None = None, fold: int = -1):  # fmt: skip
    """The TrainConfig of one pipeline task. lr 0, gamma -1, n_step 0: the model's own
    default; batch_size/envs 0: sized for the device; each applies to the models that have
    it. `overrides`: JSON of further fields per config ({"dqn": {...}, "env": {...},
    "train": {...}}); only the chosen model's section is used. `fold` >= 0: that fold alone
    (the pipeline's fold fan-out)."""
    from foxhunt.train import EnvConfig, TrainConfig
    from foxhunt.train.agents import AGENTS

    extra = json.loads(overrides or "{}")
    fields = {f.name for f in dataclasses.fields(TrainConfig)} - {
        "folds", "cache", "out", "env", *AGENTS,
    }  # fmt: skip
    if model not in AGENTS:
        raise ValueError(f"model {model!r}: choose one of {', '.join(AGENTS)}")
    config_cls = AGENTS[model].load()[0]
    own = {f.name for f in dataclasses.fields(config_cls)}
    given = {"lr": lr if lr > 0 else None, "gamma": gamma if gamma >= 0 else None,
             "n_step": n_step or None, "batch_size": batch_size or None,
             "envs": envs or None}  # fmt: skip
    agent = {k: v for k, v in given.items() if v is not None and k in own}
    agent |= extra.get(model, {})
    agent = {k: tuple(v) if isinstance(v, list) else v for k, v in agent.items()}
    env = {"fee_bps": fee_bps, "half_spread_bps": half_spread_bps, **extra.get("env", {})}
    return TrainConfig(
        folds=Path(folds_path), cache=Path(work_dir) / "fxcache", model=model, epochs=epochs,
        seed=seed, out=Path(work_dir) / "runs", gpus=gpus,
        # What torch.compile made, kept on the volume for the next task (retry, rerun, seed).
        compile_cache=Path(work_dir) / "compile-cache",
        **({"fold_ids": (fold,)} if fold >= 0 else {}),
        # A retry of this task (same KFP run) resumes; a new pipeline run trains afresh.
        run_id=kfp_run_id, tracking="mlflow",
        tags={**({"kfp_run_id": kfp_run_id} if kfp_run_id else {}),
              **({"mlflow.parentRunId": parent_run_id} if parent_run_id else {})},
        **{model: config_cls(**agent)}, env=EnvConfig(**env),
        **{k: v for k, v in extra.get("train", {}).items() if k in fields},
    )  # fmt: skip


def write_outputs(tasks: list[tuple[int, Path]], results_path: str, best_model, metrics) -> None:
    """The step's outputs from its finished tasks, (seed, run directory) each: results.json (of
    several seeds trained side by side, {"seeds": {seed: results.json}}), the best fold's
    checkpoint over all of them as a Model (with its metrics in the metadata), each aggregate
    as KFP metrics (prefixed `seed<s>_` where there are several)."""
    docs = {seed: json.loads((run_dir / "results.json").read_text()) for seed, run_dir in tasks}
    if len(tasks) == 1:
        shutil.copy(tasks[0][1] / "results.json", results_path)
    else:
        Path(results_path).write_text(json.dumps({"seeds": docs}, indent=1))
    seed, run_dir, best = max(
        ((s, d, f) for s, d in tasks for f in docs[s]["folds"]), key=lambda x: x[2]["val"]["sharpe"]
    )
    Path(best_model.path).mkdir(parents=True, exist_ok=True)
    for name in ("best.safetensors", "best.json"):
        shutil.copy(run_dir / f"fold-{best['fold']}" / name, Path(best_model.path) / name)
    best_model.metadata.update(
        fold=best["fold"], seed=seed, val_sharpe=best["val"]["sharpe"],
        test_sharpe=best["test"]["sharpe"], mlflow_model_uri=best.get("model_uri") or "",
        run_dir=str(run_dir),
    )  # fmt: skip
    for seed, doc in docs.items():
        agg = doc["aggregate"]
        flat = {k: v for k, v in agg.items() if k != "baselines_test_sharpe"}
        flat |= {f"baseline_{k}_test_sharpe": v
                 for k, v in agg.get("baselines_test_sharpe", {}).items()}  # fmt: skip
        prefix = f"seed{seed}_" if len(docs) > 1 else ""
        for k, v in flat.items():
            if math.isfinite(v):  # KFP's metrics JSON takes numbers only (no inf profit factor)
                metrics.log_metric(prefix + k, v)
