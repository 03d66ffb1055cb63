"""The warm start is the same in every run: generation.weights_fingerprint against an independent computation (the
safetensors library's reader and torch), fingerprint_distance naming a changed tensor, and 05's SFT giving the same
weights, bit for bit, run after run, with 1 or 2 threads (through its command line)."""
import hashlib
import json
import math
import random
import shutil
import subprocess
import sys

from common import generation as G
import numpy as np
import pytest
import torch
from conftest import ROOT, load_stage, run_stage
from safetensors.torch import load_file, save_file

DTYPES = {torch.float32: "F32", torch.bfloat16: "BF16", torch.float16: "F16", torch.int64: "I64"}


def hash_by_hand(tensors):
    """sha256 over the tensors in sorted name order, each: json([name, dtype, shape]) + newline, its byte count (8
    bytes, little endian), its bytes, taken from torch tensors (the safetensors library read them)."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name].contiguous()
        data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
        h.update((json.dumps([name, DTYPES[t.dtype], list(t.shape)]) + "\n").encode())
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()


def indices_by_hand(name, numel):
    """The rule: min(8, numel) distinct flat indices, random.Random(first 8 bytes of sha256(name), little endian)."""
    return random.Random(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little")).sample(
        range(numel), min(8, numel))


def check_sketch(fp, tensors):
    assert fp["tensors"] == len(tensors) and fp["elements"] == sum(t.numel() for t in tensors.values())
    for name, t in tensors.items():
        dtype, shape, total, squares, values = fp["sketch"][name]
        x = t.flatten().double()  # bf16 / fp16 / fp32 -> float64 is exact
        assert (dtype, shape) == (DTYPES[t.dtype], list(t.shape))
        assert total == pytest.approx(float(x.sum()), rel=1e-12, abs=1e-12)
        assert squares == pytest.approx(float((x * x).sum()), rel=1e-12, abs=1e-12)
        want = [float(x[i]) for i in indices_by_hand(name, t.numel())]
        if t.is_floating_point():  # stored as the shortest decimal of its float32: the same float32
            assert [np.float32(v) for v in values] == [np.float32(v) for v in want]
        else:
            assert values == want


def test_fingerprint_of_a_saved_model_matches_torch(tiny05):
    fp = G.weights_fingerprint(tiny05)
    tensors = load_file(str(tiny05 / "model.safetensors"))
    assert fp["sha256"] == hash_by_hand(tensors)
    check_sketch(fp, tensors)
    assert G.fingerprint_distance(fp, json.loads(json.dumps(fp))) == dict(  # through JSON, as the ledger keeps it
        same_hash=True, max_abs=0.0, max_rel=0.0, first_differing=None, differing=0, compared=len(tensors))


def test_fingerprint_reads_shards_and_bf16_and_ignores_file_metadata(tmp_path):
    g = torch.Generator().manual_seed(0)
    tensors = {"b.weight": torch.randn(7, 5, generator=g).to(torch.bfloat16), "a.bias": torch.randn(3, generator=g),
               "c.half": torch.randn(4, 4, generator=g).half(), "d.count": torch.arange(5),
               "e.scalar": torch.tensor(2.5)}
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    save_file(tensors, str(tmp_path / "one" / "model.safetensors"), metadata={"format": "pt"})
    two = tmp_path / "two"
    save_file({k: tensors[k] for k in ("d.count", "a.bias")}, str(two / "model-00001-of-00002.safetensors"))
    save_file({k: tensors[k] for k in ("b.weight", "c.half", "e.scalar")},
              str(tmp_path / "two" / "model-00002-of-00002.safetensors"), metadata={"made": "elsewhere"})
    one, two = G.weights_fingerprint(tmp_path / "one"), G.weights_fingerprint(tmp_path / "two")
    assert one == two and one["sha256"] == hash_by_hand(tensors)
    check_sketch(one, tensors)


def test_a_changed_weight_changes_the_hash_and_the_distance_names_it(tiny05, tmp_path):
    tensors = load_file(str(tiny05 / "model.safetensors"))
    name, delta = "model.layers.1.mlp.up_proj.weight", 1e-3
    changed = dict(tensors, **{name: tensors[name] + delta})
    shutil.copytree(tiny05, tmp_path / "m")
    save_file(changed, str(tmp_path / "m" / "model.safetensors"), metadata={"format": "pt"})
    a, b = G.weights_fingerprint(tiny05), G.weights_fingerprint(tmp_path / "m")
    d = G.fingerprint_distance(a, b)
    assert not d["same_hash"] and d["first_differing"] == name and d["differing"] == 1
    # by hand, in float64 from torch: the sampled values' difference, and each difference over the tensor's scale
    x, y = tensors[name].flatten().double(), changed[name].flatten().double()
    idx = indices_by_hand(name, x.numel())
    dv = float((y[idx] - x[idx]).abs().max())
    n, sq = x.numel(), max(float((x * x).sum()), float((y * y).sum()))
    rel = max(dv / math.sqrt(sq / n), abs(float(y.sum() - x.sum())) / math.sqrt(n * sq),
              abs(float((y * y).sum() - (x * x).sum())) / sq)
    # (the sketch keeps each value as the shortest decimal of its float32: ~1e-9 off here)
    assert d["max_abs"] == pytest.approx(dv, rel=1e-4) and dv == pytest.approx(delta, rel=1e-3)
    assert d["max_rel"] == pytest.approx(rel, rel=1e-4)
    # one element off the sampled indices: the sums still show it
    k = next(i for i in range(x.numel()) if i not in idx)
    single = tensors[name].clone()
    single.view(-1)[k] += 0.5
    save_file(dict(tensors, **{name: single}), str(tmp_path / "m" / "model.safetensors"))
    d = G.fingerprint_distance(a, G.weights_fingerprint(tmp_path / "m"))
    assert d["first_differing"] == name and d["max_abs"] == 0.0 and d["max_rel"] > 1e-4
    # a tensor missing from one side: incomparable, named
    b["sketch"].pop("model.norm.weight")
    d = G.fingerprint_distance(a, b)
    assert d["max_abs"] == math.inf and d["first_differing"] == "model.layers.1.mlp.up_proj.weight"
    assert d["differing"] == 2 and d["compared"] == a["tensors"] - 1


def test_no_safetensors_is_one_clear_line(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "model.safetensors").write_bytes(b"\x05\x00\x00\x00\x00\x00\x00\x00{oops")
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "bad", tmp_path / "empty"):
        code = f"from common import generation; generation.weights_fingerprint({str(folder)!r})"
        p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
        assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and str(folder) in p.stderr, p.stderr


def test_fingerprint_needs_no_torch(tiny05):
    code = (f"import sys; from common import generation; fp = generation.weights_fingerprint({str(tiny05)!r}); "
            "assert 'torch' not in sys.modules, 'torch imported'; print(fp['sha256'])")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == G.weights_fingerprint(tiny05)["sha256"]


def test_sft_gives_the_same_weights_in_every_run_with_1_or_2_threads(tiny05, tmp_path, monkeypatch):
    """05 --algo sft twice from the same inputs (the second with another thread count): the same sha256, and
    each run's config records its threads and CPU kernels."""
    rng, vocab = random.Random(5), json.loads((tiny05 / "config.json").read_text())["vocab_size"]
    recs = [{"episode_id": f"d{i}", "policy": "oracle", "reward": 1.0, "model_turns": [
        {"prompt_ids": [rng.randrange(3, vocab) for _ in range(rng.randint(20, 60))],
         "completion_ids": [rng.randrange(3, vocab) for _ in range(rng.randint(5, 30))]}]} for i in range(8)]
    (tmp_path / "demos.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    flags = ["--algo", "sft", "--policy", tiny05, "--rollouts", tmp_path / "demos.jsonl", "--epochs", "2",
             "--minibatch-size", "3", "--lr", "3e-3", "--seed", "7"]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the first run in this process (no start-up to pay), on 1 thread
    try:
        load_stage("05_train.py").main([str(f) for f in flags + ["--out", tmp_path / "t1" / "policy"]])
    finally:
        torch.set_num_threads(threads)
    monkeypatch.setenv("OMP_NUM_THREADS", "2")  # the second through the command line, on 2
    run_stage("05_train.py", *flags, "--out", tmp_path / "t2" / "policy")
    fps = {}
    for n in ("1", "2"):
        cfg = json.loads((tmp_path / f"t{n}" / "05_train_config.json").read_text())
        assert cfg["threads"] == int(n) and cfg["cpu_kernels"] == torch.backends.cpu.get_cpu_capability()
        assert cfg["optimizer_steps"] == 6
        fps[n] = G.weights_fingerprint(tmp_path / f"t{n}" / "policy")
    assert fps["1"]["sha256"] == fps["2"]["sha256"] != G.weights_fingerprint(tiny05)["sha256"]
    assert G.fingerprint_distance(fps["1"], fps["2"])["differing"] == 0
