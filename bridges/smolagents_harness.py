"""A real agent framework as an out-of-space harness: smolagents' ToolCallingAgent around our policy.

    # through 04's eval mode (the oracle, or any checkpoint with --backend hf|vllm)
    python 04_rollout.py --run runs/toy --eval --policy oracle --harnesses smolagents --out /tmp/smol.jsonl

Nobody designed this harness for the experiment: smolagents' own system prompt (its toolcalling_agent.yaml),
its tool-call format (an `Action:` line and a JSON blob, parsed by smolagents' own text parser), its
observation and error rendering and its memory are used exactly as the library ships them. What this
file adds is the plumbing between that black box and our environment:

- Tools: the task's workspace tools (list_files, read_file, search, write_file, calculator) as smolagents
  `Tool`s that call common/environment.py's `Workspace.call` (the same semantics and limits as 04, `argument` on every
  argument); the built-in `final_answer` tool (same name, description and schema) also records the answer = 04's
  submit.
  A ToolCallingAgent (never a CodeAgent): nothing the model writes is executed.
- The policy: a smolagents `Model` that renders the messages smolagents sends with the policy's chat
  template (common/generation.py's `encode`), samples through 04's backend (hf or vllm), decodes, cuts the text at the
  stop sequences smolagents asks for ("Observation:", "Calling tools:"), and records each call as one
  token-in/token-out model turn (prompt ids as sent, completion ids as sampled, log-probs) in 04's schema. Each
  episode draws with its own randomness, keyed by its episode_id as in 04's lockstep rollouts (EpisodeBackend).
- The oracle: a scripted `Model` that writes each step of the task's `solution` in smolagents' format,
  through the same text path and parser as the policy (submit -> final_answer).

Episode rules (decisions). max_steps = the harness turn budget (max_turns); every smolagents step is one
model call. When the budget runs out smolagents would make one extra model call to force an answer
(`provide_final_answer`); we do not: the episode ends as "turn_budget" and is scored as it stands. A reply
smolagents cannot parse (AgentParsingError) counts as a parse error; an unknown tool, bad arguments
(AgentToolCallError) or a failing tool (our ToolError message inside smolagents' "Error executing tool"
text) count as tool errors; smolagents reports each one to the model in its own words and the episode goes
on. A prompt longer than positions - max_new_tokens ends the episode as "context_limit". Reward = the task's
checker on the final workspace and the submitted answer. There is no W component: workflow_violations is 0.
smolagents' loop is sequential, so episodes run side by side, one thread each (Lockstep): a model call waits
until every running episode waits for one, then one batched generation call answers them all.

This file imports no stage: the workspace, its tools and the verifier come from common/environment.py (as in 04), the
chat template and the token-in/token-out rule from common/generation.py; 04 hands it the backend and the tokenizer.
"""
import json
import threading
import time

import smolagents
from smolagents import (AgentError, AgentGenerationError, AgentMaxStepsError, AgentParsingError,
                        AgentToolExecutionError, ChatMessage, FinalAnswerTool, LogLevel, MessageRole, Model, Tool,
                        ToolCallingAgent)
from smolagents.memory import ActionStep
from smolagents.models import get_clean_message_list, tool_role_conversions
from tqdm import tqdm

from common.environment import TOOL_DOCS, Workspace, argument, check_results, safe, score
from common.generation import encode, extend_prompt

HARNESS_ID = "X-smolagents"
FRAMEWORK = f"smolagents {smolagents.__version__}"  # e.g. "smolagents 1.26.0", recorded in every episode
SUPPORTED = ">=1.20,<1.27"  # the APIs used here exist unchanged in these versions (checked in their source)


class BridgeError(Exception):
    """Bad input to the bridge: 04 reports it as `error: ...` with exit status 2, nothing written."""


def harness_title():
    """The name of this harness in tables: the framework and its installed version."""
    return FRAMEWORK


# ----------------------------------------------------------------------------- the workspace tools
def workspace_call(ws, tool, **args):
    """04's argument rules (environment.argument: numbers become strings, other types refused, MAX_ARG chars; the
    framework checks the declared types first, this is a second guard), then Workspace.call."""
    return ws.call(tool, {name: argument(name, safe(value)) for name, value in args.items()})  # model text is data


class WorkspaceTool(Tool):
    """One of 04's canonical tools over one episode's Workspace. ToolError -> smolagents' error observation."""
    output_type = "string"

    def __init__(self, ws):
        super().__init__()
        self.ws = ws

    def call_workspace(self, tool, **args):
        return workspace_call(self.ws, tool, **args)


def described(tool):
    """A smolagents Tool's name, description and inputs from environment.TOOL_DOCS (the words every harness uses)."""
    description, args = TOOL_DOCS[tool]
    return tool, description, {a: {"type": "string", "description": d} for a, d in args.items()}


class ListFiles(WorkspaceTool):
    name, description, inputs = described("list_files")

    def forward(self):
        return self.call_workspace("list_files")


class ReadFile(WorkspaceTool):
    name, description, inputs = described("read_file")

    def forward(self, path):
        return self.call_workspace("read_file", path=path)


class Search(WorkspaceTool):
    name, description, inputs = described("search")

    def forward(self, query):
        return self.call_workspace("search", query=query)


class WriteFile(WorkspaceTool):
    name, description, inputs = described("write_file")

    def forward(self, path, content):
        return self.call_workspace("write_file", path=path, content=content)


class Calculator(WorkspaceTool):
    name, description, inputs = described("calculator")

    def forward(self, expression):
        return self.call_workspace("calculator", expression=expression)


class SubmitFinalAnswer(FinalAnswerTool):
    """smolagents' own final_answer tool (its name, description and schema), which also records the answer
    in the workspace the way 04's submit does: a string (numbers become strings) of at most max_arg chars."""

    def __init__(self, ws):
        super().__init__()
        self.ws = ws

    def forward(self, answer):
        workspace_call(self.ws, "submit", answer=answer)
        return self.ws.answer


def make_tools(ws):
    return [cls(ws) for cls in (ListFiles, ReadFile, Search, WriteFile, Calculator, SubmitFinalAnswer)]


# ----------------------------------------------------------------------------- the agent (two guards, nothing else)
class Agent(ToolCallingAgent):
    """smolagents' ToolCallingAgent with its prompts, parser, rendering and memory unchanged, and two guards."""

    def provide_final_answer(self, task):
        """smolagents calls this when max_steps is reached, to make one extra model call for an answer. The turn
        budget is the harness's, so no extra call: the episode ends without an answer ("turn_budget")."""
        return ChatMessage(role=MessageRole.ASSISTANT, content=None)

    def execute_tool_call(self, tool_name, arguments):
        # a JSON blob whose "name" is a list or an object would crash the dict lookup in smolagents (TypeError)
        if not isinstance(tool_name, str):
            raise AgentToolExecutionError(f"Unknown tool {str(tool_name)[:40]}: a tool name is a string, one of: "
                                          f"{', '.join(self.tools)}.", self.logger)
        return super().execute_tool_call(tool_name, arguments)


# ----------------------------------------------------------------------------- the models (policy and oracle)
class ContextLimit(Exception):
    """The prompt does not fit in the policy's positions: the episode ends as "context_limit"."""


def plain_messages(messages):
    """smolagents' messages -> [{"role", "content"}] strings, by smolagents' own conversion for text models:
    tool-call -> assistant, tool-response -> user, consecutive messages of one role joined by a newline. Model
    text is data: a lone surrogate a model typed (a tool name smolagents echoes) becomes U+FFFD (environment.safe)."""
    clean = get_clean_message_list(messages, role_conversions=tool_role_conversions, flatten_messages_as_text=True)
    return [{"role": MessageRole(m["role"]).value, "content": safe(m["content"])} for m in clean]


def cut_at_stop_sequences(text, stops):
    """The text before the first stop sequence (what an API with `stop=` would return)."""
    for stop in stops or []:
        text = text.split(stop)[0]
    return text


class EpisodeModel(Model):
    """A smolagents Model for one episode: messages -> our chat template -> reply(messages, prompt_ids).
    Keeps what each call sent (`sent`) and the token-in/token-out model turns (`model_turns`, 04's schema)."""

    def __init__(self, tok=None, positions=None, max_new_tokens=0, model_id="policy"):
        super().__init__(model_id=model_id)
        self.tok, self.positions, self.max_new_tokens = tok, positions, max_new_tokens
        self.sent, self.model_turns, self.n_calls = [], [], 0
        self.last, self.rerendered = None, 0  # token-in/token-out across calls, as 04 (generation.extend_prompt)

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):
        # tools_to_call_from is not rendered by the chat template: the tools reach the model through
        # smolagents' system prompt, and the tool call comes back as text for smolagents' own parser.
        msgs = plain_messages(messages)
        ids = None
        if self.tok is not None:  # 04's rule: extend the last prompt's ids where smolagents only appended to what
            # the model saw and shows its reply unchanged; else re-render (smolagents folds its "Calling tools:"
            # text into the assistant message after a tool call, so most turns re-render: a new sample in 05)
            ids = extend_prompt(self.tok, *self.last, msgs) if self.last else None
            self.rerendered += self.last is not None and ids is None
            ids = ids if ids is not None else encode(self.tok, msgs)
        if ids is not None and self.positions and len(ids) > self.positions - self.max_new_tokens:
            raise ContextLimit(f"prompt of {len(ids)} tokens")
        self.sent.append(msgs)
        text, completion_ids, logprobs = self.reply(msgs, ids)
        if completion_ids is not None:
            self.model_turns.append({"prompt_ids": ids, "completion_ids": completion_ids, "logprobs": logprobs})
            self.last = (msgs, ids, completion_ids, safe(text))
        return ChatMessage(role=MessageRole.ASSISTANT, content=cut_at_stop_sequences(text, stop_sequences))

    def reply(self, messages, prompt_ids):
        """-> (text, completion ids or None, log-probs or None)."""
        raise NotImplementedError

    def parse_tool_calls(self, message):
        """smolagents' own text parser (Model.parse_tool_calls); only the call ids, random uuid4s there, become
        call_1, call_2, ... so that a seeded evaluation sees the same prompts when it is run again."""
        message = super().parse_tool_calls(message)
        for call in message.tool_calls:
            self.n_calls += 1
            call.id = f"call_{self.n_calls}"
        return message


class EpisodeBackend:
    """04's backend for one episode: each generate call draws with the episode's own randomness, keyed by its
    episode_id (generation.episode_seed) as in 04's lockstep rollouts: the same tokens whatever ran before it or
    beside it. Its calls go through the Lockstep that runs the episode (batched with the other running episodes')."""

    def __init__(self, lockstep, key, order):
        self.lockstep, self.key, self.order = lockstep, key, order

    def generate(self, prompts, turn):
        return [self.lockstep.generate(self.order, p, turn, self.key) for p in prompts]


class PolicyModel(EpisodeModel):
    """Our policy through 04's backend (an EpisodeBackend in an episode run here): completion ids as sampled (cut at
    the first stop token), decoded with skip_special_tokens. The text is then cut at smolagents' stop sequences; the
    ids are kept whole. The turn index is the episode's (0, 1, ...), as in 04."""

    def __init__(self, backend, tok, positions=None, max_new_tokens=0, model_id="policy"):
        super().__init__(tok, positions, max_new_tokens, model_id)
        self.backend = backend

    def reply(self, messages, prompt_ids):
        completion_ids, logprobs = self.backend.generate([prompt_ids], len(self.sent) - 1)[0]
        return self.tok.decode(completion_ids, skip_special_tokens=True), completion_ids, logprobs


def oracle_text(step):
    """One solution step in the format smolagents' prompt teaches: `Action:` and a JSON blob; submit ->
    final_answer."""
    name, args = ("final_answer", step["args"]) if step["tool"] == "submit" else (step["tool"], step["args"])
    return "Action:\n" + json.dumps({"name": name, "arguments": args}, ensure_ascii=False)


class OracleModel(EpisodeModel):
    """The scripted expert inside smolagents: the task's next solution step. With a tokenizer it records
    token ids like 04's oracle (the text's ids and the reply-end token; no log-probs)."""

    def __init__(self, task, tok=None):
        super().__init__(tok, model_id="oracle")
        self.solution = task.get("solution") or []

    def reply(self, messages, prompt_ids):
        text = oracle_text(self.solution[min(len(self.sent) - 1, len(self.solution) - 1)])
        ids = self.tok.encode(text, add_special_tokens=False) + self.tok.stop_ids[:1] if self.tok is not None else None
        return text, ids, None


# ----------------------------------------------------------------------------- episodes
def run_episode(task, model, ws, max_turns, meta, policy, temperature):
    """One task inside smolagents with `model` (an EpisodeModel) over workspace `ws`; -> 04's record."""
    agent = Agent(tools=make_tools(ws), model=model, max_steps=max_turns, verbosity_level=LogLevel.OFF)
    finish_reason = "turn_budget"
    try:
        agent.run(task["request"])
    except AgentGenerationError as e:  # an exception inside our Model.generate
        if not isinstance(e.__cause__, ContextLimit):
            raise
        finish_reason = "context_limit"
    steps = [s for s in agent.memory.steps if isinstance(s, ActionStep)]
    if any(s.is_final_answer for s in steps):
        finish_reason = "submitted"
    failed = [s for s in steps if isinstance(s.error, AgentError) and not isinstance(s.error, AgentMaxStepsError)]
    errors = [s.error for s in failed]
    parse_errors = sum(isinstance(e, AgentParsingError) for e in errors)
    reward = score(task["checker"], ws.files, ws.answer)
    return {**meta, "task_id": task["task_id"], "family": task.get("family", "custom"), "harness_id": HARNESS_ID,
            "policy": policy, "temperature": temperature, "reward": reward, "success": reward == 1.0,
            "checks": check_results(task["checker"], ws.files, ws.answer),
            "finish_reason": finish_reason, "turns": len(model.sent), "parse_errors": parse_errors,
            "tool_errors": len(errors) - parse_errors, "workflow_violations": 0, "workflow_checks": 0,
            "error_turns": [s.step_number for s in failed],  # 04's per-turn facts, from smolagents' steps
            "valid_call_turns": [s.step_number for s in steps if s.error is None and (s.tool_calls or
                                                                                     s.is_final_answer)],
            "submitted_answer": ws.answer, "rerendered_turns": model.rerendered,
            "transcript": plain_messages(agent.write_memory_to_messages()),
            "tools": getattr(model, "tools", None) or None,  # the schemas sent (native mode); text mode: in its prompt
            "model_turns": model.model_turns, "framework": FRAMEWORK}


def eval_meta(harness_id):
    """04's eval-mode meta of sample s of a task under this harness: meta(task, s) -> the record's first fields."""
    return lambda task, s: {"episode_id": f"eval-{task['task_id']}-{harness_id}-s{s}", "iteration": None,
                            "visit": None, "group_id": f"{task['task_id']}|{harness_id}|eval", "sample_index": s}


# ----------------------------------------------------------------------------- episodes side by side
class Lockstep:
    """A framework's episodes run side by side, one thread each (a framework's loop is sequential), and meet here
    for their model calls: a call waits until every running episode waits for one, then ONE batched generate call
    answers them all, in episode order (04's lockstep, across episodes the framework steps on its own). Each
    request keeps its episode's turn and key (generation.episode_seed), so an episode draws its own tokens whichever
    episodes share its batch. Python runs one episode at a time (the baton: held except while waiting here), so
    neither the framework nor the tokenizer runs in two threads at once. window 1: one episode after another."""

    def __init__(self, backend, window):
        self.backend, self.window = backend, max(1, window)
        self.cond, self.baton = threading.Condition(), threading.Lock()
        self.pending, self.running, self.calls = [], 0, 0

    def generate(self, order, prompt, turn, key):
        """One episode's request (from its thread, holding the baton) -> (completion ids, log-probs)."""
        slot = {"order": order, "prompt": prompt, "turn": turn, "key": key}
        self.baton.release()
        try:
            with self.cond:
                self.pending.append(slot)
                self.flush_if_all_wait()
                while "out" not in slot:
                    self.cond.wait()
        finally:
            self.baton.acquire()
        if isinstance(slot["out"], BaseException):  # the batch's generate call failed: each episode raises it
            raise slot["out"]
        return slot["out"]

    def flush_if_all_wait(self):
        """With self.cond held: once every running episode waits, one generate call for all their requests."""
        if not self.pending or len(self.pending) < self.running:
            return
        batch, self.pending = sorted(self.pending, key=lambda x: x["order"]), []
        self.calls += 1
        try:
            outs = self.backend.generate([x["prompt"] for x in batch], [x["turn"] for x in batch],
                                         keys=[x["key"] for x in batch])
        except Exception as e:
            outs = [e] * len(batch)
        for x, out in zip(batch, outs):
            x["out"] = out
        self.cond.notify_all()

    def run(self, jobs, done=lambda: None):
        """jobs: one callable per episode, job(lockstep, its index) -> their results in job order. `window` workers
        each take the next job when their episode ends, so the episodes of every batch are the same from run to run.
        An exception in an episode (a BridgeError) stops new episodes from starting; the first (in job order) is
        raised."""
        results, todo, errors = [None] * len(jobs), iter(enumerate(jobs)), []  # errors: (job index, exception)

        def worker():
            with self.baton:
                while True:
                    with self.cond:
                        job = None if errors else next(todo, None)
                        if job is None:
                            self.running -= 1
                            self.flush_if_all_wait()
                            return
                    try:
                        results[job[0]] = job[1](self, job[0])
                        done()
                    except BaseException as e:
                        errors.append((job[0], e))
        threads = [threading.Thread(target=worker, daemon=True) for _ in range(min(self.window, len(jobs)))]
        self.running = len(threads)
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise min(errors, key=lambda x: x[0])[1]
        return results


def bridge_jobs(name, harness_id, run_episode, make_model, tasks, policy, backend, tok, max_turns, temperature,
                samples=1, meta=None):
    """Every task x `samples` inside a framework as Lockstep jobs, in task x sample order: job(lockstep, order) -> the
    episode's record in 04's schema plus "framework". meta(task, s) -> the record's meta (default: eval mode's,
    eval_meta; 04's train mode gives its own). backend None = the oracle (tok optional: it only records token ids);
    otherwise 04's HFBackend or VLLMBackend and the policy's tok. make_model(task, episode_backend) -> the episode's
    Model (the oracle's, or the policy's drawing through EpisodeBackend(lockstep, episode_id, order)). Every bridge
    makes its episodes here."""
    if max_turns < 1 or samples < 1:
        raise BridgeError(f"{name} harness: max_turns and samples must be >= 1")
    missing = [t["task_id"] for t in tasks if backend is None and not t.get("solution")]
    if missing:
        raise BridgeError(f"task {missing[0]!r}: the oracle needs a 'solution'")
    if backend is not None and tok is None:
        raise BridgeError(f"{name} harness: a policy backend needs the policy's tokenizer")
    metas = [(task, (meta or eval_meta(harness_id))(task, s)) for task in tasks for s in range(samples)]
    return [lambda lockstep, order, task=task, m=m: run_episode(
        task, make_model(task, EpisodeBackend(lockstep, m["episode_id"], order)), Workspace(task["files"]), max_turns,
        m, policy, temperature) for task, m in metas]


def run_jobs(name, jobs, backend, concurrency=1, progress=True):
    """Lockstep jobs (one framework's or several's) -> their records, in job order: `concurrency` episodes side by
    side, their model calls batched (Lockstep); 1 = one after another, as does the oracle (it generates nothing)."""
    lockstep = Lockstep(backend, concurrency if backend is not None else 1)
    bar = tqdm(total=len(jobs), desc=f"{name} episodes", disable=not progress, leave=False)
    start = time.perf_counter()
    records = lockstep.run(jobs, bar.update)
    bar.close()
    if progress:
        print(f"[{name}] {len(records)} episodes in {time.perf_counter() - start:.1f} s ({lockstep.calls} generate "
              f"calls, up to {lockstep.window} episodes side by side)", flush=True)
    return records


def episode_jobs(tasks, policy, backend, tok, max_turns, max_new_tokens, temperature, samples=1, positions=None,
                 meta=None):
    """The episodes inside smolagents' text mode as Lockstep jobs (bridge_jobs)."""
    def make_model(task, episode_backend):
        return (OracleModel(task, tok) if backend is None else
                PolicyModel(episode_backend, tok, positions, max_new_tokens, str(policy)))
    return bridge_jobs("smolagents", HARNESS_ID, run_episode, make_model, tasks, policy, backend, tok, max_turns,
                       temperature, samples, meta)


def run_smolagents_episodes(tasks, policy, backend, tok, max_turns, max_new_tokens, temperature, samples=1,
                            progress=True, positions=None, meta=None, concurrency=1):
    """The episodes inside smolagents' text mode, `concurrency` side by side -> records (run_jobs)."""
    return run_jobs("smolagents", episode_jobs(tasks, policy, backend, tok, max_turns, max_new_tokens, temperature,
                                               samples, positions, meta), backend, concurrency, progress)
