"""Stage 05 learns: a few GRPO and PPO iterations (sampling with the model itself, a synthetic reward)
raise the reward on fresh samples; SFT lowers the loss on its demonstrations."""
import json
import random

import pytest
import torch
from conftest import TINY05_WORDS, load_stage
from transformers import AutoModelForCausalLM, AutoTokenizer

T05 = load_stage("05_train.py")
WORDS = TINY05_WORDS  # the words the tiny tokenizer was trained on
TEMPERATURE = 0.8  # sampling temperature; the trainer must recompute pi_old at it


@pytest.fixture
def tiny(tiny05):
    return tiny05


def prompts(tok, n=8):
    rng = random.Random(1)
    return [tok.apply_chat_template([{"role": "user", "content": " ".join(rng.sample(WORDS, 4))}],
                                    add_generation_prompt=True, tokenize=True, return_dict=False) for _ in range(n)]


@torch.no_grad()
def sample(model, prompt, n, new_tokens, gen):
    """n completions of one prompt at TEMPERATURE, with their sampling log-probs."""
    ids = torch.tensor([prompt] * n)
    logps = []
    for _ in range(new_tokens):
        logp = torch.log_softmax(model(ids).logits[:, -1].float() / TEMPERATURE, -1)  # [n, V]
        nxt = torch.multinomial(logp.exp(), 1, generator=gen)  # [n, 1]
        logps.append(logp.gather(1, nxt))
        ids = torch.cat([ids, nxt], 1)
    return ids[:, len(prompt):].tolist(), torch.cat(logps, 1).tolist()


def reward(completion):
    """1 when the first generated token is in the target set (a quarter of the vocabulary)."""
    return float(completion[0] % 4 == 0)


def success_rate(path, ps, seed):
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    rs = [reward(c) for p in ps for c in sample(model, p, 32, 1, gen)[0]]
    return sum(rs) / len(rs)


def rl_iterations(tiny, tmp_path, algo, iterations, extra):
    torch.manual_seed(0)
    ps = prompts(AutoTokenizer.from_pretrained(tiny))
    policy, mismatch = tiny, []
    for it in range(iterations):
        model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).eval()
        gen = torch.Generator().manual_seed(100 + it)
        recs = []
        for i, p in enumerate(ps):
            comps, lps = sample(model, p, 8, 3, gen)
            recs += [{"episode_id": f"{it}-{i}-{j}", "group_id": f"p{i}|it{it}", "temperature": TEMPERATURE,
                      "reward": reward(c), "policy": str(policy),
                      "model_turns": [{"prompt_ids": p, "completion_ids": c, "logprobs": lp}]}
                     for j, (c, lp) in enumerate(zip(comps, lps))]
        roll = tmp_path / f"iter_{it:03d}" / "rollouts.jsonl"
        roll.parent.mkdir(parents=True)
        roll.write_text("".join(json.dumps(r) + "\n" for r in recs))
        out = roll.parent / "policy"
        T05.main(["--algo", algo, "--policy", str(policy), "--rollouts", str(roll), "--out", str(out),
                  "--seed", str(it), *extra])
        mismatch.append(json.loads((roll.parent / "train_log.jsonl").read_text().splitlines()[0])["logprob_mismatch"])
        policy = out
    return success_rate(tiny, ps, 7), success_rate(policy, ps, 7), mismatch


def test_grpo_raises_the_reward(tiny, tmp_path):
    before, after, mismatch = rl_iterations(tiny, tmp_path, "grpo", 3, ["--lr", "2e-2", "--ppo-epochs", "4"])
    assert max(mismatch) < 1e-4  # pi_old recomputed at the sampling temperature = the sampler's
    assert after > before + 0.25, (before, after)


def test_ppo_raises_the_reward(tiny, tmp_path):
    before, after, _ = rl_iterations(tiny, tmp_path, "ppo", 3, ["--lr", "3e-2", "--ppo-epochs", "4"])
    assert after > before + 0.25, (before, after)


def test_sft_lowers_the_loss_on_its_data(tiny, tmp_path):
    tok = AutoTokenizer.from_pretrained(tiny)
    ps = prompts(tok)
    demos = [tok.encode(f"read {w} file", add_special_tokens=False) + [tok.eos_token_id] for w in WORDS[:8]]
    recs = [{"episode_id": f"d{i}", "policy": "oracle", "model_turns": [{"prompt_ids": p, "completion_ids": d}]}
            for i, (p, d) in enumerate(zip(ps, demos))]
    (tmp_path / "demos.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))

    def nll(path):  # independent: full logits, completion positions picked by hand, mean over tokens
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        total, n = 0.0, 0
        with torch.no_grad():
            for p, d in zip(ps, demos):
                logp = torch.log_softmax(model(torch.tensor([p + d])).logits[0], -1)
                total -= sum(logp[len(p) - 1 + k, tok_id].item() for k, tok_id in enumerate(d))
                n += len(d)
        return total / n

    T05.main(["--algo", "sft", "--policy", str(tiny), "--rollouts", str(tmp_path / "demos.jsonl"),
              "--out", str(tmp_path / "sft" / "policy"), "--epochs", "30", "--minibatch-size", "4", "--lr", "3e-3"])
    rows = [json.loads(x) for x in (tmp_path / "sft" / "train_log.jsonl").read_text().splitlines()]
    assert len(rows) == 60
    before, after = nll(tiny), nll(tmp_path / "sft" / "policy")
    assert rows[0]["loss"] == pytest.approx(before, rel=0.05)  # first step's loss = NLL of the init
    assert after < 0.5 * before, (before, after)
