"""Stage 06: scoring maths against hand computations, and the CLI on synthetic rollout files."""
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import ROOT, episode, load_stage, run_stage

ev = load_stage("06_evaluate.py")
ER = load_stage("common/eval_rollouts.py")  # 06's rollouts (made by 04, reused when the same checkpoint made them)
stats = load_stage("common/intervals.py")  # the interval statistics 06 imports
BASE = "S0-T0-O0-C0-W0"
SPACE_IDS = ["S1-T1-O1-C1-W1", "S2-T2-O2-C2-W2", "S0-T1-O2-C0-W1"]


def test_pass_at_1_averages_pairs_then_samples():
    # pair (a, h1): 2 samples, 1 success -> 0.5; pair (a, h2): 1/1 -> 1; pair (b, h1): 0/1 -> 0
    eps = [episode("a", "S0-T0-O0-C0-W0", True), episode("a", "S0-T0-O0-C0-W0", False),
           episode("a", "S1-T0-O0-C0-W0", True), episode("b", "S0-T0-O0-C0-W0", False)]
    s = ev.score_split(eps, n_boot=200, seed=0)
    assert s["pass@1"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert s["pairs"] == 3 and s["tasks"] == 2 and s["ci_method"] == "korn-graubard"  # task a: 0.75
    assert s["per_harness"] == {"S0-T0-O0-C0-W0": pytest.approx(0.25), "S1-T0-O0-C0-W0": 1.0}


def binom_cdf(k, n, p):
    """P(Binomial(n, p) <= k), summed term by term (the independent computation)."""
    return sum(math.comb(n, i) * p ** i * (1 - p) ** (n - i) for i in range(k + 1))


def test_clopper_pearson_at_every_count():
    """Where each task scores 0 or 1, pass1_ci is Clopper-Pearson at every count: its bounds solve
    P(X >= k | lo) = 2.5% and P(X <= k | hi) = 2.5%, the upper bound rises with k, and it covers at least as far
    as Clopper-Pearson (the percentile bootstrap it replaced gave 1/40 -> [0, 7.5%], under-covering)."""
    for n in (24, 40):
        uppers = []
        for k in range(0, 8):
            (lo, hi), method = ev.pass1_ci([1.0] * k + [0.0] * (n - k), 1000, 0)
            assert method == "exact"
            assert hi == pytest.approx(next(p for p in np.linspace(0, 1, 200001) if binom_cdf(k, n, p) <= 0.025),
                                       abs=1e-5)
            if k:
                assert 1 - binom_cdf(k - 1, n, lo) == pytest.approx(0.025, abs=1e-6)
            else:
                assert lo == 0
            uppers.append(hi)
        assert all(a < b for a, b in zip(uppers, uppers[1:]))
    assert ev.pass1_ci([1.0] + [0.0] * 39, 1000, 0)[0] == pytest.approx([0.00063, 0.1316], abs=1e-4)
    assert ev.pass1_ci([1.0] * 2 + [0.0] * 38, 1000, 0)[0] == pytest.approx([0.0061, 0.1692], abs=1e-4)
    assert ev.pass1_ci([1.0] * 40, 1000, 0)[0] == pytest.approx([1 - 0.0881, 1], abs=1e-4)
    # the incomplete beta behind it, against the binomial tail: I_p(k, n - k + 1) = P(X >= k)
    for k, n, p in ((3, 10, 0.2), (1, 40, 0.01), (7, 18, 0.5), (20, 24, 0.9)):
        assert stats.betainc(k, n - k + 1, p) == pytest.approx(1 - binom_cdf(k - 1, n, p), abs=1e-12)
    none = ev.score_split([episode(f"t{i}", BASE, False) for i in range(40)], 500, 0)
    assert none["ci_method"] == "exact" and none["ci95"] == pytest.approx([0, 0.0881], abs=1e-4)
    every = ev.score_split([episode(f"t{i}", h, True) for i in range(40) for h in SPACE_IDS], 500, 0)
    assert every["ci_method"] == "exact" and every["ci95"][0] == pytest.approx(0.9119, abs=1e-4)  # n = 40 tasks
    one = ev.score_split([episode(f"t{i}", BASE, i == 0) for i in range(40)], 500, 0)
    assert one["ci_method"] == "exact" and one["ci95"] == pytest.approx([0.00063, 0.1316], abs=1e-4)


def test_korn_graubard_interval_by_hand_and_its_coverage():
    """Task values that are means over m = 4 harnesses: Clopper-Pearson on n_eff = p(1-p)/Var x (z/t_{n-1})^2
    trials, Var = s^2 / n, at most n m. Coverage by simulation (24 tasks x 4 harnesses, tasks of different
    difficulty): at least 0.93 where the percentile bootstrap gave 0.89."""
    v = np.array([0.25, 0.5, 0.0, 0.0, 0.75, 0.0, 0.25, 0.0])
    p, var = v.mean(), v.var(ddof=1) / len(v)
    n_eff = p * (1 - p) / var * (1.959964 / 2.364624) ** 2  # t_{7, 0.975} = 2.364624
    (lo, hi), method = ev.pass1_ci(v, 1000, 0)
    assert method == "korn-graubard" and stats.trials_per_task(v) == 4
    assert [lo, hi] == pytest.approx(stats.clopper_pearson(p * n_eff, n_eff), abs=1e-4)
    # no spread: the cap n m, with m = 2 read off the values (halves; the smallest m, so the wider interval)
    assert ev.pass1_ci(np.full(24, 0.5), 1000, 0)[0] == pytest.approx(stats.clopper_pearson(24, 48), abs=1e-4)
    rng = np.random.default_rng(0)
    for p_true in (0.05, 0.2):
        q = rng.beta(p_true * 7 / 3, (1 - p_true) * 7 / 3, size=(400, 24))  # intra-task correlation 0.3
        values = rng.binomial(4, q) / 4
        ivs = np.array([ev.pass1_ci(x, 0, 0)[0] for x in values])
        assert np.mean((ivs[:, 0] <= p_true) & (p_true <= ivs[:, 1])) >= 0.93


def test_behaviour_compliance_and_recovery_hand_counted():
    eps = [
        # 4 turns; errors at 1 and 3 (3 < 4: both count); turn 2 has a valid call, turn 4 not -> 1 of 2 recovered
        episode("a", BASE, True, turns=4, parse_errors=1, tool_errors=1, workflow_checks=3, workflow_violations=1,
                error_turns=[1, 3], valid_call_turns=[2]),
        # 3 turns; error at 2 recovered at 3; error at 3 is the last turn: not counted
        episode("b", BASE, False, turns=3, tool_errors=2, workflow_checks=2, workflow_violations=0,
                error_turns=[2, 3], valid_call_turns=[1, 3], finish_reason="turn_budget"),
        # no workflow checks (W0): left out of compliance; no errors
        episode("c", BASE, True, turns=1, workflow_checks=0, error_turns=[], valid_call_turns=[1]),
    ]
    b = ev.behaviour(eps)
    assert b["workflow_checks"] == 5
    assert b["workflow_compliance"] == pytest.approx(1 - 1 / 5)
    assert b["recoverable_errors"] == 3 and b["recovery_rate"] == pytest.approx(2 / 3)
    assert b["episodes_with_error"] == pytest.approx(2 / 3)
    assert b["parse_error_rate"] == pytest.approx(1 / 8)
    assert b["mean_turns"] == pytest.approx(8 / 3) and b["submitted"] == pytest.approx(2 / 3)
    # old rollout files (no workflow_checks / error_turns / valid_call_turns): n/a, never a crash
    old = ev.behaviour([episode("a", BASE, True, workflow_violations=1), episode("b", BASE, False, parse_errors=1)])
    assert old["workflow_compliance"] is None and old["workflow_checks"] is None
    assert old["recovery_rate"] is None and old["recoverable_errors"] is None
    assert old["episodes_with_error"] == 0.5
    mixed = ev.behaviour([eps[0], episode("z", BASE, True)])  # one record lacks the fields: n/a
    assert mixed["workflow_compliance"] is None and mixed["recovery_rate"] is None


def test_per_component_counts_and_wilson_interval():
    eps = [episode("a", "S0-T1-O0-C0-W0", True), episode("b", "S0-T1-O0-C0-W0", False),
           episode("a", "S1-T0-O0-C0-W1", True), episode("a", "S1-T0-O0-C0-W1", False),  # one pair, 2 samples
           episode("b", "S1-T1-O0-C0-W1", True), episode("d", "X-shell", False)]
    comp = ev.per_component(eps)  # X-shell is out of space: ignored
    assert {k: (v["k"], v["n"]) for k, v in comp["T"].items()} == {"T0": (0.5, 1), "T1": (2, 3)}
    assert {k: (v["k"], v["n"]) for k, v in comp["S"].items()} == {"S0": (1, 2), "S1": (1.5, 2)}
    assert comp["W"]["W1"]["pass@1"] == pytest.approx(0.75)
    # Wilson at 2/3, z = 1.96, by hand: centre (2/3 + z^2/6) / (1 + z^2/3), half z sqrt(2/27 + z^2/36) / (1 + z^2/3)
    z = 1.96
    centre, half = (2 / 3 + z * z / 6) / (1 + z * z / 3), z * np.sqrt(2 / 27 + z * z / 36) / (1 + z * z / 3)
    assert comp["T"]["T1"]["ci95"] == pytest.approx([centre - half, centre + half])
    assert ev.wilson(0, 10)[0] == 0 and ev.wilson(10, 10)[1] == 1


# ----------------------------------------------------------------------------- CLI on hand-made rollout files
def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_run(tmp_path, name="run", label="mine", train=(BASE,)):
    run = tmp_path / name
    write_jsonl(run / "train_harnesses.jsonl", [{"harness_id": h} for h in train])
    write_jsonl(run / "heldout_harnesses.jsonl", [{"harness_id": h} for h in SPACE_IDS])
    write_jsonl(run / "iter_000" / "rollouts.jsonl", [episode("a", BASE, False), episode("b", BASE, True)])
    write_jsonl(tmp_path / "tasks.jsonl", [{"task_id": t} for t in "abcd"])
    out = run / "eval" / label
    write_jsonl(out / "base.jsonl", [episode(t, BASE, t != "c") for t in "abcd"])
    write_jsonl(out / "inspace.jsonl", [episode(t, h, h == SPACE_IDS[0]) for t in "abcd" for h in SPACE_IDS])
    write_jsonl(out / "external.jsonl", [episode(t, h, t == "a" and h == "X-shell") for t in "abcd"
                                         for h in ("X-shell", "X-react")])
    write_jsonl(out / "smolagents.jsonl", [episode(t, "X-smolagents", t in "ab", framework="smolagents 9.9.9")
                                           for t in "abcd"])
    write_jsonl(out / "smolagents-native.jsonl", [episode(t, "X-smolagents-native", t == "a",
                                                          framework="smolagents 9.9.9 (native tool calls)")
                                                  for t in "abcd"])
    write_jsonl(out / "pydantic-ai.jsonl", [episode(t, "X-pydantic-ai", t in "abc", framework="pydantic-ai 8.8.8")
                                            for t in "abcd"])
    return run


ALL_SPLITS = ["base", "external", "inspace", "pydantic-ai", "smolagents", "smolagents-native"]
HEADER = ("| policy | Base | In-Space | smolagents 9.9.9 native | pydantic-ai 8.8.8 | Unseen syntax: X-react, X-shell "
          "| Unseen syntax: smolagents 9.9.9 text |")


def score(run, *extra, label="mine", check=True):
    return run_stage("06_evaluate.py", "--run", run, "--label", label, "--no-rollout", "--heldout", 3,
                     "--tasks", run.parent / "tasks.jsonl", *extra, check=check)


def test_cli_scores_existing_rollouts_and_compares(tmp_path):
    run = make_run(tmp_path)
    proc = score(run)
    summary = json.loads((run / "eval_summary.json").read_text())["mine"]
    assert summary["splits"]["base"]["pass@1"] == pytest.approx(0.75)
    assert summary["splits"]["inspace"]["pass@1"] == pytest.approx(1 / 3)
    assert summary["splits"]["external"]["pass@1"] == pytest.approx(1 / 8)
    assert summary["splits"]["smolagents"]["pass@1"] == pytest.approx(0.5)
    assert summary["splits"]["smolagents-native"]["pass@1"] == pytest.approx(0.25)
    assert summary["splits"]["pydantic-ai"]["pass@1"] == pytest.approx(0.75)
    assert not any(sp["trained_in"] for sp in summary["splits"].values())
    assert summary["framework_tasks"] == {"smolagents-native": 4, "pydantic-ai": 4, "smolagents": 4}
    assert summary["training_curve"] == [{"iteration": 0, "reward_mean": 0.5, "success": 0.5}]
    assert summary["train_ids"] == [BASE] and summary["eval_harnesses"] is None
    assert summary["heldout_ids"] == sorted(SPACE_IDS) and summary["external_ids"] == ["X-shell", "X-react"]
    comp = summary["per_component"]  # held-out in-space pairs only, never base
    assert sum(v["n"] for v in comp["S"].values()) == 12 and comp["T"]["T2"] == {**comp["T"]["T2"], "k": 0, "n": 4}
    md = (run / "results.md").read_text()
    assert "| mine | 75.0 [" in md and HEADER in md and "(trained in)" not in md
    assert "T1: 4/8 = 50% [" in md and "treated as independent" in md
    assert "| mine | 75.0 [" in proc.stdout
    assert (run / "eval" / "mine" / "summary.json").stat().st_mtime_ns >= (run / "results.md").stat().st_mtime_ns
    cmp = run_stage("experiments/compare.py", run, run)
    assert cmp.stdout.count("| run/mine | 75.0 [") == 2


def test_cli_writes_summary_json_last(tmp_path, monkeypatch):
    run, order = make_run(tmp_path), []
    real = ev.write_atomic
    monkeypatch.setattr(ev, "write_atomic", lambda path, text: (order.append(str(path)), real(path, text)))
    ev.main(["--run", str(run), "--label", "mine", "--no-rollout", "--heldout", "3",
             "--tasks", str(tmp_path / "tasks.jsonl")])
    assert order[-1].endswith("summary.json") and "eval" in order[-1] and order[0].endswith("eval_summary.json")


def test_cli_bad_input_names_file_and_line(tmp_path):
    run = make_run(tmp_path)
    bad = run / "eval" / "mine" / "base.jsonl"
    bad.write_text(bad.read_text() + "{not json\n")
    proc = score(run, check=False)
    assert proc.returncode != 0
    assert f"{bad}:5" in proc.stderr
    assert not (run / "eval_summary.json").exists() and not (run / "results.md").exists()
    missing = run_stage("experiments/compare.py", tmp_path / "nope", check=False)
    assert missing.returncode != 0 and "eval_summary.json: file not found" in missing.stderr


def test_cli_no_smolagents_and_framework_tasks_leave_framework_columns_out(tmp_path):
    run = make_run(tmp_path)
    score(run, "--no-smolagents")
    summary = json.loads((run / "eval_summary.json").read_text())["mine"]
    assert set(summary["splits"]) == set(ALL_SPLITS) - {"smolagents"}
    assert "| Base | In-Space | smolagents 9.9.9 native | pydantic-ai 8.8.8 | Unseen syntax: X-react, X-shell |" \
        in (run / "results.md").read_text()
    score(run, "--framework-tasks", "0")  # a bare N sets every framework column; 0 leaves it out
    summary = json.loads((run / "eval_summary.json").read_text())["mine"]
    assert set(summary["splits"]) == {"base", "inspace", "external"} and summary["framework_tasks"] == {}
    assert "| policy | Base | In-Space | Unseen syntax: X-react, X-shell |" in (run / "results.md").read_text()
    score(run, "--framework-tasks", "0,pydantic-ai=4")  # later items win
    assert set(json.loads((run / "eval_summary.json").read_text())["mine"]["splits"]) == \
        {"base", "inspace", "external", "pydantic-ai"}


@pytest.mark.parametrize("spec", ["pydantic=3", "smolagents-native=-1", "x", "8,native=2", "pydantic-ai=2.5"])
def test_bad_framework_tasks_is_one_line(tmp_path, spec):
    run = make_run(tmp_path)
    proc = score(run, "--framework-tasks", spec, check=False)
    assert proc.returncode == 2 and f"--framework-tasks {spec!r}: item " in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and not (run / "eval_summary.json").exists()


def test_framework_columns_hold_their_tasks_and_harness(tmp_path):
    """A framework split file holds exactly its (task, harness) pairs: the first --framework-tasks N tasks, under
    the harness id its bridge records; a file from another framework, or with other tasks, is refused."""
    run = make_run(tmp_path)
    proc = score(run, "--framework-tasks", "smolagents-native=2", check=False)
    assert proc.returncode == 2 and "smolagents-native.jsonl: its (task_id, harness_id) pairs" in proc.stderr
    assert "2 extra, e.g. ('c', 'X-smolagents-native')" in proc.stderr
    out = run / "eval" / "mine"
    write_jsonl(out / "smolagents-native.jsonl", [episode(t, "X-smolagents-native", True) for t in "ab"])
    score(run, "--framework-tasks", "smolagents-native=2")
    summary = json.loads((run / "eval_summary.json").read_text())["mine"]
    assert summary["splits"]["smolagents-native"]["pairs"] == 2 and summary["splits"]["smolagents-native"]["tasks"] == 2
    assert summary["framework_tasks"]["smolagents-native"] == 2 and summary["framework_tasks"]["pydantic-ai"] == 4
    shutil.copy(out / "smolagents.jsonl", out / "pydantic-ai.jsonl")  # smolagents' episodes in pydantic-ai's file
    proc = score(run, "--framework-tasks", "smolagents-native=2", check=False)
    assert proc.returncode == 2 and "pydantic-ai.jsonl: its (task_id, harness_id) pairs" in proc.stderr
    assert "('a', 'X-smolagents')" in proc.stderr
    write_jsonl(out / "pydantic-ai.jsonl", [episode(t, "X-pydantic-ai", True) for t in "ab"])
    listed = sorted(set(ALL_SPLITS) - {"pydantic-ai"})
    (out / "checkpoint.json").write_text(json.dumps({"policy": "p", "splits": listed}))
    proc = score(run, "--framework-tasks", "2", check=False)
    assert proc.returncode == 2 and "pydantic-ai.jsonl is not among the splits" in proc.stderr, proc.stderr


def test_trained_in_marks_the_framework_column(tmp_path):
    """--trained-in X-pydantic-ai (a black-box baseline trained inside pydantic-ai): its pydantic-ai cell is marked
    trained in, in the summary, results.md and experiments/compare.py's table; the other columns are transfer figures.
    An id 06 does not evaluate, or an in-space configuration, is refused."""
    run = make_run(tmp_path)
    score(run, "--trained-in", "X-pydantic-ai")
    summary = json.loads((run / "eval_summary.json").read_text())["mine"]
    assert summary["train_ids"] == [BASE, "X-pydantic-ai"]
    assert [s for s, sp in summary["splits"].items() if sp["trained_in"]] == ["pydantic-ai"]
    assert summary["splits"]["pydantic-ai"]["pass@1"] == pytest.approx(0.75)  # scored all the same
    md = (run / "results.md").read_text()
    assert "| 75.0 [19.4, 99.4]* (trained in) | " in md and md.count("(trained in) |") == 2  # both tables
    assert "not a transfer figure" in md
    assert summary["external_ids"] == ["X-shell", "X-react"]
    other = make_run(tmp_path, "other")
    score(other)
    cmp = run_stage("experiments/compare.py", run / "eval" / "mine", other / "eval" / "mine", "--out", tmp_path / "cmp")
    report = json.loads((tmp_path / "cmp.json").read_text())
    marks = {r["name"]: [s for s, x in r["splits"].items() if x["trained_in"]] for r in report["rows"]}
    assert marks == {"run/mine": ["pydantic-ai"], "other/mine": []}
    assert "(trained in) |" in cmp.stdout and "not a transfer figure" in cmp.stdout
    assert report["common_ground"]["excluded_external"] == []  # a framework id is not an unseen-syntax harness
    for bad, why in (("X-pydantic", "not an out-of-space harness 06 evaluates"),
                     (SPACE_IDS[0], "not an out-of-space harness 06 evaluates")):
        proc = score(make_run(tmp_path, "bad"), "--trained-in", bad, check=False)
        assert proc.returncode == 2 and f"--trained-in {bad!r}: {why}" in proc.stderr, proc.stderr
    shell = make_run(tmp_path, "shell")  # an external harness trained in leaves the unseen-syntax column
    write_jsonl(shell / "eval" / "mine" / "external.jsonl", [episode(t, "X-react", False) for t in "abcd"])
    score(shell, "--trained-in", "X-shell")
    summary = json.loads((shell / "eval_summary.json").read_text())["mine"]
    assert summary["external_ids"] == ["X-react"] and not any(sp["trained_in"] for sp in summary["splits"].values())


def test_no_rollout_refuses_files_with_other_pairs(tmp_path):
    run = make_run(tmp_path)
    proc = score(run, "--max-tasks", 3, check=False)  # the files hold task d too
    assert proc.returncode != 0 and "base.jsonl: its (task_id, harness_id) pairs are not" in proc.stderr
    assert "1 extra, e.g. ('d', 'S0-T0-O0-C0-W0')" in proc.stderr
    train_x = make_run(tmp_path, "xrun", train=(BASE, "X-shell"))  # X-shell trained: not Out-of-Space here
    proc = score(train_x, check=False)
    assert proc.returncode != 0 and "external.jsonl" in proc.stderr and "'X-shell')" in proc.stderr


def test_eval_harnesses_file_is_the_inspace_split_and_refuses_training_harnesses(tmp_path):
    run = make_run(tmp_path)
    eval_set = tmp_path / "eval_set.jsonl"
    write_jsonl(eval_set, [{"harness_id": SPACE_IDS[2]}, {"harness_id": SPACE_IDS[0]}])
    write_jsonl(run / "eval" / "mine" / "inspace.jsonl",
                [episode(t, h, True) for t in "abcd" for h in SPACE_IDS[:1] + SPACE_IDS[2:]])
    score(run, "--eval-harnesses", eval_set)
    summary = json.loads((run / "eval" / "mine" / "summary.json").read_text())
    assert summary["heldout_ids"] == sorted([SPACE_IDS[0], SPACE_IDS[2]]) and summary["eval_harnesses"] == str(eval_set)
    for bad, why in ((BASE, "is the base harness"), ("S2-T2-O2-C2-W2", "is a training harness"),
                     ("X-shell", "not an in-space configuration")):
        write_jsonl(eval_set, [{"harness_id": SPACE_IDS[0]}, {"harness_id": bad}])
        run2 = make_run(tmp_path, "run2", train=(BASE, "S2-T2-O2-C2-W2"))
        proc = score(run2, "--eval-harnesses", eval_set, check=False)
        assert proc.returncode != 0 and f"{eval_set}:2: " in proc.stderr and why in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------- stage 04 through 06 (oracle)
def test_cli_rollouts_one_04_call_split_by_harness(tmp_path):
    """06 asks 04 once for every split (one engine start with vLLM): base + in-space + unseen-syntax harnesses, and
    each framework column on the first --framework-tasks tasks (NAME:N); it splits the episodes by harness id.
    The oracle solves all of them."""
    import helpers_04 as H
    run = H.make_run(tmp_path / "run", {"S0-T1-O1-C1-W1"}, {})
    run_stage("06_evaluate.py", "--run", run, "--policy", "oracle", "--label", "o", "--max-tasks", 3, "--heldout", 2,
              "--framework-tasks", "2,smolagents=1")
    out = run / "eval" / "o"
    rows = {s: [json.loads(x) for x in (out / f"{s}.jsonl").read_text().splitlines()] for s in ALL_SPLITS}
    ids = {s: {e["harness_id"] for e in r} for s, r in rows.items()}
    assert ids["base"] == {"S0-T0-O0-C0-W0"} and ids["external"] == {"X-shell", "X-react"}
    assert len(ids["inspace"]) == 2 and not ids["inspace"] & {"S0-T0-O0-C0-W0", "S0-T1-O1-C1-W1"}
    assert ids["smolagents"] == {"X-smolagents"} and not (out / "episodes.jsonl").exists()
    assert ids["smolagents-native"] == {"X-smolagents-native"} and ids["pydantic-ai"] == {"X-pydantic-ai"}
    assert [len(rows[s]) for s in ("smolagents", "smolagents-native", "pydantic-ai")] == [1, 2, 2]
    assert rows["pydantic-ai"][0]["framework"].startswith("pydantic-ai ")
    summary = json.loads((run / "eval_summary.json").read_text())["o"]["splits"]
    assert all(summary[s]["pass@1"] == 1.0 for s in summary), summary
    assert summary["inspace"]["behaviour"]["workflow_compliance"] in (None, 1.0)  # None: a 04 without the counters
    ck = json.loads((out / "checkpoint.json").read_text())
    assert ck["policy"] == "oracle" and ck["fingerprint"] == "oracle" and ck["samples"] == 1
    assert ck["splits"] == ALL_SPLITS
    md = (run / "results.md").read_text()
    fw = {s: rows[s][0]["framework"].split()[1] for s in ("smolagents", "pydantic-ai")}  # the installed versions
    assert (f"| policy | Base | In-Space | smolagents {fw['smolagents']} native | pydantic-ai {fw['pydantic-ai']} | "
            f"Unseen syntax: X-react, X-shell | Unseen syntax: smolagents {fw['smolagents']} text |") in md


def test_eval_set_shared_across_runs_and_trained_external_leaves_out_of_space(tmp_path):
    """Two runs with different training sets (one also trained inside X-shell) evaluated on one --eval-harnesses
    file: identical In-Space harness ids and tasks; X-shell leaves the second run's Out-of-Space split (a
    --harness-file harness stays), and experiments/compare.py then drops it from every row."""
    import helpers_04 as H
    a = H.make_run(tmp_path / "a", {"S0-T1-O1-C1-W1"}, {})
    b = H.make_run(tmp_path / "b", {"S1-T0-O0-C0-W0", "S2-T0-O0-C0-W0"}, {})
    shell = json.loads((H.ROOT / "data" / "external_harnesses.json").read_text())[0]
    assert shell["harness_id"] == "X-shell"
    with open(b / "train_harnesses.jsonl", "a") as f:
        f.write(json.dumps(shell) + "\n")
    eval_set = tmp_path / "eval_set.jsonl"
    write_jsonl(eval_set, [{"harness_id": h} for h in ("S2-T2-O2-C2-W2", "S1-T2-O0-C1-W2")])
    extra = H.ROOT / "data" / "example_harness.json"  # an extra out-of-space harness: stays in Out-of-Space
    for run in (a, b):
        run_stage("06_evaluate.py", "--run", run, "--policy", "oracle", "--label", "o", "--max-tasks", 2,
                  "--framework-tasks", 0, "--eval-harnesses", eval_set, "--harness-file", extra)
    pairs = {r.name: {s: {(e["task_id"], e["harness_id"]) for e in map(json.loads, (r / "eval" / "o" / f"{s}.jsonl")
                                                                          .read_text().splitlines())}
                      for s in ("base", "inspace", "external")} for r in (a, b)}
    assert pairs["a"]["inspace"] == pairs["b"]["inspace"] and len(pairs["a"]["inspace"]) == 4
    assert {h for _, h in pairs["a"]["inspace"]} == {"S2-T2-O2-C2-W2", "S1-T2-O0-C1-W2"}
    assert {h for _, h in pairs["a"]["external"]} == {"X-shell", "X-react", "X-example-fs"}
    assert {h for _, h in pairs["b"]["external"]} == {"X-react", "X-example-fs"}
    sb = json.loads((b / "eval" / "o" / "summary.json").read_text())
    assert sb["train_ids"] == sorted(["S1-T0-O0-C0-W0", "S2-T0-O0-C0-W0", "X-shell"])
    assert sb["external_ids"] == ["X-react", "X-example-fs"] and sb["splits"]["external"]["pass@1"] == 1.0
    cmp = run_stage("experiments/compare.py", a / "eval" / "o", b, "--out", tmp_path / "cmp")
    report = json.loads((tmp_path / "cmp.json").read_text())
    assert report["common_ground"]["splits"]["external"]["harness_ids"] == ["X-example-fs", "X-react"]
    assert report["common_ground"]["excluded_external"] == ["X-shell"]
    assert [r["name"] for r in report["rows"]] == ["a/o", "b/o"] and "X-shell (trained by a row)" in cmp.stdout
    write_jsonl(eval_set, [{"harness_id": "S2-T2-O2-C2-W2"}, {"harness_id": "S0-T1-O1-C1-W1"}])
    proc = run_stage("06_evaluate.py", "--run", a, "--policy", "oracle", "--label", "o2", "--max-tasks", 2,
                     "--framework-tasks", 0, "--eval-harnesses", eval_set, check=False)
    assert proc.returncode != 0 and f"{eval_set}:2: S0-T1-O1-C1-W1 is a training harness" in proc.stderr


def test_reused_rollouts_must_come_from_the_same_checkpoint(tmp_path):
    """checkpoint.json beside the rollouts: the same request reuses them; another checkpoint folder, a changed
    file in it, other settings, other tasks or no checkpoint.json at all are refused."""
    run = make_run(tmp_path)
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "config.json").write_text("{}")
    (ckpt / "model.safetensors").write_bytes(b"weights-1")
    common = ["--run", run, "--label", "mine", "--heldout", 3, "--tasks", tmp_path / "tasks.jsonl"]
    refused = run_stage("06_evaluate.py", *common, "--policy", ckpt, check=False)
    assert refused.returncode != 0 and "checkpoint.json does not" in refused.stderr and "--overwrite" in refused.stderr
    args = ev.parse_args(["--policy", str(ckpt), "--heldout", "3"])
    ck = {**ER.checkpoint_request(args, ckpt), "splits": ALL_SPLITS}
    (run / "eval" / "mine" / "checkpoint.json").write_text(json.dumps(ck))
    ok = run_stage("06_evaluate.py", *common, "--policy", ckpt)  # every split exists: no 04 call
    assert ok.stdout.count("reusing it") == 6
    (ckpt / "model.safetensors").write_bytes(b"weights-2")  # same name and size, other weights
    refused = run_stage("06_evaluate.py", *common, "--policy", ckpt, check=False)
    assert refused.returncode != 0 and "fingerprint" in refused.stderr and "another --label" in refused.stderr
    (ckpt / "model.safetensors").write_bytes(b"weights-1")
    run_stage("06_evaluate.py", *common, "--policy", ckpt)
    for extra, why in ((["--policy", "oracle"], "policy = "), (["--policy", ckpt, "--temperature", 1], "temperature"),
                       (["--policy", ckpt, "--max-tasks", 2], "pairs are not the ones")):
        refused = run_stage("06_evaluate.py", *common, *extra, check=False)
        assert refused.returncode != 0 and why in refused.stderr, refused.stderr


def test_default_label_of_an_iteration_checkpoint(tmp_path):
    run = make_run(tmp_path, label="iter_005")
    (run / "iter_005" / "policy").mkdir(parents=True)
    run_stage("06_evaluate.py", "--run", run, "--no-rollout", "--heldout", 3, "--tasks", tmp_path / "tasks.jsonl")
    assert list(json.loads((run / "eval_summary.json").read_text())) == ["iter_005"]




# ----------------------------------------------------------------------------- stopping the pipeline stops 04
STAND_IN_04 = """
import os, signal, subprocess, sys, time
from pathlib import Path
out = Path(sys.argv[sys.argv.index("--out") + 1]).parent
# the engine: a child of 04, as vLLM's engine process is; 04 shuts it down when it is stopped (SIGTERM / SIGINT)
engine = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", str(out / "engine")])
def stop(sig, frame):
    engine.terminate()
    engine.wait()
    sys.exit(128 + sig)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
(Path(sys.argv[sys.argv.index("--run") + 1]).parent / "pids").write_text(f"{os.getpid()} {engine.pid}")
time.sleep(120)
"""

PIPELINE_LIKE = """
import sys
sys.path.insert(0, sys.argv[1])
import pipeline
sys.exit(pipeline.run_stage(sys.argv[2:]))
"""


def alive(pid):
    """A process that exists and is not a zombie (an orphan's zombie may wait for a reaper that never comes)."""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (ProcessLookupError, FileNotFoundError):
        return False


def test_a_sigterm_to_the_pipeline_stops_06_and_the_04_it_runs(tmp_path):
    """pipeline -> 06 -> 04 -> engine: SIGTERM to the pipeline alone reaches 04 through 06 (run_child), which stops
    its engine; nothing is left running. 06 here is a copy beside a stand-in 04 that keeps an engine child running
    until it is told to stop (with subprocess.run, 06 would SIGKILL 04 on its way out and orphan the engine)."""
    code = tmp_path / "code"
    code.mkdir()
    (code / "common").mkdir()
    for name in ("06_evaluate.py", "common/__init__.py", "common/eval_rollouts.py", "common/plumbing.py",
                 "common/intervals.py", "common/schemas.py", "common/environment.py"):
        shutil.copy(ROOT / name, code / name)
    (code / "data").symlink_to(ROOT / "data")
    (code / "04_rollout.py").write_text(STAND_IN_04)
    (tmp_path / "driver.py").write_text(PIPELINE_LIKE)
    run = tmp_path / "run"
    run.mkdir()
    (run / "train_harnesses.jsonl").write_text(json.dumps({"harness_id": SPACE_IDS[0]}) + "\n")
    (run / "heldout_harnesses.jsonl").write_text("".join(json.dumps({"harness_id": h}) + "\n" for h in SPACE_IDS[1:]))
    (tmp_path / "tasks.jsonl").write_text('{"task_id": "t0"}\n')
    proc = subprocess.Popen([sys.executable, tmp_path / "driver.py", ROOT, sys.executable, code / "06_evaluate.py",
                             "--run", run, "--policy", "oracle", "--label", "x", "--tasks", tmp_path / "tasks.jsonl",
                             "--no-smolagents"], stderr=subprocess.PIPE, text=True)
    pids = []
    try:
        for _ in range(600):
            if (tmp_path / "pids").is_file() or proc.poll() is not None:
                break
            time.sleep(0.05)
        assert (tmp_path / "pids").is_file(), f"04 never started: {proc.stderr.read() if proc.poll() else ''}"
        pids = [int(p) for p in (tmp_path / "pids").read_text().split()]  # 04 and its engine
        proc.send_signal(signal.SIGTERM)  # to the pipeline alone (as `kill PID` does), not to its process group
        assert proc.wait(timeout=20) == 128 + signal.SIGTERM
        deadline = time.time() + 20
        while any(alive(p) for p in pids) and time.time() < deadline:
            time.sleep(0.1)
        assert not [p for p in pids if alive(p)], "04 or its engine is left running as an orphan"
        assert "stopped by SIGTERM" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.terminate()
            proc.wait(timeout=20)
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)
