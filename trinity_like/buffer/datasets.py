"""Task, SFT, preference-pair and expert data sets from local JSONL / parquet files.

Every row is checked when a set is built, and the first bad one is an error naming its
file and line (:mod:`.records`: what is checked, and why before anything else runs).

Field names of the file map to ours through :class:`DatasetOptions` (``prompt_key``,
``answer_key``, ...). The preference shape ``{"prompt", "chosen", "rejected"}`` and the
chat shape ``{"messages": [{"role", "content"}, ...]}`` work as they are.

Order is reproducible and resumable: each epoch is a permutation drawn from
``(seed, epoch)``, and ``state_dict()`` is the position in it, so a resumed run continues
with exactly the rows the interrupted one would have seen next::

    tasks = TaskSet(DatasetOptions(path="data/train.jsonl", answer_key="solution", seed=1))
    batch = tasks.next_batch(8)          # list[Task]
    state = tasks.state_dict()           # saved with the checkpoint
    tasks.load_state_dict(state)         # in the resumed run: same next rows
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from trinity_like.buffer.records import (
    FieldError,
    RowCheck,
    SameKind,
    load_records,
    messages_field,
    prompt_field,
    prompt_messages,
    text_field,
)
from trinity_like.errors import DataError
from trinity_like.experience import Experience, PairExperience, Task
from trinity_like.models.chat import end_of_turn_id, tokenize_chat, tokenize_response
from trinity_like.models.chat import render_prompt as tokenize_prompt

T = TypeVar("T")


@dataclass(frozen=True)
class DatasetOptions:
    """Where a data set lives, how its fields map to ours, and in which order it is read."""

    path: str = ""  # JSONL / parquet file, or a folder of them (one format per folder)
    prompt_key: str = "prompt"  # prompt: text, or chat messages [{"role", "content"}, ...]
    answer_key: str = "answer"  # reference answer of a task (text or number)
    response_key: str = "response"  # response text of an SFT row in prompt/response form
    messages_key: str = "messages"  # conversation of an SFT / expert row in chat form
    chosen_key: str = "chosen"  # preferred response text of a pair
    rejected_key: str = "rejected"  # dispreferred response text of a pair
    system_prompt: str | None = None  # system message put before text prompts
    shuffle: bool = True  # a new permutation each epoch, drawn from (seed, epoch)
    seed: int = 0  # shuffling seed
    epochs: int | None = 1  # passes before the set is exhausted; None cycles forever


# -- reading order ------------------------------------------------------------------
class EpochOrder:
    """Positions in a data set of ``n`` rows over epochs: shuffled per (seed, epoch), resumable."""

    def __init__(self, n: int, *, shuffle: bool, seed: int, epochs: int | None) -> None:
        if epochs is not None and epochs < 1:
            raise ValueError(f"epochs must be at least 1 (or None to cycle), got {epochs}")
        self.n, self.shuffle, self.seed, self.epochs = n, shuffle, seed, epochs
        self.epoch, self.index = 0, 0
        self._perm = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.n)
        return np.random.default_rng([self.seed, epoch]).permutation(self.n)

    @property
    def exhausted(self) -> bool:
        return self.epochs is not None and self.epoch >= self.epochs

    def take(self, k: int) -> list[int]:
        """The next ``k`` row indices (fewer when the last epoch ends)."""
        out: list[int] = []
        while len(out) < k and not self.exhausted:
            step = min(k - len(out), self.n - self.index)
            out.extend(int(i) for i in self._perm[self.index : self.index + step])
            self.index += step
            if self.index == self.n:
                self.epoch, self.index = self.epoch + 1, 0
                self._perm = self._permutation(self.epoch)
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"epoch": self.epoch, "index": self.index, "n": self.n, "seed": self.seed, "shuffle": self.shuffle}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        mine = (self.n, self.seed, self.shuffle)
        theirs = (state["n"], state["seed"], state["shuffle"])
        if mine != theirs:
            raise DataError(
                f"cannot resume the data order: saved (rows, seed, shuffle) = {theirs}, this data set {mine}"
            )
        self.epoch, self.index = int(state["epoch"]), int(state["index"])
        self._perm = self._permutation(self.epoch)


class RowSet(Generic[T]):
    """Converted rows read in :class:`EpochOrder`: the common part of every set below."""

    def __init__(self, rows: list[T], options: DatasetOptions, *, epochs: int | None) -> None:
        self.rows = rows
        self.options = options
        self.order = EpochOrder(len(rows), shuffle=options.shuffle, seed=options.seed, epochs=epochs)

    def __len__(self) -> int:
        return len(self.rows)

    @property
    def exhausted(self) -> bool:
        return self.order.exhausted

    def next_batch(self, n: int) -> list[T]:
        """The next ``n`` rows (fewer, or none, once the last epoch is done)."""
        return [self.rows[i] for i in self.order.take(n)]

    def __iter__(self) -> Iterator[T]:
        """Rows from the current position to the end of the last epoch."""
        while not self.order.exhausted:
            yield from self.next_batch(1)

    def state_dict(self) -> dict[str, Any]:
        return self.order.state_dict()

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.order.load_state_dict(state)


# -- the data sets ------------------------------------------------------------------
def task_check(o: DatasetOptions) -> RowCheck:
    """What a task row must hold: a prompt (text or chat) and an answer (text or number), each of
    one kind on every row."""
    checker = SameKind({o.prompt_key: ["a string", "a list"], o.answer_key: ["a string", "a number"]})

    def check(record: Mapping[str, Any], where: str) -> None:
        prompt_field(record, o.prompt_key, where)
        text_field(record, o.answer_key, where, ["a string", "a number"])
        checker.same_kind(record, where)

    return check


class TaskSet(RowSet[Task]):
    """Tasks for the explorer: a prompt (text or chat) and a reference answer per row.

    Fields other than the prompt and the answer are kept in ``Task.info`` (a reward
    function may need them); ``task_id`` is where the row came from (``file:line``).
    """

    def __init__(self, options: DatasetOptions) -> None:
        ds, origins = load_records(options.path, task_check(options))
        rows = [task_from_row(r, where, options) for r, where in zip(ds, origins)]
        super().__init__(rows, options, epochs=options.epochs)


def load_tasks(
    path: str,
    *,
    prompt_key: str = "prompt",
    answer_key: str = "answer",
    system_prompt: str | None = None,
    size: int | None = None,
) -> list[Task]:
    """The tasks of a JSONL / parquet file, a folder of them or a ``save_to_disk`` folder, in file
    order: what a recipe's ``buffer.tasks`` with the same keys reads, checked the same way (a bad
    row is a DataError naming its file and line). ``size``: the first ``size`` rows only::

        train = load_tasks("examples/data/gsm8k_style_train.jsonl", prompt_key="question")
        train[0].messages()   # [{"role": "user", "content": "..."}], the answer in train[0].answer
    """
    options = DatasetOptions(
        path=path, prompt_key=prompt_key, answer_key=answer_key, system_prompt=system_prompt, shuffle=False
    )
    return TaskSet(options).rows[:size]


def task_from_row(record: Mapping[str, Any], where: str, o: DatasetOptions) -> Task:
    info = {k: v for k, v in record.items() if k not in (o.prompt_key, o.answer_key)}
    return Task(
        prompt=prompt_field(record, o.prompt_key, where),
        answer=str(record[o.answer_key]),
        task_id=where,
        system_prompt=o.system_prompt,
        info=info,
    )


class SftSet(RowSet[Experience]):
    """Supervised rows, tokenized with the model's chat template; only assistant tokens are trained.

    A row is a conversation (``messages_key``: every assistant turn is supervised) or a
    prompt/response pair (``prompt_key`` text or chat, ``response_key`` text). Rows become
    :class:`Experience` objects with an ``action_mask`` and no logprobs or reward.
    ``max_tokens``: a longer row is an error naming its line (never silently cut).
    """

    is_expert = False

    def __init__(
        self,
        options: DatasetOptions,
        tokenizer: Any,
        *,
        max_tokens: int | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        self.options = options
        check = sft_check(options)
        ds, origins = load_records(options.path, check)
        rows = [
            self._tokenize(self._messages(r, where), where, tokenizer, max_tokens, template_kwargs)
            for r, where in zip(ds, origins)
        ]
        super().__init__(rows, options, epochs=self._epochs(options))

    @staticmethod
    def _epochs(options: DatasetOptions) -> int | None:
        return options.epochs

    def _messages(self, record: Mapping[str, Any], where: str) -> list[dict[str, str]]:
        return sft_messages(record, where, self.options)

    def _tokenize(
        self,
        messages: list[dict[str, str]],
        where: str,
        tokenizer: Any,
        max_tokens: int | None,
        template_kwargs: Mapping[str, Any] | None,
    ) -> Experience:
        try:
            tokens, prompt_length, mask = tokenize_chat(tokenizer, messages, template_kwargs=template_kwargs)
        except ValueError as exc:
            raise DataError(f"{where}: {exc}") from None
        if max_tokens is not None and len(tokens) > max_tokens:
            raise DataError(f"{where}: {len(tokens)} tokens, more than max_tokens={max_tokens}")
        return Experience(
            tokens=tokens, prompt_length=prompt_length, action_mask=mask, task_id=where, is_expert=self.is_expert
        )


def sft_messages(record: Mapping[str, Any], where: str, o: DatasetOptions) -> list[dict[str, str]]:
    """An SFT row as a conversation ending in assistant turns (chat form or prompt/response)."""
    if record.get(o.messages_key) is not None:
        msgs = messages_field(record, o.messages_key, where)
        if not any(m["role"] == "assistant" for m in msgs):
            raise DataError(f'{where}: field "{o.messages_key}" has no assistant message to train on')
        if not any(m["content"].strip() for m in msgs if m["role"] == "assistant"):
            raise DataError(f'{where}: field "{o.messages_key}": every assistant message is empty')
        return msgs
    if record.get(o.prompt_key) is None:
        raise FieldError(
            f'{where}: missing field "{o.messages_key}" (or "{o.prompt_key}" and "{o.response_key}")',
            o.prompt_key,
            list(record),
        )
    prompt = prompt_messages(prompt_field(record, o.prompt_key, where), o.system_prompt)
    response = text_field(record, o.response_key, where)
    return prompt + [{"role": "assistant", "content": response}]


def sft_check(o: DatasetOptions) -> RowCheck:
    """What an SFT row must hold: a conversation, or a prompt and a response (each of one kind)."""
    checker = SameKind({o.prompt_key: ["a string", "a list"], o.response_key: ["a string"]})

    def check(record: Mapping[str, Any], where: str) -> None:
        sft_messages(record, where, o)
        checker.same_kind(record, where)

    return check


class ExpertSet(SftSet):
    """Expert SFT rows mixed into RL batches (MIX): ``is_expert=True``, cycling through epochs."""

    is_expert = True

    @staticmethod
    def _epochs(options: DatasetOptions) -> int | None:
        return None  # an RL run asks for expert rows as long as it trains


class PairSet(RowSet[PairExperience]):
    """Preference pairs (DPO, reward models): a prompt, a chosen and a rejected response.

    The prompt goes through the chat template with the generation prompt; each response
    is its text's tokens followed by the end-of-turn token (``<|im_end|>`` in ChatML).
    """

    def __init__(
        self,
        options: DatasetOptions,
        tokenizer: Any,
        *,
        max_tokens: int | None = None,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> None:
        o = options
        check = pair_check(options)
        ds, origins = load_records(options.path, check)
        end_id = end_of_turn_id(tokenizer, template_kwargs)
        rows = []
        for record, where in zip(ds, origins):
            prompt = prompt_messages(prompt_field(record, o.prompt_key, where), o.system_prompt)
            pair = PairExperience(
                prompt_tokens=tokenize_prompt(tokenizer, prompt, template_kwargs=template_kwargs),
                chosen_tokens=tokenize_response(tokenizer, record[o.chosen_key], end_id),
                rejected_tokens=tokenize_response(tokenizer, record[o.rejected_key], end_id),
                task_id=where,
            )
            longest = len(pair.prompt_tokens) + max(len(pair.chosen_tokens), len(pair.rejected_tokens))
            if max_tokens is not None and longest > max_tokens:
                raise DataError(f"{where}: {longest} tokens, more than max_tokens={max_tokens}")
            rows.append(pair)
        super().__init__(rows, options, epochs=options.epochs)


def pair_check(o: DatasetOptions) -> RowCheck:
    """What a pair row must hold: a prompt (text or chat), a chosen and a rejected response text."""
    keys = (o.chosen_key, o.rejected_key)
    checker = SameKind({o.prompt_key: ["a string", "a list"], **{k: ["a string"] for k in keys}})

    def check(record: Mapping[str, Any], where: str) -> None:
        prompt_field(record, o.prompt_key, where)
        for key in keys:
            text_field(record, key, where)
        checker.same_kind(record, where)

    return check
