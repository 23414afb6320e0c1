"""One step's rollouts as the page shows them: groups of samples, filtered, one page at a time.

The step's rows are read in one indexed query and filtered here (reward, length, finish
reason, text); only the page's rows get per-token text, so a page costs the same in a run
of 100k rows as in one of 100 (``benchmarks/view.py``). Per-token fields are shown where
the buffer stores them; what it does not store is said in ``notes``, never made up.
"""

from __future__ import annotations

from typing import Any

from trinity_like.experience import Experience, PairExperience
from trinity_like.view.run import Filters, Run

NOT_STORED = {
    "advantages": "advantages are not stored in this buffer (the trainer computes them when it trains a batch): "
                  "colouring by advantage is unavailable",
    "trainer_logprobs": "the trainer's logprobs are not stored in the buffer, only the sampler's: the "
                        "sampler/trainer ratio per token is unavailable (the metric rollout_logprob_diff is its mean)",
}


def _sample(row: Experience, status: str, consumed_by: int | None, pieces: list[str]) -> dict[str, Any]:
    mask = row.action_mask
    adv = row.advantages
    kept = [a for a, m in zip(adv, row.mask()) if m] if adv is not None else []
    info = {k: v for k, v in row.info.items() if k != "response_text"}
    return {
        "eid": row.eid, "task_id": row.task_id, "reward": row.reward, "finish_reason": row.finish_reason,
        "model_version": row.model_version, "status": status, "consumed_by": consumed_by, "is_expert": row.is_expert,
        "length": row.response_length, "response": "".join(pieces), "tokens": pieces, "token_ids": row.response_tokens,
        "logprobs": row.logprobs, "advantages": adv, "mask": mask, "token_level_reward": row.token_level_reward,
        "advantage": sum(kept) / len(kept) if kept else None, "info": info,
    }


def _pair(run: Run, row: PairExperience) -> dict[str, Any]:
    prompt, chosen, rejected = run.decode([row.prompt_tokens, row.chosen_tokens, row.rejected_tokens])
    return {"eid": row.eid, "task_id": row.task_id, "prompt": prompt, "chosen": chosen, "rejected": rejected,
            "info": row.info}


def step_page(run: Run, version: int, filters: Filters = Filters(), page: int = 0, page_size: int = 32) -> dict[str, Any]:
    """Page ``page`` of the samples of ``version`` that pass ``filters``, grouped by prompt."""
    buffer = run.buffer()
    if buffer is None:
        return {"error": run.buffer_missing()}
    found = buffer.rows(version)
    experiences = [(r, status, step) for r, status, step in found if isinstance(r, Experience)]
    pairs = [r for r, _, _ in found if isinstance(r, PairExperience)]
    # Text of every row of the step (one batched decode): the text filter needs it, and a
    # group's prompt is decoded once.
    prompts = {r.group_id or r.eid: r.prompt_tokens for r, _, _ in experiences}
    keys = list(prompts)
    prompt_text = dict(zip(keys, run.decode([prompts[k] for k in keys])))
    responses = run.decode([r.response_tokens for r, _, _ in experiences]) if filters.text else [""] * len(experiences)
    kept = [(r, s, c) for (r, s, c), text in zip(experiences, responses)
            if filters.keep(r, prompt_text[r.group_id or r.eid], text)]
    pages = max(1, -(-len(kept) // page_size))
    shown = kept[page * page_size : (page + 1) * page_size]
    flat = run.pieces([t for r, _, _ in shown for t in r.response_tokens])
    groups: dict[str, dict[str, Any]] = {}
    at = 0
    for row, status, consumed_by in shown:
        key = row.group_id or row.eid
        group = groups.setdefault(key, {"group_id": row.group_id, "task_id": row.task_id,
                                        "prompt": prompt_text[key], "samples": []})
        group["samples"].append(_sample(row, status, consumed_by, flat[at : at + row.response_length]))
        at += row.response_length
    stored = {name: any(getattr(r, name) is not None for r, _, _ in experiences)
              for name in ("logprobs", "advantages", "action_mask", "token_level_reward")}
    notes = [NOT_STORED["trainer_logprobs"]] + ([] if stored["advantages"] else [NOT_STORED["advantages"]])
    if run.tokenizer is None:
        notes.insert(0, run.tokenizer_error)
    return {
        "version": version, "rows": len(experiences), "matching": len(kept), "page": page, "pages": pages,
        "page_size": page_size, "stored": stored, "notes": notes if experiences else [],
        "finish_reasons": sorted({r.finish_reason for r, _, _ in experiences}),
        "groups": list(groups.values()), "pairs": [_pair(run, r) for r in pairs[:page_size]],
    }
