"""Stage 05's off-policy corrections: the rollouts were sampled by another engine (vLLM in bf16, or any dtype but
05's fp32), whose log-probs differ from pi_old, the log-probs 05 computes of the same weights. 05 calls each function
once: tis_cap_for when it loads the batch, tis_weights as it scores pi_old, logprob_mismatch after.

Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you off-policy RL"):
each token's term of the clipped objective is weighted by

    w_t = min(pi_old(y_t | s_t) / pi_rollout(y_t | s_t), C)          1 where 04 stored no log-prob

(05's policy_loss applies it). docs/engineering.md measures what it changes on the small preset.
"""
import torch

TIS_CAP = 2.0  # C
MISMATCH_WARN = 0.05  # mean |rollout - trainer| log-prob above which 05 warns (bf16 / vLLM: up to ~1e-2)


def sampler_of(episodes):
    """The engines that sampled the rollouts, e.g. 'vllm/bfloat16' (04 stores `sampler` in every record)."""
    names = {f"{e['sampler'].get('backend')}/{e['sampler'].get('dtype')}" if isinstance(e["sampler"], dict)
             else "unknown" for e in episodes}
    return ", ".join(sorted(names))


def tis_cap_for(args, episodes):
    """The truncated-IS cap C, or None (off): --tis-cap (0 = off); by default on where another engine sampled: vLLM
    (bf16 kernels, its own sampler) or any dtype but fp32; off where 05's own fp32 forward did (hf float32) or 04
    did not say. SFT: none (no pi_old)."""
    if args.algo == "sft":
        return None
    if args.tis_cap is not None:
        return args.tis_cap or None
    other = any(isinstance(e["sampler"], dict) and (e["sampler"].get("backend") == "vllm" or
                                                     e["sampler"].get("dtype") not in ("float32", None))
                for e in episodes)
    return TIS_CAP if other else None


def tis_weights(old_logp, stored_logp, cap):
    """w_t [n] of one sequence: min(exp(log pi_old - log pi_rollout), C), 1 where the rollout stored none (NaN)."""
    w = torch.exp(old_logp - stored_logp).clamp(max=cap)  # [n]
    return torch.where(torch.isnan(w), torch.ones_like(w), w)


def logprob_mismatch(trained, info, warnings):
    """Mean |rollout - trainer| log-prob over the tokens that have both (logged; a warning above MISMATCH_WARN, which
    run_stage prints with the others)."""
    stored = torch.cat([s.stored_logp for s in trained])
    recomp = torch.cat([s.old_logp for s in trained])
    have = ~torch.isnan(stored)
    info["logprob_mismatch"] = float((stored[have] - recomp[have]).abs().mean()) if have.any() else None
    if (info["logprob_mismatch"] or 0) > MISMATCH_WARN:
        warnings.append(f"logprob_mismatch {info['logprob_mismatch']:.3g} > {MISMATCH_WARN}: the rollouts were not "
                        "sampled by these weights at the recorded temperature (off-policy; see --tis-cap)")
