"""compare.py: the paired bootstrap and the sign test against independent computations, and the table across runs
(common ground, replicates, reference row) on hand-made RUN/eval/LABEL folders."""
import itertools
import json
import random
import shutil

import numpy as np
import pytest

from conftest import load_stage, run_stage

cmp = load_stage("compare.py")
BASE = "S0-T0-O0-C0-W0"
SPACE_IDS = ["S1-T1-O1-C1-W1", "S2-T2-O2-C2-W2", "S0-T1-O2-C0-W1"]


def episode(task, harness, success, **kw):
    e = dict(task_id=task, harness_id=harness, success=success, reward=float(success), turns=2,
             parse_errors=0, tool_errors=0, workflow_violations=0, finish_reason="submitted")
    e.update(kw)
    return e


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
    proc = run_stage("compare.py", f"oa={reps[0]},{reps[1]}", ref, "--reference", "base/final",
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
        # minimum detectable difference: (z_0.975 + z_0.8) x sample sd of d / sqrt(n), with statistics' quantiles
        from statistics import NormalDist, stdev
        z = NormalDist().inv_cdf(0.975) + NormalDist().inv_cdf(0.8)
        assert cell["mdd80"] == pytest.approx(z * stdev(d) / len(d) ** 0.5, rel=1e-5)
        assert report["rows"][1]["splits"][split]["diff_vs_reference"] is None
    md = out.with_suffix(".md").read_text()
    assert "| policy | Base | Δ vs base/final |" in md and "| base/final | " in md and "reference" in md
    assert "Minimum detectable difference to the reference in points" in md and "In-Space: oa " in md
    assert md in proc.stdout + "\n" and "Common ground: Base 12 tasks x 1 harness(es); In-Space 12 tasks x 2" in md
    bad = run_stage("compare.py", ref, "--reference", "nope", check=False)
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
    proc = run_stage("compare.py", ref, other, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    reps = run_stage("compare.py", f"m={ref},{other}", check=False)  # replicates: same set too
    assert reps.returncode != 0 and "replicates must share one evaluation set" in reps.stderr

def test_compare_leaves_out_a_split_some_row_lacks(tmp_path):
    ref = make_evaldir(tmp_path, "base", "final")
    other = make_evaldir(tmp_path, "other", "final")
    (other / "summary.json").write_text(json.dumps({**json.loads((other / "summary.json").read_text()),
                                                    "splits": {"base": {}, "inspace": {}}}))
    proc = run_stage("compare.py", ref, other, "--out", tmp_path / "c")
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
    proc = run_stage("compare.py", ref, bb, "--out", tmp_path / "c")
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


def test_compare_reads_the_columns_06_writes():
    ev = load_stage("06_evaluate.py")
    assert cmp.SPLITS == ev.SPLITS and cmp.FRAMEWORKS == ev.FRAMEWORKS and cmp.SPLIT_TITLES == ev.SPLIT_TITLES


def test_compare_identical_rows_and_the_sign_test(tmp_path):
    """Two rows with the same per-task values say 'identical', never a zero-width interval; a row that differs gets
    the exact sign test on its discordant tasks, in the JSON and the table."""
    tasks = [f"t{i}" for i in range(10)]
    ref = make_evaldir(tmp_path, "base", "final", tasks=tasks)
    same = tmp_path / "copy" / "eval" / "final"
    shutil.copytree(ref, same)
    other = make_evaldir(tmp_path, "other", "final", tasks=tasks, seed=3)
    run_stage("compare.py", ref, same, other, "--out", tmp_path / "c")
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
        proc = run_stage("compare.py", ref, other, "--out", tmp_path / "c", check=False)
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
    proc = run_stage("compare.py", *rows, "--experiment", exp, "--out", exp / "comparison")
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
