"""The fxcache on the training device: uploaded once per task, a fold is index bounds into it.

    mkt     float32 [N, 50]  features (42) and order flow (8) of each bar, raw
    close, high, low  float32 [N]  prices (ratio-adjusted; float32, never bfloat16)
    ret1    float32 [N]      close[t+1] / close[t] - 1, computed in float64 before the cast

    memory  float32 [N, 8]   exponential moving average of each order-flow column over the bars
                             up to t (`use_memory`, what the agents see beside the bar itself)
    forecast float32 [N]     a ridge regression's forecast of ret1 from the normalised columns
                             (the 50 and the memory), fitted and standardised on each fold's
                             train range (`use_forecast`)

Normalisation is per fold: mean and standard deviation of each column over the fold's train
range, computed on the device (`fit_normaliser`) into persistent tensors, and applied when an
observation is gathered. Nothing here imports polars, mlflow or kfp: the GPU image runs it as is.
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass

import numpy as np
import torch

N_MKT = 50
N_MEMORY = 8  # the order-flow columns, the last 8 of the 50: the memory averages them
SCAN_BLOCK = 32  # rows per block of `ema`'s scan
CLIP = 10.0  # normalised values beyond +-10 standard deviations are clipped
RIDGE_L2 = 1e-3  # ridge penalty, relative to the bar count (the columns are normalised)
FORECAST_ROWS = 1 << 18  # bars a block of the forecast's fit and scores: float64 columns of
# 2M bars at once would take ~1 GB


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
        pin: bool = False,
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
        blocks = {  # each device tensor's column blocks, side by side
            "mkt": (features, ofi),
            "hlc": (targets[:, 1:4],),
            "ret1": (np.append(close64[1:] / close64[:-1] - 1.0, 0.0),),
        }
        _sync(device)
        t0 = time.perf_counter()
        dev = {k: _upload(bs, device, pin) for k, bs in blocks.items()}
        _sync(device)
        self.upload = UploadStats(
            bytes=sum(v.numel() * v.element_size() for v in dev.values()),
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
        self.memory: torch.Tensor | None = None  # `use_memory`
        self.memory_decay: float | None = None
        self.forecast: torch.Tensor | None = None  # `use_forecast`
        # The range the statistics were last fitted on, with their tensors' version counters
        # then (`fitted_on`).
        self._fitted: tuple | None = None

    @classmethod
    def from_fxcache(cls, cache, device: torch.device, pin: bool = False) -> MarketData:
        m = cache.manifest
        names = [*m.get("features", []), *m.get("ofi", [])]
        return cls(cache.features, cache.ofi, cache.targets, device, pin=pin, names=names)

    def use_memory(self, decay: float) -> None:
        """Compute the memory columns (`ema` of the 8 order-flow columns at `decay` a bar), once;
        their normaliser is fitted with the others'. An agent's observation calls it when built
        (before capture: the tensors are persistent). One decay per MarketData."""
        if self.memory_decay == decay:
            return
        if self.memory_decay is not None:
            raise ValueError(
                f"memory_decay = {decay}: this data already holds the memory at "
                f"{self.memory_decay}; agents over one MarketData share one observation"
            )
        if self.forecast is not None:
            raise ValueError(
                "use_memory after use_forecast: the forecast reads the memory, so the memory "
                "comes first (agents over one MarketData share one observation)"
            )
        self.memory = ema(self.mkt[:, -N_MEMORY:], decay)
        self.memory_decay = decay
        self.memory_mean = torch.zeros(N_MEMORY, device=self.device)
        self.memory_inv_std = torch.ones(N_MEMORY, device=self.device)

    def use_forecast(self) -> None:
        """Add the forecast column, once (after `use_memory` where the agents remember): each
        fold, `fit_normaliser` fits a ridge regression of the next bar's return on the
        normalised columns the agents see (the 50, and the memory where the data holds it) over
        the train range, in closed form, and standardises its forecast for every bar with the
        forecast's mean and standard deviation over that range. A value at bar t reads bar t's
        columns alone; the fit reads returns inside the range alone. The tensors are persistent
        (captured graphs keep their addresses)."""
        if self.forecast is not None:
            return
        d = N_MKT + (N_MEMORY if self.memory is not None else 0)
        self.forecast = torch.zeros(self.n, device=self.device)
        self.forecast_w = torch.zeros(d + 1, device=self.device, dtype=torch.float64)
        self.forecast_mean = torch.zeros((), device=self.device, dtype=torch.float64)
        self.forecast_std = torch.ones((), device=self.device, dtype=torch.float64)

    def fit_normaliser(self, lo: int, hi: int) -> None:
        """Mean and standard deviation of every column over bars [lo, hi) (the train range),
        and the forecast's fit there (`use_forecast`)."""
        _fit(self.mkt[lo:hi], self.mean, self.inv_std)
        if self.memory is not None:
            _fit(self.memory[lo:hi], self.memory_mean, self.memory_inv_std)
        if self.forecast is not None:
            self.forecast_w.copy_(self._fit_forecast(lo, hi))
            score = self._forecast_scores()
            self.forecast_mean.copy_(score[lo:hi].mean())
            self.forecast_std.copy_(score[lo:hi].std())
            self.forecast.copy_(standardised(score, self.forecast_mean, self.forecast_std))
        self._fitted = (lo, hi, self._versions())

    def fitted_on(self, lo: int, hi: int) -> bool:
        """Whether the statistics are what `fit_normaliser(lo, hi)` left, not written since (a
        restored resume file, a loaded checkpoint) nor joined by columns (`use_memory`,
        `use_forecast`): a caller that needs them fitted on [lo, hi) may then skip the fit."""
        versions = self._versions()
        return versions is not None and self._fitted == (lo, hi, versions)

    def _versions(self) -> tuple[int, ...] | None:
        """The version counters of the statistics and the forecast column (each in-place write
        advances its tensor's), None where they keep none (tensors made in inference mode: then
        nothing counts as fitted)."""
        tensors = [*self.statistics().values(), *([] if self.forecast is None else [self.forecast])]
        try:
            return tuple(t._version for t in tensors)
        except RuntimeError:
            return None

    def statistics(self) -> dict[str, torch.Tensor]:
        """The fold's normaliser as checkpoints and resume files name it (live tensors): the
        columns' statistics, the memory's where the data holds the memory, and the forecast's
        weights and statistics where it holds the forecast (the column itself is computed from
        them: `score_forecast`). The memory's decay, a setting that training does not change,
        goes into checkpoints alone (`core.save_checkpoint`)."""
        st = {"norm.mean": self.mean, "norm.inv_std": self.inv_std}
        if self.memory is not None:
            st |= {"norm.memory_mean": self.memory_mean, "norm.memory_inv_std": self.memory_inv_std}
        if self.forecast is not None:
            st |= {"norm.forecast_w": self.forecast_w, "norm.forecast_mean": self.forecast_mean,
                   "norm.forecast_std": self.forecast_std}  # fmt: skip
        return st

    def _fit_forecast(self, lo: int, hi: int) -> torch.Tensor:
        """The ridge regression of ret1 on the `columns` the agents see over the train range
        [lo, hi), its sums taken FORECAST_ROWS bars at a time (one block: `fit_ridge`'s
        numbers)."""
        # ret1[t] is bar t + 1's return: the last bar of the range has none inside it.
        if hi - 1 <= lo:
            raise ValueError(f"forecast: the train range [{lo}, {hi}) holds no bar's return")
        gram = xty = None
        for a in range(lo, hi - 1, FORECAST_ROWS):
            t = torch.arange(a, min(a + FORECAST_ROWS, hi - 1), device=self.device)
            g, b = ridge_sums(
                self.columns(t, self.memory is not None), self.ret1.index_select(0, t)
            )
            gram, xty = (g, b) if gram is None else (gram + g, xty + b)
        return ridge_solve(gram, xty, hi - 1 - lo)

    def score_forecast(self) -> None:
        """The forecast column again from the fitted weights and statistics, as `fit_normaliser`
        left it: after they were restored from a resume file into a new process's data."""
        if self.forecast is not None:
            score = self._forecast_scores()
            self.forecast.copy_(standardised(score, self.forecast_mean, self.forecast_std))

    def columns(self, t: torch.Tensor, memory: bool = False) -> torch.Tensor:
        """The normalised columns a linear read takes at bars `t` (the forecast, the baselines):
        the 50 market columns, with `memory` the memory's 8 beside them, [len(t), 50 or 58]."""
        x = self.observe(t)
        return torch.cat([x, self.remember(t)], 1) if memory else x

    def _forecast_scores(self) -> torch.Tensor:
        """The ridge forecast of every bar, float64 [N], FORECAST_ROWS bars at a time."""
        return torch.cat([
            linear_score(self.columns(torch.arange(a, min(a + FORECAST_ROWS, self.n),
                                                   device=self.device), self.memory is not None),
                         self.forecast_w)
            for a in range(0, self.n, FORECAST_ROWS)
        ])  # fmt: skip

    def observe(self, t: torch.Tensor) -> torch.Tensor:
        """Normalised market features of bars `t`, [len(t), 50]."""
        return normalise(self.mkt.index_select(0, t), self.mean, self.inv_std)

    def remember(self, t: torch.Tensor) -> torch.Tensor:
        """Normalised memory columns of bars `t`, [len(t), 8] (after `use_memory`)."""
        return normalise(self.memory.index_select(0, t), self.memory_mean, self.memory_inv_std)


def normalise(x: torch.Tensor, mean: torch.Tensor, inv_std: torch.Tensor) -> torch.Tensor:
    """Columns standardised with a fold's statistics, clipped at +-CLIP standard deviations (the
    trainer's observation and a served policy's alike)."""
    return ((x - mean) * inv_std).clamp(-CLIP, CLIP)


def standardised(score: torch.Tensor, mean: torch.Tensor, std: torch.Tensor) -> torch.Tensor:
    """A forecast (float64) standardised with a fold's statistics, clipped at +-CLIP, float32
    (the trainer's forecast column and a served policy's alike)."""
    return ((score - mean) / std.clamp_min(1e-12)).clamp(-CLIP, CLIP).float()


def fit_ridge(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Weights [d + 1] (bias last) of ridge regression, in float64."""
    return ridge_solve(*ridge_sums(x, y), len(x))


def ridge_sums(x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """X'X and X'y of the rows of x with a bias column, float64: the sums a ridge regression
    solves, which add up over blocks of rows."""
    x, y = x.double(), y.double()
    xb = torch.cat([x, x.new_ones(len(x), 1)], 1)
    return xb.T @ xb, xb.T @ y


def ridge_solve(gram: torch.Tensor, xty: torch.Tensor, n: int) -> torch.Tensor:
    """The ridge weights from `ridge_sums` over n rows, the penalty RIDGE_L2 * n on every
    weight but the bias."""
    d = gram.shape[0] - 1
    reg = torch.eye(d + 1, dtype=gram.dtype, device=gram.device) * (RIDGE_L2 * n)
    reg[d, d] = 0.0  # the bias is not penalised
    return torch.linalg.solve(gram + reg, xty)


def linear_score(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """A linear model's score of the rows of x with weights w [d + 1] (bias last, as
    `fit_ridge` gives them), float64."""
    return x.double() @ w[:-1] + w[-1]


def ema(x: torch.Tensor, decay: float) -> torch.Tensor:
    """Exponential moving average of each column of `x` [N, C] down its rows, seeded with the
    first row: m[t] = decay * m[t-1] + (1 - decay) * x[t], m[-1] = x[0]. Causal: m[t] reads
    rows <= t only (future rows enter the blocks' products with weight exactly 0). In float64,
    returned as float32."""
    if not 0.0 <= decay < 1.0:
        raise ValueError(f"memory decay = {decay}: must be in [0, 1)")
    x64 = x.double()
    first = x64[:1]
    return ((1.0 - decay) * _scan(x64 - first, decay) + first).float()


def _scan(d: torch.Tensor, a: float) -> torch.Tensor:
    """y[t] = a * y[t-1] + d[t], y[-1] = 0, for d [N, C]: in blocks of SCAN_BLOCK rows, each
    block's scan a product with the [B, B] matrix of a^(i-j) (j <= i), the carry from one block
    to the next the same scan over the blocks' last rows at a^B (recursively)."""
    n, c = d.shape
    b = SCAN_BLOCK
    m = -(-n // b)
    blocks = torch.nn.functional.pad(d, (0, 0, 0, m * b - n)).view(m, b, c)
    i = torch.arange(b, device=d.device)
    lag = (i[:, None] - i[None, :]).double()
    powers = torch.where(lag >= 0, a ** lag.clamp_min(0), 0.0)  # [B, B], lower triangular
    local = torch.einsum("ij,mjc->mic", powers, blocks)  # each block's scan from a zero carry
    if m > 1:
        ends = _scan(local[:, -1], a**b)  # the true last value of each block
        carry = torch.cat([ends.new_zeros(1, c), ends[:-1]])  # the true value before each block
        local = local + (a ** (i + 1).double())[None, :, None] * carry[:, None, :]
    return local.reshape(m * b, c)[:n]


def _fit(x: torch.Tensor, mean: torch.Tensor, inv_std: torch.Tensor) -> None:
    std, mu = torch.std_mean(x, dim=0)
    mean.copy_(mu)
    inv_std.copy_(1.0 / std.clamp_min(1e-8))


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


def _upload(blocks: tuple[np.ndarray, ...], device: torch.device, pin: bool) -> torch.Tensor:
    """The host column blocks `blocks` ([n] or [n, k] each) side by side on `device`, float32:
    [n] for one 1-D block, else [n, sum of k]. Each block goes straight from its host memory (a
    read-only memory map of the fxcache) into its columns: no host copy of the whole, unless
    `pin`, where each block is first converted into page-locked memory. Pageable is the
    default: pinning the standard workload's 432 MB costs more than the copy it speeds up
    (docs/task-start.md)."""
    widths = [b.shape[1] if b.ndim == 2 else 1 for b in blocks]
    flat = len(blocks) == 1 and blocks[0].ndim == 1
    dest = torch.empty((len(blocks[0]),) if flat else (len(blocks[0]), sum(widths)),
                       dtype=torch.float32, device=device)  # fmt: skip
    col = 0
    for b, w in zip(blocks, widths, strict=True):
        with warnings.catch_warnings():  # a read-only map: the tensor is only read from
            warnings.filterwarnings("ignore", "The given NumPy array is not writable")
            src = torch.from_numpy(np.asarray(b)).to(torch.float32)
        if pin:
            src = src.pin_memory()
        part = dest if flat else dest[:, col : col + w]
        part.copy_(src.view(part.shape), non_blocking=pin)
        col += w
    return dest


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
