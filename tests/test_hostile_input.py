"""Model text is data (issue 18): nothing a model types crashes an episode, a record or a run.

A hostile-input corpus (tests/data/hostile_replies.jsonl, made by tests/make_hostile_corpus.py) is stepped through
every harness syntax: 01's three T realisations (Hermes JSON, XML, Python calls) under varied S/O/C/W, the
out-of-space X-shell, X-react and X-example-fs, and smolagents. A lone UTF-16 surrogate, typed as an escape in a
JSON or Python string, is driven through 04's command line (write, then read, then submit) and the smolagents
bridge: the episode finishes, the record is written and the text holds U+FFFD."""
import json
import time

import pytest

from common import environment as E
from common import generation as G
import helpers_04 as H
from conftest import ROOT, load_stage

R = load_stage("04_rollout.py")
S01 = load_stage("01_harness_space.py")
CORPUS = [json.loads(line)["reply"] for line in (ROOT / "tests" / "data" / "hostile_replies.jsonl").read_text()
          .splitlines()]
SPACE = {h["harness_id"]: h for h in S01.build_space(S01.COMPONENTS)}  # 01's own realisations
EXAMPLE = R.load_harness_file(ROOT / "data" / "example_harness.json")
HARNESSES = [SPACE[i] for i in ("S0-T0-O0-C0-W0", "S1-T1-O1-C1-W1", "S2-T2-O2-C2-W2", "S0-T0-O2-C2-W2",
                                "S2-T1-O0-C2-W2", "S1-T2-O1-C0-W1")] + R.load_harness_file(R.EXTERNAL) + EXAMPLE
TASK = next(t for t in H.read_tasks("test_tasks.jsonl") if t["family"] == "edit")  # writes a file: every tool
META = {"episode_id": "e", "iteration": None, "visit": None, "group_id": "g", "sample_index": 0}


def is_text(x):
    """Every string in x can be written as UTF-8 (and so tokenized): no lone surrogate anywhere."""
    json.dumps(x, ensure_ascii=False).encode("utf-8")
    return True


def test_the_corpus_is_a_few_hundred_hostile_replies():
    assert len(CORPUS) >= 300
    assert sum("\\ud8" in r or "\\udf" in r or "\\udc" in r for r in CORPUS) >= 20  # surrogates typed as escapes
    assert sum(any("\ud800" <= c <= "\udfff" for c in r) for r in CORPUS) >= 5  # and raw
    assert {h["specs"]["T"]["syntax"] for h in HARNESSES} == set(R.SYNTAXES)


@pytest.mark.parametrize("harness", HARNESSES, ids=lambda h: h["harness_id"])
def test_every_corpus_reply_is_one_safe_step_under_every_syntax(harness):
    start, cap = time.perf_counter(), harness["specs"]["O"].get("max_chars") or 2000
    for reply in CORPUS:
        ep = R.Episode(TASK, harness, 6, META)
        ep.step(reply)  # never raises
        obs = ep.messages[-1]["content"] if not ep.done else ""
        assert len(obs) <= 2 * cap + 1200, (reply[:60], len(obs))  # MAX_SHOWN outputs/errors + reminder
        assert is_text(ep.record("p", 1.0)) and is_text(ep.context())
        assert all(E.workspace_path(p) == p for p in ep.ws.files) and len(ep.ws.files) <= E.MAX_FILES
    assert time.perf_counter() - start < 20


@pytest.mark.parametrize("harness", HARNESSES, ids=lambda h: h["harness_id"])
def test_corpus_episodes_finish_and_their_records_are_written(harness, tmp_path):
    """The corpus in episodes of 6 replies (lockstep, as 04 runs them): every episode ends, every record is text."""
    chunks = [CORPUS[i:i + 6] for i in range(0, len(CORPUS), 6)]
    eps = [R.Episode(TASK, harness, 6, dict(META, episode_id=f"e{i}")) for i in range(len(chunks))]
    for turn in range(6):
        for ep, chunk in zip(eps, chunks):
            if not ep.done:
                ep.step(chunk[min(turn, len(chunk) - 1)])
    assert all(ep.done and ep.finish_reason in ("submitted", "turn_budget") for ep in eps)
    out = tmp_path / "r.jsonl"
    R.write_atomic(out, "".join(json.dumps(ep.record("p", 1.0), ensure_ascii=False) + "\n" for ep in eps))
    assert len(out.read_text(encoding="utf-8").splitlines()) == len(eps) and not list(tmp_path.glob("*.tmp"))


# ----------------------------------------------------------------------------- a lone surrogate, end to end
# Write "a\ud800b" to a file, read it back, submit "\ud800" -- typed as ASCII escapes, so a real tokenizer carries
# them: the parser (JSON / Python literal) makes the lone surrogate, 04 makes it U+FFFD.
SURROGATE_SCRIPT = {
    "hermes_json": ['<tool_call>{"name": "write_file", "arguments": {"path": "x.txt", "content": "a\\ud800b"}}'
                    '</tool_call>', '<tool_call>{"name": "read_file", "arguments": {"path": "x.txt"}}</tool_call>',
                    '<tool_call>{"name": "submit", "arguments": {"answer": "\\ud800"}}</tool_call>'],
    "xml_invoke": ['<invoke name="save"><parameter name="file">x.txt</parameter><parameter name="text">a\\ud800b'
                   '</parameter></invoke>', '<invoke name="open"><parameter name="file">x.txt</parameter></invoke>',
                   '<invoke name="final_answer"><parameter name="result">\\ud800</parameter></invoke>'],
    "python_call": ['write(filename="x.txt", body="a\\ud800b")', 'cat(filename="x.txt")', 'done(value="\\ud800")'],
    "react": ['Thought: w\nAction: WriteFile\nAction Input: {"file_path": "x.txt", "text": "a\\ud800b"}',
              'Thought: r\nAction: ReadFile\nAction Input: {"file_path": "x.txt"}', "Thought: s\nFinal Answer: x"],
    "shell": ['```sh\necho "a\\ud800b" > x.txt\n```', "```sh\ncat x.txt\n```", "```sh\nsubmit \\ud800\n```"],
}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return H.build_tiny_model(tmp_path_factory.mktemp("tiny_hostile"), max_positions=8192)


class ScriptedBackend:
    """04's backend contract, replying the script's text of this turn as token ids (what a policy samples)."""
    replies = []

    def __init__(self, policy, tok, args):
        self.tok, self.gen_seconds = tok, 0.0

    def generate(self, prompts, turn, keys=None):
        ids = self.tok.encode(self.replies[min(turn, len(self.replies) - 1)], add_special_tokens=False)
        return [(ids + self.tok.stop_ids[:1], None) for _ in prompts]


@pytest.mark.parametrize("hid", ["S0-T0-O0-C0-W0", "S0-T1-O0-C0-W0", "S0-T2-O1-C0-W0", "X-react", "X-shell"])
def test_a_typed_surrogate_through_04s_cli_write_then_read_then_submit(hid, tiny, tmp_path, monkeypatch):
    run = tmp_path / "run"
    H.write_jsonl(run / "harness_space.jsonl", list(SPACE.values()))
    H.write_jsonl(tmp_path / "tasks.jsonl", [TASK])
    external = {h["harness_id"]: h for h in R.load_harness_file(R.EXTERNAL)}
    syntax = (SPACE.get(hid) or external[hid])["specs"]["T"]["syntax"]
    monkeypatch.setattr(ScriptedBackend, "replies", SURROGATE_SCRIPT[syntax])
    monkeypatch.setattr(G, "HFBackend", ScriptedBackend)  # what generation.load_for_generation makes
    out = tmp_path / "out.jsonl"
    R.main(["--run", str(run), "--eval", "--policy", str(tiny), "--harnesses", hid, "--tasks",
            str(tmp_path / "tasks.jsonl"), "--out", str(out), "--max-turns", "4", "--temperature", "0"])
    rec = json.loads(out.read_text(encoding="utf-8"))
    assert rec["finish_reason"] == "submitted" and rec["turns"] == 3 and len(rec["model_turns"]) == 3
    shown = "\n".join(m["content"] for m in rec["transcript"])
    if syntax != "xml_invoke":  # XML has no escapes: the six characters stay text; elsewhere the parser made U+FFFD
        assert "a\ufffdb" in shown  # written, read back, rendered and tokenized
    assert rec["tool_errors"] == 0 and sorted(p.name for p in tmp_path.iterdir()) == [
        "out.04_rollout_config.json", "out.jsonl", "run", "tasks.jsonl"]


# ----------------------------------------------------------------------------- smolagents
def smolagents_bridge():
    return load_stage("bridges/smolagents_harness.py")


class Scripted:
    @staticmethod
    def make(B, replies, tok=None):
        class Model(B.EpisodeModel):
            def reply(self, messages, prompt_ids):
                return replies[min(len(self.sent) - 1, len(replies) - 1)], None, None
        return Model(tok=tok, model_id="scripted")


def test_a_typed_surrogate_through_the_smolagents_bridge(tiny):
    B = smolagents_bridge()
    tok = G.load_tokenizer(tiny)
    act = lambda name, args: "Action:\n" + json.dumps({"name": name, "arguments": args})  # noqa: E731
    replies = [act("write_file", {"path": "x.txt", "content": "a\\ud800b"}).replace("\\\\", "\\"),
               act("read_file", {"path": "x.txt"}), act("no\\ud800pe", {}).replace("\\\\", "\\"),
               act("final_answer", {"answer": "\\ud800"}).replace("\\\\", "\\")]
    model = Scripted.make(B, replies, tok=tok)  # with a tokenizer: every prompt is encoded (would raise TypeError)
    ws = R.Workspace(TASK["files"])
    rec = B.run_episode(TASK, model, ws, 6, META, "scripted", 0.0)
    assert rec["finish_reason"] == "submitted" and ws.files["x.txt"] == "a\ufffdb" and rec["submitted_answer"] == "\ufffd"
    assert is_text(rec) and "a\ufffdb" in json.dumps(rec["transcript"], ensure_ascii=False)


def test_the_corpus_through_the_smolagents_bridge():
    B = smolagents_bridge()
    start = time.perf_counter()
    for i in range(0, len(CORPUS), 6):
        model = Scripted.make(B, CORPUS[i:i + 6])
        ws = R.Workspace(TASK["files"])
        rec = B.run_episode(TASK, model, ws, 6, dict(META, episode_id=f"e{i}"), "scripted", 0.0)
        assert rec["finish_reason"] in ("submitted", "turn_budget") and is_text(rec) and is_text(ws.files)
    assert time.perf_counter() - start < 60
