"""The native engine on a CUDA device: the float64 oracle's samples up to fp32 near-ties, captured
steps, bf16 by default, memory handed back (skipped without a GPU; run by benchmarks/gpu_check.py
on a GPU machine).

Token parity is judged by ``token_parity.check_sample``: every token against the float64 model on
the CPU, a divergence accepted only at a near-tie measured from this device's own fp32 logit error
(fp32 on two devices may take either side of a tie: identical tokens is not what a correct engine
promises). tests/explorer/test_token_parity.py checks the same judgement on the CPU.
"""

from __future__ import annotations

import copy

import pytest
import torch
from _lib.token_parity import check_sample, fp32_logit_error

from trinity_like.explorer.engine import EngineParams, NativeEngine, SamplingParams
from trinity_like.explorer.engine_contract import sample_seed
from trinity_like.explorer.engines import build_rollout_engine
from trinity_like.models.tiny import build_tiny_model

pytestmark = pytest.mark.gpu

TEXTS = ["What is 23 + 5?", "Hello", "The capital of France is Paris and the answer is", "7 * 8 =", "add"]
STOPS = (300, 301, 302, 303, 304, 305, 306, 307)


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model(seed=0)


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny[1].encode(t) for t in TEXTS]


def flat(groups):
    return [(s.prompt_index, s.sample_index, s.token_ids, s.finish_reason) for g in groups for s in g]


def on(device: str, tiny, params: EngineParams | None = None) -> NativeEngine:
    model, tok = tiny
    return NativeEngine(copy.deepcopy(model).to(device), tok, params or EngineParams())


@pytest.fixture(scope="module")
def model64(tiny):
    return copy.deepcopy(tiny[0]).double()


def assert_oracle_samples(groups, prompts, model64, model32, sp: SamplingParams) -> None:
    """Every sample of ``groups`` is the float64 oracle's, up to near-ties measured on ``model32``'s device."""
    got = [(p, s) for p, group in enumerate(groups) for s in group]
    tokens = [s.token_ids for _, s in got]
    error = fp32_logit_error(model32, model64, [prompts[p] for p, _ in got], tokens)
    for p, s in got:
        seed = None if sp.greedy else sample_seed(sp.seed, p, s.sample_index)
        verdict = check_sample(
            s.token_ids, prompts[p], model64, greedy=sp.greedy, seed=seed, temperature=sp.temperature, error=error
        )
        assert verdict.mismatch is None, (p, s.sample_index, verdict)
        torch.testing.assert_close(torch.tensor(s.logprobs), torch.tensor(verdict.logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize("greedy", [True, False])
def test_cuda_samples_are_the_float64_oracles_for_the_same_seeds(tiny, prompts, model64, greedy):
    """float32 on CUDA: the oracle's tokens (counter-based draws: a seed's stream is the device's too),
    a near-tie aside; the same samples, in the same order, as the CPU gives."""
    sp = SamplingParams(n=3, max_new_tokens=24, seed=11, greedy=greedy, stop_token_ids=STOPS)
    engine = on("cuda", tiny)
    gpu = engine.generate(prompts, sp)
    assert_oracle_samples(gpu, prompts, model64, engine.model, sp)
    cpu = on("cpu", tiny).generate(prompts, sp)
    assert [(s.prompt_index, s.sample_index) for s in sum(gpu, [])] == [
        (s.prompt_index, s.sample_index) for s in sum(cpu, [])
    ]


def test_greedy_on_cuda_and_transformers_generate_on_cuda_are_the_oracles(tiny, prompts, model64):
    model, tok = tiny
    engine = on("cuda", tiny)
    sp = SamplingParams(greedy=True, max_new_tokens=12, stop_token_ids=(tok.eos_token_id,))
    ours = engine.generate(prompts, sp)
    assert_oracle_samples(ours, prompts, model64, engine.model, sp)
    for prompt in prompts:
        ids = torch.tensor([prompt], device="cuda")
        out = engine.model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
            eos_token_id=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
        )  # fmt: skip
        theirs = out[0, len(prompt) :].tolist()
        error = fp32_logit_error(engine.model, model64, [prompt], [theirs])
        verdict = check_sample(theirs, prompt, model64, greedy=True, seed=None, temperature=1.0, error=error)
        assert verdict.mismatch is None, verdict  # generate too: the oracle's tokens, a near-tie aside


def test_steps_are_captured_as_graphs_and_replay_the_eager_samples(tiny, prompts):
    sp = SamplingParams(n=2, max_new_tokens=80, seed=5, stop_token_ids=STOPS)
    eager = on("cuda", tiny, EngineParams(cuda_graphs=False)).generate(prompts, sp)
    engine = on("cuda", tiny)
    graphed = engine.generate(prompts, sp)
    assert flat(graphed) == flat(eager)
    stats = engine.workspace_stats()
    assert stats["graph_error"] is None and stats["cuda_graphs"] >= 2, stats  # key-length buckets 64 and more
    again = engine.generate(prompts, sp)  # replayed from the kept workspace
    assert flat(again) == flat(eager) and engine.workspace_stats()["cuda_graphs"] == stats["cuda_graphs"]


def test_continuous_batching_on_cuda_with_few_slots_gives_the_oracles_samples(tiny, prompts, model64):
    sp = SamplingParams(n=3, max_new_tokens=30, seed=2, stop_token_ids=STOPS)
    engine = on("cuda", tiny, EngineParams(max_batch_size=4, prefill_batch_size=2))
    assert_oracle_samples(engine.generate(prompts, sp), prompts, model64, engine.model, sp)


def test_the_cache_is_sized_to_the_work_and_released(tiny, prompts, tmp_path):
    folder = build_tiny_model(tmp_path / "tiny", seed=0)
    engine = build_rollout_engine("native", folder, device="cuda")
    assert engine.model.dtype == torch.bfloat16  # dtype auto on CUDA
    sp = SamplingParams(n=100, max_new_tokens=16, seed=1)
    engine.generate(prompts, sp)
    assert engine.workspace_stats()["slots"] == len(prompts) * 100  # one slot per sample: one wave
    assert engine._workspace.cache.keys[0].dtype == torch.bfloat16
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated()
    engine.release_memory()
    assert torch.cuda.memory_allocated() < held and engine._workspace is None
    assert len(engine.generate(prompts, SamplingParams(n=2, max_new_tokens=4))) == len(prompts)
