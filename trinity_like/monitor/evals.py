"""What the model answered at each held-out evaluation: ``<run_dir>/evals.jsonl``.

``metrics.jsonl`` keeps an evaluation's mean; this file keeps its items, one JSON object
per line, so a person can follow one held-out problem across the run (what did the model
answer at step 0, 10, 20?). ``step`` is the trainer step whose weights answered. Two kinds::

    {"step": 10, "kind": "answer", "task_id": "gsm-3", "prompt": "What is 17 + 5?",
     "messages": [{"role": "system", "content": "..."}, {"role": "user", "content": "What is 17 + 5?"}],
     "answer": "17 + 5 = 22\n#### 22", "reference": "22", "parsed": "22",
     "response": "17 + 5 = 22", "reward": 1.0, "finish_reason": "stop", "length": 9}
    {"step": 10, "kind": "pair", "task_id": "pair-7", "prompt": "...", "chosen": "...", "rejected": "...",
     "metrics": {"reward_chosen": 0.12, "reward_rejected": -0.03, "reward_margin": 0.15, ...}}

An answer's ``messages`` are the whole prompt (system prompt included; ``prompt`` is its last
message's text); ``reference`` and ``parsed`` are what the reward compared, when the reward fn
declares how it reads them (``reference_of`` / ``response_of``; ``exact_match`` does), absent
otherwise and in files written before them.

A pair's ``metrics`` are what the run's pair loss reports for that pair alone (DPO's
implicit rewards and margin, a reward model's margin), and each per-row output of the
model for its two rows (a reward model's ``scores_chosen`` / ``scores_rejected``). Lines are
appended and flushed per evaluation; a torn last line (a killed run) is cut before the next
append and skipped when read, as is any line that is not such an item (with a warning).

A DPO or reward-model stage also appends each *training* pair of each step, in the same
``pair`` format, to ``<run_dir>/trained_pairs.jsonl``: the scores the step's own forward
gave before its update (no extra pass). A resumed run writes its steps again; readers keep
the last writing of each pair of a step.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from trinity_like.errors import TrinityError
from trinity_like.monitor.jsonl import JsonlAppender, Read, needs, read_file_records, read_records

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from trinity_like.experience import Experience, Task

EVALS_FILE = "evals.jsonl"
TRAINED_PAIRS_FILE = "trained_pairs.jsonl"

_STEP = needs({"step": int})
_ITEM = needs({"step": int, "kind": str, "task_id": str, "prompt": str})
_KIND = {
    "answer": needs({"response": str}),
    "pair": needs({"chosen": str, "rejected": str, "metrics": dict}),
}


def check_item(record: dict[str, Any]) -> str | None:
    """Why ``record`` is not an item of the two kinds above (None when it is one)."""
    why = _ITEM(record)
    if why is None and record["kind"] not in _KIND:
        why = f'field "kind" must be "answer" or "pair" (got {json.dumps(record["kind"])[:40]})'
    return why or _KIND[record["kind"]](record)


def append_evals(path: str | os.PathLike, step: int, items: Iterable[dict[str, Any]]) -> None:
    """Append one evaluation's ``items`` (each gets ``"step": step`` first), durably."""
    JsonlAppender(path, fsync=True).append({"step": step, **item} for item in items)


def read_items(path: str | os.PathLike, name: str | None = None) -> Read:
    """The items of ``path`` with the damaged lines it skipped (for a caller that reports them itself)."""
    return read_records(path, check=check_item, name=name)


def read_jsonl(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Every record (with a whole-number ``step``) of an ``evals.jsonl`` / ``trained_pairs.jsonl``; a torn
    last line left by a kill is skipped, and so is a damaged line, with a warning naming its file and line
    (on stderr). The view reads with :func:`read_items`, which also checks each item's shape."""
    return [r for _, r in read_file_records(path, _STEP).records]


def answer_items(
    tasks: list[Task], answered: list[Experience], tokenizer: PreTrainedTokenizerBase, reward: Any = None
) -> list[dict[str, Any]]:
    """The ``evals.jsonl`` items (:mod:`trinity_like.monitor.evals`) of one held-out evaluation:
    the whole prompt (``messages``, system prompt included) and, when the reward fn ``reward``
    declares how it reads them (``reference_of`` / ``response_of``, as ``exact_match`` does), the
    reference and the response's answer it compared.

    Rows find their task by id, so the ids must be distinct (the data sets make them so): a
    repeated one would give every row of it one task's prompt and answer."""
    by_id = {t.task_id: t for t in tasks}
    if len(by_id) != len(tasks):
        twice = next(i for i, n in Counter(t.task_id for t in tasks).items() if n > 1)
        raise TrinityError(f"held-out tasks share the task id {twice!r}: each needs its own to be logged")
    texts = tokenizer.batch_decode([e.response_tokens for e in answered], skip_special_tokens=True)
    reference_of, response_of = getattr(reward, "reference_of", None), getattr(reward, "response_of", None)
    items = []
    for e, text in zip(answered, texts):
        task = by_id[e.task_id]
        item = {
            "kind": "answer",
            "task_id": e.task_id,
            "prompt": task.messages()[-1]["content"],
            "messages": task.messages(),
            "answer": task.answer,
            "response": text,
            "reward": e.reward,
            "finish_reason": e.finish_reason,
            "length": e.response_length,
        }
        if reference_of is not None:
            item["reference"] = reference_of(task.answer)
        if response_of is not None:
            item["parsed"] = response_of(text)
        items.append(item)
    return items
