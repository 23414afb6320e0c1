"""The near-tie-aware token parity of ``token_parity.py`` on the CPU: fp32 samples of our engine
against the float64 oracle stand in for CUDA's (what tests/explorer/test_engine_cuda.py checks on a
GPU). A correct fp32 engine passes; a sample drawn with other uniforms, or a greedy sample that
takes a clearly worse token, does not."""

from __future__ import annotations

import copy

import pytest
import torch
from _lib.token_parity import check_sample, fp32_logit_error

from trinity_like.explorer.engine import NativeEngine, SamplingParams
from trinity_like.explorer.engine_contract import sample_seed
from trinity_like.models.tiny import build_tiny_model

TEXTS = ["What is 23 + 5?", "Hello", "The capital of France is Paris and the answer is", "7 * 8 =", "add"]
STOPS = (300, 301, 302, 303, 304, 305, 306, 307)


@pytest.fixture(scope="module")
def models():
    model, tok = build_tiny_model(seed=0)
    return model, copy.deepcopy(model).double(), tok


def samples(model, tok, greedy: bool, seed: int = 11):
    prompts = [tok.encode(t) for t in TEXTS]
    sp = SamplingParams(n=3, max_new_tokens=24, seed=seed, greedy=greedy, stop_token_ids=STOPS)
    groups = NativeEngine(copy.deepcopy(model), tok).generate(prompts, sp)
    return prompts, [(p, s) for p, group in enumerate(groups) for s in group]


@pytest.mark.parametrize("greedy", [True, False])
def test_fp32_samples_agree_with_the_float64_oracle(models, greedy):
    model, model64, tok = models
    prompts, got = samples(model, tok, greedy)
    error = fp32_logit_error(model, model64, [prompts[p] for p, _ in got], [s.token_ids for _, s in got])
    assert 0 < error < 1e-3  # measured: fp32 is not fp64, and not far from it
    checked = 0
    for p, s in got:
        seed = sample_seed(11, p, s.sample_index)
        verdict = check_sample(s.token_ids, prompts[p], model64, greedy=greedy, seed=seed, temperature=1.0, error=error)
        assert verdict.mismatch is None, (p, s.sample_index, verdict)
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(verdict.logprobs), atol=1e-4, rtol=0)
        checked += verdict.positions
    assert checked > 100


def test_a_sample_of_other_uniforms_is_caught(models):
    model, model64, tok = models
    prompts, got = samples(model, tok, greedy=False, seed=12)  # drawn with seed 12, checked as seed 11's
    error = fp32_logit_error(model, model64, [prompts[p] for p, _ in got], [s.token_ids for _, s in got])
    caught = [
        check_sample(
            s.token_ids,
            prompts[p],
            model64,
            greedy=False,
            seed=sample_seed(11, p, s.sample_index),
            temperature=1.0,
            error=error,
        ).mismatch
        for p, s in got
    ]
    assert all(caught), caught


def test_a_greedy_token_that_trails_the_argmax_is_caught(models):
    model, model64, tok = models
    prompts, got = samples(model, tok, greedy=True)
    p, s = got[0]
    logits = model64(input_ids=torch.tensor([prompts[p]])).logits[0, -1]
    runner_up = int(logits.topk(2).indices[1])
    wrong = [runner_up, *s.token_ids[1:]]
    verdict = check_sample(wrong, prompts[p], model64, greedy=True, seed=None, temperature=1.0, error=1e-6)
    assert verdict.mismatch is not None and verdict.mismatch.startswith("position 0")
