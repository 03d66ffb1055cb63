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
DIST = load_stage("common/distributed.py")  # imported by 05 under torchrun only
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


def launch(argv, mode):
    """05 with argv: mode one (plain `python 05_train.py` code path, in this process), or two gloo ranks under
    torchrun: two (the default port), naive (tests/variants05.py naive-local-nb), fsdp (--fsdp); or one rank under
    torchrun (common/distributed.py over a group of one, as on one GPU): rank1, rank1-fsdp."""
    if mode == "one":
        return T05.main(argv)
    # CUDA hidden: these are gloo ranks on the CPU, also on a GPU machine (2 NCCL ranks need 2 GPUs)
    env = dict(os.environ, OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", CUDA_VISIBLE_DEVICES="")
    ranks = "1" if mode.startswith("rank1") else "2"
    stage = [str(ROOT / "tests" / "variants05.py"), "naive-local-nb", "--"] if mode == "naive" else \
        [str(ROOT / "05_train.py")]
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", ranks, "--",
           *stage, *argv] + (["--fsdp"] if mode.endswith("fsdp") else [])
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def update(tiny05, tmp_path_factory):
    """update(algo, mode) -> output folder; mode one | two | naive | fsdp. Cached: each runs once per module."""
    d = tmp_path_factory.mktemp("dist05")
    roll = rollouts(d / "rollouts.jsonl", vocab=290)
    done = {}

    def run(algo, mode):
        if (algo, mode) in done:
            return done[algo, mode]
        out = d / f"{algo}-{mode}" / "policy"
        argv = ["--policy", str(tiny05), "--rollouts", str(roll), "--out", str(out), "--algo", algo, "--lr", "1e-3",
                "--ppo-epochs", "2", "--epochs", "2", "--minibatches", "2", "--micro-batch-size", "2",
                "--no-optimizer-state"]
        launch(argv, mode)
        done[algo, mode] = out
        return out

    hidden = json.loads((tiny05 / "config.json").read_text())["hidden_size"]
    # theta_0: the loaded policy, and for PPO the value head 05 initialises to zeros
    run.rollouts = roll
    run.theta0 = {"grpo": flat(tiny05), "sft": flat(tiny05), "ppo": torch.cat([flat(tiny05), torch.zeros(hidden + 1)])}
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
        assert b["signal_sequences"] == a["signal_sequences"]  # counted once, not once per rank
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
        tokens = lambda s: len(s["ids"])  # noqa: E731
        parts = [DIST.shard_by_tokens(seqs, rank=r, world=world, cost=tokens) for r in range(world)]
        assert sorted(s["k"] for p in parts for s in p) == list(range(37))  # each sequence on exactly one rank
        assert parts == [DIST.shard_by_tokens(seqs, rank=r, world=world, cost=tokens) for r in range(world)]  # same on every rank
        load = [sum(len(s["ids"]) for s in p) for p in parts]
        assert max(load) - min(load) <= 50  # greedy longest-first: within one sequence's length
        for p in parts:  # each share keeps the minibatch's order
            assert [s["k"] for s in p] == sorted(s["k"] for s in p)


@pytest.mark.parametrize("algo", ["grpo", "ppo", "sft"])
def test_fsdp_makes_the_one_process_update(update, algo):
    """--fsdp (FSDP2: weights, gradients and AdamW moments sharded over the 2 ranks; zero-weight micro-batches on the
    rank with fewer; gradients summed, not averaged): the same update, and a checkpoint in the one-process format."""
    one, fsdp = update(algo, "one"), update(algo, "fsdp")
    gap = float((flat(fsdp) - flat(one)).norm() / (flat(one) - update.theta0[algo]).norm())
    print(f"\n[{algo}] --fsdp: ||theta_fsdp - theta_1proc|| / ||theta_1proc - theta_0|| = {gap:.2e}")
    assert gap <= TOL
    log1 = [json.loads(x) for x in (one.parent / "train_log.jsonl").read_text().splitlines()]
    logf = [json.loads(x) for x in (fsdp.parent / "train_log.jsonl").read_text().splitlines()]
    assert len(log1) == len(logf) == 4
    for a, b in zip(log1, logf):
        assert len(set(b["rank_tokens"])) == 2 and sum(b["rank_tokens"]) == a["tokens"]
        assert b["signal_sequences"] == a["signal_sequences"]
        for k in ("loss", "pg_loss", "entropy", "grad_norm"):
            assert (b[k] is None and a[k] is None) or b[k] == pytest.approx(a[k], rel=1e-4, abs=1e-6), k  # entropy: None without --ent-coef
    # the same files, the same tensor names and shapes (the tied LM head written once, as save_pretrained does)
    assert sorted(p.name for p in one.iterdir()) == sorted(p.name for p in fsdp.iterdir())
    sd1, sdf = load_file(one / "model.safetensors"), load_file(fsdp / "model.safetensors")
    assert {k: v.shape for k, v in sd1.items()} == {k: v.shape for k, v in sdf.items()}


def test_fsdp_checkpoint_and_adamw_state_carry_over(update, tiny05, tmp_path):
    """--fsdp gathers the weights and AdamW's moments to rank 0 and writes them in the one-process format: the
    checkpoint loads with from_pretrained, optimizer.pt holds the one-process run's moments, and the next update
    loads it with or without --fsdp and lands where the one-process chain lands."""
    from transformers import AutoModelForCausalLM

    def it(mode, policy, name):  # one GRPO update that loads and saves optimizer.pt
        out = tmp_path / name / "policy"
        launch(["--policy", str(policy), "--rollouts", str(update.rollouts), "--out", str(out), "--algo", "grpo",
                "--lr", "1e-3", "--ppo-epochs", "1", "--minibatches", "2", "--micro-batch-size", "2"], mode)
        return out

    one1, fsdp1 = it("one", tiny05, "one-1"), it("fsdp", tiny05, "fsdp-1")
    assert AutoModelForCausalLM.from_pretrained(fsdp1).config.tie_word_embeddings
    o1, f1 = torch.load(one1 / "optimizer.pt"), torch.load(fsdp1 / "optimizer.pt")
    assert f1["algo"] == o1["algo"] and f1["shapes"] == o1["shapes"]
    assert f1["state"]["param_groups"] == o1["state"]["param_groups"]
    assert f1["state"]["state"].keys() == o1["state"]["state"].keys()
    for k in ("exp_avg", "exp_avg_sq"):
        a = torch.cat([st[k].flatten() for _, st in sorted(o1["state"]["state"].items())])
        b = torch.cat([st[k].flatten() for _, st in sorted(f1["state"]["state"].items())])
        rel = float((b - a).norm() / a.norm())
        print(f"\n--fsdp optimizer.pt: ||{k} - one-process|| / ||one-process|| = {rel:.2e}")
        assert rel <= 1e-3
    assert all(float(f1["state"]["state"][i]["step"]) == float(st["step"]) for i, st in o1["state"]["state"].items())
    # iteration 2 from each checkpoint, loading its optimizer.pt: one process, and --fsdp (each rank cuts its shard)
    one2, fsdp_one2, fsdp_fsdp2 = it("one", one1, "one-2"), it("one", fsdp1, "fsdp-one-2"), it("fsdp", fsdp1, "fsdp-2")
    step = (flat(one2) - flat(one1)).norm()
    for out in (fsdp_one2, fsdp_fsdp2):
        cfg = json.loads((out.parent / "05_train_config.json").read_text())
        assert cfg["optimizer_state"].startswith("AdamW state loaded"), cfg["optimizer_state"]
        gap = float((flat(out) - flat(one2)).norm() / step)
        print(f"[{out.parent.name}] ||theta_2 - theta_2 one-process chain|| / ||its second step|| = {gap:.2e}")
        assert gap <= TOL


def test_fsdp_needs_torchrun(tiny05, tmp_path, capsys):
    roll = rollouts(tmp_path / "r.jsonl", vocab=290)
    with pytest.raises(SystemExit) as e:
        T05.main(["--policy", str(tiny05), "--rollouts", str(roll), "--out", str(tmp_path / "p"), "--fsdp"])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--fsdp" in err[0] and "torchrun" in err[0]
    assert not (tmp_path / "p").exists()


@pytest.mark.parametrize("mode", ["rank1", "rank1-fsdp"])
def test_one_rank_under_torchrun_is_the_one_process_update_exactly(update, mode):
    """torchrun --nproc_per_node 1 (a user with one GPU; experiments/bench/gpu_check.py's torchrun step) runs
    common/distributed.py over a group of one, with and without FSDP2: every sum is over one rank, so the weights are
    the one process's, bit for bit."""
    one, rank1 = flat(update("grpo", "one")), flat(update("grpo", mode))
    if torch.cuda.is_available():  # "one" ran on the GPU here, the ranks on the CPU: the 2-rank tolerance
        assert (rank1 - one).norm() <= TOL * (one - update.theta0["grpo"]).norm()
    else:
        assert torch.equal(rank1, one)
