"""Rows -> padded tensor batches in the train-engine layout (see trinity_like/trainer/base.py).

Prompts are left-padded to P columns and responses right-padded to R, so every row's
response starts at column P: per-token fields are ``[B, R]`` and line up across rows.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from trinity_like.buffer.rows import TrainedRecord
from trinity_like.experience import Experience, PairExperience
from trinity_like.ops import normalizers, token_level_rewards
from trinity_like.trainer.base import ROWS_PER_EXAMPLE

Batch = dict[str, torch.Tensor]


def _pad_rows(prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]], pad_id: int) -> Batch:
    P = max((len(p) for p in prompts), default=0)
    R = max(max((len(r) for r in responses), default=0), 1)
    B = len(prompts)
    input_ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((B, P + R), dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompts, responses)):
        if p:
            input_ids[i, P - len(p) : P] = torch.tensor(p, dtype=torch.long)
            attention_mask[i, P - len(p) : P] = 1
        if r:
            input_ids[i, P : P + len(r)] = torch.tensor(r, dtype=torch.long)
            attention_mask[i, P : P + len(r)] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids}


def _per_token(rows: Sequence[Sequence[float] | None], R: int, default: float = 0.0) -> torch.Tensor:
    out = torch.full((len(rows), R), default, dtype=torch.float32)
    for i, row in enumerate(rows):
        if row is not None and len(row):
            out[i, : len(row)] = torch.tensor(list(row), dtype=torch.float32)
    return out


def experience_batch(rows: Sequence[Experience], pad_id: int) -> Batch:
    """A batch of experiences with every field a component may ask for.

    Fields: input_ids, attention_mask, position_ids, response_mask [B, R], rollout_logprob
    [B, R] (the sampler's logprobs, when any row was sampled), rewards [B], token_level_rewards [B, R], group_index [B],
    is_expert [B], model_version [B], and the normalisers num_tokens, num_seqs,
    num_expert_tokens, num_expert_seqs (0-d tensors for the whole batch).
    """
    if not rows:
        raise ValueError("experience_batch: no rows")
    batch = _pad_rows([r.prompt_tokens for r in rows], [r.response_tokens for r in rows], pad_id)
    R = batch["input_ids"].shape[1] - max(r.prompt_length for r in rows)
    mask = _per_token([r.mask() for r in rows], R)
    batch["response_mask"] = mask
    if any(r.logprobs is not None for r in rows):  # SFT data has none; expert rows in MIX neither
        batch["rollout_logprob"] = _per_token([r.logprobs for r in rows], R)
    rewards = torch.tensor([float(r.reward or 0.0) for r in rows], dtype=torch.float32)
    batch["rewards"] = rewards
    dense = [r.token_level_reward for r in rows]
    tlr = token_level_rewards(rewards, mask)
    for i, row in enumerate(dense):
        if row is not None:
            tlr[i] = _per_token([row], R)[0]
    batch["token_level_rewards"] = tlr
    ids: dict[str, int] = {}
    batch["group_index"] = torch.tensor([ids.setdefault(r.group_id or r.eid, len(ids)) for r in rows], dtype=torch.long)
    batch["is_expert"] = torch.tensor([bool(r.is_expert) for r in rows], dtype=torch.bool)
    batch["model_version"] = torch.tensor([int(r.model_version) for r in rows], dtype=torch.long)
    if all(r.advantages is not None for r in rows):
        batch["advantages"] = _per_token([r.advantages for r in rows], R)
    batch.update(normalizers(mask, batch["is_expert"]))
    return batch


def trained_records(rows: Sequence[Experience], batch: Batch, outputs: Batch) -> list[TrainedRecord]:
    """What a step computed for each row of ``batch`` (built from ``rows`` by :func:`experience_batch`),
    cut back to the row's response: the ``advantages`` the loss used and the trainer's own
    ``logprob`` from ``outputs`` (``forward_backward``'s ``out``), whichever the step has."""
    fields = {"advantages": batch.get("advantages"), "trainer_logprob": outputs.get("logprob")}
    lists = {name: t.tolist() for name, t in fields.items() if t is not None}
    return (
        [
            TrainedRecord(row.eid, {name: values[i][: row.response_length] for name, values in lists.items()})
            for i, row in enumerate(rows)
        ]
        if lists
        else []
    )


def pair_batch(rows: Sequence[PairExperience], pad_id: int) -> Batch:
    """2B rows, pairs interleaved: pair i's chosen response in row 2i, its rejected one in 2i + 1.

    Any split at even row boundaries holds whole pairs; ``rows_per_example`` (2) tells the
    engines to split only there.
    """
    if not rows:
        raise ValueError("pair_batch: no rows")
    prompts = [r.prompt_tokens for r in rows for _ in (0, 1)]
    responses = [t for r in rows for t in (r.chosen_tokens, r.rejected_tokens)]
    batch = _pad_rows(prompts, responses, pad_id)
    R = batch["input_ids"].shape[1] - max(len(p) for p in prompts)
    masks = [
        m
        for r in rows
        for m in (r.chosen_mask or [1] * len(r.chosen_tokens), r.rejected_mask or [1] * len(r.rejected_tokens))
    ]
    batch["response_mask"] = _per_token(masks, R)
    batch.update(normalizers(batch["response_mask"]))
    batch[ROWS_PER_EXAMPLE] = torch.tensor(2)
    return batch


def split_rows(batch: Batch, index: torch.Tensor) -> Batch:
    """The rows ``index`` of a batch; 0-d entries (whole-batch normalisers) are kept as they are."""
    return {k: (v if v.dim() == 0 else v[index]) for k, v in batch.items()}
