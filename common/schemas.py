"""The records the stages exchange, one table each, and one checker.

A table maps field -> (check, description, required): check(value) is True for a good value, the description ends
the error message, a required field must be there and an optional one is checked when it is. check_record stops at
the first bad field, through plumbing.fail (exit 2), with the place first, the way compilers name it:

    WHERE: field 'x' is missing
    WHERE: field 'x' is "300", not an integer >= 1

    HARNESS[c]   one component c of a harness record: 01 writes the realisations, 04 interprets them
    TASK         a task: workspace files, request, checker, optional solution (data/*_tasks.jsonl; 03, 04 read it)
    ASSIGNMENT   a line of RUN/assignment.jsonl: a task's harness group H_x (03 writes it, 04 reads it)
    ROLLOUT      an episode record, as 04 writes it (05 trains on it, 06 evaluates it; TRAIN_ROLLOUT: 05's reading)

The readers at the end (load_tasks, load_harness_file, load_run_harnesses, harness_pool, select_harnesses and
split_frameworks: what 04's --harnesses names, check_oracle, load_assignment, load_rollouts, load_train_rollouts)
add the rules that span records: ids unique, ids that name a task or a harness of the run, token ids inside the
policy's vocabulary, an update batch's rules (05). Every message names the file and line (`path:line:`).
"""
import json
import math
import random
from pathlib import Path

from common.environment import answer_items
from common.plumbing import fail, read_jsonl, read_text, surrogate_field

COMPONENTS = ["S", "T", "O", "C", "W"]  # a harness id names one level of each: S0-T2-O1-C0-W1
# The evaluation's columns (06 writes RUN/eval/<label>/<split>.jsonl; experiments/compare.py reads them): Base,
# In-Space, the two framework columns with native tool calls, then the unseen-call-syntax columns (04's external
# harnesses; smolagents' text mode). A framework column's harness id is the one its bridge records (04 --harnesses
# NAME).
SPLITS = ["base", "inspace", "smolagents-native", "pydantic-ai", "external", "smolagents"]
FRAMEWORKS = {"smolagents-native": "X-smolagents-native", "pydantic-ai": "X-pydantic-ai", "smolagents": "X-smolagents"}
# column titles: {fw} = the framework and version the episodes recorded (e.g. "pydantic-ai 2.68.0"), {ids} = the
# column's harness ids
SPLIT_TITLES = {"base": "Base", "inspace": "In-Space", "smolagents-native": "{fw} native", "pydantic-ai": "{fw}",
                "external": "Unseen syntax: {ids}", "smolagents": "Unseen syntax: {fw} text"}
SYNTAXES = ["hermes_json", "xml_invoke", "python_call", "shell", "react"]
CANONICAL_TOOLS = {"list_files": [], "read_file": ["path"], "search": ["query"], "write_file": ["path", "content"],
                   "calculator": ["expression"], "submit": ["answer"]}  # tool -> its arguments, in order



def levels_of(harness_id):
    """'S0-T2-O1-C0-W1' -> {'S': 0, 'T': 2, ...}; None for an out-of-space harness id (X-react, X-pydantic-ai)."""
    parts = harness_id.split("-")
    if len(parts) != len(COMPONENTS) or any(p[:1] != c or not p[1:].isdigit() for p, c in zip(parts, COMPONENTS)):
        return None
    return {c: int(p[1:]) for p, c in zip(parts, COMPONENTS)}

def clip(s, n=200):
    s = str(s)
    return s if len(s) <= n else s[:n] + "..."


def check_record(rec, table, where, prefix="", why=None):
    """Stop at the first field of `rec` that `table` refuses; `prefix` goes before the field's name (specs.O.);
    why: {field: the reason a missing field is needed, ending the message}."""
    for field, (ok, description, required) in table.items():
        if field not in rec:
            if required:
                fail(f"{where}: field '{prefix}{field}' is missing{(why or {}).get(field, '')}")
        elif not ok(rec[field]):
            fail(f"{where}: field '{prefix}{field}' is {clip(json.dumps(rec[field]), 40)}, not {description}")
    return rec


# ----------------------------------------------------------------------------- kinds of value: (check, description)
TEXT = (lambda v: isinstance(v, str), "a string")
TEXT_OR_NULL = (lambda v: v is None or isinstance(v, str), "a string or null")
BOOL = (lambda v: isinstance(v, bool), "true or false")  # not 0 / 1 / "yes"
COUNT = (lambda v: type(v) is int and v >= 0, "an integer >= 0")  # type(v) is int: true is not a number here
POSITIVE = (lambda v: type(v) is int and v >= 1, "an integer >= 1")
COUNT_OR_NULL = (lambda v: v is None or type(v) is int and v >= 0, "an integer >= 0 or null")


def one_of(*names):
    return lambda v: isinstance(v, str) and v in names, f"one of {list(names)}"


def list_of(kind, description):
    return lambda v: isinstance(v, list) and all(kind[0](x) for x in v), description


# ----------------------------------------------------------------------------- harness records
# required: the interpreter (04) has no default for it. An optional field falls back to the base's behaviour (e.g.
# T.max_calls_per_turn: 1, O.max_chars: 2000). 01 asks more of a realisation: it spells out every field but the
# out-of-space extras (OUT_OF_SPACE), as the base does, so that a components file reads complete.
HARNESS = {
    "S": {"template": (*TEXT, True), "placement": (*one_of("system", "user"), False),
          "task_prefix": (*TEXT_OR_NULL, False)},
    "T": {"syntax": (*one_of(*SYNTAXES), True), "declare": (*one_of("chat_template", "system_prompt"), False),
          "tools": (lambda v: isinstance(v, dict), "an object canonical tool -> {name, args}", True),
          "max_calls_per_turn": (*POSITIVE, False), "final_answer": (*TEXT, False)},
    "O": {"role": (*one_of("tool", "user"), True), "template": (*TEXT, True), "error_template": (*TEXT, True),
          "max_chars": (*POSITIVE, False), "truncate_marker": (*TEXT_OR_NULL, False), "line_numbers": (*BOOL, False)},
    "C": {"mode": (*one_of("full", "window", "elide"), True), "k": (*COUNT_OR_NULL, False),
          "elided_text": (*TEXT_OR_NULL, False)},
    "W": {"rules": (*TEXT_OR_NULL, False), "plan_first": (*BOOL, False), "plan_prefix": (*TEXT_OR_NULL, False),
          "reply_marker": (*TEXT_OR_NULL, False), "budget_reminder": (*TEXT_OR_NULL, False),
          "verify_before_submit": (*BOOL, False), "verify_marker": (*TEXT_OR_NULL, False)},
}
OUT_OF_SPACE = {"S": {"placement", "task_prefix"}, "T": {"final_answer"}, "W": {"reply_marker"}}  # extras (X-shell...)


def validate_tools(tools, where, field, every=False):
    """T.tools: each entry a canonical tool shown under a non-empty name with exactly its arguments, each shown under
    a non-empty name; submit always there (every: all six canonical tools, as 01's realisations have them)."""
    for tool, entry in tools.items():
        args = entry.get("args") if isinstance(entry, dict) else None
        if not (tool in CANONICAL_TOOLS and isinstance(args, dict) and set(args) == set(CANONICAL_TOOLS[tool])
                and all(isinstance(a, str) and a.strip() for a in args.values())
                and isinstance(entry.get("name"), str) and entry["name"].strip()):
            fail(f"{where}: field '{field}.{clip(tool, 40)}': needs a canonical tool, a non-empty name and 'args' "
                 f"mapping exactly {CANONICAL_TOOLS.get(tool, 'its args')} to non-empty names")
    for tool in CANONICAL_TOOLS if every else ["submit"]:
        if tool not in tools:
            fail(f"{where}: field '{field}': needs an entry for the {tool} tool")


def validate_component(c, spec, where, prefix="", complete=False):
    """One component's spec against HARNESS[c]; complete: every field but the out-of-space extras required (01)."""
    table = {f: (ok, d, req or complete and f not in OUT_OF_SPACE.get(c, ())) for f, (ok, d, req) in HARNESS[c].items()}
    check_record(spec, table, where, prefix)
    if c == "T":
        validate_tools(spec["tools"], where, prefix + "tools", every=complete)
        if spec.get("declare") == "chat_template" and spec["syntax"] != "hermes_json":
            fail(f"{where}: field '{prefix}declare': chat_template declares tools whose calls are <tool_call> JSON "
                 f"(syntax hermes_json), not {spec['syntax']}; declare them in the system_prompt")
    return spec


def validate_harness(h, where):
    """A harness record (harness_space.jsonl, the sets 02 writes, --harness-file): an id and specs S, T, O, C, W."""
    if not isinstance(h, dict) or not isinstance(h.get("harness_id"), str) or not h["harness_id"]:
        fail(f"{where}: field 'harness_id' missing")
    field = surrogate_field(h)
    if field:
        fail(f"{where}: field '{clip(field, 60)}': a lone UTF-16 surrogate (e.g. \\ud800) is not text")
    specs = h.get("specs")
    if not isinstance(specs, dict) or any(not isinstance(specs.get(c), dict) for c in COMPONENTS):
        fail(f"{where}: field 'specs' must hold objects S, T, O, C, W")
    for c in COMPONENTS:
        validate_component(c, specs[c], where, prefix=f"specs.{c}.")
    return h


# ----------------------------------------------------------------------------- tasks and the assignment
CHECKER_ARGS = {"answer_equals": ["value"], "answer_set": ["values"], "file_equals": ["path", "value"],
                "file_contains": ["path", "value"], "all": ["checks"]}


def valid_checker(c):
    """A checker environment.check can run: a known type with its arguments; answer_set's values a non-empty list of
    strings, each one item as the checker splits answers (no separator inside: else no answer could ever match)."""
    need = CHECKER_ARGS.get(c.get("type")) if isinstance(c, dict) and isinstance(c.get("type"), str) else None
    if need is None or any(k not in c for k in need):
        return False
    if c["type"] == "answer_set":
        values = c["values"]
        return isinstance(values, list) and bool(values) and \
            all(isinstance(v, str) and len(answer_items(v)) == 1 for v in values)
    return c["type"] != "all" or isinstance(c["checks"], list) and c["checks"] and all(map(valid_checker, c["checks"]))


def valid_step(s):
    return isinstance(s, dict) and s.get("tool") in CANONICAL_TOOLS and isinstance(s.get("args", {}), dict) \
        and set(s.get("args", {})) == set(CANONICAL_TOOLS[s["tool"]])


TASK = {
    "task_id": (*TEXT, True), "request": (*TEXT, True),
    "files": (lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
              "an object path -> text", True),
    "checker": (valid_checker, "a checker: type answer_equals (value), answer_set (values: a non-empty list of "
                "single items), file_equals / file_contains (path, value) or all (checks: a non-empty list of checkers)",
                True),
    "solution": (lambda v: not v or isinstance(v, list) and all(map(valid_step, v)),
                 "a list of steps {tool: a canonical tool, args: exactly its arguments} (the oracle's)", False),
    "family": (*TEXT, False),
}
ASSIGNMENT = {
    "task_id": (*TEXT, True),
    "harness_ids": (lambda v: isinstance(v, list) and len(v) > 0 and all(isinstance(x, str) for x in v),
                    "a non-empty list of harness ids", True),
}


# ----------------------------------------------------------------------------- rollout (episode) records
def finite(v):
    return type(v) in (int, float) and math.isfinite(v)


TURN_NUMBERS = list_of(POSITIVE, "a list of 1-based turn numbers")
ROLLOUT = {  # what 04 writes per episode; docs/stages.md explains each field
    "episode_id": (*TEXT, True),
    "iteration": (*COUNT_OR_NULL, True),  # null in eval mode
    "visit": (*COUNT_OR_NULL, True),  # train: the task's visit i (it ran H_x[i mod K]); eval: null
    "group_id": (*TEXT, True),  # "task|harness|itNNN" or "task|harness|eval": GRPO's group
    "sample_index": (*COUNT, True),
    "task_id": (*TEXT, True), "family": (*TEXT, True), "harness_id": (*TEXT, True),
    "policy": (*TEXT, True),  # a checkpoint folder or "oracle"
    "temperature": (lambda v: finite(v) and v >= 0, "a finite number > 0, or 0 (greedy)", True),
    "reward": (lambda v: finite(v) and 0 <= v <= 1, "a number in [0, 1]", True),
    "success": (*BOOL, True),  # reward == 1
    "checks": (*list_of((lambda v: type(v) is int and v in (0, 1), ""), "a list of 0 / 1 (each check)"), True),
    "finish_reason": (*one_of("submitted", "turn_budget", "context_limit"), True),
    "turns": (*COUNT, True), "parse_errors": (*COUNT, True), "tool_errors": (*COUNT, True),
    "workflow_violations": (*COUNT, True), "workflow_checks": (*COUNT, True),
    "error_turns": (*TURN_NUMBERS, True), "valid_call_turns": (*TURN_NUMBERS, True),
    "submitted_answer": (*TEXT_OR_NULL, True),
    "rerendered_turns": (*COUNT, True),
    "transcript": (lambda v: isinstance(v, list) and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                         and isinstance(m.get("content"), str) for m in v),
                   "a list of messages {role, content}", True),
    "model_turns": (lambda v: isinstance(v, list) and all(isinstance(t, dict) for t in v),
                    "a list of {prompt_ids, completion_ids, logprobs}", True),  # empty: the oracle without tokenizer
    "sampler": (lambda v: v is None or isinstance(v, dict), "an object {backend, dtype, ...} or null", True),
    "framework": (*TEXT, False),  # only the smolagents harness's episodes
    # the tools the chat template declared (T0: JSON schemas), null where the prompt's text declares them
    "tools": (lambda v: v is None or isinstance(v, list) and all(isinstance(t, dict) for t in v),
              "a list of tool schemas or null", False),
}
# 05 also trains on records 04 did not write (hand-made demonstrations, rewards of another scale: GRPO and PPO
# normalise them), so its reading lifts the reward's [0, 1] bound.
TRAIN_ROLLOUT = dict(ROLLOUT, reward=(finite, "a finite number", True))


# ----------------------------------------------------------------------------- readers: rules that span records
def load_tasks(path):
    """The tasks of a JSONL file, each checked against TASK; ids unique; family defaults to "custom"."""
    tasks, seen = [], set()
    for n, t in read_jsonl(path, " (tasks file)"):
        check_record(t, TASK, f"{path}:{n}")
        if t["task_id"] in seen:
            fail(f"{path}:{n}: field 'task_id': duplicate id {clip(t['task_id'], 60)!r}")
        seen.add(t["task_id"])
        t.setdefault("family", "custom")
        tasks.append(t)
    if not tasks:
        fail(f"{path}: no tasks")
    return tasks


def load_harness_file(path):
    """Harness records from a JSON object, a JSON list of objects, or JSONL; every record validated."""
    text = read_text(path, " (harness file)")
    try:
        data = json.loads(text)
        rows = [(f"{path}[{i}]", h) for i, h in enumerate(data)] if isinstance(data, list) else [(str(path), data)]
    except json.JSONDecodeError:
        rows = [(f"{path}:{n}", h) for n, h in read_jsonl(path)]
    return [validate_harness(h, where) for where, h in rows]


def load_run_harnesses(run, name):
    """The harness records of RUN/name (01's harness_space.jsonl, 02's train / heldout sets), each validated."""
    path = Path(run) / name
    return [validate_harness(h, f"{path}:{n}") for n, h in read_jsonl(path, " (run stages 01-02 first)")]


def harness_pool(run, names, pool=()):
    """{harness_id: record} from `pool` then every file of `names` that exists in the run folder."""
    pool = {h["harness_id"]: h for h in pool}
    for name in names:
        if (Path(run) / name).is_file():
            pool.update({h["harness_id"]: h for h in load_run_harnesses(run, name)})
    return pool


def select_harnesses(run, spec, external, seed):
    """The harness records an eval-mode SPEC names (04's --harnesses): base (the space's all-zero configuration),
    train, heldout, heldout:N (N of them drawn with Random(seed)), all (01's space), external (`external`: the
    built-in out-of-space harnesses and the user's), or ids, comma-separated, from all of these."""
    run = Path(run)
    if spec == "external":
        return external
    if spec in ("base", "all"):
        space = load_run_harnesses(run, "harness_space.jsonl")
        return space if spec == "all" else [h for h in space if h.get("levels") and not any(h["levels"].values())][:1]
    if spec in ("train", "heldout"):
        return load_run_harnesses(run, f"{spec}_harnesses.jsonl")
    if spec.startswith("heldout:"):
        held, n = load_run_harnesses(run, "heldout_harnesses.jsonl"), spec.partition(":")[2]
        if not n.isdigit() or int(n) < 1:
            fail(f"--harnesses {spec}: N in heldout:N must be a positive integer")
        return sorted(random.Random(seed).sample(held, min(int(n), len(held))), key=lambda h: h["harness_id"])
    pool = harness_pool(run, ("harness_space.jsonl", "train_harnesses.jsonl", "heldout_harnesses.jsonl"), external)
    named = [i.strip() for i in spec.split(",") if i.strip()]  # the word "external" stands for those harnesses
    ids = list(dict.fromkeys(x for i in named for x in ([h["harness_id"] for h in external] if i == "external"
                                                        else [i])))
    for hid in ids:
        if hid not in pool:
            fail(f"--harnesses: unknown harness id {clip(hid, 60)!r} (not in {run}/*.jsonl, the built-in external "
                 "harnesses or --harness-file)")
    return [pool[hid] for hid in ids]


# The black boxes (docs/experiments.md), each behind a bridge: NAME -> its module; pydantic-ai also trains
BLACKBOXES = {"smolagents": "bridges.smolagents_harness", "smolagents-native": "bridges.smolagents_native_harness",
              "pydantic-ai": "bridges.pydantic_ai_harness"}
EVAL_ONLY = {"smolagents": "evaluation only: its text mode is an unseen call syntax, no method trains in it",
             "smolagents-native": "evaluation only: it plays Claude Code, a role that never trains"}


def split_frameworks(spec):
    """--harnesses SPEC -> (the rest or None, [(framework, N or None)]): an item NAME or NAME:N runs inside that
    framework on the first N tasks (eval mode, e.g. base,pydantic-ai:8), after the others, on the same engine."""
    items = [i.strip().partition(":") for i in (spec or "").split(",") if i.strip()]
    if any(name in BLACKBOXES and sep and not n.isdigit() for name, sep, n in items):
        fail(f"--harnesses {spec}: a framework is NAME or NAME:N (its first N tasks)")
    rest = ",".join("".join(i) for i in items if i[0] not in BLACKBOXES)
    return rest or None, [(name, int(n) if sep else None) for name, sep, n in items if name in BLACKBOXES]


def check_oracle(jobs, tasks_path):
    """The oracle replays each task's solution: every task needs one, with tools its harness has."""
    for task, h, _ in jobs:
        missing = {s["tool"] for s in task.get("solution") or []} - set(h["specs"]["T"]["tools"])
        if not task.get("solution") or missing:
            fail(f"{tasks_path}: task {task['task_id']!r}: the oracle needs a 'solution' whose tools harness "
                 f"{h['harness_id']} has (missing: {sorted(missing) or 'solution'})")


def load_assignment(path, task_ids, harness_ids, tasks_path):
    """RUN/assignment.jsonl -> {task_id: [harness ids]}: one line per task of `task_ids`, harnesses of the run."""
    assignment = {}
    for n, row in read_jsonl(path, " (run stage 03 first)"):
        where = f"{path}:{n}"
        check_record(row, ASSIGNMENT, where)
        if row["task_id"] not in task_ids:
            fail(f"{where}: field 'task_id': {clip(row['task_id'], 60)!r} is not a task of {tasks_path}")
        if row["task_id"] in assignment:
            fail(f"{where}: field 'task_id': {clip(row['task_id'], 60)!r} is assigned twice (one line per task)")
        unknown = [hid for hid in row["harness_ids"] if hid not in harness_ids]
        if unknown:
            fail(f"{where}: field 'harness_ids': unknown harness id {clip(unknown[0], 60)!r}")
        assignment[row["task_id"]] = row["harness_ids"]
    if not assignment:
        fail(f"{path}: no episodes to run (empty assignment)")
    return assignment


def check_model_turns(turns, where, vocab):
    """model_turns token by token: prompt_ids (non-empty) and completion_ids lists of token ids in [0, vocab),
    logprobs null or one finite number per completion token."""
    for i, t in enumerate(turns):
        for k in ("prompt_ids", "completion_ids"):
            ids = t.get(k)
            if not isinstance(ids, list) or not all(type(x) is int for x in ids):
                fail(f"{where}: model_turns[{i}].{k} missing or not a list of ints")
            bad = [x for x in ids if x < 0 or x >= vocab]
            if bad:
                fail(f"{where}: model_turns[{i}].{k} has token id {bad[0]} outside the policy's vocabulary "
                     f"(size {vocab})")
        lp = t.get("logprobs")
        if lp is not None and (not isinstance(lp, list) or len(lp) != len(t["completion_ids"])
                               or not all(finite(x) for x in lp)):
            fail(f"{where}: model_turns[{i}].logprobs must be null or one finite number per completion token")
        if not t["prompt_ids"]:
            fail(f"{where}: model_turns[{i}].prompt_ids is empty")


def load_rollouts(path, fields, need=None, table=ROLLOUT, vocab=None):
    """[(line, record)] of a rollout file (04's rollouts.jsonl, 06's split files): the `fields` of `table` a record
    holds are checked, in that order; need: {field: reason} of those it must hold (the reason ends the message,
    e.g. " (needed by --algo grpo)"); vocab: model_turns checked token by token (check_model_turns)."""
    need = need or {}
    checked = {f: (*table[f][:2], f in need) for f in fields}
    rows = read_jsonl(path)
    for n, r in rows:
        check_record(r, checked, f"{path}:{n}", why=need)
        if vocab is not None and "model_turns" in r:
            check_model_turns(r["model_turns"], f"{path}:{n}", vocab)
    return rows


# 05's reading: the fields it trains on; which of them a record must hold depends on the flags
TRAIN_FIELDS = ["model_turns", "reward", "group_id", "temperature", "episode_id", "policy", "sampler"]


def load_train_rollouts(path, algo, vocab, min_reward=None):
    """[(line, record)] of the rollouts one update of 05 trains on (`algo`: grpo, ppo or sft): TRAIN_FIELDS checked
    against TRAIN_ROLLOUT, model_turns token by token, and the rules of an update batch: the fields the flags need
    (grpo: reward and group_id; ppo: reward; --min-reward: reward), not empty, no RL on greedy rollouts (temperature
    0), no episode twice, with min_reward only the records whose reward reaches it, some completion tokens."""
    by = f"--algo {algo}" if algo != "sft" else "--min-reward"  # name only the flags given
    need = {"grpo": ["reward", "group_id"], "ppo": ["reward"]}.get(algo, ["reward"] if min_reward is not None else [])
    rows = load_rollouts(path, TRAIN_FIELDS, {"model_turns": "", **dict.fromkeys(need, f" (needed by {by})")},
                         TRAIN_ROLLOUT, vocab)
    if not rows:
        fail(f"{path}: empty rollout file (no episodes)")
    seen = {}
    for ln, r in rows:
        if algo != "sft" and r.get("temperature") == 0:
            fail(f"{path}:{ln}: field 'temperature' is 0 (greedy): RL needs the sampling temperature (> 0)")
        key = r.get("episode_id", json.dumps(r, sort_keys=True))
        if key in seen:
            fail(f"{path}:{ln}: episode {str(key)[:60]!r} repeats line {seen[key]} (a duplicate would count twice)")
        seen[key] = ln
    if min_reward is not None:
        rows = [(ln, r) for ln, r in rows if float(r.get("reward", 0.0)) >= min_reward]
        if not rows:
            fail(f"{path}: no episode has reward >= {min_reward} (--min-reward)")
    if not any(t["completion_ids"] for _, r in rows for t in r["model_turns"]):
        fail(f"{path}: no model turn with completion tokens (oracle rollouts need 04 --tokenizer)")
    return rows
