"""What 05's default truncated IS (C = 2, on for vLLM rollouts) does, on a real rollouts file.

    python pipeline.py --preset small --run runs/small-tis --iterations 1 --stop-after 04-it0   # vLLM rollouts
    python experiments/bench/tis_effect.py --run runs/small-tis --out results/tis_effect.md

1. The token weights: 05's fp32 log-probs of the sampled tokens (pi_old) against vLLM's (pi_rollout), over the
   tokens 05 trains (the sequences of groups with different rewards): |d log p|, w = min(pi_old / pi_rollout, C),
   the share of tokens capped, and how far w moves the tokens with the largest mismatch.
2. The update: one GRPO update (the small preset's flags) from the same policy with and without --tis-cap 0 (off);
   ||theta_tis - theta_off|| against ||theta_off - theta_0||.
"""
import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(HERE), str(HERE / "tests")]  # the repository root (05 imports common/plumbing.py) and conftest
from conftest import load_stage  # noqa: E402

T05 = load_stage("05_train.py")
OP = load_stage("common/off_policy.py")  # 05's truncated IS


def flat(path):
    from safetensors.torch import load_file
    sd = load_file(Path(path) / "model.safetensors")
    return torch.cat([sd[k].flatten().float() for k in sorted(sd)])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", required=True)
    ap.add_argument("--iteration", type=int, default=0)
    ap.add_argument("--lr", default="1e-5")
    ap.add_argument("--out", help="markdown file for the figures")
    args = ap.parse_args()
    run, t0 = Path(args.run), time.time()
    policy = run / "init_policy" if args.iteration == 0 else run / f"iter_{args.iteration - 1:03d}" / "policy"
    rollouts = run / f"iter_{args.iteration:03d}" / "rollouts.jsonl"
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32)
    episodes = T05.load_episodes(rollouts, "grpo", model.config.vocab_size)
    seqs = T05.build_sequences(episodes)
    adv, _ = T05.grpo_advantages([e["reward"] for e in episodes], [e["group"] for e in episodes])
    active = [s for s in seqs if adv[s.ep] != 0]
    ctx = T05.Context(T05.parse_args(["--micro-batch-size", "4"]), model, None, 0, "cpu", False)
    for s, lp in zip(active, T05.sequence_logprobs(ctx, active, desc="pi_old")[0]):
        s.old_logp = lp
    old = torch.cat([s.old_logp for s in active])
    stored = torch.cat([s.stored_logp for s in active])
    have = ~torch.isnan(stored)
    d = (old - stored)[have]  # log pi_old - log pi_rollout
    w = torch.exp(d).clamp(max=OP.TIS_CAP)
    top = d.abs() >= d.abs().quantile(0.99)
    lines = [f"Rollouts `{rollouts}` ({len(episodes)} episodes, {len(active)} trained sequences, {int(have.sum())} "
             f"tokens with rollout log-probs); sampler {OP.sampler_of(episodes)}; policy `{policy}`.", "",
             "| tokens | mean abs d log p | mean w | w < 0.9 | w > 1.1 | capped at C = 2 |", "| --- | --- | --- | --- | --- | --- |"]
    for name, sel in (("all trained", torch.ones_like(d, dtype=torch.bool)), ("top 1% of abs d log p", top)):
        x, y = d[sel], w[sel]
        lines.append(f"| {name} ({int(sel.sum())}) | {x.abs().mean():.4f} | {y.mean():.4f} | {(y < 0.9).float().mean():.2%} | "
                     f"{(y > 1.1).float().mean():.2%} | {(torch.exp(x) > OP.TIS_CAP).float().mean():.2%} |")
    outs = {}
    for name, extra in (("tis", []), ("off", ["--tis-cap", "0"])):
        out = Path(f"/tmp/tis_effect/{name}/policy")
        cmd = [sys.executable, str(HERE / "05_train.py"), "--algo", "grpo", "--policy", str(policy), "--rollouts",
               str(rollouts), "--out", str(out), "--lr", args.lr, "--ppo-epochs", "1", "--seed", "0", *extra]
        subprocess.run(cmd, check=True, capture_output=True, text=True)
        outs[name] = out
    th0, on, off = flat(policy), flat(outs["tis"]), flat(outs["off"])
    rel = float((on - off).norm() / (off - th0).norm())
    lines += ["", f"One GRPO update (--lr {args.lr}, --ppo-epochs 1, 2 minibatches): ||theta_tis - theta_off|| / "
              f"||theta_off - theta_0|| = {rel:.4f}; ||theta_tis - theta_0|| / ||theta_off - theta_0|| = "
              f"{float((on - th0).norm() / (off - th0).norm()):.4f}."]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=HERE).stdout
    head = (f"# Truncated IS on a small-preset rollouts file\n\n"
            f"Command: `python experiments/bench/tis_effect.py --run {args.run}"
            f"{' --out ' + args.out if args.out else ''}`; commit {commit.strip()}; machine {platform.machine()}, "
            f"{os.cpu_count()} cores; wall {time.time() - t0:.0f} s.\n\n")
    text = head + "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
