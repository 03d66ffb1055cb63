"""Stage 04: the harness interpreter and multi-turn rollouts, over the task environment of common/environment.py.

    # train mode: tasks of iteration t from DIR/assignment.jsonl, x's i-th visit under H_x[i mod K], G samples each
    python 04_rollout.py --run runs/toy --iteration 0 --group-size 4 --tasks-per-iteration 32
    python 04_rollout.py --run runs/toy --iteration 0 --policy oracle --tokenizer runs/toy/init_policy
    # iterations 0..5 in one process, one engine (what pipeline.py runs): each waits for 05's policy, reloaded
    python 04_rollout.py --run runs/toy --iteration 0 --until 6 --group-size 4 --tasks-per-iteration 32
    # eval mode: tasks (default data/test_tasks.jsonl) x harnesses x samples
    python 04_rollout.py --run runs/toy --eval --policy runs/toy/iter_004/policy --harnesses heldout:20 \
        --out runs/toy/eval/heldout.jsonl
    python 04_rollout.py --run runs/toy --eval --policy oracle --harnesses external \
        --harness-file data/example_harness.json --out /tmp/oracle_external.jsonl
    # inside agent frameworks (docs/experiments.md): NAME or NAME:N (first N tasks); pydantic-ai also in train mode
    python 04_rollout.py --run runs/toy --eval --policy oracle --harnesses base,smolagents:8,pydantic-ai --out /tmp/o
    python 04_rollout.py --run runs/bb --iteration 0 --harnesses pydantic-ai --group-size 4 --tasks-per-iteration 32

An episode: S's prompt with T's tool docs and W's rules; each reply is parsed in T's call syntax, its calls run in
the task's workspace, their outputs come back as O's observation in C's view of the history, W's rules are checked;
it ends submitted, at the turn budget or at the context limit, and the checker's pass/fail is its reward. The rules
in full, the harness fields and the record: docs/stages.md. Writes DIR/iter_{t:03d}/rollouts.jsonl or --out + config.
"""
import argparse
import ast
import contextlib
import importlib
import json
import random
import re
import sys
import time
from collections import Counter
from pathlib import Path

from tqdm import tqdm

from common.environment import TOOL_DOCS, ToolError, Workspace, argument, check_results, clip, oracle_reply, safe, score
from common.generation import (BackendError, KeptEngine, ToolTemplate, encode, extend_prompt, load_for_generation,
                               scripted_reply, tool_call_text)
from common.plumbing import fail, iteration_policy, jsonl_text, locked, seed_everything, wait_for, write_atomic
from common.schemas import CANONICAL_TOOLS as CANONICAL, COMPONENTS, SYNTAXES  # noqa: F401 (T.syntax's names)
from common.schemas import (BLACKBOXES, EVAL_ONLY, check_oracle, harness_pool, load_assignment, load_harness_file,
                            load_tasks, select_harnesses, split_frameworks)

HERE = Path(__file__).resolve().parent  # data/ beside this file: the default tasks, the external harnesses
EXTERNAL = HERE / "data" / "external_harnesses.json"  # X-shell and X-react: --harnesses external
TOOL_HELP = {"list_files": "list all files", "read_file": "show a file", "search": "show lines that contain it",
             "write_file": "replace a file's text", "calculator": "do arithmetic", "submit": "give the final answer"}
MAX_REPLY = 8000  # characters of a reply the parsers read
MAX_SHOWN = 2  # parser messages shown per reply; the rest are counted in one line


def parse_args(argv=None):
    p = argparse.ArgumentParser(description="Run (task, harness) episodes with a policy; write rollouts.jsonl.")
    what = p.add_argument_group("what to run (one of --iteration t or --eval)")
    train = p.add_argument_group("train mode: the tasks of iteration t, each under H_x[visit mod K]")
    evaluation = p.add_argument_group("eval mode: every task x harness x sample")
    sampling = p.add_argument_group("episodes and sampling")
    engine = p.add_argument_group("generation backend (a checkpoint policy)")
    what.add_argument("--run", default="runs/default", help="run folder")
    what.add_argument("--iteration", type=int, help="train mode: RL iteration t")
    what.add_argument("--eval", action="store_true", help="eval mode (needs --harnesses and --out)")
    what.add_argument("--policy", help="checkpoint folder or 'oracle' (train default: contract rule)")
    engine.add_argument("--backend", default="hf", choices=["hf", "vllm"], help="generation backend for a checkpoint")
    engine.add_argument("--tokenizer", help="oracle: record token ids with this tokenizer (SFT demos)")
    what.add_argument("--tasks", help="tasks JSONL (default: data/train_tasks.jsonl; eval: data/test_tasks.jsonl)")
    train.add_argument("--group-size", type=int, default=4, help="samples per (task, harness) = GRPO group")
    train.add_argument("--tasks-per-iteration", type=int, default=32, help="tasks per iteration B (0 = all)")
    evaluation.add_argument("--harnesses", help="base|train|heldout|heldout:N|all|external|id,id,... (ids + "
                            "external); a framework: smolagents|smolagents-native|pydantic-ai[:N] (train: pydantic-ai)")
    evaluation.add_argument("--harness-file", action="append", default=[], help="your harness JSON/JSONL (repeatable)")
    evaluation.add_argument("--samples", type=int, default=1, help="samples per (task, harness)")
    evaluation.add_argument("--out", help="output rollouts JSONL")
    sampling.add_argument("--temperature", type=float, default=1.0, help="sampling temperature (0 = greedy)")
    sampling.add_argument("--max-turns", type=int, default=6, help="model replies per episode (turn budget)")
    sampling.add_argument("--max-new-tokens", type=int, default=128, help="tokens per reply")
    sampling.add_argument("--seed", type=int, default=0, help="random seed (sampling; heldout:N draw)")
    engine.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                        help="sampling dtype (auto: bf16 on a GPU with bf16, fp16 on T4/V100; CPU: hf fp32, vllm bf16)")
    engine.add_argument("--enforce-eager", action=argparse.BooleanOptionalAction, default=None,
                        help="vllm: no compilation / CUDA graphs (default: on for CPU: start-up 20 s, not 2 min)")
    engine.add_argument("--max-model-len", type=int, help="vllm: context length (default: the model's)")
    engine.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="vllm: share of GPU memory used")
    engine.add_argument("--tensor-parallel-size", type=int, default=1, help="vllm: GPUs one engine splits a model over")
    what.add_argument("--shard", metavar="I/N", help="run part I of N (0-based) of the episodes, into <out>.shard-I-of-"
                      "N.jsonl; concatenated in order of I, the parts are one process's records (pipeline --gpus N)")
    train.add_argument("--order-seed", type=int, default=0, help="seed of the task order (fixed: batches cycle)")
    train.add_argument("--until", type=int, metavar="T", help="iterations --iteration .. T-1 in turn, one engine: "
                       "each waits for 05's policy, loaded into it (pipeline.py; see kept_engine)")
    sampling.add_argument("--concurrency", type=int, default=32, help="framework episodes side by side (1: one by one)")
    return p.parse_args(argv)  # (flags added in one fixed order: the config lists them in that order)


# ----------------------------------------------------------------------------- helpers
def fill(template, **values):
    """Replace {name} placeholders in one pass (text put in is never re-read, so braces in it are safe)."""
    return re.sub(r"\{(\w+)\}", lambda m: str(values[m[1]]) if m[1] in values else m[0], template)


def has_line(text, prefix):
    """Does a line of `text` start with `prefix` (leading spaces allowed)?"""
    return any(line.lstrip().startswith(prefix) for line in text.splitlines())


# ============================================================================= the algorithm
# ----------------------------------------------------------------------------- rendering (S, T, O, C)
def render_call(T, tool, args):
    """One canonical call written in T's syntax (the oracle's replies and the tool docs' example)."""
    spec = T["tools"][tool]
    name, shown = spec["name"], {spec["args"][a]: args[a] for a in CANONICAL[tool]}
    syntax = T["syntax"]
    if syntax == "hermes_json":  # as the chat template renders a call (and the bridges' oracle writes it)
        return tool_call_text(name, shown)
    if syntax == "xml_invoke":
        params = "".join(f'<parameter name="{k}">{v}</parameter>' for k, v in shown.items())
        return f'<invoke name="{name}">{params}</invoke>'
    if syntax == "python_call":
        return name + "(" + ", ".join(f"{k}={json.dumps(v, ensure_ascii=False)}" for k, v in shown.items()) + ")"
    if syntax == "react":
        if tool == "submit":
            return f"{T.get('final_answer', 'Final Answer:')} {args['answer']}"
        return f"Action: {name}\nAction Input: {json.dumps(shown, ensure_ascii=False)}"
    return f"```sh\n{shell_command(name, tool, args)}\n```"


def shell_command(name, tool, args, quote=True):
    """`name ARG` or `name TEXT > FILE`; with quote, TEXT that the shell parser would misread goes in JSON quotes."""
    if tool != "write_file":
        return " ".join([name] + [args[a] for a in CANONICAL[tool]])
    text = args["content"]
    if quote and (any(c in text for c in "\n\"'>") or text != text.strip()):
        text = json.dumps(text, ensure_ascii=False)
    return f"{name} {text} > {args['path']}"


def declared_tools(T):
    """T's tools as JSON schemas for the chat template's `tools` (T.declare "chat_template"), else None. Shaped as
    pydantic-ai's OpenAIChatModel sends a tool (type, function: name, description, parameters), in the words of
    environment.TOOL_DOCS, under the names T shows: the base harness declares its tools as the frameworks do."""
    if T.get("declare") != "chat_template":
        return None
    schemas = []
    for tool, spec in T["tools"].items():
        description, arg_docs = TOOL_DOCS[tool]
        properties = {spec["args"][a]: {"description": arg_docs[a], "type": "string"} for a in CANONICAL[tool]}
        parameters = {"additionalProperties": False, "properties": properties}
        if properties:
            parameters["required"] = list(properties)
        parameters["type"] = "object"
        schemas.append({"type": "function",
                        "function": {"name": spec["name"], "description": description, "parameters": parameters}})
    return schemas


def tool_docs(T):
    """The {tool_docs} text of S's template: the tools in T's syntax, or, where the chat template declares them, the
    per-reply limit alone."""
    tools, n = T["tools"], T.get("max_calls_per_turn", 1)
    if T.get("declare") == "chat_template":
        return f"Call the functions you are given, at most {n} per reply."
    if T["syntax"] == "shell":
        lines = [f"Commands (in a ```sh block, at most {n} per reply):"]
        for t in CANONICAL:
            if t in tools:
                command = shell_command(tools[t]["name"], t, tools[t]["args"], quote=False)
                lines.append(f"{command} - {TOOL_HELP[t]}")
        return "\n".join(lines)
    if T["syntax"] == "react":
        lines = []
        for t, spec in tools.items():
            if t != "submit":
                example_input = json.dumps({name: "..." for name in spec["args"].values()})
                lines.append(f"- {spec['name']}, input {example_input}: {TOOL_HELP[t]}")
        return "\n".join(lines)
    lines = []
    for t in CANONICAL:
        if t in tools:
            arg_names = ", ".join(tools[t]["args"][a] for a in CANONICAL[t])
            lines.append(f"- {tools[t]['name']}({arg_names}): {TOOL_HELP[t]}")
    example = render_call(T, "read_file", {"path": "a.txt"}) if "read_file" in tools else ""
    per = "one call per line, " if T["syntax"] == "python_call" else ""
    return "\n".join(lines + [f"Call format ({per}at most {n} per reply):", example])


def initial_messages(h, task, max_turns):
    """S's template with T's tool docs, W's rules, the turn budget and the name T gives the submit tool."""
    S, T, W = h["specs"]["S"], h["specs"]["T"], h["specs"]["W"]
    names = dict(submit=T["tools"]["submit"]["name"], max_turns=max_turns)
    text = fill(S["template"], tool_docs=tool_docs(T), workflow_rules=fill(W.get("rules") or "", **names),
                **names).strip()
    if S.get("placement") == "user":
        return [{"role": "user", "content": text + "\n\n" + (S.get("task_prefix") or "") + task["request"]}]
    return [{"role": "system", "content": text}, {"role": "user", "content": task["request"]}]


def format_output(O, tool, output):
    if O.get("line_numbers"):
        output = "\n".join(f"{i}: {line}" for i, line in enumerate(output.split("\n"), 1))
    limit = O.get("max_chars") or 2000
    if len(output) > limit:
        output = output[:limit] + fill(O.get("truncate_marker") or "...", n=len(output) - limit)
    return fill(O["template"], tool=tool, output=output)


def format_error(O, tool, error):
    return fill(O["error_template"], tool=clip(tool, 40), error=clip(error))


def manage_context(C, messages, n_head):
    """C: what the model sees. The head (system + task) is always kept; the rest are (reply, observation) pairs."""
    head, rest = messages[:n_head], messages[n_head:]
    k = C.get("k") or 0
    if C["mode"] == "window":
        return head + rest[max(0, len(rest) - 2 * k):]
    if C["mode"] == "elide":
        n_obs = len(rest) // 2
        return head + [dict(m, content=C.get("elided_text") or "") if i % 2 == 1 and i // 2 < n_obs - k else m
                       for i, m in enumerate(rest)]
    return list(messages)


# ----------------------------------------------------------------------------- parsing replies (T)
# Each parser: (T, reply) -> [("call", shown_name, {shown_arg: value}) or ("error", message)], in order of
# appearance. Every scan moves forward through the reply, so parsing stays linear in its length.
def parse_hermes(T, text):
    items, pos = [], 0
    while (start := text.find("<tool_call>", pos)) >= 0:
        end = text.find("</tool_call>", start)
        if end < 0:
            return items + [("error", "unclosed <tool_call>")]
        body, pos = text[start + len("<tool_call>"):end], end + len("</tool_call>")
        try:
            obj = json.loads(body)
            args = obj.get("arguments", {})
            args = json.loads(args) if isinstance(args, str) else args
            assert isinstance(obj["name"], str) and isinstance(args, dict)
            items.append(("call", obj["name"], args))
        except Exception:
            items.append(("error", 'a tool call must be {"name": ..., "arguments": {...}} in JSON'))
    return items


XML_NAME = re.compile(r"""\s+name\s*=\s*["']([^"'<>]*)["']\s*>""")  # after "<invoke" / "<parameter"
XML_HELP = ('write <invoke name="TOOL"><parameter name="ARG">value</parameter></invoke>, each tag closed, '
            "each argument once")


def parse_xml(T, text):
    items, pos, invoke = [], 0, re.compile(r"<invoke\b")
    while m := invoke.search(text, pos):
        end = text.find("</invoke>", m.end())
        if end < 0:
            return items + [("error", XML_HELP)]
        pos, head = end + len("</invoke>"), XML_NAME.match(text, m.end(), end)
        params, ok = {}, head is not None
        for chunk in text[head.end():end].split("<parameter")[1:] if ok else []:  # each chunk read once
            name, close = XML_NAME.match(chunk), chunk.find("</parameter>")
            if not name or close < 0 or name[1] in params:
                ok = False
                break
            value = chunk[name.end():close]
            value = value[1:] if value.startswith("\n") else value  # a newline after the opening tag and one
            params[name[1]] = value[:-1] if value.endswith("\n") else value  # before the closing tag are layout
        items.append(("call", head[1], params) if ok else ("error", XML_HELP))
    return items


def parse_python(T, text):
    items = []
    for line in text.splitlines():
        if not re.match(r"\s*[A-Za-z_]\w*\s*\(", line):
            continue
        try:
            node = ast.parse(line.strip(), mode="eval").body
            assert isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and not node.args
            args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords}
            assert None not in args and all(type(v) in (str, int, float) for v in args.values())
            items.append(("call", node.func.id, args))
        except Exception:
            items.append(("error", 'write one call per line as name(arg="text"), keyword arguments only'))
    return items


def parse_shell(T, text):
    if text.count("```") % 2:
        return [("error", "unclosed ``` block")]
    words = {spec["name"]: tool for tool, spec in T["tools"].items()}  # the word this harness gives each tool
    lines = []  # the command lines of every ``` block, comments and blank lines left out
    for block in re.findall(r"```[A-Za-z]*\n?(.*?)```", text, re.S):
        for line in map(str.strip, block.splitlines()):
            if line and not line.startswith("#"):
                lines.append(line)
    items = []
    for line in lines:
        word, _, rest = line.partition(" ")
        tool, rest = words.get(word), rest.strip()
        names = T["tools"][tool]["args"] if tool else {}
        if tool != "write_file" and re.search(r"[|;&`]|\$\(", line):
            items.append(("error", "pipes, ';', '&' and substitutions are not supported"))
        elif tool != "write_file":  # an unknown word -> no args -> "unknown tool" (a tool error)
            items.append(("call", word, {names[a]: unquote(rest) for a in CANONICAL[tool]} if tool else {}))
        else:
            content, arrow, path = (x.strip() for x in rest.rpartition(">"))
            try:
                content = json.loads(content) if arrow and path and content.startswith('"') else content
            except json.JSONDecodeError:
                content = None
            if not arrow or not path or " " in path:
                items.append(("error", f"write files as: {word} TEXT > FILE"))
            elif content is None:
                items.append(("error", "bad quoted text"))
            else:
                items.append(("call", word, {names["path"]: path, names["content"]: unquote(content)}))
    return items


def parse_react(T, text):
    final = T.get("final_answer", "Final Answer:")
    answers = re.findall(r"^[ \t]*" + re.escape(final) + r"(.*)$", text, re.M)
    actions = list(re.finditer(r"^[ \t]*Action:[ \t]*(.*)$", text, re.M))
    if answers and actions:
        return [("error", f"write either an Action or a {final} line, not both")]
    if answers:
        submit = T["tools"]["submit"]
        return [("call", submit["name"], {submit["args"]["answer"]: answers[0].strip()})]
    items, action_input = [], re.compile(r"[ \t]*\n[ \t]*Action Input:[ \t]*")
    for m in actions:
        try:
            args, _ = json.JSONDecoder().raw_decode(text, action_input.match(text, m.end()).end())
            assert isinstance(args, dict)
            items.append(("call", m[1].strip(), args))
        except Exception:
            items.append(("error", "after 'Action: TOOL' write 'Action Input: {JSON object}'"))
    return items


PARSERS = {"hermes_json": parse_hermes, "xml_invoke": parse_xml, "python_call": parse_python, "shell": parse_shell,
           "react": parse_react}  # T.syntax -> parser (SYNTAXES lists the same names)


def parse_reply(T, text):
    if len(text) > MAX_REPLY:
        return [("error", f"reply too long ({MAX_REPLY} chars max)")]
    return PARSERS[T["syntax"]](T, text)


def unquote(s):
    return s[1:-1] if len(s) >= 2 and s[0] == s[-1] and s[0] in "'\"" else s


def to_canonical(T, name, args):
    by_name = {spec["name"]: tool for tool, spec in T["tools"].items()}
    if name not in by_name:
        raise ToolError(f"unknown tool {clip(name, 40)!r}; tools: {', '.join(by_name)}")
    tool = by_name[name]
    shown = T["tools"][tool]["args"]  # canonical arg -> the name this harness shows
    unknown = [a for a in args if a not in shown.values()]
    if unknown:
        raise ToolError(f"unknown argument {clip(unknown[0], 40)!r}; {name} takes: "
                        f"{', '.join(shown.values()) or 'nothing'}")
    out = {}
    for a in CANONICAL[tool]:
        if args.get(shown[a]) is None:
            raise ToolError(f"missing argument {shown[a]!r}")
        out[a] = argument(shown[a], args[shown[a]])  # a string of at most MAX_ARG chars (common/environment.py)
    return tool, out


# ----------------------------------------------------------------------------- one episode (W enforced here)
class Episode:
    def __init__(self, task, harness, max_turns, meta):
        self.task, self.harness, self.max_turns, self.meta = task, harness, max_turns, meta
        self.S, self.T, self.O, self.C, self.W = (harness["specs"][c] for c in COMPONENTS)
        self.ws = Workspace(task["files"])
        self.tools = declared_tools(self.T)  # JSON schemas for the chat template, or None (docs in the prompt)
        self.messages = initial_messages(harness, task, max_turns)
        self.n_head = len(self.messages)
        self.turns = 0  # model replies so far
        self.parse_errors = 0  # replies with a parse error
        self.tool_errors = 0  # calls that raised a ToolError
        self.workflow_violations = 0  # W's rules broken
        self.workflow_checks = 0  # W's rules checked
        self.model_turns, self.finish_reason, self.reward, self.checks = [], None, 0.0, []
        self.error_turns, self.valid_call_turns = [], []  # 1-based turns with an error / a call that ran cleanly
        self.last = None  # (context shown, its prompt ids, completion ids, reply text) of the last model turn
        self.rerendered = 0  # later turns whose prompt was re-rendered (the context rewrote history): new samples

    @property
    def done(self):
        return self.finish_reason is not None

    def context(self):
        return manage_context(self.C, self.messages, self.n_head)

    def prompt(self, tok):
        """(context, prompt ids). Token-in/token-out: where the context only appended since the last turn, the
        last prompt's ids + the sampled ids + the template's ids for what followed (generation.extend_prompt), so
        the model never sees a re-tokenisation of its own reply and 05 trains the episode as one sequence; where C
        rewrote history (window, elision), the context is rendered afresh and a new sample starts there."""
        context = self.context()
        view = ToolTemplate(tok, self.tools) if self.tools else tok  # T0: the template renders the tools too
        ids = extend_prompt(view, *self.last, context) if self.last else None
        if ids is None:
            self.rerendered += self.last is not None
            ids = encode(view, context)
        return context, ids

    def finish(self, reason):
        self.finish_reason = reason
        self.reward = score(self.task["checker"], self.ws.files, self.ws.answer)
        self.checks = check_results(self.task["checker"], self.ws.files, self.ws.answer)

    def step(self, reply):
        """Apply one model reply: W's rules on the reply, else parse and run its calls; keep the books; observe."""
        self.turns += 1
        reply = safe(reply)  # model text is data (environment.safe): stored, rendered and written safely
        self.messages.append({"role": "assistant", "content": reply})
        errors_before = self.tool_errors + self.workflow_violations
        violation = self.workflow_violation(reply)
        parts, n_errors, ran = ([violation], 0, []) if violation else self.run_calls(reply)
        self.parse_errors += n_errors > 0
        # per-turn facts (06: recovery = share of error turns followed by a turn with a valid call)
        if n_errors or self.tool_errors + self.workflow_violations > errors_before:
            self.error_turns.append(self.turns)
        if ran:
            self.valid_call_turns.append(self.turns)
        if "submit" in ran:
            return self.finish("submitted")
        if n_errors > MAX_SHOWN:
            parts.append(format_error(self.O, "parser", f"{n_errors - MAX_SHOWN} more parse errors not shown"))
        self.observe(parts)

    # each W rule checked counts in workflow_checks; each failed check is one workflow violation
    def violation(self, message):
        self.workflow_violations += 1
        return format_error(self.O, "workflow", message)

    def workflow_violation(self, reply):
        """W's rules on the whole reply (plan first, a reply marker): the error observation of the first that
        fails (then nothing is run), else None."""
        plan, marker = self.W.get("plan_prefix") or "Plan:", self.W.get("reply_marker")
        if self.W.get("plan_first") and self.turns == 1:
            self.workflow_checks += 1
            if not reply.lstrip().startswith(plan):
                return self.violation(f"your first reply must start with '{plan}'; nothing was run")
        if marker:
            self.workflow_checks += 1
            if not has_line(reply, marker):
                return self.violation(f"every reply needs a line starting with '{marker}'; nothing was run")
        return None

    def run_calls(self, reply):
        """Parse the reply and run its calls in order, up to T.max_calls_per_turn (default 1) and the first submit.
        -> (observation parts, parse errors, canonical tools that ran without error)."""
        parts, n_errors, calls, limit, ran = [], 0, 0, self.T.get("max_calls_per_turn", 1), []
        for item in safe(parse_reply(self.T, reply)) or [("error", "no tool call found")]:
            calls += item[0] == "call"
            if item[0] == "error" or calls > limit:
                n_errors += 1
                if n_errors <= MAX_SHOWN:  # the rest are counted in step(): the observation stays bounded
                    parts.append(format_error(self.O, "parser", item[1] if item[0] == "error" else
                                              f"at most {limit} calls per reply; the rest were not run"))
                if calls > limit:
                    break
                continue
            tool, output = self.run_call(reply, item[1], item[2])
            if tool:
                ran.append(tool)  # a call that parsed and ran without error
            if tool == "submit":
                break
            parts.append(format_output(self.O, item[1], output) if tool else output)
        return parts, n_errors, ran

    def run_call(self, reply, name, args):
        """One parsed call -> (canonical tool, its output), or (None, the error observation): a tool error, or a
        submit that W refuses (verify before submit: the reply needs a verify_marker line)."""
        try:
            tool, args = to_canonical(self.T, name, args)
            verify = self.W.get("verify_marker") or ""
            if tool == "submit" and self.W.get("verify_before_submit"):
                self.workflow_checks += 1
                if not has_line(reply, verify):
                    return None, self.violation(f"{name} refused: the reply that calls it needs a line starting "
                                                f"with '{verify}'")
            return tool, safe(self.ws.call(tool, args))
        except Exception as e:  # a ToolError, or anything unexpected inside a tool: an observation, not a crash
            self.tool_errors += 1
            return None, format_error(self.O, name, str(e) if isinstance(e, ToolError) else
                                      f"the tool failed ({type(e).__name__})")

    def observe(self, parts):
        """The observation (O's role), W's budget reminder last; the turn budget may end the episode."""
        observation = "\n".join(parts)
        if self.W.get("budget_reminder"):
            observation += "\n" + fill(self.W["budget_reminder"], left=self.max_turns - self.turns)
        self.messages.append({"role": self.O["role"], "content": observation})
        if self.turns >= self.max_turns:
            self.finish("turn_budget")

    def record(self, policy, temperature):
        return {**self.meta, "task_id": self.task["task_id"], "family": self.task["family"],
                "harness_id": self.harness["harness_id"], "policy": policy, "temperature": temperature,
                "reward": self.reward, "success": self.reward == 1.0, "checks": self.checks,
                "finish_reason": self.finish_reason, "turns": self.turns, "parse_errors": self.parse_errors,
                "tool_errors": self.tool_errors, "workflow_violations": self.workflow_violations,
                "workflow_checks": self.workflow_checks, "error_turns": self.error_turns,
                "valid_call_turns": self.valid_call_turns, "submitted_answer": self.ws.answer,
                "rerendered_turns": self.rerendered, "transcript": self.messages, "tools": self.tools,
                "model_turns": self.model_turns}


# ----------------------------------------------------------------------------- lockstep rollouts
def run_episodes(jobs, policy, backend=None, tok=None, max_turns=6, max_new_tokens=128, positions=None,
                 temperature=1.0, progress=True):
    """jobs: (task, harness, meta) triples. Each turn, ONE batched generation call for all live episodes."""
    episodes = [Episode(task, h, max_turns, meta) for task, h, meta in jobs]
    bar = tqdm(total=len(episodes), desc="episodes", disable=not progress, leave=False)
    for turn in range(max_turns):
        live = [e for e in episodes if not e.done]
        if not live:
            break
        shown = [e.prompt(tok) for e in live] if tok is not None else [(None, None)] * len(live)
        contexts, prompts = [c for c, _ in shown], [p for _, p in shown]
        if positions:  # the prompt and the reply must fit in the model's positions
            for e, p in zip(live, prompts):
                if len(p) > positions - max_new_tokens:
                    e.finish("context_limit")
            keep = [i for i, e in enumerate(live) if not e.done]
            live = [live[i] for i in keep]
            contexts = [contexts[i] for i in keep]
            prompts = [prompts[i] for i in keep]
        if backend is None:  # oracle
            texts = [oracle_reply(e.task, e.turns, e.T, e.W, render_call) for e in live]
            outs = [scripted_reply(t, tok)[1:] if tok is not None else None for t in texts]  # (ids + stop, None)
        else:
            # an episode's sampling randomness is keyed by its episode_id alone (common/generation.py: episode_seed), so
            # it draws the same tokens in one process or in any shard (--shard I/N); unnamed episodes: batch RNG
            keys = [e.meta.get("episode_id") for e in live]
            if not live:
                outs = []
            elif all(keys):
                outs = backend.generate(prompts, turn, keys=keys)
            else:
                outs = backend.generate(prompts, turn)
            texts = [tok.decode(ids, skip_special_tokens=True) for ids, _ in outs]
        for e, c, p, out, text in zip(live, contexts, prompts, outs, texts):
            if out is not None:
                e.model_turns.append({"prompt_ids": p, "completion_ids": out[0], "logprobs": out[1]})
                e.last = (c, p, out[0], safe(text))  # the reply as the transcript will hold it
            e.step(text)
        bar.update(sum(e.done for e in episodes) - bar.n)
    bar.close()
    return [e.record(policy, temperature) for e in episodes]


# ----------------------------------------------------------------------------- modes: which episodes to run
def train_batch(task_ids, t, size, order_seed):
    """Tasks of iteration t (B = size): epoch t // ceil(N/B) permutes the tasks with Random(order_seed * 1000003
    + epoch) and takes chunk t mod ceil(N/B), the last one filled from the permutation's start."""
    n = len(task_ids)
    if size <= 0 or size >= n:
        return list(task_ids)
    epoch, j = divmod(t, -(-n // size))
    perm = list(range(n))
    random.Random(order_seed * 1_000_003 + epoch).shuffle(perm)
    chunk = perm[j * size:(j + 1) * size]
    return [task_ids[i] for i in chunk + perm[:size - len(chunk)]]


def batch_visits(task_ids, t, size, order_seed):
    """Iteration t's (task id, visit i): i = how many earlier batches t' < t held the task (recomputed, no state
    file)."""
    visits = Counter(tid for u in range(t) for tid in train_batch(task_ids, u, size, order_seed))
    return [(tid, visits[tid]) for tid in train_batch(task_ids, t, size, order_seed)]


def batch_harnesses(assignment, t, size, order_seed):
    """Iteration t's (task id, harness id, visit i). Visit i of task x runs H_x[i mod K], so every task visited K
    times sees all K harnesses of its group, whatever the batch order."""
    return [(tid, assignment[tid][i % len(assignment[tid])], i)  # H_x[i mod K]
            for tid, i in batch_visits(list(assignment), t, size, order_seed)]


def episode_meta(tid, hid, s, t=None, visit=None):
    """A record's first fields: train mode's iteration t and visit, or eval mode's (t None); group_id: GRPO's."""
    tag = "eval" if t is None else f"it{t:03d}"
    return {"episode_id": f"{tag}-{tid}-{hid}-s{s}", "iteration": t, "visit": visit, "group_id": f"{tid}|{hid}|{tag}",
            "sample_index": s}


def framework_meta(hid, t, visits):
    """Train mode inside a framework: the meta of sample s of a task, its visit in iteration t's batch."""
    def meta(task, s):
        return episode_meta(task["task_id"], hid, s, t, visits[task["task_id"]])
    return meta


def train_jobs(args, tasks_by_id, tasks_path):
    """Train mode: iteration t's batch of tasks, each under its visit's harness, group_size samples each."""
    run, t = Path(args.run), args.iteration
    known = harness_pool(run, ("harness_space.jsonl", "train_harnesses.jsonl"))
    if not known:
        fail(f"{run / 'train_harnesses.jsonl'}: harness file not found (run stages 01-02 first)")
    assignment = load_assignment(run / "assignment.jsonl", tasks_by_id, known, tasks_path)
    jobs = []  # a group: --group-size samples of one (task, harness)
    for tid, hid, visit in batch_harnesses(assignment, t, args.tasks_per_iteration, args.order_seed):
        for s in range(args.group_size):
            jobs.append((tasks_by_id[tid], known[hid], episode_meta(tid, hid, s, t, visit)))
    return jobs


def eval_jobs(args, tasks, spec):
    """Eval mode: every task under every harness SPEC names (schemas.select_harnesses), --samples each."""
    external = load_harness_file(EXTERNAL) + [h for f in args.harness_file for h in load_harness_file(f)]
    harnesses = select_harnesses(args.run, spec, external, args.seed)
    if not harnesses:
        fail(f"--harnesses {spec}: no harness selected")
    jobs = []
    for h in harnesses:
        for task in tasks:
            for s in range(args.samples):
                jobs.append((task, h, episode_meta(task["task_id"], h["harness_id"], s)))
    return jobs


def run_blackbox(args, frameworks, tasks, policy, backend, tok, positions):
    """The episodes inside each framework (NAME, its first N tasks), all side by side, --concurrency at a time, model
    calls batched across frameworks (smolagents_harness.Lockstep). Eval: every task x --samples. Train (pydantic-ai):
    iteration t's batch (train_batch), --group-size each, train mode's meta. Bridges imported when asked for."""
    jobs = []
    try:
        for name, n in frameworks:
            try:
                bridge = importlib.import_module(BLACKBOXES[name])
            except ImportError as e:
                fail(f"--harnesses {name}: {e} (pip install -r requirements.txt)")
            mine, samples, meta = tasks[:n], args.samples, None
            if not args.eval:
                t, hid, by_id = args.iteration, bridge.HARNESS_ID, {task["task_id"]: task for task in mine}
                visits = dict(batch_visits(list(by_id), t, args.tasks_per_iteration, args.order_seed))
                mine, samples = [by_id[tid] for tid in visits], args.group_size
                meta = framework_meta(hid, t, visits)
            jobs += bridge.episode_jobs(mine, policy, backend, tok, args.max_turns, args.max_new_tokens,
                                        args.temperature, samples, positions, meta)
        return bridge.run_jobs("+".join(f for f, _ in frameworks), jobs, backend, args.concurrency) if jobs else []
    except bridge.BridgeError as e:  # bad input (every bridge raises smolagents_harness.BridgeError): exit 2
        fail(str(e))


# ----------------------------------------------------------------------------- main
def validate_flags(args):
    """The flags' values, before anything is read. -> the shard (I, N) or None."""
    if args.eval == (args.iteration is not None):
        fail("give exactly one of --iteration t (train mode) or --eval (eval mode)")
    bad = [f for f in ("group_size", "samples", "max_turns", "max_new_tokens", "tensor_parallel_size", "concurrency")
           if getattr(args, f) < 1]
    if bad or args.temperature < 0 or (args.iteration or 0) < 0:
        fail(f"--{(bad or ['temperature/iteration'])[0].replace('_', '-')}: must be >= 1 (>= 0 for --temperature and "
             "--iteration)")
    m = re.fullmatch(r"(\d+)/(\d+)", args.shard or "")  # [multi-GPU] --shard I/N with 0 <= I < N
    if args.shard and (not m or not int(m[1]) < int(m[2])):
        fail(f"--shard {args.shard}: expected I/N with 0 <= I < N (e.g. 0/4)")
    if args.eval and (not args.harnesses or not args.out or not args.policy):
        fail("eval mode needs --policy, --harnesses SPEC and --out FILE")
    if not args.eval and args.out:  # training writes RUN/iter_t/rollouts.jsonl; a silently ignored --out misleads
        fail(f"--out {args.out}: only for --eval; training writes {args.run}/iter_NNN/rollouts.jsonl")
    if not args.eval and args.harnesses not in (None, "pydantic-ai"):  # the one framework a method trains in
        why = EVAL_ONLY.get(args.harnesses, "not in train mode, which runs the harnesses of assignment.jsonl")
        fail(f"--harnesses {args.harnesses}: {why}; black-box RL trains inside pydantic-ai (--harnesses pydantic-ai)")
    if args.until is not None and (args.eval or args.shard or args.until <= (args.iteration or 0)):
        fail(f"--until {args.until}: train mode in one process only (no --eval, no --shard), after --iteration")
    if args.shard and split_frameworks(args.harnesses)[1]:
        fail(f"--shard: not for --harnesses {args.harnesses} (its episodes run inside the framework)")
    return (int(m[1]), int(m[2])) if args.shard else None


def output_path(args):
    """--out (eval mode) or DIR/iter_{t:03d}/rollouts.jsonl (train mode); None if neither is given."""
    if args.eval:
        return Path(args.out) if args.out else None
    return Path(args.run) / f"iter_{args.iteration:03d}" / "rollouts.jsonl" if args.iteration is not None else None


def shard_path(path, i, n):
    """rollouts.jsonl -> rollouts.shard-I-of-N.jsonl (pipeline.py concatenates I = 0..N-1 into the first name)."""
    return path.with_name(f"{path.stem}.shard-{i}-of-{n}{path.suffix}")


def summarize(records):
    """One line of means over all episodes (06 makes the tables)."""
    mean = {f: sum(float(r[f]) for r in records) / len(records) for f in ("reward", "success", "parse_errors", "turns")}
    print(f"{len(records)} episodes, {len({r['harness_id'] for r in records})} harnesses: reward {mean['reward']:.3f}, "
          f"success {mean['success']:.3f}, parse errors/episode {mean['parse_errors']:.2f}, turns {mean['turns']:.2f}")


def run_stage(args, engine=None):  # engine: --until's KeptEngine, kept from call to call
    shard = validate_flags(args)  # [multi-GPU] (I, N)
    tasks_path = Path(args.tasks or HERE / "data" / ("test_tasks.jsonl" if args.eval else "train_tasks.jsonl"))
    tasks = load_tasks(tasks_path)
    spec, frameworks = split_frameworks(args.harnesses)  # episodes inside a framework run there (run_blackbox)
    if args.eval:
        jobs = eval_jobs(args, tasks, spec) if spec else []
    elif frameworks:
        jobs = []  # training inside pydantic-ai: run_blackbox makes its episodes
    else:
        jobs = train_jobs(args, {t["task_id"]: t for t in tasks}, tasks_path)
    out = output_path(args)
    config_path = out.with_name(out.stem + ".04_rollout_config.json" if args.eval else "04_rollout_config.json")
    if shard:  # [multi-GPU] block I of N of the job list: contiguous, so the N files concatenated in order of I
        # are the one-process records (each episode's sampling randomness is its own: run_episodes)
        i, n = shard
        jobs = jobs[len(jobs) * i // n:len(jobs) * (i + 1) // n]
        out, config_path = shard_path(out, i, n), shard_path(config_path, i, n)
    policy = args.policy or str(iteration_policy(args.run, args.iteration or 0))  # eval mode gives --policy
    if policy == "oracle":
        check_oracle(jobs, tasks_path)
    backend, tok, positions = engine.get(policy, args) if engine else load_for_generation(policy, args)
    seed_everything(args.seed)
    start, gen_before = time.perf_counter(), backend.gen_seconds if backend else 0.0
    records = run_episodes(jobs, policy, backend, tok, args.max_turns, args.max_new_tokens, positions,
                           args.temperature, progress=bool(jobs))
    records += run_blackbox(args, frameworks, tasks, policy, backend, tok, positions)  # same engine, after
    wall = time.perf_counter() - start
    for r in records:  # which engine sampled the episode (05: truncated IS where it is not 05's own fp32 forward)
        r["sampler"] = getattr(backend, "sampler", None) if backend else {"backend": "oracle", "dtype": None}
    write_atomic(out, jsonl_text(records))
    versions = {m: sys.modules[m].__version__ for m in ("torch", "transformers", "vllm", "smolagents", "pydantic_ai")
                if m in sys.modules}
    config = {**vars(args), "policy": policy, "tasks": str(tasks_path), "episodes": len(records), "out": str(out),
              "harness_ids": sorted({r["harness_id"] for r in records}), "wall_seconds": round(wall, 3),
              "generation_seconds": round(backend.gen_seconds - gen_before, 3) if backend else None,
              "engine_reloads": engine.reloads if engine else 0, "versions": versions}
    write_atomic(config_path, json.dumps(config, indent=2))
    if records:
        summarize(records)
    print(f"wrote {out} ({len(records)} episodes, {wall:.1f} s) and {config_path}")
    return records


def kept_engine(args):
    """--until T: iterations u = t .. T-1, one engine for all (its start-up paid once: docs/engineering.md): u waits
    for its policy (05 renames RUN/iter_{u-1:03d}/policy into place last), loads it into the engine
    (generation.KeptEngine) and runs as `--iteration u --seed S+u-t` would (--policy: only u = t's)."""
    engine, t = KeptEngine(), args.iteration
    for u in range(t, args.until):
        a = argparse.Namespace(**{**vars(args), "iteration": u, "seed": args.seed + u - t,
                                  "policy": args.policy if u == t or args.policy == "oracle" else None})
        if a.policy != "oracle":
            wait_for(Path(a.policy or iteration_policy(a.run, u)), f"iteration {u}'s policy (05's)")
        out = output_path(a)
        with locked(out.with_name(out.name + ".lock")):
            run_stage(a, engine)


def main(argv=None):
    args = parse_args(argv)
    out = output_path(args)  # one writer per output file: <out>.lock while this call writes it
    lock = locked(out.with_name(out.name + ".lock")) if out else contextlib.nullcontext()  # None: a usage error
    try:
        if args.until is not None:
            validate_flags(args)  # before any waiting
            return kept_engine(args)
        with lock:
            run_stage(args)
    except BackendError as e:  # common/generation.py's bad input (a folder, vllm missing): one line, exit 2
        fail(str(e))


if __name__ == "__main__":
    main()
