"""The transfer curve: pass@1 along training on the harnesses a method trained on and on harnesses it never saw.

RL can get better on its own training harnesses (it learns them) without getting better on held-out ones (it does
not transfer). This program puts the two lines side by side for each method, at the same checkpoints, on the same
test tasks: the gap between them is what training across harnesses is meant to close. The pipeline's experiments
make its inputs (pipeline.py --experiment main --curve-every K): for each checkpoint after 0, K, 2K, ... and the
last RL iteration, one greedy 04 --eval call on the curve's test tasks under the experiment's In-Space evaluation
set and under the run's own training harnesses, RUN/curve/iter-NNN.jsonl.

    python experiments/transfer_curve.py harness-scaling=runs/exp/harness-scaling single=runs/exp/single \
        --eval-set runs/exp/eval_harnesses.jsonl --out runs/exp/transfer_curve

For every method and checkpoint, two lines, each pass@1 over tasks with its 95% interval (common/intervals.py's
pass1_ci):
  trained   the (task, harness) pairs under the run's training harnesses (RUN/train_harnesses.jsonl)
  held-out  the pairs under the evaluation set (disjoint from every method's training harnesses)
and each point's paired change since the warm start (iteration 0), with the exact sign test over tasks. Between
methods (the first against each other), the held-out lines' paired difference at each common checkpoint. And how
the episodes of each point end (solved, a wrong answer submitted, never submitted; parse and tool errors): which
failure RL removes first. Then the held-out line split two ways, as experiments/compare.py splits its In-Space column
(the same helpers): by the Hamming distance of each held-out harness to the method's own training set, at every
checkpoint, and by task family, at the first and the last checkpoint with the paired change between them.

ITEM: NAME=RUN[,RUN...] (several RUNs: seed replicates of one method, a pair's success averaged over them).
Reads   RUN/curve/iter-NNN.jsonl (04 --eval: task_id, harness_id, success, finish_reason, turns, parse_errors,
        tool_errors), RUN/train_harnesses.jsonl, --eval-set
Writes  PREFIX.md, PREFIX.png (matplotlib), PREFIX.json (written last: the done marker)
"""
import argparse
import json
import os
import sys
from fractions import Fraction
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: common/, experiments/

from common.intervals import pass1_ci, sign_test
from common.plumbing import fail, locked, read_jsonl, write_atomic
from common.schemas import COMPONENTS, levels_of


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("items", nargs="+", metavar="NAME=RUN[,RUN...]", help="a method's run folder(s); several: seed "
                   "replicates, averaged")
    p.add_argument("--eval-set", required=True, metavar="FILE", help="the held-out harnesses (JSONL, harness_id): "
                   "the experiment's In-Space set, which no method trained on")
    p.add_argument("--out", required=True, metavar="PREFIX", help="writes PREFIX.md, PREFIX.png, PREFIX.json")
    return p.parse_args(argv)


# ---- input checking ----
def harness_ids(path):
    return [h["harness_id"] for _, h in read_jsonl(path, required=("harness_id",))]


COUNTS = ("turns", "parse_errors", "tool_errors")  # 04's per-episode counters that say how an episode went


def read_checkpoint(path):
    """The episodes of one 04 --eval file: task_id, harness_id, success (true/false), finish_reason and the
    counters in COUNTS (non-negative integers)."""
    episodes = []
    for lineno, e in read_jsonl(path, required=("task_id", "harness_id", "success", "finish_reason", *COUNTS)):
        if type(e["success"]) not in (bool, int) or e["success"] not in (0, 1):
            fail(f"{path}:{lineno}: field 'success' is {e['success']!r}, expected true/false")
        for field in COUNTS:
            if type(e[field]) is not int or e[field] < 0:
                fail(f"{path}:{lineno}: field '{field}' is {e[field]!r}, expected a count (integer >= 0)")
        episodes.append(e)
    return episodes


def load_method(name, runs, eval_ids):
    """{"points": {iteration: {"trained": pairs, "held-out": pairs, "ends": ...}}, "train_ids": the training
    harnesses, "families": {task: family}}, each pairs {(task, harness): success averaged over replicates}; the
    checkpoints, tasks and training harnesses must agree across replicates."""
    points, trained = None, None
    per_run = []
    for run in runs:
        ids = set(harness_ids(run / "train_harnesses.jsonl"))
        if ids & eval_ids:
            fail(f"{run / 'train_harnesses.jsonl'}: trains on {sorted(ids & eval_ids)[0]}, which is in the "
                 "evaluation set: the held-out line would not be held out")
        files = {int(f.stem.split("-")[1]): f for f in sorted((run / "curve").glob("iter-*.jsonl"))
                 if f.stem.split("-")[1].isdigit()}
        if not files:
            fail(f"{run / 'curve'}: no iter-NNN.jsonl files (pipeline.py --experiment ... --curve-every K makes them)")
        if points is not None and (sorted(files) != points or ids != trained):
            fail(f"{run}: other checkpoints or training harnesses than {runs[0]} (replicates of {name} must match)")
        points, trained = sorted(files), ids
        per_run.append({t: read_checkpoint(f) for t, f in files.items()})
    out, families = {}, {}
    for t in points:
        episodes = [e for r in per_run for e in r[t]]
        families.update(families_of(episodes))  # for the held-out line split by task family
        lines = {"trained": [e for e in episodes if e["harness_id"] in trained],
                 "held-out": [e for e in episodes if e["harness_id"] in eval_ids]}
        for line, eps in lines.items():
            if not eps:
                fail(f"{runs[0] / 'curve' / f'iter-{t:03d}.jsonl'}: no episode under the {line} harnesses")
        out[t] = {line: exact_pair_means(eps) for line, eps in lines.items()}
        out[t]["ends"] = {line: how_episodes_end(eps) for line, eps in lines.items()}
    for line in ("trained", "held-out"):  # every checkpoint on the same (task, harness) pairs
        first = set(out[points[0]][line])
        for t in points[1:]:
            if set(out[t][line]) != first:
                fail(f"{runs[0] / 'curve' / f'iter-{t:03d}.jsonl'}: its {line} (task, harness) pairs differ from "
                     f"iteration {points[0]}'s (the curve compares checkpoints on the same tasks and harnesses)")
    return {"points": out, "train_ids": sorted(trained), "families": families}


# ---- the algorithm ----
# Per-task values are exact fractions (successes / episodes, then means of those), floats only for display and the
# intervals: a task on which two rows both score 1/2 must compare equal, and a float mean of 2/3, 2/3, 1/3, 1/3 is
# 0.49999999999999994, which a sign test would count as worse than 0.5. experiments/compare.py uses these two as well.
def exact_pair_means(episodes):
    """{(task_id, harness_id): Fraction(successes, episodes)}: a pair's success averaged over its samples (and over
    replicates, when their episodes are pooled)."""
    by_pair = {}
    for e in episodes:
        by_pair.setdefault((e["task_id"], e["harness_id"]), []).append(int(bool(e["success"])))
    return {k: Fraction(sum(v), len(v)) for k, v in by_pair.items()}


def exact_task_means(pairs, tasks):
    """[n_tasks] per-task pass@1 as Fractions, in `tasks` order: the mean over the task's pairs (keys (task, ...))."""
    by_task = {}
    for (t, _), v in pairs.items():
        by_task.setdefault(t, []).append(v)
    return [sum(by_task[t], Fraction(0)) / len(by_task[t]) for t in tasks]


def mean(values):
    """The mean of exact values, as a float for the tables."""
    values = list(values)
    return float(sum(values, Fraction(0)) / len(values))


# ---- held-out pairs split by distance and by task family ----
# experiments/compare.py splits its In-Space column with these as well (one copy: compare.py imports this file, not
# the other way round).
def hamming(a, b):
    """d_H(a, b) = sum_c [a(c) != b(c)]: the components on which two harness ids of the space differ."""
    la, lb = levels_of(a), levels_of(b)
    return sum(la[c] != lb[c] for c in COMPONENTS)


def distance_to(harness, train_ids):
    """A harness's Hamming distance to a training set: to the set's nearest member in the space (an out-of-space id
    such as X-pydantic-ai has no distance); None when no member is in the space, or the harness itself is not."""
    in_space = [h for h in train_ids if levels_of(h) is not None]
    if not in_space or levels_of(harness) is None:
        return None
    return min(hamming(harness, h) for h in in_space)


def pairs_by_distance(pairs, train_ids):
    """{(task, harness): value} -> {d: the pairs whose harness lies at Hamming distance d from train_ids}, by
    increasing d; None when some harness has no distance (a training set with no harness of the space, or a
    harness outside it)."""
    at, distance = {}, {}
    for (task, h), v in pairs.items():
        if h not in distance:  # once per harness, not once per (task, harness) pair
            distance[h] = distance_to(h, train_ids)
        d = distance[h]
        if d is None:
            return None
        at.setdefault(d, {})[(task, h)] = v
    return dict(sorted(at.items()))


def families_of(episodes):
    """{task_id: family} from the episodes that record one (04 writes it)."""
    return {e["task_id"]: e["family"] for e in episodes if e.get("family")}


def pairs_by_family(pairs, families):
    """{(task, ...): value} -> {family: the pairs of its tasks}, families in name order; None when some task has
    no family (episodes written before 04 recorded it)."""
    if not all(t in families for t, _ in pairs):
        return None
    out = {}
    for family in sorted({families[t] for t, _ in pairs}):
        out[family] = {k: v for k, v in pairs.items() if families[k[0]] == family}
    return out


def cell_of(pairs):
    """pass@1 of some {(task, ...): value} pairs with its 95% interval over tasks (the independent units)."""
    tasks = sorted({t for t, _ in pairs})
    ci, method = pass1_ci([float(x) for x in exact_task_means(pairs, tasks)])
    return {"pass@1": mean(pairs.values()), "ci95": ci, "ci_method": method, "tasks": len(tasks),
            "pairs": len(pairs)}


def how_episodes_end(episodes):
    """What RL changes on the way to a success: solved, submitted a wrong answer, or never submitted (turn budget,
    unparsable replies, failing tool calls), with the parse errors per model turn and tool errors per episode."""
    n, turns = len(episodes), sum(e["turns"] for e in episodes)
    submitted = [e for e in episodes if e["finish_reason"] == "submitted"]
    return {"episodes": n, "solved": sum(bool(e["success"]) for e in episodes) / n,
            "submitted_wrong": sum(not e["success"] for e in submitted) / n,
            "not_submitted": 1 - len(submitted) / n,
            "parse_errors_per_turn": sum(e["parse_errors"] for e in episodes) / max(turns, 1),
            "tool_errors_per_episode": sum(e["tool_errors"] for e in episodes) / n}


def paired(after, before):
    """Paired change over tasks (exact per-task values): mean of the per-task differences, tasks better / worse,
    exact sign test."""
    d = [a - b for a, b in zip(after, before)]  # [n_tasks] Fractions: a tie is exactly 0
    better, worse = sum(x > 0 for x in d), sum(x < 0 for x in d)
    return {"diff": mean(d), "better_tasks": better, "worse_tasks": worse, "sign_test_p": sign_test(better, worse)}


def curve_of(points):
    """Per checkpoint and line: pass@1 (mean over the line's pairs), 95% interval over tasks, change since 0."""
    rows = []
    start = min(points)
    for t in sorted(points):
        row = {"iteration": t}
        for line in ("trained", "held-out"):
            pairs = points[t][line]
            tasks = sorted({task for task, _ in pairs})
            v = exact_task_means(pairs, tasks)  # [n_tasks] a task's pass@1 over the line's harnesses
            ci, method = pass1_ci([float(x) for x in v], 0, 0)  # exact / Korn-Graubard: no resampling
            since_start = None  # the first checkpoint is the start
            if t != start:
                since_start = paired(v, exact_task_means(points[start][line], tasks))
            row[line] = {"pass@1": mean(pairs.values()), "ci95": ci, "ci_method": method,
                         "tasks": len(tasks), "harnesses": len({h for _, h in pairs}),
                         "since_start": since_start, "ends": points[t]["ends"][line]}
        rows.append(row)
    return rows


def between(ref, other):
    """Held-out pass@1 of `other` minus `ref` at each checkpoint both have, paired over tasks."""
    out = []
    for t in sorted(set(ref) & set(other)):
        tasks = sorted({task for task, _ in ref[t]["held-out"]})
        if set(ref[t]["held-out"]) != set(other[t]["held-out"]):
            fail(f"iteration {t}: the methods' held-out (task, harness) pairs differ (not the same evaluation)")
        out.append({"iteration": t, **paired(exact_task_means(other[t]["held-out"], tasks),
                                             exact_task_means(ref[t]["held-out"], tasks))})
    return out


def held_out_by_distance(method):
    """The held-out line at each checkpoint split by each held-out harness's Hamming distance to the method's OWN
    training set (the base harness alone for single: distances 1-5; the OA-18 for harness-scaling: 1-2). Does the
    gain reach the harnesses far from what the method trained on, or only the near ones?
    -> [{"iteration", "distances": [{distance, pass@1, ci95, ..., harness_ids}]}], or None for a method trained on
    no harness of the space."""
    rows = []
    for t, point in sorted(method["points"].items()):
        at = pairs_by_distance(point["held-out"], method["train_ids"])
        if at is None:
            return None
        rows.append({"iteration": t,
                     "distances": [{"distance": d, **cell_of(pairs), "harness_ids": sorted({h for _, h in pairs})}
                                   for d, pairs in at.items()]})
    return rows


def held_out_by_family(method):
    """The held-out line per task family at the first and the last checkpoint, with the paired change between them
    over the family's tasks (exact per-task values, exact sign test): which families RL improved under harnesses
    it never saw. -> [{family, tasks, first, last, change}], or None when the episodes record no family."""
    points = method["points"]
    first, last = min(points), max(points)
    before = pairs_by_family(points[first]["held-out"], method["families"])
    after = pairs_by_family(points[last]["held-out"], method["families"])
    if before is None or after is None:
        return None
    out = []
    for family, pairs in before.items():  # every checkpoint has the same (task, harness) pairs (load_method)
        tasks = sorted({t for t, _ in pairs})
        change = paired(exact_task_means(after[family], tasks), exact_task_means(pairs, tasks))
        out.append({"family": family, "tasks": len(tasks),
                    "first": {"iteration": first, **cell_of(pairs)},
                    "last": {"iteration": last, **cell_of(after[family])},
                    "change": change if last != first else None})  # a curve of one checkpoint: no change
    return out


def with_interval(x):
    """'pass@1 [lo, hi]' in %."""
    lo, hi = x["ci95"]
    return f"{100 * x['pass@1']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def change_text(c):
    """A paired change in points: '+4.7 (9 / 3, p 0.15)' (tasks better / worse, p of the sign test)."""
    return f"{100 * c['diff']:+.1f} ({c['better_tasks']} / {c['worse_tasks']}, p {c['sign_test_p']:.2g})"


def cell(x):
    c = x["since_start"]
    return with_interval(x) + (f" | {change_text(c)}" if c else " | start")


def markdown(report):
    ref = next(iter(report["methods"]))
    lines = ["pass@1 in % [95% interval over tasks], greedy, on the same test tasks at every checkpoint. trained = "
             "under the method's own training harnesses; held-out = under the In-Space evaluation set, which no "
             "method trained on. Δ0 = paired change since iteration 0 in points (tasks better / worse, p of the "
             "exact two-sided sign test).", "",
             "| method | iteration | trained | Δ0 | held-out | Δ0 |", "| --- | --- | --- | --- | --- | --- |"]
    for name, m in report["methods"].items():
        for row in m["curve"]:
            lines.append(f"| {name} | {row['iteration']} | {cell(row['trained'])} | {cell(row['held-out'])} |")
    lines += ["", "How the episodes end (share of episodes; errors per model turn / per episode):", "",
              "| method | iteration | harnesses | solved | submitted wrong | never submitted | parse errors / turn | "
              "tool errors / episode |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, m in report["methods"].items():
        for row in m["curve"]:
            for line in ("trained", "held-out"):
                e = row[line]["ends"]
                lines.append(f"| {name} | {row['iteration']} | {line} | {100 * e['solved']:.1f}% | "
                             f"{100 * e['submitted_wrong']:.1f}% | {100 * e['not_submitted']:.1f}% | "
                             f"{e['parse_errors_per_turn']:.2f} | {e['tool_errors_per_episode']:.2f} |")
    for name, rows in report["held_out_vs_reference"].items():
        lines += ["", f"Held-out pass@1, {name} minus {ref}, paired over tasks:", "",
                  "| iteration | Δ points | tasks better / worse | sign test p |", "| --- | --- | --- | --- |"]
        lines += [f"| {r['iteration']} | {100 * r['diff']:+.1f} | {r['better_tasks']} / {r['worse_tasks']} | "
                  f"{r['sign_test_p']:.2g} |" for r in rows]
    return "\n".join(lines + distance_markdown(report) + family_markdown(report)) + "\n"


def distance_markdown(report):
    """The table of held_out_by_distance: a row per method and checkpoint, a column per distance. -> lines."""
    methods = {name: m for name, m in report["methods"].items() if m["held_out_by_distance"]}
    if not methods:
        return []
    ds = sorted({c["distance"] for m in methods.values() for row in m["held_out_by_distance"]
                 for c in row["distances"]})
    lines = ["", "## Held-out by Hamming distance to the method's own training set", "",
             "Held-out pass@1 in % [95% interval over tasks] on the held-out harnesses at Hamming distance d from the "
             "nearest harness the method trained on (its own training set: the base harness alone for single, the "
             "OA-18 for harness-scaling); (N h): the held-out harnesses at d. Not paired across methods: each "
             "method's harnesses at d are its own.", "",
             "| method | iteration | " + " | ".join(f"d = {d}" for d in ds) + " |",
             "| --- | --- |" + " --- |" * len(ds)]
    for name, m in methods.items():
        for row in m["held_out_by_distance"]:
            cells = {c["distance"]: f"{with_interval(c)} ({len(c['harness_ids'])} h)" for c in row["distances"]}
            lines.append(f"| {name} | {row['iteration']} | " + " | ".join(cells.get(d, "-") for d in ds) + " |")
    return lines


def family_markdown(report):
    """The table of held_out_by_family: a row per method, a column per family (first -> last checkpoint, paired
    change). -> lines."""
    methods = {name: m for name, m in report["methods"].items() if m["held_out_by_family"]}
    if not methods:
        return []
    first = next(iter(methods.values()))["held_out_by_family"]
    families = [(c["family"], c["tasks"]) for c in first]  # the same tasks in every method (between() checks)
    lines = ["", "## Held-out by task family", "",
             "Held-out pass@1 in % per task family at the method's first → last checkpoint, then the paired change "
             "over the family's tasks in points (tasks better / worse, p of the exact two-sided sign test). The "
             "intervals are in the JSON.", "",
             "| method | iterations | " + " | ".join(f"{f} ({n} tasks)" for f, n in families) + " |",
             "| --- | --- |" + " --- |" * len(families)]
    for name, m in methods.items():
        cells = []
        for c in m["held_out_by_family"]:
            text = f"{100 * c['first']['pass@1']:.1f} → {100 * c['last']['pass@1']:.1f}"
            cells.append(text + (f": {change_text(c['change'])}" if c["change"] else ""))
        c = m["held_out_by_family"][0]
        lines.append(f"| {name} | {c['first']['iteration']} → {c['last']['iteration']} | " + " | ".join(cells) + " |")
    return lines


def plot(report, path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[transfer_curve] matplotlib not installed: no PNG (the markdown table has the numbers)")
        return
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for i, (name, m) in enumerate(report["methods"].items()):
        for line, style in (("trained", "o-"), ("held-out", "s--")):
            xs = [r["iteration"] + 0.08 * i for r in m["curve"]]  # nudged apart so the intervals do not overlap
            ys = [100 * r[line]["pass@1"] for r in m["curve"]]
            err = np.array([[100 * (r[line]["pass@1"] - r[line]["ci95"][0]), 100 * (r[line]["ci95"][1] -
                                                                                 r[line]["pass@1"])]
                            for r in m["curve"]]).T.clip(min=0)
            ax.errorbar(xs, ys, yerr=err, fmt=style, color=f"C{i}", capsize=3, label=f"{name}: {line}")
    ax.set_xlabel("RL iterations")
    ax.set_ylabel("pass@1 (%), greedy, 95% interval")
    ax.legend(fontsize=8)
    ax.set_title("trained vs held-out harnesses along training", fontsize=10)
    fig.tight_layout()
    tmp = path.with_name(path.stem + ".tmp.png")
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, path)


def transfer_curve(args):
    items = []
    for item in args.items:
        name, sep, runs = item.partition("=")
        if not sep or not name or not runs:
            fail(f"{item!r}: expected NAME=RUN[,RUN...]")
        items.append((name, [Path(r) for r in runs.split(",") if r]))
    eval_ids = set(harness_ids(args.eval_set))
    methods = {name: load_method(name, runs, eval_ids) for name, runs in items}
    ref = items[0][0]
    report = {"eval_set": str(args.eval_set), "eval_ids": sorted(eval_ids),
              "methods": {name: {"runs": [str(r) for r in runs], "curve": curve_of(methods[name]["points"]),
                                 "train_ids": methods[name]["train_ids"],
                                 "held_out_by_distance": held_out_by_distance(methods[name]),
                                 "held_out_by_family": held_out_by_family(methods[name])}
                          for name, runs in items},
              "held_out_vs_reference": {name: between(methods[ref]["points"], methods[name]["points"])
                                        for name, _ in items[1:]}}
    out = Path(args.out)
    write_atomic(out.with_suffix(".md"), markdown(report))
    plot(report, out.with_suffix(".png"))
    write_atomic(out.with_suffix(".json"), json.dumps(report, indent=2))
    print(markdown(report))


def main(argv=None):
    args = parse_args(argv)
    with locked(Path(args.out).parent / "run.lock"):  # one writer of the folder at a time
        transfer_curve(args)


if __name__ == "__main__":
    main()
