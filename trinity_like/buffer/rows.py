"""Row codec shared by the storages: a row travels as ``(kind, JSON text)``, never pickle.

``kind`` names the row type (``"experience"`` or ``"pair"``, the keys of
:data:`trinity_like.experience.ROW_TYPES`), so one storage can hold either shape and a
reader rebuilds exactly the dataclass that was written -- in another process, or in a
later run of a newer version of the code.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Union

from trinity_like.experience import ROW_TYPES, Experience, PairExperience

Row = Union[Experience, PairExperience]

# The states a stored row moves through (``count(status)`` takes these names).
STATUSES = ("available", "claimed", "consumed", "dropped")
_KIND_OF = {cls: kind for kind, cls in ROW_TYPES.items()}


def kind_of(row: Row) -> str:
    """The row's kind; anything but an :class:`Experience` or a pair is a ``TypeError``."""
    kind = _KIND_OF.get(type(row))
    if kind is None:
        raise TypeError(f"a buffer stores Experience or PairExperience rows, got {type(row).__name__}")
    return kind


def encode(row: Row) -> tuple[str, str]:
    """``(kind, compact JSON)`` of one row."""
    return kind_of(row), json.dumps(row.to_dict(), separators=(",", ":"))


def decode(kind: str, text: str) -> Row:
    """The row :func:`encode` produced; an unknown kind is a ``ValueError``."""
    cls = ROW_TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown row kind {kind!r} (known: {', '.join(ROW_TYPES)})")
    return cls.from_dict(json.loads(text))


def model_version(row: Row) -> int:
    """The version of the weights that produced ``row``; pairs (offline data) are version 0."""
    return row.model_version if isinstance(row, Experience) else 0


def check_status(status: str) -> str:
    if status not in STATUSES:
        raise ValueError(f"unknown row status {status!r} (known: {', '.join(STATUSES)})")
    return status


def check_claim_args(n: int, order: str, orders: Sequence[str]) -> None:
    if n < 0:
        raise ValueError(f"cannot claim {n} rows")
    if order not in orders:
        raise ValueError(f"unknown claim order {order!r} (known: {', '.join(orders)})")
