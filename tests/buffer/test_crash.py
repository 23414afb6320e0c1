"""SIGKILL the explorer (writer) and the trainer (reader) at random moments: nothing lost, nothing twice.

The reader plays a trainer: it claims rows, "trains" on them (appends their ids to the
model state it holds in memory), saves a checkpoint (the model state, written atomically)
every few steps and commits the step right after. A killed reader restarts from its last
checkpoint and calls ``recover(step)``. After every kill the invariant is checked against
the checkpoint, an oracle independent of the buffer's own bookkeeping:

* every row the writer saw ``put`` return for is in the database (none lost);
* the checkpoint's model holds each row at most once (none trained twice);
* a row is consumed (with the checkpoint's step) exactly when the checkpoint holds it, and
  available otherwise -- so the resumed run trains on each remaining row exactly once;
* every claim, and so every step, holds whole groups: rows are written in groups of
  ``group_size`` (1 to 8 by seed) in puts that cut groups anywhere, so a killed writer
  leaves part of a group behind until its successor writes the rest.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import random
import time
from collections import Counter
from pathlib import Path

import pytest

from trinity_like.buffer.sqlite_storage import SqliteParams, SqliteStorage
from trinity_like.experience import Experience

N_ROWS = 200  # a multiple of every group size below
GROUP_SIZES = (1, 2, 4, 5, 8)
CTX = multiprocessing.get_context("fork")


def _eid(i: int) -> str:
    return f"e{i:05d}"


def _open(db: Path) -> SqliteStorage:
    return SqliteStorage(params=SqliteParams(path=str(db), poll_interval_s=0.002))


def _group(i: int, seed: int) -> tuple[str, int]:
    size = GROUP_SIZES[seed % len(GROUP_SIZES)]
    return f"g{i // size}", size


def _writer(db: Path, log: Path, seed: int, group_seed: int) -> None:
    """Put rows e0..e{N-1} in random batches (cutting groups anywhere); log each batch after ``put`` returned."""
    storage = _open(db)
    done = set(log.read_text().split()) if log.exists() else set()
    rng = random.Random(seed)
    todo = [i for i in range(N_ROWS) if _eid(i) not in done]
    with open(log, "a") as f:
        while todo:
            batch = todo[: rng.randint(1, 6)]
            todo = todo[len(batch) :]
            rows = [
                Experience(
                    tokens=[i, i + 1],
                    prompt_length=1,
                    model_version=i // 40,  # one version for a group of any size
                    eid=_eid(i),
                    group_id=_group(i, group_seed)[0],
                    group_size=_group(i, group_seed)[1],
                )
                for i in batch
            ]
            storage.put(rows)
            f.write(" ".join(r.eid for r in rows) + "\n")
            f.flush()
    storage.mark_writer_done()


def _load_ckpt(path: Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"step": 0, "trained": []}


def _reader(db: Path, ckpt_path: Path, seed: int, group_seed: int) -> None:
    """A trainer: claim, train (in memory), checkpoint every 1-3 steps, then commit. A claim
    that is not whole groups leaves a file ``<checkpoint>.split`` saying so."""
    storage = _open(db)
    ckpt = _load_ckpt(ckpt_path)
    storage.recover(ckpt["step"])
    rng = random.Random(seed)
    step, model, pending = ckpt["step"], list(ckpt["trained"]), []
    every = rng.randint(1, 3)
    size = _group(0, group_seed)[1]
    while True:
        n = size * rng.randint(1, 3) + rng.randint(0, size - 1)
        rows = storage.claim(n, order=rng.choice(["fifo", "newest_version"]), timeout=0.02)
        counts = Counter(r.group_id for r in rows)
        if len(rows) > n or any(c != size for c in counts.values()):
            ckpt_path.with_suffix(".split").write_text(f"claim of {n}: {sorted(counts.items())}")
        if not rows and storage.writer_done() and storage.count("available") == 0:
            break
        if not rows:
            continue
        step += 1
        pending += [r.eid for r in rows]
        if step % every == 0:
            model = _save_and_commit(storage, ckpt_path, step, model, pending)
            pending = []
    if pending:  # the last partial interval
        _save_and_commit(storage, ckpt_path, step, model, pending)


def _save_and_commit(storage: SqliteStorage, ckpt_path: Path, step: int, model: list, pending: list) -> list:
    """Save the checkpoint of ``step`` atomically, then commit the step."""
    model = model + [[eid, step] for eid in pending]
    tmp = ckpt_path.with_suffix(".tmp")
    tmp.write_text(json.dumps({"step": step, "trained": model}))
    os.replace(tmp, ckpt_path)  # the checkpoint is saved ...
    storage.commit(step)  # ... then the step is committed
    return model


def _check(db: Path, ckpt_path: Path, log: Path, group_seed: int) -> dict[str, tuple[str, int | None]]:
    """Recover as a restarted trainer would and check the invariant; returns row states."""
    ckpt = _load_ckpt(ckpt_path)
    confirmed = set(log.read_text().split()) if log.exists() else set()  # before the snapshot:
    storage = _open(db)  # the writer may still be running and confirm more rows meanwhile
    storage.recover(ckpt["step"])
    states = storage.statuses()
    storage.close()
    assert confirmed <= set(states), f"lost rows: {sorted(confirmed - set(states))[:5]}"
    trained = [eid for eid, _ in ckpt["trained"]]
    assert len(trained) == len(set(trained)), "a row was trained on twice"
    in_model = dict(ckpt["trained"])
    assert not ckpt_path.with_suffix(".split").exists(), ckpt_path.with_suffix(".split").read_text()
    by_step: dict[int, Counter] = {}
    for eid, step in ckpt["trained"]:
        by_step.setdefault(step, Counter())[_group(int(eid[1:]), group_seed)[0]] += 1
    size = _group(0, group_seed)[1]
    assert all(c == size for groups in by_step.values() for c in groups.values()), "a step trained part of a group"
    for eid, (status, step) in states.items():
        if eid in in_model:
            assert (status, step) == ("consumed", in_model[eid]), (eid, status, step, in_model[eid])
        else:
            assert status == "available", (eid, status, step)
    return states


def _start(target, *args) -> multiprocessing.Process:
    proc = CTX.Process(target=target, args=args, daemon=True)
    proc.start()
    return proc


@pytest.mark.timeout(60)
@pytest.mark.parametrize("seed", range(24))
def test_sigkill_writer_and_reader_loses_nothing_and_trains_nothing_twice(tmp_path: Path, seed: int) -> None:
    db, ckpt, log = tmp_path / "buffer.sqlite", tmp_path / "ckpt.json", tmp_path / "written.log"
    rng = random.Random(seed)
    procs = {"writer": _start(_writer, db, log, seed, seed), "reader": _start(_reader, db, ckpt, seed, seed)}
    for kill in range(4):
        time.sleep(rng.uniform(0.0, 0.06))
        who = rng.choice(["writer", "reader"])
        procs[who].kill()  # SIGKILL (a no-op if it has finished already)
        procs[who].join()
        if who == "reader":
            _check(db, ckpt, log, seed)
        target, args = (
            (_writer, (db, log, seed + kill + 1, seed))
            if who == "writer"
            else (_reader, (db, ckpt, seed + kill + 1, seed))
        )
        procs[who] = _start(target, *args)
    for proc in procs.values():
        proc.join(timeout=30)
        assert proc.exitcode == 0
    states = _check(db, ckpt, log, seed)
    assert sorted(states) == [_eid(i) for i in range(N_ROWS)]
    assert {s for s, _ in states.values()} == {"consumed"}
