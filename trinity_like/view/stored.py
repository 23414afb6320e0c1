"""One row of a run's SQLite buffer as the view shows it, decoded without trusting the file.

The buffer is written by the run (:mod:`trinity_like.buffer.sqlite_storage`), but a file
copied from elsewhere, cut short or edited by hand can hold anything: a header that is not
JSON, a column of the wrong type, arrays cut short, a reward that is text. :func:`decode_row`
turns such a row into a reason instead of an exception, so the view skips it and says
which row it skipped and why.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

from trinity_like.buffer.rows import STATUSES, unpack, unpack_floats
from trinity_like.experience import Experience, PairExperience


@dataclass(frozen=True)
class StoredRow:
    """One buffer row as the view shows it."""

    row: Experience | PairExperience
    status: str  # available | claimed | consumed | dropped
    consumed_by: int | None  # the checkpoint step that consumed it
    trained_at: int | None  # the step that trained on it, where the trainer recorded it
    trained: dict[
        str, list[float]
    ]  # what that step computed per token (rows.TrainedRecord): advantages, trainer_logprob


def _is_int(x: Any) -> bool:
    return type(x) is int


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _tokens(name: str, ids: Any) -> str | None:
    if not isinstance(ids, list) or not all(_is_int(t) and t >= 0 for t in ids):
        return f"{name} must be a list of token ids (whole numbers >= 0)"
    return None


def _floats(name: str, values: Any) -> str | None:
    if values is not None and not (isinstance(values, list) and all(_is_number(v) for v in values)):
        return f"{name} must be a list of numbers"
    return None


def _strings(row: Any, *names: str) -> str | None:
    bad = next((n for n in names if not isinstance(getattr(row, n), str)), None)
    return None if bad is None else f"{bad} must be a string"


def _why_not(row: Experience | PairExperience) -> str | None:
    """What makes a decoded row unfit to show, or None."""
    if not isinstance(row.info, dict):
        return "info must be an object"
    if isinstance(row, PairExperience):
        for name in ("prompt_tokens", "chosen_tokens", "rejected_tokens"):
            why = _tokens(name, getattr(row, name))
            if why:
                return why
        return _strings(row, "task_id", "eid")
    why = _tokens("tokens", row.tokens) or _strings(row, "group_id", "task_id", "finish_reason", "eid")
    if why:
        return why
    if not (_is_int(row.prompt_length) and _is_int(row.model_version) and isinstance(row.is_expert, bool)):
        return "prompt_length and model_version must be whole numbers, is_expert true or false"
    if row.reward is not None and not (_is_number(row.reward) and math.isfinite(row.reward)):
        return f"reward must be a finite number (got {json.dumps(row.reward)[:40]})"
    for name in ("logprobs", "token_level_reward", "advantages", "returns"):
        why = _floats(name, getattr(row, name))
        if why:
            return why
    if row.action_mask is not None and not all(m in (0, 1) and not isinstance(m, float) for m in row.action_mask):
        return "action_mask must be a list of 0 and 1"
    return None


def decode_row(
    kind: Any, header: Any, blob: Any, status: Any, step: Any, t_step: Any, layout: Any, t_blob: Any
) -> tuple[StoredRow | None, str]:
    """``(row, "")`` of one buffer row and its training record, or ``(None, why)`` when it cannot be shown.

    A training record that does not decode is dropped, not the row: the row is still what
    was sampled. (A record shorter than the response colours the tokens it covers.)
    """
    try:
        row = unpack(kind, header, blob)
    except (ValueError, TypeError, KeyError, AttributeError, IndexError, RecursionError) as exc:
        return None, f"cannot be decoded ({type(exc).__name__}: {' '.join(str(exc).split())[:160]})"
    why = _why_not(row)
    if why:
        return None, why
    if not (_is_int(status) and 0 <= status < len(STATUSES)) or not (step is None or _is_int(step)):
        return None, "its state (status, step) is damaged"
    trained: dict[str, list[float]] = {}
    if layout is not None and isinstance(row, Experience) and (t_step is None or _is_int(t_step)):
        try:
            trained = unpack_floats(layout, t_blob)
        except (ValueError, TypeError, AttributeError, RecursionError):
            trained = {}
        if not isinstance(trained, dict) or not all(isinstance(v, list) for v in trained.values()):
            trained = {}
    return StoredRow(row, STATUSES[status], step, t_step if trained else None, trained), ""
