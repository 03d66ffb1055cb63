"""06's rollouts: stage 04 (eval mode) makes every split's episodes in one call; files already there are reused
only when the same checkpoint and settings made them (checkpoint.json beside them) and they hold exactly this call's
(task, harness) pairs. 06_evaluate.py calls make_rollouts, check_made_by (--no-rollout) and check_pairs; the rest is
theirs.

Writes  RUN/eval/<label>/<split>.jsonl, RUN/eval/<label>/checkpoint.json, RUN/eval/<label>/tasks.jsonl (--max-tasks)
"""
import hashlib
import json
import sys
from pathlib import Path

from common.plumbing import fail, jsonl_text, read_json, read_jsonl, run_child, write_atomic
from common.schemas import FRAMEWORKS

ROOT = Path(__file__).resolve().parents[1]  # the repository root, where the stages are


def make_rollouts(args, run, policy, out_dir, ids, want, splits):
    """Ask 04 (eval mode) for the rollouts of every split in ONE call (one vLLM engine start): base, in-space and
    external episodes in lockstep, then each framework column inside its framework on its first N tasks (04
    --harnesses ...,NAME:N); the records are then split by harness id into one file per split. Existing files are
    reused (resume) only if checkpoint.json says the same checkpoint and settings made them and they hold exactly
    this call's pairs."""
    request, ck_path = checkpoint_request(args, policy), out_dir / "checkpoint.json"
    old = read_json(ck_path) if ck_path.is_file() else None
    same = old is not None and {k: old.get(k) for k in request} == request
    existing = [] if args.overwrite else [s for s in splits if (out_dir / f"{s}.jsonl").is_file()]
    check_reusable(out_dir, existing, want, request, old)
    done = set(old.get("splits", [])) if same else set()
    todo = [s for s in splits if s not in existing]
    if not todo:
        return request
    # the column's tasks: the first --framework-tasks N (want holds exactly those)
    specs = {"base": args.base_harness, "inspace": ",".join(ids["inspace"]), "external": ",".join(ids["external"]),
             **{s: f"{s}:{len({t for t, _ in want[s]})}" for s in FRAMEWORKS}}
    out = out_dir / "episodes.jsonl"
    cmd = rollout_command(args, run, policy, ",".join(specs[s] for s in todo), tasks_file(args, out_dir), out,
                          "external" in todo)
    print("[06] " + "+".join(todo) + ": " + " ".join(cmd[1:]), flush=True)
    # run_child passes SIGINT / SIGTERM on to 04 and waits: stopping 06 stops 04 and its vLLM engine too
    if run_child(cmd, on_stop="[06] the rollouts were not finished") != 0:
        fail("stage 04 failed while making the rollouts (command above)")
    rows = [r for _, r in read_jsonl(out, required=("harness_id",))]  # one file per split, by harness id
    split_of = {args.base_harness: "base", **{h: "inspace" for h in ids["inspace"]},
                **{h: s for s, h in FRAMEWORKS.items()}}
    for split in todo:
        write_atomic(out_dir / f"{split}.jsonl",
                     jsonl_text(r for r in rows if split_of.get(r["harness_id"], "external") == split))
    out.unlink()
    write_atomic(ck_path, json.dumps({**request, "splits": sorted(done | set(todo))}, indent=2))
    return request


def check_reusable(out_dir, existing, want, request, old):
    """Split files already in out_dir are reused only if checkpoint.json (old) says the same checkpoint and
    settings (request) made them, lists their split, and they hold exactly this call's pairs."""
    ck_path, redo = out_dir / "checkpoint.json", "pass --overwrite to redo them, or another --label"
    for split in existing:
        path = out_dir / f"{split}.jsonl"
        if old is None:
            fail(f"{path} exists but {ck_path} does not, so what made it is unknown; {redo} "
                 "(or --no-rollout to score it as it is)")
        if {k: old.get(k) for k in request} != request:
            field = next(k for k in request if old.get(k) != request[k])
            fail(f"{ck_path}: the rollouts in {out_dir} were made with {field} = {old.get(field)!r}, this call asks "
                 f"for {request[field]!r}; {redo}")
        if split not in old.get("splits", []):
            fail(f"{path} is not among the splits {ck_path} lists; {redo}")
        rows = [r for _, r in read_jsonl(path, required=("task_id", "harness_id"))]
        check_pairs(path, rows, want[split], redo)
        print(f"[06] {path} exists, made by the same checkpoint and settings: reusing it (--overwrite to redo)")


def rollout_command(args, run, policy, spec, tasks, out, external):
    """The 04 --eval command line of one call: this call's policy, harnesses, tasks and sampling settings."""
    cmd = [sys.executable, str(ROOT / "04_rollout.py"), "--run", str(run), "--eval",
           "--policy", str(policy), "--harnesses", spec, "--tasks", str(tasks),
           "--samples", str(args.samples), "--temperature", str(args.temperature),
           "--backend", args.backend, "--seed", str(args.seed), "--out", str(out)]
    for flag, value in (("--max-turns", args.max_turns), ("--max-new-tokens", args.max_new_tokens),
                        ("--max-model-len", args.max_model_len), ("--dtype", args.dtype)):
        cmd += [flag, str(value)] if value else []
    for hf in args.harness_file if external else []:
        cmd += ["--harness-file", hf]
    return cmd


def tasks_file(args, out_dir):
    """The evaluation tasks, optionally cut to the first --max-tasks (written beside the rollouts)."""
    if args.max_tasks is None:
        return Path(args.tasks)
    rows = [r for _, r in read_jsonl(args.tasks, required=("task_id",))][: args.max_tasks]
    path = out_dir / "tasks.jsonl"
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in rows))
    return path


def policy_fingerprint(policy):
    """sha256 over the name, size, first and last 1 MiB of every file of the checkpoint folder, sorted (cheap, and
    changes when the weights do); optimizer.pt is left out: the pipeline deletes it after the next iteration."""
    if str(policy) == "oracle":
        return "oracle"
    h = hashlib.sha256()
    for f in sorted(p for p in Path(policy).rglob("*") if p.is_file() and p.name != "optimizer.pt"):
        size = f.stat().st_size
        h.update(f"{f.relative_to(policy).as_posix()}\0{size}\0".encode())
        with open(f, "rb") as fh:
            h.update(fh.read(1 << 20))
            fh.seek(max(size - (1 << 20), 0))
            h.update(fh.read(1 << 20))
    return h.hexdigest()


def checkpoint_request(args, policy):
    """What this call's rollouts are made by; stored as eval/<label>/checkpoint.json beside them."""
    return {"policy": "oracle" if str(policy) == "oracle" else str(Path(policy).resolve()),
            "fingerprint": policy_fingerprint(policy), "samples": args.samples, "temperature": args.temperature,
            "max_turns": args.max_turns, "max_new_tokens": args.max_new_tokens, "seed": args.seed}


def check_pairs(path, rows, want, hint):
    """A split file must hold exactly the (task_id, harness_id) pairs this call evaluates."""
    have = {(r["task_id"], r["harness_id"]) for r in rows}
    if have != want:
        extra, missing = sorted(have - want), sorted(want - have)
        fail(f"{path}: its (task_id, harness_id) pairs are not the ones this call evaluates ({len(extra)} extra"
             f"{', e.g. ' + str(extra[0]) if extra else ''}; {len(missing)} missing"
             f"{', e.g. ' + str(missing[0]) if missing else ''}); {hint}")


def check_made_by(path, rows, ck_path, redo):
    """--no-rollout: a split file is scored only if the checkpoint.json beside it lists its split and names the
    policy its episodes say made them (a file copied from another label's folder is refused)."""
    if not ck_path.is_file():
        print(f"[06] note: {ck_path} missing: what made {path.name} is unknown (scored as it is)")
        return
    old = read_json(ck_path)
    split = path.stem
    if not isinstance(old, dict) or split not in old.get("splits", []):
        fail(f"{path} is not among the splits {ck_path} lists; {redo}")
    made_by = {e["policy"] for e in rows if "policy" in e}
    want = old.get("policy")
    for p in sorted(made_by):
        if p != want and ("oracle" if p == "oracle" else str(Path(p).resolve())) != want:
            fail(f"{path}: its episodes were made by {p!r}, but {ck_path} says {want!r}; {redo}")
