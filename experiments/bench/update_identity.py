"""Does a change to 05 change an update? 05 at a git revision (before) and in this checkout (after), on the same tiny
model and rollouts, for GRPO, GRPO with a KL term, GRPO without truncated IS, PPO and SFT: the sha256 of the weights
each writes, and the largest weight difference against the step's size.

    python experiments/bench/update_identity.py --rev REV [--out results/update_identity.md]

The tiny model is data/tiny_model.py's (2 layers, d = 32, a 300-token BPE on a seeded corpus); the rollouts are 16
seeded two-turn episodes in 4 groups, with rollout log-probs from another engine (vLLM, bf16), so that truncated
IS is on by default. Each 05 runs in its own process, one after the other (a minute or two on 2 cores). Writes the
markdown report (command, commits, machine, date) and prints it.
"""
import argparse
import datetime
import hashlib
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
from pathlib import Path

from bench_eval_cost import extract  # REV's tree by git archive -> its short hash

ROOT = Path(__file__).resolve().parents[2]
WORDS = "river apple stone cloud code key read submit file path answer what is the in".split()
UPDATES = {"grpo": [], "grpo, KL 0.05": ["--kl-coef", "0.05"], "grpo, no truncated IS": ["--tis-cap", "0"],
           "ppo": [], "sft": []}


def inputs(work):
    """The tiny model and the rollouts, both seeded."""
    rng = random.Random(0)
    corpus = work / "corpus.jsonl"
    corpus.write_text("".join(json.dumps({"text": " ".join(rng.choice(WORDS) for _ in range(12))}) + "\n"
                              for _ in range(300)))
    subprocess.run([sys.executable, str(ROOT / "data" / "tiny_model.py"), "--out", str(work / "tiny"), "--corpus",
                    str(corpus), "--vocab-size", "300", "--layers", "2", "--dim", "32", "--heads", "2", "--seed", "0"],
                   check=True, capture_output=True)
    recs = []
    for i in range(16):
        prompt, turns = [rng.randrange(3, 290) for _ in range(rng.randint(4, 20))], []
        for _ in range(2):
            comp = [rng.randrange(3, 290) for _ in range(rng.randint(1, 12))]
            turns.append({"prompt_ids": prompt, "completion_ids": comp,
                          "logprobs": [-2.0 - 0.05 * j for j in range(len(comp))]})
            prompt = prompt + comp + [rng.randrange(3, 290) for _ in range(3)]  # full history: turns merge
        recs.append({"episode_id": f"e{i}", "group_id": f"g{i % 4}", "reward": float(rng.random() < 0.5),
                     "temperature": 1.0, "model_turns": turns, "sampler": {"backend": "vllm", "dtype": "bfloat16"}})
    (work / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))


def weights(policy):
    from safetensors.torch import load_file
    return load_file(policy / "model.safetensors")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rev", required=True, help="git revision of the 'before' 05")
    p.add_argument("--out", default=None, help="also write the markdown report here")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="update_identity_"))
    before_code = work / "before"
    short = extract(args.rev, before_code)
    after = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    dirty = subprocess.run(["git", "status", "--porcelain", "--", "*.py"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    inputs(work)
    rows = []
    for name, flags in UPDATES.items():
        out = {}
        # before-all-old: a 05 that took the first minibatch's pi_old from its own forward, made to score every
        # pi_old apart (its test switch); a 05 without that switch ignores the variable
        sides = [("before", before_code, {}), ("after", ROOT, {})]
        if name.startswith("grpo"):
            sides.append(("before-all-old", before_code, {"HARNESS_05_TEST_VARIANTS": "score-all-old"}))
        for side, code, env in sides:
            policy = work / side / name.replace(" ", "_").replace(",", "") / "policy"
            subprocess.run([sys.executable, str(code / "05_train.py"), "--algo", name.split(",")[0], *flags,
                            "--policy", str(work / "tiny"), "--rollouts", str(work / "rollouts.jsonl"),
                            "--out", str(policy), "--lr", "1e-3", "--seed", "1"], cwd=code, check=True,
                           capture_output=True, env={**os.environ, **env})
            out[side] = policy
        sha = {k: hashlib.sha256((v / "model.safetensors").read_bytes()).hexdigest()[:12] for k, v in out.items()}
        a, b, w0 = weights(out["before"]), weights(out["after"]), weights(work / "tiny")
        diff = max(float((a[k] - b[k]).abs().max()) for k in a)
        step = max(float((a[k] - w0[k]).abs().max()) for k in a)
        rows.append(f"| {name} | {sha['before']} | {sha.get('before-all-old', '-')} | {sha['after']} | "
                    f"{'yes' if sha['before'] == sha['after'] else 'no'} | {diff:.1e} | {step:.1e} |")
    md = "\n".join([
        "# 05 before and after: the same update?", "",
        f"Command: `python experiments/bench/update_identity.py --rev {args.rev}`. Before = 05 at {short}, "
        f"after = this checkout ({after.strip()}{', with uncommitted changes' if dirty else ''}). "
        f"Machine: {platform.processor() or platform.machine()}, "
        f"date {datetime.date.today()}. Tiny model (2 layers, d = 32), 16 two-turn episodes, lr 1e-3, seed 1, "
        "2 epochs x 2 minibatches (SFT: 1 epoch).", "",
        "| update | sha256 before | before, every pi_old scored apart | sha256 after | after = before | "
        "max abs weight difference | max abs step |",
        "| --- | --- | --- | --- | --- | --- | --- |", *rows, ""])
    print(md)
    if args.out:
        Path(args.out).write_text(md)


if __name__ == "__main__":
    main()
