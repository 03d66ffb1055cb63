"""04 --until T (what pipeline.py runs): iterations t .. T-1 in one process with one engine, each waiting for the
policy 05 writes and loading it into the running engine (generation.KeptEngine). Its records must be those of
separate calls `04 --iteration u --seed S+u` on the same policies (hf backend here, fp32 and exact; the vLLM
engine's in-place reload against a fresh engine: tests/test_vllm_cpu.py)."""
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import ROOT, run_stage

import helpers_04 as H
import test_04_cli as C  # its helpers (a module import: its tests are not collected twice)

HARNESSES = ["S0-T0-O0-C0-W0", "S2-T1-O2-C2-W1"]
FLAGS = ["--backend", "hf", "--group-size", 2, "--tasks-per-iteration", 2, "--max-turns", 2, "--max-new-tokens", 12,
         "--temperature", 1.0, "--seed", 5]
VOLATILE = ("policy",)  # a record's policy path names its run folder


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Two different tiny checkpoints of one architecture and tokenizer: the policy before and after an update."""
    root = tmp_path_factory.mktemp("models")
    return [H.build_tiny_model(root / f"m{seed}", seed=seed, stop_logit=3.0) for seed in (0, 1)]


def make_run(run, init):
    tasks = C.small_tasks(run / "tasks.jsonl")[:2]
    H.make_run(run, set(HARNESSES), {t["task_id"]: HARNESSES for t in tasks})
    shutil.copytree(init, run / "init_policy")
    return run


def records(path):
    return [{k: v for k, v in json.loads(x).items() if k not in VOLATILE} for x in path.read_text().splitlines()]


def put_policy(run, t, model):
    """As 05 does: the checkpoint written beside, then renamed into place (its presence = finished)."""
    tmp = run / f"iter_{t:03d}" / "policy.tmp"
    shutil.copytree(model, tmp)
    os.replace(tmp, run / f"iter_{t:03d}" / "policy")


def start(*args):
    env = dict(os.environ, PYTHONUNBUFFERED="1", HF_HUB_OFFLINE="1")
    return subprocess.Popen([sys.executable, str(ROOT / "04_rollout.py"), *map(str, args)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def wait_file(path, proc, timeout=300):
    end = time.time() + timeout
    while not path.exists():
        assert proc.poll() is None, f"04 ended ({proc.returncode}):\n{proc.stdout.read()}"
        assert time.time() < end, f"{path} not written in {timeout} s"
        time.sleep(0.1)


def test_until_gives_the_records_of_separate_calls_with_the_policy_05_wrote(tmp_path, models):
    kept = make_run(tmp_path / "kept", models[0])
    proc = start("--run", kept, "--iteration", 0, "--until", 2, "--tasks", kept / "tasks.jsonl", *FLAGS)
    wait_file(kept / "iter_000" / "rollouts.jsonl", proc)
    time.sleep(1.0)  # 04 now waits for iteration 1's policy
    assert proc.poll() is None and not (kept / "iter_001").exists()
    put_policy(kept, 0, models[1])  # "05" of iteration 0
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    assert "waiting for iteration 1's policy" in out

    # the same two iterations as separate calls, seed S + t, on the same policies
    apart = make_run(tmp_path / "apart", models[0])
    (apart / "iter_000").mkdir()
    shutil.copytree(models[1], apart / "iter_000" / "policy")
    for t in (0, 1):
        run_stage("04_rollout.py", "--run", apart, "--iteration", t, "--tasks", apart / "tasks.jsonl",
                  *FLAGS[:-1], 5 + t)
    for t in (0, 1):
        got, want = (records(r / f"iter_{t:03d}" / "rollouts.jsonl") for r in (kept, apart))
        assert len(got) == 4 and got == want, f"iteration {t}"
    config = json.loads((kept / "iter_001" / "04_rollout_config.json").read_text())
    assert config["engine_reloads"] == 1 and config["seed"] == 6 and config["policy"].endswith("iter_000/policy")

    # the reload mattered: the first policy, kept, samples other completions in iteration 1
    stale = make_run(tmp_path / "stale", models[0])
    run_stage("04_rollout.py", "--run", stale, "--iteration", 1, "--policy", stale / "init_policy",
              "--tasks", stale / "tasks.jsonl", *FLAGS[:-1], 6)
    stale_ids = [m["completion_ids"] for r in records(stale / "iter_001" / "rollouts.jsonl") for m in r["model_turns"]]
    kept_ids = [m["completion_ids"] for r in records(kept / "iter_001" / "rollouts.jsonl") for m in r["model_turns"]]
    assert stale_ids != kept_ids


def test_until_ends_when_the_process_that_started_it_ends(tmp_path, models):
    """No engine left behind: a parent that starts `04 --until` and dies leaves a 04 that stops while it waits."""
    run = make_run(tmp_path / "run", models[0])
    pid_file, rollouts = tmp_path / "pid", run / "iter_000" / "rollouts.jsonl"
    parent = (f"import subprocess, sys; p = subprocess.Popen([sys.executable, {str(ROOT / '04_rollout.py')!r}, "
              f"'--run', {str(run)!r}, '--iteration', '0', '--until', '3', '--tasks', {str(run / 'tasks.jsonl')!r}, "
              f"{', '.join(repr(str(f)) for f in FLAGS)}], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); "
              f"open({str(pid_file)!r}, 'w').write(str(p.pid)); import pathlib, time; "  # ends once 04 runs
              f"[time.sleep(0.1) for _ in range(3000) if not pathlib.Path({str(rollouts)!r}).exists()]")
    subprocess.run([sys.executable, "-c", parent], cwd=ROOT, check=True, timeout=60)
    pid = int(pid_file.read_text())
    end = time.time() + 300
    while time.time() < end:
        stat = Path(f"/proc/{pid}/stat")  # gone, or a zombie (State Z) where no one reaps it
        if not stat.exists() or stat.read_text().rpartition(")")[2].split()[0] == "Z":
            break
        time.sleep(0.2)
    else:
        os.kill(pid, 9)
        raise AssertionError("04 --until went on waiting after its parent ended")
    assert rollouts.is_file() and not (run / "iter_001").exists()


@pytest.mark.parametrize("flags", [["--iteration", 2, "--until", 2], ["--eval", "--until", 2],
                                   ["--iteration", 0, "--until", 2, "--shard", "0/2"]])
def test_until_refuses_what_it_cannot_run(tmp_path, models, flags):
    run = make_run(tmp_path / "run", models[0])
    extra = ["--policy", run / "init_policy", "--harnesses", "base", "--out", tmp_path / "o.jsonl"] \
        if "--eval" in flags else []
    proc = run_stage("04_rollout.py", "--run", run, *flags, *extra, "--tasks", run / "tasks.jsonl", *FLAGS,
                     check=False, timeout=120)
    assert proc.returncode == 2 and "--until" in proc.stderr, proc.stderr
    assert not (run / "iter_000").exists() and not (tmp_path / "o.jsonl").exists()
