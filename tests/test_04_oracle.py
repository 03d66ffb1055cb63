"""Stage 04: the oracle solves every default task family under all 243 configurations and every
out-of-space harness; the default task files are seeded, disjoint and small."""
import json
import re
import subprocess
import sys

import pytest
from conftest import load_stage, run_stage

import helpers_04 as H

R = load_stage("04_rollout.py")
FAMILIES = ["lookup", "sum", "edit", "multihop", "search", "count"]
EXAMPLE = H.ROOT / "data" / "example_harness.json"


def one_per_family(tasks):
    return [next(t for t in tasks if t["family"] == f) for f in FAMILIES]


def external_harnesses():
    return R.EXTERNAL_HARNESSES + R.load_harness_file(EXAMPLE)


def assert_all_solved(records):
    bad = [(r["task_id"], r["harness_id"], r["finish_reason"], r["reward"]) for r in records
           if not (r["reward"] == 1.0 and r["success"] and r["finish_reason"] == "submitted"
                   and r["parse_errors"] == r["tool_errors"] == r["workflow_violations"] == 0)]
    assert not bad, bad[:5]


def test_oracle_solves_every_family_under_all_243_configurations_and_external_harnesses():
    space = H.space_records()
    assert len(space) == 243 and len({h["harness_id"] for h in space}) == 243
    harnesses = space + external_harnesses()
    assert {"X-shell", "X-react", "X-example-fs"} <= {h["harness_id"] for h in harnesses}
    tasks = one_per_family(H.read_tasks()) + one_per_family(H.read_tasks("test_tasks.jsonl"))
    jobs = [(t, h, {}) for h in harnesses for t in tasks]
    records = R.run_episodes(jobs, "oracle", progress=False)
    assert len(records) == 246 * 12
    assert_all_solved(records)
    # the hardest sum task (3 reads + calculator + submit) fits the default budget
    assert max(r["turns"] for r in records) == 5


def test_oracle_solves_every_default_task_under_base_and_external_harnesses():
    space = H.by_id(H.space_records())
    harnesses = [space["S0-T0-O0-C0-W0"], space["S2-T2-O2-C2-W2"]] + external_harnesses()
    tasks = H.read_tasks() + H.read_tasks("test_tasks.jsonl")
    records = R.run_episodes([(t, h, {}) for h in harnesses for t in tasks], "oracle", progress=False)
    assert_all_solved(records)


def test_stage01_space_matches_the_contract_and_the_oracle_solves_it(tmp_path):
    if not (H.ROOT / "01_harness_space.py").exists():
        pytest.skip("stage 01 has not landed")
    run_stage("01_harness_space.py", "--run", tmp_path)
    theirs = R.load_run_harnesses(tmp_path, "harness_space.jsonl")
    ours = H.by_id(H.space_records())
    strip = lambda specs: {c: {k: v for k, v in s.items() if k != "desc"} for c, s in specs.items()}
    assert {h["harness_id"] for h in theirs} == set(ours)
    for h in theirs:
        assert strip(h["specs"]) == strip(ours[h["harness_id"]]["specs"]), h["harness_id"]
    tasks = one_per_family(H.read_tasks("test_tasks.jsonl"))
    assert_all_solved(R.run_episodes([(t, h, {}) for h in theirs for t in tasks], "oracle", progress=False))


def test_failing_oracle_is_detected():
    """The oracle check can fail: a wrong solution gives reward 0 under every harness."""
    task = dict(one_per_family(H.read_tasks())[0])
    task["solution"] = [task["solution"][0], {"tool": "submit", "args": {"answer": "-1"}}]
    records = R.run_episodes([(task, h, {}) for h in external_harnesses()], "oracle", progress=False)
    assert all(r["reward"] == 0.0 and r["finish_reason"] == "submitted" for r in records)


# ----------------------------------------------------------------------------- the default task files
def test_task_files_are_the_seeded_generator_output(tmp_path):
    subprocess.run([sys.executable, str(H.ROOT / "data" / "make_tasks.py"), "--out-dir", str(tmp_path)],
                   check=True, capture_output=True)
    for name in ("train_tasks.jsonl", "test_tasks.jsonl"):
        assert (tmp_path / name).read_bytes() == (H.ROOT / "data" / name).read_bytes(), name
    subprocess.run([sys.executable, str(H.ROOT / "data" / "make_tasks.py"), "--out-dir", str(tmp_path / "s1"),
                    "--seed", "1", "--n-train", "12", "--n-test", "6"], check=True, capture_output=True)
    other = (tmp_path / "s1" / "train_tasks.jsonl").read_text().splitlines()
    assert len(other) == 12 and other[0] != (H.ROOT / "data" / "train_tasks.jsonl").read_text().splitlines()[0]


def test_task_files_schema_sizes_disjointness_and_entities():
    train, test = H.read_tasks(), H.read_tasks("test_tasks.jsonl")
    assert len(train) >= 200 and 80 <= len(test) <= 150
    for name in ("train_tasks.jsonl", "test_tasks.jsonl"):
        assert (H.ROOT / "data" / name).stat().st_size < 1_000_000
        assert len(R.load_tasks(H.ROOT / "data" / name)) > 0  # passes 04's own schema validation
    for rows in (train, test):
        assert {t["family"] for t in rows} == set(FAMILIES)
        assert min(sum(t["family"] == f for t in rows) for f in FAMILIES) >= 10
    content = lambda t: json.dumps([t["request"], t["files"], t["checker"]], sort_keys=True)
    assert not {content(t) for t in train} & {content(t) for t in test}
    assert len({content(t) for t in train}) == len(train)
    assert not {t["task_id"] for t in train} & {t["task_id"] for t in test}
    for t in train + test:
        assert 1 <= len(t["files"]) <= 6 and len(t["request"]) < 90
        for path, text in t["files"].items():
            assert re.fullmatch(r"[a-z]+\.txt", path) and len(text) <= 40 and text.count("\n") <= 1
            for number in re.findall(r"\d+", text):
                assert 10 <= int(number) <= 999
    hops = {t["difficulty"]["hops"] for t in train if t["family"] == "multihop"}
    distractors = {t["difficulty"]["distractors"] for t in train if t["family"] == "lookup"}
    assert hops == {1, 2} and distractors == {1, 2, 3}
