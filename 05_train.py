"""Stage 05: one policy update from one iteration's rollouts (GRPO / PPO / SFT), plain PyTorch.

The paper's multi-harness policy optimisation: the clipped surrogate over every generated token of every
(task, harness, trajectory) of the update batch, with pi_old recomputed here, before the update, at the sampling
temperature. The whole objective (policy, value, KL and entropy terms) is written once, above `objective`; GAE's
recursion above its lines in `gae`; `run_stage` at the end runs the steps in order: check the inputs, prepare the
batch (sequences, advantages, old log-probs), update (epochs x minibatches, one AdamW step each), save.

A minibatch with no signal (GRPO: every group reward-equal, A = 0) makes no optimizer step: AdamW's momentum
would move the weights on zero gradients. Where another engine sampled (04's `sampler`: vLLM, or a dtype other
than fp32) each token's term is weighted by min(pi_old / pi_rollout, 2) (truncated IS, --tis-cap / --no-tis).
Each stored model turn is one sequence prompt + completion; turns whose prompt extends the previous prompt +
completion are merged (same loss, fewer tokens). The LM head runs in chunks of --logit-chunk completion tokens:
memory is bounded by a chunk (docs/rl-cost.md). The toy preset's tiny model is built by data/tiny_model.py.

    python 05_train.py --algo sft --policy runs/toy/tiny --rollouts demos.jsonl --out runs/toy/init_policy \
        --epochs 6 --lr 3e-3
    python 05_train.py --run runs/toy --iteration 0 --algo grpo --lr 3e-4
    python 05_train.py --run runs/toy --iteration 1 --algo ppo --epochs 2 --minibatches 4 --kl-coef 0.05
    # N GPUs (or N CPU processes on gloo): the same update, each minibatch split over the ranks (docs/distributed.md)
    torchrun --standalone --nproc_per_node 4 -- 05_train.py --run runs/gpu --iteration 0 --algo grpo
    # ... with the model sharded over the ranks (FSDP2) when its weights + AdamW state do not fit one GPU
    torchrun --standalone --nproc_per_node 4 -- 05_train.py --run runs/big --iteration 0 --algo grpo --fsdp

Writes <out>/ (save_pretrained model + tokenizer, value_head.pt for PPO, optimizer.pt: the AdamW
moments, 2x the fp32 weights, loaded by the next update from its --policy folder when it was saved by
the same --algo with the same parameter groups) and, beside it, train_log.jsonl (one row per optimizer
step) and 05_train_config.json. Defaults with --run DIR --iteration t: rollouts
DIR/iter_{t:03d}/rollouts.jsonl, policy DIR/init_policy (t = 0) or DIR/iter_{t-1:03d}/policy, out
DIR/iter_{t:03d}/policy.
"""
import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import sys
import threading
import time
import types
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_argument_group("inputs and outputs")
    g.add_argument("--run", default="runs/default", help="run folder (used with --iteration)")
    g.add_argument("--iteration", type=int, help="RL iteration t (sets the default paths)")
    g.add_argument("--policy", help="policy checkpoint folder (default: see module docstring)")
    g.add_argument("--rollouts", help="rollouts.jsonl (default DIR/iter_{t:03d}/rollouts.jsonl)")
    g.add_argument("--out", help="output checkpoint folder (default DIR/iter_{t:03d}/policy)")
    g.add_argument("--seed", type=int, default=0)
    g = p.add_argument_group("algorithm")
    g.add_argument("--algo", choices=["grpo", "ppo", "sft"], default="grpo")
    g.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate (toy: 3e-4 RL, 3e-3 SFT)")
    g.add_argument("--weight-decay", type=float, default=0.0)
    g.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping (total L2 norm)")
    g.add_argument("--clip-eps", type=float, default=0.2, help="epsilon of clip(rho, 1-eps, 1+eps)")
    g.add_argument("--kl-coef", type=float, default=0.0, help="weight of the k3 KL to the reference policy")
    g.add_argument("--ref-policy", help="reference policy for the KL (default: with --iteration, DIR/init_policy "
                   "if it exists; else the loaded policy)")
    g.add_argument("--tis-cap", type=float, help="truncated importance sampling: each token's clipped surrogate "
                   f"times min(pi_old / pi_rollout, C), C = this cap. Default: C = {TIS_CAP} where the rollouts were "
                   "sampled by another engine (vLLM, or a dtype other than 05's fp32), off where 05's own fp32 "
                   "forward sampled them (hf backend in float32: the log-probs agree to ~1e-6)")
    g.add_argument("--no-tis", action="store_true", help="no truncated importance sampling, whoever sampled")
    g.add_argument("--ent-coef", type=float, default=0.0, help="entropy bonus weight")
    g.add_argument("--no-std", action="store_true", help="GRPO: A = r - mean (no division by the group std)")
    g.add_argument("--adv-eps", type=float, default=1e-6, help="GRPO: A = (r - mean) / (std + eps)")
    g.add_argument("--gamma", type=float, default=1.0, help="PPO: discount over generated tokens")
    g.add_argument("--lam", type=float, default=1.0, help="PPO: GAE lambda (verl's default 1: A_t = R - V_t)")
    g.add_argument("--vf-coef", type=float, default=0.5, help="PPO: value-loss weight")
    g.add_argument("--vf-lr", type=float, help="PPO: value-head learning rate (default 10 x --lr, as verl's critic)")
    g.add_argument("--vf-clip", type=float, default=0.5, help="PPO: value clipping range around the old value")
    g.add_argument("--no-norm-adv", action="store_true", help="PPO: do not whiten the GAE advantages")
    g = p.add_argument_group("batching")
    g.add_argument("--epochs", "--ppo-epochs", dest="epochs", type=int, help="passes over the batch (default: 2 for "
                   "grpo/ppo, 1 for sft); --ppo-epochs is its old name")
    g.add_argument("--minibatches", type=int, help="optimizer steps per pass (RL default 2)")
    g.add_argument("--minibatch-size", type=int, help="sequences per optimizer step (SFT default 32)")
    g.add_argument("--micro-batch-size", type=int, default=8, help="sequences per forward/backward (accumulation)")
    g.add_argument("--micro-batch-tokens", type=int, help="instead of --micro-batch-size: micro-batches of the "
                   "length-sorted sequences holding at most this many padded tokens (sequences x longest; a longer "
                   "sequence runs alone), so memory follows tokens, not sequence counts")
    g.add_argument("--logit-chunk", type=int, default=LOGIT_CHUNK, help="completion tokens per LM-head chunk: the "
                   "fp32 [tokens, vocab] logits exist for one chunk at a time (backward recomputes them per chunk); "
                   "0 = the whole micro-batch at once")
    g.add_argument("--amp", choices=["auto", "bf16", "off"], default="auto", help="bf16 autocast of the trunk (the "
                   "LM head stays fp32): auto = on a GPU with bf16, fp32 elsewhere; bf16 = also on a CPU (about 1.6x "
                   "faster where it has AVX512-BF16 or AMX, slower where it has neither); off = fp32")
    g.add_argument("--no-merge-turns", action="store_true", help="one sequence per model turn, never merged")
    g.add_argument("--min-reward", type=float, help="SFT: keep only demonstrations with reward >= this (e.g. 1)")
    g.add_argument("--no-optimizer-state", action="store_true", help="neither load nor save optimizer.pt")
    g.add_argument("--no-skip-zero-adv", action="store_true", help="GRPO: also run the sequences whose advantage is "
                   "0 (equal-reward groups), which add exactly 0 to the gradient without KL or entropy terms")
    g.add_argument("--fsdp", action="store_true", help="under torchrun: shard the weights, gradients and AdamW state "
                   "over the ranks (FSDP2 fully_shard, per decoder layer + root) for a model whose full copy does not "
                   "fit one GPU; the same update (docs/distributed.md)")
    # tests only: score every pi_old apart, as before the first minibatch took it from its own forward pass
    g.add_argument("--score-all-old", action="store_true", help=argparse.SUPPRESS)
    # [distributed] tests only: the biased port (loss / the rank's own N_B, gradients averaged over ranks)
    g.add_argument("--naive-local-nb", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.epochs is None:
        args.epochs = 1 if args.algo == "sft" else 2
    return args


# ----------------------------------------------------------------------------------- small helpers
def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def write_atomic(path, text):
    """Write to a temporary file in the same folder, then rename it: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:  # e.g. interrupted: no half .tmp left behind
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def read_jsonl(path):
    """[(line_number, record)]; a malformed line stops with the file and line."""
    path = Path(path)
    if not path.is_file():
        fail(f"{path}: file not found")
    rows, data = [], path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        fail(f"{path} line {line}: invalid UTF-8 (byte {data[e.start]:#04x})")
    for i, line in enumerate(text.splitlines(), 1):
        if line.strip():
            try:
                rows.append((i, json.loads(line)))
            except json.JSONDecodeError as e:
                fail(f"{path} line {i}: malformed JSON ({e.msg})")
    return rows


LOGIT_CHUNK = 1024  # completion tokens per LM-head chunk (--logit-chunk): 1024 x 151,936 x 4 B = 0.6 GB a tensor
TIS_CAP = 2.0  # truncated IS cap C (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL")
MISMATCH_WARN = 0.05  # mean |rollout - trainer| log-prob above which 05 warns (bf16 / vLLM: up to ~1e-2)
# [distributed] under torchrun: this process's rank and the number of ranks, FSDP = --fsdp (init_distributed). Run as
# `python 05_train.py`, WORLD = 1 and no line marked [distributed] runs a collective (section "distributed" below).
RANK, WORLD = 0, 1
FSDP = False


# ---------------------------------------------------------------------------------- input checking
# Bad input stops with one line on stderr naming the file, line and field (or the flag), exit status 2, nothing
# written: the flags and every rollout record before any weight is loaded; then two guards, check_head once the
# model is loaded and check_finite before anything is saved.
def finite(x):
    return type(x) in (int, float) and math.isfinite(x)


# A rollout record (04 writes it): field -> (check, what it must be), checked up front for every line. Which fields
# are required depends on the flags (grpo: reward, group_id; ppo: reward; --min-reward: reward). Also refused:
# a duplicated episode (same episode_id, or the same line twice), RL on greedy (temperature 0) rollouts.
ROLLOUT_SCHEMA = {
    "model_turns": (lambda v: isinstance(v, list), "a list of {prompt_ids, completion_ids, logprobs}"),
    "reward": (finite, "a finite number"),
    "group_id": (lambda v: isinstance(v, str), "a string"),
    "temperature": (lambda v: v is None or finite(v) and v >= 0, "a finite number > 0 (the sampling temperature)"),
    "episode_id": (lambda v: isinstance(v, str), "a string"),
    "policy": (lambda v: v is None or isinstance(v, str), "a string"),
}


def check_flags(args):
    """The flags' values, before anything is read."""
    for k in ("epochs", "micro_batch_size", "minibatches", "minibatch_size", "micro_batch_tokens"):
        if getattr(args, k) is not None and getattr(args, k) < 1:
            fail(f"--{k.replace('_', '-')} must be >= 1")
    if args.logit_chunk < 0:
        fail(f"--logit-chunk {args.logit_chunk}: must be >= 0 (0 = no chunking)")
    for flag, x in (("--lr", args.lr), ("--vf-lr", args.vf_lr), ("--tis-cap", args.tis_cap)):  # name only the flag
        if x is not None and not (math.isfinite(x) and x > 0):  # that is wrong
            fail(f"{flag} {x}: must be a finite number > 0")
    if not 0 < args.clip_eps < 1:
        fail(f"--clip-eps {args.clip_eps}: must be in (0, 1)")
    for flag, x in (("--kl-coef", args.kl_coef), ("--vf-coef", args.vf_coef), ("--ent-coef", args.ent_coef)):
        if not (math.isfinite(x) and x >= 0):  # a term's weight: 0 = off
            fail(f"{flag} {x}: must be a finite number >= 0")
    if args.algo == "sft" and (args.tis_cap or args.no_tis):
        fail(f"{'--tis-cap' if args.tis_cap else '--no-tis'} is for --algo grpo/ppo only")
    if args.algo != "sft" and args.min_reward is not None:
        fail("--min-reward is for --algo sft only (it would bias an RL update)")


def check_policy_dir(path, what="policy"):
    if not (Path(path) / "config.json").is_file():
        fail(f"{what} folder {path} not found (expected a save_pretrained folder with config.json)")


def resolve_paths(args):
    run, t = Path(args.run), args.iteration
    if t is None and not (args.policy and args.rollouts and args.out):
        fail("give --iteration t (with --run DIR) or all of --policy, --rollouts and --out")
    if t is not None and t < 0:
        fail(f"--iteration must be >= 0, got {t}")
    it = lambda k: run / f"iter_{k:03d}"
    policy = Path(args.policy) if args.policy else (run / "init_policy" if t == 0 else it(t - 1) / "policy")
    rollouts = Path(args.rollouts) if args.rollouts else it(t) / "rollouts.jsonl"
    out = Path(args.out) if args.out else it(t) / "policy"
    ref, why = ((Path(args.ref_policy), "--ref-policy") if args.ref_policy else
                (run / "init_policy", "the run's initial policy") if t is not None and (run / "init_policy").exists()
                else (policy, "the loaded policy itself: no --ref-policy and no --iteration"))
    return policy, rollouts, out, ref, why


def uses_kl(args):
    """The KL term is on: RL with --kl-coef > 0 (then a reference policy is loaded, or is the policy itself)."""
    return args.algo != "sft" and args.kl_coef > 0


def check_inputs(args):
    """The paths, the policy (and reference) folders and every rollout record; the off-policy warning.
    -> (policy, rollouts, out, ref, episodes, warnings)"""
    from transformers import AutoConfig
    policy, rollouts, out, ref, ref_why = resolve_paths(args)
    check_policy_dir(policy)
    if not rollouts.is_file():
        fail(f"rollouts file {rollouts} not found")
    vocab = AutoConfig.from_pretrained(policy).vocab_size
    episodes = load_episodes(rollouts, args.algo, vocab, args.min_reward)
    if uses_kl(args):
        check_policy_dir(ref, "reference policy")
        print(f"[05] KL reference policy: {ref} ({ref_why})")
    warnings, others = [], [str(e["policy"]) for e in episodes if e["policy"] is not None
                            and (e["policy"] == "oracle" or Path(str(e["policy"])).resolve() != policy.resolve())]
    if args.algo != "sft" and others:
        warnings.append(f"{len(others)} of {len(episodes)} episodes of {rollouts} were sampled by "
                        f"{sorted(set(others))[:3]}, not by the loaded policy {policy}: the update is off-policy")
    return policy, rollouts, out, ref, episodes, warnings


def load_episodes(path, algo, vocab, min_reward=None):
    """Validated episodes: [{"turns": [(prompt_ids, completion_ids, logprobs|None)], "reward", ...}].
    SFT trains at temperature 1 whatever the record says; --min-reward keeps the successful ones."""
    rows = read_jsonl(path)
    if not rows:
        fail(f"{path}: empty rollout file (no episodes)")
    episodes, seen = [], {}
    for ln, r in rows:
        where = f"{path} line {ln}"
        if not isinstance(r, dict):
            fail(f"{where}: expected a JSON object")
        need = {"grpo": ["reward", "group_id"], "ppo": ["reward"], "sft": []}[algo] + ["model_turns"]
        for k, (ok, want) in ROLLOUT_SCHEMA.items():
            if k not in r and (k in need or k == "reward" and min_reward is not None):
                by = f"--algo {algo}" if k in need else "--min-reward"  # name only the flags given
                fail(f"{where}: field '{k}' missing (needed by {by})" if k != "model_turns" else
                     f"{where}: field 'model_turns' missing or not a list")
            if k in r and not ok(r[k]):
                fail(f"{where}: field '{k}' is {json.dumps(r[k])[:40]}, not {want}")
        if algo != "sft" and r.get("temperature") == 0:
            fail(f"{where}: field 'temperature' is 0 (greedy): RL needs the sampling temperature (> 0)")
        key = r.get("episode_id", json.dumps(r, sort_keys=True))
        if key in seen:
            fail(f"{where}: episode {str(key)[:60]!r} repeats line {seen[key]} (a duplicate would count twice)")
        seen[key] = ln
        turns = []
        for i, t in enumerate(r["model_turns"]):
            if not isinstance(t, dict):
                fail(f"{where}: model_turns[{i}] is not an object")
            for k in ("prompt_ids", "completion_ids"):
                ids = t.get(k)
                if not isinstance(ids, list) or not all(type(x) is int for x in ids):
                    fail(f"{where}: model_turns[{i}].{k} missing or not a list of ints")
                bad = [x for x in ids if x < 0 or x >= vocab]
                if bad:
                    fail(f"{where}: model_turns[{i}].{k} has token id {bad[0]} outside the policy's "
                         f"vocabulary (size {vocab})")
            lp = t.get("logprobs")
            if lp is not None and (not isinstance(lp, list) or len(lp) != len(t["completion_ids"])
                                   or not all(finite(x) for x in lp)):
                fail(f"{where}: model_turns[{i}].logprobs must be null or one finite number per completion token")
            if not t["prompt_ids"]:
                fail(f"{where}: model_turns[{i}].prompt_ids is empty")
            turns.append((t["prompt_ids"], t["completion_ids"], lp))
        temp = 1.0 if algo == "sft" else r.get("temperature") or 1.0  # SFT, greedy (0) or missing: T = 1
        episodes.append(dict(turns=turns, reward=float(r.get("reward", 0.0)), group=r.get("group_id"),
                        temp=float(temp), line=ln, policy=r.get("policy"), sampler=r.get("sampler")))
    if min_reward is not None:
        episodes = [e for e in episodes if e["reward"] >= min_reward]
        if not episodes:
            fail(f"{path}: no episode has reward >= {min_reward} (--min-reward)")
    if not any(c for e in episodes for _, c, _ in e["turns"]):
        fail(f"{path}: no model turn with completion tokens (oracle rollouts need 04 --tokenizer)")
    return episodes


@torch.no_grad()
def check_head(model, ids, where):
    """Refuse a model whose forward computes other logits than base_model + lm_head() below (an
    unknown logit scaling would silently change every log-prob and ratio)."""
    model.eval()
    ids = torch.tensor([ids[:128]], device=model.device)  # [1, L]
    ref = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)  # [L, V]
    mine = torch.log_softmax(lm_head(model, model.base_model(input_ids=ids).last_hidden_state[0]), -1)  # [L, V]
    model.train()
    err = (ref - mine).abs().max().item()
    if not err < 1e-3:
        fail(f"{where}: {model.config.model_type}'s forward applies a logit transformation that 05 does not (max "
             f"log-prob difference {err:.2g}; known: Gemma-2 soft-capping, Cohere logit_scale, Granite logits_scaling)")


def check_finite(model, vhead, log):
    """Input checking's last guard: refuse to write a policy whose loss or weights went non-finite (exit 2,
    nothing written)."""
    params = list(model.named_parameters()) + (list(vhead.named_parameters()) if vhead is not None else [])
    bad = next((n for n, p in params if not torch.isfinite(p.to_local() if FSDP else p).all()), None)
    if FSDP:  # [distributed] each rank checked its own shards: all of them stop, or none
        import torch.distributed as dist
        names = [None] * WORLD
        dist.all_gather_object(names, bad)
        bad = next((n for n in names if n), None)
    loss = next((r["loss"] for r in log if not math.isfinite(r["loss"])), None)
    if bad or loss is not None:
        fail(f"the update made {f'weight {bad}' if bad else 'the loss'} non-finite (loss {loss}); nothing written "
             "(check the rollouts, or lower --lr)")


# ------------------------------------------------------------------------------------- the algorithm
# rollouts -> sequences -> advantages -> log-probs -> the objective -> one update
def build_sequences(episodes, merge=True):
    """Each model turn -> one sequence ids = prompt + completion with mask 1 on the completion.
    If a turn's prompt starts with the previous sequence (full history), that sequence is extended
    instead: the earlier completion keeps the same prefix, hence the same log-probs and loss."""
    seqs = []
    for e_idx, ep in enumerate(episodes):
        cur = None
        for prompt, comp, lp in ep["turns"]:
            lp = lp if lp is not None else [float("nan")] * len(comp)
            if merge and cur is not None and prompt[:len(cur["ids"])] == cur["ids"]:
                extra = len(prompt) - len(cur["ids"])
                cur["ids"] = prompt + comp
                cur["mask"] += [0] * extra + [1] * len(comp)
                cur["stored_logp"] += lp
                continue
            if cur is not None and sum(cur["mask"]):
                seqs.append(cur)
            cur = dict(ids=prompt + comp, mask=[0] * len(prompt) + [1] * len(comp), ep=e_idx,
                       temp=ep["temp"], stored_logp=list(lp))
        if cur is not None and sum(cur["mask"]):
            seqs.append(cur)
    for s in seqs:
        s["n"] = sum(s["mask"])
        s["stored_logp"] = torch.tensor(s["stored_logp"], dtype=torch.float32)
    return seqs


def grpo_advantages(rewards, group_ids, use_std=True, eps=1e-6):
    """GRPO, per episode i of group g (its group_id: one task under one harness, sampled G times); population std.
    -> (advantages, share of groups whose rewards are all equal)"""
    r = np.asarray(rewards, dtype=np.float64)
    adv, zero_var = np.zeros_like(r), 0
    for g in dict.fromkeys(group_ids):
        idx = np.array([i for i, gi in enumerate(group_ids) if gi == g])
        centred = r[idx] - r[idx].mean()
        # A_i = (r_i - mean_g r) / (std_g r + eps)   (--no-std: A_i = r_i - mean_g r)
        adv[idx] = centred / (r[idx].std() + eps) if use_std else centred
        zero_var += bool(np.all(r[idx] == r[idx][0]))
    return adv, zero_var / max(1, len(dict.fromkeys(group_ids)))


def gae(rewards, values, gamma, lam):
    """Generalized advantage estimation over one episode's generated tokens t = 0..T-1 in order, from the last one
    back. -> (advantages A [T], returns R [T])"""
    r, v = rewards.tolist(), values.tolist()
    adv, last = [0.0] * len(v), 0.0  # last = A_{t+1}, 0 after the last token
    for t in reversed(range(len(v))):
        next_v = v[t + 1] if t + 1 < len(v) else 0.0  # V_T = 0: nothing follows the episode's last token
        # delta_t = r_t + gamma V_{t+1} - V_t
        delta = r[t] + gamma * next_v - v[t]
        # A_t = delta_t + gamma lambda A_{t+1}
        last = delta + gamma * lam * last
        adv[t] = last
    adv = torch.tensor(adv, dtype=values.dtype)  # [T]
    # R_t = A_t + V_t: the value head's target
    return adv, adv + values


def ppo_advantages(seqs, rewards, gamma, lam, whiten=True):
    """Sets s["adv"], s["ret"]: GAE over each episode's generated tokens, turn after turn, with the
    terminal reward on its last token; then whitened over the batch unless whiten=False."""
    by_ep = {}
    for s in seqs:
        by_ep.setdefault(s["ep"], []).append(s)
    for e_idx, ep_seqs in by_ep.items():
        values = torch.cat([s["old_v"] for s in ep_seqs])  # [T_ep]
        r = torch.zeros_like(values)  # [T_ep] r_t = 0, but the episode's reward on its last token
        r[-1] = rewards[e_idx]
        a, ret = gae(r, values, gamma, lam)
        for s, a_s, r_s in zip(ep_seqs, a.split([s["n"] for s in ep_seqs]), ret.split([s["n"] for s in ep_seqs])):
            s["adv"], s["ret"] = a_s, r_s
    all_a = torch.cat([s["adv"] for s in seqs])  # [N]
    if whiten and len(all_a) > 1:
        for s in seqs:  # A <- (A - mean_B A) / (std_B A + 1e-8) over every token of the batch
            s["adv"] = (s["adv"] - all_a.mean()) / (all_a.std() + 1e-8)


TOKEN_FIELDS = ("old_logp", "ref_logp", "old_v", "adv", "ret", "tis_w")  # per generated token, set before the update


def collate(seqs, pad_id, device, fields=TOKEN_FIELDS):
    """Right-padded batch. `sel` marks the positions whose *next* token is a completion token: the
    logits there predict y_t, so sel is the mask M_t shifted by one. `fields`: the per-token values the
    sequences carry, concatenated in the same order as the tokens (none when only log-probs are wanted)."""
    L = max(len(s["ids"]) for s in seqs)
    inp = torch.full((len(seqs), L), pad_id, dtype=torch.long)  # [B, L]
    sel = torch.zeros((len(seqs), L), dtype=torch.bool)  # [B, L]
    for b, s in enumerate(seqs):
        inp[b, :len(s["ids"])] = torch.tensor(s["ids"])
        sel[b, :len(s["ids"]) - 1] = torch.tensor(s["mask"][1:], dtype=torch.bool)
    tgt = inp[:, 1:][sel[:, :-1]]  # [N] the generated tokens y_t, row-major order
    temp = torch.cat([torch.full((s["n"],), s["temp"]) for s in seqs])  # [N]
    batch = dict(inp=inp.to(device), sel=sel.to(device), tgt=tgt.to(device), temp=temp.to(device),
                 tokens=sum(len(s["ids"]) for s in seqs))
    for k in fields:
        if k in seqs[0]:
            batch[k] = torch.cat([s[k] for s in seqs]).to(device)  # [N]
    return batch


def train_mode(model, grad_ckpt):
    """Training mode with dropout off. Not model.eval(): transformers checkpoints a layer only while
    model.training is True. nn.Dropout modules get p = 0 and float fields such as Llama's
    attention_dropout become 0 (on the modules only: the saved config keeps its values)."""
    model.config.use_cache = False
    if grad_ckpt and hasattr(model, "activation_checkpointing_enable"):  # the newer transformers name
        model.activation_checkpointing_enable({"use_reentrant": False})
    elif grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for k, v in list(vars(m).items()):
            if "dropout" in k and isinstance(v, float):
                setattr(m, k, 0.0)


def lm_head(model, h):
    """fp32 logits [N, V] from hidden states [N, H], with the scalings the model's own forward applies
    after its output embedding (this direct path would skip them)."""
    cfg = model.config
    # fp32 even under bf16 autocast: bf16 logits of 16-32 move in steps of 0.125 (ratio noise ~ +-0.06)
    with torch.autocast(h.device.type, enabled=False):
        logits = model.get_output_embeddings()(h.float())  # [N, V]
    logits = logits * (getattr(cfg, "logit_scale", None) or 1.0)  # Cohere: z * logit_scale
    logits = logits / (getattr(cfg, "logits_scaling", None) or 1.0)  # Granite: z / logits_scaling
    if getattr(cfg, "final_logit_softcapping", None):  # Gemma-2/3: cap * tanh(z / cap)
        logits = cfg.final_logit_softcapping * torch.tanh(logits / cfg.final_logit_softcapping)
    return logits



def head_logp(model, h, tgt, temp):
    """log pi(y_t | s_t) at temperature for one chunk of hidden states [c, H] -> [c]."""
    logits = lm_head(model, h) / temp[:, None]  # [c, V] fp32, pi(.|s) at the sampling temperature
    return torch.log_softmax(logits, dim=-1).gather(1, tgt[:, None]).squeeze(1)  # [c]


def head_logp_ent(model, h, tgt, temp):
    """(log-probs [c], entropies [c]) for one chunk: H(pi(.|s_t)) = -sum_v p_v log p_v."""
    logp_all = torch.log_softmax(lm_head(model, h) / temp[:, None], dim=-1)  # [c, V]
    return logp_all.gather(1, tgt[:, None]).squeeze(1), -(logp_all.exp() * logp_all).sum(-1)  # [c], [c]


def trunk_and_head(model, batch, amp, entropy=False, chunk=LOGIT_CHUNK):
    """Hidden states [N, H] of the positions that predict generated tokens, their log-probs [N] at temperature and
    entropies [N] (only with entropy=True: an --ent-coef term; else None). The LM head runs on the selected hidden
    states, not on every position (prompts are most of the tokens), in chunks of `chunk` tokens: the fp32 [chunk, V]
    logits and log-softmax exist for one chunk at a time. With gradients and more than one chunk, each chunk is
    checkpointed (its [chunk, V] tensors are freed and recomputed in backward: one more LM-head matmul per chunk), so
    peak memory is bounded by one chunk instead of growing with the micro-batch. Row-wise the same arithmetic as one
    [N, V] pass (tested to 1e-6). amp: bf16 autocast of the trunk on the batch's device (the LM head stays fp32).
    Under --fsdp this function is a registered forward method of the root unit (shard_model)."""
    with torch.autocast(batch["inp"].device.type, dtype=torch.bfloat16, enabled=amp):
        # right padding + causal attention: real tokens never attend to the pads, so no attention mask
        h = model.base_model(input_ids=batch["inp"]).last_hidden_state  # [B, L, H]
    h = h[batch["sel"]]  # [N, H]
    n = h.shape[0]
    chunk = chunk if chunk and chunk > 0 else max(1, n)
    fn = head_logp_ent if entropy else head_logp
    ckpt = torch.is_grad_enabled() and n > chunk
    parts = []
    for a in range(0, n, chunk):
        args = (model, h[a:a + chunk], batch["tgt"][a:a + chunk], batch["temp"][a:a + chunk])
        parts.append(torch.utils.checkpoint.checkpoint(fn, *args, use_reentrant=False) if ckpt else fn(*args))
    if entropy:
        logp, ent = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])  # [N], [N]
    else:
        logp, ent = torch.cat(parts), None  # [N]
    return h, logp, ent


def forward(model, vhead, batch, amp, entropy=False, chunk=LOGIT_CHUNK):
    """Log-probs (at temperature), entropies (or None) and values of the generated tokens only."""
    # [distributed] --fsdp: the same function, through the root unit's hooks (shard_model)
    h, logp, ent = (model.trunk_and_head(batch, amp, entropy, chunk) if FSDP else
                    trunk_and_head(model, batch, amp, entropy, chunk))
    v = vhead(h.float()).squeeze(-1) if vhead is not None else None  # [N]
    return logp, ent, v


def micro_batches(seqs, size=8, tokens=None):
    """Split (length-sorted) sequences into consecutive micro-batches: `size` sequences each, or, with `tokens`
    (--micro-batch-tokens), greedily as many as keep count x longest (the padded tokens run) <= tokens; a sequence
    longer than the budget runs alone. The loss does not depend on the split (every part divides by N_B)."""
    if not tokens:
        return [seqs[i:i + size] for i in range(0, len(seqs), size)]
    out, cur, width = [], [], 0
    for s in seqs:
        w = max(width, len(s["ids"]))
        if cur and w * (len(cur) + 1) > tokens:
            out.append(cur)
            cur, w = [], len(s["ids"])
        cur.append(s)
        width = w
    return out + [cur] if cur else out


# ---------------------------------------------------------------------------------------- the objective
# One minibatch B (one optimizer step); t runs over its generated tokens (M_t = 1 only there: completion tokens,
# never prompts or tool outputs), N_B = their number in the WHOLE minibatch (counted before it is split into
# micro-batches or over ranks, so neither split changes the update). AdamW minimises
#
#   loss(theta) = pg_loss + c_kl kl + c_v v_loss - c_H entropy
#
# where -pg_loss is the paper's objective L(theta) (its batch: the (task x, harness h, trajectory tau) rollouts)
#
#   pg_loss = -1/N_B sum_t w_t min(rho_t A_t, clip(rho_t, 1 - eps, 1 + eps) A_t)      GRPO, PPO (A: advantages)
#               rho_t = pi_theta(y_t | s_t) / pi_old(y_t | s_t), eps = --clip-eps,
#               w_t = min(pi_old(y_t | s_t) / pi_rollout(y_t | s_t), C)      only where truncated IS is on (else 1)
#           = -1/N_B sum_t log pi_theta(y_t | s_t)                                 SFT (no pi_old: rho = 1)
#   kl      = 1/N_B sum_t exp(d_t) - d_t - 1,  d_t = log pi_ref(y_t | s_t) - log pi_theta(y_t | s_t)
#               (k3, an estimator of KL(pi_theta || pi_ref))        only where c_kl = --kl-coef is on (GRPO, PPO)
#   v_loss  = 1/N_B sum_t 0.5 max((V_t - R_t)^2, (V_old,t + clip(V_t - V_old,t, -c, c) - R_t)^2)
#               R_t: GAE's returns, c = --vf-clip                     only with a value head (PPO), c_v = --vf-coef
#   entropy = 1/N_B sum_t H(pi_theta(. | s_t)),  H(p) = -sum_v p_v log p_v          only where c_H = --ent-coef is on
#
# All log-probs at the episode's sampling temperature. A term that is off is the number 0 (nothing computed).
# Every micro-batch adds its tokens' share (each divides by the minibatch's N_B): the gradients accumulated over
# the micro-batches are the gradient of the minibatch's loss.
def objective(logp, ent, v, b, args, n_b):
    """loss over one micro-batch's tokens (log-probs logp [N], entropies ent [N] or None, values v [N] or None;
    b: its collated batch). -> (loss, pg_loss, kl, v_loss, ratio rho [N])"""
    # policy term (SFT: the log-likelihood)
    if args.algo == "sft":
        pg_loss, ratio = -logp.sum() / n_b, torch.ones_like(logp)
    else:
        pg_loss, ratio = policy_loss(logp, b["old_logp"], b["adv"], args.clip_eps, n_b, b.get("tis_w"))
    kl = v_loss = entropy = 0.0
    if args.algo != "sft" and args.kl_coef:  # KL term (k3)
        d = b["ref_logp"] - logp  # [N]
        kl = (torch.exp(d) - d - 1).sum() / n_b
    if v is not None:  # value term (clipped, as PPO's policy term)
        v_clip = b["old_v"] + (v - b["old_v"]).clamp(-args.vf_clip, args.vf_clip)  # [N]
        v_loss = 0.5 * torch.max((v - b["ret"]) ** 2, (v_clip - b["ret"]) ** 2).sum() / n_b
    if ent is not None:  # entropy term (H computed only with --ent-coef)
        entropy = ent.sum() / n_b
    loss = pg_loss + args.kl_coef * kl + args.vf_coef * v_loss - args.ent_coef * entropy
    return loss, pg_loss, kl, v_loss, ratio


def policy_loss(logp, old_logp, adv, clip_eps, n_b, tis_w=None):
    """pg_loss above: -1/N_B sum_t w_t min(rho_t A_t, clip(rho_t, 1-eps, 1+eps) A_t) over the given tokens."""
    # rho_t = pi_theta(y_t | s_t) / pi_old(y_t | s_t)
    ratio = torch.exp(logp - old_logp)  # [N]
    # min(rho_t A_t, clip(rho_t, 1-eps, 1+eps) A_t)
    surr = torch.min(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)  # [N]
    if tis_w is not None:  # truncated IS (--tis-cap C): w_t = min(pi_old(y_t) / pi_rollout(y_t), C), constant
        surr = tis_w * surr  # [N]
    return -surr.sum() / n_b, ratio


def tis_weights(old_logp, rollout_logp, cap):
    """Truncated IS: w_t = min(pi_old(y_t | s_t) / pi_rollout(y_t | s_t), C); 1 where 04 stored no log-prob."""
    w = torch.exp(old_logp - rollout_logp).clamp(max=cap)  # [n]
    return torch.where(torch.isnan(w), torch.ones_like(w), w)


# ------------------------------------------------------------------------------------------ pi_old
def sampler_of(episodes):
    """The engines that sampled the rollouts, e.g. 'vllm/bfloat16' (04 stores `sampler` in every record)."""
    names = {f"{e['sampler'].get('backend')}/{e['sampler'].get('dtype')}" if isinstance(e["sampler"], dict)
             else "unknown" for e in episodes}
    return ", ".join(sorted(names))


def tis_cap_for(args, episodes):
    """The truncated-IS cap C, or None (off). On by default where another engine sampled: vLLM (bf16 kernels, its
    own sampler) or any dtype but fp32; off where 05's own fp32 forward did (hf float32) or 04 did not say."""
    if args.no_tis:
        return None
    if args.tis_cap:
        return args.tis_cap
    other = any(isinstance(e["sampler"], dict) and (e["sampler"].get("backend") == "vllm" or
                                                     e["sampler"].get("dtype") not in ("float32", None))
                for e in episodes)
    return TIS_CAP if other else None


@torch.no_grad()
def sequence_logprobs(model, vhead, seqs, pad_id, device, amp, bs, tokens=None, logit_chunk=LOGIT_CHUNK,
                      desc="log-probs"):
    """Per sequence, the log-probs [n] of its generated tokens under the model's current weights, at the sequence's
    temperature, and with a value head their values [n] (else None). -> (log-probs, values): two lists in the order
    of `seqs`. Sequences run sorted by length (in file order the padding was 19-25% of the tokens, sorted ~1%)."""
    model.eval()
    by_length = sorted(seqs, key=lambda s: len(s["ids"]))
    mine = shard_by_tokens(by_length) if WORLD > 1 else by_length  # [distributed] each rank scores its share
    parts = micro_batches(mine, bs, tokens)
    if FSDP:  # [distributed] the same number of forwards on every rank (FSDP2's gathers); the extra ones are dropped
        parts += [None] * (int(max(all_sum([len(parts) * (r == RANK) for r in range(WORLD)]))) - len(parts))
    scores = {}  # id(sequence) -> (log-probs, values)
    for part in tqdm(parts, desc=desc, leave=False, disable=len(parts) <= 4 or RANK > 0):
        if part is None:
            forward(model, vhead, collate(by_length[:1], pad_id, device, fields=()), amp, chunk=logit_chunk)
            continue
        logp, _, v = forward(model, vhead, collate(part, pad_id, device, fields=()), amp, chunk=logit_chunk)
        sizes = [s["n"] for s in part]
        for s, lp, vv in zip(part, logp.split(sizes), v.split(sizes) if v is not None else [None] * len(part)):
            scores[id(s)] = (lp.float().cpu(), vv.float().cpu() if vv is not None else None)
    if WORLD > 1:  # [distributed] ... and every rank receives every rank's scores (a few floats per token)
        import torch.distributed as dist
        gathered_scores = [None] * WORLD
        dist.all_gather_object(gathered_scores, [scores[id(s)] for s in mine])
        for r, theirs in enumerate(gathered_scores):
            scores.update((id(s), sc) for s, sc in zip(shard_by_tokens(by_length, rank=r), theirs))
    if FSDP:  # [distributed] a root unit keeps its weights gathered after forward, until the backward that follows;
        # none follows here: shard them again (the optimizer must see, and update, the sharded parameters)
        for m in (model, vhead) if vhead is not None else (model,):
            m.reshard()
    model.train()
    return [scores[id(s)][0] for s in seqs], [scores[id(s)][1] for s in seqs]


def old_from_forward(seqs, logp, device):
    """pi_old of sequences trained at the rollout's weights (the first minibatch of the first epoch, see
    old_policy_scores): their own forward's log-probs, detached, and what is derived from pi_old for the others:
    the truncated-IS weights and, for a KL to this same policy, ref = pi_old. -> the batch's fields."""
    for s, lp in zip(seqs, logp.split([s["n"] for s in seqs])):
        s["old_logp"] = lp.float().cpu()
        cap, ref_is_old = s.pop("old_from_forward")
        if cap:
            s["tis_w"] = tis_weights(s["old_logp"], s["stored_logp"], cap)
        if ref_is_old:
            s["ref_logp"] = s["old_logp"].clone()
    return {k: torch.cat([s[k] for s in seqs]).to(device) for k in ("old_logp", "tis_w", "ref_logp") if k in seqs[0]}


# ------------------------------------------------------------------------------- one minibatch's gradient
def only_pg_term(args):
    """GRPO without KL or entropy terms: a sequence whose advantage is 0 everywhere adds exactly 0 to the loss."""
    return args.algo == "grpo" and not args.kl_coef and not args.ent_coef


def skips_zero_adv(args):
    """Such sequences are not even run (unless --no-skip-zero-adv); N_B still counts them."""
    return only_pg_term(args) and not args.no_skip_zero_adv


LOG_TERMS = ("loss", "pg_loss", "value_loss", "kl", "clip_frac", "approx_kl", "entropy")  # summed over micro-batches


def accumulate(model, vhead, seqs, args, pad_id, device, amp):
    """Forward/backward one minibatch in micro-batches; gradients add up to d(loss)/d(theta) of the
    whole minibatch because every micro-batch divides by the minibatch's N_B, not its own. -> its log row."""
    minibatch = seqs
    n_b = sum(s["n"] for s in seqs)  # N_B: generated tokens of the whole minibatch
    if WORLD > 1:  # [distributed] this rank's share, and N_B = the sum of the ranks' counts (each one logged)
        seqs, n_b, rank_tokens = rank_share(seqs, args)
    m = dict.fromkeys(LOG_TERMS, 0.0) | dict(tokens=n_b, seq_tokens=0)
    # the sequences with signal: GRPO without KL/entropy, those with A != 0 (A = 0 on every token gives
    # min(rho A, clip(rho) A) = 0, no gradient); every sequence otherwise (SFT, PPO's value loss, KL, entropy)
    signal = [s for s in seqs if s["adv"].any()] if only_pg_term(args) else seqs
    m["signal_sequences"] = len(signal)  # 0: no optimizer step
    if skips_zero_adv(args):  # run only those (N_B keeps the others)
        seqs = signal
    seqs = sorted(seqs, key=lambda s: len(s["ids"]))  # less padding; the sum does not depend on order
    micro = micro_batches(seqs, args.micro_batch_size, getattr(args, "micro_batch_tokens", None))
    if FSDP:  # [distributed] every rank runs as many forward/backward calls as the busiest one (FSDP2's collectives)
        micro += [None] * (int(max(all_sum([len(micro) * (r == RANK) for r in range(WORLD)]))) - len(micro))
        filler = min((s for s in minibatch if not skips_zero_adv(args) or s["adv"].any()), key=lambda s: len(s["ids"]),
                     default=None)  # any sequence that has the scores collate needs (its gradient is multiplied by 0)
    n_act = max(1, sum(s["n"] for s in seqs))  # the tokens run: clip_frac, approx_kl, entropy average over them
    if WORLD > 1:  # [distributed] the global counts of tokens run and of sequences with signal: the decision to
        # skip the optimizer step is about the whole minibatch, never one rank's share (else the ranks drift apart)
        n_act, signal_count = all_sum([sum(s["n"] for s in seqs), m["signal_sequences"]])
        n_act, m["signal_sequences"] = max(1, n_act), int(signal_count)
    for mb in micro:
        if mb is None:  # [distributed] --fsdp: a zero-weight micro-batch (gathers, then reduces zero gradients)
            logp, _, v = forward(model, vhead, collate([filler], pad_id, device), amp)
            (0.0 * (logp.sum() + (v.sum() if v is not None else 0.0))).backward()
            continue
        micro_step(model, vhead, mb, args, pad_id, device, amp, n_b, n_act, m)
    if WORLD > 1:  # [distributed] every term above is over the global N_B / n_act: the ranks' sum is the minibatch's
        if args.tis_cap:
            m.setdefault("tis_weight", 0.0)  # the same keys on every rank, even one that ran nothing
        names = [k for k in m if k not in ("tokens", "signal_sequences")]  # those two are already global
        m.update(zip(names, all_sum([m[k] for k in names])), tokens=int(n_b), rank_tokens=list(map(int, rank_tokens)))
        m["seq_tokens"] = int(m["seq_tokens"])
    if not args.ent_coef:
        m["entropy"] = None
    return m


def micro_step(model, vhead, mb, args, pad_id, device, amp, n_b, n_act, m):
    """Forward and backward of one micro-batch `mb` (its gradients add to .grad); its share of each logged term
    added to the minibatch's row m."""
    b = collate(mb, pad_id, device)
    logp, ent, v = forward(model, vhead, b, amp, entropy=args.ent_coef > 0,
                           chunk=getattr(args, "logit_chunk", LOGIT_CHUNK))
    if args.algo != "sft" and "old_logp" not in b:  # the first minibatch at the rollout's weights (old_policy_scores)
        b.update(old_from_forward(mb, logp.detach(), device))
    loss, pg_loss, kl, v_loss, ratio = objective(logp, ent, v, b, args, n_b)
    loss.backward()
    with torch.no_grad():
        log_ratio = torch.log(ratio)  # log rho_t
        if "tis_w" in b:
            m["tis_weight"] = m.get("tis_weight", 0.0) + b["tis_w"].sum().item() / n_act
        m["loss"] += loss.item()
        m["pg_loss"] += pg_loss.item()
        m["kl"] += float(kl)
        m["value_loss"] += float(v_loss)
        m["clip_frac"] += ((ratio - 1).abs() > args.clip_eps).sum().item() / n_act
        m["approx_kl"] += ((ratio - 1) - log_ratio).sum().item() / n_act  # k3 of KL(old || new)
        if ent is not None:  # only with --ent-coef (the [N, V] work it takes is not spent for the log alone)
            m["entropy"] += ent.sum().item() / n_act
        m["seq_tokens"] += b["tokens"]


# -------------------------------------------------------------------------- the stage's steps, in order
def load_policy(args, policy, device, probe_ids):
    """The policy (fp32 master weights, training mode without dropout), its tokenizer, the pad id and, for PPO, the
    value head V(s_t) = w . h_t + b on the last hidden state (zeros at first, or the one saved beside the policy).
    -> (tok, model, vhead or None, pad_id)"""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(policy)
    # [distributed] --fsdp: the full model stays on the CPU; shard_model below moves each rank's shards to its GPU
    model = AutoModelForCausalLM.from_pretrained(policy, dtype=torch.float32).to("cpu" if FSDP else device)
    train_mode(model, grad_ckpt=device == "cuda")
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    vhead = None
    if args.algo == "ppo":
        vhead = torch.nn.Linear(model.config.hidden_size, 1).to(device)
        torch.nn.init.zeros_(vhead.weight)
        torch.nn.init.zeros_(vhead.bias)
        if (policy / "value_head.pt").is_file():
            vhead.load_state_dict(torch.load(policy / "value_head.pt", map_location=device))
    check_head(model, probe_ids, policy)
    if FSDP:  # [distributed] shard the policy (per decoder layer + root) and the value head over the ranks
        from torch.distributed.fsdp import fully_shard
        shard_model(model)
        vhead = sum_gradients(fully_shard(vhead)) if vhead is not None else None  # its own root unit
    return tok, model, vhead, pad_id


def minibatch_size(args, n):
    """Sequences per optimizer step: --minibatch-size, or n / --minibatches, or SFT 32, RL n / 2."""
    if args.minibatch_size:
        return args.minibatch_size
    if args.minibatches:
        return math.ceil(n / args.minibatches)
    return 32 if args.algo == "sft" else math.ceil(n / 2)


def prepare_batch(args, model, vhead, episodes, seqs, ref, same_ref, pad_id, device, amp, shuffle_gen):
    """Before any step: the advantages (GRPO: per episode; PPO: GAE per token, after the old values), the sequences
    that will run, and for RL pi_old (+ TIS weights, ref log-probs). -> (active sequences, minibatch size, info)"""
    rewards = [e["reward"] for e in episodes]
    info = dict(episodes=len(episodes), sequences=len(seqs), turns=sum(len(e["turns"]) for e in episodes),
                gen_tokens=sum(s["n"] for s in seqs), reward_mean=float(np.mean(rewards)))
    if args.algo == "grpo":
        adv, info["zero_var_group_share"] = grpo_advantages(rewards, [e["group"] for e in episodes],
                                                            not args.no_std, args.adv_eps)
        for s in seqs:  # every generated token of an episode shares its advantage
            s["adv"] = torch.full((s["n"],), float(adv[s["ep"]]))
    # the sequences that carry a gradient (GRPO: equal-reward groups have A = 0 and are skipped, see accumulate)
    active = [s for s in seqs if s["adv"].any()] if skips_zero_adv(args) else seqs
    info["trained_sequences"] = len(active)
    mb_size = minibatch_size(args, len(seqs))
    if args.algo != "sft" and active:
        old_policy_scores(args, model, vhead, episodes, seqs, active, info, ref, same_ref, mb_size,
                          pad_id, device, amp, shuffle_gen)
    if args.algo == "ppo":  # GAE needs the old values scored above
        ppo_advantages(seqs, rewards, args.gamma, args.lam, whiten=not args.no_norm_adv)
    return active, mb_size, info


def old_policy_scores(args, model, vhead, episodes, seqs, active, info, ref, same_ref, mb_size, pad_id, device, amp,
                      shuffle_gen):
    """Sets s["old_logp"] (pi_old: the log-probs under the rollout's weights, this policy, at each episode's
    temperature), s["old_v"] (PPO), s["tis_w"] (truncated IS) and s["ref_logp"] (KL) of the active sequences.
    No work done twice: the first minibatch of the first epoch is trained at exactly those weights (no step yet,
    dropout off, same sequences and temperature), so its own forward pass IS pi_old: under GRPO its sequences are
    not scored here, accumulate takes pi_old from that forward, detached (its ratio is then 1, as it is, up to float
    noise, against a separate pass), and the TIS weights and a KL reference equal to this policy with it. PPO scores
    everything (GAE needs the old values before any step); so does torchrun (a rank would miss the pi_old of
    sequences another rank ran); the rollout's own log-probs are not used as pi_old (docs/rl-cost.md: not bit-equal
    even on the hf fp32 path, and vLLM's differ by ~1e-2)."""
    from transformers import AutoModelForCausalLM
    info["tis_cap"] = cap = tis_cap_for(args, episodes)
    first = set()
    if args.algo == "grpo" and WORLD == 1 and not args.score_all_old:
        state = shuffle_gen.get_state()  # the first epoch's order, drawn again in update from the same state
        first = set(torch.randperm(len(seqs), generator=shuffle_gen)[:mb_size].tolist())
        shuffle_gen.set_state(state)
    runs = {id(s) for s in active}
    for k, s in enumerate(seqs):
        if k in first and id(s) in runs:
            s["old_from_forward"] = (cap, same_ref)
    scored = [s for s in active if "old_from_forward" not in s]
    info["old_logp_scored"] = len(scored)  # sequences scored apart (the rest: pi_old from the first forward)
    old_logp, old_v = sequence_logprobs(model, vhead, scored, pad_id, device, amp, args.micro_batch_size,
                                        args.micro_batch_tokens, args.logit_chunk, "old log-probs")
    for s, lp, v in zip(scored, old_logp, old_v):
        s["old_logp"] = lp
        if v is not None:
            s["old_v"] = v
        if cap:  # tokens without rollout log-probs weigh 1
            s["tis_w"] = tis_weights(lp, s["stored_logp"], cap)
        if same_ref:
            s["ref_logp"] = lp.clone()
    if cap and RANK == 0:
        print(f"[05] truncated IS on: w_t = min(pi_old / pi_rollout, {cap}) "
              f"({'--tis-cap' if args.tis_cap else 'default: sampled by ' + sampler_of(episodes)})")
    if uses_kl(args) and not same_ref:
        ref_model = AutoModelForCausalLM.from_pretrained(ref, dtype=torch.float32)
        ref_model = shard_model(ref_model) if FSDP else ref_model.to(device)  # [distributed] --fsdp: sharded too
        ref_logp, _ = sequence_logprobs(ref_model, None, active, pad_id, device, amp, args.micro_batch_size,
                                        args.micro_batch_tokens, args.logit_chunk, "ref log-probs")
        for s, lp in zip(active, ref_logp):
            s["ref_logp"] = lp
        del ref_model


def logprob_mismatch(active, info, warnings):
    """Mean |rollout - trainer| log-prob over the tokens that have both (logged; a warning above MISMATCH_WARN)."""
    stored = torch.cat([s["stored_logp"] for s in active])
    recomp = torch.cat([s["old_logp"] for s in active])
    have = ~torch.isnan(stored)
    info["logprob_mismatch"] = float((stored[have] - recomp[have]).abs().mean()) if have.any() else None
    if (info["logprob_mismatch"] or 0) > MISMATCH_WARN:
        warnings.append(f"logprob_mismatch {info['logprob_mismatch']:.3g} > {MISMATCH_WARN}: the rollouts were not "
                        "sampled by these weights at the recorded temperature (off-policy; see --tis-cap)")
        if RANK == 0:
            print(f"[05] warning: {warnings[-1]}", file=sys.stderr)


def make_optimizer(args, model, vhead, policy, info):
    """AdamW; the value head has its own parameter group (learning rate) and gradient clipping. Its moments are
    carried over from the policy folder's optimizer.pt where that fits. -> (opt, the parameter groups' shapes)"""
    param_groups = [dict(params=list(model.parameters()), lr=args.lr)]
    if vhead is not None:
        param_groups.append(dict(params=list(vhead.parameters()), lr=args.vf_lr or 10 * args.lr))
    opt = torch.optim.AdamW(param_groups, lr=args.lr, weight_decay=args.weight_decay)
    shapes = [[list(p.shape) for p in g["params"]] for g in param_groups]
    info["optimizer_state"] = ("fresh AdamW state (--no-optimizer-state)" if args.no_optimizer_state else
                               load_optimizer(opt, policy / "optimizer.pt", args.algo, shapes))
    print(f"[05] optimizer: {info['optimizer_state']}")
    return opt, shapes



def load_optimizer(opt, path, algo, shapes):
    """Carry AdamW's moments across updates: a fresh AdamW makes each first step ~lr * sign(g)."""
    if not path.is_file():
        return f"fresh AdamW state ({path} not found)"
    saved = torch.load(path, map_location="cpu")
    if saved.get("algo") != algo or saved.get("shapes") != shapes:  # e.g. SFT -> RL, GRPO -> PPO (value head)
        return f"fresh AdamW state ({path} was saved by --algo {saved.get('algo')}, other parameter groups)"
    hyper = [(g["lr"], g["weight_decay"]) for g in opt.param_groups]
    if FSDP:  # [distributed] the file holds full moments (whoever wrote it): each rank keeps its shard of each
        from torch.distributed.tensor import distribute_tensor
        params = [p for g in opt.param_groups for p in g["params"]]
        for i, st in saved["state"]["state"].items():
            for k, v in st.items():
                if k != "step":  # every rank read the same file: each cuts its own shard, no communication
                    p = params[i]
                    st[k] = distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
    opt.load_state_dict(saved["state"])  # moved to each parameter's device; this run's lr replaces the saved one
    for g, (lr, wd) in zip(opt.param_groups, hyper):
        g["lr"], g["weight_decay"] = lr, wd
    steps = int(next(iter(opt.state.values()))["step"]) if opt.state else 0  # 0: saved by an update with no step
    return f"AdamW state loaded from {path} ({steps} steps so far)"


def update(args, model, vhead, opt, seqs, active, info, warnings, mb_size, pad_id, device, amp, shuffle_gen):
    """Epochs x minibatches (a fresh random order each epoch), each minibatch one AdamW step on the gradient
    accumulated over its micro-batches. -> the log, one row per minibatch"""
    n_mb = math.ceil(len(seqs) / mb_size)
    log = []
    bar = tqdm(total=args.epochs * n_mb, desc=f"05 {args.algo}", disable=args.epochs * n_mb < 5 or RANK > 0)
    for epoch in range(args.epochs):
        order = torch.randperm(len(seqs), generator=shuffle_gen).tolist()
        for j in range(n_mb):
            ts = time.time()
            m = accumulate(model, vhead, [seqs[k] for k in order[j * mb_size:(j + 1) * mb_size]],
                           args, pad_id, device, amp)
            if args.algo != "sft" and active and "logprob_mismatch" not in info:  # every pi_old is known now
                logprob_mismatch(active, info, warnings)
            norms = optimizer_step(args, opt, m)
            dt = time.time() - ts
            m.update(step=len(log), epoch=epoch, grad_norm=math.hypot(*norms), pg_grad_norm=norms[0],
                     reward_mean=info["reward_mean"], tokens_per_s=m["seq_tokens"] / dt, step_s=dt)
            m.update({k: info[k] for k in ("zero_var_group_share", "logprob_mismatch", "trained_sequences", "tis_cap")
                      if k in info})
            if args.algo == "ppo":
                m["vf_grad_norm"] = norms[1]
            else:
                m.pop("value_loss")
            log.append(m)
            bar.update()
            bar.set_postfix(loss=f"{m['loss']:.4f}")
    bar.close()
    return log


def optimizer_step(args, opt, m):
    """theta <- AdamW(theta, clip(g)) with the minibatch's accumulated gradient g, clipped per parameter group to
    --max-grad-norm; then the gradients are cleared. No signal, no step: with zero gradients AdamW would still move
    every weight by its momentum (lr * m_hat / (sqrt(v_hat) + eps), about lr per parameter) and decay it; the state
    stays untouched too. -> each parameter group's gradient norm before clipping (0 without a step)"""
    m["optimizer_step"] = m["signal_sequences"] > 0
    norms = [0.0] * len(opt.param_groups)
    if m["optimizer_step"]:
        # [distributed] sum the ranks' gradients (FSDP2 has already: sum_gradients): clip_grad_norm_ below
        # then sees the global norm (FSDP2's sharded DTensor gradients: the norm of the full gradient)
        if WORLD > 1 and not FSDP:
            all_reduce_grads([p for g in opt.param_groups for p in g["params"]], naive=args.naive_local_nb)
        norms = [float(torch.nn.utils.clip_grad_norm_(g["params"], args.max_grad_norm)) for g in opt.param_groups]
        opt.step()
    opt.zero_grad(set_to_none=True)
    return norms


def save(args, model, vhead, tok, opt, shapes, log, config):
    """Checkpoint to <out>.tmp, the log and the config beside it, then <out>.tmp -> <out> last: its presence means
    the stage finished. [distributed] rank 0 alone writes (the others return False); --fsdp: the gathered weights."""
    out = Path(config["out"])
    if FSDP:  # [distributed] the full weights and AdamW state, gathered to rank 0's CPU (every rank takes part)
        full = dict(model=gathered(model.state_dict(keep_vars=True)),
                    vhead=gathered(vhead.state_dict(keep_vars=True)) if vhead is not None else None,
                    opt=None if args.no_optimizer_state else gathered_optimizer_state(opt))
    if WORLD > 1:  # [distributed] every rank holds the same weights and AdamW state (or, --fsdp, rank 0 holds the
        # gathered ones): rank 0 alone writes them
        import torch.distributed as dist
        dist.barrier()
        if RANK > 0:
            dist.destroy_process_group()
            return False
    tmp = Path(str(out) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    model.config.use_cache = True
    # a plain causal LM (fp32 master weights) + generation_config; [distributed] --fsdp: the gathered weights
    model.save_pretrained(tmp, state_dict=full["model"] if FSDP else None)
    tok.save_pretrained(tmp)
    if vhead is not None:
        torch.save(full["vhead"] if FSDP else vhead.state_dict(), tmp / "value_head.pt")
    if not args.no_optimizer_state:  # AdamW moments: 2x the fp32 weights on disk
        torch.save(dict(algo=args.algo, shapes=shapes, state=full["opt"] if FSDP else opt.state_dict()),
                   tmp / "optimizer.pt")
    write_atomic(out.parent / "train_log.jsonl", "".join(json.dumps(r) + "\n" for r in log))
    write_atomic(out.parent / "05_train_config.json", json.dumps(config, indent=2, default=str))
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    if WORLD > 1:
        torch.distributed.destroy_process_group()
    return True


# ------------------------------------------------------------------- distributed (torchrun; docs/distributed.md)
# Under `torchrun --nproc_per_node N` every rank loads the same rollouts, builds the same sequences and draws the
# same minibatch order (same seed); each minibatch is then split over the ranks by tokens. Three things make N ranks
# give the one-process update: N_B (and every batch-level count of the log) is summed over ranks BEFORE the loss,
# gradients are SUMMED over ranks (not averaged), and the clipping norm is taken after that sum (the global norm).
# Run as `python 05_train.py`, WORLD = 1 and none of this runs a collective. RANK, WORLD, FSDP: at the top.


def init_distributed(fsdp=False):
    """torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR; gloo on CPU, NCCL on GPUs."""
    global RANK, WORLD, FSDP
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        if fsdp:  # one process holds the whole model anyway: sharding it over one rank would only add collectives
            fail("--fsdp shards the model over torchrun's processes: run 05 under torchrun --nproc_per_node N "
                 "(N >= 2), or drop --fsdp")
        return
    import torch.distributed as dist
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # "cuda" below = this rank's GPU
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    RANK, WORLD, FSDP = dist.get_rank(), dist.get_world_size(), fsdp


def all_sum(x):
    """sum over ranks of a number or a list of numbers (float64, exact for token counts); identity on one process."""
    if WORLD == 1:
        return x
    import torch.distributed as dist
    t = torch.tensor(x, dtype=torch.float64, device="cuda" if torch.cuda.is_available() else "cpu")
    dist.all_reduce(t)  # SUM
    return t.tolist()


def shard_by_tokens(seqs, rank=None, world=None, cost=lambda s: len(s["ids"])):
    """This rank's share of a list of sequences: costliest first onto the least-loaded rank (cost: tokens run by
    the forward), ties by position, so every rank computes the same split without talking to the others."""
    rank, world = RANK if rank is None else rank, WORLD if world is None else world
    load, owner = [0] * world, [0] * len(seqs)
    for i in sorted(range(len(seqs)), key=lambda i: (-cost(seqs[i]), i)):
        owner[i] = min(range(world), key=lambda r: (load[r], r))
        load[owner[i]] += cost(seqs[i])
    return [s for s, r in zip(seqs, owner) if r == rank]


def rank_share(seqs, args):
    """This rank's share of a minibatch, balanced by the tokens that will run (skipped ones cost 0), and N_B, the
    generated tokens of the WHOLE minibatch: the sum of the ranks' counts, taken before any loss. -> (share, N_B,
    each rank's count). --naive-local-nb (tests only): N_B = this rank's own count, the biased port."""
    seqs = shard_by_tokens(seqs, cost=lambda s: len(s["ids"]) if not skips_zero_adv(args) or s["adv"].any() else 0)
    n_b = sum(s["n"] for s in seqs)
    rank_tokens = all_sum([n_b * (r == RANK) for r in range(WORLD)])
    return seqs, n_b if args.naive_local_nb else sum(rank_tokens), rank_tokens


def all_reduce_grads(params, naive=False):
    """g = sum_r g_r. Each rank divided its loss by the GLOBAL N_B, so
        sum_r 1/N_B sum_{t in B_r} l_t = 1/N_B sum_{t in B} l_t,
    the one-process loss, and the sum of the ranks' gradients is the one-process gradient. A plain all-reduce
    rather than DistributedDataParallel: DDP AVERAGES (1/W sum_r g_r, so the loss would need a factor W), needs every
    forward to go through its wrapper (05 calls model.base_model and the LM head directly) and the same number of
    synchronised backwards per rank, while ranks here hold different numbers of micro-batches (or none: a rank
    without an active sequence sends zeros). What DDP adds is speed (buckets reduced while backward still runs).
    naive=True (tests only): the biased port, each rank's loss over its own N_B_r, then DDP's mean:
    1/W sum_r 1/N_B_r sum_{t in B_r} l_t, which weighs a token on a short rank more than one on a long rank."""
    import torch.distributed as dist
    for p in params:
        if p.grad is None:  # a rank that ran no sequence: it still takes part, with zeros
            p.grad = torch.zeros_like(p)
        dist.all_reduce(p.grad)  # SUM over ranks
        if naive:
            p.grad /= WORLD


# [distributed] --fsdp: FSDP2 keeps 1/W of every weight, gradient and AdamW moment on each rank and gathers a unit's
# full weights around its forward and backward (a model whose full copy does not fit one GPU). The N_B arithmetic
# above does not change; four things do:
# - every forward and backward is a collective, so every rank runs the same number of them: a rank with fewer
#   micro-batches (or none) runs zero-weight ones (accumulate, sequence_logprobs);
# - FSDP2 reduces each gradient to its MEAN over ranks; 05 needs the SUM (sum_gradients);
# - 05 runs model.base_model and the LM head directly, not model.forward: both run inside trunk_and_head, registered
#   as a forward method of the root unit, which owns the embeddings, the final norm and the tied LM head;
# - the checkpoint and optimizer.pt are gathered to rank 0 and written in the one-process format (gathered).
def shard_model(model):
    """FSDP2 in place: one unit per decoder layer (the classes transformers never splits, `_no_split_modules`), then
    the root unit with what is left (embeddings, final norm, the LM head tied to the embeddings)."""
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
    for m in model.modules():
        if type(m).__name__ in (model._no_split_modules or []):
            fully_shard(m)
    fully_shard(model)
    model.trunk_and_head = types.MethodType(trunk_and_head, model)
    register_fsdp_forward_method(model, "trunk_and_head")  # the root's weights are gathered around it, as around forward
    return sum_gradients(model)


def sum_gradients(module):
    """FSDP2 reduce-scatters a gradient as 1/W sum_r g_r. Each rank's loss is already over the GLOBAL N_B, so the
    one-process gradient is the plain sum (all_reduce_grads): divide factor 1, done as a SUM reduction (gloo has no
    PREMUL_SUM). The alternative, the loss times W and FSDP2's mean, gives the same W * 1/W."""
    from torch.distributed.fsdp import FSDPModule
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return module


@torch.no_grad()
def gathered(tensors):
    """{name: full CPU copy on rank 0, None elsewhere} of a dict of DTensor shards (a collective: every rank calls it
    in the same order). A tensor under two names (the tied LM head) stays one tensor, as save_pretrained expects."""
    from torch.distributed.tensor import DTensor
    out, full = {}, {}
    for k, v in tensors.items():
        if id(v) not in full:
            t = v.full_tensor() if isinstance(v, DTensor) else v
            full[id(v)] = t.detach().cpu() if RANK == 0 else None
        out[k] = full[id(v)]
    return out


def gathered_optimizer_state(opt):
    """AdamW's state_dict() with full moments (integer parameter ids, like the one-process optimizer.pt)."""
    sd = opt.state_dict()
    return dict(sd, state={i: gathered(st) for i, st in sorted(sd["state"].items())})


# ---------------------------------------------------------------------------------- one writer per output
LOCK_ENV = "HARNESS_SCALING_LOCKS"  # the lock files held by the processes that started this one: path=pid;...


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@contextlib.contextmanager
def locked(path):
    """Hold the lock file `path` (os.open O_CREAT|O_EXCL; it holds our pid and command) while the block runs. A
    second writer prints who holds it and exits 2; a lock whose pid is dead is stale and taken over; a lock held
    by the process that started this one (the pipeline, 06 calling 04) is ours. On exit the lock goes, and so do
    the folders made for it if they stayed empty: bad input leaves nothing behind."""
    path = Path(path).resolve()
    made = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    inherited = dict(x.rsplit("=", 1) for x in os.environ.get(LOCK_ENV, "").split(os.pathsep) if "=" in x)
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            try:
                holder = json.loads(path.read_text())
                pid = int(holder["pid"])
            except (OSError, ValueError, KeyError, TypeError):  # being written this instant, or garbage
                holder, pid = {}, None
            if pid is not None and inherited.get(str(path)) == str(pid):
                yield  # our parent holds it
                return
            if pid is not None and pid_alive(pid) or pid is None and path.exists() and \
                    time.time() - path.stat().st_mtime < 5:
                print(f"error: {path} is held by pid {pid} ({holder.get('command', '?')}); wait for it to finish, or "
                      "stop it (a lock whose process is gone is taken over)", file=sys.stderr)
                raise SystemExit(2)
            path.unlink(missing_ok=True)  # stale: its process is gone
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": os.getpid(), "command": " ".join(sys.argv)}, f)
    before = os.environ.get(LOCK_ENV)
    os.environ[LOCK_ENV] = os.pathsep.join(filter(None, [before, f"{path}={os.getpid()}"]))
    term = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread() and term == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # SIGTERM unwinds (finally runs), like Ctrl-C
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread() and term == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, term)
        if before is None:
            os.environ.pop(LOCK_ENV, None)
        else:
            os.environ[LOCK_ENV] = before
        path.unlink(missing_ok=True)
        for p in made:  # deepest first
            if p.is_dir() and not any(p.iterdir()):
                p.rmdir()


# -------------------------------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    out = args.out or (Path(args.run) / f"iter_{args.iteration:03d}" / "policy" if args.iteration is not None else None)
    rank0 = os.environ.get("RANK", "0") == "0"  # under torchrun only rank 0 writes, so only it holds the lock
    with locked(Path(str(out) + ".lock")) if out and rank0 else contextlib.nullcontext():  # <out>.lock
        return run_stage(args)


def run_stage(args):
    """The stage in its steps: check the inputs, prepare the batch, update, save. -> the summary (None on ranks > 0)"""
    # ---- input checking: the flags, the paths, every rollout record
    check_flags(args)
    init_distributed(args.fsdp)  # [distributed] under torchrun: join the process group (no-op for `python 05_train.py`)
    if RANK > 0:  # [distributed] one voice: only rank 0 prints to stdout (errors and tqdm go to stderr)
        sys.stdout = open(os.devnull, "w")
    policy, rollouts, out, ref, episodes, warnings = check_inputs(args)
    same_ref = uses_kl(args) and ref.resolve() == policy.resolve()

    # ---- the algorithm. Seeding: python, numpy, torch (CPU + CUDA); the minibatch shuffles use their own generator
    seed_everything(args.seed)
    shuffle_gen = torch.Generator().manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    # GPU: gradient checkpointing, and bf16 autocast (fp32 LM head) where the GPU has bf16; fp32 on T4/V100 and, by
    # default, on the CPU (--amp bf16 turns it on there)
    # (fp16 autocast would need loss scaling, which this file does not implement)
    amp = (device == "cuda" and torch.cuda.is_bf16_supported()) if args.amp == "auto" else args.amp == "bf16"
    if amp and device == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        print("[05] warning: --amp bf16 on a CPU without native bf16 (AVX512-BF16 / AMX): emulated, slower than fp32")
    seqs = build_sequences(episodes, merge=not args.no_merge_turns)
    tok, model, vhead, pad_id = load_policy(args, policy, device, seqs[0]["ids"])
    t0 = time.time()
    active, mb_size, info = prepare_batch(args, model, vhead, episodes, seqs, ref, same_ref, pad_id, device, amp,
                                          shuffle_gen)
    prep_s = time.time() - t0
    for w in warnings if RANK == 0 else []:
        print(f"[05] warning: {w}", file=sys.stderr)
    opt, shapes = make_optimizer(args, model, vhead, policy, info)
    t_update = time.time()
    log = update(args, model, vhead, opt, seqs, active, info, warnings, mb_size, pad_id, device, amp, shuffle_gen)
    update_s = time.time() - t_update
    info["optimizer_steps"] = sum(r["optimizer_step"] for r in log)
    if not info["optimizer_steps"] and RANK == 0:
        print("[05] no optimizer step: no minibatch had a sequence with signal (every GRPO group reward-equal); "
              "the policy is written unchanged")
    check_finite(model, vhead, log)  # input checking's last guard: a non-finite policy is never written

    # ---- save
    summary = dict(info, steps=len(log), prep_s=prep_s, update_s=update_s, device=device, bf16_autocast=amp,
                   first_loss=log[0]["loss"], last_loss=log[-1]["loss"], warnings=warnings)
    config = dict(args=vars(args), policy=str(policy), rollouts=str(rollouts), out=str(out),
                  ref_policy=str(ref) if uses_kl(args) else None, seed=args.seed, torch=torch.__version__, **summary)
    if not save(args, model, vhead, tok, opt, shapes, log, config):
        return None  # [distributed] ranks > 0
    print(f"[05] {args.algo}: {info['episodes']} episodes, {info['sequences']} sequences "
          f"({info['turns']} turns), {info['gen_tokens']} generated tokens, reward mean {info['reward_mean']:.3f}")
    extra = {k: info[k] for k in ("zero_var_group_share", "logprob_mismatch", "trained_sequences", "tis_cap")
             if k in info}
    print(f"[05] {info['optimizer_steps']} optimizer steps of {len(log)} minibatches in {update_s:.1f} s "
          f"(+{prep_s:.1f} s old log-probs), loss {log[0]['loss']:.4f} -> {log[-1]['loss']:.4f} {extra} "
          f"seed {args.seed} -> {out}")
    return summary


if __name__ == "__main__":
    main()
