"""gpu_check.py: one run that tries the gpu preset's pieces on one CUDA machine and brings every figure back.

    python experiments/bench/gpu_check.py --device cuda --out gpu_check.json    # the device run (H200: a few minutes)
    python experiments/bench/gpu_check.py                                       # CPU mode where there is no CUDA (2-5 min)

Needs torch and transformers only: no vLLM, no network (the children run with HF_HUB_OFFLINE=1). The model is a
random-weight Qwen2ForCausalLM with Qwen2.5-0.5B-Instruct's exact configuration (`qwen_config`), written with
save_pretrained beside a tokenizer built offline by data/tiny_model.py (byte-level BPE, ChatML template), its
vocabulary padded to the model's 151,936 ids so that every sampled id decodes to text. The stages are called
through their command lines only. Steps (each records ok / failed, its seconds and its error's tail; a failed step
does not stop the others):

  model      the config, the tokenizer and the weights (plus a tiny model of the same architecture for torchrun)
  train      05 (GRPO, the gpu preset's flags: --epochs 2 --micro-batch-tokens 32768 --amp auto --lr 1e-6) on a
             synthetic rollouts file shaped like the preset's worst case (8-turn episodes of 256 completion tokens,
             8,192 positions each, merged by 05 into one sequence per episode): peak memory
             (torch.cuda.max_memory_allocated; CPU: peak RSS), tokens/s
  train_mb8  the same with --micro-batch-tokens 65536: 8 such episodes in one micro-batch (docs/engineering.md's
             worst micro-batch, estimated there at ~20 GiB)
  bare       a bare forward + backward + AdamW loop over the same sequences (same epochs, minibatches and
             micro-batches; LM head on the completion tokens only, one pass): tokens/s and the trainer's time
             over the bare time (target <= 1.3, docs/engineering.md)
  rollout    01 -> 02 -> 03 -> 04 --backend hf, one iteration of the preset's episode shape (8 samples per task,
             8 turns x 256 tokens; fewer tasks): episodes/s and the share of 04's wall time outside generation
  pipeline   pipeline.py's miniature (toy preset, tests/test_pipeline.py's sizes; CPU mode: smaller), every stage
  pytest_05  the 05 test files (on a CUDA machine their 05 code runs on CUDA): passed / failed counts
  torchrun   torchrun --nproc_per_node 1 05_train.py on a tiny job, without and with --fsdp (one rank: NCCL on a GPU,
             FSDP2 over a process group of one)

Writes every figure to --out (JSON) and prints a short table. docs/engineering.md: what each figure means.
"""
import argparse
import json
import math
import os
import platform
import random
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Qwen/Qwen2.5-0.5B-Instruct's config.json (architecture fields); bos/eos/pad come from our tokenizer
QWEN25_05B = dict(vocab_size=151936, hidden_size=896, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2, intermediate_size=4864, tie_word_embeddings=True, rope_theta=1000000.0,
                  max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_act="silu", use_sliding_window=False,
                  attention_dropout=0.0, initializer_range=0.02)
TINY_DIMS = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=176, max_position_embeddings=4096)
# per mode: the rollouts file of `train` (episodes, GRPO group, turns, first prompt, tool tokens between turns,
# completion tokens per turn), 05's micro-batch tokens, 04's shape, the pipeline's sizes, the pytest files
# (on CPU one test: the quick suite runs the whole file; here the step itself is what is checked)
SIZES = {
    "cuda": dict(episodes=16, group=8, turns=8, prompt=1027, tool=731, completion=256, mb_tokens=32768,
                 rollout=dict(tasks=4, group=8, turns=8, tokens=256),
                 pipeline=["--iterations", 3, "--tasks-per-iteration", 2, "--group-size", 2, "--eval-tasks", 3,
                           "--eval-heldout", 3, "--sft-tasks", 2, "--sft-epochs", 1, "--tiny-size", "1,32,2",
                           "--max-new-tokens", 48, "--framework-tasks", 0],
                 pytest=["tests/test_05_numerics.py", "tests/test_05_cost.py"]),
    "cpu": dict(episodes=16, group=4, turns=3, prompt=40, tool=12, completion=16, mb_tokens=256,
                rollout=dict(tasks=2, group=2, turns=2, tokens=16),
                pipeline=["--iterations", 1, "--tasks-per-iteration", 2, "--group-size", 2, "--eval-tasks", 1,
                          "--eval-heldout", 1, "--sft-tasks", 1, "--sft-epochs", 1, "--tiny-size", "1,32,2",
                          "--max-new-tokens", 16, "--framework-tasks", 0, "--stop-after", "06-untrained"],
                pytest=["tests/test_05_numerics.py::test_lm_head_is_fp32_under_bf16_autocast"]),
}
TIMEOUTS = dict(train=240, rollout=240, pipeline=240, pytest_05=180, torchrun=120)
BUDGET_S = dict(cuda=450, cpu=1200)  # the whole check (--budget-s): a step gets what is left of it at the most, so
# one device call of 8 minutes brings back every figure that fit; a step started with under 10 s left is skipped
DEADLINE = [float("inf")]  # set in main: time.perf_counter() + --budget-s


def timeout(name):
    """Seconds a step's child may run: its own limit, or what is left of the budget if that is less."""
    left = DEADLINE[0] - time.perf_counter()
    if left < 10:
        raise RuntimeError(f"skipped: the check's time budget (--budget-s) was spent before {name}")
    return min(TIMEOUTS[name], left)
# runs a stage's command line (runpy, as `python SCRIPT ARGS`), then prints its peak memory
PEAK_RUNNER = r'''
import json, resource, runpy, sys
import torch
script, sys.argv = sys.argv[1], sys.argv[1:]
try:
    runpy.run_path(script, run_name="__main__")
finally:
    cuda = torch.cuda.is_available()
    print("GPU_CHECK_PEAK " + json.dumps(dict(
        cuda_max_allocated=torch.cuda.max_memory_allocated() if cuda else None,
        cuda_max_reserved=torch.cuda.max_memory_reserved() if cuda else None,
        rss_max=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)), flush=True)
'''


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=["cuda", "cpu"], help="cuda: the gpu preset's sizes; cpu: small sizes "
                   "(default: cuda when torch sees a GPU)")
    p.add_argument("--out", default=str(ROOT / "experiments" / "bench" / "gpu_check.json"), help="JSON file of every figure")
    p.add_argument("--work", help="folder for the models and runs (default: a temporary one, deleted at the end)")
    p.add_argument("--budget-s", type=float, help="the whole check's wall time in seconds (default: 450 on cuda, "
                   "under the device's 8 minutes; 1200 on cpu)")
    p.add_argument("--phase", choices=["bare"], help=argparse.SUPPRESS)  # the bare loop, in its own process
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------------- the model
def qwen_config(tiny=False, vocab=None, bos=None, eos=None, pad=None):
    """Qwen2Config kwargs: Qwen2.5-0.5B's exactly, or (tiny) the same architecture with small dims and `vocab`."""
    cfg = dict(QWEN25_05B, bos_token_id=bos, eos_token_id=eos, pad_token_id=pad)
    if tiny:
        cfg.update(TINY_DIMS, vocab_size=vocab)
    return cfg


def rope_theta(config_json):
    """rope theta from a config.json dict (transformers 5 keeps it in rope_parameters)."""
    return config_json.get("rope_theta") or (config_json.get("rope_parameters") or {}).get("rope_theta")


def build_tokenizer(work, env):
    """data/tiny_model.py's byte-level BPE + ChatML tokenizer (trained on the training tasks, offline). -> folder"""
    src = work / "tok_src"
    run([sys.executable, "data/tiny_model.py", "--out", src, "--corpus", "data/train_tasks.jsonl",
         "--vocab-size", 1024, "--layers", 1, "--dim", 8, "--heads", 1], env, 120)
    return src


def pad_tokenizer(src, vocab, out):
    """The tokenizer of `src` with its vocabulary padded to `vocab` ids by tokens " w<N>": encoding never produces
    them, but every id a model of that vocabulary samples decodes to text. -> (out, size before padding)"""
    out.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name.startswith("tokenizer") or f.name in ("special_tokens_map.json", "chat_template.jinja"):
            shutil.copy(f, out / f.name)
    tj = json.loads((src / "tokenizer.json").read_text())
    table = tj["model"]["vocab"]
    n = max(max(table.values()), max(t["id"] for t in tj["added_tokens"])) + 1
    for i in range(n, vocab):
        table[f"\u0120w{i}"] = i  # \u0120: the byte-level alphabet's space
    (out / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    return out, n


def write_config(folder, cfg_kwargs):
    """The Qwen2Config, written to folder/config.json (no weights allocated). -> the config"""
    from transformers import Qwen2Config
    config = Qwen2Config(architectures=["Qwen2ForCausalLM"], **cfg_kwargs)
    config.save_pretrained(folder)
    return config


def build_model(folder, cfg_kwargs, tok_dir, device, seed=0):
    """Random-weight Qwen2ForCausalLM (fp32, like a hub checkpoint loaded by 05) + the tokenizer, save_pretrained."""
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2ForCausalLM
    torch.manual_seed(seed)
    config = write_config(folder, cfg_kwargs)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model.generation_config = GenerationConfig(eos_token_id=[cfg_kwargs["eos_token_id"]],
                                               pad_token_id=cfg_kwargs["pad_token_id"])
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(tok_dir).save_pretrained(folder)
    n = sum(p.numel() for p in model.parameters())
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return n


def step_model(ctx):
    from transformers import AutoTokenizer
    sizes = ctx["sizes"]
    src = build_tokenizer(ctx["work"], ctx["env"])
    tok_dir, base_vocab = pad_tokenizer(src, QWEN25_05B["vocab_size"] if ctx["mode"] == "cuda" else 0,
                                        ctx["work"] / "tok")
    tok = AutoTokenizer.from_pretrained(tok_dir)
    ids = dict(bos=tok.convert_tokens_to_ids("<|endoftext|>"), eos=tok.convert_tokens_to_ids("<|im_end|>"),
               pad=tok.convert_tokens_to_ids("<|endoftext|>"))
    tiny = qwen_config(tiny=True, vocab=len(tok) if ctx["mode"] == "cpu" else base_vocab, **ids)
    res = dict(tokenizer_vocab=len(tok), bpe_vocab=base_vocab, tiny_params=build_model(
        ctx["work"] / "tiny", tiny, src, "cpu"))
    if ctx["mode"] == "cuda":
        res["params"] = build_model(ctx["work"] / "model", qwen_config(**ids), tok_dir, "cuda")
    else:
        shutil.copytree(ctx["work"] / "tiny", ctx["work"] / "model")
        res["params"] = res["tiny_params"]
    written = json.loads((ctx["work"] / "model" / "config.json").read_text())
    res["config"] = {k: written.get(k) for k in QWEN25_05B if k != "rope_theta"}
    res["config"]["rope_theta"] = rope_theta(written)
    res["architectures"] = written.get("architectures")
    write_rollouts(ctx["work"] / "rollouts.jsonl", sizes, written["vocab_size"])
    write_rollouts(ctx["work"] / "tiny_rollouts.jsonl", SIZES["cpu"], tiny["vocab_size"])
    return res


# ------------------------------------------------------------------------------------ the rollouts file
def write_rollouts(path, s, vocab, seed=0):
    """Records in 04's schema: full-history turns (turn k's prompt = turn k-1's prompt + completion + tool ids), so
    05 merges each episode into one sequence of prompt + turns x (completion + tool) - tool positions. Rewards
    alternate inside each group (every GRPO group has signal: no sequence is skipped); vLLM-style sampler and
    log-probs, as the gpu preset's rollouts carry (05 then applies truncated IS)."""
    rng = random.Random(seed)
    ids = lambda n: [rng.randrange(3, vocab) for _ in range(n)]
    lines = []
    for e in range(s["episodes"]):
        prompt, turns = ids(s["prompt"]), []
        for _ in range(s["turns"]):
            comp = ids(s["completion"])
            turns.append({"prompt_ids": prompt, "completion_ids": comp,
                          "logprobs": [round(-rng.random() * 3, 4) for _ in comp]})
            prompt = prompt + comp + ids(s["tool"])
        lines.append(json.dumps({"episode_id": f"e{e}", "group_id": f"g{e // s['group']}", "reward": float(e % 2),
                                 "temperature": 1.0, "policy": "synthetic", "task_id": f"t{e // s['group']}",
                                 "harness_id": "S0-T0-O0-C0-W0", "success": e % 2 == 1, "turns": s["turns"],
                                 "sampler": {"backend": "vllm", "dtype": "bfloat16"}, "model_turns": turns}))
    Path(path).write_text("\n".join(lines) + "\n")


def merged_sequences(path):
    """Each episode as 05 merges it: (ids, mask) with mask 1 on completion tokens. Only full-history files."""
    seqs = []
    for line in Path(path).read_text().splitlines():
        r = json.loads(line)
        ids, mask = [], []
        for t in r["model_turns"]:
            assert t["prompt_ids"][:len(ids)] == ids, "not a full-history episode"
            mask += [0] * (len(t["prompt_ids"]) - len(ids)) + [1] * len(t["completion_ids"])
            ids = t["prompt_ids"] + t["completion_ids"]
        seqs.append((ids, mask))
    return seqs


# ---------------------------------------------------------------------------------------- 05 and bare
def train_flags(ctx, out, extra):
    return ["--algo", "grpo", "--policy", ctx["work"] / "model", "--rollouts", ctx["work"] / "rollouts.jsonl",
            "--out", out, "--epochs", 2, "--minibatches", 2, "--amp", "auto", "--lr", 1e-6, "--seed", 0, *extra]


def step_train(ctx, name, extra):
    out = ctx["work"] / name / "policy"
    text = run([sys.executable, "-c", PEAK_RUNNER, "05_train.py", *train_flags(ctx, out, extra)], ctx["env"],
               timeout("train"))
    peak = json.loads(re.findall(r"^GPU_CHECK_PEAK (.*)$", text, re.M)[-1])
    c = json.loads((out.parent / "05_train_config.json").read_text())
    seqs = merged_sequences(ctx["work"] / "rollouts.jsonl")
    tokens = 2 * sum(len(ids) for ids, _ in seqs)  # 2 epochs over every position of the merged sequences
    seconds = c["prep_s"] + c["update_s"]  # old log-probs + optimizer steps; not load / save
    res = dict(flags=" ".join(map(str, extra)), work_s=seconds, prep_s=c["prep_s"], update_s=c["update_s"],
               tokens=tokens, tokens_per_s=tokens / seconds, device=c.get("device"), bf16=c.get("bf16_autocast"),
               sequences=c.get("sequences"), optimizer_steps=c.get("optimizer_steps"),
               positions_per_sequence=max(len(ids) for ids, _ in seqs), loss=[c.get("first_loss"), c.get("last_loss")],
               warnings=c.get("warnings"))
    res.update(peak_figures(peak))
    return res


def positions(s):
    """positions of one merged episode: first prompt + turns x completion + the tool tokens between turns"""
    return s["prompt"] + s["turns"] * s["completion"] + (s["turns"] - 1) * s["tool"]


def peak_figures(peak):
    gib = lambda b: None if b is None else round(b / 2 ** 30, 3)
    return dict(peak_gib=gib(peak["cuda_max_allocated"] if peak["cuda_max_allocated"] is not None else peak["rss_max"]),
                peak_kind="torch.cuda.max_memory_allocated" if peak["cuda_max_allocated"] is not None else
                "peak RSS of the process", cuda_reserved_gib=gib(peak["cuda_max_reserved"]))


def bare_loop(work, mb_tokens, epochs=2, minibatches=2, lr=1e-6, seed=0):
    """forward + backward + AdamW over the merged sequences: 05's device, dtype (bf16 autocast on a bf16 GPU, fp32
    LM head), gradient checkpointing on CUDA, epochs x minibatches steps, micro-batches of <= mb_tokens padded
    positions; the loss is the masked NLL of the completion tokens (LM head on those positions only)."""
    import torch
    from transformers import AutoModelForCausalLM
    cuda = torch.cuda.is_available()
    device, amp = ("cuda", torch.cuda.is_bf16_supported()) if cuda else ("cpu", False)
    model = AutoModelForCausalLM.from_pretrained(work / "model", dtype=torch.float32).to(device)
    model.config.use_cache = False
    if cuda:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    seqs = merged_sequences(work / "rollouts.jsonl")
    gen = torch.Generator().manual_seed(seed)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    start, steps, size = time.perf_counter(), 0, -(-len(seqs) // minibatches)
    for _ in range(epochs):
        order = torch.randperm(len(seqs), generator=gen).tolist()
        for j in range(0, len(seqs), size):
            chunk = sorted((seqs[k] for k in order[j:j + size]), key=lambda s: len(s[0]))
            n_b = sum(sum(m) for _, m in chunk)
            micro = []
            for s in chunk:  # greedy: sequences x longest <= mb_tokens (as 05's --micro-batch-tokens)
                if micro and (len(micro[-1]) + 1) * len(s[0]) > mb_tokens:
                    micro.append([s])
                elif micro:
                    micro[-1].append(s)
                else:
                    micro.append([s])
            for mb in micro:
                L = max(len(ids) for ids, _ in mb)
                inp = torch.zeros((len(mb), L), dtype=torch.long)  # [B, L], right padding
                msk = torch.zeros((len(mb), L), dtype=torch.bool)  # [B, L]
                for b, (ids, m) in enumerate(mb):
                    inp[b, :len(ids)], msk[b, :len(ids)] = torch.tensor(ids), torch.tensor(m, dtype=torch.bool)
                inp, msk = inp.to(device), msk.to(device)
                with torch.autocast(device, dtype=torch.bfloat16, enabled=amp):
                    h = model.model(input_ids=inp).last_hidden_state  # [B, L, H]
                sel = msk[:, 1:]  # position t predicts token t+1
                logits = model.lm_head(h[:, :-1][sel].float())  # [N, V] fp32, completion tokens only
                logp = torch.log_softmax(logits, -1).gather(1, inp[:, 1:][sel][:, None])[:, 0]  # [N]
                (-(logp.sum()) / n_b).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
            steps += 1
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return dict(seconds=seconds, tokens=epochs * sum(len(ids) for ids, _ in seqs), steps=steps, device=device,
                bf16=amp, cuda_max_allocated=torch.cuda.max_memory_allocated() if cuda else None,
                cuda_max_reserved=torch.cuda.max_memory_reserved() if cuda else None,
                rss_max=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def step_bare(ctx):
    text = run([sys.executable, __file__, "--phase", "bare", "--work", ctx["work"], "--device", ctx["mode"]],
               ctx["env"], timeout("train"))
    r = json.loads(re.findall(r"^BARE (.*)$", text, re.M)[-1])
    res = dict(work_s=r["seconds"], tokens=r["tokens"], tokens_per_s=r["tokens"] / r["seconds"],
               optimizer_steps=r["steps"], device=r["device"], bf16=r["bf16"])
    res.update(peak_figures(r))
    train = ctx["results"].get("train", {})
    if train.get("ok"):
        res["trainer_over_bare"] = train["work_s"] / r["seconds"]  # target <= 1.3
    return res


# ------------------------------------------------------------------------------- 04, pipeline, tests
def step_rollout(ctx):
    r, s = ctx["work"] / "run04", ctx["sizes"]["rollout"]
    for cmd in (["01_harness_space.py", "--run", r], ["02_orthogonal_design.py", "--run", r],
                ["03_assignment.py", "--run", r, "--tasks", "data/train_tasks.jsonl"]):
        run([sys.executable, *cmd], ctx["env"], 60)
    t = time.perf_counter()
    run([sys.executable, "04_rollout.py", "--run", r, "--iteration", 0, "--policy", ctx["work"] / "model",
         "--backend", "hf", "--tasks", "data/train_tasks.jsonl", "--tasks-per-iteration", s["tasks"],
         "--group-size", s["group"], "--max-turns", s["turns"], "--max-new-tokens", s["tokens"], "--seed", 0],
        ctx["env"], timeout("rollout"))
    process_s = time.perf_counter() - t
    c = json.loads((r / "iter_000" / "04_rollout_config.json").read_text())
    recs = [json.loads(x) for x in (r / "iter_000" / "rollouts.jsonl").read_text().splitlines() if x.strip()]
    turns = [t for e in recs for t in e["model_turns"]]
    wall, gen = c["wall_seconds"], c["generation_seconds"]
    return dict(episodes=len(recs), model_turns=len(turns), wall_s=wall, generation_s=gen, process_s=process_s,
                episodes_per_s=len(recs) / wall, outside_generation_share=(wall - gen) / wall,  # target < 0.1
                completion_tokens=sum(len(t["completion_ids"]) for t in turns),
                completion_tokens_per_s=sum(len(t["completion_ids"]) for t in turns) / gen,
                max_prompt_tokens=max(len(t["prompt_ids"]) for t in turns), sampler=recs[0].get("sampler"),
                shape=s)


def step_pipeline(ctx):
    r = ctx["work"] / "pipeline"
    t = time.perf_counter()
    run([sys.executable, "pipeline.py", "--run", r, "--warmstart", ctx["work"] / "warmstart",  # not a cached one
         *ctx["sizes"]["pipeline"]], ctx["env"], timeout("pipeline"))
    configs = [*r.rglob("05_train_config.json"), *(ctx["work"] / "warmstart").rglob("05_train_config.json")]
    devices = sorted({json.loads(p.read_text()).get("device") for p in configs})
    return dict(wall_s=time.perf_counter() - t, flags=" ".join(map(str, ctx["sizes"]["pipeline"])),
                stage05_devices=devices, results_md=(r / "results.md").is_file(),
                stage05_runs=len(configs), step_s=json.loads((r / "step_times.json").read_text()))


def step_pytest(ctx):
    files = ctx["sizes"]["pytest"]
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *files], cwd=ROOT,
                          env=ctx["env"], capture_output=True, text=True, timeout=timeout("pytest_05"))
    last = (proc.stdout.strip().splitlines() or [""])[-1]
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", last)}
    if proc.returncode:
        raise RuntimeError(f"pytest exit {proc.returncode}: {last}\n{tail(proc.stdout + proc.stderr)}")
    return dict(files=files, summary=last, **counts)


def step_torchrun(ctx, fsdp):
    out = ctx["work"] / ("torchrun_fsdp" if fsdp else "torchrun") / "policy"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", 1, "--",
           "05_train.py", "--algo", "grpo", "--policy", ctx["work"] / "tiny", "--rollouts",
           ctx["work"] / "tiny_rollouts.jsonl", "--out", out, "--lr", 1e-4, "--seed", 0] + (["--fsdp"] if fsdp else [])
    proc = subprocess.run(list(map(str, cmd)), cwd=ROOT, env=ctx["env"], capture_output=True, text=True,
                          timeout=timeout("torchrun"))
    text = proc.stdout + proc.stderr
    if proc.returncode == 0:
        c = json.loads((out.parent / "05_train_config.json").read_text())
        return dict(rc=0, device=c.get("device"), optimizer_steps=c.get("optimizer_steps"),
                    work_s=c["prep_s"] + c["update_s"])
    raise RuntimeError(f"exit {proc.returncode}\n{tail(text)}")


# ----------------------------------------------------------------------------------------- plumbing
def tail(text, n=2000):
    return text[-n:]


def run(cmd, env, timeout):
    """A child from the repo root; its stdout + stderr, or RuntimeError with their tail."""
    cmd = list(map(str, cmd))
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if proc.returncode:
        raise RuntimeError(f"{' '.join(cmd[:3])} ... exit {proc.returncode}\n{tail(proc.stdout + proc.stderr)}")
    return proc.stdout + proc.stderr


def child_env(mode):
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_DATASETS_OFFLINE="1",
               PYTHONUNBUFFERED="1", TOKENIZERS_PARALLELISM="false")
    if mode == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""  # the stages pick CUDA whenever they see it
    return env


def finite(x):
    return isinstance(x, (int, float)) and math.isfinite(x)


def print_table(report):
    print(f"\ngpu_check ({report['mode']}: {report['device_name']}), {report['wall_s']:.0f} s -> {report['out']}")
    keys = ("peak_gib", "tokens_per_s", "trainer_over_bare", "episodes_per_s", "outside_generation_share",
            "wall_s", "passed", "failed", "refused", "params")
    for name, r in report["steps"].items():
        figs = ", ".join(f"{k} {r[k]:.3g}" if isinstance(r[k], float) else f"{k} {r[k]}"
                         for k in keys if r.get(k) is not None)
        err = "" if r["ok"] else " | " + r["error"].strip().splitlines()[-1][:100]
        print(f"  {name:10} {'ok' if r['ok'] else 'FAILED':6} {r['seconds']:7.1f} s  {figs}{err}")


def run_step(ctx, name, fn):
    t = time.perf_counter()
    try:
        res = dict(ok=True, error=None, **fn(ctx))
    except Exception as e:  # a failed step does not stop the others: one device run brings back everything
        detail = "".join(traceback.format_exception_only(type(e), e))
        res = dict(ok=False, error=tail(detail if isinstance(e, RuntimeError) else traceback.format_exc()))
    res["seconds"] = time.perf_counter() - t
    ctx["results"][name] = res
    print(f"[gpu_check] {name}: {'ok' if res['ok'] else 'FAILED'} ({res['seconds']:.1f} s)", flush=True)


def save_report(report, out, start):
    report["wall_s"] = time.perf_counter() - start
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    report = dict(report, steps=dict(report["steps"]))  # a copy: a background step may be adding its entry
    Path(out).write_text(json.dumps(report, indent=2, default=str))


def main(argv=None):
    args = parse_args(argv)
    if args.phase == "bare":
        work = Path(args.work)
        print("BARE " + json.dumps(bare_loop(work, SIZES[args.device or "cpu"]["mb_tokens"])))
        return
    import torch
    import transformers
    mode = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if mode == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda: torch sees no CUDA device")
    work = Path(args.work or tempfile.mkdtemp(prefix="gpu_check_"))
    work.mkdir(parents=True, exist_ok=True)
    ctx = dict(mode=mode, work=work, sizes=SIZES[mode], env=child_env(mode), results={})
    report = dict(mode=mode, out=str(args.out), device_name=torch.cuda.get_device_name(0) if mode == "cuda" else
                  f"CPU, {os.cpu_count()} cores", torch=torch.__version__, transformers=transformers.__version__,
                  python=platform.python_version(), started=time.strftime("%Y-%m-%d %H:%M:%S"),
                  sizes={k: v for k, v in SIZES[mode].items() if k not in ("pipeline", "pytest")},
                  steps=ctx["results"], pipeline_beside_other_steps=mode == "cpu")
    steps = [("model", step_model), ("train", lambda c: step_train(c, "train", ["--micro-batch-tokens",
                                                                               c["sizes"]["mb_tokens"]])),
             ("train_mb8", lambda c: step_train(c, "train_mb8",
                                                ["--micro-batch-tokens", 8 * positions(c["sizes"])])),
             ("bare", step_bare), ("rollout", step_rollout), ("pipeline", step_pipeline), ("pytest_05", step_pytest),
             ("torchrun", lambda c: step_torchrun(c, False)), ("torchrun_fsdp", lambda c: step_torchrun(c, True))]
    # CPU mode: the pipeline (a dozen processes, each mostly imports) runs beside the other steps, so that the check
    # fits CI's minutes on 2 cores; its CPU figures are then indicative only. CUDA: one step at a time (timings).
    background = [n for n in ("pipeline",) if mode == "cpu"]
    threads = [threading.Thread(target=run_step, args=(ctx, n, dict(steps)[n])) for n in background]
    start = time.perf_counter()
    DEADLINE[0] = start + (args.budget_s or BUDGET_S[mode])
    for th in threads:
        th.start()
    for name, fn in steps:
        if name not in background:
            run_step(ctx, name, fn)
            save_report(report, args.out, start)  # after every step: a run cut short still brings back its figures
    for th in threads:
        th.join()
    report["steps"] = {name: ctx["results"][name] for name, _ in steps}
    save_report(report, args.out, start)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)
    print_table(report)
    return report


if __name__ == "__main__":
    main()
