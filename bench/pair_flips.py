"""Episode-level difference between two evaluations of one policy (06 folders or ledger records' eval/ folders):
per split, how many (task, harness, sample) episodes end differently (how, or after how many turns) and how many
change success. Used for results/machine_drift (one warm start evaluated on two CPU types).

    python bench/pair_flips.py results/records/small/warm-start/seed0/eval results/machine_drift/warm-start-xeon/eval
"""
import json
import sys


def load(path):
    """{(task_id, harness_id, sample_index): episode} of one split's JSONL."""
    with open(path, encoding="utf-8") as f:
        return {(r["task_id"], r["harness_id"], r["sample_index"]): r for r in map(json.loads, filter(str.strip, f))}


def main(a, b):
    print("| split | episodes | end or turns differ | success differs |\n| --- | --- | --- | --- |")
    for split in json.load(open(f"{a}/summary.json", encoding="utf-8"))["splits"]:
        x, y = load(f"{a}/{split}.jsonl"), load(f"{b}/{split}.jsonl")
        if x.keys() != y.keys():
            sys.exit(f"{b}/{split}.jsonl: other (task, harness, sample) episodes than {a}/{split}.jsonl")
        ends = sum((x[k]["finish_reason"], x[k]["turns"]) != (y[k]["finish_reason"], y[k]["turns"]) for k in x)
        flips = sum(x[k]["success"] != y[k]["success"] for k in x)
        print(f"| {split} | {len(x)} | {ends} | {flips} |")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
