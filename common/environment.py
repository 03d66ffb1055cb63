"""The task environment: a workspace, its tools, the checker, the oracle; shared by 04 and the framework bridges.

A task (schemas.TASK) is a workspace of files, a user request and a checker. Workspace(files) holds the files in
memory and runs the six canonical tools (list_files, read_file, search, write_file, calculator, submit) on
canonical arguments; nothing the model writes is executed as code and no path leaves the workspace. A call that
fails raises ToolError, which every harness shows to the model in its own words (04's O.error_template, smolagents'
error observation, pydantic-ai's retry). score(checker, files, answer) is the verifier: pass/fail, the reward.

04_rollout.py renders the tools in each harness's call syntax and parses the model's calls back to canonical names
(its harness interpreter); the bridges (bridges/smolagents_harness.py, bridges/pydantic_ai_harness.py, ...) give the
same tools to a framework. Both pass every argument through `argument` (its type and size), then `Workspace.call`.
oracle_reply(task, turn, T, W, write_call) is the scripted expert 04 runs as --policy oracle: the task's solution,
one call a reply, in the harness's words.
"""
import ast
import math
import operator
import re

from common.plumbing import safe_text

MAX_ARG = 2000  # characters a tool argument may hold
MAX_FILE, MAX_FILES, MAX_PATH = 4000, 64, 64  # characters of a file, files in a workspace, characters of a path
MAX_ERR = 200  # characters of an error message (clip)


class ToolError(Exception):
    """A tool call that fails: becomes an error observation, never leaves the episode."""


def clip(s, n=MAX_ERR):
    s = str(s)
    return s if len(s) <= n else s[:n] + "..."


def safe(x):
    """Model text is data (plumbing.safe_text: a lone surrogate becomes U+FFFD) on every string of a reply, a parsed
    call (names, keys, values) or a tool result: it is stored, rendered and written safely. Not text: unchanged."""
    if isinstance(x, str):
        return safe_text(x)
    if isinstance(x, (list, tuple)):
        return type(x)(safe(v) for v in x)
    if isinstance(x, dict):
        return {safe(k): safe(v) for k, v in x.items()}
    return x


def argument(name, value):
    """A tool argument as the tools take it: a number becomes its string; any other non-string, or a text over
    MAX_ARG characters, is a ToolError (`name`: the argument's name as the harness shows it)."""
    value = str(value) if type(value) in (int, float) else value
    if not isinstance(value, str):
        raise ToolError(f"argument {name!r} must be a string")
    if len(value) > MAX_ARG:
        raise ToolError(f"argument {name!r} too long ({MAX_ARG} chars max)")
    return value


# ----------------------------------------------------------------------------- the verifier
def normalise(s):
    s = " ".join(str(s).strip().lower().split()).strip("'\"`").rstrip(".")
    try:
        return repr(float(s))
    except ValueError:
        return s


def answer_items(s):
    """An answer read as a set of items (answer_set): split on commas, semicolons, whitespace and the word "and";
    each item normalised as above (brackets and quotes around it dropped); items without a letter or digit (a
    bullet "-") dropped. "River.txt, apple.txt and owl" -> {"river.txt", "apple.txt", "owl"}; a repeat counts once."""
    items = (normalise(w.strip("'\"`[](){}")) for w in re.split(r"[\s,;]+", str(s)))
    return {w for w in items if w != "and" and re.search(r"[^\W_]", w)}


def check(checker, files, answer):
    """One check on the final workspace and the submitted answer: True or False (an `all` passes when all its parts
    do)."""
    kind = checker["type"]
    if kind == "all":
        return all(check(c, files, answer) for c in checker["checks"])
    if kind == "answer_equals":
        return answer is not None and normalise(answer) == normalise(checker["value"])
    if kind == "answer_set":  # the same items, in any order, with any of the separators; nothing missing or extra
        want = set().union(*(answer_items(v) for v in checker["values"]))
        return answer is not None and bool(want) and answer_items(answer) == want
    text = files.get(checker["path"])
    if text is None:
        return False
    if kind == "file_equals":
        return text.strip() == str(checker["value"]).strip()
    return str(checker["value"]) in text


def check_results(checker, files, answer):
    """Each top-level check's result, 0 or 1 (an `all` checker lists its parts): kept in the record for analysis."""
    return [int(check(c, files, answer)) for c in (checker["checks"] if checker["type"] == "all" else [checker])]


def score(checker, files, answer):
    """The verifier, pass/fail (the paper's pass@1): 1.0 when every check passes, else 0.0. No partial credit: an edit
    task answered "done" without the edit would otherwise earn 0.5 for doing nothing, and GRPO would turn a group
    [0.5, 0.5, 0, 0] into the same advantages as a real success in [1, 1, 0, 0]."""
    return float(check(checker, files, answer))


# ----------------------------------------------------------------------------- the workspace and its tools
OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
       ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}


def calculate(expr):
    """Safe arithmetic: numbers, + - * / // % ** and parentheses; |values| <= 1e15, exponents <= 64. No eval."""
    if len(expr) > 200:
        raise ToolError("expression too long (200 chars max)")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise ToolError("not an arithmetic expression")
    if sum(1 for _ in ast.walk(tree)) > 100:
        raise ToolError("expression too complex")

    def ev(node):
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            value = node.value
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
            value = ev(node.operand) * (-1 if isinstance(node.op, ast.USub) else 1)
        elif isinstance(node, ast.BinOp) and type(node.op) in OPS:
            a, b = ev(node.left), ev(node.right)
            if isinstance(node.op, ast.Pow) and (abs(b) > 64 or abs(a) > 1e6):
                raise ToolError("exponent or base too large")
            try:
                value = OPS[type(node.op)](a, b)
            except ZeroDivisionError:  # x / 0, x % 0, and 0 ** -1
                raise ToolError("division by zero")
            except (OverflowError, ValueError):
                raise ToolError("number too large")
        else:
            raise ToolError("only numbers, + - * / // % ** and parentheses are allowed")
        if isinstance(value, complex) or abs(value) > 1e15 or not math.isfinite(value):
            raise ToolError("result out of range")
        return value

    value = ev(tree.body)
    if isinstance(value, float):
        value = int(value) if value.is_integer() else round(value, 6)
    return str(value)


def workspace_path(path):
    """The path, stripped, if it names a file inside the workspace; else a ToolError saying why."""
    path = path.strip()
    if not path:
        raise ToolError("empty path")
    if len(path) > MAX_PATH:
        raise ToolError("path too long")
    if any(ord(c) < 32 or ord(c) == 127 for c in path):
        raise ToolError("control character in path")
    if path.startswith(("/", "~")) or "\\" in path or any(p in ("", ".", "..") for p in path.split("/")):
        raise ToolError(f"path must stay inside the workspace: {clip(path, 64)}")
    if not re.fullmatch(r"[A-Za-z0-9_.\-/]+", path):
        raise ToolError("path may use only letters, digits, '_', '-', '.' and '/'")
    return path


# What each tool does, in the words a function-calling agent declares it with: a description, and one per argument.
# The base harness (T0, JSON schemas through the chat template) and the framework bridges declare the tools in
# these words, so the base harness and the frameworks differ in prompts, loop and history, not in the tools.
TOOL_DOCS = {
    "list_files": ("Lists the names of all files in the workspace, one per line.", {}),
    "read_file": ("Returns the text of one file of the workspace.", {"path": "the file's name, e.g. notes.txt"}),
    "search": ("Returns every line of every file that contains the text, as 'file: line'.",
               {"query": "the text to look for (case is ignored)"}),
    "write_file": ("Replaces the whole text of a file (creates it if it does not exist).",
                   {"path": "the file's name, e.g. notes.txt", "content": "the file's new text"}),
    "calculator": ("Evaluates arithmetic: numbers, + - * / // % ** and parentheses.",
                   {"expression": "the expression, e.g. 12+30"}),
    "submit": ("Gives the final answer to the user's request and ends the task.", {"answer": "the answer"}),
}


class Workspace:
    """The task's files in memory; the six canonical tools. Nothing is executed, nothing touches the disk."""

    def __init__(self, files):
        self.files, self.answer = dict(files), None

    def call(self, tool, args):
        if tool == "list_files":
            return "\n".join(sorted(self.files)) or "(no files)"
        if tool == "read_file":
            path = workspace_path(args["path"])
            if path not in self.files:
                raise ToolError(f"no such file: {path}")
            return self.files[path][:MAX_FILE] or "(empty file)"
        if tool == "search":
            query = args["query"].strip().lower()
            if not query or len(query) > 100:
                raise ToolError("the search text must have 1-100 characters")
            hits = [f"{name}: {line}" for name in sorted(self.files) for line in self.files[name].splitlines()
                    if query in line.lower()]
            return "\n".join(hits[:20]) or "no matches"
        if tool == "write_file":
            path, content = workspace_path(args["path"]), args["content"]
            if len(content) > MAX_FILE:
                raise ToolError(f"content too long ({MAX_FILE} chars max)")
            if path not in self.files and len(self.files) >= MAX_FILES:
                raise ToolError("too many files")
            self.files[path] = content
            return f"wrote {len(content)} chars to {path}"
        if tool == "calculator":
            return calculate(args["expression"])
        self.answer = args["answer"]  # submit
        return "submitted"


# ----------------------------------------------------------------------------- the oracle: a scripted expert
# It replays the task's solution (schemas.TASK) under any harness: it shows that every task is solvable in every
# configuration, and its episodes are the SFT demonstrations. The harness gives the words: the call syntax (a
# call-writer, 04's render_call) and W's rules; the bridges write the same steps in their framework's format.
def oracle_notes(task, k):
    """Lines of files read before solution step k that hold a number a later step uses (e.g. a sum's terms),
    restated in every reply until then: a window or an elided observation never hides a value it uses."""
    solution = task["solution"]
    later = set(re.findall(r"\d+", " ".join(v for s in solution[k + 1:] for v in s["args"].values())))
    return [f"{s['args']['path']} {line.strip()}" for s in solution[:k] if s["tool"] == "read_file"
            for line in task["files"].get(s["args"]["path"], "").splitlines() if later & set(re.findall(r"\d+", line))]


def oracle_reply(task, turn, T, W, write_call):
    """The oracle's reply after `turn` replies: the task's next solution call, written by write_call(T, tool, args)
    in T's call syntax, satisfying W's rules, after a 'Notes:' line with the values it will still need."""
    solution = task.get("solution") or []
    k = min(turn, len(solution) - 1)
    step, lines = solution[k], []
    if W.get("plan_first") and turn == 0:
        names = ", ".join(T["tools"][s["tool"]]["name"] for s in solution)
        lines.append(f"{W.get('plan_prefix') or 'Plan:'} {names}.")
    if W.get("reply_marker"):
        lines.append(f"{W['reply_marker']} " + ("I know the answer." if step["tool"] == "submit" else
                                                f"I will use {T['tools'][step['tool']]['name']}."))
    notes = oracle_notes(task, k)
    if notes:
        lines.append("Notes: " + "; ".join(notes) + ".")
    if step["tool"] == "submit" and W.get("verify_before_submit"):
        lines.append(f"{W.get('verify_marker')} {step['args']['answer']}")
    return "\n".join(lines + [write_call(T, step["tool"], step["args"])])
