"""Fixtures for the stage-04 tests: the contract's 243 configurations (built here from the contract's
realisation table, independently of 01), run folders, and a tiny random model with a ChatML tokenizer."""
import itertools
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

S_TEMPLATES = [
    "You are an agent in a small file workspace. Solve the user's task with the tools.\n{tool_docs}\n"
    "When you know the answer, call {submit}.\n{workflow_rules}",
    "Rules: finish with {submit}; at most {max_turns} replies.\n{workflow_rules}\nTools:\n{tool_docs}",
    "# Role\nWorkspace assistant.\n# Tools\n{tool_docs}\n# Workflow\n{workflow_rules}\n# Rules\n"
    "Answer only through the {submit} tool.",
]
T_RENAMES = [
    ("hermes_json", 1, {"list_files": ("list_files", {}), "read_file": ("read_file", {"path": "path"}),
                        "search": ("search", {"query": "query"}),
                        "write_file": ("write_file", {"path": "path", "content": "content"}),
                        "calculator": ("calculator", {"expression": "expression"}),
                        "submit": ("submit", {"answer": "answer"})}),
    ("xml_invoke", 1, {"list_files": ("ls", {}), "read_file": ("open", {"path": "file"}),
                       "search": ("grep", {"query": "pattern"}),
                       "write_file": ("save", {"path": "file", "content": "text"}),
                       "calculator": ("calc", {"expression": "expr"}),
                       "submit": ("final_answer", {"answer": "result"})}),
    ("python_call", 3, {"list_files": ("list_dir", {}), "read_file": ("cat", {"path": "filename"}),
                        "search": ("find", {"query": "text"}),
                        "write_file": ("write", {"path": "filename", "content": "body"}),
                        "calculator": ("compute", {"expression": "formula"}), "submit": ("done", {"answer": "value"})}),
]
O_SPECS = [
    {"role": "tool", "template": "{output}", "error_template": "Error: {error}", "max_chars": 2000,
     "truncate_marker": "...", "line_numbers": False},
    {"role": "tool", "template": "<result tool=\"{tool}\">\n{output}\n</result>",
     "error_template": "<result tool=\"{tool}\" status=\"error\">{error}</result>", "max_chars": 2000,
     "truncate_marker": "...", "line_numbers": True},
    {"role": "user", "template": "[{tool}] {output}", "error_template": "!! {tool} failed: {error}", "max_chars": 300,
     "truncate_marker": "...[truncated {n} chars]", "line_numbers": False},
]
C_SPECS = [{"mode": "full", "k": None, "elided_text": None}, {"mode": "window", "k": 2, "elided_text": None},
           {"mode": "elide", "k": 1, "elided_text": "[output elided]"}]
W_SPECS = [
    {"rules": "", "plan_first": False, "plan_prefix": None, "budget_reminder": None, "verify_before_submit": False,
     "verify_marker": None},
    {"rules": "Start your first reply with a line 'Plan: ...'.", "plan_first": True, "plan_prefix": "Plan:",
     "budget_reminder": None, "verify_before_submit": False, "verify_marker": None},
    {"rules": "In the reply with the final answer, start a line with 'Checked: ...'.", "plan_first": False,
     "plan_prefix": None,
     "budget_reminder": "({left} replies left)", "verify_before_submit": True, "verify_marker": "Checked:"},
]


def components():
    S = [{"id": f"S{i}", "desc": "s", "template": t} for i, t in enumerate(S_TEMPLATES)]
    # T0 declares its tools through the chat template (JSON schemas), T1 and T2 in the system prompt
    T = [{"id": f"T{i}", "desc": "t", "syntax": syn, "declare": "chat_template" if i == 0 else "system_prompt",
          "max_calls_per_turn": n, "tools": {k: {"name": name, "args": dict(args)} for k, (name, args) in tools.items()}}
         for i, (syn, n, tools) in enumerate(T_RENAMES)]
    return {c: [dict(spec, id=f"{c}{i}", desc=c) if c in "OCW" else spec for i, spec in enumerate(specs)]
            for c, specs in zip("STOCW", (S, T, O_SPECS, C_SPECS, W_SPECS))}


def space_records():
    comps = components()
    out = []
    for lv in itertools.product(range(3), repeat=5):
        levels = dict(zip("STOCW", lv))
        out.append({"harness_id": "-".join(f"{c}{i}" for c, i in levels.items()), "levels": levels,
                    "specs": {c: comps[c][i] for c, i in levels.items()}})
    return out


def by_id(records):
    return {h["harness_id"]: h for h in records}


def write_jsonl(path, rows):
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r) + "\n" for r in rows))


def make_run(run, train_ids, assignment):
    """A run folder as 01-03 would leave it: space, train/heldout split, assignment {task_id: [ids]}."""
    space = space_records()
    write_jsonl(Path(run) / "harness_space.jsonl", space)
    write_jsonl(Path(run) / "train_harnesses.jsonl", [h for h in space if h["harness_id"] in train_ids])
    write_jsonl(Path(run) / "heldout_harnesses.jsonl", [h for h in space if h["harness_id"] not in train_ids])
    write_jsonl(Path(run) / "assignment.jsonl", [{"task_id": t, "harness_ids": hs} for t, hs in assignment.items()])
    return Path(run)


def read_tasks(name="train_tasks.jsonl"):
    return [json.loads(line) for line in (ROOT / "data" / name).read_text().splitlines() if line.strip()]


CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def stop_now_and_then(model, stop, stop_logit, hidden):
    """Give token `stop` about `stop_logit` at every position (others near 0), so random replies sometimes stop
    early: residual dimension 0 is a constant that no layer writes to, read only by `stop`."""
    import torch
    with torch.no_grad():
        model.model.embed_tokens.weight[:, 0] = 10.0
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight[0, :] = 0.0
            layer.mlp.down_proj.weight[0, :] = 0.0
        model.lm_head.weight[:, 0] = 0.0
        model.lm_head.weight[stop] = 0.0
        model.lm_head.weight[stop, 0] = stop_logit / hidden ** 0.5  # normalised dim 0 ~ sqrt(hidden)


def build_tiny_model(out, max_positions=2048, vocab_size=700, seed=0, stop_logit=None, hidden=32, heads=2, tied=False):
    """A byte-level BPE with ChatML specials and a 2-layer random Llama, saved like a hub checkpoint
    (hidden=128, heads=2 gives head size 64, which vLLM's CPU attention supports).
    stop_logit: give <|im_end|> about this logit at every position, so random replies sometimes stop early
    (stop_now_and_then).
    tied: the LM head is the embedding (SmolLM2's layout; not with stop_logit, which sets them apart)."""
    assert not (tied and stop_logit is not None), "stop_logit needs an LM head of its own"
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
    from common.environment import TOOL_DOCS
    from common.generation import HERMES_TOOLS
    # the tasks, the harness texts, and the tool block T0's chat template adds (data/tiny_model.py does the same)
    corpus = [json.dumps(t) for t in read_tasks()] + S_TEMPLATES + [json.dumps(T_RENAMES), HERMES_TOOLS,
                                                                   json.dumps(TOOL_DOCS)]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=max_positions,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=None,
                         tie_word_embeddings=tied)
    model = LlamaForCausalLM(config)
    if stop_logit is not None:
        stop_now_and_then(model, tok.eos_token_id, stop_logit, hidden)
    model.save_pretrained(out)
    return Path(out)


class Recording:
    """A generation backend that passes every call on to `backend` and keeps (prompt ids, (ids, logprobs)) of
    each in .calls: what the policy was given and what it sampled, to check a bridge's records against."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    def generate(self, prompts, turn, keys=None):
        out = self.backend.generate(prompts, turn, keys=keys)
        self.calls.append((prompts[0], out[0]))
        return out
