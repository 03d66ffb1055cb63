"""Stage 01: the harness space, its records, the Hamming distance, bad input."""
import itertools
import json
import random
import re

import pytest

from conftest import load_stage, run_stage

LETTERS = ["S", "T", "O", "C", "W"]
# Field names as the contract spells them (typed here, not taken from the code).
CONTRACT_FIELDS = {
    "S": {"id", "desc", "template"},
    "T": {"id", "desc", "syntax", "declare", "max_calls_per_turn", "tools"},
    "O": {"id", "desc", "role", "template", "error_template", "max_chars", "truncate_marker", "line_numbers"},
    "C": {"id", "desc", "mode", "k", "elided_text"},
    "W": {"id", "desc", "rules", "plan_first", "plan_prefix", "budget_reminder", "verify_before_submit",
          "verify_marker"},
}


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def run01(tmp_path_factory):
    run = tmp_path_factory.mktemp("run01")
    proc = run_stage("01_harness_space.py", "--run", run)
    return run, proc


def test_space_size_ids_and_records(run01):
    run, proc = run01
    space = read_jsonl(run / "harness_space.jsonl")
    assert len(space) == 3 ** 5 == 243
    ids = [h["harness_id"] for h in space]
    assert len(set(ids)) == 243
    # every level combination exactly once, and the id spells the levels
    assert {tuple(h["levels"][c] for c in LETTERS) for h in space} == set(itertools.product(range(3), repeat=5))
    for h in space:
        assert h["harness_id"] == "-".join(f"{c}{h['levels'][c]}" for c in LETTERS)
        assert list(h["specs"]) == LETTERS
    comps = json.loads((run / "components.json").read_text())
    assert comps["order"] == LETTERS
    for h in space[::17]:
        for c in LETTERS:
            assert h["specs"][c] == comps["components"][c][h["levels"][c]]
    assert "243" in proc.stdout and (run / "01_harness_space_config.json").is_file()
    assert not list(run.glob("*.tmp"))


def test_realisations_follow_the_contract(run01):
    run, _ = run01
    comps = json.loads((run / "components.json").read_text())["components"]
    for c in LETTERS:
        assert len(comps[c]) == 3
        for i, spec in enumerate(comps[c]):
            assert set(spec) == CONTRACT_FIELDS[c], (c, i)
            assert spec["id"] == f"{c}{i}" and spec["desc"] and "\n" not in spec["desc"]
    s = comps["S"]
    assert s[0]["template"] == ("You are an agent in a small file workspace. Solve the user's task with the tools.\n"
                                "{tool_docs}\nWhen you know the answer, call {submit}.\n{workflow_rules}")
    assert s[1]["template"] == "Rules: finish with {submit}; at most {max_turns} replies.\n{workflow_rules}\nTools:\n{tool_docs}"
    assert s[2]["template"].startswith("# Role\nWorkspace assistant.\n# Tools\n{tool_docs}\n# Workflow")
    # S is independent of T: the submit tool is named through the {submit} placeholder (04 fills in T's name),
    # never by a name that some T realisation gives a tool
    tool_names = {tool["name"] for x in comps["T"] for tool in x["tools"].values()}
    for x in s + comps["W"]:
        text = x.get("template") or x.get("rules") or ""
        assert x["id"][0] == "W" or "{submit}" in text
        assert not [n for n in tool_names if re.search(rf"\b{n}\b", text.replace("{submit}", ""))], x["id"]
    t = comps["T"]
    assert [x["syntax"] for x in t] == ["hermes_json", "xml_invoke", "python_call"]
    assert [x["max_calls_per_turn"] for x in t] == [1, 1, 3]
    # the base declares its tools as every framework does (JSON schemas via the chat template); T1, T2 in the prompt
    assert [x["declare"] for x in t] == ["chat_template", "system_prompt", "system_prompt"]
    assert t[1]["tools"]["read_file"] == {"name": "open", "args": {"path": "file"}}
    assert t[1]["tools"]["submit"] == {"name": "final_answer", "args": {"answer": "result"}}
    assert t[2]["tools"]["write_file"] == {"name": "write", "args": {"path": "filename", "content": "body"}}
    assert t[2]["tools"]["calculator"] == {"name": "compute", "args": {"expression": "formula"}}
    assert t[0]["tools"]["list_files"] == {"name": "list_files", "args": {}}
    o = comps["O"]
    assert [x["role"] for x in o] == ["tool", "tool", "user"]
    assert [x["max_chars"] for x in o] == [2000, 2000, 300]
    assert [x["line_numbers"] for x in o] == [False, True, False]
    assert o[2]["truncate_marker"] == "...[truncated {n} chars]"
    assert o[1]["error_template"] == '<result tool="{tool}" status="error">{error}</result>'
    cm = comps["C"]
    assert [x["mode"] for x in cm] == ["full", "window", "elide"]
    assert cm[1]["k"] == 2 and cm[2]["k"] == 1 and cm[2]["elided_text"] == "[output elided]"
    w = comps["W"]
    assert w[0]["rules"] == "" and w[0]["budget_reminder"] is None
    assert w[1]["plan_first"] is True and w[1]["plan_prefix"] == "Plan:"
    assert w[2]["verify_before_submit"] is True and w[2]["verify_marker"] == "Checked:"
    assert w[2]["budget_reminder"] == "({left} replies left)"


def test_hamming_against_hand_and_id_strings():
    mod = load_stage("01_harness_space.py")
    a = {"S": 0, "T": 2, "O": 1, "C": 0, "W": 1}
    b = {"S": 0, "T": 1, "O": 1, "C": 2, "W": 1}     # differs on T and C
    assert mod.hamming(a, b) == 2 and mod.hamming(a, a) == 0
    assert mod.hamming({c: 0 for c in LETTERS}, {c: 2 for c in LETTERS}) == 5
    # independent: count differing tokens of the id strings
    rng = random.Random(0)
    for _ in range(200):
        x = {c: rng.randrange(3) for c in LETTERS}
        y = {c: rng.randrange(3) for c in LETTERS}
        tx, ty = mod.harness_id(x).split("-"), mod.harness_id(y).split("-")
        assert mod.hamming(x, y) == sum(p != q for p, q in zip(tx, ty))


def test_distance_profile_printed(run01):
    # from the base: C(5,d) * 2^d configurations at distance d
    _, proc = run01
    assert "d=0: 1, d=1: 10, d=2: 40, d=3: 80, d=4: 80, d=5: 32" in proc.stdout


def test_user_adds_a_fourth_realisation(run01, tmp_path):
    run, _ = run01
    comps = json.loads((run / "components.json").read_text())
    extra = dict(comps["components"]["C"][1], id="C3", desc="sliding window of 4 exchanges", k=4)
    comps["components"]["C"].append(extra)
    path = tmp_path / "mine.json"
    path.write_text(json.dumps(comps))
    out = tmp_path / "run"
    run_stage("01_harness_space.py", "--run", out, "--components", path)
    space = read_jsonl(out / "harness_space.jsonl")
    assert len(space) == 3 ** 4 * 4 == 324
    assert sum(h["levels"]["C"] == 3 for h in space) == 81
    assert any(h["harness_id"] == "S2-T1-O0-C3-W2" and h["specs"]["C"]["k"] == 4 for h in space)


@pytest.mark.parametrize("case", ["missing", "bad_json", "missing_field", "bad_id"])
def test_bad_components_file(run01, tmp_path, case):
    run, _ = run01
    comps = json.loads((run / "components.json").read_text())
    path = tmp_path / "mine.json"
    if case == "bad_json":
        path.write_text('{"order": ["S"],\n  "components": oops}')
    elif case == "missing_field":
        del comps["components"]["O"][2]["max_chars"]
        path.write_text(json.dumps(comps))
    elif case == "bad_id":
        comps["components"]["W"].append(dict(comps["components"]["W"][0], id="W9"))
        path.write_text(json.dumps(comps))
    out = tmp_path / "run"
    proc = run_stage("01_harness_space.py", "--run", out, "--components", path, check=False)
    assert proc.returncode == 2
    err = proc.stderr.strip()
    assert err.startswith("error:") and str(path) in err and len(err.splitlines()) == 1
    expect = {"missing": "not found", "bad_json": "mine.json:2", "missing_field": "'max_chars'", "bad_id": "'id'"}[case]
    assert expect in err
    if case == "missing_field":
        assert "component 'O', realisation 2" in err
    assert not out.exists() or not any(out.iterdir())
