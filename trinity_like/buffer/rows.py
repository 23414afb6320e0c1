"""Row codecs shared by the storages: JSON text, or JSON plus packed number arrays; never pickle.

``kind`` names the row type (``"experience"`` or ``"pair"``, the keys of
:data:`trinity_like.experience.ROW_TYPES`), so one storage can hold either shape and a
reader rebuilds exactly the dataclass that was written -- in another process, or in a
later run of a newer version of the code.

Two codecs: :func:`encode` / :func:`decode` give one JSON text (for Ray messages and
JSONL files, where a person may read it); :func:`pack` / :func:`unpack` keep the token and
per-token float lists as little-endian int32 / float64 arrays beside a small JSON header.
Why the second: a 512-token experience is mostly numbers, and printing and parsing
~1,000 of them as decimal text costs about 0.5 ms each way, while packing them is
copying memory -- float64 keeps logprobs bit-exact, int32 holds any vocabulary.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from trinity_like.experience import ROW_TYPES, Experience, PairExperience

Row = Experience | PairExperience

# The states a stored row moves through (``count(status)`` takes these names).
STATUSES = ("available", "claimed", "consumed", "dropped")
_KIND_OF = {cls: kind for kind, cls in ROW_TYPES.items()}


def kind_of(row: Row) -> str:
    """The row's kind; anything but an :class:`Experience` or a pair is a ``TypeError``."""
    kind = _KIND_OF.get(type(row))
    if kind is None:
        raise TypeError(f"a buffer stores Experience or PairExperience rows, got {type(row).__name__}")
    return kind


def fields_of(row: Row) -> dict[str, Any]:
    """The row's fields as a shallow dict (``to_dict`` deep-copies every list: 6x slower)."""
    return {f.name: getattr(row, f.name) for f in dataclasses.fields(row)}


def _row_type(kind: str) -> type:
    cls = ROW_TYPES.get(kind)
    if cls is None:
        raise ValueError(f"unknown row kind {kind!r} (known: {', '.join(ROW_TYPES)})")
    return cls


def encode(row: Row) -> tuple[str, str]:
    """``(kind, compact JSON)`` of one row."""
    return kind_of(row), json.dumps(fields_of(row), separators=(",", ":"))


def decode(kind: str, text: str) -> Row:
    """The row :func:`encode` produced; an unknown kind is a ``ValueError``."""
    return _row_type(kind).from_dict(json.loads(text))


# Fields packed as arrays: typecode "i" (int32) for token ids and masks, "d" (float64) for floats.
_ARRAY_CODES = {
    **dict.fromkeys(
        ("tokens", "action_mask", "prompt_tokens", "chosen_tokens", "rejected_tokens", "chosen_mask", "rejected_mask"),
        "i",
    ),
    **dict.fromkeys(("logprobs", "token_level_reward", "advantages", "returns"), "d"),
}
_SWAP = sys.byteorder != "little"  # arrays are stored little-endian on every machine
assert array("i").itemsize == 4 and array("d").itemsize == 8


def pack(row: Row) -> tuple[str, str, bytes]:
    """``(kind, JSON header, blob)``: list fields become arrays in the blob, the rest JSON."""
    kind = kind_of(row)
    fields = fields_of(row)
    layout, chunks = {}, []
    for name, code in _ARRAY_CODES.items():
        value = fields.get(name)
        if value is None:
            continue
        arr = array(code, value)
        if _SWAP:
            arr.byteswap()
        layout[name] = len(arr)
        chunks.append(arr.tobytes())
        del fields[name]
    fields["_arrays"] = layout
    return kind, json.dumps(fields, separators=(",", ":")), b"".join(chunks)


def unpack(kind: str, header: str, blob: bytes) -> Row:
    """The row :func:`pack` produced."""
    fields = json.loads(header)
    view, at = memoryview(blob), 0
    for name, n in fields.pop("_arrays").items():
        arr = array(_ARRAY_CODES[name])
        size = n * arr.itemsize
        arr.frombytes(view[at : at + size])
        if _SWAP:
            arr.byteswap()
        fields[name] = arr.tolist()
        at += size
    return _row_type(kind)(**fields)


@dataclass(frozen=True)
class TrainedRecord:
    """What the trainer computed for one stored row when a step trained on it.

    Recorded from tensors the step had anyway (no extra forward pass), so a person can see
    what the loss saw: ``trinity-like view`` colours a response's tokens by them. Names in
    ``arrays`` (per response token, float64 in storage): ``advantages`` (what the loss
    used), ``trainer_logprob`` (the trainer's logprob of the token before the update; with
    the sampler's ``logprobs`` it gives the sampler/trainer ratio).
    """

    eid: str  # the row's id (Experience.eid)
    arrays: Mapping[str, Sequence[float]]  # name -> one value per response token


def pack_floats(arrays: Mapping[str, Sequence[float]]) -> tuple[str, bytes]:
    """``(JSON layout, blob)``: each list as little-endian float64, its length in the layout."""
    layout, chunks = {}, []
    for name, values in arrays.items():
        arr = array("d", values)
        if _SWAP:
            arr.byteswap()
        layout[name] = len(arr)
        chunks.append(arr.tobytes())
    return json.dumps(layout, separators=(",", ":")), b"".join(chunks)


def unpack_floats(layout: str, blob: bytes) -> dict[str, list[float]]:
    """The lists :func:`pack_floats` packed."""
    out, view, at = {}, memoryview(blob), 0
    for name, n in json.loads(layout).items():
        arr = array("d")
        arr.frombytes(view[at : at + 8 * n])
        if _SWAP:
            arr.byteswap()
        out[name] = arr.tolist()
        at += 8 * n
    return out


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
