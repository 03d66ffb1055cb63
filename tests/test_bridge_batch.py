"""A framework's episodes side by side (smolagents_harness.Lockstep): their model calls are batched, and each
episode's records are the ones it makes alone (one by one, 04 --concurrency 1), greedy and sampled with its own
per-episode seeds; a hostile reply in one episode of a batch ends as that episode's parse or tool error, and a
failing engine call fails the run instead of leaving a batch waiting. Offline, on 04's tiny random model (hf)."""
import json
import os
import threading

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402

from common import generation  # noqa: E402  (the module 04 imports: its HFBackend is the one 04's main builds)
import helpers_04 as H  # noqa: E402
from conftest import load_stage  # noqa: E402

pytest.importorskip("pydantic_ai")
R = load_stage("04_rollout.py")
N = load_stage("bridges/smolagents_native_harness.py")
P = load_stage("bridges/pydantic_ai_harness.py")
TASKS = R.load_tasks(H.ROOT / "data" / "test_tasks.jsonl")[:3]
BRIDGES = {"smolagents-native": (N.run_native_episodes, "final_answer"),
           "pydantic-ai": (P.run_pydantic_ai_episodes, "submit")}
HF_GENERATE = generation.HFBackend.generate


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """04's tiny random policy with room for smolagents' system prompt; it stops early now and then."""
    return H.build_tiny_model(tmp_path_factory.mktemp("tiny_batch"), max_positions=8192, stop_logit=5.5)


def rollouts(tiny, tmp_path, name, temperature, concurrency, monkeypatch):
    """04 --eval --harnesses NAME through its main(): -> (records, the batch size of every generate call)."""
    sizes, generate = [], HF_GENERATE

    def counted(self, prompts, turn, keys=None):
        sizes.append(len(prompts))
        return generate(self, prompts, turn, keys=keys)
    monkeypatch.setattr(generation.HFBackend, "generate", counted)
    tasks, out = tmp_path / "tasks.jsonl", tmp_path / f"{name}-{temperature}-{concurrency}.jsonl"
    tasks.write_text("".join(json.dumps(t) + "\n" for t in TASKS))
    R.main(["--run", str(tmp_path), "--eval", "--policy", str(tiny), "--backend", "hf", "--harnesses", name,
            "--tasks", str(tasks), "--samples", "2", "--temperature", str(temperature), "--max-turns", "2",
            "--max-new-tokens", "12", "--seed", "3", "--concurrency", str(concurrency), "--out", str(out)])
    return [json.loads(line) for line in out.read_text().splitlines()], sizes


def same_records(a, b, tol=1e-5):
    """The same episodes: every field equal, token ids included; the log-probs within tol (a batch of other shape
    runs other float kernels on the CPU: they agree to ~1e-6, not bit for bit)."""
    def without_logprobs(rows):
        return [dict(r, model_turns=[dict(t, logprobs=None) for t in r["model_turns"]]) for r in rows]
    logprobs = [[lp for t in r["model_turns"] for lp in (t["logprobs"] or [])] for r in (*a, *b)]
    pairs = zip(logprobs[:len(a)], logprobs[len(a):])
    return without_logprobs(a) == without_logprobs(b) and all(
        len(x) == len(y) and all(abs(u - v) <= tol for u, v in zip(x, y)) for x, y in pairs)


def test_same_records_sees_a_changed_token_or_a_far_log_prob():
    rec = {"success": True, "model_turns": [{"completion_ids": [5, 2], "logprobs": [-1.0, -0.5]}]}
    near = {"success": True, "model_turns": [{"completion_ids": [5, 2], "logprobs": [-1.000001, -0.5]}]}
    token = {"success": True, "model_turns": [{"completion_ids": [6, 2], "logprobs": [-1.0, -0.5]}]}
    far = {"success": True, "model_turns": [{"completion_ids": [5, 2], "logprobs": [-1.01, -0.5]}]}
    assert same_records([rec], [near])
    assert not same_records([rec], [token]) and not same_records([rec], [far])


@pytest.mark.parametrize("name", BRIDGES)
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_batched_episodes_give_the_one_by_one_records(tiny, tmp_path, name, temperature, monkeypatch):
    alone, sizes_alone = rollouts(tiny, tmp_path, name, temperature, 1, monkeypatch)
    batched, sizes = rollouts(tiny, tmp_path, name, temperature, 4, monkeypatch)
    assert set(sizes_alone) == {1} and max(sizes) == 4  # 6 episodes, 4 side by side: real batches
    assert len(sizes) < len(sizes_alone) == sum(sizes)  # the same model calls, in fewer generate calls
    assert [r["episode_id"] for r in batched] == [r["episode_id"] for r in alone]  # task x sample order
    assert same_records(batched, alone)
    if temperature:  # each sample draws with its own seed: the two samples of a task differ
        assert any(a["model_turns"][0]["completion_ids"] != b["model_turns"][0]["completion_ids"]
                   for a, b in zip(batched[::2], batched[1::2]))


class Scripted:
    """A backend that writes each episode's reply from its prompt: the oracle's calls, a hostile text where the
    prompt names the hostile task; counts batch sizes. fail=True: every generate call raises."""

    def __init__(self, tok, hostile_task, submit, fail=False):
        self.tok, self.hostile, self.submit, self.fail, self.sizes = tok, hostile_task, submit, fail, []

    def generate(self, prompts, turn, keys=None):
        self.sizes.append(len(prompts))
        if self.fail:
            raise RuntimeError("engine died")
        return [self.reply(p, t) for p, t in zip(prompts, turn)]

    def reply(self, prompt, turn):
        text = self.tok.decode(prompt)
        task = next(t for t in TASKS if t["request"] in text)
        if task["task_id"] == self.hostile and turn == 0:
            reply = '<tool_call>{"name": "read_\ud800", "arguments": {"path": </tool_call>' + "\x00" * 50
        elif turn == 0 and task["task_id"] == TASKS[1]["task_id"]:
            reply = generation.tool_call_text("rm_rf", {"path": ["/"]})  # an unknown tool, a wrong type
        else:
            step = task["solution"][min(turn, len(task["solution"]) - 1)]
            reply = generation.tool_call_text(self.submit if step["tool"] == "submit" else step["tool"], step["args"])
        return generation.scripted_reply(reply.encode("utf-8", "replace").decode("utf-8"), self.tok)[1], None


@pytest.mark.parametrize("name", BRIDGES)
def test_a_hostile_reply_in_a_batch_is_that_episodes_error(tiny, name):
    run, submit = BRIDGES[name]
    tok = generation.load_tokenizer(tiny)
    backend = Scripted(tok, TASKS[0]["task_id"], submit)
    recs = run(TASKS, "scripted", backend, tok, 5, 64, 0.0, samples=2, progress=False, concurrency=6)
    assert max(backend.sizes) == 6
    by_task = {t["task_id"]: [r for r in recs if r["task_id"] == t["task_id"]] for t in TASKS}
    assert all(r["parse_errors"] >= 1 and r["error_turns"][0] == 1 for r in by_task[TASKS[0]["task_id"]])
    assert all(r["tool_errors"] >= 1 and r["error_turns"][0] == 1 for r in by_task[TASKS[1]["task_id"]])
    assert all(r["success"] and r["parse_errors"] + r["tool_errors"] == 0 for r in by_task[TASKS[2]["task_id"]])
    assert all(r["finish_reason"] in ("submitted", "turn_budget") for r in recs)


@pytest.mark.parametrize("name", BRIDGES)
def test_a_failing_engine_call_fails_the_run_and_leaves_no_thread_waiting(tiny, name):
    run, submit = BRIDGES[name]
    tok = generation.load_tokenizer(tiny)
    before = threading.active_count()
    with pytest.raises(Exception):
        run(TASKS, "scripted", Scripted(tok, None, submit, fail=True), tok, 3, 16, 0.0, samples=2, progress=False,
            concurrency=4)
    assert threading.active_count() == before


def test_06_makes_every_split_in_one_04_call(tmp_path):
    """One 04 process (one engine) per evaluation: lockstep splits, then each framework on its first N tasks."""
    from conftest import run_stage
    run = H.make_run(tmp_path / "run", {"S0-T1-O1-C1-W1"}, {})
    run_stage("06_evaluate.py", "--run", run, "--policy", "oracle", "--label", "o", "--max-tasks", 2, "--heldout", 1,
              "--framework-tasks", "2,smolagents=1")
    out = run / "eval" / "o"
    assert [p.name for p in out.glob("*04_rollout_config.json")] == ["episodes.04_rollout_config.json"]
    config = json.loads((out / "episodes.04_rollout_config.json").read_text())
    assert {"smolagents-native:2", "pydantic-ai:2", "smolagents:1", "X-shell"} <= set(config["harnesses"].split(","))
    rows = {s: [json.loads(x) for x in (out / f"{s}.jsonl").read_text().splitlines()]
            for s in ("smolagents-native", "pydantic-ai", "smolagents")}
    assert [len(r) for r in rows.values()] == [2, 2, 1] and all(e["success"] for r in rows.values() for e in r)


def test_frameworks_named_together_share_their_batches(tiny, tmp_path, monkeypatch):
    """04 --harnesses A,B: both frameworks' episodes side by side in one Lockstep, the records those of A then B."""
    both = "smolagents-native,pydantic-ai"
    alone, _ = rollouts(tiny, tmp_path, both, 1.0, 1, monkeypatch)
    together, sizes = rollouts(tiny, tmp_path, both, 1.0, 12, monkeypatch)
    assert max(sizes) == 12 and same_records(together, alone)  # 6 episodes in each framework, all 12 in one batch
    assert [r["harness_id"] for r in together] == ["X-smolagents-native"] * 6 + ["X-pydantic-ai"] * 6
