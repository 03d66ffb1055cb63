"""Stage 06: scoring maths against hand computations, and the CLI on synthetic rollout files."""
import json

import numpy as np
import pytest

from conftest import load_stage, run_stage

ev = load_stage("06_evaluate.py")


def episode(task, harness, success, **kw):
    e = dict(task_id=task, harness_id=harness, success=success, reward=float(success), turns=2,
             parse_errors=0, tool_errors=0, workflow_violations=0, finish_reason="submitted")
    e.update(kw)
    return e


def test_pass_at_1_averages_pairs_then_samples():
    # pair (a, h1): 2 samples, 1 success -> 0.5; pair (a, h2): 1/1 -> 1; pair (b, h1): 0/1 -> 0
    eps = [episode("a", "S0-T0-O0-C0-W0", True), episode("a", "S0-T0-O0-C0-W0", False),
           episode("a", "S1-T0-O0-C0-W0", True), episode("b", "S0-T0-O0-C0-W0", False)]
    s = ev.score_split(eps, n_boot=200, seed=0)
    assert s["pass@1"] == pytest.approx((0.5 + 1.0 + 0.0) / 3)
    assert s["pairs"] == 3 and s["tasks"] == 2
    assert s["per_harness"] == {"S0-T0-O0-C0-W0": pytest.approx(0.25), "S1-T0-O0-C0-W0": 1.0}


def test_bootstrap_interval_matches_an_independent_resampling():
    rng = np.random.default_rng(1)
    eps = [episode(f"t{i}", "S0-T0-O0-C0-W0", bool(rng.random() < 0.6)) for i in range(40)]
    lo, hi = ev.bootstrap_ci(eps, n_boot=2000, seed=3)
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


def test_behaviour_and_component_breakdown():
    eps = [episode("a", "S0-T1-O0-C0-W0", True, parse_errors=1, turns=4),
           episode("b", "S0-T1-O0-C0-W0", False, tool_errors=2, turns=6, finish_reason="turn_budget"),
           episode("c", "S0-T0-O0-C0-W1", True, workflow_violations=1, turns=2),
           episode("d", "X-shell", False, turns=4)]
    b = ev.behaviour(eps)
    assert b["parse_error_rate"] == pytest.approx(1 / 16)
    assert b["recovery_rate"] == pytest.approx(0.5)  # 2 episodes had an error, 1 succeeded
    assert b["workflow_compliance"] == pytest.approx(0.75)
    assert b["mean_turns"] == pytest.approx(4.0)
    assert b["submitted"] == pytest.approx(0.75)
    comp = ev.per_component(eps)  # X-shell is out of space: ignored
    assert comp["T"] == {"T0": 1.0, "T1": 0.5}
    assert comp["W"] == {"W0": 0.5, "W1": 1.0}
    assert comp["S"] == {"S0": pytest.approx(2 / 3)}


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_run(tmp_path):
    run = tmp_path / "run"
    ids = ["S0-T0-O0-C0-W0", "S1-T1-O1-C1-W1", "S2-T2-O2-C2-W2", "S0-T1-O2-C0-W1"]
    write_jsonl(run / "train_harnesses.jsonl", [{"harness_id": ids[0]}])
    write_jsonl(run / "heldout_harnesses.jsonl", [{"harness_id": h} for h in ids[1:]])
    write_jsonl(run / "iter_000" / "rollouts.jsonl", [episode("a", ids[0], False), episode("b", ids[0], True)])
    out = run / "eval" / "mine"
    write_jsonl(out / "base.jsonl", [episode(t, ids[0], t != "c") for t in "abcd"])
    write_jsonl(out / "inspace.jsonl", [episode(t, h, h == ids[1]) for t in "abcd" for h in ids[1:]])
    write_jsonl(out / "external.jsonl", [episode(t, "X-shell", t == "a") for t in "abcd"])
    write_jsonl(out / "smolagents.jsonl", [episode(t, "X-smolagents", t in "ab", framework="smolagents 9.9.9")
                                           for t in "abcd"])
    return run


def test_cli_scores_existing_rollouts_and_compares(tmp_path):
    run = make_run(tmp_path)
    proc = run_stage("06_evaluate.py", "--run", run, "--label", "mine", "--no-rollout", "--heldout", 3)
    summary = json.loads((run / "eval_summary.json").read_text())["mine"]
    assert summary["splits"]["base"]["pass@1"] == pytest.approx(0.75)
    assert summary["splits"]["inspace"]["pass@1"] == pytest.approx(1 / 3)
    assert summary["splits"]["external"]["pass@1"] == pytest.approx(0.25)
    assert summary["splits"]["smolagents"]["pass@1"] == pytest.approx(0.5)
    assert summary["training_curve"] == [{"iteration": 0, "reward_mean": 0.5, "success": 0.5}]
    md = (run / "results.md").read_text()
    assert "| mine | 75.0 [" in md and "| Base | In-Space | Out-of-Space | smolagents 9.9.9 |" in md
    assert "| mine | 75.0 [" in proc.stdout
    cmp = run_stage("06_evaluate.py", "--compare", run, run)
    assert cmp.stdout.count("| run/mine | 75.0 [") == 2


def test_cli_bad_input_names_file_and_line(tmp_path):
    run = make_run(tmp_path)
    bad = run / "eval" / "mine" / "base.jsonl"
    bad.write_text(bad.read_text() + "{not json\n")
    proc = run_stage("06_evaluate.py", "--run", run, "--label", "mine", "--no-rollout", check=False)
    assert proc.returncode != 0
    assert f"{bad}:5" in proc.stderr
    assert not (run / "eval_summary.json").exists() and not (run / "results.md").exists()
    missing = run_stage("06_evaluate.py", "--compare", tmp_path / "nope", check=False)
    assert missing.returncode != 0 and "eval_summary.json: file not found" in missing.stderr


def test_cli_no_smolagents_leaves_the_framework_column_out(tmp_path):
    run = make_run(tmp_path)
    run_stage("06_evaluate.py", "--run", run, "--label", "mine", "--no-rollout", "--heldout", 3, "--no-smolagents")
    summary = json.loads((run / "eval_summary.json").read_text())["mine"]
    assert set(summary["splits"]) == {"base", "inspace", "external"}
    assert "| Base | In-Space | Out-of-Space | smolagents |" in (run / "results.md").read_text()


def test_cli_rollouts_one_04_call_split_by_harness(tmp_path):
    """06 asks 04 once for base + in-space + out-of-space (one engine start with vLLM) and splits the episodes
    by harness id; smolagents runs on the first --smolagents-tasks tasks. The oracle solves all of them."""
    import helpers_04 as H
    run = H.make_run(tmp_path / "run", {"S0-T1-O1-C1-W1"}, {})
    run_stage("06_evaluate.py", "--run", run, "--policy", "oracle", "--label", "o", "--max-tasks", 3, "--heldout", 2,
              "--smolagents-tasks", 2)
    out = run / "eval" / "o"
    ids = {s: {json.loads(x)["harness_id"] for x in (out / f"{s}.jsonl").read_text().splitlines()}
           for s in ("base", "inspace", "external", "smolagents")}
    assert ids["base"] == {"S0-T0-O0-C0-W0"} and ids["external"] == {"X-shell", "X-react"}
    assert len(ids["inspace"]) == 2 and not ids["inspace"] & {"S0-T0-O0-C0-W0", "S0-T1-O1-C1-W1"}
    assert ids["smolagents"] == {"X-smolagents"} and not (out / "episodes.jsonl").exists()
    assert len((out / "smolagents.jsonl").read_text().splitlines()) == 2
    summary = json.loads((run / "eval_summary.json").read_text())["o"]["splits"]
    assert all(summary[s]["pass@1"] == 1.0 for s in summary), summary
