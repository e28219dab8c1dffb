"""The fxcache on the training device: uploaded once per task, a fold is index bounds into it.

    mkt     float32 [N, 50]  features (42) and order flow (8) of each bar, raw
    close, high, low  float32 [N]  prices (ratio-adjusted; float32, never bfloat16)
    ret1    float32 [N]      close[t+1] / close[t] - 1, computed in float64 before the cast

Normalisation is per fold: mean and standard deviation of each column over the fold's train
range, computed on the device (`fit_normaliser`) into persistent tensors, and applied when an
observation is gathered. Nothing here imports polars, mlflow or kfp: the GPU image runs it as is.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch

N_MKT = 50
CLIP = 10.0  # normalised values beyond +-10 standard deviations are clipped


@dataclass
class UploadStats:
    bytes: int
    seconds: float
    pinned: bool


class DataError(ValueError):
    """Market data no training may use (non-finite values, non-positive prices); says where."""


class MarketData:
    def __init__(
        self,
        features: np.ndarray,
        ofi: np.ndarray,
        targets: np.ndarray,
        device: torch.device,
        pin: bool | None = None,
        names: list[str] | None = None,
    ):
        n = len(features)
        if ofi.shape[0] != n or targets.shape[0] != n:
            raise ValueError(
                f"features ({n} rows), ofi ({ofi.shape[0]}) and targets ({targets.shape[0]}) "
                "must have one row per bar"
            )
        if n < 3:
            raise ValueError(f"{n} bars: too few to train on")
        self.device = device
        self.n = n
        close64 = np.asarray(targets[:, 3], dtype=np.float64)
        host = {
            "mkt": np.concatenate([features, ofi], axis=1, dtype=np.float32),
            "hlc": np.ascontiguousarray(targets[:, 1:4], dtype=np.float32),
            "ret1": np.append(close64[1:] / close64[:-1] - 1.0, 0.0).astype(np.float32),
        }
        pin = device.type == "cuda" if pin is None else pin
        tensors = {k: torch.from_numpy(v) for k, v in host.items()}
        if pin:
            tensors = {k: v.pin_memory() for k, v in tensors.items()}
        dev = {k: torch.empty(v.shape, dtype=v.dtype, device=device) for k, v in tensors.items()}
        _sync(device)
        t0 = time.perf_counter()
        for k, v in tensors.items():
            dev[k].copy_(v, non_blocking=pin)
        _sync(device)
        self.upload = UploadStats(
            bytes=sum(v.numel() * v.element_size() for v in tensors.values()),
            seconds=time.perf_counter() - t0,
            pinned=pin,
        )
        self.mkt = dev["mkt"]
        self.names = list(names or [])
        _check_values(dev, self.names, features.shape[1])
        self.high, self.low, self.close = (dev["hlc"][:, i].contiguous() for i in range(3))
        self.ret1 = dev["ret1"]
        # Per-fold normaliser, updated in place (captured graphs keep their addresses).
        self.mean = torch.zeros(N_MKT, device=device)
        self.inv_std = torch.ones(N_MKT, device=device)

    @classmethod
    def from_fxcache(cls, cache, device: torch.device, pin: bool | None = None) -> MarketData:
        m = cache.manifest
        names = [*m.get("features", []), *m.get("ofi", [])]
        return cls(cache.features, cache.ofi, cache.targets, device, pin=pin, names=names)

    def fit_normaliser(self, lo: int, hi: int) -> None:
        """Mean and standard deviation of every column over bars [lo, hi) (the train range)."""
        x = self.mkt[lo:hi]
        std, mean = torch.std_mean(x, dim=0)
        self.mean.copy_(mean)
        self.inv_std.copy_(1.0 / std.clamp_min(1e-8))

    def observe(self, t: torch.Tensor) -> torch.Tensor:
        """Normalised market features of bars `t`, [len(t), 50]."""
        x = (self.mkt.index_select(0, t) - self.mean) * self.inv_std
        return x.clamp(-CLIP, CLIP)


def _check_values(dev: dict[str, torch.Tensor], names: list[str], n_features: int) -> None:
    """Refuse non-finite inputs and non-positive prices, naming the first offending value.
    One reduction per array on the device and one read back, once per task."""
    mkt, hlc = dev["mkt"], dev["hlc"]
    bad_mkt, bad_px = ~torch.isfinite(mkt), ~(torch.isfinite(hlc) & (hlc > 0))
    flags = torch.stack([bad_mkt.any(), bad_px.any()]).tolist()
    if flags[0]:
        row, col = (int(x) for x in bad_mkt.nonzero()[0])
        array, k = ("features", col) if col < n_features else ("ofi", col - n_features)
        label = f" ({names[col]})" if col < len(names) else ""
        raise DataError(
            f"{array}[{row}, {k}]{label} is {float(mkt[row, col])}: training needs finite inputs "
            f"({int(bad_mkt.any(1).sum())} bar(s) affected)"
        )
    if flags[1]:
        row, col = (int(x) for x in bad_px.nonzero()[0])
        raise DataError(
            f"targets[{row}] {('high', 'low', 'close')[col]} price is {float(hlc[row, col])}: "
            "prices must be finite and positive"
        )


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
