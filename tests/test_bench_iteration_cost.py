"""experiments/bench/bench_iteration_cost.py's report from two run folders made by hand: the per-iteration sums, the
ratios after / before, the split into work (04's episodes + 05's update and scoring) and the rest, and the episode
agreement, each against numbers computed here."""
import json
import sys
import types

from conftest import ROOT, load_stage

sys.path.insert(0, str(ROOT / "experiments" / "bench"))
B = load_stage("experiments/bench/bench_iteration_cost.py")

STEPS = {"before": {"04-it0": 70.0, "05-it0": 50.0, "04-it1": 80.0, "05-it1": 60.0},
         "after": {"04-it0": 100.0, "05-it0": 55.0, "04-it1": 40.0, "05-it1": 50.0}}
WORK = {"before": [(40.0, 44.0), (45.0, 50.0)], "after": [(42.0, 46.0), (38.0, 45.0)]}  # (04 episodes, 05 update+prep)


def episode(i, success, ids):
    return {"episode_id": f"e{i}", "success": success, "finish_reason": "submitted" if success else "turn_budget",
            "turns": 2, "model_turns": [{"completion_ids": ids}]}


def make(tmp_path, version):
    run = tmp_path / version
    for t in (0, 1):
        it = run / f"iter_{t:03d}"
        it.mkdir(parents=True)
        eps = [episode(0, True, [1, 2]), episode(1, False, [3]), episode(2, version == "after" and t == 1, [4])]
        if version == "after":
            eps[0]["model_turns"][0]["completion_ids"] = [1, 5]  # same outcome, other tokens
        (it / "rollouts.jsonl").write_text("".join(json.dumps(e) + "\n" for e in eps))
        (it / "04_rollout_config.json").write_text(json.dumps({"wall_seconds": WORK[version][t][0]}))
        update = WORK[version][t][1]
        (it / "05_train_config.json").write_text(json.dumps({"update_s": update - 4.0, "prep_s": 4.0}))
    return run


def test_report_sums_ratios_work_and_agreement(tmp_path):
    args = types.SimpleNamespace(iterations=2, work_runs={v: make(tmp_path, v) for v in ("before", "after")})
    text = B.report(args, {"before": "aaa", "after": "bbb"}, {"before": 260.0, "after": 245.0}, STEPS, "cmd")
    before = [STEPS["before"][f"04-it{t}"] + STEPS["before"][f"05-it{t}"] for t in (0, 1)]  # 120, 140
    after = [STEPS["after"][f"04-it{t}"] + STEPS["after"][f"05-it{t}"] for t in (0, 1)]  # 155, 90
    assert f"| 1 | 80.0 | 60.0 | {before[1]:.1f} | 40.0 | 50.0 | {after[1]:.1f} | {after[1] / before[1]:.2f} |" in text
    assert f"an iteration {sum(after) / sum(before):.2f} over all 2" in text
    assert f"{after[1] / before[1]:.2f} over iterations 1-1" in text
    rest = {v: [sum(STEPS[v][f"0{s}-it{t}"] for s in (4, 5)) - sum(WORK[v][t]) for t in (0, 1)] for v in STEPS}
    assert f"| 1 | {sum(WORK['before'][1]):.1f} | {rest['before'][1]:.1f} | {sum(WORK['after'][1]):.1f} | " \
           f"{rest['after'][1]:.1f} |" in text
    # at equal work: W = mean of both versions' iteration-1 work = (95 + 83) / 2 = 89; rests 45 (before), 7 (after)
    w = (sum(WORK["before"][1]) + sum(WORK["after"][1])) / 2
    assert f"{w:.1f} s) an iteration is (W + after's rest) / (W + before's rest) = " \
           f"{(w + rest['after'][1]) / (w + rest['before'][1]):.2f}." in text
    # episodes: iteration 0 all outcomes equal, one episode's tokens differ; iteration 1 one outcome differs too
    assert "| 0 | 3 | 3 | 2 |" in text and "| 1 | 3 | 2 | 2 |" in text
