"""The checks of a recipe's data beyond its paths: the first rows of every data file, read the way
the run will read them, and what the dry-run plan shows of each data source.

Why the first rows here, when a stage reads every row anyway: ``validate`` and ``--dry-run``
answer in a second, and a field name that does not match the file (``prompt_key`` left at
``prompt`` for a GSM8K file whose prompt is ``question``) shows on its first row. A row the run
would refuse is refused here with the same words, plus the key that maps the field and the
fields the row has::

    recipe.yaml:9: buffer.eval_tasks: gsm_heldout.jsonl:1: missing field "prompt"; set
    buffer.eval_tasks.prompt_key to the field that holds it (this row's fields: "question", "answer")

(one line). The run itself adds the same hint to an error on a later row (:func:`with_hint`).

One setting for both data sources: a held-out source without its own ``system_prompt`` takes
its training source's (``eval_tasks`` from ``tasks``, ``eval_data`` from ``train_data``;
:func:`system_prompt_of`), so a model is evaluated on the prompts it was trained on; one set
on both that differ is said in the plan.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from trinity_like.buffer.datasets import DatasetOptions, pair_check, sft_messages, task_check, task_from_row
from trinity_like.buffer.records import FieldError, RowCheck, first_records, prompt_field, prompt_messages
from trinity_like.buffer.task_sources import task_source
from trinity_like.components import AlgorithmType
from trinity_like.config.loader import Locator
from trinity_like.config.schema import BufferConfig, Config, DatasetConfig
from trinity_like.errors import DataError, TrinityError
from trinity_like.registry import REWARD_FN

FIRST_ROWS = 20  # rows of each data file `validate` reads
TRAIN_SOURCE = {"eval_tasks": "tasks", "eval_data": "train_data"}  # a held-out source -> the one it inherits from
_OPTION_FIELDS = {f.name for f in fields(DatasetOptions)}
_KEYS = ("prompt_key", "answer_key", "response_key", "messages_key", "chosen_key", "rejected_key")


def system_prompt_of(buf: BufferConfig, key: str) -> str | None:
    """``buffer.<key>.system_prompt``, or, unset on a held-out source, its training source's."""
    ds = getattr(buf, key)
    own = ds.system_prompt if ds is not None else None
    train = getattr(buf, TRAIN_SOURCE.get(key, key))
    return own if own is not None or train is None else train.system_prompt


def dataset_options(ds: DatasetConfig, *, epochs: int | None, system_prompt: str | None = None) -> DatasetOptions:
    """The data set options of ``ds``; ``system_prompt``: the one in effect when ``ds`` sets none
    (its training source's, :func:`system_prompt_of`)."""
    values = {k: getattr(ds, k) for k in _OPTION_FIELDS if hasattr(ds, k) and k not in ("path", "epochs")}
    values["system_prompt"] = ds.system_prompt if ds.system_prompt is not None else system_prompt
    return DatasetOptions(path=ds.path or "", epochs=epochs, **values)


def kind_of(key: str, ds: DatasetConfig, algo: AlgorithmType) -> str:
    """What ``buffer.<key>`` holds: "tasks", "pairs" or "sft" rows."""
    if key in ("tasks", "eval_tasks") or ds.pairs_from_samples:
        return "tasks"
    if key == "expert_data":
        return "sft"
    return "pairs" if algo.schema == "pair" else "sft"


def _row_check(kind: str, o: DatasetOptions) -> RowCheck:
    if kind == "tasks":
        return task_check(o)
    if kind == "pairs":
        return pair_check(o)
    return lambda record, where: sft_messages(record, where, o)


def with_hint(exc: DataError, key: str, options: DatasetOptions) -> str:
    """``exc``'s line, plus the ``buffer.<key>.<x>_key`` that names the field it is about and the
    fields the row has (a row's fields are the quickest way to see a key that does not match)."""
    text = str(exc)
    if not isinstance(exc, FieldError):
        return text
    have = ", ".join(f'"{k}"' for k in exc.fields) or "none"
    option = next((k for k in _KEYS if getattr(options, k) == exc.key), None)
    if option is None:
        return f"{text} (this row's fields: {have})"
    if "missing field" in text:
        return f"{text}; set buffer.{key}.{option} to the field that holds it (this row's fields: {have})"
    return f"{text} (buffer.{key}.{option} names it; this row's fields: {have})"


def check_data(cfg: Config, algo: AlgorithmType, loc: Locator) -> None:
    """Every check of this module, in the order a user would fix them."""
    check_data_rows(cfg, algo, loc)
    check_eval_cadence(cfg, loc)


def check_data_rows(cfg: Config, algo: AlgorithmType, loc: Locator) -> None:
    """The first :data:`FIRST_ROWS` rows of each data file of each data source, checked as the run
    checks every row; the first bad one is a ConfigError at ``buffer.<key>`` (see the module doc)."""
    for key in ("tasks", "eval_tasks", "train_data", "eval_data", "expert_data"):
        ds = getattr(cfg.buffer, key)
        if ds is None or ds.path is None:
            continue
        options = dataset_options(ds, epochs=1, system_prompt=system_prompt_of(cfg.buffer, key))
        check = _row_check(kind_of(key, ds, algo), options)
        try:
            for where, record in first_records(ds.path, FIRST_ROWS):
                check(record, where)
        except DataError as exc:
            raise loc.error(("buffer", key), with_hint(exc, key, options)) from None


def check_eval_cadence(cfg: Config, loc: Locator) -> None:
    """``monitor.eval_interval: 0`` means never (as the client loop's ``eval_every=0``): the held-out
    tasks are not loaded, so nothing that reads them may be asked for."""
    if cfg.monitor.eval_interval == 0 and cfg.monitor.rm_check_tasks and cfg.buffer.eval_tasks is not None:
        raise loc.error(
            ("monitor", "eval_interval"),
            "0 means never evaluate (leave it unset for the start and the end only), but "
            "monitor.rm_check_tasks reads the held-out tasks",
        )


# -- what the plan shows ------------------------------------------------------------
def _first_task(cfg: Config, key: str) -> Any:
    """The first task of a generated source (asked for one)."""
    ds: DatasetConfig = getattr(cfg.buffer, key)
    source, params = task_source(ds.generator or "", ds.generator_args, f"buffer.{key}")
    tasks = source(split=ds.split, size=1, seed=ds.seed, system_prompt=system_prompt_of(cfg.buffer, key), params=params)
    return next(iter(tasks), None)


def _messages_text(messages: list[Mapping[str, Any]]) -> list[str]:
    return [f"      [{m['role']}] {m['content']!r}" for m in messages]


def reference_text(reward_fn: str, answer: str) -> str:
    """``answer`` and, when the reward fn says how it reads a reference (``reference_of``), what it
    compares a response with: ``'...#### 12' -> '12'``."""
    reads = getattr(REWARD_FN.get(reward_fn), "reference_of", None)
    if reads is None:
        return repr(answer)
    return f"{answer!r} -> {reward_fn} compares with {reads(answer)!r}"


def describe_data(cfg: Config, algo: AlgorithmType) -> list[str]:
    """Plan lines for each data source: its field mapping and its first row as the model sees it
    (system prompt included), with the reference the reward compares for a task."""
    lines: list[str] = []
    e = cfg.explorer
    for key in ("tasks", "eval_tasks", "train_data", "eval_data", "expert_data"):
        ds = getattr(cfg.buffer, key)
        if ds is None:
            continue
        kind = kind_of(key, ds, algo)
        reward = (e.eval_reward_fn or e.reward_fn) if key == "eval_tasks" else e.reward_fn
        system = system_prompt_of(cfg.buffer, key)
        inherited = ds.system_prompt is None and system is not None
        args = f" {ds.generator_args}" if ds.generator_args else ""
        src = ds.path or f"generator {ds.generator}{args} split={ds.split}"
        lines.append(f"  {key}: {src}" + (f" size={ds.size}" if ds.size else "") + f"  ({kind})")
        if ds.path:
            mapping = {
                "tasks": ("prompt_key", "answer_key"),
                "pairs": ("prompt_key", "chosen_key", "rejected_key"),
                "sft": ("messages_key", "prompt_key", "response_key"),
            }[kind]
            lines.append("    fields: " + ", ".join(f"{k}={getattr(ds, k)!r}" for k in mapping))
        if inherited:
            lines.append(f"    system_prompt: from buffer.{TRAIN_SOURCE[key]}")
        other = getattr(cfg.buffer, TRAIN_SOURCE.get(key, key))
        both = other is not ds and other is not None and None not in (ds.system_prompt, other.system_prompt)
        if both and ds.system_prompt != other.system_prompt:
            lines.append(f"    warning: system_prompt differs from buffer.{TRAIN_SOURCE[key]}'s")
        try:
            lines += _first_row_lines(cfg, key, kind, reward)
        except TrinityError as exc:  # validate has checked the rows; a source's own complaint shows here
            lines.append(f"    first row: cannot be shown ({exc})")
    return lines


def _first_row_lines(cfg: Config, key: str, kind: str, reward: str) -> list[str]:
    ds: DatasetConfig = getattr(cfg.buffer, key)
    if ds.path is None:
        task = _first_task(cfg, key)
        if task is None:
            return ["    first row: (the source gave no task)"]
        return [
            "    first prompt:",
            *_messages_text(task.messages()),
            f"    answer: {reference_text(reward, task.answer)}",
        ]
    options = dataset_options(ds, epochs=1, system_prompt=system_prompt_of(cfg.buffer, key))
    where, record = next(first_records(ds.path, 1))
    if kind == "tasks":
        task = task_from_row(record, where, options)
        return [
            f"    first prompt ({where}):",
            *_messages_text(task.messages()),
            f"    answer: {reference_text(reward, task.answer)}",
        ]
    if kind == "pairs":
        prompt = prompt_messages(prompt_field(record, options.prompt_key, where), options.system_prompt)
        return [
            f"    first prompt ({where}):",
            *_messages_text(prompt),
            f"    chosen: {record[options.chosen_key]!r}",
            f"    rejected: {record[options.rejected_key]!r}",
        ]
    return [f"    first conversation ({where}):", *_messages_text(sft_messages(record, where, options))]
