"""The timeline file (trinity_like/monitor/timeline.py): spans, a torn last line, the overlap figure."""

from __future__ import annotations

import threading

from trinity_like.monitor.timeline import (
    Span,
    Timeline,
    busy_seconds,
    overlap_fraction,
    read_spans,
)


def test_spans_from_two_threads_are_whole_lines_and_a_torn_one_is_skipped(tmp_path):
    timeline = Timeline(tmp_path / "sub" / "timeline.jsonl")

    def write(actor: str) -> None:
        for i in range(200):
            timeline.add(Span(actor, "rollout", i, float(i), i + 0.5))

    threads = [threading.Thread(target=write, args=(a,)) for a in ("explorer", "trainer")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    with open(timeline.path, "a") as f:
        f.write('{"actor": "trainer", "phase": "upd')  # a kill mid-line
    spans = read_spans(timeline.path)
    assert len(spans) == 400
    assert sorted(s.step for s in spans if s.actor == "explorer") == list(range(200))


def test_a_span_records_its_body_even_when_it_raises(tmp_path):
    timeline = Timeline(tmp_path / "t.jsonl")
    try:
        with timeline.span("trainer", "update", 3):
            raise ValueError("boom")
    except ValueError:
        pass
    (span,) = read_spans(timeline.path)
    assert (span.actor, span.phase, span.step) == ("trainer", "update", 3) and span.end >= span.start


def test_overlap_against_a_hand_count():
    """Explorer rollouts 0-4 and 6-10 (8 s); trainer busy 1-3 and 7-12 (waits 3-7, which does not
    count): hidden 2 + 3 = 5 s of 8. Overlapping trainer spans count once."""
    spans = [
        Span("explorer", "rollout", 1, 0, 4),
        Span("explorer", "rollout", 2, 6, 10),
        Span("trainer", "update", 1, 1, 3),
        Span("trainer", "sync", 1, 2, 3),
        Span("trainer", "wait", 2, 3, 7),
        Span("trainer", "update", 2, 7, 12),
        Span("explorer", "sync", 2, 4, 6),
    ]
    assert overlap_fraction(spans) == 5 / 8
    assert busy_seconds(spans, "trainer") == 2 + 5
    assert busy_seconds(spans, "explorer", "rollout") == 8
    assert overlap_fraction([Span("trainer", "update", 1, 0, 1)]) is None
