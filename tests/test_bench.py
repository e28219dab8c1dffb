"""foxhunt bench on the CPU with tiny workloads: the stability checks, the decision
arithmetic, the accumulation arithmetic, hardware decoding, and the whole command: its report,
the interleaved comparison and the regression gate catching a planted slowdown."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from foxhunt.bench import stability
from foxhunt.bench.core import BenchConfig, accumulation, gate, run_bench
from foxhunt.bench.decide import CostAssumptions, TrainingPlan, decide
from foxhunt.bench.hardware import detect, throttle_reasons
from foxhunt.cli import main as cli


def h(loss, grad=1.0):
    return {"losses/loss": loss, "losses/grad_norm": grad}


def test_stability_checks():
    ok = stability.check([h(1.0), h(0.8), h(0.7), h(0.65)])
    assert ok["ok"] and ok["loss_trend"] == "falling"
    assert stability.check([h(1.0), h(1.0), h(1.001)])["loss_trend"] == "flat"
    bad = stability.check([h(1.0), h(float("nan"))])
    assert not bad["ok"] and "non-finite" in bad["problems"][0]
    boom = stability.check([h(1.0, 1.0), h(1.0, 1.2), h(1.0, 0.9), h(1.0, 5e3)])
    assert not boom["ok"] and "exploding" in boom["problems"][0]
    dead = stability.check([h(1.0, 0.0), h(1.0, 0.0)])
    assert "vanishing" in dead["problems"][0]
    div = stability.check([h(1.0), h(0.5), h(6.0)])
    assert not div["ok"] and "diverged" in div["problems"][0]
    rising = stability.check([h(1.0), h(2.0), h(3.0)])  # a rise alone is reported, no failure
    assert rising["ok"] and rising["loss_trend"] == "rising"


def test_the_decision_arithmetic_by_hand():
    plan = TrainingPlan(folds=2, epochs=10, seeds=3, deadline_hours=1.0)
    costs = CostAssumptions(cloud_usd_per_gpu_hour=2.0, cloud_slowdown=1.5,
                            local_power_kw=0.5, energy_usd_per_kwh=0.2)  # fmt: skip
    # a task: 2 folds x 10 epochs x 36 s + 60 s start = 780 s; 3 seeds x 2 models = 6 tasks
    d = decide({"a": 36.0, "b": 36.0}, {"a": 60.0, "b": 60.0}, plan, costs)
    gpu_h = 6 * 780 / 3600
    assert d["tasks"] == 6 and d["hours_here"] == pytest.approx(gpu_h)
    assert d["cost_here_usd"] == pytest.approx(gpu_h * 0.5 * 0.2)
    assert d["cloud_gpu_hours"] == pytest.approx(gpu_h * 1.5)
    assert d["cloud_cost_usd"] == pytest.approx(gpu_h * 1.5 * 2.0)
    # 1.3 h here misses the 1 h deadline: the cloud, on ceil(1.95 / 1) = 2 GPUs
    assert d["recommendation"] == "cloud" and d["cloud_gpus"] == 2
    easy = decide({"a": 36.0}, {"a": 60.0}, TrainingPlan(folds=1, epochs=1, seeds=1), costs)
    assert easy["recommendation"] == "here" and "within" in easy["reason"]


def test_accumulation_reaches_the_effective_batch_in_equal_micro_batches():
    assert accumulation(4096, 4096) == {"effective": 4096, "accumulate": 1, "micro_batch": 4096,
                                        "effective_run": 4096}  # fmt: skip
    a = accumulation(1024, 3000)
    assert (a["accumulate"], a["micro_batch"], a["effective_run"]) == (3, 1000, 3000)
    b = accumulation(1000, 4097)
    assert b["accumulate"] == 5 and b["micro_batch"] <= 1000 and b["effective_run"] >= 4097


def test_hardware_on_a_cpu_and_throttle_bits():
    info = detect("cpu")
    assert info["kind"] == "cpu" and info["host"]["cpu_count"] >= 1
    assert throttle_reasons(0x1 | 0x4 | 0x40) == ["sw_power_cap", "hw_thermal_slowdown"]


def test_the_gate_on_planted_samples():
    base = {"workloads": {"m": {"status": "ok", "samples_train_s": [1.0 + i / 100 for i in
                                                                   range(20)]}}}  # fmt: skip
    slow = {"m": {"status": "ok", "samples_train_s": [2.0 + i / 100 for i in range(20)]}}
    same = {"m": {"status": "ok", "samples_train_s": [1.0 + i / 100 for i in range(1, 21)]}}
    assert gate(slow, base, 1.1, 0.01) and slow["m"]["vs_baseline"]["ratio_b_over_a"] > 1.9
    assert gate(same, base, 1.1, 0.01) == []


def test_the_command_reports_compares_and_gates_a_planted_slowdown(tmp_path):
    """Two tiny DQN benchmarks in this process: the baseline, then one with 4x the learning
    steps. The second run's interleaved comparison sees B slower, and the gate against the
    first run's report fails the command."""
    common = dict(models=("dqn",), epochs=6, warmup=1, repeats=2, in_process=True,
                  threads=1, bars=5000, val_bars=500)  # fmt: skip
    base = run_bench(BenchConfig(**common, out=tmp_path / "base", set=("dqn.learn_steps=4",)))
    w = base["workloads"]["dqn"]
    assert w["status"] == "ok" and w["train_s"]["n"] + w["train_s"]["outliers"] == 12
    assert len(w["process_medians_s"]) == 2 and math.isfinite(w["spread"])
    assert w["memory_peak_bytes"] == {} and w["host_rss_bytes"] > 0  # a CPU: no VRAM figures
    assert w["step_s"]["n"] + w["step_s"]["outliers"] == 2 * 6 * 4  # every learning step timed
    md = (tmp_path / "base" / "report.md").read_text()
    assert "| dqn | ok |" in md and "Decision for" in md
    code = cli(["bench", "--models", "dqn", "--epochs", "6", "--warmup", "1", "--repeats", "2",
                "--in-process", "--threads", "1", "--bars", "5000", "--val-bars", "500",
                "--set", "dqn.learn_steps=16", "--compare", "learn_steps=4",
                "--baseline", str(tmp_path / "base" / "report.json"),
                "--out", str(tmp_path / "slow")])  # fmt: skip
    assert code == 1  # the gate failed the command
    rep = json.loads((tmp_path / "slow" / "report.json").read_text())
    g = rep["gate"]
    assert len(g["failures"]) == 1 and g["failures"][0].startswith("dqn: median epoch")
    cmp_ = rep["workloads"]["dqn"]["compare"]  # B = the baseline's 4 steps, faster than A's 16
    assert cmp_["ratio_b_over_a"] < 0.7 and cmp_["p"] < 0.01


def test_a_real_fxcache_as_the_workload(demo_es, tmp_path):
    """`--fxcache` trains on the cache's bars (the demo's ES, 6 months), named in the report;
    a folder holding no cache or several is refused, naming what is there."""
    from foxhunt.bench.core import BenchError, bench_cache
    from foxhunt.bench.workload import run_workload
    from foxhunt.fxcache import FxCache
    from foxhunt.fxcache.store import list_caches

    (row,) = list_caches(demo_es[0])
    bars = len(FxCache.open(row["path"]))
    rep = run_bench(BenchConfig(models=("dqn",), epochs=2, warmup=0, repeats=1, in_process=True,
                                threads=1, val_bars=500, fxcache=demo_es[0],
                                out=tmp_path / "b"))  # fmt: skip
    assert rep["data"] == {"fxcache": str(row["path"]), "key": row["key"], "bars": bars}
    assert rep["workloads"]["dqn"]["status"] == "ok"
    assert f"fxcache {row['key']} ({bars:,} bars)" in (tmp_path / "b" / "report.md").read_text()
    spec = {"model": "pqn", "sets": {"envs": 64, "rollout_steps": 4, "rounds": 1},
            "device": "cpu", "fxcache": str(row["path"]), "bars": 0, "val_bars": 300,
            "warmup": 0, "epochs": 1}  # fmt: skip
    assert run_workload(spec)["bars"] == bars != 20_000  # the cache's, not the synthetic default
    with pytest.raises(BenchError, match="no fxcache there"):
        bench_cache(tmp_path / "b")
    two = tmp_path / "two"
    for k in ("k1", "k2"):
        shutil.copytree(row["path"], two / k)
    with pytest.raises(BenchError, match=r"holds 2 caches \(k1, k2\): name one"):
        bench_cache(two)
    assert bench_cache(two / "k2") == (two / "k2", bars)


def test_peak_vram_is_the_training_phases_with_a_larger_build_beside():
    """The table's VRAM is what training holds; the build (where the supervised sizer probes
    batches it then rejects) shows beside it only when it was higher."""
    from foxhunt.bench.core import markdown, vram_gb

    gb = 10**9
    w = {"status": "ok", "spread": 0.0, "train_s": {"median": 1.0, "mean": 1.0, "ci95": 0.0,
                                                    "outliers": 0},
         "memory_peak_bytes": {"build": 67 * gb, "capture": 27 * gb, "learn": gb}}  # fmt: skip
    assert vram_gb(w) == (27.0, 67.0)
    rep = {"hardware": {"kind": "cpu", "name": "x", "threads": 2, "host": {"torch": "t"}},
           "data": {"synthetic": "the standard market", "bars": 10},
           "workloads": {"tft": w}}  # fmt: skip
    assert "| 27.00 (build 67.00) |" in markdown(rep)
    w["memory_peak_bytes"]["build"] = 2 * gb
    assert vram_gb(w) == (27.0, 2.0) and "| 27.00 |" in markdown(rep)


def test_one_mlflow_run_per_workload(tmp_path, monkeypatch):
    """With tracking, each model's figures land in the experiment foxhunt-bench as a run of its
    own: settings as parameters, the epoch statistics, memory and RSS as metrics, the workload's
    JSON as an artifact."""
    import mlflow

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    rep = run_bench(BenchConfig(models=("pqn", "dqn"), epochs=2, warmup=0, repeats=1,
                                in_process=True, threads=1, bars=3000, val_bars=300,
                                tracking="mlflow", out=tmp_path / "b"))  # fmt: skip
    client = mlflow.MlflowClient(uri)
    exp = client.get_experiment_by_name("foxhunt-bench")
    runs = {r.data.tags["model"]: r for r in client.search_runs([exp.experiment_id])}
    assert set(runs) == {"pqn", "dqn"}
    for m, r in runs.items():
        w = rep["workloads"][m]
        assert r.info.status == "FINISHED" and r.data.params["model"] == m
        assert r.data.params["data.bars"] == "3000"  # which market it ran on
        assert r.data.metrics["epoch_median_s"] == pytest.approx(w["train_s"]["median"])
        assert r.data.metrics["host_rss_gb"] == pytest.approx(w["host_rss_bytes"] / 1e9)
        art = client.download_artifacts(r.info.run_id, "workload.json", str(tmp_path / m))
        assert json.loads(Path(art).read_text())["status"] == "ok"


def test_bench_train_cpu_smoke_times_every_kind_of_variant(tmp_path):
    """bench/bench_train.py (the H200 figures of docs/performance.md) on the CPU: a DQN, its
    network-only floor, PPO, PQN and a supervised variant with its evaluation piece each give
    their row; a variant that fails prints FAILED and leaves no row. $OUT need not exist: the
    script makes it."""
    import os
    import subprocess
    import sys

    variants = ["eager-fp32", "eager-fp32-floor", "ppo-eager-fp32", "pqn-eager-fp32",
                "tlob-eager-fp32-p64"]  # fmt: skip
    out = subprocess.run(
        [sys.executable, "bench/bench_train.py", "--cpu-smoke", "--epochs", "2",
         "--variants", ",".join(variants)],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
        env=os.environ | {"OUT": str(tmp_path / "results")}, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0 and "FAILED" not in out.stdout, out.stdout + out.stderr[-2000:]
    res = json.loads((tmp_path / "results" / "bench_train.json").read_text())
    for v in variants:
        assert res[v]["train_epoch"][0] > 0 and res[v]["params"] > 0, v


def test_bench_plan_cpu_smoke_times_both_processes_and_profiles_a_warm_start(tmp_path):
    """bench/bench_plan.py (the plan and task-start figures of docs/performance.md) on the CPU:
    the cold and the warm process each train every epoch of the fold and give their marks in
    order, and `--profile-start` lists foxhunt's training functions from a third process."""
    import os
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "bench/bench_plan.py", "--cpu-smoke", "--epochs", "2", "--folds", "1",
         "--profile-start"],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
        env=os.environ | {"OUT": str(tmp_path / "results")}, timeout=600,
    )  # fmt: skip
    assert out.returncode == 0 and "FAILED" not in out.stdout, out.stdout + out.stderr[-2000:]
    res = json.loads((tmp_path / "results" / "bench_plan.json").read_text())
    for phase in ("cold cache", "warm cache"):
        r = res[phase]
        assert r["epochs"] == 2 and r["folds"] == 1, r
        assert 0 < r["imports_s"] < r["first_epoch_start_s"] < r["first_epoch_s"] < r["total_s"]
    assert "profiled warm process (1 epoch of one fold)" in out.stdout, out.stdout
    assert "foxhunt/train/core.py" in out.stdout and "(run_train)" in out.stdout, out.stdout


def test_bench_eval_cpu_smoke_gives_the_same_returns_at_every_piece_count():
    """bench/bench_eval.py (the evaluation rows of docs/task-start.md) on the CPU: a row per
    policy and piece count, each with the first count's returns."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "bench/bench_eval.py", "--cpu-smoke"], capture_output=True, text=True,
        cwd=Path(__file__).resolve().parents[1], timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    rows = [ln.split() for ln in out.stdout.splitlines() if ln.startswith(("dqn ", "signal "))]
    assert len(rows) == 6 and all(r[-1] == "True" and int(r[3]) >= 1 for r in rows), out.stdout


def test_bench_eval_baselines_cpu_smoke_gives_the_same_figures_at_every_piece_count():
    """bench/bench_eval.py --baselines on the CPU: a fold's baselines timed at each piece count,
    every deterministic baseline's figures the same in each of the 3 runs and those of the first
    count."""
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "bench/bench_eval.py", "--cpu-smoke", "--baselines"],
        capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=600,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr[-2000:]
    rows = [ln.split() for ln in out.stdout.splitlines() if ln[:7].strip().isdigit()]
    assert [int(r[0]) for r in rows] == [16, 64, 256], out.stdout
    assert all(float(r[1]) > 0 and r[2:] == ["True", "True"] for r in rows), out.stdout


def test_bench_eval_names_the_baseline_figures_that_differ():
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "bench" / "bench_eval.py"
    spec = importlib.util.spec_from_file_location("bench_eval", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    a = {"flat": {"val": {"sharpe": 0.0}, "test": {"sharpe": 0.0}},
         "ridge_cost": {"val": {"sharpe": 1.5, "turnover": 0.25}, "test": {"sharpe": 1.0},
                        "threshold": 0.5}}  # fmt: skip
    b = {"flat": a["flat"], "ridge_cost": {**a["ridge_cost"], "threshold": 0.75,
                                           "val": {"sharpe": 1.5, "turnover": 0.5}}}  # fmt: skip
    assert mod.differences(a, a) == []
    assert mod.differences(a, b) == ["ridge_cost.val.turnover: 0.25 against 0.5",
                                     "ridge_cost.threshold: 0.5 against 0.75"]  # fmt: skip


def test_bench_learning_baselines_alone_with_and_without_the_memory(demo_es, tmp_path):
    """bench/bench_learning.py --models none on the demo folds: the baselines' table with the
    memory ridges beside the others (the agents' default), and without them when the memory is
    off; the ridge on the 50 columns gives the same figure either way."""
    import os
    import subprocess
    import sys

    data = tmp_path / "data"
    (data / "folds").mkdir(parents=True)
    (data / "folds" / "ES.json").write_text(demo_es[1].read_text())
    (data / "fxcache").symlink_to(demo_es[0])

    def table(*sets: str) -> dict[str, list[str]]:
        out = subprocess.run(
            [sys.executable, "bench/bench_learning.py", "--data", str(data), "--models", "none",
             "--costs", "on", *(["--set", *sets] if sets else [])],
            capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1],
            env=os.environ | {"PYTHONPATH": "src"}, timeout=600,
        )  # fmt: skip
        assert out.returncode == 0, out.stdout + out.stderr[-2000:]
        return {ln.split()[0]: ln.split()[1:] for ln in out.stdout.splitlines()
                if ln.split() and ln.split()[0].startswith(("ridge", "flat"))}  # fmt: skip

    on, off = table(), table("env.memory_decay=null")
    assert {"ridge", "ridge_cost", "ridge_memory", "ridge_memory_cost"} <= on.keys()
    assert "ridge_memory" not in off and on["ridge"][:2] == off["ridge"][:2]
    assert float(on["flat"][1]) == 0.0


def test_bench_learning_q_ensemble_against_the_trainers_own_q_values(
    demo_es, tmp_path, monkeypatch
):
    """bench_learning's mean-Q ensemble (`--ensemble`) rebuilds each member from its fold
    checkpoint. A group of one run earns that run's own val and test figures as the trainer
    reported them, and so does the same run twice; a group of two runs acts on the argmax of
    the mean of the two trained agents' expected Q-values (the trainer's own networks with
    the checkpoints' weights); the runs are grouped in their order, the remainder left out."""
    import torch
    from safetensors.torch import load_file

    from foxhunt.fxcache import FxCache
    from foxhunt.train import TrainConfig, run_train
    from foxhunt.train.agents.common import Observation
    from foxhunt.train.agents.dqn import DQNConfig, RainbowAgent
    from foxhunt.train.data import MarketData
    from foxhunt.train.env import EnvConfig
    from foxhunt.train.evaluate import Evaluator
    from foxhunt.train.metrics import periods_per_year
    from foxhunt.train.tracking import NullLogger

    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "bench"))
    import bench_learning

    tiny = DQNConfig(hidden=(32, 32), head_hidden=16, envs=16, collect_steps=8, learn_steps=4,
                     batch_size=64, replay_capacity=4096)  # fmt: skip
    env = EnvConfig(episode_bars=256)
    runs = [
        run_train(TrainConfig(folds=demo_es[1], cache=demo_es[0], epochs=2, out=tmp_path,
                              dqn=tiny, tracking="none", eval_segments=64, env=env,
                              baselines=False, fold_ids=(1,), run_id=f"s{seed}", seed=seed),
                  NullLogger())
        for seed in (0, 1)
    ]  # fmt: skip
    doc = json.loads(demo_es[1].read_text())
    cache = FxCache.open(demo_es[0], doc["fxcache_key"])
    data = MarketData.from_fxcache(cache, torch.device("cpu"))
    data.use_memory(env.memory_decay)
    folds = [f for f in doc["folds"] if f["fold"] == 1]
    ev = Evaluator(env, data, 64)
    ppy = periods_per_year(cache.timestamps)
    a = runs[0].run_dir
    one = bench_learning.ensemble_rows(ev, data, folds, [a], 1, env, ppy)
    twice = bench_learning.ensemble_rows(ev, data, folds, [a, a, a], 2, env, ppy)
    assert len(one) == 1 and len(twice) == 1
    for part in ("val", "test"):
        want = {k: v for k, v in runs[0].folds[0][part].items() if k != "exact"}
        assert one[0][0][part] == want and twice[0][0][part] == want

    f = folds[0]
    data.fit_normaliser(f["train_start"], f["train_end"])
    obs = Observation(data, env.memory_decay, env.forecast)
    ckpts = [r.run_dir / "fold-1" / "best.safetensors" for r in runs]
    policy = bench_learning.q_ensemble(ckpts, obs, data.device)
    n = 400
    t = torch.arange(f["test_start"], f["test_start"] + n)
    port = torch.stack([torch.linspace(-1, 1, n), torch.linspace(-0.5, 0.5, n),
                        torch.linspace(0, 2, n)], 1)  # fmt: skip
    qs = []
    for ck in ckpts:
        agent = RainbowAgent(tiny, env, data, seed=99)  # the weights come from the checkpoint
        agent.load_weights({k: v for k, v in load_file(str(ck)).items() if k.startswith("net.")
                            or k == "support.z"})  # fmt: skip
        with torch.no_grad():
            qs.append(agent.q_values(agent._acting()(agent.state(t, port), None, noise=False)))
    want = agent.joint.index_select(0, torch.stack(qs).mean(0).argmax(-1))
    assert torch.equal(policy(t, port), want)
    assert not torch.equal(qs[0].argmax(-1), qs[1].argmax(-1))  # the members disagree somewhere


def _fake_gpu_tries(monkeypatch, failure):
    """find_batch's search with its GPU parts replaced: each try's "peak" is its size, and
    `failure(n)` gives the error a try at size n reports (None: it ran)."""
    import torch

    from foxhunt.bench import workload
    from foxhunt.train import sizer

    tried = []

    def run_workload(spec):
        n = spec["sets"]["batch_size"]
        tried.append(n)
        return {"error": e} if (e := failure(n)) else {"epochs": []}

    monkeypatch.setattr(workload, "run_workload", run_workload)
    monkeypatch.setattr(sizer, "cuda_peak", lambda device, step: lambda n: (step(n), n)[1])
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda: (1 << 40, 1 << 40))
    return tried


def test_the_batch_finder_stops_at_memory_and_reports_any_other_failure(monkeypatch):
    from foxhunt.bench.core import find_batch

    cfg = BenchConfig(models=["dqn"], effective_batch=100_000)
    tried = _fake_gpu_tries(monkeypatch, lambda n: "out of memory" if n > 4096 else None)
    found = find_batch(cfg, "dqn", {}, "cuda")
    assert found["field"] == "batch_size" and found["largest"] == 4096, found
    assert found["accumulate"] == math.ceil(100_000 / 4096) and 4096 in tried
    assert found["micro_batch"] * found["accumulate"] == found["effective_run"] >= 100_000

    # A failure that is not memory says nothing about the size: it is reported, not counted as
    # fitting (which would have driven the search to the largest size tried).
    tried = _fake_gpu_tries(monkeypatch, lambda n: "ValueError: a bad field" if n > 4096 else None)
    found = find_batch(cfg, "dqn", {}, "cuda")
    assert "largest" not in found and found["field"] == "batch_size"
    assert "not for memory" in found["error"] and "a bad field" in found["error"]
    assert f"batch_size = {max(tried)}" in found["error"]


def test_the_report_shows_the_batch_finder(tmp_path, monkeypatch):
    """`--find-batch` on a CPU: the report says why there is no batch; with a found batch and a
    failed search (as on a GPU) it gives the batch, its memory and the micro-batches, or the
    error."""
    from foxhunt.bench.core import markdown

    report = run_bench(BenchConfig(models=("dqn",), epochs=2, warmup=1, repeats=1,
                                   in_process=True, threads=1, bars=3000, val_bars=300,
                                   find_batch=True, out=tmp_path))  # fmt: skip
    md = (tmp_path / "report.md").read_text()
    assert "| dqn | - | needs a GPU and a model with a batch size |  |  |" in md
    found = {"field": "batch_size", "largest": 65536, "peak_bytes": 3.5e9, "budget_bytes": 7e10,
             **accumulation(65536, 100_000)}  # fmt: skip
    report["workloads"]["dqn"]["batch_finder"] = found
    assert "| dqn | batch_size | 65,536 | 3.50 / 70.00 GB | 100,000 = 2 x 50,000 |" in markdown(
        report
    )
    report["workloads"]["dqn"]["batch_finder"] = {"field": "envs", "error": "envs = 512: failed"}
    assert "| dqn | envs | envs = 512: failed |  |  |" in markdown(report)


@pytest.mark.parametrize("model", ["tlob", "cfc", "mamba2", "tft"])
def test_a_steps_flops_counted_on_a_few_windows_are_the_whole_batchs(model):
    """The MFU's FLOPs (workload.train_flops) are counted over a step's first windows and
    scaled to its batch, two micro-batches here: that equals the count over the whole batch,
    since every operation of the supervised models is a window's own."""
    import torch

    from foxhunt.bench.workload import standard_market, train_flops
    from foxhunt.train.agents import AGENTS
    from foxhunt.train.data import MarketData
    from foxhunt.train.env import EnvConfig

    feats, ofi, targets = standard_market(4_000)
    data = MarketData(feats, ofi, targets, torch.device("cpu"))
    sizes = {"tlob": dict(hidden=16, layers=1), "cfc": dict(units=16, backbone_units=32),
             "mamba2": dict(d_model=16, headdim=8, d_state=8, chunk=8, layers=1),
             "tft": dict(hidden=8, heads=2)}[model]  # fmt: skip
    cls, agent_cls = AGENTS[model].load()
    cfg = cls(window=16, batch_size=32, accumulate=2, steps=1, **sizes)
    agent = agent_cls(cfg, EnvConfig(), data, seed=0)
    agent.reset_fold(100, 3_000, seed=1)
    agent.batch_t.copy_(torch.randint(100, 3_000, (64,)))
    whole = train_flops(agent, rows=64)
    assert whole > 0
    assert train_flops(agent, rows=8) == whole
    assert train_flops(agent, rows=5) == whole
