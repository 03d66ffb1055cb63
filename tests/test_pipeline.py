"""The whole chain, 01 -> 06, through the pipeline's command line on a miniature toy, with an
interruption in the middle: the second call must finish without redoing finished steps."""
import json

from conftest import run_stage

MINI = ["--max-train-tasks", 6, "--sft-tasks", 3, "--sft-epochs", 1, "--tiny-size", "1,32,2", "--iterations", 1,
        "--tasks-per-iteration", 3, "--group-size", 2, "--eval-tasks", 3, "--eval-heldout", 2]


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_pipeline_end_to_end_with_interruption(tmp_path):
    run, ws = tmp_path / "run", tmp_path / "ws"
    args = ["--run", run, "--warmstart", ws, *MINI]

    # 1) interrupted right after the first rollout stage
    first = run_stage("pipeline.py", *args, "--stop-after", "04-it0")
    assert "stopped after step 04-it0" in first.stdout
    rollouts = run / "iter_000" / "rollouts.jsonl"
    assert rollouts.is_file() and not (run / "iter_000" / "policy").exists()
    finished = {p: p.stat().st_mtime_ns for p in [run / "harness_space.jsonl", run / "train_harnesses.jsonl",
                                                  run / "assignment.jsonl", rollouts, ws / "policy" / "config.json"]}
    # a half-written checkpoint of the interrupted update must not be trusted
    (run / "iter_000" / "policy.tmp").mkdir()
    (run / "iter_000" / "policy.tmp" / "config.json").write_text("{half")

    # 2) the same command continues and finishes
    second = run_stage("pipeline.py", *args)
    for name in ("01", "02", "03", "ws-sft", "04-it0"):
        assert f"[pipeline] {name}: done already" in second.stdout
    assert "[pipeline] 05-it0: python 05_train.py" in second.stdout
    assert all(p.stat().st_mtime_ns == t for p, t in finished.items()), "a finished step was redone"

    # every stage's output is there and well formed
    space = read_jsonl(run / "harness_space.jsonl")
    train = read_jsonl(run / "train_harnesses.jsonl")
    heldout = read_jsonl(run / "heldout_harnesses.jsonl")
    assert len(space) == 243 and len(train) == 18 and len(heldout) == 225
    assign = read_jsonl(run / "assignment.jsonl")
    assert len(assign) == 6 and all(len(a["harness_ids"]) == 3 for a in assign)
    eps = read_jsonl(rollouts)
    assert len(eps) == 3 * 2  # tasks-per-iteration x group size
    for e in eps:
        assert e["model_turns"] and all(t["prompt_ids"] and t["completion_ids"] for t in e["model_turns"])
        assert e["harness_id"] in {a["harness_ids"][0] for a in assign if a["task_id"] == e["task_id"]}
    assert (run / "iter_000" / "policy" / "config.json").is_file()
    log = read_jsonl(run / "iter_000" / "train_log.jsonl")
    assert log and all("loss" in row for row in log)
    summary = json.loads((run / "eval_summary.json").read_text())
    assert list(summary) == ["untrained", "warm-start", "harness-scaling"]
    for label, s in summary.items():
        assert set(s["splits"]) == {"base", "inspace", "external", "smolagents"}
        assert s["splits"]["base"]["pairs"] == 3
        assert s["splits"]["inspace"]["pairs"] == 3 * 2
        assert s["splits"]["external"]["pairs"] == 3 * 2  # X-shell and X-react
        assert s["splits"]["smolagents"]["pairs"] == 3 and s["splits"]["smolagents"]["framework"].startswith(
            "smolagents ")
        assert not set(s["heldout_ids"]) & {h["harness_id"] for h in train}
    table = (run / "results.md").read_text()
    assert "| policy | Base | In-Space | Out-of-Space | smolagents " in table
    for label in summary:
        assert f"| {label} | " in table
    assert "| policy | Base | In-Space | Out-of-Space | smolagents " in second.stdout

    # 3) the run folder belongs to its settings: other settings are refused, nothing touched
    third = run_stage("pipeline.py", "--run", run, "--warmstart", ws, *MINI[:-2], "--eval-heldout", 3, check=False)
    assert third.returncode == 2 and "made with other settings" in third.stderr
    assert (run / "results.md").read_text() == table


def test_single_harness_baseline_sets(tmp_path):
    """The `single` method: H_tr = {base}, everything else held out, and 03 with K = 1 gives every task the base."""
    from conftest import load_stage
    pipe = load_stage("pipeline.py")
    run = tmp_path / "run"
    run_stage("01_harness_space.py", "--run", run)
    pipe.single_harness_sets(run)
    train = read_jsonl(run / "train_harnesses.jsonl")
    heldout = read_jsonl(run / "heldout_harnesses.jsonl")
    assert [h["harness_id"] for h in train] == ["S0-T0-O0-C0-W0"]
    assert len(heldout) == 242 and "S0-T0-O0-C0-W0" not in {h["harness_id"] for h in heldout}
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"t{i}"}) + "\n" for i in range(5)))
    run_stage("03_assignment.py", "--run", run, "--tasks", tasks, "--k", 1)
    assert [a["harness_ids"] for a in read_jsonl(run / "assignment.jsonl")] == [["S0-T0-O0-C0-W0"]] * 5
