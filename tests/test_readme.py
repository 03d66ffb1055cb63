"""The README is read in one sitting and says only what the code does.

- every relative link in README.md and docs/*.md names a file (and a heading, for `#anchor`) inside the repository;
- every command `python SCRIPT.py ... --flag` (or `torchrun ... SCRIPT.py --flag`) in README.md's code, fenced
  blocks and inline spans alike, names a script that exists and only flags that its argparse declares (read from
  the script's source: the string options of its add_argument calls; no import, so no torch);
- the test command that CI runs (.ci/run) is the README's;
- the README carries no history ("issue N": what changed is in git);
- the README's results are the summaries experiments/compare.py generates from the records
(results/tables/*-summary.md),
  byte for byte, each with its figure.
"""
import ast
import re
import shlex
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))

FENCE = re.compile(r"^(`{3,}|~{3,})[^\n]*\n(.*?)^\1[ \t]*$", re.M | re.S)
INLINE = re.compile(r"(`+)(.+?)\1", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REF_LINK = re.compile(r"^\s*\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$", re.M)
SEPARATORS = {"&&", "||", ";", "|", ">", ">>", "2>", "2>&1"}


def code_and_prose(text):
    """(code snippets: fenced blocks and inline spans, prose with both removed)."""
    code = [m.group(2) for m in FENCE.finditer(text)]
    prose = FENCE.sub("", text)
    code += [m.group(2) for m in INLINE.finditer(prose)]
    return code, INLINE.sub("", prose)


def slug(heading):
    """GitHub's anchor of a heading: lower case, markup and punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[`*]|<[^>]+>", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path):
    text = FENCE.sub("", path.read_text(encoding="utf-8"))
    seen, out = {}, set()
    for h in re.findall(r"^#{1,6}\s+(.+?)\s*#*\s*$", text, re.M):
        s = slug(h)
        out.add(s if s not in seen else f"{s}-{seen[s]}")
        seen[s] = seen.get(s, 0) + 1
    return out


def relative_links(path):
    _, prose = code_and_prose(path.read_text(encoding="utf-8"))
    targets = LINK.findall(prose) + REF_LINK.findall(prose)
    return [t for t in targets if not re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", t)]  # http:, https:, mailto:


def declared_flags(script):
    """The option strings of every add_argument call in `script` (BooleanOptionalAction adds --no-X), plus -h."""
    flags = {"-h", "--help"}
    for node in ast.walk(ast.parse(script.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "add_argument":
            names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            flags.update(n for n in names if n.startswith("-"))
            action = next((k.value for k in node.keywords if k.arg == "action"), None)
            if getattr(action, "attr", None) == "BooleanOptionalAction":
                flags.update("--no-" + n[2:] for n in names if n.startswith("--"))
    return flags


def commands(snippet, bare=True):
    """(script, [flags], line) for each python/torchrun command of a code snippet (bare: also a line that starts
    with a script, as in `05_train.py --init-tiny`). Lines ending in a backslash are joined; a `#` after
    whitespace starts a comment; placeholders such as [--lr 3e-4] or [--a|--no-a] count with the flags they
    spell."""
    text = re.sub(r"\\\n", " ", snippet)
    for line in text.splitlines():
        line = re.split(r"(?:^|\s)#", line, maxsplit=1)[0]
        try:
            words = shlex.split(line)
        except ValueError:  # an unbalanced quote in prose-like code: fall back to spaces
            words = line.split()
        i = 0
        while i < len(words):
            w = words[i]
            script = None
            if re.fullmatch(r"python(3(\.\d+)?)?", w) and i + 1 < len(words) and words[i + 1].endswith(".py"):
                script, i = words[i + 1], i + 1
            elif w == "torchrun":
                j = next((j for j in range(i + 1, len(words)) if words[j].endswith(".py")), None)
                if j is not None:
                    script, i = words[j], j
            elif bare and i == 0 and w.endswith(".py") and not w.startswith("tests/"):
                script = w
            if script is None:
                i += 1
                continue
            flags = []
            i += 1
            while i < len(words) and words[i] not in SEPARATORS:
                flags += re.findall(r"(?<![\w-])(--[A-Za-z][\w-]*)", words[i])
                i += 1
            yield script, flags, line.strip()


def commands_of(doc, bare=True):
    code, _ = code_and_prose(doc.read_text(encoding="utf-8"))
    return [c for snippet in code for c in commands(snippet, bare)]


def unknown_flags(found):
    bad, known = [], {}
    for script, flags, line in found:
        path = ROOT / script
        if not path.is_file():
            bad.append(f"{script}: no such script ({line})")
            continue
        known.setdefault(script, declared_flags(path))
        bad += [f"{script} has no {f} ({line})" for f in flags if f not in known[script]]
    return bad


@pytest.mark.parametrize("doc", [README, *DOCS], ids=lambda p: p.relative_to(ROOT).as_posix())
def test_relative_links_resolve_inside_the_repository(doc):
    bad = []
    for target in relative_links(doc):
        file_part, _, anchor = target.partition("#")
        dest = (doc.parent / file_part).resolve() if file_part else doc
        if not dest.is_relative_to(ROOT):
            bad.append(f"{target}: outside the repository")
        elif not dest.exists():
            bad.append(f"{target}: no such file")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target}: no heading #{anchor} in {dest.relative_to(ROOT)}")
    assert not bad, f"{doc.relative_to(ROOT)}: " + "; ".join(bad)


def test_readme_points_only_inside_the_repository():
    """From the repository root a `../` path, linked or quoted, is always outside it."""
    outside = re.findall(r"\S*\.\./\S*", README.read_text(encoding="utf-8"))
    assert not outside, f"README.md points outside the repository: {outside}"


def test_readme_commands_use_existing_scripts_and_flags():
    found = commands_of(README)
    assert len({s for s, _, _ in found}) >= 7, "the README shows every stage's command"
    bad = unknown_flags(found)
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_docs_commands_use_existing_scripts_and_flags(doc):
    """The same for docs/ (python and torchrun lines only: docs also quote files of other repositories)."""
    bad = unknown_flags(commands_of(doc, bare=False))
    assert not bad, "\n".join(bad)


def as_shown(command):
    """A test command as the README shows it: `python`, no comment, no --durations (a report, not a selection)."""
    command = re.sub(r"^python3 ", "python ", command.split("  #")[0].strip())
    return re.sub(r" --durations=\d+", "", command)


def test_readme_shows_the_test_commands_ci_runs():
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    ci_cmds = [as_shown(line) for line in ci.splitlines() if re.match(r"\s*python3? -m pytest\b", line)]
    code, _ = code_and_prose(README.read_text(encoding="utf-8"))
    shown = {as_shown(line) for snippet in code for line in snippet.splitlines()}
    assert len(ci_cmds) == 3, ci_cmds  # the quick suite, the slow tests without vLLM, the vLLM tests
    missing = [c for c in ci_cmds if c not in shown]
    assert not missing, f"README does not show CI's test commands: {missing}"


def test_readme_has_no_history():
    text = README.read_text(encoding="utf-8")
    refs = re.findall(r".{0,30}\bissues? #?\d+.{0,30}", text, re.I)
    assert not refs, f"README.md refers to issues (what changed is in git): {refs}"


def test_the_checks_can_fail(tmp_path):
    """The parsers above catch what they are for: a made-up flag, a missing script, a link out of the repo."""
    snippet = ("python 05_train.py --run R \\\n    --no-such-flag 1   # a comment --ignored\n"
               "torchrun --nproc_per_node 2 -- 05_train.py --fsdp\n")
    found = list(commands(snippet))
    assert [(s, f) for s, f, _ in found] == [("05_train.py", ["--run", "--no-such-flag"]),
                                               ("05_train.py", ["--fsdp"])]
    assert "--no-such-flag" not in declared_flags(ROOT / "05_train.py")
    assert "--no-enforce-eager" in declared_flags(ROOT / "04_rollout.py")  # BooleanOptionalAction
    doc = tmp_path / "x.md"
    doc.write_text("[a](../../outside.txt) `[b](in-code.md)` [c](https://example.org) [d](#here)\n")
    assert relative_links(doc) == ["../../outside.txt", "#here"]
    assert slug("Stage 05: the trainer (`05_train.py`)") == "stage-05-the-trainer-05_trainpy"


# ---- the README's results: the generated summary, byte for byte ----
# README.md shows each summary experiments/compare.py writes (results/tables/<ledger>-summary.md, regenerated from the
# records by `python experiments/compare.py --ledger results/records --out results/tables`, which tests/test_ledger.py holds) between
# <!-- summary: PATH --> and <!-- end summary -->, with its figure PATH.svg above it.
BLOCK = re.compile(r"<!-- summary: (\S+) -->\n(.*?)<!-- end summary -->", re.S)


def summary_mismatches(readme_text):
    """Each README summary block that is not its file's text, or whose figure the README does not show."""
    blocks = BLOCK.findall(readme_text)
    if not blocks:
        return ["README.md shows no generated summary (<!-- summary: results/tables/...-summary.md -->)"]
    bad = []
    for path, shown in blocks:
        made = (ROOT / path).read_text(encoding="utf-8") if (ROOT / path).is_file() else None
        if shown != made:
            bad.append(f"{path}: the README's copy differs from the file (copy the file between the markers)")
        if f"]({path.removesuffix('.md')}.svg)" not in readme_text:
            bad.append(f"{path}: the README does not show its figure {path.removesuffix('.md')}.svg")
    return bad


def test_readme_shows_the_generated_summary_byte_for_byte():
    bad = summary_mismatches(README.read_text(encoding="utf-8"))
    assert not bad, "\n".join(bad)


def test_the_summary_check_can_fail():
    """A changed figure, a dropped line, a missing figure or no block at all is each reported."""
    text = README.read_text(encoding="utf-8")
    path, shown = BLOCK.findall(text)[0]
    line = next(ln for ln in shown.splitlines() if re.match(r"\| [\w+-]+ \| [\d, ]+ \| \d+\.\d \|", ln))  # a policy row
    number = re.search(r"\| (\d+\.\d) \|", line).group(1)
    for changed in (text.replace(line, line.replace(f"| {number} |", f"| {float(number) + 0.1:.1f} |", 1)),
                    text.replace(line + "\n", ""), text.replace(f"]({path.removesuffix('.md')}.svg)", "](x.svg)"),
                    BLOCK.sub("", text)):
        assert changed != text and summary_mismatches(changed)
