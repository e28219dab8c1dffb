"""foxhunt bench's statistics against scipy and hand values."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from scipy import stats as sp

from foxhunt.bench.stats import mann_whitney, percentile, summarize, t_quantile, tukey_keep


@pytest.mark.parametrize("df", [1, 2, 3, 5, 9, 10, 29, 100, 1000])
@pytest.mark.parametrize("p", [0.5, 0.9, 0.975, 0.995, 0.025])
def test_t_quantiles_are_scipy_s(df, p):
    assert t_quantile(p, df) == pytest.approx(sp.t.ppf(p, df), rel=1e-9, abs=1e-12)


def test_percentiles_are_numpy_s():
    rng = random.Random(0)
    xs = [rng.random() for _ in range(37)]
    for q in (0, 5, 25, 50, 95, 99, 100):
        assert percentile(xs, q) == pytest.approx(float(np.percentile(xs, q)))


def test_the_iqr_rule_by_hand():
    # quartiles of 1..8 are 2.75 and 6.25 (IQR 3.5): fences at -2.5 and 11.5
    xs = [1, 2, 3, 4, 5, 6, 7, 8, 11.5, 11.6, -2.6]
    q1, q3 = percentile(xs, 25), percentile(xs, 75)
    kept, out = tukey_keep(xs)
    lo, hi = q1 - 1.5 * (q3 - q1), q3 + 1.5 * (q3 - q1)
    assert sorted(out) == sorted(x for x in xs if x < lo or x > hi)
    assert kept == [x for x in xs if lo <= x <= hi]
    assert tukey_keep([1.0, 1.0, 1.0, 9.0, 1.0])[1] == [9.0]


def test_summary_excludes_outliers_then_gives_the_t_interval():
    xs = [0.100, 0.101, 0.099, 0.102, 0.098, 0.100, 0.101, 0.099, 0.100, 0.100, 0.250]
    s = summarize(xs)
    kept = xs[:-1]
    assert (s.n, s.outliers) == (10, 1)
    assert s.mean == pytest.approx(np.mean(kept))
    half = sp.t.ppf(0.975, 9) * np.std(kept, ddof=1) / math.sqrt(10)
    assert s.ci95 == pytest.approx(half)
    assert s.median == pytest.approx(np.median(kept))
    assert s.p99 == pytest.approx(np.percentile(kept, 99))
    assert s.iqr == pytest.approx(np.percentile(kept, 75) - np.percentile(kept, 25))


@pytest.mark.parametrize("seed", range(6))
def test_mann_whitney_is_scipy_s(seed):
    rng = random.Random(seed)
    n1, n2 = rng.randint(3, 8), rng.randint(3, 8)
    a = [rng.gauss(0, 1) for _ in range(n1)]
    b = [rng.gauss(0.8 * (seed % 2), 1) for _ in range(n2)]
    got = mann_whitney(a, b)
    want = sp.mannwhitneyu(a, b, alternative="two-sided", method="exact")
    assert got.method == "exact"
    assert got.u == pytest.approx(want.statistic)
    assert got.p == pytest.approx(want.pvalue, rel=1e-9)
    # larger samples with ties: the normal approximation with both corrections
    a = [round(rng.gauss(0, 1), 1) for _ in range(25)]
    b = [round(rng.gauss(0.5, 1), 1) for _ in range(30)]
    got = mann_whitney(a, b)
    want = sp.mannwhitneyu(a, b, alternative="two-sided", method="asymptotic")
    assert got.method == "asymptotic"
    assert got.u == pytest.approx(want.statistic)
    assert got.p == pytest.approx(want.pvalue, rel=1e-9)
