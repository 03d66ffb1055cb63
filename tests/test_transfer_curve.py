"""experiments/transfer_curve.py through its command line on hand-made run folders: each point's pass@1, interval and
paired
change since iteration 0 against plain-python computations, the methods' held-out difference, and bad input."""
import json
import math
import random

import pytest

from conftest import load_stage, run_stage

cmp = load_stage("experiments/compare.py")
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
    run_stage("experiments/transfer_curve.py", f"harness-scaling={hs}", f"single={single}", "--eval-set", tmp_path / "eval.jsonl",
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
    run_stage("experiments/transfer_curve.py", "hs=" + ",".join(map(str, runs)), "--eval-set", tmp_path / "eval.jsonl",
              "--out", out)
    change = json.loads(out.with_suffix(".json").read_text())["methods"]["hs"]["curve"][1]["trained"]["since_start"]
    assert (change["better_tasks"], change["worse_tasks"]) == (1, 0) and change["sign_test_p"] == 1.0
    assert change["diff"] == pytest.approx((0 + 3 / 9) / 2)


def test_held_out_split_by_distance_to_the_methods_own_training_set_and_by_family(tmp_path):
    """Hand-computed: two checkpoints (0, 4), two held-out harnesses, tasks t0, t1 (lookup) and t2, t3 (sum).
        A = S0-T0-O0-C0-W1: single (trained on the base) d 1 (W); hs (trained on S1-T1-O0-C0-W1) d 2 (S, T)
        B = S1-T1-O0-C0-W0: single d 2 (S, T);                     hs d 1 (W)
    Successes (every other episode, the training harness's included, fails):
        single  iteration 0: (t0, A)             iteration 4: (t0, A), (t1, A), (t3, A), (t2, B)
        hs      iteration 0: (t2, A)             iteration 4: (t2, A) and every task under B
    By distance, pass@1 over the 4 tasks under the harness at d:
        single  d 1 (A): 1/4 -> 3/4     d 2 (B): 0 -> 1/4
        hs      d 1 (B): 0 -> 1         d 2 (A): 1/4 -> 1/4
    By family, a task's value is its mean over A and B; the change is paired over the family's tasks:
        single  lookup t0 1/2 -> 1/2 (tie), t1 0 -> 1/2: 1/4 -> 1/2, +1/4 (1 / 0);  sum t2, t3 0 -> 1/2: 0 -> 1/2,
                +1/2 (2 / 0, p 0.5)
        hs      lookup t0, t1 0 -> 1/2: 0 -> 1/2, +1/2 (2 / 0);  sum t2 1/2 -> 1, t3 0 -> 1/2: 1/4 -> 3/4, +1/2"""
    A, B = "S0-T0-O0-C0-W1", "S1-T1-O0-C0-W0"
    train = {"single": "S0-T0-O0-C0-W0", "hs": "S1-T1-O0-C0-W1"}
    family = {"t0": "lookup", "t1": "lookup", "t2": "sum", "t3": "sum"}
    solved = {"single": {0: {("t0", A)}, 4: {("t0", A), ("t1", A), ("t3", A), ("t2", B)}},
              "hs": {0: {("t2", A)}, 4: {("t2", A)} | {(t, B) for t in family}}}
    runs = {}
    for name in solved:
        run = tmp_path / name
        write_jsonl(run / "train_harnesses.jsonl", [{"harness_id": train[name]}])
        for t, wins in solved[name].items():
            write_jsonl(run / "curve" / f"iter-{t:03d}.jsonl",
                        [{"task_id": task, "family": family[task], "harness_id": h, "success": (task, h) in wins,
                          "finish_reason": "submitted", "turns": 2, "parse_errors": 0, "tool_errors": 0}
                         for task in family for h in (A, B, train[name])])
        runs[name] = run
    write_jsonl(tmp_path / "eval.jsonl", [{"harness_id": h} for h in (A, B)])
    out = tmp_path / "tc"
    run_stage("experiments/transfer_curve.py", f"single={runs['single']}", f"hs={runs['hs']}", "--eval-set",
              tmp_path / "eval.jsonl", "--out", out)
    report = json.loads(out.with_suffix(".json").read_text())
    single, hs = report["methods"]["single"], report["methods"]["hs"]
    assert single["train_ids"] == [train["single"]] and hs["train_ids"] == [train["hs"]]
    # by distance: {iteration: {d: (pass@1, harnesses at d, tasks)}}
    got = {name: {r["iteration"]: {c["distance"]: (c["pass@1"], c["harness_ids"], c["tasks"]) for c in r["distances"]}
                  for r in report["methods"][name]["held_out_by_distance"]} for name in ("single", "hs")}
    assert got["single"] == {0: {1: (0.25, [A], 4), 2: (0.0, [B], 4)}, 4: {1: (0.75, [A], 4), 2: (0.25, [B], 4)}}
    assert got["hs"] == {0: {1: (0.0, [B], 4), 2: (0.25, [A], 4)}, 4: {1: (1.0, [B], 4), 2: (0.25, [A], 4)}}
    first = single["held_out_by_distance"][0]["distances"][0]  # single, iteration 0, d 1: tasks 1, 0, 0, 0
    assert first["ci95"] == pytest.approx(cmp.pass1_ci([1, 0, 0, 0])[0])  # the interval every table uses
    # by family: first and last checkpoint, the paired change over the family's tasks
    fam = {name: {c["family"]: c for c in report["methods"][name]["held_out_by_family"]} for name in ("single", "hs")}
    want = {"single": {"lookup": (1 / 4, 1 / 2, 1 / 4, 1, 0, 1.0), "sum": (0, 1 / 2, 1 / 2, 2, 0, 0.5)},
            "hs": {"lookup": (0, 1 / 2, 1 / 2, 2, 0, 0.5), "sum": (1 / 4, 3 / 4, 1 / 2, 2, 0, 0.5)}}
    for name, families in want.items():
        assert list(fam[name]) == ["lookup", "sum"]
        for f, (before, after, diff, better, worse, p) in families.items():
            c = fam[name][f]
            assert (c["first"]["iteration"], c["last"]["iteration"], c["tasks"]) == (0, 4, 2)
            assert c["first"]["pass@1"] == pytest.approx(before) and c["last"]["pass@1"] == pytest.approx(after)
            assert c["change"] == pytest.approx(dict(diff=diff, better_tasks=better, worse_tasks=worse,
                                                     sign_test_p=p))
    md = out.with_suffix(".md").read_text()
    table_before = md.split("\n## ")[0]  # the existing tables come first, unchanged
    assert table_before.startswith("pass@1 in % [95% interval over tasks]") and "## " not in table_before
    assert "## Held-out by Hamming distance to the method's own training set" in md
    assert "| method | iteration | d = 1 | d = 2 |" in md
    assert "| single | 4 | 75.0 [" in md and "(1 h) | 25.0 [" in md and "| hs | 4 | 100.0 [" in md
    assert "## Held-out by task family" in md
    assert "| method | iterations | lookup (2 tasks) | sum (2 tasks) |" in md
    assert "| single | 0 → 4 | 25.0 → 50.0: +25.0 (1 / 0, p 1) | 0.0 → 50.0: +50.0 (2 / 0, p 0.5) |" in md
    assert "| hs | 0 → 4 | 0.0 → 50.0: +50.0 (2 / 0, p 0.5) | 25.0 → 75.0: +50.0 (2 / 0, p 0.5) |" in md


def test_the_distance_helpers_are_shared_with_compare():
    """One copy: experiments/compare.py splits its In-Space column with experiments/transfer_curve.py's helpers."""
    tc = load_stage("experiments/transfer_curve.py")
    for helper in ("hamming", "distance_to", "pairs_by_distance", "pairs_by_family", "families_of", "cell_of"):
        assert getattr(cmp, helper).__module__ == "experiments.transfer_curve", helper  # imported, not a second definition
    assert cmp.levels_of.__module__ == tc.levels_of.__module__ == "common.schemas"  # a harness id's parts: one copy
    assert tc.distance_to("S1-T1-O0-C0-W0", ["X-shell", "S0-T0-O0-C0-W0", "S1-T0-O0-C0-W0"]) == 1
    assert tc.distance_to("X-pydantic-ai", ["S0-T0-O0-C0-W0"]) is None  # out of the space: no distance
    assert tc.distance_to("S0-T0-O0-C0-W1", ["X-shell"]) is None


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
    proc = run_stage("experiments/transfer_curve.py", f"harness-scaling={hs}", "--eval-set", tmp_path / "eval.jsonl",
                     "--out", out, check=False)
    assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert not list((tmp_path / "exp").glob("transfer_curve*"))
