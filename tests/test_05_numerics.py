"""Stage 05 numerics: the LM head and log-softmax in fp32 under bf16 autocast, the logit scalings that
the direct base_model + output-embedding path must apply (or refuse), dropout off during the update
without turning gradient checkpointing off."""
import random

from common import generation as G
import pytest
import torch
from conftest import load_stage

T05 = load_stage("05_train.py")


def tiny_model(kind, **extra):
    """A randomly initialised 1-2 layer model of the given architecture (vocabulary 300)."""
    import transformers as tf
    torch.manual_seed(0)
    common = dict(vocab_size=300, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256)
    cfg = {"llama": lambda: tf.LlamaConfig(**common, tie_word_embeddings=False, **extra),
           "gemma2": lambda: tf.Gemma2Config(**common, head_dim=16, **extra),
           "cohere": lambda: tf.CohereConfig(**common, **extra),
           "granite": lambda: tf.GraniteConfig(**common, **extra),
           "gpt2": lambda: tf.GPT2Config(vocab_size=300, n_embd=64, n_layer=2, n_head=4, n_positions=256, **extra),
           }[kind]()
    return tf.AutoModelForCausalLM.from_config(cfg).float()


def batch(n=4, vocab=300, seed=0):
    rng = random.Random(seed)
    seqs = []
    for _ in range(n):
        p, c = [rng.randrange(3, vocab) for _ in range(rng.randint(5, 12))], [rng.randrange(3, vocab) for _ in range(6)]
        seqs.append(T05.Sequence(ids=p + c, mask=[0] * len(p) + [1] * len(c), ep=0, temp=1.0, n=len(c)))
    return seqs, T05.token_batch(seqs, 0, "cpu", T05.TOKEN_FIELDS)


def full_logp(model, seqs, scale=True):
    """log pi(y_t) of the completion tokens from the model's own forward (full logits, fp32)."""
    out = []
    with torch.no_grad():
        for s in seqs:
            logits = model(torch.tensor([s.ids])).logits[0].float()  # [L, V]
            logp = torch.log_softmax(logits, -1)
            out += [logp[k - 1, s.ids[k]] for k in range(len(s.ids)) if s.mask[k]]
    return torch.stack(out)


def test_lm_head_is_fp32_under_bf16_autocast():
    """CPU bf16 autocast (the GPU path): log-probs come back fp32 and, from the same bf16-trunk hidden
    states, match an fp64 head far more closely than a head run in bf16 would (the old code). The head is
    scaled so that logits reach ~16-32, as in real models."""
    model = tiny_model("llama").eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(40.0)
    seqs, b = batch()
    with torch.no_grad():
        ref, _, _ = T05.forward(model, None, b, amp=False)
        got, _, _ = T05.forward(model, None, b, amp=True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            h = model.base_model(input_ids=b["inp"]).last_hidden_state[b["sel"]]  # [N, H]
            bf16_logits = model.lm_head(h)  # [N, V] what the old code computed under autocast
            assert T05.lm_head(model, h).dtype == torch.float32
        bf16 = torch.log_softmax(bf16_logits.float(), -1).gather(1, b["tgt"][:, None])[:, 0]
        exact = torch.log_softmax(h.double() @ model.lm_head.weight.double().T, -1).gather(1, b["tgt"][:, None])[:, 0]
    assert bf16_logits.dtype == torch.bfloat16 and bf16_logits.abs().max() > 16  # the regime of the issue
    assert got.dtype == torch.float32
    torch.testing.assert_close(ref, full_logp(model, seqs), atol=1e-4, rtol=0)  # fp32 path = model's forward
    err_fp32_head, err_bf16_head = (got - exact).abs().max().item(), (bf16 - exact).abs().max().item()
    assert err_fp32_head < 1e-4 and err_bf16_head > 100 * err_fp32_head, (err_fp32_head, err_bf16_head)
    assert (got - ref).abs().max() < 0.2  # the bf16 trunk itself stays close to fp32


@pytest.mark.parametrize("kind,extra", [("gemma2", dict(final_logit_softcapping=0.5)),
                                        ("cohere", dict(logit_scale=4.0)),
                                        ("granite", dict(logits_scaling=0.25))])
def test_model_specific_logit_scaling_is_applied(kind, extra):
    """The trainer's log-probs equal those of the model's own forward for Gemma-2 soft-capping, Cohere
    logit_scale and Granite logits_scaling; the plain base_model + lm_head path differs (the check can fail)."""
    model = tiny_model(kind, **extra).eval()
    seqs, b = batch()
    with torch.no_grad():
        got, _, _ = T05.forward(model, None, b, amp=False)
        h = model.base_model(input_ids=b["inp"]).last_hidden_state[b["sel"]]
        plain = torch.log_softmax(model.get_output_embeddings()(h), -1).gather(1, b["tgt"][:, None])[:, 0]
    ref = full_logp(model, seqs)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    assert (plain - ref).abs().max() > 1e-2
    T05.check_head(model, seqs[0].ids, "policy")  # passes: no SystemExit


def test_unknown_logit_transformation_is_refused(capsys):
    """A model whose forward rescales its logits in a way 05 does not know stops with one clear error."""
    model = tiny_model("llama")
    plain_forward = model.forward

    def scaled_forward(*a, **k):
        out = plain_forward(*a, **k)
        out.logits = out.logits * 0.5
        return out
    model.forward = scaled_forward
    seqs, _ = batch()
    with pytest.raises(SystemExit) as e:
        T05.check_head(model, seqs[0].ids, "some/policy")
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and err[0].startswith("error: some/policy: llama's forward applies")


@pytest.mark.parametrize("kind,extra", [("llama", dict(attention_dropout=0.5)),
                                        ("gpt2", dict(resid_pdrop=0.5, embd_pdrop=0.5, attn_pdrop=0.5))])
def test_dropout_off_during_the_update_with_checkpointing_still_on(kind, extra):
    """train_mode(): two training-mode forwards give the same log-probs (dropout 0.5 would not), the
    model stays in training mode, and the first layer's MLP runs again in backward (checkpointed).
    Controls: without it dropout is active; with model.eval() nothing is recomputed."""
    def layer0_mlp(m):
        return (m.model.layers[0] if kind == "llama" else m.transformer.h[0]).mlp

    def one_step(m):
        calls = []
        # a pre-hook: the recomputation stops early, right after the last tensor backward needs
        hook = layer0_mlp(m).register_forward_pre_hook(lambda *_: calls.append(1))
        seqs, b = batch()
        logp, _, _ = T05.forward(m, None, b, amp=False)
        logp.sum().backward()
        hook.remove()
        return logp.detach(), len(calls)

    model = tiny_model(kind, **extra)
    G.train_mode(model, grad_ckpt=True)
    assert model.training
    (a, calls), (b2, _) = one_step(model), one_step(model)
    torch.testing.assert_close(a, b2, atol=0, rtol=0)
    assert calls == 2  # forward + the recomputation in backward
    assert model.config.to_dict()[next(iter(extra))] == 0.5  # the saved config keeps its dropout

    control = tiny_model(kind, **extra)
    control.train()
    assert (one_step(control)[0] - one_step(control)[0]).abs().max() > 1e-3
    G.train_mode(control, grad_ckpt=True)
    control.eval()
    assert one_step(control)[1] == 1
