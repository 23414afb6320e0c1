"""One step's rollouts as the page shows them: groups of samples, filtered, one page at a time.

The step's rows are read in one indexed query and filtered here (reward, length, finish
reason, text); only the page's rows get per-token text, so a page costs the same in a run
of 100k rows as in one of 100 (``benchmarks/view.py``). Per-token fields are shown where
the buffer stores them: the sampler's logprobs with each row, the advantages and the
trainer's own logprobs in the training record of a row a step trained on
(:meth:`~trinity_like.buffer.sqlite_storage.SqliteStorage.record_trained`). What it does not
store is said in ``notes``, never made up.
"""

from __future__ import annotations

from typing import Any

from trinity_like.experience import Experience, PairExperience
from trinity_like.view.run import Filters, Run
from trinity_like.view.stored import StoredRow

NOT_STORED = {
    "no_records": "this buffer predates training records (the trainer's advantages and logprobs per row): colouring "
    "by advantage or by the sampler/trainer ratio is unavailable",
    "not_trained": "no row of this step has been trained on yet (or dynamic sampling dropped every group): the "
    "trainer's advantages and logprobs come when a step trains on them",
}


def _sample(stored: StoredRow, pieces: list[str]) -> dict[str, Any]:
    row = stored.row
    mask = row.action_mask
    adv = row.advantages if row.advantages is not None else stored.trained.get("advantages")
    kept = [a for a, m in zip(adv, row.mask()) if m] if adv is not None else []
    info = {k: v for k, v in row.info.items() if k != "response_text"}
    return {
        "eid": row.eid,
        "task_id": row.task_id,
        "reward": row.reward,
        "finish_reason": row.finish_reason,
        "model_version": row.model_version,
        "status": stored.status,
        "consumed_by": stored.consumed_by,
        "trained_at": stored.trained_at,
        "is_expert": row.is_expert,
        "length": row.response_length,
        "response": "".join(pieces),
        "tokens": pieces,
        "token_ids": row.response_tokens,
        "logprobs": row.logprobs,
        "advantages": adv,
        "trainer_logprobs": stored.trained.get("trainer_logprob"),
        "mask": mask,
        "token_level_reward": row.token_level_reward,
        "advantage": sum(kept) / len(kept) if kept else None,
        "info": info,
    }


def _pair(run: Run, row: PairExperience) -> dict[str, Any]:
    prompt, chosen, rejected = run.decode([row.prompt_tokens, row.chosen_tokens, row.rejected_tokens])
    return {
        "eid": row.eid,
        "task_id": row.task_id,
        "prompt": prompt,
        "chosen": chosen,
        "rejected": rejected,
        "info": row.info,
        "metrics": None,
    }


def _notes(
    run: Run, records: bool, sampled: list[dict[str, Any]], stored: dict[str, bool], skipped: list[str]
) -> list[str]:
    """What the page cannot show for this step, and why."""
    notes = [run.tokenizer_error] if run.tokenizer is None else []
    if skipped:
        notes.append(f"{len(skipped)} damaged rows of this step are not shown: " + "; ".join(skipped[:3]))
    if not sampled:
        return notes
    if not records:
        notes.append(NOT_STORED["no_records"])
    elif not stored["trainer_logprobs"]:
        notes.append(NOT_STORED["not_trained"])
    return notes


def step_page(
    run: Run, version: int, filters: Filters = Filters(), page: int = 0, page_size: int = 32
) -> dict[str, Any]:
    """Page ``page`` of the samples of ``version`` that pass ``filters``, grouped by prompt.

    A DPO / RM run has no buffer: its "steps" are training steps, each with the pairs it
    trained on (:func:`pair_page`).
    """
    buffer = run.buffer()
    if buffer is None:
        return (
            pair_page(run, version, filters, page, page_size)
            if run.trained_pairs()
            else {"error": run.buffer_missing()}
        )
    found = buffer.rows(version)
    run.warn([f"{buffer.path}: {why}: row skipped" for why in buffer.skipped])
    experiences = [r for r in found if isinstance(r.row, Experience)]
    pairs = [r.row for r in found if isinstance(r.row, PairExperience)]
    # Text of every row of the step (one batched decode): the text filter needs it, and a
    # group's prompt is decoded once.
    prompts = {r.row.group_id or r.row.eid: r.row.prompt_tokens for r in experiences}
    keys = list(prompts)
    prompt_text = dict(zip(keys, run.decode([prompts[k] for k in keys])))
    responses = run.decode([r.row.response_tokens for r in experiences]) if filters.text else [""] * len(experiences)
    kept = [
        r
        for r, text in zip(experiences, responses)
        if filters.keep(r.row, prompt_text[r.row.group_id or r.row.eid], text)
    ]
    pages = max(1, -(-len(kept) // page_size))
    shown = kept[page * page_size : (page + 1) * page_size]
    flat = run.pieces([t for r in shown for t in r.row.response_tokens])
    groups: dict[str, dict[str, Any]] = {}
    at = 0
    for stored in shown:
        row = stored.row
        key = row.group_id or row.eid
        group = groups.setdefault(
            key, {"group_id": row.group_id, "task_id": row.task_id, "prompt": prompt_text[key], "samples": []}
        )
        group["samples"].append(_sample(stored, flat[at : at + row.response_length]))
        at += row.response_length
    stored_fields = {
        name: any(getattr(r.row, name) is not None for r in experiences)
        for name in ("logprobs", "advantages", "action_mask", "token_level_reward")
    }
    stored_fields["advantages"] = stored_fields["advantages"] or any("advantages" in r.trained for r in experiences)
    stored_fields["trainer_logprobs"] = any("trainer_logprob" in r.trained for r in experiences)
    return {
        "kind": "rollouts",
        "version": version,
        "rows": len(experiences),
        "matching": len(kept),
        "page": page,
        "pages": pages,
        "page_size": page_size,
        "stored": stored_fields,
        "notes": _notes(run, buffer.has_training_records(), experiences, stored_fields, buffer.skipped),
        "finish_reasons": sorted({r.row.finish_reason for r in experiences}),
        "groups": list(groups.values()),
        "pairs": [_pair(run, r) for r in pairs[:page_size]],
    }


def pair_page(run: Run, step: int, filters: Filters = Filters(), page: int = 0, page_size: int = 32) -> dict[str, Any]:
    """The pairs a DPO / RM stage trained on at ``step`` (``trained_pairs.jsonl``), each with the
    scores the step's forward gave it (DPO's implicit rewards and margin, the reward model's
    scores and margin). Only the text filter applies to pairs."""
    every = run.trained_pairs().get(step, [])
    items = every
    if filters.text:
        q = filters.text.lower()
        items = [it for it in every if q in "\n".join((it["prompt"], it["chosen"], it["rejected"])).lower()]
    pages = max(1, -(-len(items) // page_size))
    shown = items[page * page_size : (page + 1) * page_size]
    return {
        "kind": "pairs",
        "version": step,
        "rows": len(every),
        "matching": len(items),
        "page": page,
        "pages": pages,
        "page_size": page_size,
        "stored": {},
        "notes": [],
        "finish_reasons": [],
        "groups": [],
        "pairs": [
            {
                "task_id": it["task_id"],
                "prompt": it["prompt"],
                "chosen": it["chosen"],
                "rejected": it["rejected"],
                "metrics": it["metrics"],
            }
            for it in shown
        ],
    }
