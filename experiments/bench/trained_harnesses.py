"""Greedy pass@1 of a run's checkpoints on its own training harnesses and training tasks: did RL learn what it
trained on? (06 measures test tasks on held-out harnesses; this is the other line of the picture.)

    python experiments/bench/trained_harnesses.py --run runs/small17 --checkpoints init,5 --tasks 12 --out results/x.json

For each checkpoint (`init` = DIR/init_policy, t = DIR/iter_{t:03d}/policy) one 04 call: --eval, --harnesses
train (DIR/train_harnesses.jsonl), the first --tasks lines of DIR/train_tasks.jsonl, temperature 0, the preset's
turn and token budgets (--max-turns / --max-new-tokens / --backend / --max-model-len). Rollouts are kept in
DIR/train-eval/<checkpoint>.jsonl and reused when the command runs again. Prints pass@1 per checkpoint and, for
each later checkpoint, the (task, harness) pairs it solves that the first does not and the reverse, with the exact
two-sided sign test on them."""
import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository root, where common/intervals.py and common/plumbing.py are
from common.intervals import sign_test  # noqa: E402
from common.plumbing import run_child  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True)
    p.add_argument("--checkpoints", default="init", help="comma-separated: init and/or iteration numbers")
    p.add_argument("--tasks", type=int, default=12, help="the first N training tasks of DIR/train_tasks.jsonl")
    p.add_argument("--backend", default="vllm")
    p.add_argument("--max-turns", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--out", help="write the result as JSON here")
    args = p.parse_args(argv)
    run = Path(args.run)
    tasks = run / "train-eval" / f"tasks-{args.tasks}.jsonl"
    tasks.parent.mkdir(exist_ok=True)
    tasks.write_text("".join((run / "train_tasks.jsonl").read_text().splitlines(keepends=True)[:args.tasks]))
    result = {}
    for ck in args.checkpoints.split(","):
        policy = run / "init_policy" if ck == "init" else run / f"iter_{int(ck):03d}" / "policy"
        out = run / "train-eval" / f"{ck}-{args.tasks}.jsonl"
        if not out.is_file():
            cmd = [sys.executable, "04_rollout.py", "--run", str(run), "--eval", "--policy", str(policy),
                   "--harnesses", "train", "--tasks", str(tasks), "--out", str(out), "--backend", args.backend,
                   "--temperature", "0", "--max-turns", str(args.max_turns), "--max-new-tokens",
                   str(args.max_new_tokens), "--max-model-len", str(args.max_model_len), "--seed", "0"]
            if run_child(cmd, cwd=ROOT) != 0:  # a Ctrl-C reaches 04 and its engine, and is waited for
                raise SystemExit(f"04 failed: {' '.join(cmd)}")
        result[ck] = {(r["task_id"], r["harness_id"]): bool(r["success"])
                      for r in map(json.loads, out.read_text().splitlines())}
    first = next(iter(result))
    rows = []
    for ck, pairs in result.items():
        better = sum(pairs[k] and not result[first][k] for k in pairs)
        worse = sum(result[first][k] and not pairs[k] for k in pairs)
        rows.append(dict(checkpoint=ck, solved=sum(pairs.values()), pairs=len(pairs),
                         pass1=100 * sum(pairs.values()) / len(pairs), better_than_first=better,
                         worse_than_first=worse, sign_test_p=sign_test(better, worse)))
        print(f"{ck:>6}: {rows[-1]['solved']}/{len(pairs)} = {rows[-1]['pass1']:.1f}%  vs {first}: +{better} "
              f"-{worse} (sign test p {rows[-1]['sign_test_p']:.2g})")
    if args.out:
        Path(args.out).write_text(json.dumps(dict(run=str(run), tasks=args.tasks, rows=rows), indent=1))
    return rows


if __name__ == "__main__":
    main()
