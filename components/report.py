from kfp import dsl

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def report(
    work_dir: str,
    markdown: dsl.Output[dsl.Markdown],
    html: dsl.Output[dsl.HTML],
    metrics: dsl.Output[dsl.Metrics],
    kfp_run_id: str = "",
    parent_run_id: str = "",
    extra_trials: int = 0,
):
    """Test metrics of every train task of this pipeline run (model x seed; results.json under
    runs/<KFP run id>/ on the volume, whichever way the task ran: in a pod or as a TrainJob),
    the baselines beside them, the deflated Sharpe ratio (N: every task MLflow holds for this
    cache, plus `extra_trials` made elsewhere) and equity curves: Markdown and HTML for the
    Kubeflow UI, logged on the pipeline's MLflow parent run."""
    import math
    import shutil
    from pathlib import Path

    from foxhunt.report import ReportConfig, run_report
    from foxhunt.train.tracking import require_tracking_uri

    require_tracking_uri()
    runs = Path(work_dir) / "runs" / kfp_run_id
    paths = sorted(runs.glob("*/results.json"))
    if not paths:
        raise RuntimeError(f"no training results under {runs}: no task of this run finished")
    out = Path(work_dir) / "report" / (kfp_run_id or "latest")
    tags = {"kfp_run_id": kfp_run_id} if kfp_run_id else {}
    cfg = ReportConfig(
        results=tuple(paths), out=out, tracking="mlflow", tags=tags,
        run_id=parent_run_id or None, extra_trials=extra_trials,
    )  # fmt: skip
    rep = run_report(cfg)
    shutil.copy(out / "report.md", markdown.path)
    shutil.copy(out / "report.html", html.path)
    scores = {**rep["aggregate"], "deflated_sharpe": rep["deflated_sharpe"]["dsr"]}
    for k, v in scores.items():
        if isinstance(v, float) and math.isfinite(v):  # KFP's metrics JSON takes numbers only
            metrics.log_metric(k, v)
