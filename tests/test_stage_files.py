"""05 puts its algorithm before its plumbing: a reader meets the update before the input checking. (No line cap:
a cap measures the wrong thing and invites packed lines; a reader judges a stage's length.)"""
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_05_reads_algorithm_first():
    """A reader meets 05's algorithm (sequences, advantages, the objective, pi_old, the update) before its input
    checking, the stage's steps and main."""
    sections = re.findall(r"^# -{10,} (.+)$", (ROOT / "05_train.py").read_text(), re.M)
    assert sections.index("the algorithm") < sections.index("the objective") < sections.index("input checking")
    assert sections[-2:] == ["the stage's steps, in order", "main"]


def imports_of(path):
    """The project folders a file imports from (common, bridges, experiments), read from its import statements."""
    import ast
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module or ""] if isinstance(node, ast.ImportFrom) else []
        found |= {n.split(".")[0] for n in names} & {"common", "bridges", "experiments"}
    return found


def test_imports_run_one_way():
    """The layout the README draws: the top level holds the six stages and the pipeline; common/ imports nothing of
    the project's but itself, bridges/ only common/, experiments/ common/ and itself, and the stages and the pipeline
    only common/ (04 loads a bridge by name, schemas.BLACKBOXES): nothing imports the experiment layer."""
    top = sorted(p.name for p in ROOT.glob("*.py"))
    assert top == ["01_harness_space.py", "02_orthogonal_design.py", "03_assignment.py", "04_rollout.py",
                   "05_train.py", "06_evaluate.py", "pipeline.py"]
    allowed = {"common": {"common"}, "bridges": {"common", "bridges"}, "experiments": {"common", "experiments"}}
    for folder, ok in allowed.items():
        for path in (ROOT / folder).rglob("*.py"):
            assert imports_of(path) <= ok, (path, imports_of(path))
    for path in ROOT.glob("*.py"):
        assert imports_of(path) <= {"common"}, (path, imports_of(path))
    assert imports_of(ROOT / "data" / "tiny_model.py") <= {"common"}
