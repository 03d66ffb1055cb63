"""Stage 02: constructions, the strength-2 verifier, bounds, the random baseline, the CLI."""
import itertools
import json
import math
import re

import numpy as np
import pytest

from conftest import ROOT, load_stage, run_stage

LETTERS = ["S", "T", "O", "C", "W"]


@pytest.fixture(scope="module")
def mod():
    return load_stage("02_orthogonal_design.py")


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def unbalanced_pairs(rows, levels):
    """Independent strength-2 count: column pairs (i, j) whose level pairs are not all equally frequent."""
    a = np.asarray(rows)
    n = len(a)
    bad = []
    for i, j in itertools.combinations(range(a.shape[1]), 2):
        counts = np.zeros((levels[i], levels[j]), dtype=int)
        np.add.at(counts, (a[:, i], a[:, j]), 1)
        if not (counts * levels[i] * levels[j] == n).all():
            bad.append((i, j))
    return bad


def assert_oa(rows, levels):
    a = np.asarray(rows)
    assert a.shape[1] == len(levels)
    for col, s in zip(a.T, levels):
        assert set(col.tolist()) <= set(range(s))
    assert unbalanced_pairs(rows, levels) == []
    assert len({tuple(r) for r in a.tolist()}) == len(a), "rows must be distinct"


def make_components(tmp_path, extra):
    """components.json of stage 01 with extra realisations appended: {"C": 1} adds C3."""
    base = tmp_path / "base"
    run_stage("01_harness_space.py", "--run", base)
    comps = json.loads((base / "components.json").read_text())
    for c, count in extra.items():
        for _ in range(count):
            specs = comps["components"][c]
            specs.append(dict(specs[1], id=f"{c}{len(specs)}", desc=f"extra realisation {len(specs)}"))
    path = tmp_path / "components_mine.json"
    path.write_text(json.dumps(comps))
    return path


@pytest.fixture(scope="module")
def run01(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    run_stage("01_harness_space.py", "--run", run)
    return run


# ----------------------------------------------------------------------------- constructions
def test_default_design_is_an_18_run_strength2_oa(mod):
    name, rows = mod.construct_oa([3] * 5, LETTERS)
    assert len(rows) == 18 and "L18" in name
    assert_oa(rows, [3] * 5)
    # every level pair of every column pair exactly twice (18 / 9), counted directly
    for i, j in itertools.combinations(range(5), 2):
        pairs = [(r[i], r[j]) for r in rows]
        assert all(pairs.count(p) == 2 for p in itertools.product(range(3), repeat=2))
    # the columns DESIGN.md names: L18[:, 2:7]
    assert rows == (np.asarray(mod.L18)[:, 2:7] - 1).tolist()


def test_l18_table_is_an_oa(mod):
    a = np.asarray(mod.L18) - 1
    assert a.shape == (18, 8)
    assert_oa(a.tolist(), [2] + [3] * 7)


@pytest.mark.parametrize("s,k,n", [(3, 1, 3), (3, 2, 9), (3, 4, 9), (3, 5, 18), (3, 6, 18), (3, 7, 18),
                                   (3, 8, 27), (3, 13, 27), (2, 3, 4), (2, 4, 8), (2, 7, 8), (5, 2, 25),
                                   (5, 6, 25), (7, 3, 49)])
def test_smallest_construction_for_s_to_the_k(mod, s, k, n):
    name, rows = mod.construct_oa([s] * k, LETTERS[:k] if k <= 5 else [f"X{i}" for i in range(k)])
    assert len(rows) == n, name
    assert_oa(rows, [s] * k)


def test_rao_hamming_directly(mod):
    for s, k, n in [(2, 3, 4), (5, 6, 25), (3, 4, 9), (2, 15, 16)]:
        _, rows = mod.rao_hamming(s, k)
        assert len(rows) == n
        assert_oa(rows, [s] * k)


def test_mixed_levels_are_crossed(mod):
    levels = [3, 3, 3, 4, 3]
    name, rows = mod.construct_oa(levels, LETTERS)
    assert len(rows) == 36          # = smallest N: lcm(9, 12) = 36 >= Rao bound 12
    assert_oa(rows, levels)
    _, rows = mod.construct_oa([2, 3, 3, 2, 3], LETTERS)
    assert len(rows) == 4 * 9 and unbalanced_pairs(rows, [2, 3, 3, 2, 3]) == []


def test_unconstructible_pattern_explains_bounds(mod):
    with pytest.raises(mod.DesignError) as e:
        mod.construct_oa([4, 4, 4, 3, 3], LETTERS)
    msg = str(e.value)
    # Rao: 1 + 3*3 + 2*2 = 14; every N divisible by lcm(16, 12, 9) = 144
    assert "= 14" in msg and "144" in msg and "--design" in msg and "S,T,O" in msg


def test_rao_bound_and_divisibility_values(mod):
    assert mod.rao_bound([3] * 5) == 11
    assert mod.rao_bound([2] * 7) == 8
    assert mod.rao_bound([3, 3, 3, 3, 4]) == 12
    assert mod.rao_bound([2, 3, 4]) == 7
    assert mod.divisor([3] * 5) == 9 and mod.divisor([2, 3]) == 6 and mod.divisor([3, 3, 4]) == 36
    assert mod.smallest_possible_n([3] * 5) == 18
    assert mod.smallest_possible_n([3] * 4) == 9
    assert mod.smallest_possible_n([2] * 3) == 4
    assert mod.smallest_possible_n([2] * 7) == 8
    report = mod.check_design(mod.construct_oa([3] * 5, LETTERS)[1], [3] * 5, LETTERS)
    assert report["rao_ok"] and report["divisible_ok"] and report["balance_ok"] and report["strength2_ok"]
    assert report["covered"] == report["total_pairs"] == 90


# ----------------------------------------------------------------------------- the verifier
def test_verifier_catches_one_changed_cell(mod):
    _, rows = mod.construct_oa([3] * 5, LETTERS)
    rows = [list(r) for r in rows]
    rows[4][1] = (rows[4][1] + 1) % 3            # one cell of column T
    report = mod.check_design(rows, [3] * 5, LETTERS)
    assert not report["strength2_ok"] and not report["balance_ok"]
    named = [tuple(re.match(r"columns (\w) and (\w):", f).groups()) for f in report["failures"]]
    expected = [(LETTERS[i], LETTERS[j]) for i, j in unbalanced_pairs(rows, [3] * 5)]
    assert named == expected == [("S", "T"), ("T", "O"), ("T", "C"), ("T", "W")]
    # the named level pair and its count are right
    m = re.search(r"level pair \((\d), (\d)\) appears (\d+) times?, expected 2", report["failures"][0])
    a, b, count = map(int, m.groups())
    assert sum(1 for r in rows if (r[0], r[1]) == (a, b)) == count != 2


def test_expected_random_coverage_exact(mod):
    # a level pair lies in 27 of 243 configurations; P(an 18-subset misses it) = C(216,18)/C(243,18)
    p_miss = math.comb(216, 18) / math.comb(243, 18)
    assert mod.expected_random_coverage([3] * 5, 18) == pytest.approx(1 - p_miss)
    assert 0.88 < 1 - p_miss < 0.90


# ----------------------------------------------------------------------------- the CLI
def test_cli_default_oa(run01, tmp_path):
    proc = run_stage("02_orthogonal_design.py", "--run", run01)
    space = read_jsonl(run01 / "harness_space.jsonl")
    train = read_jsonl(run01 / "train_harnesses.jsonl")
    held = read_jsonl(run01 / "heldout_harnesses.jsonl")
    assert len(train) == 18 and len(held) == 225
    tid, hid = {h["harness_id"] for h in train}, {h["harness_id"] for h in held}
    assert not tid & hid and tid | hid == {h["harness_id"] for h in space}
    by_id = {h["harness_id"]: h for h in space}
    assert all(h == by_id[h["harness_id"]] for h in train + held)
    assert_oa([[h["levels"][c] for c in LETTERS] for h in train], [3] * 5)
    assert "100.0%" in proc.stdout and "89.0%" in proc.stdout and "random-18" in proc.stdout
    config = json.loads((run01 / "02_orthogonal_design_config.json").read_text())
    assert config["n_train"] == 18 and config["method"] == "oa"


def test_cli_random_is_seeded(run01, tmp_path):
    outs = {}
    for seed in (1, 1, 2):
        run = tmp_path / f"r{seed}"
        if not run.exists():
            run.mkdir()
            for f in ("components.json", "harness_space.jsonl"):
                (run / f).write_text((run01 / f).read_text())
        proc = run_stage("02_orthogonal_design.py", "--run", run, "--method", "random", "--seed", seed)
        assert "OA (18 runs)" in proc.stdout and f"random-18 (seed {seed})" in proc.stdout
        outs.setdefault(seed, []).append((run / "train_harnesses.jsonl").read_text())
    assert outs[1][0] == outs[1][1]
    assert outs[1][0] != outs[2][0]
    train = [json.loads(x) for x in outs[1][0].splitlines()]
    assert len({h["harness_id"] for h in train}) == 18


def test_cli_user_design_json_and_1_based_table(run01, tmp_path):
    rows = (np.asarray(load_stage("02_orthogonal_design.py").L18)[:, 1:6] - 1).tolist()
    for kind in ("json", "table"):
        path = tmp_path / f"design.{kind}"
        if kind == "json":
            path.write_text(json.dumps(rows))
        else:
            path.write_text("# L18 columns 2-6, 1-based\nS,T,O,C,W\n" + "\n".join(",".join(str(v + 1) for v in r) for r in rows))
        run_stage("02_orthogonal_design.py", "--run", run01, "--design", path)
        train = read_jsonl(run01 / "train_harnesses.jsonl")
        assert [[h["levels"][c] for c in LETTERS] for h in train] == rows


def test_cli_design_with_one_changed_cell_is_refused(run01, tmp_path):
    rows = (np.asarray(load_stage("02_orthogonal_design.py").L18)[:, 2:7] - 1).tolist()
    rows[0][1] = 1                                # T: 0 -> 1 in the first row
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(rows))
    out = tmp_path / "out"
    out.mkdir()
    for f in ("components.json", "harness_space.jsonl"):
        (out / f).write_text((run01 / f).read_text())
    proc = run_stage("02_orthogonal_design.py", "--run", out, "--design", path, check=False)
    assert proc.returncode == 2
    # rows with S=0: T levels were 0,1,2 twice each; now (0,0) once and (0,1) three times
    assert "columns S and T: level pair (0, 0) appears 1 time, expected 2" in proc.stderr
    assert "00:1 01:3 02:2" in proc.stderr and "(and 3 more column pairs)" in proc.stderr
    assert not (out / "train_harnesses.jsonl").exists()


@pytest.mark.parametrize("case", ["no_run", "bad_space_line", "bad_design_line", "unknown_method"])
def test_cli_bad_input(run01, tmp_path, case):
    out = tmp_path / "out"
    out.mkdir()
    args = []
    if case != "no_run":
        (out / "components.json").write_text((run01 / "components.json").read_text())
        lines = (run01 / "harness_space.jsonl").read_text().splitlines()
        if case == "bad_space_line":
            lines[4] = lines[4][:40]
        (out / "harness_space.jsonl").write_text("\n".join(lines) + "\n")
    if case == "bad_design_line":
        path = tmp_path / "d.txt"
        path.write_text("0 0 0 0 0\n1 1 1 1 1\n2 2 2 2\n")
        args = ["--design", path]
    if case == "unknown_method":
        args = ["--method", "greedy"]
    proc = run_stage("02_orthogonal_design.py", "--run", out, *args, check=False)
    assert proc.returncode == 2
    assert "error" in proc.stderr
    expect = {"no_run": "components.json: file not found", "bad_space_line": "harness_space.jsonl:5",
              "bad_design_line": "d.txt:3", "unknown_method": "invalid choice: 'greedy'"}[case]
    assert expect in proc.stderr
    assert not (out / "train_harnesses.jsonl").exists() and not (out / "heldout_harnesses.jsonl").exists()


def test_cli_four_level_component(tmp_path):
    comps = make_components(tmp_path, {"C": 1})
    run = tmp_path / "run"
    run_stage("01_harness_space.py", "--run", run, "--components", comps)
    proc = run_stage("02_orthogonal_design.py", "--run", run)
    train = read_jsonl(run / "train_harnesses.jsonl")
    levels = [3, 3, 3, 4, 3]
    assert len(train) == 36 and len(read_jsonl(run / "heldout_harnesses.jsonl")) == 324 - 36
    assert_oa([[h["levels"][c] for c in LETTERS] for h in train], levels)
    assert "36" in proc.stdout
    # the same space with a user array: OA(9, 3^4) (rows (a, b), columns a, b, a+b, a+2b mod 3)
    # crossed with the 4 levels of C, built here by hand
    oa9 = [[a, b, (a + b) % 3, (a + 2 * b) % 3] for a in range(3) for b in range(3)]
    rows = [[r[0], r[1], r[2], c, r[3]] for r in oa9 for c in range(4)]
    path = tmp_path / "mixed.txt"
    path.write_text("\n".join(" ".join(map(str, r)) for r in rows) + "\n")
    run_stage("02_orthogonal_design.py", "--run", run, "--design", path)
    train = read_jsonl(run / "train_harnesses.jsonl")
    assert [[h["levels"][c] for c in LETTERS] for h in train] == rows


def test_cli_unconstructible_pattern(tmp_path):
    comps = make_components(tmp_path, {"S": 1, "T": 1, "O": 1})
    run = tmp_path / "run"
    run_stage("01_harness_space.py", "--run", run, "--components", comps)
    proc = run_stage("02_orthogonal_design.py", "--run", run, check=False)
    assert proc.returncode == 2
    assert "Rao bound" in proc.stderr and "N >= 144" in proc.stderr and "--design" in proc.stderr
    assert not (run / "train_harnesses.jsonl").exists()
    # the random baseline still works when told its size
    run_stage("02_orthogonal_design.py", "--run", run, "--method", "random", "--n", 20)
    assert len(read_jsonl(run / "train_harnesses.jsonl")) == 20


# ----------------------------------------------------------------------------- the other harness sets
def hamming_to_set(space, ids):
    """Independent of 02: {harness id: Hamming distance to the nearest configuration of `ids`}, with numpy."""
    every = np.array([list(h["levels"].values()) for h in space])
    chosen = np.array([list(h["levels"].values()) for h in space if h["harness_id"] in ids])
    d = (every[:, None, :] != chosen[None, :, :]).sum(axis=2).min(axis=1)
    return {h["harness_id"]: int(x) for h, x in zip(space, d)}


@pytest.fixture(scope="module")
def experiment_sets(run01, tmp_path_factory):
    """The harness sets an experiment's evaluation set leaves out, made by 02's command line as the pipeline makes
    them: the OA, the warm start's (one-factor) and random18's draws at seeds 0-2."""
    root = tmp_path_factory.mktemp("sets")
    made = {}
    for name, args in (("oa", []), ("warm-start", ["--method", "one-factor"]),
                       *((f"random18-seed{s}", ["--method", "random", "--seed", s]) for s in range(3))):
        run = copy_run(run01, root / name)
        run_stage("02_orthogonal_design.py", "--run", run, *args)
        made[name] = {h["harness_id"] for h in read_jsonl(run / "train_harnesses.jsonl")}
    return made


def test_eval_set_is_a_seeded_draw_stratified_by_distance_to_the_oa(mod, run01, experiment_sets):
    """The experiment's In-Space set: as many configurations at Hamming distance 1 from the OA as at distance 2
    (distances counted here with numpy), none of the OA, the base, the warm start's set or an excluded set; the same
    set for the same seed, another for another seed. The stratum sizes the issue quotes: 225 held out = 180 at
    distance 1 + 45 at distance 2 (every configuration lies within 2 of the L18), 145 / 39 once the warm start's set
    and random18's draws at seeds 0 and 1 are left out, 133 / 38 with seed 2's too."""
    space = read_jsonl(run01 / "harness_space.jsonl")
    oa = experiment_sets["oa"]
    warm = experiment_sets["warm-start"]
    randoms = set().union(*(experiment_sets[f"random18-seed{s}"] for s in range(3)))
    distance = hamming_to_set(space, oa)
    assert max(distance.values()) == 2 and "S0-T0-O0-C0-W0" in oa and len(warm) == 11

    def sizes(left_out):  # candidates at distance 1 and 2 outside the OA and left_out, counted here
        rest = [d for h, d in distance.items() if h not in oa | left_out]
        return rest.count(1), rest.count(2)
    assert sizes(set()) == (180, 45) and sizes(warm) == (170, 45)
    two_seeds = warm | experiment_sets["random18-seed0"] | experiment_sets["random18-seed1"]
    assert sizes(two_seeds) == (145, 39) and sizes(warm | randoms) == (133, 38)
    strata = mod.eval_strata(space, oa, warm | randoms)
    assert (len(strata[1]), len(strata[2])) == (133, 38)

    # the draw: stratified, disjoint from everything left out, each row with its distance
    drawn = mod.shared_eval_set(space, oa, randoms, 12, seed=0)  # 02 leaves out the warm start's set itself
    ids = [h["harness_id"] for h in drawn]
    assert len(set(ids)) == 12 and [distance[h] for h in ids].count(1) == 6 and [distance[h] for h in ids].count(2) == 6
    assert all(h["distance_to_oa"] == distance[h["harness_id"]] for h in drawn)
    assert not set(ids) & (oa | warm | randoms)
    # reproducible per seed, another draw for another seed
    assert mod.shared_eval_set(space, oa, randoms, 12, seed=0) == drawn
    assert {h["harness_id"] for h in mod.shared_eval_set(space, oa, randoms, 12, seed=1)} != set(ids)
    # the largest set: twice the smaller stratum, which it then holds whole
    largest = mod.shared_eval_set(space, oa, randoms, 76, seed=0)
    assert {h["harness_id"] for h in largest if distance[h["harness_id"]] == 2} == \
        {h for h, d in distance.items() if d == 2} - oa - warm - randoms


def copy_run(run01, path):
    path.mkdir()
    for f in ("components.json", "harness_space.jsonl"):
        (path / f).write_text((run01 / f).read_text())
    return path


def test_cli_single_harness_and_the_warm_starts_set(run01, tmp_path):
    """--method single: the base alone (everything else held out), or X-shell from the external file as it stands
    there (the whole space held out); --method one-factor: the 11 configurations at distance <= 1 from the base."""
    space = read_jsonl(run01 / "harness_space.jsonl")
    shell = json.loads((ROOT / "data" / "external_harnesses.json").read_text())[0]
    for args, want in ((["--method", "single"], [space[0]]), (["--method", "single", "--harness", "X-shell"], [shell]),
                       (["--method", "one-factor"], [h for h in space if list(h["levels"].values()).count(0) >= 4])):
        run = copy_run(run01, tmp_path / "-".join(args[1:]))
        proc = run_stage("02_orthogonal_design.py", "--run", run, *args)
        train, held = read_jsonl(run / "train_harnesses.jsonl"), read_jsonl(run / "heldout_harnesses.jsonl")
        assert train == want and len(train) == (11 if args[1] == "one-factor" else 1)
        assert held == [h for h in space if h["harness_id"] not in {w["harness_id"] for w in want}]
        config = json.loads((run / "02_orthogonal_design_config.json").read_text())
        assert config["method"] == args[1] and config["train_harness_ids"] == [h["harness_id"] for h in want]
        assert f"H_tr: {len(want)} configurations ({args[1]})" in proc.stdout
    assert space[0]["harness_id"] == "S0-T0-O0-C0-W0"
    bad = copy_run(run01, tmp_path / "bad")
    for args, message in ((["--method", "single", "--harness", "S9-T0-O0-C0-W0"], "--harness S9-T0-O0-C0-W0: neither"),
                          (["--harness", "X-shell"], "only with --method single"),
                          (["--method", "one-factor", "--design", tmp_path / "d.csv"], "--design: only with")):
        proc = run_stage("02_orthogonal_design.py", "--run", bad, *args, check=False)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr
    assert sorted(p.name for p in bad.iterdir()) == ["components.json", "harness_space.jsonl"]


def test_cli_eval_set_is_written_once_and_refused_if_it_would_change(mod, run01, tmp_path):
    """--eval-set N: the stratified draw outside the run's OA, the warm start's set and every --exclude file, into
    --out, with its config beside it (the seed, the stratum sizes after each exclusion, each row's distance); the
    same call again leaves it as it is, a call that would change it (another exclusion, another seed) is refused
    (exit 2, file untouched); an odd, too small or too large N is refused in one line naming --eval-set, with nothing
    written."""
    oa_run, ws = copy_run(run01, tmp_path / "oa"), copy_run(run01, tmp_path / "ws")
    run_stage("02_orthogonal_design.py", "--run", oa_run)
    run_stage("02_orthogonal_design.py", "--run", ws, "--method", "random", "--seed", 5)
    out = tmp_path / "exp" / "eval_harnesses.jsonl"
    out.parent.mkdir()
    args = ["--run", oa_run, "--eval-set", 6, "--exclude", ws / "train_harnesses.jsonl", "--out", out]

    # bad N first: one line naming the flag, exit 2, nothing written
    for n, message in ((3, "--eval-set 3: N must be even and >= 2"), (0, "--eval-set 0: N must be even and >= 2"),
                       (92, "--eval-set 92: at most ")):
        proc = run_stage("02_orthogonal_design.py", *args[:2], "--eval-set", n, *args[4:], check=False)
        assert proc.returncode == 2 and proc.stderr.startswith(f"error: {message}"), proc.stderr
        assert proc.stderr.count("\n") == 1 and list(out.parent.iterdir()) == []

    proc = run_stage("02_orthogonal_design.py", *args)
    space = read_jsonl(run01 / "harness_space.jsonl")
    oa = {h["harness_id"] for h in read_jsonl(oa_run / "train_harnesses.jsonl")}
    excluded = {h["harness_id"] for h in read_jsonl(ws / "train_harnesses.jsonl")}
    rows = read_jsonl(out)
    assert rows == mod.shared_eval_set(space, oa, excluded, 6, seed=0) and len(rows) == 6
    assert not {h["harness_id"] for h in rows} & (oa | excluded | set(mod.one_factor_ids(space)))
    assert f"wrote {out}" in proc.stdout and "170 /  45  less the base and the warm start's set" in proc.stdout
    config_path = out.with_name("eval_harnesses_config.json")
    config = json.loads(config_path.read_text())
    distance = hamming_to_set(space, oa)
    assert config["seed"] == 0 and config["n"] == 6
    assert config["distance_to_oa"] == {h["harness_id"]: distance[h["harness_id"]] for h in rows}
    assert [s["step"] for s in config["strata"]][:2] == ["outside the OA", "less the base and the warm start's set"]
    assert (config["strata"][0]["distance_1"], config["strata"][0]["distance_2"]) == (180, 45)
    assert sorted(p.name for p in out.parent.iterdir()) == ["eval_harnesses.jsonl", "eval_harnesses_config.json"]

    # written once
    before = (out.read_bytes(), out.stat().st_mtime_ns, config_path.read_bytes())
    assert "unchanged" in run_stage("02_orthogonal_design.py", *args).stdout
    first = rows[0]["harness_id"]
    extra = tmp_path / "extra.jsonl"
    extra.write_text(json.dumps({"harness_id": first}) + "\n")
    proc = run_stage("02_orthogonal_design.py", *args[:-3], f"{ws / 'train_harnesses.jsonl'},{extra}", "--out", out,
                     check=False)
    assert proc.returncode == 2 and "the evaluation set would change" in proc.stderr
    proc = run_stage("02_orthogonal_design.py", *args, "--seed", 1, check=False)
    assert proc.returncode == 2 and "the evaluation set would change" in proc.stderr
    extra.write_text('{"harness_id": "S1-T1-O1-C1-W1"}\n{"name": 1}\n')
    proc = run_stage("02_orthogonal_design.py", *args[:-3], extra, "--out", out, check=False)
    assert proc.returncode == 2 and f"{extra}:2: field 'harness_id'" in proc.stderr
    proc = run_stage("02_orthogonal_design.py", "--run", oa_run, "--eval-set", 6, check=False)
    assert proc.returncode == 2 and "--eval-set 6: needs --out FILE" in proc.stderr
    assert (out.read_bytes(), out.stat().st_mtime_ns, config_path.read_bytes()) == before
