"""Training speed on the standard GPU workload (../shared/bench/README.md), through foxhunt.

    python bench/bench_train.py                 on a CUDA device (the H200 of the device tool)
    python bench/bench_train.py --cpu-smoke     tiny sizes on the CPU: checks the script runs

Workload (the anchor's definition): 2,000,000 bars of 42 + 8 i.i.d. N(0,1) features and
prices from a geometric random walk; the state (53 here, 54 in the anchor) padded to 64; trunk
512-256, heads 128, C51 on 51 atoms; foxhunt's dueling head covers the env's 30 joint actions
(434,349 parameters), the anchor's three branches 3/5/3 (375,140); replay 1,000,000 on the GPU;
batch 8192; n-step 3; PER; Adam; epsilon-greedy 0.05 as the anchor. One epoch = 100 collection
steps at E = 16384, then 488 learning steps at B = 8192. Variants `-noisy` use noisy heads
instead (Rainbow's exploration: every head layer a second matmul, ~1.5x the network's FLOPs),
`-compile` torch.compile the loss and the update. A/B switches: `-noalign` (head matmuls at
their own widths), `-optfused` / `-optsingle` (the update uncompiled, Adam fused or one op at a
time).

Measured: the upload of the 2M bars (pinned, median of 3), the fold transition (reset of
weights, optimiser, replay, envs and normaliser; median of 20), epochs eager fp32, eager bf16 and
captured (CUDA graphs) bf16 with the phase breakdown (collect, learn, val eval over 100k bars in
1024 pieces), each as mean and 95% CI over the timed epochs, and whether eager and captured
give the same numbers (tests/test_train_gpu.py). Prints a table; JSON to $OUT or /tmp.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from foxhunt.train.agents.dqn import DQNConfig, RainbowAgent
from foxhunt.train.data import MarketData
from foxhunt.train.env import EnvConfig
from foxhunt.train.evaluate import Evaluator

T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}


def ci95(xs: list[float]) -> tuple[float, float]:
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, float("nan")
    return m, T95.get(len(xs), 2.0) * statistics.stdev(xs) / math.sqrt(len(xs))


def host_data(n: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    feats = rng.standard_normal((n, 42), dtype=np.float32)
    ofi = rng.standard_normal((n, 8), dtype=np.float32)
    close = np.exp(math.log(100.0) + np.cumsum(rng.normal(0, 1e-3, n)))
    openp = np.concatenate([close[:1], close[:-1]])
    sp = rng.uniform(0, 5e-4, (n, 2))
    high = np.maximum(openp, close) * (1 + sp[:, 0])
    low = np.minimum(openp, close) * (1 - sp[:, 1])
    return feats, ofi, np.stack([openp, high, low, close], 1)


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def time_epochs(agent, evaluator, val, epochs: int, warm: int) -> dict:
    dev = agent.device
    rows = []

    def greedy(t, p):
        return agent.act(agent.state(t, p), noise=False)

    for e in range(warm + epochs):
        sync(dev)
        t0 = time.perf_counter()
        agent.collect()
        sync(dev)
        t1 = time.perf_counter()
        agent.learn()
        sync(dev)
        t2 = time.perf_counter()
        evaluator.run(greedy, *val, graph=True)
        sync(dev)
        t3 = time.perf_counter()
        stats = agent.read_stats()
        if e >= warm:
            rows.append((t1 - t0, t2 - t1, t3 - t2, stats["losses/loss"]))
    out = {}
    for i, k in enumerate(("collect", "learn", "eval")):
        out[k] = ci95([r[i] for r in rows])
    out["train_epoch"] = ci95([r[0] + r[1] for r in rows])
    out["epoch_with_eval"] = ci95([r[0] + r[1] + r[2] for r in rows])
    out["loss_last"] = rows[-1][3]
    return out


def profile_learn(agent, variant: str, steps: int = 20) -> None:
    """Kernel time per learning step, by kernel name (outside any graph: the eager or compiled
    step as it is captured)."""
    from torch.profiler import ProfilerActivity, profile

    agent._learn_step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            agent._learn_step()
        torch.cuda.synchronize()
    rows = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            k = e.name[:60]
            n, t = rows.get(k, (0, 0.0))
            rows[k] = (n + 1, t + e.device_time)
    total = sum(t for _, t in rows.values()) / steps
    print(f"profile {variant}: {total:.0f} us of kernels per step, "
          f"{sum(n for n, _ in rows.values()) / steps:.0f} kernels", flush=True)  # fmt: skip
    for k, (n, t) in sorted(rows.items(), key=lambda kv: -kv[1][1])[:30]:
        print(f"  {t / steps:7.1f} us  {n / steps:4.1f}x  {k}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument(
        "--variants",
        default="eager-fp32,eager-bf16,graph-fp32,graph-bf16,graph-bf16-noisy,graph-bf16-compile,"
        "graph-bf16-compile-noisy",
        help="capture-precision[-noisy][-compile|-autotune]; without -noisy: epsilon-greedy 0.05",
    )
    ap.add_argument("--check", action="store_true", help="run the eager == captured checks")
    ap.add_argument(
        "--profile", action="store_true", help="top CUDA kernels of 20 learning steps per variant"
    )
    args = ap.parse_args()
    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    n = 20_000 if args.cpu_smoke else 2_000_000
    res: dict = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"}
    res["torch"] = torch.__version__
    feats, ofi, targets = host_data(n)

    ups = []
    for _ in range(3):
        d = MarketData(feats, ofi, targets, dev)
        ups.append(d.upload.seconds * 1e3)
        del d
    data = MarketData(feats, ofi, targets, dev)
    res["upload_ms"] = statistics.median(ups)
    res["upload_mb"] = data.upload.bytes / 1e6
    runs = ", ".join(f"{u:.1f}" for u in ups)
    print(
        f"upload of {n:,} bars ({res['upload_mb']:.0f} MB, pinned={data.upload.pinned}): "
        f"{res['upload_ms']:.1f} ms (runs {runs})",
        flush=True,
    )

    small = dict(envs=256, collect_steps=8, learn_steps=8, batch_size=256, replay_capacity=8192)
    env_cfg = EnvConfig()
    train = (0, int(n * 0.6))
    val = (int(n * 0.6), int(n * 0.6) + (2_000 if args.cpu_smoke else 100_000))
    segments = 16 if args.cpu_smoke else 1024
    for variant in args.variants.split(","):
        capture, precision, *opts = variant.split("-")
        if args.cpu_smoke and capture == "graph":
            continue
        cfg = DQNConfig(
            capture=capture,
            precision=precision,
            noisy="noisy" in opts,
            epsilon=0.0 if "noisy" in opts else 0.05,
            compile="compile" in opts or "autotune" in opts,
            compile_mode="max-autotune-no-cudagraphs" if "autotune" in opts else "default",
            **(small if args.cpu_smoke else {}),
        )
        t0 = time.perf_counter()
        agent = RainbowAgent(cfg, env_cfg, data, seed=0)
        # Experiment switches: -noalign (heads' matmuls at their own widths), -optfused /
        # -optsingle (the update eager, Adam fused or one op at a time, on the flat buffer).
        if "noalign" in opts:
            agent.net.align = agent.target.align = 1
        for impl in ("fused", "single"):
            if "opt" + impl in opts:
                agent.opt = torch.optim.Adam(
                    [agent.flat], lr=cfg.lr, eps=cfg.adam_eps, capturable=True,
                    fused=impl == "fused" or None, foreach=False,
                )  # fmt: skip
                agent.update_fn = agent._update
        agent.ensure_optimizer_state()
        agent.reset_fold(*train, seed=1)
        if capture == "graph":
            agent.capture()
        evaluator = Evaluator(env_cfg, data, segments, capture=capture == "graph")
        build_s = time.perf_counter() - t0
        nparam = sum(p.numel() for p in agent.params)
        # Fold transition: everything a new fold needs, in place.
        resets = []
        for k in range(20):
            sync(dev)
            a = time.perf_counter()
            agent.reset_fold(*train, seed=k)
            sync(dev)
            resets.append((time.perf_counter() - a) * 1e3)
        epochs = 2 if args.cpu_smoke else (args.epochs if capture == "graph" else 3)
        r = time_epochs(agent, evaluator, val, epochs=epochs, warm=1)
        r |= {"build_s": build_s, "fold_reset_ms": statistics.median(resets), "params": nparam}
        if dev.type == "cuda":
            r["peak_vram_gb"] = torch.cuda.max_memory_allocated() / 1e9
        res[variant] = r
        print(
            f"{variant:11s} epoch {r['train_epoch'][0]:.3f} s +- {r['train_epoch'][1]:.3f} "
            f"(collect {r['collect'][0] * 1e3:.1f} ms, learn {r['learn'][0] * 1e3:.1f} ms; "
            f"{r['learn'][0] / agent.cfg.learn_steps * 1e6:.0f} us/step), eval "
            f"{r['eval'][0] * 1e3:.1f} ms, fold reset {r['fold_reset_ms']:.2f} ms, "
            f"build {build_s:.1f} s, params {nparam:,}, loss {r['loss_last']:.3f}",
            flush=True,
        )
        if args.profile and dev.type == "cuda":
            profile_learn(agent, variant)
        del agent
        if dev.type == "cuda":
            torch.cuda.empty_cache()

    if args.check and dev.type == "cuda":
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        import test_train_gpu as t

        checks = {}
        for precision, dist, ep, ls in (("fp32", "c51", 3, 24), ("bf16", "c51", 3, 24),
                                        ("fp32", "iqn", 1, 1), ("fp32", "iqn", 3, 24)):  # fmt: skip
            s_e, p_e, pr_e = t.run_epochs("eager", precision, dist, ep, ls)
            s_g, p_g, pr_g = t.run_epochs("graph", precision, dist, ep, ls)
            same = s_e == s_g and torch.equal(p_e, p_g) and torch.equal(pr_e, pr_g)
            diff = (p_e - p_g).abs().max().item()
            checks[f"{precision}-{dist}-{ep}x{ls}"] = {"identical": same, "max_param_diff": diff}
            le = [round(s["losses/loss"], 6) for s in s_e]
            lg = [round(s["losses/loss"], 6) for s in s_g]
            print(
                f"eager vs captured {precision} {dist} {ep} epochs x {ls} steps: "
                f"identical={same} max param diff {diff:.3g}; losses {le} vs {lg}",
                flush=True,
            )
        res["eager_vs_captured"] = checks

    out = Path(os.environ.get("OUT", "/tmp")) / "bench_train.json"
    out.write_text(json.dumps(res, indent=2))
    print(f"results in {out}")


if __name__ == "__main__":
    main()
