"""Walk-forward folds: index ranges into an fxcache, from its timestamps alone.

Periods are calendar months (UTC, the clock of the cache's timestamps, so DST changes nothing);
a fold's train, val and test periods follow each other, and the next fold moves them all on by
`step` months. With `window="expanding"` every train period starts at the first month.

    month:   1    2    3    4    5    6    7
    fold 0:  [ train        ]p[val]e[test]
    fold 1:       [ train        ]p[val]e[test]            sliding
    fold 1:  [ train             ]p[val]e[test]            expanding
                              p = purge, e = embargo (bars dropped from the end of the range)

Each range is half-open (`train_start` .. `train_end` are bar indices, end excluded). The
`purge` bars at the end of train are dropped so that no reward horizon of a training sample
reaches into val; the `embargo` bars at the end of val are dropped likewise before test.

Why the embargo need not cover the longest feature lookback (179 bars, and VPIN's day of
volume): in walk-forward order every range lies after the ones it is fitted or selected on, so a
feature window that reaches back from test into val (or from val into train) reads the past, as
it would in live trading, and leaks nothing. What can leak is a label: a reward of the last val
bars that reads test bars, which an embargo of at least the reward horizon (n_step) rules out,
as the purge does for train. Lopez de Prado's embargo against feature overlap is for
cross-validation, where a test range can precede train data; walk-forward never does that. The
default `lookback` of 60 bars widens the gap beyond the horizon only to keep the val and test
estimates apart under volatility clustering. A fold
whose ranges hold too few bars (holidays, missing weeks or months, a partial last month) is
dropped with its reason logged; a series too short for even one fold is an error.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import Literal

import numpy as np

from foxhunt.errors import StepError

log = logging.getLogger(__name__)


class FoldError(StepError, ValueError):
    """The series cannot make the folds asked for; the message says why."""


@dataclass(frozen=True)
class FoldSpec:
    train_months: int = 3
    """Length of each train period, in calendar months."""
    val_months: int = 1
    """Length of each validation period (best-epoch selection)."""
    test_months: int = 1
    """Length of each test period (evaluated once per fold)."""
    step_months: int = 1
    """How far the next fold moves on."""
    window: Literal["sliding", "expanding"] = "sliding"
    """sliding: train periods of fixed length; expanding: every train period starts at month 0."""
    n_step: int = 3
    """Reward horizon of the agent in bars (n-step returns): sets the default purge."""
    lookback: int = 60
    """Bars of serial dependence (volatility clustering) kept between val and test: sets the
    default embargo. Not the features' lookback, which forward order makes safe (see above)."""
    purge: int | None = None
    """Bars dropped from the end of train before val (default: n_step)."""
    embargo: int | None = None
    """Bars dropped from the end of val before test (default: max(n_step, lookback))."""
    min_train_bars: int = 1000
    """A fold with fewer train bars is dropped."""
    min_eval_bars: int = 100
    """A fold with fewer val or test bars is dropped."""

    def __post_init__(self) -> None:
        for k in ("train_months", "val_months", "test_months", "step_months"):
            if getattr(self, k) < 1:
                raise FoldError(f"{k} = {getattr(self, k)}: must be at least 1")
        for k in ("n_step", "lookback", "min_train_bars", "min_eval_bars"):
            if getattr(self, k) < 0:
                raise FoldError(f"{k} = {getattr(self, k)}: must not be negative")
        for k in ("purge", "embargo"):
            if getattr(self, k) is not None and getattr(self, k) < 0:
                raise FoldError(f"{k} = {getattr(self, k)}: must not be negative")

    @property
    def purge_bars(self) -> int:
        return self.n_step if self.purge is None else self.purge

    @property
    def embargo_bars(self) -> int:
        return max(self.n_step, self.lookback) if self.embargo is None else self.embargo


@dataclass(frozen=True)
class Fold:
    fold: int
    train_start: int
    train_end: int
    val_start: int
    val_end: int
    test_start: int
    test_end: int
    periods: dict  # ISO month boundaries of train, val and test
    difficulty: float | None = None  # mean ADX (feature 40) over the train range

    def as_json(self) -> dict:
        return asdict(self)


def _month(ts_ns: int) -> int:
    """Months since 1970-01 of a UTC timestamp."""
    m = np.datetime64(int(ts_ns), "ns").astype("datetime64[M]").astype(np.int64)
    return int(m)


def _month_ns(month: int) -> int:
    return int(np.datetime64(month, "M").astype("datetime64[ns]").astype(np.int64))


def _iso(month: int) -> str:
    return str(np.datetime64(month, "M").astype("datetime64[D]").item())


def make_folds(timestamps: np.ndarray, spec: FoldSpec) -> tuple[list[Fold], list[dict]]:
    """Folds over bar-close timestamps (int64 ns, strictly increasing). Returns the kept folds and
    the dropped ones with their reasons."""
    ts = np.asarray(timestamps, dtype=np.int64)
    if len(ts) == 0:
        raise FoldError("no bars: the series is empty")
    if (np.diff(ts) <= 0).any():
        raise FoldError("timestamps must be strictly increasing")
    first, last = _month(ts[0]), _month(ts[-1])
    span = spec.train_months + spec.val_months + spec.test_months
    n_months = last - first + 1
    if n_months < span:
        raise FoldError(
            f"the series covers {n_months} calendar month(s) ({_iso(first)} .. {_iso(last)}); "
            f"one fold needs {span} (train {spec.train_months} + val {spec.val_months} + "
            f"test {spec.test_months})"
        )
    folds, dropped = [], []
    k = 0
    while True:
        m0 = first + k * spec.step_months
        tr0 = first if spec.window == "expanding" else m0
        tr1 = m0 + spec.train_months
        va1 = tr1 + spec.val_months
        te1 = va1 + spec.test_months
        if te1 - 1 > last:
            break
        idx = np.searchsorted(ts, [_month_ns(m) for m in (tr0, tr1, va1, te1)], side="left")
        a, b, c, d = (int(x) for x in idx)
        train_end = max(a, b - spec.purge_bars)
        val_end = max(b, c - spec.embargo_bars)
        periods = {
            "train": [_iso(tr0), _iso(tr1)],
            "val": [_iso(tr1), _iso(va1)],
            "test": [_iso(va1), _iso(te1)],
        }
        fold = Fold(k, a, train_end, b, val_end, c, d, periods)
        reason = None
        min_train, min_eval = max(1, spec.min_train_bars), max(1, spec.min_eval_bars)
        if train_end - a < min_train:
            reason = f"train has {train_end - a} bars (< min_train_bars {min_train})"
        elif val_end - b < min_eval:
            reason = f"val has {val_end - b} bars (< min_eval_bars {min_eval})"
        elif d - c < min_eval:
            reason = f"test has {d - c} bars (< min_eval_bars {min_eval})"
        if reason:
            log.info("fold %d (%s .. %s) dropped: %s", k, _iso(tr0), _iso(te1), reason)
            dropped.append({"fold": k, "periods": periods, "reason": reason})
        else:
            folds.append(fold)
        k += 1
    if not folds:
        raise FoldError(
            f"all {len(dropped)} fold(s) dropped: "
            + "; ".join(f"fold {d['fold']}: {d['reason']}" for d in dropped[:3])
        )
    return folds, dropped


RANGE_FIELDS = ("train_start", "train_end", "val_start", "val_end", "test_start", "test_end")


def fold_ranges(fold: dict) -> dict[str, tuple[int, int]]:
    """A fold's half-open bar ranges by part: {"train": (start, end), "val": ..., "test": ...}."""
    return {p: (fold[f"{p}_start"], fold[f"{p}_end"]) for p in ("train", "val", "test")}


def check_folds(folds: list[dict], rows: int, spec: dict | None = None) -> None:
    """Raise `FoldError` unless every fold is a set of ranges a trainer can use without
    look-ahead: integer bounds inside the `rows` bars of the cache, train before val before test
    with no overlap, each range long enough to evaluate, and at least the purge and embargo gaps
    the folds file declares (never less than one bar: a reward at bar t needs close[t+1])."""
    spec = spec or {}
    purge = max(int(spec.get("purge_bars", 1)), 1)
    embargo = max(int(spec.get("embargo_bars", 1)), 1)
    seen: set = set()
    for i, f in enumerate(folds):
        if not isinstance(f, dict):
            raise FoldError(f"fold #{i}: not an object")
        name = f"fold {f.get('fold', f'#{i}')}"
        if f.get("fold") in seen:
            raise FoldError(f"{name}: fold id appears twice")
        seen.add(f.get("fold"))
        for k in ("fold", *RANGE_FIELDS):
            if type(f.get(k)) is not int:
                raise FoldError(f"{name}: {k} = {f.get(k)!r}: must be an integer bar index")
        a, b, c, d, e, g = (f[k] for k in RANGE_FIELDS)
        if a < 0 or g > rows:
            raise FoldError(
                f"{name}: ranges [{a}, {g}) reach outside the cache's {rows} bars (0 .. {rows})"
            )
        for lo, hi, part in ((a, b, "train"), (c, d, "val"), (e, g, "test")):
            if hi - lo < 2:
                raise FoldError(f"{name}: {part} range [{lo}, {hi}) holds fewer than 2 bars")
        if c - b < purge:
            raise FoldError(
                f"{name}: val starts at bar {c}, {c - b} bar(s) after train ends at {b}; the "
                f"purge must be at least {purge} bar(s) so that no train reward sees val"
            )
        if e - d < embargo:
            raise FoldError(
                f"{name}: test starts at bar {e}, {e - d} bar(s) after val ends at {d}; the "
                f"embargo must be at least {embargo} bar(s) so that no val reward sees test"
            )


def with_difficulty(folds: list[Fold], adx: np.ndarray) -> list[Fold]:
    """Each fold's difficulty: the mean ADX (feature 40) over its train range."""
    out = []
    for f in folds:
        mean = float(np.mean(adx[f.train_start : f.train_end], dtype=np.float64))
        out.append(Fold(**{**asdict(f), "difficulty": round(mean, 4)}))
    return out


def picture(folds: list[Fold], n: int, width: int = 72) -> str:
    """An ASCII picture of the folds over the series (t = train, v = val, T = test)."""
    lines = []
    scale = width / max(n, 1)
    for f in folds:
        row = [" "] * width
        for lo, hi, ch in (
            (f.train_start, f.train_end, "t"),
            (f.val_start, f.val_end, "v"),
            (f.test_start, f.test_end, "T"),
        ):
            for i in range(int(lo * scale), max(int(hi * scale), int(lo * scale) + 1)):
                if i < width:
                    row[i] = ch
        lines.append(f"fold {f.fold:3d} |{''.join(row)}|")
    return "\n".join(lines)
