"""Stage 05: one policy update from one iteration's rollouts (GRPO / PPO / SFT), plain PyTorch.

    python 05_train.py --algo sft --policy runs/toy/tiny --rollouts demos.jsonl --out runs/toy/init_policy \
        --epochs 6 --lr 3e-3
    python 05_train.py --run runs/toy --iteration 0 --algo grpo --lr 3e-4
    python 05_train.py --run runs/toy --iteration 1 --algo ppo --epochs 2 --minibatches 4 --kl-coef 0.05
    # N GPUs (or N CPU processes on gloo): the same update, each minibatch split over the ranks (docs/engineering.md)
    torchrun --standalone --nproc_per_node 4 -- 05_train.py --run runs/gpu --iteration 0 --algo grpo
    # ... with the model sharded over the ranks (FSDP2) when its weights + AdamW state do not fit one GPU
    torchrun --standalone --nproc_per_node 4 -- 05_train.py --run runs/big --iteration 0 --algo grpo --fsdp

The paper's multi-harness policy optimisation: the clipped surrogate over every generated token of every (task,
harness, trajectory) of the update batch, pi_old recomputed at the sampling temperature. `run_stage` runs the steps in
order: flags, load, sequences, advantages, pi_old, the update loop (epochs x minibatches, one AdamW step each, around
`objective`, its equation above it), save. The log-probs it trains on are computed here, above the objective. Beside
it: common/off_policy.py (truncated IS, where another engine sampled) and, under torchrun only, common/distributed.py
(each `if dist:` below). What it writes, its defaults and its rules: docs/stages.md.
"""
import argparse
import contextlib
import dataclasses
import functools
import json
import math
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from common import off_policy
from common.generation import (bf16_autocast, check_policy_folder, load_for_training, load_optimizer, load_reference,
                               save_checkpoint)
from common.plumbing import fail, iteration_policy, jsonl_text, locked, seed_everything
from common.schemas import load_train_rollouts

LOGIT_CHUNK = 1024  # completion tokens per LM-head chunk: an fp32 [1024, 151,936] tensor is 0.6 GB
ADV_EPS = 1e-6  # GRPO: A = (r - mean) / (std + eps)
GAMMA = 1.0  # PPO: discount over generated tokens (verl's default; the reward is on the episode's last token)
VF_COEF, VF_CLIP, VF_LR_FACTOR = 0.5, 0.5, 10  # PPO: value-loss weight, value clip, value head lr = 10 x --lr (verl)


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    g = p.add_argument_group("inputs and outputs")
    g.add_argument("--run", default="runs/default", help="run folder (used with --iteration)")
    g.add_argument("--iteration", type=int, help="RL iteration t (sets the default paths)")
    g.add_argument("--policy", help="checkpoint folder (default DIR/init_policy; t > 0: DIR/iter_{t-1:03d}/policy)")
    g.add_argument("--rollouts", help="rollouts.jsonl (default DIR/iter_{t:03d}/rollouts.jsonl)")
    g.add_argument("--out", help="output checkpoint folder (default DIR/iter_{t:03d}/policy)")
    g.add_argument("--seed", type=int, default=0, help="seeds torch and the minibatch order (a replicate)")
    g = p.add_argument_group("algorithm")
    g.add_argument("--algo", choices=["grpo", "ppo", "sft"], default="grpo")
    g.add_argument("--clip-eps", type=float, default=0.2, help="epsilon of clip(rho, 1-eps, 1+eps)")
    g.add_argument("--kl-coef", type=float, default=0.0, help="weight of the k3 KL to the reference policy (0: off)")
    g.add_argument("--ref-policy", help="KL reference (default: --iteration's DIR/init_policy if any, else --policy)")
    g.add_argument("--ent-coef", type=float, default=0.0, help="entropy bonus weight (0: entropy not computed)")
    g.add_argument("--tis-cap", type=float, help=f"truncated IS cap C: each token's term times min(pi_old / "
                   f"pi_rollout, C); 0 = off. Default {off_policy.TIS_CAP} where another engine sampled (vLLM, not fp32)")
    g.add_argument("--lam", type=float, default=1.0, help="PPO: GAE lambda (verl's default 1: A_t = R - V_t)")
    g.add_argument("--min-reward", type=float, help="SFT: keep only demonstrations with reward >= this (e.g. 1)")
    g = p.add_argument_group("optimisation")
    g.add_argument("--lr", type=float, default=1e-5, help="AdamW learning rate (toy: 3e-4 RL, 3e-3 SFT)")
    g.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    g.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping (total L2 norm per group)")
    g.add_argument("--epochs", "--ppo-epochs", dest="epochs", type=int, help="passes over the batch (RL 2, SFT 1)")
    g.add_argument("--minibatches", type=int, help="optimizer steps per pass (RL default 2)")
    g.add_argument("--minibatch-size", type=int, help="sequences per optimizer step (SFT default 32)")
    g.add_argument("--no-optimizer-state", action="store_true", help="neither load nor save optimizer.pt (AdamW)")
    g = p.add_argument_group("memory and speed (none changes the update)")
    g.add_argument("--micro-batch-size", type=int, default=8, help="sequences per forward/backward (accumulation)")
    g.add_argument("--micro-batch-tokens", type=int, help="instead: at most this many padded tokens per micro-batch")
    g.add_argument("--amp", choices=["auto", "bf16", "off"], default="auto", help="bf16 autocast of the trunk (LM "
                   "head fp32): auto = on a GPU with bf16; bf16 = also on a CPU (~1.6x faster with AVX512-BF16/AMX)")
    g = p.add_argument_group("distributed (torchrun, docs/engineering.md)")
    g.add_argument("--fsdp", action="store_true", help="shard weights, gradients, AdamW state over the ranks (FSDP2)")
    args = p.parse_args(argv)
    if args.epochs is None:
        args.epochs = 1 if args.algo == "sft" else 2
    return args


# ------------------------------------------------------------------------ one process, or N under torchrun
# `python 05_train.py` is one process holding every sequence and the whole model: dist is None. Under `torchrun
# --nproc_per_node N` (it sets LOCAL_RANK) dist is common/distributed.py, and each `if dist` below is the one point
# where the N ranks share a step (N = 1 too: one GPU, NCCL and FSDP2). docs/engineering.md.
if "LOCAL_RANK" in os.environ:
    from common import distributed as dist
else:
    dist = None


def rank0():
    """This process writes and prints: the one process, or torchrun's rank 0."""
    return dist is None or dist.rank == 0


def placed(model, vhead, device):
    """The model (and PPO's value head) on this process's device; torchrun --fsdp: sharded over the ranks."""
    if dist:
        return dist.placed(model, vhead, device, trunk_and_head)
    return model.to(device), vhead


# ------------------------------------------------------------------------------------- the algorithm
# rollout records -> episodes -> sequences -> advantages -> pi_old -> the objective -> one update
@dataclasses.dataclass(eq=False)  # eq=False: a sequence is itself (compared, hashed by identity)
class Sequence:
    """One training sequence: a model turn's prompt + completion, or several turns of one episode merged."""
    ids: list  # prompt + completion token ids [L]
    mask: list  # M_t per position [L]: 1 on generated tokens, 0 on prompts and tool outputs
    ep: int  # its episode's index (GRPO: the episode's advantage; PPO: GAE runs over the episode)
    temp: float  # the episode's sampling temperature: every log-prob is taken at it
    n: int = 0  # generated tokens, sum(mask)
    stored_logp: torch.Tensor = None  # [n] the sampler's log-probs (NaN where 04 stored none): truncated IS
    # per generated token [n], set before the update
    adv: torch.Tensor = None  # A_t
    ret: torch.Tensor = None  # R_t, PPO's value target
    old_logp: torch.Tensor = None  # log pi_old(y_t | s_t)
    old_v: torch.Tensor = None  # V_old,t (PPO)
    ref_logp: torch.Tensor = None  # log pi_ref(y_t | s_t) (KL)
    tis_w: torch.Tensor = None  # truncated-IS weight w_t


TOKEN_FIELDS = ("old_logp", "ref_logp", "old_v", "adv", "ret", "tis_w")  # per generated token, set before the update


@dataclasses.dataclass
class Context:
    """What every step of the update needs: the flags, the policy (and PPO's value head), where and how it runs."""
    args: argparse.Namespace
    model: torch.nn.Module
    vhead: torch.nn.Module  # PPO's value head, else None
    pad_id: int
    device: str
    amp: bool  # bf16 autocast of the trunk
    tis_cap: float = None  # truncated-IS cap C; None: off
    same_ref: bool = False  # the KL reference is the loaded policy: pi_ref = pi_old
    chunk: int = LOGIT_CHUNK  # completion tokens per LM-head chunk (trunk_and_head); 0: all at once


def load_episodes(path, algo, vocab, min_reward=None):
    """The update batch: [{"turns": [(prompt_ids, completion_ids, logprobs|None)], "reward", ...}] of the records
    schemas.load_train_rollouts accepts (its rules: the flags' fields, no greedy RL, no episode twice, --min-reward)."""
    episodes = []
    for ln, r in load_train_rollouts(path, algo, vocab, min_reward):
        turns = [(t["prompt_ids"], t["completion_ids"], t.get("logprobs")) for t in r["model_turns"]]
        temp = 1.0 if algo == "sft" else float(r.get("temperature", 1.0))  # SFT whatever it says, none recorded: T = 1
        episodes.append(dict(turns=turns, reward=float(r.get("reward", 0.0)), group=r.get("group_id"), temp=temp,
                             line=ln, policy=r.get("policy"), sampler=r.get("sampler")))
    return episodes


def build_sequences(episodes, merge=True):
    """Each model turn -> one sequence ids = prompt + completion with mask 1 on the completion.
    If a turn's prompt starts with the previous sequence (full history), that sequence is extended
    instead: the earlier completion keeps the same prefix, hence the same log-probs and loss."""
    seqs = []
    for e_idx, ep in enumerate(episodes):
        cur = None
        for prompt, comp, lp in ep["turns"]:
            lp = lp if lp is not None else [float("nan")] * len(comp)
            if merge and cur is not None and prompt[:len(cur.ids)] == cur.ids:
                cur.mask += [0] * (len(prompt) - len(cur.ids)) + [1] * len(comp)
                cur.ids = prompt + comp
                cur.stored_logp += lp
                continue
            if cur is not None and sum(cur.mask):
                seqs.append(cur)
            cur = Sequence(ids=prompt + comp, mask=[0] * len(prompt) + [1] * len(comp), ep=e_idx, temp=ep["temp"],
                           stored_logp=list(lp))
        if cur is not None and sum(cur.mask):
            seqs.append(cur)
    for s in seqs:
        s.n = sum(s.mask)
        s.stored_logp = torch.tensor(s.stored_logp, dtype=torch.float32)
    return seqs


def has_signal(u, s):
    """The sequence can move the weights: A != 0 somewhere (GRPO without KL/entropy: A = 0 on every token gives
    min(rho A, clip(rho) A) = 0, no gradient); every sequence otherwise (SFT, PPO's value loss, KL, entropy)."""
    only_pg_term = u.args.algo == "grpo" and not u.args.kl_coef and not u.args.ent_coef
    return not only_pg_term or bool(s.adv.any())


def trains(u, s):
    """The sequence runs (pi_old, forward, backward): those with signal. N_B still counts the others."""
    return has_signal(u, s)


def uses_kl(args):
    """The KL term is on: RL with --kl-coef > 0 (then a reference policy is loaded, or is the policy itself)."""
    return args.algo != "sft" and args.kl_coef > 0


def grpo_advantages(rewards, group_ids, use_std=True, eps=ADV_EPS):
    """GRPO, per episode i of group g (its group_id: one task under one harness, sampled G times); population std.
    -> (advantages, share of groups whose rewards are all equal)"""
    r = np.asarray(rewards, dtype=np.float64)
    adv, zero_var = np.zeros_like(r), 0
    for g in dict.fromkeys(group_ids):
        idx = np.array([i for i, gi in enumerate(group_ids) if gi == g])
        centred = r[idx] - r[idx].mean()
        # A_i = (r_i - mean_g r) / (std_g r + eps)   (use_std=False: A_i = r_i - mean_g r)
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
    """Sets s.adv, s.ret: GAE over each episode's generated tokens, turn after turn, with the terminal reward on its
    last token; then whitened over the batch unless whiten=False."""
    by_ep = {}
    for s in seqs:
        by_ep.setdefault(s.ep, []).append(s)
    for e_idx, ep_seqs in by_ep.items():
        values = torch.cat([s.old_v for s in ep_seqs])  # [T_ep]
        r = torch.zeros_like(values)  # [T_ep] r_t = 0, but the episode's reward on its last token
        r[-1] = rewards[e_idx]
        a, ret = gae(r, values, gamma, lam)
        sizes = [s.n for s in ep_seqs]
        for s, a_s, r_s in zip(ep_seqs, a.split(sizes), ret.split(sizes)):
            s.adv, s.ret = a_s, r_s
    all_a = torch.cat([s.adv for s in seqs])  # [N]
    if whiten and len(all_a) > 1:
        for s in seqs:  # A <- (A - mean_B A) / (std_B A + 1e-8) over every token of the batch
            s.adv = (s.adv - all_a.mean()) / (all_a.std() + 1e-8)


# ------------------------------------------------------------------------------- log-probs of a batch
# log pi_theta(y_t | s_t) of the generated tokens y_t, at the episode's sampling temperature: the trunk over the whole
# sequence, the LM head only where the next token is a generated one, in chunks of completion tokens.
def token_batch(seqs, pad_id, device, fields=()):
    """Right-padded input ids [B, L] of sequences (05's Sequence: ids, mask M_t, n = sum(mask), temp). `sel` marks
    the positions whose *next* token is a generated one: the logits there predict y_t, so sel is the mask M_t
    shifted by one. tgt: those tokens y_t [N], row-major; temp: each one's sampling temperature [N]; and each of
    `fields` the sequences carry per generated token ([n] each, e.g. 05's old_logp, adv) as one [N] tensor."""
    L = max(len(s.ids) for s in seqs)
    inp = torch.full((len(seqs), L), pad_id, dtype=torch.long)  # [B, L]
    sel = torch.zeros((len(seqs), L), dtype=torch.bool)  # [B, L]
    for b, s in enumerate(seqs):
        inp[b, :len(s.ids)] = torch.tensor(s.ids)
        sel[b, :len(s.ids) - 1] = torch.tensor(s.mask[1:], dtype=torch.bool)
    tgt = inp[:, 1:][sel[:, :-1]]  # [N] the generated tokens y_t, row-major order
    temp = torch.cat([torch.full((s.n,), s.temp) for s in seqs])  # [N]
    return dict(inp=inp.to(device), sel=sel.to(device), tgt=tgt.to(device), temp=temp.to(device),
                tokens=sum(len(s.ids) for s in seqs), **token_fields(seqs, device, fields))


def token_fields(seqs, device, fields):
    """{field: [N]} for each of `fields` the sequences carry per generated token ([n] each), in the order of y_t."""
    return {k: torch.cat([getattr(s, k) for s in seqs]).to(device) for k in fields if getattr(seqs[0], k) is not None}


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


def head_logp(model, h, tgt, temp, entropy):
    """One chunk of hidden states [c, H] -> (log pi(y_t | s_t) [c] at temperature, and with entropy its entropy)."""
    logp_all = torch.log_softmax(lm_head(model, h) / temp[:, None], dim=-1)  # [c, V] fp32, at the temperature
    logp = logp_all.gather(1, tgt[:, None]).squeeze(1)  # [c]
    # H(pi(.|s_t)) = -sum_v p_v log p_v
    return (logp, -(logp_all.exp() * logp_all).sum(-1)) if entropy else (logp,)  # [c], [c]


def trunk_and_head(model, batch, amp, entropy=False, chunk=LOGIT_CHUNK):
    """Hidden states [N, H] of the positions that predict generated tokens, their log-probs [N] at temperature and
    entropies [N] (entropy=True, for --ent-coef; else None). The LM head runs on those positions only (prompts are
    most tokens), `chunk` tokens at a time: with gradients and several chunks each is checkpointed (its fp32
    [chunk, V] tensors recomputed in backward), so peak memory is one chunk's, whatever the micro-batch. Row-wise
    the same arithmetic as one [N, V] pass (tested to 1e-6). amp: bf16 autocast of the trunk (the head stays fp32)."""
    with torch.autocast(batch["inp"].device.type, dtype=torch.bfloat16, enabled=amp):
        # right padding + causal attention: real tokens never attend to the pads, so no attention mask
        h = model.base_model(input_ids=batch["inp"]).last_hidden_state  # [B, L, H]
    h = h[batch["sel"]]  # [N, H]
    n = h.shape[0]
    chunk = chunk if chunk and chunk > 0 else max(1, n)
    ckpt = torch.is_grad_enabled() and n > chunk
    parts = []
    for a in range(0, n, chunk):
        args = (model, h[a:a + chunk], batch["tgt"][a:a + chunk], batch["temp"][a:a + chunk], entropy)
        parts.append(torch.utils.checkpoint.checkpoint(head_logp, *args, use_reentrant=False) if ckpt
                     else head_logp(*args))
    ent = torch.cat([p[1] for p in parts]) if entropy else None  # [N]
    return h, torch.cat([p[0] for p in parts]), ent  # [N, H], [N], [N]


def forward(model, vhead, batch, amp, entropy=False, chunk=LOGIT_CHUNK):
    """Log-probs (at temperature), entropies (or None) and values of the generated tokens only."""
    # torchrun --fsdp: model.trunk_and_head is the function above, run through the root unit's hooks
    # (common/distributed.py)
    run = getattr(model, "trunk_and_head", None) or functools.partial(trunk_and_head, model)
    h, logp, ent = run(batch, amp, entropy, chunk)
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
        w = max(width, len(s.ids))
        if cur and w * (len(cur) + 1) > tokens:
            out.append(cur)
            cur, w = [], len(s.ids)
        cur.append(s)
        width = w
    return out + [cur] if cur else out


def sequence_logprobs(u, seqs, desc="log-probs"):
    """Per sequence, the log-probs [n] of its generated tokens under u.model's current weights, at the sequence's
    temperature, and with a value head their values [n] (else None), without gradients (pi_old, pi_ref).
    -> (log-probs, values): two lists in the order of `seqs`. Sequences run sorted by length (padding ~1% of the
    tokens; in file order 19-25%), in this update's micro-batches. torchrun: each rank scores its share, padded to the
    busiest rank's count under --fsdp, then every rank receives every score."""
    model, vhead = u.model, u.vhead
    model.eval()
    by_length = sorted(seqs, key=lambda s: len(s.ids))

    def run(part):
        return forward(model, vhead, token_batch(part, u.pad_id, u.device), u.amp, chunk=u.chunk)

    def score(mine):  # {id(sequence): (log-probs, values)} of the sequences this process scores (torchrun: its share)
        scores, parts = {}, micro_batches(mine, u.args.micro_batch_size, u.args.micro_batch_tokens)
        total = len(parts)
        quiet = total <= 4 or not rank0()
        if dist:  # --fsdp: as many forwards as the busiest rank
            parts = dist.padded(parts, lambda: run(by_length[:1]))
        for part in tqdm(parts, desc=desc, total=total, leave=False, disable=quiet):
            logp, _, v = run(part)
            sizes = [s.n for s in part]
            for s, lp, vv in zip(part, logp.split(sizes), v.split(sizes) if v is not None else [None] * len(part)):
                scores[id(s)] = (lp.float().cpu(), vv.float().cpu() if vv is not None else None)
        return scores
    with torch.no_grad():
        scores = dist.scored(by_length, score, (model, vhead)) if dist else score(by_length)
    model.train()
    return [scores[id(s)][0] for s in seqs], [scores[id(s)][1] for s in seqs]


def check_head(model, ids, where):
    """Refuse a model whose forward computes other logits than base_model + lm_head() below (an
    unknown logit scaling would silently change every log-prob and ratio)."""
    model.eval()
    with torch.no_grad():
        ids = torch.tensor([ids[:128]], device=model.device)  # [1, L]
        ref = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)  # [L, V]
        mine = torch.log_softmax(lm_head(model, model.base_model(input_ids=ids).last_hidden_state[0]), -1)  # [L, V]
    model.train()
    err = (ref - mine).abs().max().item()
    if not err < 1e-3:
        fail(f"{where}: {model.config.model_type}'s forward applies a logit transformation that 05 does not (max "
             f"log-prob difference {err:.2g}; known: Gemma-2 soft-capping, Cohere logit_scale, Granite logits_scaling)")


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
#               R_t: GAE's returns, c = VF_CLIP                       only with a value head (PPO), c_v = VF_COEF
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
    # the other terms are 0 when they are off
    kl = 0.0
    v_loss = 0.0
    entropy = 0.0
    if args.algo != "sft" and args.kl_coef:  # KL term (k3)
        d = b["ref_logp"] - logp  # [N]
        kl = (torch.exp(d) - d - 1).sum() / n_b
    if v is not None:  # value term (clipped, as PPO's policy term)
        v_clip = b["old_v"] + (v - b["old_v"]).clamp(-VF_CLIP, VF_CLIP)  # [N]
        v_loss = 0.5 * torch.max((v - b["ret"]) ** 2, (v_clip - b["ret"]) ** 2).sum() / n_b
    if ent is not None:  # entropy term (H computed only with --ent-coef)
        entropy = ent.sum() / n_b
    loss = pg_loss + args.kl_coef * kl + VF_COEF * v_loss - args.ent_coef * entropy
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


# ------------------------------------------------------------------------------------------ pi_old
def old_policy_scores(u, episodes, trained, ref, info):
    """pi_old of every trained sequence, before the first step: its log-probs under the rollout's weights (this
    policy) at its episode's temperature, one forward without gradients; with them PPO's old values, the truncated-IS
    weights and pi_ref (KL). The rollout's own log-probs are not pi_old (docs/engineering.md: not bit-equal even on the
    hf fp32 path, and vLLM's differ by ~1e-2); they only weigh truncated IS."""
    info["tis_cap"] = u.tis_cap
    old_logp, old_v = sequence_logprobs(u, trained, "old log-probs")
    for s, lp, v in zip(trained, old_logp, old_v):
        s.old_logp, s.old_v = lp, v
        if u.tis_cap:  # truncated IS: w_t = min(pi_old(y_t | s_t) / pi_rollout(y_t | s_t), C)
            s.tis_w = off_policy.tis_weights(lp, s.stored_logp, u.tis_cap)
    if u.tis_cap:
        print(f"[05] truncated IS on: w_t = min(pi_old / pi_rollout, {u.tis_cap}) "
              f"({'--tis-cap' if u.args.tis_cap else 'default: sampled by ' + off_policy.sampler_of(episodes)})")
    if u.same_ref:  # a KL to the loaded policy itself: pi_ref = pi_old
        for s in trained:
            s.ref_logp = s.old_logp.clone()
    elif uses_kl(u.args):
        ref_model = placed(load_reference(ref), None, u.device)[0]
        ref_u = dataclasses.replace(u, model=ref_model, vhead=None)
        for s, lp in zip(trained, sequence_logprobs(ref_u, trained, "ref log-probs")[0]):
            s.ref_logp = lp
        del ref_model, ref_u


def warn(msg):
    if rank0():  # torchrun: one voice
        print(f"[05] warning: {msg}", file=sys.stderr)


# ------------------------------------------------------------------------------- one minibatch's gradient
LOG_TERMS = ("loss", "pg_loss", "value_loss", "kl", "clip_frac", "approx_kl", "entropy")  # summed over micro-batches
INFO_LOGGED = ("zero_var_group_share", "logprob_mismatch", "trained_sequences", "tis_cap")  # batch facts in every row


def accumulate(u, minibatch):
    """Forward/backward one minibatch in micro-batches; gradients add up to d(loss)/d(theta) of the
    whole minibatch because every micro-batch divides by the minibatch's N_B, not its own. -> its log row."""
    mine = minibatch
    if dist:  # torchrun: this rank's share, balanced by the tokens that will run (skipped sequences cost 0)
        mine = dist.share(minibatch, cost=lambda s: len(s.ids) if trains(u, s) else 0)
    # N_B: generated tokens of the whole minibatch, those skipped included
    n_b = sum(s.n for s in mine)
    if dist:  # the sum of the ranks' counts, and each rank's (logged)
        n_b, rank_tokens = dist.token_count(n_b)
    run = sorted((s for s in mine if trains(u, s)), key=lambda s: len(s.ids))  # less padding; the sum is the same
    micro = micro_batches(run, u.args.micro_batch_size, u.args.micro_batch_tokens)
    # the tokens run (clip_frac, approx_kl, entropy average over them) and the sequences with signal (0: no optimizer
    # step), over the whole minibatch
    n_act, n_signal = sum(s.n for s in run), sum(has_signal(u, s) for s in mine)
    if dist:  # the ranks decide together, else they would drift apart
        n_act, n_signal = dist.all_sum([n_act, n_signal])
    n_act = max(1, n_act)
    m = dict.fromkeys(LOG_TERMS, 0.0) | dict(tokens=n_b, seq_tokens=0, signal_sequences=int(n_signal))
    if dist:  # --fsdp: every rank runs as many micro-batches as the busiest, zero-weight ones after its own
        def filler():  # a forward of the minibatch's shortest trained sequence (called only when padding is due)
            shortest = min((s for s in minibatch if trains(u, s)), key=lambda s: len(s.ids))
            return forward(u.model, u.vhead, token_batch([shortest], u.pad_id, u.device), u.amp)
        micro = dist.padded(micro, filler)
    for mb in micro:
        micro_step(u, mb, n_b, n_act, m)
    if dist:  # each term summed over the ranks
        m = dist.summed_log(m, rank_tokens, u.tis_cap)
    if not u.args.ent_coef:
        m["entropy"] = None
    return m


def micro_step(u, mb, n_b, n_act, m):
    """Forward and backward of one micro-batch `mb` (its gradients add to .grad); its share of each logged term
    added to the minibatch's row m."""
    b = token_batch(mb, u.pad_id, u.device, TOKEN_FIELDS)
    logp, ent, v = forward(u.model, u.vhead, b, u.amp, entropy=u.args.ent_coef > 0, chunk=u.chunk)
    loss, pg_loss, kl, v_loss, ratio = objective(logp, ent, v, b, u.args, n_b)
    loss.backward()
    with torch.no_grad():
        log_ratio = torch.log(ratio)  # log rho_t
        if "tis_w" in b:
            m["tis_weight"] = m.get("tis_weight", 0.0) + b["tis_w"].sum().item() / n_act
        m["loss"] += loss.item()
        m["pg_loss"] += pg_loss.item()
        m["kl"] += float(kl)
        m["value_loss"] += float(v_loss)
        m["clip_frac"] += ((ratio - 1).abs() > u.args.clip_eps).sum().item() / n_act
        m["approx_kl"] += ((ratio - 1) - log_ratio).sum().item() / n_act  # k3 of KL(old || new)
        if ent is not None:  # only with --ent-coef (the [N, V] work it takes is not spent for the log alone)
            m["entropy"] += ent.sum().item() / n_act
        m["seq_tokens"] += b["tokens"]


def optimizer_step(u, opt, m):
    """theta <- AdamW(theta, clip(g)) with the minibatch's accumulated gradient g, clipped per parameter group to
    --max-grad-norm; then the gradients are cleared. No signal, no step: with zero gradients AdamW would still move
    every weight by its momentum (lr * m_hat / (sqrt(v_hat) + eps), about lr per parameter) and decay it; the state
    stays untouched too. -> each parameter group's gradient norm before clipping (0 without a step)"""
    m["optimizer_step"] = m["signal_sequences"] > 0
    norms = [0.0] * len(opt.param_groups)
    if m["optimizer_step"]:
        if dist:  # sum the ranks' gradients first, so that the clipping below sees the norm of the full gradient
            dist.reduce_gradients([p for g in opt.param_groups for p in g["params"]])
        norms = [float(torch.nn.utils.clip_grad_norm_(g["params"], u.args.max_grad_norm)) for g in opt.param_groups]
        opt.step()
    opt.zero_grad(set_to_none=True)
    return norms


def update(u, opt, epochs, trained, info, warnings):
    """Epochs x minibatches, each minibatch one AdamW step on the gradient accumulated over its micro-batches.
    -> the log, one row per minibatch"""
    log, total = [], sum(len(e) for e in epochs)
    bar = tqdm(total=total, desc=f"05 {u.args.algo}", disable=total < 5 or not rank0())
    for epoch, minibatches in enumerate(epochs):
        for minibatch in minibatches:
            ts = time.time()
            m = accumulate(u, minibatch)
            norms = optimizer_step(u, opt, m)
            dt = time.time() - ts
            m.update(step=len(log), epoch=epoch, grad_norm=math.hypot(*norms), pg_grad_norm=norms[0],
                     reward_mean=info["reward_mean"], tokens_per_s=m["seq_tokens"] / dt, step_s=dt)
            m.update({k: info[k] for k in INFO_LOGGED if k in info})
            if u.args.algo == "ppo":
                m["vf_grad_norm"] = norms[1]
            else:
                m.pop("value_loss")
            log.append(m)
            bar.update()
            bar.set_postfix(loss=f"{m['loss']:.4f}")
    bar.close()
    return log


# ---------------------------------------------------------------------------------- input checking
# Bad input stops with one line on stderr naming the file, line and field (or the flag), exit 2, nothing written:
# the flags and every rollout record (common/schemas.py) before any weight is loaded; then two guards: check_head
# once the model is loaded (common/generation.py), check_finite before anything is saved.
def check_flags(args):
    """The flags' values, before anything is read."""
    for k in ("epochs", "micro_batch_size", "minibatches", "minibatch_size", "micro_batch_tokens"):
        if getattr(args, k) is not None and getattr(args, k) < 1:
            fail(f"--{k.replace('_', '-')} must be >= 1")
    if not (math.isfinite(args.lr) and args.lr > 0):
        fail(f"--lr {args.lr}: must be a finite number > 0")
    if not 0 < args.clip_eps < 1:
        fail(f"--clip-eps {args.clip_eps}: must be in (0, 1)")
    for flag, x in (("--kl-coef", args.kl_coef), ("--ent-coef", args.ent_coef), ("--tis-cap", args.tis_cap or 0)):
        if not (math.isfinite(x) and x >= 0):  # a term's weight, a cap: 0 = off; name only the flag that is wrong
            fail(f"{flag} {x}: must be a finite number >= 0")
    if args.algo == "sft" and args.tis_cap is not None:
        fail("--tis-cap is for --algo grpo/ppo only")
    if args.algo != "sft" and args.min_reward is not None:
        fail("--min-reward is for --algo sft only (it would bias an RL update)")
    if args.fsdp and dist is None:  # FSDP2 shards over torchrun's process group
        fail("--fsdp shards the model over torchrun's processes: run 05 under torchrun --nproc_per_node N, "
             "or drop --fsdp")


def resolve_paths(args):
    run, t = Path(args.run), args.iteration
    if t is None and not (args.policy and args.rollouts and args.out):
        fail("give --iteration t (with --run DIR) or all of --policy, --rollouts and --out")
    if t is not None and t < 0:
        fail(f"--iteration must be >= 0, got {t}")
    policy = Path(args.policy) if args.policy else iteration_policy(run, t)
    rollouts = Path(args.rollouts) if args.rollouts else run / f"iter_{t:03d}" / "rollouts.jsonl"
    out = Path(args.out) if args.out else run / f"iter_{t:03d}" / "policy"
    if args.ref_policy:
        ref, why = Path(args.ref_policy), "--ref-policy"
    elif t is not None and (run / "init_policy").exists():
        ref, why = run / "init_policy", "the run's initial policy"
    else:
        ref, why = policy, "the loaded policy itself: no --ref-policy and no --iteration"
    return policy, rollouts, out, ref, why


def check_inputs(args):
    """The paths, the policy (and reference) folders and every rollout record; the off-policy warning.
    -> (policy, rollouts, out, ref, episodes, warnings)"""
    from transformers import AutoConfig
    policy, rollouts, out, ref, ref_why = resolve_paths(args)
    check_policy_folder(policy)
    if not rollouts.is_file():
        fail(f"rollouts file {rollouts} not found")
    vocab = AutoConfig.from_pretrained(policy).vocab_size
    episodes = load_episodes(rollouts, args.algo, vocab, args.min_reward)
    if uses_kl(args):
        check_policy_folder(ref, "reference policy")
        print(f"[05] KL reference policy: {ref} ({ref_why})")
    # an episode sampled by another policy (or by the oracle) makes the RL update off-policy: say so
    others = []
    for e in episodes:
        sampler = e["policy"]
        if sampler is None:
            continue
        if sampler == "oracle" or Path(str(sampler)).resolve() != policy.resolve():
            others.append(str(sampler))
    warnings = []
    if args.algo != "sft" and others:
        warnings.append(f"{len(others)} of {len(episodes)} episodes of {rollouts} were sampled by "
                        f"{sorted(set(others))[:3]}, not by the loaded policy {policy}: the update is off-policy")
    return policy, rollouts, out, ref, episodes, warnings


def check_finite(model, vhead, log):
    """The last guard: refuse to write a policy whose loss or weights went non-finite (exit 2, nothing written)."""
    named = list(model.named_parameters()) + (list(vhead.named_parameters()) if vhead is not None else [])
    if dist:  # --fsdp: each rank checks its own shards, and all of them stop or none
        bad = dist.first_non_finite(named)
    else:
        bad = next((n for n, p in named if not torch.isfinite(p).all()), None)
    loss = next((r["loss"] for r in log if not math.isfinite(r["loss"])), None)
    if bad or loss is not None:
        fail(f"the update made {f'weight {bad}' if bad else 'the loss'} non-finite (loss {loss}); nothing written "
             "(check the rollouts, or lower --lr)")


# -------------------------------------------------------------------------- the stage's steps, in order
def prepare_batch(u, episodes, seqs, ref, shuffle_gen, warnings):
    """Before any step: the advantages (GRPO: per episode; PPO: GAE per token, after the old values), the sequences
    that train, the minibatches and, for RL, pi_old (+ TIS weights, ref log-probs).
    -> (epochs: [[minibatch: [sequence]]], trained sequences, info)"""
    rewards = [e["reward"] for e in episodes]
    info = dict(episodes=len(episodes), sequences=len(seqs), turns=sum(len(e["turns"]) for e in episodes),
                gen_tokens=sum(s.n for s in seqs), reward_mean=float(np.mean(rewards)))
    if u.args.algo == "grpo":
        adv, info["zero_var_group_share"] = grpo_advantages(rewards, [e["group"] for e in episodes])
        for s in seqs:  # every generated token of an episode shares its advantage
            s.adv = torch.full((s.n,), float(adv[s.ep]))
    trained = [s for s in seqs if trains(u, s)]  # GRPO: equal-reward groups have A = 0 and do not run
    info["trained_sequences"] = len(trained)
    # the minibatches of `size` sequences (--minibatch-size, or n / --minibatches, or SFT 32, RL n / 2): a fresh
    # random order each epoch, drawn from the update's own generator
    a, n = u.args, len(seqs)
    if a.minibatch_size:
        size = a.minibatch_size
    elif a.minibatches:
        size = math.ceil(n / a.minibatches)
    else:
        size = 32 if a.algo == "sft" else math.ceil(n / 2)
    epochs = []  # epochs[e][m]: the sequences of minibatch m of epoch e
    for _ in range(a.epochs):
        order = torch.randperm(n, generator=shuffle_gen).tolist()
        minibatches = []
        for j in range(0, n, size):
            minibatches.append([seqs[k] for k in order[j:j + size]])
        epochs.append(minibatches)
    if u.args.algo != "sft" and trained:
        old_policy_scores(u, episodes, trained, ref, info)
        off_policy.logprob_mismatch(trained, info, warnings)
    if u.args.algo == "ppo":  # GAE needs the old values scored above
        ppo_advantages(seqs, rewards, GAMMA, u.args.lam)
    return epochs, trained, info


def make_optimizer(args, model, vhead, policy, info):
    """AdamW; the value head has its own parameter group (learning rate) and gradient clipping. Its moments are
    carried over from the policy folder's optimizer.pt where that fits. -> (opt, the parameter groups' shapes)"""
    param_groups = [dict(params=list(model.parameters()), lr=args.lr)]
    if vhead is not None:
        param_groups.append(dict(params=list(vhead.parameters()), lr=VF_LR_FACTOR * args.lr))
    opt = torch.optim.AdamW(param_groups, lr=args.lr, weight_decay=args.weight_decay)
    shapes = [[list(p.shape) for p in g["params"]] for g in param_groups]
    if args.no_optimizer_state:
        info["optimizer_state"] = "fresh AdamW state (--no-optimizer-state)"
    else:
        my_shards = dist.my_shards if dist else None
        info["optimizer_state"] = load_optimizer(opt, policy / "optimizer.pt", args.algo, shapes, my_shards)
    print(f"[05] optimizer: {info['optimizer_state']}")
    return opt, shapes


def save(args, model, vhead, tok, opt, shapes, log, config):
    """The checkpoint (generation.save_checkpoint), train_log.jsonl and the config beside it, <out> itself last: its
    presence means the stage finished. -> False on torchrun's ranks > 0, which write nothing."""
    # {model: None (its own state dict), vhead, opt}
    full = dict(model=None, vhead=vhead.state_dict() if vhead is not None else None,
                opt=opt.state_dict() if not args.no_optimizer_state else None)
    if dist:  # --fsdp: the full ones, gathered on rank 0
        full = dist.full_state(model, vhead, opt, not args.no_optimizer_state)
    if rank0():  # torchrun: rank 0 alone writes; the others wait for it in dist.finish
        save_checkpoint(config["out"], model, tok, full, args.algo, shapes, beside={
            "train_log.jsonl": jsonl_text(log), "05_train_config.json": json.dumps(config, indent=2, default=str)})
    if dist:
        dist.finish()
    return rank0()


# -------------------------------------------------------------------------------------------- main
def main(argv=None):
    args = parse_args(argv)
    out = args.out or (Path(args.run) / f"iter_{args.iteration:03d}" / "policy" if args.iteration is not None else None)
    # <out>.lock: one writer per output (under torchrun only rank 0 writes, so only it holds the lock)
    with locked(Path(str(out) + ".lock")) if out and rank0() else contextlib.nullcontext():
        return run_stage(args)


def run_stage(args):
    """The stage in its steps. -> the summary (None on torchrun's ranks > 0)"""
    # ---- flags and inputs: the flags, the paths, every rollout record
    check_flags(args)
    if dist:  # torchrun: join the process group
        dist.init(args.fsdp)
    policy, rollouts, out, ref, episodes, warnings = check_inputs(args)
    # ---- seeding: python, numpy, torch (CPU + CUDA); the minibatch order has its own generator. CPU, fp32: the same
    # bits run after run, with 1 or 2 threads; AVX2 vs AVX512 kernels round otherwise
    # (experiments/bench/warmstart_repro.py)
    seed_everything(args.seed)
    shuffle_gen = torch.Generator().manual_seed(args.seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    amp = bf16_autocast(args.amp, device)  # of the trunk (the LM head stays fp32); GPU: gradient checkpointing too
    # ---- load the policy (+ PPO's value head), refused where its logits are not 05's; the sequences
    probe = next(p + c for e in episodes for p, c, _ in e["turns"] if c)
    tok, model, vhead, pad_id = load_for_training(policy, device, args.algo == "ppo")
    check_head(model, probe, policy)  # refused where its logits are not those 05 computes
    model, vhead = placed(model, vhead, device)
    seqs = build_sequences(episodes)
    u = Context(args, model, vhead, pad_id, device, amp, tis_cap=off_policy.tis_cap_for(args, episodes),
                same_ref=uses_kl(args) and ref.resolve() == policy.resolve(), chunk=LOGIT_CHUNK)
    # ---- advantages, minibatches, pi_old
    t0 = time.time()
    epochs, trained, info = prepare_batch(u, episodes, seqs, ref, shuffle_gen, warnings)
    prep_s = time.time() - t0
    for w in warnings:
        warn(w)
    # ---- the update loop
    opt, shapes = make_optimizer(args, model, vhead, policy, info)
    t_update = time.time()
    log = update(u, opt, epochs, trained, info, warnings)
    update_s = time.time() - t_update
    info["optimizer_steps"] = sum(r["optimizer_step"] for r in log)
    if not info["optimizer_steps"]:
        print("[05] no optimizer step: no minibatch had a sequence with signal (every GRPO group reward-equal); "
              "the policy is written unchanged")
    check_finite(model, vhead, log)  # input checking's last guard: a non-finite policy is never written
    # ---- save
    summary = dict(info, steps=len(log), prep_s=prep_s, update_s=update_s, device=device, bf16_autocast=amp,
                   first_loss=log[0]["loss"], last_loss=log[-1]["loss"], warnings=warnings)
    config = dict(args=vars(args), policy=str(policy), rollouts=str(rollouts), out=str(out),
                  ref_policy=str(ref) if uses_kl(args) else None, seed=args.seed, torch=torch.__version__,
                  threads=torch.get_num_threads(), cpu_kernels=torch.backends.cpu.get_cpu_capability(), **summary)
    if not save(args, model, vhead, tok, opt, shapes, log, config):
        return None
    print(f"[05] {args.algo}: {info['episodes']} episodes, {info['sequences']} sequences "
          f"({info['turns']} turns), {info['gen_tokens']} generated tokens, reward mean {info['reward_mean']:.3f}")
    extra = {k: info[k] for k in INFO_LOGGED if k in info}
    print(f"[05] {info['optimizer_steps']} optimizer steps of {len(log)} minibatches in {update_s:.1f} s "
          f"(+{prep_s:.1f} s old log-probs), loss {log[0]['loss']:.4f} -> {log[-1]['loss']:.4f} {extra} "
          f"seed {args.seed} -> {out}")
    return summary


if __name__ == "__main__":
    main()
    if dist:  # torchrun: the checkpoint is written and every rank has left the process group. End here: the
        sys.stdout.flush()  # interpreter's teardown of gloo's C++ threads can abort a rank after the work is done
        sys.stderr.flush()  # ("terminate called without an active exception")
        os._exit(0)
