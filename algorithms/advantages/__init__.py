"""Advantage functions (ADVANTAGE_FN): rewards (and values, for GAE) -> per-token advantages.

Shared contract: ``rewards [B]`` (sequence scores; the sum of the token-level rewards when
KL shaping is on), ``action_mask [B, R]``, ``group_index [B]`` (long: rows with the same
index answer the same prompt), and for token-level methods ``token_level_rewards [B, R]``
and ``values [B, R]``; returns ``(advantages [B, R], returns [B, R])``, zero off the mask.
Group methods are vectorised with scatter ops (``trinity_like.ops.group_stats``).
"""

from algorithms.advantages import gae, grpo, reinforce_plus_plus, rloo  # noqa: F401  (importing registers)
