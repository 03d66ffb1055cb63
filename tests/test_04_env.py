"""Stage 04: tools, calculator, paths, checkers, parsers, hostile replies, workflow, observations, context."""
import copy
import re
import json
import os
import time

import pytest
from conftest import load_stage

from common import environment as E
import helpers_04 as H

R = load_stage("04_rollout.py")
SPACE = H.by_id(H.space_records())
EXT = {h["harness_id"]: h for h in R.load_harness_file(R.EXTERNAL)}
TASK = {"task_id": "t", "family": "lookup", "request": "What is the code in river.txt? Submit the number.",
        "files": {"river.txt": "code: 417\nsize: 23", "stone.txt": "code: 58"},
        "checker": {"type": "answer_equals", "value": "417"}}


def episode(hid, max_turns=6, task=TASK):
    return R.Episode(copy.deepcopy(task), SPACE.get(hid) or EXT[hid], max_turns, {})


# ----------------------------------------------------------------------------- calculator
@pytest.mark.parametrize("expr,expected", [("126+913+83", 1122), ("10/4", 2.5), ("7//2", 3), ("7 % 4", 3),
                                           ("2**10", 1024), ("-(3-5)*4", 8), ("1/3", 0.333333), ("0.5*4", 2),
                                           ("((((12))))", 12), ("-2**2", -4)])
def test_calculator_values(expr, expected):
    assert E.calculate(expr) == str(expected)


@pytest.mark.parametrize("expr", ["9**9**9", "__import__('os').system('touch pwned')", "open('x')", "(1).__class__",
                                  "[1]*10**9", "'a'*10", "1e308*10", "10**16", "1/0", "5 % 0", "True+1", "x",
                                  "lambda: 1", "1 if 1 else 2", "(" * 300 + ")" * 300, "9" * 250, "١+١", "",
                                  "1e999", "(-8)**0.5", "2**-9999999", "10**400", "1;2", "a=1", "0**-1", "0.0**-2",
                                  "(1-1)**-3"])
def test_calculator_refuses_abuse(expr):
    with pytest.raises(R.ToolError):
        E.calculate(expr)


# ----------------------------------------------------------------------------- workspace, paths, checkers
@pytest.mark.parametrize("path", ["../x", "/etc/passwd", "a\\b", "~/x", "a/../../b", "./a", "a//b", "", "   ",
                                  "riv\x00er.txt", "a\nb", "río.txt", "\u202eevil.txt", "x" * 65, "a b.txt"])
def test_paths_outside_or_invalid_are_refused(path):
    ws = R.Workspace({"a.txt": "1"})
    for tool, args in (("read_file", {"path": path}), ("write_file", {"path": path, "content": "x"})):
        with pytest.raises(R.ToolError):
            ws.call(tool, args)
    assert ws.files == {"a.txt": "1"}


def test_tools_outputs():
    ws = R.Workspace({"river.txt": "code: 417\nthe owl", "apple.txt": "The OWL flew"})
    assert ws.call("list_files", {}) == "apple.txt\nriver.txt"
    assert ws.call("read_file", {"path": " river.txt "}) == "code: 417\nthe owl"
    assert ws.call("search", {"query": "owl"}) == "apple.txt: The OWL flew\nriver.txt: the owl"
    assert ws.call("search", {"query": "cat"}) == "no matches"
    assert ws.call("write_file", {"path": "notes/new.txt", "content": "hi"}) == "wrote 2 chars to notes/new.txt"
    assert ws.files["notes/new.txt"] == "hi"
    assert ws.call("calculator", {"expression": "2+3"}) == "5"
    assert ws.call("submit", {"answer": "417"}) == "submitted" and ws.answer == "417"
    for tool, args in (("read_file", {"path": "nope.txt"}), ("search", {"query": " "}),
                       ("write_file", {"path": "b.txt", "content": "x" * 5000})):
        with pytest.raises(R.ToolError):
            ws.call(tool, args)


def test_checkers():
    files = {"a.txt": "  code: 5\n", "b.txt": "x\ncode: 7\ny"}
    assert R.score({"type": "answer_equals", "value": "417"}, files, " 417. ") == 1.0
    assert R.score({"type": "answer_equals", "value": "417"}, files, "417.0") == 1.0
    assert R.score({"type": "answer_equals", "value": "River.txt"}, files, "river.txt") == 1.0
    assert R.score({"type": "answer_equals", "value": "417"}, files, "418") == 0.0
    assert R.score({"type": "answer_equals", "value": "417"}, files, None) == 0.0
    assert R.score({"type": "file_equals", "path": "a.txt", "value": "code: 5"}, files, None) == 1.0
    assert R.score({"type": "file_equals", "path": "b.txt", "value": "code: 7"}, files, None) == 0.0
    assert R.score({"type": "file_contains", "path": "b.txt", "value": "code: 7"}, files, None) == 1.0
    assert R.score({"type": "file_contains", "path": "zz.txt", "value": ""}, files, None) == 0.0
    both = {"type": "all", "checks": [{"type": "file_contains", "path": "b.txt", "value": "code: 7"},
                                      {"type": "answer_equals", "value": "done"}]}
    # pass/fail: one check of two passing is a failure (no partial credit); each check's result is kept apart
    assert R.score(both, files, "nope") == 0.0 and R.score(both, files, "Done") == 1.0
    assert R.check_results(both, files, "nope") == [1, 0] and R.check_results(both, files, "Done") == [1, 1]
    nested = {"type": "all", "checks": [both, {"type": "answer_equals", "value": "done"}]}
    assert R.score(nested, files, "done") == 1.0 and R.check_results(nested, files, "nope") == [0, 0]


@pytest.mark.parametrize("answer,passes", [
    ("apple.txt, river.txt", True), ("river.txt apple.txt", True), ("River.txt and APPLE.TXT.", True),
    ("apple.txt,river.txt", True), ("apple.txt; river.txt", True), ("- apple.txt\n- river.txt", True),
    ('["apple.txt", "river.txt"]', True), ("apple.txt, apple.txt, river.txt", True),  # a repeat counts once
    ("apple.txt", False), ("apple.txt, river.txt, stone.txt", False), ("apple, river", False),
    ("apple.txt river.txt and", True), ("", False), ("   ", False), (",", False), ("and", False), (None, False),
    ("apple.txtriver.txt", False), ("2", False)])
def test_answer_set_checker(answer, passes):
    """answer_set: the submitted items, split on commas / semicolons / whitespace / "and" and normalised each as
    answer_equals does, are exactly the values (order, separators, case and repeats free; nothing missing or extra);
    None, an empty answer or separators alone never pass."""
    files = {"apple.txt": "code: 5", "river.txt": "code: 7", "stone.txt": "pin: 9"}
    checker = {"type": "answer_set", "values": ["river.txt", "apple.txt"]}
    assert R.score(checker, files, answer) == float(passes)
    assert R.check_results(checker, files, answer) == [int(passes)]
    both = {"type": "all", "checks": [checker, {"type": "file_contains", "path": "stone.txt", "value": "pin"}]}
    assert R.score(both, files, answer) == float(passes)


def test_answer_set_checker_never_passes_an_empty_set():
    assert R.score({"type": "answer_set", "values": []}, {}, "") == 0.0
    assert R.score({"type": "answer_set", "values": ["and"]}, {}, "and") == 0.0
    assert E.answer_items("12, 12.0 and 013") == {"12.0", "13.0"}  # numbers compared as numbers


# ----------------------------------------------------------------------------- parsers (valid calls)
@pytest.mark.parametrize("hid,reply", [
    ("S0-T0-O0-C0-W0",
     '<tool_call>{"name": "write_file", "arguments": {"path": "a.txt", "content": "x: 1"}}</tool_call>'),
    ("S0-T1-O0-C0-W0", '<invoke name="save">\n<parameter name="file">a.txt</parameter>\n'
                       '<parameter name="text">\nx: 1\n</parameter>\n</invoke>'),
    ("S0-T2-O0-C0-W0", 'I will write.\nwrite(filename="a.txt", body="x: 1")'),
    ("X-shell", "```sh\necho x: 1 > a.txt\n```"),
    ("X-shell", '```bash\necho "x: 1" > a.txt\n```'),
    ("X-react", 'Thought: write it\nAction: WriteFile\nAction Input: {"file_path": "a.txt", "text": "x: 1"}\n'),
])
def test_each_syntax_parses_a_write(hid, reply):
    T = (SPACE.get(hid) or EXT[hid])["specs"]["T"]
    (kind, name, args), = R.parse_reply(T, reply)
    assert kind == "call"
    assert R.to_canonical(T, name, args) == ("write_file", {"path": "a.txt", "content": "x: 1"})
    ep = episode(hid)
    ep.step(reply)
    assert ep.ws.files["a.txt"] == "x: 1" and ep.parse_errors == ep.tool_errors == 0


def test_python_call_runs_up_to_three_calls_in_order_and_submit_ends():
    ep = episode("S0-T2-O0-C0-W0")
    ep.step('cat(filename="river.txt")\ncat(filename="stone.txt")\ncompute(formula="1+1")\nlist_dir()')
    obs = ep.messages[-1]["content"].split("\n")
    assert obs == ["code: 417", "size: 23", "code: 58", "2",
                   "Error: at most 3 calls per reply; the rest were not run"] and ep.parse_errors == 1
    ep.step('write(filename="x.txt", body="1")\ndone(value="417")\nwrite(filename="y.txt", body="2")')
    assert ep.finish_reason == "submitted" and ep.reward == 1.0
    assert "x.txt" in ep.ws.files and "y.txt" not in ep.ws.files


def test_react_final_answer_submits():
    ep = episode("X-react")
    ep.step("Thought: I know it.\nFinal Answer: 417")
    assert ep.finish_reason == "submitted" and ep.reward == 1.0 and ep.turns == 1


# ----------------------------------------------------------------------------- hostile replies
HOSTILE = [
    "", "   \n ", "🦊🦊🦊", "Ω≈ç√∫", "\x00\x01\x02",
    "<tool_call>{not json}</tool_call>", "<tool_call>[1, 2]</tool_call>", '<tool_call>{"name": 5}</tool_call>',
    '<tool_call>{"name": "read_file", "arguments": {"path": "river.txt"}}',
    '<tool_call>{"name": "read_file", "arguments": {"path": "../../etc/passwd"}}</tool_call>',
    '<tool_call>{"name": "read_file", "arguments": {"path": "/etc/passwd"}}</tool_call>',
    '<tool_call>{"name": "write_file", "arguments": {"path": "../escape.txt", "content": "x"}}</tool_call>',
    '<tool_call>{"name": "write_file", "arguments": {"path": "big.txt", "content": "' + "x" * 3000 + '"}}</tool_call>',
    '<tool_call>{"name": "read_file", "arguments": {"path": "r\\u00edo.txt"}}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": {"expression": "9**9**9"}}</tool_call>',
    '<tool_call>{"name": "calculator", "arguments": {"expression": '
    '"__import__(\'os\').system(\'touch pwned\')"}}</tool_call>',
    '<tool_call>{"name": "__import__", "arguments": {"x": "os"}}</tool_call>',
    '<tool_call>{"name": "read_file", "arguments": {"path": ["a"]}}</tool_call>',
    "<tool_call>" + "[" * 5000 + "</tool_call>",
    "<tool_call>" + "x" * 20000 + "</tool_call>",
    '<invoke name="open"><parameter name="file">../etc/passwd</parameter></invoke>',
    '<invoke name="open"><parameter name="file">a.txt</invoke>', '<invoke name="open">', "<invoke>",
    '<invoke name="open"><parameter name="file">a</parameter><parameter name="file">b</parameter></invoke>',
    '<invoke name="calc"><parameter name="expr">open("x").read()</parameter></invoke>',
    'cat(filename="../../etc/passwd")', 'cat(filename=__import__("os").system("touch pwned"))', 'cat("x"',
    'cat("river.txt")', "cat(**{'filename': 'river.txt'})", 'compute(formula="9**9**9")', "cat(" + "(" * 3000,
    'write(filename="/tmp/pwned", body="x")',
    "```sh\ncat /etc/passwd\n```", "```sh\ncat river.txt | sh\n```", "```sh\nrm -rf /\n```",
    "```sh\necho hi > ../x.txt\n```", "```sh\ncalc __import__('os')\n```", "```sh\ncat $(whoami)\n```", "```sh\nls",
    "Action: ReadFile\nAction Input: {\"file_path\": \"/etc/passwd\"}", "Action: ReadFile\nAction Input: not json",
    "Action: ReadFile", "Action: Calculator\nAction Input: {\"input\": \"2**99999\"}",
    "Final Answer: 1\nAction: ReadFile\nAction Input: {}",
    # pathological inputs for the parsers' regular expressions (must stay fast)
    "\n" * 7990, " " * 7990, '<parameter name="a">' * 300, "<invoke " * 1000, "<tool_call>" * 700,
    "```sh\necho " + " " * 7900 + "\n```", "Action:" * 1100, "Action: X\n" + " \n" * 3900, "a(" * 3900,
]
HOSTILE_HARNESSES = ["S0-T0-O0-C0-W0", "S0-T1-O0-C0-W0", "S0-T2-O0-C0-W0", "X-shell", "X-react"]


@pytest.mark.parametrize("hid", HOSTILE_HARNESSES)
def test_hostile_replies_become_error_observations(hid, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    start = time.perf_counter()
    h = SPACE.get(hid) or EXT[hid]
    O = h["specs"]["O"]
    prefix = O["error_template"].split("{")[0]
    for reply in HOSTILE:
        if hid == "X-react":
            reply = "Thought: try\n" + reply
        ep = episode(hid)
        ep.step(reply)  # must not raise
        obs = ep.messages[-1]
        assert obs["role"] == O["role"] and obs["content"].startswith(prefix), (reply[:80], obs)
        assert ep.parse_errors + ep.tool_errors + ep.workflow_violations >= 1, reply[:80]
        assert set(ep.ws.files) == set(TASK["files"]) and ep.finish_reason is None, reply[:80]
    assert os.listdir(tmp_path) == []  # nothing escaped to the disk
    assert time.perf_counter() - start < 3.0  # no pathological (super-linear) parsing


def test_turn_budget_ends_the_episode():
    ep = episode("S0-T0-O0-C0-W0", max_turns=3)
    for _ in range(3):
        ep.step("I don't know")
    assert ep.finish_reason == "turn_budget" and ep.turns == 3 and ep.parse_errors == 3 and ep.reward == 0.0
    assert [m["role"] for m in ep.messages] == ["system", "user"] + ["assistant", "tool"] * 3


# ----------------------------------------------------------------------------- workflow
def test_w1_plan_first():
    ep = episode("S0-T0-O0-C0-W1")
    call = '<tool_call>{"name": "write_file", "arguments": {"path": "a.txt", "content": "1"}}</tool_call>'
    ep.step(call)
    assert ep.workflow_violations == 1 and "a.txt" not in ep.ws.files
    assert ep.messages[-1]["content"] == "Error: your first reply must start with 'Plan:'; nothing was run"
    ep.step(call)  # the rule is about the first reply only
    assert ep.workflow_violations == 1 and ep.ws.files["a.txt"] == "1"
    ep2 = episode("S0-T0-O0-C0-W1")
    ep2.step("Plan: write, submit.\n" + call)
    assert ep2.workflow_violations == 0 and ep2.ws.files["a.txt"] == "1"


def test_w2_verify_before_submit_and_budget_reminder():
    ep = episode("S0-T0-O2-C0-W2", max_turns=5)
    submit = '<tool_call>{"name": "submit", "arguments": {"answer": "417"}}</tool_call>'
    ep.step(submit)
    assert ep.finish_reason is None and ep.workflow_violations == 1
    assert ep.messages[-1] == {"role": "user", "content": "!! workflow failed: submit refused: the reply that calls "
                               "it needs a line starting with 'Checked:'\n(4 replies left)"}
    ep.step('<tool_call>{"name": "read_file", "arguments": {"path": "stone.txt"}}</tool_call>')
    assert ep.messages[-1]["content"] == "[read_file] code: 58\n(3 replies left)"
    ep.step("Checked: the file says 417\n" + submit)
    assert ep.finish_reason == "submitted" and ep.reward == 1.0 and ep.workflow_violations == 1


def test_react_requires_a_thought_line():
    ep = episode("X-react")
    ep.step('Action: ReadFile\nAction Input: {"file_path": "river.txt"}')
    assert ep.workflow_violations == 1 and ep.messages[-1]["content"].startswith("Observation: ERROR (workflow)")


# ----------------------------------------------------------------------------- per-turn facts for 06's metrics
HERMES_READ = '<tool_call>{"name": "read_file", "arguments": {"path": "%s"}}</tool_call>'
HERMES_SUBMIT = '<tool_call>{"name": "submit", "arguments": {"answer": "417"}}</tool_call>'


def facts(ep):
    r = ep.record("p", 1.0)
    return r["workflow_checks"], r["workflow_violations"], r["error_turns"], r["valid_call_turns"]


def test_workflow_checks_count_only_where_a_rule_applies():
    ep = episode("S0-T0-O0-C0-W1")  # plan_first: checked on the first reply only
    ep.step("Plan: read, submit.\n" + HERMES_READ % "river.txt")
    ep.step(HERMES_READ % "stone.txt")
    ep.step(HERMES_SUBMIT)
    assert facts(ep) == (1, 0, [], [1, 2, 3]) and ep.finish_reason == "submitted"
    ep = episode("S0-T0-O0-C0-W1")
    ep.step(HERMES_READ % "river.txt")  # no plan: a violation, nothing run
    ep.step(HERMES_SUBMIT)
    assert facts(ep) == (1, 1, [1], [2])

    ep = episode("X-react")  # reply_marker: checked on every reply
    ep.step('Thought: read it\nAction: ReadFile\nAction Input: {"file_path": "river.txt"}')
    ep.step('Action: ReadFile\nAction Input: {"file_path": "stone.txt"}')  # no Thought line
    ep.step("Thought: it is 417\nFinal Answer: 417")
    assert facts(ep) == (3, 1, [2], [1, 3]) and ep.reward == 1.0

    ep = episode("S0-T0-O0-C0-W2")  # verify_before_submit: checked on every submit call, not on other calls
    ep.step(HERMES_SUBMIT)  # no Checked line: refused
    ep.step(HERMES_READ % "river.txt")
    ep.step("Checked: the file says 417\n" + HERMES_SUBMIT)
    assert facts(ep) == (2, 1, [1], [2, 3]) and ep.reward == 1.0
    ep = episode("S0-T2-O0-C0-W2")  # three calls a reply: two refused submits are two failed checks
    ep.step('done(value="1")\ncat(filename="river.txt")\ndone(value="417")')
    assert facts(ep) == (2, 2, [1], [1]) and ep.finish_reason is None

    for hid in ("S0-T0-O0-C0-W0", "X-shell"):  # no rule: no checks, whatever the replies
        ep = episode(hid)
        for reply in ("nothing", HERMES_READ % "nope.txt", "```sh\ncat nope.txt\n```", HERMES_SUBMIT):
            ep.step(reply)
        assert facts(ep)[:2] == (0, 0)


def test_error_turns_and_valid_call_turns():
    ep = episode("S0-T0-O0-C0-W0")
    ep.step("I don't know")                        # 1: parse error (no call)
    ep.step(HERMES_READ % "river.txt")             # 2: valid: recovered from turn 1
    ep.step(HERMES_READ % "nope.txt")              # 3: tool error
    ep.step("<tool_call>{not json}</tool_call>")   # 4: parse error: turn 3 not recovered from
    ep.step(HERMES_READ % "stone.txt" + HERMES_READ % "river.txt")  # 5: one call ran, one too many
    ep.step(HERMES_SUBMIT)                         # 6: valid, submitted
    assert facts(ep) == (0, 0, [1, 3, 4, 5], [2, 5, 6])
    assert ep.finish_reason == "submitted" and ep.parse_errors == 3 and ep.tool_errors == 1

    ep = episode("S0-T2-O0-C0-W0")  # python_call: up to three calls in one reply
    ep.step('cat(filename="nope.txt")\ncompute(formula="1/0")')  # 1: two tool errors, nothing valid
    ep.step('cat(filename="nope.txt")\ncat(filename="river.txt")')  # 2: an error and a valid call
    ep.step('cat("river.txt")\ndone(value="417")')  # 3: a parse error, then a submit that ends the episode
    assert facts(ep) == (0, 0, [1, 2, 3], [2, 3]) and ep.reward == 1.0 and ep.turns == 3
    r = ep.record("p", 1.0)
    assert (r["parse_errors"], r["tool_errors"]) == (1, 3)
    # recovery as 06 computes it: error turns followed by a turn with a valid call
    recovered = [t for t in r["error_turns"] if t + 1 in r["valid_call_turns"]]
    assert recovered == [1, 2]


# ----------------------------------------------------------------------------- observations
def test_o1_envelope_with_line_numbers():
    ep = episode("S0-T1-O1-C0-W0")
    ep.step('<invoke name="open"><parameter name="file">river.txt</parameter></invoke>')
    assert ep.messages[-1] == {"role": "tool", "content": '<result tool="open">\n1: code: 417\n2: size: 23\n</result>'}
    ep.step('<invoke name="open"><parameter name="file">nope.txt</parameter></invoke>')
    assert ep.messages[-1]["content"] == '<result tool="open" status="error">no such file: nope.txt</result>'


def test_o2_truncates_with_marker_and_sends_as_user():
    task = dict(TASK, files={"long.txt": "ab" * 175})
    ep = episode("S0-T2-O2-C0-W0", task=task)
    ep.step('cat(filename="long.txt")')
    assert ep.messages[-1] == {"role": "user", "content": "[cat] " + "ab" * 150 + "...[truncated 50 chars]"}


# ----------------------------------------------------------------------------- context management
def conv(n):
    """Hand-built conversation: system, task, then n (assistant, observation) exchanges."""
    msgs = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"}]
    for i in range(1, n + 1):
        msgs += [{"role": "assistant", "content": f"a{i}"}, {"role": "tool", "content": f"o{i}"}]
    return msgs


def test_window_keeps_head_and_last_two_exchanges():
    C = SPACE["S0-T0-O0-C1-W0"]["specs"]["C"]
    expected = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                {"role": "assistant", "content": "a3"}, {"role": "tool", "content": "o3"},
                {"role": "assistant", "content": "a4"}, {"role": "tool", "content": "o4"}]
    assert R.manage_context(C, conv(4), 2) == expected
    assert R.manage_context(C, conv(1), 2) == conv(1)
    assert R.manage_context(C, conv(0), 2) == conv(0)


def test_elide_replaces_all_but_the_last_observation():
    C = SPACE["S0-T0-O0-C2-W0"]["specs"]["C"]
    E = "[output elided]"
    expected = [{"role": "system", "content": "S"}, {"role": "user", "content": "Q"},
                {"role": "assistant", "content": "a1"}, {"role": "tool", "content": E},
                {"role": "assistant", "content": "a2"}, {"role": "tool", "content": E},
                {"role": "assistant", "content": "a3"}, {"role": "tool", "content": "o3"}]
    assert R.manage_context(C, conv(3), 2) == expected
    assert R.manage_context(C, conv(1), 2) == conv(1)


def test_full_history_and_user_placement_head():
    assert R.manage_context(SPACE["S0-T0-O0-C0-W0"]["specs"]["C"], conv(3), 2) == conv(3)
    ep = episode("X-react")  # no system message: the head is the single first user message
    assert [m["role"] for m in ep.messages] == ["user"] and ep.messages[0]["content"].endswith(
        "\n\nQuestion: " + TASK["request"])
    for i in range(4):
        ep.step(f'Thought: {i}\nAction: ListFiles\nAction Input: {{}}')
    ctx = ep.context()  # X-react elides all but the last 2 observations
    assert [m["content"] for m in ctx[1:]] == [f"Thought: 0\nAction: ListFiles\nAction Input: {{}}",
                                              "Observation: (hidden)",
                                              f"Thought: 1\nAction: ListFiles\nAction Input: {{}}",
                                              "Observation: (hidden)",
                                              f"Thought: 2\nAction: ListFiles\nAction Input: {{}}",
                                              "Observation: river.txt\nstone.txt",
                                              f"Thought: 3\nAction: ListFiles\nAction Input: {{}}",
                                              "Observation: river.txt\nstone.txt"]
    assert ctx[0] == ep.messages[0]


def test_system_prompt_rendering_of_the_base_harness():
    """The base harness's system text, written out by hand from the contract's S0 template: its tools are declared
    through the chat template (test_base_harness_declares_tools_as_the_frameworks), so S0's {tool_docs} holds only
    the per-reply limit."""
    ep = episode("S0-T0-O0-C0-W0")
    assert ep.messages[0] == {"role": "system", "content": (
        "You are an agent in a small file workspace. Solve the user's task with the tools.\n"
        "Call the functions you are given, at most 1 per reply.\n"
        "When you know the answer, call submit.")}
    assert ep.messages[1] == {"role": "user", "content": TASK["request"]}
    s1 = episode("S1-T0-O0-C0-W1", max_turns=5).messages[0]["content"]
    assert s1 == ("Rules: finish with submit; at most 5 replies.\nStart your first reply with a line 'Plan: ...'.\n"
                  "Tools:\nCall the functions you are given, at most 1 per reply.")


def test_a_hermes_harness_that_declares_its_tools_in_the_prompt_writes_signatures():
    """An out-of-space harness file with the JSON call syntax and no `declare` field: the tools as prose signatures
    and a call example in the system prompt, as 04 declared them before the base spoke the frameworks' language."""
    h = copy.deepcopy(SPACE["S0-T0-O0-C0-W0"])
    del h["specs"]["T"]["declare"]
    assert R.declared_tools(h["specs"]["T"]) is None
    assert R.initial_messages(h, TASK, 6)[0]["content"] == (
        "You are an agent in a small file workspace. Solve the user's task with the tools.\n"
        "- list_files(): list all files\n- read_file(path): show a file\n- search(query): show lines that contain it\n"
        "- write_file(path, content): replace a file's text\n- calculator(expression): do arithmetic\n"
        "- submit(answer): give the final answer\nCall format (at most 1 per reply):\n"
        '<tool_call>\n{"name": "read_file", "arguments": {"path": "a.txt"}}\n</tool_call>\n'
        "When you know the answer, call submit.")


def test_builtin_external_harnesses_come_from_the_data_file():
    path = H.ROOT / "data" / "external_harnesses.json"
    assert [h["harness_id"] for h in R.load_harness_file(R.EXTERNAL)] == ["X-shell", "X-react"]
    assert R.load_harness_file(R.EXTERNAL) == R.load_harness_file(path) == json.loads(path.read_text())
    assert all(h["external"] and h["levels"] is None for h in R.load_harness_file(R.EXTERNAL))
    assert [h["specs"]["T"]["syntax"] for h in R.load_harness_file(R.EXTERNAL)] == ["shell", "react"]


# ----------------------------------------------------------------------------- issue 10: defects that must stay fixed
@pytest.mark.parametrize("hid,reply", [
    ("S0-T0-O0-C0-W0", '<tool_call>{"name": "calculator", "arguments": {"expression": "0**-1"}}</tool_call>'),
    ("S0-T1-O1-C0-W0", '<invoke name="calc"><parameter name="expr">0.0 ** -2</parameter></invoke>'),
    ("S0-T2-O2-C0-W0", 'compute(formula="(5-5)**-1")\ncompute(formula="2+2")'),
    ("X-shell", "```sh\ncalc 0**-1\n```"),
])
def test_zero_to_a_negative_power_is_an_error_observation_not_a_crash(hid, reply):
    ep = episode(hid)
    ep.step(reply)  # raised ZeroDivisionError out of Episode.step before the fix
    O = (SPACE.get(hid) or EXT[hid])["specs"]["O"]
    assert ep.tool_errors == 1 and ep.finish_reason is None
    name = (SPACE.get(hid) or EXT[hid])["specs"]["T"]["tools"]["calculator"]["name"]
    assert ep.messages[-1]["content"].startswith(R.fill(O["error_template"], tool=name, error="division by zero"))
    if hid.startswith("S0-T2"):  # the next call of the reply still runs
        assert ep.messages[-1]["content"].split("\n")[1] == "[compute] 4"


@pytest.mark.parametrize("hid", HOSTILE_HARNESSES + ["S2-T2-O1-C2-W2"])
def test_any_unexpected_exception_inside_a_tool_becomes_an_error_observation(hid, monkeypatch):
    def broken(self, tool, args):
        raise {"read_file": KeyError, "calculator": RecursionError}.get(tool, RuntimeError)("boom")

    monkeypatch.setattr(R.Workspace, "call", broken)
    h = SPACE.get(hid) or EXT[hid]
    for tool, args in (("read_file", {"path": "river.txt"}), ("calculator", {"expression": "1+1"}),
                       ("list_files", {})):
        ep = episode(hid)
        reply = R.render_call(h["specs"]["T"], tool, args)
        ep.step(("Thought: go\n" if hid == "X-react" else "") + reply)  # must not raise
        err = h["specs"]["O"]["error_template"]
        assert ep.tool_errors == 1 and ep.finish_reason is None and ep.turns == 1
        assert ep.messages[-1]["content"].startswith(err.split("{")[0]) and "the tool failed" in ep.messages[-1][
            "content"], ep.messages[-1]


def many_malformed(hid, n):
    """A reply with n malformed calls in the harness's own syntax (each line/tag a separate error)."""
    syntax = (SPACE.get(hid) or EXT[hid])["specs"]["T"]["syntax"]
    one = {"hermes_json": "<tool_call>{x}</tool_call>\n", "xml_invoke": "<invoke name=1></invoke>\n",
           "python_call": "a(\n", "shell": "```sh\necho x\n```\n", "react": "Action: a\nAction Input: no\n"}[syntax]
    return ("Thought: go\n" if hid == "X-react" else "") + one * n


def observation_bound(h):
    """What an observation may hold, from the harness spec alone: each allowed call's output cut at O.max_chars
    (plus its template and truncation marker, 100 chars), at most 3 parser lines (2 + the count line, each an
    error clipped to 200 chars + its template) and the budget reminder."""
    O, T = h["specs"]["O"], h["specs"]["T"]
    return T["max_calls_per_turn"] * (O["max_chars"] + 100) + 3 * (203 + len(O["error_template"]) + 40) + 40


@pytest.mark.parametrize("hid", ["S0-T0-O2-C0-W0", "S0-T1-O2-C0-W2", "S0-T2-O2-C0-W0", "S1-T2-O1-C1-W2", "X-shell",
                                 "X-react"])
def test_observations_are_bounded_whatever_the_reply(hid):
    h = SPACE.get(hid) or EXT[hid]
    if hid == "S0-T2-O2-C0-W0":  # the case: a 1,200-character reply of `a(` lines gave 34,399 chars
        reply = "a(\n" * 400
        assert len(reply) == 1200
        ep = episode(hid)
        ep.step(reply)
        obs = ep.messages[-1]["content"]
        assert obs.split("\n") == ['!! parser failed: write one call per line as name(arg="text"), keyword arguments only'
                                   ] * 2 + ["!! parser failed: 398 more parse errors not shown"]
        assert ep.parse_errors == 1
    long_file = dict(TASK, files={**TASK["files"], "long.txt": "tags: river stone\n" * 200})
    reads = R.render_call(h["specs"]["T"], "read_file", {"path": "long.txt"})
    replies = [many_malformed(hid, n) for n in (1, 3, 50, 400)] + HOSTILE + [
        (reads + "\n") * 10 + many_malformed(hid, 100), many_malformed(hid, 100) + (reads + "\n") * 10]
    for reply in replies:
        ep = episode(hid, task=long_file)
        ep.step(("Thought: go\n" if hid == "X-react" and not reply.startswith("Thought") else "") + reply[:7990])
        assert len(ep.messages[-1]["content"]) <= observation_bound(h), (reply[:60], len(ep.messages[-1]["content"]))


def test_checked_must_be_a_line_that_starts_with_the_marker():
    submit = '<tool_call>{"name": "submit", "arguments": {"answer": "417"}}</tool_call>'
    for reply in ("I Checked: 417\n" + submit, "Checked 417\n" + submit, submit + " Checked: 417",
                  "see 'Checked: 417'\n" + submit):
        ep = episode("S0-T0-O0-C0-W2")
        ep.step(reply)  # the old rule accepted "Checked:" anywhere in the reply
        assert ep.finish_reason is None and ep.workflow_violations == 1, reply
    for reply in ("Checked: 417\n" + submit, "Plan done.\n  Checked: the file says 417\n" + submit):
        ep = episode("S0-T0-O0-C0-W2")
        ep.step(reply)
        assert ep.finish_reason == "submitted" and ep.workflow_violations == 0 and ep.reward == 1.0, reply


def test_xml_parsing_of_a_hostile_8000_char_reply_is_fast():
    """Many opened, never closed <parameter> tags: the old regex rescanned the rest of the reply from each one
    (~35 ms, quadratic); a forward scan takes well under a millisecond."""
    T = SPACE["S0-T1-O0-C0-W0"]["specs"]["T"]
    hostile = ['<invoke name="open">' + '<parameter name="file">x\n' * 300 + "</invoke>",
               '<invoke name="open">' + "<parameter name='f'>" * 390 + "</invoke>",
               '<invoke name="open">' * 390 + "</invoke>", ('<invoke name="a"><parameter name="b">' * 230)[:7999]]
    for reply in hostile:
        assert 7000 < len(reply) <= R.MAX_REPLY
        best = min(timed(R.parse_reply, T, reply) for _ in range(5))
        assert best < 0.005, (reply[:40], best)
        assert len(R.parse_reply(T, reply)) == 1  # one <invoke> element (nested opening tags are its text)
    # and a valid call is still read exactly
    (item,) = R.parse_reply(T, '<invoke name="save"><parameter name="file">\na.txt\n</parameter>'
                               '<parameter name="text">\n\nx: 1\n\n</parameter></invoke>')
    assert item == ("call", "save", {"file": "a.txt", "text": "\nx: 1\n"})


def timed(f, *args):
    start = time.perf_counter()
    f(*args)
    return time.perf_counter() - start


def test_system_prompt_names_the_submit_tool_of_its_T_and_no_other():
    """S is independent of T: over all 243 configurations (the independent copy in helpers_04) and the
    out-of-space harnesses, the prompt names T's submit tool and never another T's."""
    names = {h["specs"]["T"]["tools"]["submit"]["name"] for h in list(SPACE.values()) + list(EXT.values())}
    assert names == {"submit", "final_answer", "done", "Final Answer"}
    example = R.load_harness_file(H.ROOT / "data" / "example_harness.json")
    for h in list(SPACE.values()) + list(EXT.values()) + example:
        prompt = R.Episode(copy.deepcopy(TASK), h, 6, {}).messages[0]["content"]
        own = h["specs"]["T"]["tools"]["submit"]["name"]
        assert "{submit}" not in prompt and re.search(r"(?<![\w.])" + re.escape(own) + r"\b", prompt), h["harness_id"]
        if h["harness_id"].startswith("S"):  # the S templates all ask for the submit tool in their own words
            text = prompt.split(R.tool_docs(h["specs"]["T"]))
            assert any(re.search(r"\b" + re.escape(own) + r"\b", part) for part in text), h["harness_id"]
        for other in names - {own, "Final Answer"}:
            assert not re.search(r"\b" + other + r"\b", prompt), (h["harness_id"], other)
