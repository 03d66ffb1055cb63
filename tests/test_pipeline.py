"""The whole chain, 01 -> 06, through the pipeline's command line on a miniature toy, with an
interruption in the middle: the second call must finish without redoing finished steps."""
import json
from pathlib import Path

import pytest
from conftest import load_stage, run_stage

BASE = "S0-T0-O0-C0-W0"
MINI = ["--max-new-tokens", 48, "--max-train-tasks", 6, "--sft-tasks", 3, "--sft-epochs", 1, "--tiny-size", "1,32,2", "--iterations", 1,
        "--tasks-per-iteration", 3, "--group-size", 2, "--eval-tasks", 3, "--eval-heldout", 2]


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
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
        assert list(s["splits"]) == ["base", "inspace", "smolagents-native", "pydantic-ai", "external", "smolagents"]
        assert s["splits"]["base"]["pairs"] == 3
        assert s["splits"]["inspace"]["pairs"] == 3 * 2
        assert s["splits"]["external"]["pairs"] == 3 * 2  # X-shell and X-react
        for split, name in (("smolagents", "smolagents "), ("smolagents-native", "smolagents "),
                            ("pydantic-ai", "pydantic-ai ")):  # the toy preset's 8 tasks, cut to the 3 evaluated
            assert s["splits"][split]["pairs"] == 3 and s["splits"][split]["framework"].startswith(name)
        assert not any(sp["trained_in"] for sp in s["splits"].values())
        assert not set(s["heldout_ids"]) & {h["harness_id"] for h in train}
    table = (run / "results.md").read_text()
    header = "| policy | Base | In-Space | smolagents 1"
    assert header in table and " native | pydantic-ai 2." in table and "| Unseen syntax: X-react, X-shell |" in table
    for label in summary:
        assert f"| {label} | " in table
    assert header in second.stdout

    # 3) the run folder belongs to its settings: other settings are refused, nothing touched
    third = run_stage("pipeline.py", "--run", run, "--warmstart", ws, *MINI[:-2], "--eval-heldout", 3, check=False)
    assert third.returncode == 2 and "made with other settings" in third.stderr
    assert (run / "results.md").read_text() == table


def test_single_and_blackbox_training_sets(tmp_path):
    """`single`: H_tr = {base}, every other configuration held out, 03 with K = 1 gives every task the base.
    `blackbox-rl` and `blackbox-sft` train inside pydantic-ai: their 02 set is the warm start's (the base and its 10
    one-factor variants, the only configurations of the space they trained on), and no assignment (03) is made."""
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text("".join(json.dumps({"task_id": f"t{i}"}) + "\n" for i in range(5)))
    run = tmp_path / "single"
    out = run_stage("pipeline.py", "--run", run, "--method", "single", "--train-tasks", tasks, "--stop-after", "03")
    assert "stopped after step 03" in out.stdout
    heldout = {h["harness_id"] for h in read_jsonl(run / "heldout_harnesses.jsonl")}
    assert [h["harness_id"] for h in read_jsonl(run / "train_harnesses.jsonl")] == [BASE] and len(heldout) == 242
    assert [a["harness_ids"] for a in read_jsonl(run / "assignment.jsonl")] == [[BASE]] * 5
    for method in ("blackbox-rl", "blackbox-sft"):
        run = tmp_path / method
        run_stage("pipeline.py", "--run", run, "--method", method, "--train-tasks", tasks,
                  "--warmstart", tmp_path / "ws", "--stop-after", "ws-01")
        train = [h["harness_id"] for h in read_jsonl(run / "train_harnesses.jsonl")]
        heldout = {h["harness_id"] for h in read_jsonl(run / "heldout_harnesses.jsonl")}
        one_factor = {BASE} | {BASE.replace(f"{c}0", f"{c}{lv}") for c in "STOCW" for lv in (1, 2)}
        assert set(train) == one_factor and len(train) == 11 and len(heldout) == 243 - 11 and not heldout & set(train)
        assert not (run / "assignment.jsonl").exists()


def test_blackbox_methods_train_and_are_scored_inside_the_frameworks(tmp_path, monkeypatch):
    """The commands the pipeline gives the black-box methods: blackbox-sft's demonstrations are the oracle's inside
    pydantic-ai with the warm start's tokenizer; blackbox-rl makes the same SFT first and starts its RL from it (04
    and 05 of iteration 0 get --policy RUN/sft/policy, later iterations their own chain), its 04 in train mode
    inside pydantic-ai (one process even with --gpus N: the framework runs its episodes in turn; 05 under torchrun
    as for any RL); 06 marks their pydantic-ai column trained in and gets every framework column's task count from
    the preset."""
    pipe = load_stage("pipeline.py")
    steps = []
    kept = []  # the Kept04 each step got (None: a process of its own)
    monkeypatch.setattr(pipe, "step", lambda name, output, cmd, args, log=None, shards=1, kept_04=None:
                        steps.append((name, [str(c) for c in cmd], shards)) or kept.append(kept_04))
    args = pipe.parse_args(["--gpus", "2", "--preset", "small"])
    cfg = dict(pipe.settings(args), iterations=2)
    run, tasks = tmp_path / "run", tmp_path / "t.jsonl"
    assert pipe.train(cfg, args, "blackbox-rl", run, 0, tasks, []) == run / "iter_001" / "policy"
    bb_sft = steps[:2]
    (name, cmd04, shards), (_, cmd05, _), (_, cmd04_1, _), (_, cmd05_1, _) = steps[2:]
    assert name == "04-it0" and shards == 1 and cmd04[:2] == ["04_rollout.py", "--run"]
    assert flag(cmd04, "--policy") == flag(cmd05, "--policy") == str(run / "sft" / "policy")
    assert "--policy" not in cmd04_1 and "--policy" not in cmd05_1  # iteration 1: the policy 05 wrote in 0
    assert flag(cmd04, "--harnesses") == "pydantic-ai" and flag(cmd04, "--iteration") == "0" and "--eval" not in cmd04
    assert flag(cmd04, "--group-size") == "8" and flag(cmd04, "--tasks-per-iteration") == "12"
    assert "torch.distributed.run" in cmd05 and "05_train.py" in cmd05 and flag(cmd05, "--algo") == "grpo"
    assert [n for n, _, _ in steps] == ["04-demos", "05-sft", "04-it0", "05-it0", "04-it1", "05-it1"]
    # both iterations' rollouts from one 04 process (one engine, 04 --until 2), even with --gpus 2
    assert kept[2] is kept[4] and kept[2].until == 2 and [kept[i] for i in (0, 1, 3, 5)] == [None] * 4
    steps.clear()
    assert pipe.train(cfg, args, "blackbox-sft", run, 0, tasks, []) == run / "sft" / "policy"
    assert steps == bb_sft  # the same SFT commands as blackbox-rl's first two steps
    (_, demos, _), (_, sft, _) = steps
    assert flag(demos, "--harnesses") == "pydantic-ai" and flag(demos, "--policy") == "oracle" and "--eval" in demos
    assert flag(demos, "--tokenizer") == str(run / "init_policy") and flag(sft, "--algo") == "sft"
    steps.clear()
    for method in ("blackbox-rl", "harness-scaling"):
        pipe.evaluate(cfg, args, run, method, run / "p", [], trained_in=pipe.trained_inside(method))
    (_, bb, _), (_, hs, _) = steps
    assert flag(bb, "--trained-in") == "X-pydantic-ai" and "--trained-in" not in hs
    # the small preset: the native-call columns on every test task (no count: 06's default, all), smolagents' 8
    assert flag(bb, "--framework-tasks") == flag(hs, "--framework-tasks") == "smolagents=8"
    args = pipe.parse_args(["--framework-tasks", "2,smolagents=0"])
    assert pipe.settings(args)["framework_tasks"] == {"smolagents-native": 2, "pydantic-ai": 2, "smolagents": 0}
    bad = run_stage("pipeline.py", "--run", tmp_path / "r", "--framework-tasks", "native=2", check=False)
    assert bad.returncode == 2 and "--framework-tasks 'native=2': item 'native=2'" in bad.stderr
    assert not (tmp_path / "r").exists()


def test_blackbox_rl_takes_blackbox_sfts_sft(tmp_path, monkeypatch):
    """In one experiment, blackbox-rl's first two steps are blackbox-sft's commands (same warm start, demonstrations,
    seed): where blackbox-sft's run has made its sft/policy, blackbox-rl copies its sft/ folder and those two steps'
    wall times (its record counts them) and starts RL from the copy; where it has not, blackbox-rl makes its own."""
    pipe = load_stage("pipeline.py")
    steps = []  # the steps that would run: as step() does, one whose output exists is done already
    monkeypatch.setattr(pipe, "step", lambda name, output, cmd, args, log=None, shards=1, kept_04=None:
                        None if Path(output).exists() else steps.append(name))
    args = pipe.parse_args(["--preset", "small"])
    cfg = dict(pipe.settings(args), iterations=1)
    src, run, tasks = tmp_path / "blackbox-sft", tmp_path / "blackbox-rl", tmp_path / "t.jsonl"
    (src / "sft" / "policy").mkdir(parents=True)
    (src / "sft" / "policy" / "model.safetensors").write_bytes(b"weights")
    (src / "sft" / "demos.jsonl").write_text("{}\n")
    (src / "step_times.json").write_text(json.dumps({"01": 0.1, "04-demos": 7.2, "05-sft": 3616.4, "06-x": 9.0}))
    run.mkdir()
    (run / "step_times.json").write_text(json.dumps({"01": 0.2}))
    pipe.train(cfg, args, "blackbox-rl", run, 0, tasks, [], sft_from=src)
    assert steps == ["04-it0", "05-it0"]  # no SFT made again: the step found blackbox-sft's
    assert (run / "sft" / "policy" / "model.safetensors").read_bytes() == b"weights"
    assert (run / "sft" / "demos.jsonl").read_text() == "{}\n"
    assert json.loads((run / "step_times.json").read_text()) == {"01": 0.2, "04-demos": 7.2, "05-sft": 3616.4}
    steps.clear()
    other = tmp_path / "blackbox-rl-2"  # blackbox-sft's SFT not made (yet): blackbox-rl makes its own
    pipe.train(cfg, args, "blackbox-rl", other, 0, tasks, [], sft_from=tmp_path / "missing")
    assert steps == ["04-demos", "05-sft", "04-it0", "05-it0"] and not (other / "sft").exists()


def flag(cmd, name):
    return cmd[cmd.index(name) + 1] if name in cmd else None


def test_bad_flags_leave_no_folder_and_paths_are_relative_to_the_caller(tmp_path):
    bad = run_stage("pipeline.py", "--run", tmp_path / "r", "--tiny-size", "2,128", check=False)
    assert bad.returncode == 2 and "--tiny-size '2,128': expected LAYERS,DIM,HEADS" in bad.stderr
    assert "Traceback" not in bad.stderr and not (tmp_path / "r").exists()
    bad = run_stage("pipeline.py", "--run", tmp_path / "r", "--seeds", "0,1", check=False)
    assert bad.returncode == 2 and "--seeds is for --experiment" in bad.stderr and not (tmp_path / "r").exists()
    bad = run_stage("pipeline.py", "--experiment", "main", "--run", tmp_path / "r", "--eval-heldout", 3, check=False)
    assert bad.returncode == 2 and "--eval-heldout 3: an experiment's In-Space set is half" in bad.stderr
    assert not (tmp_path / "r").exists()  # refused before the warm start, not at 02 an hour later
    # relative paths are the caller's, and the warm-start cache is keyed by its settings
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    run_stage("pipeline.py", "--run", "r1", "--stop-after", "ws-01", cwd=cwd)
    run_stage("pipeline.py", "--run", "r2", "--sft-epochs", 2, "--stop-after", "ws-01", cwd=cwd)
    assert (cwd / "r1" / "pipeline_config.json").is_file() and (cwd / "r2" / "pipeline_config.json").is_file()
    caches = sorted((cwd / "runs").glob("toy-warmstart-*"))
    assert len(caches) == 2, caches  # other SFT epochs, another warm start
    configs = [json.loads((c / "warmstart_config.json").read_text()) for c in caches]
    assert sorted(c["sft_epochs"] for c in configs) == [2, load_stage("pipeline.py").PRESETS["toy"]["sft_epochs"]]


def test_the_experiments_evaluation_set_is_stratified_by_distance_to_the_oa(tmp_path):
    """An experiment's In-Space set (small preset: 12 configurations) is 02 --eval-set's draw at its own seed 0: 6 at
    Hamming distance 1 from the OA, 6 at distance 2 (counted here), outside the OA, the warm start's set and
    random18's draws at seeds 0-2. Every preset's set is even (the two strata) and at least 12."""
    pipe = load_stage("pipeline.py")
    assert all(p["eval_heldout"] % 2 == 0 and p["eval_heldout"] >= 12 for p in pipe.PRESETS.values())
    args = pipe.parse_args(["--experiment", "main", "--preset", "small"])
    cfg = pipe.settings(args)
    assert cfg["eval_heldout"] == 12
    assert cfg["framework_tasks"] == {"smolagents-native": None, "pydantic-ai": None, "smolagents": 8}
    exp, ref = tmp_path / "exp", tmp_path / "exp" / "warm-start"
    run_stage("01_harness_space.py", "--run", ref)
    run_stage("02_orthogonal_design.py", "--run", ref, "--method", "one-factor")
    eval_set = pipe.evaluation_set(cfg, args, exp, {}, ref, tmp_path / "ledger")
    ids = {h["harness_id"] for h in read_jsonl(eval_set)}
    config = json.loads((exp / "eval_harnesses_config.json").read_text())
    assert len(ids) == 12 and config["seed"] == 0
    space = read_jsonl(ref / "harness_space.jsonl")
    levels = {h["harness_id"]: list(h["levels"].values()) for h in space}
    oa = [levels[h["harness_id"]] for h in read_jsonl(exp / "spare" / "oa" / "train_harnesses.jsonl")]
    distance = {h: min(sum(a != b for a, b in zip(levels[h], row)) for row in oa) for h in ids}
    assert sorted(distance.values()) == [1] * 6 + [2] * 6
    left_out = [exp / "spare" / "oa", ref, *(exp / "spare" / f"random18-seed{s}" for s in range(3))]
    for run in left_out:
        assert not ids & {h["harness_id"] for h in read_jsonl(run / "train_harnesses.jsonl")}, run


def test_the_k_experiment_gives_k5_all_five_harnesses_of_a_task(tmp_path):
    """The k experiment's task split is I x B / 5 tasks (the largest K of its methods): visited 5 times, a task of
    k5 runs under all 5 harnesses of its group. With the preset's I x B / 3 every task was visited 3 times and k5
    ran exactly the (task, harness) pairs of K = 3 (its first 3 nearest harnesses are K = 3's): the same run."""
    pipe, rollout = load_stage("pipeline.py"), load_stage("04_rollout.py")
    cfg = pipe.settings(pipe.parse_args(["--experiment", "k"]))
    iters, size = cfg["iterations"], cfg["tasks_per_iteration"]
    assert cfg["max_train_tasks"] == iters * size // 5
    assert pipe.settings(pipe.parse_args(["--experiment", "main"]))["max_train_tasks"] == iters * size // 3
    assert pipe.settings(pipe.parse_args(["--method", "single"]))["max_train_tasks"] == iters * size // 3

    tasks = tmp_path / "tasks.jsonl"  # the experiment's split: the first max_train_tasks training tasks
    tasks.write_text("".join((pipe.HERE / "data" / "train_tasks.jsonl").read_text().splitlines(True)
                             [:cfg["max_train_tasks"]]))
    pairs = {}
    for k in (3, 5):  # 01 -> 03 as the pipeline runs them, then 04's rule for which harness each visit runs
        run = tmp_path / f"k{k}"
        run_stage("01_harness_space.py", "--run", run)
        run_stage("02_orthogonal_design.py", "--run", run, "--method", "oa")
        run_stage("03_assignment.py", "--run", run, "--tasks", tasks, "--k", k, "--method", "locality")
        groups = {r["task_id"]: r["harness_ids"] for r in read_jsonl(run / "assignment.jsonl")}
        pairs[k] = {(tid, hid) for t in range(iters) for tid, hid, _ in rollout.batch_harnesses(groups, t, size, 0)}
        seen = {tid: {hid for x, hid in pairs[k] if x == tid} for tid in groups}
        saw_all = sum(len(hs) == k for hs in seen.values())
        assert saw_all >= 0.7 * len(groups), (k, saw_all, len(groups))
    assert pairs[5] != pairs[3] and len(pairs[5]) > len(pairs[3])
