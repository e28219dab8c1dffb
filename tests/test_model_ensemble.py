"""The ensemble: its combination rules by hand, weights fitted on val, parallel inference equal
to one member at a time, and through `foxhunt train` (same seed same metrics, resume, a served
checkpoint that trades as the trainer does, learning above chance)."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch

from foxhunt.train import EnvConfig, TrainConfig, demo, run_train
from foxhunt.train.models.cfc import CfCConfig
from foxhunt.train.models.ensemble import EnsembleAgent, EnsembleConfig, combine, fit_weights
from foxhunt.train.models.mamba2 import Mamba2Config
from foxhunt.train.models.tlob import TLOBConfig
from foxhunt.train.tracking import NullLogger
from marketdata import random_market
from trainruns import Killed, metrics_of, served_and_trained_orders

TINY = dict(window=16, horizon=5, batch_size=64, steps=8)
ENSEMBLE_TINY = EnsembleConfig(
    members=("tlob", "cfc", "mamba2"), seeds=2, rule="weighted",
    tlob=TLOBConfig(hidden=16, layers=1, **TINY),
    cfc=CfCConfig(units=16, backbone_units=32, **TINY),
    mamba2=Mamba2Config(d_model=16, headdim=8, d_state=8, chunk=8, layers=1, **TINY),
)  # fmt: skip


TRAIN_TINY = EnsembleConfig(**{**vars(ENSEMBLE_TINY), "members": ("cfc", "mamba2")})


def test_combination_rules_by_hand():
    p = torch.tensor([
        [[0.7, 0.2, 0.1], [0.1, 0.3, 0.6]],
        [[0.5, 0.1, 0.4], [0.2, 0.5, 0.3]],
        [[0.2, 0.2, 0.6], [0.1, 0.2, 0.7]],
    ])  # fmt: skip  # [K=3 members, n=2 bars, 3 classes]
    torch.testing.assert_close(combine(p, "mean"), p.mean(0))
    # votes: bar 0 down, down, up -> down 2/3; bar 1 up, flat, up -> up 2/3
    assert combine(p, "vote").argmax(-1).tolist() == [0, 2]
    w = torch.tensor([0.0, 0.0, 1.0])
    torch.testing.assert_close(combine(p, "weighted", w), p[2])
    # a tie of votes goes to the mean's choice: one down, one up, one flat
    t = torch.tensor([[[0.8, 0.1, 0.1]], [[0.1, 0.1, 0.8]], [[0.2, 0.5, 0.3]]])
    assert combine(t, "vote").argmax(-1).tolist() == [int(t.mean(0).argmax())]


def test_weights_fitted_on_val_favour_the_member_that_knows():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, 3, (500,), generator=g)
    knows = torch.nn.functional.one_hot(labels, 3).float() * 0.8 + 0.2 / 3
    guesses = torch.softmax(torch.randn(500, 3, generator=g), -1)
    w = fit_weights(torch.stack([guesses, knows]), labels)
    assert w.sum().item() == pytest.approx(1.0) and w[1] > 0.9
    assert torch.equal(w, fit_weights(torch.stack([guesses, knows]), labels))  # deterministic


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_members_predict_in_parallel_as_they_do_one_by_one(precision):
    """vmap over the stacked seeds of one architecture gives each member's own forecast, also
    under bf16 autocast (as on a GPU: autocast does not cast a vmapped conv1d's bias)."""
    data = random_market(3000, 0)
    members = {m: dataclasses.replace(getattr(ENSEMBLE_TINY, m), precision=precision)
               for m in ENSEMBLE_TINY.members}  # fmt: skip
    cfg = EnsembleConfig(**{**vars(ENSEMBLE_TINY), **members, "parallel": "vmap"})
    a = EnsembleAgent(cfg, EnvConfig(), data, seed=3)
    a.reset_fold(100, 2000, seed=1)
    a.learn()  # the seeds' weights differ anyway; after a step, surely
    par = a.member_predictions(2000, 2600)
    a.cfg = EnsembleConfig(**{**vars(a.cfg), "parallel": "sequential"})
    seq = a.member_predictions(2000, 2600)
    assert par.shape == (6, 600, 3)
    tol = dict(rtol=1e-5, atol=1e-6) if precision == "fp32" else dict(rtol=2e-2, atol=1e-2)
    torch.testing.assert_close(par, seq, **tol)
    assert not torch.allclose(par[0], par[1])  # two seeds, two forecasts


def test_config_from_a_checkpoint_and_refusals():
    doc = json.loads(json.dumps(ENSEMBLE_TINY, default=lambda o: vars(o)))
    back = EnsembleConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in doc.items()})
    assert back == ENSEMBLE_TINY
    with pytest.raises(ValueError, match="horizons differ"):
        EnsembleConfig(members=("tlob", "cfc"), cfc=CfCConfig(horizon=3))
    with pytest.raises(ValueError, match="not supervised models"):
        EnsembleConfig(members=("tlob", "dqn"))


def tiny(demo_pair, out, **kw) -> TrainConfig:
    cache, folds = demo_pair
    base = dict(folds=folds, cache=cache, epochs=2, out=out, tracking="none", eval_segments=64,
                ensemble=TRAIN_TINY, env=EnvConfig(episode_bars=256), run_id="run-1",
                baselines=False, model="ensemble")  # fmt: skip
    return TrainConfig(**(base | kw))


def test_same_seed_same_metrics_a_killed_task_resumes_and_a_served_checkpoint_trades_alike(
    demo_es, tmp_path
):

    a = run_train(tiny(demo_es, tmp_path / "a", fold_ids=(0,)), NullLogger())
    b = run_train(tiny(demo_es, tmp_path / "b", fold_ids=(0,)), NullLogger())
    assert metrics_of(a) == metrics_of(b)
    test = a.folds[0]["test"]
    assert {"accuracy", "macro_f1", "weight_cfc0", "weight_mamba21"} <= set(test)
    assert sum(v for k, v in test.items() if k.startswith("weight_")) == pytest.approx(1.0)

    def kill(fold, epoch):
        if (fold, epoch) == (0, 0):
            raise Killed

    cfg = tiny(demo_es, tmp_path / "k", fold_ids=(0,))
    with pytest.raises(Killed):
        run_train(cfg, NullLogger(), on_epoch_end=kill)
    resumed = run_train(cfg, NullLogger())
    assert resumed.resumed and metrics_of(resumed) == metrics_of(a)

    got, want = served_and_trained_orders(
        demo_es, a.run_dir / "fold-0" / "best.safetensors",
        lambda data: EnsembleAgent(TRAIN_TINY, EnvConfig(), data, 0),
    )  # fmt: skip
    L = TRAIN_TINY.window
    assert (got[L - 1 :] == want[L - 1 :]).all()


def test_the_ensemble_learns_the_planted_signal(demo_es, tmp_path):
    """TLOB and CfC at their demo sizes, one seed each, forecasts averaged, costs on: above
    chance on test and well above a random policy (the demo's second fold alone, as the
    members' own learning tests)."""
    cfg = EnsembleConfig(members=("tlob", "cfc"), seeds=1, tlob=demo.TLOB, cfc=demo.CFC)
    res = run_train(tiny(demo_es, tmp_path, ensemble=cfg, fold_ids=(1,)), NullLogger())
    print(res.summary())
    acc = np.mean([f["test"]["accuracy"] for f in res.folds])
    assert acc > 0.36, acc
    assert res.aggregate["test_sharpe"] > 3.0, res.aggregate
    assert res.aggregate["val_sharpe"] > res.aggregate["random_val_sharpe"] + 10.0


def test_the_members_compile_ahead_of_time_with_the_ensemble_s_mode():
    """`--ensemble.compile-mode aot` is every member's mode, compile on (on a CPU too, where it
    is off by default); with compile off it is refused, and a TFT member with dropout is
    refused when the members are built (its draws would come from inside the package)."""
    cpu = torch.device("cpu")
    cfg = EnsembleConfig(members=("tlob", "cfc"), compile_mode="aot").resolved(cpu)
    assert [(c.compile, c.compile_mode) for _, c in cfg.member_configs()] == [(True, "aot")] * 4
    plain = EnsembleConfig(members=("tlob", "cfc")).resolved(cpu)
    assert {(c.compile, c.compile_mode) for _, c in plain.member_configs()} == {(False, "default")}
    with pytest.raises(ValueError, match="with compile = False: nothing would be compiled"):
        EnsembleConfig(compile=False, compile_mode="aot").resolved(cpu)
    with pytest.raises(ValueError, match=r"with dropout = 0\.1"):
        EnsembleAgent(EnsembleConfig(members=("tft",), seeds=1, compile_mode="aot"), EnvConfig(),
                      random_market(), seed=0)  # fmt: skip
