"""transfer_curve.py through its command line on hand-made run folders: each point's pass@1, interval and paired
change since iteration 0 against plain-python computations, the methods' held-out difference, and bad input."""
import json
import math
import random

import pytest

from conftest import load_stage, run_stage

cmp = load_stage("compare.py")
EVAL = ["S1-T1-O1-C1-W1", "S2-T2-O2-C2-W2"]
TRAIN = {"hs": ["S0-T1-O2-C0-W1", "S1-T0-O1-C2-W0", "S2-T2-O0-C1-W2"], "single": ["S0-T0-O0-C0-W0"]}
TASKS = [f"t{i}" for i in range(10)]


def write_jsonl(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_run(root, name, points=(0, 2, 3), p=(0.2, 0.5, 0.7)):
    """A run folder with train_harnesses.jsonl and curve/iter-NNN.jsonl, success drawn with rate p[i] at point i."""
    run = root / name
    write_jsonl(run / "train_harnesses.jsonl", [{"harness_id": h} for h in TRAIN[name]])
    rng = random.Random(name)
    for t, rate in zip(points, p):
        write_jsonl(run / "curve" / f"iter-{t:03d}.jsonl",
                    [episode(rng, task, h, rate) for task in TASKS for h in EVAL + TRAIN[name]])
    return run


def episode(rng, task, harness, rate):
    """A 04 --eval record: solved with probability rate; otherwise a wrong submission or the turn budget."""
    success = rng.random() < rate
    finish = "submitted" if success or rng.random() < 0.5 else "turn_budget"
    return {"task_id": task, "harness_id": harness, "success": success, "finish_reason": finish,
            "turns": rng.randint(1, 5), "parse_errors": rng.randint(0, 2), "tool_errors": rng.randint(0, 3)}


def task_values(run, t, harnesses):
    """Plain python: per task, the mean success over the given harnesses."""
    rows = [json.loads(x) for x in (run / "curve" / f"iter-{t:03d}.jsonl").read_text().splitlines()]
    return [sum(r["success"] for r in rows if r["task_id"] == task and r["harness_id"] in harnesses)
            / len(harnesses) for task in TASKS]


def sign_p(better, worse):
    n = better + worse
    return min(1.0, sum(math.comb(n, i) for i in range(min(better, worse) + 1)) * 2 / 2 ** n) if n else 1.0


def test_curve_points_against_plain_python(tmp_path):
    hs, single = make_run(tmp_path, "hs"), make_run(tmp_path, "single", p=(0.2, 0.3, 0.3))
    write_jsonl(tmp_path / "eval.jsonl", [{"harness_id": h} for h in EVAL])
    out = tmp_path / "exp" / "transfer_curve"
    run_stage("transfer_curve.py", f"harness-scaling={hs}", f"single={single}", "--eval-set", tmp_path / "eval.jsonl",
              "--out", out)
    report = json.loads(out.with_suffix(".json").read_text())
    assert list(report["methods"]) == ["harness-scaling", "single"]
    for name, run in (("harness-scaling", hs), ("single", single)):
        rows = report["methods"][name]["curve"]
        assert [r["iteration"] for r in rows] == [0, 2, 3]
        for r in rows:
            for line, ids in (("trained", TRAIN[run.name]), ("held-out", EVAL)):
                v, v0 = task_values(run, r["iteration"], ids), task_values(run, 0, ids)
                x = r[line]
                eps = [json.loads(e) for e in (run / "curve" / f"iter-{r['iteration']:03d}.jsonl").read_text()
                       .splitlines() if json.loads(e)["harness_id"] in ids]
                n = len(eps)
                assert x["ends"] == pytest.approx(dict(
                    episodes=n, solved=sum(e["success"] for e in eps) / n,
                    submitted_wrong=sum(e["finish_reason"] == "submitted" and not e["success"] for e in eps) / n,
                    not_submitted=sum(e["finish_reason"] != "submitted" for e in eps) / n,
                    parse_errors_per_turn=sum(e["parse_errors"] for e in eps) / sum(e["turns"] for e in eps),
                    tool_errors_per_episode=sum(e["tool_errors"] for e in eps) / n))
                assert x["pass@1"] == pytest.approx(sum(v) / len(v)) and x["tasks"] == 10
                assert x["harnesses"] == len(ids)
                assert x["ci95"] == pytest.approx(cmp.pass1_ci(v, 0, 0)[0])  # the interval every table uses
                if r["iteration"] == 0:
                    assert x["since_start"] is None
                else:
                    d = [a - b for a, b in zip(v, v0)]
                    b, w = sum(e > 0 for e in d), sum(e < 0 for e in d)
                    assert x["since_start"] == pytest.approx(
                        dict(diff=sum(d) / 10, better_tasks=b, worse_tasks=w, sign_test_p=sign_p(b, w)))
    for r in report["held_out_vs_reference"]["single"]:
        d = [a - b for a, b in zip(task_values(single, r["iteration"], EVAL), task_values(hs, r["iteration"], EVAL))]
        assert r["diff"] == pytest.approx(sum(d) / 10) and r["better_tasks"] == sum(e > 0 for e in d)
    md = out.with_suffix(".md").read_text()
    assert "| harness-scaling | 3 |" in md and "single minus harness-scaling" in md
    assert "| single | 2 | held-out |" in md and "How the episodes end" in md
    assert out.with_suffix(".png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_exact_tie_between_checkpoints_is_no_change(tmp_path):
    """Three replicate runs pool their episodes per pair. On task t0 the trained harnesses are solved 1, 3 and 3
    times of 3 at iteration 0 and 3, 3 and 1 times at iteration 2: 7/9 both times, which float means make
    0.7777777777777777 and 0.7777777777777778. A tie, not a task better. Task t1 goes from 0 to 3/9: better."""
    solved = {0: {"t0": (1, 3, 3), "t1": (0, 0, 0)}, 2: {"t0": (3, 3, 1), "t1": (1, 1, 1)}}  # times of 3 runs
    runs = []
    for r in range(3):
        run = tmp_path / f"hs-{r}"
        write_jsonl(run / "train_harnesses.jsonl", [{"harness_id": h} for h in TRAIN["hs"]])
        for t, counts in solved.items():
            rows = [{"task_id": task, "harness_id": h, "success": r < n, "finish_reason": "submitted", "turns": 2,
                     "parse_errors": 0, "tool_errors": 0}
                    for task in ("t0", "t1") for h, n in zip(EVAL + TRAIN["hs"], (0, 0, *counts[task]))]
            write_jsonl(run / "curve" / f"iter-{t:03d}.jsonl", rows)
        runs.append(run)
    write_jsonl(tmp_path / "eval.jsonl", [{"harness_id": h} for h in EVAL])
    out = tmp_path / "tc"
    run_stage("transfer_curve.py", "hs=" + ",".join(map(str, runs)), "--eval-set", tmp_path / "eval.jsonl",
              "--out", out)
    change = json.loads(out.with_suffix(".json").read_text())["methods"]["hs"]["curve"][1]["trained"]["since_start"]
    assert (change["better_tasks"], change["worse_tasks"]) == (1, 0) and change["sign_test_p"] == 1.0
    assert change["diff"] == pytest.approx((0 + 3 / 9) / 2)


@pytest.mark.parametrize("break_it, message", [
    (lambda hs: (hs / "curve" / "iter-002.jsonl").write_text(json.dumps(dict(
        episode(random.Random(0), "t0", EVAL[0], 1.0), success="yes")) + "\n"),
     "iter-002.jsonl:1: field 'success' is 'yes'"),
    (lambda hs: (hs / "curve" / "iter-003.jsonl").write_text('{"task_id": "t0", "success": true}\n'),
     "iter-003.jsonl:1: missing field 'harness_id'"),
    (lambda hs: (hs / "curve" / "iter-000.jsonl").write_text(json.dumps(dict(
        episode(random.Random(0), "t0", EVAL[0], 1.0), tool_errors=-1)) + "\n"),
     "iter-000.jsonl:1: field 'tool_errors' is -1, expected a count"),
    (lambda hs: write_jsonl(hs / "train_harnesses.jsonl", [{"harness_id": EVAL[1]}]),
     f"trains on {EVAL[1]}, which is in the evaluation set"),
    (lambda hs: (hs / "curve" / "iter-002.jsonl").write_text(
        (hs / "curve" / "iter-002.jsonl").read_text().split("\n", 1)[1]),
     "iter-002.jsonl: its held-out (task, harness) pairs differ from iteration 0's"),
])
def test_bad_input_names_file_line_field_and_writes_nothing(tmp_path, break_it, message):
    hs = make_run(tmp_path, "hs")
    write_jsonl(tmp_path / "eval.jsonl", [{"harness_id": h} for h in EVAL])
    break_it(hs)
    out = tmp_path / "exp" / "transfer_curve"
    proc = run_stage("transfer_curve.py", f"harness-scaling={hs}", "--eval-set", tmp_path / "eval.jsonl",
                     "--out", out, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not list((tmp_path / "exp").glob("transfer_curve*"))
