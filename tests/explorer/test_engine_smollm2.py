"""The engine on the real SmolLM2-135M-Instruct: greedy equals `generate` (slow: real model)."""

from __future__ import annotations

import pytest
import torch

from trinity_like.explorer import NativeEngine, SamplingParams
from trinity_like.models import load_model, render_prompt

pytestmark = pytest.mark.slow


def test_greedy_equals_generate_on_smollm2():
    model, tok = load_model("smollm2-135m-instruct")
    questions = ["What is 47 + 8?", "Name the capital of France.", "Count to five."]
    prompts = [render_prompt(tok, [{"role": "user", "content": q}]) for q in questions]
    groups = NativeEngine(model, tok).generate(prompts, SamplingParams(greedy=True, max_new_tokens=12))
    for prompt, (sample,) in zip(prompts, groups):
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12)
        assert sample.token_ids == out[0, len(prompt) :].tolist()
