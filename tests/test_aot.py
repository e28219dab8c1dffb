"""Steps compiled ahead of time (foxhunt.train.aot, the agents' compile_mode="aot"), on the
CPU: AOTInductor builds C++ here. Each package takes 10-30 s to build, so the tests share one
compile cache and one configuration where they can."""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import subprocess
import sys
import time
import types
from pathlib import Path

import pytest
import torch

from foxhunt.train import aot
from foxhunt.train.agents.dqn import DQNConfig, RainbowAgent
from foxhunt.train.agents.ppo import PPOAgent, PPOConfig
from foxhunt.train.agents.pqn import PQNAgent, PQNConfig
from foxhunt.train.env import EnvConfig
from marketdata import random_market

CFG = DQNConfig(
    hidden=(32, 32), head_hidden=16, envs=8, collect_steps=6, learn_steps=4, batch_size=32,
    replay_capacity=512, compile=True, compile_mode="aot", dense_inputs=True,
)  # fmt: skip


@pytest.fixture(scope="module")
def cache(tmp_path_factory, monkeypatch_module):
    path = tmp_path_factory.mktemp("compile-cache")
    monkeypatch_module.setenv("TORCHINDUCTOR_CACHE_DIR", str(path))
    return path


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def trained(make, epochs: int):
    """The agent `make()` builds, trained `epochs` epochs of one fold, single-threaded (a
    thread count of its own would sum in another order); its statistics are left to read."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        agent = make()
        agent.reset_fold(0, 400, seed=1)
        for e in range(epochs):
            agent.begin_epoch(e, epochs)
            for _ in range(agent.rounds):
                agent.collect()
                agent.learn()
        return agent
    finally:
        torch.set_num_threads(threads)


def train(cfg: DQNConfig, epochs: int = 3) -> RainbowAgent:
    return trained(lambda: RainbowAgent(cfg, EnvConfig(episode_bars=64), random_market(), 0),
                   epochs)  # fmt: skip


ON_POLICY = {
    "ppo": (PPOAgent, PPOConfig(hidden=(32, 32), envs=16, rollout_steps=8, rounds=2, accumulate=2,
                                compile_mode="aot")),
    "pqn": (PQNAgent, PQNConfig(hidden=(32, 32), envs=16, rollout_steps=8, rounds=2,
                                compile_mode="aot")),
}  # fmt: skip


def train_on_policy(name: str, compile_mode: str = "aot", epochs: int = 2):
    """PPO or PQN trained `epochs` epochs of one fold."""
    cls, cfg = ON_POLICY[name]
    if compile_mode != "aot":
        cfg = dataclasses.replace(cfg, compile=False, compile_mode=compile_mode)
    return trained(lambda: cls(cfg, EnvConfig(episode_bars=64), random_market(), seed=0), epochs)


def test_a_step_compiled_ahead_of_time_trains_as_the_eager_agent_does(cache):
    """Three epochs: the statistics and weights of the agent whose collection and learning steps
    were built into the cache, and of a second agent that loaded them, against the uncompiled
    agent's. The two compiled agents agree bit for bit (the same code); the eager one to float
    rounding (inductor fuses and orders sums otherwise)."""
    built = train(CFG)
    assert built.learn_aot.built, "the first agent builds the package"
    assert sorted(p.name.split("-")[1] for p in (cache / "foxhunt-aot").glob("*.pt2")) == [
        "collect", "learn"]  # fmt: skip
    loaded = train(CFG)
    assert not loaded.learn_aot.built, "the second loads what the first built"
    eager = train(dataclasses.replace(CFG, compile=False, compile_mode="default"))
    assert eager.learn_aot is None
    s_built, s_loaded, s_eager = (a.read_stats() for a in (built, loaded, eager))
    assert s_built == s_loaded
    assert torch.equal(built.flat, loaded.flat)
    assert torch.equal(built.replay.prio, loaded.replay.prio)
    for k in ("losses/loss", "losses/grad_norm", "losses/q_taken", "charts/collect_reward_bps"):
        assert s_built[k] == pytest.approx(s_eager[k], rel=1e-4, abs=1e-6), k
    assert s_built["losses/loss"] > 0
    torch.testing.assert_close(built.flat, eager.flat, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(built.target_flat, eager.target_flat, rtol=1e-3, atol=1e-4)
    torch.testing.assert_close(built.replay.prio, eager.replay.prio, rtol=1e-3, atol=1e-5)
    assert torch.equal(built.replay.ibuf, eager.replay.ibuf), "the same transitions collected"
    assert int(built.opt.state[built.flat]["step"]) == 3 * CFG.learn_steps


@pytest.mark.parametrize(
    "kw",
    [dict(noisy=True, epsilon=0.0, noise_per_env=True, n_step=3),
     dict(noisy=True, epsilon=0.0, distribution="mean", cql_alpha=0.5, double_q=False)],
    ids=["noisy-per-env-nstep3", "noisy-mean-cql"],
)  # fmt: skip
def test_other_forms_of_the_agent_train_ahead_of_time_as_eagerly(cache, kw):
    """Noisy nets with per-env noise (drawn outside the collection step) and n-step returns;
    noisy nets whose noise is shared by the envs (each step's noise copied inside the step into
    the buffer the layers' noise is a view of: per-env noise is C51's alone) with the `mean`
    head and CQL. Two forms in two builds, each package 10-30 s on a CPU: two epochs against
    the uncompiled agent, to float rounding."""
    cfg = dataclasses.replace(CFG, **kw)
    built, eager = (
        train(cfg, epochs=2),
        train(dataclasses.replace(cfg, compile=False, compile_mode="default"), epochs=2),
    )
    assert built.learn_aot is not None
    s_built, s_eager = built.read_stats(), eager.read_stats()
    for k in ("losses/loss", "losses/grad_norm", "losses/q_taken", "losses/cql"):
        assert s_built[k] == pytest.approx(s_eager[k], rel=1e-4, abs=1e-6), k
    torch.testing.assert_close(built.flat, eager.flat, rtol=1e-3, atol=1e-4)
    assert torch.equal(built.replay.ibuf, eager.replay.ibuf)


@pytest.mark.parametrize("name", ["ppo", "pqn"])
def test_on_policy_minibatches_compiled_ahead_of_time_learn_as_eagerly(cache, name):
    """PPO (two micro-batches a minibatch, their gradients summed inside the step) and PQN,
    two epochs of 2 rounds: the agent that built its minibatch
    step and one that loaded it agree bit for bit, and both agree with the uncompiled agent
    to float rounding (the rollouts are not compiled: the same actions are taken). PPO's
    evaluation step, compiled ahead of time as `foxhunt train` does for such an agent, walks
    as the uncompiled one."""
    from foxhunt.train.evaluate import Evaluator

    built = train_on_policy(name)
    assert built.minibatch_aot.built
    loaded = train_on_policy(name)
    assert not loaded.minibatch_aot.built
    eager = train_on_policy(name, "default")
    assert eager.minibatch_aot is None
    s_built, s_loaded, s_eager = (a.read_stats() for a in (built, loaded, eager))
    assert s_built == s_loaded
    assert torch.equal(built.flat, loaded.flat)
    assert s_built.keys() == s_eager.keys()
    for k, v in s_eager.items():
        assert s_built[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert s_built["losses/grad_norm"] > 0
    torch.testing.assert_close(built.flat, eager.flat, rtol=1e-4, atol=1e-5)
    v_built, v_eager = (a.opt.state[a.flat]["exp_avg_sq"] for a in (built, eager))
    torch.testing.assert_close(v_built, v_eager, rtol=1e-3, atol=1e-9)
    steps = 2 * 2 * built.cfg.update_epochs * built.cfg.minibatches  # epochs x rounds x ...
    assert int(built.opt.state[built.flat]["step"]) == steps
    assert torch.equal(built.roll.act, eager.roll.act), "the same actions in the last rollout"
    if name == "ppo":
        env = EnvConfig(episode_bars=64)
        walks = []
        for compile_ in (False, "aot"):
            ev = Evaluator(env, built.data, segments=8, compile=compile_)
            ev.reserve(200)
            walks.append(ev.run(built.greedy, 400, 599, graph=True))
        (r0, f0), (r1, f1) = walks
        torch.testing.assert_close(r1, r0, rtol=1e-5, atol=1e-9)
        assert torch.equal(f1, f0)


def train_supervised(cfg):
    """A supervised model trained 2 epochs on one fold."""
    from foxhunt.train.agents.supervised import SupervisedAgent

    return trained(lambda: SupervisedAgent(cfg, EnvConfig(), random_market(), seed=0), 2)


@pytest.mark.parametrize("name", ["tlob", "tft"])
def test_supervised_steps_compiled_ahead_of_time_learn_as_eagerly(cache, name):
    """A supervised model's whole training step (the learning rate's schedule, the loss over
    the micro-batches, the gradient, clipping, AdamW) built and loaded: bit for bit between the
    two, to float rounding against the uncompiled model. TLOB with two micro-batches a step
    (its attention's views, which export would refuse as views), TFT with its LSTM (traced as
    cells) and its return target (quantiles read as a normal distribution)."""
    from foxhunt.train.models.tft import TFTConfig
    from foxhunt.train.models.tlob import TLOBConfig

    small = dict(window=16, batch_size=32, steps=4, compile_mode="aot")
    cfg = (TLOBConfig(hidden=16, layers=1, accumulate=2, **small) if name == "tlob"
           else TFTConfig(dropout=0.0, **small))  # fmt: skip
    built = train_supervised(cfg)
    assert built.step_aot.built
    loaded = train_supervised(cfg)
    assert not loaded.step_aot.built
    eager = train_supervised(dataclasses.replace(cfg, compile=False, compile_mode="default"))
    assert eager.step_aot is None
    s_built, s_loaded, s_eager = (a.read_stats() for a in (built, loaded, eager))
    assert s_built == s_loaded
    assert torch.equal(built.flat, loaded.flat)
    for k, v in s_eager.items():
        assert s_built[k] == pytest.approx(v, rel=1e-4, abs=1e-6), k
    assert s_built["losses/loss"] > 0
    # An attention's key bias adds the same amount to every key's score of a query, which the
    # softmax takes out: its gradient is 0 but for rounding, which AdamW scales up to steps of
    # about the learning rate with a sign of the rounding's choosing (built and eager differed
    # by 1.4e-5 there, and nowhere else beyond 1e-5, on an AVX-512 VM). TLOB has two: the
    # attention's own and its key projection's (k), which reaches the scores only through the
    # keys (1.2e-5 on a 2-core VM). Held to that bound; every other parameter to float
    # tolerance.
    from foxhunt.train.models.tlob import TransformerLayer

    noise = torch.zeros_like(built.flat, dtype=torch.bool)
    at = lambda p: p.storage_offset() - built.flat.storage_offset()  # noqa: E731
    for m in built.net.modules():  # the parameters are views of the flat buffer
        if isinstance(m, torch.nn.MultiheadAttention) and m.in_proj_bias is not None:
            e = m.embed_dim
            noise[at(m.in_proj_bias) + e : at(m.in_proj_bias) + 2 * e] = True
        if isinstance(m, TransformerLayer):
            noise[at(m.k.bias) : at(m.k.bias) + m.k.bias.numel()] = True
    assert noise.any() == (name == "tlob")
    torch.testing.assert_close(built.flat[~noise], eager.flat[~noise], rtol=1e-4, atol=1e-5)
    bound = cfg.lr * int(eager.step_i)
    torch.testing.assert_close(built.flat[noise], eager.flat[noise], rtol=0, atol=bound)
    assert int(built.step_i) == int(eager.step_i) == 8, "the fold's steps, counted in the package"


def test_the_dqn_s_gpu_packages_give_each_combo_subkernel_its_block_size():
    """dqn.aot_options: on a GPU the packages are built with inductor's combo kernels, a block
    size for each of their subkernels (this torch has the setting) and the loop reordering off
    where the torch asserts in it; on a CPU with inductor's defaults. The options key the
    packages, so bench_train's `-nosubblocks` builds packages of its own."""
    from foxhunt.train.agents import common, dqn

    assert dqn.aot_options(torch.device("cpu")) is None
    gpu = dqn.aot_options(torch.device("cuda"))
    assert gpu == {**common.COMBO_NO_REORDER, "combo_kernel_per_subkernel_blocks": True}
    assert gpu["combo_kernels"] is True


def test_dropout_is_refused_ahead_of_time():
    """TFT's dropout would draw inside the package, apart from the task's seed: refused."""
    from foxhunt.train.agents.supervised import SupervisedAgent
    from foxhunt.train.models.tft import TFTConfig

    with pytest.raises(ValueError, match=r"compile_mode = 'aot' with dropout = 0\.1"):
        SupervisedAgent(TFTConfig(window=16, batch_size=32, compile_mode="aot"), EnvConfig(),
                        random_market(), seed=0)  # fmt: skip


def test_a_step_is_not_compiled_ahead_of_time_for_data_parallel_ranks(monkeypatch):
    """A package holds no all-reduce of the ranks' gradients (torch.compile's graph keeps
    `distributed.average_`'s): refused in a process of a data-parallel group."""
    from foxhunt.train import distributed

    monkeypatch.setattr(distributed, "world", lambda: (0, 2))
    h = types.SimpleNamespace(w=torch.zeros(4))
    with pytest.raises(ValueError, match="one of 2 data-parallel processes"):
        aot.Step(h, "toy", lambda: h.w.add_(1), (), "", lambda: None, lambda _: None)


def test_a_fresh_process_runs_the_steps_without_importing_the_compiler(cache):
    """What the warm start saves: another process loads the packages and trains an epoch with
    neither Dynamo nor inductor imported (on the H200's hosts their imports alone took 9-15 s),
    nothing traced and nothing compiled."""
    train(CFG, epochs=1)  # the packages are there
    code = f"""
import sys, torch
sys.path[:0] = {sys.path!r}
from test_aot import CFG, train
a = train(CFG, epochs=1)
assert not a.learn_aot.built
print(sorted(m for m in sys.modules if m.startswith(("torch._dynamo", "torch._inductor"))))
print(a.read_stats()["losses/loss"])
"""
    env = {"TORCHINDUCTOR_CACHE_DIR": str(cache), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=300)  # fmt: skip
    assert p.returncode == 0, p.stderr[-3000:]
    modules, loss = p.stdout.strip().splitlines()[-2:]
    assert modules == "[]", "torch's compiler imported"
    assert float(loss) > 0


def test_a_broken_package_is_built_again(cache, caplog):
    """A package in the cache that cannot be loaded (here cut short) is rebuilt, with a
    warning naming it and the build's start and end logged, and the agent trains as with the
    package it replaces; a package that loads is not built, and says nothing."""
    caplog.set_level(logging.INFO, logger="foxhunt.train.aot")
    first = train(CFG, epochs=1)
    path = first.learn_aot.path
    caplog.clear()
    assert not train(CFG, epochs=1).learn_aot.built
    assert "aot: building" not in caplog.text and " built in " not in caplog.text
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    again = train(CFG, epochs=1)
    assert again.learn_aot.built
    assert f"aot: {path.name} could not be loaded" in caplog.text
    assert "aot: building dqn-learn: no package for this torch" in caplog.text
    assert re.search(rf"aot: dqn-learn built in \d+\.\d s: {re.escape(path.name)}", caplog.text)
    assert torch.equal(first.flat, again.flat)


def test_packages_loaded_are_marked_used_and_unused_ones_pruned(cache, tmp_path, monkeypatch):
    """Every change of foxhunt's source, torch or a config builds packages of its own; on a
    shared cache volume those not loaded for FOXHUNT_AOT_KEEP_DAYS days are removed when a task
    builds one, and loading a package counts as a use."""
    path = train(CFG, epochs=1).learn_aot.path
    month_ago = time.time() - 30 * 86400
    os.utime(path, (month_ago, month_ago))
    assert not train(CFG, epochs=1).learn_aot.built
    assert path.stat().st_mtime > month_ago + 29 * 86400

    for name in ("old", "recent", "kept"):
        (tmp_path / f"{name}.pt2").write_bytes(b"x")
    (tmp_path / "old.txt").write_bytes(b"x")  # not a package
    for name in ("old.pt2", "kept.pt2", "old.txt"):
        os.utime(tmp_path / name, (month_ago, month_ago))
    assert aot.prune(tmp_path, 0) == []  # 0 keeps every package
    assert aot.prune(tmp_path, 14, keep=tmp_path / "kept.pt2") == [tmp_path / "old.pt2"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["kept.pt2", "old.txt", "recent.pt2"]

    monkeypatch.setenv(aot.KEEP_DAYS_ENV, "a week")
    with pytest.raises(ValueError, match="FOXHUNT_AOT_KEEP_DAYS='a week'"):
        aot.keep_days()
    monkeypatch.setenv(aot.KEEP_DAYS_ENV, "7")
    assert aot.keep_days() == 7


def test_a_build_without_a_cpp_compiler_is_refused_before_the_trace(cache, monkeypatch):
    """The CPU image has no C++ compiler: a step to build there stops at once, saying what to
    do, rather than after its trace with inductor's error."""
    import torch._inductor.config as inductor_config

    monkeypatch.setattr(aot, "trace", lambda *a: pytest.fail("traced"))
    other = dataclasses.replace(CFG, hidden=(24, 24))  # a package the cache does not hold
    with (
        inductor_config.patch({"cpp.cxx": (None, "/nonexistent/g++")}),
        pytest.raises(RuntimeError, match="aot: building dqn-learn needs a C\\+\\+ compiler"),
    ):
        train(other, epochs=1)
    assert inductor_config.cpp.cxx != (None, "/nonexistent/g++")


def test_a_loader_that_crashes_stops_the_task_with_an_error_not_a_signal(
        cache, monkeypatch, tmp_path):  # fmt: skip
    """torch's loader is tried on a package in a process of its own, once per torch and
    machine: where it ends that process (torch 2.11 on the H200 image: SIGSEGV on any package),
    the task stops with an error naming the cause; where it fails without a crash (a package
    that does not load), the package is built again; a success leaves a marker, so a warm task
    starts no process."""
    import tempfile

    train(CFG, epochs=1)  # the packages are there, the loader checked
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # no marker of another run there
    markers = list(cache.glob("foxhunt-aot/loader-ok-*"))
    assert len(markers) == 1
    markers[0].unlink()
    crash = "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"
    monkeypatch.setattr(aot, "LOADER_CHECK", crash)
    with pytest.raises(aot.LoaderCrash, match=r"ends the process \(signal 11\).*compile_mode"):
        train(CFG, epochs=1)
    assert not markers[0].exists()

    monkeypatch.setattr(aot, "LOADER_CHECK", "raise SystemExit('no model in it')")
    with pytest.raises(ValueError, match=r"x\.pt2 does not load: no model in it"):
        aot.check_loader(cache / "x.pt2", -1)
    monkeypatch.undo()
    assert not train(CFG, epochs=1).learn_aot.built  # the real check, passed again
    assert markers[0].exists()


def test_a_read_only_cache_keeps_the_loaders_mark_in_the_temporary_folder(
        cache, monkeypatch, tmp_path):  # fmt: skip
    """Where the marker cannot be written beside the packages (a cache volume mounted
    read-only), it goes to the temporary folder: the next task starts no process either."""
    import tempfile
    from pathlib import Path

    train(CFG, epochs=1)
    pkg = next(cache.glob("foxhunt-aot/*.pt2"))
    for m in cache.glob("foxhunt-aot/loader-ok-*"):
        m.unlink()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    touch = Path.touch

    def read_only(self, *a, **k):
        if self.parent == pkg.parent:
            raise PermissionError(13, "Read-only file system", str(self))
        return touch(self, *a, **k)

    monkeypatch.setattr(Path, "touch", read_only)
    runs = []
    run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: runs.append(a) or run(*a, **k))
    aot.check_loader(pkg, -1)
    aot.check_loader(pkg, -1)
    assert len(runs) == 1
    assert len(list(tmp_path.glob("foxhunt-aot-loader-ok-*"))) == 1
    assert not list(cache.glob("foxhunt-aot/loader-ok-*"))


@torch.library.custom_op("foxhunt_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    """An operator inductor has no lowering for: it calls it as it is (an implicit fallback)."""
    return x * 2


@twice.register_fake
def _(x):
    return torch.empty_like(x)


class Stop(Exception):
    pass


def test_an_operator_inductor_calls_as_it_is_is_named_in_one_line_whatever_its_inputs(
    tmp_path, monkeypatch
):
    """aot.short_operator_messages: inductor's message about an operator it calls as it is (a
    custom op without a lowering) names an argument 14 levels of sin + cos deep in one line.
    Inductor's own form prints an argument's IR once per path to each input, doubling with
    each level (6.5 MB at these 14 levels under torch 2.13), and torch 2.11 formats it even
    where the line is not logged: TFT's GPU build stayed in it for minutes. The build stops at
    the fallback here (its `make_fallback` raises), before any C++, and leaves no package."""
    from torch._inductor import exc, graph

    def stop(*a, **k):
        raise Stop("stopped at the fallback")

    monkeypatch.setattr(graph, "make_fallback", stop)
    lines: list[str] = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda r: lines.append(r.getMessage())
    log = logging.getLogger("torch._inductor.graph")
    monkeypatch.setattr(log, "level", logging.INFO)
    log.addHandler(handler)
    h = types.SimpleNamespace(w=torch.zeros(4))

    def body(x):
        for _ in range(14):
            x = torch.sin(x) + torch.cos(x)
        h.w.add_(twice(x))

    bound = aot.Bound(h)
    gm = aot.trace(bound, body, (torch.ones(4),))
    original = exc.OperatorIssue.__dict__["operator_str"]
    t0 = time.perf_counter()
    try:
        with pytest.raises(Exception, match="stopped at the fallback") as e:
            aot.build(gm, [*bound.bases, torch.ones(4)], tmp_path / "x.pt2")
    finally:
        log.removeHandler(handler)
    assert time.perf_counter() - t0 < 60
    said = [ln for ln in lines if "implicit fallback" in ln]
    assert said and len(said[0]) < 500, said
    assert "args[0]: TensorBox(" in said[0] and "size=[4]" in said[0], said[0]
    assert len(str(e.value)) < 2000  # inductor's error names the arguments the same way
    assert exc.OperatorIssue.__dict__["operator_str"] is original  # put back after the build
    assert not list(tmp_path.iterdir())  # nothing left half-written


def test_an_operator_s_arguments_are_described_in_short():
    assert aot.describe(list(range(20))) == "[0, 1, 2, 3, 4, 5, 6, 7, ... 12 more]"
    assert aot.describe("x" * 300) == repr("x" * 300)[:200] + "..."
    assert aot.describe([[[[1]]]]) == "[[[[1]]]]"


def test_an_lstm_is_traced_as_its_cells_operators_forward_and_backward(monkeypatch):
    """aot._cell_rnns: nn.LSTM traced (as a step's trace runs it) into matrix products and
    pointwise ops, its gradient too, with no fused or backend kernel of a whole layer or cell
    (which AOTInductor's runtimes cannot call backward), through torch._decomp's decomposition,
    which takes the same path on a GPU (where torch's own LSTM without cuDNN runs a fused cell:
    not seen on a CPU); the graph computes eager's numbers, and the switches and torch's `_VF`
    are put back after."""
    from torch._decomp import decompositions
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.nn.modules import rnn

    calls = []
    impl = decompositions.lstm_impl
    monkeypatch.setattr(decompositions, "lstm_impl", lambda *a: calls.append(1) or impl(*a))

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 8, batch_first=True)
    x = torch.randn(2, 5, 4)
    params = list(lstm.parameters())

    def step(x):
        out, (h, c) = lstm(x)
        return torch.autograd.grad(out.square().sum() + h.sum() + c.sum(), params)

    vf, switches = rnn._VF, (torch.backends.mkldnn.enabled, torch.backends.cudnn.enabled)
    with aot._cell_rnns():
        gm = make_fx(step)(x)
    assert calls == [1]
    assert rnn._VF is vf
    assert (torch.backends.mkldnn.enabled, torch.backends.cudnn.enabled) == switches
    ops = {str(n.target) for n in gm.graph.nodes if n.op == "call_function"}
    assert not [o for o in ops if "lstm" in o or "rnn" in o], ops
    assert {"aten.sigmoid.default", "aten.tanh.default"} <= ops, ops
    for got, want in zip(gm(x), step(x), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_traced_lstm_is_left_holding_its_own_parameters():
    """After a step's trace an agent's LSTM holds its own parameters again, the views of the
    agent's flat buffer, and sees no change of weights: otherwise its next call re-reads them
    and, on a GPU, flattens them for cuDNN into memory of its own, away from the buffer the
    optimiser and the package train (TFT's builder then predicted with stale LSTM weights)."""
    from foxhunt.train.agents.common import flatten_into_views

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 8, batch_first=True)
    agent = types.SimpleNamespace(net=lstm, flat=flatten_into_views(list(lstm.parameters())))
    x = torch.randn(2, 5, 4)
    aot.trace(aot.Bound(agent), lambda x: lstm(x)[0].sum(), (x,))
    own = [getattr(lstm, n) for n in lstm._flat_weights_names]
    assert all(w is p for w, p in zip(lstm._flat_weights, own, strict=True))
    assert not lstm._weights_have_changed()
    lo, hi = agent.flat.data_ptr(), agent.flat.data_ptr() + agent.flat.nbytes
    assert all(lo <= p.data_ptr() < hi for p in own)


def test_the_loaders_mark_is_keyed_by_each_packages_own_link(toy_packages, tmp_path, monkeypatch):
    """A package keeps how it was linked in its metadata, read back without loading it; the
    loader's check of a package linked inductor's default way (where the compiler has no
    static libstdc++) is not taken as passed by the mark of one linked with its own runtime,
    nor the other way round. A package without the entry reads as the own runtime's. (The
    toy packages of aot_probe, which carry the entry as a step's do: the next test.)"""
    import shutil
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    own, plain = tmp_path / "own.pt2", tmp_path / "plain.pt2"  # the marks go beside them
    shutil.copy(toy_packages["own"], own)
    shutil.copy(toy_packages["default"], plain)
    assert aot.package_link(own) == " ".join(aot.OWN_RUNTIME)
    assert aot.package_link(plain) == aot.DEFAULT_LINK
    assert aot.package_link(tmp_path / "none.pt2") == " ".join(aot.OWN_RUNTIME)

    runs = []
    run = subprocess.run
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: runs.append(a) or run(*a, **k))
    for path in (own, own, plain, plain):
        aot.check_loader(path, -1)
    assert len(runs) == 2  # one check for each link, not one for both
    assert len(list(tmp_path.glob("loader-ok-*"))) == 2


def traced_toy() -> tuple[torch.fx.GraphModule, list[torch.Tensor]]:
    """A toy step (w += x) traced for aot.build, with its example inputs."""
    h = types.SimpleNamespace(w=torch.zeros(4))
    bound = aot.Bound(h)
    gm = aot.trace(bound, lambda x: h.w.add_(x), (torch.ones(4),))
    return gm, [*bound.bases, torch.ones(4)]


def test_a_step_s_package_says_how_it_is_linked(tmp_path, monkeypatch):
    """aot.build links a package with its own C++ runtime where `aot.runtime_linker` gives a
    wrapper (inductor's compiler is then the wrapper), else inductor's default way, and writes
    which into the package's metadata beside the caller's (inductor's build recorded here)."""
    import torch._inductor

    seen = []

    def record(ep, package_path, inductor_configs):
        seen.append(inductor_configs)
        Path(package_path).write_bytes(b"")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", record)
    gm, example = traced_toy()
    for linker in ("/machine/foxhunt-cxx/tag/g++", None):
        monkeypatch.setattr(aot, "runtime_linker", lambda folder=None, w=linker: w)
        aot.build(gm, example, tmp_path / "p.pt2", {"mine": "1"})
    own, plain = seen
    assert own["aot_inductor.metadata"] == {"mine": "1", aot.LINK_KEY: aot.OWN_LINK}
    assert own["cpp.cxx"] == ("/machine/foxhunt-cxx/tag/g++",)
    assert plain["aot_inductor.metadata"] == {"mine": "1", aot.LINK_KEY: aot.DEFAULT_LINK}
    assert "cpp.cxx" not in plain


def test_a_build_whose_passes_disagree_is_built_again_tuned_at_compile_time(tmp_path, monkeypatch):
    """Where inductor's second pass asks for a kernel its first never saved (aot.UNSAVED_KERNEL:
    TFT's step on a GPU), aot.build builds once more with each kernel tuned at compile time and
    renames that package into place; any other error, or that one from the second build, is
    raised, and no package or temporary file is left (inductor's build stood in for here)."""
    import torch._inductor

    seen, fail = [], {}

    def flaky(ep, package_path, inductor_configs):
        seen.append(dict(inductor_configs))
        Path(package_path).write_bytes(b"half")
        err = fail.get(inductor_configs["triton.autotune_at_compile_time"])
        if err:
            raise RuntimeError(err)
        Path(package_path).write_bytes(b"built")

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", flaky)
    monkeypatch.setattr(aot, "runtime_linker", lambda folder=None: None)
    gm, example = traced_toy()
    unsaved = f"AssertionError: {aot.UNSAVED_KERNEL} for triton_per_fused_softmax_129"

    fail[False] = unsaved
    assert aot.build(gm, example, tmp_path / "p.pt2", {"mine": "1"}).read_bytes() == b"built"
    assert [c["triton.autotune_at_compile_time"] for c in seen] == [False, True]
    assert seen[1]["aot_inductor.metadata"] == seen[0]["aot_inductor.metadata"]

    for first, second, match in ((unsaved, unsaved, aot.UNSAVED_KERNEL),
                                 ("some other inductor error", None, "some other")):  # fmt: skip
        seen.clear()
        fail.update({False: first, True: second})
        with pytest.raises(RuntimeError, match=match):
            aot.build(gm, example, tmp_path / "q.pt2")
        assert len(seen) == (2 if second else 1)
    assert sorted(f.name for f in tmp_path.iterdir()) == ["p.pt2"]


def test_a_cpu_process_running_packages_keeps_its_freed_buffers():
    """aot.hold_heap: a buffer above glibc's mmap threshold, freed and taken again, comes back
    without its pages faulted in again (the memory stays with the process)."""
    code = """
import ctypes, resource, sys
from foxhunt.train import aot
libc = ctypes.CDLL(None)
libc.malloc.restype, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_void_p]
if sys.argv[1] == "hold":
    assert aot.hold_heap()
n = 64 << 20
for _ in range(3):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)
    libc.free(p)
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
    faults = {}
    for mode in ("hold", "none"):
        p = subprocess.run([sys.executable, "-c", code, mode], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr[-2000:]
        faults[mode] = int(p.stdout.split()[-1])
    # Every page faulted in again without (16,385 with 4 kB pages; fewer with huge pages).
    assert faults["none"] > 0 and faults["hold"] * 10 <= faults["none"], faults


def test_a_replaced_tensor_is_refused_by_name(cache):
    agent = train(CFG, epochs=1)
    agent.z = agent.z.clone()  # a package reads the tensors it was loaded with
    with pytest.raises(RuntimeError, match=r"'z' was replaced"):
        agent.learn()


def test_views_of_one_buffer_are_one_input_and_see_each_others_writes(tmp_path):
    """A step that writes through the flat buffer and reads through a view of it: inside the
    package the view is made from the buffer, so it reads what was written (as eager code
    does), where two separate inputs would read the old values."""

    h = types.SimpleNamespace()
    h.flat = torch.arange(8.0)
    h.views = [h.flat[:4].view(2, 2), h.flat[4:]]
    h.out = torch.zeros(4)

    def body(x):
        h.flat.mul_(x)
        h.out.copy_(h.views[1] + 1)

    bound = aot.Bound(h)
    assert len(bound.bases) == 2
    gm = aot.trace(bound, body, (torch.full((8,), 2.0),))
    # The trace shows library code torch.compile's view; nothing keeps that view after it.
    from torch._dynamo import decorators

    assert not torch.compiler.is_compiling() and not decorators.is_compiling()
    h.flat.copy_(torch.arange(8.0))
    h.out.zero_()
    path = aot.build(gm, [*bound.bases, torch.ones(8)], tmp_path / "toy.pt2")
    loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
    loader.run([*bound.inputs, torch.full((8,), 3.0)])
    assert h.flat.tolist() == [3.0 * i for i in range(8)]
    assert h.out.tolist() == [13.0, 16.0, 19.0, 22.0]


def test_the_gradient_ahead_of_time_is_its_views_gradients_concatenated():
    """FlatGrad inside a traced step: the gradient taken for the parameters' views and
    concatenated is the flat buffer's own gradient bit for bit (two backward passes added up,
    zeros for a parameter the loss leaves out), and the trace forms no zero buffer of the
    flat's size, which autograd's backward of each view writes into when the gradient is
    taken for the flat buffer itself."""
    from foxhunt.train.agents import common

    class Toy(common.FlatGrad):
        aot = True

        def __init__(self):
            g = torch.Generator().manual_seed(0)
            self.w, self.b, self.unused = (torch.nn.Parameter(torch.randn(*s, generator=g))
                                           for s in ((3, 4), (3,), (5,)))  # fmt: skip
            self.params = [self.w, self.b, self.unused]
            self.flat = common.flatten_into_views(self.params)
            self.x = torch.randn(6, 4, generator=g)

        def step(self):
            for k in (1.0, 2.0):
                self._backward(k * (self.x @ self.w.t() + self.b).square().sum())
            return self.flat.grad

    def of_the_flat(self, loss):  # the gradient taken for the flat buffer itself
        (g,) = torch.autograd.grad(loss, [self.flat])
        self.flat.grad = g if self.flat.grad is None else self.flat.grad + g

    grads, zeros = {}, {}
    for form in ("views", "flat"):
        toy = Toy()
        if form == "flat":
            toy._backward = types.MethodType(of_the_flat, toy)
        bound = aot.Bound(toy)
        gm = aot.trace(bound, toy.step, ())
        (grads[form],) = gm(*bound.bases)
        n = toy.flat.numel()
        zeros[form] = [nd for nd in gm.graph.nodes if "zeros" in str(nd.target)
                       and nd.meta["val"].numel() == n]  # fmt: skip
    assert torch.equal(grads["views"], grads["flat"])
    toy = Toy()
    (toy.x @ toy.w.t() + toy.b).square().sum().backward()
    want = torch.cat([3 * toy.w.grad.reshape(-1), 3 * toy.b.grad, torch.zeros(5)])
    torch.testing.assert_close(grads["views"], want)
    assert zeros["flat"] and not zeros["views"]


def test_only_views_whose_memory_is_not_written_after_them_become_reshapes():
    """Export may refuse a trace's view (its meta strides differ from the kernels'), so views
    become reshapes, but not one whose memory is written after it: a copy would miss the
    write. Here the view of the input, which `add_` writes after, stays a view; the view of
    an intermediate becomes a reshape; the graph computes what eager code does."""
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        v = (x * 2).view(4)
        w = x.view(4)
        x.add_(1)
        return v + w

    gm = make_fx(f)(torch.zeros(2, 2))
    assert aot.reshape_read_only_views(gm) == 1
    ops = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert ops.count(torch.ops.aten.view.default) == 1
    assert ops.count(torch.ops.aten.reshape.default) == 1
    x = torch.arange(4.0).view(2, 2)
    assert gm(x.clone()).tolist() == f(x.clone()).tolist() == [1.0, 4.0, 7.0, 10.0]


def test_a_tensor_the_agent_does_not_hold_where_it_is_looked_for_is_refused():
    """A step reading a tensor held in a tuple would keep its value of the trace: refused."""
    h = types.SimpleNamespace(w=torch.zeros(4), pair=(torch.ones(4), torch.ones(4)))

    def body(x):
        h.w.add_(x * h.pair[0])

    with pytest.raises(ValueError, match=r"reads 1 tensor\(s\) of shapes \[\(4,\)\]"):
        aot.trace(aot.Bound(h), body, (torch.ones(4),))


def test_the_package_key_changes_with_the_settings_the_layout_and_the_cpu(monkeypatch):
    """Another learning rate or another size is another package (the Python values a step
    reads are fixed in it), and so is another CPU model (inductor builds for the host's)."""
    h = types.SimpleNamespace()
    h.w = torch.zeros(4)
    u = torch.zeros(3)
    keys = {
        aot.package_path("s", "lr=1e-3", aot.Bound(h), (u,)),
        aot.package_path("s", "lr=1e-4", aot.Bound(h), (u,)),
        aot.package_path("s", "lr=1e-3", aot.Bound(h), (torch.zeros(5),)),
    }
    monkeypatch.setattr(aot, "host_cpu", lambda: "another CPU")
    keys.add(aot.package_path("s", "lr=1e-3", aot.Bound(h), (u,)))
    h.w = torch.zeros(6)
    keys.add(aot.package_path("s", "lr=1e-3", aot.Bound(h), (u,)))
    assert len(keys) == 5


def test_a_steps_inductor_options_reach_its_build_and_key_its_package(cache, monkeypatch):
    """A step built with inductor options (the DQN's combo kernels on a GPU) gets them over
    foxhunt's own in AOTInductor's build, and a package of its own; a step without options
    keeps the key it had, so packages already built stay found."""
    h = types.SimpleNamespace(w=torch.zeros(4))

    def body(x):
        h.w.add_(x * 2)

    args = (torch.ones(4),)
    plain = aot.package_path("toy", "s", aot.Bound(h), args)
    seen = []
    real = torch._inductor.aoti_compile_and_package

    def spy(ep, package_path, inductor_configs):
        seen.append(dict(inductor_configs))
        return real(ep, package_path=package_path, inductor_configs=inductor_configs)

    monkeypatch.setattr(torch._inductor, "aoti_compile_and_package", spy)
    step = aot.Step(h, "toy", body, args, "s", h.w.clone, h.w.copy_,  # the trace runs it once
                    options={"loop_ordering_after_fusion": False})  # fmt: skip
    assert step.built and step.path != plain and step.path.exists()
    assert seen[0]["loop_ordering_after_fusion"] is False
    assert seen[0]["triton.autotune_at_compile_time"] is False  # foxhunt's own kept
    step(torch.full((4,), 3.0))
    assert h.w.tolist() == [6.0] * 4


@pytest.mark.parametrize("cfg", [CFG, ON_POLICY["ppo"][1], ON_POLICY["pqn"][1]],
                         ids=["dqn", "ppo", "pqn"])  # fmt: skip
def test_the_mode_alone_compiles_ahead_of_time_and_contradictions_are_refused(cfg):
    """compile_mode="aot" turns compile on (on a CPU too, where it is off by default); with
    compile=False, or for IQN, it is refused."""
    cpu = torch.device("cpu")
    assert dataclasses.replace(cfg, compile=None).resolved(cpu).compile is True
    assert (
        dataclasses.replace(cfg, compile=None, compile_mode="default").resolved(cpu).compile
        is False
    )
    with pytest.raises(ValueError, match="with compile = False: nothing would be compiled"):
        dataclasses.replace(cfg, compile=False).resolved(cpu)
    if isinstance(cfg, DQNConfig):
        with pytest.raises(ValueError, match="IQN draws its quantile fractions"):
            dataclasses.replace(cfg, distribution="iqn").resolved(cpu)


def test_auto_compiles_ahead_of_time_on_a_gpu_where_packages_can_run(monkeypatch):
    """The DQN's compile_mode "auto": the steps compiled ahead of time on a GPU for C51 where
    `aot.unusable` finds nothing against it; torch.compile's default on a CPU, with compile
    off, for IQN, in a data-parallel process, and where packages cannot run."""
    from foxhunt.train import distributed
    from foxhunt.train.agents import dqn

    assert DQNConfig().compile_mode == "default"  # auto is asked for
    gpu, cpu = torch.device("cuda", 0), torch.device("cpu")
    why: list[str | None] = [None]
    asked = []
    monkeypatch.setattr(aot, "unusable", lambda device: asked.append(device) or why[0])
    on = dataclasses.replace(CFG, compile=True, compile_mode="auto")
    assert dqn.auto_compile_mode(on, gpu) == "aot" and asked == [gpu]
    assert dqn.auto_compile_mode(on, cpu) == "default"
    assert dqn.auto_compile_mode(dataclasses.replace(on, compile=False), gpu) == "default"
    assert dqn.auto_compile_mode(dataclasses.replace(on, distribution="iqn"), gpu) == "default"
    why[0] = "no C++ compiler to build packages with"
    assert dqn.auto_compile_mode(on, gpu) == "default"
    why[0] = None
    with monkeypatch.context() as mp:
        mp.setattr(distributed, "world", lambda: (0, 2))
        assert dqn.auto_compile_mode(on, gpu) == "default"
    assert len(asked) == 2  # not asked where the answer is known without it
    # On a CPU the choice resolves to torch.compile's mode, compiled only where asked to be.
    assert dataclasses.replace(on, compile=None).resolved(cpu).compile_mode == "default"
    assert on.resolved(cpu).compile_mode == "default"


def test_seeds_to_be_stacked_take_torch_compile_s_steps():
    """`stack_seeds` on: the seeds' DQN config with compile_mode auto takes torch.compile's
    steps, which stack (those compiled ahead of time do not); a mode set is kept, and one seed
    or stack_seeds auto or off keeps auto."""
    from foxhunt.train.core import TrainConfig

    cfg = TrainConfig(folds="f.json", cache="c", stack_seeds="on",
                      dqn=DQNConfig(compile_mode="auto"))  # fmt: skip
    assert cfg.for_seeds(2).dqn.compile_mode == "default"
    assert cfg.for_seeds(1).dqn.compile_mode == "auto"
    for other in ("auto", "off"):
        assert dataclasses.replace(cfg, stack_seeds=other).for_seeds(2).dqn.compile_mode == "auto"
    aot_cfg = dataclasses.replace(cfg, dqn=dataclasses.replace(cfg.dqn, compile_mode="aot"))
    assert aot_cfg.for_seeds(2).dqn.compile_mode == "aot"


def test_whether_packages_run_here_is_checked_once_with_a_toy_then_marked(tmp_path, monkeypatch):
    """aot.unusable: where no earlier package left the loader's mark in the cache, a toy package
    is built and loaded in processes of their own. A loader that dies on it is named with its
    signal and leaves no mark; one that runs it leaves the mark, and a later process finds the
    mark and builds nothing. Without a C++ compiler nothing is tried."""
    import tempfile

    from foxhunt.train import aot_probe

    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "cc"))
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    calls: list[str] = []

    def build(work, name, device, cxx=None, own_runtime=False):
        calls.append(f"build {device}")
        (work / f"{name}.pt2").write_bytes(b"")
        return work / f"{name}.pt2", ""

    rc = [-11]
    monkeypatch.setattr(aot_probe, "build", build)

    def load(pkg, index, env=None):
        calls.append("load")
        return rc[0], "boom"

    monkeypatch.setattr(aot_probe, "load", load)
    cpu = torch.device("cpu")

    def fresh():  # as in a new process
        aot._unusable.cache_clear()
        calls.clear()
        return aot.unusable(cpu)

    try:
        why = fresh()
        assert "CRASH (signal 11)" in why and "aot_probe --explain" in why, why
        assert calls == ["build cpu", "load"]
        assert not list(tmp_path.rglob("*loader-ok-*"))
        rc[0] = 0
        assert fresh() is None and calls == ["build cpu", "load"]
        folder = tmp_path / "cc" / "foxhunt-aot"
        (marked,) = folder.glob("loader-ok-*")  # the mark check_loader reads for its link
        assert marked in {aot.loader_markers(folder, -1, link)[0]
                          for link in (aot.OWN_LINK, aot.DEFAULT_LINK)}  # fmt: skip
        assert fresh() is None and calls == []  # the mark: nothing built or loaded
        monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "other"))
        assert fresh() is None and calls == ["build cpu", "load"]  # another cache: checked
        monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
        why = fresh()
        assert "no C++ compiler" in why and "no-such-g++" in why and calls == []
    finally:
        aot._unusable.cache_clear()


@pytest.mark.parametrize("decoupled", [True, False])
def test_flat_adam_holds_and_steps_as_torch_s_adam(decoupled):
    """The optimiser of an agent not compiled by torch.compile (built without torch.optim,
    whose constructor imports torch._dynamo): torch.optim.Adam's settings, its state as torch's
    Adam makes it at its first step (capturable: the step count on the device; else on the
    host), and, uncompiled, the same weights and state as torch's Adam.step, bit for bit, over
    steps with gradients of their own."""
    from foxhunt.train.agents.common import FlatAdam, adam_step, ensure_adam_state

    kw = dict(lr=3e-4, eps=1e-6, weight_decay=0.5, decoupled_weight_decay=decoupled, foreach=True)
    for capturable in (True, False):
        flat = torch.randn(10, requires_grad=True)
        ours = FlatAdam(flat, capturable=capturable, **kw)
        theirs = torch.optim.Adam([flat], capturable=capturable, **kw)
        assert ours.defaults == theirs.defaults
        assert ours.param_groups[0].keys() == theirs.param_groups[0].keys()
        assert ours.param_groups[0]["params"][0] is flat
        flat.grad = torch.zeros_like(flat)
        theirs.param_groups[0]["capturable"] = False  # on a CPU torch steps only this form
        ensure_adam_state(theirs, flat)
        theirs.param_groups[0]["capturable"] = capturable
        a, b = ours.state[flat], theirs.state[flat]
        assert a.keys() == b.keys()
        for k in a:
            assert (a[k].dtype, a[k].shape, a[k].device) == (b[k].dtype, b[k].shape, b[k].device)
            assert not a[k].any(), k

    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(1000, generator=g)
    grads = [torch.randn(1000, generator=g) for _ in range(5)]
    runs = []
    for make in (lambda p: FlatAdam(p, capturable=False, **kw),
                 lambda p: torch.optim.Adam([p], **kw)):  # fmt: skip
        p = w0.clone().requires_grad_()
        opt = make(p)
        for grad in grads:
            p.grad = grad.clone()
            adam_step(opt, p) if isinstance(opt, FlatAdam) else opt.step()
        runs.append([p.detach(), *opt.state[p].values()])
    for ours, theirs in zip(*runs, strict=True):
        assert torch.equal(ours, theirs)
    assert not torch.equal(runs[0][0], w0)


def test_an_uncompiled_task_does_not_import_the_compiler():
    """Agents trained uncompiled (the CPU's default) build no torch optimiser, whose
    constructor imports torch._dynamo (a second on the 2-core VM)."""
    code = f"""
import sys, dataclasses, torch
sys.path[:0] = {sys.path!r}
from test_aot import CFG, ON_POLICY, train, train_on_policy, train_supervised
from foxhunt.train.models.ensemble import fit_weights
from foxhunt.train.models.tlob import TLOBConfig
train(dataclasses.replace(CFG, compile=False, compile_mode="default"), epochs=1)
train_on_policy("ppo", compile_mode="default", epochs=1)
train_supervised(TLOBConfig(window=16, batch_size=32, steps=2, hidden=16, layers=1, compile=False))
fit_weights(torch.full((2, 10, 3), 1 / 3), torch.zeros(10, dtype=torch.long), steps=2)
print(sorted(m for m in sys.modules if m.startswith(("torch._dynamo", "torch._inductor"))))
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert p.stdout.strip().splitlines()[-1] == "[]", "torch's compiler imported"


def test_the_evaluation_step_compiled_ahead_of_time_walks_as_the_uncompiled_one(cache):
    """Evaluator(compile="aot") (what `foxhunt train` builds for an agent compiled ahead of
    time): a trained agent's greedy walk over a range gives the uncompiled step's returns and
    positions, from a package built once per policy and buffer size; a policy that is not an
    agent's method runs uncompiled."""
    from foxhunt.train.evaluate import Evaluator

    agent = train(CFG, epochs=2)
    env = EnvConfig(episode_bars=64)
    runs = {}
    for compile_ in (False, "aot", "aot"):
        ev = Evaluator(env, agent.data, segments=8, compile=compile_)
        ev.reserve(200)
        runs.setdefault(compile_, []).append(ev.run(agent.greedy, 400, 599, graph=True))
        ev.run(lambda t, p: agent.greedy(t, p), 400, 599, graph=True)  # not compiled
        assert len(ev._aot) == (compile_ == "aot"), "one package: the agent's method's"
    assert len(list((cache / "foxhunt-aot").glob("eval-RainbowAgent.greedy-*.pt2"))) == 1
    (r0, f0), (r1, f1), (r2, f2) = runs[False][0], *runs["aot"]
    assert torch.equal(r1, r2) and torch.equal(f1, f2)
    torch.testing.assert_close(r1, r0, rtol=1e-5, atol=1e-9)
    assert torch.equal(f1, f0)
    assert f0.abs().sum() > 0, "the policy trades"
