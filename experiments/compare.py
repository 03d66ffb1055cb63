"""Compare runs: the paper's table across policies, on common ground, with paired differences to a reference row.

06 evaluates one policy and leaves RUN/eval/LABEL/{summary.json, base.jsonl, inspace.jsonl, ...}; this program
reads those folders of several runs, checks that every row was scored on the same ground (the same tasks, the same
(task, harness) pairs, samples and settings), and writes one table: pass@1 of every row with its 95% interval, and
each row's paired difference to the reference row, with a paired bootstrap interval over tasks and an exact sign
test on the tasks where the two differ (per-task values are exact fractions: a tie is a tie), and each column's
minimum detectable difference from that exact test. Then In-Space split two ways, a table each: by the Hamming
distance of each evaluation harness to the row's own training set, and by task family. With --experiment (an
experiment folder of pipeline.py) the table also says what each method spent (rollout episodes, minibatches,
optimizer steps, wall time): the one writer of that file.

    python experiments/compare.py runs/default runs/single-harness
    python experiments/compare.py base=runs/exp/base/eval/final \
        oa=runs/exp/oa-s0/eval/final,runs/exp/oa-s1/eval/final --reference base --out runs/exp/comparison
    python experiments/compare.py warm-start=runs/exp/warm-start/eval/warm-start \
        harness-scaling=runs/exp/harness-scaling/eval/harness-scaling --reference harness-scaling \
        --experiment runs/exp --out runs/exp/comparison      # as pipeline.py calls it: + the compute table

ITEM: RUN (one row per label of its eval_summary.json) or [NAME=]EVALDIR[,EVALDIR...] (RUN/eval/LABEL folders;
several = seed replicates of one method, one row: a pair's success is its mean over samples, then replicates).
Common ground, checked: the splits every row has; the unseen-syntax column without the external harnesses any row
trained on (X-shell, X-react: a row trained inside one); then every row must have the same settings (SAME_CONFIG)
and the same (task, harness) pairs in every split, and a row's replicates the same evaluation set. A framework
column whose harness a row trained in (its train_ids: a black-box baseline trained inside pydantic-ai) keeps its
pairs and is marked "trained in" in that row: not a transfer figure.

Reads   EVALDIR/summary.json (train_ids, splits, config), EVALDIR/<split>.jsonl   (06)
        --experiment EXP: EXP/experiment_config.json, and each method's run folder: iter_*/rollouts.jsonl,
        iter_*/train_log.jsonl, sft/, assignment.jsonl, train_harnesses.jsonl, step_times.json
Writes  --out PREFIX: PREFIX.md, PREFIX.json (written last)
"""
import argparse
import contextlib
import json
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: common/, experiments/

from common.intervals import CI_NOTE, bootstrap_ci, fmt, pass1_ci, sign_test
from common.plumbing import fail, locked, read_json, read_jsonl, write_atomic
from common.schemas import FRAMEWORKS, SPLIT_TITLES, SPLITS, levels_of
from experiments import figure
from experiments.ledger import compute_of, read_records
# per-task values as exact fractions (a tie is a tie), and the splits of held-out pairs by Hamming distance and by
# task family: one copy for both programs that compare tasks
from experiments.transfer_curve import (cell_of, exact_pair_means, exact_task_means, families_of, mean,
                                        pairs_by_distance, pairs_by_family, transfer_curve)
from experiments.transfer_curve import distance_to, hamming  # noqa: F401 (compare.hamming for readers, tests)

# the columns' short names (SPLITS, FRAMEWORKS and SPLIT_TITLES: common/schemas.py, as 06 writes them)
SPLIT_NAMES = {"base": "Base", "inspace": "In-Space", "smolagents-native": "smolagents native",
               "pydantic-ai": "pydantic-ai", "external": "Unseen syntax", "smolagents": "smolagents text"}
# rows must agree on these (the engine too: an hf row and a vLLM row, or bf16 and fp32, or two context lengths,
# sample different episodes from the same weights)
SAME_CONFIG = ["samples", "temperature", "max_turns", "max_new_tokens", "backend", "dtype", "max_model_len"]


# The tables a ledger makes (--ledger): name -> (reference row, rows), each a method's records (experiments/ledger.py);
# a table is written once its reference and one more row have records. The policy before SFT is "untrained" (toy: random
# weights) or "zero-shot" (a pretrained model); "+ppo": the method trained with 05 --algo ppo (in main: its Δ to
# GRPO's harness-scaling; in ppo: the paper's comparison within PPO).
TABLES = {"start": ("warm-start", ["untrained", "zero-shot", "warm-start"]),  # the policies before RL
          "main": ("harness-scaling", ["untrained", "zero-shot", "warm-start", "harness-scaling", "single",
                                       "blackbox-sft", "blackbox-rl", "harness-scaling+ppo", "single+ppo"]),
          "selection": ("harness-scaling", ["harness-scaling", "random18"]),
          "assignment": ("harness-scaling", ["harness-scaling", "random-assign"]),
          "k": ("harness-scaling", ["k1", "harness-scaling", "k5"]),
          "ppo": ("harness-scaling+ppo", ["harness-scaling+ppo", "single+ppo", "harness-scaling", "single"])}
CURVE_ROWS = ["harness-scaling", "single", "harness-scaling+ppo", "single+ppo"]  # the curve's lines (records' curve/)


# ----------------------------------------------------------------------------- Args
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_argument_group("the rows")
    g.add_argument("items", nargs="*", metavar="ITEM",
                   help="RUN (one row per label of its eval_summary.json) or [NAME=]EVALDIR[,EVALDIR...] "
                        "(RUN/eval/LABEL folders; several = seed replicates of one method, one row)")
    g.add_argument("--reference", default=None, help="the row the paired differences are taken to "
                                                     "(default: the first row)")
    g = p.add_argument_group("the paired bootstrap of the differences")
    g.add_argument("--seed", type=int, default=0, help="seed of the resampling (a table is reproducible)")
    g.add_argument("--bootstrap", type=int, default=1000, help="resamples for the 95%% interval (more: a steadier "
                   "interval edge)")
    g = p.add_argument_group("outputs")
    g.add_argument("--experiment", default=None, metavar="EXP",
                   help="an experiment folder of pipeline.py: add what each of its methods spent, and its settings")
    g.add_argument("--out", default=None, metavar="PREFIX", help="also write PREFIX.md and PREFIX.json")
    g.add_argument("--ledger", default=None, metavar="LEDGER", help="instead of ITEMs: every table of a results "
                   "ledger (experiments/ledger.py) from its records alone, PREFIX-<table>.{md,json} and "
                   "PREFIX-transfer_curve.*")
    args = p.parse_args(argv)
    if bool(args.items) == bool(args.ledger):
        p.error("give ITEMs or --ledger LEDGER (with --out PREFIX), not both")
    if args.ledger and not args.out:
        p.error("--ledger needs --out PREFIX (where the tables go)")
    return args


def split_title(split, summaries, ids):
    """Column title: a framework column by the framework and version its episodes recorded (the first two words of
    "smolagents 1.26.0 (native tool calls)"), the unseen-syntax column by its harness ids on common ground."""
    fws = sorted({" ".join(s["splits"][split]["framework"].split()[:2]) for s in summaries
                  if (s["splits"].get(split) or {}).get("framework")})
    return SPLIT_TITLES[split].format(fw=" / ".join(fws) or split.removesuffix("-native"), ids=", ".join(ids))


# ---- input checking ----
# Every file is checked as it is read: bad input stops with one line naming the file, the line and the field
# (exit 2), before anything is written.
def compare_rows(items):
    """ITEMs -> rows {name, evaldirs, summaries}: a RUN gives one row per label of its eval_summary.json;
    [NAME=]EVALDIR[,EVALDIR...] gives one row (several EVALDIRs: seed replicates of one method)."""
    rows = []
    for item in items:
        name, _, dirs = item.partition("=") if "=" in item else ("", "", item)
        paths = [Path(d) for d in dirs.split(",") if d]
        if len(paths) == 1 and not name and not (paths[0] / "summary.json").is_file():  # a RUN folder
            run = paths[0]
            summaries = read_json(run / "eval_summary.json", f" (run 06_evaluate.py --run {run} first, or give a "
                                                            "RUN/eval/LABEL folder with summary.json)")
            rows += [{"name": f"{run.name}/{label}", "evaldirs": [run / "eval" / label],
                      "summaries": [checked_summary(s, f"{run / 'eval_summary.json'}, label {label!r}")]}
                     for label, s in summaries.items()]
        elif paths:
            rows.append({"name": name or f"{paths[0].parent.parent.name}/{paths[0].name}", "evaldirs": paths,
                         "summaries": [checked_summary(read_json(d / "summary.json", " (an EVALDIR is a RUN/eval/"
                                                                 "LABEL folder 06 wrote)"), d / "summary.json")
                                       for d in paths]})
        else:
            fail(f"{item!r}: no folder given")
    if not rows:
        fail("no rows (the runs' eval_summary.json files are empty)")
    return rows


def checked_summary(summary, where):
    """A summary as 06 writes it: splits, train_ids, and the settings every row must share (config)."""
    if not isinstance(summary, dict) or not isinstance(summary.get("splits"), dict):
        fail(f"{where}: field 'splits' is missing (not a summary 06 wrote)")
    if not isinstance(summary.get("train_ids"), list):
        fail(f"{where}: field 'train_ids' is missing (an older 06 wrote it: evaluate the policy again)")
    config = summary.get("config") if isinstance(summary.get("config"), dict) else {}
    for field in SAME_CONFIG:
        if field not in config:
            fail(f"{where}: field 'config.{field}' is missing (an older 06 wrote it: evaluate the policy again)")
    return summary


def load_evaldir(evaldir, summary, excluded):
    """One EVALDIR -> ({split: {(task, harness): success averaged over samples, a Fraction}}, {task: family}); unseen
    syntax without `excluded`. The family is read where the episodes record one (04 writes it)."""
    pairs, families = {}, {}
    for split in summary["splits"]:
        episodes = [e for _, e in read_jsonl(evaldir / f"{split}.jsonl", required=("task_id", "harness_id", "success"))
                    if not (split == "external" and e["harness_id"] in excluded)]
        pairs[split] = exact_pair_means(episodes)
        families.update(families_of(episodes))
    return pairs, families


def experiment_runs(exp):
    """An experiment folder of pipeline.py -> ({"METHOD (seed S)": run folder}, its settings): the settings are
    its experiment_config.json less the method list (the rows show it), plus its evaluation set's path."""
    config = read_json(exp / "experiment_config.json", " (an experiment folder pipeline.py made)")
    for field in ("methods", "seeds"):
        if not isinstance(config, dict) or not isinstance(config.get(field), list):
            fail(f"{exp / 'experiment_config.json'}: field '{field}' (a list) is missing")
    seeds = config["seeds"]
    runs = {f"{m} (seed {s})": exp / (m if len(seeds) == 1 else f"{m}-seed{s}") for m in config["methods"]
            for s in seeds}
    for run in runs.values():  # every method's run has its training set (02); a black-box one no assignment (03)
        if not (run / "train_harnesses.jsonl").is_file():
            fail(f"{run / 'train_harnesses.jsonl'}: file not found (the experiment's runs are not all there)")
    settings = {k: v for k, v in config.items() if k != "methods"}
    return runs, dict(settings, eval_harnesses=str(exp / "eval_harnesses.jsonl"))


# ---- the algorithm ----
# ----------------------------------------------------------------------------- common ground, paired differences
def first_difference(what, a_name, a, b_name, b):
    """'WHAT differ: A has X, B does not' for the first element in one set and not the other; None if equal."""
    if a - b:
        return f"{what} differ: {a_name} has {min(a - b)}, {b_name} does not"
    if b - a:
        return f"{what} differ: {b_name} has {min(b - a)}, {a_name} does not"
    return None

def ground_difference(a_name, a, b_name, b, splits):
    """How two rows (or replicates) first differ: a setting, else a split's harness ids, tasks, or pairs."""
    for f in SAME_CONFIG:
        if a["config"][f] != b["config"][f]:
            return f"{f} differs: {a_name} has {a['config'][f]}, {b_name} has {b['config'][f]}"
    for split in splits:
        mine, theirs = set(a["pairs"][split]), set(b["pairs"][split])  # (task, harness) pairs
        for what, x, y in (("harness ids", {h for _, h in mine}, {h for _, h in theirs}),
                           ("tasks", {t for t, _ in mine}, {t for t, _ in theirs}),
                           ("(task, harness) pairs", mine, theirs)):
            msg = first_difference(f"{SPLIT_NAMES[split]} {what}", a_name, x, b_name, y)
            if msg:
                return msg
    return None

def min_detectable_tasks(n, alpha=0.05):
    """The fewest discordant tasks k, all one way, for which the exact two-sided sign test gives p <= alpha: p(k, 0)
    = 2 / 2^k, so k = 6 at 5% (p 0.031; 5 gives 0.0625) once n >= 6; None when n tasks are too few. As a
    difference in pass@1, k / n is the smallest that can be significant over n tasks, a discordant task counted
    whole (from 0 to 1)."""
    return next((k for k in range(1, n + 1) if sign_test(k, 0) <= alpha), None)


def table(items, reference, args):
    """One table across policies on common ground (the same tasks, harnesses, samples and settings in every row),
    with paired differences of pass@1 to a reference row. -> (report, markdown)."""
    rows, splits, excluded = common_ground(compare_rows(items))
    names = [r["name"] for r in rows]
    if reference is not None and reference not in names:
        fail(f"--reference {reference!r}: no such row (rows: {', '.join(names)})")
    ref = rows[names.index(reference)] if reference is not None else rows[0]
    ground = {"splits": {s: column_ground(ref["pairs"][s]) for s in splits},
              "excluded_external": [h for h in excluded if levels_of(h) is None and h not in FRAMEWORKS.values()],
              **ref["config"]}
    report = {"reference": ref["name"], "common_ground": ground, "rows": paired_rows(rows, ref, splits, args)}
    md = compare_markdown(report, splits, [s for r in rows for s in r["summaries"]])
    if "inspace" in splits:  # the In-Space column split two ways, each in a table of its own
        for r, out in zip(rows, report["rows"]):
            own = [sorted(h for h in x["train_ids"] if levels_of(h) is not None) for x in r["replicates"]]
            out.update(own_training_sets=own, inspace_by_distance=by_distance(r),
                       inspace_by_family=by_family(r, ref, args))
        md += distance_markdown(report) + family_markdown(report)
    return report, md


def column_ground(pairs):
    """A column's common ground: its tasks, pairs and harness ids, and its minimum detectable difference from the
    exact sign test over its tasks (the paired units)."""
    n = len({t for t, _ in pairs})
    k = min_detectable_tasks(n)
    return {"tasks": n, "pairs": len(pairs), "harness_ids": sorted({h for _, h in pairs}),
            "min_detectable_tasks": k, "min_detectable": None if k is None else k / n}


def write_outputs(prefix, report, md):
    write_atomic(f"{prefix}.md", md)
    write_atomic(f"{prefix}.json", json.dumps(report, indent=2) + "\n")  # last: a pipeline's done marker
    print(f"[compare] wrote {prefix}.md and {prefix}.json")


def compare(args):
    """The table of the ITEMs; with --experiment, what each method spent."""
    runs, settings = experiment_runs(Path(args.experiment).resolve()) if args.experiment else (None, None)
    report, md = table(args.items, args.reference, args)
    if runs is not None:
        report.update(compute={name: compute_of(run) for name, run in runs.items()}, settings=settings)
        md += compute_markdown(report["compute"])
    print(md)
    if args.out:
        write_outputs(args.out, report, md)


def common_ground(rows):
    """Every row's pairs on common ground: unseen syntax without the external harnesses any row trained on, a row's
    replicates averaged (one evaluation set), then the splits every row has, with the same settings and (task,
    harness) pairs in every row. -> (rows with config and pairs, splits, excluded harness ids)."""
    for r in rows:
        r["train_ids"] = sorted({h for s in r["summaries"] for h in s["train_ids"]})
    # common ground 1: the unseen-syntax column keeps only the external harnesses that no row trained on
    excluded = sorted({h for r in rows for h in r["train_ids"]})
    for r in rows:
        reps = []
        for d, s in zip(r["evaldirs"], r["summaries"]):
            pairs, families = load_evaldir(d, s, excluded)
            reps.append({"config": {f: s["config"][f] for f in SAME_CONFIG}, "pairs": pairs, "families": families,
                         "train_ids": s["train_ids"]})
        for d, rep in zip(r["evaldirs"][1:], reps[1:]):  # seed replicates: one evaluation set
            first = r["evaldirs"][0]
            msg = first_difference("splits", first, set(reps[0]["pairs"]), d, set(rep["pairs"])) or \
                ground_difference(first, reps[0], d, rep, reps[0]["pairs"])
            if msg:
                fail(f"row {r['name']}: its replicates must share one evaluation set: {msg}")
        r["config"] = reps[0]["config"]  # a pair's success: mean over samples, then over replicates (exact)
        r["pairs"] = {sp: {k: sum(x["pairs"][sp][k] for x in reps) / len(reps) for k in v}
                      for sp, v in reps[0]["pairs"].items()}
        r["replicates"] = reps  # kept apart for the split by distance: each seed's own training set
        r["families"] = {t: f for x in reps for t, f in x["families"].items()}
    # common ground 2: the splits every row has, with the same settings and (task, harness) pairs in every row
    splits = [s for s in SPLITS if all(r["pairs"].get(s) for r in rows)]
    for s in SPLITS:
        if s not in splits and any(s in x for r in rows for x in r["pairs"]):
            print(f"[compare] note: {SPLIT_NAMES[s]} left out of the table: some row has no episodes in it on "
                  f"common ground ({', '.join(r['name'] for r in rows if not r['pairs'].get(s))})")
    if not splits:
        fail("no split is common to every row")
    for r in rows[1:]:
        msg = ground_difference(f"row {rows[0]['name']}", rows[0], f"row {r['name']}", r, splits)
        if msg:
            fail(f"rows are not on common ground: {msg}")
    return rows, splits, excluded


def paired_difference(mine, theirs, args):
    """The paired difference of two rows over the same tasks, from exact per-task values (lists of Fractions):
    d = mean over tasks of (row's per-task pass@1 - reference's), its interval by the paired bootstrap (the same
    resampled tasks for both rows, a task's harnesses kept together), and the exact sign test on the discordant
    tasks (better vs worse; a tie, exactly equal values, is neither). Identical rows say so instead of printing a
    zero-width interval."""
    d = [a - b for a, b in zip(mine, theirs)]  # [n_tasks] Fractions
    better, worse = sum(x > 0 for x in d), sum(x < 0 for x in d)
    identical = better + worse == 0
    return {"diff_vs_reference": mean(d),
            "diff_ci95": None if identical else bootstrap_ci([float(x) for x in d], args.bootstrap, args.seed),
            "better_tasks": better, "worse_tasks": worse, "sign_test_p": sign_test(better, worse),
            "identical": identical}


def paired_rows(rows, ref, splits, args):
    """Each row's pass@1 per split with its interval, and its paired difference to the reference row."""
    out_rows = []
    for r in rows:
        res = {}
        for s in splits:
            tasks = sorted({t for t, _ in r["pairs"][s]})
            mine, theirs = (exact_task_means(x["pairs"][s], tasks) for x in (r, ref))  # [n_tasks] Fractions
            ci, method = pass1_ci([float(x) for x in mine], args.bootstrap, args.seed)
            diff = paired_difference(mine, theirs, args) if r is not ref else dict.fromkeys(
                ["diff_vs_reference", "diff_ci95", "better_tasks", "worse_tasks", "sign_test_p", "identical"])
            res[s] = {"pass@1": mean(r["pairs"][s].values()), "ci95": ci, "ci_method": method,
                      "pairs": len(r["pairs"][s]), "tasks": len(tasks), **diff,
                      "trained_in": FRAMEWORKS.get(s) in r["train_ids"]}  # not a transfer figure for this row
        out_rows.append({"name": r["name"], "evaldirs": [str(d) for d in r["evaldirs"]],
                         "policies": [s.get("policy") for s in r["summaries"]], "train_ids": r["train_ids"],
                         "inspace_ids": sorted({h for _, h in r["pairs"].get("inspace", {})}),
                         "task_ids": sorted({t for s in splits for t, _ in r["pairs"][s]}), "splits": res})
    return out_rows


# ----------------------------------------------------------------------------- In-Space by distance and by family
# levels_of, hamming, distance_to, pairs_by_distance, pairs_by_family and cell_of live in experiments/transfer_curve.py,
# which splits its held-out line the same two ways.
def by_distance(r):
    """A row's In-Space pass@1 split by each evaluation harness's distance to the row's OWN training set (its
    summaries' train_ids: the base alone for single, the OA-18 for harness-scaling, the warm start's set for the
    warm start). Replicate by replicate: each seed of random18 trains on its own draw, so one harness can lie at
    distance 1 from one seed's set and 2 from another's; a task's value at d is its mean over the (seed, harness)
    pairs at d. -> [{distance, pass@1, ci95, ..., harness_ids}], or None for a row trained on no harness of H."""
    at = {}  # d -> {(task, (replicate, harness)): value}
    for i, rep in enumerate(r["replicates"]):
        split = pairs_by_distance(rep["pairs"]["inspace"], rep["train_ids"])  # this seed's own distances
        if split is None:
            return None
        for d, pairs in split.items():
            at.setdefault(d, {}).update({(task, (i, h)): v for (task, h), v in pairs.items()})
    return [{"distance": d, **cell_of(p), "harness_ids": sorted({h for _, (_, h) in p})}
            for d, p in sorted(at.items())]


def by_family(r, ref, args):
    """A row's In-Space pass@1 per task family, with its paired difference to the reference over the family's tasks
    (both rows have the same pairs). -> [{family, pass@1, ci95, ..., diff_vs_reference, ...}], or None when the
    episodes record no family."""
    families = ref["families"]  # {task: family}: the same tasks in every row (common ground)
    split = pairs_by_family(r["pairs"]["inspace"], families)
    if split is None:
        return None
    theirs = ref["pairs"]["inspace"]
    out = []
    for family, mine in split.items():
        tasks = sorted({t for t, _ in mine})
        diff = paired_difference(exact_task_means(mine, tasks), exact_task_means(theirs, tasks), args) \
            if r is not ref else {"diff_vs_reference": None}
        out.append({"family": family, **cell_of(mine), **diff})
    return out


def distance_markdown(report):
    """The table of by_distance: a row per policy, a column per distance."""
    rows = [r for r in report["rows"] if r["inspace_by_distance"]]
    if not rows:
        return ""
    ds = sorted({c["distance"] for r in rows for c in r["inspace_by_distance"]})
    lines = ["", "## In-Space by Hamming distance to each row's own training set", "",
             "pass@1 in % [95% interval over tasks] on the In-Space harnesses at Hamming distance d from the nearest "
             "harness the row trained on (its own training set: the base harness alone for single, the OA-18 for "
             "harness-scaling, the base and its one-factor variants for the warm start and the black-box rows; each "
             "seed's distances to its own set); (N h): the evaluation harnesses at d. Not paired across rows: each "
             "row's harnesses at d are its own.", "",
             "| policy | training harnesses in H | " + " | ".join(f"d = {d}" for d in ds) + " |",
             "| --- | --- |" + " --- |" * len(ds)]
    for r in rows:
        cells = {c["distance"]: f"{fmt(c)} ({len(c['harness_ids'])} h)" for c in r["inspace_by_distance"]}
        own = r["own_training_sets"]  # per replicate, its training harnesses in H
        size = ", ".join(str(n) for n in sorted({len(ids) for ids in own}))
        size += " (a set per seed)" if len({tuple(ids) for ids in own}) > 1 else ""
        lines.append(f"| {r['name']}{replicates(r['evaldirs'])} | {size} | "
                     + " | ".join(cells.get(d, "-") for d in ds) + " |")
    return "\n".join(lines) + "\n"


def family_markdown(report):
    """The table of by_family: a row per policy, a value and a Δ column per family."""
    rows = [r for r in report["rows"] if r["inspace_by_family"]]
    if not rows:
        return ""
    ref = report["reference"]
    families = [(c["family"], c["tasks"]) for c in rows[0]["inspace_by_family"]]
    lines = ["", "## In-Space by task family", "",
             f"pass@1 in % [95% interval over the family's tasks] under the In-Space harnesses; Δ to {ref} in points, "
             "paired over the family's tasks, as above. Tasks: " + ", ".join(f"{f} {n}" for f, n in families) + ".",
             "", "| policy | " + " | ".join(f"{f} | Δ vs {ref}" for f, _ in families) + " |",
             "| --- |" + " --- | --- |" * len(families)]
    for r in rows:
        cells = [x for c in r["inspace_by_family"] for x in (fmt(c), delta_cell(c))]
        lines.append(f"| {r['name']}{replicates(r['evaldirs'])} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- what each method spent
def compute_markdown(compute):
    lines = ["", "## Compute per method", "",
             "| method | rollout episodes | minibatches | optimizer steps (with signal) | SFT demos | train s | eval s "
             "| tasks that saw all K |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, c in compute.items():
        if not c["minibatches"]:  # a method of the experiment that never trained: no row of zeros
            lines.append(f"| {name} | no update (not run, or a policy before RL) | - | - | - | - | - | - |")
            continue
        if c["tasks_saw_all_K"] is None:
            saw_all_k = "-"
        else:
            saw_all_k = f"{c['tasks_saw_all_K']} / {c['tasks_trained']}"
        lines.append(f"| {name} | {c['rollout_episodes']} | {c['minibatches']} | {c['optimizer_steps']} "
                     f"| {c['sft_demos']} | {c['train_s']} | {c['eval_s']} | {saw_all_k} |")
    return "\n".join(lines) + "\n"


def compare_markdown(report, splits, summaries):
    g, ref = report["common_ground"], report["reference"]
    shape = "; ".join(f"{SPLIT_NAMES[s]} {g['splits'][s]['tasks']} tasks x {len(g['splits'][s]['harness_ids'])} "
                      "harness(es)" for s in splits)
    left = f"; Unseen syntax leaves out {', '.join(g['excluded_external'])} (trained by a row)" \
        if g["excluded_external"] and "external" in splits else ""
    lines = [f"Common ground: {shape}; samples {g['samples']}, temperature {g['temperature']}, max_turns "
             f"{g['max_turns']}, max_new_tokens {g['max_new_tokens']}{left}.", CI_NOTE,
             f"Δ = paired difference of pass@1 to {ref} in points [95% paired bootstrap over tasks, a task's "
             "harnesses kept together] (tasks better / worse, p of the exact two-sided sign test on them).", "",
             "| policy | " + " | ".join(f"{split_title(s, summaries, g['splits'][s]['harness_ids'])} | Δ vs {ref}"
                                        for s in splits) + " |",
             "| --- |" + " --- | --- |" * len(splits)]
    for r in report["rows"]:
        cells = []
        for s in splits:
            x = r["splits"][s]
            cells += [fmt(x) + (" (trained in)" if x["trained_in"] else ""), delta_cell(x)]
        lines.append(f"| {r['name']}{replicates(r['evaldirs'])} | " + " | ".join(cells) + " |")
    mdd = []  # per column, from the exact sign test over its tasks (column_ground)
    for s in splits:
        c = g["splits"][s]
        if c["min_detectable"] is None:
            mdd.append(f"{SPLIT_NAMES[s]} none ({c['tasks']} tasks are too few)")
        else:
            mdd.append(f"{SPLIT_NAMES[s]} {100 * c['min_detectable']:.1f} ({c['min_detectable_tasks']} of "
                       f"{c['tasks']} tasks)")
    if any(x["trained_in"] for r in report["rows"] for x in r["splits"].values()):
        lines += ["", "(trained in): the row's policy trained inside this framework, so the cell is not a transfer "
                  "figure."]
    lines += ["", "Minimum detectable difference in points, per column: the fewest tasks that, all better (or all "
              "worse), reach p <= 0.05 in the exact two-sided sign test, over the column's tasks (a task counted "
              "whole, 0 to 1): " + "; ".join(mdd) + "."]
    return "\n".join(lines) + "\n"


def delta_cell(x):
    """A Δ cell: 'reference', 'identical on all N tasks', or 'Δ [interval] (better / worse, p)' in points."""
    if x["diff_vs_reference"] is None:
        return "reference"
    if x["identical"]:
        return f"identical on all {x['tasks']} tasks"
    lo, hi = x["diff_ci95"]
    return (f"{100 * x['diff_vs_reference']:+.1f} [{100 * lo:+.1f}, {100 * hi:+.1f}] "
            f"({x['better_tasks']} / {x['worse_tasks']}, p {x['sign_test_p']:.2g})")


def replicates(evaldirs):
    """A row's replicates as its name's suffix: a ledger's records (<method>/seed<s>/eval) by their seeds, so every
    row says how many seeds it averages ("single (seeds 0, 1)", "blackbox-sft (seed 0)"); other rows by their
    count when they have several."""
    seeds = [re.fullmatch(r"seed(\d+)", Path(d).parent.name) for d in evaldirs]
    if all(seeds):
        return f" (seed{'s' if len(seeds) > 1 else ''} {', '.join(s[1] for s in seeds)})"
    return f" ({len(evaldirs)} replicates)" if len(evaldirs) > 1 else ""


# ----------------------------------------------------------------------------- tables from a ledger
def ledger_tables(args):
    """--ledger LEDGER: its tables at PREFIX-<table>; a folder of ledgers (results/records): each one's at
    PREFIX/<ledger name>-<table>."""
    root, out = Path(args.ledger).resolve(), Path(args.out).resolve()
    ledgers = [root] if (root / "ground.json").is_file() else sorted(p.parent for p in root.glob("*/ground.json"))
    if not ledgers:
        fail(f"{root}: no ground.json in it or in its subfolders (not a ledger: experiments/ledger.py, "
             "pipeline.py --ledger)")
    read = []
    for ledger in ledgers:  # every ledger's records and curves are checked before any table is written
        methods, ground = read_records(ledger)
        curves = [r for m in CURVE_ROWS for r in methods.get(m, []) if (r / "curve").is_dir()]
        check_curves(curves)
        read.append((ledger, methods, ground, curves))
    for ledger, methods, ground, curves in read:
        tables_of(ledger, methods, ground, curves, out if ledger == root else out / ledger.name, args)


def tables_of(ledger, methods, ground, curves, prefix, args):
    """Every table of TABLES whose rows have records (read_records: {method: [record folder]}), from the records
    alone: a method's seeds are one row's replicates; then the transfer curve of the records in `curves`. Paths in
    the outputs are relative to the ledger."""
    with contextlib.chdir(ledger):
        for name, (reference, wanted) in TABLES.items():
            have = [m for m in wanted if m in methods]
            if reference not in have or len(have) < 2:
                print(f"[compare] {ledger.name} {name}: not enough records yet (rows with records: "
                      f"{', '.join(have) or '-'})")
                continue
            items = [f"{m}=" + ",".join(str(r.relative_to(ledger) / "eval") for r in methods[m]) for m in have]
            report, md = table(items, reference, args)
            records = {f"{m} (seed {r.name[4:]})": read_json(r / "record.json") for m in have for r in methods[m]}
            report.update(ground=ground, compute={k: v["compute"] for k, v in records.items()},
                          made={k: v.get("made") for k, v in records.items()})
            write_outputs(f"{prefix}-{name}", report, md + compute_markdown(report["compute"])
                          + made_markdown(report["made"]))
        # the transfer curve: a line per method and seed (the paper's claim should hold in every seed's line)
        lines = [f"{r.parent.name} {r.name}={r.relative_to(ledger)}" for r in curves]
        if lines:
            transfer_curve(argparse.Namespace(items=lines, eval_set="eval_harnesses.jsonl",
                                              out=f"{prefix}-transfer_curve"))
        if methods:
            summary_of(ledger, prefix, methods, args)


def check_curves(records):
    """The transfer curve's lines are drawn and paired on the same checkpoints and tasks: every record's curve/ must
    hold the same iter-NNN files on the same test tasks (its run's --curve-every and --curve-tasks, which are not
    common ground: ledger.CURVE_KEYS). Exit 2 naming both records otherwise."""
    first = None
    for r in records:
        points = sorted(p.name for p in (r / "curve").glob("iter-*.jsonl"))
        tasks = sorted({e["task_id"] for p in (r / "curve").glob("iter-*.jsonl")
                        for _, e in read_jsonl(p, required=("task_id",))})
        if first is None:
            first = (r, points, tasks)
        elif (points, tasks) != first[1:]:
            fail(f"{r / 'curve'}: its checkpoints ({', '.join(points)}) or tasks ({len(tasks)}) differ from "
                 f"{first[0] / 'curve'}'s ({', '.join(first[1])}; {len(first[2])} tasks): one ledger's curves "
                 "share --curve-every and --curve-tasks")


# ----------------------------------------------------------------------------- the answer first
# The paper's directions, each a paired comparison over tasks in one column: (the direction, the row the paper puts
# higher, the other row, the column, "higher" or "unchanged": the base harness should keep its pass@1).
DIRECTIONS = [("In-Space: harness-scaling > single", "harness-scaling", "single", "inspace", "higher"),
              ("black box: harness-scaling > black-box SFT", "harness-scaling", "blackbox-sft", "smolagents-native",
               "higher"),
              ("black box: black-box SFT > black-box RL", "blackbox-sft", "blackbox-rl", "smolagents-native",
               "higher"),
              ("OA-18 > Random-18", "harness-scaling", "random18", "inspace", "higher"),
              ("locality > random assignment", "harness-scaling", "random-assign", "inspace", "higher"),
              ("base harness about unchanged (harness-scaling vs warm start)", "harness-scaling", "warm-start", "base",
               "unchanged"),
              ("PPO, In-Space: harness-scaling > single", "harness-scaling+ppo", "single+ppo", "inspace", "higher")]
SUMMARY_ROWS = ["untrained", "zero-shot", "warm-start", "harness-scaling", "single", "blackbox-sft", "blackbox-rl",
                "random18", "random-assign", "harness-scaling+ppo", "single+ppo", "k1", "k5"]


def summary_of(ledger, prefix, methods, args):
    """PREFIX-summary.md and PREFIX-summary.svg: every row of the ledger in every column (a cell is a score), each
    of the paper's directions against its paired test, and the figure (experiments/figure.py). Run inside the ledger
    folder."""
    names = [m for m in SUMMARY_ROWS if m in methods] + sorted(set(methods) - set(SUMMARY_ROWS))
    report, _ = table([item_of(m, methods[m], ledger) for m in names], None, args)
    splits = list(report["rows"][0]["splits"])
    ground = report["common_ground"]["splits"]
    seeds = {m: [r.name[4:] for r in methods[m]] for m in names}
    lines = ["pass@1 (%), greedy, on " + "; ".join(f"{SPLIT_NAMES[s]} {ground[s]['tasks']} tasks x "
                                                   f"{len(ground[s]['harness_ids'])} harness(es)" for s in splits)
             + "; seeds averaged per task. (trained in): the row trained inside that framework, not a transfer "
             "figure.", "",
             "| policy | seeds | " + " | ".join(SPLIT_NAMES[s] for s in splits) + " |",
             "| --- | --- |" + " --- |" * len(splits)]
    for name, r in zip(names, report["rows"]):
        cells = [f"{100 * r['splits'][s]['pass@1']:.1f}" + (" (trained in)" if r["splits"][s]["trained_in"] else "")
                 for s in splits]
        lines.append(f"| {name} | {', '.join(seeds[name])} | " + " | ".join(cells) + " |")
    lines += ["", "Each of the paper's directions, paired over the column's tasks (Δ in points, the seeds averaged "
              "per task; tasks better / worse and p of the exact two-sided sign test; detectable: the fewest tasks "
              "all one way that reach p <= 0.05). A column where both rows score 0 is a floor; p > 0.05 is "
              "\"can't tell\".", "",
              "| the paper's direction | column | seeds | Δ | better / worse | p | detectable | at this scale "
              "| per seed: Δ (p) |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for title, high, low, split, kind in DIRECTIONS:
        if high not in methods or low not in methods:
            lines.append(f"| {title} | {SPLIT_NAMES[split]} | - | - | - | - | - | no records yet "
                         f"({', '.join(m for m in (high, low) if m not in methods)}) | - |")
            continue
        d, c = paired(high, methods[high], low, methods[low], ledger, split, args)
        per_seed = []
        for rec in methods[high]:
            other = [r for r in methods[low] if r.name == rec.name]  # the same seed of the other row
            if not other and len(methods[low]) == 1:
                other = methods[low]  # or its one seed
            if other and len(methods[high]) > 1:
                x, _ = paired(high, [rec], low, other, ledger, split, args)
                per_seed.append((rec.name[4:], x))
        seed_text = "; ".join(f"seed {s}: {100 * x['diff_vs_reference']:+.1f} (p {x['sign_test_p']:.2g})"
                              for s, x in per_seed) or "-"
        if len({x["diff_vs_reference"] > 0 for _, x in per_seed if x["diff_vs_reference"] != 0}) > 1:
            seed_text += ": the seeds disagree in sign"
        lines.append(f"| {title} | {SPLIT_NAMES[split]} | {', '.join(seeds[high])} vs {', '.join(seeds[low])} | "
                     f"{100 * d['diff_vs_reference']:+.1f} | {d['better_tasks']} / {d['worse_tasks']} | "
                     f"{d['sign_test_p']:.2g} | {detectable(c)} | {verdict(d, kind)} | {seed_text} |")
    write_atomic(f"{prefix}-summary.md", "\n".join(lines) + "\n")
    columns = [(s, f"{SPLIT_NAMES[s]} ({ground[s]['tasks']} tasks)") for s in splits]
    rows = []  # the figure's rows: (label, {column: (pass@1, low, high, trained in)}), in %
    for name, r in zip(names, report["rows"]):
        label = f"{name} ({len(seeds[name])} seed{'s' if len(seeds[name]) > 1 else ''})"
        cells = {}
        for s, x in r["splits"].items():
            low, high = x["ci95"]
            cells[s] = (100 * x["pass@1"], 100 * low, 100 * high, x["trained_in"])
        rows.append((label, cells))
    curve_json = Path(f"{prefix}-transfer_curve.json")
    curve = curve_lines(read_json(curve_json)) if curve_json.is_file() else None
    title = f"{ledger.name}: pass@1 of every method in every column"
    write_atomic(f"{prefix}-summary.svg", figure.svg(title, columns, rows, curve))
    print(f"[compare] wrote {prefix}-summary.md and {prefix}-summary.svg")


def item_of(method, records, ledger):
    return f"{method}=" + ",".join(str(r.relative_to(ledger) / "eval") for r in records)


def paired(high, high_records, low, low_records, ledger, split, args):
    """high's paired difference to low in one column (compare's table of the two rows, low the reference) -> (the
    difference, the column's common ground)."""
    report, _ = table([item_of(high, high_records, ledger), item_of(low, low_records, ledger)], low, args)
    return report["rows"][0]["splits"][split], report["common_ground"]["splits"][split]


def detectable(c):
    if c["min_detectable"] is None:
        return f"none ({c['tasks']} tasks)"
    return f"{100 * c['min_detectable']:.1f} ({c['min_detectable_tasks']} / {c['tasks']})"


def verdict(d, kind):
    """What a direction's paired test says: holds, the opposite, or can't tell (a floor: both rows 0 everywhere)."""
    if d["identical"] and d["pass@1"] == 0:
        return "floor (0 in both)"
    significant = d["sign_test_p"] <= 0.05
    if kind == "unchanged":
        if not significant:
            return "holds (no change at p <= 0.05)"
        return "changed: up" if d["diff_vs_reference"] > 0 else "changed: down"
    if not significant:
        return "can't tell"
    return "holds" if d["diff_vs_reference"] > 0 else "opposite"


def curve_lines(curve):
    """The transfer curve's harness-scaling and single lines, mean over seeds with the lowest and highest seed per
    iteration (the iterations every seed has), in %: experiments/figure.py's curve."""
    lines, n_seeds = {}, {}
    for method in CURVE_ROWS[:2]:
        seeds = [m["curve"] for name, m in curve["methods"].items() if name.rpartition(" ")[0] == method]
        if not seeds:
            continue
        n_seeds[method] = len(seeds)
        its = sorted(set.intersection(*({p["iteration"] for p in c} for c in seeds)))  # every seed has these
        lines[method] = {}
        for part in ("trained", "held-out"):
            points = []
            for it in its:
                vals = [100 * p[part]["pass@1"] for c in seeds for p in c if p["iteration"] == it]  # one per seed
                points.append((it, mean(vals), min(vals), max(vals)))
            lines[method][part] = points
    if not lines:
        return None
    tasks = next(p["trained"]["tasks"] for m in curve["methods"].values() for p in m["curve"])
    return {"lines": lines, "seeds": n_seeds, "tasks": tasks}


def made_markdown(made):
    lines = ["", "## How each record was made", "", "| record | commit | date | machine | wall s |",
             "| --- | --- | --- | --- | --- |"]
    for k, m in made.items():
        if not m:
            lines.append(f"| {k} | - | - | - | - |")
            continue
        commit = m["commit"] + (" (changed tree)" if m["dirty"] else "")
        lines.append(f"| {k} | {commit} | {m['date']} | {m['machine']} | {m['wall_s']} |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    with locked(Path(args.out).parent / "run.lock") if args.out else contextlib.nullcontext():  # one writer
        if args.ledger:
            ledger_tables(args)
        else:
            compare(args)


if __name__ == "__main__":
    main()
