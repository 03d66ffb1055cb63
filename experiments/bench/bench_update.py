"""Time one 05 update on a fixed rollouts file, before (05_train.py at a git revision) and after (this checkout),
in one run, with the same flags; and the gpu preset's peak LM-head / activation memory from the shapes.

    # the update: REV's 05_train.py (extracted with `git show REV:05_train.py`) against this checkout's
    python experiments/bench/bench_update.py --rollouts runs/small/iter_000/rollouts.jsonl --policy runs/small/init_policy \
        --rev main [--after-flags "--amp bf16"] -- --algo grpo --lr 1e-6
    # memory of the gpu preset's worst micro-batch (Qwen2.5-0.5B; 8 merged episodes of up to 8 x 256 completion
    # tokens in 8,192 positions), before and after chunking
    python experiments/bench/bench_update.py --memory [--logit-chunk 1024] [--micro-batch-tokens 32768]

Each version runs in its own process (one after the other, never two at once) through a small runner that
imports that 05_train.py by path and counts, in each token batch it builds (05's token_batch, or an older 05's
`collate`), the token positions the trunk runs (padded) and the completion tokens that carry a loss in the update
(those batched inside `accumulate`): "tokens processed per
loss token" = all positions run (old log-probs, reference, update) / loss tokens of the update. Reported: wall
time of 05's main(), its prep_s / update_s, the ratio before / after, and both counts. The policy is never
written over: each version writes to its own temporary --out. Needs a git checkout (for --rev).
"""
import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

RUNNER = r'''
import importlib.util, json, os, sys, time
sys.path.insert(0, os.getcwd())  # the repository root (cwd), where common/plumbing.py (imported by 05) is
path, argv, out = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
spec = importlib.util.spec_from_file_location("stage05_bench", path)
mod = importlib.util.module_from_spec(spec)
sys.modules["stage05_bench"] = mod
spec.loader.exec_module(mod)
from common import generation
stats = dict(processed=0, loss_tokens=0, collates=0)
inside = [False]
accumulate = mod.accumulate
def counting(collate):
    def counted(*a, **k):
        b = collate(*a, **k)
        stats["processed"] += b["inp"].numel()  # padded positions the trunk runs
        stats["collates"] += 1
        if inside[0]:
            stats["loss_tokens"] += b["tgt"].numel()
        return b
    return counted
if hasattr(mod, "collate"):  # a 05 with its own collate
    mod.collate = counting(mod.collate)
elif hasattr(generation, "token_batch"):  # an older 05, whose log-probs were common/generation.py's
    generation.token_batch = mod.token_batch = counting(generation.token_batch)
else:  # 05 batches its own sequences (token_batch)
    mod.token_batch = counting(mod.token_batch)
def counting_accumulate(*a, **k):
    inside[0] = True
    try:
        return accumulate(*a, **k)
    finally:
        inside[0] = False
mod.accumulate = counting_accumulate
t = time.perf_counter()
summary = mod.main(argv)
stats["wall_s"] = time.perf_counter() - t
stats.update({k: summary.get(k) for k in ("prep_s", "update_s", "first_loss", "last_loss", "sequences",
                                          "trained_sequences", "gen_tokens", "optimizer_steps")})
open(out, "w").write(json.dumps(stats))
'''


def run_version(label, script, args, extra, tmp):
    out = tmp / label
    argv = ["--policy", str(args.policy), "--rollouts", str(args.rollouts), "--out", str(out / "policy"),
            "--no-optimizer-state", *extra]
    stats_file = tmp / f"{label}.json"
    runner = tmp / "runner.py"
    runner.write_text(RUNNER)
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(runner), str(script), json.dumps(argv), str(stats_file)], env=env,
                          capture_output=True, text=True, cwd=ROOT)
    if proc.returncode:
        sys.exit(f"{label} ({script}) failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    stats = json.loads(stats_file.read_text())
    stats["tokens_per_loss_token"] = stats["processed"] / max(1, stats["loss_tokens"])
    return stats


def bench(args, extra):
    with tempfile.TemporaryDirectory(prefix="bench_update_") as tmp:
        tmp = Path(tmp)
        before = tmp / "05_before.py"
        try:
            before.write_text(subprocess.run(["git", "-C", str(ROOT), "show", f"{args.rev}:05_train.py"], check=True,
                                             capture_output=True, text=True).stdout)
        except subprocess.CalledProcessError as e:
            sys.exit(f"git show {args.rev}:05_train.py failed: {e.stderr.strip()}")
        rows = {}
        versions = [("before", before, extra), ("after", ROOT / "05_train.py", extra)]
        if args.after_flags:  # the same checkout with flags the old 05 did not have (e.g. --amp bf16)
            versions.append(("after " + args.after_flags, ROOT / "05_train.py", extra + shlex.split(args.after_flags)))
        for rep in range(args.repeats):  # alternate, so that a slower machine moment hits all
            for i, (label, script, flags) in enumerate(versions):
                rows.setdefault(label, []).append(run_version(f"v{i}-{rep}", script, args, flags, tmp))
    pick = {k: min(v, key=lambda r: r["wall_s"]) for k, v in rows.items()}  # best of repeats
    b = pick["before"]
    result = dict(rev=args.rev, flags=extra, after_flags=args.after_flags, rollouts=str(args.rollouts),
                  policy=str(args.policy), **pick,
                  speedup={k: b["wall_s"] / r["wall_s"] for k, r in pick.items()},
                  update_speedup={k: (b["prep_s"] + b["update_s"]) / max(1e-9, r["prep_s"] + r["update_s"])
                                  for k, r in pick.items()})
    print(f"{'':24}" + "".join(f"{(k + ' (' + args.rev + ')' if k == 'before' else k):>24}" for k in pick))
    for k in ("wall_s", "prep_s", "update_s", "processed", "loss_tokens", "tokens_per_loss_token", "first_loss",
              "last_loss"):
        print(f"{k:24}" + "".join(f"{r[k]:24.4f}" if isinstance(r[k], float) else f"{r[k]!s:>24}"
                                   for r in pick.values()))
    for k in pick:
        if k != "before":
            print(f"speed-up before / {k} (wall of main): {result['speedup'][k]:.2f}x; prep + update: "
                  f"{result['update_speedup'][k]:.2f}x")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return result


# ---------------------------------------------------------------------------------------------------- memory
QWEN05 = dict(hidden=896, vocab=151936, layers=24, intermediate=4864, params=494_032_768)


def peak_memory(hidden, vocab, layers, intermediate, params, seqs=8, seq_len=8192, completion=8 * 256,
                chunk=1024, entropy=False, micro_batch_tokens=None):
    """Bytes of the big tensors of one micro-batch's forward + backward in 05 on a GPU (bf16 autocast, gradient
    checkpointing, fp32 LM head), from the shapes. N = completion tokens of the micro-batch (seqs x completion).

    LM head, before chunking: the fp32 [N, V] logits, the log-softmax (kept for backward), and for the entropy
    (computed whatever --ent-coef) exp(log p) and p * log p: 4 x N x V x 4 B alive at once in the forward; in the
    backward the log-softmax, the dense gradient of the gather and of the log-softmax input: 3 x N x V x 4 B.
    After: the same tensors for one chunk of c tokens (checkpointed: nothing of it is kept between forward and
    backward); 2 (+2 with an entropy term) x c x V x 4 B in the forward, 3 in the backward.
    Trunk (both): with checkpointing, every layer's fp32 input [T, H] is kept (T = tokens of the micro-batch),
    plus one layer's recomputed working set in backward (~ q, k, v, o, gate, up, act, product and their gradients:
    about 2 x (4 H + 4 I) x T bf16 bytes); weights, gradients and AdamW moments: 16 B a parameter (fp32)."""
    if micro_batch_tokens:  # sequences of seq_len each: as many as fit the padded-token budget
        seqs = max(1, micro_batch_tokens // seq_len)
    n, t = seqs * completion, seqs * seq_len
    gb = 1 / 2**30
    head_before = max(4, 3) * n * vocab * 4
    c = min(chunk, n) if chunk else n
    head_after = max(2 + 2 * entropy, 3) * c * vocab * 4
    trunk = layers * t * hidden * 4 + 2 * (4 * hidden + 4 * intermediate) * t * 2
    states = 16 * params
    return dict(seqs=seqs, completion_tokens=n, tokens=t, one_NxV_tensor_gb=n * vocab * 4 * gb,
                head_before_gb=head_before * gb, head_after_gb=head_after * gb, trunk_gb=trunk * gb,
                weights_grads_adam_gb=states * gb, total_before_gb=(head_before + trunk + states) * gb,
                total_after_gb=(head_after + trunk + states) * gb)


def memory(args):
    rows = [("gpu preset, --micro-batch-size 8", peak_memory(**QWEN05, chunk=args.logit_chunk))]
    if args.micro_batch_tokens:
        rows.append((f"--micro-batch-tokens {args.micro_batch_tokens}",
                     peak_memory(**QWEN05, chunk=args.logit_chunk, micro_batch_tokens=args.micro_batch_tokens)))
    for name, r in rows:
        print(f"{name}: {r['seqs']} sequences x {r['tokens'] // r['seqs']} positions, {r['completion_tokens']} "
              f"completion tokens; one [N, V] fp32 tensor {r['one_NxV_tensor_gb']:.1f} GiB")
        print(f"  LM head peak: before {r['head_before_gb']:.1f} GiB, after (chunk {args.logit_chunk}) "
              f"{r['head_after_gb']:.2f} GiB; trunk (checkpointed) {r['trunk_gb']:.1f} GiB; weights + grads + "
              f"AdamW {r['weights_grads_adam_gb']:.1f} GiB")
        print(f"  total: before {r['total_before_gb']:.1f} GiB, after {r['total_after_gb']:.1f} GiB")
    return rows


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rollouts", help="a fixed rollouts.jsonl (e.g. the small preset's iter_000)")
    p.add_argument("--policy", help="the policy that sampled it (05 --policy)")
    p.add_argument("--rev", default="main", help="git revision of the 'before' 05_train.py")
    p.add_argument("--repeats", type=int, default=1, help="runs of each version (the fastest is kept)")
    p.add_argument("--json", help="write the result here")
    p.add_argument("--after-flags", help="also time this checkout with these extra 05 flags (e.g. '--amp bf16')")
    p.add_argument("--memory", action="store_true", help="only the gpu preset's memory from the shapes")
    p.add_argument("--logit-chunk", type=int, default=1024, help="--memory: the LM-head chunk to estimate (05 runs "
                   "LOGIT_CHUNK, 1024)")
    p.add_argument("--micro-batch-tokens", type=int)
    args = p.parse_args(argv)
    if args.memory:
        return memory(args)
    if not (args.rollouts and args.policy):
        p.error("--rollouts and --policy are needed (or --memory)")
    return bench(args, extra)


if __name__ == "__main__":
    main()
