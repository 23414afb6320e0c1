"""The rollout engine against independent oracles: full recompute, `generate`, HF warpers."""

from __future__ import annotations

import pytest
import torch
from transformers import TopKLogitsWarper, TopPLogitsWarper

from trinity_like.errors import TrinityError
from trinity_like.explorer.engine import Borrowed, EngineParams, NativeEngine, Request, SamplingParams
from trinity_like.models.tiny import build_tiny_model

TEXTS = [
    "What is 23 + 5?",
    "Hello",
    "The capital of France is Paris and the answer is",
    "7 * 8 =",
    "add",
]


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny_model(seed=0)
    return model, tok


@pytest.fixture(scope="module")
def prompts(tiny):
    _, tok = tiny
    return [tok.encode(t) for t in TEXTS]


def naive_greedy(model, prompt, max_new, stop_ids):
    """Greedy decoding by a full forward over the whole sequence at every step (no cache)."""
    ids = list(prompt)
    out = []
    with torch.no_grad():
        for _ in range(max_new):
            token = int(model(torch.tensor([ids])).logits[0, -1].argmax())
            ids.append(token)
            out.append(token)
            if token in stop_ids:
                break
    return out


def full_logprobs(model, prompt, response):
    """log_softmax of a full forward pass at the positions that predict each response token."""
    with torch.no_grad():
        logits = model(torch.tensor([list(prompt) + list(response)])).logits[0].double()
    return logits[len(prompt) - 1 : -1], torch.tensor(response)


def test_greedy_matches_full_recompute_with_ragged_prompts_and_stops(tiny, prompts):
    model, tok = tiny
    # Pick stop tokens that occur mid-way in some greedy continuations, so some rows stop
    # early and others run to the length cap: a ragged batch in both directions.
    free = [naive_greedy(model, p, 16, set()) for p in prompts]
    stop_ids = {free[0][5], free[2][2]}
    expected = [naive_greedy(model, p, 16, stop_ids) for p in prompts]
    assert len({len(e) for e in expected}) > 1
    engine = NativeEngine(model, tok, EngineParams(max_batch_size=3, prefill_batch_size=2))
    groups = engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=16, stop_token_ids=tuple(stop_ids)))
    for group, want in zip(groups, expected):
        (sample,) = group
        assert sample.token_ids == want
        assert sample.finish_reason == ("stop" if want[-1] in stop_ids else "length")


def test_greedy_matches_transformers_generate(tiny, prompts):
    model, tok = tiny
    stop = [tok.eos_token_id, naive_greedy(model, prompts[1], 12, set())[4]]
    engine = NativeEngine(model, tok)
    groups = engine.generate(prompts, SamplingParams(greedy=True, max_new_tokens=12, stop_token_ids=tuple(stop)))
    for prompt, (sample,) in zip(prompts, groups):
        ids = torch.tensor([prompt])
        out = model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            do_sample=False,
            max_new_tokens=12,
            eos_token_id=stop,
            pad_token_id=tok.pad_token_id,
        )
        assert sample.token_ids == out[0, len(prompt) :].tolist()


def test_greedy_logprobs_are_the_model_logprobs(tiny, prompts):
    model, tok = tiny
    (sample,), *_ = NativeEngine(model, tok).generate(prompts[:1], SamplingParams(greedy=True, max_new_tokens=10))
    logits, response = full_logprobs(model, prompts[0], sample.token_ids)
    want = torch.log_softmax(logits, -1).gather(1, response[:, None]).squeeze(1)
    torch.testing.assert_close(torch.tensor(sample.logprobs, dtype=torch.double), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    "temperature,top_k,top_p", [(1.0, 0, 1.0), (0.7, 0, 1.0), (1.3, 20, 1.0), (1.0, 0, 0.8), (0.9, 30, 0.9)]
)
def test_sampled_logprobs_match_full_forward_under_the_sampling_distribution(tiny, prompts, temperature, top_k, top_p):
    model, tok = tiny
    sp = SamplingParams(n=3, max_new_tokens=12, temperature=temperature, top_k=top_k, top_p=top_p, seed=5)
    groups = NativeEngine(model, tok).generate(prompts, sp)
    for prompt, group in zip(prompts, groups):
        for sample in group:
            logits, response = full_logprobs(model, prompt, sample.token_ids)
            # transformers' own warpers, in generate's order: temperature, top-k, top-p.
            scores = logits / temperature
            if top_k:
                scores = TopKLogitsWarper(top_k)(None, scores)
            if top_p < 1.0:
                scores = TopPLogitsWarper(top_p)(None, scores)
            want = torch.log_softmax(scores, -1).gather(1, response[:, None]).squeeze(1)
            assert torch.isfinite(want).all(), "a token outside the truncated support was sampled"
            torch.testing.assert_close(torch.tensor(sample.logprobs, dtype=torch.double), want, atol=1e-4, rtol=0)


def test_group_sampling_equals_each_sample_alone(tiny, prompts):
    model, tok = tiny
    engine = NativeEngine(model, tok)
    sp = SamplingParams(max_new_tokens=10, seed=0)
    seeds = (11, 22, 33, 44)
    together = engine.run([Request(tuple(prompts[0]), seeds), Request(tuple(prompts[2]), (5, 6))], sp)
    for group, prompt in ((together[0], prompts[0]), (together[1], prompts[2])):
        for sample in group:
            seed = (seeds if prompt is prompts[0] else (5, 6))[sample.sample_index]
            ((alone,),) = engine.run([Request(tuple(prompt), (seed,))], sp)
            assert alone.token_ids == sample.token_ids
            torch.testing.assert_close(alone.logprobs, sample.logprobs, atol=1e-4, rtol=0)


def test_continuous_batching_does_not_change_results(tiny, prompts):
    model, tok = tiny
    sp = SamplingParams(n=2, max_new_tokens=10, seed=2, stop_token_ids=(prompts[0][1], 300, 301, 302))
    wide = NativeEngine(model, tok, EngineParams(max_batch_size=64)).generate(prompts, sp)
    narrow = NativeEngine(model, tok, EngineParams(max_batch_size=2, prefill_batch_size=1)).generate(prompts, sp)
    lengths = {len(s.token_ids) for g in wide for s in g}
    assert len(lengths) > 1, "the test needs samples of different lengths"
    for gw, gn in zip(wide, narrow):
        for a, b in zip(gw, gn):
            assert (a.prompt_index, a.sample_index, a.token_ids, a.finish_reason) == (
                b.prompt_index,
                b.sample_index,
                b.token_ids,
                b.finish_reason,
            )
            torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=0)


def test_seed_determinism(tiny, prompts):
    model, tok = tiny
    engine = NativeEngine(model, tok)
    a = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8, seed=1))
    b = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8, seed=1))
    c = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=8, seed=2))
    tokens = lambda groups: [s.token_ids for g in groups for s in g]  # noqa: E731
    assert tokens(a) == tokens(b) != tokens(c)
    assert tokens(a)[0] != tokens(a)[1], "samples of one group must differ"


def test_stop_strings_and_max_tokens(tiny, prompts):
    model, tok = tiny
    engine = NativeEngine(model, tok)
    free = engine.generate(prompts[:2], SamplingParams(greedy=True, max_new_tokens=20, stop_token_ids=()))
    text = tok.decode(free[0][0].token_ids)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    (sample,), (other,) = engine.generate(
        prompts[:2], SamplingParams(greedy=True, max_new_tokens=20, stop_token_ids=(), stop_strings=(stop,))
    )
    assert sample.finish_reason == "stop"
    assert stop in tok.decode(sample.token_ids)
    assert stop not in tok.decode(sample.token_ids[:-1])
    assert sample.token_ids == free[0][0].token_ids[: len(sample.token_ids)]
    for s in (other, *free[1]):
        if s.finish_reason == "length":
            assert len(s.token_ids) == 20
    for max_new in (1, 3):
        groups = engine.generate(prompts, SamplingParams(n=2, max_new_tokens=max_new, stop_token_ids=()))
        assert all(len(s.token_ids) == max_new and s.finish_reason == "length" for g in groups for s in g)


def test_update_weights_bumps_version_and_changes_outputs(tiny, prompts):
    model, tok = tiny
    other, _ = build_tiny_model(seed=1)
    mine, _ = build_tiny_model(seed=0)
    engine = NativeEngine(mine, tok)
    sp = SamplingParams(greedy=True, max_new_tokens=8, stop_token_ids=())
    before = engine.generate(prompts[:1], sp)[0][0]
    assert before.model_version == 0
    assert engine.update_weights(other.state_dict()) == 1
    after = engine.generate(prompts[:1], sp)[0][0]
    assert after.model_version == 1
    assert after.token_ids == naive_greedy(other, prompts[0], 8, set())
    assert engine.update_weights(other.state_dict(), version=7) == 7
    with pytest.raises(TrinityError, match="unexpected"):
        engine.update_weights({**other.state_dict(), "nope": torch.zeros(1)})
    partial = {k: v for k, v in other.state_dict().items() if k != "model.norm.weight"}
    with pytest.raises(TrinityError, match="model.norm.weight"):
        engine.update_weights(partial)


def test_update_weights_without_the_tied_output_embedding(tiny, prompts):
    """The trainer may leave out lm_head.weight when it is the input embedding: it follows."""
    _, tok = tiny
    other, _ = build_tiny_model(seed=1)
    assert other.config.tie_word_embeddings
    engine = NativeEngine(build_tiny_model(seed=0)[0], tok)
    engine.update_weights({k: v.clone() for k, v in other.state_dict().items() if k != "lm_head.weight"})
    sp = SamplingParams(greedy=True, max_new_tokens=8, stop_token_ids=())
    assert engine.generate(prompts[:1], sp)[0][0].token_ids == naive_greedy(other, prompts[0], 8, set())


def test_shared_weights_are_sampled_in_place_and_never_written(tiny, prompts, tmp_path):
    """``Borrowed`` weights are sampled from the caller's tensors (a mailbox file here), no copy; a
    later plain update takes a copy of its own and leaves the caller's memory alone."""
    from trinity_like.trainer.shared_weights import WeightMailbox

    _, tok = tiny
    other, third = build_tiny_model(seed=1)[0], build_tiny_model(seed=2)[0]
    box = WeightMailbox(tmp_path)
    handle = box.write({k: v for k, v in other.state_dict().items() if k != "lm_head.weight"})
    engine = NativeEngine(build_tiny_model(seed=0)[0], tok)
    views = handle.tensors()
    engine.update_weights(Borrowed(views), version=1)
    model = engine.model
    assert model.model.embed_tokens.weight.data_ptr() == views["model.embed_tokens.weight"].data_ptr()
    assert model.lm_head.weight is model.model.embed_tokens.weight  # still tied
    assert all(p.data_ptr() == views[n].data_ptr() for n, p in model.named_parameters())
    sp = SamplingParams(greedy=True, max_new_tokens=8, stop_token_ids=())
    assert engine.generate(prompts[:1], sp)[0][0].token_ids == naive_greedy(other, prompts[0], 8, set())

    file_before = {k: v.clone() for k, v in views.items()}
    engine.update_weights(third.state_dict(), version=2)  # a copy: into memory of the engine's own
    assert all(torch.equal(views[k], v) for k, v in file_before.items())
    assert all(p.data_ptr() != views[n].data_ptr() for n, p in model.named_parameters())
    assert engine.generate(prompts[:1], sp)[0][0].token_ids == naive_greedy(third, prompts[0], 8, set())
    box.close()


def test_bad_params_are_errors():
    with pytest.raises(TrinityError):
        SamplingParams(temperature=0.0)
    with pytest.raises(TrinityError):
        SamplingParams(top_p=0.0)
    with pytest.raises(TrinityError):
        SamplingParams(n=0)


def test_finished_rows_leave_the_batch_and_waiting_ones_take_their_place(tiny, prompts):
    model, tok = tiny
    rows = []  # batch size of every forward: prefill chunks and decode steps
    hook = model.model.embed_tokens.register_forward_hook(lambda m, args, out: rows.append(tuple(args[0].shape)))
    try:
        sp = SamplingParams(n=3, max_new_tokens=12, seed=4, stop_token_ids=(300, 301, 302, 303, 304, 305))
        groups = NativeEngine(model, tok, EngineParams(max_batch_size=4, prefill_batch_size=8)).generate(prompts, sp)
    finally:
        hook.remove()
    samples = [s for g in groups for s in g]
    assert len({len(s.token_ids) for s in samples}) > 1
    decode = [b for b, t in rows if t == 1]
    prefill = [(b, t) for b, t in rows if t > 1]
    assert prefill == [(len(prompts), max(len(p) for p in prompts))]  # every prompt prefilled once
    # Each sample's first token comes from the prefill; every later token costs exactly one
    # decode row: no row is ever computed for a finished sequence.
    assert sum(decode) == sum(len(s.token_ids) - 1 for s in samples)
    assert max(decode) == 4
    # While samples wait, the batch stays full: the steps below 4 rows are the final drain.
    first_partial = next(i for i, b in enumerate(decode) if b < 4)
    assert all(b < 4 for b in decode[first_partial:])
    assert decode[first_partial:] == sorted(decode[first_partial:], reverse=True)
