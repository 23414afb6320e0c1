"""The SQLite buffer: round trips, orders, staleness, commits, recovery, concurrent processes."""

from __future__ import annotations

import multiprocessing
import sqlite3
from pathlib import Path

import pytest

from trinity_like.buffer.base import ExperienceSource, TrainingRecorder
from trinity_like.buffer.rows import TrainedRecord
from trinity_like.buffer.sqlite_storage import SqliteParams, SqliteStorage
from trinity_like.buffer.storage import open_storage
from trinity_like.errors import ConfigError
from trinity_like.experience import Experience, PairExperience
from trinity_like.registry import BUFFER_STORAGE


def exp(i: int, version: int = 0) -> Experience:
    return Experience(tokens=[i, i + 1, i + 2], prompt_length=1, model_version=version, eid=f"e{i}")


@pytest.fixture
def buf(tmp_path: Path) -> SqliteStorage:
    storage = SqliteStorage(params=SqliteParams(), run_dir=tmp_path)
    yield storage
    storage.close()


def test_registered_default_satisfies_the_protocol(tmp_path: Path) -> None:
    storage = open_storage("sqlite", {"path": "b.sqlite"}, run_dir=tmp_path)
    assert isinstance(storage, ExperienceSource) and isinstance(storage, TrainingRecorder)
    assert BUFFER_STORAGE.get("sqlite") is SqliteStorage
    assert (tmp_path / "b.sqlite").exists()
    assert sqlite3.connect(tmp_path / "b.sqlite").execute("PRAGMA journal_mode").fetchone() == ("wal",)
    with pytest.raises(ConfigError, match="pth"):
        open_storage("sqlite", {"pth": "x"}, run_dir=tmp_path)


def test_every_field_round_trips(buf: SqliteStorage) -> None:
    full = Experience(
        tokens=[5, 6, 7, 8],
        prompt_length=2,
        logprobs=[-0.1, -2.5],
        action_mask=[1, 0],
        reward=0.75,
        token_level_reward=[0.0, 0.75],
        advantages=[0.3, -0.3],
        returns=[1.0, 0.5],
        group_id="g",
        task_id="t:3",
        model_version=7,
        finish_reason="stop",
        is_expert=True,
        info={"k": [1, "x"]},
    )
    pair = PairExperience(prompt_tokens=[1], chosen_tokens=[2, 3], rejected_tokens=[4], chosen_mask=[1, 0])
    buf.put([full, pair])
    assert buf.claim(2, timeout=0) == [full, pair]


def test_fifo_and_newest_version_orders(buf: SqliteStorage) -> None:
    versions = [2, 0, 3, 3, 1]
    buf.put([exp(i, v) for i, v in enumerate(versions)])
    newest = buf.claim(3, order="newest_version", timeout=0)
    assert [r.eid for r in newest] == ["e2", "e3", "e0"]  # version 3 (write order among equals), then 2
    assert [r.eid for r in buf.claim(5, order="fifo", timeout=0)] == ["e1", "e4"]
    with pytest.raises(ValueError, match="unknown claim order"):
        buf.claim(1, order="random")


def test_staleness_filter_and_drop(buf: SqliteStorage) -> None:
    buf.put([exp(i, v) for i, v in enumerate([0, 1, 2, 3])])
    assert [r.eid for r in buf.claim(4, min_model_version=2, timeout=0)] == ["e2", "e3"]
    assert buf.count("available") == 2  # the stale ones are left, not taken
    assert buf.drop_older_than(1) == 1
    assert (buf.count("dropped"), buf.count("available")) == (1, 1)
    assert [r.eid for r in buf.claim(4, timeout=0)] == ["e1"]


def test_claim_waits_for_n_rows_then_times_out_with_what_there_is(buf: SqliteStorage) -> None:
    buf.put([exp(0)])
    assert len(buf.claim(3, timeout=0.05)) == 1
    buf.put([exp(1), exp(2)])
    buf.mark_writer_done()
    assert len(buf.claim(5)) == 2  # timeout None, but the writer is done: no hang


def test_put_is_idempotent_per_eid(buf: SqliteStorage) -> None:
    buf.put([exp(0), exp(1)])
    buf.put([exp(1), exp(2)])  # a writer retrying after a crash
    assert buf.count("available") == 3


def test_commit_is_idempotent_and_records_the_step(buf: SqliteStorage) -> None:
    buf.put([exp(i) for i in range(4)])
    buf.claim(2, timeout=0)
    buf.commit(5)
    buf.commit(5)
    assert (buf.count("consumed"), buf.last_committed_step()) == (2, 5)
    buf.claim(1, timeout=0)
    with pytest.raises(ValueError, match="committed already"):
        buf.commit(5)
    buf.commit(6)
    assert {eid: s for eid, (st, s) in buf.statuses().items() if st == "consumed"} == {"e0": 5, "e1": 5, "e2": 6}


def test_uncommitted_claims_return_when_a_reader_reopens(tmp_path: Path) -> None:
    first = SqliteStorage(params=SqliteParams(), run_dir=tmp_path)
    first.put([exp(i) for i in range(3)])
    first.claim(2, timeout=0)
    first.close()  # a trainer dies before its commit
    second = SqliteStorage(params=SqliteParams(), run_dir=tmp_path)
    assert second.count("claimed") == 2  # opening for writing touches no claim
    assert [r.eid for r in second.claim(3, timeout=0)] == ["e0", "e1", "e2"]


def test_recover_after_checkpoint_saved_but_commit_lost(buf: SqliteStorage) -> None:
    buf.put([exp(i) for i in range(4)])
    buf.claim(2, timeout=0)
    buf.commit(1)
    buf.claim(2, timeout=0)  # step 2 trained, checkpoint 2 saved, then killed before commit(2)
    moved = buf.recover(2)
    assert moved == {"committed": 2, "released": 0, "restored": 0}
    assert buf.last_committed_step() == 2 and buf.count("consumed") == 4


def test_recover_from_an_older_checkpoint_restores_later_steps(buf: SqliteStorage) -> None:
    buf.put([exp(i) for i in range(4)])
    for step in (1, 2):
        buf.claim(2, timeout=0)
        buf.commit(step)
    moved = buf.recover(1)  # checkpoint 2 was lost: its rows were never in a saved model
    assert moved == {"committed": 0, "released": 0, "restored": 2}
    assert buf.last_committed_step() == 1
    assert [r.eid for r in buf.claim(4, timeout=0)] == ["e2", "e3"]


def _write(path: str, start: int, n: int) -> None:
    storage = SqliteStorage(params=SqliteParams(path=path))
    for i in range(start, start + n, 5):
        storage.put([exp(j) for j in range(i, min(i + 5, start + n))])


def _read(path: str, total: int, out: multiprocessing.Queue) -> None:
    storage = SqliteStorage(params=SqliteParams(path=path))
    seen, step = [], 0
    while len(seen) < total:
        rows = storage.claim(7, timeout=0.05)
        if rows:
            step += 1
            storage.commit(step)
            seen += [r.eid for r in rows]
    out.put(seen)


@pytest.mark.timeout(60)
def test_two_writer_processes_and_a_reader_process(tmp_path: Path) -> None:
    ctx = multiprocessing.get_context("fork")
    path, out = str(tmp_path / "b.sqlite"), ctx.Queue()
    SqliteStorage(params=SqliteParams(path=path)).close()
    procs = [ctx.Process(target=_write, args=(path, 0, 300)), ctx.Process(target=_write, args=(path, 1000, 300))]
    procs.append(ctx.Process(target=_read, args=(path, 600, out)))
    for p in procs:
        p.start()
    seen = out.get(timeout=50)
    for p in procs:
        p.join(timeout=10)
        assert p.exitcode == 0
    assert sorted(seen) == sorted([f"e{i}" for i in range(300)] + [f"e{i}" for i in range(1000, 1300)])
    assert SqliteStorage(params=SqliteParams(path=path)).count("consumed") == 600


def test_what_the_trainer_computed_is_kept_for_claimed_and_consumed_rows_only(buf: SqliteStorage) -> None:
    """Records of a step that never reached a checkpoint go when its rows return (recover)."""
    buf.put([exp(i) for i in range(4)])
    first = buf.claim(2, timeout=0)
    buf.record_trained(
        1,
        [TrainedRecord(r.eid, {"advantages": [0.5, -0.25], "trainer_logprob": [-1.0, -2.0]}) for r in first]
        + [TrainedRecord("not-in-buffer", {"advantages": [1.0]})],
    )
    buf.commit(1)
    second = buf.claim(2, timeout=0)
    buf.record_trained(2, [TrainedRecord(r.eid, {"advantages": [1.0, 1.0]}) for r in second])
    assert buf.trained() == {
        "e0": (1, {"advantages": [0.5, -0.25], "trainer_logprob": [-1.0, -2.0]}),
        "e1": (1, {"advantages": [0.5, -0.25], "trainer_logprob": [-1.0, -2.0]}),
        "e2": (2, {"advantages": [1.0, 1.0]}),
        "e3": (2, {"advantages": [1.0, 1.0]}),
    }
    buf.recover(1)  # killed before checkpoint 2: e2, e3 are available again, their records gone
    assert set(buf.trained()) == {"e0", "e1"}
    buf.claim(2, timeout=0)
    buf.record_trained(2, [TrainedRecord("e2", {"advantages": [3.0, 3.0]})])  # trained again: replaced
    assert buf.trained()["e2"] == (2, {"advantages": [3.0, 3.0]})


def test_a_database_from_before_the_trained_table_gets_it_when_a_writer_opens_it(tmp_path: Path) -> None:
    with SqliteStorage(params=SqliteParams(), run_dir=tmp_path) as storage:
        storage.put([exp(0)])
    db = sqlite3.connect(tmp_path / "buffer.sqlite")
    db.execute("DROP TABLE trained")
    db.commit()
    db.close()
    with SqliteStorage(params=SqliteParams(), run_dir=tmp_path) as storage:
        assert storage.trained() == {} and storage.count() == 1
        storage.record_trained(1, [TrainedRecord("e0", {"advantages": [0.0, 0.0]})])
        assert storage.trained() == {"e0": (1, {"advantages": [0.0, 0.0]})}
