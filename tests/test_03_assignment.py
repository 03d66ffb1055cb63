"""Stage 03: locality-aware assignment: true K-nearest groups, seeded tie-breaks, stats, bad input."""
import itertools
import json
import re
from collections import Counter, defaultdict

import pytest

from conftest import ROOT, run_stage

N_TASKS = 180


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def d_ids(a, b):
    """Hamming distance from the id strings alone (independent of the code's helpers)."""
    return sum(x != y for x, y in zip(a.split("-"), b.split("-")))


def write_tasks(path, n=N_TASKS):
    path.write_text("".join(json.dumps({"task_id": f"toy-{i:04d}", "family": "lookup", "request": "?"}) + "\n"
                            for i in range(n)))
    return path


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A run folder with stages 01 and 02 done, and a task file."""
    root = tmp_path_factory.mktemp("base")
    run = root / "run"
    run_stage("01_harness_space.py", "--run", run)
    run_stage("02_orthogonal_design.py", "--run", run)
    return run, write_tasks(root / "tasks.jsonl")


def fresh_run(base, tmp_path, name="run"):
    run, _ = base
    out = tmp_path / name
    out.mkdir()
    (out / "train_harnesses.jsonl").write_text((run / "train_harnesses.jsonl").read_text())
    return out


def train_ids(run):
    return [h["harness_id"] for h in read_jsonl(run / "train_harnesses.jsonl")]


def assert_true_k_nearest(records, train, k):
    for r in records:
        ids = r["harness_ids"]
        assert len(ids) == k == len(set(ids)) and set(ids) <= set(train)
        anchor, chosen = ids[0], set(ids[1:])
        assert r["hamming_to_anchor"] == [d_ids(anchor, h) for h in ids]
        rest = [h for h in train if h != anchor and h not in chosen]
        if chosen and rest:
            # brute force: nothing left out is strictly closer than something chosen
            assert max(d_ids(anchor, h) for h in chosen) <= min(d_ids(anchor, h) for h in rest)


@pytest.mark.parametrize("k", [2, 3, 5, 12])
def test_locality_groups_are_k_nearest(base, tmp_path, k):
    run = fresh_run(base, tmp_path)
    run_stage("03_assignment.py", "--run", run, "--tasks", base[1], "--k", k, "--seed", 3)
    records = read_jsonl(run / "assignment.jsonl")
    assert [r["task_id"] for r in records] == [f"toy-{i:04d}" for i in range(N_TASKS)]
    assert_true_k_nearest(records, train_ids(run), k)


def test_ties_broken_by_seeded_draw_not_file_order(base, tmp_path):
    run = fresh_run(base, tmp_path)
    run_stage("03_assignment.py", "--run", run, "--tasks", base[1], "--k", 3)
    train = train_ids(run)
    by_anchor = defaultdict(list)
    for r in read_jsonl(run / "assignment.jsonl"):
        by_anchor[r["harness_ids"][0]].append(frozenset(r["harness_ids"][1:]))
    assert set(by_anchor) == set(train)                  # 180 tasks reach every anchor
    for anchor, groups in by_anchor.items():
        # in the L18 every row has 10 others at distance 3; file order would always take the same 2
        nearest = [h for h in train if h != anchor and d_ids(anchor, h) == 3]
        assert len(nearest) == 10
        if len(groups) >= 6:
            assert len(set(groups)) > 1, anchor
    first_two = Counter(g == frozenset([h for h in train if h != a and d_ids(a, h) == 3][:2])
                        for a, gs in by_anchor.items() for g in gs)
    assert first_two[False] > first_two[True]


def test_random_method(base, tmp_path):
    run = fresh_run(base, tmp_path)
    proc = run_stage("03_assignment.py", "--run", run, "--tasks", base[1], "--method", "random", "--k", 3)
    records = read_jsonl(run / "assignment.jsonl")
    train = train_ids(run)
    for r in records:
        assert len(set(r["harness_ids"])) == 3 and set(r["harness_ids"]) <= set(train)
    pairs = [d_ids(a, b) for a, b in itertools.combinations(train, 2)]
    expect = sum(pairs) / len(pairs)
    got = sum(d_ids(a, b) for r in records for a, b in itertools.combinations(r["harness_ids"], 2)) / (3 * len(records))
    assert abs(got - expect) < 0.15
    assert f"{expect:.3f} for random assignment" in proc.stdout


def test_printed_statistics_match_the_file(base, tmp_path):
    run = fresh_run(base, tmp_path)
    proc = run_stage("03_assignment.py", "--run", run, "--tasks", base[1])
    records = read_jsonl(run / "assignment.jsonl")
    train = train_ids(run)
    within = [sum(d_ids(a, b) for a, b in itertools.combinations(r["harness_ids"], 2)) / 3 for r in records]
    mean_within = sum(within) / len(within)
    pairs = [d_ids(a, b) for a, b in itertools.combinations(train, 2)]
    random_expect = sum(pairs) / len(pairs)
    m = re.search(r"mean within-group Hamming distance: ([\d.]+) \(locality.*?\) vs ([\d.]+) for random", proc.stdout)
    assert m, proc.stdout
    assert float(m.group(1)) == pytest.approx(mean_within, abs=1e-3)
    assert float(m.group(2)) == pytest.approx(random_expect, abs=1e-3)
    assert mean_within < random_expect
    usage = Counter(h for r in records for h in r["harness_ids"])
    config = json.loads((run / "03_assignment_config.json").read_text())
    assert config["usage"] == dict(usage) and sum(usage.values()) == 3 * N_TASKS
    for hid in train:
        assert re.search(rf"{hid}\s+{usage[hid]} \(", proc.stdout)


def test_same_seed_same_output_other_seed_other_draw(base, tmp_path):
    for method in ("locality", "random"):
        outs = []
        for i, seed in enumerate((7, 7, 8)):
            run = fresh_run(base, tmp_path, f"{method}{i}")
            run_stage("03_assignment.py", "--run", run, "--tasks", base[1], "--method", method, "--seed", seed)
            outs.append((run / "assignment.jsonl").read_text())
        assert outs[0] == outs[1]
        assert outs[0] != outs[2]


def test_four_level_component(tmp_path):
    run = tmp_path / "run"
    run_stage("01_harness_space.py", "--run", run)
    comps = json.loads((run / "components.json").read_text())
    comps["components"]["W"].append(dict(comps["components"]["W"][2], id="W3", desc="verify, no reminder",
                                         budget_reminder=None))
    path = tmp_path / "comps.json"
    path.write_text(json.dumps(comps))
    run_stage("01_harness_space.py", "--run", run, "--components", path)
    run_stage("02_orthogonal_design.py", "--run", run)
    tasks = write_tasks(tmp_path / "tasks.jsonl", 40)
    run_stage("03_assignment.py", "--run", run, "--tasks", tasks, "--k", 4)
    train = train_ids(run)
    assert len(train) == 36 and any("-W3" in h for h in train)
    assert_true_k_nearest(read_jsonl(run / "assignment.jsonl"), train, 4)


def test_out_of_space_training_harness_without_levels(base, tmp_path):
    """Black-box baselines train in an out-of-space harness ("levels": null, as in data/external_harnesses.json):
    K = 1 and --method random work; locality with K > 1 cannot measure Hamming distances and stops, naming the
    file, the line and the field."""
    external = {h["harness_id"]: h for h in json.loads((ROOT / "data" / "external_harnesses.json").read_text())}
    assert external["X-shell"]["levels"] is None
    tasks = write_tasks(tmp_path / "tasks.jsonl", 12)
    run = tmp_path / "one"
    run.mkdir()
    (run / "train_harnesses.jsonl").write_text(json.dumps(external["X-shell"]) + "\n")
    proc = run_stage("03_assignment.py", "--run", run, "--tasks", tasks, "--k", 1, "--method", "locality")
    records = read_jsonl(run / "assignment.jsonl")
    assert len(records) == 12 and all(r["harness_ids"] == ["X-shell"] and r["hamming_to_anchor"] == [0]
                                      for r in records)
    assert "mean within-group Hamming distance: n/a (K = 1)" in proc.stdout

    mixed = tmp_path / "mixed"
    mixed.mkdir()
    in_space = (base[0] / "train_harnesses.jsonl").read_text().splitlines()[:2]
    (mixed / "train_harnesses.jsonl").write_text("\n".join(in_space + [json.dumps(external["X-shell"])]) + "\n")
    for k in (2, 3):
        proc = run_stage("03_assignment.py", "--run", mixed, "--tasks", tasks, "--k", k, check=False)
        err = proc.stderr.strip()
        assert proc.returncode == 2 and err.startswith("error:") and len(err.splitlines()) == 1, err
        assert "train_harnesses.jsonl:3: field 'levels' is null" in err and "Hamming" in err, err
        assert "'X-shell'" in err and "--k 1" in err and not (mixed / "assignment.jsonl").exists()
    proc = run_stage("03_assignment.py", "--run", mixed, "--tasks", tasks, "--k", 3, "--method", "random")
    for r in read_jsonl(mixed / "assignment.jsonl"):  # a distance to X-shell is null, the others are counted
        anchor = r["harness_ids"][0]
        assert sorted(r["harness_ids"]) == sorted(train_ids(mixed)) and r["hamming_to_anchor"][0] == 0
        assert r["hamming_to_anchor"][1:] == [None if "X-shell" in (anchor, h) else d_ids(anchor, h)
                                              for h in r["harness_ids"][1:]]
    assert "n/a (undefined for a harness without levels)" in proc.stdout
    lines = (mixed / "train_harnesses.jsonl").read_text().splitlines()
    lines[2] = json.dumps({k: v for k, v in external["X-shell"].items() if k != "levels"})
    (mixed / "train_harnesses.jsonl").write_text("\n".join(lines) + "\n")
    proc = run_stage("03_assignment.py", "--run", mixed, "--tasks", tasks, "--k", 2, check=False)
    assert proc.returncode == 2 and "train_harnesses.jsonl:3: field 'levels' is missing" in proc.stderr, proc.stderr


@pytest.mark.parametrize("case", ["missing_tasks", "default_tasks_missing", "malformed_line", "no_task_id",
                                  "duplicate_id", "k_too_large", "k_zero", "unknown_method", "no_train"])
def test_bad_input(base, tmp_path, case):
    run = tmp_path / "run" if case == "no_train" else fresh_run(base, tmp_path)
    tasks = tmp_path / "tasks.jsonl"
    lines = [json.dumps({"task_id": f"t{i}"}) for i in range(5)]
    if case == "malformed_line":
        lines[2] = '{"task_id": "t2", '
    if case == "no_task_id":
        lines[1] = json.dumps({"id": "t1"})
    if case == "duplicate_id":
        lines[3] = lines[0]
    tasks.write_text("\n".join(lines) + "\n")
    args = ["--tasks", tasks]
    if case == "missing_tasks":
        args = ["--tasks", tmp_path / "nope.jsonl"]
    if case == "default_tasks_missing":
        args = []
    args += {"k_too_large": ["--k", 19], "k_zero": ["--k", 0], "unknown_method": ["--method", "nearest"]}.get(case, [])
    proc = run_stage("03_assignment.py", "--run", run, *args, cwd=tmp_path, check=False)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert "error" in err
    expect = {"missing_tasks": "nope.jsonl: file not found",
              "default_tasks_missing": "data/train_tasks.jsonl: file not found",
              "malformed_line": "tasks.jsonl:3: malformed JSON",
              "no_task_id": "tasks.jsonl:2: field 'task_id'",
              "duplicate_id": "tasks.jsonl:4: field 'task_id' 't0' repeats line 1",
              "k_too_large": "train_harnesses.jsonl has 18 configurations",
              "k_zero": "--k 0",
              "unknown_method": "invalid choice: 'nearest'",
              "no_train": "train_harnesses.jsonl: file not found"}[case]
    assert expect in err
    if case != "unknown_method":
        assert err.startswith("error:") and len(err.splitlines()) == 1
    assert not (run / "assignment.jsonl").exists() and not (run / "03_assignment_config.json").exists()
