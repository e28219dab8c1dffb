"""Does the DQN learn the demo set's planted signal, and how close does it get to an oracle?

    python bench/bench_learning.py [--data data]     (after `make run`; CPU, ~1 minute)

Trains with the demo settings (foxhunt.train.demo, costs off; the CI learning test's too) on the
ES demo cache and its folds, and puts beside its val and test Sharpe ratios:
- a random policy (uniform branch actions) on the same ranges and env;
- the oracle: it knows the latent order-flow pressure s[t] that synth planted (rebuilt from
  synth.json's seed and parameters) and holds sign(s[t]) at full size over bar t -> t+1, the
  best a policy trading that signal can do without costs (corr(s[t], r[t+1]) = rho).
The ratio learned / oracle says how much of the planted signal the agent captures from the
observable features (OFI and friends carry s only in part: corr(OFI L1, s) ~ 0.4).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import time
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from foxhunt.fxcache import FxCache
from foxhunt.synth.contracts import ROOTS, SESSIONS, trading_days
from foxhunt.synth.generate import SynthConfig
from foxhunt.synth.market import bar_path
from foxhunt.train import TrainConfig, demo, run_train
from foxhunt.train.metrics import periods_per_year, trading_metrics
from foxhunt.train.tracking import NullLogger


def pressure_by_timestamp(raw: Path, root: str) -> dict[int, float]:
    """synth's latent pressure s of every bar, keyed by the fxcache bar label (bar end, UTC ns)."""
    meta = json.loads((raw / "GLBX.MDP3" / "synth.json").read_text())["config"]
    cfg = SynthConfig(
        start=dt.date.fromisoformat(meta["start"]), end=dt.date.fromisoformat(meta["end"]),
        seed=meta["seed"], session=meta["session"], signal=meta["signal"],
        impact=meta["impact"], flow=meta["flow"], events_per_bar=meta["events_per_bar"],
    )  # fmt: skip
    days = trading_days(cfg.start, cfg.end)
    path = bar_path(ROOTS[root], days, cfg.params(), cfg.seed)
    open_t, bars = SESSIONS[cfg.session]
    chicago = ZoneInfo("America/Chicago")
    out = {}
    for d, day in enumerate(days):
        o = dt.datetime.combine(day, open_t, tzinfo=chicago)
        o_ns = int(o.timestamp()) * 10**9
        for m in range(bars):
            out[o_ns + (m + 1) * 60 * 10**9] = float(path.pressure[d, m])
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", type=Path, default=Path("data"))
    ap.add_argument("--epochs", type=int, default=demo.EPOCHS)
    args = ap.parse_args()
    torch.set_num_threads(2)
    # `make folds` writes folds/ES.json, the pipeline folds/ES-<key>.json: take the newest.
    candidates = sorted((args.data / "folds").glob("ES*.json"), key=lambda p: p.stat().st_mtime)
    if not candidates:
        sys.exit(f"no ES folds under {args.data / 'folds'}: run `make run` first")
    folds_path = candidates[-1]
    doc = json.loads(folds_path.read_text())
    cache = FxCache.open(args.data / "fxcache", doc["fxcache_key"])
    t0 = time.perf_counter()
    res = run_train(
        TrainConfig(folds=folds_path, cache=args.data / "fxcache", epochs=args.epochs,
                    tracking="none", out=Path("/tmp/bench_learning"), resume=False,
                    eval_segments=demo.EVAL_SEGMENTS, env=demo.ENV, dqn=demo.DQN),
        NullLogger(),
    )  # fmt: skip
    train_s = time.perf_counter() - t0
    s_of = pressure_by_timestamp(args.data / "raw", "ES")
    s = np.array([s_of.get(int(ts), np.nan) for ts in cache.timestamps])
    matched = np.isfinite(s).mean()
    close = cache.targets[:, 3]
    ret1 = np.append(close[1:] / close[:-1] - 1.0, 0.0)
    ppy = periods_per_year(cache.timestamps)
    pos = np.sign(np.nan_to_num(s))
    rows = []
    for f, fold in zip(res.folds, doc["folds"], strict=True):
        o = {}
        for part in ("val", "test"):
            lo, hi = fold[f"{part}_start"], fold[f"{part}_end"] - 1
            r = torch.from_numpy(pos[lo:hi] * ret1[lo:hi])
            tr = torch.from_numpy(np.diff(np.r_[0.0, pos[lo:hi]]))
            o[part] = trading_metrics(r, tr, ppy)["sharpe"]
        rows.append((f["fold"], f["val"]["sharpe"], f["test"]["sharpe"], f["random_val"]["sharpe"],
                     o["val"], o["test"]))  # fmt: skip
    print(f"bars matched to synth's pressure: {matched:.1%}; training {train_s:.0f} s (CPU)")
    print("fold  learned val  learned test  random val  oracle val  oracle test  test/oracle")
    for k, lv, lt, rv, ov, ot in rows:
        print(f"{k:4d} {lv:12.2f} {lt:13.2f} {rv:11.2f} {ov:11.2f} {ot:12.2f} {lt / ot:12.2f}")
    m = np.mean(np.array([r[1:] for r in rows]), 0)
    print(
        f"mean {m[0]:12.2f} {m[1]:13.2f} {m[2]:11.2f} {m[3]:11.2f} {m[4]:12.2f} {m[1] / m[4]:12.2f}"
    )


if __name__ == "__main__":
    main()
