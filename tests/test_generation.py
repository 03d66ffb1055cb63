"""common/generation.py: the hf backend's memory contract and the dtype choice (the log-probs themselves are
checked against an independent forward pass in test_04_cli.py)."""
import argparse

import pytest
from conftest import load_stage

import helpers_04 as H

R = load_stage("04_rollout.py")
G = R.sys.modules["common.generation"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return H.build_tiny_model(tmp_path_factory.mktemp("tiny"))


def test_hf_backend_keeps_no_per_step_scores(tiny, monkeypatch):
    """output_scores would keep [B, V] per step (80 GB at 512 x 256 x 152k); the recorder keeps one step."""
    import torch
    tok = G.load_tokenizer(tiny)
    backend = G.HFBackend(str(tiny), tok, argparse.Namespace(temperature=1.0, max_new_tokens=12))
    seen, real = {}, backend.model.generate

    def spy(**kwargs):
        out = real(**kwargs)
        seen["config"], seen["scores"], seen["logits"] = kwargs["generation_config"], out.scores, out.logits
        return out

    monkeypatch.setattr(backend.model, "generate", spy)
    torch.manual_seed(0)
    (ids, lps), = backend.generate([tok.encode("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")], 0)
    assert not seen["config"].output_scores and not seen["config"].output_logits
    assert seen["scores"] is None and seen["logits"] is None
    assert len(lps) == len(ids) >= 1 and all(lp <= 0 for lp in lps)


@pytest.mark.parametrize("name,cuda,bf16,want", [
    ("auto", False, False, "float32"), ("auto", True, True, "bfloat16"), ("auto", True, False, "float16"),
    ("float16", True, True, "float16"), ("float32", True, True, "float32")])
def test_dtype_choice(name, cuda, bf16, want):
    assert G.pick_dtype(name, cuda, bf16) == want
