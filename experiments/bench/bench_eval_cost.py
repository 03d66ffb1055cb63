"""The cost of evaluating one policy (06 as pipeline.py runs it for a preset), before (06 and 04 at a git revision)
and after (this checkout), in one run, on the same tasks; and whether the episodes' outcomes agree.

    python experiments/bench/bench_eval_cost.py --rev REV --src runs/small --policy runs/ws-small/policy \
        [--max-tasks 8] [--framework-tasks 8] [--repeat-after] [--out results/eval_cost.md]

REV's files are extracted with `git archive` into a temporary folder (the checkout is not touched); each version
runs its own 06 in a fresh run folder holding --src's 01/02 files, one after the other (never two at once), with
the small preset's flags (pipeline.evaluate: vLLM, 5 turns x 96 tokens, greedy, seed 0, 4 held-out harnesses,
max_model_len 4096). Reported per version: the wall time of the whole 06 call; per split, the seconds its episodes
took (04's `wall_seconds` for a 04 call; the "[NAMES] N episodes in S s" lines of the frameworks run together inside
one call, smolagents_harness.run_jobs); the rest
(process and engine start-ups, 06's scoring). Outcomes: per episode (split, task, harness, sample) whether success,
finish reason and turns agree, and whether every completion id agrees, before vs after and (--repeat-after) after
vs after: vLLM on a CPU in bf16 is not bit-reproducible across batch shapes, so greedy episodes can part where two
tokens are nearly tied. Writes the markdown report (command, commit, machine, date) and prints it.
"""
import argparse
import datetime
import io
import json
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPLITS = ["base", "inspace", "external", "smolagents-native", "pydantic-ai", "smolagents"]
FRAMEWORK_LINE = re.compile(r"^\[([a-z+() -]+)\] (\d+) episodes in ([\d.]+) s", re.M)  # smolagents_harness.run_jobs
LINE_SPLIT = {"smolagents (native)": "smolagents-native", "pydantic-ai": "pydantic-ai", "smolagents": "smolagents"}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rev", required=True, help="git revision of the 'before' 06 and 04 (e.g. the commit before)")
    p.add_argument("--src", default="runs/small", help="run folder with 01/02 outputs (copied, never written)")
    p.add_argument("--policy", default="runs/ws-small/policy", help="checkpoint evaluated by both versions")
    p.add_argument("--max-tasks", type=int, default=8, help="06 --max-tasks (the lockstep splits' tasks)")
    p.add_argument("--framework-tasks", type=int, default=8, help="tasks of each framework column (preset: 8)")
    p.add_argument("--repeat-after", action="store_true", help="run the 'after' version twice (after vs after)")
    p.add_argument("--work", default=None, help="folder for the run folders (default: a temporary one)")
    p.add_argument("--out", default=str(ROOT / "results" / "eval_cost.md"), help="markdown report")
    return p.parse_args(argv)


def extract(rev, dest):
    """REV's tree into dest (git archive: no worktree, nothing in .git changes)."""
    data = subprocess.run(["git", "archive", "--format=tar", rev], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")
    return subprocess.run(["git", "rev-parse", "--short", rev], cwd=ROOT, check=True, capture_output=True,
                          text=True).stdout.strip()


def run_06(code, run, args):
    """One 06 call as pipeline.evaluate makes it for the small preset -> (wall seconds, stdout)."""
    run.mkdir(parents=True)
    for name in ("components.json", "harness_space.jsonl", "train_harnesses.jsonl", "heldout_harnesses.jsonl"):
        shutil.copy(Path(args.src) / name, run / name)
    n = args.framework_tasks
    cmd = [sys.executable, str(code / "06_evaluate.py"), "--run", str(run),
           "--policy", str(Path(args.policy).resolve()), "--label", "bench", "--backend", "vllm", "--heldout", "4",
           "--tasks", str(ROOT / "data" / "test_tasks.jsonl"),
           "--max-turns", "5", "--max-new-tokens", "96", "--seed", "0", "--max-model-len", "4096",
           "--max-tasks", str(args.max_tasks),
           "--framework-tasks", f"smolagents-native={n},pydantic-ai={n},smolagents={n}"]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=code, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (run / "06.log").write_text(proc.stdout + proc.stderr)
    if proc.returncode:
        sys.exit(f"{' '.join(cmd)} failed ({proc.returncode}); log: {run / '06.log'}")
    return wall, proc.stdout + proc.stderr


def split_seconds(run, log):
    """{split(s): seconds of its episodes, "04 calls": how many}: a 04 call's wall_seconds (a framework column in a
    call of its own), less the framework episodes the log reports inside it (listed under their own names)."""
    frameworks = {LINE_SPLIT.get(m[1], m[1]): float(m[3]) for m in FRAMEWORK_LINE.finditer(log)}
    seconds = {"04 calls": 0}
    for cfg in sorted((run / "eval" / "bench").glob("*.04_rollout_config.json")):
        c = json.loads(cfg.read_text())
        seconds["04 calls"] += 1
        if c["harnesses"] in LINE_SPLIT.values():
            seconds[c["harnesses"]] = c["wall_seconds"]
        else:
            seconds["base+inspace+external"] = c["wall_seconds"] - sum(frameworks.values())
    return {**seconds, **frameworks}


def episodes(run):
    """{(split, episode_id): record} of a 06 call's split files."""
    out_dir = run / "eval" / "bench"
    return {(s, r["episode_id"]): r for s in SPLITS if (out_dir / f"{s}.jsonl").is_file()
            for r in map(json.loads, (out_dir / f"{s}.jsonl").read_text().splitlines())}


def agreement(a, b):
    """Per split: (episodes, same outcome (success, finish reason, turns), same completion ids)."""
    if set(a) != set(b):
        sys.exit("the two versions ran different episodes: " + str(sorted(set(a) ^ set(b))[:3]))
    out = {}
    for (split, eid), ra in a.items():
        rb = b[(split, eid)]
        same = all(ra[k] == rb[k] for k in ("success", "finish_reason", "turns"))
        ids = [t["completion_ids"] for t in ra["model_turns"]] == [t["completion_ids"] for t in rb["model_turns"]]
        n, o, i = out.get(split, (0, 0, 0))
        out[split] = (n + 1, o + same, i + ids)
    return out


def report(args, rev, runs, cmd):
    before, after = runs[0], runs[1]
    keys = list(dict.fromkeys(k for r in runs for k in r["seconds"] if k != "04 calls"))
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    cpu = next((ln.split(":", 1)[1].strip() for ln in lscpu.splitlines() if ln.startswith("Model name")), "?")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    lines = ["# The cost of evaluating one policy: before / after", "",
             f"`{cmd}`", "",
             f"Before: 06 and 04 at {rev}; after: this checkout at {head.strip()} (plus its uncommitted changes, if "
             f"any). Machine: {cpu}, {subprocess.run(['nproc'], capture_output=True, text=True).stdout.strip()} "
             f"cores. Date: {datetime.date.today()}. Policy: `{args.policy}`; {args.max_tasks} test tasks for Base, "
             f"In-Space (4 held-out) and X-shell/X-react; {args.framework_tasks} for each framework column; greedy. "
             f"Versions: {versions()}. The benchmark's wall time: {sum(r['wall'] for r in runs) / 60:.0f} min.",
             "", "| seconds | " + " | ".join(r["name"] for r in runs) + " | after / before |",
             "| --- |" + " --- |" * (len(runs) + 1)]
    for k in keys:
        vals = [r["seconds"].get(k) for r in runs]
        ratio = f"{vals[1] / vals[0]:.2f}" if vals[0] and vals[1] is not None else ""
        lines.append(f"| {k} episodes | " + " | ".join("" if v is None else f"{v:.0f}" for v in vals) + f" | {ratio} |")
    for r in runs:  # the framework columns together (one after another before; side by side after)
        r["frameworks"] = sum(v for k, v in r["seconds"].items() if k not in ("04 calls", "base+inspace+external"))
    for label, key in (("framework columns in all", "frameworks"), ("start-ups, scoring (the rest)", "rest"),
                       ("**06 in all**", "wall")):
        vals = [r[key] for r in runs]
        lines.append(f"| {label} | " + " | ".join(f"{v:.0f}" for v in vals) + f" | {vals[1] / vals[0]:.2f} |")
    lines.append("| 04 processes (vLLM engines) | " + " | ".join(str(r["seconds"]["04 calls"]) for r in runs) + " | |")
    lines += ["", "Outcome agreement per episode (success, finish reason and turns equal; every completion id equal):",
              "", "| split | episodes | " + " | ".join(f"{p}: same outcome / same ids" for p, _ in r_pairs(runs))
              + " |", "| --- | --- |" + " --- |" * len(r_pairs(runs))]
    agree = [agreement(a["episodes"], b["episodes"]) for _, (a, b) in r_pairs(runs)]
    for split in [s for s in SPLITS if s in agree[0]]:
        lines.append(f"| {split} | {agree[0][split][0]} | " + " | ".join(f"{g[split][1]} / {g[split][2]}"
                                                                        for g in agree) + " |")
    tot = [(sum(v[1] for v in g.values()), sum(v[2] for v in g.values()), sum(v[0] for v in g.values())) for g in agree]
    lines.append("| all | " + str(tot[0][2]) + " | " + " | ".join(f"{o} / {i}" for o, i, _ in tot) + " |")
    success = [sum(r["success"] for r in x["episodes"].values()) for x in runs]
    lines += ["", "Successes: " + ", ".join(f"{r['name']} {s}" for r, s in zip(runs, success)) + "."]
    return "\n".join(lines) + "\n"


def versions():
    code = "import torch, vllm, smolagents, pydantic_ai; print(torch.__version__, vllm.__version__, " \
        "smolagents.__version__, pydantic_ai.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.split()
    return ", ".join(f"{m} {v}" for m, v in zip(("torch", "vLLM", "smolagents", "pydantic-ai"), out))


def r_pairs(runs):
    pairs = [("before vs after", (runs[0], runs[1]))]
    return pairs + ([("after vs after", (runs[1], runs[2]))] if len(runs) > 2 else [])


def main(argv=None):
    args = parse_args(argv)
    cmd = "python experiments/bench/bench_eval_cost.py " + " ".join(sys.argv[1:] if argv is None else argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_eval_cost_"))
    code = work / "before_code"
    rev = extract(args.rev, code)
    versions = [("before", code), ("after", ROOT)] + ([("after again", ROOT)] if args.repeat_after else [])
    runs = []
    for name, where in versions:
        run = work / name.replace(" ", "_")
        print(f"[bench] {name}: 06 from {where} in {run}", flush=True)
        wall, log = run_06(where, run, args)
        seconds = split_seconds(run, log)
        rest = wall - sum(v for k, v in seconds.items() if k != "04 calls")
        runs.append(dict(name=name, wall=wall, rest=rest, seconds=seconds, episodes=episodes(run)))
        print(f"[bench] {name}: {wall:.0f} s {json.dumps(seconds)}", flush=True)
    text = report(args, rev, runs, cmd)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
