"""Row codecs (exact round trips, no pickle) and the JSONL storage."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trinity_like.buffer.base import ExperienceSource
from trinity_like.buffer.jsonl_storage import JsonlParams, JsonlStorage, read_rows
from trinity_like.buffer.rows import decode, encode, pack, unpack
from trinity_like.experience import Experience, PairExperience

floats = st.floats(allow_nan=False, allow_infinity=True, width=64)


@st.composite
def experiences(draw: st.DrawFn) -> Experience:
    tokens = draw(st.lists(st.integers(0, 2**31 - 1), min_size=1, max_size=40))
    p = draw(st.integers(0, len(tokens)))
    r = len(tokens) - p
    maybe = lambda elements: draw(st.none() | st.lists(elements, min_size=r, max_size=r))  # noqa: E731
    return Experience(
        tokens=tokens,
        prompt_length=p,
        logprobs=maybe(floats),
        action_mask=maybe(st.integers(0, 1)),
        reward=draw(st.none() | floats),
        token_level_reward=maybe(floats),
        advantages=maybe(floats),
        returns=maybe(floats),
        group_id=draw(st.text(max_size=5)),
        model_version=draw(st.integers(0, 10**6)),
        is_expert=draw(st.booleans()),
        info=draw(st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)),
    )


@settings(max_examples=60, deadline=None)
@given(experiences())
def test_both_codecs_round_trip_exactly(row: Experience) -> None:
    assert unpack(*pack(row)) == row
    assert decode(*encode(row)) == row


def test_pack_layout_is_little_endian_arrays() -> None:
    row = Experience(tokens=[1, 258], prompt_length=1, logprobs=[-0.5])
    kind, header, blob = pack(row)
    assert kind == "experience" and json.loads(header)["_arrays"] == {"tokens": 2, "logprobs": 1}
    assert blob == (1).to_bytes(4, "little") + (258).to_bytes(4, "little") + bytes.fromhex("000000000000e0bf")
    with pytest.raises(TypeError, match="Experience or PairExperience"):
        pack({"tokens": [1]})  # type: ignore[arg-type]


def test_jsonl_appends_reads_and_resumes_from_the_committed_cursor(tmp_path: Path) -> None:
    buf = JsonlStorage(params=JsonlParams(), run_dir=tmp_path)
    assert isinstance(buf, ExperienceSource)
    rows = [Experience(tokens=[i, i], prompt_length=1, model_version=i, eid=f"e{i}") for i in range(5)]
    pair = PairExperience(prompt_tokens=[1], chosen_tokens=[2], rejected_tokens=[3], eid="p")
    buf.put(rows[:3])
    buf.put(rows[3:] + [pair])
    assert list(read_rows(tmp_path / "experiences.jsonl")) == rows + [pair]
    assert [r.eid for r in buf.claim(2, timeout=0)] == ["e0", "e1"]
    buf.commit(1)
    assert [r.eid for r in buf.claim(2, min_model_version=3, timeout=0)] == ["e3", "e4"]  # e2 is stale
    again = JsonlStorage(params=JsonlParams(), run_dir=tmp_path)  # restarted before commit(2)
    assert [r.eid for r in again.claim(10, timeout=0.01)] == ["e2", "e3", "e4", "p"]
    again.commit(2)
    assert (again.count("consumed"), again.count("available"), again.count("claimed")) == (6, 0, 0)
    with pytest.raises(ValueError, match="unknown claim order"):
        again.claim(1, order="newest_version")


def test_jsonl_waits_for_a_line_to_be_complete(tmp_path: Path) -> None:
    buf = JsonlStorage(params=JsonlParams(path="x.jsonl"), run_dir=tmp_path)
    with open(tmp_path / "x.jsonl", "a") as f:
        f.write(encode(Experience(tokens=[1], prompt_length=0))[1][:10])  # a writer mid-line
    assert buf.claim(1, timeout=0.02) == [] and buf.count("available") == 0


def test_jsonl_claim_returns_what_there_is_once_the_writer_is_done(tmp_path: Path) -> None:
    buf = JsonlStorage(params=JsonlParams(), run_dir=tmp_path)
    buf.put([Experience(tokens=[1, 2], prompt_length=1, eid="only")])
    buf.mark_writer_done()
    assert [r.eid for r in buf.claim(4)] == ["only"]  # no timeout: without the mark this would wait forever
    assert buf.recover(None) == {}  # uncommitted claims come back from the cursor on restart, nothing to move


def test_jsonl_put_skips_ids_it_holds_and_cuts_a_torn_last_line(tmp_path: Path) -> None:
    """A resumed run re-exploring a step writes its first attempt's ids: kept once, as in SQLite.
    A writer killed mid-line leaves a line without its newline: the next writer cuts it."""
    rows = [Experience(tokens=[i, i], prompt_length=1, eid=f"e{i}") for i in range(3)]
    JsonlStorage(params=JsonlParams(), run_dir=tmp_path).put(rows[:2])
    with open(tmp_path / "experiences.jsonl", "a") as f:
        f.write(encode(rows[2])[1][:10])  # killed mid-line
    again = JsonlStorage(params=JsonlParams(), run_dir=tmp_path)
    again.put(rows[1:])  # e1 again, e2 for real
    again.put(rows)
    assert [r.eid for r in read_rows(tmp_path / "experiences.jsonl")] == ["e0", "e1", "e2"]
    assert [r.eid for r in again.claim(5, timeout=0.01)] == ["e0", "e1", "e2"]
