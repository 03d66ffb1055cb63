"""04's train mode inside pydantic-ai (black-box RL): `04 --iteration t --harnesses pydantic-ai` reads no
assignment and no harness file; iteration t's batch is train_batch(the tasks file's ids, t, B, order seed) as in
assignment-based train mode, each task gets G episodes inside the framework, and the records carry train mode's
meta, pass schemas.TRAIN_ROLLOUT and train in 05 (GRPO) with the sampled ids as the loss tokens. Each episode draws
with its own randomness (keyed by its episode_id). The evaluation-only frameworks are refused. Offline."""
import json
import types
from collections import Counter

import pytest

from common import generation as G
import helpers_04 as H
from common import schemas as S
from conftest import load_stage, run_stage

pytest.importorskip("pydantic_ai")
R = load_stage("04_rollout.py")
F = load_stage("05_train.py")
HID = "X-pydantic-ai"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """04's tiny random policy (ChatML, tools rendered in the Hermes convention); its replies stop now and then."""
    path = H.build_tiny_model(tmp_path_factory.mktemp("tiny_bbt"), max_positions=4096, stop_logit=5.5)
    return path, G.load_tokenizer(path)


def write_tasks(path, tasks):
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    return path


def rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_the_oracle_in_train_mode_inside_pydantic_ai_over_two_iterations(tmp_path):
    """5 tasks, B = 3, G = 2: iteration 0 holds chunk 0 of the epoch's permutation, iteration 1 chunk 1 filled from
    the permutation's start (one task of iteration 0 again: its visit 1). The run folder holds no 01-03 file."""
    tasks = H.read_tasks()[:5]
    path = write_tasks(tmp_path / "tasks.jsonl", tasks)
    run, ids = tmp_path / "run", [t["task_id"] for t in tasks]
    seen = Counter()
    for t in (0, 1):
        proc = run_stage("04_rollout.py", "--run", run, "--iteration", t, "--harnesses", "pydantic-ai", "--policy",
                         "oracle", "--tasks", path, "--group-size", 2, "--tasks-per-iteration", 3, "--order-seed", 7)
        out = run / f"iter_{t:03d}" / "rollouts.jsonl"
        recs = rows(out)
        batch = R.train_batch(ids, t, 3, 7)
        assert len(batch) == 3 and [r["task_id"] for r in recs] == [tid for tid in batch for _ in range(2)]
        for r in recs:
            tid, s = r["task_id"], r["sample_index"]
            assert r["episode_id"] == f"it{t:03d}-{tid}-{HID}-s{s}" and r["group_id"] == f"{tid}|{HID}|it{t:03d}"
            assert r["iteration"] == t and r["visit"] == seen[tid] and r["harness_id"] == HID
            assert r["framework"].startswith("pydantic-ai ") and r["success"] and r["policy"] == "oracle"
        assert [r["sample_index"] for r in recs] == [0, 1] * 3
        assert S.load_rollouts(out, list(S.TRAIN_ROLLOUT), {"model_turns": ""}, S.TRAIN_ROLLOUT)
        config = json.loads((run / f"iter_{t:03d}" / "04_rollout_config.json").read_text())
        assert config["harness_ids"] == [HID] and config["episodes"] == 6 and "success 1.000" in proc.stdout
        seen.update(batch)
    assert max(r["visit"] for r in recs) == 1  # iteration 1 revisits one task of iteration 0
    assert sorted(p.name for p in run.iterdir()) == ["iter_000", "iter_001"]  # no assignment, no harness file


def check_token_in_token_out(rec):
    """Each turn's prompt either extends the last one (its prompt + its sampled ids) or is a counted re-render; 05
    builds 1 + rerendered_turns sequences whose loss tokens are the sampled ids, in order."""
    turns = rec["model_turns"]
    assert len(turns) == rec["turns"] >= 1
    extended = sum(b["prompt_ids"][:len(a["prompt_ids"]) + len(a["completion_ids"])] ==
                   a["prompt_ids"] + a["completion_ids"] for a, b in zip(turns, turns[1:]))
    assert rec["rerendered_turns"] == len(turns) - 1 - extended
    seqs = F.build_sequences([dict(turns=[(t["prompt_ids"], t["completion_ids"], t["logprobs"]) for t in turns],
                                   temp=1.0)])
    assert len(seqs) == 1 + rec["rerendered_turns"]
    assert [i for s in seqs for i, m in zip(s.ids, s.mask) if m] == [i for t in turns for i in t["completion_ids"]]


def test_a_tiny_policy_in_train_mode_trains_in_05(tiny, tmp_path):
    """The tiny policy's train-mode records are token-in/token-out, the same for the same seed, and 05 takes one
    GRPO step on them."""
    path, tok = tiny
    tasks = write_tasks(tmp_path / "tasks.jsonl", H.read_tasks()[:2])
    common = ["--iteration", 0, "--harnesses", "pydantic-ai", "--policy", path, "--backend", "hf", "--tasks", tasks,
              "--group-size", 2, "--tasks-per-iteration", 0, "--max-turns", 3, "--max-new-tokens", 16,
              "--temperature", 1.0, "--seed", 3]
    for name in ("a", "b"):
        run_stage("04_rollout.py", "--run", tmp_path / name, *common)
    out = tmp_path / "a" / "iter_000" / "rollouts.jsonl"
    recs = rows(out)
    assert recs == rows(tmp_path / "b" / "iter_000" / "rollouts.jsonl")  # the same seed, the same records
    assert [r["group_id"] for r in recs] == [f"{t['task_id']}|{HID}|it000" for t in H.read_tasks()[:2]
                                             for _ in range(2)]
    assert recs[0]["model_turns"] != recs[1]["model_turns"]  # the samples of a group differ
    for r in recs:
        check_token_in_token_out(r)
        assert r["sampler"]["backend"] == "hf" and r["temperature"] == 1.0
        for mt in r["model_turns"]:
            assert 0 < len(mt["completion_ids"]) <= 16 and len(mt["logprobs"]) == len(mt["completion_ids"])
            assert max(mt["prompt_ids"] + mt["completion_ids"]) < len(tok)
    assert S.load_rollouts(out, list(S.TRAIN_ROLLOUT), {"model_turns": ""}, S.TRAIN_ROLLOUT, len(tok))
    # a random policy solves nothing, so every group is reward-equal and GRPO has no signal: the first sample of
    # each group is given reward 1, so that 05's update really steps on these records as 04 wrote them
    graded = tmp_path / "graded.jsonl"
    graded.write_text("".join(json.dumps(dict(r, reward=float(r["sample_index"] == 0))) + "\n" for r in recs))
    proc = run_stage("05_train.py", "--algo", "grpo", "--policy", path, "--rollouts", graded, "--out",
                     tmp_path / "p" / "policy", "--lr", "1e-3", "--epochs", 1, "--minibatches", 1)
    assert "[05] 1 optimizer steps of 1 minibatches" in proc.stdout, proc.stdout
    log = [json.loads(line) for line in (tmp_path / "p" / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 1 and log[0]["grad_norm"] > 0


def test_each_episode_draws_its_own_randomness(tiny):
    """A bridge episode's tokens depend on its episode_id and the seed alone, not on the episodes run before it
    (as in 04's lockstep rollouts): task B's episodes are the same run after task A's or alone."""
    from bridges import pydantic_ai_harness as P
    path, tok = tiny
    a, b = H.read_tasks()[:2]

    def run(tasks):
        backend = G.HFBackend(path, tok, types.SimpleNamespace(temperature=1.0, max_new_tokens=12, seed=5))
        return P.run_pydantic_ai_episodes(tasks, str(path), backend, tok, 2, 12, 1.0, samples=2, progress=False)
    both, alone = run([a, b]), run([b])
    assert [r["episode_id"] for r in both[2:]] == [r["episode_id"] for r in alone]
    assert [r["model_turns"] for r in both[2:]] == [r["model_turns"] for r in alone]
    assert alone[0]["model_turns"] != alone[1]["model_turns"]


@pytest.mark.parametrize("name,why", [("smolagents-native", "Claude Code"), ("smolagents", "unseen call syntax"),
                                      ("train", "assignment.jsonl")])
def test_train_mode_refuses_every_other_harness_spec(tmp_path, name, why):
    proc = run_stage("04_rollout.py", "--run", tmp_path, "--iteration", 0, "--harnesses", name, "--policy",
                     "oracle", check=False)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith(f"error: --harnesses {name}: ") \
        and why in err[0] and "pydantic-ai" in err[0], proc.stderr
    assert not (tmp_path / "iter_000" / "rollouts.jsonl").exists()


def test_train_mode_inside_pydantic_ai_refuses_shards(tmp_path):
    proc = run_stage("04_rollout.py", "--run", tmp_path, "--iteration", 0, "--harnesses", "pydantic-ai", "--policy",
                     "oracle", "--shard", "0/2", check=False)
    assert proc.returncode == 2 and "--shard: not for --harnesses pydantic-ai" in proc.stderr
    assert not (tmp_path / "iter_000" / "rollouts.jsonl").exists()
