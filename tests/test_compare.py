"""experiments/compare.py: the paired bootstrap and the sign test against independent computations, and the table across
runs (common ground, replicates, reference row) on hand-made RUN/eval/LABEL folders."""
import itertools
import json
import math
import random
import shutil

import numpy as np
import pytest

from conftest import episode, load_stage, run_stage

cmp = load_stage("experiments/compare.py")
BASE = "S0-T0-O0-C0-W0"
SPACE_IDS = ["S1-T1-O1-C1-W1", "S2-T2-O2-C2-W2", "S0-T1-O2-C0-W1"]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_bootstrap_interval_matches_an_independent_resampling():
    rng = np.random.default_rng(1)
    eps = [episode(f"t{i}", "S0-T0-O0-C0-W0", bool(rng.random() < 0.6)) for i in range(40)]
    lo, hi = cmp.bootstrap_ci([float(e["success"]) for e in eps], n_boot=2000, seed=3)  # one pair per task
    # independent: resample the 40 task outcomes with the same generator draws, plain python
    outcomes = [float(e["success"]) for e in eps]
    r = np.random.default_rng(3)
    idx = r.integers(0, 40, size=(2000, 40))
    means = sorted(sum(outcomes[j] for j in row) / 40 for row in idx)
    assert lo == pytest.approx(np.percentile(means, 2.5))
    assert hi == pytest.approx(np.percentile(means, 97.5))
    p = np.mean(outcomes)
    half = 1.96 * np.sqrt(p * (1 - p) / 40)  # the normal approximation lands close to the bootstrap
    assert abs((hi - lo) / 2 - half) < 0.03
    assert lo < p < hi

def exact_quantile(values, q):
    """q-quantile of the mean of len(values) draws with replacement, by enumerating every resample."""
    n = len(values)
    means = [sum(values[i] for i in draw) / n for draw in itertools.product(range(n), repeat=n)]
    atoms, counts = np.unique(np.round(means, 9), return_counts=True)
    cdf = np.cumsum(counts) / len(means)
    k = int(np.searchsorted(cdf, q))  # the first atom whose CDF reaches q
    return atoms[k], min(cdf[k] - q, q - (cdf[k - 1] if k else 0))  # the quantile, its distance to an atom's edge

def test_paired_bootstrap_matches_exact_enumeration():
    # 4 tasks, per-task difference row - reference: every one of the 4^4 = 256 resamples is equally likely
    row, ref = np.array([1.0, 0.5, 1.0, 0.0]), np.array([0.0, 0.5, 0.5, 1.0])
    d = list(row - ref)  # [1, 0, 0.5, -1]
    lo_exact, m_lo = exact_quantile(d, 0.025)
    hi_exact, m_hi = exact_quantile(d, 0.975)
    assert min(m_lo, m_hi) > 0.004  # the quantiles sit well inside an atom: sampling noise cannot move them
    lo, hi = cmp.bootstrap_ci(row - ref, n_boot=40000, seed=7)
    assert (lo, hi) == (pytest.approx(lo_exact), pytest.approx(hi_exact))
    assert lo < np.mean(d) < hi

def test_sign_test_against_enumeration():
    for b, w in ((3, 0), (5, 1), (6, 6), (0, 7), (10, 2)):
        n = b + w
        outcomes = list(itertools.product((0, 1), repeat=n))  # every better/worse pattern, equally likely under H0
        tail = sum(min(sum(o), n - sum(o)) <= min(b, w) for o in outcomes) / len(outcomes)
        assert cmp.sign_test(b, w) == pytest.approx(min(1.0, tail if b != w else 1.0))
    assert cmp.sign_test(0, 0) == 1.0 and cmp.sign_test(5, 0) == pytest.approx(0.0625)

def test_min_detectable_tasks_against_a_hand_computation():
    """The fewest discordant tasks, all one way, whose exact two-sided sign test reaches p <= 0.05, computed here
    with math.comb over every split of k discordant tasks (at least as extreme: min(better, worse) <= 0)."""
    def two_sided_p(k):  # all k one way: P(min(B, W) <= 0), B ~ Bin(k, 1/2)
        return min(1.0, sum(math.comb(k, i) for i in range(k + 1) if min(i, k - i) == 0) / 2 ** k)
    for n in range(1, 41):
        want = next((k for k in range(1, n + 1) if two_sided_p(k) <= 0.05), None)
        assert cmp.min_detectable_tasks(n) == want, n
    assert two_sided_p(5) == 0.0625 and two_sided_p(6) == 0.03125  # 5 all one way is not enough, 6 is
    assert cmp.min_detectable_tasks(8) == 6 and 6 / 8 == 0.75      # 8 framework tasks: 75 points
    assert cmp.min_detectable_tasks(120) == 6                      # 120 tasks: 5 points
    assert cmp.min_detectable_tasks(5) is None                     # 5 tasks all one way: p 0.0625


def write_inspace_evaldir(path, successes, train, families=None):
    """A RUN/eval/LABEL folder with an In-Space split only: successes {(task, harness): bool}, in that order (the
    order a float mean would add them in); families {task: family} recorded on the episodes when given."""
    rows = [episode(t, h, ok, **({"family": families[t]} if families else {})) for (t, h), ok in successes.items()]
    write_jsonl(path / "inspace.jsonl", rows)
    (path / "summary.json").write_text(json.dumps({
        "label": path.name, "train_ids": sorted(train), "splits": {"inspace": {}},
        "config": {"samples": 1, "temperature": 0.0, "max_turns": 6, "max_new_tokens": 128, "backend": "hf",
                   "dtype": None, "max_model_len": None}}))
    return path


def test_an_exact_tie_is_neither_better_nor_worse(tmp_path):
    """Seeds are averaged per pair, then harnesses per task. Task t0: the reference's 3 seeds solve its 4 harnesses
    2, 2, 1 and 1 times (2/3, 2/3, 1/3, 1/3: a task value of exactly 1/2, which a float mean makes
    0.49999999999999994); the other row solves 2 of 4 (1/2). A tie: neither better nor worse. Task t1 is a real
    win (0 against 1/4), so the row is better on 1 task, worse on none."""
    h = SPACE_IDS + ["S0-T0-O0-C1-W1"]
    solved_in = {0: {h[0], h[1], h[2], h[3]}, 1: {h[0], h[1]}, 2: set()}  # seed -> harnesses solved on t0
    refs = [write_inspace_evaldir(tmp_path / f"hs-s{s}" / "eval" / "hs",
                                  {**{("t0", x): x in solved_in[s] for x in h}, **{("t1", x): False for x in h}},
                                  train=(BASE,)) for s in range(3)]
    assert [sum(x in solved_in[s] for s in range(3)) for x in h] == [2, 2, 1, 1]  # times each harness is solved
    other = write_inspace_evaldir(tmp_path / "other" / "eval" / "other",
                                  {**{("t0", x): x in (h[0], h[3]) for x in h}, **{("t1", x): x == h[0] for x in h}},
                                  train=(BASE,))
    run_stage("experiments/compare.py", "hs=" + ",".join(map(str, refs)), f"other={other}", "--reference", "hs",
              "--out", tmp_path / "c")
    cell = json.loads((tmp_path / "c.json").read_text())["rows"][1]["splits"]["inspace"]
    assert (cell["better_tasks"], cell["worse_tasks"]) == (1, 0)
    assert cell["sign_test_p"] == 1.0 and cell["diff_vs_reference"] == pytest.approx((0 + 1 / 4) / 2)
    assert "(1 / 0, p 1)" in (tmp_path / "c.md").read_text()


def test_inspace_split_by_distance_to_each_rows_own_training_set_and_by_family(tmp_path):
    """Hand-computed: three evaluation harnesses A, B, C; the reference hs has two seeds with their own training
    sets (seed 0 trained on S1-T1-O1-C1-W1, seed 1 on S0-T0-O0-C0-W1), single trained on the base alone.
    Distances (components that differ to the nearest training harness):
        A = S0-T0-O0-C1-W1: single 2 (C, W), hs seed 0 3 (S, T, O), hs seed 1 1 (C)
        B = S2-T2-O1-C2-W1: single 5, hs seed 0 3 (S, T, C), hs seed 1 4 (S, T, O, C)
        C = S1-T1-O0-C1-W0: single 3 (S, T, C), hs seed 0 2 (O, W), hs seed 1 4 (S, T, C, W)
    Successes on tasks t0-t3 (families lookup, lookup, sum, sum): hs seed 0 solves C on t0 and t1, hs seed 1 solves
    A on every task, single solves A on t0 and C on t2 and t3; nothing else."""
    A, B, C = "S0-T0-O0-C1-W1", "S2-T2-O1-C2-W1", "S1-T1-O0-C1-W0"
    tasks, families = ["t0", "t1", "t2", "t3"], {"t0": "lookup", "t1": "lookup", "t2": "sum", "t3": "sum"}
    assert [cmp.hamming(A, x) for x in (BASE, "S1-T1-O1-C1-W1", "S0-T0-O0-C0-W1")] == [2, 3, 1]
    assert cmp.distance_to(B, ["X-pydantic-ai", BASE, "S0-T0-O0-C0-W1"]) == 4  # the nearest member in H
    solved = {"hs0": {("t0", C), ("t1", C)},
              "hs1": {(t, A) for t in tasks},
              "single": {("t0", A), ("t2", C), ("t3", C)}}
    train = {"hs0": ["S1-T1-O1-C1-W1"], "hs1": ["S0-T0-O0-C0-W1"], "single": [BASE]}
    dirs = {n: write_inspace_evaldir(tmp_path / n / "eval" / n, {(t, x): (t, x) in solved[n] for t in tasks
                                                                 for x in (A, B, C)}, train[n], families)
            for n in solved}
    run_stage("experiments/compare.py", f"hs={dirs['hs0']},{dirs['hs1']}", f"single={dirs['single']}", "--reference", "hs",
              "--out", tmp_path / "c")
    report = json.loads((tmp_path / "c.json").read_text())
    hs, single = report["rows"]
    assert hs["own_training_sets"] == [["S1-T1-O1-C1-W1"], ["S0-T0-O0-C0-W1"]]
    assert single["own_training_sets"] == [[BASE]]
    # by distance: pass@1 over the (task, seed, harness) pairs at d, and the harnesses there
    got = {r["name"]: {c["distance"]: (c["pass@1"], c["harness_ids"], c["pairs"]) for c in r["inspace_by_distance"]}
           for r in (hs, single)}
    assert got["hs"] == {1: (1.0, [A], 4),          # seed 1's A: solved on all 4 tasks
                         2: (0.5, [C], 4),          # seed 0's C: t0, t1
                         3: (0.0, [A, B], 8),       # seed 0's A and B
                         4: (0.0, sorted([B, C]), 8)}  # seed 1's B and C
    assert got["single"] == {2: (0.25, [A], 4), 3: (0.5, [C], 4), 5: (0.0, [B], 4)}
    # by family, paired with hs: per-task values (mean over A, B, C of the seeds' mean)
    #   hs:     t0 (1/2 + 0 + 1/2) / 3 = 1/3, t1 1/3, t2 (1/2 + 0 + 0) / 3 = 1/6, t3 1/6
    #   single: t0 1/3, t1 0, t2 1/3, t3 1/3
    fam = {c["family"]: c for c in single["inspace_by_family"]}
    assert fam["lookup"]["pass@1"] == pytest.approx(1 / 6) and fam["sum"]["pass@1"] == pytest.approx(1 / 3)
    assert (fam["lookup"]["better_tasks"], fam["lookup"]["worse_tasks"]) == (0, 1)  # t0 ties exactly
    assert fam["lookup"]["diff_vs_reference"] == pytest.approx((0 - 1 / 3) / 2)
    assert (fam["sum"]["better_tasks"], fam["sum"]["worse_tasks"]) == (2, 0)
    assert fam["sum"]["diff_vs_reference"] == pytest.approx(1 / 6) and fam["sum"]["tasks"] == 2
    assert [(c["family"], c["pass@1"]) for c in hs["inspace_by_family"]] == [("lookup", pytest.approx(1 / 3)),
                                                                           ("sum", pytest.approx(1 / 6))]
    md = (tmp_path / "c.md").read_text()
    assert "## In-Space by Hamming distance to each row's own training set" in md
    assert "| policy | training harnesses in H | d = 1 | d = 2 | d = 3 | d = 4 | d = 5 |" in md
    assert "| hs (2 replicates) | 1 (a set per seed) | 100.0 [" in md and "| single | 1 | - | 25.0 [" in md
    assert "## In-Space by task family" in md and "Tasks: lookup 2, sum 2." in md
    assert "| policy | lookup | Δ vs hs | sum | Δ vs hs |" in md and "(0 / 1, p 1)" in md and "(2 / 0, p 0.5)" in md


FRAMEWORKS = {"smolagents-native": ("X-smolagents-native", "smolagents 9.9.9 (native tool calls)"),
              "pydantic-ai": ("X-pydantic-ai", "pydantic-ai 8.8.8")}


def make_evaldir(root, run, label, tasks="abcd", inspace=SPACE_IDS[:2], external=("X-shell", "X-react"),
                 train=(BASE,), temperature=0.0, seed=0, frameworks=(), **engine):
    """A RUN/eval/LABEL folder as 06 leaves it: summary.json (config, train_ids, splits) and the split files;
    success drawn from a seeded generator so rows differ. frameworks: framework columns (FRAMEWORKS) too."""
    d = root / run / "eval" / label
    rng = random.Random(f"{run}/{label}/{seed}")
    split_ids = {"base": [BASE], "inspace": list(inspace), "external": list(external),
                 **{f: [FRAMEWORKS[f][0]] for f in frameworks}}
    for split, ids in split_ids.items():
        write_jsonl(d / f"{split}.jsonl", [episode(t, h, rng.random() < 0.5) for t in tasks for h in ids])
    summary = {"label": label, "policy": f"{run}/policy", "train_ids": sorted(train), "heldout_ids": list(inspace),
               "splits": {s: {"framework": FRAMEWORKS[s][1]} if s in FRAMEWORKS else {} for s in split_ids},
               "config": {"samples": 1, "temperature": temperature, "max_turns": 6, "max_new_tokens": 128,
                          "backend": "hf", "dtype": None, "max_model_len": None, **engine}}
    (d / "summary.json").write_text(json.dumps(summary))
    return d

def read_split(d, split):
    return [json.loads(x) for x in (d / f"{split}.jsonl").read_text().splitlines()]

def per_task_values(dirs, split, skip=()):
    """Independent per-task pass@1: mean over the task's episodes, then over replicates (plain python)."""
    out = {}
    for d in dirs:
        for t in sorted({e["task_id"] for e in read_split(d, split)}):
            v = [float(e["success"]) for e in read_split(d, split) if e["task_id"] == t and e["harness_id"] not in skip]
            out.setdefault(t, []).append(sum(v) / len(v))
    return {t: sum(v) / len(v) for t, v in out.items()}

def test_compare_paired_differences_replicates_and_reference(tmp_path):
    tasks = [f"t{i}" for i in range(12)]
    ref = make_evaldir(tmp_path, "base", "final", tasks=tasks)
    reps = [make_evaldir(tmp_path, f"oa-s{s}", "final", tasks=tasks, train=(BASE, "X-react"), seed=s)
            for s in range(2)]
    out = tmp_path / "cmp"
    proc = run_stage("experiments/compare.py", f"oa={reps[0]},{reps[1]}", ref, "--reference", "base/final",
                     "--out", out, "--bootstrap", 500, "--seed", 4)
    report = json.loads((out.with_suffix(".json")).read_text())
    assert report["reference"] == "base/final" and [r["name"] for r in report["rows"]] == ["oa", "base/final"]
    assert report["common_ground"]["splits"]["external"]["harness_ids"] == ["X-shell"]  # X-react trained by oa
    assert report["rows"][0]["evaldirs"] == [str(r) for r in reps] and report["rows"][0]["task_ids"] == sorted(tasks)
    for split in ("base", "inspace", "external"):
        skip = ("X-react",) if split == "external" else ()
        a, b = per_task_values(reps, split, skip), per_task_values([ref], split, skip)
        d = [a[t] - b[t] for t in sorted(tasks)]
        # the same interval, computed independently: the same generator draws, a plain loop over resampled tasks
        idx = np.random.default_rng(4).integers(0, len(d), size=(500, len(d)))
        means = [sum(d[j] for j in row) / len(d) for row in idx]
        cell = report["rows"][0]["splits"][split]
        assert cell["diff_vs_reference"] == pytest.approx(sum(d) / len(d))
        assert cell["diff_ci95"] == pytest.approx([np.percentile(means, 2.5), np.percentile(means, 97.5)])
        assert cell["better_tasks"] == sum(x > 0 for x in d) and cell["worse_tasks"] == sum(x < 0 for x in d)
        assert cell["pass@1"] == pytest.approx(sum(a.values()) / len(a))
        # minimum detectable difference of the column: 6 of its 12 tasks all one way (2 / 2^6 <= 0.05 < 2 / 2^5)
        column = report["common_ground"]["splits"][split]
        assert column["min_detectable_tasks"] == 6 and column["min_detectable"] == pytest.approx(6 / 12)
        assert report["rows"][1]["splits"][split]["diff_vs_reference"] is None
    md = out.with_suffix(".md").read_text()
    assert "| policy | Base | Δ vs base/final |" in md and "| base/final | " in md and "reference" in md
    assert "Minimum detectable difference in points, per column" in md and "In-Space 50.0 (6 of 12 tasks)" in md
    assert md in proc.stdout + "\n" and "Common ground: Base 12 tasks x 1 harness(es); In-Space 12 tasks x 2" in md
    bad = run_stage("experiments/compare.py", ref, "--reference", "nope", check=False)
    assert bad.returncode != 0 and "--reference 'nope': no such row" in bad.stderr

@pytest.mark.parametrize("change, message", [
    (dict(inspace=[SPACE_IDS[0], SPACE_IDS[2]]),
     f"In-Space harness ids differ: row base/final has {SPACE_IDS[1]}, row other/final does not"),
    (dict(tasks="abce"), "Base tasks differ: row base/final has d, row other/final does not"),
    (dict(temperature=1.0), "temperature differs: row base/final has 0.0, row other/final has 1.0"),
    (dict(backend="vllm"), "backend differs: row base/final has hf, row other/final has vllm"),
    (dict(dtype="bfloat16"), "dtype differs: row base/final has None, row other/final has bfloat16"),
    (dict(max_model_len=2048), "max_model_len differs: row base/final has None, row other/final has 2048"),
])
def test_compare_refuses_rows_off_common_ground(tmp_path, change, message):
    ref = make_evaldir(tmp_path, "base", "final")
    other = make_evaldir(tmp_path, "other", "final", **change)
    proc = run_stage("experiments/compare.py", ref, other, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    reps = run_stage("experiments/compare.py", f"m={ref},{other}", check=False)  # replicates: same set too
    assert reps.returncode != 0 and "replicates must share one evaluation set" in reps.stderr

def test_compare_leaves_out_a_split_some_row_lacks(tmp_path):
    ref = make_evaldir(tmp_path, "base", "final")
    other = make_evaldir(tmp_path, "other", "final")
    (other / "summary.json").write_text(json.dumps({**json.loads((other / "summary.json").read_text()),
                                                    "splits": {"base": {}, "inspace": {}}}))
    proc = run_stage("experiments/compare.py", ref, other, "--out", tmp_path / "c")
    assert "Unseen syntax left out of the table" in proc.stdout
    assert set(json.loads((tmp_path / "c.json").read_text())["common_ground"]["splits"]) == {"base", "inspace"}

def test_compare_framework_columns_and_the_trained_in_mark(tmp_path):
    """The framework columns, titled by framework and version, paired like the others; a row that trained inside
    pydantic-ai (X-pydantic-ai in its train_ids) keeps its pairs there, marked trained in, and takes nothing out of
    any other row or column (the unseen-syntax column leaves out only external harnesses trained in)."""
    tasks = [f"t{i}" for i in range(8)]
    fw = ("smolagents-native", "pydantic-ai")
    ref = make_evaldir(tmp_path, "hs", "final", tasks=tasks, frameworks=fw)
    bb = make_evaldir(tmp_path, "bb", "final", tasks=tasks, frameworks=fw, train=(BASE, "X-pydantic-ai"), seed=1)
    proc = run_stage("experiments/compare.py", ref, bb, "--out", tmp_path / "c")
    report = json.loads((tmp_path / "c.json").read_text())
    assert list(report["common_ground"]["splits"]) == ["base", "inspace", "smolagents-native", "pydantic-ai",
                                                       "external"]
    assert report["common_ground"]["splits"]["pydantic-ai"]["harness_ids"] == ["X-pydantic-ai"]
    assert report["common_ground"]["excluded_external"] == []
    rows = {r["name"]: r["splits"] for r in report["rows"]}
    assert [s for s, x in rows["bb/final"].items() if x["trained_in"]] == ["pydantic-ai"]
    assert not any(x["trained_in"] for x in rows["hs/final"].values())
    for split in fw:
        a, b = per_task_values([bb], split), per_task_values([ref], split)
        assert rows["bb/final"][split]["pairs"] == 8
        assert rows["bb/final"][split]["diff_vs_reference"] == pytest.approx(sum(a[t] - b[t] for t in tasks) / 8)
    md = (tmp_path / "c.md").read_text()
    assert ("| policy | Base | Δ vs hs/final | In-Space | Δ vs hs/final | smolagents 9.9.9 native | Δ vs hs/final | "
            "pydantic-ai 8.8.8 | Δ vs hs/final | Unseen syntax: X-react, X-shell | Δ vs hs/final |") in md
    assert md.count(" (trained in) |") == 1 and "not a transfer figure" in md and md in proc.stdout + "\n"
    assert "smolagents native 8 tasks x 1 harness(es); pydantic-ai 8 tasks x 1 harness(es)" in md


def test_compare_identical_rows_and_the_sign_test(tmp_path):
    """Two rows with the same per-task values say 'identical', never a zero-width interval; a row that differs gets
    the exact sign test on its discordant tasks, in the JSON and the table."""
    tasks = [f"t{i}" for i in range(10)]
    ref = make_evaldir(tmp_path, "base", "final", tasks=tasks)
    same = tmp_path / "copy" / "eval" / "final"
    shutil.copytree(ref, same)
    other = make_evaldir(tmp_path, "other", "final", tasks=tasks, seed=3)
    run_stage("experiments/compare.py", ref, same, other, "--out", tmp_path / "c")
    report = json.loads((tmp_path / "c.json").read_text())
    cell = report["rows"][1]["splits"]["base"]
    assert cell["identical"] is True and cell["diff_ci95"] is None and cell["sign_test_p"] == 1.0
    assert cell["better_tasks"] == cell["worse_tasks"] == 0
    md = (tmp_path / "c.md").read_text()
    assert "identical on all 10 tasks" in md and "+0.0 [+0.0, +0.0]" not in md
    for split, x in report["rows"][2]["splits"].items():
        b, w = x["better_tasks"], x["worse_tasks"]
        assert x["sign_test_p"] == pytest.approx(cmp.sign_test(b, w)) and (b + w == 0) == x["identical"]
    assert any(not x["identical"] for x in report["rows"][2]["splits"].values())
    assert ", p " in md


def test_compare_refuses_a_summary_an_older_06_wrote(tmp_path):
    """No reading of older summary formats: a summary without train_ids or without a setting every row must share
    is refused, naming the file and the field, and nothing is written."""
    ref = make_evaldir(tmp_path, "base", "final")
    other = make_evaldir(tmp_path, "other", "final")
    summary = json.loads((other / "summary.json").read_text())
    for field, broken in (("train_ids", {k: v for k, v in summary.items() if k != "train_ids"}),
                          ("config.dtype", {**summary, "config": {k: v for k, v in summary["config"].items()
                                                                  if k != "dtype"}})):
        (other / "summary.json").write_text(json.dumps(broken))
        proc = run_stage("experiments/compare.py", ref, other, "--out", tmp_path / "c", check=False)
        assert proc.returncode == 2 and f"{other / 'summary.json'}: field '{field}' is missing" in proc.stderr
        assert not (tmp_path / "c.md").exists() and not (tmp_path / "c.json").exists()


def test_compare_experiment_adds_what_each_method_spent(tmp_path):
    """--experiment EXP: the compute table (counted here by hand from the run folders) and the experiment's settings
    (its config less the method list, plus its evaluation set) join the table, in the one file; a method that
    never trained (no training log) reads 'not run', not a row of zeros."""
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "experiment_config.json").write_text(json.dumps({"seed": 0, "seeds": [0], "experiment": "mini",
                                                            "methods": ["oa", "sft", "idle", "bbrl"]}))
    oa, sft = exp / "oa", exp / "sft"
    write_jsonl(oa / "train_harnesses.jsonl", [{"harness_id": h} for h in [BASE, *SPACE_IDS]])
    write_jsonl(oa / "assignment.jsonl", [{"task_id": "a", "harness_ids": [BASE, SPACE_IDS[0]]},
                                          {"task_id": "b", "harness_ids": [SPACE_IDS[1], SPACE_IDS[2]]}])
    write_jsonl(oa / "iter_000" / "rollouts.jsonl", [episode("a", BASE, True), episode("b", SPACE_IDS[1], False)])
    write_jsonl(oa / "iter_001" / "rollouts.jsonl", [episode("a", SPACE_IDS[0], True)] * 2)
    write_jsonl(oa / "iter_000" / "train_log.jsonl", [{"loss": 1.0}, {"loss": 0.5, "optimizer_step": False}])
    (oa / "step_times.json").write_text(json.dumps({"01": 1.0, "04-it0": 2.5, "05-it0": 3.0, "06-oa": 4.25}))
    write_jsonl(sft / "assignment.jsonl", [{"task_id": "a", "harness_ids": ["X-shell"]}])
    write_jsonl(sft / "train_harnesses.jsonl", [{"harness_id": "X-shell"}])
    write_jsonl(sft / "sft" / "demos.jsonl", [episode("a", "X-shell", True)] * 3)
    write_jsonl(sft / "sft" / "train_log.jsonl", [{"loss": 2.0}] * 2)
    write_jsonl(exp / "idle" / "assignment.jsonl", [{"task_id": "a", "harness_ids": [BASE]}])  # prepared, not trained
    write_jsonl(exp / "idle" / "train_harnesses.jsonl", [{"harness_id": BASE}])
    bb = exp / "bbrl"  # black-box RL inside a framework: rollouts and a training set (02), no assignment (03)
    write_jsonl(bb / "train_harnesses.jsonl", [{"harness_id": BASE}, {"harness_id": SPACE_IDS[0]}])
    write_jsonl(bb / "iter_000" / "rollouts.jsonl", [episode(t, "X-pydantic-ai", t == "a") for t in "abc"])
    write_jsonl(bb / "iter_000" / "train_log.jsonl", [{"loss": 1.0}])
    rows = [make_evaldir(tmp_path, "exp/oa", "oa"), make_evaldir(tmp_path, "exp/sft", "sft")]
    proc = run_stage("experiments/compare.py", *rows, "--experiment", exp, "--out", exp / "comparison")
    report = json.loads((exp / "comparison.json").read_text())
    assert list(report) == ["reference", "common_ground", "rows", "compute", "settings"]
    assert report["compute"] == {
        "oa (seed 0)": {"rollout_episodes": 4, "minibatches": 2, "optimizer_steps": 1, "sft_demos": 0,
                        "train_s": 5.5, "eval_s": 4.2, "curve_s": 0, "tasks_trained": 2, "tasks_saw_all_K": 1,
                        "training_harnesses": sorted([BASE, SPACE_IDS[0], SPACE_IDS[1]])},
        "sft (seed 0)": {"rollout_episodes": 0, "minibatches": 2, "optimizer_steps": 2, "sft_demos": 3,
                         "train_s": 0, "eval_s": 0, "curve_s": 0, "tasks_trained": 0, "tasks_saw_all_K": 0,
                         "training_harnesses": ["X-shell"]},
        "idle (seed 0)": {"rollout_episodes": 0, "minibatches": 0, "optimizer_steps": 0, "sft_demos": 0,
                          "train_s": 0, "eval_s": 0, "curve_s": 0, "tasks_trained": 0, "tasks_saw_all_K": 0,
                          "training_harnesses": [BASE]},
        "bbrl (seed 0)": {"rollout_episodes": 3, "minibatches": 1, "optimizer_steps": 1, "sft_demos": 0,
                          "train_s": 0, "eval_s": 0, "curve_s": 0, "tasks_trained": 3, "tasks_saw_all_K": None,
                          "training_harnesses": ["X-pydantic-ai"]}}
    assert report["settings"] == {"seed": 0, "seeds": [0], "experiment": "mini",
                                  "eval_harnesses": str(exp.resolve() / "eval_harnesses.jsonl")}
    md = (exp / "comparison.md").read_text()
    assert md.endswith("\n## Compute per method\n\n| method | rollout episodes | minibatches | optimizer steps (with "
                       "signal) | SFT demos | train s | eval s | tasks that saw all K |\n| --- | --- | --- | --- | --- "
                       "| --- | --- | --- |\n| oa (seed 0) | 4 | 2 | 1 | 0 | 5.5 | 4.2 | 1 / 2 |\n"
                       "| sft (seed 0) | 0 | 2 | 2 | 3 | 0 | 0 | 0 / 0 |\n"
                       "| idle (seed 0) | no update (not run, or a policy before RL) | - | - | - | - | - | - |\n"
                       "| bbrl (seed 0) | 3 | 1 | 1 | 0 | 0 | 0 | - |\n")
    assert md in proc.stdout + "\n"
