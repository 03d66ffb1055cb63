"""The stages stay short enough to read in one sitting (docs/decisions.md: "04 and 05 stay within 700 lines by
holding only their algorithm"), and 05 puts its algorithm before its plumbing."""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 700


def test_every_stage_within_700_lines():
    stages = sorted(ROOT.glob("0[1-6]_*.py"))
    assert len(stages) == 6
    long = {p.name: n for p in stages if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"stages over {MAX_LINES} lines (move plumbing out, docs/decisions.md): {long}"


def test_05_reads_algorithm_first():
    """A reader meets 05's algorithm (sequences, advantages, the objective, pi_old, the update) before its input
    checking, the stage's steps and main."""
    sections = re.findall(r"^# -{10,} (.+)$", (ROOT / "05_train.py").read_text(), re.M)
    assert sections.index("the algorithm") < sections.index("the objective") < sections.index("input checking")
    assert sections[-2:] == ["the stage's steps, in order", "main"]
