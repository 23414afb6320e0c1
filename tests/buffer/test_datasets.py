"""Data sets: field mapping, resumable seeded order, tokenized SFT/pair rows, and every bad-data case."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from trinity_like.buffer.base import ExpertSource
from trinity_like.buffer.datasets import DatasetOptions, ExpertSet, PairSet, SftSet, TaskSet
from trinity_like.errors import DataError


def write_jsonl(path: Path, rows: list[Any]) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return path


def tasks_file(tmp_path: Path, n: int = 10) -> Path:
    return write_jsonl(
        tmp_path / "tasks.jsonl", [{"question": f"q{i}", "solution": i, "level": i % 3} for i in range(n)]
    )


# -- tasks and order ------------------------------------------------------------------
def test_task_fields_are_mapped_and_the_rest_kept_in_info(tmp_path: Path) -> None:
    opts = DatasetOptions(
        path=str(tasks_file(tmp_path)),
        prompt_key="question",
        answer_key="solution",
        shuffle=False,
        system_prompt="Be brief.",
    )
    first = TaskSet(opts).next_batch(1)[0]
    assert (first.prompt, first.answer, first.info, first.task_id) == ("q0", "0", {"level": 0}, "tasks.jsonl:1")
    assert first.messages() == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "q0"}]


def test_each_epoch_is_a_seeded_permutation_and_epochs_end(tmp_path: Path) -> None:
    opts = DatasetOptions(
        path=str(tasks_file(tmp_path)), prompt_key="question", answer_key="solution", seed=3, epochs=2
    )
    seen = [t.prompt for t in TaskSet(opts)]
    assert len(seen) == 20
    assert sorted(seen[:10]) == sorted(seen[10:]) == sorted(f"q{i}" for i in range(10))
    assert seen[:10] != seen[10:]  # a new order per epoch
    assert seen != [t.prompt for t in TaskSet(DatasetOptions(**{**opts.__dict__, "seed": 4}))]
    unshuffled = TaskSet(DatasetOptions(**{**opts.__dict__, "shuffle": False, "epochs": 1}))
    assert [t.prompt for t in unshuffled] == [f"q{i}" for i in range(10)]
    assert unshuffled.exhausted and unshuffled.next_batch(4) == []


@pytest.mark.parametrize("stop_after", [0, 1, 3, 4])
def test_a_resumed_set_continues_in_the_same_order(tmp_path: Path, stop_after: int) -> None:
    opts = DatasetOptions(
        path=str(tasks_file(tmp_path)), prompt_key="question", answer_key="solution", seed=7, epochs=2
    )
    straight = TaskSet(opts)
    expected = [[t.task_id for t in straight.next_batch(3)] for _ in range(7)]
    before = TaskSet(opts)
    got = [[t.task_id for t in before.next_batch(3)] for _ in range(stop_after)]
    state = json.loads(json.dumps(before.state_dict()))  # saved with a checkpoint
    after = TaskSet(opts)
    after.load_state_dict(state)
    got += [[t.task_id for t in after.next_batch(3)] for _ in range(7 - stop_after)]
    assert got == expected


def test_resuming_on_different_data_is_an_error(tmp_path: Path) -> None:
    opts = DatasetOptions(path=str(tasks_file(tmp_path)), prompt_key="question", answer_key="solution")
    state = TaskSet(opts).state_dict()
    other = TaskSet(DatasetOptions(**{**opts.__dict__, "path": str(tasks_file(tmp_path / "..", n=11))}))
    with pytest.raises(DataError, match="cannot resume"):
        other.load_state_dict(state)


def test_parquet_and_folders(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    folder.mkdir()
    pq.write_table(
        pa.Table.from_pylist([{"prompt": f"p{i}", "answer": str(i)} for i in range(3)]), folder / "a.parquet"
    )
    pq.write_table(pa.Table.from_pylist([{"prompt": "p3", "answer": None}]), folder / "b.parquet")
    with pytest.raises(DataError, match=r'^b\.parquet:row 0: missing field "answer"$'):
        TaskSet(DatasetOptions(path=str(folder)))
    (folder / "b.parquet").unlink()
    assert [t.task_id for t in TaskSet(DatasetOptions(path=str(folder), shuffle=False))] == [
        "a.parquet:row 0",
        "a.parquet:row 1",
        "a.parquet:row 2",
    ]


# -- bad data ------------------------------------------------------------------------
PAIR = {"prompt": "p", "chosen": "c", "rejected": "r"}
BAD_PAIRS = [
    ([PAIR, "", PAIR, {"prompt": "p", "chosen": "c"}], r'^pairs\.jsonl:4: missing field "rejected"$'),
    ([PAIR, '{"prompt": "p", "chosen": '], r"^pairs\.jsonl:2: invalid JSON"),
    (
        [PAIR, {"prompt": "p", "chosen": 3, "rejected": "r"}],
        r'^pairs\.jsonl:2: field "chosen" must be a string, got a number$',
    ),
    ([PAIR, {"prompt": "p", "chosen": None, "rejected": "r"}], r'^pairs\.jsonl:2: missing field "chosen"$'),
    (["[1, 2]"], r"^pairs\.jsonl:1: expected a JSON object, got list$"),
    ([PAIR, {**PAIR, "prompt": [{"role": "user"}]}], r'^pairs\.jsonl:2: field "prompt" message 0 must have'),
    (
        [PAIR, {**PAIR, "prompt": [{"role": "user", "content": "x"}]}],
        r'^pairs\.jsonl:2: field "prompt" is a list here but a string at pairs\.jsonl:1$',
    ),
    (["", "  "], r"the data set is empty$"),
    ([], r"the data set is empty$"),
]


@pytest.mark.parametrize("lines,message", BAD_PAIRS)
def test_bad_pair_rows_name_file_and_line(
    tmp_path: Path, tiny_tokenizer: Any, lines: list[Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    monkeypatch.chdir(run_dir)
    path = write_jsonl(tmp_path / "pairs.jsonl", lines)
    with pytest.raises(DataError, match=message):
        PairSet(DatasetOptions(path=str(path)), tiny_tokenizer)
    assert list(run_dir.iterdir()) == []  # nothing written before the data validated


def test_bad_files(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="no such data file"):
        TaskSet(DatasetOptions(path=str(tmp_path / "missing.jsonl")))
    (tmp_path / "t.csv").write_text("a,b\n")
    with pytest.raises(DataError, match="expected .jsonl or .parquet"):
        TaskSet(DatasetOptions(path=str(tmp_path / "t.csv")))
    (tmp_path / "t.jsonl").write_bytes(b'{"prompt": "ok", "answer": "1"}\n{"prompt": "\xff"}\n')
    with pytest.raises(DataError, match=r"^t\.jsonl:2: not UTF-8"):
        TaskSet(DatasetOptions(path=str(tmp_path / "t.jsonl")))
    write_jsonl(tmp_path / "u.jsonl", [{"prompt": "a", "answer": 1}, {"prompt": "b", "answer": "two"}])
    with pytest.raises(DataError, match=r'^u\.jsonl:2: field "answer" is a string here but a number at u\.jsonl:1$'):
        TaskSet(DatasetOptions(path=str(tmp_path / "u.jsonl")))


def test_bad_sft_rows(tmp_path: Path, tiny_tokenizer: Any) -> None:
    path = write_jsonl(tmp_path / "sft.jsonl", [{"messages": [{"role": "user", "content": "hi"}]}])
    with pytest.raises(DataError, match=r'^sft\.jsonl:1: field "messages" has no assistant message'):
        SftSet(DatasetOptions(path=str(path)), tiny_tokenizer)
    path = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "hi"}])
    with pytest.raises(DataError, match=r'^sft\.jsonl:1: missing field "response"$'):
        SftSet(DatasetOptions(path=str(path)), tiny_tokenizer)
    path = write_jsonl(tmp_path / "sft.jsonl", [{"text": "hi"}])
    with pytest.raises(DataError, match=r'^sft\.jsonl:1: missing field "messages" \(or "prompt" and "response"\)$'):
        SftSet(DatasetOptions(path=str(path)), tiny_tokenizer)
    path = write_jsonl(tmp_path / "sft.jsonl", [{"prompt": "hi " * 50, "response": "ok"}])
    with pytest.raises(DataError, match=r"^sft\.jsonl:1: \d+ tokens, more than max_tokens=20$"):
        SftSet(DatasetOptions(path=str(path)), tiny_tokenizer, max_tokens=20)


# -- tokenized rows -------------------------------------------------------------------
def test_pairs_work_as_is(tmp_path: Path, qwen3_tokenizer: Any) -> None:
    path = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "2+2?", "chosen": "4", "rejected": "5"}])
    pair = PairSet(DatasetOptions(path=str(path)), qwen3_tokenizer).next_batch(1)[0]
    tok = qwen3_tokenizer
    assert tok.decode(pair.prompt_tokens) == "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n"
    assert (tok.decode(pair.chosen_tokens), tok.decode(pair.rejected_tokens)) == ("4<|im_end|>", "5<|im_end|>")


def test_sft_rows_in_both_forms_supervise_assistant_text_only(tmp_path: Path, qwen3_tokenizer: Any) -> None:
    tok = qwen3_tokenizer
    rows = [
        {"q": "2+2?", "a": "4"},
        {
            "conv": [
                {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "Bye"},
                {"role": "assistant", "content": "Ciao"},
            ]
        },
    ]
    path = write_jsonl(tmp_path / "sft.jsonl", rows)
    opts = DatasetOptions(path=str(path), prompt_key="q", response_key="a", messages_key="conv", shuffle=False)
    first, second = SftSet(opts, tok).next_batch(2)
    for row, expected in (
        (first, ["<think>\n\n</think>\n\n4<|im_end|>"]),
        (second, ["Hello<|im_end|>", "<think>\n\n</think>\n\nCiao<|im_end|>"]),
    ):
        assert row.logprobs is None and row.reward is None and not row.is_expert
        spans, run = [], []
        for t, m in zip(row.response_tokens, row.mask()):
            if m:
                run.append(t)
            elif run:
                spans, run = spans + [tok.decode(run)], []
        assert spans + ([tok.decode(run)] if run else []) == expected


def test_expert_set_cycles_and_marks_rows(tmp_path: Path, tiny_tokenizer: Any) -> None:
    path = write_jsonl(tmp_path / "expert.jsonl", [{"prompt": f"q{i}", "response": f"a{i}"} for i in range(4)])
    expert = ExpertSet(DatasetOptions(path=str(path), epochs=1), tiny_tokenizer)
    assert isinstance(expert, ExpertSource)
    batch = expert.next_batch(10)
    assert len(batch) == 10 and all(r.is_expert for r in batch)
    assert sorted(r.task_id for r in batch[:4]) == sorted(r.task_id for r in batch[4:8])
