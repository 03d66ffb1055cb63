"""experiments/ledger.py and experiments/compare.py --ledger: records written from hand-made run folders, tables built
from the records alone (seeds as replicates, checked against an independent computation), byte-for-byte regeneration,
and the refusals: a record or a run of other common ground, named by its field."""
import json
import shutil

import pytest

from conftest import ROOT, load_stage, run_stage
from test_compare import BASE, make_evaldir, per_task_values

ledger_mod = load_stage("experiments/ledger.py")
TASKS = [f"t{i}" for i in range(10)]
GROUND = {"preset": "toy", "budget": {"lr": 0.001, "iterations": 3}, "warm_start": {"sha256": "ab", "probe": []},
          "eval_set": ["S1-T1-O1-C1-W1", "S2-T2-O2-C2-W2"], "train_tasks": "x", "test_tasks": "y",
          "versions": {"torch": "2"}}


def method_run(root, name, seed, train=(BASE,)):
    """A run folder as the pipeline leaves it: eval/<label>/ (06), train_harnesses.jsonl (02), step_times.json,
    one iteration's rollouts and training log (04, 05)."""
    run = root / f"{name}-seed{seed}"
    make_evaldir(root, run.name, name, tasks=TASKS, train=train, seed=seed)
    (run / "train_harnesses.jsonl").write_text("".join(json.dumps({"harness_id": h, "levels": {}}) + "\n"
                                                       for h in train))
    (run / "step_times.json").write_text(json.dumps({"04-it0": 10.0, "05-it0": 5.0, f"06-{name}": 7.5}))
    (run / "iter_000").mkdir()
    (run / "iter_000" / "rollouts.jsonl").write_text(json.dumps({"task_id": "t0", "harness_id": BASE}) + "\n")
    (run / "iter_000" / "train_log.jsonl").write_text(json.dumps(
        {"reward_mean": 0.25, "zero_var_group_share": 0.5, "optimizer_step": True, "approx_kl": 0.01,
         "clip_frac": 0.02}) + "\n")
    return run


def write(tmp_path, run, method, seed, ledger, ground=GROUND, check=True):
    (tmp_path / "run-ground.json").write_text(json.dumps(ground))
    return run_stage("experiments/ledger.py", "write", "--run", run, "--label", method, "--method", method, "--seed", seed,
                     "--ground", tmp_path / "run-ground.json", "--ledger", ledger, "--command", "python pipeline.py x",
                     check=check)


@pytest.fixture
def ledger(tmp_path):
    ledger = tmp_path / "ledger"
    for method, seed in (("harness-scaling", 0), ("harness-scaling", 1), ("single", 0)):
        train = ("S0-T1-O2-C0-W1", "S1-T0-O2-C1-W0") if method == "harness-scaling" else (BASE,)
        write(tmp_path, method_run(tmp_path / "runs", method, seed, train), method, seed, ledger)
    return ledger


def test_a_record_keeps_outcomes_compute_and_ground_without_paths_or_transcripts(tmp_path, ledger):
    rec = ledger / "harness-scaling" / "seed1"
    record = json.loads((rec / "record.json").read_text())
    assert record["method"] == "harness-scaling" and record["seed"] == 1 and record["ground"] == GROUND
    assert record["compute"]["rollout_episodes"] == 1 and record["compute"]["train_s"] == 15.0
    assert record["compute"]["eval_s"] == 7.5 and record["made"]["wall_s"] == 22.5
    assert record["training_signal"] == [{"iteration": 0, "reward_mean": 0.25, "groups_with_signal": 0.5,
                                          "optimizer_steps": 1, "approx_kl_max": 0.01, "clip_frac_max": 0.02}]
    src = tmp_path / "runs" / "harness-scaling-seed1" / "eval" / "harness-scaling"
    for split in ("base", "inspace", "external"):  # every episode, only the outcome fields
        kept = [json.loads(x) for x in (rec / "eval" / f"{split}.jsonl").read_text().splitlines()]
        full = [json.loads(x) for x in (src / f"{split}.jsonl").read_text().splitlines()]
        assert kept == [{k: e.get(k) for k in ledger_mod.EPISODE_FIELDS} for e in full]
    assert [json.loads(x)["harness_id"] for x in (rec / "train_harnesses.jsonl").read_text().splitlines()] == \
        ["S0-T1-O2-C0-W1", "S1-T0-O2-C1-W0"]
    text = "".join(p.read_text() for p in ledger.rglob("*") if p.is_file())
    assert str(tmp_path) not in text and "/runs/" not in text  # no absolute path, no run folder named
    assert json.loads((ledger / "ground.json").read_text()) == GROUND  # the first record fixed the ground


def test_tables_from_records_alone_average_seeds_and_regenerate_byte_for_byte(tmp_path, ledger):
    src = {m: [tmp_path / "runs" / f"{m}-seed{s}" / "eval" / m for s in seeds]
           for m, seeds in (("harness-scaling", (0, 1)), ("single", (0,)))}
    # independently, from the run folders: a task's pass@1 is the mean over its episodes, then over seeds
    want = {(m, split): per_task_values(dirs, split) for m, dirs in src.items() for split in ("base", "inspace")}
    shutil.rmtree(tmp_path / "runs")  # the run folders are gone: the records alone make the table
    out = tmp_path / "tables"
    run_stage("experiments/compare.py", "--ledger", ledger, "--out", out / "a", "--bootstrap", 300)
    report = json.loads((out / "a-main.json").read_text())
    assert [r["name"] for r in report["rows"]] == ["harness-scaling", "single"]
    hs, single = report["rows"]
    assert hs["evaldirs"] == ["harness-scaling/seed0/eval", "harness-scaling/seed1/eval"]  # relative to the ledger
    for split in ("base", "inspace"):
        a, b = want[("harness-scaling", split)], want[("single", split)]
        assert hs["splits"][split]["pass@1"] == pytest.approx(sum(a.values()) / len(a))
        assert single["splits"][split]["diff_vs_reference"] == pytest.approx(sum(b[t] - a[t] for t in TASKS) / 10)
    md = (out / "a-main.md").read_text()
    assert "| harness-scaling (seeds 0, 1) |" in md and "| single (seed 0) |" in md  # every row's seeds
    assert "## How each record was made" in md
    assert set(report["compute"]) == {"harness-scaling (seed 0)", "harness-scaling (seed 1)", "single (seed 0)"}
    assert not (out / "a-selection.md").exists()  # no random18 record yet: no selection table
    run_stage("experiments/compare.py", "--ledger", ledger, "--out", out / "b", "--bootstrap", 300)
    for name in ("main.md", "main.json"):
        assert (out / f"a-{name}").read_bytes() == (out / f"b-{name}").read_bytes()
    # a folder of ledgers: each one's tables under its name
    run_stage("experiments/compare.py", "--ledger", tmp_path, "--out", out / "all", "--bootstrap", 300)
    assert (out / "all" / "ledger-main.json").read_bytes() == (out / "a-main.json").read_bytes()


def test_a_ppo_record_joins_the_main_table_against_grpo_harness_scaling(tmp_path, ledger):
    """05 --algo ppo logs no GRPO groups (no zero_var_group_share): its record still writes (groups None), and the
    main table gets its row with the paired difference to harness-scaling, the ppo table its own reference."""
    run = method_run(tmp_path / "runs", "harness-scaling+ppo", 0)
    (run / "iter_000" / "train_log.jsonl").write_text(json.dumps(
        {"reward_mean": 0.125, "value_loss": 0.04, "optimizer_step": True, "approx_kl": 0.001,
         "clip_frac": 0.003}) + "\n")
    write(tmp_path, run, "harness-scaling+ppo", 0, ledger)
    record = json.loads((ledger / "harness-scaling+ppo" / "seed0" / "record.json").read_text())
    assert record["training_signal"] == [{"iteration": 0, "reward_mean": 0.125, "groups_with_signal": None,
                                          "optimizer_steps": 1, "approx_kl_max": 0.001, "clip_frac_max": 0.003}]
    want = {m: per_task_values([tmp_path / "runs" / f"{m}-seed{s}" / "eval" / m for s in seeds], "inspace")
            for m, seeds in (("harness-scaling", (0, 1)), ("harness-scaling+ppo", (0,)))}
    run_stage("experiments/compare.py", "--ledger", ledger, "--out", tmp_path / "t", "--bootstrap", 300)
    main = json.loads((tmp_path / "t-main.json").read_text())
    assert [r["name"] for r in main["rows"]] == ["harness-scaling", "single", "harness-scaling+ppo"]
    a, b = want["harness-scaling"], want["harness-scaling+ppo"]
    assert main["rows"][2]["splits"]["inspace"]["diff_vs_reference"] == \
        pytest.approx(sum(b[t] - a[t] for t in TASKS) / len(TASKS))
    ppo = json.loads((tmp_path / "t-ppo.json").read_text())
    assert [r["name"] for r in ppo["rows"]] == ["harness-scaling+ppo", "harness-scaling", "single"]


def test_the_summary_scores_every_row_and_tests_each_direction_against_an_independent_count(tmp_path, ledger):
    """experiments/compare.py --ledger also writes PREFIX-summary.md (a cell is a score; each of the paper's directions with
    its paired sign test, pooled seeds and per seed) and PREFIX-summary.svg: checked against plain python from
    the run folders."""
    import math
    import xml.etree.ElementTree as ET
    runs = tmp_path / "runs"
    hs = [runs / f"harness-scaling-seed{s}" / "eval" / "harness-scaling" for s in (0, 1)]
    single = [runs / "single-seed0" / "eval" / "single"]
    run_stage("experiments/compare.py", "--ledger", ledger, "--out", tmp_path / "t", "--bootstrap", 300)
    md = (tmp_path / "t-summary.md").read_text()
    rows = {ln.split(" | ")[0].strip("| "): ln.strip(" |").split(" | ") for ln in md.splitlines()
            if ln.startswith("| ")}
    a, b = per_task_values(hs, "inspace"), per_task_values(single, "inspace")
    assert rows["harness-scaling"][:2] == ["harness-scaling", "0, 1"]
    assert rows["harness-scaling"][3] == f"{100 * sum(a.values()) / len(a):.1f}"  # In-Space, the seeds averaged
    assert rows["single"][3] == f"{100 * sum(b.values()) / len(b):.1f}"

    def sign_p(better, worse):  # exact two-sided, by hand
        n, k = better + worse, min(better, worse)
        return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)

    row = rows["In-Space: harness-scaling > single"]
    better, worse = sum(a[t] > b[t] for t in TASKS), sum(a[t] < b[t] for t in TASKS)
    assert row[1:7] == ["In-Space", "0, 1 vs 0", f"{100 * sum(a[t] - b[t] for t in TASKS) / 10:+.1f}",
                        f"{better} / {worse}", f"{sign_p(better, worse):.2g}", "60.0 (6 / 10)"]
    assert row[7] == ("holds" if sign_p(better, worse) <= 0.05 and better > worse else
                      "opposite" if sign_p(better, worse) <= 0.05 else "can't tell")
    seed_cells = []  # single has one record: each seed of harness-scaling is paired with it
    for s, d in enumerate(hs):
        x = per_task_values([d], "inspace")
        up, down = sum(x[t] > b[t] for t in TASKS), sum(x[t] < b[t] for t in TASKS)
        seed_cells.append(f"seed {s}: {100 * sum(x[t] - b[t] for t in TASKS) / 10:+.1f} (p {sign_p(up, down):.2g})")
    assert row[8].startswith("; ".join(seed_cells))
    assert "no records yet (random18)" in rows["OA-18 > Random-18"][7]
    # the figure: well-formed, a dot per (row, column) it scores, named columns, no curve without curve records
    svg = ET.parse(tmp_path / "t-summary.svg").getroot()
    ns = "{http://www.w3.org/2000/svg}"
    assert len(svg.findall(f"{ns}circle")) == 2 * 3  # 2 rows x Base, In-Space, Unseen syntax
    labels = [t.text for t in svg.findall(f"{ns}text")]
    assert "harness-scaling (2 seeds)" in labels and "In-Space" in labels and not svg.findall(f"{ns}polyline")


def test_a_direction_verdict_is_a_floor_holds_the_opposite_or_cant_tell():
    cmp = load_stage("experiments/compare.py")

    def d(diff, p, identical=False, value=0.3):
        return {"diff_vs_reference": diff, "sign_test_p": p, "identical": identical, "pass@1": value}
    assert cmp.verdict(d(0.0, 1.0, identical=True, value=0.0), "higher") == "floor (0 in both)"
    assert cmp.verdict(d(0.0, 1.0, identical=True), "higher") == "can't tell"
    assert cmp.verdict(d(0.1, 0.01), "higher") == "holds"
    assert cmp.verdict(d(-0.1, 0.01), "higher") == "opposite"
    assert cmp.verdict(d(0.1, 0.06), "higher") == "can't tell"
    assert cmp.verdict(d(-0.1, 0.06), "unchanged") == "holds (no change at p <= 0.05)"
    assert cmp.verdict(d(-0.1, 0.04), "unchanged") == "changed: down"


def test_other_common_ground_is_refused_naming_the_field(tmp_path, ledger):
    other = dict(GROUND, budget={"lr": 0.002, "iterations": 3})
    run = method_run(tmp_path / "runs", "random18", 0)
    bad = write(tmp_path, run, "random18", 0, ledger, ground=other, check=False)
    assert bad.returncode == 2 and "field budget.lr: 0.001 vs 0.002" in bad.stderr
    assert not (ledger / "random18").exists()  # nothing half-written
    # a record whose ground was edited by hand: compare refuses the ledger, naming the record and the field
    rec = ledger / "single" / "seed0" / "record.json"
    record = json.loads(rec.read_text())
    record["ground"]["versions"] = {"torch": "3"}
    rec.write_text(json.dumps(record))
    bad = run_stage("experiments/compare.py", "--ledger", ledger, "--out", tmp_path / "t", check=False)
    assert bad.returncode == 2 and "single/seed0/record.json" in bad.stderr and "versions.torch" in bad.stderr
    assert not list(tmp_path.glob("t*"))


def test_ground_difference_names_the_first_differing_field():
    a = {"x": 1, "b": {"c": [1, 2], "d": "u"}}
    assert ledger_mod.ground_difference(a, json.loads(json.dumps(a))) is None
    assert ledger_mod.ground_difference(a, {"x": 1, "b": {"c": [1, 3], "d": "u"}}) == "b.c: [1, 2] vs [1, 3]"
    assert ledger_mod.ground_difference(a, {"x": 1, "b": {"c": [1, 2]}}) == 'b.d: "u" vs null'


def test_committed_tables_equal_what_the_ledger_regenerates(tmp_path):
    """README: `python experiments/compare.py --ledger results/records --out results/tables` regenerates every committed table."""
    records = ROOT / "results" / "records"
    assert (records).is_dir() and list(records.glob("*/ground.json")), "no committed ledger under results/records"
    run_stage("experiments/compare.py", "--ledger", records, "--out", tmp_path, timeout=300)
    made = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.suffix in (".md", ".json", ".svg"))
    committed = sorted(p.relative_to(ROOT / "results" / "tables") for p in (ROOT / "results" / "tables").rglob("*")
                       if p.suffix in (".md", ".json", ".svg"))
    assert made == committed and made
    for rel in made:
        assert (tmp_path / rel).read_bytes() == (ROOT / "results" / "tables" / rel).read_bytes(), rel


def test_a_recreated_warm_start_joins_only_within_the_tolerance(tmp_path, capsys):
    """A warm start re-created on another CPU may differ in its last bits: with the same probe episodes and weights
    within WARM_START_TOL of the ledger's it joins (its records carry the ledger's ground and the distance);
    further apart, or with another probe outcome, it is refused, naming the field and the distance."""
    sketch = {"w": ["F32", [4], 2.0, 4.0, [1.0, 0.5]]}  # rms 1: a difference d is d relative
    (tmp_path / "a.json").write_text(json.dumps({"sha256": "aa", "sketch": sketch}))
    ledger = tmp_path / "ledger"
    assert ledger_mod.check_ground(ledger, GROUND, ["S1-T1-O1-C1-W1"], tmp_path / "a.json") == (GROUND, None)
    assert (ledger / "warm_start.sketch.json").read_text() == (tmp_path / "a.json").read_text()
    tol = ledger_mod.WARM_START_TOL
    for delta, joins in ((tol / 2, True), (tol * 3, False)):
        mine = dict(GROUND, warm_start={"sha256": "bb", "probe": []})
        (tmp_path / "b.json").write_text(json.dumps({"sha256": "bb", "sketch": {"w": ["F32", [4], 2.0, 4.0,
                                                                                       [1.0 + delta, 0.5]]}}))
        if joins:
            ground, distance = ledger_mod.check_ground(ledger, mine, None, tmp_path / "b.json")
            assert ground == GROUND and distance["max_abs"] == pytest.approx(delta)
            assert distance["first_differing"] == "w"
        else:
            with pytest.raises(SystemExit) as e:
                ledger_mod.check_ground(ledger, mine, None, tmp_path / "b.json")
            err = capsys.readouterr().err
            assert e.value.code == 2 and "field warm_start.sha256" in err and "first in w; tolerance" in err
    other_probe = dict(GROUND, warm_start={"sha256": "aa", "probe": [["t0", BASE, True, "submitted", 2]]})
    with pytest.raises(SystemExit):
        ledger_mod.check_ground(ledger, other_probe, None, tmp_path / "a.json")
    assert "field warm_start.probe" in capsys.readouterr().err


def test_the_ground_command_checks_a_run_against_the_ledger_through_its_command_line(tmp_path):
    """`experiments/ledger.py ground` (what pipeline.py runs before any training): a new ledger takes the proposed
    ground with the installed package versions added, and its evaluation set and sketch; a run of the same ground
    joins (--out holds the ground its records carry, no distance file); a run of other ground exits 2 naming the
    field and writes no --out."""
    proposed = {k: v for k, v in GROUND.items() if k != "versions"}
    (tmp_path / "proposed.json").write_text(json.dumps(proposed))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps({"harness_id": h, "levels": {}}) + "\n"
                                                 for h in GROUND["eval_set"]))
    (tmp_path / "sketch.json").write_text(json.dumps({"sha256": "ab", "sketch": {}}))
    ledger, out, far = tmp_path / "ledger", tmp_path / "run" / "ground.json", tmp_path / "run" / "distance.json"

    def ground(proposed_file, check=True):
        return run_stage("experiments/ledger.py", "ground", "--ledger", ledger, "--proposed", proposed_file,
                         "--eval-set", tmp_path / "eval.jsonl", "--sketch", tmp_path / "sketch.json", "--out", out,
                         "--distance-out", far, check=check)

    ground(tmp_path / "proposed.json")
    carried = json.loads(out.read_text())
    assert carried == dict(proposed, versions=ledger_mod.versions()) and carried["versions"]["torch"]
    assert json.loads((ledger / "ground.json").read_text()) == carried
    assert [json.loads(line)["harness_id"] for line in (ledger / "eval_harnesses.jsonl").read_text().splitlines()] \
        == GROUND["eval_set"]
    out.unlink()
    ground(tmp_path / "proposed.json")  # the same ground: joins
    assert json.loads(out.read_text()) == carried and not far.exists()
    out.unlink()
    (tmp_path / "other.json").write_text(json.dumps(dict(proposed, budget={"lr": 0.002, "iterations": 3})))
    bad = ground(tmp_path / "other.json", check=False)
    assert bad.returncode == 2 and "field budget.lr" in bad.stderr and not out.exists()


def test_the_curve_settings_are_not_common_ground_but_one_ledgers_curves_must_agree(tmp_path, ledger):
    """--curve-every and --curve-tasks change no evaluation episode (ledger.CURVE_KEYS): a run that differs from the
    ledger in them alone joins it, one that also differs in the budget is refused naming that field. The curves'
    lines are paired on checkpoints and tasks, so compare refuses records whose curves differ in either, before it
    writes any table."""
    budget = dict(GROUND["budget"], curve_every=8, curve_tasks=16)
    runs = {}
    for seed, points, tasks in ((5, (0, 4), ("t0", "t1")), (6, (0, 8), ("t0", "t1")), (7, (0, 4), ("t0",))):
        run = runs[seed] = method_run(tmp_path / "runs", "harness-scaling", seed)
        (run / "curve").mkdir()
        for t in points:
            (run / "curve" / f"iter-{t:03d}.jsonl").write_text("".join(
                json.dumps({"task_id": task, "harness_id": BASE, "success": True}) + "\n" for task in tasks))
    write(tmp_path, runs[5], "harness-scaling", 5, ledger, ground=dict(GROUND, budget=budget))
    assert json.loads((ledger / "harness-scaling" / "seed5" / "record.json").read_text())["ground"]["budget"] == budget
    bad = write(tmp_path, runs[6], "harness-scaling", 6, ledger, check=False,
                ground=dict(GROUND, budget=dict(budget, lr=0.002)))
    assert bad.returncode == 2 and "field budget.lr: 0.001 vs 0.002" in bad.stderr
    cmp = load_stage("experiments/compare.py")
    for seed in (6, 7):  # other checkpoints; other tasks
        write(tmp_path, runs[seed], "harness-scaling", seed, ledger)
        out = tmp_path / f"t{seed}"
        bad = run_stage("experiments/compare.py", "--ledger", ledger, "--out", out, check=False)
        assert bad.returncode == 2 and "harness-scaling/seed5/curve" in bad.stderr, bad.stderr
        assert f"harness-scaling/seed{seed}/curve" in bad.stderr and not list(tmp_path.glob(f"t{seed}*"))
        shutil.rmtree(ledger / "harness-scaling" / f"seed{seed}")
    cmp.check_curves([ledger / "harness-scaling" / "seed5", ledger / "harness-scaling" / "seed5"])  # agree: passes
