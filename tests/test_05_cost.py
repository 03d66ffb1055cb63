"""05 without wasted work (docs/engineering.md): the LM head in chunks of completion tokens (same log-probs, entropies
and gradients as one [N, V] pass), micro-batches sized by tokens (--micro-batch-tokens, same update), pi_old scored
once before the first step, and scoring sorted by length."""
import json

import pytest
import torch
from test_05_train import T05, args_for, as_episodes, grads, load, prepare, random_episodes
from transformers import AutoTokenizer


@pytest.fixture
def tiny(tiny05):
    return tiny05


def batch_of(model, recs, temp=0.7):
    seqs = T05.build_sequences(as_episodes(recs))
    for s in seqs:
        s.temp = temp
    return seqs, T05.token_batch(seqs, 0, "cpu", T05.TOKEN_FIELDS)


def today_forward(model, b):
    """The formula before chunking, written out: fp32 logits of every selected position at once."""
    h = model.base_model(input_ids=b["inp"]).last_hidden_state[b["sel"]]  # [N, H]
    logp_all = torch.log_softmax(model.lm_head(h) / b["temp"][:, None], -1)  # [N, V]
    return logp_all.gather(1, b["tgt"][:, None]).squeeze(1), -(logp_all.exp() * logp_all).sum(-1)


@pytest.mark.parametrize("chunk", [1, 3, 7, 0])
def test_chunked_head_equals_one_pass(tiny, chunk):
    model = load(tiny)
    seqs, b = batch_of(model, random_episodes(model.config.vocab_size, n=5, turns=2, seed=3))
    assert b["tgt"].numel() > 7  # several chunks
    ref_logp, ref_ent = today_forward(model, b)
    (ref_logp.sum() + 0.3 * ref_ent.sum()).backward()
    g_ref = grads(model)
    model.zero_grad()
    logp, ent, _ = T05.forward(model, None, b, False, entropy=True, chunk=chunk)
    torch.testing.assert_close(logp, ref_logp, atol=1e-6, rtol=0)
    torch.testing.assert_close(ent, ref_ent, atol=1e-6, rtol=1e-6)  # ~5.7 nats: float32 ulp 5e-7
    (logp.sum() + 0.3 * ent.sum()).backward()  # through the checkpointed chunks
    scale = g_ref.abs().max().item()
    assert scale > 1 and (grads(model) - g_ref).abs().max() <= 1e-6 * scale  # float32 summation order, relative
    model.zero_grad()
    logp2, ent2, _ = T05.forward(model, None, b, False, chunk=chunk)  # no entropy term: none computed
    assert ent2 is None and torch.equal(logp2, logp)


def test_chunked_loss_equals_todays_formula(tiny):
    """The whole GRPO loss of a toy minibatch (clip, TIS, KL, entropy terms on) against the loss written out."""
    model = load(tiny)
    recs = random_episodes(model.config.vocab_size, n=6, turns=2, seed=4)
    seqs = T05.build_sequences(as_episodes(recs))
    prepare(model, seqs, [1.0, -1.0, 0.5, -0.5, 2.0, -2.0])
    with torch.no_grad():  # ratios away from 1 so that clipping acts
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    for s in seqs:
        s.tis_w = torch.rand(s.n) + 0.5
        s.ref_logp = s.old_logp - 0.1
    args = args_for("--kl-coef", "0.1", "--ent-coef", "0.01", "--micro-batch-size", "2")
    m = T05.accumulate(T05.Context(args, model, None, 0, "cpu", False, chunk=3), seqs)  # LM head in chunks of 3
    b = T05.token_batch(sorted(seqs, key=lambda s: len(s.ids)), 0, "cpu", T05.TOKEN_FIELDS)
    with torch.no_grad():
        logp, ent = today_forward(model, b)
        n_b = b["tgt"].numel()
        ratio = torch.exp(logp - b["old_logp"])
        surr = torch.min(ratio * b["adv"], ratio.clamp(0.8, 1.2) * b["adv"]) * b["tis_w"]
        d = b["ref_logp"] - logp
        loss = -surr.sum() / n_b + 0.1 * (torch.exp(d) - d - 1).sum() / n_b - 0.01 * ent.sum() / n_b
    assert m["loss"] == pytest.approx(loss.item(), abs=1e-6)
    assert m["entropy"] == pytest.approx(ent.mean().item(), abs=1e-6)
    assert T05.accumulate(T05.Context(args_for(), model, None, 0, "cpu", False), seqs)["entropy"] is None  # no term, not computed


def test_micro_batches_by_tokens():
    seqs = [T05.Sequence(ids=[0] * n, mask=[], ep=0, temp=1.0) for n in (3, 4, 4, 6, 9, 30)]
    parts = T05.micro_batches(seqs, tokens=12)
    assert [len(s.ids) for p in parts for s in p] == [3, 4, 4, 6, 9, 30]  # order kept, nothing lost
    assert all(len(p) * max(len(s.ids) for s in p) <= 12 for p in parts[:-1])
    assert [len(p) for p in parts] == [3, 1, 1, 1]  # 3 x 4 = 12; 6 + 9 would pad to 18; 30 runs alone
    assert [len(p) for p in T05.micro_batches(seqs, size=4)] == [4, 2]


def test_micro_batch_tokens_do_not_change_the_update(tiny, tmp_path, monkeypatch):
    """The --micro-batch-tokens variant of test_05_train's micro-batch invariance: gradients and parameters; with the
    LM head in chunks (chunk: completion tokens per chunk, 05's LOGIT_CHUNK) too."""
    recs = random_episodes(AutoTokenizer.from_pretrained(tiny).vocab_size, n=8, turns=2, seed=5)
    model = load(tiny)
    seqs = prepare(model, T05.build_sequences(as_episodes(recs)), T05.grpo_advantages(
        [r["reward"] for r in recs], [r["group_id"] for r in recs])[0])
    g = {}
    for flags, chunk in ((["--micro-batch-size", "64"], T05.LOGIT_CHUNK), (["--micro-batch-tokens", "1"], T05.LOGIT_CHUNK),
                         (["--micro-batch-tokens", "40"], T05.LOGIT_CHUNK), (["--micro-batch-tokens", "40"], 2)):
        model.zero_grad()
        T05.accumulate(T05.Context(args_for(*flags), model, None, 0, "cpu", False, chunk=chunk), seqs)
        g[f"{' '.join(flags)} chunk {chunk}"] = grads(model)
    for k, v in g.items():
        torch.testing.assert_close(v, g[f"--micro-batch-size 64 chunk {T05.LOGIT_CHUNK}"], atol=1e-7, rtol=1e-5, msg=k)
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    params = {}
    for flags, chunk in ((["--micro-batch-size", "64"], T05.LOGIT_CHUNK), (["--micro-batch-tokens", "30"], 4)):
        out = tmp_path / flags[1] / "policy"
        monkeypatch.setattr(T05, "LOGIT_CHUNK", chunk)
        T05.main(["--algo", "grpo", "--policy", str(tiny), "--rollouts", str(tmp_path / "r.jsonl"), "--out", str(out),
                  "--lr", "1e-3", "--ppo-epochs", "1", "--minibatches", "1", *flags])
        params[flags[1]] = torch.cat([p.flatten() for p in load(out).parameters()])
    assert (params["64"] - params["30"]).abs().max() < 1e-5


def test_old_policy_scores_sets_pi_old_tis_weights_and_pi_ref_by_hand(tiny):
    """pi_old of every trained sequence is log softmax(logits / T) of its generated tokens (here from the model's own
    forward, one sequence at a time, at a temperature that is not 1), the TIS weights min(pi_old / pi_rollout, C) (1
    where the rollout stored no log-prob) and, for a KL to the policy itself, pi_ref = pi_old."""
    recs = random_episodes(AutoTokenizer.from_pretrained(tiny).vocab_size, n=6, turns=2, seed=8)
    for i, r in enumerate(recs):
        r["temperature"] = 0.7
        for mt in r["model_turns"]:  # rollout log-probs that differ from the trainer's; none stored for e0
            mt["logprobs"] = None if i == 0 else [-2.0 - 0.1 * j for j in range(len(mt["completion_ids"]))]
    model = load(tiny)
    u = T05.Context(args_for("--kl-coef", "0.05", "--micro-batch-size", "2"), model, None, 0, "cpu", False,
                    tis_cap=2.0, same_ref=True)
    seqs = T05.build_sequences(as_episodes(recs))
    T05.old_policy_scores(u, [{"sampler": None}], seqs, None, {})
    for s in seqs:
        ids, mask = torch.tensor(s.ids), torch.tensor(s.mask)
        with torch.no_grad():
            logits = model(ids[None]).logits[0, :-1].float() / 0.7  # position t predicts token t + 1
        want = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), ids[1:]][mask[1:] == 1]
        torch.testing.assert_close(s.old_logp, want, atol=1e-5, rtol=0)
        w = torch.exp(want - s.stored_logp).clamp(max=2.0)
        torch.testing.assert_close(s.tis_w, torch.where(torch.isnan(w), torch.ones_like(w), w), atol=1e-5, rtol=0)
        assert torch.equal(s.ref_logp, s.old_logp)
    assert any((s.tis_w - 1).abs().max() > 0.1 for s in seqs)  # the weights matter here
    assert all(torch.equal(s.tis_w, torch.ones(s.n)) for s in seqs if s.ep == 0)  # none stored: w = 1


@pytest.mark.parametrize("kl", [False, True, "other-ref"])
def test_pi_old_is_the_policy_before_its_first_step(tiny, tmp_path, kl):
    """pi_old is scored once, before the first step, for every trained sequence: at the first minibatch rho = 1 on
    every token (approx_kl 0, nothing clipped) and a KL to the policy itself is 0; after a step neither holds.
    other-ref: a KL to another policy than the one trained is not 0 at the first step."""
    recs = random_episodes(AutoTokenizer.from_pretrained(tiny).vocab_size, n=8, turns=2, seed=9)
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    flags = ["--kl-coef", "0.05"] if kl else []
    if kl == "other-ref":
        ref = load(tiny)
        with torch.no_grad():
            for p in ref.parameters():
                p.add_(0.05 * torch.randn_like(p))
        ref.save_pretrained(tmp_path / "ref")
        flags += ["--ref-policy", str(tmp_path / "ref")]
    out = tmp_path / "policy"
    T05.main(["--algo", "grpo", "--policy", str(tiny), "--rollouts", str(tmp_path / "r.jsonl"), "--out", str(out),
              "--lr", "1e-3", "--seed", "1", *flags])
    log = [json.loads(x) for x in (tmp_path / "train_log.jsonl").read_text().splitlines()]
    assert len(log) == 4 and all(r["optimizer_step"] for r in log)  # 2 epochs x 2 minibatches
    assert abs(log[0]["approx_kl"]) < 1e-6 and log[0]["clip_frac"] == 0
    assert max(abs(r["approx_kl"]) for r in log[1:]) > 1e-5  # after a step pi_theta != pi_old
    assert (log[0]["kl"] > 1e-4) == (kl == "other-ref")  # KL to this same policy: 0 at the first step
    if kl is True:
        assert max(r["kl"] for r in log[1:]) > 0


def test_amp_bf16_runs_the_trunk_in_bf16_on_the_cpu(tiny, tmp_path):
    """--amp bf16 (the small preset's 05): bf16 autocast of the trunk on the CPU too, recorded in the config; the
    update moves the same way as fp32's (cosine of the parameter changes) but not bit for bit (so it did run).
    --amp auto stays fp32 on the CPU."""
    recs = random_episodes(AutoTokenizer.from_pretrained(tiny).vocab_size, n=8, turns=2, seed=7)
    (tmp_path / "r.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    start = torch.cat([p.flatten() for p in load(tiny).parameters()])
    delta, cfg = {}, {}
    for amp in ("auto", "off", "bf16"):
        out = tmp_path / amp / "policy"
        T05.main(["--algo", "grpo", "--policy", str(tiny), "--rollouts", str(tmp_path / "r.jsonl"), "--out", str(out),
                  "--lr", "1e-3", "--ppo-epochs", "1", "--minibatches", "1", "--amp", amp])
        delta[amp] = torch.cat([p.flatten() for p in load(out).parameters()]) - start
        cfg[amp] = json.loads((out.parent / "05_train_config.json").read_text())
    assert [cfg[a]["bf16_autocast"] for a in ("auto", "off", "bf16")] == [False, False, True]
    assert torch.equal(delta["auto"], delta["off"]) and not torch.equal(delta["bf16"], delta["off"])
    assert torch.nn.functional.cosine_similarity(delta["bf16"], delta["off"], dim=0) > 0.9
