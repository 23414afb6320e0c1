"""The in-memory queue: bounded with back-pressure, same claim contract as sqlite, Ray-shared."""

from __future__ import annotations

import threading
import time

import pytest

from trinity_like.buffer.base import ExperienceSource
from trinity_like.buffer.memory_storage import BufferFullError, MemoryParams, MemoryStorage
from trinity_like.buffer.storage import open_storage
from trinity_like.experience import Experience


def exp(i: int, version: int = 0) -> Experience:
    return Experience(tokens=[i, i + 1], prompt_length=1, model_version=version, eid=f"e{i}")


def test_full_queue_blocks_the_writer_until_the_reader_claims() -> None:
    buf = MemoryStorage(params=MemoryParams(capacity=4))
    assert isinstance(buf, ExperienceSource)
    done = threading.Event()

    def write() -> None:
        buf.put([exp(i) for i in range(10)])
        done.set()

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    time.sleep(0.2)
    assert not done.is_set() and buf.count("available") == 4  # blocked, not growing
    claimed = []
    while len(claimed) < 10:
        claimed += buf.claim(3, timeout=0.2)
        assert buf.count("available") <= 4
    assert done.wait(2.0)
    writer.join()
    assert [r.eid for r in claimed] == [f"e{i}" for i in range(10)]  # in write order, none lost


def test_put_timeout_raises_instead_of_waiting_forever() -> None:
    buf = open_storage("memory", {"capacity": 2, "put_timeout_s": 0.05})
    buf.put([exp(0), exp(1)])
    start = time.monotonic()
    with pytest.raises(BufferFullError):
        buf.put([exp(2)])
    assert time.monotonic() - start >= 0.05


def test_orders_staleness_and_commit() -> None:
    buf = MemoryStorage(params=MemoryParams())
    buf.put([exp(i, v) for i, v in enumerate([2, 0, 3, 3, 1])])
    assert [r.eid for r in buf.claim(3, order="newest_version", timeout=0)] == ["e2", "e3", "e0"]
    assert [r.eid for r in buf.claim(5, min_model_version=1, timeout=0)] == ["e4"]
    assert buf.drop_older_than(1) == 1
    buf.commit(1)
    buf.commit(1)
    assert {s: buf.count(s) for s in ("available", "claimed", "consumed", "dropped")} == {
        "available": 0,
        "claimed": 0,
        "consumed": 4,
        "dropped": 1,
    }


def test_a_claim_waiting_for_rows_wakes_when_they_arrive() -> None:
    buf = MemoryStorage(params=MemoryParams())
    threading.Timer(0.05, lambda: buf.put([exp(0), exp(1)])).start()
    assert len(buf.claim(2, timeout=5.0)) == 2
    buf.mark_writer_done()
    assert buf.claim(4) == []  # timeout None, writer done: returns instead of hanging


@pytest.mark.timeout(120)
def test_ray_actor_queue_is_shared_between_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    ray = pytest.importorskip("ray")
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        params = MemoryParams(capacity=8, ray_actor="test-buffer-queue")

        @ray.remote(num_cpus=0)
        def explorer(rows: list[Experience]) -> int:  # another process, writing through the actor
            MemoryStorage(params=params).put(rows)
            return len(rows)

        trainer = MemoryStorage(params=params)
        pending = explorer.remote([exp(i, version=i % 3) for i in range(20)])
        got: list[Experience] = []
        for _ in range(20):  # the writer blocks at 8 rows until these claims make room
            got += trainer.claim(5, timeout=5.0)
            if len(got) == 20:
                break
        assert ray.get(pending) == 20
        trainer.commit(1)
        assert sorted(r.eid for r in got) == sorted(f"e{i}" for i in range(20))
        assert trainer.count("consumed") == 20
    finally:
        ray.shutdown()
