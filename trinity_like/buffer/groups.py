"""Whole groups: the rows a claim hands out together, or not at all.

Why: a group advantage (GRPO, RLOO, Dr.GRPO) compares a row's reward with the other rows of
its group (the samples of one prompt). A batch holding a part of a group computes that
baseline from the part -- from one row, no baseline at all -- and nothing says so. So a
row written with ``group_size > 0`` is claimed only together with the other
``group_size - 1`` rows of its ``group_id``; a row with ``group_size`` 0 (offline data,
pairs, algorithms without groups) is a unit of its own. The explorer sets ``group_size``
where it writes a step's rows (:meth:`trinity_like.pipeline.stage.Stage.put`), from the
group as it was sampled, when the trainer needs whole groups.

Every storage walks its available rows in its claim order and lets :func:`take_whole_groups`
pick; a group whose rows are not all there (a writer still writing it, or killed while
writing it: it writes them again when it resumes) is passed over, never cut.

    >>> rows = [("a1", "a", 2), ("b1", "b", 2), ("a2", "a", 2), ("c1", "c", 2), ("c2", "c", 2)]
    >>> take_whole_groups(rows, 4)       # b is not whole yet: a and c, in the order they began
    (['a1', 'a2', 'c1', 'c2'], True)
    >>> take_whole_groups(rows, 3)       # c does not fit beside a: the claim stops there
    (['a1', 'a2'], True)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

from trinity_like.experience import Experience

K = TypeVar("K")


def unit_of(row: object) -> tuple[str, int]:
    """``(key, size)`` of the unit a claim keeps ``row`` in: its group, or the row alone."""
    if isinstance(row, Experience) and row.group_size > 0 and row.group_id:
        return "g:" + row.group_id, row.group_size
    return "r:" + str(row.eid), 1  # type: ignore[attr-defined]


def unit_key(eid: str, group_id: str | None, group_size: int | None) -> tuple[str, int]:
    """:func:`unit_of` from a row's stored fields (``None``: a field the row does not have)."""
    if group_size and group_size > 0 and group_id:
        return "g:" + group_id, int(group_size)
    return "r:" + eid, 1


def take_whole_groups(candidates: Iterable[tuple[K, str, int]], n: int) -> tuple[list[K], bool]:
    """The items of whole units among ``candidates`` (``(item, unit key, unit size)`` in claim
    order), at most ``n`` in all, unit after unit in the order each unit's first item came.

    Walks only as far as it must: it stops at ``n`` items, or at the first whole unit that
    does not fit beside those taken (a later, smaller group never overtakes it). ``full`` is
    True when it stopped so -- waiting for more rows would not make the claim bigger; False
    when the candidates ran out first. A unit larger than ``n`` is never taken by this claim.
    """
    if n <= 0:
        return [], True
    partial: dict[str, tuple[int, list[K]]] = {}  # unit key -> (position of its first item, items so far)
    whole: list[tuple[int, list[K]]] = []
    total, full = 0, False
    for pos, (item, key, size) in enumerate(candidates):
        first, items = partial.setdefault(key, (pos, []))
        items.append(item)
        if len(items) < size:
            continue
        del partial[key]
        if total + size > n:
            full = True
            break
        whole.append((first, items))
        total += size
        if total == n:
            full = True
            break
    whole.sort(key=lambda unit: unit[0])
    return [item for _, items in whole for item in items], full
