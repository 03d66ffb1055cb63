"""A vLLM engine with another checkpoint's weights reloaded in place (what 04 --until does between iterations,
generation.VLLMBackend.reload) against a fresh engine on that checkpoint, in vLLM's bf16 on the CPU, on real
prompts; and a second fresh engine against the first (vLLM-CPU's engine-to-engine noise, the yardstick).

    python experiments/bench/reload_vs_fresh.py --run runs/bench-it/after [--prompts 16] [--out results/reload_vs_fresh.md]

RUN needs init_policy/, iter_000/policy/ and iter_000/rollouts.jsonl (a run of 04 + 05, e.g. the benchmark's,
experiments/bench/bench_iteration_cost.py); any two checkpoints of one model in those places will do. The prompts:
--prompts model turns spread over iter_000's rollouts. Each engine scores every prompt's tokens (teacher-forced
prompt_logprobs, no sampling: the same computation in both) and decodes 48 tokens greedily, all prompts in one
batch, from an empty prefix cache. Reported for vLLM's reload alone and for it with the backend's repack: mean and max
|d log p| over the prompt tokens, greedy continuations equal, and the reload's seconds.
"""
import argparse
import datetime
import json
import sys
import statistics
import time
from pathlib import Path


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--run", required=True, help="run folder with init_policy/ and iter_000/{policy/,rollouts.jsonl}")
    p.add_argument("--prompts", type=int, default=16, help="model turns used as prompts")
    p.add_argument("--out", default=None, help="markdown report (default: print only)")
    return p.parse_args(argv)


def prompts(run, n):
    turns = [t["prompt_ids"] for line in (Path(run) / "iter_000" / "rollouts.jsonl").read_text().splitlines()
             for t in json.loads(line)["model_turns"]]
    return turns[::max(1, len(turns) // n)][:n]


def score(llm, vllm, ps):
    """-> (greedy continuations, each prompt's token log-probs after its first token), from an empty prefix cache"""
    llm.reset_prefix_cache()
    outs = llm.generate([{"prompt_token_ids": p} for p in ps],
                        vllm.SamplingParams(temperature=0.0, max_tokens=48, prompt_logprobs=0), use_tqdm=False)
    return ([list(o.outputs[0].token_ids) for o in outs],
            [[lp[t].logprob for t, lp in zip(p[1:], o.prompt_logprobs[1:])] for p, o in zip(ps, outs)])


def compare(a, b):
    """-> (greedy continuations equal, mean |d log p|, max |d log p|)"""
    d = [abs(x - y) for u, v in zip(a[1], b[1]) for x, y in zip(u, v)]
    return sum(x == y for x, y in zip(a[0], b[0])), statistics.mean(d), max(d)


if __name__ == "__main__":
    args = parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # common/generation.py
    import vllm

    from common import generation as G
    run, ps = Path(args.run), prompts(args.run, args.prompts)
    backend_args = argparse.Namespace(seed=0, temperature=0.0, max_new_tokens=48, max_model_len=4096)
    backend = G.VLLMBackend(run / "init_policy", G.load_tokenizer(run / "init_policy"), backend_args)
    llm, policy = backend.llm, run / "iter_000" / "policy"
    llm.collective_rpc("reload_weights", kwargs={"weights_path": str(policy)})  # vLLM's reload alone
    llm.reset_prefix_cache()
    vllm_only = score(llm, vllm, ps)
    start = time.perf_counter()
    backend.reload(policy)  # the backend's: reload, repack, reset
    reload_s = time.perf_counter() - start
    reloaded = score(llm, vllm, ps)
    del backend, llm
    fresh = G.VLLMBackend(policy, G.load_tokenizer(policy), backend_args)
    ref = score(fresh.llm, vllm, ps)
    del fresh
    other = score(G.VLLMBackend(policy, G.load_tokenizer(policy), backend_args).llm, vllm, ps)
    rows = [("vLLM's reload_weights alone vs fresh", compare(vllm_only, ref)),
            ("VLLMBackend.reload (+ repack) vs fresh", compare(reloaded, ref)),
            ("another fresh engine vs fresh (the yardstick)", compare(other, ref))]
    text = "\n".join([
        "# A reloaded vLLM-CPU engine against a fresh one (bf16)", "",
        f"`python experiments/bench/reload_vs_fresh.py --run {args.run} --prompts {args.prompts}`, "
        f"vLLM {vllm.__version__}, "
        f"{datetime.date.today().isoformat()}, {sum(map(len, ps))} prompt tokens; VLLMBackend.reload took "
        f"{reload_s:.2f} s.", "",
        "| engines | greedy 48 tokens equal | mean abs d log p | max abs d log p |", "| --- | --- | --- | --- |",
        *[f"| {name} | {n} / {len(ps)} | {m:.4f} | {x:.4f} |" for name, (n, m, x) in rows]]) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)
