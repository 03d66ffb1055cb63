"""How far two re-creations of the warm start are apart: the same machine twice, 1 vs 2 torch threads, and another
instruction set for torch's CPU kernels (ATEN_CPU_CAPABILITY=avx2 on an AVX512 machine: the proxy for another
machine); against it, how far another warm start is (SFT --seed 1: another minibatch order).
Figures: results/warmstart_repro.md.

    python experiments/bench/warmstart_repro.py --parts toy --out /tmp/toy.json                       # ~10 min on 2 cores
    python experiments/bench/warmstart_repro.py --parts smollm2 --variants a,b,t2,avx2 --out /tmp/sm.json  # ~8 min

Each variant re-creates a warm start as pipeline.warm_start does, through the stages' command lines, in its own
environment (threads, kernels):
  toy:     data/tiny_model.py (the toy preset's shape) -> 04 --eval --policy oracle (the first --toy-tasks training
           tasks under the base harness and its 10 one-factor variants) -> 05 --algo sft (--toy-epochs, lr 3e-3)
  smollm2: data/get_model.py once (shared) -> 04 oracle demos (the first --sm-tasks training tasks, base harness)
           -> 05 --algo sft, minibatches of 4 for --sm-epochs (lr 5e-5)
and compares it with variant `a`: the weights' sha256 (generation.weights_fingerprint), the largest difference
over all weights (absolute; relative: |d| / the tensor's rms) and from the sketch (generation.fingerprint_distance),
and the greedy probe: 04 --eval --backend hf --temperature 0 on the first --probe-tasks test tasks under
S0-T0-O0-C0-W0, on one thread with the variant's kernels (outcome per task, and whether every generated token id
agrees). A variant whose weights are bit-identical to `a`'s and whose probe environment is a's skips it (it is a's).
One job at a time: the stages run one after another.
"""
import argparse
import hashlib
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from common.generation import fingerprint_distance, stored_tensors, weights_fingerprint  # noqa: E402

BASE = "S0-T0-O0-C0-W0"
# name -> environment: a and b the same (two runs), t2 two threads, avx2 torch's AVX2 kernels instead of AVX512.
# One thread but in t2: on 2 cores shared with other jobs, 2 threads made the toy's SFT 6x slower (240 s vs 39 s)
VARIANTS = {"a": {"OMP_NUM_THREADS": "1"}, "b": {"OMP_NUM_THREADS": "1"}, "t2": {"OMP_NUM_THREADS": "2"},
            "avx2": {"OMP_NUM_THREADS": "1", "ATEN_CPU_CAPABILITY": "avx2"}, "seed1": {"OMP_NUM_THREADS": "1"}}
SFT_SEED = {"seed1": 1}  # 05 --seed (else 0): another minibatch order, the least change that makes another warm start


def run(cmd, env=None, log=None):
    """One stage, its wall time. -> seconds"""
    t0 = time.time()
    full = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1", **(env or {}))
    p = subprocess.run([sys.executable, *map(str, cmd)], cwd=ROOT, env=full, capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{' '.join(map(str, cmd))} failed ({p.returncode}):\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}")
    dt = time.time() - t0
    if log is not None:
        log.append(dict(cmd=" ".join(str(c) for c in cmd), env=env or {}, s=round(dt, 1)))
    print(f"[repro] {dt:6.1f} s  {' '.join(f'{k}={v}' for k, v in (env or {}).items())} {' '.join(map(str, cmd[:1]))}",
          flush=True)
    return dt


def first_rows(src, n, dst):
    dst.write_text("".join(open(src).readlines()[:n]))
    return dst


def full_difference(a, b):
    """Over every weight, in float64: max |a - b| and max over tensors of max |a - b| / rms(a)."""
    import numpy as np
    from common.generation import as_float64
    ta, tb = {n: (d, t) for n, d, _, t in stored_tensors(a)}, {n: (d, t) for n, d, _, t in stored_tensors(b)}
    max_abs = max_rel = 0.0
    for name in ta:
        x, y = as_float64(*ta[name]), as_float64(*tb[name])
        d = float(np.abs(x - y).max()) if x.size else 0.0
        rms = math.sqrt(float((x * x).mean())) if x.size else 0.0
        max_abs, max_rel = max(max_abs, d), max(max_rel, d / rms if rms else (math.inf if d else 0.0))
    return max_abs, max_rel


def probe_env(name):
    """The probe runs on one thread (on 2 shared cores, 2 threads made SmolLM2's probe 18x slower: 916 s vs 52 s)
    with the variant's kernels."""
    return dict(VARIANTS[name], OMP_NUM_THREADS="1")


def probe(policy, tasks, out, env, cfg, log):
    """Greedy episodes of `policy` on the probe. -> ({task: [success, finish_reason, turns]}, [completion ids])"""
    s = run(["04_rollout.py", "--run", cfg["space"], "--eval", "--policy", policy, "--harnesses", BASE, "--tasks",
             tasks, "--out", out, "--backend", "hf", "--temperature", 0, "--max-turns", cfg["max_turns"],
             "--max-new-tokens", cfg["max_new_tokens"], "--seed", 0], env, log)
    rows = sorted((json.loads(x) for x in open(out)), key=lambda r: r["task_id"])
    return ({r["task_id"]: [bool(r["success"]), r["finish_reason"], r["turns"]] for r in rows},
            [[t["completion_ids"] for t in r["model_turns"]] for r in rows], s)


def recreate(part, name, env, work, cfg, log):
    """One re-creation of the part's warm start in `env`. -> {sha256 of base / demos / policy, seconds, 05's config}"""
    d = work / part / name
    shutil.rmtree(d, ignore_errors=True)
    d.mkdir(parents=True)
    steps = {}
    if part == "toy":
        steps["tiny_model"] = run(["data/tiny_model.py", "--out", d / "base", "--seed", 0, "--layers", 2, "--dim",
                                   128, "--heads", 8, "--max-len", 2048, "--corpus", cfg["corpus"],
                                   "data/train_tasks.jsonl"], env, log)
        base = d / "base"
    else:
        base = cfg["smollm2"]
    steps["demos"] = run(["04_rollout.py", "--run", cfg["space"], "--eval", "--policy", "oracle", "--tokenizer", base,
                          "--harnesses", cfg["harnesses"], "--tasks", cfg["sft_tasks"], "--out", d / "demos.jsonl"],
                         env, log)
    steps["sft"] = run(["05_train.py", "--algo", "sft", "--policy", base, "--rollouts", d / "demos.jsonl", "--out",
                        d / "policy", "--epochs", cfg["epochs"], "--lr", cfg["lr"], "--seed", SFT_SEED.get(name, 0),
                        *(["--minibatch-size", cfg["minibatch"]] if cfg.get("minibatch") else [])], env, log)
    c05 = json.loads((d / "05_train_config.json").read_text())
    return dict(base=weights_fingerprint(base)["sha256"], demos=hashlib.sha256((d / "demos.jsonl").read_bytes())
                .hexdigest(), policy=d / "policy", seconds={k: round(v, 1) for k, v in steps.items()},
                threads=c05["threads"], cpu_kernels=c05["cpu_kernels"], steps=c05["optimizer_steps"],
                loss=[c05["first_loss"], c05["last_loss"]])


def compare_part(part, work, cfg, variants, log):
    """Every variant re-created, then compared with `a` (weights, sketch, probe). -> rows"""
    made = {name: recreate(part, name, VARIANTS[name], work, cfg, log) for name in variants}
    fps = {name: weights_fingerprint(m["policy"]) for name, m in made.items()}
    probes, rows = {}, []
    for name, m in made.items():
        same = fps[name]["sha256"] == fps["a"]["sha256"]
        if name == "a" or not (same and probe_env(name) == probe_env("a")):
            probes[name] = probe(m["policy"], cfg["probe_tasks"], work / part / name / "probe.jsonl", probe_env(name),
                                 cfg, log)
        dist = fingerprint_distance(fps["a"], fps[name])
        full = full_difference(made["a"]["policy"], m["policy"]) if not same else (0.0, 0.0)
        p = probes.get(name)
        rows.append(dict(part=part, variant=name, env=VARIANTS[name], threads=m["threads"], kernels=m["cpu_kernels"],
                         steps=m["steps"], loss=m["loss"], seconds=m["seconds"],
                         same_base=m["base"] == made["a"]["base"], same_demos=m["demos"] == made["a"]["demos"],
                         same_hash=same, sha256=fps[name]["sha256"][:16], full_max_abs=full[0], full_max_rel=full[1],
                         sketch=dist, probe=p[0] if p else None, probe_s=round(p[2], 1) if p else None,
                         probe_outcomes_equal=(p[0] == probes["a"][0]) if p else None,
                         probe_tokens_equal=(p[1] == probes["a"][1]) if p else None))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--work", default="runs/warmstart-repro", help="scratch folder (replaced part by part)")
    ap.add_argument("--out", required=True, help="the figures (JSON); a summary table is printed")
    ap.add_argument("--parts", default="toy,smollm2")
    ap.add_argument("--variants", default="a,b,t2,avx2,seed1", help=f"of {sorted(VARIANTS)}; `a` is the reference")
    ap.add_argument("--smollm2", help="an existing SmolLM2 folder (data/get_model.py's); default: made in --work")
    ap.add_argument("--toy-tasks", type=int, default=16)
    ap.add_argument("--toy-epochs", type=int, default=2)
    ap.add_argument("--sm-tasks", type=int, default=8)
    ap.add_argument("--sm-epochs", type=int, default=1)
    ap.add_argument("--probe-tasks", type=int, default=4)
    args = ap.parse_args()
    t0, work, log = time.time(), Path(args.work).resolve(), []
    variants = ["a"] + [v for v in args.variants.split(",") if v != "a"]
    space = work / "space"  # 01 and 02's one-factor set: the warm start's harnesses
    work.mkdir(parents=True, exist_ok=True)
    run(["01_harness_space.py", "--run", space], None, log)
    run(["02_orthogonal_design.py", "--run", space, "--method", "one-factor"], None, log)
    one_factor = ",".join(json.loads(x)["harness_id"] for x in open(space / "train_harnesses.jsonl"))
    probe_tasks = first_rows(ROOT / "data/test_tasks.jsonl", args.probe_tasks, work / "probe_tasks.jsonl")
    rows = []
    for part in args.parts.split(","):
        if part == "toy":
            run(["04_rollout.py", "--run", space, "--eval", "--policy", "oracle", "--harnesses", one_factor, "--tasks",
                 "data/train_tasks.jsonl", "--out", work / "toy_corpus.jsonl"], None, log)  # the tokenizer's corpus
            cfg = dict(space=space, corpus=work / "toy_corpus.jsonl", harnesses=one_factor, epochs=args.toy_epochs,
                       lr="3e-3", sft_tasks=first_rows(ROOT / "data/train_tasks.jsonl", args.toy_tasks,
                                                       work / "toy_sft_tasks.jsonl"),
                       probe_tasks=probe_tasks, max_turns=6, max_new_tokens=112)
        else:
            sm = Path(args.smollm2) if args.smollm2 else work / "smollm2"
            if not sm.exists():
                run(["data/get_model.py", "--out", sm], None, log)
            cfg = dict(space=space, smollm2=sm, harnesses=BASE, epochs=args.sm_epochs, lr="5e-5", minibatch=4,
                       sft_tasks=first_rows(ROOT / "data/train_tasks.jsonl", args.sm_tasks,
                                            work / "sm_sft_tasks.jsonl"),
                       probe_tasks=probe_tasks, max_turns=5, max_new_tokens=96)
        t_part = time.time()
        rows += compare_part(part, work, cfg, variants, log)
        print(f"[repro] {part}: {time.time() - t_part:.0f} s", flush=True)
    cpu = next((ln.split(":", 1)[1].strip() for ln in subprocess.run(["lscpu"], capture_output=True, text=True)
                .stdout.splitlines() if ln.startswith("Model name")), platform.processor())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout
    import torch
    out = dict(command=" ".join(sys.argv), commit=commit.strip(), cpu=cpu, cores=os.cpu_count(),
               torch=torch.__version__, wall_s=round(time.time() - t0, 1), rows=rows, log=log)
    Path(args.out).write_text(json.dumps(out, indent=1, default=str) + "\n")
    print("| part | variant | threads | kernels | same demos | same sha256 | max abs (all weights) | max rel | sketch "
          "max abs / rel | probe outcomes | probe tokens |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['part']} | {r['variant']} | {r['threads']} | {r['kernels']} | {r['same_demos']} "
              f"| {r['same_hash']} | {r['full_max_abs']:.3g} | {r['full_max_rel']:.3g} "
              f"| {r['sketch']['max_abs']:.3g} / {r['sketch']['max_rel']:.3g} | {r['probe_outcomes_equal']} "
              f"| {r['probe_tokens_equal']} |")
    print(f"[repro] {out['wall_s']:.0f} s -> {args.out}")


if __name__ == "__main__":
    main()
