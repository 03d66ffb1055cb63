"""smolagents as the out-of-space black box (bridges/smolagents_harness.py): the oracle solves every test task inside
the real framework, records keep 04's schema, the policy runs token-in/token-out through 04's backend, and
bad model output is an error observation or a scored failure, never a crash. Offline: no hub, no network."""
import importlib.resources
import json
import os
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import yaml  # noqa: E402  (a dependency of smolagents)

from common import environment as E  # noqa: E402
from common import generation as G  # noqa: E402
import helpers_04 as H  # noqa: E402
from conftest import load_stage  # noqa: E402

R = load_stage("04_rollout.py")
B = load_stage("bridges/smolagents_harness.py")
TEST_TASKS = R.load_tasks(H.ROOT / "data" / "test_tasks.jsonl")
TASK = next(t for t in TEST_TASKS if t["family"] == "lookup")  # answer_equals; files hold its answer
META = {"episode_id": "e", "iteration": None, "group_id": "g", "sample_index": 0}


class Scripted(B.EpisodeModel):
    """A model that replies fixed texts (the last one again when they run out); no token ids."""

    def __init__(self, replies):
        super().__init__(model_id="scripted")
        self.replies = list(replies)

    def reply(self, messages, prompt_ids):
        return self.replies[min(len(self.sent) - 1, len(self.replies) - 1)], None, None


def action(name, arguments):
    return "Action:\n" + json.dumps({"name": name, "arguments": arguments})


def run_scripted(replies, task=TASK, max_turns=3):
    model = Scripted(replies)
    ws = R.Workspace(task["files"])
    return B.run_episode(task, model, ws, max_turns, META, "scripted", 0.0), model


def observations(rec):
    """What smolagents showed after each reply (its rendering: 'Observation:' or 'Error:' as a user message)."""
    return [m["content"] for m in rec["transcript"][2:] if m["role"] == "user"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A tiny random policy (04's test model) with room for smolagents' ~2,700-token system prompt."""
    path = H.build_tiny_model(tmp_path_factory.mktemp("tiny_smol"), max_positions=8192, stop_logit=5.5)
    return path, G.load_tokenizer(path)


# ----------------------------------------------------------------------------- the oracle inside smolagents
def test_oracle_solves_every_test_task_inside_smolagents():
    records = B.run_smolagents_episodes(TEST_TASKS, "oracle", None, None, max_turns=6, max_new_tokens=128,
                                        temperature=0.0, progress=False)
    assert len(records) == len(TEST_TASKS) >= 100
    failed = [r["task_id"] for r in records if not r["success"]]
    assert not failed, f"the oracle failed inside smolagents on {failed[:5]}"
    assert {r["finish_reason"] for r in records} == {"submitted"}
    assert all(r["parse_errors"] == r["tool_errors"] == 0 for r in records)
    assert {r["family"] for r in records} == {t["family"] for t in TEST_TASKS}
    assert all(r["turns"] == len(t["solution"]) for r, t in zip(records, TEST_TASKS))


def test_records_have_04s_schema_and_name_the_framework():
    harness = H.space_records()[0]  # the base configuration
    meta = {"episode_id": "x", "iteration": None, "visit": None, "group_id": "x", "sample_index": 0}  # as 04's eval
    ours = R.run_episodes([(TASK, harness, meta)], "oracle", progress=False)[0]
    rec = B.run_smolagents_episodes([TASK], "oracle", None, None, 6, 128, 0.0, samples=2, progress=False)
    assert set(rec[0]) == set(ours) | {"framework"}
    # the per-turn facts of 06's metrics: no W rule here; the oracle's every step is a valid call
    assert rec[0]["workflow_checks"] == 0 and rec[0]["error_turns"] == []
    assert rec[0]["valid_call_turns"] == list(range(1, rec[0]["turns"] + 1))
    assert all(type(rec[0][k]) is type(ours[k]) for k in ours if rec[0][k] is not None and ours[k] is not None)
    assert json.loads(json.dumps(rec[0])) == rec[0]  # a JSONL line as 04 writes it
    assert rec[0]["framework"] == B.FRAMEWORK == B.harness_title() == f"smolagents {B.smolagents.__version__}"
    assert rec[0]["harness_id"] == B.HARNESS_ID == "X-smolagents"
    assert [r["group_id"] for r in rec] == [f"{TASK['task_id']}|X-smolagents|eval"] * 2
    assert [r["sample_index"] for r in rec] == [0, 1] and rec[1]["episode_id"].endswith("-s1")
    assert rec[0]["iteration"] is None and rec[0]["submitted_answer"] == TASK["checker"]["value"]
    assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in rec[0]["transcript"])


def test_the_oracle_with_a_tokenizer_records_ids_that_decode_to_its_replies(tiny):
    tok = tiny[1]
    task = next(t for t in TEST_TASKS if t["family"] == "sum")
    model = B.OracleModel(task, tok)
    rec = B.run_episode(task, model, R.Workspace(task["files"]), 6, META, "oracle", 0.0)
    assert rec["success"] and len(rec["model_turns"]) == rec["turns"] == len(task["solution"])
    for step, sent, turn in zip(task["solution"], model.sent, rec["model_turns"]):
        assert turn["prompt_ids"] == R.encode(tok, sent)
        assert turn["completion_ids"][-1] == tok.stop_ids[0] and turn["logprobs"] is None
        assert tok.decode(turn["completion_ids"], skip_special_tokens=True) == B.oracle_text(step)


def test_the_system_prompt_is_smolagents_own():
    rec, model = run_scripted([action("final_answer", {"answer": "1"})])
    shipped = yaml.safe_load(importlib.resources.files("smolagents.prompts").joinpath(
        "toolcalling_agent.yaml").read_text())["system_prompt"]
    system, user = model.sent[0]
    assert system["role"] == "system" and user == {"role": "user", "content": "New task:\n" + TASK["request"]}
    head = shipped.split("{%")[0].strip()  # the template's text before its first Jinja block
    assert len(head) > 500 and system["content"].startswith(head)
    assert "Now Begin!" in system["content"] and "- read_file: " in system["content"]
    for ours in H.S_TEMPLATES:  # none of our harness prompts
        assert ours.split("\n")[0][:30] not in system["content"]


# ----------------------------------------------------------------------------- the policy inside smolagents
def test_a_tiny_policy_runs_inside_smolagents_token_in_token_out(tiny):
    path, tok = tiny
    args = types.SimpleNamespace(temperature=1.0, max_new_tokens=24, seed=0)
    backend = G.HFBackend(path, tok, args)
    R.seed_everything(0)
    records = B.run_smolagents_episodes(TEST_TASKS[:3], str(path), backend, tok, max_turns=3, max_new_tokens=24,
                                        temperature=1.0, progress=False, positions=8192)
    for rec in records:
        assert 1 <= rec["turns"] <= 3 and len(rec["model_turns"]) == rec["turns"]
        assert rec["finish_reason"] in ("submitted", "turn_budget") and 0.0 <= rec["reward"] <= 1.0
        assert rec["parse_errors"] + rec["tool_errors"] <= rec["turns"]
        first = rec["model_turns"][0]
        assert first["prompt_ids"] == R.encode(tok, rec["transcript"][:2])  # smolagents' system prompt + task
        for turn in rec["model_turns"]:
            assert 0 < len(turn["completion_ids"]) <= 24 and len(turn["logprobs"]) == len(turn["completion_ids"])
            assert all(lp <= 0.0 for lp in turn["logprobs"])
    # token in, token out: every prompt is the encoding of the messages smolagents sent, and every completion is
    # the backend's sample, unchanged (replayed here through a recording backend)
    recording = H.Recording(backend)
    calls = recording.calls
    model = B.PolicyModel(recording, tok, 8192, 24)
    rec = B.run_episode(TEST_TASKS[0], model, R.Workspace(TEST_TASKS[0]["files"]), 3, META, "tiny", 1.0)
    assert len(calls) == len(model.sent) == rec["turns"] == len(rec["model_turns"])
    extended = 0
    for i, ((prompt, (ids, lps)), sent, turn) in enumerate(zip(calls, model.sent, rec["model_turns"])):
        assert prompt == turn["prompt_ids"]
        assert turn["completion_ids"] == ids and turn["logprobs"] == lps
        # smolagents sent what the model saw + its reply unchanged + new messages: the last ids + the sampled ids
        # (04's token-in/token-out) + the template's text after the reply; otherwise the rendered messages
        last = i and rec["model_turns"][i - 1]
        reply = i and tok.decode(last["completion_ids"], skip_special_tokens=True)
        if i and sent[:len(model.sent[i - 1]) + 1] == model.sent[i - 1] + [{"role": "assistant", "content": reply}]:
            extended += 1
            k = len(last["prompt_ids"]) + len(last["completion_ids"])
            assert prompt[:k] == last["prompt_ids"] + last["completion_ids"]
            before, now = (tok.apply_chat_template(m, add_generation_prompt=True, tokenize=False)
                           for m in (model.sent[i - 1], sent))
            tail = now[len(before) + len(reply) + (len("<|im_end|>") if last["completion_ids"][-1] in tok.stop_ids
                                                   else 0):]
            assert now.startswith(before + reply) and prompt[k:] == tok.encode(tail, add_special_tokens=False)
        else:
            assert prompt == R.encode(tok, sent)
    assert rec["rerendered_turns"] == rec["turns"] - 1 - extended


def test_a_prompt_over_the_positions_ends_the_episode_as_context_limit(tiny):
    path, tok = tiny
    backend = G.HFBackend(path, tok, types.SimpleNamespace(temperature=1.0, max_new_tokens=16, seed=0))
    rec = B.run_smolagents_episodes([TASK], str(path), backend, tok, 3, 16, 1.0, progress=False,
                                    positions=1000)[0]
    assert rec["finish_reason"] == "context_limit" and rec["turns"] == 0 and rec["reward"] == 0.0


# ----------------------------------------------------------------------------- bad model output: never a crash
def test_a_malformed_reply_is_a_parse_error_observation():
    rec, model = run_scripted(["I think the answer is in the file.", "Action:\n{\"name\": \"read_file\", "
                               "\"arguments\": {\"path\": "], max_turns=2)
    assert rec["parse_errors"] == 2 and rec["tool_errors"] == 0 and rec["turns"] == 2
    assert rec["error_turns"] == [1, 2] and rec["valid_call_turns"] == []
    assert rec["finish_reason"] == "turn_budget" and rec["reward"] == 0.0 and not rec["success"]
    assert "Error while parsing tool call from model output" in observations(rec)[0]


def test_an_unknown_tool_a_bad_name_and_bad_arguments_are_tool_errors():
    rec, model = run_scripted([action("rm_rf", {"path": "/"}), '{"name": ["read_file"], "arguments": {}}',
                               action("read_file", {"file": "a.txt"}), action("read_file", {"path": 7}),
                               action("final_answer", {"answer": TASK["checker"]["value"]})], max_turns=6)
    shown = observations(rec)
    assert "Unknown tool rm_rf" in shown[0] and "Unknown tool" in shown[1]
    assert "file is not in the tool's input schema" in shown[2] and "should be 'string'" in shown[3]
    assert rec["tool_errors"] == 4 and rec["parse_errors"] == 0
    assert rec["finish_reason"] == "submitted" and rec["success"] and rec["turns"] == 5
    assert rec["error_turns"] == [1, 2, 3, 4] and rec["valid_call_turns"] == [5]  # step 4's error recovered at 5


def test_a_huge_argument_and_a_path_outside_the_workspace_are_our_tool_errors():
    rec, model = run_scripted([action("write_file", {"path": "big.txt", "content": "x" * (E.MAX_ARG + 1)}),
                               action("read_file", {"path": "../x"}), action("read_file", {"path": "/etc/passwd"}),
                               action("final_answer", {"answer": "y" * (E.MAX_ARG + 1)})], max_turns=4)
    shown = observations(rec)
    assert f"ToolError: argument 'content' too long ({E.MAX_ARG} chars max)" in shown[0]
    assert "ToolError: path must stay inside the workspace: ../x" in shown[1]
    assert "ToolError: path must stay inside the workspace" in shown[2]
    assert rec["tool_errors"] == 4 and rec["finish_reason"] == "turn_budget" and rec["submitted_answer"] is None


def test_the_step_limit_ends_the_episode_without_an_extra_model_call():
    rec, model = run_scripted([action("list_files", {})], max_turns=3)
    assert len(model.sent) == rec["turns"] == 3  # smolagents' forced final-answer call is not made
    assert rec["finish_reason"] == "turn_budget" and rec["reward"] == 0.0 and rec["submitted_answer"] is None
    assert rec["parse_errors"] == rec["tool_errors"] == 0
    assert "\n".join(sorted(TASK["files"])) in observations(rec)[0]


def test_a_wrong_final_answer_scores_zero_and_a_right_one_one():
    wrong, _ = run_scripted([action("final_answer", {"answer": "999999"})])
    assert wrong["finish_reason"] == "submitted" and wrong["submitted_answer"] == "999999"
    assert wrong["reward"] == 0.0 and not wrong["success"] and wrong["turns"] == 1
    value = TASK["checker"]["value"]
    # the forms smolagents' own prompt teaches: a number, and a bare string as "arguments"
    for reply in (action("final_answer", {"answer": int(value)}), action("final_answer", value)):
        right, _ = run_scripted([reply])
        assert right["success"] and right["submitted_answer"] == value


def test_text_after_a_stop_sequence_is_cut_like_an_api_with_stop():
    rec, model = run_scripted([action("read_file", {"path": "nope.txt"}) + "\nObservation: the code is 1",
                               action("final_answer", {"answer": "1"}) + "\nCalling tools: more"], max_turns=3)
    assert "the code is 1" not in model.sent[1][-2]["content"]  # the reply as smolagents stored it
    assert "ToolError: no such file: nope.txt" in observations(rec)[0]
    assert rec["tool_errors"] == 1 and rec["finish_reason"] == "submitted" and rec["submitted_answer"] == "1"


def test_tools_keep_04s_semantics():
    task = next(t for t in TEST_TASKS if t["family"] == "edit")
    path = task["checker"]["checks"][0]["path"]
    replies = [action("search", {"query": path.split(".")[0]}), action("calculator", {"expression": "2**10+1"}),
               action("calculator", {"expression": "__import__('os')"}),
               action("write_file", {"path": path, "content": "changed"}), action("read_file", {"path": path})]
    rec, model = run_scripted(replies, task=task, max_turns=5)
    shown = observations(rec)
    assert shown[1] == "Observation:\n1025" and "ToolError: only numbers" in shown[2]
    assert shown[4].startswith("Observation:\nchanged\n") and rec["tool_errors"] == 1


def test_bad_input_is_a_clear_error():
    no_solution = dict(TASK, solution=None)
    with pytest.raises(B.BridgeError, match="needs a 'solution'"):
        B.run_smolagents_episodes([no_solution], "oracle", None, None, 6, 128, 0.0, progress=False)
    with pytest.raises(B.BridgeError, match="max_turns"):
        B.run_smolagents_episodes([TASK], "oracle", None, None, 0, 128, 0.0, progress=False)


# ----------------------------------------------------------------------------- through 04's command line
def test_04_cli_runs_the_oracle_inside_smolagents(tmp_path):
    from conftest import run_stage
    out = tmp_path / "smol.jsonl"
    proc = run_stage("04_rollout.py", "--run", tmp_path, "--eval", "--policy", "oracle", "--harnesses", "smolagents",
                     "--out", out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(TEST_TASKS) and all(r["success"] for r in rows)
    assert {r["harness_id"] for r in rows} == {B.HARNESS_ID} and rows[0]["framework"] == B.FRAMEWORK
    config = json.loads((tmp_path / "smol.04_rollout_config.json").read_text())
    assert config["episodes"] == len(TEST_TASKS) and config["versions"]["smolagents"] == B.smolagents.__version__
    assert "success 1.000" in proc.stdout


def test_04_cli_reports_the_bridges_bad_input(tmp_path):
    """The bridge's own error (a task the oracle cannot solve: no solution) reaches 04's command line as one error
    line with exit status 2, and nothing is written."""
    from conftest import run_stage
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / "out" / "smol.jsonl"
    tasks.write_text(json.dumps({k: v for k, v in TASK.items() if k != "solution"}) + "\n")
    proc = run_stage("04_rollout.py", "--run", tmp_path, "--eval", "--policy", "oracle", "--harnesses", "smolagents",
                     "--tasks", tasks, "--out", out, check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == f"error: task {TASK['task_id']!r}: the oracle needs a 'solution'"
    assert not (tmp_path / "out").exists()
