"""Shared test helpers: the stages are scripts named 01_..., so they are loaded by path."""
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def load_stage(filename):
    """Import a numbered stage script (e.g. '02_orthogonal_design.py') as a module."""
    path = ROOT / filename
    name = "stage_" + path.stem
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def run_stage(filename, *args, cwd=None, check=True, timeout=600):
    """Run a stage through its command line; returns the CompletedProcess."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    cmd = [sys.executable, str(ROOT / filename), *map(str, args)]
    proc = subprocess.run(cmd, cwd=cwd or ROOT, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def episode(task, harness, success, **kw):
    """One 06 episode record (what 04 writes, less the transcript) with the given outcome."""
    e = dict(task_id=task, harness_id=harness, success=success, reward=float(success), turns=2,
             parse_errors=0, tool_errors=0, workflow_violations=0, finish_reason="submitted")
    e.update(kw)
    return e


@pytest.fixture
def stage():
    return load_stage


TINY05_WORDS = "river apple stone cloud code key read submit file path answer what is the in".split()


@pytest.fixture(scope="session")
def tiny05(tmp_path_factory):
    """A 2-layer, d=32 model with a ~300-token tokenizer, built once by data/tiny_model.py (the toy's builder)."""
    import json
    import random
    d = tmp_path_factory.mktemp("tiny05")
    rng = random.Random(0)
    lines = [{"text": " ".join(rng.choice(TINY05_WORDS) for _ in range(12)) + f" {rng.randint(10, 99)}"}
             for _ in range(300)]
    (d / "corpus.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    load_stage("data/tiny_model.py").main(["--out", str(d / "tiny"), "--corpus", str(d / "corpus.jsonl"),
                                           "--vocab-size", "300", "--layers", "2", "--dim", "32", "--heads", "2",
                                           "--seed", "0"])
    return d / "tiny"
