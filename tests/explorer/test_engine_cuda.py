"""The native engine on a CUDA device: the CPU's samples, captured steps, bf16 by default, memory
handed back (skipped without a GPU; run by benchmarks/gpu_check.py on a GPU machine)."""

from __future__ import annotations

import copy

import pytest
import torch

from trinity_like.explorer.engine import EngineParams, NativeEngine, SamplingParams
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


@pytest.mark.parametrize("greedy", [True, False])
def test_cuda_samples_are_the_cpu_samples_for_the_same_seeds(tiny, prompts, greedy):
    """float32 on both: the same tokens (counter-based draws: a seed's stream is the device's too)."""
    sp = SamplingParams(n=3, max_new_tokens=24, seed=11, greedy=greedy, stop_token_ids=STOPS)
    cpu, gpu = on("cpu", tiny).generate(prompts, sp), on("cuda", tiny).generate(prompts, sp)
    assert flat(gpu) == flat(cpu)
    for a, b in zip((s for g in gpu for s in g), (s for g in cpu for s in g)):
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=0)


def test_greedy_on_cuda_equals_transformers_generate_on_cuda(tiny, prompts):
    model, tok = tiny
    engine = on("cuda", tiny)
    sp = SamplingParams(greedy=True, max_new_tokens=12, stop_token_ids=(tok.eos_token_id,))
    for prompt, (sample,) in zip(prompts, engine.generate(prompts, sp)):
        ids = torch.tensor([prompt], device="cuda")
        out = engine.model.generate(
            ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=12,
            eos_token_id=[tok.eos_token_id], pad_token_id=tok.pad_token_id,
        )  # fmt: skip
        assert sample.token_ids == out[0, len(prompt) :].tolist()


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


def test_continuous_batching_on_cuda_with_few_slots_gives_the_cpu_samples(tiny, prompts):
    sp = SamplingParams(n=3, max_new_tokens=30, seed=2, stop_token_ids=STOPS)
    few = EngineParams(max_batch_size=4, prefill_batch_size=2)
    assert flat(on("cuda", tiny, few).generate(prompts, sp)) == flat(on("cpu", tiny, few).generate(prompts, sp))


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
