from kfp import dsl

from components.images import CPU_IMAGE


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def start_tracking(
    kfp_run_id: str,
    keys: str,
    symbol: str,
    bar_size: str,
    start: str,
    end: str,
    download_symbols: str,
    train_months: int,
    val_months: int,
    test_months: int,
    step_months: int,
    window: str,
    purge: int,
    embargo: int,
    model: str,
    epochs: int,
    seeds: list,
    lr: float,
    gamma: float,
    n_step: int,
    batch_size: int,
    envs: int,
    fee_bps: float,
    half_spread_bps: float,
    overrides: str,
    extra_trials: int,
    raw_dir: str,
    work_dir: str,
    raw_pvc: str,
    fxcache_pvc: str,
    gpu_node_selector: dict,
    gpu_tolerations: list,
    nodes: int,
    gpus_per_node: int,
    fold_tasks: bool,
    seeds_together: bool,
    experiment: str = "foxhunt",
) -> str:
    """The MLflow parent run of this pipeline run: every pipeline parameter as a run parameter
    (each passed on its own, typed: a dict of pipeline parameters reaches a task as text that
    KFP's local runner does not escape), tags for the KFP run id, git commit, fxcache key,
    symbol and model. Returns its run id for the train and report steps."""
    import json

    from foxhunt.train.tracking import require_tracking_uri, start_pipeline_run

    require_tracking_uri()
    params = {k: v for k, v in locals().items() if k not in ("kfp_run_id", "keys", "experiment")}
    # A list parameter's numbers arrive as floats (protobuf's Struct): seeds [0, 1], not [0.0, 1.0].
    params["seeds"] = [int(x) if float(x).is_integer() else x for x in seeds]
    tags = {
        "kfp_run_id": kfp_run_id,
        "fxcache_key": json.loads(keys)[symbol],
        "symbol": symbol,
        "model": model,
    }
    run_id = start_pipeline_run(experiment, f"{symbol} {model} {kfp_run_id[:8]}", tags, params)
    print(f"MLflow parent run {run_id}")
    return run_id


@dsl.component(base_image=CPU_IMAGE, install_kfp_package=False)
def end_tracking(kfp_run_id: str, status: dsl.PipelineTaskFinalStatus, experiment: str = "foxhunt"):
    """The pipeline's exit task: ends the MLflow parent run of this pipeline run (found by its
    KFP run id; an exit task cannot take another task's output) with the pipeline's outcome:
    FINISHED, FAILED (with the error) or KILLED (cancelled), whichever step stopped it."""
    from foxhunt.train.tracking import end_pipeline_run, find_pipeline_run, require_tracking_uri

    require_tracking_uri()
    parent = find_pipeline_run(experiment, kfp_run_id)
    if not parent:
        print(f"no MLflow parent run for KFP run {kfp_run_id} (the pipeline stopped before it)")
        return
    outcome = {"SUCCEEDED": "FINISHED", "CANCELLED": "KILLED"}.get(status.state, "FAILED")
    message = "" if outcome == "FINISHED" else (status.error_message or status.state)
    end_pipeline_run(parent, outcome, message)
    print(f"MLflow parent run {parent}: {outcome} (pipeline {status.state})")
