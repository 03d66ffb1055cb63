"""Interval statistics of pass@1, shared by 06_evaluate.py (one policy), experiments/compare.py (paired differences
between rows) and experiments/transfer_curve.py (checkpoints along training). One copy, so every table's interval is the
same one.

    pair_means(episodes)          {(task, harness): success averaged over the pair's samples}
    task_means(pairs, tasks)      [n_tasks] per-task pass@1 (tasks are the independent units)
    pass1_ci(values)              95% interval of pass@1: Clopper-Pearson, or Korn-Graubard on the effective count
    clopper_pearson(k, n)         exact binomial interval (k may be fractional: an effective count)
    wilson(k, n)                  Wilson score interval
    bootstrap_ci(values, B, seed) percentile bootstrap of a mean over tasks (the paired bootstrap of differences)
    sign_test(better, worse)      exact two-sided sign test on discordant tasks
    min_detectable(d)             the difference a paired test over these tasks finds with 80% power
"""
import math
from collections import defaultdict

import numpy as np


# how the tables word their intervals (06, experiments/compare.py)
CI_NOTE = ("pass@1 in % with a 95% interval over test tasks: Clopper-Pearson (*) where every task scores 0 or 1; "
           "where a task's value is a mean over harnesses or samples, Clopper-Pearson on the effective number of "
           "trials (Korn-Graubard; coverage checked by simulation, docs/metrics.md).")


# ----------------------------------------------------------------------------- per pair, per task

def pair_means(episodes):
    """{(task_id, harness_id): success averaged over the pair's samples}."""
    by_pair = defaultdict(list)
    for e in episodes:
        by_pair[(e["task_id"], e["harness_id"])].append(float(e["success"]))
    return {k: float(np.mean(v)) for k, v in by_pair.items()}


def task_means(pairs, tasks):
    """[n_tasks] per-task pass@1: mean over the task's (harness) pairs, each a mean over its samples."""
    by_task = defaultdict(list)
    for (t, _), v in pairs.items():
        by_task[t].append(v)
    return np.array([np.mean(by_task[t]) for t in tasks])


# ----------------------------------------------------------------------------- the Beta and t distributions
def betainc(a, b, x):
    """Regularised incomplete beta I_x(a, b) = P(Beta(a, b) <= x), by its continued fraction (Lentz's method;
    Numerical Recipes 6.4). For integers, I_p(k, n - k + 1) = P(Binomial(n, p) >= k)."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    if x > (a + 1) / (a + b + 2):  # the fraction converges fast below the mean: use the symmetry
        return 1 - betainc(b, a, 1 - x)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)) / a
    c, d, f = 1.0, 1 - (a + b) * x / (a + 1), 0.0
    d = 1 / (d if abs(d) > 1e-300 else 1e-300)
    f = d
    for m in range(1, 500):
        for num in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                    -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d, c = 1 + num * d, 1 + num / c
            d, c = 1 / (d if abs(d) > 1e-300 else 1e-300), (c if abs(c) > 1e-300 else 1e-300)
            f *= c * d
        if abs(c * d - 1) < 1e-12:
            break
    return front * f


def beta_quantile(q, a, b):
    """x with I_x(a, b) = q, by bisection (I is increasing in x)."""
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if betainc(a, b, mid) < q else (lo, mid)
    return (lo + hi) / 2


def t_quantile_975(df):
    """Student t 97.5% quantile (2.069 at df = 23): P(T > t) = I_{df / (df + t^2)}(df / 2, 1 / 2) / 2 = 0.025."""
    lo, hi = 0.0, 1000.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if betainc(df / 2, 0.5, df / (df + mid * mid)) / 2 > 0.025 else (lo, mid)
    return (lo + hi) / 2


# ----------------------------------------------------------------------------- intervals of pass@1
def clopper_pearson(k, n, alpha=0.05):
    """Exact (Clopper-Pearson) interval for k successes in n trials; k may be fractional (an effective count):
    lower = Beta quantile alpha/2 of (k, n - k + 1), upper = Beta quantile 1 - alpha/2 of (k + 1, n - k).
    0/40 -> [0, 0.088]; 1/40 -> [0.0006, 0.132]."""
    lo = 0.0 if k <= 0 else beta_quantile(alpha / 2, k, n - k + 1)
    hi = 1.0 if k >= n else beta_quantile(1 - alpha / 2, k + 1, n - k)
    return [lo, hi]


def trials_per_task(v):
    """The smallest m <= 10000 with every v * m an integer: a task's value is successes / m (pairs x samples)."""
    return next((m for m in range(1, 10001) if np.allclose(v * m, np.round(v * m), atol=1e-6)), 10000)


def pass1_ci(task_values, n_boot=0, seed=0):
    """(95% interval, method) of pass@1 = mean of the per-task values; every table row goes through here.
    - every task 0 or 1: Clopper-Pearson on k of n tasks ("exact"), at every count.
    - a task's value is a mean over m harnesses / samples: Korn-Graubard (1998), Clopper-Pearson on the effective
      number of trials n_eff = p (1 - p) / Var(p), Var(p) = s^2 / n from the spread of the task values (tasks are
      the independent units), at most n m, times (z / t_{n-1})^2 for the estimated variance ("korn-graubard").
      Its coverage is checked by simulation: experiments/bench/ci_coverage.py, docs/metrics.md.
    n_boot and seed are unused: this interval needs no resampling (experiments/compare.py's paired bootstrap does)."""
    v = np.asarray(task_values, dtype=float)  # [n_tasks]
    n = len(v)
    if n == 0:
        return [0.0, 1.0], "exact"
    if np.all((v == 0) | (v == 1)):
        return clopper_pearson(int(v.sum()), n), "exact"
    p, var = float(v.mean()), float(v.var(ddof=1)) / n if n > 1 else 0.0  # Var(p) = s^2 / n over tasks
    n_max = n * trials_per_task(v)  # the Bernoulli trials behind the values: the effective count cannot exceed it
    # n_eff = p (1 - p) / Var(p) x (z / t_{n-1})^2, at most n m
    n_eff = min(p * (1 - p) / var * (1.959964 / t_quantile_975(n - 1)) ** 2, n_max) if var > 0 else n_max
    return clopper_pearson(p * n_eff, n_eff), "korn-graubard"


def wilson(k, n, z=1.96):
    """Wilson 95% interval: (p + z^2/2n +- z sqrt(p(1-p)/n + z^2/4n^2)) / (1 + z^2/n), p = k/n."""
    if n == 0:
        return [0.0, 1.0]
    p = k / n
    centre, half = p + z * z / (2 * n), z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return [float(max(0.0, (centre - half) / (1 + z * z / n))), float(min(1.0, (centre + half) / (1 + z * z / n)))]


# ----------------------------------------------------------------------------- paired differences
def bootstrap_ci(values, n_boot, seed):
    """95% percentile interval of mean(values) by resampling the values (one per TASK) with replacement. Given the
    per-task differences of two rows, this is the paired bootstrap: both rows get the same resampled tasks."""
    values = np.asarray(values, dtype=float)  # [n_tasks]
    if len(values) < 2:
        return [float(values.mean()), float(values.mean())] if len(values) else [0.0, 0.0]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(values), size=(n_boot, len(values)))  # [n_boot, n_tasks]
    means = values[idx].mean(axis=1)  # [n_boot]
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def sign_test(better, worse):
    """Exact two-sided sign test on the discordant tasks: p = min(1, 2 P(X <= min(b, w))), X ~ Bin(b + w, 1/2)."""
    n = better + worse
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(min(better, worse) + 1)) / 2 ** n)


def min_detectable(d):
    """Minimum detectable difference of a paired comparison over n tasks: the true mean difference a two-sided 5%
    test finds with 80% power, (z_0.975 + z_0.8) s_d / sqrt(n), s_d the spread of the measured per-task differences
    d (normal approximation; a planning figure: how small a difference this many tasks can resolve)."""
    d = np.asarray(d, dtype=float)
    return float((1.959964 + 0.841621) * d.std(ddof=1) / math.sqrt(len(d))) if len(d) > 1 else None


def fmt(split):
    """'pass@1 [lo, hi]' in %; '*' marks the exact (Clopper-Pearson) interval."""
    if split is None:
        return "n/a"
    lo, hi = split["ci95"]
    star = "*" if split.get("ci_method") == "exact" else ""
    return f"{100 * split['pass@1']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]{star}"
