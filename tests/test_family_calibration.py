"""experiments/bench/family_calibration.py: which training tasks it scores and the per-family table (no model)."""
import json

from conftest import load_stage

B = load_stage("experiments/bench/family_calibration.py")


def test_it_takes_the_first_tasks_of_each_family_after_the_demonstrations(tmp_path):
    families = ["a", "b", "c"]
    tasks = [{"task_id": f"t{i}", "family": families[i % 3]} for i in range(30)]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(t) + "\n" for t in tasks))
    chosen = B.calibration_tasks(path, skip=6, per_family=2)
    assert [t["task_id"] for t in chosen] == ["t6", "t7", "t8", "t9", "t10", "t11"]  # t0-t5: the warm start's
    assert len(B.calibration_tasks(path, skip=0, per_family=100)) == 30


def test_the_table_counts_successes_per_family_with_exact_intervals():
    records = [{"family": "a", "success": s} for s in (True, False, False, False)] + \
              [{"family": "b", "success": False}] * 5
    rows = B.family_table(records)
    assert [r[:3] for r in rows] == [("a", 1, 4), ("b", 0, 5)]
    low, high = rows[1][3:]
    assert low == 0.0 and abs(high - (1 - 0.025 ** (1 / 5))) < 1e-6  # 0 / 5: the upper bound solves (1-p)^5 = 0.025
