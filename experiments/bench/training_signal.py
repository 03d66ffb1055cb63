"""The training-set signal of RL runs, per iteration: what a learning rate, group size or batch is chosen from.

    python experiments/bench/training_signal.py runs/small17 runs/search-lr2e-5 --out results/budget/training_signal.md

For each run folder and iteration (RUN/iter_NNN/train_log.jsonl, one row per minibatch step of 05): the mean
training reward of the iteration's rollouts (its own tasks, sampled at temperature 1), the share of GRPO groups
with signal (not every sample the same reward), the optimizer steps, and the largest approx_kl and clipped-token
share over its steps (how far each update moved the policy from the one that sampled). Nothing here reads a test task.
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root, where common/plumbing.py is
from experiments.ledger import iteration_rows  # noqa: E402
from common.plumbing import read_json  # noqa: E402


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("runs", nargs="+")
    p.add_argument("--out", help="also write the markdown table here")
    args = p.parse_args(argv)
    lines = ["| run | lr | iteration | train reward | groups with signal | steps | max approx_kl | max clip share |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for run in args.runs:
        cfg = next((read_json(f) for f in (Path(run) / "pipeline_config.json",
                                                         Path(run).parent / "experiment_config.json") if f.is_file()),
                   {})
        for r in iteration_rows(run):
            lines.append(f"| {run} | {cfg.get('lr', '?')} | {r['iteration']} | {100 * r['reward_mean']:.1f}% | "
                         f"{100 * r['groups_with_signal']:.0f}% | {r['optimizer_steps']} | {r['approx_kl_max']:.4f} | "
                         f"{100 * r['clip_frac_max']:.1f}% |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
