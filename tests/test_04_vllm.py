"""Stage 04's vLLM backend, driven by a fake `vllm` module (the real engine runs in test_vllm_cpu.py): the options
it gives LLM(...) on CPU and on GPU, LLM(model=..., seed=..., dtype=..., generation_config="vllm",
logprobs_mode="processed_logprobs", ...),
LLM.generate([{"prompt_token_ids": ids}, ...], [SamplingParams(...), ...], use_tqdm=False), and the
conversion of RequestOutput.outputs[0].token_ids / .logprobs ([{token_id: Logprob(logprob=...)}, ...])."""
import argparse
import json
import os
import sys
import types

import pytest
from conftest import load_stage

from common import generation as G
import helpers_04 as H

R = load_stage("04_rollout.py")


class Fake:
    """Records every call; `reply(i, params)` gives the token ids the fake engine 'generates' for prompt i."""

    def __init__(self, reply):
        self.reply, self.llm_kwargs, self.calls = reply, None, []
        fake = self

        class SamplingParams:
            def __init__(self, **kwargs):
                self.kwargs = kwargs

        class LLM:
            def __init__(self, **kwargs):
                fake.llm_kwargs = kwargs

            def generate(self, prompts, sampling_params=None, *, use_tqdm=True):
                fake.calls.append((prompts, sampling_params, use_tqdm))
                outputs = []
                for i, (prompt, params) in enumerate(zip(prompts, sampling_params)):
                    ids = fake.reply(i, params.kwargs)[:params.kwargs["max_tokens"]]
                    lps = None if params.kwargs["logprobs"] is None else [
                        {t: types.SimpleNamespace(logprob=-0.5 - j, rank=1), 7: types.SimpleNamespace(logprob=-9.0)}
                        for j, t in enumerate(ids)]
                    completion = types.SimpleNamespace(token_ids=tuple(ids), logprobs=lps, text="ignored")
                    outputs.append(types.SimpleNamespace(prompt_token_ids=prompt["prompt_token_ids"],
                                                         outputs=[completion]))
                return outputs

        self.module = types.ModuleType("vllm")
        self.module.LLM, self.module.SamplingParams, self.module.__version__ = LLM, SamplingParams, "0.10.2"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return H.build_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tok(tiny):
    return G.load_tokenizer(tiny)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):  # the backend sets vLLM-CPU variables with setdefault: start each test without them
    for name in ("VLLM_CPU_NUM_OF_RESERVED_CPU", "VLLM_CPU_KVCACHE_SPACE", "VLLM_ENABLE_V1_MULTIPROCESSING",
                 "VLLM_ALLOW_INSECURE_SERIALIZATION"):
        monkeypatch.delenv(name, raising=False)


def test_vllm_calls_and_output_conversion(monkeypatch, tiny, tok):
    stop = tok.stop_ids[0]
    fake = Fake(lambda i, p: [10, 11, stop, 12] if i == 0 else [13] * 50)
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    args = argparse.Namespace(temperature=0.8, max_new_tokens=6, seed=3)
    backend = G.VLLMBackend(tiny, tok, args)
    assert fake.llm_kwargs == {"model": str(tiny), "seed": 3, "dtype": "bfloat16", "generation_config": "vllm",
                               "logprobs_mode": "processed_logprobs", "enforce_eager": True,
                               "enable_chunked_prefill": False,  # CPU: seeded requests crash on chunked prefill
                               "distributed_executor_backend": "uni"}  # CPU: the engine in this process
    assert os.environ["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0" and os.environ["VLLM_CPU_KVCACHE_SPACE"] == "4"
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0"
    assert "VLLM_ALLOW_INSECURE_SERIALIZATION" not in os.environ  # in one process nothing is pickled
    results = backend.generate([[1, 2, 3], [4, 5], [4, 5]], turn=2)
    (prompts, params, use_tqdm), = fake.calls
    assert prompts == [{"prompt_token_ids": [1, 2, 3]}, {"prompt_token_ids": [4, 5]}, {"prompt_token_ids": [4, 5]}]
    assert use_tqdm is False and len(params) == 3
    for p in params:
        assert set(p.kwargs) == {"temperature", "max_tokens", "seed", "stop_token_ids", "logprobs"}
        assert p.kwargs["temperature"] == 0.8 and p.kwargs["max_tokens"] == 6 and p.kwargs["logprobs"] == 0
        assert p.kwargs["stop_token_ids"] == tok.stop_ids and 0 <= p.kwargs["seed"] < 2 ** 31
    assert len({p.kwargs["seed"] for p in params}) == 3  # identical prompts of a group must not share a seed
    assert results[0] == ([10, 11, stop], [-0.5, -1.5, -2.5])  # truncated after the stop token, kept
    assert results[1] == ([13] * 6, [-0.5 - j for j in range(6)])  # hit max_tokens
    seeds_turn2 = [p.kwargs["seed"] for p in params]
    backend.generate([[1, 2, 3]], turn=3)
    assert fake.calls[-1][1][0].kwargs["seed"] != seeds_turn2[0]  # a new seed each round

    greedy = G.VLLMBackend(tiny, tok, argparse.Namespace(temperature=0.0, max_new_tokens=6, seed=3))
    assert greedy.generate([[1, 2]], 0) == [([10, 11, stop], None)] and fake.calls[-1][1][0].kwargs["logprobs"] is None


def test_vllm_cpu_engine_in_process_unless_the_user_asks_for_processes(monkeypatch, tiny, tok):
    """The user's VLLM_ENABLE_V1_MULTIPROCESSING=1 is kept, and then vLLM's own executor is left to choose."""
    fake = Fake(lambda i, p: [1])
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    G.VLLMBackend(tiny, tok, argparse.Namespace(temperature=1.0, max_new_tokens=4, seed=0))
    assert "distributed_executor_backend" not in fake.llm_kwargs
    assert os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    assert os.environ["VLLM_ALLOW_INSECURE_SERIALIZATION"] == "1"  # reload's repack goes to the worker pickled


def test_vllm_backend_through_the_command_line(monkeypatch, tmp_path, tiny, tok):
    """Eval mode with --backend vllm: lockstep calls, records built from the fake engine's tokens."""
    submit = tok.encode('<tool_call>{"name": "submit", "arguments": {"answer": "7"}}</tool_call>') + [tok.stop_ids[0]]
    read = tok.encode('<tool_call>{"name": "list_files", "arguments": {}}</tool_call>') + [tok.stop_ids[0]]
    fake = Fake(lambda i, p: read if len(fake.calls) == 1 else submit)
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    tasks = [t for t in H.read_tasks() if t["family"] == "count"][:3]
    H.write_jsonl(tmp_path / "tasks.jsonl", tasks)
    out = tmp_path / "o.jsonl"
    H.make_run(tmp_path, set(), {})
    R.main(["--run", str(tmp_path), "--eval", "--backend", "vllm", "--policy", str(tiny), "--harnesses",
            "S0-T0-O0-C0-W0,S1-T0-O1-C0-W0", "--tasks",
            str(tmp_path / "tasks.jsonl"), "--samples", "2", "--out", str(out), "--max-new-tokens", "64"])
    records = [json.loads(x) for x in out.read_text().splitlines()]
    assert [len(c[0]) for c in fake.calls] == [12, 12]  # one call per turn, all live episodes in it
    for r in records:
        assert r["turns"] == 2 and r["finish_reason"] == "submitted" and r["submitted_answer"] == "7"
        assert [mt["completion_ids"] for mt in r["model_turns"]] == [read, submit]
        assert all(len(mt["logprobs"]) == len(mt["completion_ids"]) for mt in r["model_turns"])
        assert r["model_turns"][1]["prompt_ids"][:len(r["model_turns"][0]["prompt_ids"])] == \
            r["model_turns"][0]["prompt_ids"]  # full history: turn 1's prompt extends turn 0's
    config = json.loads((tmp_path / "o.04_rollout_config.json").read_text())
    assert config["versions"]["vllm"] == "0.10.2" and config["backend"] == "vllm"


def test_vllm_missing_is_a_clear_error(monkeypatch, tiny, tok):
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(R.BackendError, match="vllm is not installed"):
        G.VLLMBackend(tiny, tok, argparse.Namespace(temperature=1.0, max_new_tokens=4, seed=0))


def test_vllm_options_on_a_gpu_without_bf16(monkeypatch, tiny, tok):
    """A T4/V100: float16, CUDA graphs on, the memory share passed; chunked prefill left to vLLM."""
    import torch
    fake = Fake(lambda i, p: [1])
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    args = argparse.Namespace(temperature=1.0, max_new_tokens=4, seed=0, dtype="auto", enforce_eager=None,
                              max_model_len=2048, gpu_memory_utilization=0.5)
    G.VLLMBackend(tiny, tok, args)
    assert fake.llm_kwargs == {"model": str(tiny), "seed": 0, "dtype": "float16", "generation_config": "vllm",
                               "logprobs_mode": "processed_logprobs", "enforce_eager": False, "max_model_len": 2048,
                               "gpu_memory_utilization": 0.5}
    assert "VLLM_CPU_KVCACHE_SPACE" not in os.environ and "VLLM_ENABLE_V1_MULTIPROCESSING" not in os.environ
