"""Benchmark of stage 05: the trainer's update beside a bare forward + backward + step loop over the same
sequences with the same model, in one run; throughput (tokens/s) and peak memory. Not a test.

    python experiments/bench/bench_train.py                          # CPU: the toy's tiny Llama (2 layers, d=128)
    python experiments/bench/bench_train.py --layers 4 --dim 256     # a bigger tiny model
    python experiments/bench/bench_train.py --policy PATH --episodes 64 --prompt-len 1024   # a checkpoint (GPU: Qwen2.5-0.5B)

Data: synthetic multi-turn GRPO rollouts in the contract's format (full-history turns, so turn k's prompt
is turn k-1's prompt + completion + a tool output). Rows:
  bare loop        one sequence per turn, model(...).logits on every position, masked NLL, AdamW step
  trainer no-merge the same sequences through 05_train.py, 05's build_sequences with merge=False (old log-probs pass
  included) trainer          05_train.py defaults (full-history turns merged into one sequence per episode)
Both do the same optimizer steps (epochs x minibatches, micro-batches accumulated). tokens/s counts the
tokens of the per-turn sequences (the work a naive loop does), so merging shows as a speed-up.
Each phase runs in its own process (peak memory per phase), --repeats times interleaved; the best
time is kept. Target: trainer no-merge time <= 1.3 x bare loop.
"""
import argparse
import functools
import importlib.util
import json
import random
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository root, where common/plumbing.py (imported by 05) is


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--policy", help="an existing checkpoint folder (default: build the tiny model)")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--turns", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=120, help="first prompt's tokens")
    p.add_argument("--completion-len", type=int, default=24)
    p.add_argument("--tool-len", type=int, default=20, help="tokens added to the prompt between turns")
    p.add_argument("--ppo-epochs", type=int, default=2)
    p.add_argument("--minibatches", type=int, default=2)
    p.add_argument("--micro-batch-size", type=int, default=8)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--phase", choices=["bare", "trainer", "trainer-merged"], help=argparse.SUPPRESS)
    p.add_argument("--work", help=argparse.SUPPRESS)
    return p.parse_args(argv)


def load_trainer():
    spec = importlib.util.spec_from_file_location("stage_05_train", ROOT / "05_train.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def setup(args, work):
    """The policy (tiny model unless --policy) and the synthetic rollouts, in `work`."""
    import torch  # noqa: F401  (import cost paid here, not in the phases' timings)
    policy = Path(args.policy) if args.policy else work / "policy"
    rng = random.Random(args.seed)
    if not args.policy:
        words = [f"w{i}" for i in range(300)] + [str(n) for n in range(10, 1000)]
        corpus = [{"text": " ".join(rng.choice(words) for _ in range(40))} for _ in range(2000)]
        (work / "corpus.jsonl").write_text("".join(json.dumps(c) + "\n" for c in corpus))
        subprocess.run([sys.executable, str(ROOT / "data" / "tiny_model.py"), "--out", str(policy), "--corpus",
                        str(work / "corpus.jsonl"), "--seed", "0", "--layers", str(args.layers), "--dim", str(args.dim),
                        "--heads", str(args.heads)], check=True)
    vocab = json.loads((policy / "config.json").read_text())["vocab_size"]
    ids = lambda n: [rng.randrange(3, vocab) for _ in range(n)]
    recs = []
    for e in range(args.episodes):
        prompt, turns = ids(args.prompt_len), []
        for _ in range(args.turns):
            comp = ids(args.completion_len)
            turns.append({"prompt_ids": prompt, "completion_ids": comp, "logprobs": None})
            prompt = prompt + comp + ids(args.tool_len)
        recs.append({"episode_id": f"e{e}", "group_id": f"g{e // 4}", "reward": float(rng.random() < 0.5),
                     "temperature": 1.0, "model_turns": turns})
    (work / "rollouts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    return policy


def peak_memory_mb(torch, device, base_kb):
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2 ** 20
    return (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base_kb) / 1024  # Linux: KiB


def run_phase(args):
    import torch
    t05 = load_trainer()
    work = Path(args.work)
    policy = Path(args.policy) if args.policy else work / "policy"
    device = "cuda" if torch.cuda.is_available() else "cpu"
    recs = [json.loads(x) for x in (work / "rollouts.jsonl").read_text().splitlines()]
    episodes = [dict(turns=[(t["prompt_ids"], t["completion_ids"], None) for t in r["model_turns"]],
                     reward=r["reward"], group=r["group_id"], temp=1.0) for r in recs]
    per_turn_tokens = sum(len(s.ids) for s in t05.build_sequences(episodes, merge=False))
    tokens = per_turn_tokens * args.ppo_epochs
    if args.phase.startswith("trainer"):
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        if args.phase != "trainer-merged":  # one sequence per model turn (tests/variants05.py no-merge-turns)
            t05.build_sequences = functools.partial(t05.build_sequences, merge=False)
        s = t05.main(["--algo", "grpo", "--policy", str(policy), "--rollouts", str(work / "rollouts.jsonl"),
                      "--out", str(work / args.phase / "policy"), "--ppo-epochs", str(args.ppo_epochs),
                      "--minibatches", str(args.minibatches), "--micro-batch-size", str(args.micro_batch_size),
                      "--seed", str(args.seed)])
        seconds = s["prep_s"] + s["update_s"]  # old log-probs + all optimizer steps; not load / save
        return dict(seconds=seconds, tokens=tokens, peak_mb=peak_memory_mb(torch, device, base), steps=s["steps"],
                    sequences=s["sequences"], prep_s=s["prep_s"])
    # the bare loop: same sequences (one per turn), same minibatches / micro-batches, full logits
    from transformers import AutoModelForCausalLM
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # as for the trainer: before the model loads
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).to(device)
    model.config.use_cache = False
    if device == "cuda":
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    seqs = t05.build_sequences(episodes, merge=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.0)
    gen = torch.Generator().manual_seed(args.seed)
    mb = -(-len(seqs) // args.minibatches)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start, steps = time.perf_counter(), 0
    for _ in range(args.ppo_epochs):
        order = torch.randperm(len(seqs), generator=gen).tolist()
        for j in range(0, len(seqs), mb):
            chunk = sorted((seqs[k] for k in order[j:j + mb]), key=lambda s: len(s.ids))
            n_b = sum(s.n for s in chunk)
            for i in range(0, len(chunk), args.micro_batch_size):
                micro = chunk[i:i + args.micro_batch_size]
                L = max(len(s.ids) for s in micro)
                inp = torch.zeros((len(micro), L), dtype=torch.long)  # [B, L]
                mask = torch.zeros((len(micro), L))  # [B, L]
                for b, s in enumerate(micro):
                    inp[b, :len(s.ids)] = torch.tensor(s.ids)
                    mask[b, :len(s.ids)] = torch.tensor(s.mask, dtype=torch.float)
                inp, mask = inp.to(device), mask.to(device)
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=device == "cuda"):
                    logits = model(input_ids=inp).logits  # [B, L, V] (right padding: no mask needed)
                logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(2, inp[:, 1:, None])[..., 0]  # [B, L-1]
                loss = -(logp * mask[:, 1:]).sum() / n_b
                loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
    if device == "cuda":
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return dict(seconds=seconds, tokens=tokens, peak_mb=peak_memory_mb(torch, device, base), steps=steps,
                sequences=len(seqs))


def main(argv=None):
    args = parse_args(argv)
    if args.phase:
        print("RESULT " + json.dumps(run_phase(args)))
        return
    work = Path(tempfile.mkdtemp(prefix="bench05_"))
    policy = setup(args, work)
    cfg = json.loads((policy / "config.json").read_text())
    forward = [a for a in (argv if argv is not None else sys.argv[1:])]
    best = {}
    for r in range(args.repeats):
        for phase in ("bare", "trainer", "trainer-merged"):
            proc = subprocess.run([sys.executable, __file__, *forward, "--phase", phase, "--work", str(work)],
                                  capture_output=True, text=True)
            line = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
            if proc.returncode or not line:
                raise SystemExit(f"error: phase {phase} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
            res = json.loads(line[0][7:])
            if phase not in best or res["seconds"] < best[phase]["seconds"]:
                best[phase] = res
    import torch
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"CPU ({torch.get_num_threads()} threads)"
    print(f"\nmodel: {cfg.get('num_hidden_layers')} layers, d={cfg.get('hidden_size')}, vocab {cfg.get('vocab_size')}; "
          f"{device}; {args.episodes} episodes x {args.turns} turns, prompt {args.prompt_len} + {args.turns} x "
          f"({args.completion_len} completion + {args.tool_len} tool); {args.ppo_epochs} epochs x "
          f"{args.minibatches} minibatches, micro-batch {args.micro_batch_size}; best of {args.repeats}")
    mem = "peak GPU MiB" if torch.cuda.is_available() else "peak RSS MiB above start"
    print(f"{'':18}{'seconds':>9}{'tokens/s':>10}{'vs bare':>9}{'sequences':>11}{mem:>26}")
    for name, key in (("bare loop", "bare"), ("trainer no-merge", "trainer"), ("trainer (merged)", "trainer-merged")):
        b = best[key]
        print(f"{name:18}{b['seconds']:9.2f}{b['tokens'] / b['seconds']:10.0f}"
              f"{b['seconds'] / best['bare']['seconds']:8.2f}x{b['sequences']:11d}{b['peak_mb']:26.0f}")
    print(f"(trainer times include the old log-probs pass: {best['trainer']['prep_s']:.2f} s no-merge, "
          f"{best['trainer-merged']['prep_s']:.2f} s merged)")


if __name__ == "__main__":
    main()
