"""A real agent framework with native tool calls: smolagents' ToolCallingAgent, as a serving engine would drive it.

Role: plays Claude Code (docs/experiments.md): every test row is evaluated inside it, nothing trains in it.

bridges/smolagents_harness.py runs the same agent in text mode (the model writes `Action: {json}` and smolagents' own
text parser reads it: the 'unseen call syntax' column). Here the Model is what smolagents' OpenAIServerModel talks
to when it points at vLLM with `--tool-call-parser hermes`: smolagents sends its messages and the tools' JSON
schemas (`tools_to_call_from` -> `get_tool_json_schema`, by smolagents' own `_prepare_completion_kwargs`), the
engine renders them with the policy's chat template (generation.ToolTemplate: the template's own tool rendering,
or the Hermes/Qwen2.5 convention), samples, and returns structured tool calls parsed from `<tool_call>{json}
</tool_call>` as vLLM's hermes parser does (generation.parse_tool_calls). smolagents then takes
`ChatMessage.tool_calls` and skips its text parser; where the reply has no parsable call it falls back to that
parser, as it does with any API (a parse error when that fails too). Everything else is smolagents as shipped: its
toolcalling_agent.yaml system prompt, its memory (a call is shown back to the model as "Calling tools: [...]", a
result as "Observation: ..."), its error texts, its loop.

Shared with bridges/smolagents_harness.py (imported, not copied): the workspace tools (common/environment.py's) and
final_answer, the Agent with its two guards (no forced extra answer call at the step limit; a non-string tool name is an
unknown tool), the episode record (run_episode) and the token-in/token-out bookkeeping of its EpisodeModel. Decisions
of this file: smolagents asks for tool_choice="required", which an engine enforces by guided decoding; we sample
unconstrained (the ids trained on are the ids sampled) and parse as tool_choice="auto" does. Call ids are call_1,
call_2, ... (deterministic). The text is cut at smolagents' stop sequences before parsing; the ids are kept whole.
"""
import json

from smolagents import ChatMessage, MessageRole
from smolagents.models import ChatMessageToolCall, ChatMessageToolCallFunction

from bridges import smolagents_harness as text_bridge
from common.generation import (ToolTemplate, encode, extend_prompt, parse_tool_calls, sampled_reply, scripted_reply,
                               tool_call_text)
from common.environment import safe
from bridges.smolagents_harness import ContextLimit, bridge_jobs, run_jobs
from bridges.smolagents_harness import BridgeError  # noqa: F401  (04 uses it through this module)

HARNESS_ID = "X-smolagents-native"
FRAMEWORK = f"{text_bridge.FRAMEWORK} (native tool calls)"  # e.g. "smolagents 1.26.0 (native tool calls)"


def harness_title():
    return FRAMEWORK


class NativeModel(text_bridge.EpisodeModel):
    """A smolagents Model for one episode with function calling: messages + tool schemas -> the chat template
    (tools in the system turn) -> reply(messages, prompt_ids) -> hermes parser -> ChatMessage.tool_calls."""

    def generate(self, messages, stop_sequences=None, response_format=None, tools_to_call_from=None, **kwargs):
        request = self._prepare_completion_kwargs(messages, stop_sequences, response_format, tools_to_call_from,
                                                  flatten_messages_as_text=True)  # smolagents' own request
        self.tools = request.get("tools") or []  # the tool schemas smolagents sent (the engine renders them)
        msgs = [{"role": MessageRole(m["role"]).value, "content": safe(m["content"])} for m in request["messages"]]
        ids = None
        if self.tok is not None:  # 04's rule: extend the last prompt's ids where smolagents only appended
            view = ToolTemplate(self.tok, request.get("tools"))
            ids = extend_prompt(view, *self.last, msgs) if self.last else None
            self.rerendered += self.last is not None and ids is None
            ids = ids if ids is not None else encode(view, msgs)
        if ids is not None and self.positions and len(ids) > self.positions - self.max_new_tokens:
            raise ContextLimit(f"prompt of {len(ids)} tokens")
        self.sent.append(msgs)
        text, completion_ids, logprobs = self.reply(msgs, ids)
        text = safe(text)
        if completion_ids is not None:
            self.model_turns.append({"prompt_ids": ids, "completion_ids": completion_ids, "logprobs": logprobs})
            self.last = (msgs, ids, completion_ids, text)
        text = text_bridge.cut_at_stop_sequences(text, request.get("stop"))
        calls, _ = parse_tool_calls(text)  # an error: no calls, the whole text as content (vLLM's fallback)
        tool_calls = []
        for call in calls:
            self.n_calls += 1
            tool_calls.append(ChatMessageToolCall(id=f"call_{self.n_calls}", type="function",
                                                  function=ChatMessageToolCallFunction(
                                                      name=call["name"],
                                                      arguments=json.dumps(call["arguments"], ensure_ascii=False))))
        content = text[:text.find("<tool_call>")] if calls else text
        return ChatMessage(role=MessageRole.ASSISTANT, content=content or None, tool_calls=tool_calls or None)


class PolicyModel(NativeModel):
    """Our policy through 04's backend, the reply decoded as vLLM does with tools (generation.sampled_reply)."""

    def __init__(self, backend, tok, positions=None, max_new_tokens=0, model_id="policy"):
        super().__init__(tok, positions, max_new_tokens, model_id)
        self.backend = backend

    def reply(self, messages, prompt_ids):
        return sampled_reply(self.backend, self.tok, prompt_ids, len(self.sent) - 1)


def oracle_text(step):
    """One solution step as a structured call (Hermes text); submit -> smolagents' final_answer."""
    return tool_call_text("final_answer" if step["tool"] == "submit" else step["tool"], step["args"])


class OracleModel(NativeModel):
    """The scripted expert: the task's next solution step, through the same render -> text -> parser path."""

    def __init__(self, task, tok=None):
        super().__init__(tok, model_id="oracle")
        self.solution = task.get("solution") or []

    def reply(self, messages, prompt_ids):
        return scripted_reply(oracle_text(self.solution[min(len(self.sent) - 1, len(self.solution) - 1)]), self.tok)


def run_episode(task, model, ws, max_turns, meta, policy, temperature):
    """One task inside smolagents (native tool calls); -> 04's record (smolagents_harness.run_episode's)."""
    record = text_bridge.run_episode(task, model, ws, max_turns, meta, policy, temperature)
    return {**record, "harness_id": HARNESS_ID, "framework": FRAMEWORK}


def episode_jobs(tasks, policy, backend, tok, max_turns, max_new_tokens, temperature, samples=1, positions=None,
                 meta=None):
    """Every task x `samples` inside smolagents with native tool calls as Lockstep jobs (smolagents_harness.bridge_jobs;
    default meta: eval mode's, group_id "task|X-smolagents-native|eval"); backend None = the oracle."""
    def make_model(task, episode_backend):
        return (OracleModel(task, tok) if backend is None else
                PolicyModel(episode_backend, tok, positions, max_new_tokens, str(policy)))
    return bridge_jobs("smolagents (native)", HARNESS_ID, run_episode, make_model, tasks, policy, backend, tok,
                       max_turns, temperature, samples, meta)


def run_native_episodes(tasks, policy, backend, tok, max_turns, max_new_tokens, temperature, samples=1,
                        progress=True, positions=None, meta=None, concurrency=1):
    """The episodes inside smolagents (native tool calls), `concurrency` side by side (their model calls batched:
    smolagents_harness.Lockstep); -> 04's records + "framework"."""
    return run_jobs("smolagents (native)", episode_jobs(tasks, policy, backend, tok, max_turns, max_new_tokens,
                                                        temperature, samples, positions, meta), backend, concurrency,
                    progress)
