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
import itertools
import json
import re
from pathlib import Path

from common.plumbing import fail, jsonl_text, locked, read_json, read_text, surrogate_field, write_atomic
from common.schemas import validate_component

ORDER = ["S", "T", "O", "C", "W"]
COMPONENT_NAMES = {"S": "system prompt", "T": "tool interface", "O": "observation",
                   "C": "context management", "W": "workflow"}

# ---------------------------------------------------------------------------------------
# The realisations (the contract's 15). Placeholders in braces are filled by 04: {tool_docs}
# (T's tools in T's syntax, or one line pointing at the declared functions), {workflow_rules} (W.rules), {max_turns},
# and {submit}, the name T gives
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
# declare: how the model learns the tools. "chat_template": as JSON schemas through the chat template's `tools`, the
# way an OpenAI-compatible server renders them for every real agent framework (the template's tool block asks for
# <tool_call>{json}</tool_call>, so only the hermes_json syntax declares this way). "system_prompt": signatures and
# a call example written into S's {tool_docs}, in T's own syntax (the XML and Python syntaxes have no template of
# their own; a schema block that asks for JSON calls would contradict them).
T = [
    {"id": "T0", "desc": "base: native function calling (JSON schemas via the chat template, <tool_call> JSON)",
     "syntax": "hermes_json", "declare": "chat_template", "max_calls_per_turn": 1,
     "tools": {"list_files": {"name": "list_files", "args": {}},
               "read_file": {"name": "read_file", "args": {"path": "path"}},
               "search": {"name": "search", "args": {"query": "query"}},
               "write_file": {"name": "write_file", "args": {"path": "path", "content": "content"}},
               "calculator": {"name": "calculator", "args": {"expression": "expression"}},
               "submit": {"name": "submit", "args": {"answer": "answer"}}}},
    {"id": "T1", "desc": "XML <invoke name=..><parameter ..>, renamed tools and args, 1 call a turn",
     "syntax": "xml_invoke", "declare": "system_prompt", "max_calls_per_turn": 1,
     "tools": {"list_files": {"name": "ls", "args": {}},
               "read_file": {"name": "open", "args": {"path": "file"}},
               "search": {"name": "grep", "args": {"query": "pattern"}},
               "write_file": {"name": "save", "args": {"path": "file", "content": "text"}},
               "calculator": {"name": "calc", "args": {"expression": "expr"}},
               "submit": {"name": "final_answer", "args": {"answer": "result"}}}},
    {"id": "T2", "desc": "Python calls name(arg=\"...\"), renamed tools and args, up to 3 calls a turn",
     "syntax": "python_call", "declare": "system_prompt", "max_calls_per_turn": 3,
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
# Helpers
# ---------------------------------------------------------------------------------------
def harness_id(levels, order=ORDER):
    """{"S":0,"T":2,"O":1,"C":0,"W":1} -> "S0-T2-O1-C0-W1"."""
    return "-".join(f"{c}{levels[c]}" for c in order)


def hamming(levels_a, levels_b, order=ORDER):
    """Hamming distance between two configurations (dicts component -> level)."""
    # d_H(h_i, h_j) = sum over components c in {S,T,O,C,W} of 1[h_i^c != h_j^c]
    return sum(levels_a[c] != levels_b[c] for c in order)


# ---- input checking ----
# A realisation is one component of a harness record: schemas.HARNESS holds its fields (04 checks the same table on
# the records it reads). A realisation here must also be complete: every field but the out-of-space extras, as the
# base spells them out. Besides, it has "id" (S0, S1, ... in list order) and a one-line "desc".
def validate_components(components, source):
    """Check the realisation specs; stop with a message naming the component and realisation."""
    for c in ORDER:
        specs = components.get(c)
        if not isinstance(specs, list) or len(specs) < 1:
            fail(f"{source}: component '{c}' must be a non-empty list of realisations")
        base_fields = set(specs[0]) if isinstance(specs[0], dict) else set()
        for i, spec in enumerate(specs):
            where = f"{source}: component '{c}', realisation {i}"
            if not isinstance(spec, dict):
                fail(f"{where}: must be a JSON object")
            for field in ("id", "desc"):
                if field not in spec:
                    fail(f"{where}: field '{field}' is missing")
            if spec["id"] != f"{c}{i}":
                fail(f"{where}: field 'id' is {spec['id']!r}, expected '{c}{i}' (ids follow list order)")
            if not isinstance(spec["desc"], str) or not spec["desc"] or "\n" in spec["desc"]:
                fail(f"{where}: field 'desc' must be a one-line description")
            validate_component(c, spec, where, complete=True)
            extra = set(spec) - base_fields
            if extra:
                fail(f"{where}: field '{sorted(extra)[0]}' is not in the base realisation {c}0 "
                     f"(all realisations of a component share the base's fields)")
    extra = set(components) - set(ORDER)
    if extra:
        fail(f"{source}: unknown component '{sorted(extra)[0]}' (components are {ORDER})")


def load_components(path):
    """Read a components.json-style file given with --components."""
    data = read_json(path)
    field = surrogate_field(data)
    if field:  # the line of the first \ud800-style escape
        line = next((n for n, ln in enumerate(read_text(path).splitlines(), 1) if re.search(r"\\u[dD][89a-fA-F]", ln)),
                    "?")
        fail(f"{path}:{line}: field '{field}': a lone UTF-16 surrogate (e.g. \\ud800) is not text")
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
