"""The default tasks must be solved, not guessed (DESIGN.md, "Tasks and the environment"): for every family, each
guessing floor below, computed on the committed data/train_tasks.jsonl and data/test_tasks.jsonl with the verifier
itself (environment.score), is at most FLOOR on the test tasks. A guess writes nothing: it is scored on the untouched
workspace, so an edit task is never passed by an answer alone.

    constant       the best constant answer chosen on the family's TRAINING tasks (every answer that passes a training
                   task is a candidate; ties: the mean of the tied candidates), scored on its test tasks
    random file    a file name picked at random from the workspace (expected value)
    from request   any answer readable from the request itself: the whole request, each word (as is and stripped of
                   punctuation), each number, each file name, all its file names together (a task counts when one
                   of them passes: an upper bound on every such strategy)
    random subset  a random non-empty subset of the workspace's file names (expected value; "all files" is one)
Reported, not bounded (a guess that already reads files, and so does part of the work):
    random number  a number picked at random from a random workspace file that holds one (expected value)

    python -m pytest -q -s tests/test_task_floors.py     # -s prints the per-family table
    TASK_FLOORS_DIR=/tmp/tasks python -m pytest -q -s tests/test_task_floors.py   # another folder's task files
The oracle's solution of every task passes its checker, replayed through environment.Workspace.
"""
import itertools
import json
import os
import re
from pathlib import Path

import pytest

from common import environment as E
ROOT = Path(__file__).resolve().parents[1]
TASKS = Path(os.environ.get("TASK_FLOORS_DIR") or ROOT / "data")  # holds train_tasks.jsonl and test_tasks.jsonl
FLOOR = 0.05  # the most any guess may pass, per family
BOUNDED = ["constant", "random file", "from request", "random subset"]
COLUMNS = BOUNDED + ["random number"]
MAX_SOLUTION = 5  # calls: the small model's turn budget is 5 replies


def load(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


def passes(task, answer):
    """The verifier on the untouched workspace: what a guess that writes nothing scores."""
    return E.score(task["checker"], task["files"], answer)


def mean(xs):
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0


def accepted_answers(checker):
    """The answers a checker accepts on their own (its answer parts): the constants a guesser could learn."""
    if checker["type"] == "all":
        return [a for c in checker["checks"] for a in accepted_answers(c)]
    if checker["type"] == "answer_equals":
        return [str(checker["value"])]
    if checker["type"] == "answer_set":
        return [", ".join(checker["values"])]
    return []


def constant_floor(train, test):
    """Test pass rate of the constant that passes the most training tasks (mean over ties; 0 when none passes any)."""
    candidates = {E.normalise(a): a for t in train for a in accepted_answers(t["checker"])}
    train_rate = {c: mean(passes(t, a) for t in train) for c, a in candidates.items()}
    best = max(train_rate.values(), default=0.0)
    if best == 0:
        return 0.0
    return mean(mean(passes(t, candidates[c]) for t in test) for c, r in train_rate.items() if r == best)


def random_file_floor(tasks):
    return mean(mean(passes(t, name) for name in t["files"]) for t in tasks)


def request_answers(request):
    """Every answer readable from the request alone."""
    words = request.split()
    names = re.findall(r"[A-Za-z0-9_\-]+\.txt", request)
    out = {request, ", ".join(names)} | set(words) | {w.strip(".,;:!?'\"()") for w in words}
    return out | set(re.findall(r"\d+", request)) | set(names)


def request_floor(tasks):
    return mean(any(passes(t, a) for a in request_answers(t["request"])) for t in tasks)


def random_subset_floor(tasks):
    def one(t):
        names = sorted(t["files"])
        subsets = [s for k in range(1, len(names) + 1) for s in itertools.combinations(names, k)]
        return mean(passes(t, ", ".join(s)) for s in subsets)
    return mean(one(t) for t in tasks)


def random_number_floor(tasks):
    def one(t):
        numbers = [re.findall(r"\d+", text) for text in t["files"].values()]
        return mean(mean(passes(t, n) for n in ns) for ns in numbers if ns)
    return mean(one(t) for t in tasks)


def floors(train, test):
    """family -> {column: the floor on the family's test tasks}."""
    out = {}
    for family in sorted({t["family"] for t in test}):
        tr, te = [t for t in train if t["family"] == family], [t for t in test if t["family"] == family]
        out[family] = {"constant": constant_floor(tr, te), "random file": random_file_floor(te),
                       "from request": request_floor(te), "random subset": random_subset_floor(te),
                       "random number": random_number_floor(te), "n": len(te)}
    return out


def table(result):
    head = f"{'family':10}" + "".join(f"{c:>15}" for c in COLUMNS) + f"{'tasks':>7}"
    rows = [f"{f:10}" + "".join(f"{r[c]:>14.1%} " for c in COLUMNS) + f"{r['n']:>7}" for f, r in result.items()]
    return "\n".join([head] + rows)


@pytest.fixture(scope="module")
def committed():
    return load(TASKS / "train_tasks.jsonl"), load(TASKS / "test_tasks.jsonl")


def test_no_family_is_passed_by_guessing(committed):
    result = floors(*committed)
    print("\nguessing floors on the test tasks (pass rate):\n" + table(result))
    assert len(result) == 6 and all(r["n"] >= 20 for r in result.values())
    over = [(f, c, round(r[c], 3)) for f, r in result.items() for c in BOUNDED if r[c] > FLOOR + 1e-9]
    assert not over, over


def test_the_oracle_solution_of_every_task_passes_its_checker(committed):
    for t in committed[0] + committed[1]:
        ws = E.Workspace(t["files"])
        for step in t["solution"]:
            ws.call(step["tool"], step["args"])
        assert E.score(t["checker"], ws.files, ws.answer) == 1.0, t["task_id"]
        assert 2 <= len(t["solution"]) <= MAX_SOLUTION and t["solution"][-1]["tool"] == "submit", t["task_id"]
        assert sum(s["tool"] == "submit" for s in t["solution"]) == 1, t["task_id"]


def test_the_floors_see_a_guessable_family():
    """The floors can fail: a family answered by a small count is passed by its commonest answer, by the number in
    the request, by a random file name or subset."""
    def task(i, family, request, files, answer):
        return {"task_id": f"{family}-{i}", "family": family, "request": request, "files": files,
                "checker": {"type": "answer_equals", "value": answer}}
    files = {"a.txt": "code: 12", "b.txt": "pin: 17"}
    count = [task(i, "count", "How many files?", files, "2") for i in range(4)]
    echo = [task(i, "echo", f"Answer {10 + i}.", files, str(10 + i)) for i in range(4)]
    name = [task(i, "name", "Which file?", files, "a.txt") for i in range(4)]
    r = floors(count + echo + name, count + echo + name)
    assert r["count"]["constant"] == 1.0 and r["echo"]["from request"] == 1.0 and r["echo"]["constant"] == 0.25
    assert r["name"]["random file"] == 0.5 and r["name"]["random subset"] == 1 / 3
    assert r["count"]["random number"] == 0.0 and r["name"]["constant"] == 1.0
