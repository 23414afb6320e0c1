"""Rows of local JSONL / parquet files, each checked before anything uses it.

Why validate before anything else: a run that dies at step 300 on line 17 of a data file
wastes the 299 steps before it. Every row is checked when a data set is built
(:mod:`.datasets`) -- valid JSON, required fields present (``null`` counts as missing), right
types, the same type on every row -- and the first bad one is a :class:`DataError` naming
the file and line (``pairs.jsonl:17: missing field "rejected"``; parquet rows are named
``file:row 16``, counted from 0). Blank lines are skipped; a set with no rows is an error.
A folder a ``datasets.Dataset`` was saved to (``save_to_disk``: ``state.json`` beside its
``.arrow`` shards) is read with ``load_from_disk``; its rows are named ``folder:row 16``.
Loading writes nothing to the run directory, so a recipe with bad data fails before a run starts.

What else is rejected, not trained on silently: an empty or blank text where text is the
point of the row (a prompt, a task's answer, an SFT response, a chosen or rejected
response; a chat prompt whose messages are all blank), a NaN or infinite number (the
``NaN`` / ``Infinity`` literals Python's ``json`` accepts but JSON does not), and a key
written twice in one object (``json`` keeps the last one without a word). A UTF-8 byte
order mark at the start of a file is accepted, as are CRLF line ends::

    def check(record, where):                       # where: "tasks.jsonl:17"
        text_field(record, "prompt", where)
    table, origins = load_records("data/tasks.jsonl", check)   # a datasets.Dataset, "file:line" per row
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity_like.errors import DataError

if TYPE_CHECKING:  # `datasets` and pyarrow load only when a data file is read: generated tasks need neither
    import datasets

RowCheck = Callable[[Mapping[str, Any], str], None]  # (record, "file:line") -> None or DataError
_FORMATS = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}
DISK = "disk"  # the format of a folder written by ``Dataset.save_to_disk``


def _saved_dataset(root: Path) -> bool:
    return root.is_dir() and (root / "state.json").is_file() and (root / "dataset_info.json").is_file()


# -- files and rows ---------------------------------------------------------------
def data_files(path: str | Path) -> tuple[str, list[Path]]:
    """The ``datasets`` builder name and the data files of ``path`` (a file or a folder)."""
    root = Path(path).expanduser()
    if not str(path) or not root.exists():
        raise DataError(f"{path or '(no path)'}: no such data file or folder")
    if _saved_dataset(root):
        return DISK, [root]
    if root.is_dir() and (root / "dataset_dict.json").is_file():
        splits = sorted(p.name for p in root.iterdir() if _saved_dataset(p))
        raise DataError(
            f"{path}: a DatasetDict saved with save_to_disk; point at one split's folder ({', '.join(splits)})"
        )
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
    import pyarrow.parquet as pq

    return [f"{_name(f, root)}:row {i}" for f in files for i in range(pq.ParquetFile(f).metadata.num_rows)]


def _load_from_disk(root: Path) -> datasets.Dataset:
    import datasets

    try:
        ds = datasets.load_from_disk(str(root))
    except (OSError, ValueError, KeyError) as exc:  # a damaged state.json or shard
        raise DataError(f"{root}: cannot be read as a saved dataset ({exc})") from None
    if not isinstance(ds, datasets.Dataset):
        raise DataError(f"{root}: holds a {type(ds).__name__}; point at one split's folder")
    return ds


def first_records(path: str, n: int) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(where, record)`` of the first ``n`` rows of each data file of ``path``, without loading the
    rest (what ``validate`` checks: a run reads every row when its stage starts)."""
    fmt, files = data_files(path)
    root = Path(path).expanduser()
    for file in files:
        if fmt == "json":
            for k, item in enumerate(_jsonl_records(file, _name(file, root))):
                if k == n:
                    break
                yield item
        elif fmt == "parquet":
            import pyarrow.parquet as pq

            table = next(pq.ParquetFile(file).iter_batches(batch_size=n), None)
            for i, record in enumerate(table.to_pylist() if table is not None else []):
                yield f"{_name(file, root)}:row {i}", record
        else:
            ds = _load_from_disk(file)
            for i in range(min(n, len(ds))):
                yield f"{root.name}:row {i}", ds[i]


def load_records(path: str, check: RowCheck) -> tuple[datasets.Dataset, list[str]]:
    """Validate every row with ``check(record, where)``, then load the files with ``datasets``.

    Returns the data set and, for each of its rows, where it came from (``file:line``).
    JSONL is validated line by line before ``datasets`` reads it, so errors name lines.
    """
    import datasets

    fmt, files = data_files(path)
    root = Path(path).expanduser()
    if fmt == DISK:
        ds = _load_from_disk(root)
        origins = [f"{root.name}:row {i}" for i in range(len(ds))]
        if not origins:
            raise DataError(f"{path}: the data set is empty")
        for record, where in zip(ds, origins):
            check(record, where)
        return ds, origins
    if fmt == "json":
        origins = []
        for file in files:
            for where, record in _jsonl_records(file, _name(file, root)):
                check(record, where)
                origins.append(where)
    else:
        origins = _parquet_origins(files, root)
    if not origins:
        raise DataError(f"{path}: the data set is empty")
    try:
        ds = datasets.load_dataset(fmt, data_files=[str(f) for f in files], split="train")
    except datasets.exceptions.DatasetGenerationError as exc:
        raise DataError(f"{path}: cannot be read as a table ({exc.__cause__ or exc})") from None
    if fmt == "parquet":
        for record, where in zip(ds, origins):
            check(record, where)
    return ds, origins


# -- field checks -------------------------------------------------------------------
class FieldError(DataError):
    """A row's field ``key`` is missing or unusable: what ``validate`` turns into the key to set;
    ``fields``: the fields the row has."""

    def __init__(self, message: str, key: str, fields: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.key, self.fields = key, list(fields)


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
        raise FieldError(f'{where}: missing field "{key}"', key, list(record))
    kind = _json_kind(value)
    if kind not in allowed:
        raise FieldError(f'{where}: field "{key}" must be {" or ".join(allowed)}, got {kind}', key, list(record))
    if kind == "a number" and not math.isfinite(value):  # parquet floats; JSONL rejects the literals earlier
        raise DataError(f'{where}: field "{key}" is {value}, not a finite number')
    return value


def text_field(record: Mapping[str, Any], key: str, where: str, allowed: Sequence[str] = ("a string",)) -> Any:
    """:func:`field`, and a string must hold more than whitespace (an empty prompt trains on nothing)."""
    value = field(record, key, where, allowed)
    if isinstance(value, str) and not value.strip():
        raise FieldError(f'{where}: field "{key}" is empty', key, list(record))
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


class SameKind:
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


# -- prompts ---------------------------------------------------------------------
def prompt_messages(prompt: str | list[dict[str, str]], system_prompt: str | None) -> list[dict[str, str]]:
    """A prompt as chat messages: a text prompt becomes one user message, after the system prompt if any."""
    if isinstance(prompt, list):
        return prompt
    system = [{"role": "system", "content": system_prompt}] if system_prompt else []
    return system + [{"role": "user", "content": prompt}]


def prompt_field(record: Mapping[str, Any], key: str, where: str) -> str | list[dict[str, str]]:
    """A prompt: text, or a chat whose messages are not all blank."""
    value = text_field(record, key, where, ["a string", "a list"])
    if isinstance(value, str):
        return value
    messages = messages_field(record, key, where)
    if not any(m["content"].strip() for m in messages):
        raise DataError(f'{where}: field "{key}" is empty (every message is blank)')
    return messages
