"""Stage 06: pass@1 of a policy on the base, held-out in-space and out-of-space harnesses.

The paper's evaluation (summary, "Experiment"): pass@1 on (1) the base harness, (2) held-out
configurations of the factorised space H that were never trained on (in-space combinatorial
generalisation, H minus H_tr), (3) harnesses outside the space (out-of-space / black-box), and (4) a
real agent framework nobody designed for this experiment, smolagents (its own column, named after the
framework and its version, like the paper's Claude Code column; `--no-smolagents` skips it).

This stage owns no environment: it asks stage 04 (eval mode) for the rollouts of each split and
scores them. Everything it prints is computed from those rollout files.

    # evaluate the run's latest checkpoint (or --policy PATH) and label the row
    python 06_evaluate.py --run runs/default --label harness-scaling
    python 06_evaluate.py --run runs/default --policy runs/default/init_policy --label warm-start
    # score rollouts that already exist, without calling 04 (e.g. made on another machine)
    python 06_evaluate.py --run runs/default --label harness-scaling --no-rollout
    # the paper's table across runs (rows: run/label, columns: Base, In-Space, Out-of-Space)
    python 06_evaluate.py --compare runs/default runs/single-harness

Reads   RUN/train_harnesses.jsonl, RUN/heldout_harnesses.jsonl (from 02), RUN/iter_*/rollouts.jsonl
Writes  RUN/eval/<label>/{base,inspace,external,smolagents}.jsonl   (rollouts made by 04 --eval)
        RUN/eval/<label>/summary.json                    (this policy's numbers)
        RUN/eval_summary.json  RUN/results.md            (every label evaluated in this run)
        RUN/learning_curve.png                           (when matplotlib is installed)
"""
import argparse
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
SPLITS = ["base", "inspace", "external", "smolagents"]  # table columns: Base, In-Space, Out-of-Space, smolagents
SPLIT_TITLES = {"base": "Base", "inspace": "In-Space", "external": "Out-of-Space", "smolagents": "smolagents"}
COMPONENTS = ["S", "T", "O", "C", "W"]


# ----------------------------------------------------------------------------- Args
def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", default="runs/default", help="run folder (outputs of stages 01-05)")
    p.add_argument("--policy", default=None,
                   help="checkpoint to evaluate (default: the run's latest iter_*/policy, else init_policy)")
    p.add_argument("--label", default=None, help="row name in the tables (default: the policy folder's name)")
    p.add_argument("--tasks", default=str(HERE / "data" / "test_tasks.jsonl"), help="evaluation tasks (JSONL)")
    p.add_argument("--max-tasks", type=int, default=None, help="evaluate on the first N test tasks only")
    p.add_argument("--heldout", type=int, default=8, help="size of the seeded sample of held-out in-space harnesses")
    p.add_argument("--base-harness", default="S0-T0-O0-C0-W0", help="id of the base harness")
    p.add_argument("--harness-file", action="append", default=[],
                   help="extra out-of-space harness JSON file(s), passed on to 04")
    p.add_argument("--no-smolagents", action="store_true",
                   help="skip the smolagents column (episodes inside smolagents' ToolCallingAgent, run one by one)")
    p.add_argument("--smolagents-tasks", type=int, default=None,
                   help="smolagents column: only the first N evaluation tasks (its episodes run one by one)")
    p.add_argument("--samples", type=int, default=1, help="samples per (task, harness) pair")
    p.add_argument("--temperature", type=float, default=0.0, help="sampling temperature (0 = greedy)")
    p.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="generation backend of 04")
    p.add_argument("--max-model-len", type=int, default=None, help="vllm: context length, passed on to 04")
    p.add_argument("--dtype", default=None, help="sampling dtype, passed on to 04 (default: 04's auto)")
    p.add_argument("--max-turns", type=int, default=None, help="turn budget per episode (default: 04's)")
    p.add_argument("--max-new-tokens", type=int, default=None, help="tokens per reply (default: 04's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the held-out sample, sampling and bootstrap")
    p.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples for the 95%% interval")
    p.add_argument("--no-rollout", action="store_true", help="only score rollout files that already exist")
    p.add_argument("--overwrite", action="store_true", help="redo rollouts that already exist for this label")
    p.add_argument("--compare", nargs="+", metavar="RUN", help="print one table across these runs and exit")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- helpers
def die(msg):
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def read_jsonl(path, required=()):
    path = Path(path)
    if not path.is_file():
        die(f"{path}: file not found")
    rows = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                die(f"{path}:{lineno}: malformed JSON ({e.msg})")
            if not isinstance(row, dict):
                die(f"{path}:{lineno}: expected a JSON object")
            for field in required:
                if field not in row:
                    die(f"{path}:{lineno}: missing field '{field}'")
            rows.append(row)
    return rows


def write_atomic(path, text):
    """Write to a temporary name, then rename: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def latest_policy(run):
    iters = sorted(p for p in run.glob("iter_*/policy") if p.is_dir())
    if iters:
        return iters[-1]
    if (run / "init_policy").is_dir():
        return run / "init_policy"
    die(f"{run}: no checkpoint found (no iter_*/policy, no init_policy); pass --policy")


def levels_of(harness_id):
    """'S0-T2-O1-C0-W1' -> {'S': 0, 'T': 2, ...}; None for an out-of-space harness id."""
    parts = harness_id.split("-")
    if len(parts) != len(COMPONENTS) or any(p[:1] != c or not p[1:].isdigit() for p, c in zip(parts, COMPONENTS)):
        return None
    return {c: int(p[1:]) for p, c in zip(parts, COMPONENTS)}


def wanted_splits(args):
    return [s for s in SPLITS if not (s == "smolagents" and args.no_smolagents)]


# ----------------------------------------------------------------------------- rollouts via stage 04
def make_rollouts(args, run, policy, out_dir, heldout_ids):
    """Ask 04 (eval mode) for the rollouts: base, in-space and out-of-space episodes in ONE 04 call (one engine
    start with vLLM), then split by harness id into one file per split; smolagents in a call of its own.
    Existing files are kept (resume)."""
    specs = {"base": args.base_harness, "inspace": ",".join(heldout_ids), "external": "external"}
    tasks = tasks_file(args, out_dir)
    todo = [s for s in wanted_splits(args) if args.overwrite or not (out_dir / f"{s}.jsonl").is_file()]
    for split in sorted(set(wanted_splits(args)) - set(todo)):
        print(f"[06] {out_dir / f'{split}.jsonl'} exists, reusing it (--overwrite to redo)")
    in_one = [s for s in todo if s in specs]  # (name, --harnesses) of each 04 call
    calls = ([("+".join(in_one), ",".join(specs[s] for s in in_one))] if in_one else []) + \
        ([("smolagents", "smolagents")] if "smolagents" in todo else [])
    for name, spec in calls:
        out = out_dir / (f"{name}.jsonl" if name == "smolagents" else "episodes.jsonl")
        split_tasks = tasks
        if name == "smolagents" and args.smolagents_tasks:
            split_tasks = out_dir / "smolagents_tasks.jsonl"
            write_atomic(split_tasks, "".join(json.dumps(r) + "\n" for r in read_jsonl(tasks)[:args.smolagents_tasks]))
        cmd = [sys.executable, str(HERE / "04_rollout.py"), "--run", str(run), "--eval",
               "--policy", str(policy), "--harnesses", spec, "--tasks", str(split_tasks),
               "--samples", str(args.samples), "--temperature", str(args.temperature),
               "--backend", args.backend, "--seed", str(args.seed), "--out", str(out)]
        for flag, value in (("--max-turns", args.max_turns), ("--max-new-tokens", args.max_new_tokens),
                            ("--max-model-len", args.max_model_len), ("--dtype", args.dtype)):
            cmd += [flag, str(value)] if value else []
        for hf in args.harness_file if "external" in name else []:
            cmd += ["--harness-file", hf]
        print(f"[06] {name}: " + " ".join(cmd[1:]), flush=True)
        if subprocess.run(cmd).returncode != 0:
            die(f"stage 04 failed while making the '{name}' rollouts (command above)")
        if name == "smolagents":
            continue
        rows = read_jsonl(out, required=("harness_id",))  # one file per split, by harness id
        split_of = {args.base_harness: "base", **{h: "inspace" for h in heldout_ids}}
        for split in name.split("+"):
            mine = [r for r in rows if split_of.get(r["harness_id"], "external") == split]
            write_atomic(out_dir / f"{split}.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in mine))
        out.unlink()


def tasks_file(args, out_dir):
    """The evaluation tasks, optionally cut to the first --max-tasks (written beside the rollouts)."""
    if args.max_tasks is None:
        return Path(args.tasks)
    rows = read_jsonl(args.tasks, required=("task_id",))[: args.max_tasks]
    path = out_dir / "tasks.jsonl"
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
    return path


# ----------------------------------------------------------------------------- scoring
def bootstrap_ci(episodes, n_boot, seed):
    """95% interval of pass@1 by resampling TASKS with replacement (pairs of one task move together)."""
    by_task = defaultdict(list)
    for e in episodes:
        by_task[e["task_id"]].append(float(e["success"]))
    per_task = np.array([np.mean(v) for v in by_task.values()])  # [n_tasks] pass@1 of each task
    if len(per_task) < 2:
        return [float(per_task.mean()), float(per_task.mean())] if len(per_task) else [0.0, 0.0]
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(per_task), size=(n_boot, len(per_task)))  # [n_boot, n_tasks]
    means = per_task[idx].mean(axis=1)  # [n_boot]
    return [float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))]


def behaviour(episodes):
    """Behavioural metrics from the transcripts' counters (see README, "Metrics")."""
    n = len(episodes)
    turns = sum(e["turns"] for e in episodes)
    had_error = [e for e in episodes if e["parse_errors"] + e["tool_errors"] > 0]
    return {
        "episodes": n,
        "parse_error_rate": sum(e["parse_errors"] for e in episodes) / max(turns, 1),  # per model turn
        "episodes_with_error": len(had_error) / max(n, 1),
        "recovery_rate": (sum(e["success"] for e in had_error) / len(had_error)) if had_error else None,
        "workflow_compliance": sum(e["workflow_violations"] == 0 for e in episodes) / max(n, 1),
        "mean_turns": turns / max(n, 1),
        "submitted": sum(e["finish_reason"] == "submitted" for e in episodes) / max(n, 1),
    }


def score_split(episodes, n_boot, seed):
    """pass@1 = mean success over (task, harness) pairs (each pair averaged over its samples)."""
    pairs = defaultdict(list)
    for e in episodes:
        pairs[(e["task_id"], e["harness_id"])].append(float(e["success"]))
    pass1 = float(np.mean([np.mean(v) for v in pairs.values()])) if pairs else 0.0
    per_harness = defaultdict(list)
    for (task, h), v in pairs.items():
        per_harness[h].append(np.mean(v))
    return {
        "pass@1": pass1,
        "ci95": bootstrap_ci(episodes, n_boot, seed),
        "pairs": len(pairs),
        "tasks": len({t for t, _ in pairs}),
        "mean_reward": float(np.mean([e["reward"] for e in episodes])) if episodes else 0.0,
        "framework": next((e["framework"] for e in episodes if e.get("framework")), None),
        "per_harness": {h: float(np.mean(v)) for h, v in sorted(per_harness.items())},
        "behaviour": behaviour(episodes),
    }


def per_component(episodes):
    """Mean pass@1 by realisation of each component, over every in-space episode evaluated."""
    table = {c: defaultdict(list) for c in COMPONENTS}
    for e in episodes:
        lv = levels_of(e["harness_id"])
        if lv is None:
            continue
        for c in COMPONENTS:
            table[c][lv[c]].append(float(e["success"]))
    return {c: {f"{c}{k}": float(np.mean(v)) for k, v in sorted(table[c].items())} for c in COMPONENTS}


def training_curve(run):
    """Mean training reward of each iteration's rollouts (04 train mode)."""
    curve = []
    for path in sorted(run.glob("iter_*/rollouts.jsonl")):
        rows = read_jsonl(path, required=("reward",))
        curve.append({"iteration": int(path.parent.name.split("_")[1]),
                      "reward_mean": float(np.mean([r["reward"] for r in rows])) if rows else 0.0,
                      "success": float(np.mean([r["success"] for r in rows])) if rows else 0.0})
    return curve


# ----------------------------------------------------------------------------- reports
def fmt(split):
    if split is None:
        return "n/a"
    lo, hi = split["ci95"]
    return f"{100 * split['pass@1']:.1f} [{100 * lo:.1f}, {100 * hi:.1f}]"


def split_title(split, summaries):
    """Column title; the framework column is named after the framework and version its episodes ran in."""
    names = sorted({s["splits"][split].get("framework") or "" for s in summaries if split in s["splits"]} - {""})
    return " / ".join(names) if split == "smolagents" and names else SPLIT_TITLES[split]


def table(rows):
    """rows: [(name, summary)] -> markdown table, the paper's shape."""
    lines = ["| policy | " + " | ".join(split_title(s, [r for _, r in rows]) for s in SPLITS) + " |",
             "| --- | " + " | ".join("---" for _ in SPLITS) + " |"]
    for name, s in rows:
        lines.append(f"| {name} | " + " | ".join(fmt(s["splits"].get(s_)) for s_ in SPLITS) + " |")
    return "\n".join(lines)


def results_markdown(run, summaries):
    out = [f"# Results: {run}", "",
           "pass@1 in % with a 95% bootstrap interval over test tasks.", "", table(list(summaries.items())), ""]
    for label, s in summaries.items():
        out += [f"## {label}", "", f"policy: `{s['policy']}`", ""]
        out += ["| split | pass@1 | pairs | parse-error rate | recovery | workflow compliance | turns |",
                "| --- | --- | --- | --- | --- | --- | --- |"]
        for split in SPLITS:
            sp = s["splits"].get(split)
            if sp is None:
                continue
            b = sp["behaviour"]
            rec = "n/a" if b["recovery_rate"] is None else f"{100 * b['recovery_rate']:.0f}%"
            out.append(f"| {split_title(split, [s])} | {fmt(sp)} | {sp['pairs']} | {100 * b['parse_error_rate']:.1f}% "
                       f"| {rec} | {100 * b['workflow_compliance']:.0f}% | {b['mean_turns']:.2f} |")
        width = max([len(v) for v in s["per_component"].values()] + [1])
        out += ["", "pass@1 by realisation (base + held-out in-space episodes):", "",
                "| component | " + " | ".join(f"level {i}" for i in range(width)) + " |",
                "| --- |" + " --- |" * width]
        for c, by_level in s["per_component"].items():
            out.append(f"| {c} | " + " | ".join(f"{k}: {100 * v:.0f}%" for k, v in by_level.items()) + " |")
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
    os.replace(tmp, run / "learning_curve.png")


def compare(runs):
    rows = []
    for r in runs:
        path = Path(r) / "eval_summary.json"
        if not path.is_file():
            die(f"{path}: file not found (run 06_evaluate.py --run {r} first)")
        try:
            summaries = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            die(f"{path}:{e.lineno}: malformed JSON ({e.msg})")
        rows += [(f"{Path(r).name}/{label}", s) for label, s in summaries.items()]
    print(table(rows))


# ----------------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    if args.compare:
        compare(args.compare)
        return
    run = Path(args.run)
    for name in ("train_harnesses.jsonl", "heldout_harnesses.jsonl"):
        if not (run / name).is_file():
            die(f"{run / name}: file not found (run 01_harness_space.py and 02_orthogonal_design.py first)")
    train_ids = {h["harness_id"] for h in read_jsonl(run / "train_harnesses.jsonl", required=("harness_id",))}
    heldout = [h["harness_id"] for h in read_jsonl(run / "heldout_harnesses.jsonl", required=("harness_id",))]
    if args.base_harness in heldout:
        print(f"[06] note: the base harness {args.base_harness} is not in the training set")
    # a seeded sample of H \ H_tr, the same for every policy evaluated with this seed
    rng = np.random.default_rng(args.seed)
    pool = sorted(h for h in heldout if h != args.base_harness)
    heldout_ids = sorted(rng.choice(pool, size=min(args.heldout, len(pool)), replace=False).tolist())
    assert not set(heldout_ids) & train_ids

    if args.policy:
        policy = Path(args.policy)
    elif args.no_rollout and args.label:
        policy = Path("(scored from existing rollouts)")
    else:
        policy = latest_policy(run)
    label = args.label or policy.name
    out_dir = run / "eval" / label
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.no_rollout:
        if not policy.is_dir() and str(policy) != "oracle":
            die(f"{policy}: policy folder not found")
        make_rollouts(args, run, policy, out_dir, heldout_ids)

    required = ("task_id", "harness_id", "success", "reward", "turns", "parse_errors", "tool_errors",
                "workflow_violations", "finish_reason")
    splits = {}
    for split in wanted_splits(args):
        path = out_dir / f"{split}.jsonl"
        if path.is_file():
            splits[split] = read_jsonl(path, required=required)
        elif args.no_rollout:
            print(f"[06] {path} missing: split '{split}' left out")
    if not splits:
        die(f"{out_dir}: no rollout files to score")
    inspace_eps = [e for s in ("base", "inspace") for e in splits.get(s, [])]
    summary = {
        "label": label, "policy": str(policy), "tasks": args.tasks, "heldout_ids": heldout_ids,
        "splits": {s: score_split(eps, args.bootstrap, args.seed) for s, eps in splits.items()},
        "per_component": per_component(inspace_eps),
        "training_curve": training_curve(run),
        "config": vars(args),
    }
    write_atomic(out_dir / "summary.json", json.dumps(summary, indent=2))
    # merge into the run's summary (one entry per label evaluated in this run)
    all_path = run / "eval_summary.json"
    summaries = json.loads(all_path.read_text()) if all_path.is_file() else {}
    summaries[label] = summary
    write_atomic(all_path, json.dumps(summaries, indent=2))
    write_atomic(run / "results.md", results_markdown(run, summaries))
    plot_curve(run, summary["training_curve"], summaries)

    print()
    print(table(list(summaries.items())))
    for split, s in summary["splits"].items():
        b = s["behaviour"]
        print(f"[06] {label} {split_title(split, [summary]):>17}: pass@1 {fmt(s)} over {s['pairs']} pairs, "
              f"parse errors/turn {b['parse_error_rate']:.3f}, workflow compliance {b['workflow_compliance']:.2f}, "
              f"turns {b['mean_turns']:.2f}")
    print(f"[06] wrote {out_dir / 'summary.json'}, {all_path}, {run / 'results.md'}")


if __name__ == "__main__":
    main()
