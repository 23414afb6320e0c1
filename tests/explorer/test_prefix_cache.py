"""Prefix reuse across turns: the same tokens and logprobs as re-prefilling the whole history.

The oracle of every engine test here is the same engine with the prefix cache off
(``prefix_cache_tokens=0``: every prompt prefilled whole, the path test_engine.py checks
against full recompute), plus ``transformers`` ``generate`` and a full forward for greedy.
An episode is multi-turn the way environments make it: turn k's prompt is turn k-1's
prompt + the sampled response + observation tokens, token for token.

The tiny model runs in float64 here so that the 1e-5 logprob tolerance tests the cache,
not float32 rounding: in float32 the cache-less engine itself differs from a full forward
by up to 1.7e-5 on this model (keys computed one token at a time in decode vs all at once
in a prefill round differently), and reused keys come from decode steps. One float32 test
checks the real-world claim at test_engine.py's 1e-4 (the sampler's logprobs are float32
in both cases, so 1e-5 here is a few units in their last place).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trinity_like.explorer.engine import EngineParams, NativeEngine, SamplingParams
from trinity_like.explorer.prefix_cache import BLOCK, PrefixCache
from trinity_like.models.tiny import build_tiny_model

OPENINGS = [
    "<|im_start|>user\nWhat is 23 + 5? Use the calculator.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nHello world! Compute 7 times 8 please.<|im_end|>\n<|im_start|>assistant\n",
    "<|im_start|>user\nThe capital of France is Paris.<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.fixture(scope="module")
def tiny():
    model, tok = build_tiny_model(seed=0)
    return model.double(), tok


def observation(tok, episode: int, turn: int) -> list[int]:
    """A tool result rendered as a user turn that reopens the assistant's."""
    return tok.encode(
        f"<|im_end|>\n<|im_start|>user\nresult: {17 * episode + turn} plus {turn}<|im_end|>\n<|im_start|>assistant\n"
    )


def play(engine, tok, sampling, turns=3, openings=OPENINGS):
    """Run every episode for ``turns`` turns in one batch per turn; returns [turn][episode] -> (prompt, samples)."""
    histories = [tok.encode(t) for t in openings]
    out = []
    for turn in range(turns):
        groups = engine.generate(histories, sampling)
        out.append(list(zip([list(h) for h in histories], groups)))
        # The next prompt extends this one by the first sample's response and an observation.
        histories = [h + g[0].token_ids + observation(tok, e, turn) for e, (h, g) in enumerate(zip(histories, groups))]
    return out


def assert_same(a, b, atol=1e-5):
    for turn_a, turn_b in zip(a, b, strict=True):
        for (pa, ga), (pb, gb) in zip(turn_a, turn_b, strict=True):
            assert pa == pb
            for sa, sb in zip(ga, gb, strict=True):
                assert (sa.token_ids, sa.finish_reason) == (sb.token_ids, sb.finish_reason)
                np.testing.assert_allclose(sa.logprobs, sb.logprobs, atol=atol, rtol=0)


def prefill_widths(model):
    """Collect (rows, tokens) of every multi-token forward (prefills) while the hook is on."""
    shapes: list[tuple[int, int]] = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, args, out: shapes.append(tuple(args[0].shape)))
    return shapes, hook


def test_greedy_three_turns_equal_full_reprefill_generate_and_full_forward(tiny):
    model, tok = tiny
    sp = SamplingParams(greedy=True, max_new_tokens=8, stop_token_ids=())
    cold = play(NativeEngine(model, tok, EngineParams(prefix_cache_tokens=0)), tok, sp)
    engine = NativeEngine(model, tok)
    shapes, hook = prefill_widths(model)
    try:
        warm = play(engine, tok, sp)
    finally:
        hook.remove()
    assert_same(warm, cold)
    # Turns 2 and 3 ran only their new tokens: the last response token + the observation.
    prefills = [t for _, t in shapes if t > 1]
    full = [max(len(p) for p, _ in turn) for turn in warm]
    assert prefills[0] == full[0]
    assert all(w < f - 8 for w, f in zip(prefills[1:], full[1:])), (prefills, full)
    assert engine.prefix_cache.stats["hits"] == 2 * len(OPENINGS)
    for turn in warm:
        for prompt, (sample,) in turn:
            ids = torch.tensor([prompt])
            out = model.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                do_sample=False,
                max_new_tokens=8,
                eos_token_id=None,
                pad_token_id=tok.pad_token_id,
            )
            assert sample.token_ids == out[0, len(prompt) :].tolist()
            with torch.no_grad():
                logits = model(torch.tensor([prompt + sample.token_ids])).logits[0, len(prompt) - 1 : -1].double()
            want = torch.log_softmax(logits, -1).gather(1, torch.tensor(sample.token_ids)[:, None])[:, 0]
            np.testing.assert_allclose(sample.logprobs, want.numpy(), atol=1e-5, rtol=0)


def test_sampled_episodes_with_the_same_seeds_equal_full_reprefill(tiny):
    model, tok = tiny
    sp = SamplingParams(n=2, max_new_tokens=10, temperature=0.9, top_p=0.95, seed=3, stop_token_ids=(300, 301))
    cold = play(NativeEngine(model, tok, EngineParams(prefix_cache_tokens=0)), tok, sp)
    engine = NativeEngine(model, tok)
    assert_same(play(engine, tok, sp), cold)
    assert engine.prefix_cache.stats["reused_tokens"] > 0


def test_float32_sampled_episodes_equal_full_reprefill():
    model, tok = build_tiny_model(seed=0)
    sp = SamplingParams(n=2, max_new_tokens=10, seed=7, stop_token_ids=(300, 301))
    cold = play(NativeEngine(model, tok, EngineParams(prefix_cache_tokens=0)), tok, sp)
    assert_same(play(NativeEngine(model, tok), tok, sp), cold, atol=1e-4)


def test_a_group_whose_prompt_extends_a_kept_sequence(tiny):
    model, tok = tiny
    first = SamplingParams(greedy=True, max_new_tokens=6, stop_token_ids=())
    group = SamplingParams(n=4, max_new_tokens=8, seed=11)
    results = []
    for budget in (0, 4096):
        engine = NativeEngine(model, tok, EngineParams(prefix_cache_tokens=budget, max_batch_size=3))
        prompt = tok.encode(OPENINGS[0])
        ((turn1,),) = engine.generate([prompt], first)
        history = prompt + turn1.token_ids + observation(tok, 0, 0)
        results.append(engine.generate([history], group))
        if budget:
            # The first turn's kept tokens: the prompt and every response token but the last.
            assert engine.prefix_cache.stats["reused_tokens"] == len(prompt) + len(turn1.token_ids) - 1
    (cold,), (warm,) = results
    assert len({tuple(s.token_ids) for s in warm}) > 1, "samples of the group must differ"
    for a, b in zip(warm, cold, strict=True):
        assert a.token_ids == b.token_ids
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5, rtol=0)


def test_partial_matches_reuse_only_the_shared_prefix(tiny):
    model, tok = tiny
    sp = SamplingParams(greedy=True, max_new_tokens=6, stop_token_ids=())
    engine = NativeEngine(model, tok)
    cold = NativeEngine(model, tok, EngineParams(prefix_cache_tokens=0))
    base = tok.encode(OPENINGS[1])
    ((kept,),) = engine.generate([base], sp)
    shared = BLOCK + 5  # not on a block boundary: the match extends past the last hashed block
    assert shared < len(base)
    cases = [
        base[:shared] + tok.encode(" seven eight nine ten"),  # diverges inside the prompt
        base + kept.token_ids[:2] + tok.encode(" twenty"),  # diverges inside the kept response
        base[: BLOCK - 1] + tok.encode(" one two three four five six"),  # shares less than a block
    ]
    for prompt, want in zip(cases, (shared, len(base) + 2, 0)):
        before = engine.prefix_cache.stats["reused_tokens"]
        ((got,),) = engine.generate([prompt], sp)
        assert engine.prefix_cache.stats["reused_tokens"] - before == want
        ((ref,),) = cold.generate([prompt], sp)
        assert got.token_ids == ref.token_ids
        np.testing.assert_allclose(got.logprobs, ref.logprobs, atol=1e-5, rtol=0)


def test_eviction_under_a_small_budget_stays_correct(tiny):
    model, tok = tiny
    sp = SamplingParams(n=2, max_new_tokens=8, seed=5, stop_token_ids=())
    cold = play(NativeEngine(model, tok, EngineParams(prefix_cache_tokens=0)), tok, sp)
    longest = max(len(p) for turn in cold for p, _ in turn) + 8
    engine = NativeEngine(model, tok, EngineParams(prefix_cache_tokens=longest + 10))  # about one sequence
    assert_same(play(engine, tok, sp), cold)
    store = engine.prefix_cache
    assert store.tokens <= store.budget and len(store.entries) <= 2
    assert 0 < store.stats["hits"] < store.stats["lookups"]


def test_update_weights_clears_the_kept_keys(tiny):
    _, tok = tiny
    mine, other = build_tiny_model(seed=0)[0].double(), build_tiny_model(seed=1)[0].double()
    sp = SamplingParams(greedy=True, max_new_tokens=8, stop_token_ids=())
    engine = NativeEngine(mine, tok)
    prompt = tok.encode(OPENINGS[2])
    ((turn1,),) = engine.generate([prompt], sp)
    assert engine.prefix_cache.tokens > 0
    engine.update_weights(other.state_dict())
    assert engine.prefix_cache.tokens == 0 and not engine.prefix_cache.index
    history = prompt + turn1.token_ids + observation(tok, 0, 0)
    ((turn2,),) = engine.generate([history], sp)
    ((want,),) = NativeEngine(other, tok, EngineParams(prefix_cache_tokens=0)).generate([history], sp)
    assert turn2.token_ids == want.token_ids
    np.testing.assert_allclose(turn2.logprobs, want.logprobs, atol=1e-5, rtol=0)


def kv(n):
    return torch.full((1, 2, 1, n, 1), float(n))


def test_store_lookup_is_exact_lru_and_replaces_what_a_sequence_extends():
    store = PrefixCache(budget=100)
    a = list(range(40))
    store.insert(a, lambda: kv(40))
    entry, m = store.lookup(a + [7, 8])
    assert entry is not None and m == 40
    assert store.lookup(a)[1] == 39  # the prompt's last token always runs
    assert store.lookup(a[:20] + [999] * 10)[1] == 20
    assert store.lookup([999] + a)[1] == 0
    # A sequence that extends the matched one in full replaces it.
    b = a + [1, 2, 3, 4, 5]
    store.insert(b, lambda: kv(45), source=entry)
    assert [len(e.tokens) for e in store.entries.values()] == [45]
    # One already contained in a kept sequence is not kept twice (read_kv is not called).
    store.insert(a[:30], lambda: pytest.fail("read a contained sequence"))
    # Least recently used goes first: c and d fill the budget, then a hit on c saves it.
    c, d = [5] * 30, [6] * 20
    store.insert(c, lambda: kv(30))
    store.insert(d, lambda: kv(20))
    assert store.tokens == 95
    store.lookup(c + [1])
    store.insert([7] * 30, lambda: kv(30))
    assert sorted(len(e.tokens) for e in store.entries.values()) == [20, 30, 30]
    assert store.lookup(b + [0])[1] == 0 and store.lookup(c + [1])[1] == 30
    assert store.tokens == 80 and store.tokens <= store.budget
    store.insert(list(range(101)), lambda: pytest.fail("longer than the whole budget"))
    store.clear()
    assert store.tokens == 0 and store.lookup(c + [1]) == (None, 0)
