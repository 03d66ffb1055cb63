"""Stage 01: the factorised harness space H = S x T x O x C x W.

A harness is how an agent's episode is presented to the policy. We factorise it into five
components, each with a few *realisations* (realisation 0 is the base harness, the others
are transformations of it that a policy could overfit to):

    S  system prompt        wording, length, structure, where the rules stand
    T  tool interface       call syntax, tool and argument names, calls per turn
    O  observation          raw / enveloped + line-numbered / truncated, how errors read
    C  context management   full history / sliding window / older outputs elided
    W  workflow             free ReAct / plan-first / verify-before-submit + step budget

A harness configuration picks one realisation per component; its id reads e.g.
`S0-T2-O1-C0-W1`. With 3 realisations each the space has 3^5 = 243 configurations.
Realisations are plain data (templates and parameters, below); `04_rollout.py` interprets
them. To add one, append a dict to a component's list (next id, same fields as the base)
or pass your own file with `--components` in the format of the `components.json` this
stage writes. A component may have any number of realisations; stages 02 and 03 follow.

Writes into the run folder:
    components.json           {"order": [...], "components": {"S": [spec0, spec1, ...], ...}}
    harness_space.jsonl       one configuration per line: harness_id, levels, specs
    01_harness_space_config.json

Commands:
    python 01_harness_space.py --run runs/default
    python 01_harness_space.py --run runs/mine --components my_components.json
"""
import argparse
import contextlib
import itertools
import json
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

ORDER = ["S", "T", "O", "C", "W"]
COMPONENT_NAMES = {"S": "system prompt", "T": "tool interface", "O": "observation",
                   "C": "context management", "W": "workflow"}

# ---------------------------------------------------------------------------------------
# The realisations (the contract's 15). Placeholders in braces are filled by 04: {tool_docs}
# (T's tools in T's syntax), {workflow_rules} (W.rules), {max_turns}, and {submit}, the name T gives
# the submit tool (so no S realisation names a tool that some T renames: S stays independent of T).
# ---------------------------------------------------------------------------------------
S = [
    {"id": "S0", "desc": "base: role, tool docs, submit instruction, workflow rules",
     "template": "You are an agent in a small file workspace. Solve the user's task with the tools.\n"
                 "{tool_docs}\nWhen you know the answer, call {submit}.\n{workflow_rules}"},
    {"id": "S1", "desc": "terse, rules first, states the reply budget",
     "template": "Rules: finish with {submit}; at most {max_turns} replies.\n{workflow_rules}\n"
                 "Tools:\n{tool_docs}"},
    {"id": "S2", "desc": "structured markdown sections, rules last",
     "template": "# Role\nWorkspace assistant.\n# Tools\n{tool_docs}\n# Workflow\n{workflow_rules}\n"
                 "# Rules\nAnswer only through the {submit} tool."},
]

# tools: canonical tool -> {"name": name shown to the model, "args": {canonical arg: shown arg}}
T = [
    {"id": "T0", "desc": "base: Hermes <tool_call>{json}</tool_call>, canonical names, 1 call a turn",
     "syntax": "hermes_json", "max_calls_per_turn": 1,
     "tools": {"list_files": {"name": "list_files", "args": {}},
               "read_file": {"name": "read_file", "args": {"path": "path"}},
               "search": {"name": "search", "args": {"query": "query"}},
               "write_file": {"name": "write_file", "args": {"path": "path", "content": "content"}},
               "calculator": {"name": "calculator", "args": {"expression": "expression"}},
               "submit": {"name": "submit", "args": {"answer": "answer"}}}},
    {"id": "T1", "desc": "XML <invoke name=..><parameter ..>, renamed tools and args, 1 call a turn",
     "syntax": "xml_invoke", "max_calls_per_turn": 1,
     "tools": {"list_files": {"name": "ls", "args": {}},
               "read_file": {"name": "open", "args": {"path": "file"}},
               "search": {"name": "grep", "args": {"query": "pattern"}},
               "write_file": {"name": "save", "args": {"path": "file", "content": "text"}},
               "calculator": {"name": "calc", "args": {"expression": "expr"}},
               "submit": {"name": "final_answer", "args": {"answer": "result"}}}},
    {"id": "T2", "desc": "Python calls name(arg=\"...\"), renamed tools and args, up to 3 calls a turn",
     "syntax": "python_call", "max_calls_per_turn": 3,
     "tools": {"list_files": {"name": "list_dir", "args": {}},
               "read_file": {"name": "cat", "args": {"path": "filename"}},
               "search": {"name": "find", "args": {"query": "text"}},
               "write_file": {"name": "write", "args": {"path": "filename", "content": "body"}},
               "calculator": {"name": "compute", "args": {"expression": "formula"}},
               "submit": {"name": "done", "args": {"answer": "value"}}}},
]

O = [
    {"id": "O0", "desc": "base: raw output as a tool message",
     "role": "tool", "template": "{output}", "error_template": "Error: {error}",
     "max_chars": 2000, "truncate_marker": "...", "line_numbers": False},
    {"id": "O1", "desc": "structured <result> envelope, line-numbered output",
     "role": "tool", "template": "<result tool=\"{tool}\">\n{output}\n</result>",
     "error_template": "<result tool=\"{tool}\" status=\"error\">{error}</result>",
     "max_chars": 2000, "truncate_marker": "...", "line_numbers": True},
    {"id": "O2", "desc": "sent as a user message, cut at 300 chars with a marker",
     "role": "user", "template": "[{tool}] {output}", "error_template": "!! {tool} failed: {error}",
     "max_chars": 300, "truncate_marker": "...[truncated {n} chars]", "line_numbers": False},
]

# The system message and the first user message (the task) are always kept.
C = [
    {"id": "C0", "desc": "base: full history", "mode": "full", "k": None, "elided_text": None},
    {"id": "C1", "desc": "sliding window: only the last 2 (reply, observation) exchanges",
     "mode": "window", "k": 2, "elided_text": None},
    {"id": "C2", "desc": "compaction: every observation but the last one is elided",
     "mode": "elide", "k": 1, "elided_text": "[output elided]"},
]

W = [
    {"id": "W0", "desc": "base: free ReAct", "rules": "", "plan_first": False, "plan_prefix": None,
     "budget_reminder": None, "verify_before_submit": False, "verify_marker": None},
    {"id": "W1", "desc": "plan-first: the first reply must start with 'Plan:'",
     "rules": "Start your first reply with a line 'Plan: ...'.", "plan_first": True,
     "plan_prefix": "Plan:", "budget_reminder": None, "verify_before_submit": False,
     "verify_marker": None},
    {"id": "W2", "desc": "verify-before-submit ('Checked:' line) + replies-left reminder",
     "rules": "In the reply with the final answer, start a line with 'Checked: ...'.", "plan_first": False,
     "plan_prefix": None, "budget_reminder": "({left} replies left)", "verify_before_submit": True,
     "verify_marker": "Checked:"},
]

COMPONENTS = {"S": S, "T": T, "O": O, "C": C, "W": W}

# ---------------------------------------------------------------------------------------
# Args
# ---------------------------------------------------------------------------------------
def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Stage 01: build the harness space H = S x T x O x C x W.")
    p.add_argument("--run", default="runs/default", help="run folder to write into (created if missing)")
    p.add_argument("--components", default=None,
                   help="optional JSON file with your own realisations, in the format of the "
                        "components.json this stage writes (default: the realisations embedded here)")
    return p.parse_args(argv)


# ---------------------------------------------------------------------------------------
# Helpers (repeated in each stage on purpose)
# ---------------------------------------------------------------------------------------
def fail(msg):
    print(f"error: {msg}", file=sys.stderr)
    raise SystemExit(2)


def write_atomic(path, text):
    """Write to a temporary file in the same folder, then rename it: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:  # e.g. interrupted: no half .tmp left behind
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, path)


def jsonl_text(records):
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)


def harness_id(levels, order=ORDER):
    """{"S":0,"T":2,"O":1,"C":0,"W":1} -> "S0-T2-O1-C0-W1"."""
    return "-".join(f"{c}{levels[c]}" for c in order)


def hamming(levels_a, levels_b, order=ORDER):
    """Hamming distance between two configurations (dicts component -> level)."""
    # d_H(h_i, h_j) = sum over components c in {S,T,O,C,W} of 1[h_i^c != h_j^c]
    return sum(levels_a[c] != levels_b[c] for c in order)


# ---- input checking ----
# The schema of a realisation, field -> (kind, required), checked before the space is built.
# Every realisation carries "id" and "desc" besides; 04 checks the same table on harness records. The optional
# fields are the out-of-space extras 04 understands (data/external_harnesses.json).
SCHEMA = {
    "S": {"template": ("text", True), "placement": (("system", "user"), False), "task_prefix": ("text or null", False)},
    "T": {"syntax": (("hermes_json", "xml_invoke", "python_call", "shell", "react"), True), "tools": ("tools", True),
          "max_calls_per_turn": ("int >= 1", True), "final_answer": ("text", False)},
    "O": {"role": (("tool", "user"), True), "template": ("text", True), "error_template": ("text", True),
          "max_chars": ("int >= 1", True), "truncate_marker": ("text or null", True), "line_numbers": ("bool", True)},
    "C": {"mode": (("full", "window", "elide"), True), "k": ("int >= 0 or null", True),
          "elided_text": ("text or null", True)},
    "W": {"rules": ("text or null", True), "plan_first": ("bool", True), "plan_prefix": ("text or null", True),
          "budget_reminder": ("text or null", True), "verify_before_submit": ("bool", True),
          "verify_marker": ("text or null", True), "reply_marker": ("text or null", False)},
}
KINDS = {  # kind -> (check, what the message says)
    "text": (lambda v: isinstance(v, str), "a string"),
    "text or null": (lambda v: v is None or isinstance(v, str), "a string or null"),
    "bool": (lambda v: isinstance(v, bool), "true or false"),
    "int >= 1": (lambda v: type(v) is int and v >= 1, "an integer >= 1"),
    "int >= 0 or null": (lambda v: v is None or (type(v) is int and v >= 0), "an integer >= 0 or null"),
    "tools": (lambda v: isinstance(v, dict), "an object canonical tool -> {name, args}"),
}
REQUIRED_FIELDS = {c: [f for f, (_, required) in fields.items() if required] for c, fields in SCHEMA.items()}
CANONICAL_TOOLS = {"list_files": [], "read_file": ["path"], "search": ["query"],
                   "write_file": ["path", "content"], "calculator": ["expression"],
                   "submit": ["answer"]}


def validate_components(components, source):
    """Check the realisation specs; stop with a message naming the component and field."""
    for c in ORDER:
        specs = components.get(c)
        if not isinstance(specs, list) or len(specs) < 1:
            fail(f"{source}: component '{c}' must be a non-empty list of realisations")
        base_fields = set(specs[0]) if isinstance(specs[0], dict) else set()
        for i, spec in enumerate(specs):
            where = f"{source}: component '{c}', realisation {i}"
            if not isinstance(spec, dict):
                fail(f"{where}: must be a JSON object")
            for field in ["id", "desc"] + REQUIRED_FIELDS[c]:
                if field not in spec:
                    fail(f"{where}: field '{field}' is missing")
            if spec["id"] != f"{c}{i}":
                fail(f"{where}: field 'id' is {spec['id']!r}, expected '{c}{i}' (ids follow list order)")
            if not isinstance(spec["desc"], str) or not spec["desc"] or "\n" in spec["desc"]:
                fail(f"{where}: field 'desc' must be a one-line description")
            for field, (kind, _) in SCHEMA[c].items():
                want = check_field(spec[field], kind) if field in spec else None
                if want:
                    fail(f"{where}: field '{field}': {json.dumps(spec[field])[:40]} is not {want}")
            extra = set(spec) - base_fields
            if extra:
                fail(f"{where}: field '{sorted(extra)[0]}' is not in the base realisation {c}0 "
                     f"(all realisations of a component share the base's fields)")
            if c == "T":
                tools = spec["tools"]
                for tool, args in CANONICAL_TOOLS.items():
                    entry = tools.get(tool) if isinstance(tools, dict) else None
                    if not isinstance(entry, dict) or "name" not in entry or "args" not in entry:
                        fail(f"{where}: field 'tools' needs an entry {{'name', 'args'}} for '{tool}'")
                    shown = entry["args"]
                    if not isinstance(shown, dict) or sorted(shown) != sorted(args) or not all(
                            isinstance(a, str) and a.strip() for a in shown.values()) or not (
                            isinstance(entry["name"], str) and entry["name"].strip()):
                        fail(f"{where}: field 'tools.{tool}': 'name' must be a non-empty string and 'args' an "
                             f"object mapping exactly {args} to non-empty names")
    extra = set(components) - set(ORDER)
    if extra:
        fail(f"{source}: unknown component '{sorted(extra)[0]}' (components are {ORDER})")


def check_field(value, kind):
    """None if value is of this kind (SCHEMA), else what it should be."""
    if isinstance(kind, tuple):
        return None if isinstance(value, str) and value in kind else f"one of {list(kind)}"
    ok, want = KINDS[kind]
    return None if ok(value) else want


def lone_surrogate(x, field=""):
    """The first field holding a lone UTF-16 surrogate (JSON "\\ud800": not text, cannot be written), or None."""
    if isinstance(x, str):
        try:
            x.encode("utf-8")
        except UnicodeEncodeError:
            return field or "(top level)"
        return None
    items = x.items() if isinstance(x, dict) else enumerate(x) if isinstance(x, list) else ()
    for k, v in items:
        name = f"{field}.{k}".lstrip(".")
        found = lone_surrogate(k, name + " (name)") or lone_surrogate(v, name)
        if found:
            return found.encode("utf-8", "replace").decode("utf-8")
    return None


def load_components(path):
    """Read a components.json-style file given with --components."""
    path = Path(path)
    if not path.is_file():
        fail(f"{path}: file not found")
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data[:e.start].count(b"\n") + 1
        fail(f"{path}, line {line}: invalid UTF-8 (byte {data[e.start]:#04x})")
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        fail(f"{path}, line {e.lineno}: invalid JSON ({e.msg})")
    field = lone_surrogate(data)
    if field:
        line = next((n for n, ln in enumerate(text.splitlines(), 1) if re.search(r"\\u[dD][89a-fA-F]", ln)), "?")
        fail(f"{path}, line {line}: field '{field}': a lone UTF-16 surrogate (e.g. \\ud800) is not text")
    if not isinstance(data, dict) or not isinstance(data.get("components"), dict):
        fail(f"{path}: field 'components' (an object component -> list of realisations) is missing")
    if data.get("order", ORDER) != ORDER:
        fail(f"{path}: field 'order' must be {ORDER}")
    return data["components"]


# ---- the algorithm ----
def build_space(components, order=ORDER):
    """The full product: one record per configuration, in lexicographic level order."""
    # H = S x T x O x C x W
    ranges = [range(len(components[c])) for c in order]
    space = []
    for combo in itertools.product(*ranges):
        levels = dict(zip(order, combo))
        space.append({"harness_id": harness_id(levels, order), "levels": levels,
                      "specs": {c: components[c][levels[c]] for c in order}})
    return space


def print_table(components):
    for c in ORDER:
        print(f"{c}  {COMPONENT_NAMES[c]} ({len(components[c])} realisations)")
        for spec in components[c]:
            print(f"    {spec['id']:<4} {spec['desc']}")


# ---- one writer at a time: a lock file (pid, command) while this stage writes (repeated per stage on purpose)
LOCK_ENV = "HARNESS_SCALING_LOCKS"  # the lock files held by the processes that started this one: path=pid;...


def pid_alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@contextlib.contextmanager
def locked(path):
    """Hold the lock file `path` (os.open O_CREAT|O_EXCL; it holds our pid and command) while the block runs. A
    second writer prints who holds it and exits 2; a lock whose pid is dead is stale and taken over; a lock held
    by the process that started this one (the pipeline, 06 calling 04) is ours. On exit the lock goes, and so do
    the folders made for it if they stayed empty: bad input leaves nothing behind."""
    path = Path(path).resolve()
    made = [p for p in [path.parent, *path.parent.parents] if not p.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    inherited = dict(x.rsplit("=", 1) for x in os.environ.get(LOCK_ENV, "").split(os.pathsep) if "=" in x)
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            try:
                holder = json.loads(path.read_text())
                pid = int(holder["pid"])
            except (OSError, ValueError, KeyError, TypeError):  # being written this instant, or garbage
                holder, pid = {}, None
            if pid is not None and inherited.get(str(path)) == str(pid):
                yield  # our parent holds it
                return
            if pid is not None and pid_alive(pid) or pid is None and path.exists() and \
                    time.time() - path.stat().st_mtime < 5:
                print(f"error: {path} is held by pid {pid} ({holder.get('command', '?')}); wait for it to finish, or "
                      "stop it (a lock whose process is gone is taken over)", file=sys.stderr)
                raise SystemExit(2)
            path.unlink(missing_ok=True)  # stale: its process is gone
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": os.getpid(), "command": " ".join(sys.argv)}, f)
    before = os.environ.get(LOCK_ENV)
    os.environ[LOCK_ENV] = os.pathsep.join(filter(None, [before, f"{path}={os.getpid()}"]))
    term = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is threading.main_thread() and term == signal.SIG_DFL:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # SIGTERM unwinds (finally runs), like Ctrl-C
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread() and term == signal.SIG_DFL:
            signal.signal(signal.SIGTERM, term)
        if before is None:
            os.environ.pop(LOCK_ENV, None)
        else:
            os.environ[LOCK_ENV] = before
        path.unlink(missing_ok=True)
        for p in made:  # deepest first
            if p.is_dir() and not any(p.iterdir()):
                p.rmdir()


# ---------------------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------------------
def main(argv=None):
    args = parse_args(argv)
    with locked(Path(args.run) / "run.lock"):  # one writer per run folder
        return run_stage(args)


def run_stage(args):
    components = load_components(args.components) if args.components else COMPONENTS
    validate_components(components, args.components or "01_harness_space.py (embedded realisations)")
    components = {c: components[c] for c in ORDER}

    space = build_space(components)
    sizes = [len(components[c]) for c in ORDER]
    ids = [h["harness_id"] for h in space]
    assert len(set(ids)) == len(ids), "harness ids must be unique"

    # Distances from the base harness: how the space spreads around it.
    base = space[0]
    by_distance = {}
    for h in space:
        d = hamming(base["levels"], h["levels"])
        by_distance[d] = by_distance.get(d, 0) + 1

    run = Path(args.run)
    run.mkdir(parents=True, exist_ok=True)
    config = {"stage": "01_harness_space", "args": vars(args), "order": ORDER,
              "realisations_per_component": dict(zip(ORDER, sizes)), "space_size": len(space),
              "configs_by_distance_from_base": by_distance}
    write_atomic(run / "components.json",
                 json.dumps({"order": ORDER, "components": components}, indent=1, ensure_ascii=False) + "\n")
    write_atomic(run / "01_harness_space_config.json", json.dumps(config, indent=1) + "\n")
    write_atomic(run / "harness_space.jsonl", jsonl_text(space))  # last: its presence means 01 finished

    print_table(components)
    print()
    size_eq = " x ".join(str(s) for s in sizes)
    print(f"space size |H| = {size_eq} = {len(space)} configurations")
    print("configurations at Hamming distance d from the base " + base["harness_id"] + ": "
          + ", ".join(f"d={d}: {n}" for d, n in sorted(by_distance.items())))
    example = space[-1]["harness_id"]
    print(f"example: d_H({base['harness_id']}, {example}) = {hamming(base['levels'], space[-1]['levels'])}")
    print(f"wrote {run / 'components.json'}, {run / 'harness_space.jsonl'}, {run / '01_harness_space_config.json'}")


if __name__ == "__main__":
    main()
