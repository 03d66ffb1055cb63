"""bench_rollout.py: throughput of stage 04's rollouts (a benchmark, not a test).

    python experiments/bench/bench_rollout.py              # builds a tiny model in a temp folder (data/tiny_model.py)
    python experiments/bench/bench_rollout.py --model runs/toy/init_policy --episodes 128 --max-new-tokens 64

Reports
  1. the oracle over the whole space (243 configurations + the external harnesses, x the test tasks):
     episodes/s without token records, and with token records (--tokenizer = the model's tokenizer);
  2. the hf backend on a small model: wall time of the lockstep rollout, time inside model.generate, and
     the share of wall time spent outside generation (rendering + tokenising prompts, decoding, parsing,
     tools, bookkeeping). Target: under 10%.
"""
import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # 04 imports common/plumbing.py and common/generation.py from the repository root


def load_04():
    spec = importlib.util.spec_from_file_location("stage_04_rollout", ROOT / "04_rollout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None, help="checkpoint for the hf part (default: data/tiny_model.py in a "
                   "temp dir)")
    p.add_argument("--episodes", type=int, default=96, help="hf part: episodes in the lockstep batch")
    p.add_argument("--max-turns", type=int, default=4, help="hf part: turn budget")
    p.add_argument("--max-new-tokens", type=int, default=48, help="hf part: tokens per reply")
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    R = load_04()
    from common import generation as G  # the backends (04 imports it: on the path)
    from common import schemas as S
    tmp = Path(tempfile.mkdtemp(prefix="bench04_"))
    subprocess.run([sys.executable, str(ROOT / "01_harness_space.py"), "--run", str(tmp)], check=True,
                   capture_output=True)
    harnesses = S.load_run_harnesses(tmp, "harness_space.jsonl") + R.load_harness_file(R.EXTERNAL)
    tasks = R.load_tasks(ROOT / "data" / "test_tasks.jsonl")
    jobs = [(t, h, {}) for h in harnesses for t in tasks]

    start = time.perf_counter()
    records = R.run_episodes(jobs, "oracle", progress=False)
    oracle_s = time.perf_counter() - start
    turns = sum(r["turns"] for r in records)
    assert all(r["success"] for r in records)
    print(f"oracle, text only: {len(records)} episodes ({len(harnesses)} harnesses x {len(tasks)} tasks), "
          f"{oracle_s:.2f} s -> {len(records) / oracle_s:,.0f} episodes/s, {turns / oracle_s:,.0f} turns/s")

    model = args.model
    if model is None:
        demos = tmp / "demos.jsonl"
        demos.write_text("".join(json.dumps(r) + "\n" for r in records[::10]))
        model = tmp / "tiny"
        subprocess.run([sys.executable, str(ROOT / "data" / "tiny_model.py"), "--out", str(model), "--corpus",
                        str(demos), str(ROOT / "data" / "train_tasks.jsonl")], check=True, capture_output=True)
    tok = G.load_tokenizer(model)
    sub = jobs[::5]
    start = time.perf_counter()
    records = R.run_episodes(sub, "oracle", tok=tok, progress=False)
    tok_s = time.perf_counter() - start
    print(f"oracle, with token records: {len(sub)} episodes, {tok_s:.2f} s -> {len(sub) / tok_s:,.0f} episodes/s")

    import torch
    backend = G.HFBackend(str(model), tok, argparse.Namespace(temperature=args.temperature,
                                                              max_new_tokens=args.max_new_tokens))
    R.seed_everything(args.seed)
    spread = [jobs[(i * 7919) % len(jobs)] for i in range(args.episodes)]  # many harnesses and tasks
    task, harness, meta = spread[0]
    backend.generate([R.encode(tok, R.Episode(task, harness, args.max_turns, meta).context())], 0)  # warm-up
    backend.gen_seconds = 0.0
    start = time.perf_counter()
    records = R.run_episodes(spread, str(model), backend, tok, args.max_turns, args.max_new_tokens,
                             G.max_positions(model), args.temperature, progress=False)
    wall = time.perf_counter() - start
    gen = backend.gen_seconds
    prompts = [len(mt["prompt_ids"]) for r in records for mt in r["model_turns"]]
    completions = [len(mt["completion_ids"]) for r in records for mt in r["model_turns"]]
    n_params = sum(q.numel() for q in backend.model.parameters())
    print(f"hf backend ({backend.device}, {torch.get_num_threads()} threads, {n_params / 1e6:.2f}M params, "
          f"{os.cpu_count()} CPUs): {len(records)} episodes, {len(prompts)} model turns, "
          f"prompt tokens median {statistics.median(prompts):.0f} (max {max(prompts)}), "
          f"completion tokens mean {statistics.mean(completions):.1f}")
    print(f"  wall {wall:.2f} s, inside generate {gen:.2f} s, outside generation {wall - gen:.2f} s "
          f"= {100 * (wall - gen) / wall:.1f}% of wall time (target < 10%)")
    print(json.dumps({"oracle_episodes_per_s": round(len(jobs) / oracle_s), "oracle_token_episodes_per_s":
                      round(len(sub) / tok_s), "hf_wall_s": round(wall, 3), "hf_generate_s": round(gen, 3),
                      "hf_outside_share": round((wall - gen) / wall, 4)}))


if __name__ == "__main__":
    main()
