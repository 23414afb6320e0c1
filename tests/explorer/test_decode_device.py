"""The decode loop's GPU-shaped paths, run on the CPU where the code is shared with CUDA.

On CUDA the host looks at the slots every 16 steps (finished rows idle meanwhile), and each
step runs at a row bucket and a key-length bucket (rows past the live ones idle too) as a
captured graph. Here the same steps run eagerly: the samples must be exactly those of the
look-after-every-step loop, which the oracle tests of test_engine.py hold to full recomputes.
"""

from __future__ import annotations

import pytest
import torch

from trinity_like.errors import TrinityError
from trinity_like.explorer.decode import KEY_BUCKET, row_bucket
from trinity_like.explorer.decode_step import StepGraphs
from trinity_like.explorer.engine import EngineParams, NativeEngine, Request, SamplingParams
from trinity_like.explorer.engine_contract import RolloutEngine
from trinity_like.explorer.engines import build_rollout_engine
from trinity_like.models.tiny import build_tiny_model

TEXTS = ["What is 23 + 5?", "Hello", "The capital of France is Paris and the answer is", "7 * 8 =", "add"]
STOPS = (300, 301, 302, 303, 304, 305, 306, 307)  # frequent enough that samples end at different steps


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model(seed=0)


@pytest.fixture(scope="module")
def prompts(tiny):
    return [tiny[1].encode(t) for t in TEXTS]


def flat(groups):
    return [(s.prompt_index, s.sample_index, s.token_ids, s.finish_reason) for g in groups for s in g]


class EagerGraphs(StepGraphs):
    """The graph path's step shapes, run eagerly and recorded (a CPU has no CUDA graphs)."""

    def __init__(self) -> None:
        super().__init__()
        self.keys: list[tuple] = []

    def run(self, key: tuple, step) -> None:
        self.keys.append(key)
        step()


def with_eager_graphs(engine: NativeEngine, monkeypatch) -> EagerGraphs:
    graphs, real = EagerGraphs(), engine.workspace

    def workspace(*args):
        ws = real(*args)
        ws.graphs = graphs
        return ws

    monkeypatch.setattr(engine, "workspace", workspace)
    return graphs


@pytest.mark.parametrize("greedy", [False, True])
def test_looking_every_16_steps_gives_the_samples_of_looking_every_step(tiny, prompts, greedy):
    model, tok = tiny
    sp = SamplingParams(n=3, max_new_tokens=20, seed=7, greedy=greedy, stop_token_ids=STOPS)
    every = NativeEngine(model, tok, EngineParams(max_batch_size=4)).generate(prompts, sp)
    rows = []
    hook = model.model.embed_tokens.register_forward_hook(lambda m, a, o: rows.append(tuple(a[0].shape)))
    try:
        sparse = NativeEngine(model, tok, EngineParams(max_batch_size=4, sync_every=16)).generate(prompts, sp)
    finally:
        hook.remove()
    assert flat(sparse) == flat(every)
    for a, b in zip((s for g in sparse for s in g), (s for g in every for s in g)):
        torch.testing.assert_close(a.logprobs, b.logprobs, atol=1e-4, rtol=0)  # other batch-mates: rounding
    assert len({len(s.token_ids) for g in every for s in g}) > 1, "the test needs samples of different lengths"
    decoded = sum(b for b, t in rows if t == 1)
    assert decoded > sum(len(s.token_ids) - 1 for g in every for s in g), "finished rows idle until the look"


def test_bucketed_graph_steps_with_idle_rows_give_the_same_samples(tiny, prompts, monkeypatch):
    model, tok = tiny
    sp = SamplingParams(n=2, max_new_tokens=70, seed=3, stop_token_ids=STOPS)
    plain = NativeEngine(model, tok, EngineParams(max_batch_size=8)).generate(prompts, sp)
    engine = NativeEngine(model, tok, EngineParams(max_batch_size=8, sync_every=5))
    graphs = with_eager_graphs(engine, monkeypatch)
    got = engine.generate(prompts, sp)
    assert flat(got) == flat(plain)
    rows = {key[0] for key in graphs.keys}
    lengths = {key[1] for key in graphs.keys}
    max_length = max(len(p) for p in prompts) + 70
    assert rows <= {1, 2, 3, 4, 6, 8} and len(rows) > 1  # buckets only, shrinking as samples finish
    assert all(n % KEY_BUCKET == 0 or n == max_length for n in lengths) and len(lengths) > 1
    assert max(lengths) == max_length  # capped at the cache, past the last 64-multiple


def test_row_buckets():
    assert [row_bucket(n, 1000) for n in range(1, 14)] == [1, 2, 3, 4, 6, 6, 8, 8, 12, 12, 12, 12, 16]
    assert row_bucket(700, 512) == 512


def test_a_call_with_stop_strings_looks_every_step(tiny, prompts):
    """Stop strings are matched on the host: sync_every is overruled (results as looking every step)."""
    model, tok = tiny
    free = NativeEngine(model, tok).generate(
        prompts[:1], SamplingParams(greedy=True, max_new_tokens=20, stop_token_ids=())
    )
    text = tok.decode(free[0][0].token_ids)
    stop = text[len(text) // 2 : len(text) // 2 + 2]
    sp = SamplingParams(greedy=True, max_new_tokens=20, stop_token_ids=(), stop_strings=(stop,))
    a = NativeEngine(model, tok, EngineParams(sync_every=16)).generate(prompts[:1], sp)
    b = NativeEngine(model, tok).generate(prompts[:1], sp)
    assert flat(a) == flat(b) and a[0][0].finish_reason == "stop"


def test_release_memory_drops_the_kept_prefixes_and_the_engine_still_samples(tiny, prompts):
    model, tok = tiny
    engine = NativeEngine(model, tok)
    sp = SamplingParams(greedy=True, max_new_tokens=24, stop_token_ids=())
    first = engine.generate([prompts[2]], sp)
    assert engine.prefix_cache.entries
    engine.release_memory()
    assert not engine.prefix_cache.entries and engine._workspace is None
    engine.resume_memory()
    assert flat(engine.generate([prompts[2]], sp)) == flat(first)
    assert engine.workspace_stats() == {"slots": 1, "cuda_graphs": 0, "graph_error": None}


def test_the_cpu_default_is_128_slots_as_before(tiny, prompts):
    model, tok = tiny
    engine = NativeEngine(model, tok)
    engine.run([Request(tuple(prompts[0]), tuple(range(200)))], SamplingParams(max_new_tokens=2))
    assert engine.last_slots == 128
    engine.run([Request(tuple(prompts[0]), tuple(range(5)))], SamplingParams(max_new_tokens=2))
    assert engine.last_slots == 5


def test_the_factory_builds_a_registered_engine_on_the_asked_device(tiny, tmp_path):
    folder = build_tiny_model(tmp_path / "tiny", seed=0)
    engine = build_rollout_engine("native", folder, device="cpu")
    assert isinstance(engine, RolloutEngine) and isinstance(engine, NativeEngine)
    assert engine.device == torch.device("cpu") and engine.model.dtype == torch.float32  # auto on a CPU
    assert build_rollout_engine("native", folder, device="cpu", dtype="bfloat16").model.dtype == torch.bfloat16
    with pytest.raises(TrinityError, match=r"unknown rollout engine 'vllm'.*registered: .*native"):
        build_rollout_engine("vllm", folder)
    with pytest.raises(TrinityError, match="explorer device: 'tpu' is not a device"):
        build_rollout_engine("native", folder, device="tpu")
