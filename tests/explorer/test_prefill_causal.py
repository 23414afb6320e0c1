"""Fresh prompts are prefilled right-padded with no mask (SDPA's causal fused kernels), ragged or not;
their first tokens and logprobs are those of a full forward over each prompt alone."""

from __future__ import annotations

import torch

from trinity_like.explorer import kv_cache
from trinity_like.explorer.engine import EngineParams, NativeEngine, SamplingParams
from trinity_like.models.tiny import build_tiny_model


def test_ragged_fresh_prompts_prefill_without_a_mask_and_match_each_prompt_alone(monkeypatch):
    model, tok = build_tiny_model(seed=0)
    prompts = [tok.encode(t) for t in ("What is 23 + 5?", "Hi", "The capital of France is Paris and", "7 * 8 =")]
    assert len({len(p) for p in prompts}) == len(prompts)  # ragged
    seen = []
    real = kv_cache.slot_attention

    def spy(module, query, key, value, attention_mask, scaling, **kw):
        if query.shape[2] > 1:
            seen.append(attention_mask is None)
        return real(module, query, key, value, attention_mask, scaling, **kw)

    monkeypatch.setattr(kv_cache, "slot_attention", spy)
    sp = SamplingParams(n=1, max_new_tokens=1, greedy=True, stop_token_ids=())
    got = NativeEngine(model, tok, EngineParams(prefill_batch_size=4)).generate(prompts, sp)
    # one prefill forward for the four prompts (an attention call per layer), without a mask
    assert seen == [True] * model.config.num_hidden_layers
    with torch.no_grad():
        for prompt, (sample,) in zip(prompts, got):
            logits_V = model(torch.tensor([prompt])).logits[0, -1].double()
            assert sample.token_ids == [int(logits_V.argmax())]
            expected = float(torch.log_softmax(logits_V, -1)[sample.token_ids[0]])
            assert abs(sample.logprobs[0] - expected) < 1e-4
