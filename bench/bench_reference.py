"""The supervised models against what a user would run today, on the same windows, in one call.

    python3 bench/bench_reference.py --tlob-reference .ref/TLOB      on a CUDA device
    python3 bench/bench_reference.py --cpu-smoke --tlob-reference .ref/TLOB

- TLOB: the reference repository's own training loop (github.com/LeonardoBerti00/TLOB: its
  `Engine` LightningModule with its TLOB model, Adam and EMA, its `Dataset` slicing
  x[i : i + seq_size] and its DataLoader with 4 workers and pinned memory, a Lightning
  `Trainer` at its precision 32; and, to be generous, at "bf16-mixed") against foxhunt's
  supervised path (windows gathered on the device, one CUDA graph a step, bf16, compiled), at
  the reference's configuration (hidden 40, 4 layer pairs, 1 head, windows of 128) and the same
  batch size. The reference code is not part of foxhunt: check it out (MIT licence) and pass
  its folder; its `wandb` and `lion_pytorch` imports, unused at these settings, are stubbed, and
  `torch_ema` must be importable (carried as a wheel on the device).
- TFT: foxhunt's TFT (one CUDA graph a step, bf16, compiled) against pytorch-forecasting's
  TemporalFusionTransformer as its users run it (a pandas TimeSeriesDataSet, its DataLoader, a
  Lightning Trainer; precision 32 and bf16-mixed), same windows, batch and widths, where
  pytorch_forecasting is importable (carried as a wheel; not a dependency of foxhunt).
- CfC: foxhunt's CfC compiled inside one CUDA graph a step, against the same model run step by
  step without compilation (eager), and against `ncps.torch.CfC` (the authors' package, eager)
  with the same sizes, where ncps is importable.

Data: the standard synthetic workload's 2,000,000 bars (foxhunt.bench.workload.standard_market),
labels from the 10-bar return (three classes). Samples/s counts the optimiser steps' samples
after a warm-up; the reference's time includes its DataLoader, as a user of it pays. Prints a
table; JSON to $OUT or /tmp.
"""

from __future__ import annotations

import argparse
import importlib.machinery
import json
import statistics
import sys
import time
import types
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_train import sync
from foxhunt.bench.workload import results_path, standard_market
from foxhunt.train.agents.supervised import SupervisedAgent
from foxhunt.train.data import MarketData
from foxhunt.train.env import EnvConfig
from foxhunt.train.models.cfc import CfCConfig
from foxhunt.train.models.tft import TFTConfig
from foxhunt.train.models.tlob import TLOBConfig


def ours(cfg, data, train, steps: int, warm: int) -> dict:
    """Samples/s of foxhunt's supervised training step at `cfg`: `warm` steps, then `steps`
    timed, three times; the median."""
    agent = SupervisedAgent(cfg, EnvConfig(), data, seed=0)
    agent.reset_fold(*train, seed=1)
    if agent.cfg.capture == "graph":
        agent.capture()
    agent.begin_epoch(0, 1)
    agent.cfg = dataclass_replace(agent.cfg, steps=warm)
    agent.learn()
    agent.cfg = dataclass_replace(agent.cfg, steps=steps)
    runs = []
    for _ in range(3):
        sync(data.device)
        t0 = time.perf_counter()
        agent.learn()
        sync(data.device)
        runs.append(time.perf_counter() - t0)
    loss = agent.read_stats()["losses/loss"]
    s = statistics.median(runs)
    return {"samples_per_s": steps * agent.cfg.batch_size / s, "step_ms": s / steps * 1e3,
            "runs_s": runs, "loss": loss, "batch": agent.cfg.batch_size,
            "params": sum(p.numel() for p in agent.params)}  # fmt: skip


def dataclass_replace(cfg, **kw):
    import dataclasses

    return dataclasses.replace(cfg, **kw)


def labels_of(close: np.ndarray, h: int) -> np.ndarray:
    r = np.zeros_like(close)
    r[:-h] = close[h:] / close[:-h] - 1
    theta = np.quantile(np.abs(r), 1 / 3)
    return np.where(r > theta, 2, np.where(r < -theta, 0, 1)).astype(np.int64)


def lightning_fit_seconds(module, loader, device: str, precision, warm: int, steps: int) -> float:
    """Fit `module` on `loader` under a Lightning Trainer for `warm + steps` steps and return
    the seconds from the end of step `warm` to the end of the last (CUDA synchronised)."""
    import lightning as L

    marks: list[float] = []

    class Clock(L.Callback):
        def on_train_batch_end(self, trainer, module, outputs, batch_, batch_idx):
            if batch_idx in (warm - 1, warm + steps - 1):
                if device == "cuda":
                    torch.cuda.synchronize()
                marks.append(time.perf_counter())

    trainer = L.Trainer(
        accelerator="gpu" if device == "cuda" else "cpu", devices=1, precision=precision,
        max_steps=warm + steps, limit_val_batches=0, num_sanity_val_steps=0, logger=False,
        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
        callbacks=[Clock()],
    )  # fmt: skip
    trainer.fit(module, train_dataloaders=loader)
    return marks[1] - marks[0]


def reference_tlob(ref: Path, x: np.ndarray, y: np.ndarray, window: int, batch: int, steps: int,
                   warm: int, precision, device: str, workers: int) -> dict:  # fmt: skip
    """The reference's Engine + Dataset + DataLoader under a Lightning Trainer, timed from the
    end of step `warm` to the end of step `warm + steps`."""
    sys.path.insert(0, str(ref))
    for name in ("wandb", "lion_pytorch"):  # imported by engine.py, unused at these settings
        if name not in sys.modules:
            stub = types.ModuleType(name)
            stub.__spec__ = importlib.machinery.ModuleSpec(name, None)
            stub.Lion = None
            sys.modules[name] = stub
    from models.engine import Engine
    from preprocessing.dataset import DataModule, Dataset

    n = len(y) - window
    xs = torch.from_numpy(x)
    ys = torch.from_numpy(y[window - 1 :][:n].copy())
    train_set = Dataset(xs, ys, window)
    dm = DataModule(train_set, train_set, batch, batch * 4, num_workers=workers)
    engine = Engine(
        seq_size=window, horizon=10, max_epochs=1, model_type="TLOB", is_wandb=False,
        experiment_type="TRAINING", lr=1e-4, optimizer="Adam", dir_ckpt="bench",
        num_features=x.shape[1], dataset_type="BTC", num_layers=4, hidden_dim=40, num_heads=1,
        is_sin_emb=True,
    )  # fmt: skip
    s = lightning_fit_seconds(engine, dm.train_dataloader(), device, precision, warm, steps)
    params = sum(p.numel() for p in engine.model.parameters() if p.requires_grad)
    return {"samples_per_s": steps * batch / s, "step_ms": s / steps * 1e3, "params": params,
            "precision": str(precision), "workers": workers}  # fmt: skip


def reference_tft(x: np.ndarray, r: np.ndarray, window: int, batch: int, steps: int, warm: int,
                  device: str, workers: int, rows: int, precision) -> dict:  # fmt: skip
    """pytorch-forecasting's TemporalFusionTransformer as its users run it: a pandas frame of
    the 50 columns and the target (the 10-bar return), a TimeSeriesDataSet of encoder windows
    of `window` bars and one step ahead, its DataLoader, a Lightning Trainer, the quantile loss;
    the same widths as ours (hidden 64, 4 heads, 64 per variable). `rows` bars of the market
    (the dataset's pandas build is the slow part, not what is timed)."""
    import pandas as pd
    from pytorch_forecasting import QuantileLoss, TemporalFusionTransformer, TimeSeriesDataSet

    n = min(rows, len(r))
    cols = [f"c{i}" for i in range(x.shape[1])]
    df = pd.DataFrame(x[:n], columns=cols)
    df["target"], df["time_idx"], df["group"] = r[:n].astype(np.float32), np.arange(n), "ES"
    ds = TimeSeriesDataSet(
        df, time_idx="time_idx", target="target", group_ids=["group"],
        max_encoder_length=window, max_prediction_length=1,
        time_varying_unknown_reals=[*cols, "target"], target_normalizer=None,
    )  # fmt: skip
    dl = ds.to_dataloader(train=True, batch_size=batch, num_workers=workers)
    tft = TemporalFusionTransformer.from_dataset(
        ds, hidden_size=64, attention_head_size=4, dropout=0.1, hidden_continuous_size=64,
        loss=QuantileLoss([0.1, 0.5, 0.9]), learning_rate=1e-3,
    )  # fmt: skip
    s = lightning_fit_seconds(tft, dl, device, precision, warm, steps)
    params = sum(p.numel() for p in tft.parameters() if p.requires_grad)
    return {"samples_per_s": steps * batch / s, "step_ms": s / steps * 1e3, "params": params,
            "precision": str(precision), "workers": workers, "rows": n}  # fmt: skip


def ncps_cfc(x_dev: torch.Tensor, y_dev: torch.Tensor, window: int, batch: int, units: int,
             steps: int, warm: int) -> dict:  # fmt: skip
    """ncps.torch.CfC (eager, its own per-step loop) with a linear readout of 3 classes, AdamW,
    on windows gathered on the device as ours are."""
    from ncps.torch import CfC

    dev = x_dev.device
    net = CfC(x_dev.shape[1], units, proj_size=3, return_sequences=False,
              backbone_units=128, backbone_layers=1).to(dev)  # fmt: skip
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3)
    n = len(y_dev) - window
    offs = torch.arange(window, device=dev)

    def step():
        t = torch.randint(0, n, (batch,), device=dev)
        xb = x_dev[t[:, None] + offs]
        out, _ = net(xb)
        loss = F.cross_entropy(out, y_dev[t + window - 1])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(net.parameters(), 1.0)
        opt.step()

    for _ in range(warm):
        step()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    sync(dev)
    s = time.perf_counter() - t0
    return {"samples_per_s": steps * batch / s, "step_ms": s / steps * 1e3,
            "params": sum(p.numel() for p in net.parameters())}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cpu-smoke", action="store_true")
    ap.add_argument("--tlob-reference", type=Path, help="checkout of LeonardoBerti00/TLOB")
    ap.add_argument("--batch", type=int, default=1024)
    ap.add_argument("--workers", type=int, default=4, help="the reference's DataLoader workers")
    ap.add_argument("--only", default="tlob,cfc,tft")
    args = ap.parse_args()
    smoke = args.cpu_smoke
    dev = torch.device("cpu" if smoke else "cuda")
    n = 20_000 if smoke else 2_000_000
    window = 32 if smoke else 128
    batch = 32 if smoke else args.batch
    steps, warm = (3, 2) if smoke else (50, 20)
    feats, ofi, targets = standard_market(n)
    data = MarketData(feats, ofi, targets, dev)
    train = (0, int(n * 0.6))
    res: dict = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                 "torch": torch.__version__, "batch": batch, "window": window}  # fmt: skip
    rows = []
    out_path = results_path("bench_reference.json")

    def add(name, fn):
        try:
            r = fn()
        except Exception as e:  # one failing row must not hide the others
            r = {"error": f"{type(e).__name__}: {str(e)[:500]}"}
        res[name] = r
        rows.append(name)
        out_path.write_text(json.dumps(res, indent=1))  # each row kept as it comes
        if "error" in r:
            print(f"{name:44s} FAILED {r['error']}", flush=True)
        else:
            print(f"{name:44s} {r['samples_per_s']:12,.0f} samples/s  {r['step_ms']:8.2f} ms a "
                  f"step  params {r['params']:,}", flush=True)  # fmt: skip

    rt = "eager" if smoke else "graph"
    prec = "fp32" if smoke else "bf16"
    how = f"{rt}, {prec}" + ("" if smoke else ", compiled")
    if "tlob" in args.only:
        for hidden in (40, 64):
            cfg = TLOBConfig(window=window, hidden=hidden, batch_size=batch, capture=rt,
                             precision=prec, compile=not smoke, steps=steps)  # fmt: skip
            add(f"foxhunt tlob hidden {hidden} ({how})",
                lambda cfg=cfg: ours(cfg, data, train, steps, warm))  # fmt: skip
        if args.tlob_reference:
            x = np.concatenate([feats, ofi], 1).astype(np.float32)  # N(0, 1) already
            y = labels_of(targets[:, 3], 10)
            for precision in ("32", "bf16-mixed"):
                if smoke and precision != "32":
                    continue
                add(f"reference tlob loop, precision {precision}",
                    lambda p=precision: reference_tlob(
                        args.tlob_reference.resolve(), x, y, window, batch, steps, warm, p,
                        dev.type, 0 if smoke else args.workers))  # fmt: skip
    if "tft" in args.only:
        cfg = TFTConfig(window=window, hidden=16 if smoke else 64, heads=4, batch_size=batch,
                        steps=steps, capture=rt, precision=prec, compile=not smoke)  # fmt: skip
        add(f"foxhunt tft ({how})", lambda: ours(cfg, data, train, steps, warm))
        try:
            import pytorch_forecasting  # noqa: F401

            x = np.concatenate([feats, ofi], 1).astype(np.float32)
            c = targets[:, 3]
            r = np.zeros_like(c)
            r[:-10] = c[10:] / c[:-10] - 1
            for p in ("32", "bf16-mixed"):
                if smoke and p != "32":
                    continue
                add(f"pytorch-forecasting TFT, precision {p}",
                    lambda p=p: reference_tft(x, r, window, batch, steps, warm, dev.type,
                                              0 if smoke else args.workers,
                                              5_000 if smoke else 200_000, p))  # fmt: skip
        except ImportError:
            print("pytorch-forecasting not importable: its row is left out", flush=True)
    if "cfc" in args.only:
        cfg = CfCConfig(window=window, batch_size=batch, steps=steps, capture=rt,
                        precision=prec, compile=not smoke)  # fmt: skip
        add(f"foxhunt cfc ({how})", lambda: ours(cfg, data, train, steps, warm))
        for p in ("fp32", "bf16"):
            cfg = CfCConfig(window=window, batch_size=batch, steps=steps, capture="eager",
                            precision=p, compile=False)  # fmt: skip
            add(f"foxhunt cfc step by step (eager, {p})",
                lambda cfg=cfg: ours(cfg, data, train, max(2, steps // 5), 3))  # fmt: skip
        try:
            import ncps  # noqa: F401

            y = torch.from_numpy(labels_of(targets[:, 3], 10)).to(dev)
            x = data.mkt
            add("ncps.torch.CfC (eager, fp32)",
                lambda: ncps_cfc(x, y, window, batch, 64, max(2, steps // 5), 3))  # fmt: skip
        except ImportError:
            print("ncps not importable: its row is left out", flush=True)
    for name in rows:
        if name.startswith("pytorch-forecasting") and "error" not in res[name]:
            for k in rows:
                if k.startswith("foxhunt tft") and "error" not in res[k]:
                    ratio = res[k]["samples_per_s"] / res[name]["samples_per_s"]
                    print(f"  {k} / {name}: {ratio:.1f}x")
        if name.startswith("reference tlob") and "error" not in res[name]:
            for ref_name in rows:
                if ref_name.startswith("foxhunt tlob") and "error" not in res[ref_name]:
                    ratio = res[ref_name]["samples_per_s"] / res[name]["samples_per_s"]
                    print(f"  {ref_name} / {name}: {ratio:.1f}x")
    ok = [k for k in rows if "error" not in res[k]]
    base = [k for k in ok if k.startswith("foxhunt cfc (")]
    for k in ok:
        if base and (k.startswith("foxhunt cfc step") or k.startswith("ncps")):
            ratio = res[base[0]]["samples_per_s"] / res[k]["samples_per_s"]
            print(f"  {base[0]} / {k}: {ratio:.1f}x")
    out_path.write_text(json.dumps(res, indent=2))
    print(f"results in {out_path}")


if __name__ == "__main__":
    main()
