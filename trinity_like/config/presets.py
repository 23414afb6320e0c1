"""An algorithm type's preset applied to a recipe: fill what is unset, never overwrite.

The rule (docs: ``plugins/README.md``; code: :func:`apply_preset`; tests: ``tests/core``):

- **Slots can be swapped.** Every slot name (``algorithm.policy_loss.name``,
  ``advantage.name``, ``kl_loss.name``, ``kl_penalty.name``, ``entropy_loss.name``,
  ``sample_strategy.name``, ``value_loss.name``) may be set by a recipe or on the command
  line, whatever the algorithm type names there: prototyping a loss needs no algorithm
  type of its own. ``name: none`` switches a slot off. The resolver then validates the
  swap like any component: its params against its params dataclass, and the inputs it
  asks for against what the algorithm provides (``--dry-run`` prints every swapped slot).
- **The algorithm's per-slot params follow its component.** ``AlgorithmType.params[slot]``
  fills a slot that keeps the algorithm's component; a swapped-in component gets only
  its own defaults (the old one's params would not fit it). A weighted slot's ``coef``
  (``kl_loss``, ``kl_penalty``, ``entropy_loss``) weighs the slot, not the component, so
  it carries over a swap.
- **``requires`` pins what the algorithm cannot work without** (``mode: train`` for an
  offline one, or a slot's name): a recipe value that contradicts it is an error naming
  the file and line. ``defaults`` fill only what the recipe left unset.
"""

from __future__ import annotations

import copy
from typing import Any

from trinity_like.components import WEIGHTED_SLOTS, AlgorithmType
from trinity_like.config.loader import KeyPath, Locator, get_path


def set_path(data: dict, path: KeyPath, value: Any) -> None:
    node = data
    for part in path[:-1]:
        node = node.setdefault(part, {})
    node[path[-1]] = copy.deepcopy(value)


def swapped_slots(algo: AlgorithmType, algorithm_section: Any) -> dict[str, str]:
    """Slot -> the algorithm's component, for every slot whose name the recipe changed."""
    out = {}
    for slot, name in algo.components().items():
        chosen = getattr(algorithm_section, slot, {}).get("name", name)
        if chosen != name:
            out[slot] = name
    return out


def apply_preset(data: dict, algo: AlgorithmType, algo_name: str, loc: Locator) -> dict:
    """``data`` with the algorithm's slots, params, requires and defaults filled in (a copy)."""
    data = copy.deepcopy(data)
    alg = data.setdefault("algorithm", {})
    if not isinstance(alg, dict):
        raise loc.error(("algorithm",), "must be a mapping")
    for slot, name in algo.components().items():
        user = alg.setdefault(slot, {})
        if not isinstance(user, dict):
            raise loc.error(("algorithm", slot), f"must be a mapping like {{name: {name}}}")
        defaults = algo.params.get(slot, {})
        if user.setdefault("name", name) != name:  # swapped: the params were the old component's
            defaults = {k: v for k, v in defaults.items() if k == "coef" and slot in WEIGHTED_SLOTS}
        for key, value in defaults.items():
            user.setdefault(key, copy.deepcopy(value))
    for path_str, value in algo.requires.items():
        path = tuple(path_str.split("."))
        present, current = get_path(data, path)
        if present and current != value:
            raise loc.error(path, f"{current!r} conflicts with algorithm type {algo_name!r}, which requires {value!r}")
        set_path(data, path, value)
    for path_str, value in algo.defaults.items():
        path = tuple(path_str.split("."))
        if not get_path(data, path)[0]:
            set_path(data, path, value)
    return data
