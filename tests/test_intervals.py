"""common/intervals.py against independent computations: scipy where installed, else brute force from math.comb."""
import math

import numpy as np
import pytest

from common import intervals as I
try:
    from scipy import stats as scipy_stats
except ImportError:  # the brute-force checks below still run
    scipy_stats = None


def binom_cdf(k, n, p):
    """P(X <= k), X ~ Bin(n, p), summed from the binomial terms."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(0, k + 1))


def invert(f, target, increasing):
    """x in [0, 1] with f(x) = target, by 200 bisection steps (f monotone)."""
    lo, hi = 0.0, 1.0
    for _ in range(200):
        mid = (lo + hi) / 2
        if (f(mid) < target) == increasing:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@pytest.mark.parametrize("a,b,x", [(1, 1, 0.3), (2.5, 0.5, 0.7), (10, 31, 0.2), (0.5, 0.5, 0.01), (40, 2, 0.97),
                                   (3, 38, 0.08)])
def test_betainc_against_the_binomial_tail_and_scipy(a, b, x):
    if scipy_stats is not None:
        assert I.betainc(a, b, x) == pytest.approx(scipy_stats.beta.cdf(x, a, b), abs=1e-10)
    if float(a).is_integer() and float(b).is_integer():
        n, k = int(a + b - 1), int(a)  # I_x(k, n - k + 1) = P(Bin(n, x) >= k)
        assert I.betainc(a, b, x) == pytest.approx(1 - binom_cdf(k - 1, n, x), abs=1e-10)


@pytest.mark.parametrize("k,n", [(0, 40), (1, 40), (7, 24), (12, 24), (23, 24), (24, 24), (3, 5)])
def test_clopper_pearson_is_the_inverted_binomial_tail(k, n):
    """lower: P(X >= k | p) = 0.025; upper: P(X <= k | p) = 0.025 (brute force over the binomial terms)."""
    lo, hi = I.clopper_pearson(k, n)
    want_lo = 0.0 if k == 0 else invert(lambda p: 1 - binom_cdf(k - 1, n, p), 0.025, increasing=True)
    want_hi = 1.0 if k == n else invert(lambda p: binom_cdf(k, n, p), 0.025, increasing=False)
    assert lo == pytest.approx(want_lo, abs=1e-9) and hi == pytest.approx(want_hi, abs=1e-9)
    if scipy_stats is not None and 0 < k < n:
        assert lo == pytest.approx(scipy_stats.beta.ppf(0.025, k, n - k + 1), abs=1e-9)
        assert hi == pytest.approx(scipy_stats.beta.ppf(0.975, k + 1, n - k), abs=1e-9)


@pytest.mark.parametrize("df", [1, 2, 5, 23, 39, 200])
def test_t_quantile(df):
    want = scipy_stats.t.ppf(0.975, df) if scipy_stats is not None else {1: 12.7062, 2: 4.3027, 5: 2.5706, 23: 2.0687,
                                                                        39: 2.0227, 200: 1.9719}[df]
    assert I.t_quantile_975(df) == pytest.approx(want, abs=1e-4)


@pytest.mark.parametrize("k,n", [(0, 10), (3, 10), (10, 10), (1, 24), (17, 40), (2.5, 6)])
def test_wilson_against_its_closed_form(k, n):
    """The Wilson interval solves |p - p_hat| = z sqrt(p (1 - p) / n) for p: the quadratic's two roots."""
    z, p_hat = 1.96, k / n
    # (1 + z^2/n) p^2 - (2 p_hat + z^2/n) p + p_hat^2 = 0
    qa, qb, qc = 1 + z * z / n, -(2 * p_hat + z * z / n), p_hat ** 2
    disc = math.sqrt(qb * qb - 4 * qa * qc)
    roots = [(-qb - disc) / (2 * qa), (-qb + disc) / (2 * qa)]
    assert I.wilson(k, n) == pytest.approx([max(0, roots[0]), min(1, roots[1])], abs=1e-12)
    assert I.wilson(0, 0) == [0.0, 1.0]


@pytest.mark.parametrize("better,worse", [(0, 0), (3, 0), (5, 5), (9, 2), (1, 12), (20, 7)])
def test_sign_test_against_the_sum_of_binomial_terms(better, worse):
    n = better + worse
    # two-sided: the probability under Bin(n, 1/2) of an outcome at most as likely as the one seen
    probs = [math.comb(n, i) / 2 ** n for i in range(n + 1)]
    seen = probs[better] if n else 1.0
    want = min(1.0, sum(q for q in probs if q <= seen * (1 + 1e-12))) if n else 1.0
    assert I.sign_test(better, worse) == pytest.approx(want, abs=1e-12)
    if scipy_stats is not None and n:
        assert I.sign_test(better, worse) == pytest.approx(scipy_stats.binomtest(better, n, 0.5).pvalue, abs=1e-12)


def test_pair_and_task_means_by_hand():
    eps = [dict(task_id=t, harness_id=h, success=s) for t, h, s in
           [("a", "h1", True), ("a", "h1", False), ("a", "h2", True), ("b", "h1", False), ("b", "h2", False)]]
    pairs = I.pair_means(eps)
    assert pairs == {("a", "h1"): 0.5, ("a", "h2"): 1.0, ("b", "h1"): 0.0, ("b", "h2"): 0.0}
    assert I.task_means(pairs, ["b", "a"]).tolist() == [0.0, 0.75]


def test_pass1_ci_exact_on_zero_one_tasks_and_korn_graubard_otherwise():
    v = np.array([1, 0, 0, 1, 1, 0, 0, 0, 1, 0] * 3, dtype=float)
    assert I.pass1_ci(v) == (I.clopper_pearson(12, 30), "exact")
    # means over 4 harnesses: n_eff = p (1 - p) / (s^2 / n) x (z / t_{n-1})^2, at most n x 4 trials
    v = np.array([0.25, 0.5, 0.0, 0.75, 1.0, 0.25, 0.0, 0.5] * 3)
    n, p = len(v), v.mean()
    n_eff = min(p * (1 - p) / (v.var(ddof=1) / n) * (1.959964 / scipy_t(n - 1)) ** 2, n * 4)
    ci, method = I.pass1_ci(v)
    assert method == "korn-graubard" and ci == pytest.approx(I.clopper_pearson(p * n_eff, n_eff), abs=1e-9)
    assert I.trials_per_task(v) == 4 and I.pass1_ci([]) == ([0.0, 1.0], "exact")


def scipy_t(df):
    return scipy_stats.t.ppf(0.975, df) if scipy_stats is not None else I.t_quantile_975(df)


def test_bootstrap_ci_resamples_tasks_with_replacement():
    d = np.array([1.0, 0.0, -1.0, 0.5, 0.25, 0.0, 1.0, -0.5])
    rng = np.random.default_rng(7)
    means = np.array([d[rng.integers(0, len(d), size=len(d))].mean() for _ in range(300)])
    assert I.bootstrap_ci(d, 300, 7) == pytest.approx([np.percentile(means, 2.5), np.percentile(means, 97.5)])
    lo, hi = I.bootstrap_ci(d, 2000, 0)
    assert lo < d.mean() < hi
    assert I.bootstrap_ci([0.3], 100, 0) == [0.3, 0.3] and I.bootstrap_ci([], 100, 0) == [0.0, 0.0]


def test_min_detectable_difference():
    d = np.array([0.0, 1.0, 0.0, -1.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0])
    z = (scipy_stats.norm.ppf(0.975) + scipy_stats.norm.ppf(0.8)) if scipy_stats is not None else 2.801585
    assert I.min_detectable(d) == pytest.approx(z * d.std(ddof=1) / math.sqrt(len(d)), rel=1e-6)
    assert I.min_detectable([0.5]) is None
