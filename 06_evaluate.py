"""Stage 06: pass@1 of a policy on the base, held-out in-space and out-of-space harnesses.

The paper's evaluation (summary, "Experiment"): pass@1 on (1) the base harness, (2) held-out
configurations of the factorised space H that were never trained on (in-space combinatorial
generalisation, H minus H_tr), and (3) real agent frameworks outside the space, which call tools in the
model's own function-calling format (docs/experiments.md): smolagents' ToolCallingAgent with native tool calls
(the paper's Claude Code column: every policy is evaluated in it, none trains in it) and pydantic-ai's Agent
(the OpenClaw column: the black-box baselines train in it, so for them it is marked "trained in", not a
transfer figure). Two more columns hold harnesses whose call syntax no policy has seen: X-shell and X-react
(04's external harnesses, minus any the run trained on), and smolagents' text `Action: {json}` mode. Each
framework column is titled by the framework and version its episodes ran in.

This stage owns no environment: it asks stage 04 (eval mode) for the rollouts of each split and
scores them (common/eval_rollouts.py: one 04 call; files already there reused only when the same checkpoint and
settings made them). Everything it prints is computed from those rollout files.

    # evaluate the run's latest checkpoint (or --policy PATH) and label the row
    python 06_evaluate.py --run runs/default --label harness-scaling
    python 06_evaluate.py --run runs/default --policy runs/default/init_policy --label warm-start
    # an experiment's shared In-Space evaluation set instead of the seeded --heldout sample
    python 06_evaluate.py --run runs/exp/oa --eval-harnesses runs/exp/eval_harnesses.jsonl --label oa
    # the framework columns on the first 8 tasks, pydantic-ai's on 16, smolagents' text mode left out
    python 06_evaluate.py --run runs/default --label oa --framework-tasks 8,pydantic-ai=16,smolagents=0
    # a black-box baseline that trained inside pydantic-ai: its pydantic-ai column is marked "trained in"
    python 06_evaluate.py --run runs/exp/blackbox-rl --label blackbox-rl --trained-in X-pydantic-ai
    # score rollouts that already exist, without calling 04 (e.g. made on another machine)
    python 06_evaluate.py --run runs/default --label harness-scaling --no-rollout
    # the paper's table across runs (paired differences to a reference row): experiments/compare.py, on these folders
    python experiments/compare.py runs/default runs/single-harness

Reads   RUN/train_harnesses.jsonl, RUN/heldout_harnesses.jsonl (from 02), RUN/iter_*/rollouts.jsonl
Writes  RUN/eval/<label>/<split>.jsonl  (rollouts made by 04 --eval), one per split: base, inspace,
        smolagents-native, pydantic-ai, external, smolagents
        RUN/eval/<label>/checkpoint.json                 (what made those rollouts: reuse only for the same)
        RUN/eval_summary.json  RUN/results.md            (every label evaluated in this run)
        RUN/learning_curve.png                           (when matplotlib is installed)
        RUN/eval/<label>/summary.json                    (this policy's numbers; written last: the done marker)
"""
import argparse
import json
import os
from collections import defaultdict
from pathlib import Path

import numpy as np

from common.eval_rollouts import check_made_by, check_pairs, make_rollouts
from common.intervals import CI_NOTE, fmt, pair_means, pass1_ci, task_means, wilson
from common.plumbing import fail, locked, read_json, read_jsonl, read_text, write_atomic
from common.schemas import COMPONENTS, FRAMEWORKS, SPLIT_TITLES, SPLITS, levels_of, load_rollouts

HERE = Path(__file__).resolve().parent


# ----------------------------------------------------------------------------- Args
def parse_args(argv=None):
    # (arguments in the order of the summary's "config"; each in its group for --help)
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    what = p.add_argument_group("what is evaluated")
    evalset = p.add_argument_group("the evaluation set (the same for every policy compared)")
    sampling = p.add_argument_group("sampling, passed on to 04 (rows are compared only where these agree)")
    what.add_argument("--run", default="runs/default", help="run folder (outputs of stages 01-05)")
    what.add_argument("--policy", default=None,
                      help="checkpoint to evaluate (default: the run's latest iter_*/policy, else init_policy)")
    what.add_argument("--label", default=None,
                      help="row name in the tables (default: the policy folder's name; iter_NNN for iter_NNN/policy)")
    evalset.add_argument("--tasks", default=str(HERE / "data" / "test_tasks.jsonl"), help="evaluation tasks (JSONL)")
    evalset.add_argument("--max-tasks", type=int, default=None, help="evaluate on the first N test tasks only")
    evalset.add_argument("--heldout", type=int, default=8, help="size of the seeded sample of held-out in-space "
                         "harnesses")
    evalset.add_argument("--eval-harnesses", default=None, metavar="FILE",
                         help="JSONL of harness records (harness_id): the In-Space split is exactly these ids (an "
                              "experiment's shared evaluation set) instead of the seeded --heldout sample")
    evalset.add_argument("--base-harness", default="S0-T0-O0-C0-W0", help="id of the base harness (the Base column)")
    evalset.add_argument("--harness-file", action="append", default=[],
                         help="extra out-of-space harness JSON file(s), passed on to 04: your own black-box harness")
    evalset.add_argument("--framework-tasks", default=None, metavar="N|NAME=N[,...]",
                         help="framework columns (NAME: smolagents-native, pydantic-ai, smolagents) on the first N "
                              "evaluation tasks (a framework's episodes cost most); a bare N sets all three, 0 leaves a "
                              "column out (default: every task), e.g. 8,smolagents=0")
    evalset.add_argument("--no-smolagents", action="store_true",
                         help="leave out smolagents' text-mode column (the same as --framework-tasks smolagents=0)")
    what.add_argument("--trained-in", default=None, metavar="ID[,ID...]",
                      help="out-of-space harness ids this policy trained in besides RUN/train_harnesses.jsonl (a "
                           "black-box baseline: X-pydantic-ai): a framework column with one is marked trained in, "
                           "the unseen-syntax column leaves it out")
    sampling.add_argument("--samples", type=int, default=1, help="samples per (task, harness) pair")
    sampling.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    sampling.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="generation backend of 04")
    sampling.add_argument("--max-model-len", type=int, default=None, help="vllm: context length")
    sampling.add_argument("--dtype", default=None, help="sampling dtype (default: 04's auto)")
    sampling.add_argument("--max-turns", type=int, default=None, help="turn budget per episode (default: 04's)")
    sampling.add_argument("--max-new-tokens", type=int, default=None, help="tokens per reply (default: 04's)")
    evalset.add_argument("--seed", type=int, default=0, help="seed of the held-out sample and of sampling")
    evalset.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (kept in the summary's "
                         "config; the intervals here need none)")
    what.add_argument("--no-rollout", action="store_true", help="only score rollout files that already exist (e.g. "
                      "made on another machine)")
    what.add_argument("--overwrite", action="store_true", help="redo rollouts that already exist for this label")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- scoring: the algorithm
def behaviour(episodes):
    """Behavioural metrics from the transcripts' counters (docs/metrics.md); None where the rollout records
    lack the fields a metric needs (files made before 04 wrote them)."""
    n = len(episodes)
    turns = sum(e["turns"] for e in episodes)
    had_error = [e for e in episodes if e["parse_errors"] + e["tool_errors"] > 0]
    # workflow compliance = 1 - sum(violations) / sum(workflow_checks), over episodes with checks > 0
    has_checks = n > 0 and all("workflow_checks" in e for e in episodes)
    checked = [e for e in episodes if has_checks and e["workflow_checks"] > 0]
    checks = sum(e["workflow_checks"] for e in checked)
    # recovery = #(error turns t before the last turn whose turn t+1 made a valid call) / #(error turns before the last)
    has_turns = n > 0 and all("error_turns" in e and "valid_call_turns" in e for e in episodes)
    inner = 0  # error turns before the last turn
    recovered = 0  # ... whose next turn made a valid call
    for e in episodes if has_turns else []:
        for t in e["error_turns"]:
            if t < e["turns"]:  # an error turn with a turn after it
                inner += 1
                recovered += t + 1 in e["valid_call_turns"]
    return {
        "episodes": n,
        "parse_error_rate": sum(e["parse_errors"] for e in episodes) / max(turns, 1),  # per model turn
        "episodes_with_error": len(had_error) / max(n, 1),
        "recovery_rate": recovered / inner if inner else None,
        "recoverable_errors": inner if has_turns else None,  # error turns before the last turn
        "workflow_compliance": 1 - sum(e["workflow_violations"] for e in checked) / checks if checks else None,
        "workflow_checks": checks if has_checks else None,
        "mean_turns": turns / max(n, 1),
        "submitted": sum(e["finish_reason"] == "submitted" for e in episodes) / max(n, 1),
    }


def score_split(episodes, n_boot, seed):
    """pass@1 = mean success over (task, harness) pairs (each pair averaged over its samples)."""
    pairs = pair_means(episodes)
    per_harness = defaultdict(list)
    for (task, h), v in pairs.items():
        per_harness[h].append(v)
    ci, method = pass1_ci(task_means(pairs, sorted({t for t, _ in pairs})), n_boot, seed)
    return {
        "pass@1": float(np.mean(list(pairs.values()))) if pairs else 0.0,
        "ci95": ci,
        "ci_method": method,
        "pairs": len(pairs),
        "tasks": len({t for t, _ in pairs}),
        "mean_reward": float(np.mean([e["reward"] for e in episodes])) if episodes else 0.0,
        "framework": next((e["framework"] for e in episodes if e.get("framework")), None),
        "per_harness": {h: float(np.mean(v)) for h, v in sorted(per_harness.items())},
        "behaviour": behaviour(episodes),
    }


def per_component(episodes):
    """Per component and level, over held-out in-space pairs: successes k (a pair counts its mean over samples),
    pairs n, pass@1 = k/n and a Wilson 95% interval that treats the pairs as independent."""
    table = {c: defaultdict(list) for c in COMPONENTS}
    for (_, h), v in pair_means([e for e in episodes if levels_of(e["harness_id"]) is not None]).items():
        for c, level in levels_of(h).items():
            table[c][level].append(v)
    out = {}
    for c in COMPONENTS:
        out[c] = {}
        for level, v in sorted(table[c].items()):
            k, n = sum(v), len(v)
            out[c][f"{c}{level}"] = {"pass@1": k / n, "k": k, "n": n, "ci95": wilson(k, n)}
    return out


def training_curve(run):
    """Mean training reward of each iteration's rollouts (04 train mode)."""
    curve = []
    for path in sorted(run.glob("iter_*/rollouts.jsonl")):
        rows = [r for _, r in read_jsonl(path, required=("reward",))]
        curve.append({"iteration": int(path.parent.name.split("_")[1]),
                      "reward_mean": float(np.mean([r["reward"] for r in rows])) if rows else 0.0,
                      "success": float(np.mean([r["success"] for r in rows])) if rows else 0.0})
    return curve


# ----------------------------------------------------------------------------- what one call evaluates
# Every file and flag is checked as it is read: bad input stops with one line naming the file, the line and the
# field (exit 2), and nothing is written.
def latest_policy(run):
    iters = sorted(p for p in run.glob("iter_*/policy") if p.is_dir())
    if iters:
        return iters[-1]
    if (run / "init_policy").is_dir():
        return run / "init_policy"
    fail(f"{run}: no checkpoint found (no iter_*/policy, no init_policy); pass --policy")


def framework_tasks(args):
    """--framework-tasks and --no-smolagents -> {framework split: N} (None: every task; 0: the column left out)."""
    counts = dict.fromkeys(FRAMEWORKS)
    for item in filter(None, (x.strip() for x in (args.framework_tasks or "").split(","))):
        name, _, n = item.rpartition("=")
        if (name and name not in FRAMEWORKS) or not n.isdigit():
            fail(f"--framework-tasks {args.framework_tasks!r}: item {item!r}: expected N or NAME=N (NAME one of "
                 f"{', '.join(FRAMEWORKS)}; N >= 0), items separated by commas, e.g. 8,smolagents=0")
        counts.update({name: int(n)} if name else dict.fromkeys(FRAMEWORKS, int(n)))
    if args.no_smolagents:
        counts["smolagents"] = 0
    return counts


def trained_in_ids(args):
    """--trained-in: out-of-space harness ids 06 evaluates (a framework's, or an external harness's)."""
    known = set(FRAMEWORKS.values()) | set(harness_file_ids(HERE / "data" / "external_harnesses.json"))
    for f in args.harness_file:
        known |= set(harness_file_ids(f))
    ids = []
    for hid in (args.trained_in or "").split(","):
        if hid.strip() and hid.strip() not in ids:
            ids.append(hid.strip())
    for hid in ids:
        if hid not in known:
            fail(f"--trained-in {hid!r}: not an out-of-space harness 06 evaluates ({', '.join(sorted(known))}); an "
                 "in-space training harness belongs in RUN/train_harnesses.jsonl (02)")
    return ids


def inspace_ids_of(args, run, train_ids):
    """The In-Space split: the --eval-harnesses ids (all of them), else a seeded sample of H \\ H_tr (the same for
    every policy evaluated with this seed)."""
    if args.eval_harnesses:
        ids = set()
        for lineno, h in read_jsonl(args.eval_harnesses, required=("harness_id",)):
            hid, where = h["harness_id"], f"{args.eval_harnesses}:{lineno}"
            if not isinstance(hid, str) or levels_of(hid) is None:
                fail(f"{where}: harness_id {hid!r} is not an in-space configuration (S?-T?-O?-C?-W?)")
            if hid == args.base_harness:
                fail(f"{where}: {hid} is the base harness; the In-Space evaluation set must leave it out")
            if hid in train_ids:
                fail(f"{where}: {hid} is a training harness of {run} (train_harnesses.jsonl); the In-Space "
                    "evaluation set must be disjoint from it")
            ids.add(hid)
        return sorted(ids)
    heldout = [h["harness_id"] for _, h in read_jsonl(run / "heldout_harnesses.jsonl", required=("harness_id",))]
    if args.base_harness in heldout:
        print(f"[06] note: the base harness {args.base_harness} is not in the training set")
    rng = np.random.default_rng(args.seed)
    pool = sorted(h for h in heldout if h != args.base_harness)
    ids = sorted(rng.choice(pool, size=min(args.heldout, len(pool)), replace=False).tolist())
    assert not set(ids) & set(train_ids)
    return ids


def external_ids_of(args, train_ids):
    """The Out-of-Space split: the built-in external harnesses and --harness-file ones, minus any this run trained
    on (a black-box baseline trained inside X-shell is not scored out of space on X-shell)."""
    ids = harness_file_ids(HERE / "data" / "external_harnesses.json")
    for f in args.harness_file:
        ids += harness_file_ids(f)
    left_out = sorted(set(ids) & set(train_ids))
    if left_out:
        print(f"[06] Out-of-Space leaves out {', '.join(left_out)}: this run trained on it")
    return list(dict.fromkeys(h for h in ids if h not in train_ids))


def harness_file_ids(path):
    """Harness ids of a file as 04 reads it: a JSON object, a JSON list of objects, or JSONL (04 validates)."""
    if not Path(path).is_file():
        fail(f"{path}: harness file not found")
    try:
        data = json.loads(read_text(path))
        rows = data if isinstance(data, list) else [data]
    except json.JSONDecodeError:
        rows = [h for _, h in read_jsonl(path)]
    return [h["harness_id"] for h in rows if isinstance(h, dict) and "harness_id" in h]


# ----------------------------------------------------------------------------- episode records
# What 06 reads of an episode record (04 writes it; schemas.ROLLOUT checks each field): these must be there, the
# optional ones are checked when present (older files lack them). checkpoint.json beside the files says which
# policy and settings made them.
EPISODE_NEEDS = ["task_id", "harness_id", "success", "reward", "turns", "parse_errors", "tool_errors",
                 "workflow_violations", "finish_reason"]
EPISODE_OPTIONAL = ["workflow_checks", "error_turns", "valid_call_turns", "policy", "framework"]


def read_episodes(path):
    """A split file's episodes, each field checked against schemas.ROLLOUT (one line naming file, line, field)."""
    return [e for _, e in load_rollouts(path, EPISODE_NEEDS + EPISODE_OPTIONAL, dict.fromkeys(EPISODE_NEEDS, ""))]


# ----------------------------------------------------------------------------- reports
def pct(x, digits=0):
    return "n/a" if x is None else f"{100 * x:.{digits}f}%"


def split_title(split, summaries):
    """Column title: a framework column by the framework and version its episodes recorded (the first two words of
    "smolagents 1.26.0 (native tool calls)"), the unseen-syntax column by its harness ids."""
    found = [s["splits"][split] for s in summaries if split in s["splits"]]
    fws = sorted({" ".join(x["framework"].split()[:2]) for x in found if x.get("framework")})
    ids = sorted({h for x in found for h in x.get("per_harness", {})})
    return SPLIT_TITLES[split].format(fw=" / ".join(fws) or split.removesuffix("-native"), ids=", ".join(ids))


def cell(sp):
    """A table cell: pass@1 [interval], marked where the policy trained inside that framework."""
    return fmt(sp) + (" (trained in)" if sp and sp.get("trained_in") else "")


TRAINED_NOTE = "(trained in): the policy trained inside this framework, so the cell is not a transfer figure."


def table(rows):
    """rows: [(name, summary)] -> markdown table, the paper's shape (the columns some row has)."""
    splits = [s for s in SPLITS if any(s in x["splits"] for _, x in rows)]
    lines = ["| policy | " + " | ".join(split_title(s, [r for _, r in rows]) for s in splits) + " |",
             "| --- | " + " | ".join("---" for _ in splits) + " |"]
    for name, s in rows:
        lines.append(f"| {name} | " + " | ".join(cell(s["splits"].get(s_)) for s_ in splits) + " |")
    trained = any(sp.get("trained_in") for _, x in rows for sp in x["splits"].values())
    return "\n".join(lines + (["", TRAINED_NOTE] if trained else []))


def results_markdown(run, summaries):
    out = [f"# Results: {run}", "", CI_NOTE, "", table(list(summaries.items())), ""]
    for label, s in summaries.items():
        out += [f"## {label}", "", f"policy: `{s['policy']}`", ""]
        out += ["| split | pass@1 | pairs | parse-error rate | episodes with error | recovery | workflow compliance "
                "| turns |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for split in SPLITS:
            sp = s["splits"].get(split)
            if sp is None:
                continue
            b = sp["behaviour"]
            checks = "" if b.get("workflow_checks") is None else f" of {b['workflow_checks']} checks"
            out.append(f"| {split_title(split, [s])} | {cell(sp)} | {sp['pairs']} | {pct(b['parse_error_rate'], 1)} "
                       f"| {pct(b['episodes_with_error'])} | {pct(b.get('recovery_rate'))} "
                       f"| {pct(b.get('workflow_compliance'))}{checks} "
                       f"| {b['mean_turns']:.2f} |")
        comp = s["per_component"]
        width = 1  # the columns: levels 0 .. the highest any component has
        for levels in comp.values():
            for name in levels:  # "S2": component S, level 2
                width = max(width, int(name[1:]) + 1)
        out += ["", "pass@1 by realisation over the held-out in-space pairs: successes/pairs, % and a Wilson 95% "
                "interval (pairs are treated as independent here, though a task's pairs are not):", "",
                "| component | " + " | ".join(f"level {i}" for i in range(width)) + " |",
                "| --- |" + " --- |" * width]
        for c, by_level in comp.items():
            cells = [(f"{c}{i}", by_level.get(f"{c}{i}")) for i in range(width)]
            out.append(f"| {c} | " + " | ".join(
                "" if v is None else f"{k}: {v['k']:g}/{v['n']} = {100 * v['pass@1']:.0f}% [{100 * v['ci95'][0]:.0f}, "
                f"{100 * v['ci95'][1]:.0f}]" for k, v in cells) + " |")
        out += ["", "Per harness:", "", "| harness | pass@1 |", "| --- | --- |"]
        for split in SPLITS:
            for h, v in s["splits"].get(split, {}).get("per_harness", {}).items():
                out.append(f"| {h} | {100 * v:.0f}% |")
        out.append("")
    curve = next(iter(summaries.values()))["training_curve"] if summaries else []
    if curve:
        out += ["## Training curve", "", "| iteration | mean reward | success |", "| --- | --- | --- |"]
        out += [f"| {c['iteration']} | {c['reward_mean']:.3f} | {100 * c['success']:.0f}% |" for c in curve]
    return "\n".join(out) + "\n"


def plot_curve(run, curve, summaries):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[06] matplotlib not installed: no learning_curve.png (the markdown table has the numbers)")
        return
    fig, ax = plt.subplots(figsize=(6, 3.5))
    if curve:
        ax.plot([c["iteration"] for c in curve], [c["reward_mean"] for c in curve], "o-", label="train reward (mean)")
    for i, (label, s) in enumerate(summaries.items()):
        base = s["splits"].get("base")
        if base is not None:
            ax.axhline(base["pass@1"], ls="--", color=f"C{i + 1}", label=f"{label}: base pass@1")
    ax.set_xlabel("iteration")
    ax.set_ylim(-0.02, 1.02)
    ax.legend(fontsize=8)
    ax.set_title(str(run))
    fig.tight_layout()
    tmp = run / "learning_curve.tmp.png"
    fig.savefig(tmp, dpi=100)
    plt.close(fig)
    os.replace(tmp, run / "learning_curve.png")


# ----------------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    with locked(Path(args.run) / "run.lock"):  # one writer per run folder
        evaluate(args)


def evaluate(args):
    run = Path(args.run)
    for name in ("train_harnesses.jsonl", "heldout_harnesses.jsonl"):
        if not (run / name).is_file():
            fail(f"{run / name}: file not found (run 01_harness_space.py and 02_orthogonal_design.py first)")
    # the harnesses this policy trained in: the run's training set (02) and --trained-in (a framework, e.g.)
    train_ids = sorted({h["harness_id"] for _, h in read_jsonl(run / "train_harnesses.jsonl",
                                                                required=("harness_id",))} | set(trained_in_ids(args)))
    ids = {"base": [args.base_harness], "inspace": inspace_ids_of(args, run, train_ids),
           "external": external_ids_of(args, train_ids), **{s: [h] for s, h in FRAMEWORKS.items()}}
    task_ids = [t["task_id"] for _, t in read_jsonl(args.tasks, required=("task_id",))][:args.max_tasks]
    counts = framework_tasks(args)  # a framework column runs on the first N tasks (None: all)
    # the (task, harness) pairs each split evaluates
    want = {}
    for s, harness_ids in ids.items():
        want[s] = {(t, h) for t in task_ids[:counts.get(s)] for h in harness_ids}
    splits = [s for s in SPLITS if counts.get(s) != 0 and (s != "external" or ids["external"])]

    if args.policy:
        policy = Path(args.policy)
    elif args.no_rollout and args.label:
        policy = Path("(scored from existing rollouts)")
    else:
        policy = latest_policy(run)
    label = args.label or (policy.parent.name if policy.name == "policy" else policy.name)  # iter_005/policy: iter_005
    out_dir = run / "eval" / label
    if not task_ids:
        fail(f"{args.tasks}: no tasks")
    checkpoint = None
    if not args.no_rollout:
        if not policy.is_dir() and str(policy) != "oracle":
            fail(f"{policy}: policy folder not found")
        checkpoint = make_rollouts(args, run, policy, out_dir, ids, want, splits)
    episodes = read_splits(args, out_dir, splits, want)
    summary = {
        "label": label, "policy": str(policy), "tasks": args.tasks, "heldout_ids": ids["inspace"],
        "eval_harnesses": args.eval_harnesses, "train_ids": train_ids, "external_ids": ids["external"],
        "framework_tasks": {s: len({t for t, _ in want[s]}) for s in FRAMEWORKS if s in splits},
        "checkpoint": checkpoint,
        # a framework column whose harness this policy trained in is not a transfer figure: marked trained_in
        "splits": {s: {**score_split(eps, args.bootstrap, args.seed), "trained_in": FRAMEWORKS.get(s) in train_ids}
                   for s, eps in episodes.items()},
        "per_component": per_component(episodes.get("inspace", [])),
        "training_curve": training_curve(run),
        "config": vars(args),
    }
    write_reports(run, out_dir, label, summary)


def read_splits(args, out_dir, splits, want):
    """{split: episodes} of the split files in out_dir, each checked to hold exactly this call's pairs."""
    episodes = {}
    for split in splits:
        path = out_dir / f"{split}.jsonl"
        if path.is_file():
            episodes[split] = read_episodes(path)
            if args.no_rollout:
                check_made_by(path, episodes[split], out_dir / "checkpoint.json", "score it under its own --label, "
                              "or make the rollouts again without --no-rollout")
            check_pairs(path, episodes[split], want[split], "score it with the --tasks, --max-tasks, "
                        "--heldout or --eval-harnesses, --seed and --harness-file it was made with")
        elif args.no_rollout:
            print(f"[06] {path} missing: split '{split}' left out")
    if not episodes:
        fail(f"{out_dir}: no rollout files to score")
    return episodes


def write_reports(run, out_dir, label, summary):
    """Merge into the run's summary (one entry per label evaluated in this run); summary.json last: the done marker."""
    all_path = run / "eval_summary.json"
    summaries = read_json(all_path) if all_path.is_file() else {}
    summaries[label] = summary
    write_atomic(all_path, json.dumps(summaries, indent=2))
    write_atomic(run / "results.md", results_markdown(run, summaries))
    plot_curve(run, summary["training_curve"], summaries)
    write_atomic(out_dir / "summary.json", json.dumps(summary, indent=2))

    print()
    print(table(list(summaries.items())))
    for split, s in summary["splits"].items():
        b = s["behaviour"]
        print(f"[06] {label} {split_title(split, [summary]):>17}: pass@1 {cell(s)} over {s['pairs']} pairs, "
              f"parse errors/turn {b['parse_error_rate']:.3f}, workflow compliance {pct(b['workflow_compliance'])}, "
              f"recovery {pct(b['recovery_rate'])}, turns {b['mean_turns']:.2f}")
    print(f"[06] wrote {all_path}, {run / 'results.md'}, {out_dir / 'summary.json'}")


if __name__ == "__main__":
    main()
