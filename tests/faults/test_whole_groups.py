"""Whole groups, always: every batch a storage hands out is whole groups, none lost, none twice.

A property test on the real storages (memory, SQLite, JSONL) over random group and batch
sizes, writes that cut groups across puts, staleness drops, group-rewards that dynamic
sampling drops, and kill points: a writer killed in the middle of a put (SQLite: its
transaction is gone, tests/buffer/test_crash.py kills one for real; JSONL: the lines it
wrote before, and half a line, are left in the file) that restarts and writes its rows
again, and a trainer killed with claims not committed (before or, for SQLite, right after
saving its checkpoint) that restarts from its checkpoint. Nothing survives a process in
memory, so the memory queue is not killed.

The oracle is the trainer's own checkpoint (what it trained on, step by step), not the
buffer's bookkeeping: each step's rows are whole groups as they were written; no row is in
two steps; once everything is written and claimed, every row was trained once or dropped,
and what was dropped is whole groups, each older than the last staleness floor.
"""

from __future__ import annotations

import tempfile
from collections import Counter
from pathlib import Path

import pytest
from _lib.faultlib import record
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trinity_like.buffer.jsonl_storage import JsonlParams, JsonlStorage
from trinity_like.buffer.memory_storage import MemoryParams, MemoryStorage
from trinity_like.buffer.sqlite_storage import SqliteParams, SqliteStorage
from trinity_like.experience import Experience
from trinity_like.pipeline.batching import experience_batch
from trinity_like.pipeline.rl_loop import drop_uninformative_groups


def _rows(sizes: list[int], versions: list[int], equal: list[bool]) -> list[Experience]:
    """Group ``g`` of ``sizes[g]`` rows sampled by version ``versions[g]``; its rewards all equal
    when ``equal[g]`` (dynamic sampling drops it), else 0, 1, 2, ..."""
    rows = []
    for g, (size, version, same) in enumerate(zip(sizes, versions, equal)):
        for i in range(size):
            rows.append(
                Experience(
                    tokens=[1, 2 + g, 3 + i],
                    prompt_length=1,
                    reward=0.5 if same else float(i),
                    group_id=f"g{g}",
                    group_size=size,
                    task_id=f"t{g}",
                    model_version=version,
                    eid=f"g{g}-{i}",
                )
            )
    return rows


class Harness:
    """One storage, its writer and its trainer, and the trainer's checkpoint (the oracle)."""

    def __init__(self, kind: str, folder: Path) -> None:
        self.kind, self.folder = kind, folder
        self.writer = self._open()
        self.reader = self.writer if kind == "memory" else self._open()
        self.step, self.trained, self.pending = 0, {}, []  # checkpoint: step, eid -> step; claimed since
        self.floor = None  # the last staleness floor applied

    def _open(self):
        if self.kind == "memory":
            return MemoryStorage(params=MemoryParams(capacity=10_000))
        if self.kind == "sqlite":
            return SqliteStorage(params=SqliteParams(poll_interval_s=0.001), run_dir=self.folder)
        return JsonlStorage(params=JsonlParams(poll_interval_s=0.001), run_dir=self.folder)

    def put(self, rows: list[Experience]) -> None:
        self.writer.put(rows)

    def writer_dies_in(self, rows: list[Experience], cut: int) -> None:
        """A writer killed while putting ``rows``: what it leaves, then a new writer puts them all."""
        if self.kind == "jsonl":  # lines are appended one by one: the first `cut`, and half of the next
            with open(self.writer.path, "a") as f:
                for row in rows[:cut]:
                    f.write(Experience.to_json(row) + "\n")
                if cut < len(rows):
                    f.write(Experience.to_json(rows[cut])[:7])
        # SQLite: one transaction, rolled back by the kill -- nothing of it is in the file
        self.writer.close()
        self.writer = self._open()
        self.put(rows)

    def claim(self, n: int, groups: dict[str, tuple[int, set[str]]]) -> None:
        """A claim as the ``staleness`` strategy makes it once a floor is set: drop, then claim above it."""
        if self.floor is not None:
            self.reader.drop_older_than(self.floor)
        rows = self.reader.claim(n, min_model_version=self.floor, timeout=0)
        assert len(rows) <= n
        by_group = Counter(r.group_id for r in rows)
        for gid, count in by_group.items():  # whole groups: every row of each group it holds
            assert {r.eid for r in rows if r.group_id == gid} == groups[gid][1], (gid, count)
        if rows:  # dynamic sampling drops groups whole, and keeps groups whole
            batch, _, keep = drop_uninformative_groups(experience_batch(rows, pad_id=0))
            kept = Counter(rows[i].group_id for i in keep.tolist())
            assert all(kept[g] in (0, c) for g, c in by_group.items())
            assert (batch is None) == (not kept)
            self.step += 1
            self.pending += [r.eid for r in rows]

    def commit(self) -> None:
        if self.step == 0:
            return
        self.trained.update(dict.fromkeys(self.pending, self.step))  # the checkpoint is saved ...
        self.pending = []
        self.reader.commit(self.step)  # ... then the step committed (consuming every claim since)

    def reader_dies(self, after_checkpoint: bool) -> None:
        """The trainer is killed with its claims not committed (optionally: its checkpoint saved)."""
        if after_checkpoint:
            self.trained.update(dict.fromkeys(self.pending, self.step))
        else:
            self.step = max(self.trained.values(), default=0)
        self.pending = []
        self.reader.close()
        self.reader = self._open()
        if self.kind == "sqlite":
            self.reader.recover(self.step)

    def drop(self, version: int) -> None:
        """The staleness floor rises to ``version`` (it never falls)."""
        self.floor = max(version, self.floor or version)
        self.reader.drop_older_than(self.floor)


@st.composite
def scenarios(draw, kind: str):
    group = draw(st.integers(1, 6))
    n_groups = draw(st.integers(1, 10))
    sizes = [group] * n_groups if draw(st.booleans()) else [draw(st.integers(1, 6)) for _ in range(n_groups)]
    versions = [draw(st.integers(0, 3)) for _ in range(n_groups)]
    equal = [draw(st.booleans()) for _ in range(n_groups)]
    total = sum(sizes)
    cuts = sorted(draw(st.sets(st.integers(1, max(total - 1, 1)), max_size=6)) - {total})
    batch = max(sizes) * draw(st.integers(1, 3)) + (draw(st.integers(0, 5)) if draw(st.booleans()) else 0)
    kills = ["writer", "reader", "reader_after_checkpoint"] if kind == "sqlite" else ["writer", "reader"]
    actions = draw(
        st.lists(
            st.one_of(
                st.just(("claim",)),
                st.just(("commit",)),
                st.tuples(st.just("drop"), st.integers(0, 4)),
                st.tuples(st.sampled_from(kills if kind != "memory" else ["claim"]), st.integers(0, 6)),
            ),
            max_size=12,
        )
    )
    return sizes, versions, equal, cuts, batch, actions


def _check_property(kind: str, scenario) -> None:
    sizes, versions, equal, cuts, batch, actions = scenario
    rows = _rows(sizes, versions, equal)
    groups = {f"g{g}": (versions[g], {f"g{g}-{i}" for i in range(s)}) for g, s in enumerate(sizes)}
    bounds = [0, *cuts, len(rows)]
    puts = [rows[a:b] for a, b in zip(bounds, bounds[1:]) if b > a]
    with tempfile.TemporaryDirectory() as folder:
        h = Harness(kind, Path(folder))
        for i, put in enumerate(puts):  # each put may end in the middle of a group
            act = actions[i] if i < len(actions) else ("claim",)
            if act[0] == "writer":
                h.writer_dies_in(put, min(act[1], len(put)))
            else:
                h.put(put)
            if act[0] == "claim":
                h.claim(batch, groups)
            elif act[0] == "commit":
                h.claim(batch, groups)
                h.commit()
            elif act[0] == "drop":
                h.drop(act[1])
            elif act[0] in ("reader", "reader_after_checkpoint"):
                h.claim(batch, groups)
                h.reader_dies(act[0] == "reader_after_checkpoint")
        h.writer.mark_writer_done()
        if h.reader is not h.writer:
            h.reader.mark_writer_done()
        while True:  # drain: every whole group left, batch after batch
            before = h.step
            h.claim(batch, groups)
            h.commit()
            if h.step == before:
                break
        h.step += 1  # one more step, as the run's next would: JSONL counts what it passed over at a commit
        h.commit()
        per_step: dict[int, list[str]] = {}
        for eid, step in h.trained.items():
            per_step.setdefault(step, []).append(eid)
        for step, eids in per_step.items():  # the checkpoint's steps: whole groups each
            for gid in {e.split("-")[0] for e in eids}:
                assert groups[gid][1] <= set(eids), (step, gid)
        everything = {r.eid for r in rows}
        dropped = everything - set(h.trained)
        for gid, (version, eids) in groups.items():
            if eids & dropped:  # a dropped group is dropped whole, and was stale
                assert eids <= dropped, gid
                assert h.floor is not None and version < h.floor, (gid, version, h.floor)
        assert h.reader.count("claimed") == 0 and h.reader.count("dropped") == len(dropped)
        if kind == "sqlite":
            states = h.reader.statuses()
            assert {e for e, (s, _) in states.items() if s == "consumed"} == set(h.trained)
            assert {e: s for e, (_, s) in states.items() if e in h.trained} == h.trained
        h.reader.close()
        if h.writer is not h.reader:
            h.writer.close()


SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize("kind", ["memory", "sqlite", "jsonl"])
def test_every_batch_is_whole_groups_none_lost_none_twice(kind: str, record_property) -> None:
    seen = []

    def check(scenario) -> None:
        seen.append(scenario)
        _check_property(kind, scenario)

    given(scenarios(kind))(SETTINGS(check))()
    kills = "; no kill (nothing survives a process)" if kind == "memory" else ", writer and trainer kills"
    record(
        record_property,
        f"{kind} buffer, {len(seen)} random cases: group sizes 1-6, batch sizes, puts that cut groups, "
        f"staleness drops, dynamic sampling{kills} (property test)",
        "every claim is whole groups; dynamic sampling keeps or drops groups whole",
        "yes (trainer from its checkpoint, writer writes its rows again)" if kind != "memory" else "-",
        "0 lost, 0 twice; dropped only whole stale groups",
    )
