"""Episode-level difference between two evaluations of one policy (06 folders or ledger records' eval/ folders):
per split, how many (task, harness, sample) episodes end differently (how, or after how many turns) and how many
change success. Used for results/machine_drift (one warm start evaluated on two CPU types).

    python experiments/bench/pair_flips.py results/records/small/warm-start/seed0/eval results/machine_drift/warm-start-xeon/eval
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: common/plumbing.py
from common.plumbing import fail, read_json, read_jsonl  # noqa: E402

FIELDS = ("task_id", "harness_id", "sample_index", "success", "finish_reason", "turns")


def load(path):
    """{(task_id, harness_id, sample_index): episode} of one split's JSONL (a bad line: file:line, exit 2)."""
    return {(e["task_id"], e["harness_id"], e["sample_index"]): e for _, e in read_jsonl(path, required=FIELDS)}


def main(a, b):
    print("| split | episodes | end or turns differ | success differs |\n| --- | --- | --- | --- |")
    for split in read_json(Path(a) / "summary.json")["splits"]:
        x, y = load(Path(a) / f"{split}.jsonl"), load(Path(b) / f"{split}.jsonl")
        if x.keys() != y.keys():
            fail(f"{b}/{split}.jsonl: other (task, harness, sample) episodes than {a}/{split}.jsonl")
        ends = sum((x[k]["finish_reason"], x[k]["turns"]) != (y[k]["finish_reason"], y[k]["turns"]) for k in x)
        flips = sum(x[k]["success"] != y[k]["success"] for k in x)
        print(f"| {split} | {len(x)} | {ends} | {flips} |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
