"""common/schemas.py: the record tables and their one checker. Each table is checked against records made independently
of it (helpers_04's harness space, 01's realisations, the data files, the records 04 and the smolagents bridge write),
and each refusal against a message computed here: the first bad field, by name, in table order."""
import json
import random

import pytest
from conftest import ROOT, load_stage

from common import generation as G
import helpers_04 as H
from common import schemas as S
R = load_stage("04_rollout.py")
S01 = load_stage("01_harness_space.py")


def refused(capsys, fn, *args, **kw):
    """The one error line that fn(*args) stops with (exit 2)."""
    with pytest.raises(SystemExit) as e:
        fn(*args, **kw)
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: "), err
    return err[0][len("error: "):]


# ----------------------------------------------------------------------------- the checker
def test_check_record_stops_at_the_first_bad_field_in_table_order(capsys):
    # a table of 6 fields, 3 required; random records; the expected message is computed here, field by field
    table = {f"f{i}": ((lambda v: isinstance(v, int) and v >= 0), "an integer >= 0", i % 2 == 0) for i in range(6)}
    rng = random.Random(0)
    n_ok = n_missing = n_bad = 0
    for _ in range(300):
        rec = {f: rng.choice([3, 3, 3, 3, 0, -1, "x"]) for f in table if rng.random() < 0.9}
        expect = None
        for i in range(6):
            f = f"f{i}"
            if f not in rec and i % 2 == 0:
                expect = f"here: field 'p.{f}' is missing"
                n_missing += 1
                break
            if f in rec and not (isinstance(rec[f], int) and rec[f] >= 0):
                expect = f"here: field 'p.{f}' is {json.dumps(rec[f])}, not an integer >= 0"
                n_bad += 1
                break
        if expect is None:
            assert S.check_record(rec, table, "here", "p.") is rec
            n_ok += 1
        else:
            assert refused(capsys, S.check_record, rec, table, "here", "p.") == expect
    assert min(n_ok, n_missing, n_bad) > 20  # every branch was exercised


def test_long_values_are_clipped_in_the_message(capsys):
    msg = refused(capsys, S.check_record, {"a": "x" * 100}, {"a": (*S.BOOL, True)}, "w")
    assert msg == f"w: field 'a' is {json.dumps('x' * 100)[:40]}..., not true or false"


# ----------------------------------------------------------------------------- harness records
def all_harnesses():
    return (H.space_records() + S01.build_space(S01.COMPONENTS) + R.load_harness_file(R.EXTERNAL)
            + R.load_harness_file(ROOT / "data" / "example_harness.json"))


def test_every_harness_the_project_has_is_a_valid_record():
    hs = all_harnesses()
    assert len(hs) == 243 + 243 + 2 + 1
    for h in hs:
        assert S.validate_harness(h, "w") is h


BAD = [("O", "max_chars", "300"), ("O", "max_chars", 0), ("O", "max_chars", True), ("O", "line_numbers", "no"),
       ("C", "k", "2"), ("C", "k", -1), ("C", "mode", "all"), ("W", "plan_first", "yes"), ("W", "plan_prefix", 7),
       ("T", "max_calls_per_turn", 0), ("T", "syntax", "json"), ("S", "template", None), ("S", "placement", "x")]


@pytest.mark.parametrize("c,field,value", BAD)
def test_a_bad_value_is_refused_with_the_field_and_what_it_must_be(c, field, value, capsys):
    h = json.loads(json.dumps(H.by_id(H.space_records())["S0-T2-O1-C1-W1"]))
    h["specs"][c][field] = value
    ok, description, _ = S.HARNESS[c][field]
    assert not ok(value)
    msg = refused(capsys, S.validate_harness, h, "h.json")
    assert msg == f"h.json: field 'specs.{c}.{field}' is {json.dumps(value)}, not {description}"


@pytest.mark.parametrize("tool,entry", [("read_file", {"name": "cat", "args": {"file": "f"}}),
                                        ("read_file", {"name": "cat", "args": {"path": ""}}),
                                        ("submit", {"name": 3, "args": {"answer": "a"}}),
                                        ("shell", {"name": "sh", "args": {}})])
def test_a_bad_tool_entry_is_refused_by_name(tool, entry, capsys):
    h = json.loads(json.dumps(H.space_records()[0]))
    h["specs"]["T"]["tools"][tool] = entry
    assert f"field 'specs.T.tools.{tool}': needs a canonical tool" in refused(capsys, S.validate_harness, h, "w")


def test_max_calls_per_turn_is_optional_in_a_record_and_required_in_a_realisation(capsys):
    # 04 reads T.max_calls_per_turn with the default 1 (one call a turn, the base's): a record may leave it out ...
    h = json.loads(json.dumps(H.by_id(H.space_records())["S0-T1-O0-C0-W0"]))
    del h["specs"]["T"]["max_calls_per_turn"]
    S.validate_harness(h, "w")
    assert "at most 1 per reply" in R.tool_docs(h["specs"]["T"])
    ep = R.Episode({"task_id": "t", "family": "f", "request": "r", "files": {}, "checker": {"type": "answer_equals",
                                                                                        "value": "1"}}, h, 3, {})
    ep.step('<invoke name="ls"></invoke><invoke name="ls"></invoke>')
    assert ep.parse_errors == 1 and "at most 1 calls per reply" in ep.messages[-1]["content"]
    # ... while 01 asks its realisations to spell out every field but the out-of-space extras
    spec = dict(S01.COMPONENTS["T"][1])
    del spec["max_calls_per_turn"]
    assert refused(capsys, S.validate_component, "T", spec, "w", complete=True) == \
        "w: field 'max_calls_per_turn' is missing"
    for c, extras in S.OUT_OF_SPACE.items():  # the extras stay optional for 01 too; the rest are required
        for field, (_, _, required) in S.HARNESS[c].items():
            spec = {k: v for k, v in S01.COMPONENTS[c][0].items() if k != field}
            if field in extras:
                S.validate_component(c, spec, "w", complete=True)
            else:
                assert f"field '{field}' is missing" in refused(capsys, S.validate_component, c, spec, "w",
                                                                complete=True)


def test_a_record_needs_only_the_fields_the_interpreter_has_no_default_for(capsys):
    h = json.loads(json.dumps(H.space_records()[0]))
    for c in S.COMPONENTS:
        h["specs"][c] = {k: v for k, v in h["specs"][c].items() if S.HARNESS[c].get(k, (0, 0, False))[2]}
    S.validate_harness(h, "w")
    assert set(h["specs"]["O"]) == {"role", "template", "error_template"}
    ep = R.Episode(H.read_tasks()[0], h, 2, {})  # and 04 runs it, with the base's behaviour
    ep.step("no call")
    assert ep.parse_errors == 1 and not ep.done
    del h["specs"]["C"]["mode"]
    assert refused(capsys, S.validate_harness, h, "w") == "w: field 'specs.C.mode' is missing"


def test_01_needs_every_canonical_tool_and_a_record_needs_submit(capsys):
    spec = json.loads(json.dumps(S01.COMPONENTS["T"][0]))
    del spec["tools"]["search"]
    assert refused(capsys, S.validate_component, "T", spec, "w", complete=True) == \
        "w: field 'tools': needs an entry for the search tool"
    S.validate_component("T", spec, "w")
    del spec["tools"]["submit"]
    assert refused(capsys, S.validate_component, "T", spec, "w", prefix="specs.T.") == \
        "w: field 'specs.T.tools': needs an entry for the submit tool"


# ----------------------------------------------------------------------------- tasks and the assignment
def test_the_default_tasks_are_valid_and_bad_checkers_are_refused(tmp_path, capsys):
    for name in ("train_tasks.jsonl", "test_tasks.jsonl"):
        for t in H.read_tasks(name):
            S.check_record(t, S.TASK, name)
    ok = S.TASK["checker"][0]
    assert ok({"type": "all", "checks": [{"type": "answer_equals", "value": 1},
                                         {"type": "file_contains", "path": "a", "value": "b"}]})
    assert ok({"type": "answer_set", "values": ["a.txt", "B.txt"]}) and ok({"type": "answer_set", "values": ["7"]})
    assert ok({"type": "all", "checks": [{"type": "answer_set", "values": ["a.txt"]}]})
    for bad in ({"type": "all", "checks": []}, {"type": "all", "checks": [{"type": "file_equals", "value": "x"}]},
                {"type": "all", "checks": [["answer_equals"]]}, {"type": ["answer_equals"]}, {"type": "regex"},
                {"value": 1}, "answer_equals", None,
                # answer_set: a non-empty list of strings, each one item (a separator inside could never match)
                {"type": "answer_set"}, {"type": "answer_set", "value": "a.txt"}, {"type": "answer_set", "values": []},
                {"type": "answer_set", "values": "a.txt"}, {"type": "answer_set", "values": [7]},
                {"type": "answer_set", "values": ["a.txt b.txt"]}, {"type": "answer_set", "values": ["a.txt, b.txt"]},
                {"type": "answer_set", "values": [""]}, {"type": "answer_set", "values": ["and"]},
                {"type": "answer_set", "values": ["a.txt", None]}, {"type": "all", "checks": [{"type": "answer_set"}]}):
        assert not ok(bad), bad
    t = H.read_tasks()[0]
    H.write_jsonl(tmp_path / "t.jsonl", [t, dict(t, task_id="b", checker={"type": ["x"]})])
    msg = refused(capsys, S.load_tasks, tmp_path / "t.jsonl")
    assert msg.startswith(f"{tmp_path / 't.jsonl'}:2: field 'checker' is")
    H.write_jsonl(tmp_path / "t.jsonl", [t, dict(t, solution=[{"tool": "read_file", "args": {}}])])
    assert "t.jsonl:2: field 'solution' is" in refused(capsys, S.load_tasks, tmp_path / "t.jsonl")
    H.write_jsonl(tmp_path / "t.jsonl", [t, t])
    assert "t.jsonl:2: field 'task_id': duplicate id" in refused(capsys, S.load_tasks, tmp_path / "t.jsonl")
    family = {k: v for k, v in t.items() if k != "family"}
    H.write_jsonl(tmp_path / "t.jsonl", [family])
    assert S.load_tasks(tmp_path / "t.jsonl")[0]["family"] == "custom"


@pytest.mark.parametrize("row,needle", [
    ({"task_id": "a", "harness_ids": ["h1"]}, None),
    ({"task_id": "z", "harness_ids": ["h1"]}, "field 'task_id': 'z' is not a task of tasks.jsonl"),
    ({"task_id": "a", "harness_ids": []}, "field 'harness_ids' is [], not a non-empty list of harness ids"),
    ({"task_id": "a", "harness_ids": ["h1", "h9"]}, "field 'harness_ids': unknown harness id 'h9'"),
    ({"task_id": ["a"], "harness_ids": ["h1"]}, "field 'task_id' is [\"a\"], not a string"),
    ({"harness_ids": ["h1"]}, "field 'task_id' is missing")])
def test_assignment_lines(row, needle, tmp_path, capsys):
    H.write_jsonl(tmp_path / "assignment.jsonl", [{"task_id": "b", "harness_ids": ["h2", "h1"]}, row])
    args = (tmp_path / "assignment.jsonl", {"a": 0, "b": 0}, {"h1": 0, "h2": 0}, "tasks.jsonl")
    if needle is None:
        assert S.load_assignment(*args) == {"b": ["h2", "h1"], "a": ["h1"]}
    else:
        assert refused(capsys, S.load_assignment, *args) == f"{tmp_path / 'assignment.jsonl'}:2: {needle}"


# ----------------------------------------------------------------------------- rollout records
def oracle_records(tok=None):
    tasks = H.read_tasks("test_tasks.jsonl")[:6]
    space = H.space_records()
    jobs = [(t, space[(7 * i) % 243], {"episode_id": f"e{i}", "iteration": None, "visit": None,
                                       "group_id": f"g{i}", "sample_index": 0}) for i, t in enumerate(tasks)]
    jobs += [(tasks[0], h, {"episode_id": h["harness_id"], "iteration": 3, "visit": 1, "group_id": "g",
                            "sample_index": 2}) for h in R.load_harness_file(R.EXTERNAL)]
    records = R.run_episodes(jobs, "oracle", max_turns=2, progress=False)  # 2 turns: some run out of them
    for r in records:
        r["sampler"] = {"backend": "oracle", "dtype": None}
    return records


def test_the_rollout_table_lists_exactly_what_04_writes_and_accepts_it(capsys):
    records = oracle_records()
    assert {r["finish_reason"] for r in records} == {"submitted", "turn_budget"}
    required = {f for f, (_, _, req) in S.ROLLOUT.items() if req}
    for r in records:
        # a new field in 04's record is a new line in the table; `tools` is optional there (hand-made records for
        # 05 may leave it out), and 04 always writes it
        assert set(r) == required | {"tools"}
        S.check_record(r, S.ROLLOUT, "r")
    for field, value in (("reward", 2.0), ("success", 1), ("checks", [True]), ("finish_reason", "done"),
                         ("error_turns", [0]), ("transcript", [{"role": "user"}]), ("temperature", -1.0),
                         ("iteration", -1), ("model_turns", {}), ("sampler", "oracle")):
        bad = dict(records[0], **{field: value})
        assert refused(capsys, S.check_record, bad, S.ROLLOUT, "r:1") == \
            f"r:1: field '{field}' is {json.dumps(value)}, not {S.ROLLOUT[field][1]}"


def test_the_rollout_table_accepts_the_smolagents_bridges_records():
    pytest.importorskip("smolagents")
    from bridges import smolagents_harness as B
    tasks = H.read_tasks("test_tasks.jsonl")[:2]
    for r in B.run_smolagents_episodes(tasks, "oracle", None, None, 4, 64, 0.0, progress=False):
        r["sampler"] = {"backend": "oracle", "dtype": None}
        assert set(r) <= set(S.ROLLOUT)
        S.check_record(r, S.ROLLOUT, "smolagents")


# ----------------------------------------------------------------------------- the rollout reader (05, 06)
@pytest.fixture(scope="module")
def tokenized_records(tiny05):
    """04's oracle records with model_turns (token ids of the tiny05 tokenizer, no log-probs), and its vocab size."""
    tok = G.load_tokenizer(tiny05)
    tasks = H.read_tasks("test_tasks.jsonl")[:3]
    jobs = [(t, H.space_records()[11 * i], {"episode_id": f"e{i}", "iteration": 0, "visit": 0, "group_id": f"g{i}",
                                            "sample_index": 0}) for i, t in enumerate(tasks)]
    records = R.run_episodes(jobs, "oracle", tok=tok, max_turns=3, progress=False)
    for r in records:
        r["sampler"] = {"backend": "oracle", "dtype": None}
    assert all(r["model_turns"] and r["model_turns"][0]["completion_ids"] for r in records)
    return records, len(tok)


def test_load_rollouts_accepts_what_04_writes(tokenized_records, tmp_path):
    records, vocab = tokenized_records
    H.write_jsonl(tmp_path / "r.jsonl", records)
    need = {f: "" for f, (_, _, req) in S.ROLLOUT.items() if req}
    rows = S.load_rollouts(tmp_path / "r.jsonl", list(S.ROLLOUT), need, vocab=vocab)
    assert rows == [(n, json.loads(json.dumps(r))) for n, r in enumerate(records, 1)]
    assert S.load_rollouts(tmp_path / "r.jsonl", ["reward"], table=S.TRAIN_ROLLOUT) == rows
    (tmp_path / "empty.jsonl").write_text("\n")
    assert S.load_rollouts(tmp_path / "empty.jsonl", list(S.ROLLOUT), need) == []


@pytest.mark.parametrize("field,value", [("reward", 1.5), ("reward", float("nan")), ("success", 1),
                                         ("temperature", -0.5), ("temperature", "hot"), ("group_id", ["g"]),
                                         ("error_turns", [0]), ("finish_reason", "done"), ("model_turns", [3])])
def test_load_rollouts_refuses_a_bad_field_with_path_line_and_field(field, value, tokenized_records, tmp_path,
                                                                    capsys):
    records, vocab = tokenized_records
    H.write_jsonl(tmp_path / "r.jsonl", [records[0], dict(records[1], **{field: value}), records[2]])
    fields = list(S.ROLLOUT)
    msg = refused(capsys, S.load_rollouts, tmp_path / "r.jsonl", fields, vocab=vocab)
    assert msg == f"{tmp_path / 'r.jsonl'}:2: field '{field}' is {json.dumps(value)}, not {S.ROLLOUT[field][1]}"
    # a field the reader does not read is not checked
    assert len(S.load_rollouts(tmp_path / "r.jsonl", [f for f in fields if f != field])) == 3
    if field == "reward" and value == 1.5:  # 05's reading: any finite reward
        assert len(S.load_rollouts(tmp_path / "r.jsonl", fields, table=S.TRAIN_ROLLOUT)) == 3


def test_load_rollouts_needs_only_the_fields_asked_for_with_the_reason(tokenized_records, tmp_path, capsys):
    records, _ = tokenized_records
    short = {k: v for k, v in records[1].items() if k not in ("reward", "group_id")}
    H.write_jsonl(tmp_path / "r.jsonl", [records[0], short])
    path = tmp_path / "r.jsonl"
    assert len(S.load_rollouts(path, ["model_turns", "reward", "group_id"], {"model_turns": ""})) == 2
    assert refused(capsys, S.load_rollouts, path, ["model_turns", "reward", "group_id"],
                   {"group_id": " (needed by --algo grpo)"}) == f"{path}:2: field 'group_id' is missing (needed by " \
                                                                "--algo grpo)"
    assert refused(capsys, S.load_rollouts, path, ["reward"], {"reward": ""}) == f"{path}:2: field 'reward' is missing"


@pytest.mark.parametrize("change,needle", [
    (lambda t, v: t["completion_ids"].__setitem__(0, v), "model_turns[0].completion_ids has token id {v} outside "
                                                         "the policy's vocabulary (size {v})"),
    (lambda t, v: t["prompt_ids"].__setitem__(0, -1), "model_turns[0].prompt_ids has token id -1 outside"),
    (lambda t, v: t.__setitem__("prompt_ids", []), "model_turns[0].prompt_ids is empty"),
    (lambda t, v: t.__setitem__("completion_ids", [1.0]), "model_turns[0].completion_ids missing or not a list of ints"),
    (lambda t, v: t.__setitem__("logprobs", [0.0]), "model_turns[0].logprobs must be null or one finite number"),
    (lambda t, v: t.__setitem__("logprobs", [float("nan")] * len(t["completion_ids"])), "model_turns[0].logprobs")])
def test_load_rollouts_checks_model_turns_token_by_token(change, needle, tokenized_records, tmp_path, capsys):
    records, vocab = tokenized_records
    bad = json.loads(json.dumps(records[1]))
    change(bad["model_turns"][0], vocab)
    path = tmp_path / "r.jsonl"
    H.write_jsonl(path, [records[0], bad])
    msg = refused(capsys, S.load_rollouts, path, ["model_turns"], vocab=vocab)
    assert msg.startswith(f"{path}:2: {needle.format(v=vocab)}"), msg
    if "outside" in needle:  # without a vocabulary the ids are not bounded
        assert len(S.load_rollouts(path, ["model_turns"])) == 2
