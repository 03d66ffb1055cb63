"""Issue 18: bad input files stop a stage with one line naming file, line and field (exit 2, nothing written);
05 never trains on non-finite or malformed records; 04 refuses duplicate assignments; 06 --no-rollout checks
checkpoint.json; a run folder has one writer at a time; the pipeline forwards SIGINT/SIGTERM to its stage."""
import json
import os
import signal
import subprocess
import sys
import time

import pytest

import helpers_04 as H
from conftest import ROOT, load_stage, run_stage


def one_error(proc, *needles):
    """Exit 2 and exactly one stderr line, 'error: ...', that holds every needle."""
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(err) == 1 and err[0].startswith("error: "), proc.stderr
    assert "Traceback" not in proc.stderr and all(n in err[0] for n in needles), err[0]
    return err[0]


def tree(path):
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else None


# ----------------------------------------------------------------------------- 01 --components, 04 --harness-file
@pytest.fixture(scope="module")
def components(tmp_path_factory):
    run = tmp_path_factory.mktemp("c") / "run"
    run_stage("01_harness_space.py", "--run", run)
    return json.loads((run / "components.json").read_text())


BAD_FIELDS = [  # (component, realisation, field, value): the 11 files that 01 and 04 accepted
    ("O", 2, "max_chars", "300"), ("W", 2, "budget_reminder", 5), ("W", 1, "plan_prefix", 7), ("C", 1, "k", "2"),
    ("T", 0, "tools.read_file.args", ["path"]), ("O", 2, "max_chars", -5), ("O", 1, "line_numbers", "no"),
    ("O", 0, "max_chars", True), ("W", 0, "plan_first", "yes"), ("T", 1, "max_calls_per_turn", 0),
    ("T", 2, "tools.submit.name", 3)]


def set_field(spec, dotted, value):
    *path, last = dotted.split(".")
    for k in path:
        spec = spec[k]
    spec[last] = value


@pytest.mark.parametrize("case", BAD_FIELDS, ids=lambda c: f"{c[0]}{c[1]}.{c[2]}={c[3]!r}")
def test_01_refuses_a_wrong_type_or_range_in_components(case, components, tmp_path):
    c, i, field, value = case
    data = json.loads(json.dumps(components))
    set_field(data["components"][c][i], field, value)
    (tmp_path / "bad.json").write_text(json.dumps(data))
    proc = run_stage("01_harness_space.py", "--run", tmp_path / "out", "--components", tmp_path / "bad.json",
                     check=False)
    one_error(proc, "bad.json", f"component '{c}', realisation {i}", field.split(".")[-2 if "tools" in field else 0])
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", BAD_FIELDS, ids=lambda c: f"{c[0]}{c[1]}.{c[2]}={c[3]!r}")
def test_04_refuses_the_same_values_in_a_harness_file(case, tmp_path):
    c, i, field, value = case
    h = json.loads(json.dumps(H.by_id(H.space_records())["S0-T0-O0-C0-W0"]))
    h["specs"][c] = json.loads(json.dumps(H.components()[c][i]))
    set_field(h["specs"][c], field, value)
    (tmp_path / "h.json").write_text(json.dumps(dict(h, harness_id="X-bad")))
    proc = run_stage("04_rollout.py", "--run", tmp_path, "--eval", "--policy", "oracle", "--harnesses", "X-bad",
                     "--harness-file", tmp_path / "h.json", "--out", tmp_path / "o" / "r.jsonl", check=False)
    one_error(proc, "h.json", f"specs.{c}.{field.split('.')[0]}")
    assert not (tmp_path / "o").exists()


def test_01_refuses_a_lone_surrogate_and_invalid_utf8(components, tmp_path):
    data = json.loads(json.dumps(components))
    data["components"]["S"][1]["template"] += "\ud800"
    (tmp_path / "s.json").write_text(json.dumps(data, indent=1))  # ASCII JSON: the escape \ud800
    proc = run_stage("01_harness_space.py", "--run", tmp_path / "o", "--components", tmp_path / "s.json", check=False)
    one_error(proc, "s.json:", "field 'components.S.1.template'", "surrogate")
    (tmp_path / "u.json").write_bytes(json.dumps(components, indent=1).encode().replace(b"terse", b"te\xffrse"))
    proc = run_stage("01_harness_space.py", "--run", tmp_path / "o", "--components", tmp_path / "u.json", check=False)
    one_error(proc, "u.json:18", "invalid UTF-8")
    assert not (tmp_path / "o").exists()


# ----------------------------------------------------------------------------- invalid UTF-8 / surrogates: 02 03 04
def test_02_03_04_refuse_invalid_utf8_and_surrogates_in_input_files(tmp_path):
    run = tmp_path / "run"
    run_stage("01_harness_space.py", "--run", run)
    space = run / "harness_space.jsonl"
    good = space.read_bytes()
    space.write_bytes(good + b'{"harness_id": "\xff"}\n')
    one_error(run_stage("02_orthogonal_design.py", "--run", run, check=False), "harness_space.jsonl:244",
              "invalid UTF-8")
    space.write_bytes(good)
    run_stage("02_orthogonal_design.py", "--run", run)
    before = tree(run)
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_bytes(b'{"task_id": "a"}\n{"task_id": "b\xc3"}\n')
    one_error(run_stage("03_assignment.py", "--run", run, "--tasks", tasks, check=False), "tasks.jsonl:2",
              "invalid UTF-8")
    tasks.write_text('{"task_id": "a"}\n{"task_id": "b\\ud800"}\n')
    one_error(run_stage("03_assignment.py", "--run", run, "--tasks", tasks, check=False), "tasks.jsonl:2",
              "field 'task_id'", "surrogate")
    t = H.read_tasks("test_tasks.jsonl")[0]
    for text, needles in ((json.dumps(t).encode() + b"\n" + json.dumps(dict(t, task_id="z")).encode()[:-3] + b"\xff\"}\n",
                           ("tasks.jsonl:2", "invalid UTF-8")),
                          ((json.dumps(dict(t, request=t["request"] + "\ud800")) + "\n").encode(),
                           ("tasks.jsonl:1", "field 'request'", "surrogate"))):
        tasks.write_bytes(text)
        proc = run_stage("04_rollout.py", "--run", run, "--eval", "--policy", "oracle", "--harnesses", "base",
                         "--tasks", tasks, "--out", run / "ev" / "r.jsonl", check=False)
        one_error(proc, *needles)
    assert tree(run) == before  # nothing written: no .tmp, no empty folder


# ----------------------------------------------------------------------------- 04: one line per task in an assignment
def test_04_refuses_a_task_assigned_twice(tmp_path):
    tasks = H.read_tasks()[:2]
    run = H.make_run(tmp_path / "run", ["S0-T1-O2-C0-W2", "S0-T2-O2-C1-W1"], {tasks[0]["task_id"]: ["S0-T1-O2-C0-W2"]})
    with open(run / "assignment.jsonl", "a") as f:
        f.write(json.dumps({"task_id": tasks[0]["task_id"], "harness_ids": ["S0-T2-O2-C1-W1"]}) + "\n")
    H.write_jsonl(tmp_path / "tasks.jsonl", tasks)
    before = tree(run)
    proc = run_stage("04_rollout.py", "--run", run, "--iteration", 0, "--policy", "oracle", "--tasks",
                     tmp_path / "tasks.jsonl", check=False)
    one_error(proc, "assignment.jsonl:2", "field 'task_id'", "assigned twice")
    assert tree(run) == before


# ----------------------------------------------------------------------------- 05: what it must refuse
T05 = load_stage("05_train.py")


def rollout(vocab, i, **kw):
    rec = {"episode_id": f"e{i}", "group_id": f"g{i % 2}", "reward": float(i % 2), "temperature": 1.0,
           "policy": "p", "model_turns": [{"prompt_ids": [3, 4, 5], "completion_ids": [6 + i % 5, 7],
                                           "logprobs": [-1.0, -2.0]}]}
    rec.update(kw)
    return rec


CASES_05 = {  # name -> (change to line 2, extra flags, needles)
    "reward_nan": (dict(reward=float("nan")), [], [":2:", "field 'reward'", "finite"]),
    "reward_inf": (dict(reward=float("inf")), [], [":2:", "field 'reward'"]),
    "reward_bool": (dict(reward=True), [], ["field 'reward'"]),
    "temperature_hot": (dict(temperature="hot"), [], ["field 'temperature'", "> 0"]),
    "temperature_negative": (dict(temperature=-1), [], ["field 'temperature'", "> 0"]),
    "temperature_zero": (dict(temperature=0), [], ["field 'temperature'", "greedy"]),
    "logprobs_strings": ("logprobs", [], ["model_turns[0].logprobs", "finite number"]),
    "logprobs_nan": ("logprobs_nan", [], ["model_turns[0].logprobs"]),
    "group_id_list": (dict(group_id=["a"]), [], ["field 'group_id'", "a string"]),
    "duplicate": ("duplicate", [], [":2:", "repeats line 1"]),
    "missing_reward_grpo": ("no_reward", [], ["field 'reward' is missing (needed by --algo grpo)"]),
}


@pytest.mark.parametrize("case", sorted(CASES_05))
def test_05_refuses_bad_rollouts_with_one_line_and_writes_nothing(case, tiny05, tmp_path, capsys):
    change, flags, needles = CASES_05[case]
    recs = [rollout(300, i) for i in range(4)]
    if change == "logprobs":
        recs[1]["model_turns"][0]["logprobs"] = ["-1.0", "-2.0"]
    elif change == "logprobs_nan":
        recs[1]["model_turns"][0]["logprobs"] = [float("nan"), -1.0]
    elif change == "duplicate":
        recs[1] = recs[0]
    elif change == "no_reward":
        del recs[1]["reward"]
    else:
        recs[1].update(change)
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    with pytest.raises(SystemExit) as e:
        T05.main(["--policy", str(tiny05), "--rollouts", str(path), "--out", str(tmp_path / "o" / "policy"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and all(n in err[0] for n in needles), err
    assert "--min-reward" not in err[0] and not (tmp_path / "o").exists()


def test_05_invalid_utf8_and_a_non_finite_policy_are_refused(tiny05, tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_bytes(json.dumps(rollout(300, 0)).encode() + b"\n\xff\n")
    with pytest.raises(SystemExit) as e:
        T05.main(["--policy", str(tiny05), "--rollouts", str(path), "--out", str(tmp_path / "o" / "policy")])
    assert e.value.code == 2 and ":2: invalid UTF-8" in capsys.readouterr().err
    # the last guard: an update that made a weight non-finite is never written (here: a NaN weight by hand)
    import torch
    from transformers import AutoModelForCausalLM
    model = AutoModelForCausalLM.from_pretrained(tiny05)
    with torch.no_grad():
        next(model.parameters())[0, 0] = float("nan")
    with pytest.raises(SystemExit) as e:
        T05.check_finite(model, None, [{"loss": 0.5}])
    assert e.value.code == 2 and "non-finite" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        T05.check_finite(AutoModelForCausalLM.from_pretrained(tiny05), None, [{"loss": float("nan")}])
    T05.check_finite(AutoModelForCausalLM.from_pretrained(tiny05), None, [{"loss": 0.5}])  # finite: no error


# ----------------------------------------------------------------------------- 06
BASE = "S0-T0-O0-C0-W0"


def episode(task, success=True, **kw):
    return dict(task_id=task, harness_id=BASE, success=success, reward=float(success), turns=2, parse_errors=0,
                tool_errors=0, workflow_violations=0, finish_reason="submitted", **kw)


def eval_run(tmp_path, label="mine", policy="/runs/a/policy", **ck):
    run = tmp_path / "run"
    H.write_jsonl(run / "train_harnesses.jsonl", [{"harness_id": BASE}])
    H.write_jsonl(run / "heldout_harnesses.jsonl", [{"harness_id": "S1-T1-O1-C1-W1"}])
    H.write_jsonl(tmp_path / "tasks.jsonl", [{"task_id": t} for t in "ab"])
    H.write_jsonl(run / "eval" / label / "base.jsonl", [episode(t, policy=policy) for t in "ab"])
    if ck is not None:
        (run / "eval" / label / "checkpoint.json").write_text(json.dumps({"policy": policy, "splits": ["base"], **ck}))
    return run


def score06(run, tmp_path, *extra, label="mine"):
    return run_stage("06_evaluate.py", "--run", run, "--label", label, "--no-rollout", "--no-smolagents",
                     "--heldout", 0, "--tasks", tmp_path / "tasks.jsonl", *extra, check=False)


def test_06_no_rollout_refuses_another_policys_episodes(tmp_path):
    run = eval_run(tmp_path)
    assert score06(run, tmp_path).returncode == 0  # its own episodes: scored
    (run / "eval_summary.json").unlink()
    (run / "results.md").unlink()
    (run / "eval" / "mine" / "summary.json").unlink()
    H.write_jsonl(run / "eval" / "mine" / "base.jsonl", [episode(t, policy="/runs/a/untrained_policy") for t in "ab"])
    before = tree(run)
    one_error(score06(run, tmp_path), "base.jsonl", "made by '/runs/a/untrained_policy'", "checkpoint.json")
    (run / "eval" / "mine" / "checkpoint.json").write_text(json.dumps({"policy": "/runs/a/untrained_policy",
                                                                       "splits": ["inspace"]}))
    one_error(score06(run, tmp_path), "base.jsonl is not among the splits")
    assert tree(run) == before  # no summary, results or eval_summary rewritten


def test_06_success_yes_is_one_error(tmp_path):
    run = eval_run(tmp_path)
    H.write_jsonl(run / "eval" / "mine" / "base.jsonl", [episode("a", policy="/runs/a/policy"),
                                                         dict(episode("b", policy="/runs/a/policy"), success="yes")])
    one_error(score06(run, tmp_path), "base.jsonl:2", "field 'success'", "true or false")
    (run / "eval" / "mine" / "base.jsonl").write_bytes(b'{"task_id": "\xff"}\n')
    one_error(score06(run, tmp_path), "base.jsonl:1", "invalid UTF-8")


def test_06_missing_policy_and_empty_tasks_leave_nothing(tmp_path):
    run = eval_run(tmp_path)
    before = tree(run)
    proc = run_stage("06_evaluate.py", "--run", run, "--label", "new", "--policy", "/nope", "--tasks",
                     tmp_path / "tasks.jsonl", check=False)
    one_error(proc, "/nope: policy folder not found")
    (tmp_path / "empty.jsonl").write_text("")
    proc = run_stage("06_evaluate.py", "--run", run, "--label", "new2", "--policy", "oracle", "--tasks",
                     tmp_path / "empty.jsonl", "--max-tasks", 3, check=False)
    one_error(proc, "empty.jsonl: no tasks")
    assert tree(run) == before


# ----------------------------------------------------------------------------- one writer per run folder
def test_a_second_writer_is_told_who_holds_the_lock_and_a_stale_lock_is_taken_over(tmp_path):
    run = tmp_path / "run"
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        run.mkdir()
        (run / "run.lock").write_text(json.dumps({"pid": holder.pid, "command": "01_harness_space.py --run run"}))
        one_error(run_stage("01_harness_space.py", "--run", run, check=False), f"held by pid {holder.pid}",
                  "01_harness_space.py --run run")
        assert tree(run) == ["run.lock"]
        # a child of the holder (the pipeline's stages) may write: the holder's lock is named in its environment
        env = dict(os.environ, HARNESS_SCALING_LOCKS=f"{(run / 'run.lock').resolve()}={holder.pid}")
        proc = subprocess.run([sys.executable, ROOT / "01_harness_space.py", "--run", run], env=env,
                              capture_output=True, text=True)
        assert proc.returncode == 0 and (run / "run.lock").is_file(), proc.stderr  # still the holder's
    finally:
        holder.kill()
        holder.wait()
    run_stage("01_harness_space.py", "--run", run)  # the holder is gone: its lock is stale, taken over, released
    assert not (run / "run.lock").exists() and (run / "harness_space.jsonl").is_file()


SLEEPER = """
import os, signal, sys, time
from pathlib import Path
out = Path(sys.argv[1])
def stop(sig, frame):
    time.sleep(0.5)  # cleaning up: the pipeline must wait for this
    out.with_name("stopped").write_text(signal.Signals(sig).name)
    sys.exit(1)
signal.signal(signal.SIGTERM, stop)
signal.signal(signal.SIGINT, stop)
out.with_name("pid.tmp").write_text(str(os.getpid()))
out.with_name("pid.tmp").rename(out.with_name("pid"))  # whole or absent: the test never reads a half-written file
time.sleep(60)
"""

DRIVER = """
import sys
sys.path[:0] = [sys.argv[1], sys.argv[1] + "/.."]  # tests/ (conftest) and the repository root (common/plumbing.py)
from conftest import load_stage
P = load_stage("pipeline.py")
P.run_stage([sys.executable, sys.argv[2], sys.argv[3]])
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_pipeline_forwards_a_signal_to_its_stage_and_waits(sig, tmp_path):
    (tmp_path / "sleeper.py").write_text(SLEEPER)
    (tmp_path / "driver.py").write_text(DRIVER)
    proc = subprocess.Popen([sys.executable, tmp_path / "driver.py", ROOT / "tests", tmp_path / "sleeper.py",
                             tmp_path / "out"], stderr=subprocess.PIPE, text=True)
    for _ in range(200):
        if (tmp_path / "pid").is_file():
            break
        time.sleep(0.05)
    child = int((tmp_path / "pid").read_text())
    proc.send_signal(sig)  # to the pipeline alone (as `kill PID` does), not to its process group
    assert proc.wait(timeout=20) == 128 + sig
    assert (tmp_path / "stopped").read_text() == signal.Signals(sig).name  # the stage got it and finished first
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)  # no orphan left running
    assert "stopped by" in proc.stderr.read()


@pytest.mark.parametrize("flags,needle,absent", [
    (["--lr", "-1"], "--lr -1.0: must be a finite number > 0", ["--tis-cap", "--vf-lr", "--clip-eps"]),
    (["--lr", "nan"], "--lr nan", ["--tis-cap"]),
    (["--algo", "grpo", "--min-reward", "1"], "--min-reward is for --algo sft only", ["--tis-cap"]),
    (["--algo", "sft", "--tis-cap", "2"], "--tis-cap is for --algo grpo/ppo only", ["--min-reward"]),
    (["--kl-coef", "-0.1"], "--kl-coef -0.1: must be a finite number >= 0", ["--ent-coef", "--vf-coef"]),
    (["--ent-coef", "nan"], "--ent-coef nan: must be a finite number >= 0", ["--kl-coef", "--vf-coef"])])
def test_05_flag_errors_name_only_the_flags_given(flags, needle, absent, tiny05, tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text("".join(json.dumps(rollout(300, i)) + "\n" for i in range(2)))
    with pytest.raises(SystemExit) as e:
        T05.main(["--policy", str(tiny05), "--rollouts", str(path), "--out", str(tmp_path / "o" / "policy"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and needle in err[0] and not any(a in err[0] for a in absent), err
    assert not (tmp_path / "o").exists()
