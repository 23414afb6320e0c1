"""What flows from the explorer (or a dataset) through the buffer into the trainer.

Three row shapes, each a plain dataclass serialised as JSON-compatible dicts (never
pickle), so a row written by one process, or by an older run, reads back anywhere:

- :class:`Experience` -- one sampled (or expert) response: the unit of online RL and SFT.
- :class:`PairExperience` -- a prompt with a chosen and a rejected response (DPO, RM).
- :class:`Task` -- what the explorer answers: a prompt and its reference answer.

Token layout of an :class:`Experience` (letters used in shapes throughout the code:
B batch, T tokens, R response tokens, G group size)::

    tokens         = prompt tokens + response tokens           (length prompt_length + R)
    logprobs       = sampling logprob of each response token    (length R)
    action_mask    = 1 where a response token is trained on     (length R)
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import uuid
from dataclasses import dataclass, field
from typing import Any


def _new_id() -> str:
    return uuid.uuid4().hex


def rollout_id(run: str, step: int, task_id: str, index: int) -> str:
    """The id of the ``index``-th row of task ``task_id`` explored for ``step`` of run ``run``.

    Deterministic, so a step explored again after a resume (same tasks, same seed) writes
    rows the buffer already holds, and its put adds nothing (exactly once, issue 19)."""
    key = json.dumps([run, step, task_id, index])
    return hashlib.sha256(key.encode()).hexdigest()[:32]


def rollout_group_id(run: str, step: int, task_id: str, ordinal: int) -> str:
    """The id of the ``ordinal``-th group of task ``task_id`` explored for ``step`` of run ``run``.

    Deterministic for the reason :func:`rollout_id` is: the rows a resumed run writes again
    to complete a group that a killed writer left partly written join that group."""
    key = json.dumps([run, step, task_id, "group", ordinal])
    return hashlib.sha256(key.encode()).hexdigest()[:32]


@dataclass
class Experience:
    """One response to one prompt, with everything a trainer may need of it."""

    tokens: list[int]  # prompt + response token ids
    prompt_length: int  # number of leading prompt tokens in `tokens`
    logprobs: list[float] | None = None  # per response token, under the sampling distribution
    action_mask: list[int] | None = None  # per response token; None means all ones
    reward: float | None = None  # sequence-level scalar reward
    token_level_reward: list[float] | None = None  # per response token, if the reward is dense
    advantages: list[float] | None = None  # per response token, when computed at explore time
    returns: list[float] | None = None  # per response token (GAE), when computed early
    group_id: str = ""  # samples of one prompt share it; group advantages normalise over it
    group_size: int = 0  # rows of its group, when a train batch must hold whole groups; 0: claimed alone
    task_id: str = ""  # the task (dataset row) that produced it
    model_version: int = 0  # version of the weights that sampled it (staleness = now - this)
    weights_digest: str = ""  # digest of those weights as the engine held them (models/weight_digest.py)
    explore_step: int = 0  # the step whose batch it was explored for (0: unknown): the weights it needs (weight_ledger)
    finish_reason: str = ""  # "stop" | "length" | "" (not sampled)
    is_expert: bool = False  # an expert (SFT) row inside an RL batch (MIX)
    info: dict[str, Any] = field(default_factory=dict)  # free-form, JSON-serialisable
    eid: str = field(default_factory=_new_id)  # unique id; the buffer's primary key

    def __post_init__(self) -> None:
        if not 0 <= self.prompt_length <= len(self.tokens):
            raise ValueError(f"prompt_length {self.prompt_length} outside 0..{len(self.tokens)} tokens")
        n = self.response_length
        for name in ("logprobs", "action_mask", "token_level_reward", "advantages", "returns"):
            value = getattr(self, name)
            if value is not None and len(value) != n:
                raise ValueError(f"{name} has {len(value)} entries for {n} response tokens")

    @property
    def response_length(self) -> int:
        return len(self.tokens) - self.prompt_length

    @property
    def prompt_tokens(self) -> list[int]:
        return self.tokens[: self.prompt_length]

    @property
    def response_tokens(self) -> list[int]:
        return self.tokens[self.prompt_length :]

    def mask(self) -> list[int]:
        """The action mask, all ones when none was given."""
        return list(self.action_mask) if self.action_mask is not None else [1] * self.response_length

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Experience:
        return cls(**row)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Experience:
        return cls.from_dict(json.loads(text))


@dataclass
class PairExperience:
    """A preference pair: one prompt, a chosen and a rejected response (DPO, RM)."""

    prompt_tokens: list[int]
    chosen_tokens: list[int]  # response tokens only
    rejected_tokens: list[int]
    chosen_mask: list[int] | None = None  # per chosen token; None means all ones
    rejected_mask: list[int] | None = None
    task_id: str = ""
    info: dict[str, Any] = field(default_factory=dict)
    eid: str = field(default_factory=_new_id)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> PairExperience:
        return cls(**row)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> PairExperience:
        return cls.from_dict(json.loads(text))


@dataclass
class Task:
    """One problem for the explorer: a prompt (text or chat messages) and its reference answer."""

    prompt: str | list[dict[str, str]]  # user text, or chat messages [{"role", "content"}, ...]
    answer: str = ""  # reference answer the reward fn compares against
    task_id: str = ""  # stable id (dataset name + index, or generator seed + index)
    system_prompt: str | None = None  # prepended as a system message when `prompt` is text
    info: dict[str, Any] = field(default_factory=dict)  # e.g. a reasoning-gym entry for scoring

    def messages(self) -> list[dict[str, str]]:
        """The prompt as chat messages, ready for the tokenizer's chat template."""
        if isinstance(self.prompt, list):
            return [dict(m) for m in self.prompt]
        msgs = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return msgs + [{"role": "user", "content": self.prompt}]

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, row: dict[str, Any]) -> Task:
        return cls(**row)


ROW_TYPES: dict[str, type] = {"experience": Experience, "pair": PairExperience}
