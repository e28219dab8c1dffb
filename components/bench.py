from kfp import dsl

from components.images import GPU_IMAGE


@dsl.component(base_image=GPU_IMAGE, install_kfp_package=False)
def bench(
    work_dir: str,
    markdown: dsl.Output[dsl.Markdown],
    report_json: dsl.Output[dsl.Artifact],
    metrics: dsl.Output[dsl.Metrics],
    models: str = "dqn,ppo,pqn,tlob,cfc,mamba2,tft",
    epochs: int = 10,
    repeats: int = 3,
    sets: str = "",
    fxcache_key: str = "",
    baseline: str = "",
    find_batch: bool = False,
    plan_folds: int = 12,
    plan_epochs: int = 50,
    plan_seeds: int = 3,
    deadline_hours: float = 24.0,
    cloud_usd_per_gpu_hour: float = 3.5,
    kfp_run_id: str = "",
):
    """`foxhunt bench` on the GPU node: every model's epoch time with its statistics, memory
    and stability, the decision for the training plan; the Markdown summary in the Kubeflow
    UI, report.json as an artifact (and kept on the volume under bench/<run>), one MLflow run
    per workload. `baseline`: a report.json on the volume to gate against (the step fails on a
    regression). `sets`: space-separated model.field=value. `fxcache_key`: train on that cache
    of the volume (work_dir/fxcache/<key>, what precompute-features wrote) instead of the
    standard synthetic market."""
    import math
    import shutil
    from pathlib import Path

    from foxhunt.bench.core import BenchConfig, run_bench
    from foxhunt.bench.decide import CostAssumptions, TrainingPlan
    from foxhunt.train.tracking import require_tracking_uri

    require_tracking_uri()
    out = Path(work_dir) / "bench" / (kfp_run_id or "latest")
    cfg = BenchConfig(
        models=tuple(m for m in models.split(",") if m), epochs=epochs, repeats=repeats,
        set=tuple(sets.split()), baseline=Path(baseline) if baseline else None,
        fxcache=Path(work_dir) / "fxcache" / fxcache_key if fxcache_key else None,
        find_batch=find_batch, out=out, tracking="mlflow",
        plan=TrainingPlan(folds=plan_folds, epochs=plan_epochs, seeds=plan_seeds,
                          deadline_hours=deadline_hours),
        costs=CostAssumptions(cloud_usd_per_gpu_hour=cloud_usd_per_gpu_hour),
    )  # fmt: skip
    rep = run_bench(cfg)
    shutil.copy(out / "report.md", markdown.path)
    shutil.copy(out / "report.json", report_json.path)
    for m, w in rep["workloads"].items():
        if w["status"] == "ok":
            for k in ("median", "mean", "ci95"):
                metrics.log_metric(f"{m}_epoch_{k}_s", w["train_s"][k])
            if w.get("samples_per_s") and math.isfinite(w["samples_per_s"]):
                metrics.log_metric(f"{m}_samples_per_s", w["samples_per_s"])
    failures = rep.get("gate", {}).get("failures", [])
    if failures:
        raise RuntimeError("slower than the baseline: " + "; ".join(failures))
