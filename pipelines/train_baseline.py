"""train-baseline: ingest -> precompute -> folds -> train (a task per model and seed group) ->
report.

How a task runs, by the run's parameters (each rerunnable from the Kubeflow UI):
    nodes = 1, gpus_per_node = 1   one pod, one GPU (the default)
    nodes = 1, gpus_per_node = N   one pod, N GPUs: data-parallel through torchrun's launcher
    nodes = M > 1                  a Kubeflow Trainer TrainJob of M nodes x gpus_per_node GPUs,
                                   submitted and followed by a CPU pod (train_job)
An agent's seeds (dqn, ppo, pqn) train side by side in one task on one GPU by default
(seeds_together; foxhunt train --seeds: one upload, one compile, each seed its own results and
MLflow runs); seeds_together=false, a supervised model or a data-parallel task gives each seed a
task of its own. With fold_tasks, every fold of a model and seed is a task of its own too (more,
shorter tasks; the report puts a task's folds back together). Tasks run side by side up to the
compile-time PARALLELISM (a cluster is not flooded), each labelled for Kueue's queue
KUEUE_QUEUE where that is set (pipelines.platform.Cluster)."""

from typing import Literal

from kfp import dsl

from components import end_tracking, folds, plan_tasks, report, start_tracking, train, train_job
from pipelines.platform import (
    GPU_NODE_SELECTOR,
    GPU_TOLERATIONS,
    MLFLOW_SECRET,
    RAW_MOUNT,
    WORK_MOUNT,
    Cluster,
    configure,
    ingest_and_precompute,
)


def build_train_baseline(
    platform: Literal["cluster", "local"] = "cluster", cluster: Cluster | None = None
):
    local = platform == "local"
    cluster = cluster or Cluster.from_env()
    raw_default = "data/raw" if local else RAW_MOUNT
    work_default = "data" if local else WORK_MOUNT

    @dsl.pipeline(
        name="train-baseline",
        description="Databento DBN -> fxcache -> walk-forward folds -> models (agents: dqn, "
        "ppo, pqn; supervised: tlob, cfc, mamba2, tft, ensemble) x seeds -> report",
    )
    def train_baseline(
        symbol: str = "ES",
        bar_size: str = "1m",
        start: str = "",
        end: str = "",
        download_symbols: str = "",
        train_months: int = 3,
        val_months: int = 1,
        test_months: int = 1,
        step_months: int = 1,
        window: str = "sliding",
        purge: int = -1,
        embargo: int = -1,
        model: str = "dqn",
        epochs: int = 10,
        seeds: list = [0, 1],  # noqa: B006 (a KFP default, not a Python one)
        lr: float = 0.0,
        gamma: float = -1.0,
        n_step: int = 0,
        batch_size: int = 0,
        envs: int = 0,
        fee_bps: float = 0.1,
        half_spread_bps: float = 0.25,
        overrides: str = "{}",
        extra_trials: int = 0,
        raw_dir: str = raw_default,
        work_dir: str = work_default,
        raw_pvc: str = "foxhunt-raw",
        fxcache_pvc: str = "foxhunt-fxcache",
        gpu_node_selector: dict = GPU_NODE_SELECTOR,
        gpu_tolerations: list = GPU_TOLERATIONS,
        nodes: int = 1,
        gpus_per_node: int = 1,
        fold_tasks: bool = False,
        seeds_together: bool = True,
    ):
        # Whatever stops a task, the exit task ends the MLflow parent run with the pipeline's
        # outcome (FINISHED, FAILED, KILLED): no run is left RUNNING.
        outcome = end_tracking(kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        outcome.set_display_name("MLflow parent run: outcome").set_caching_options(False)
        with dsl.ExitHandler(outcome, name="train-baseline"):
            _, pre = ingest_and_precompute(
                local, cluster, raw_dir, work_dir, download_symbols, start, end, symbol, bar_size,
                raw_pvc, fxcache_pvc,
            )  # fmt: skip
            keys = pre.outputs["Output"]  # symbol -> fxcache key (JSON)
            fo = folds(
                work_dir=work_dir, keys=keys, symbol=symbol, train_months=train_months,
                val_months=val_months, test_months=test_months, step_months=step_months,
                window=window, purge=purge, embargo=embargo,
            )  # fmt: skip
            fo.set_display_name("Walk-forward folds").set_caching_options(True)
            trk = start_tracking(
                kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, keys=keys, symbol=symbol,
                bar_size=bar_size, start=start, end=end, download_symbols=download_symbols,
                train_months=train_months, val_months=val_months, test_months=test_months,
                step_months=step_months, window=window, purge=purge, embargo=embargo,
                model=model, epochs=epochs, seeds=seeds, lr=lr, gamma=gamma, n_step=n_step,
                batch_size=batch_size, envs=envs, fee_bps=fee_bps,
                half_spread_bps=half_spread_bps, overrides=overrides, extra_trials=extra_trials,
                raw_dir=raw_dir, work_dir=work_dir, raw_pvc=raw_pvc, fxcache_pvc=fxcache_pvc,
                gpu_node_selector=gpu_node_selector, gpu_tolerations=gpu_tolerations,
                nodes=nodes, gpus_per_node=gpus_per_node, fold_tasks=fold_tasks,
                seeds_together=seeds_together,
            )  # fmt: skip
            trk.set_display_name("MLflow parent run").set_caching_options(False)
            plan = plan_tasks(model=model, seeds=seeds, folds=fo.outputs["folds_json"],
                              fold_tasks=fold_tasks, seeds_together=seeds_together,
                              nodes=nodes, gpus_per_node=gpus_per_node)  # fmt: skip
            plan.set_display_name("Tasks: models x seeds").set_caching_options(False)
            common = dict(
                work_dir=work_dir, folds=fo.outputs["folds_json"], epochs=epochs,
                kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, lr=lr, gamma=gamma, n_step=n_step,
                batch_size=batch_size, envs=envs, fee_bps=fee_bps,
                half_spread_bps=half_spread_bps, overrides=overrides,
            )  # fmt: skip
            with dsl.ParallelFor(plan.output, parallelism=cluster.parallelism, name="tasks") as t:
                with dsl.If(nodes > 1, name="several-nodes"):
                    tj = train_job(
                        model=t.model, seed=t.seed, fold=t.fold, nodes=nodes,
                        gpus_per_node=gpus_per_node,
                        fxcache_pvc=fxcache_pvc, gpu_node_selector=gpu_node_selector,
                        gpu_tolerations=gpu_tolerations, gpu_resource=cluster.gpu_type,
                        kueue_queue=cluster.kueue_queue, **common,
                    ).after(trk)  # fmt: skip
                    tj.set_display_name("Train as a TrainJob").set_caching_options(False)
                    tj.set_retry(num_retries=2, backoff_duration="120s")
                with dsl.Else(name="one-node"):
                    tr = train(model=t.model, seed=t.seed, seeds=t.seeds, fold=t.fold,
                               gpus=gpus_per_node, **common).after(trk)  # fmt: skip
                    tr.set_display_name("Train over all folds").set_caching_options(False)
                    tr.set_retry(num_retries=2, backoff_duration="120s")  # resumes from resume.pt
            rep = report(
                work_dir=work_dir,
                kfp_run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
                parent_run_id=trk.output,
                extra_trials=extra_trials,
            ).after(tr, tj)  # the run's results.json files, on the volume
            rep.set_display_name("Report: test metrics, deflated Sharpe").set_caching_options(False)
        if not local:
            configure(fo, "folds", cluster, work_pvc=fxcache_pvc)
            configure(trk, "tracking", cluster, secrets=(MLFLOW_SECRET,))
            configure(outcome, "tracking", cluster, secrets=(MLFLOW_SECRET,))
            configure(
                tr, "train", cluster, work_pvc=fxcache_pvc, secrets=(MLFLOW_SECRET,),
                gpu_node_selector=gpu_node_selector, gpu_tolerations=gpu_tolerations,
                gpus=gpus_per_node,
            )  # fmt: skip
            configure(tj, "train_job", cluster, work_pvc=fxcache_pvc, secrets=(MLFLOW_SECRET,))
            configure(plan, "folds", cluster)
            configure(rep, "report", cluster, work_pvc=fxcache_pvc, secrets=(MLFLOW_SECRET,))

    return train_baseline
