"""Stage 05 with a variant patched in, for tests and benchmarks that need 05 to do one step another way. A test that
runs 05 in its own process patches the same function with pytest's monkeypatch; one that runs 05 as a process
(torchrun too) runs this file:

    python tests/variants05.py no-merge-turns -- --run runs/toy --iteration 0 --algo grpo
    torchrun --standalone --nproc_per_node 2 -- tests/variants05.py naive-local-nb -- --policy P --rollouts R --out O
"""
import functools
import sys
from pathlib import Path

sys.path[:0] = [str(Path(__file__).parent), str(Path(__file__).parents[1])]  # conftest; the stages' modules
from conftest import load_stage  # noqa: E402


def no_skip_zero_adv(t05):
    """Also run the GRPO sequences whose advantage is 0 (they add exactly 0 to the gradient)."""
    t05.trains = lambda u, s: True


def no_merge_turns(t05):
    """One sequence per model turn, never merged (experiments/bench/bench_train.py measures what merging saves)."""
    t05.build_sequences = functools.partial(t05.build_sequences, merge=False)


def no_norm_adv(t05):
    """PPO: do not whiten the GAE advantages (tests compute the raw ones by hand)."""
    t05.ppo_advantages = functools.partial(t05.ppo_advantages, whiten=False)


def naive_local_nb(t05):
    """Under torchrun, the biased port: each rank's loss over its own N_B_r, gradients averaged as DDP does."""
    dist = t05.dist
    token_count = dist.token_count

    def local_count(n):
        _, rank_tokens = token_count(n)  # the same collective, but N_B = this rank's own count
        return n, rank_tokens

    def averaged(params):
        for p in params:
            if p.grad is None:
                p.grad = dist.torch.zeros_like(p)
            dist.tdist.all_reduce(p.grad)
            p.grad /= dist.world

    dist.token_count, dist.reduce_gradients = local_count, averaged


VARIANTS = {"no-skip-zero-adv": no_skip_zero_adv, "no-merge-turns": no_merge_turns, "no-norm-adv": no_norm_adv,
            "naive-local-nb": naive_local_nb}


def patch(t05, names):
    for name in filter(None, names.split(",")):
        VARIANTS[name](t05)
    return t05


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[2] != "--" or not set(sys.argv[1].split(",")) <= set(VARIANTS):
        sys.exit(f"usage: variants05.py VARIANT[,VARIANT] -- 05 FLAGS (variants: {', '.join(VARIANTS)})")
    t05 = patch(load_stage("05_train.py"), sys.argv[1])
    t05.main(sys.argv[3:])
    if t05.dist:  # torchrun: end as 05 does, without the interpreter's teardown of gloo's threads
        sys.stdout.flush()
        sys.stderr.flush()
        t05.os._exit(0)
