"""The client loop's advantages, computed by a registered advantage fn (ADVANTAGE_FN) looked up by name.

The loop hands the estimator the same inputs a recipe's ``compute_advantages`` does, in the
contract of ``algorithms/advantages`` -- ``rewards [B]``, ``action_mask [B, R]``,
``group_index [B]`` and ``token_level_rewards [B, R]`` -- laid out over episodes and turns
(letters: B rows, R positions; here a position is a *turn*, not a token):

- per episode (default): one row per episode, one position per turn. ``rewards`` is the
  episode's return (its shaped rewards summed), ``token_level_rewards`` holds each turn's
  shaped reward at that turn's position, ``action_mask`` marks the episode's turns and
  ``group_index`` its group. Turn t's tokens get the estimator's advantage at position t:
  a group method (``group_centered``, ``grpo``, ``rloo``) gives every turn its episode's
  advantage; a token-level one (``reinforce_plus_plus``) sees one step per turn.
- per turn (``advantage_per_turn``): one row per (episode, turn t), one position. Its
  ``rewards`` is the return-to-go from turn t, ``G_it = sum_{s >= t} r'_is`` (0 for an episode
  that ended before turn t: it still counts in its group's baseline, as an episode that
  earns nothing more), and each turn of each group is a group of its own. Turn t's tokens
  get that row's advantage: ``A_it = estimator(G_.t)`` within the group -- with the default
  ``group_centered``, ``G_it - mean_j G_jt``.

The estimator sees every group of one call at once (a whole iteration, or one streamed
minibatch), so a batch-level method (``reinforce_plus_plus`` whitens over the batch) sees
what the learner trains together. An estimator that needs anything else (``gae`` needs a
critic's ``values``) is refused by name when the loop's config is built.

Values are computed in float64. Where an estimator's exact answer is 0 -- the rewards of a
group are all equal and it is group-relative -- float rounding of the group mean may leave
about 1e-16 (times 1/epsilon after GRPO's std division); advantages within 1e-9 of 0,
relative to the largest input, are set to exactly 0, so such a group is skipped
(``skip_zero_advantage_groups``) instead of trained on rounding noise.

Example::

    estimator = Estimator.build("rloo")
    group_advantages([[[1.0], [0.0], [0.0]]], estimator, per_turn=False)  # [[[1.0], [-0.5], [-0.5]]]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any

import torch

from trinity_like.components import build_params, call_component, required_inputs
from trinity_like.errors import ConfigError
from trinity_like.registry import ADVANTAGE_FN, UnknownNameError

DEFAULT = "group_centered"  # reward minus its group's mean: no std, no length normalisation
INPUTS = frozenset({"rewards", "action_mask", "group_index", "token_level_rewards"})  # what the loop can give
ZERO_TOLERANCE = 1e-9  # relative to the largest input: below it, an advantage is rounding noise


@dataclass(frozen=True)
class Estimator:
    """A registered advantage fn and its params object."""

    name: str
    fn: Any
    params: Any

    @classmethod
    def build(
        cls, name: str = DEFAULT, params: Mapping[str, Any] | None = None, *, where: str = "advantage"
    ) -> Estimator:
        """Look ``name`` up in ADVANTAGE_FN and build its params; a one-line ConfigError naming ``where``
        for an unknown name, a bad parameter or an input the loop does not have."""
        try:
            fn = ADVANTAGE_FN.get(name)
        except UnknownNameError as exc:
            raise ConfigError(f"{where}: {exc.args[0]}") from None
        missing = required_inputs(fn) - INPUTS
        if missing:
            raise ConfigError(
                f"{where}: advantage fn {name!r} needs {', '.join(sorted(missing))}, which the client loop does not "
                f"have (it gives {', '.join(sorted(INPUTS))})"
            )
        return cls(name, fn, build_params(fn, params, where=f"{where}_params"))

    def __call__(self, rows: list[list[float]], group_index: list[int]) -> list[list[float]]:
        """Advantages ``[B][R_b]`` of rows of per-position rewards (``R_b`` positions in row b)."""
        width = max(map(len, rows))
        token_BR = torch.zeros(len(rows), width, dtype=torch.float64)
        mask_BR = torch.zeros(len(rows), width, dtype=torch.float64)
        for b, row in enumerate(rows):
            token_BR[b, : len(row)] = torch.tensor(row, dtype=torch.float64)
            mask_BR[b, : len(row)] = 1.0
        inputs = {
            "rewards": token_BR.sum(dim=1),
            "token_level_rewards": token_BR,
            "action_mask": mask_BR,
            "group_index": torch.tensor(group_index, dtype=torch.long),
        }
        adv_BR, _ = call_component(self.fn, inputs, self.params)
        adv_BR = adv_BR.detach().to(torch.float64)
        scale = max(1.0, float(token_BR.abs().max()), float(inputs["rewards"].abs().max()))
        adv_BR = torch.where(adv_BR.abs() <= ZERO_TOLERANCE * scale, torch.zeros_like(adv_BR), adv_BR)
        return [adv_BR[b, : len(row)].tolist() for b, row in enumerate(rows)]


def returns_to_go(rewards: Sequence[float]) -> list[float]:
    """``G_t = sum_{s >= t} r_s``.

    >>> returns_to_go([1.0, 0.0, 2.0])
    [3.0, 2.0, 2.0]
    """
    return list(accumulate(reversed(rewards)))[::-1]


def group_advantages(
    groups: Sequence[Sequence[Sequence[float]]], estimator: Estimator, *, per_turn: bool
) -> list[list[list[float]]]:
    """The advantage of each turn of each episode of each group, from per-turn (shaped) rewards
    ``groups[g][i][t]``, by ``estimator`` (module docstring: the layouts of both modes)."""
    if not per_turn:
        rows = [list(episode) for group in groups for episode in group]
        flat = iter(estimator(rows, [g for g, group in enumerate(groups) for _ in group]))
        return [[next(flat) for _ in group] for group in groups]
    rows: list[list[float]] = []
    keys: list[tuple[int, int, int]] = []  # (group, episode, turn) of each row
    for g, group in enumerate(groups):
        to_go = [returns_to_go(episode) for episode in group]
        for t in range(max(map(len, to_go))):
            for i, episode in enumerate(to_go):
                rows.append([episode[t] if t < len(episode) else 0.0])
                keys.append((g, i, t))
    turn_groups: dict[tuple[int, int], int] = {}  # each turn of each group is a group of its own
    index = [turn_groups.setdefault((g, t), len(turn_groups)) for g, _, t in keys]
    advantages = estimator(rows, index)
    out: list[list[list[float]]] = [[[0.0] * len(episode) for episode in group] for group in groups]
    for (g, i, t), adv in zip(keys, advantages, strict=True):
        if t < len(groups[g][i]):  # an episode that ended before turn t has no tokens there
            out[g][i][t] = adv[0]
    return out


def turn_advantages(
    rewards_G: Sequence[Sequence[float]], *, per_turn: bool, estimator: Estimator | None = None
) -> list[list[float]]:
    """The advantage of each turn of each episode of one group (:func:`group_advantages`);
    ``group_centered`` unless another estimator is given.

    >>> turn_advantages([[0.0, 1.0], [0.0]], per_turn=False)
    [[0.5, 0.5], [-0.5]]
    >>> turn_advantages([[1.0, 0.0, 1.0], [0.0, 1.0, 0.0]], per_turn=True)  # returns-to-go [2, 1, 1], [1, 1, 0]
    [[0.5, 0.0, 0.5], [-0.5, 0.0, -0.5]]
    """
    return group_advantages([rewards_G], estimator or Estimator.build(), per_turn=per_turn)[0]
