"""data/tiny_model.py, the toy preset's model builder, through its command line: a folder transformers loads like a
hub model (ChatML template, corpus entities as single tokens), the same files for the same corpus and seed, and bad
input as one error line with nothing written."""
import hashlib
import json

import pytest
from conftest import TINY05_WORDS, run_stage
from transformers import AutoModelForCausalLM, AutoTokenizer

WORDS = TINY05_WORDS


@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "c.jsonl"
    path.write_text("".join(json.dumps({"transcript": [{"role": "user", "content": f"read {w}.txt code {n}"}]}) + "\n"
                            for w in WORDS for n in (17, 417)))
    return path


def build(out, corpus, *extra):
    return run_stage("data/tiny_model.py", "--out", out, "--corpus", corpus, "--vocab-size", "400",
                     "--layers", "1", "--dim", "16", "--heads", "2", *extra)


def digests(folder):
    """sha256 of every file but tiny_model_config.json (it records the command's arguments, --out included)."""
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())
            if p.name != "tiny_model_config.json"}


def test_cli_tiny_model_loads_like_a_hub_model(tmp_path, corpus):
    build(tmp_path / "m", corpus)
    tok = AutoTokenizer.from_pretrained(tmp_path / "m")
    msgs = [{"role": "system", "content": "s"}, {"role": "user", "content": "read river.txt"},
            {"role": "assistant", "content": "ok"}, {"role": "tool", "content": "code 417"}]
    ids = tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True, return_dict=False)
    assert isinstance(ids, list) and all(isinstance(i, int) for i in ids)
    assert tok.decode(ids).endswith("code 417<|im_end|>\n<|im_start|>assistant\n")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert len(tok.encode("417", add_special_tokens=False)) == 1  # corpus entities are single tokens
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "m")
    assert model.config.num_hidden_layers == 1 and model.config.hidden_size == 16
    assert model.generation_config.eos_token_id == [tok.eos_token_id]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.jsonl", "m"]  # no temporary folder left


def test_same_corpus_and_seed_give_identical_files(tmp_path, corpus):
    for name, seed in (("a", 0), ("b", 0), ("c", 1)):
        build(tmp_path / name, corpus, "--seed", seed)
    a, b, c = (digests(tmp_path / name) for name in "abc")
    assert {"model.safetensors", "tokenizer.json", "tokenizer_config.json", "config.json"} <= set(a) and a == b
    summary = [json.loads((tmp_path / name / "tiny_model_config.json").read_text()) for name in "ab"]
    assert summary[0]["params"] == summary[1]["params"] > 0 and summary[0]["args"]["seed"] == 0
    # another seed: the same tokenizer, other initial weights (the check above can fail)
    assert c["tokenizer.json"] == a["tokenizer.json"] and c["model.safetensors"] != a["model.safetensors"]
    build(tmp_path / "a", corpus, "--seed", 0)  # an existing folder is replaced by the same files
    assert digests(tmp_path / "a") == b


@pytest.mark.parametrize("case,expect", [
    ("heads", "--dim 16 must be a multiple of --heads 3"),
    ("zero", "--layers 0: must be >= 1"),
    ("missing", "nope.jsonl: file not found"),
    ("malformed", "bad.jsonl:2: malformed JSON"),
    ("empty", "no strings found"),
])
def test_bad_input_one_error_nothing_written(tmp_path, corpus, case, expect):
    extra, files = [], [corpus]
    if case == "heads":
        extra = ["--heads", "3"]
    elif case == "zero":
        extra = ["--layers", "0"]
    elif case == "missing":
        files = [tmp_path / "nope.jsonl"]
    elif case == "malformed":
        (tmp_path / "bad.jsonl").write_text('{"a": "b"}\n{"a": \n')
        files = [tmp_path / "bad.jsonl"]
    else:
        (tmp_path / "nums.jsonl").write_text('[3, 4.5]\n7\n')
        files = [tmp_path / "nums.jsonl"]
    proc = run_stage("data/tiny_model.py", "--out", tmp_path / "m", "--corpus", *files, "--dim", "16", "--heads", "2",
                     *extra, check=False)
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith("error: ") and expect in err[0], proc.stderr
    assert not (tmp_path / "m").exists() and not list(tmp_path.glob(".m.tmp*"))
