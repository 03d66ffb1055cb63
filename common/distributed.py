"""Stage 05's update over N processes: torchrun, gloo on CPU, NCCL on GPUs; with --fsdp the model sharded (FSDP2).

05_train.py imports this module only when torchrun started it (LOCAL_RANK is set; any WORLD_SIZE) and calls it at
each `if dist:` of its update; run as `python 05_train.py` it never imports it. docs/engineering.md.

Every rank loads the same rollouts, builds the same sequences and draws the same minibatch order (same seed); each
minibatch is then split over the ranks by tokens. Three things make N ranks give the one-process update: N_B (and
every batch-level count of the log) is summed over ranks BEFORE the loss, gradients are SUMMED over ranks (not
averaged), and the clipping norm is taken after that sum (the global norm).

--fsdp: FSDP2 keeps 1/W of every weight, gradient and AdamW moment on each rank and gathers a unit's full weights
around its forward and backward (a model whose full copy does not fit one GPU). The N_B arithmetic does not change;
four things do:
- every forward and backward is a collective, so every rank runs the same number of them: a rank with fewer
  micro-batches (or none) runs zero-weight ones (padded);
- FSDP2 reduces each gradient to its MEAN over ranks; 05 needs the SUM (sum_gradients);
- 05 runs model.base_model and the LM head directly, not model.forward: both run inside trunk_and_head (05_train.py),
  registered as a forward method of the root unit, which owns the embeddings, the final norm and the tied LM head;
- the checkpoint and optimizer.pt are gathered to rank 0 and written in the one-process format (full_state).
"""
import os
import sys
import types

import torch
import torch.distributed as tdist

rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
fsdp = False  # --fsdp


def init(fsdp_on):
    """torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR. Only rank 0 prints to stdout (errors and tqdm go
    to stderr)."""
    global rank, world, fsdp
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))  # "cuda" below = this rank's GPU
    tdist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world, fsdp = tdist.get_rank(), tdist.get_world_size(), fsdp_on
    if rank > 0:
        sys.stdout = open(os.devnull, "w")


def all_sum(x):
    """sum over ranks of a number or a list of numbers (float64, exact for token counts)."""
    t = torch.tensor(x, dtype=torch.float64, device="cuda" if torch.cuda.is_available() else "cpu")
    tdist.all_reduce(t)  # SUM
    return t.tolist()


def shard_by_tokens(seqs, rank, world, cost=lambda s: len(s.ids)):
    """Rank `rank`'s share of a list of sequences: costliest first onto the least-loaded rank (cost: tokens run by
    the forward), ties by position, so every rank computes the same split without talking to the others."""
    load, owner = [0] * world, [0] * len(seqs)
    for i in sorted(range(len(seqs)), key=lambda i: (-cost(seqs[i]), i)):
        owner[i] = min(range(world), key=lambda r: (load[r], r))
        load[owner[i]] += cost(seqs[i])
    return [s for s, r in zip(seqs, owner) if r == rank]


def share(seqs, cost):
    """This rank's share of a minibatch, balanced by the tokens that will run (cost)."""
    return shard_by_tokens(seqs, rank, world, cost)


def token_count(n):
    """-> (N_B, each rank's count): N_B = the sum of the ranks' generated tokens, taken before any loss."""
    rank_tokens = all_sum([n * (r == rank) for r in range(world)])
    return sum(rank_tokens), rank_tokens


def summed_log(m, rank_tokens, tis):
    """A minibatch's log row: every term is over the global N_B / tokens run, so the ranks' sum is the minibatch's.
    `tokens` and `signal_sequences` are global already."""
    if tis:
        m.setdefault("tis_weight", 0.0)  # the same keys on every rank, even one that ran nothing
    names = [k for k in m if k not in ("tokens", "signal_sequences")]
    m.update(zip(names, all_sum([m[k] for k in names])), tokens=int(m["tokens"]),
             rank_tokens=list(map(int, rank_tokens)))
    m["seq_tokens"] = int(m["seq_tokens"])
    return m


def scored(seqs, score, modules):
    """score(share) -> {id(sequence): scores} on each rank's share; then every rank receives every rank's scores (a
    few floats per token). --fsdp: a root unit keeps its weights gathered after forward, until the backward that
    follows; none follows here: shard them again (the optimizer must see, and update, the sharded parameters)."""
    mine = shard_by_tokens(seqs, rank, world)
    scores = score(mine)
    theirs = [None] * world
    tdist.all_gather_object(theirs, [scores[id(s)] for s in mine])
    for r, sc in enumerate(theirs):
        scores.update((id(s), x) for s, x in zip(shard_by_tokens(seqs, r, world), sc))
    for m in modules if fsdp else ():
        if m is not None:
            m.reshard()
    return scores


def padded(parts, forward_one):
    """Yields this rank's micro-batches; --fsdp: then, until it has run as many as the busiest rank (FSDP2's gathers),
    zero-weight ones: forward_one() (a forward of any sequence) and, under autograd, a backward of 0 x its output
    (gathers, then reduces zero gradients). The count is agreed on before the first forward."""
    extra = int(max(all_sum([len(parts) * (r == rank) for r in range(world)]))) - len(parts) if fsdp else 0
    yield from parts
    for _ in range(extra):
        logp, _, v = forward_one()
        if torch.is_grad_enabled():
            (0.0 * (logp.sum() + (v.sum() if v is not None else 0.0))).backward()


def reduce_gradients(params):
    """g = sum_r g_r (FSDP2 has summed already: sum_gradients). Each rank divided its loss by the GLOBAL N_B, so
        sum_r 1/N_B sum_{t in B_r} l_t = 1/N_B sum_{t in B} l_t,
    the one-process loss, and the sum of the ranks' gradients is the one-process gradient. A plain all-reduce
    rather than DistributedDataParallel: DDP AVERAGES (1/W sum_r g_r, so the loss would need a factor W), needs every
    forward to go through its wrapper (05 calls model.base_model and the LM head directly) and the same number of
    synchronised backwards per rank, while ranks here hold different numbers of micro-batches (or none: a rank
    without a sequence to run sends zeros). What DDP adds is speed (buckets reduced while backward still runs).
    The naive port, each rank's loss over its own N_B_r then DDP's mean, 1/W sum_r 1/N_B_r sum_{t in B_r} l_t,
    weighs a token on a short rank more than one on a long rank (tests/test_05_distributed.py shows the gap)."""
    if fsdp:
        return
    for p in params:
        if p.grad is None:  # a rank that ran no sequence: it still takes part, with zeros
            p.grad = torch.zeros_like(p)
        tdist.all_reduce(p.grad)  # SUM over ranks


def first_non_finite(named_params):
    """The first parameter name holding a non-finite value on any rank (--fsdp: each rank checks its own shards;
    all of them stop, or none), or None."""
    bad = next((n for n, p in named_params if not torch.isfinite(p.to_local() if fsdp else p).all()), None)
    if not fsdp:
        return bad
    names = [None] * world
    tdist.all_gather_object(names, bad)
    return next((n for n in names if n), None)


# ----------------------------------------------------------------------------- --fsdp: shard, gather, load
def placed(model, vhead, device, trunk_and_head):
    """The model (and PPO's value head) ready to train on this rank: on its device; --fsdp: sharded in place, one
    unit per decoder layer (the classes transformers never splits, `_no_split_modules`), then the root unit with
    what is left (embeddings, final norm, the LM head tied to the embeddings); the value head its own root unit.
    trunk_and_head (05's, passed in) becomes a forward method of the root unit (its weights are
    gathered around it)."""
    if not fsdp:
        return model.to(device), vhead
    from torch.distributed.fsdp import fully_shard, register_fsdp_forward_method
    for m in model.modules():
        if type(m).__name__ in (model._no_split_modules or []):
            fully_shard(m)
    fully_shard(model)
    model.trunk_and_head = types.MethodType(trunk_and_head, model)
    register_fsdp_forward_method(model, "trunk_and_head")
    return sum_gradients(model), sum_gradients(fully_shard(vhead)) if vhead is not None else None


def sum_gradients(module):
    """FSDP2 reduce-scatters a gradient as 1/W sum_r g_r. Each rank's loss is already over the GLOBAL N_B, so the
    one-process gradient is the plain sum (reduce_gradients): divide factor 1, done as a SUM reduction (gloo has no
    PREMUL_SUM). The alternative, the loss times W and FSDP2's mean, gives the same W * 1/W."""
    from torch.distributed.fsdp import FSDPModule
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)
    return module


def my_shards(state, opt):
    """AdamW's state loaded from optimizer.pt, which holds full moments (whoever wrote it). --fsdp: each rank keeps
    its shard of each (every rank read the same file: each cuts its own shard, no communication)."""
    if fsdp:
        from torch.distributed.tensor import distribute_tensor
        params = [p for g in opt.param_groups for p in g["params"]]
        for i, st in state["state"].items():
            for k, v in st.items():
                if k != "step":
                    p = params[i]
                    st[k] = distribute_tensor(v.to(p.device), p.device_mesh, p.placements, src_data_rank=None)
    return state


def full_state(model, vhead, opt, with_opt):
    """What rank 0 writes: {model: state dict (None: the model's own), vhead, opt}. Every rank holds the same
    weights and AdamW state; --fsdp: the full ones, gathered to rank 0's CPU (every rank takes part)."""
    if not fsdp:
        return dict(model=None, vhead=vhead.state_dict() if vhead is not None else None,
                    opt=opt.state_dict() if with_opt else None)
    return dict(model=gathered(model.state_dict(keep_vars=True)),
                vhead=gathered(vhead.state_dict(keep_vars=True)) if vhead is not None else None,
                opt=gathered_optimizer_state(opt) if with_opt else None)


@torch.no_grad()
def gathered(tensors):
    """{name: full CPU copy on rank 0, None elsewhere} of a dict of DTensor shards (a collective: every rank calls it
    in the same order). A tensor under two names (the tied LM head) stays one tensor, as save_pretrained expects."""
    from torch.distributed.tensor import DTensor
    out, full = {}, {}
    for k, v in tensors.items():
        if id(v) not in full:
            t = v.full_tensor() if isinstance(v, DTensor) else v
            full[id(v)] = t.detach().cpu() if rank == 0 else None
        out[k] = full[id(v)]
    return out


def gathered_optimizer_state(opt):
    """AdamW's state_dict() with full moments (integer parameter ids, like the one-process optimizer.pt)."""
    sd = opt.state_dict()
    return dict(sd, state={i: gathered(st) for i, st in sorted(sd["state"].items())})


def finish():
    """The last step on every rank: wait until rank 0 has written the checkpoint (a barrier), then leave the process
    group together (torch's documented shutdown: every rank calls destroy_process_group near the end)."""
    tdist.barrier()
    tdist.destroy_process_group()
