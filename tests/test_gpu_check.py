"""experiments/bench/gpu_check.py: the GPU check's CPU mode runs every step through the script's command line and its
JSON holds sane figures; the config it writes for the device is Qwen2.5-0.5B-Instruct's, value for value."""
import json
import math
import os
import subprocess
import sys

import pytest
from conftest import ROOT, load_stage

G = load_stage("experiments/bench/gpu_check.py")
STEPS = ["model", "train", "train_mb8", "bare", "rollout", "pipeline", "pytest_05", "torchrun", "torchrun_fsdp"]
# Qwen/Qwen2.5-0.5B-Instruct's config.json, written out here independently of the script
QWEN = dict(architectures=["Qwen2ForCausalLM"], model_type="qwen2", vocab_size=151936, hidden_size=896,
            num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2, intermediate_size=4864,
            tie_word_embeddings=True, max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_act="silu",
            use_sliding_window=False)


def test_the_device_config_is_qwen25_05b(tmp_path):
    """The config the device run writes (config.json through save_pretrained; no weights allocated)."""
    import torch
    from transformers import Qwen2ForCausalLM
    config = G.write_config(tmp_path, G.qwen_config(bos=0, eos=2, pad=0))
    written = json.loads((tmp_path / "config.json").read_text())
    for k, v in QWEN.items():
        assert written[k] == v, (k, written[k], v)
    assert G.rope_theta(written) == 1e6
    assert not (tmp_path / "model.safetensors").exists()
    with torch.device("meta"):  # shapes only: Qwen2.5-0.5B has 494,032,768 parameters (embeddings tied)
        model = Qwen2ForCausalLM(config)
    assert sum(p.numel() for p in model.parameters()) == 494_032_768
    tiny = G.qwen_config(tiny=True, vocab=300, bos=0, eos=2, pad=0)
    assert tiny["vocab_size"] == 300 and tiny["hidden_size"] < 896 and tiny["rope_theta"] == 1e6


def test_a_step_gets_what_is_left_of_the_budget():
    """--budget-s: a child's timeout is its own limit or the budget's rest; under 10 s left, the step is skipped."""
    import time
    try:
        G.DEADLINE[0] = float("inf")
        assert G.timeout("train") == G.TIMEOUTS["train"]
        G.DEADLINE[0] = time.perf_counter() + 100
        assert 90 < G.timeout("train") <= 100
        G.DEADLINE[0] = time.perf_counter() + 5
        with pytest.raises(RuntimeError, match="skipped"):
            G.timeout("pipeline")
    finally:
        G.DEADLINE[0] = float("inf")


@pytest.mark.slow
def test_cpu_mode_runs_every_step(tmp_path):
    out = tmp_path / "check.json"
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    proc = subprocess.run([sys.executable, str(ROOT / "experiments" / "bench" / "gpu_check.py"), "--device", "cpu", "--out", str(out),
                           "--work", str(tmp_path / "work")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["mode"] == "cpu" and list(r["steps"]) == STEPS
    bad = {k: v["error"] for k, v in r["steps"].items() if not v["ok"]}
    assert not bad, bad
    s = r["steps"]
    written = json.loads((tmp_path / "work" / "model" / "config.json").read_text())
    assert written["architectures"] == ["Qwen2ForCausalLM"] and s["model"]["config"]["vocab_size"] == \
        s["model"]["tokenizer_vocab"] == written["vocab_size"]
    for name in ("train", "train_mb8", "bare"):
        assert s[name]["peak_gib"] > 0 and s[name]["tokens_per_s"] > 0 and s[name]["device"] == "cpu", s[name]
    assert s["train"]["optimizer_steps"] == s["bare"]["optimizer_steps"] == 4  # 2 epochs x 2 minibatches
    assert s["train"]["tokens"] == s["bare"]["tokens"] == 2 * 16 * G.positions(G.SIZES["cpu"])
    assert math.isfinite(s["bare"]["trainer_over_bare"]) and s["bare"]["trainer_over_bare"] > 0
    ro = s["rollout"]
    assert ro["episodes"] == 2 * 2 and ro["episodes_per_s"] > 0 and 0 <= ro["outside_generation_share"] < 1
    assert ro["sampler"]["backend"] == "hf"
    assert s["pipeline"]["results_md"] and s["pipeline"]["stage05_devices"] == ["cpu"]
    assert s["pipeline"]["stage05_runs"] >= 2  # the warm start's SFT and one RL update, not a cached warm start
    assert s["pytest_05"].get("passed", 0) > 0 and not s["pytest_05"].get("failed")
    assert s["torchrun"]["optimizer_steps"] >= 1
    assert s["torchrun_fsdp"]["optimizer_steps"] == s["torchrun"]["optimizer_steps"] >= 1
    assert "train" in proc.stdout and "ok" in proc.stdout  # the printed table
