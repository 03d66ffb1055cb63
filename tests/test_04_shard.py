"""04 --shard I/N: N processes, each running a contiguous block of the jobs, whose files concatenated in order
are the records of one process with the same seed (each episode's sampling randomness is keyed by its id)."""
import json

import pytest
from conftest import load_stage, run_stage

from common import generation as G
import helpers_04 as H

R = load_stage("04_rollout.py")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return H.build_tiny_model(tmp_path_factory.mktemp("tiny"), stop_logit=5.5)  # P(stop) ~ 1/4 a token


def read(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_shards_concatenated_equal_one_process_hf_sampling(tmp_path, tiny):
    tasks = H.read_tasks()[:3]
    H.write_jsonl(tmp_path / "tasks.jsonl", tasks)
    hids = ["S0-T0-O0-C0-W0", "S2-T1-O2-C2-W1"]
    H.make_run(tmp_path, set(hids), {t["task_id"]: hids for t in tasks})
    common = ["--run", tmp_path, "--iteration", 0, "--policy", tiny, "--tasks", tmp_path / "tasks.jsonl",
              "--group-size", 2, "--tasks-per-iteration", 3, "--max-turns", 2, "--max-new-tokens", 10,
              "--temperature", 1.0, "--seed", 3]
    run_stage("04_rollout.py", *common)
    one = read(tmp_path / "iter_000" / "rollouts.jsonl")
    parts = []
    for i in range(2):  # 6 episodes: shard 0 runs 3, shard 1 runs 3, each in batches of its own composition
        run_stage("04_rollout.py", *common, "--shard", f"{i}/2")
        parts.append(read(tmp_path / "iter_000" / f"rollouts.shard-{i}-of-2.jsonl"))
        assert (tmp_path / "iter_000" / f"04_rollout_config.shard-{i}-of-2.json").is_file()
    assert [len(p) for p in parts] == [3, 3]
    cat = parts[0] + parts[1]
    assert [r["episode_id"] for r in cat] == [r["episode_id"] for r in one]
    # the samples of a group differ (their randomness is their own), so the identity below is not vacuous
    assert one[0]["model_turns"][0]["completion_ids"] != one[1]["model_turns"][0]["completion_ids"]
    for a, b in zip(one, cat):
        for mt_a, mt_b in zip(a["model_turns"], b["model_turns"]):
            assert mt_a["prompt_ids"] == mt_b["prompt_ids"] and mt_a["completion_ids"] == mt_b["completion_ids"]
            # log-probs: the same up to float rounding of another batch shape (padding width)
            assert mt_a["logprobs"] == pytest.approx(mt_b["logprobs"], abs=1e-4)
        strip = lambda r: {k: v for k, v in r.items() if k != "model_turns"}
        assert strip(a) == strip(b)


def test_shard_spec_errors_and_block_split(tmp_path, capsys):
    for bad in ("2/2", "1", "a/b", "-1/2"):
        with pytest.raises(SystemExit):
            R.main(["--run", str(tmp_path), "--iteration", "0", "--policy", "oracle", "--shard", bad])
        assert "--shard" in capsys.readouterr().err
    jobs = list(range(7))  # the block split used by 04: contiguous, sizes differ by at most one, nothing lost
    blocks = [jobs[len(jobs) * i // 3:len(jobs) * (i + 1) // 3] for i in range(3)]
    assert sum(blocks, []) == jobs and {len(b) for b in blocks} <= {2, 3}
    assert R.shard_path(tmp_path / "r.jsonl", 1, 3).name == "r.shard-1-of-3.jsonl"


def test_vllm_seeds_follow_the_episode_and_tensor_parallel_is_passed(monkeypatch, tiny):
    """A request's seed depends on (seed, turn, episode id) only: the same in any batch; TP reaches LLM(...)."""
    import argparse
    import sys

    from test_04_vllm import Fake
    tok = G.load_tokenizer(tiny)
    fake = Fake(lambda i, p: [5])
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    args = argparse.Namespace(temperature=1.0, max_new_tokens=4, seed=7, tensor_parallel_size=2)
    backend = G.VLLMBackend(tiny, tok, args)
    assert fake.llm_kwargs["tensor_parallel_size"] == 2
    backend.generate([[1], [2], [3]], 1, keys=["a", "b", "c"])
    backend.generate([[3], [1]], 1, keys=["c", "a"])  # another batch: the same episodes keep their seeds
    seeds = [[p.kwargs["seed"] for p in params] for _, params, _ in fake.calls]
    assert seeds[1] == [seeds[0][2], seeds[0][0]] and len(set(seeds[0])) == 3
    backend.generate([[1]], 2, keys=["a"])  # the next turn draws new randomness
    assert fake.calls[-1][1][0].kwargs["seed"] != seeds[0][0]
    args1 = argparse.Namespace(temperature=1.0, max_new_tokens=4, seed=7)
    G.VLLMBackend(tiny, tok, args1)
    assert "tensor_parallel_size" not in fake.llm_kwargs  # one GPU: nothing new passed
