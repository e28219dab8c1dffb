"""The statistics of `foxhunt bench`, in plain Python (no scipy on the GPU image's path):

- `summarize`: outliers beyond 1.5 IQR of the quartiles (Tukey's fences, as pytest-benchmark
  reports them) counted and excluded, then over the rest the mean with a Student-t 95%
  confidence interval, the median, the IQR and the 50th/95th/99th percentiles.
- `t_quantile`: Student's t quantile, by bisection on its CDF through the regularised
  incomplete beta function (a continued fraction, Numerical Recipes' betacf).
- `mann_whitney`: the two-sided Mann-Whitney U test (asv judges a change with it): the exact
  distribution of U for small samples without ties, the normal approximation with tie and
  continuity corrections otherwise (scipy's methods "exact" and "asymptotic").

Percentiles interpolate linearly between order statistics (numpy's default).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import asdict, dataclass
from functools import cache, lru_cache


def percentile(xs: list[float], q: float) -> float:
    """The q-th percentile (0..100) of xs, linear between order statistics."""
    s = sorted(xs)
    if not s:
        return math.nan
    pos = (len(s) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    tiny, eps = 1e-300, 3e-16
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > tiny else tiny)
        c = 1.0 + aa / c
        c = c if abs(c) > tiny else tiny
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < eps:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b)."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    ln = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x)
    ln += b * math.log1p(-x)
    front = math.exp(ln)
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    x = df / (df + t * t)
    tail = 0.5 * betainc(df / 2.0, 0.5, x)
    return 1.0 - tail if t > 0 else tail


@lru_cache(maxsize=256)
def t_quantile(p: float, df: float) -> float:
    """The p quantile of Student's t with df degrees of freedom."""
    if not 0.0 < p < 1.0:
        raise ValueError(f"p = {p}: must be in (0, 1)")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < p:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if t_cdf(mid, df) < p:
            lo = mid
        else:
            hi = mid
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


@dataclass(frozen=True)
class Summary:
    n: int  # samples kept (outliers excluded)
    outliers: int  # beyond 1.5 IQR of the quartiles, excluded
    mean: float
    ci95: float  # half-width of the Student-t 95% interval of the mean
    median: float
    iqr: float
    p50: float
    p95: float
    p99: float
    min: float
    max: float

    def as_dict(self) -> dict:
        return asdict(self)

    @property
    def rel_ci(self) -> float:
        """The interval's half-width over the mean."""
        return self.ci95 / self.mean if self.mean else math.nan


def tukey_keep(xs: list[float]) -> tuple[list[float], list[float]]:
    """(kept, outliers): outliers lie below Q1 - 1.5 IQR or above Q3 + 1.5 IQR."""
    q1, q3 = percentile(xs, 25), percentile(xs, 75)
    lo, hi = q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1)
    return [x for x in xs if lo <= x <= hi], [x for x in xs if not lo <= x <= hi]


def summarize(xs: list[float]) -> Summary:
    """Outliers excluded, then the statistics of the rest (see the module doc)."""
    if not xs:
        raise ValueError("no samples to summarise")
    kept, out = tukey_keep(list(xs)) if len(xs) >= 4 else (list(xs), [])
    n = len(kept)
    mean = statistics.fmean(kept)
    ci = t_quantile(0.975, n - 1) * statistics.stdev(kept) / math.sqrt(n) if n > 1 else math.nan
    return Summary(
        n=n, outliers=len(out), mean=mean, ci95=ci, median=statistics.median(kept),
        iqr=percentile(kept, 75) - percentile(kept, 25), p50=percentile(kept, 50),
        p95=percentile(kept, 95), p99=percentile(kept, 99), min=min(kept), max=max(kept),
    )  # fmt: skip


# ---------------------------------------------------------------------------------- Mann-Whitney
def _ranks(values: list[float]) -> list[float]:
    """Average ranks (1-based) with ties sharing the mean of their ranks."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2.0 + 1.0
        i = j + 1
    return ranks


@lru_cache(maxsize=64)
def _u_counts(n1: int, n2: int) -> tuple[int, ...]:
    """The number of arrangements of n1 + n2 distinct values giving each U (0..n1 n2)."""

    @cache
    def f(a: int, b: int) -> tuple[int, ...]:
        if a == 0 or b == 0:
            return (1,)
        # the largest value is from sample 1 (adds b to U) or from sample 2 (adds nothing)
        x, y = f(a - 1, b), f(a, b - 1)
        out = [0] * (a * b + 1)
        for u, c in enumerate(x):
            out[u + b] += c
        for u, c in enumerate(y):
            out[u] += c
        return tuple(out)

    return f(n1, n2)


@dataclass(frozen=True)
class MannWhitney:
    u: float  # U of the first sample: pairs (a, b) with a > b, ties counting a half
    p: float  # two-sided p value
    method: str  # "exact" or "asymptotic"


def mann_whitney(a: list[float], b: list[float]) -> MannWhitney:
    """Two-sided Mann-Whitney U test of samples a and b (see the module doc)."""
    n1, n2 = len(a), len(b)
    if n1 == 0 or n2 == 0:
        raise ValueError("Mann-Whitney needs two non-empty samples")
    r = _ranks(list(a) + list(b))
    u1 = sum(r[:n1]) - n1 * (n1 + 1) / 2.0
    ties = len(set(a) | set(b)) < n1 + n2
    if not ties and n1 <= 8 and n2 <= 8:
        counts = _u_counts(n1, n2)
        total = sum(counts)
        k = round(max(u1, n1 * n2 - u1))
        upper = sum(counts[k:]) / total  # P(U >= k), U symmetric about n1 n2 / 2
        return MannWhitney(u1, min(1.0, 2.0 * upper), "exact")
    n = n1 + n2
    mu = n1 * n2 / 2.0
    groups: dict[float, int] = {}
    for v in list(a) + list(b):
        groups[v] = groups.get(v, 0) + 1
    tie_term = sum(t**3 - t for t in groups.values()) / (n * (n - 1))
    sd = math.sqrt(n1 * n2 / 12.0 * ((n + 1) - tie_term))
    if sd == 0:
        return MannWhitney(u1, 1.0, "asymptotic")
    z = (abs(u1 - mu) - 0.5) / sd  # continuity correction
    p = 2.0 * (1.0 - statistics.NormalDist().cdf(max(z, 0.0)))
    return MannWhitney(u1, min(1.0, p), "asymptotic")
