"""Stage 05 maths against independent computations: mask, N_B across micro-batches, GRPO advantages,
the first-step loss, clipping, GAE, merged turns; plus the CLI (one iteration, bad input)."""
import dataclasses
import functools
import json
import random

import numpy as np
import pytest
import torch
from conftest import TINY05_WORDS, load_stage, run_stage
from transformers import AutoModelForCausalLM, AutoTokenizer

T05 = load_stage("05_train.py")
WORDS = TINY05_WORDS  # the words the tiny tokenizer was trained on


@pytest.fixture
def tiny(tiny05):
    return tiny05


def load(path):
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def random_episodes(vocab, n=6, turns=2, seed=0, full_history=False, groups=3):
    """Contract-shaped rollout records with random ids; completion lengths differ on purpose."""
    rng = random.Random(seed)
    recs = []
    for i in range(n):
        prompt, mts = [rng.randrange(3, vocab) for _ in range(rng.randint(4, 9))], []
        for _ in range(turns):
            comp = [rng.randrange(3, vocab) for _ in range(rng.randint(1, 7))]
            mts.append({"prompt_ids": prompt, "completion_ids": comp, "logprobs": None})
            tool = [rng.randrange(3, vocab) for _ in range(rng.randint(2, 5))]
            prompt = (prompt + comp + tool) if full_history else [rng.randrange(3, vocab) for _ in range(5)] + tool
        recs.append({"episode_id": f"e{i}", "group_id": f"g{i % groups}", "reward": float(rng.random() < 0.5) + 0.1 * i,
                     "temperature": 1.0, "model_turns": mts})
    return recs


def as_episodes(recs):
    return [dict(turns=[(t["prompt_ids"], t["completion_ids"], t["logprobs"]) for t in r["model_turns"]],
                 reward=r["reward"], group=r["group_id"], temp=r["temperature"]) for r in recs]


def args_for(*extra):
    return T05.parse_args(["--policy", "p", "--rollouts", "r", "--out", "o", *extra])


def grads(model):
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


def prepare(model, seqs, adv_by_ep):
    ctx = T05.Context(args_for("--micro-batch-size", "4"), model, None, 0, "cpu", False)
    for s, lp in zip(seqs, T05.sequence_logprobs(ctx, seqs)[0]):
        s.old_logp = lp
    for s in seqs:
        s.adv = torch.full((s.n,), float(adv_by_ep[s.ep]))
    return seqs


# --------------------------------------------------------------------------------------------- maths
def test_grpo_advantages_match_numpy():
    rewards = [1.0, 0.0, 1.0, 0.5, 0.5, 0.5, 0.2, 0.9, 0.0, 1.0]
    groups = ["a", "a", "a", "b", "b", "b", "c", "c", "c", "d"]
    adv, share = T05.grpo_advantages(rewards, groups, use_std=True, eps=1e-6)
    r = np.array(rewards)
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        expect = (r[idx] - r[idx].mean()) / (np.std(r[idx]) + 1e-6)
        np.testing.assert_allclose(adv[idx], expect, atol=1e-12)
    # by hand: rewards (1, 0, 1): mean 2/3, population std sqrt(2)/3
    np.testing.assert_allclose(adv[:3], np.array([1 / 3, -2 / 3, 1 / 3]) / (2 ** 0.5 / 3 + 1e-6), atol=1e-12)
    assert share == pytest.approx(2 / 4)  # groups b (all 0.5) and d (one sample) are zero-variance
    adv_mean_only, _ = T05.grpo_advantages(rewards, groups, use_std=False)
    np.testing.assert_allclose(adv_mean_only[6:9], [0.2 - 1.1 / 3, 0.9 - 1.1 / 3, -1.1 / 3], atol=1e-12)


def test_gae_small_example_by_hand():
    # gamma 0.9, lambda 0.8, rewards (0, 0, 1), values (0.5, 0.6, 0.7):
    # delta = (0.04, 0.03, 0.3); A_2 = 0.3, A_1 = 0.03 + 0.72 * 0.3 = 0.246, A_0 = 0.04 + 0.72 * 0.246
    adv, ret = T05.gae(torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.5, 0.6, 0.7]), 0.9, 0.8)
    torch.testing.assert_close(adv, torch.tensor([0.21712, 0.246, 0.3]))
    torch.testing.assert_close(ret, torch.tensor([0.71712, 0.846, 1.0]))
    adv, _ = T05.gae(torch.tensor([0.0, 0.0, 2.0]), torch.tensor([0.1, -0.2, 0.4]), 1.0, 1.0)
    torch.testing.assert_close(adv, torch.tensor([1.9, 2.2, 1.6]))  # gamma = lambda = 1: A_t = R - V_t


def test_clipping_zeroes_gradient_on_the_clipped_side():
    eps, n_b = 0.2, 10.0
    ratio = torch.tensor([1.5, 1.5, 0.5, 0.5, 1.1, 0.9])
    adv = torch.tensor([1.0, -1.0, -2.0, 2.0, 0.5, -0.5])
    old = torch.log(torch.tensor([0.3, 0.2, 0.4, 0.1, 0.25, 0.5]))
    logp = (old + torch.log(ratio)).requires_grad_(True)
    loss, _ = T05.policy_loss(logp, old, adv, eps, n_b)
    loss.backward()
    # d(-min(rho A, clip(rho) A) / N_B)/d logp = -A rho / N_B where the unclipped term is the min, else 0:
    # rho > 1 + eps with A > 0 and rho < 1 - eps with A < 0 are clipped (tokens 0 and 2)
    expect = torch.tensor([0.0, 1.5 * 1.0, 0.0, -0.5 * 2.0, -1.1 * 0.5, 0.9 * 0.5]) / n_b
    torch.testing.assert_close(logp.grad, expect)
    manual = -sum(min(r * a, min(max(r, 0.8), 1.2) * a) for r, a in zip(ratio.tolist(), adv.tolist())) / n_b
    assert loss.item() == pytest.approx(manual, abs=1e-6)


def test_first_step_gradient_and_mask_against_full_logits(tiny):
    """Ratio = 1 on the first minibatch: loss = -sum(M A)/N_B and the gradient is that of
    -sum(M A log pi)/N_B, computed here independently from full logits. Tokens after the last
    completion (a tool output) are masked: changing them changes no gradient."""
    model = load(tiny)
    vocab = model.config.vocab_size
    rng = random.Random(3)
    seqs, ref_terms = [], []
    for e in range(4):
        p, c, tool = ([rng.randrange(3, vocab) for _ in range(k)] for k in (5 + e, 2 + 2 * e, 3))
        seqs.append(T05.Sequence(ids=p + c + tool, mask=[0] * len(p) + [1] * len(c) + [0] * 3, ep=e, temp=1.0,
                                 n=len(c)))
    adv = [0.5, -1.0, 2.0, 0.25]
    prepare(model, seqs, adv)
    n_b = sum(s.n for s in seqs)
    args = args_for("--algo", "grpo", "--micro-batch-size", "3")
    model.zero_grad()
    m = T05.accumulate(T05.Context(args, model, None, 0, "cpu", False), seqs)
    g_trainer = grads(model)
    assert m["tokens"] == n_b == 2 + 4 + 6 + 8
    assert m["pg_loss"] == pytest.approx(-sum(a * s.n for a, s in zip(adv, seqs)) / n_b, abs=1e-6)
    assert m["clip_frac"] == 0 and abs(m["approx_kl"]) < 1e-7
    # independent: full forward of each sequence alone, positions picked by hand
    model.zero_grad()
    total = 0
    for s, a in zip(seqs, adv):
        logp = torch.log_softmax(model(torch.tensor([s.ids])).logits[0], -1)  # [L, V]
        for pos in range(len(s.ids)):
            if s.mask[pos]:
                total = total - a * logp[pos - 1, s.ids[pos]]
    (total / n_b).backward()
    torch.testing.assert_close(g_trainer, grads(model), atol=1e-6, rtol=1e-4)
    # change the masked tool-output tokens at the end: identical gradient
    changed = [dataclasses.replace(s, ids=s.ids[:-3] + [(x + 7) % vocab for x in s.ids[-3:]]) for s in seqs]
    model.zero_grad()
    T05.accumulate(T05.Context(args, model, None, 0, "cpu", False), changed)
    torch.testing.assert_close(grads(model), g_trainer, atol=0, rtol=0)
    # ...whereas changing a completion token does change it (the check above can fail)
    s0 = seqs[3]
    k = s0.mask.index(1) + 1
    changed[3] = dataclasses.replace(s0, ids=s0.ids[:k] + [(s0.ids[k] + 1) % vocab] + s0.ids[k + 1:])
    model.zero_grad()
    T05.accumulate(T05.Context(args, model, None, 0, "cpu", False), changed)
    assert (grads(model) - g_trainer).abs().max() > 1e-6


def test_sequences_mask_exactly_the_completions():
    recs = random_episodes(500, n=3, turns=3)
    seqs = T05.build_sequences(as_episodes(recs), merge=True)  # not full history: nothing merges
    assert len(seqs) == 9
    for s, t in zip(seqs, [t for r in recs for t in r["model_turns"]]):
        assert s.ids == t["prompt_ids"] + t["completion_ids"]
        assert s.mask == [0] * len(t["prompt_ids"]) + [1] * len(t["completion_ids"])
        b = T05.token_batch([s], 0, "cpu", T05.TOKEN_FIELDS)
        assert b["tgt"].tolist() == t["completion_ids"]


def test_micro_batch_size_does_not_change_the_update(tiny, tmp_path):
    recs = random_episodes(AutoTokenizer.from_pretrained(tiny).vocab_size, n=8, turns=2, seed=5)
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    params = {}
    for mbs in (1, 64):
        T05.main(["--algo", "grpo", "--policy", str(tiny), "--rollouts", str(tmp_path / "r.jsonl"),
                  "--out", str(tmp_path / f"mb{mbs}" / "policy"), "--micro-batch-size", str(mbs), "--lr", "1e-3",
                  "--ppo-epochs", "1", "--minibatches", "1"])
        params[mbs] = torch.cat([p.flatten() for p in load(tmp_path / f"mb{mbs}" / "policy").parameters()])
    init = torch.cat([p.flatten() for p in load(tiny).parameters()])
    assert (params[1] - init).abs().max() > 1e-4  # the update did something
    assert (params[1] - params[64]).abs().max() < 1e-5
    # gradient level, and the well-known bug (each micro-batch divides by its own token count) differs
    model = load(tiny)
    seqs = prepare(model, T05.build_sequences(as_episodes(recs)), T05.grpo_advantages(
        [r["reward"] for r in recs], [r["group_id"] for r in recs])[0])
    g = {}
    for mbs in (1, 3, 64):
        model.zero_grad()
        T05.accumulate(T05.Context(args_for("--micro-batch-size", str(mbs)), model, None, 0, "cpu", False), seqs)
        g[mbs] = grads(model)
    torch.testing.assert_close(g[1], g[64], atol=1e-7, rtol=1e-5)
    torch.testing.assert_close(g[3], g[64], atol=1e-7, rtol=1e-5)
    model.zero_grad()
    for s in seqs:  # per-micro-batch normalisation, micro-batch size 1, averaged over micro-batches
        T05.accumulate(T05.Context(args_for(), model, None, 0, "cpu", False), [s])
    assert (grads(model) / len(seqs) - g[64]).abs().max() > 10 * (g[1] - g[64]).abs().max() + 1e-6


def test_merged_and_unmerged_turns_give_the_same_loss(tiny):
    model = load(tiny)
    recs = random_episodes(model.config.vocab_size, n=5, turns=3, seed=7, full_history=True)
    eps = as_episodes(recs)
    merged, single = T05.build_sequences(eps, merge=True), T05.build_sequences(eps, merge=False)
    assert len(merged) == 5 and len(single) == 15
    assert sum(s.n for s in merged) == sum(s.n for s in single)
    adv = [1.0, -0.5, 0.3, -2.0, 0.7]
    prepare(model, merged, adv)
    prepare(model, single, adv)
    with torch.no_grad():  # move away from the rollout weights so that ratios differ from 1
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    args = args_for("--micro-batch-size", "4", "--clip-eps", "0.1")
    out = {}
    for name, seqs in (("merged", merged), ("single", single)):
        model.zero_grad()
        out[name] = (T05.accumulate(T05.Context(args, model, None, 0, "cpu", False), seqs), grads(model))
    assert out["merged"][0]["clip_frac"] > 0  # the clip is active somewhere
    assert out["merged"][0]["loss"] == pytest.approx(out["single"][0]["loss"], abs=1e-6)
    torch.testing.assert_close(out["merged"][1], out["single"][1], atol=1e-6, rtol=1e-4)


def test_ppo_first_step_losses_by_hand(tiny, tmp_path, monkeypatch):
    """Fresh (zero) value head, gamma = 1: V = 0, so A_t = lambda^(T-1-t) R over the episode's tokens
    counted across turns, returns = A; the first-step losses follow by hand."""
    recs = random_episodes(AutoTokenizer.from_pretrained(tiny).vocab_size, n=4, turns=2, seed=9)
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    monkeypatch.setattr(T05, "ppo_advantages", functools.partial(T05.ppo_advantages, whiten=False))  # raw A
    T05.main(["--algo", "ppo", "--policy", str(tiny), "--rollouts", str(tmp_path / "r.jsonl"), "--lam", "0.9",
              "--out", str(tmp_path / "it" / "policy"), "--ppo-epochs", "1", "--minibatches", "1"])
    n_b = sum(len(t["completion_ids"]) for r in recs for t in r["model_turns"])
    advs = [r["reward"] * 0.9 ** k for r in recs
            for k in range(sum(len(t["completion_ids"]) for t in r["model_turns"]))]
    row = json.loads((tmp_path / "it" / "train_log.jsonl").read_text().splitlines()[0])
    assert row["pg_loss"] == pytest.approx(-sum(advs) / n_b, abs=1e-5)
    assert row["value_loss"] == pytest.approx(0.5 * sum(a * a for a in advs) / n_b, abs=1e-5)
    head = torch.load(tmp_path / "it" / "policy" / "value_head.pt")
    assert head["weight"].abs().sum() > 0  # trained, saved beside the plain causal LM


def test_kl_to_the_reference_is_k3_by_hand(tiny, tmp_path):
    """First step, reference = a perturbed copy: logged kl = mean over generated tokens of
    exp(d) - d - 1, d = log pi_ref - log pi_theta (at the episode's temperature), from full logits."""
    ref = load(tiny)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.1 * torch.randn_like(p))
    ref.save_pretrained(tmp_path / "ref")
    recs = random_episodes(ref.config.vocab_size, n=4, turns=2, seed=13)
    for r in recs:
        r["temperature"] = 0.7
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    T05.main(["--algo", "grpo", "--policy", str(tiny), "--rollouts", str(tmp_path / "r.jsonl"), "--kl-coef", "0.5",
              "--ref-policy", str(tmp_path / "ref"), "--out", str(tmp_path / "it" / "policy"),
              "--ppo-epochs", "1", "--minibatches", "1"])
    row = json.loads((tmp_path / "it" / "train_log.jsonl").read_text().splitlines()[0])
    pol, ks = load(tiny), []
    with torch.no_grad():
        for r in recs:
            for t in r["model_turns"]:
                ids = torch.tensor([t["prompt_ids"] + t["completion_ids"]])
                lp = [torch.log_softmax(m(ids).logits[0] / 0.7, -1) for m in (pol, ref)]
                for k, y in enumerate(t["completion_ids"]):
                    d = (lp[1][len(t["prompt_ids"]) - 1 + k, y] - lp[0][len(t["prompt_ids"]) - 1 + k, y]).item()
                    ks.append(np.exp(d) - d - 1)
    assert row["kl"] == pytest.approx(np.mean(ks), rel=1e-4) and row["kl"] > 1e-3
    assert row["loss"] == pytest.approx(row["pg_loss"] + 0.5 * row["kl"], abs=1e-6)


# ----------------------------------------------------------------------------------------------- CLI
def test_epochs_drive_every_algorithm_and_the_old_flag_name_still_works(tiny, tmp_path):
    """--epochs: passes over the batch for GRPO/PPO as for SFT (defaults 2 and 1); --ppo-epochs is its old name."""
    assert [T05.parse_args(["--algo", a]).epochs for a in ("grpo", "ppo", "sft")] == [2, 2, 1]
    assert T05.parse_args(["--ppo-epochs", "3"]).epochs == T05.parse_args(["--epochs", "3"]).epochs == 3
    roll = tmp_path / "r.jsonl"
    roll.write_text("".join(json.dumps(r) + "\n" for r in random_episodes(
        AutoTokenizer.from_pretrained(tiny).vocab_size, n=4, seed=5)))
    for flag, n in (("--epochs", 3), ("--ppo-epochs", 1)):
        out = tmp_path / flag.strip("-") / "policy"
        T05.main(["--algo", "grpo", "--policy", str(tiny), "--rollouts", str(roll), "--out", str(out), flag, str(n),
                  "--minibatches", "1", "--lr", "1e-3"])
        rows = [json.loads(x) for x in (out.parent / "train_log.jsonl").read_text().splitlines()]
        assert [r["epoch"] for r in rows] == list(range(n))


def test_at_most_25_flags_and_the_lm_head_chunk_is_a_constant(capsys):
    """05's --help lists at most 25 flags (issue 29). The LM-head chunk changes no result (test_05_cost), so it is
    LOGIT_CHUNK, a constant a test sets through Context.chunk, not a flag."""
    import re
    with pytest.raises(SystemExit):
        T05.parse_args(["--help"])
    flags = re.findall(r"^  (--[a-z-]+)", capsys.readouterr().out, re.M)  # first name of each option
    assert "--algo" in flags and "--fsdp" in flags and len(flags) - 1 <= 25  # - 1: --help
    with pytest.raises(SystemExit):
        T05.parse_args(["--logit-chunk", "4"])
    assert T05.Context(T05.parse_args([]), None, None, 0, "cpu", False).chunk == T05.LOGIT_CHUNK == 1024


def write_run(tmp_path, tiny, recs):
    import shutil
    run = tmp_path / "run"
    shutil.copytree(tiny, run / "init_policy")
    (run / "iter_000").mkdir()
    (run / "iter_000" / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return run


def test_cli_one_grpo_iteration_from_a_run_folder(tiny, tmp_path):
    recs = random_episodes(AutoTokenizer.from_pretrained(tiny).vocab_size, n=6, turns=2, seed=11)
    recs[0]["model_turns"][0]["logprobs"] = [-1.0] * len(recs[0]["model_turns"][0]["completion_ids"])
    run = write_run(tmp_path, tiny, recs)
    proc = run_stage("05_train.py", "--run", run, "--iteration", 0, "--algo", "grpo", "--lr", "1e-3")
    assert "[05] grpo" in proc.stdout
    it = run / "iter_000"
    AutoModelForCausalLM.from_pretrained(it / "policy")
    AutoTokenizer.from_pretrained(it / "policy")
    rows = [json.loads(x) for x in (it / "train_log.jsonl").read_text().splitlines()]
    assert len(rows) == 4  # 2 epochs x 2 minibatches
    for k in ("loss", "pg_loss", "kl", "clip_frac", "approx_kl", "entropy", "grad_norm", "reward_mean",
              "tokens", "tokens_per_s", "zero_var_group_share", "logprob_mismatch"):
        assert k in rows[0], k
    assert rows[0]["logprob_mismatch"] > 0
    assert rows[0]["reward_mean"] == pytest.approx(np.mean([r["reward"] for r in recs]))
    cfg = json.loads((it / "05_train_config.json").read_text())
    assert cfg["seed"] == 0 and cfg["policy"].endswith("init_policy")
    assert sorted(p.name for p in it.iterdir()) == ["05_train_config.json", "policy", "rollouts.jsonl", "train_log.jsonl"]


@pytest.mark.parametrize("case", ["empty", "vocab", "no_policy", "malformed"])
def test_cli_bad_input_one_error_nothing_written(tiny, tmp_path, case):
    recs = random_episodes(AutoTokenizer.from_pretrained(tiny).vocab_size, n=3, seed=1)
    run = write_run(tmp_path, tiny, recs)
    roll = run / "iter_000" / "rollouts.jsonl"
    lines = roll.read_text().splitlines()
    if case == "empty":
        roll.write_text("")
        expect = "empty rollout file"
    elif case == "vocab":
        recs[1]["model_turns"][1]["completion_ids"][0] = 10 ** 6
        lines[1] = json.dumps(recs[1])
        roll.write_text("\n".join(lines) + "\n")
        expect = ":2: model_turns[1].completion_ids has token id 1000000 outside the policy's vocabulary"
    elif case == "no_policy":
        import shutil
        shutil.rmtree(run / "init_policy")
        expect = "policy folder"
    else:
        lines[2] = lines[2][:40]
        roll.write_text("\n".join(lines) + "\n")
        expect = ":3: malformed JSON"
    proc = run_stage("05_train.py", "--run", run, "--iteration", 0, check=False)
    assert proc.returncode == 2, proc.stderr
    err = proc.stderr.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and expect in err[0], proc.stderr
    if case != "no_policy":
        assert str(roll) in err[0]
    assert sorted(p.name for p in (run / "iter_000").iterdir()) == ["rollouts.jsonl"]


# ------------------------------------------------------------------ issue 10: correctness of the update
def write_recs(path, recs):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def row0(out):
    return json.loads((out.parent / "train_log.jsonl").read_text().splitlines()[0])


def flat(path):
    return torch.cat([p.detach().flatten() for p in load(path).parameters()])


def grpo_adv_numpy(recs):
    r, g = np.array([x["reward"] for x in recs]), [x["group_id"] for x in recs]
    out = np.zeros_like(r)
    for k in set(g):
        idx = [i for i, x in enumerate(g) if x == k]
        out[idx] = (r[idx] - r[idx].mean()) / (r[idx].std() + 1e-6)
    return out


def surrogate_by_hand(model, recs, adv, weights=None, temp=1.0):
    """-sum_t A_t log pi(y_t) / N_B from full logits (ratio = 1 at the first step), optionally times w_t."""
    n_b = sum(len(t["completion_ids"]) for r in recs for t in r["model_turns"])
    total, k = 0, 0
    for r, a in zip(recs, adv):
        for t in r["model_turns"]:
            logp = torch.log_softmax(model(torch.tensor([t["prompt_ids"] + t["completion_ids"]])).logits[0] / temp, -1)
            for j, y in enumerate(t["completion_ids"]):
                w = 1.0 if weights is None else weights[k]
                total = total - w * a * logp[len(t["prompt_ids"]) - 1 + j, y]
                k += 1
    return total / n_b


def test_adam_state_is_carried_across_iterations(tiny, tmp_path):
    """Two 1-step iterations through main() = two steps of one Adam (hand-written here) on the
    first-step GRPO gradients; a fresh optimizer for the second iteration gives another result."""
    recs = random_episodes(AutoTokenizer.from_pretrained(tiny).vocab_size, n=6, turns=2, seed=21)
    roll = write_recs(tmp_path / "r.jsonl", recs)
    common = ["--algo", "grpo", "--rollouts", str(roll), "--lr", "1e-3", "--ppo-epochs", "1", "--minibatches", "1",
              "--max-grad-norm", "1e9"]
    T05.main(common + ["--policy", str(tiny), "--out", str(tmp_path / "a" / "policy")])
    assert (tmp_path / "a" / "policy" / "optimizer.pt").is_file()
    T05.main(common + ["--policy", str(tmp_path / "a" / "policy"), "--out", str(tmp_path / "b" / "policy")])
    assert "loaded" in json.loads((tmp_path / "b" / "05_train_config.json").read_text())["optimizer_state"]
    T05.main(common + ["--policy", str(tmp_path / "a" / "policy"), "--out", str(tmp_path / "c" / "policy"),
                       "--no-optimizer-state"])
    assert not (tmp_path / "c" / "policy" / "optimizer.pt").exists()
    model, adv = load(tiny), grpo_adv_numpy(recs)
    params = list(model.parameters())
    m1, m2 = [torch.zeros_like(p) for p in params], [torch.zeros_like(p) for p in params]
    after = {}
    for t in (1, 2):  # Adam (weight decay 0): m, v moments with bias correction, eps outside the sqrt
        model.zero_grad()
        surrogate_by_hand(model, recs, adv).backward()
        with torch.no_grad():
            for p, m, v in zip(params, m1, m2):
                m.mul_(0.9).add_(0.1 * p.grad)
                v.mul_(0.999).add_(0.001 * p.grad ** 2)
                p -= 1e-3 * (m / (1 - 0.9 ** t)) / ((v / (1 - 0.999 ** t)).sqrt() + 1e-8)
        after[t] = torch.cat([p.detach().flatten() for p in params])
    init = flat(tiny)
    rel = lambda x, t: float((x - after[t]).norm() / (after[t] - init).norm())  # error relative to the update
    carried, fresh = flat(tmp_path / "b" / "policy"), flat(tmp_path / "c" / "policy")
    assert rel(flat(tmp_path / "a" / "policy"), 1) < 1e-4 and rel(carried, 2) < 1e-4
    assert (carried - after[2]).abs().max() < 1e-5  # each parameter moves ~1e-3 a step
    assert rel(fresh, 2) > 0.05  # a fresh AdamW's first step is ~lr * sign(g): measured 0.16


def test_optimizer_state_is_not_loaded_across_algorithms(tiny, tmp_path, capsys):
    """SFT -> GRPO (another algorithm) and GRPO -> PPO (a value-head group more) start fresh, with a note."""
    tok = AutoTokenizer.from_pretrained(tiny)
    recs = random_episodes(tok.vocab_size, n=4, turns=1, seed=4)
    roll = write_recs(tmp_path / "r.jsonl", recs)
    T05.main(["--algo", "sft", "--policy", str(tiny), "--rollouts", str(roll), "--out", str(tmp_path / "s" / "p")])
    capsys.readouterr()
    T05.main(["--algo", "grpo", "--policy", str(tmp_path / "s" / "p"), "--rollouts", str(roll),
              "--out", str(tmp_path / "g" / "p"), "--ppo-epochs", "1"])
    assert "optimizer: fresh AdamW state" in capsys.readouterr().out
    T05.main(["--algo", "ppo", "--policy", str(tmp_path / "g" / "p"), "--rollouts", str(roll),
              "--out", str(tmp_path / "p" / "p"), "--ppo-epochs", "1", "--lr", "2e-4"])
    assert "saved by --algo grpo" in capsys.readouterr().out
    groups = torch.load(tmp_path / "p" / "p" / "optimizer.pt")["state"]["param_groups"]
    assert [g["lr"] for g in groups] == pytest.approx([2e-4, 2e-3])  # the value head's group: 10 x --lr


def test_ppo_defaults_give_early_tokens_of_a_success_credit():
    """64 episodes of 300-700 tokens in 3 turns, every other one a success. A fresh (zero) value head:
    with the defaults (gamma = lambda = 1) every token of a success gets A = R = 1; with the old
    lambda 0.95 about 3/4 of them got < 1e-3. Then values in [0, 0.5]: raw and whitened advantages
    against an independent GAE in matrix form, A = U delta with U[t, k] = (gamma lambda)^(k - t), k >= t."""
    args = args_for("--algo", "ppo")
    assert (T05.GAMMA, args.lam, T05.VF_CLIP, T05.VF_LR_FACTOR) == (1.0, 1.0, 0.5, 10)
    rng = np.random.default_rng(0)
    lengths, rewards = [int(n) for n in rng.integers(300, 701, 64)], [float(e % 2) for e in range(64)]

    def episodes(values):
        return [T05.Sequence(ids=[], mask=[], ep=e, temp=1.0, n=len(part),
                             old_v=torch.tensor(values[e][part], dtype=torch.float64))
                for e, n in enumerate(lengths) for part in np.array_split(np.arange(n), 3)]

    def per_episode(seqs):
        return [torch.cat([s.adv for s in seqs if s.ep == e]).numpy() for e in range(64)]

    zero = episodes([np.zeros(n) for n in lengths])
    low = {}
    for lam in (args.lam, 0.95):
        T05.ppo_advantages(zero, rewards, T05.GAMMA, lam, whiten=False)
        low[lam] = np.mean(np.concatenate([np.abs(a) < 1e-3 for a, r in zip(per_episode(zero), rewards) if r == 1]))
    assert low[1.0] == 0 and low[0.95] > 0.7
    T05.ppo_advantages(zero, rewards, T05.GAMMA, args.lam)  # whitened: every token of a success ~ +1
    assert min(a[0] for a, r in zip(per_episode(zero), rewards) if r == 1) > 0.9

    values = [rng.uniform(0, 0.5, n) for n in lengths]
    seqs = episodes(values)
    for gamma, lam in ((1.0, 1.0), (0.99, 0.95)):
        raw = []
        for r, v in zip(rewards, values):
            delta = gamma * np.append(v[1:], 0.0) - v
            delta[-1] += r
            k = np.arange(len(v))
            raw.append(np.triu((gamma * lam) ** (k[None, :] - k[:, None]).clip(0)) @ delta)
        T05.ppo_advantages(seqs, rewards, gamma, lam, whiten=False)
        for got, x in zip(per_episode(seqs), raw):
            np.testing.assert_allclose(got, x, atol=1e-9)
        T05.ppo_advantages(seqs, rewards, gamma, lam, whiten=True)
        flat_raw = np.concatenate(raw)
        np.testing.assert_allclose(np.concatenate(per_episode(seqs)),
                                   (flat_raw - flat_raw.mean()) / (flat_raw.std(ddof=1) + 1e-8), atol=1e-9)


def test_ppo_gradient_norms_logged_per_group(tiny, tmp_path):
    """First PPO step, zero value head: V = 0 so returns = R; the value head's gradient is
    -vf_coef * sum_t R h_t / N_B (bias: -vf_coef * sum_t R / N_B), the policy's that of
    -sum_t A_t log pi / N_B with A the whitened R. Both norms against full-forward computations."""
    recs = random_episodes(AutoTokenizer.from_pretrained(tiny).vocab_size, n=4, turns=2, seed=17)
    roll = write_recs(tmp_path / "r.jsonl", recs)
    out = tmp_path / "it" / "policy"
    T05.main(["--algo", "ppo", "--policy", str(tiny), "--rollouts", str(roll), "--out", str(out),
              "--ppo-epochs", "1", "--minibatches", "1"])
    row = row0(out)
    model = load(tiny)
    R = torch.tensor([r["reward"] for r in recs for t in r["model_turns"] for _ in t["completion_ids"]])
    n_b = len(R)
    gw, gb, k = torch.zeros(model.config.hidden_size), -0.5 * R.sum() / n_b, 0
    with torch.no_grad():
        for r in recs:
            for t in r["model_turns"]:
                h = model.model(torch.tensor([t["prompt_ids"] + t["completion_ids"]])).last_hidden_state[0]
                for j in range(len(t["completion_ids"])):
                    gw -= 0.5 * R[k] * h[len(t["prompt_ids"]) - 1 + j] / n_b
                    k += 1
    assert row["vf_grad_norm"] == pytest.approx(float(torch.sqrt(gw.square().sum() + gb ** 2)), rel=1e-4)
    a = ((R - R.mean()) / (R.std() + 1e-8)).tolist()  # whitened per-token advantages, as token weights
    model.zero_grad()
    surrogate_by_hand(model, recs, [1.0] * len(recs), weights=a).backward()
    assert row["pg_grad_norm"] == pytest.approx(float(grads(model).norm()), rel=1e-4)
    assert row["grad_norm"] == pytest.approx(np.hypot(row["pg_grad_norm"], row["vf_grad_norm"]), rel=1e-6)


def test_sft_ignores_record_temperature_and_min_reward_filters(tiny, tmp_path):
    """Demonstrations recorded at T = 0.5: SFT's first loss is the NLL at T = 1 (full logits, by hand)
    of the demonstrations with reward >= --min-reward only."""
    recs = random_episodes(AutoTokenizer.from_pretrained(tiny).vocab_size, n=6, turns=2, seed=23)
    for i, r in enumerate(recs):
        r.update(temperature=0.5, reward=[1.0, 0.0, 1.0, 0.5, 1.0, 0.0][i], policy="oracle")
    roll = write_recs(tmp_path / "d.jsonl", recs)
    out = tmp_path / "sft" / "policy"
    s = T05.main(["--algo", "sft", "--policy", str(tiny), "--rollouts", str(roll), "--out", str(out),
                  "--min-reward", "1", "--epochs", "1", "--minibatch-size", "64"])
    kept = [r for r in recs if r["reward"] >= 1]
    assert s["episodes"] == 3 and row0(out)["tokens"] == sum(len(t["completion_ids"]) for r in kept
                                                              for t in r["model_turns"])
    model = load(tiny)
    with torch.no_grad():
        nll1, nll05 = (surrogate_by_hand(model, kept, [1.0] * 3, temp=T).item() for T in (1.0, 0.5))
    assert row0(out)["loss"] == pytest.approx(nll1, abs=1e-5) and abs(nll1 - nll05) > 0.01


@pytest.mark.parametrize("case", ["none_left", "rl"])
def test_cli_min_reward_errors(tiny, tmp_path, case):
    recs = random_episodes(AutoTokenizer.from_pretrained(tiny).vocab_size, n=3, seed=2)
    roll = write_recs(tmp_path / "d.jsonl", [dict(r, reward=0.0) for r in recs])
    algo, expect = ("sft", "no episode has reward >= 1.0") if case == "none_left" else ("grpo", "--min-reward is for")
    proc = run_stage("05_train.py", "--algo", algo, "--policy", tiny, "--rollouts", roll, "--out",
                     tmp_path / "o" / "policy", "--min-reward", "1", check=False)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and expect in err[0], proc.stderr
    assert not (tmp_path / "o").exists()


def test_off_policy_warnings_and_kl_reference_printed(tiny, tmp_path, capsys):
    vocab = AutoTokenizer.from_pretrained(tiny).vocab_size
    recs = random_episodes(vocab, n=4, turns=1, seed=31)
    common = ["--algo", "grpo", "--policy", str(tiny), "--ppo-epochs", "1", "--kl-coef", "0.1"]
    T05.main(common + ["--rollouts", str(write_recs(tmp_path / "a.jsonl", [dict(r, policy=str(tiny)) for r in recs])),
                       "--out", str(tmp_path / "a" / "p")])
    cap = capsys.readouterr()
    assert "warning" not in cap.err and f"KL reference policy: {tiny} (the loaded policy itself" in cap.out
    bad = [dict(r, policy="runs/x/iter_003/policy") for r in recs]
    for r in bad:
        r["model_turns"][0]["logprobs"] = [-0.2] * len(r["model_turns"][0]["completion_ids"])
    s = T05.main(common + ["--rollouts", str(write_recs(tmp_path / "b.jsonl", bad)),
                           "--out", str(tmp_path / "b" / "p")])
    err = capsys.readouterr().err
    assert "4 of 4 episodes" in err and "not by the loaded policy" in err
    assert "logprob_mismatch" in err and s["logprob_mismatch"] > T05.off_policy.MISMATCH_WARN and len(s["warnings"]) == 2


def test_truncated_importance_sampling_by_hand_and_off_by_default(tiny, tmp_path):
    """Rollout log-probs = trainer log-probs - offset: w = min(exp(offset), C), 1 where missing; first-step
    pg_loss = -sum_t w_t A_t / N_B. Without --tis-cap the rollout log-probs change nothing."""
    model = load(tiny)
    recs = random_episodes(model.config.vocab_size, n=6, turns=2, seed=29)
    offsets, weights = [0.3, -0.5, 2.0, 0.0], []
    with torch.no_grad():
        for i, r in enumerate(recs):
            for j, t in enumerate(r["model_turns"]):
                if (i + j) % 3 == 2:  # no rollout log-probs on this turn: weight 1
                    weights += [1.0] * len(t["completion_ids"])
                    continue
                logp = torch.log_softmax(model(torch.tensor([t["prompt_ids"] + t["completion_ids"]])).logits[0], -1)
                t["logprobs"] = []
                for k, y in enumerate(t["completion_ids"]):
                    off = offsets[(i + k) % 4]
                    t["logprobs"].append(logp[len(t["prompt_ids"]) - 1 + k, y].item() - off)
                    weights.append(min(np.exp(off), 1.5))
    assert min(weights) < 0.7 and max(weights) == 1.5  # both sides of 1 and the cap are exercised
    common = ["--algo", "grpo", "--policy", str(tiny), "--ppo-epochs", "2", "--minibatches", "1", "--lr", "1e-3"]
    roll = write_recs(tmp_path / "r.jsonl", recs)
    T05.main(common + ["--rollouts", str(roll), "--out", str(tmp_path / "tis" / "p"), "--tis-cap", "1.5"])
    row = row0(tmp_path / "tis" / "p")
    adv = grpo_adv_numpy(recs)
    adv_tok = [a for r, a in zip(recs, adv) for t in r["model_turns"] for _ in t["completion_ids"]]
    expect = -sum(w * a for w, a in zip(weights, adv_tok)) / len(weights)  # ratio = 1: -sum w A / N_B
    assert row["pg_loss"] == pytest.approx(expect, abs=1e-5)
    assert row["tis_weight"] == pytest.approx(np.mean(weights), abs=1e-5)
    # off (the default): same run with and without rollout log-probs is bit-identical, pg_loss unweighted
    T05.main(common + ["--rollouts", str(roll), "--out", str(tmp_path / "off" / "p")])
    plain = [dict(r, model_turns=[dict(t, logprobs=None) for t in r["model_turns"]]) for r in recs]
    T05.main(common + ["--rollouts", str(write_recs(tmp_path / "plain.jsonl", plain)),
                       "--out", str(tmp_path / "plain" / "p")])
    rows = {k: [json.loads(x) for x in (tmp_path / k / "train_log.jsonl").read_text().splitlines()]
            for k in ("off", "plain")}
    assert "tis_weight" not in rows["off"][0]
    assert [r["loss"] for r in rows["off"]] == [r["loss"] for r in rows["plain"]]
    assert torch.equal(flat(tmp_path / "off" / "p"), flat(tmp_path / "plain" / "p"))
    assert rows["off"][0]["pg_loss"] == pytest.approx(-sum(adv_tok) / len(adv_tok), abs=1e-5)
    assert abs(expect - rows["off"][0]["pg_loss"]) > 1e-2


@pytest.mark.parametrize("all_equal", [False, True])
def test_skipping_zero_advantage_sequences_changes_nothing(tiny, tmp_path, all_equal, monkeypatch):
    """GRPO: equal-reward groups have A = 0, so 05 skips their sequences (old log-probs and forward/backward)
    while N_B still counts them. The update must equal the one that runs them all; a minibatch
    with no signal makes no optimizer step in either (all_equal: the weights stay bit-identical)."""
    recs = random_episodes(load(tiny).config.vocab_size, n=9, seed=41)
    for r in recs:  # groups g0, g1: equal rewards (A = 0); g2: different rewards (all_equal: every group equal)
        r["reward"] = 1.0 if r["group_id"] in ("g0",) or all_equal else (0.0 if r["group_id"] == "g1" else
                                                                          float(r["episode_id"] in ("e2", "e5")))
    roll = write_recs(tmp_path / "r.jsonl", recs)
    common = ["--algo", "grpo", "--policy", str(tiny), "--rollouts", str(roll), "--ppo-epochs", "2",
              "--minibatches", "3", "--lr", "1e-3", "--weight-decay", "0.1", "--micro-batch-size", "2"]
    T05.main(common + ["--out", str(tmp_path / "skip" / "p")])
    with monkeypatch.context() as m:
        m.setattr(T05, "trains", lambda u, s: True)  # every sequence runs (tests/variants05.py no-skip-zero-adv)
        T05.main(common + ["--out", str(tmp_path / "all" / "p")])
    cfg = {k: json.loads((tmp_path / k / "05_train_config.json").read_text()) for k in ("skip", "all")}
    assert cfg["all"]["trained_sequences"] == cfg["all"]["sequences"]
    assert cfg["skip"]["trained_sequences"] == (0 if all_equal else 6)  # e2, e5, e8 (group g2) x 2 turns
    logs = {k: [json.loads(x) for x in (tmp_path / k / "train_log.jsonl").read_text().splitlines()] for k in cfg}
    assert [r["loss"] for r in logs["skip"]] == pytest.approx([r["loss"] for r in logs["all"]], abs=1e-7)
    a, b = flat(tmp_path / "skip" / "p"), flat(tmp_path / "all" / "p")
    # other micro-batches sum the same terms in another order; Adam's g / sqrt(v) turns that 1e-7 rounding into
    # up to ~2e-6 on near-zero gradients (the update itself is up to ~6e-3)
    assert torch.allclose(a, b, atol=1e-5)
    if all_equal:
        assert torch.equal(a, flat(tiny)) and torch.equal(b, flat(tiny))
        assert not any(r["optimizer_step"] for k in logs for r in logs[k])
    else:
        assert (a - flat(tiny)).abs().max() > 1e-3


def test_no_signal_no_step_through_the_cli(tiny, tmp_path):
    """A policy folder carrying AdamW moments (one update with signal) then an update whose every GRPO group is
    reward-equal: no optimizer step, the weights written are bit-identical and optimizer.pt is untouched. (The old
    zero-gradient step moved every weight by ~lr through the momentum, and weight decay on top.)"""
    from safetensors.torch import load_file
    recs = random_episodes(load(tiny).config.vocab_size, n=6, turns=2, seed=5)
    common = ["--algo", "grpo", "--ppo-epochs", "2", "--minibatches", "2", "--lr", "1e-3", "--weight-decay", "0.1"]
    run_stage("05_train.py", *common, "--policy", tiny, "--rollouts", write_recs(tmp_path / "r1.jsonl", recs),
              "--out", tmp_path / "a" / "policy")
    flat_recs = [dict(r, reward=1.0) for r in recs]  # every group reward-equal: A = 0 everywhere
    proc = run_stage("05_train.py", *common, "--policy", tmp_path / "a" / "policy",
                     "--rollouts", write_recs(tmp_path / "r2.jsonl", flat_recs), "--out", tmp_path / "b" / "policy")
    assert "no optimizer step" in proc.stdout and "AdamW state loaded" in proc.stdout
    a, b = (load_file(tmp_path / k / "policy" / "model.safetensors") for k in "ab")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    oa, ob = (torch.load(tmp_path / k / "policy" / "optimizer.pt")["state"]["state"] for k in "ab")
    assert oa.keys() == ob.keys() and all(torch.equal(oa[i][f], ob[i][f]) for i in oa for f in oa[i])
    rows = [json.loads(x) for x in (tmp_path / "b" / "train_log.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and not any(r["optimizer_step"] for r in rows)
    cfg = json.loads((tmp_path / "b" / "05_train_config.json").read_text())
    assert cfg["optimizer_steps"] == 0 and cfg["trained_sequences"] == 0
    # a fresh AdamW that made no step saves an empty state; the next update loads it (0 steps so far)
    run_stage("05_train.py", *common, "--policy", tiny, "--rollouts", tmp_path / "r2.jsonl", "--out", tmp_path / "c" / "p")
    proc = run_stage("05_train.py", *common, "--policy", tmp_path / "c" / "p", "--rollouts", tmp_path / "r1.jsonl",
                     "--out", tmp_path / "d" / "p")
    assert "(0 steps so far)" in proc.stdout


def test_truncated_is_on_by_default_where_another_engine_sampled(tiny, tmp_path, capsys):
    """04 stores the sampler in each record: vLLM (or any dtype but fp32) -> TIS with C = 2 by default, printed and
    logged; hf in float32 (05's own forward) -> off; --tis-cap 0 turns it off. The weights are min(exp(offset), 2)."""
    model = load(tiny)
    recs = random_episodes(model.config.vocab_size, n=4, turns=1, seed=31)
    with torch.no_grad():
        for i, r in enumerate(recs):
            t = r["model_turns"][0]
            logp = torch.log_softmax(model(torch.tensor([t["prompt_ids"] + t["completion_ids"]])).logits[0], -1)
            t["logprobs"] = [logp[len(t["prompt_ids"]) - 1 + k, y].item() - (1.0 if i % 2 else -0.2)
                             for k, y in enumerate(t["completion_ids"])]
    weights = [min(np.exp(1.0 if i % 2 else -0.2), 2.0) for i, r in enumerate(recs)
               for _ in r["model_turns"][0]["completion_ids"]]
    common = ["--algo", "grpo", "--policy", str(tiny), "--ppo-epochs", "1", "--minibatches", "1"]
    cases = {"vllm": ({"backend": "vllm", "dtype": "bfloat16"}, []), "hf32": ({"backend": "hf", "dtype": "float32"}, []),
             "hf16": ({"backend": "hf", "dtype": "bfloat16"}, []),
             "off": ({"backend": "vllm", "dtype": "bfloat16"}, ["--tis-cap", "0"])}
    got = {}
    for name, (sampler, extra) in cases.items():
        roll = write_recs(tmp_path / f"{name}.jsonl", [dict(r, sampler=sampler, group_id="g") for r in recs])
        T05.main(common + ["--rollouts", str(roll), "--out", str(tmp_path / name / "p"), *extra])
        got[name] = (json.loads((tmp_path / name / "05_train_config.json").read_text())["tis_cap"],
                     row0(tmp_path / name / "p").get("tis_weight"), capsys.readouterr().out)
    assert got["vllm"][0] == 2.0 and got["hf16"][0] == 2.0 and got["hf32"][0] is None and got["off"][0] is None
    assert got["vllm"][1] == pytest.approx(np.mean(weights), abs=1e-5) and max(weights) == 2.0
    assert "truncated IS on" in got["vllm"][2] and "vllm/bfloat16" in got["vllm"][2]
    assert got["hf32"][1] is None and "truncated IS" not in got["hf32"][2] and got["off"][1] is None
