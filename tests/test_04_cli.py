"""Stage 04 through its command line: token records, train-mode rotation and batches, the hf backend
end to end with a tiny random model, log-probs, the context limit, and bad input."""
import argparse
import json
import re

import pytest
from conftest import load_stage, run_stage

from common import generation as G
import helpers_04 as H

R = load_stage("04_rollout.py")
FAMILIES = ["lookup", "sum", "edit", "multihop", "search", "count"]
MIX = ["S0-T0-O0-C0-W0", "S1-T1-O1-C1-W1", "S2-T2-O2-C2-W2", "S0-T2-O1-C1-W2", "X-react", "X-shell"]
# what each harness shows of the past (independent of the code): (messages in the head, C mode, k, elided text)
CONTEXT = {"C0": ("full", 0, None), "C1": ("window", 2, None), "C2": ("elide", 1, "[output elided]"),
           "X-shell": ("window", 3, None), "X-react": ("elide", 2, "Observation: (hidden)")}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return H.build_tiny_model(tmp_path_factory.mktemp("tiny"), stop_logit=5.5)  # P(stop) ~ 1/4 a token


@pytest.fixture(scope="module")
def tok(tiny):
    return G.load_tokenizer(tiny)


def small_tasks(path, per_family=1, name="train_tasks.jsonl"):
    tasks = [t for f in FAMILIES for t in [t for t in H.read_tasks(name) if t["family"] == f][:per_family]]
    H.write_jsonl(path, tasks)
    return tasks


def expected_messages(record, turn):
    """The messages the model should see at `turn`, built by hand from the full transcript."""
    hid = record["harness_id"]
    head = 1 if hid == "X-react" else 2
    past = record["transcript"][:head + 2 * turn]
    mode, k, elided = CONTEXT[hid if hid.startswith("X-") else hid.split("-")[3]]
    rest = past[head:]
    if mode == "window":
        rest = rest[-2 * k:] if k and len(rest) > 2 * k else rest
    if mode == "elide":
        n_obs = len(rest) // 2
        rest = [dict(m, content=elided) if i % 2 and i // 2 < n_obs - k else m for i, m in enumerate(rest)]
    return past[:head] + rest


def chatml(msgs):
    return "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs) + "<|im_start|>assistant\n"


def expected_prompt_text(record, turn):
    """ChatML text of what the model should see at `turn`, built by hand from the full transcript; where the harness
    declared its tools through the chat template (T0), in the Hermes / Qwen2.5 convention the toy's ChatML template
    lacks (generation.hermes_messages: tested against Qwen2.5's template in test_blackbox_bridges)."""
    messages = expected_messages(record, turn)
    return chatml(G.hermes_messages(messages, record["tools"]) if record.get("tools") else messages)


def appends(record, turn):
    """Does the context at `turn` only append to the one at turn - 1 (+ the reply)? Then the prompt must extend the
    last prompt + its completion ids (token-in/token-out); otherwise it is the rendered context, tokenised."""
    before, now, head = expected_messages(record, turn - 1), expected_messages(record, turn), 1 if \
        record["harness_id"] == "X-react" else 2
    return turn > 0 and now[:len(before) + 1] == before + [record["transcript"][head + 2 * (turn - 1)]]


def check_token_records(records, tok, max_new_tokens=None):
    stop = set(tok.stop_ids)
    for r in records:
        head = 1 if r["harness_id"] == "X-react" else 2
        assert len(r["model_turns"]) == r["turns"] + (r["finish_reason"] == "context_limit")
        rerendered = 0
        for i, mt in enumerate(r["model_turns"]):
            text = expected_prompt_text(r, i)
            if appends(r, i):  # token-in/token-out: last prompt + sampled ids + the template's text after the reply
                last = r["model_turns"][i - 1]
                k = len(last["prompt_ids"]) + len(last["completion_ids"])
                assert mt["prompt_ids"][:k] == last["prompt_ids"] + last["completion_ids"], (r["episode_id"], i)
                reply = r["transcript"][head + 2 * (i - 1)]["content"]
                tail = text[len(expected_prompt_text(r, i - 1)) + len(reply):]  # "<|im_end|>\n<|im_start|>..."
                if last["completion_ids"][-1] in stop:
                    tail = tail[len("<|im_end|>"):]
                assert tok.decode(mt["prompt_ids"][k:], skip_special_tokens=False) == tail, (r["episode_id"], i)
                assert mt["prompt_ids"][k:] == tok.encode(tail, add_special_tokens=False)
                if tok.encode(text, add_special_tokens=False) == mt["prompt_ids"]:  # where re-tokenising agrees
                    assert tok.decode(mt["prompt_ids"], skip_special_tokens=False) == text
            else:
                rerendered += i > 0
                assert tok.decode(mt["prompt_ids"], skip_special_tokens=False) == text, (r["episode_id"], i)
                assert mt["prompt_ids"] == tok.encode(text, add_special_tokens=False)
            ids = mt["completion_ids"]
            assert ids and not stop & set(ids[:-1])  # at most one stop token, at the end
            assert ids[-1] in stop or len(ids) == max_new_tokens
            if i < r["turns"]:
                assert r["transcript"][head + 2 * i]["content"] == tok.decode(ids, skip_special_tokens=True)
            if mt["logprobs"] is not None:
                assert len(mt["logprobs"]) == len(ids) and all(lp <= 0 for lp in mt["logprobs"])
        assert r.get("rerendered_turns", rerendered) == rerendered


# ----------------------------------------------------------------------------- oracle with --tokenizer
def test_oracle_token_records_equal_the_rendered_context(tmp_path, tiny, tok):
    small_tasks(tmp_path / "tasks.jsonl")
    H.make_run(tmp_path, set(), {})
    out = tmp_path / "demos.jsonl"
    R.main(["--run", str(tmp_path), "--eval", "--policy", "oracle", "--tokenizer", str(tiny), "--harnesses",
            ",".join(MIX), "--tasks", str(tmp_path / "tasks.jsonl"), "--out", str(out)])
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(records) == 6 * len(MIX) and all(r["success"] for r in records)
    assert {r["harness_id"] for r in records} == set(MIX)
    check_token_records(records, tok)
    for r in records:  # the oracle's completion = its reply text encoded once + <|im_end|>, no log-probs
        head = 1 if r["harness_id"] == "X-react" else 2
        for i, mt in enumerate(r["model_turns"]):
            reply = r["transcript"][head + 2 * i]["content"]
            im_end = tok.convert_tokens_to_ids("<|im_end|>")
            assert mt["completion_ids"] == tok.encode(reply, add_special_tokens=False) + [im_end]
            assert mt["logprobs"] is None
    assert max(len(mt["prompt_ids"]) for r in records for mt in r["model_turns"]) < G.max_positions(tiny)  # they fit
    config = json.loads((tmp_path / "demos.04_rollout_config.json").read_text())
    assert config["episodes"] == len(records) and config["policy"] == "oracle"


# ----------------------------------------------------------------------------- train mode
def test_train_mode_rotation_groups_and_batch_cycling(tmp_path):
    tasks = small_tasks(tmp_path / "tasks.jsonl")
    ids = [h["harness_id"] for h in H.space_records()]
    assignment = {t["task_id"]: [ids[7 * i], ids[7 * i + 1], ids[7 * i + 3]] for i, t in enumerate(tasks)}
    H.make_run(tmp_path, {h for hs in assignment.values() for h in hs}, assignment)
    seen = []
    for t in range(4):
        R.main(["--run", str(tmp_path), "--iteration", str(t), "--policy", "oracle", "--tasks",
                str(tmp_path / "tasks.jsonl"), "--group-size", "3", "--tasks-per-iteration", "4"])
        records = [json.loads(x) for x in (tmp_path / f"iter_{t:03d}" / "rollouts.jsonl").read_text().splitlines()]
        assert (tmp_path / f"iter_{t:03d}" / "04_rollout_config.json").is_file()
        batch = sorted({r["task_id"] for r in records})
        assert len(records) == 12 and len(batch) == 4
        for r in records:
            i = sum(r["task_id"] in b for b in seen)  # earlier iterations whose batch held the task
            assert r["visit"] == i and r["harness_id"] == assignment[r["task_id"]][i % 3]  # H_x[i mod K]
            assert r["iteration"] == t and r["group_id"] == f"{r['task_id']}|{r['harness_id']}|it{t:03d}"
            assert r["episode_id"] == f"it{t:03d}-{r['task_id']}-{r['harness_id']}-s{r['sample_index']}"
            assert r["success"] and r["model_turns"] == [] and r["policy"] == "oracle"
        assert sorted(r["sample_index"] for r in records if r["task_id"] == batch[0]) == [0, 1, 2]
        seen.append(batch)
    # ceil(6/4) = 2 iterations per epoch: each epoch visits every task
    assert set(seen[0]) | set(seen[1]) == set(assignment) and set(seen[2]) | set(seen[3]) == set(assignment)
    first = (tmp_path / "iter_000" / "rollouts.jsonl").read_text()
    R.main(["--run", str(tmp_path), "--iteration", "0", "--policy", "oracle", "--tasks", str(tmp_path / "tasks.jsonl"),
            "--group-size", "3", "--tasks-per-iteration", "4"])
    assert (tmp_path / "iter_000" / "rollouts.jsonl").read_text() == first  # same seed, same file


def test_train_mode_each_visit_takes_the_next_harness_of_the_group(tmp_path):
    """A task's i-th visit runs H_x[i mod K]. 4 tasks, B = 2: iterations 0-5 are 3 epochs, each visiting every task
    once at a reshuffled place. The old rule H_x[t mod K] could not pass: a second visit is at t = 2 or 3, which
    gives H_x[2] or H_x[0], never H_x[1]."""
    tasks = small_tasks(tmp_path / "tasks.jsonl")[:4]
    H.write_jsonl(tmp_path / "tasks.jsonl", tasks)
    ids = [h["harness_id"] for h in H.space_records()]
    assignment = {t["task_id"]: [ids[7 * i], ids[7 * i + 1], ids[7 * i + 5]] for i, t in enumerate(tasks)}
    H.make_run(tmp_path, {h for hs in assignment.values() for h in hs}, assignment)
    visits = {tid: [] for tid in assignment}
    for t in range(6):
        R.main(["--run", str(tmp_path), "--iteration", str(t), "--policy", "oracle", "--tasks",
                str(tmp_path / "tasks.jsonl"), "--group-size", "2", "--tasks-per-iteration", "2"])
        records = [json.loads(x) for x in (tmp_path / f"iter_{t:03d}" / "rollouts.jsonl").read_text().splitlines()]
        assert len(records) == 4 and len({r["task_id"] for r in records}) == 2
        for r in records:
            assert r["success"] and r["iteration"] == t
            # the oracle makes no error and one valid call a turn; checks: W1 plan once, W2 the one submit
            assert r["error_turns"] == [] and r["valid_call_turns"] == list(range(1, r["turns"] + 1))
            assert r["workflow_checks"] == {"W0": 0, "W1": 1, "W2": 1}[r["harness_id"][-2:]]
            if r["sample_index"] == 0:
                visits[r["task_id"]].append((r["visit"], r["harness_id"]))
    for tid, seen in visits.items():
        assert seen == [(0, assignment[tid][0]), (1, assignment[tid][1]), (2, assignment[tid][2])], tid


def test_train_mode_in_an_out_of_space_harness(tmp_path):
    """Black-box baseline: train_harnesses.jsonl holds only X-shell ("levels": null), as in
    data/external_harnesses.json; 03 (locality, K = 1) gives it to every task and 04 trains in it."""
    tasks = small_tasks(tmp_path / "tasks.jsonl")
    external = json.loads((H.ROOT / "data" / "external_harnesses.json").read_text())
    (xshell,) = [h for h in external if h["harness_id"] == "X-shell"]
    assert xshell["levels"] is None
    H.write_jsonl(tmp_path / "train_harnesses.jsonl", [xshell])
    run_stage("03_assignment.py", "--run", tmp_path, "--tasks", tmp_path / "tasks.jsonl", "--k", 1,
              "--method", "locality")
    for t in range(2):
        R.main(["--run", str(tmp_path), "--iteration", str(t), "--policy", "oracle", "--tasks",
                str(tmp_path / "tasks.jsonl"), "--group-size", "2", "--tasks-per-iteration", "3"])
        records = [json.loads(x) for x in (tmp_path / f"iter_{t:03d}" / "rollouts.jsonl").read_text().splitlines()]
        assert len(records) == 6 and {r["harness_id"] for r in records} == {"X-shell"}
        assert all(r["success"] and r["finish_reason"] == "submitted" and r["visit"] == 0 for r in records)
        assert all(r["transcript"][0]["content"].startswith(xshell["specs"]["S"]["template"][:20]) for r in records)


def test_train_batch_selection():
    ids = [f"t{i}" for i in range(10)]
    batches = [R.train_batch(ids, t, 4, 0) for t in range(6)]
    assert all(len(b) == len(set(b)) == 4 for b in batches)
    assert set(batches[0] + batches[1] + batches[2]) == set(ids) == set(batches[3] + batches[4] + batches[5])
    assert batches[:3] != batches[3:]  # a new permutation each epoch
    assert R.train_batch(ids, 5, 0, 0) == ids and R.train_batch(ids, 5, 20, 0) == ids


# ----------------------------------------------------------------------------- the hf backend
def test_hf_backend_end_to_end_train_and_eval(tmp_path, tiny, tok):
    tasks = small_tasks(tmp_path / "tasks.jsonl")[:2]
    H.write_jsonl(tmp_path / "tasks.jsonl", tasks)
    assignment = {t["task_id"]: ["S0-T0-O0-C0-W0", "S2-T1-O2-C2-W1"] for t in tasks}
    H.make_run(tmp_path, {"S0-T0-O0-C0-W0", "S2-T1-O2-C2-W1"}, assignment)
    (tmp_path / "init_policy").symlink_to(tiny)
    proc = run_stage("04_rollout.py", "--run", tmp_path, "--iteration", 1, "--policy", tmp_path / "init_policy",
                     "--tasks", tmp_path / "tasks.jsonl", "--group-size", 2, "--tasks-per-iteration", 2,
                     "--max-turns", 2, "--max-new-tokens", 12, "--temperature", 1.0)
    assert "4 episodes, 1 harnesses: reward" in proc.stdout
    records = [json.loads(x) for x in (tmp_path / "iter_001" / "rollouts.jsonl").read_text().splitlines()]
    assert len(records) == 4 and {r["harness_id"] for r in records} == {"S2-T1-O2-C2-W1"}
    assert all(r["policy"] == str(tmp_path / "init_policy") and r["turns"] == 2 for r in records)
    assert all(mt["logprobs"] is not None for r in records for mt in r["model_turns"])
    check_token_records(records, tok, max_new_tokens=12)
    config = json.loads((tmp_path / "iter_001" / "04_rollout_config.json").read_text())
    assert config["generation_seconds"] > 0 and config["versions"]["transformers"]

    out = tmp_path / "eval" / "mix.jsonl"
    run_stage("04_rollout.py", "--run", tmp_path, "--eval", "--policy", tiny, "--harnesses", "base,X-react,X-shell"
              .replace("base", "S0-T0-O0-C0-W0"), "--tasks", tmp_path / "tasks.jsonl", "--samples", 2,
              "--max-turns", 2, "--max-new-tokens", 8, "--temperature", 0, "--out", out)
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(records) == 12 and all(r["iteration"] is None for r in records)
    check_token_records(records, tok, max_new_tokens=8)
    assert all(mt["logprobs"] is None for r in records for mt in r["model_turns"])  # greedy: no sampling log-probs
    by_group = {}
    for r in records:  # greedy: the two samples of a pair are identical
        by_group.setdefault(r["group_id"], []).append([mt["completion_ids"] for mt in r["model_turns"]])
    assert all(a == b for a, b in by_group.values())


def test_hf_logprobs_equal_a_forward_pass_at_the_temperature(tiny, tok):
    import torch
    args = argparse.Namespace(temperature=0.7, max_new_tokens=10)
    backend = G.HFBackend(str(tiny), tok, args)
    torch.manual_seed(0)
    prompts = [tok.encode("<|im_start|>user\nWhat is the code in river.txt?<|im_end|>\n<|im_start|>assistant\n"),
               tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")]
    results = backend.generate(prompts, 0)
    assert len(results) == 2
    for p, (ids, lps) in zip(prompts, results):
        with torch.no_grad():
            logits = backend.model(torch.tensor([p + ids])).logits[0]  # [L, V] unpadded, independent of generate
        ref = torch.log_softmax(logits[len(p) - 1:len(p) - 1 + len(ids)] / 0.7, -1)  # [N, V]
        ref = ref.gather(-1, torch.tensor(ids)[:, None])[:, 0]
        assert torch.allclose(torch.tensor(lps), ref, atol=1e-4), (lps, ref.tolist())


def test_context_limit_ends_episodes(tiny, tok):
    task = H.read_tasks()[1]
    h = H.by_id(H.space_records())["S0-T0-O0-C0-W0"]
    first = len(R.Episode(task, h, 4, {}).prompt(tok)[1])  # T0: the tools rendered by the template too
    backend = G.HFBackend(str(tiny), tok, argparse.Namespace(temperature=1.0, max_new_tokens=16))
    positions = first + 16 + 3  # turn 0 fits, turn 1 (prompt + reply + observation) cannot
    (r,) = R.run_episodes([(task, h, {})], "tiny", backend, tok, 4, 16, positions, progress=False)
    assert r["finish_reason"] == "context_limit" and r["turns"] == 1 and len(r["model_turns"]) == 1
    assert len(r["model_turns"][0]["prompt_ids"]) <= positions - 16
    assert G.max_positions(tiny) == 2048


def test_one_generation_call_per_turn_for_all_live_episodes(tok):
    class Fake:
        def __init__(self):
            self.calls = []

        def generate(self, prompts, turn):  # episodes 0 and 1 submit at turn 0, the rest never do
            self.calls.append(len(prompts))
            submit = tok.encode('<tool_call>{"name": "submit", "arguments": {"answer": "1"}}</tool_call>')
            return [(submit if turn == 0 and i < 2 else tok.encode("no"), None) for i in range(len(prompts))]

    fake, h = Fake(), H.by_id(H.space_records())["S0-T0-O0-C0-W0"]
    task = H.read_tasks()[0]
    R.run_episodes([(task, h, {}) for _ in range(5)], "fake", fake, tok, 3, 16, None, progress=False)
    assert fake.calls == [5, 3, 3]


# ----------------------------------------------------------------------------- bad input
def test_rewards_are_pass_fail_and_shortcuts_score_zero(tmp_path):
    """Through the CLI: a policy that does not do the work (here the oracle following a shortened solution) earns 0,
    never partial credit. Edit answered "done" without the edit: checks [file 0, answer 1] -> reward 0."""
    tasks = {t["family"]: t for t in small_tasks(tmp_path / "all.jsonl")}
    shortcuts = {
        "edit": [{"tool": "submit", "args": {"answer": "done"}}],  # no write
        # the edit written, but no "done": the request asks for both
        "edit-no-answer": tasks["edit"]["solution"][:2] + [{"tool": "submit", "args": {"answer": "ok"}}],
        # an answer from a distractor / a partial sum: read, then submit a number that is not the answer
        "sum": [tasks["sum"]["solution"][0], {"tool": "submit", "args": {"answer": "0"}}],
    }
    rows = []
    for name, solution in shortcuts.items():
        t = dict(tasks[name.split("-")[0]], task_id=f"shortcut-{name}", solution=solution)
        rows.append(t)
    rows.append(dict(tasks["edit"], task_id="real-edit"))  # the real solution still scores 1
    H.write_jsonl(tmp_path / "tasks.jsonl", rows)
    H.make_run(tmp_path, {"S0-T0-O0-C0-W0"}, {})
    out = tmp_path / "o.jsonl"
    run_stage("04_rollout.py", "--run", tmp_path, "--eval", "--policy", "oracle", "--harnesses", "base",
              "--tasks", tmp_path / "tasks.jsonl", "--out", out)
    recs = {r["task_id"]: r for r in map(json.loads, out.read_text().splitlines())}
    assert recs["shortcut-edit"]["checks"] == [0, 1] and recs["shortcut-edit"]["finish_reason"] == "submitted"
    assert recs["shortcut-edit-no-answer"]["checks"] == [1, 0]
    for tid in ("shortcut-edit", "shortcut-edit-no-answer", "shortcut-sum"):
        assert recs[tid]["reward"] == 0.0 and recs[tid]["success"] is False, recs[tid]
    assert recs["real-edit"]["reward"] == 1.0 and recs["real-edit"]["success"] is True
    assert recs["real-edit"]["checks"] == [1, 1]
    for r in recs.values():  # reward and success are one fact
        assert r["reward"] == float(r["success"])


def expect_error(capsys, argv, *needles):
    with pytest.raises(SystemExit) as e:
        R.main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith("error: "), err
    for needle in needles:
        assert needle in err, (needle, err)


def test_bad_input_names_file_line_and_field_and_writes_nothing(tmp_path, capsys):
    tasks = small_tasks(tmp_path / "tasks.jsonl")
    H.make_run(tmp_path, {"S0-T0-O0-C0-W0"}, {t["task_id"]: ["S0-T0-O0-C0-W0"] for t in tasks})
    out = tmp_path / "out" / "o.jsonl"
    base = ["--run", str(tmp_path), "--eval", "--policy", "oracle", "--harnesses", "base", "--out", str(out)]
    expect_error(capsys, base + ["--tasks", str(tmp_path / "nope.jsonl")], "nope.jsonl", "not found")
    lines = (tmp_path / "tasks.jsonl").read_text().splitlines()
    (tmp_path / "bad.jsonl").write_text(lines[0] + "\n" + lines[1][:-5] + "\n")
    expect_error(capsys, base + ["--tasks", str(tmp_path / "bad.jsonl")], "bad.jsonl:2", "malformed JSON")
    broken = json.loads(lines[0])
    del broken["checker"]
    (tmp_path / "bad.jsonl").write_text(lines[1] + "\n" + json.dumps(broken) + "\n")
    expect_error(capsys, base + ["--tasks", str(tmp_path / "bad.jsonl")], "bad.jsonl:2", "'checker'")
    tasks_arg = ["--tasks", str(tmp_path / "tasks.jsonl")]
    expect_error(capsys, base[:-4] + ["--harnesses", "S0-T0-O0-C0-W0,S9-T0-O0-C0-W0", "--out", str(out)] + tasks_arg,
                 "unknown harness id 'S9-T0-O0-C0-W0'")
    expect_error(capsys, base[:-4] + ["--harnesses", "heldout:x", "--out", str(out)] + tasks_arg, "heldout:N")
    shell = R.load_harness_file(R.EXTERNAL)[0]
    (tmp_path / "h.json").write_text(json.dumps(dict(shell, harness_id="X-bad",
                                                     specs=dict(shell["specs"], T={"syntax": "?"}))))
    expect_error(capsys, base[:-4] + ["--harnesses", "external", "--harness-file", str(tmp_path / "h.json"), "--out",
                                      str(out)] + tasks_arg, "h.json", "specs.T")
    expect_error(capsys, base[:4] + ["missing_policy", "--harnesses", "base", "--out", str(out)] + tasks_arg,
                 "missing_policy", "policy folder not found")
    expect_error(capsys, ["--run", str(tmp_path), "--policy", "oracle"] + tasks_arg, "--iteration")
    expect_error(capsys, ["--run", str(tmp_path), "--iteration", "0", "--group-size", "0"] + tasks_arg, "--group-size")
    # training writes RUN/iter_t/rollouts.jsonl: an --out would be silently ignored, so it is refused
    expect_error(capsys, ["--run", str(tmp_path), "--iteration", "0", "--policy", "oracle", "--out", str(out)]
                 + tasks_arg, "--out", "only for --eval")
    # train mode: the default policy of iteration 2 is DIR/iter_001/policy
    expect_error(capsys, ["--run", str(tmp_path), "--iteration", "2"] + tasks_arg, "iter_001/policy")
    rows = (tmp_path / "assignment.jsonl").read_text().splitlines()
    bad_row = rows[1].replace("S0-T0-O0-C0-W0", "S0-T0-O0-C0-W7")
    (tmp_path / "assignment.jsonl").write_text(rows[0] + "\n" + bad_row + "\n")
    expect_error(capsys, ["--run", str(tmp_path), "--iteration", "0", "--policy", "oracle"] + tasks_arg,
                 "assignment.jsonl:2", "'harness_ids'", "S0-T0-O0-C0-W7")
    (tmp_path / "assignment.jsonl").write_text(json.dumps({"task_id": "zzz", "harness_ids": ["S0-T0-O0-C0-W0"]}))
    expect_error(capsys, ["--run", str(tmp_path), "--iteration", "0", "--policy", "oracle"] + tasks_arg,
                 "assignment.jsonl:1", "'task_id'")
    for bad in ({"task_id": ["a"], "harness_ids": ["S0-T0-O0-C0-W0"]}, {"task_id": json.loads(rows[0])["task_id"],
                                                                          "harness_ids": [["S0-T0-O0-C0-W0"]]}):
        (tmp_path / "assignment.jsonl").write_text(json.dumps(bad))  # unhashable ids: a clear error, no TypeError
        expect_error(capsys, ["--run", str(tmp_path), "--iteration", "0", "--policy", "oracle"] + tasks_arg,
                     "assignment.jsonl:1", "'task_id'" if isinstance(bad["task_id"], list) else "'harness_ids'")
    assert not out.exists() and not (tmp_path / "iter_000").exists() and not list(tmp_path.rglob("*.tmp"))
    # the real command line: exit status 2, one error line
    proc = run_stage("04_rollout.py", "--run", tmp_path, "--eval", "--policy", "oracle", "--harnesses", "base",
                     "--tasks", tmp_path / "nope.jsonl", "--out", out, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: ") and "nope.jsonl" in proc.stderr


# ----------------------------------------------------------------------------- with the toy's tiny model
@pytest.fixture(scope="module")
def tiny05(tmp_path_factory):
    out = tmp_path_factory.mktemp("t05") / "tiny"
    run_stage("data/tiny_model.py", "--out", out, "--corpus", H.ROOT / "data" / "train_tasks.jsonl")
    return out


def test_task_entities_are_single_tokens_of_the_stage05_tiny_tokenizer(tiny05):
    """The toy can copy a file name, key, animal or value only if it is one token: data/tiny_model.py's tokenizer,
    trained on the training tasks, makes every entity of every default task (train and test) one token."""
    tok05 = G.load_tokenizer(tiny05)
    entities = {w for t in H.read_tasks() + H.read_tasks("test_tasks.jsonl") for text in t["files"].values()
                for w in re.findall(r"[a-z]+|\d+", text)}
    assert len(entities) > 100
    several = [w for w in sorted(entities) if len(tok05.encode(w, add_special_tokens=False)) != 1]
    assert not several, several[:10]


def test_works_with_the_stage05_tiny_model(tmp_path, tiny05):
    """data/tiny_model.py's tokenizer, chat template and stop ids: oracle demonstrations and hf rollouts."""
    tok05 = G.load_tokenizer(tiny05)
    assert tok05.stop_ids[0] == tok05.convert_tokens_to_ids("<|im_end|>")
    small_tasks(tmp_path / "tasks.jsonl")
    H.make_run(tmp_path, set(), {})
    common = ["--run", tmp_path, "--eval", "--tasks", tmp_path / "tasks.jsonl"]
    R.main([str(a) for a in common + ["--policy", "oracle", "--tokenizer", tiny05, "--harnesses", ",".join(MIX),
                                      "--out", tmp_path / "demos.jsonl"]])
    records = [json.loads(x) for x in (tmp_path / "demos.jsonl").read_text().splitlines()]
    assert all(r["success"] for r in records)
    check_token_records(records, tok05)
    run_stage("04_rollout.py", *common, "--policy", tiny05, "--harnesses", "S0-T2-O1-C1-W2,X-shell",
              "--max-turns", 3, "--max-new-tokens", 8, "--out", tmp_path / "hf.jsonl")
    records = [json.loads(x) for x in (tmp_path / "hf.jsonl").read_text().splitlines()]
    assert len(records) == 12
    check_token_records(records, tok05, max_new_tokens=8)
