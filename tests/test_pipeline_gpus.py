"""pipeline.py --gpus N, without GPUs: the commands it builds (04 as N shard processes, one per GPU; 05 under
torchrun) and the concatenation of the shard files, against --gpus 1 (the default, unchanged)."""
import types

from conftest import load_stage

pipe = load_stage("pipeline.py")


def drive(tmp_path, monkeypatch, gpus, *flags):
    """One RL iteration of pipeline.train with the stage processes replaced by recorders (each 04 shard writes
    a file whose lines name the shard, i + 1 lines for shard i)."""
    run = tmp_path / f"run{gpus}{''.join(flags)}"
    (run / "iter_000").mkdir(parents=True)
    popens, runs = [], []

    class FakePopen:
        def __init__(self, cmd, cwd, env=None, start_new_session=False):
            if "--shard" not in cmd:  # a stage run by run_stage, or the one 04 process (Kept04): in `runs`
                runs.append(cmd)
                if "04_rollout.py" in cmd:
                    (run / "iter_000" / "rollouts.jsonl").write_text('{"shard": null}\n')
                return
            popens.append((cmd, env["CUDA_VISIBLE_DEVICES"]))
            i, n = cmd[cmd.index("--shard") + 1].split("/")
            lines = "".join(f'{{"shard": {i}, "k": {k}}}\n' for k in range(int(i) + 1))
            (run / "iter_000" / f"rollouts.shard-{i}-of-{n}.jsonl").write_text(lines)

        def wait(self):
            return 0

        poll = wait

    def fake_run(cmd, cwd):
        runs.append(cmd)
        return types.SimpleNamespace(returncode=0)

    monkeypatch.setattr(pipe.subprocess, "Popen", FakePopen)
    monkeypatch.setattr(pipe.subprocess, "run", fake_run)
    cfg = dict(pipe.PRESETS["toy"], iterations=1)
    pipe.train(cfg, pipe.parse_args(["--gpus", str(gpus), *flags]), "harness-scaling", run, 0, tmp_path / "t.jsonl", [])
    return run, popens, runs


def test_gpus_n_shards_04_and_runs_05_under_torchrun(tmp_path, monkeypatch):
    run1, popens1, runs1 = drive(tmp_path, monkeypatch, 1)
    run3, popens3, runs3 = drive(tmp_path, monkeypatch, 3)
    py = pipe.PY
    # --gpus 1: one 04 process for every iteration (--until: one engine), then `python 05_train.py`
    assert popens1 == [] and len(runs1) == 2
    cmd04, cmd05 = runs1
    assert cmd04[:2] == [py, "04_rollout.py"] and "--shard" not in cmd04 and cmd05[:2] == [py, "05_train.py"]
    assert cmd04[-2:] == ["--until", "1"]
    # --gpus 3: shard i of 3 on GPU i, a process per iteration, otherwise the same command
    assert [gpu for _, gpu in popens3] == ["0", "1", "2"]
    for i, (cmd, _) in enumerate(popens3):
        assert cmd == [py, *[str(c).replace("run1", "run3") for c in cmd04[1:-2]], "--shard", f"{i}/3"]
    # the shard files concatenated in shard order, then removed
    rows = (run3 / "iter_000" / "rollouts.jsonl").read_text().splitlines()
    assert rows == [f'{{"shard": {i}, "k": {k}}}' for i in range(3) for k in range(i + 1)]
    assert not list((run3 / "iter_000").glob("*.shard-*"))
    # 05: torchrun with one process per GPU, the same arguments
    (cmd05_3,) = runs3
    assert cmd05_3[:8] == [py, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "3", "--",
                           "05_train.py"]
    assert [str(c).replace("run3", "run1") for c in cmd05_3[8:]] == [str(c) for c in cmd05[2:]]


def test_a_failed_shard_stops_the_pipeline(tmp_path, monkeypatch):
    class FailingPopen:
        def __init__(self, cmd, cwd, env, start_new_session=False):
            self.code = 1 if cmd[-1] == "1/2" else 0

        def wait(self):
            return self.code

    monkeypatch.setattr(pipe.subprocess, "Popen", FailingPopen)
    (tmp_path / "iter_000").mkdir()
    try:
        pipe.train(dict(pipe.PRESETS["toy"], iterations=1), pipe.parse_args(["--gpus", "2"]), "harness-scaling",
                   tmp_path, 0, tmp_path / "t.jsonl", [])
        raise AssertionError("expected SystemExit")
    except SystemExit as e:
        assert e.code == 1
    assert not (tmp_path / "iter_000" / "rollouts.jsonl").exists()


def test_fsdp_is_passed_to_05_under_torchrun(tmp_path, monkeypatch, capsys):
    _, _, (cmd04, cmd05) = drive(tmp_path, monkeypatch, 1)
    _, _, (cmd05_fsdp,) = drive(tmp_path, monkeypatch, 2, "--fsdp")
    assert cmd05_fsdp[:9] == [pipe.PY, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", "--",
                              "05_train.py", "--fsdp"]
    assert [str(c).replace("run2--fsdp", "run1") for c in cmd05_fsdp[9:]] == [str(c) for c in cmd05[2:]]
    # one GPU holds the whole model: --fsdp without --gpus N > 1 is refused before anything runs
    try:
        pipe.main(["--fsdp", "--run", str(tmp_path / "never")])
        raise AssertionError("expected SystemExit")
    except SystemExit as e:
        assert e.code == 2
    assert "--fsdp" in capsys.readouterr().err and not (tmp_path / "never").exists()


def test_05_gets_the_presets_update_flags(tmp_path, monkeypatch, capsys):
    """The RL update's flags come from the preset and the command line: --lr, --ppo-epochs, --amp (small: bf16 on
    the CPU) and, for the gpu preset, --micro-batch-tokens (the bound its memory estimate assumes)."""
    cases = (("toy", ["--lr", "1e-4", "--ppo-epochs", "1"], {"--lr": "0.0001", "--epochs": "1", "--amp": "auto"}),
             ("small", [], {"--lr": "1e-05", "--epochs": "1", "--amp": "bf16"}),
             ("gpu", [], {"--micro-batch-tokens": "32768", "--amp": "auto", "--lr": "1e-06"}))
    for preset, flags, expect in cases:
        runs = []

        class Recorder:  # run_stage's process, or 04 (Kept04, which writes the rollouts): recorded, exits 0
            def __init__(self, cmd, cwd, env=None, start_new_session=False):
                runs.append(cmd)
                if "04_rollout.py" in cmd:
                    (run / "iter_000" / "rollouts.jsonl").write_text("{}\n")

            def wait(self):
                return 0

            poll = wait

        monkeypatch.setattr(pipe.subprocess, "Popen", Recorder)
        args = pipe.parse_args(["--preset", preset, *flags])
        run = tmp_path / preset
        (run / "iter_000").mkdir(parents=True)
        pipe.train(dict(pipe.settings(args), iterations=1), args, "harness-scaling", run, 0, tmp_path / "t.jsonl", [])
        cmd05 = [str(c) for c in runs[-1]]
        assert cmd05[1] == "05_train.py"
        for flag, value in expect.items():
            assert cmd05[cmd05.index(flag) + 1] == value, (preset, flag, cmd05)
        assert ("--micro-batch-tokens" in cmd05) == (preset == "gpu")
    for bad in (["--lr", "0"], ["--lr", "nan"], ["--ppo-epochs", "0"]):
        try:
            pipe.settings(pipe.parse_args(bad))
            raise AssertionError(f"{bad} accepted")
        except SystemExit as e:
            assert e.code == 2 and bad[0] in capsys.readouterr().err


def test_an_experiment_on_the_small_preset_runs_the_chosen_budget():
    """--experiment on the small preset takes the budget study's sizes (16 iterations, every one of the 120 test
    tasks); one run of the preset keeps its quick sizes, other presets are unchanged, and a flag still wins."""
    size = lambda *flags: {k: pipe.settings(pipe.parse_args(list(flags)))[k] for k in ("iterations", "eval_tasks")}
    assert size("--preset", "small", "--experiment", "main") == {"iterations": 16, "eval_tasks": 120}
    assert size("--preset", "small", "--experiment", "k") == {"iterations": 16, "eval_tasks": 120}
    assert size("--preset", "small") == {"iterations": 6, "eval_tasks": 24}
    assert size("--preset", "small", "--experiment", "main", "--iterations", "12", "--eval-tasks", "96") == \
        {"iterations": 12, "eval_tasks": 96}
    assert size("--experiment", "main") == size() == {"iterations": 6, "eval_tasks": 40}  # toy
    assert sum(1 for _ in open(pipe.HERE / "data" / "test_tasks.jsonl")) == 120  # "every test task"
