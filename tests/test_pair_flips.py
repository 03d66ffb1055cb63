"""experiments/bench/pair_flips.py through its CLI: episode-level differences between two evaluations, counted per
split."""
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def write_eval(folder, episodes):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"splits": {"inspace": {}}}))
    (folder / "inspace.jsonl").write_text("".join(json.dumps(e) + "\n" for e in episodes))


def episode(task, success, finish="submitted", turns=2):
    return {"task_id": task, "harness_id": "S0-T0-O0-C1-W1", "sample_index": 0, "success": success,
            "finish_reason": finish, "turns": turns}


def run(a, b):
    return subprocess.run([sys.executable, str(ROOT / "experiments" / "bench" / "pair_flips.py"), str(a), str(b)],
                          capture_output=True, text=True)


def test_counts_ends_and_success_flips(tmp_path):
    write_eval(tmp_path / "a", [episode("t1", True), episode("t2", False), episode("t3", False, "turn_budget", 5)])
    # t1 flips success (same end, same turns); t2 ends after another number of turns, same success; t3 the same
    write_eval(tmp_path / "b", [episode("t1", False), episode("t2", False, turns=3), episode("t3", False, "turn_budget", 5)])
    out = run(tmp_path / "a", tmp_path / "b")
    assert out.returncode == 0, out.stderr
    assert "| inspace | 3 | 1 | 1 |" in out.stdout


def test_other_episodes_are_refused(tmp_path):
    write_eval(tmp_path / "a", [episode("t1", True)])
    write_eval(tmp_path / "b", [episode("t2", True)])
    out = run(tmp_path / "a", tmp_path / "b")
    assert out.returncode == 2 and "other (task, harness, sample) episodes" in out.stderr


def test_a_bad_line_names_file_and_line(tmp_path):
    write_eval(tmp_path / "a", [episode("t1", True)])
    write_eval(tmp_path / "b", [episode("t1", True)])
    (tmp_path / "b" / "inspace.jsonl").write_text('{"task_id": "t1"}\n')  # fields missing
    out = run(tmp_path / "a", tmp_path / "b")
    assert out.returncode == 2 and "inspace.jsonl:1" in out.stderr
