"""Training speed on the standard GPU workload (../shared/bench/README.md), through foxhunt.

    python bench/bench_train.py                 on a CUDA device (the H200 of the device tool)
    python bench/bench_train.py --cpu-smoke     tiny sizes on the CPU: checks the script runs
    python bench/bench_train.py --variants ppo-graph-bf16-compile,pqn-graph-bf16-compile

Workload (the anchor's definition): 2,000,000 bars of 42 + 8 i.i.d. N(0,1) features and
prices from a geometric random walk; the state (61 here with the memory of the 8 order-flow
columns, 53 without, 54 in the anchor) padded to 64; trunk 512-256, heads 128, C51 on 51
atoms; foxhunt's dueling head covers the env's 30 joint actions (434,349 parameters), the
anchor's three branches 3/5/3 (375,140); replay 1,000,000 on the GPU;
batch 8192; n-step 3; PER; Adam; epsilon-greedy 0.05 as the anchor. One epoch = 100 collection
steps at E = 16384, then 488 learning steps at B = 8192. Variants `-noisy` use noisy heads
instead (Rainbow's exploration: every head layer a second matmul, ~1.5x the network's FLOPs),
`-compile` torch.compile the loss and the update. A/B switches: `-noalign` (head matmuls at
their own widths), `-optfused` / `-optsingle` (the update uncompiled, Adam fused or one op at a
time), `-f32out` (the output layers in float32, `float32_outputs`), `-eagercollect` (a
compiled variant's collection step left uncompiled), `-nofold` (the dueling mean taken over the
advantage layer's outputs, as on a CPU, rather than out of its weights), `-nofuse` (each ReLU
a kernel of its own after its layer's product rather than in the product's epilogue,
`QNet.fused_relu`), `-f32prio` (the replay's priorities held in float32, converted to float64
for each sample's cumulative sum, rather than held in float64), `-cubscan` (the priorities'
running sum by torch's scan of a 1-D tensor, CUB's, which may differ in its last bits from run
to run, rather than foxhunt.train.scan's Triton scans), `-noisysplit` (noisy
layers as two matmuls with the noise applied to their outputs, as on a CPU, rather than one
with their weights formed for the shared sample), `-logits` (C51's Triton target given the next
states' logits rather than their dueling streams), `-fullout` (the loss
gathers the taken action's logits from the network's full output rather than reading them in
place), `-torchtarget` (C51's
projection in torch rather than the Triton kernel of foxhunt.train.agents.c51_triton,
`triton_target`),
`-dense` (the state beside each hidden layer's input, `dense_inputs`, D2RL), `-optstep` (Adam's
step through torch.optim's method, which breaks the compiled update into three graphs, rather
than `common.adam_step`), `-nocombo` (without inductor's combo kernels, which launch a graph's
independent small kernels as one: `dqn.COMBO_KERNELS`, and with `-aot`
`dqn.AOT_COMBO_KERNELS`), `-streams` / `-onegraph` (torch.compile's loss as pieces with the
next states' two forward passes on CUDA streams of their own beside the online network's
forward, or as one graph: `dqn.NEXT_ON_STREAMS`), `-advtarget` (C51's target given the next
states' advantage hidden layers and the advantage layers' weights, each action's logits formed
inside its kernel: `dqn.ADV_IN_TARGET`), `-aot` (the DQN's collection and
learning steps, PPO's and PQN's minibatch step, a supervised model's training step, compiled
ahead of time by AOTInductor, `compile_mode="aot"`, foxhunt.train.aot, rather than by
torch.compile), `-flatgrad` (with `-aot`: the learning step's gradient taken for the flat
parameter buffer itself, which autograd forms from a zero buffer of the flat's size per
parameter, rather than for the parameters' views and concatenated, `common.FlatGrad`; its
packages in a folder of their own, since the switch changes the trace, not the source),
`-autotune` (torch.compile's `max-autotune-no-cudagraphs` mode; with `-aot`: the packages'
matrix products tuned at build time among cuBLAS's and Triton's templates, inductor's
`max_autotune`),
`-reorder` (with `-aot`: the packages' combo kernels built with inductor's loop reordering after
fusion, which `common.COMBO_NO_REORDER` turns off on torch before 2.13 and torch.compile's lone
agent keeps),
`-nosubblocks` (with `-aot`: the packages' combo kernels with one block size for all their
subkernels, without `dqn.AOT_COMBO_SETTINGS`), `-pwonly`, `-benchcombo` (inductor's
`combo_kernels_pointwise_only` or `benchmark_combo_kernel`, for the packages and torch.compile's
graphs),
`-nomemory` (the observation without the memory of the order flow, `EnvConfig.memory_decay`
None: the state of the anchor's definition), `-floor` (the learning step cut down to its
network work: the online network's forward, its taken actions' logits read in place, and its
backward on a fixed batch of states and actions, the target's and the online network's
forwards on the next states up to their dueling streams, clipping, Adam and the target update;
no replay, no n-step return, no C51 target or loss, and no pass over the full outputs that
the real step does not make; the collection as usual: what an epoch would take if everything
but the network cost nothing).

Measured: the upload of the 2M bars (pageable, median of 3), the fold transition (reset of
weights, optimiser, replay, envs and normaliser; median of 20), epochs eager fp32, eager bf16 and
captured (CUDA graphs) bf16 with the phase breakdown (collect, learn, val eval over 100k bars in
1024 pieces), each as mean and 95% CI over the timed epochs, and whether eager and captured
give the same numbers (tests/test_train_gpu.py). Prints a table; JSON to $OUT or /tmp.

A variant may start with the model: `ppo-...` and `pqn-...` time PPO and PQN at their GPU
defaults (E = 16,384 envs, rollouts of 32 steps, 4 rounds an epoch; PPO 4 update epochs x 4
minibatches, PQN 2 x 4) on the same data and env; `tlob-...`, `cfc-...`, `mamba2-...` and
`tft-...` time the supervised
models' epochs at their GPU defaults (windows of 128 bars, batches of 1,024; `-h128`, `-d512`,
`-b4096`, `-w64`, `-u128` change TLOB's or TFT's width, Mamba-2's, the batch, the window, CfC's
units; `-p256` the evaluation's piece of windows; `-s200` times epochs of
200 steps, and the row gives what a pass over the train range takes) with their MFU (the
FLOPs of a training step counted by torch's FlopCounterMode, over the H200's 790 TFLOP/s bf16).
Every row gives env-steps/s (collection) and learner samples/s over the epoch (collection and
learning, evaluation excluded).
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import statistics
import sys
import time
from pathlib import Path
from unittest import mock

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from foxhunt.bench.workload import kernel_profile, results_path, standard_market, train_flops
from foxhunt.train import aot
from foxhunt.train.agents import AGENTS, c51_triton, common, dqn
from foxhunt.train.agents.dqn import DQNConfig, RainbowAgent
from foxhunt.train.agents.supervised import SupervisedAgent
from foxhunt.train.data import MarketData
from foxhunt.train.env import EnvConfig
from foxhunt.train.evaluate import Evaluator

T95 = {2: 12.71, 3: 4.30, 4: 3.18, 5: 2.78, 6: 2.57, 7: 2.45, 8: 2.36, 9: 2.31, 10: 2.26}


def ci95(xs: list[float]) -> tuple[float, float]:
    m = statistics.mean(xs)
    if len(xs) < 2:
        return m, float("nan")
    return m, T95.get(len(xs), 2.0) * statistics.stdev(xs) / math.sqrt(len(xs))


def sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize()


def epoch_sizes(agent) -> tuple[int, int]:
    """Env steps and learner samples of one epoch."""
    c = agent.cfg
    if isinstance(agent, SupervisedAgent):
        return 0, agent.steps_per_epoch() * c.batch_size
    if isinstance(agent, RainbowAgent):
        return c.envs * c.collect_steps, c.learn_steps * c.batch_size
    steps = c.envs * c.rollout_steps * c.rounds
    return steps, steps * c.update_epochs


def time_epochs(agent, evaluator, val, epochs: int, warm: int) -> dict:
    """Collection, learning and val evaluation per epoch (an epoch is `agent.rounds` rounds of
    collection then learning), mean and 95% CI over the timed epochs."""
    dev = agent.device
    rows = []
    for e in range(warm + epochs):
        agent.begin_epoch(e, warm + epochs)
        collect = learn = 0.0
        for _ in range(agent.rounds):
            sync(dev)
            t0 = time.perf_counter()
            agent.collect()
            sync(dev)
            t1 = time.perf_counter()
            agent.learn()
            sync(dev)
            collect, learn = collect + t1 - t0, learn + time.perf_counter() - t1
        t0 = time.perf_counter()
        evaluator.run(agent.greedy, *val, graph=True)
        sync(dev)
        ev = time.perf_counter() - t0
        stats = agent.read_stats()
        if e >= warm:
            rows.append((collect, learn, ev, stats["losses/loss"]))
    out = {}
    for i, k in enumerate(("collect", "learn", "eval")):
        out[k] = ci95([r[i] for r in rows])
    out["train_epoch"] = ci95([r[0] + r[1] for r in rows])
    out["epoch_with_eval"] = ci95([r[0] + r[1] + r[2] for r in rows])
    out["loss_last"] = rows[-1][3]
    return out


def profile_learn(agent, variant: str, steps: int = 20, rows: int = 30) -> None:
    """Kernel time per learning step (DQN) or per update (PPO, PQN), by kernel name (outside any
    graph: the eager or compiled step as it is captured)."""
    if isinstance(agent, SupervisedAgent):
        step = agent._step
    else:
        step = agent._learn_step if isinstance(agent, RainbowAgent) else agent._update
    kernel_profile(step, variant, steps, rows)


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
    ap.add_argument("--profile-rows", type=int, default=30, help="kernels the profile lists")
    args = ap.parse_args()
    dev = torch.device("cpu" if args.cpu_smoke else "cuda")
    n = 20_000 if args.cpu_smoke else 2_000_000
    res: dict = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu"}
    res["torch"] = torch.__version__
    feats, ofi, targets = standard_market(n)

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
        # Each variant traces its own code: Dynamo reuses a compiled frame for another agent
        # wherever its guards pass, and they do not cover a switch that patches a function the
        # frame calls (`-optstep`) or inductor's settings (`-nocombo`). Inductor's cache still
        # serves a variant built before it.
        torch._dynamo.reset()
        if dev.type == "cuda":  # a row's peak VRAM is its own, whatever ran or failed before
            torch.cuda.reset_peak_memory_stats()
        try:
            run_variant(args, res, variant, data, env_cfg, train, val, segments, small)
        except Exception as e:  # one failing variant must not hide the others' figures
            res[variant] = {"error": f"{type(e).__name__}: {e}"}
            print(f"{variant}: FAILED {type(e).__name__}: {str(e)[:2000]}", flush=True)
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
        for model in ("ppo", "pqn"):
            for precision in ("fp32", "bf16"):
                s_e, p_e = t.run_onpolicy("eager", model, precision)
                s_g, p_g = t.run_onpolicy("graph", model, precision)
                same = s_e == s_g and torch.equal(p_e, p_g)
                diff = (p_e - p_g).abs().max().item()
                checks[f"{model}-{precision}"] = {"identical": same, "max_param_diff": diff}
                print(f"eager vs captured {model} {precision}, 3 epochs: identical={same} "
                      f"max param diff {diff:.3g}", flush=True)  # fmt: skip
        res["eager_vs_captured"] = checks

    out = results_path("bench_train.json")
    out.write_text(json.dumps(res, indent=2))
    print(f"results in {out}")


def run_variant(args, res, variant, data, env_cfg, train, val, segments, small) -> None:
    model = variant.split("-")[0] if variant.split("-")[0] in AGENTS else "dqn"
    capture, precision, *opts = variant.removeprefix(f"{model}-").split("-")
    if args.cpu_smoke and capture == "graph":
        return
    if "nomemory" in opts:
        env_cfg = dataclasses.replace(env_cfg, memory_decay=None)
    if model != "dqn":  # PPO, PQN and the supervised models at their own defaults
        cls, agent_cls = AGENTS[model].load()
        on_policy = dict(envs=256, rollout_steps=8, rounds=2)
        supervised = dict(window=32, batch_size=64, steps=4)
        sizes = (on_policy if model in ("ppo", "pqn") else supervised) if args.cpu_smoke else {}
        sizes = dict(sizes)
        # Size switches of the supervised models: -h<hidden> (TLOB, TFT), -u<units> (CfC),
        # -d<d_model> (Mamba-2),
        # -b<batch>, -w<window>, -s<optimiser steps an epoch> (default: the whole train range),
        # -p<windows of an evaluation piece> (default 2,048; a wide TFT's piece outgrows the GPU).
        keys = {"h": "hidden", "u": "units", "d": "d_model", "b": "batch_size", "w": "window",
                "s": "steps", "p": "predict_batch"}  # fmt: skip
        for o in opts:
            if o[:1] in keys and o[1:].isdigit():
                sizes[keys[o[0]]] = int(o[1:])
        piece = sizes.pop("predict_batch", None)
        ahead = "aot" in opts  # the mode turns compile on
        mode = {"compile": None, "compile_mode": "aot"} if ahead else {"compile": "compile" in opts}
        ocfg = cls(capture=capture, precision=precision, **mode, **sizes)
        t0 = time.perf_counter()
        agent = agent_cls(ocfg, env_cfg, data, seed=0)
        if piece:
            agent.predict_batch = piece
        agent.reset_fold(*train, seed=1)
        if capture == "graph":
            agent.capture()
        report(args, res, variant, agent, env_cfg, data, train, val, segments, t0, capture)
        return
    mode = "max-autotune-no-cudagraphs" if "autotune" in opts else "default"
    mode = "aot" if "aot" in opts else mode
    cfg = DQNConfig(
        capture=capture,
        precision=precision,
        noisy="noisy" in opts,
        epsilon=0.0 if "noisy" in opts else 0.05,
        n_step=3,  # the standard workload's; the DQN's default is 1
        compile="compile" in opts or mode != "default",
        compile_mode=mode,
        float32_outputs="f32out" in opts,
        dense_inputs="dense" in opts,
        triton_target=False if "torchtarget" in opts else None,
        **(small if args.cpu_smoke else {}),
    )
    t0 = time.perf_counter()
    # -optstep: Adam's step through torch.optim's method, whose graph breaks cut the compiled
    # update in three, rather than `common.adam_step` (patched while the variant traces).
    step = (lambda opt, flat: opt.step()) if "optstep" in opts else common.adam_step
    # -flatgrad: a step compiled ahead of time takes its gradient for the flat buffer, its
    # packages in a folder of their own (the switch changes the trace, not the source).
    backward, cache = common.FlatGrad._backward, aot.cache_dir
    if "flatgrad" in opts:
        folder = aot.cache_dir() / "flatgrad"
        backward, cache = flat_backward, lambda: folder
    # -reorder: the packages' combo kernels with the loop reordering (the options key them).
    combo_aot = {"combo_kernels": True} if "reorder" in opts else dict(dqn.COMBO_NO_REORDER)
    # -aot-autotune: the packages' matrix products tuned at build time among cuBLAS's and
    # Triton's templates (inductor's max_autotune; the build is cached with the package).
    if "autotune" in opts and mode == "aot":
        combo_aot |= {"max_autotune": True, "max_autotune_gemm_backends": "ATEN,TRITON"}
    # -pwonly / -benchcombo: inductor's combo-kernel settings, for the packages and
    # torch.compile's graphs (pointwise kernels alone grouped; each combo kernel timed against
    # its parts), where this torch has them.
    import torch._inductor.config

    known, inductor_patch = torch._inductor.config._config, {}
    for o, key in COMBO_SWITCHES.items():
        if o in opts:
            if key in known:
                combo_aot[key] = inductor_patch[key] = True
            else:
                print(f"{variant}: this torch has no inductor option {key}; left out", flush=True)
    with (
        mock.patch.object(common, "adam_step", step),
        # -nocombo: without inductor's combo kernels (independent small kernels of a graph
        # launched as one), compiled by torch.compile or ahead of time.
        mock.patch.object(dqn, "COMBO_KERNELS", "nocombo" not in opts),
        mock.patch.object(dqn, "AOT_COMBO_KERNELS", "nocombo" not in opts),
        # -streams / -onegraph: the loss as pieces with the next states' forward passes on
        # streams of their own, or as one compiled graph.
        mock.patch.object(
            dqn,
            "NEXT_ON_STREAMS",
            "streams" in opts or (dqn.NEXT_ON_STREAMS and "onegraph" not in opts),
        ),
        # -advtarget: C51's target from the next states' advantage hidden layers.
        mock.patch.object(dqn, "ADV_IN_TARGET", "advtarget" in opts or dqn.ADV_IN_TARGET),
        mock.patch.object(common.FlatGrad, "_backward", backward),
        mock.patch.object(aot, "cache_dir", cache),
        mock.patch.object(dqn, "COMBO_NO_REORDER", combo_aot),
        # -nosubblocks: the packages' combo kernels with one block size for all subkernels.
        mock.patch.object(
            dqn, "AOT_COMBO_SETTINGS", () if "nosubblocks" in opts else dqn.AOT_COMBO_SETTINGS
        ),
        torch._inductor.config.patch(inductor_patch),  # torch.compile's graphs too
    ):
        build_dqn(args, res, variant, opts, cfg, data, env_cfg, train, val, segments, t0)


COMBO_SWITCHES = {"pwonly": "combo_kernels_pointwise_only",
                  "benchcombo": "benchmark_combo_kernel"}  # fmt: skip
"""bench_train's switches of inductor's combo-kernel settings (packages and torch.compile's)."""


def flat_backward(self, loss: torch.Tensor) -> None:
    """`-flatgrad`: FlatGrad's `_backward` with the gradient of a step compiled ahead of time
    taken for the flat buffer itself (autograd's backward of each parameter's view writes it
    into a zero buffer of the flat's size, and those are added up)."""
    if not self.aot:
        loss.backward()
        return
    (g,) = torch.autograd.grad(loss, [self.flat])
    self.flat.grad = g if self.flat.grad is None else self.flat.grad + g


def build_dqn(args, res, variant, opts, cfg, data, env_cfg, train, val, segments, t0) -> None:
    capture = cfg.capture
    agent = RainbowAgent(cfg, env_cfg, data, seed=0)
    # Experiment switches: -noalign (heads' matmuls at their own widths), -optfused /
    # -optsingle (the update eager, Adam fused or one op at a time, on the flat buffer),
    # -eagercollect (the collection step uncompiled).
    if "noalign" in opts:
        agent.net.align = agent.target.align = 1
    if "nofold" in opts:
        agent.net.fold_mean = agent.target.fold_mean = False
    if "nofuse" in opts:  # each ReLU a kernel of its own after its layer's product
        agent.net.fused_relu = agent.target.fused_relu = False
    if "f32prio" in opts:  # the replay's priorities held in float32 (converted each sample)
        agent.replay.prio = agent.replay.prio.float()
    if "cubscan" in opts:  # the priorities' running sum by CUB's scan, torch's on a 1-D tensor
        agent.replay.cumsum = lambda x, dtype: torch.cumsum(x, 0, dtype=dtype)
    if "logits" in opts:  # the Triton target given the next states' logits, not their streams
        agent.next_target = functools.partial(c51_triton.next_target)
    if "noisysplit" in opts:  # noisy layers as two matmuls, the noise applied to their outputs
        agent.net.noisy_weights = agent.target.noisy_weights = False
    if "fullout" in opts:  # the loss gathers the taken action from the full output
        full = agent.net.forward

        def gathered(x, taus=None, noise=True, act=None):
            out = full(x, taus, noise)
            return (
                out if act is None else out.gather(1, act[:, :, None].expand(-1, -1, out.shape[2]))
            )

        agent.net.forward = gathered
    if "eagercollect" in opts:  # the collection step uncompiled (captured all the same)
        agent.collect_fn = agent._collect_act
    for impl in ("fused", "single"):
        if "opt" + impl in opts:
            agent.opt = torch.optim.Adam(
                [agent.flat], lr=cfg.lr, eps=cfg.adam_eps, capturable=True,
                fused=impl == "fused" or None, foreach=False,
            )  # fmt: skip
            agent.update_fn = agent._step_update
    agent.reset_fold(*train, seed=1)
    if "floor" in opts:
        agent._learn_step = network_only_step(agent, train)
    if capture == "graph":
        agent.capture()
    report(args, res, variant, agent, env_cfg, data, train, val, segments, t0, capture)


def network_only_step(agent: RainbowAgent, train: tuple[int, int]):
    """The `-floor` variant's learning step: the network's share of a real one (see the module
    docstring), over one fixed batch of states and taken actions drawn from the train range.
    It reads the networks' outputs as the real step does: the online network's taken-action
    logits in place (its backward writes one action's gradient) and the next states' dueling
    streams (`parts`), of which the stand-in loss reads a column, so that it adds no pass over
    the full [batch, actions, atoms] outputs that the real step never forms."""
    from foxhunt.train.agents.common import compiled

    cfg, B = agent.cfg, agent.cfg.batch_size
    g = torch.Generator(agent.device).manual_seed(0)
    t = torch.randint(train[0], train[1] - 2, (B,), device=agent.device, generator=g)
    act = torch.randint(0, agent.net.n_act, (B, 1), device=agent.device, generator=g)
    flat, one = torch.zeros(B, device=agent.device), torch.ones(B, device=agent.device)
    s, s2 = (agent.state(x, agent.env.portfolio_of(x, flat, one, flat)) for x in (t, t + 1))

    def loss_of(s, s2, act):
        with agent._autocast():
            out = agent.net(s, None, act=act)  # [B, 1, atoms]
            with torch.no_grad():
                streams = [*agent.target(s2, None, parts=True), *agent.net(s2, None, parts=True)]
                nxt = sum(x[:, 0, 0].float().mean() for x in streams)
        # the next-state outputs feed the loss as a constant, so they are not optimised away
        return out.float().square().mean() + nxt

    loss_fn = compiled(loss_of) if cfg.compile else loss_of
    update = compiled(agent._update) if cfg.compile else agent._update

    def step() -> None:
        loss = loss_fn(s, s2, act)
        for p in agent.params:
            p.grad = None
        loss.backward()
        agent.flat.grad = torch.cat([p.grad.reshape(-1) for p in agent.params])
        update()  # clipping, Adam and the target update, as the real step
        with torch.no_grad():
            agent.stats[0] += loss.detach()

    return step


H200_BF16_FLOPS = 790e12  # dense bf16 matmul peak as measured (../shared/bench/README.md)


def report(args, res, variant, agent, env_cfg, data, train, val, segments, t0, capture) -> None:
    """Time one built agent (fold reset, epochs) and print its row."""
    dev = agent.device
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
    steps, samples = epoch_sizes(agent)
    r |= {"build_s": build_s, "fold_reset_ms": statistics.median(resets), "params": nparam,
          "env_steps_per_epoch": steps, "samples_per_epoch": samples,
          "env_steps_per_s": steps / r["train_epoch"][0],
          "samples_per_s": samples / r["train_epoch"][0]}  # fmt: skip
    if dev.type == "cuda":  # training's and evaluation's peak, before the FLOPs are counted
        r["peak_vram_gb"] = torch.cuda.max_memory_allocated() / 1e9
        torch.cuda.reset_peak_memory_stats()
    if isinstance(agent, SupervisedAgent):
        full = max(1, agent.samples // agent.cfg.batch_size)  # steps of one pass over the range
        r["full_epoch_s"] = r["train_epoch"][0] / agent.steps_per_epoch() * full
        flops = train_flops(agent)  # per optimiser step, forward and backward
        r["train_flops_per_step"] = flops
        r["mfu_bf16"] = flops * agent.steps_per_epoch() / r["train_epoch"][0] / H200_BF16_FLOPS
    res[variant] = r
    mfu = f", MFU {r['mfu_bf16']:.1%}" if "mfu_bf16" in r else ""
    if "peak_vram_gb" in r:
        mfu += f", peak VRAM {r['peak_vram_gb']:.1f} GB"
    if "full_epoch_s" in r:
        mfu += f", {r['full_epoch_s']:.2f} s a pass over the train range"
    print(
        f"{variant:24s} epoch {r['train_epoch'][0]:.3f} s +- {r['train_epoch'][1]:.3f}{mfu} "
        f"(collect {r['collect'][0] * 1e3:.1f} ms, learn {r['learn'][0] * 1e3:.1f} ms), "
        f"{r['env_steps_per_s'] / 1e6:.2f} M env-steps/s, {r['samples_per_s'] / 1e6:.2f} M "
        f"samples/s, eval {r['eval'][0] * 1e3:.1f} ms, fold reset {r['fold_reset_ms']:.2f} ms, "
        f"build {build_s:.1f} s, params {nparam:,}, loss {r['loss_last']:.3f}",
        flush=True,
    )
    if args.profile and dev.type == "cuda":
        profile_learn(agent, variant, rows=args.profile_rows)


if __name__ == "__main__":
    main()
