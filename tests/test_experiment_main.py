"""`--experiment main` end to end on a miniature toy (its own file, so that the slow suite on two processes runs it
beside tests/test_pipeline.py's interrupted chain)."""
import json
import shutil

import pytest
from conftest import load_stage, run_stage

EPISODE_FIELDS = load_stage("experiments/ledger.py").EPISODE_FIELDS


def read_jsonl(path):
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.mark.slow
def test_experiment_main_from_one_command(tmp_path):
    """`--experiment main` on a miniature toy: every method is scored on the same tasks and the same In-Space
    harnesses (disjoint from all training sets and the warm start's) and in both frameworks; the black-box
    baselines train inside pydantic-ai (RL on its episodes, SFT on the oracle's token-consistent episodes in it),
    so their pydantic-ai column alone is marked trained in; each training task visited K = 3 times sees its 3
    harnesses, compute is matched. Every method leaves its record in the ledger, the tables are rebuilt from the
    records alone byte for byte, a second call redoes nothing, and a run of other common ground is refused."""
    exp, ledger = tmp_path / "exp", tmp_path / "ledger"
    size = ["--max-new-tokens", 48, "--sft-tasks", 2, "--sft-epochs", 1, "--tiny-size", "1,32,2", "--iterations", 3,
            "--tasks-per-iteration", 2, "--group-size", 2, "--eval-tasks", 3, "--eval-heldout", 2,
            "--framework-tasks", "smolagents-native=2,pydantic-ai=2,smolagents=0", "--curve-every", 2,
            "--curve-tasks", 2]
    args = ["--experiment", "main", "--run", exp, "--ledger", ledger, *size]
    run_stage("pipeline.py", *args, timeout=1200)
    comp = json.loads((exp / "comparison-main.json").read_text())
    rows = {r["name"]: r for r in comp["rows"]}
    assert list(rows) == ["untrained", "warm-start", "harness-scaling", "single", "blackbox-sft", "blackbox-rl"]
    assert comp["reference"] == "harness-scaling"
    eval_ids = [h["harness_id"] for h in read_jsonl(exp / "eval_harnesses.jsonl")]
    tasks = {r["name"]: sorted(r["task_ids"]) for r in comp["rows"]}
    assert len(eval_ids) == 2 and len(set(map(tuple, tasks.values()))) == 1 and len(tasks["single"]) == 3
    trained = {h["harness_id"] for m in ("harness-scaling", "single", "blackbox-rl", "blackbox-sft", "warm-start")
               for h in read_jsonl(exp / m / "train_harnesses.jsonl")}
    assert not set(eval_ids) & trained and not {h for h in trained if h.startswith("X-")}
    for m in ("blackbox-rl", "blackbox-sft"):  # the warm start's set (02 one-factor), no assignment
        assert read_jsonl(exp / m / "train_harnesses.jsonl") == read_jsonl(exp / "warm-start" / "train_harnesses.jsonl")
        assert not (exp / m / "assignment.jsonl").exists()
    for r in comp["rows"]:
        assert sorted(r["inspace_ids"]) == sorted(eval_ids)
        for d in r["evaldirs"]:  # the records' episodes: the same (task, harness) pairs for every row
            pairs = {(e["task_id"], e["harness_id"]) for e in read_jsonl(ledger / d / "inspace.jsonl")}
            assert pairs == {(t, h) for t in tasks["single"] for h in eval_ids}
        assert r["splits"]["external"]["pairs"] == 3 * 2  # X-shell and X-react: no row trained in them
        assert r["splits"]["smolagents-native"]["pairs"] == r["splits"]["pydantic-ai"]["pairs"] == 2
        assert "smolagents" not in r["splits"]  # --framework-tasks smolagents=0
        assert not r["splits"]["smolagents-native"]["trained_in"]  # nothing trains in the Claude Code column
        assert r["splits"]["pydantic-ai"]["trained_in"] == r["name"].startswith("blackbox")
        if r["name"] != "harness-scaling":  # an interval, or 'identical' (never a zero-width interval)
            x = r["splits"]["base"]
            assert (x["diff_ci95"] is None) == x["identical"] and 0 <= x["sign_test_p"] <= 1
    for t in range(3):  # black-box RL: train mode inside pydantic-ai, its groups one (task, framework) each
        eps = read_jsonl(exp / "blackbox-rl" / f"iter_{t:03d}" / "rollouts.jsonl")
        assert len(eps) == 2 * 2 and {e["harness_id"] for e in eps} == {"X-pydantic-ai"}
        assert {e["group_id"] for e in eps} == {f"{e['task_id']}|X-pydantic-ai|it{t:03d}" for e in eps}
        assert all(e["model_turns"] and e["framework"].startswith("pydantic-ai ") for e in eps)
    demos = read_jsonl(exp / "blackbox-sft" / "sft" / "demos.jsonl")  # the oracle inside pydantic-ai
    assert len(demos) == len(read_jsonl(exp / "train_tasks.jsonl")) and all(d["success"] for d in demos)
    for d in demos:  # token-consistent: each prompt extends the last prompt and its sampled ids (one sequence)
        assert d["harness_id"] == "X-pydantic-ai" and d["rerendered_turns"] == 0
        turns = d["model_turns"]
        assert all(b["prompt_ids"][:len(a["prompt_ids"]) + len(a["completion_ids"])] ==
                   a["prompt_ids"] + a["completion_ids"] for a, b in zip(turns, turns[1:]))
    compute = comp["compute"]
    hs = compute["harness-scaling (seed 0)"]
    assert hs["tasks_trained"] == 2 and hs["tasks_saw_all_K"] == 2  # 3 iterations x 2 tasks = 2 tasks x K visits
    assert hs["rollout_episodes"] == compute["single (seed 0)"]["rollout_episodes"] == 3 * 2 * 2
    before_rl = {"untrained (seed 0)", "warm-start (seed 0)"}  # evaluated only: no update
    assert all(compute[n]["minibatches"] == compute[n]["rollout_episodes"] == 0 for n in before_rl)
    budget = {name: c["minibatches"] for name, c in compute.items() if name not in before_rl}
    bb_rl = budget.pop("blackbox-rl (seed 0)")
    assert len(set(budget.values())) == 1, budget  # RL and black-box SFT: the same number of minibatches
    assert bb_rl == 2 * budget["harness-scaling (seed 0)"]  # black-box RL: black-box SFT's, then RL's
    assert compute["blackbox-rl (seed 0)"]["sft_demos"] == compute["blackbox-sft (seed 0)"]["sft_demos"] > 0
    assert all(c["optimizer_steps"] <= c["minibatches"] for c in compute.values())
    # equal starts: the same warm-start weights and a fresh AdamW for every method (no optimizer.pt copied)
    for name in ("harness-scaling", "single", "blackbox-sft", "blackbox-rl"):
        assert not (exp / name / "init_policy" / "optimizer.pt").exists()
        assert (exp / name / "init_policy" / "model.safetensors").read_bytes() == \
            (exp / "warmstart" / "policy" / "model.safetensors").read_bytes()
        first = exp / name / ("sft" if name == "blackbox-sft" else "iter_000") / "05_train_config.json"
        assert json.loads(first.read_text())["optimizer_state"].startswith("fresh AdamW state")
    # black-box RL's RL starts from its black-box SFT: blackbox-sft's, made once and copied (its wall time too)
    assert json.loads((exp / "blackbox-rl" / "iter_000" / "05_train_config.json").read_text())["policy"] == \
        str(exp / "blackbox-rl" / "sft" / "policy")
    sft_s = [json.loads((exp / m / "step_times.json").read_text())["05-sft"] for m in ("blackbox-rl", "blackbox-sft")]
    assert sft_s[0] == sft_s[1] and compute["blackbox-rl (seed 0)"]["train_s"] > sft_s[0]
    assert (exp / "blackbox-rl" / "sft" / "policy" / "model.safetensors").read_bytes() == \
        (exp / "blackbox-sft" / "sft" / "policy" / "model.safetensors").read_bytes()
    for m in ("blackbox-rl", "blackbox-sft"):
        assert compute[f"{m} (seed 0)"]["training_harnesses"] == ["X-pydantic-ai"]
        assert compute[f"{m} (seed 0)"]["tasks_saw_all_K"] is None
    assert compute["blackbox-rl (seed 0)"]["rollout_episodes"] == hs["rollout_episodes"]
    md = (exp / "comparison-main.md").read_text()
    assert "| harness-scaling (seed 0) |" in md and "## Compute per method" in md and md.count(" (trained in) |") == 2
    assert " native | Δ vs harness-scaling | pydantic-ai 2." in md
    # the transfer curve: harness-scaling and single after 0, 2 and 3 iterations, greedy, on the first 2 test tasks,
    # under the shared evaluation set (held out) and under each run's own training harnesses
    curve = json.loads((exp / "comparison-transfer_curve.json").read_text())
    assert list(curve["methods"]) == ["harness-scaling seed0", "single seed0"]  # a line per method and seed
    assert curve["eval_ids"] == sorted(eval_ids)
    for line, c in curve["methods"].items():
        m = line.split()[0]
        assert [r["iteration"] for r in c["curve"]] == [0, 2, 3]
        own = [h["harness_id"] for h in read_jsonl(exp / m / "train_harnesses.jsonl")]
        assert all(r["trained"]["harnesses"] == len(own) and r["held-out"]["harnesses"] == 2 and
                   r["trained"]["tasks"] == r["held-out"]["tasks"] == 2 for r in c["curve"])
        episodes = read_jsonl(exp / m / "curve" / "iter-002.jsonl")
        assert {e["harness_id"] for e in episodes} == set(own) | set(eval_ids)
        assert {e["task_id"] for e in episodes} == {t["task_id"] for t in read_jsonl(exp / "curve_tasks.jsonl")}
        assert read_jsonl(ledger / m / "seed0" / "curve" / "iter-002.jsonl") == \
            [{k: e.get(k) for k in EPISODE_FIELDS} for e in episodes]  # the record keeps every curve episode
    assert (exp / "comparison-transfer_curve.md").is_file() and (exp / "comparison-transfer_curve.png").is_file()

    # the ledger: a record per row, small, without paths; the warm start's fingerprint in the common ground
    records = sorted(str(p.parent.relative_to(ledger)) for p in ledger.glob("*/seed*/record.json"))
    assert records == sorted(f"{m}/seed0" for m in rows)
    ground = json.loads((ledger / "ground.json").read_text())
    assert ground["eval_set"] == sorted(eval_ids) and len(ground["warm_start"]["sha256"]) == 64
    assert len(ground["warm_start"]["probe"]) == 2 * 11  # 2 demonstration tasks x the 11 warm-start harnesses
    text = "".join(p.read_text() for p in ledger.rglob("*") if p.is_file())
    assert str(tmp_path) not in text and "model_turns" not in text and len(text) < 400_000
    again = run_stage("pipeline.py", *args)  # every record there: nothing trained or evaluated again
    assert "python 0" not in again.stdout.replace("[pipeline] evaluation set", "")
    assert again.stdout.count("in the ledger already") == len(rows)
    shutil.rmtree(exp / "harness-scaling")  # a run folder gone: its record still makes the table
    run_stage("experiments/compare.py", "--ledger", ledger, "--out", tmp_path / "again")
    for name in ("main.md", "main.json", "transfer_curve.md", "transfer_curve.json"):
        assert (tmp_path / f"again-{name}").read_bytes() == (exp / f"comparison-{name}").read_bytes(), name
    # another budget into the same ledger: refused before any training, naming the field
    other = run_stage("pipeline.py", "--experiment", "main", "--run", tmp_path / "exp2", "--ledger", ledger,
                      "--warmstart", exp / "warmstart", *size, "--lr", 0.5, "--method", "single", check=False)
    assert other.returncode == 2 and "field budget.lr: 0.0003 vs 0.5" in other.stderr
    assert "python 04_rollout.py" not in other.stdout
