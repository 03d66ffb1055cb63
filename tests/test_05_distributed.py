"""Stage 05 under torchrun (2 gloo ranks on CPU) against one process on the same rollouts: the same update.
And the naive port (each rank divides by its own N_B, gradients averaged as DDP does) measurably is not.
Run with -s to see the figures quoted in README.md ("Beyond one GPU")."""
import json
import os
import random
import subprocess
import sys

import pytest
import torch
from conftest import ROOT, load_stage
from safetensors.torch import load_file

T05 = load_stage("05_train.py")
TOL = 0.01  # ||theta_2rank - theta_1proc|| <= 1% of ||theta_1proc - theta_0||


def rollouts(path, vocab, n=13, seed=1):
    """One-turn episodes of very different lengths (13: the ranks can never hold equal token counts)."""
    rng = random.Random(seed)
    recs = []
    for i in range(n):
        prompt = [rng.randrange(3, vocab) for _ in range(rng.randint(4, 30))]
        comp = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 25))]
        recs.append({"episode_id": f"e{i}", "group_id": f"g{i // 4}", "reward": float(rng.random() < 0.5),
                     "temperature": 1.0, "model_turns": [{"prompt_ids": prompt, "completion_ids": comp,
                                                          "logprobs": None}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def flat(policy):
    """All trained parameters in one vector: the model's and (PPO) the value head's."""
    sd = load_file(policy / "model.safetensors")
    parts = [sd[k].flatten() for k in sorted(sd)]
    if (policy / "value_head.pt").is_file():
        vh = torch.load(policy / "value_head.pt")
        parts += [vh[k].flatten() for k in sorted(vh)]
    return torch.cat(parts)


@pytest.fixture(scope="module")
def update(tiny05, tmp_path_factory):
    """update(algo, mode) -> output folder; mode one | two | naive. Cached: each runs once per module."""
    d = tmp_path_factory.mktemp("dist05")
    roll = rollouts(d / "rollouts.jsonl", vocab=290)
    done = {}

    def run(algo, mode):
        if (algo, mode) in done:
            return done[algo, mode]
        out = d / f"{algo}-{mode}" / "policy"
        argv = ["--policy", str(tiny05), "--rollouts", str(roll), "--out", str(out), "--algo", algo, "--lr", "1e-3",
                "--ppo-epochs", "2", "--minibatches", "2", "--micro-batch-size", "2", "--no-optimizer-state"]
        if mode == "one":  # the reference: plain `python 05_train.py` code path, in this process
            T05.main(argv)
        else:
            env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
            cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--",
                   str(ROOT / "05_train.py"), *argv] + (["--naive-local-nb"] if mode == "naive" else [])
            proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        done[algo, mode] = out
        return out

    hidden = json.loads((tiny05 / "config.json").read_text())["hidden_size"]
    # theta_0: the loaded policy, and for PPO the value head 05 initialises to zeros
    run.theta0 = {"grpo": flat(tiny05), "ppo": torch.cat([flat(tiny05), torch.zeros(hidden + 1)])}
    return run


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_two_ranks_make_the_one_process_update(update, algo):
    one, two = update(algo, "one"), update(algo, "two")
    step = (flat(one) - update.theta0[algo]).norm()
    gap = float((flat(two) - flat(one)).norm() / step)
    print(f"\n[{algo}] ||theta_2rank - theta_1proc|| / ||theta_1proc - theta_0|| = {gap:.2e}")
    assert step > 0
    assert gap <= TOL
    log1 = [json.loads(x) for x in (one.parent / "train_log.jsonl").read_text().splitlines()]
    log2 = [json.loads(x) for x in (two.parent / "train_log.jsonl").read_text().splitlines()]
    assert len(log1) == len(log2) == 4
    for a, b in zip(log1, log2):
        # the ranks held different token counts in every step, and the logged counts are the global ones
        assert len(set(b["rank_tokens"])) == 2 and sum(b["rank_tokens"]) == b["tokens"] == a["tokens"]
        for k in ("loss", "pg_loss", "entropy", "grad_norm"):
            assert b[k] == (None if a[k] is None else pytest.approx(a[k], rel=1e-4, abs=1e-6)), k  # entropy: None
            # without --ent-coef (not computed)
    # only rank 0 wrote: one checkpoint, one log, one config
    assert sorted(p.name for p in one.parent.iterdir()) == sorted(p.name for p in two.parent.iterdir())


@pytest.mark.parametrize("algo", ["grpo", "ppo"])
def test_the_naive_local_token_count_would_fail_it(update, algo):
    """Each rank over its own N_B_r and DDP's mean: 1/W sum_r 1/N_B_r sum_{t in B_r} l_t != 1/N_B sum_t l_t when
    the N_B_r differ; the gap is far outside the tolerance the correct port meets."""
    one, naive = update(algo, "one"), update(algo, "naive")
    gap = float((flat(naive) - flat(one)).norm() / (flat(one) - update.theta0[algo]).norm())
    print(f"\n[{algo}] naive local N_B: ||theta_naive - theta_1proc|| / ||theta_1proc - theta_0|| = {gap:.3f}")
    assert gap > 10 * TOL


def test_shard_by_tokens_is_a_balanced_deterministic_partition():
    rng = random.Random(0)
    seqs = [{"ids": [0] * rng.randint(1, 50), "k": i} for i in range(37)]
    for world in (1, 2, 3, 8):
        parts = [T05.shard_by_tokens(seqs, rank=r, world=world) for r in range(world)]
        assert sorted(s["k"] for p in parts for s in p) == list(range(37))  # each sequence on exactly one rank
        assert parts == [T05.shard_by_tokens(seqs, rank=r, world=world) for r in range(world)]  # same on every rank
        load = [sum(len(s["ids"]) for s in p) for p in parts]
        assert max(load) - min(load) <= 50  # greedy longest-first: within one sequence's length
        for p in parts:  # each share keeps the minibatch's order
            assert [s["k"] for s in p] == sorted(s["k"] for s in p)
