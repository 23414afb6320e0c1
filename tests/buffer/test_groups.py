"""Whole groups in the buffer's own pieces: the picking rule, a memory queue smaller than a
group, a group's size kept through the storages' codecs. The property test over random
sizes, drops and kills is tests/faults/test_whole_groups.py."""

from __future__ import annotations

import threading
from pathlib import Path

from trinity_like.buffer.groups import take_whole_groups
from trinity_like.buffer.jsonl_storage import JsonlParams, JsonlStorage
from trinity_like.buffer.memory_storage import MemoryParams, MemoryStorage
from trinity_like.buffer.sqlite_storage import SqliteParams, SqliteStorage
from trinity_like.experience import Experience


def _group(gid: str, size: int, version: int = 0) -> list[Experience]:
    return [
        Experience(
            tokens=[1, 2, 3 + i],
            prompt_length=1,
            reward=float(i),
            group_id=gid,
            group_size=size,
            model_version=version,
            eid=f"{gid}-{i}",
        )
        for i in range(size)
    ]


def test_take_whole_groups_keeps_order_and_stops_at_a_group_that_does_not_fit() -> None:
    rows = [("a1", "a", 2), ("b1", "b", 3), ("a2", "a", 2), ("c1", "c", 1), ("b2", "b", 3), ("b3", "b", 3)]
    assert take_whole_groups(rows, 3) == (["a1", "a2", "c1"], True)
    assert take_whole_groups(rows, 4) == (["a1", "a2", "c1"], True)  # b is whole, but does not fit
    assert take_whole_groups(rows[:4], 8) == (["a1", "a2", "c1"], False)  # b is not whole: wait for its rows
    assert take_whole_groups(rows, 6) == (["a1", "a2", "b1", "b2", "b3", "c1"], True)
    assert take_whole_groups(rows, 1) == ([], True)  # a does not fit: a claim of 1 never splits it
    assert take_whole_groups(rows[:2], 8) == ([], False)


def test_a_memory_queue_smaller_than_a_group_takes_it_whole(tmp_path: Path) -> None:
    """A put waits for room for a whole group, not row by row: a claim never sees half of one."""
    storage = MemoryStorage(params=MemoryParams(capacity=3))
    rows = _group("g0", 4) + _group("g1", 4)
    writer = threading.Thread(target=storage.put, args=(rows,))
    writer.start()
    first = storage.claim(4, timeout=5)
    second = storage.claim(4, timeout=5)
    writer.join(timeout=5)
    assert [r.eid for r in first] == [f"g0-{i}" for i in range(4)]
    assert [r.eid for r in second] == [f"g1-{i}" for i in range(4)]


def test_rows_keep_their_group_size_through_every_codec(tmp_path: Path) -> None:
    row = _group("g0", 3, version=1)[0]
    for storage in (
        SqliteStorage(params=SqliteParams(), run_dir=tmp_path),
        JsonlStorage(params=JsonlParams(), run_dir=tmp_path),
    ):
        storage.put([row])
        assert storage.claim(3, timeout=0) == []  # one row of a group of 3: not whole
        storage.close()
    back = SqliteStorage(params=SqliteParams(), run_dir=tmp_path)
    back.put(_group("g0", 3, version=1)[1:])
    assert [r.group_size for r in back.claim(3, timeout=0)] == [3, 3, 3]


def test_a_group_with_one_stale_row_is_dropped_whole(tmp_path: Path) -> None:
    """Rows of a group share their version; should one lag, dropping it alone would leave the
    rest waiting for ever: the group goes whole, and a later group stays."""
    mixed = _group("g0", 3, version=5)
    mixed[1].model_version = 1
    fresh = _group("g1", 2, version=5)
    for storage in (
        MemoryStorage(params=MemoryParams()),
        SqliteStorage(params=SqliteParams(), run_dir=tmp_path),
    ):
        storage.put(mixed + fresh)
        assert storage.drop_older_than(3) == 3
        assert [r.eid for r in storage.claim(5, timeout=0)] == ["g1-0", "g1-1"]
        storage.close()


def test_jsonl_passes_over_a_group_a_dead_writer_cut_and_counts_it_dropped(tmp_path: Path) -> None:
    """Lines of a group are written one after another: another group's line before the group
    is whole means its writer died and nothing will complete it."""
    storage = JsonlStorage(params=JsonlParams(), run_dir=tmp_path)
    cut, whole = _group("g0", 3)[:2], _group("g1", 2)
    storage.put(cut + whole)
    storage.mark_writer_done()
    assert [r.eid for r in storage.claim(4, timeout=0)] == ["g1-0", "g1-1"]
    storage.commit(1)
    assert storage.count("dropped") == 2 and storage.count("consumed") == 2
