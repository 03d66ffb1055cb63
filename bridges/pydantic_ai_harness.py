"""A real agent framework with native tool calls: pydantic-ai's Agent, our policy behind its FunctionModel.

Role: plays OpenClaw (docs/experiments.md): black-box SFT and RL train inside it; it is left out of their
Out-of-Space column. Every model call is a token-in/token-out model turn in 04's schema.

pydantic-ai as shipped: its Agent loop (one model request per step, tools run, results sent back), its message
history (ModelRequest / ModelResponse parts), its argument validation (pydantic, from each tool's signature and
docstring), its error texts (an unknown tool, invalid JSON or a wrong type, a tool's ModelRetry: a tool result
{"error": ...} the model sees; a reply without a tool call: "Please include your response in a tool call."), its
output tool that ends the run (`submit`), and no system prompt (pydantic-ai ships none; an agent's author adds
instructions, and we add none). What this file adds:

- Tools: list_files, read_file, search, write_file, calculator as async functions over common/environment.py's workspace
  (through smolagents_harness.workspace_call: 04's semantics and limits; their descriptions are
  environment.TOOL_DOCS, the words 04's base harness declares them with); a failing call raises ModelRetry
  (pydantic-ai's way to tell the model). `submit` is the agent's output tool.
- The model: pydantic-ai's FunctionModel calling one async function per request. It maps pydantic-ai's messages
  to chat messages as pydantic-ai's OpenAIChatModel does for an OpenAI-compatible server (instructions first,
  tool results as role "tool" with ToolReturnPart.model_response_str(), a response's text parts joined by a blank
  line, its calls as `tool_calls`), and the tool definitions as that model's `_map_tool_definition` does; the
  engine's side (generation.ToolTemplate, parse_tool_calls) renders, samples and parses as vLLM's hermes parser.
- Budget: UsageLimits(request_limit=max_turns): the request after the last allowed one is not made ("turn_budget").
  retries = max_turns for every tool and the output, so the turn budget, not pydantic-ai's default of one retry,
  ends an episode that keeps failing (pydantic-ai would raise UnexpectedModelBehavior: "turn_budget" too).
- Token-in/token-out: pydantic-ai only appends to its history, so where the template renders the parsed reply
  exactly as the model wrote it (the oracle's and a trained model's canonical `<tool_call>` text), the next
  prompt is the last prompt's ids + the sampled ids + the template's ids for what follows (generation.extend_prompt):
  the episode trains as one sequence. Otherwise the turn is re-rendered and counted (rerendered_turns), as in 04.
- Training: 04's train mode runs its episodes here (`04 --iteration t --harnesses pydantic-ai`, black-box RL): the
  same records with 04's train-mode meta; each episode draws with its own randomness (its episode_id, as in 04).
"""
import json

import pydantic_ai
from pydantic_ai import Agent, ModelRetry, Tool, ToolOutput, UsageLimits, capture_run_messages
from pydantic_ai.exceptions import UnexpectedModelBehavior, UsageLimitExceeded
from pydantic_ai.messages import (ModelRequest, ModelResponse, RetryFeedbackPart, SystemPromptPart, TextPart,
                                  ToolCallPart, ToolReturnPart, UserPromptPart)
from pydantic_ai.models.function import FunctionModel

from common.generation import (ToolTemplate, encode, extend_prompt, hermes_messages, parse_tool_calls, render,
                               safe_json, sampled_reply, scripted_reply, tool_call_text)
from common.environment import TOOL_DOCS, check_results, safe, score
from bridges.smolagents_harness import BridgeError  # noqa: F401  (04 uses it through this module)
from bridges.smolagents_harness import (Calculator, ContextLimit, ListFiles, ReadFile, Search, WriteFile, bridge_jobs,
                                        run_jobs, workspace_call)

HARNESS_ID = "X-pydantic-ai"
FRAMEWORK = f"pydantic-ai {pydantic_ai.__version__}"  # e.g. "pydantic-ai 2.68.0", recorded in every episode
SUPPORTED = "==2.68.0"  # pydantic-ai-slim, the version whose source this file was checked against


def harness_title():
    return FRAMEWORK


# ----------------------------------------------------------------------------- the workspace tools
def make_tools(ws, retries):
    """04's tools as pydantic-ai tools (schemas from the signatures, descriptions from the docstrings) + submit."""
    def call(tool, **args):
        try:
            return workspace_call(ws, tool, **args)
        except Exception as e:  # environment.ToolError or any other: pydantic-ai shows it to the model, goes on
            raise ModelRetry(f"{type(e).__name__}: {e}")

    async def list_files() -> str:
        return call("list_files")

    async def read_file(path: str) -> str:
        return call("read_file", path=path)

    async def search(query: str) -> str:
        return call("search", query=query)

    async def write_file(path: str, content: str) -> str:
        return call("write_file", path=path, content=content)

    async def calculator(expression: str) -> str:
        return call("calculator", expression=expression)

    async def submit(answer: str) -> str:
        call("submit", answer=answer)
        return ws.answer

    tools = (list_files, read_file, search, write_file, calculator)
    for f, spec in zip(tools, (ListFiles, ReadFile, Search, WriteFile, Calculator)):
        args = "".join(f"\n    {name}: {arg['description']}" for name, arg in spec.inputs.items())
        f.__doc__ = spec.description + (f"\n\nArgs:{args}" if args else "")
    description, args = TOOL_DOCS["submit"]
    submit.__doc__ = description + "\n\nArgs:\n    answer: " + args["answer"]
    return [Tool(f, max_retries=retries) for f in tools], ToolOutput(submit, name="submit", max_retries=retries)


# ----------------------------------------------------------------------------- pydantic-ai's request as chat messages
def tool_json(tool):
    """A ToolDefinition as OpenAIChatModel._map_tool_definition sends it."""
    return {"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                             "parameters": tool.parameters_json_schema}}


def chat_messages(messages, instructions):
    """pydantic-ai's messages -> OpenAI chat messages, as OpenAIChatModel._map_messages maps the parts an agent
    run holds (model text is data: lone surrogates -> U+FFFD). Any other part is a BridgeError."""
    out = []
    for message in messages:
        if isinstance(message, ModelResponse):
            texts = [p.content for p in message.parts if isinstance(p, TextPart)]
            calls = [{"id": p.tool_call_id, "type": "function", "function": {"name": p.tool_name,
                                                                              "arguments": p.args_as_json_str()}}
                     for p in message.parts if isinstance(p, ToolCallPart)]
            if texts or calls:  # an empty response is not sent
                out.append({"role": "assistant", "content": "\n\n".join(texts) if texts else None,
                            **({"tool_calls": calls} if calls else {})})
            continue
        for part in message.parts:
            if isinstance(part, SystemPromptPart):
                out.append({"role": "system", "content": part.content})
            elif isinstance(part, UserPromptPart) and isinstance(part.content, str):
                out.append({"role": "user", "content": part.content})
            elif isinstance(part, ToolReturnPart):
                out.append({"role": "tool", "tool_call_id": part.tool_call_id, "content": part.model_response_str()})
            else:
                raise BridgeError(f"pydantic-ai sent a {type(part).__name__}: this bridge does not map it")
    leading = next((i for i, m in enumerate(out) if m["role"] != "system"), len(out))
    out[leading:leading] = [{"role": "system", "content": instructions}] if instructions else []
    return safe_json(out)


# ----------------------------------------------------------------------------- the models (policy and oracle)
class EpisodeModel:
    """FunctionModel's function for one episode: chat messages + tools -> the chat template -> reply(messages,
    prompt_ids) -> hermes parser -> a ModelResponse. Keeps what each call sent (`sent`), the token-in/token-out
    model turns (`model_turns`, 04's schema) and each reply's parse error (`parse_failed`: no valid call)."""

    def __init__(self, tok=None, positions=None, max_new_tokens=0):
        self.tok, self.positions, self.max_new_tokens = tok, positions, max_new_tokens
        self.sent, self.model_turns, self.parse_failed, self.n_calls = [], [], [], 0
        self.last, self.rerendered = None, 0

    def prompt_ids(self, view, chat):
        """04's rule: the last prompt's ids + the sampled ids + the template's ids for the messages since, where
        pydantic-ai only appended and the template renders the parsed reply as the text the model wrote."""
        if self.last:
            prev_chat, prev_shown, prev_ids, completion_ids, reply = self.last
            n, as_written = len(prev_chat), {"role": "assistant", "content": reply}
            if chat[:n] == prev_chat and len(chat) > n and chat[n]["role"] == "assistant" and \
                    render(view, chat[:n + 1]) == render(view, prev_shown + [as_written]):
                shown = prev_shown + [as_written] + chat[n + 1:]
                ids = extend_prompt(view, prev_shown, prev_ids, completion_ids, reply, shown)
                if ids is not None:
                    return shown, ids
            self.rerendered += 1
        return chat, encode(view, chat)

    async def respond(self, messages, info):
        chat = chat_messages(messages, info.instructions)
        self.tools = [tool_json(t) for t in info.function_tools + info.output_tools]  # as sent to the engine
        ids = None
        if self.tok is not None:
            view = ToolTemplate(self.tok, self.tools)
            shown, ids = self.prompt_ids(view, chat)
        if ids is not None and self.positions and len(ids) > self.positions - self.max_new_tokens:
            raise ContextLimit(f"prompt of {len(ids)} tokens")
        self.sent.append(chat)
        text, completion_ids, logprobs = self.reply(chat, ids)
        self.text = text = safe(text)
        if completion_ids is not None:
            self.model_turns.append({"prompt_ids": ids, "completion_ids": completion_ids, "logprobs": logprobs})
            self.last = (chat, shown, ids, completion_ids, text)
        calls, error = parse_tool_calls(text)  # an error: no calls, the whole text as content (vLLM's fallback)
        self.parse_failed.append(not calls)
        content = text[:text.find("<tool_call>")] if calls else text  # vLLM: the text before the first call
        parts = [TextPart(content)] if content or not calls else []
        for call in calls:  # arguments as the OpenAI API returns them: a JSON string, validated by pydantic-ai
            self.n_calls += 1
            parts.append(ToolCallPart(call["name"], json.dumps(call["arguments"], ensure_ascii=False),
                                      tool_call_id=f"call_{self.n_calls}"))
        return ModelResponse(parts=parts)

    def reply(self, messages, prompt_ids):
        """-> (text, completion ids or None, log-probs or None)."""
        raise NotImplementedError

    def transcript(self):
        """The messages of the last request as {"role", "content"} text (calls and results in the Hermes
        convention, without the tool block) + the last reply: what the model saw and wrote last."""
        return hermes_messages(self.sent[-1], []) + [{"role": "assistant", "content": self.text}] if self.sent else []


class PolicyModel(EpisodeModel):
    """Our policy through 04's backend, decoded as vLLM does with tools (generation.sampled_reply)."""

    def __init__(self, backend, tok, positions=None, max_new_tokens=0):
        super().__init__(tok, positions, max_new_tokens)
        self.backend = backend

    def reply(self, messages, prompt_ids):
        return sampled_reply(self.backend, self.tok, prompt_ids, len(self.sent) - 1)


def oracle_text(step):
    """One solution step as a structured call (Hermes text); submit is the agent's output tool."""
    return tool_call_text(step["tool"], step["args"])


class OracleModel(EpisodeModel):
    """The scripted expert: the task's next solution step, through the same render -> text -> parser path."""

    def __init__(self, task, tok=None):
        super().__init__(tok)
        self.solution = task.get("solution") or []

    def reply(self, messages, prompt_ids):
        return scripted_reply(oracle_text(self.solution[min(len(self.sent) - 1, len(self.solution) - 1)]), self.tok)


# ----------------------------------------------------------------------------- episodes
def turn_facts(messages, parse_failed):
    """Per model turn (1-based): tool errors = pydantic-ai's retried tool results (unknown tool, invalid
    arguments, a tool's ModelRetry) in the request after that turn's response; a parse error = a reply without a
    valid tool call (pydantic-ai answers it with a RetryFeedbackPart). -> (tool_errors, error_turns, valid_turns)."""
    responses = [i for i, m in enumerate(messages) if isinstance(m, ModelResponse)]
    tool_errors, error_turns, valid_turns = 0, [], []
    for turn, i in enumerate(responses, start=1):
        after = messages[i + 1].parts if i + 1 < len(messages) and isinstance(messages[i + 1], ModelRequest) else []
        failed = sum(isinstance(p, ToolReturnPart) and p.outcome in ("retried", "failed") for p in after)
        failed += sum(isinstance(p, RetryFeedbackPart) for p in after) and not parse_failed[turn - 1]
        tool_errors += failed
        if failed or parse_failed[turn - 1]:
            error_turns.append(turn)
        elif any(isinstance(p, ToolCallPart) for p in messages[i].parts):
            valid_turns.append(turn)
    return tool_errors, error_turns, valid_turns


def run_episode(task, model, ws, max_turns, meta, policy, temperature):
    """One task inside pydantic-ai with `model` (an EpisodeModel) over workspace `ws`; -> 04's record."""
    tools, output = make_tools(ws, retries=max_turns)
    agent = Agent(FunctionModel(model.respond, model_name=getattr(model, "model_id", "policy")), tools=tools,
                  output_type=output, retries=max_turns)
    finish_reason = "submitted"
    with capture_run_messages() as messages:
        try:
            agent.run_sync(task["request"], usage_limits=UsageLimits(request_limit=max_turns))
        except (UsageLimitExceeded, UnexpectedModelBehavior):  # the next request would pass the turn budget
            finish_reason = "turn_budget"
        except ContextLimit:
            finish_reason = "context_limit"
    tool_errors, error_turns, valid_turns = turn_facts(messages, model.parse_failed)
    reward = score(task["checker"], ws.files, ws.answer)
    return {**meta, "task_id": task["task_id"], "family": task.get("family", "custom"), "harness_id": HARNESS_ID,
            "policy": policy, "temperature": temperature, "reward": reward, "success": reward == 1.0,
            "checks": check_results(task["checker"], ws.files, ws.answer), "finish_reason": finish_reason,
            "turns": len(model.sent), "parse_errors": sum(model.parse_failed), "tool_errors": tool_errors,
            "workflow_violations": 0, "workflow_checks": 0, "error_turns": error_turns,
            "valid_call_turns": valid_turns, "submitted_answer": ws.answer, "rerendered_turns": model.rerendered,
            "transcript": model.transcript(), "tools": getattr(model, "tools", None), "model_turns": model.model_turns,
            "framework": FRAMEWORK}


def episode_jobs(tasks, policy, backend, tok, max_turns, max_new_tokens, temperature, samples=1, positions=None,
                 meta=None):
    """Every task x `samples` inside pydantic-ai as Lockstep jobs (smolagents_harness.bridge_jobs). meta(task, s): the
    record's meta (default: eval mode's, group_id "task|X-pydantic-ai|eval"; 04's train mode gives its own). backend
    None = the oracle (tok optional: it only records ids)."""
    def make_model(task, episode_backend):
        return (OracleModel(task, tok) if backend is None else
                PolicyModel(episode_backend, tok, positions, max_new_tokens))
    return bridge_jobs("pydantic-ai", HARNESS_ID, run_episode, make_model, tasks, policy, backend, tok, max_turns,
                       temperature, samples, meta)


def run_pydantic_ai_episodes(tasks, policy, backend, tok, max_turns, max_new_tokens, temperature, samples=1,
                             progress=True, positions=None, meta=None, concurrency=1):
    """The episodes inside pydantic-ai, `concurrency` side by side (their model calls batched:
    smolagents_harness.Lockstep); -> 04's records + "framework"."""
    return run_jobs("pydantic-ai", episode_jobs(tasks, policy, backend, tok, max_turns, max_new_tokens, temperature,
                                                samples, positions, meta), backend, concurrency, progress)
