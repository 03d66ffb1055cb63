"""tiny_model.py: the toy preset's model, built locally: a byte-level BPE tokenizer trained on a corpus and a tiny
Llama with random weights, written as a save_pretrained folder that transformers (and 04, 05, vLLM) load like a
hub model.

    python data/tiny_model.py --out runs/toy/tiny --corpus demos_text.jsonl data/train_tasks.jsonl
    python data/tiny_model.py --out /tmp/tiny --corpus data/train_tasks.jsonl --layers 1 --dim 16 --heads 2

The tokenizer is trained on every string of the JSONL corpus files (keys and values, at any depth: 04's records
hold the tools a harness declared through the chat template) plus the four role names and the template's tool
block; the pre-tokenizer splits letters, digits, whitespace and punctuation apart, so a word or a number of the
corpus (a file name, a value) becomes one token wherever it stands. Chat template: ChatML (<|im_start|>role
... <|im_end|>), eos <|im_end|>, pad <|endoftext|>. The same corpus and --seed give byte-identical files. Writes
<out>/ (config.json, generation_config.json, model.safetensors, tokenizer files, tiny_model_config.json), built
under a temporary name and renamed last; an existing <out> is replaced.
"""
import argparse
import json
import os
import random
import re
import shutil
import sys
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # common/plumbing.py, in the repository root
from common.generation import HERMES_TOOLS  # noqa: E402
from common.plumbing import fail, read_text, write_atomic  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + (message['content'] or '') + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}")
# Pre-tokenizer: letters, digits, whitespace and punctuation runs are split apart, so a word or a
# number is the same token wherever it stands ("417" in a file, after a quote, after a space):
# copying an entity is then copying one token.
PRETOKEN = r"[A-Za-z]+|[0-9]+|\s+|[^A-Za-z0-9\s]+"
ROLES = ["system", "user", "assistant", "tool"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, help="model folder to write (replaced if it exists)")
    p.add_argument("--corpus", nargs="+", required=True, help="JSONL files whose strings train the tokenizer")
    p.add_argument("--vocab-size", type=int, default=2048, help="BPE vocabulary size (at most)")
    p.add_argument("--layers", type=int, default=2, help="decoder layers")
    p.add_argument("--dim", type=int, default=128, help="hidden size (a multiple of --heads; MLP 4x)")
    p.add_argument("--heads", type=int, default=8, help="attention heads")
    p.add_argument("--max-len", type=int, default=1024, help="max_position_embeddings")
    p.add_argument("--seed", type=int, default=0, help="seed of the random initial weights")
    return p.parse_args(argv)


# ----------------------------------------------------------------------------------- small helpers
def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def collect_strings(obj, out):
    """Every string of a JSON value (keys too), depth first, appended to `out`."""
    if isinstance(obj, str):
        out.append(obj)
    elif isinstance(obj, dict):
        for k, v in obj.items():
            collect_strings(k, out)
            collect_strings(v, out)
    elif isinstance(obj, list):
        for v in obj:
            collect_strings(v, out)


# ---------------------------------------------------------------------------------- input checking
def check_inputs(args):
    """The corpus strings (after the role names); bad flags or files stop with one line, exit 2."""
    for flag in ("layers", "dim", "heads", "vocab_size", "max_len"):
        if getattr(args, flag) < 1:
            fail(f"--{flag.replace('_', '-')} {getattr(args, flag)}: must be >= 1")
    if args.dim % args.heads:
        fail(f"--dim {args.dim} must be a multiple of --heads {args.heads}")
    texts = list(ROLES) + [HERMES_TOOLS]  # the tool block the chat template adds where a harness declares tools there
    for f in args.corpus:
        for n, line in enumerate(read_text(f).splitlines(), 1):  # a corpus line may be any JSON value
            try:
                value = json.loads(line) if line.strip() else None
            except json.JSONDecodeError as e:
                fail(f"{f}:{n}: malformed JSON ({e.msg})")
            collect_strings(value, texts)
    if len(texts) == len(ROLES) + 1:
        fail(f"corpus {' '.join(args.corpus)}: no strings found")
    return texts


# ------------------------------------------------------------------------------ tokenizer and model
def train_tokenizer(texts, vocab_size, max_len):
    """Byte-level BPE on the corpus strings, wrapped as a transformers tokenizer with the ChatML template."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKEN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIALS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  additional_special_tokens=["<|im_start|>"], chat_template=CHAT_TEMPLATE,
                                  model_max_length=max_len)
    return tok, bpe


def tiny_llama(tok, layers, dim, heads, max_len):
    """A Llama with tied input/output embeddings, MLP width 4 x dim, random weights (torch's generator)."""
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM
    eos, pad = tok.convert_tokens_to_ids("<|im_end|>"), tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=dim, intermediate_size=4 * dim,
                      num_hidden_layers=layers, num_attention_heads=heads,
                      num_key_value_heads=heads, max_position_embeddings=max_len,
                      tie_word_embeddings=True, bos_token_id=pad, eos_token_id=eos, pad_token_id=pad)
    model = LlamaForCausalLM(cfg)
    model.generation_config = GenerationConfig(eos_token_id=[eos], pad_token_id=pad, bos_token_id=pad)
    return model


def main(argv=None):
    args = parse_args(argv)
    texts = check_inputs(args)
    seed_everything(args.seed)
    tok, bpe = train_tokenizer(texts, args.vocab_size, args.max_len)
    model = tiny_llama(tok, args.layers, args.dim, args.heads, args.max_len)
    # how many distinct words / numbers of the corpus became single tokens (entities should)
    words = {w for t in texts for w in re.findall(r"[A-Za-z]+|[0-9]+", t)}
    single = sum(len(bpe.encode(w).ids) == 1 for w in words)
    summary = dict(vocab=len(tok), params=sum(p.numel() for p in model.parameters()), strings=len(texts),
                   single_token_words=f"{single}/{len(words)}")
    out = Path(args.out)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")  # one per process: two builds never mix their files
    try:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        write_atomic(tmp / "tiny_model_config.json", json.dumps({"args": vars(args), **summary}, indent=2))
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)  # the folder appears last, complete
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"[tiny_model] {out}: {summary}")
    return summary


if __name__ == "__main__":
    main()
