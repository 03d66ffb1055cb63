"""Stage 03: give each training task a small group of structurally close training harnesses.

The paper's locality-aware assignment. For each task x:
    anchor   h_x ~ Uniform(H_tr)
    then     the K-1 other configurations of H_tr with the smallest Hamming distance to h_x
    H_x = {h_x, h_x^(1), ..., h_x^(K-1)}
Ties at the cut-off are broken by a seeded random draw (never by file order). Over the RL
iterations a task is run under the K harnesses of its group (its i-th visit in 04 uses H_x[i mod K]),
so it sees small, controlled variations of one harness, while different tasks (different
anchors) spread over all of H_tr.
`--method random` (the ablation) gives each task K distinct training configurations uniformly.
A training record may have "levels": null (an out-of-space harness of data/external_harnesses.json, for the
black-box baselines): Hamming distance to it is undefined, so it works with K = 1 or --method random only
(its distances are written as null); --method locality with K > 1 stops with an error naming its line.

Reads  RUN/train_harnesses.jsonl (stage 02) and a task file (JSONL, each line with a "task_id")
Writes RUN/assignment.jsonl: {"task_id": ..., "harness_ids": [anchor, ...], "hamming_to_anchor": [0, ...]}
       (null where a distance is undefined)
       RUN/03_assignment_config.json
Prints how often each training configuration is used and the mean within-group Hamming
distance of this assignment beside what random assignment gives (exact expectation).

Commands:
    python 03_assignment.py --run runs/default                               # locality, K = 3
    python 03_assignment.py --run runs/default --tasks data/train_tasks.jsonl --k 3 --seed 0
    python 03_assignment.py --run runs/randassign --method random --seed 0   # the ablation
"""
import argparse
import itertools
import json
import random
from collections import Counter
from pathlib import Path

from common.plumbing import fail, jsonl_text, locked, read_jsonl, write_atomic


# ---------------------------------------------------------------------------------------
# Args
# ---------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Stage 03: assign each task K nearby training harnesses.")
    g = p.add_argument_group("inputs and output")
    g.add_argument("--run", default="runs/default", help="run folder (reads train_harnesses.jsonl, writes "
                   "assignment.jsonl)")
    g.add_argument("--tasks", default="data/train_tasks.jsonl",
                   help="training tasks, JSONL with a 'task_id' on every line (made by data/make_tasks.py)")
    g = p.add_argument_group("the assignment")
    g.add_argument("--k", type=int, default=3, help="harnesses per task, the anchor included (K): how many "
                   "variations of one harness a task sees")
    g.add_argument("--method", default="locality", choices=["locality", "random"],
                   help="locality: anchor + its K-1 Hamming-nearest (the paper's); random: K uniform (ablation)")
    g.add_argument("--seed", type=int, default=0, help="seed of the anchors, tie-breaks and random groups")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------
def hamming(levels_a, levels_b):
    """Hamming distance between two configurations (dicts component -> level); None if one has no levels."""
    if levels_a is None or levels_b is None:
        return None
    # d_H(h_i, h_j) = sum over components c in {S,T,O,C,W} of 1[h_i^c != h_j^c]
    return sum(levels_a[c] != levels_b[c] for c in levels_a)


def mean(values):
    """Mean of a list; None if it is empty or holds an undefined (None) value."""
    return None if not values or None in values else sum(values) / len(values)


# ---- input checking ----
# Every file and flag is checked before anything is computed or written: bad input stops with one line naming
# the file, the line and the field (exit 2), and the run folder is left as it was.
def load_train(path, need_levels):
    """The training configurations: [(harness_id, levels or None)] in file order, checked.
    need_levels: every record must have levels (locality with K > 1 measures Hamming distances)."""
    train, keys, seen = [], None, {}
    for n, rec in read_jsonl(path, hint=" (run 02_orthogonal_design.py first)"):
        hid, levels = rec.get("harness_id"), rec.get("levels")
        if not isinstance(hid, str) or not hid:
            fail(f"{path}:{n}: field 'harness_id' is missing or not a string")
        if levels is None and need_levels:  # an out-of-space harness: no levels, no Hamming distance
            fail(f"{path}:{n}: field 'levels' is {'null' if 'levels' in rec else 'missing'}, so the Hamming "
                 f"distance to {hid!r} is undefined: --method locality needs --k 1 here (or use --method random)")
        if levels is not None:
            if not isinstance(levels, dict) or not levels or not all(isinstance(v, int) for v in levels.values()):
                fail(f"{path}:{n}: field 'levels' must be an object component -> integer level "
                     "(or null for an out-of-space harness)")
            keys = keys or sorted(levels)
            if sorted(levels) != keys:
                fail(f"{path}:{n}: field 'levels' has components {sorted(levels)}, earlier lines {keys}")
        if hid in seen:
            fail(f"{path}:{n}: field 'harness_id' {hid!r} repeats line {seen[hid]}")
        seen[hid] = n
        train.append((hid, levels))
    if not train:
        fail(f"{path}: no training configurations")
    return train


def load_task_ids(path):
    """The task ids of a task file, in file order (other fields are not needed here)."""
    ids, seen = [], {}
    for n, rec in read_jsonl(path, hint=" (make it with: python data/make_tasks.py)"):
        tid = rec.get("task_id")
        if not isinstance(tid, str) or not tid:
            fail(f"{path}:{n}: field 'task_id' is missing or not a non-empty string")
        if tid in seen:
            fail(f"{path}:{n}: field 'task_id' {tid!r} repeats line {seen[tid]}")
        seen[tid] = n
        ids.append(tid)
    if not ids:
        fail(f"{path}: no tasks")
    return ids


# ---- the algorithm ----
# ---------------------------------------------------------------------------------------
# The assignment
# ---------------------------------------------------------------------------------------
def locality_group(train, k, rng):
    """Anchor ~ U(H_tr), then its K-1 nearest others; ties broken by the seeded shuffle."""
    # h_x ~ U(H_tr)
    anchor = rng.choice(train)
    others = [h for h in train if h[0] != anchor[0]]
    rng.shuffle(others)                                   # a seeded random order among equals ...
    # H_x = {h_x} + the K-1 h in H_tr \ {h_x} with the smallest d_H(h_x, h)
    others.sort(key=lambda h: hamming(anchor[1], h[1]))   # ... kept by the stable sort
    return [anchor] + others[:k - 1]


def random_group(train, k, rng):
    """K distinct training configurations uniformly (the first one plays the anchor)."""
    return rng.sample(train, k)


def mean_pairwise_distance(group):
    """Mean d_H over the unordered pairs of a group (None for a group of one or an undefined distance)."""
    return mean([hamming(a[1], b[1]) for a, b in itertools.combinations(group, 2)])


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------
def main(argv=None):
    args = parse_args(argv)
    with locked(Path(args.run) / "run.lock"):  # one writer per run folder
        return run_stage(args)


def run_stage(args):
    run = Path(args.run)
    train_path = run / "train_harnesses.jsonl"
    train = load_train(train_path, need_levels=args.method == "locality" and args.k > 1)
    task_ids = load_task_ids(args.tasks)
    if args.k < 1:
        fail(f"--k {args.k}: must be at least 1")
    if args.k > len(train):
        fail(f"--k {args.k} is larger than the training set: {train_path} has {len(train)} configurations")

    rng = random.Random(args.seed)
    make_group = locality_group if args.method == "locality" else random_group
    records, groups = [], []
    for tid in task_ids:
        group = make_group(train, args.k, rng)
        groups.append(group)
        records.append({"task_id": tid, "harness_ids": [h[0] for h in group],
                        "hamming_to_anchor": [0] + [hamming(group[0][1], h[1]) for h in group[1:]]})

    # Usage: in how many task groups each training configuration appears (and as anchor).
    used = Counter(h[0] for g in groups for h in g)
    anchors = Counter(g[0][0] for g in groups)
    # Locality: mean within-group d_H here vs random assignment. For K distinct uniform
    # configurations every pair in the group is a uniform pair of H_tr, so its expectation is
    # E_random[d_H] = mean of d_H(h_i, h_j) over all unordered pairs i < j of H_tr (exact).
    # Each is None (n/a) where undefined: K = 1, or a harness without levels.
    mean_within = mean([mean_pairwise_distance(g) for g in groups if len(g) > 1])
    random_expect = mean_pairwise_distance(train)
    mean_to_anchor = mean([d for r in records for d in r["hamming_to_anchor"][1:]])

    print(f"tasks: {len(task_ids)} from {args.tasks}; H_tr: {len(train)} configurations from {train_path}")
    print(f"method {args.method}, K = {args.k}, seed {args.seed}")
    print("usage: tasks whose group holds the configuration (as anchor in brackets)")
    cells = [f"{hid} {used[hid]:>4} ({anchors[hid]})" for hid, _ in sorted(train)]
    for i in range(0, len(cells), 3):
        print("  " + "   ".join(f"{c:<26}" for c in cells[i:i + 3]).rstrip())
    print(f"usage min..max: {min(used[h] for h, _ in train)}..{max(used[h] for h, _ in train)} "
          f"(mean {len(task_ids) * args.k / len(train):.2f} = tasks * K / |H_tr|); "
          f"configurations never used: {sum(used[h] == 0 for h, _ in train)}")
    if mean_within is None:
        why = "K = 1" if args.k == 1 else "undefined for a harness without levels"
        print(f"mean within-group Hamming distance: n/a ({why})")
    else:
        expect = "n/a" if random_expect is None else f"{random_expect:.3f}"
        print(f"mean within-group Hamming distance: {mean_within:.3f} ({args.method}, this assignment) vs "
              f"{expect} for random assignment (exact expectation)")
        print(f"mean Hamming distance anchor -> other members: {mean_to_anchor:.3f}")

    config = {"stage": "03_assignment", "args": vars(args), "n_tasks": len(task_ids), "n_train": len(train),
              "usage": dict(sorted(used.items())), "anchor_usage": dict(sorted(anchors.items())),
              "mean_within_group_hamming": mean_within, "random_expected_within_group_hamming": random_expect,
              "mean_hamming_to_anchor": mean_to_anchor}
    write_atomic(run / "03_assignment_config.json", json.dumps(config, indent=1) + "\n")
    write_atomic(run / "assignment.jsonl", jsonl_text(records))  # last: its presence means 03 finished
    print(f"wrote {run / 'assignment.jsonl'} ({len(records)} tasks), {run / '03_assignment_config.json'}")


if __name__ == "__main__":
    main()
