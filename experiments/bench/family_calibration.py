"""Per-family pass@1 of a policy on TRAINING tasks under one harness: how the task families are calibrated.

    python experiments/bench/family_calibration.py --policy runs/exp2/warmstart/policy --run runs/exp2/warmstart \
        --skip 6 --per-family 20 --out results/calibration/warm_start_base.md

The design asks each family to be neither failed nor passed by the warm start on the base harness (roughly 10-70%
of its training tasks), so RL can move every family both ways. This runs 04 (eval mode, greedy, the small preset's
turns, reply tokens and engine) on the first --per-family training tasks of each family after the first --skip
(the warm start's own demonstration tasks), and writes a table: family, solved / tasks, pass@1 with its
Clopper-Pearson interval, and whether it lies in the band. Nothing here reads a test task.
"""
import argparse
import json
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # the repository root: common/intervals.py, common/plumbing.py
from common.intervals import clopper_pearson  # noqa: E402
from common.plumbing import jsonl_text, read_jsonl, write_atomic  # noqa: E402

BAND = (0.10, 0.70)  # the share of a family's training tasks the warm start should solve


def calibration_tasks(path, skip, per_family):
    """The first per_family tasks of each family after the first `skip` tasks of the file, in file order."""
    taken, chosen = defaultdict(int), []
    for _, task in read_jsonl(path, required=("family",))[skip:]:
        if taken[task["family"]] < per_family:
            taken[task["family"]] += 1
            chosen.append(task)
    return chosen


def family_table(records):
    """[(family, solved, n, low, high)] in order of first appearance: pass@1 with its Clopper-Pearson interval."""
    solved, n = defaultdict(int), defaultdict(int)
    for r in records:
        n[r["family"]] += 1
        solved[r["family"]] += bool(r["success"])
    return [(f, solved[f], n[f], *clopper_pearson(solved[f], n[f])) for f in n]


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--policy", required=True, help="the checkpoint to score (e.g. the warm start)")
    p.add_argument("--run", required=True, help="a run folder with stages 01-02 done (04 reads its harness space)")
    p.add_argument("--tasks", default=str(ROOT / "data" / "train_tasks.jsonl"), help="training tasks (JSONL)")
    p.add_argument("--skip", type=int, default=6, help="leave out the first N tasks (the warm start's demonstrations)")
    p.add_argument("--per-family", type=int, default=20, help="tasks per family")
    p.add_argument("--harness", default="base", help="04's --harnesses SPEC (default: the base harness)")
    p.add_argument("--backend", default="vllm", choices=["hf", "vllm"])
    p.add_argument("--max-turns", type=int, default=5)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--out", required=True, help="the markdown report (small: it goes under results/)")
    p.add_argument("--work", default="runs/calibration", help="where the tasks and episodes go (large: not results/)")
    args = p.parse_args(argv)

    out, work = Path(args.out), Path(args.work)
    out.parent.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    tasks_file, episodes = work / (out.stem + ".tasks.jsonl"), work / (out.stem + ".jsonl")
    write_atomic(tasks_file, jsonl_text(calibration_tasks(args.tasks, args.skip, args.per_family)))
    cmd = [sys.executable, str(ROOT / "04_rollout.py"), "--run", args.run, "--eval", "--policy", args.policy,
           "--harnesses", args.harness, "--tasks", str(tasks_file), "--out", str(episodes), "--backend", args.backend,
           "--temperature", "0", "--max-turns", str(args.max_turns), "--max-new-tokens", str(args.max_new_tokens)]
    cmd += ["--max-model-len", str(args.max_model_len)] if args.backend == "vllm" else []
    start = time.time()
    subprocess.run(cmd, check=True)
    wall = time.time() - start

    rows = family_table([r for _, r in read_jsonl(episodes)])
    words = ' '.join(sys.argv[1:] if argv is None else argv)
    lines = [f"Command: `python experiments/bench/family_calibration.py {words}`",
             f"(04 greedy on training tasks {args.skip + 1}.. of {Path(args.tasks).name}, harness {args.harness}, "
             f"{args.backend}; {wall:.0f} s). Band: {100 * BAND[0]:.0f}-{100 * BAND[1]:.0f}% of a family's tasks.",
             "", "| family | solved | pass@1 | 95% interval | in the band |", "| --- | --- | --- | --- | --- |"]
    for family, k, n, low, high in rows:
        inside = "yes" if BAND[0] <= k / n <= BAND[1] else "no"
        lines.append(f"| {family} | {k} / {n} | {100 * k / n:.0f}% | [{100 * low:.0f}, {100 * high:.0f}] | {inside} |")
    text = "\n".join(lines) + "\n"
    write_atomic(out, text)
    print(text)
    print(json.dumps({f: f"{k}/{n}" for f, k, n, *_ in rows}))


if __name__ == "__main__":
    main()
