"""Capture beside a trainer (decode_step.StepGraphs): its order and its failures, on the CPU where the
logic is shared with CUDA, and the real capture on a GPU (`gpu`).

On the CPU a graph's capture is stood in for by running the step and keeping a replay that runs it
again (what a CUDA graph replays is the same step on the same tensors): what is checked is what
happens around the capture -- who holds the device turn, what is captured when, what a failure leaves.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from trinity_like.explorer.decode_step import StepGraphs
from trinity_like.explorer.engine import EngineParams, NativeEngine, SamplingParams
from trinity_like.models.device import DEVICE_TURN
from trinity_like.models.tiny import build_tiny_model

EVENTS: list[tuple[str, str, bool]] = []  # (what, thread, device turn held by that thread)
_EVENTS_LOCK = threading.Lock()


def record(what: str) -> None:
    with _EVENTS_LOCK:
        EVENTS.append((what, threading.current_thread().name, DEVICE_TURN._is_owned()))


class _Replay:
    def __init__(self, step) -> None:
        self.step = step

    def replay(self) -> None:
        self.step()


class RecordingGraphs(StepGraphs):
    """StepGraphs whose capture runs on the CPU: the step once for real, then a kept replay of it."""

    def __init__(self, fail: BaseException | None = None) -> None:
        super().__init__()
        self.fail = fail

    def _capture(self, key, step):
        record("capture begin")
        step()
        time.sleep(0.02)  # a capture takes a while: a trainer step that did not wait would land inside it
        record("capture end")
        if self.fail is not None:
            return self.fail
        self.graphs[key] = _Replay(step)
        self.captures += 1
        return None


@pytest.fixture(scope="module")
def tiny():
    return build_tiny_model(seed=0)


def engine_with(monkeypatch, model, tok, graphs: StepGraphs, **params) -> NativeEngine:
    engine = NativeEngine(model, tok, EngineParams(**params))
    monkeypatch.setattr(engine, "_new_graphs", lambda device: graphs)
    return engine


def flat(groups):
    return [(s.token_ids, s.finish_reason) for g in groups for s in g]


def test_captures_hold_the_device_turn_and_graphs_survive_release_and_in_place_updates(tiny, monkeypatch):
    model, tok = tiny
    prompts = [tok.encode(t) for t in ("What is 2 + 3?", "Hello", "7 * 8 =")]
    sp = SamplingParams(n=2, max_new_tokens=10, seed=5)
    graphs = RecordingGraphs()
    engine = engine_with(monkeypatch, model, tok, graphs, sync_every=4)
    EVENTS.clear()
    first = engine.generate(prompts, sp)
    assert graphs.captures >= 1 and all(held for what, _, held in EVENTS if what.startswith("capture"))
    captured = graphs.captures
    # A colocated rollout ends by releasing memory and the next weights arrive in place: the graphs stay.
    engine.release_memory()
    new = {n: p.detach() * 1.01 for n, p in model.named_parameters()}
    original = {n: p.detach().clone() for n, p in model.named_parameters()}
    try:
        engine.update_weights(new, strict=False)
        again = engine.generate(prompts, sp)
        assert graphs.captures == captured, "same shapes: replayed, not captured again"
        fresh = NativeEngine(model, tok, EngineParams(sync_every=4, cuda_graphs=False)).generate(prompts, sp)
        assert flat(again) == flat(fresh) != flat(first)  # the replays read the new weights where they lie
        # keep_graphs=False: a release drops them, the next call captures again.
        engine2 = engine_with(monkeypatch, model, tok, RecordingGraphs(), sync_every=4, keep_graphs=False)
        engine2.generate(prompts, sp)
        engine2.release_memory()
        assert engine2._workspace is None
    finally:
        engine.update_weights(original, strict=False)


def test_a_failed_capture_turns_graphs_off_with_its_own_error_and_drops_the_pool(tiny, monkeypatch):
    model, tok = tiny
    prompts = [tok.encode(t) for t in ("What is 2 + 3?", "Hello")]
    sp = SamplingParams(n=2, max_new_tokens=8, seed=3)
    error = RuntimeError("CUDA error: operation not permitted when stream is capturing\nmore detail")
    graphs = RecordingGraphs(fail=error)
    graphs.pool = object()  # a pool from earlier captures: dropped with them
    graphs.graphs[("old",)] = _Replay(lambda: None)
    engine = engine_with(monkeypatch, model, tok, graphs, sync_every=4)
    with pytest.warns(UserWarning, match="operation not permitted when stream is capturing"):
        got = engine.generate(prompts, sp)
    assert graphs.failed == "RuntimeError: CUDA error: operation not permitted when stream is capturing"
    assert graphs.graphs == {} and graphs.pool is None
    assert engine.workspace_stats()["graph_error"] == graphs.failed
    eager = NativeEngine(model, tok, EngineParams(sync_every=4)).generate(prompts, sp)
    assert flat(got) == flat(eager)  # the failed capture's step ran for real, the rest eagerly


def test_in_a_concurrent_run_captures_and_trainer_steps_take_turns(tmp_path, monkeypatch):
    """A real run, mode both, offset 1, the explorer in a thread beside the trainer: every capture and
    every trainer step holds the device turn, and no trainer step starts or ends inside a capture."""
    from _lib.tiny_runs import run

    from trinity_like.trainer.local_engine import LocalEngine

    monkeypatch.setattr(NativeEngine, "_new_graphs", lambda self, device: RecordingGraphs())
    for name in ("forward_backward", "optim_step"):
        real = getattr(LocalEngine, name)

        def wrapped(self, *args, _real=real, _name=name, **kwargs):
            record(f"trainer {_name} begin")
            try:
                return _real(self, *args, **kwargs)
            finally:
                record(f"trainer {_name} end")

        monkeypatch.setattr(LocalEngine, name, wrapped)
    EVENTS.clear()
    run(tmp_path, "trainer.total_steps=3", "synchronizer.offset=1", "algorithm.dynamic_sampling=false")
    events = list(EVENTS)
    captures = [e for e in events if e[0].startswith("capture")]
    steps = [e for e in events if e[0].startswith("trainer")]
    assert captures and steps
    assert all(held for _, _, held in captures + steps), [e for e in captures + steps if not e[2]]
    assert {t for _, t, _ in captures} != {t for _, t, _ in steps}  # two threads
    inside = False
    for what, _, _ in events:
        inside = what == "capture begin" or (inside and what != "capture end")
        assert not (inside and what.startswith("trainer")), events


@pytest.mark.gpu
def test_real_capture_beside_an_allocating_thread_and_a_failing_capture_on_cuda():
    model, tok = build_tiny_model(seed=0)
    model = model.to("cuda")
    prompts = [tok.encode(t) for t in ("What is 2 + 3?", "Hello", "7 * 8 =")]
    sp = SamplingParams(n=4, max_new_tokens=40, seed=1)
    stop = threading.Event()

    def trainer_like():  # allocates, syncs and empties the cache, in turns, as a trainer step does
        while not stop.is_set():
            with DEVICE_TURN:
                x = torch.randn(1024, 1024, device="cuda")
                (x @ x).sum().item()
                del x
                torch.cuda.empty_cache()

    other = threading.Thread(target=trainer_like)
    other.start()
    try:
        engine = NativeEngine(model, tok)
        got = engine.generate(prompts, sp)
    finally:
        stop.set()
        other.join()
    stats = engine.workspace_stats()
    assert stats["graph_error"] is None and stats["cuda_graphs"] >= 1, stats
    eager = NativeEngine(model, tok, EngineParams(cuda_graphs=False)).generate(prompts, sp)
    assert [len(s.token_ids) for g in got for s in g] == [len(s.token_ids) for g in eager for s in g]

    # A step a graph cannot hold (a host sync): its own error, the caller's stream back, the pool dropped.
    graphs = StepGraphs()
    caller = torch.cuda.current_stream()
    x = torch.ones(4, device="cuda")
    with pytest.warns(UserWarning, match="capture failed"):
        graphs.run(("sync",), lambda: x.sum().item())
    assert torch.cuda.current_stream() == caller
    assert graphs.failed is not None and "invalidated" not in graphs.failed, graphs.failed
    assert graphs.pool is None and graphs.graphs == {}
    assert float((x + 1).sum()) == 8.0  # the stream works
