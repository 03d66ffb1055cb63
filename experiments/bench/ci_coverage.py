"""Coverage of the pass@1 interval of 06 and experiments/compare.py (intervals.pass1_ci) by simulation, against the
percentile bootstrap it replaced.

    python experiments/bench/ci_coverage.py                      # 2000 replicates per cell, ~3 min on 2 cores
    python experiments/bench/ci_coverage.py --reps 500 --out results/ci_coverage.md

Model: n tasks, each with its own success rate q_i ~ Beta(mean p, intra-task correlation icc) (tasks differ in
difficulty; icc = 0: every task has rate p), then m Bernoulli(q_i) pairs per task (m = 1: one pair, the 0/1 case;
m = 4 or 6: a task's value is a mean over harnesses, as In-Space). The true pass@1 is p. Coverage = share of
replicates whose 95% interval contains p (nominal 0.95); a good method is at or above it, and not far above.
"""
import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, where common/intervals.py is
from common.intervals import bootstrap_ci, clopper_pearson, pass1_ci  # noqa: E402


def simulate(n, m, p, icc, reps, rng):
    """[reps, n] task values."""
    if icc > 0:
        conc = (1 - icc) / icc  # Beta(a, b) with a + b = conc has correlation 1 / (1 + conc) between two pairs
        q = rng.beta(p * conc, (1 - p) * conc, size=(reps, n))
    else:
        q = np.full((reps, n), p)
    return rng.binomial(m, q) / m


def old_interval(v, n_boot, seed):
    """The interval before: percentile bootstrap, Clopper-Pearson only at all-0 / all-1."""
    if np.all(v == 0) or np.all(v == 1):
        return clopper_pearson(int(v.sum()), len(v))
    return bootstrap_ci(v, n_boot, seed)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=2000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="also write the table to this markdown file")
    args = ap.parse_args()
    rng, t0 = np.random.default_rng(args.seed), time.time()
    lines = ["| tasks n | pairs per task m | icc | true p | pass1_ci coverage | mean width | "
             "old bootstrap coverage | mean width |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for n in (24, 40):
        for m, icc in ((1, 0.0), (4, 0.3), (6, 0.3), (6, 0.0)):
            for p in (0.02, 0.05, 0.10, 0.20):
                values = simulate(n, m, p, icc, args.reps, rng)
                new = np.array([pass1_ci(v, 0, 0)[0] for v in values])  # [reps, 2]
                old = np.array([old_interval(v, 500, i) for i, v in enumerate(values)])
                cov = lambda iv: float(np.mean((iv[:, 0] <= p) & (p <= iv[:, 1])))
                width = lambda iv: float(np.mean(iv[:, 1] - iv[:, 0]))
                lines.append(f"| {n} | {m} | {icc} | {p:.2f} | {cov(new):.3f} | {width(new):.3f} | "
                             f"{cov(old):.3f} | {width(old):.3f} |")
                print(lines[-1], flush=True)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    head = (f"Coverage of 95% pass@1 intervals, {args.reps} replicates per row (seed {args.seed}).\n"
            f"Command: `python experiments/bench/ci_coverage.py --reps {args.reps} --out {args.out}`; commit {commit}; machine "
            f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}; wall "
            f"{time.time() - t0:.0f} s.\n\n")
    if args.out:
        Path(args.out).write_text(head + "\n".join(lines) + "\n")
        print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
