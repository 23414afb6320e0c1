"""Task, SFT, preference-pair and expert data sets from local JSONL / parquet files.

Why validate before anything else: a run that dies at step 300 on line 17 of a data file
wastes the 299 steps before it. Every row is checked when the set is built -- valid JSON,
required fields present (``null`` counts as missing), right types, the same type on every
row -- and the first bad one is a :class:`DataError` naming the file and line
(``pairs.jsonl:17: missing field "rejected"``; parquet rows are named ``file:row 16``,
counted from 0). Blank lines are skipped; a set with no rows is an error. Loading writes
nothing to the run directory, so a recipe with bad data fails before a run starts.

What else is rejected, not trained on silently: an empty or blank text where text is the
point of the row (a prompt, a task's answer, an SFT response, a chosen or rejected
response; a chat prompt whose messages are all blank), a NaN or infinite number (the
``NaN`` / ``Infinity`` literals Python's ``json`` accepts but JSON does not), and a key
written twice in one object (``json`` keeps the last one without a word). A UTF-8 byte
order mark at the start of a file is accepted, as are CRLF line ends.

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

import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, TypeVar

import datasets
import numpy as np
import pyarrow.parquet as pq

from trinity_like.errors import DataError
from trinity_like.experience import Experience, PairExperience, Task
from trinity_like.models.chat import end_of_turn_id, tokenize_chat, tokenize_response
from trinity_like.models.chat import render_prompt as tokenize_prompt

T = TypeVar("T")
RowCheck = Callable[[Mapping[str, Any], str], None]  # (record, "file:line") -> None or DataError
_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


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


# -- files and rows ---------------------------------------------------------------
def data_files(path: str | Path) -> tuple[str, list[Path]]:
    """The ``datasets`` builder name and the data files of ``path`` (a file or a folder)."""
    root = Path(path).expanduser()
    if not str(path) or not root.exists():
        raise DataError(f"{path or '(no path)'}: no such data file or folder")
    files = sorted(p for p in root.rglob("*") if p.suffix in _FORMATS) if root.is_dir() else [root]
    formats = {_FORMATS.get(p.suffix) for p in files}
    if not files or None in formats:
        raise DataError(f"{path}: expected .jsonl or .parquet data files")
    special = next((p for p in files if not p.is_file()), None)  # a FIFO would block the read for ever
    if special is not None:
        raise DataError(f"{special}: not a regular file (a FIFO, device or socket); data is read from files")
    if len(formats) > 1:
        raise DataError(f"{path}: mixes JSONL and parquet files; keep one format per folder")
    return formats.pop(), files


def _name(file: Path, root: Path) -> str:
    return str(file.relative_to(root)) if root.is_dir() else file.name


def _strict_json(text: str, where: str) -> Any:
    """``json.loads`` without what JSON does not allow: NaN / Infinity, a key twice in one object."""

    def no_constant(name: str) -> Any:
        raise DataError(f"{where}: invalid JSON ({name} is not a JSON number)")

    def unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                raise DataError(f'{where}: duplicate key "{key}" in one JSON object')
            out[key] = value
        return out

    return json.loads(text, parse_constant=no_constant, object_pairs_hook=unique_keys)


def _jsonl_records(file: Path, name: str) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, record)`` of each non-blank line; invalid JSON or a non-object is a DataError."""
    with open(file, "rb") as f:
        for lineno, raw in enumerate(f, start=1):
            where = f"{name}:{lineno}"
            if lineno == 1 and raw.startswith(b"\xef\xbb\xbf"):  # a byte order mark (Windows editors write one)
                raw = raw[3:]
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise DataError(f"{where}: not UTF-8 text ({exc.reason})") from None
            if not text.strip():
                continue
            try:
                record = _strict_json(text, where)
            except json.JSONDecodeError as exc:
                raise DataError(f"{where}: invalid JSON ({exc.msg} at column {exc.colno})") from None
            if not isinstance(record, dict):
                raise DataError(f"{where}: expected a JSON object, got {type(record).__name__}")
            yield where, record


def _parquet_origins(files: Sequence[Path], root: Path) -> list[str]:
    return [f"{_name(f, root)}:row {i}" for f in files for i in range(pq.ParquetFile(f).metadata.num_rows)]


def load_records(options: DatasetOptions, check: RowCheck) -> tuple[datasets.Dataset, list[str]]:
    """Validate every row with ``check(record, where)``, then load the files with ``datasets``.

    Returns the data set and, for each of its rows, where it came from (``file:line``).
    JSONL is validated line by line before ``datasets`` reads it, so errors name lines.
    """
    fmt, files = data_files(options.path)
    root = Path(options.path).expanduser()
    if fmt == "json":
        origins = []
        for file in files:
            for where, record in _jsonl_records(file, _name(file, root)):
                check(record, where)
                origins.append(where)
    else:
        origins = _parquet_origins(files, root)
    if not origins:
        raise DataError(f"{options.path}: the data set is empty")
    try:
        ds = datasets.load_dataset(fmt, data_files=[str(f) for f in files], split="train")
    except datasets.exceptions.DatasetGenerationError as exc:
        raise DataError(f"{options.path}: cannot be read as a table ({exc.__cause__ or exc})") from None
    if fmt == "parquet":
        for record, where in zip(ds, origins):
            check(record, where)
    return ds, origins


# -- field checks -------------------------------------------------------------------
def _json_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    return f"a {type(value).__name__}"


def field(record: Mapping[str, Any], key: str, where: str, allowed: Sequence[str]) -> Any:
    """``record[key]``, which must be present, non-null and of one of the ``allowed`` kinds."""
    value = record.get(key)
    if value is None:
        raise DataError(f'{where}: missing field "{key}"')
    kind = _json_kind(value)
    if kind not in allowed:
        raise DataError(f'{where}: field "{key}" must be {" or ".join(allowed)}, got {kind}')
    if kind == "a number" and not math.isfinite(value):  # parquet floats; JSONL rejects the literals earlier
        raise DataError(f'{where}: field "{key}" is {value}, not a finite number')
    return value


def text_field(record: Mapping[str, Any], key: str, where: str, allowed: Sequence[str] = ("a string",)) -> Any:
    """:func:`field`, and a string must hold more than whitespace (an empty prompt trains on nothing)."""
    value = field(record, key, where, allowed)
    if isinstance(value, str) and not value.strip():
        raise DataError(f'{where}: field "{key}" is empty')
    return value


def messages_field(record: Mapping[str, Any], key: str, where: str) -> list[dict[str, str]]:
    """A chat: a non-empty list of ``{"role": str, "content": str}`` objects."""
    value = field(record, key, where, ["a list"])
    if not value:
        raise DataError(f'{where}: field "{key}" has no messages')
    for i, m in enumerate(value):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise DataError(f'{where}: field "{key}" message {i} must have a string "role" and "content"')
    return [{k: v for k, v in m.items() if v is not None} for m in value]


class _Checker:
    """Checks rows one by one, and that each field keeps the kind it had on the first row.

    (A column that is text on line 1 and a number on line 40 would otherwise fail inside
    the table reader with a message that names no line.)
    """

    def __init__(self, fields: Mapping[str, Sequence[str]]) -> None:
        self.fields = fields  # key -> allowed kinds; keys absent from a row are skipped here
        self.first: dict[str, tuple[str, str]] = {}  # key -> (kind, where first seen)

    def same_kind(self, record: Mapping[str, Any], where: str) -> None:
        for key, allowed in self.fields.items():
            if record.get(key) is None:
                continue
            kind = _json_kind(field(record, key, where, allowed))
            seen = self.first.setdefault(key, (kind, where))
            if seen[0] != kind:
                raise DataError(f'{where}: field "{key}" is {kind} here but {seen[0]} at {seen[1]}')


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


def _prompt_messages(prompt: str | list[dict[str, str]], system_prompt: str | None) -> list[dict[str, str]]:
    if isinstance(prompt, list):
        return prompt
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return system + [{"role": "user", "content": prompt}]


def _prompt(record: Mapping[str, Any], key: str, where: str) -> str | list[dict[str, str]]:
    value = text_field(record, key, where, ["a string", "a list"])
    if isinstance(value, str):
        return value
    messages = messages_field(record, key, where)
    if not any(m["content"].strip() for m in messages):
        raise DataError(f'{where}: field "{key}" is empty (every message is blank)')
    return messages


# -- the data sets ------------------------------------------------------------------
class TaskSet(RowSet[Task]):
    """Tasks for the explorer: a prompt (text or chat) and a reference answer per row.

    Fields other than the prompt and the answer are kept in ``Task.info`` (a reward
    function may need them); ``task_id`` is where the row came from (``file:line``).
    """

    def __init__(self, options: DatasetOptions) -> None:
        o = options
        checker = _Checker({o.prompt_key: ["a string", "a list"], o.answer_key: ["a string", "a number"]})

        def check(record: Mapping[str, Any], where: str) -> None:
            _prompt(record, o.prompt_key, where)
            text_field(record, o.answer_key, where, ["a string", "a number"])
            checker.same_kind(record, where)

        ds, origins = load_records(options, check)
        rows = [_task(r, where, o) for r, where in zip(ds, origins)]
        super().__init__(rows, options, epochs=options.epochs)


def _task(record: Mapping[str, Any], where: str, o: DatasetOptions) -> Task:
    info = {k: v for k, v in record.items() if k not in (o.prompt_key, o.answer_key)}
    return Task(
        prompt=_prompt(record, o.prompt_key, where),
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
        o = self.options = options  # _messages reads it while the rows are checked
        checker = _Checker({o.prompt_key: ["a string", "a list"], o.response_key: ["a string"]})

        def check(record: Mapping[str, Any], where: str) -> None:
            self._messages(record, where)
            checker.same_kind(record, where)

        ds, origins = load_records(options, check)
        rows = [
            self._tokenize(self._messages(r, where), where, tokenizer, max_tokens, template_kwargs)
            for r, where in zip(ds, origins)
        ]
        super().__init__(rows, options, epochs=self._epochs(options))

    @staticmethod
    def _epochs(options: DatasetOptions) -> int | None:
        return options.epochs

    def _messages(self, record: Mapping[str, Any], where: str) -> list[dict[str, str]]:
        """The row as a conversation ending in assistant turns (chat form or prompt/response)."""
        o = self.options
        if record.get(o.messages_key) is not None:
            msgs = messages_field(record, o.messages_key, where)
            if not any(m["role"] == "assistant" for m in msgs):
                raise DataError(f'{where}: field "{o.messages_key}" has no assistant message to train on')
            if not any(m["content"].strip() for m in msgs if m["role"] == "assistant"):
                raise DataError(f'{where}: field "{o.messages_key}": every assistant message is empty')
            return msgs
        if record.get(o.prompt_key) is None:
            raise DataError(f'{where}: missing field "{o.messages_key}" (or "{o.prompt_key}" and "{o.response_key}")')
        prompt = _prompt_messages(_prompt(record, o.prompt_key, where), o.system_prompt)
        response = text_field(record, o.response_key, where)
        return prompt + [{"role": "assistant", "content": response}]

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
        keys = (o.chosen_key, o.rejected_key)
        checker = _Checker({o.prompt_key: ["a string", "a list"], **{k: ["a string"] for k in keys}})

        def check(record: Mapping[str, Any], where: str) -> None:
            _prompt(record, o.prompt_key, where)
            for key in keys:
                text_field(record, key, where)
            checker.same_kind(record, where)

        ds, origins = load_records(options, check)
        end_id = end_of_turn_id(tokenizer, template_kwargs)
        rows = []
        for record, where in zip(ds, origins):
            prompt = _prompt_messages(_prompt(record, o.prompt_key, where), o.system_prompt)
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
