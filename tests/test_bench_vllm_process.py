"""experiments/bench/bench_vllm_process.py without an engine: the trials alternate the two settings, each in a process
of its own whose environment asks vLLM for its processes or not, the trial's line is found among vLLM's log lines, and
the report's medians and ratios equal numbers computed here."""
import json
import sys
import types

from conftest import ROOT, load_stage

sys.path.insert(0, str(ROOT / "experiments" / "bench"))
B = load_stage("experiments/bench/bench_vllm_process.py")

# (start, five rounds) per trial, in the order they run: in-process, three processes, in-process, three processes
SECONDS = [(3.0, [5.0, 5.0, 4.0, 4.0, 4.0]), (17.0, [6.0, 6.0, 5.0, 5.0, 4.0]),
           (4.0, [6.0, 5.0, 5.0, 5.0, 5.0]), (19.0, [7.0, 6.0, 6.0, 5.0, 5.0])]


def test_trials_alternate_settings_and_the_report_has_the_medians(monkeypatch, tmp_path):
    calls, real_run = [], B.subprocess.run

    def fake_run(cmd, env=None, **kw):  # platform.processor() runs `uname -p` through subprocess.run too
        if "--trial" not in cmd:
            return real_run(cmd, env=env, **kw)
        calls.append(env.get("VLLM_ENABLE_V1_MULTIPROCESSING"))
        start, rounds = SECONDS[len(calls) - 1]
        out = "INFO vLLM says something\n" + B.MARK + json.dumps({"start": start, "rounds": rounds, "tokens": 100})
        return types.SimpleNamespace(returncode=0, stdout=out + "\nINFO shutdown\n", stderr="")

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")  # the shell's setting must not reach a trial
    monkeypatch.setattr(B.subprocess, "run", fake_run)
    out = tmp_path / "r.md"
    B.main(B.parse_args(["--run", "RUN", "--repeat", "2", "--out", str(out)]))
    assert calls == ["0", "1", "0", "1"]  # in-process, then vLLM's processes, whatever this shell had set
    text = out.read_text()
    assert "| 1 | in-process | 3.0 | 22.0 | 100 |" in text and "| 4 | three processes | 19.0 | 29.0 | 100 |" in text
    # medians of two: in-process start (3 + 4) / 2, rounds (22 + 26) / 2; three processes (17 + 19) / 2, (26 + 29) / 2
    assert f"engine start 3.5 / 18.0 s ({3.5 / 18.0:.2f}x)" in text
    assert f"five rounds 24.0 / 27.5 s ({24.0 / 27.5:.2f}x)" in text


def test_a_failed_trial_stops_the_bench_with_its_error(monkeypatch):
    monkeypatch.setattr(B.subprocess, "run", lambda *a, **k: types.SimpleNamespace(returncode=1, stdout="",
                                                                                   stderr="no policy here"))
    try:
        B.main(B.parse_args(["--run", "RUN", "--repeat", "1"]))
    except SystemExit as e:
        assert "in-process trial failed" in str(e) and "no policy here" in str(e)
    else:
        raise AssertionError("the bench went on after a failed trial")
