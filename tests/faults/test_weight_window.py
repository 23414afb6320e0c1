"""The trainer's weight ledger refuses a row sampled by weights it sent, but longer ago than the
recipe's schedule allows for the row's batch; and an update that reached one rollout engine of
two is caught at the first check of the stale engine's rows.

The window (:mod:`trinity_like.pipeline.weight_ledger`): the batch of step ``s`` may be sampled
by the weights of step ``s - 1 - offset`` (``synchronizer.offset``), rounded down to a step
that publishes (every ``interval``); the expected versions below are worked out by hand from
that rule, not by the ledger's own function. A recipe has one rollout engine (there is no
engine count in ``explorer``), so "one engine of two" is tested here with two real rollout
engines of the tiny model, in this process, fed by one ledger: the update is applied to one
and never reaches the other, either not at all (it keeps its version number: only the window
names it) or as a dropped load (it takes the version number: the digest names it). The same
fault end to end, in a real run with one engine, is ``test_weight_identity.py``'s ``missed``.
"""

from __future__ import annotations

import re

import pytest
import torch
from _lib.faultlib import record

from trinity_like.errors import TrinityError
from trinity_like.experience import Experience
from trinity_like.explorer.engine_contract import SamplingParams
from trinity_like.explorer.engines import build_rollout_engine
from trinity_like.models.resolve import load_model
from trinity_like.models.weight_digest import model_digest, weights_digest
from trinity_like.pipeline.weight_ledger import WeightLedger

LINE = re.compile(
    r"^step (\d+): row \w+ of task '[^']*' was sampled by weights v(\d+) "
    r"with digest (\w+), expected (\w+): (.*); refusing to train on it$"
)


def refusal(ledger: WeightLedger, step: int, rows: list[Experience], trainer_version: int) -> tuple:
    with pytest.raises(TrinityError) as err:
        ledger.check(step, rows, trainer_version)
    line = str(err.value)
    assert "\n" not in line
    m = LINE.match(line)
    assert m, line
    return int(m[1]), int(m[2]), m[3], m[4], m[5]


def row(version: int, digest: str, explore_step: int, task: str = "t") -> Experience:
    return Experience(
        tokens=[1, 2, 3],
        prompt_length=1,
        model_version=version,
        weights_digest=digest,
        explore_step=explore_step,
        task_id=task,
    )


def ledger_of(versions: int, offset: int, interval: int) -> WeightLedger:
    """A ledger that sent versions 0..versions-1, each a distinct digest (as a trainer's steps give)."""
    ledger = WeightLedger(offset=offset, interval=interval)
    for v in range(versions):
        ledger.record(v, {"w": torch.full((4,), float(v))})
    return ledger


@pytest.mark.parametrize(
    "offset, interval, step, oldest",
    [
        (0, 1, 3, 2),  # on-policy: batch 3 is sampled by step 2's weights
        (1, 1, 3, 1),  # one step ahead: step 1's
        (2, 1, 5, 2),
        (0, 2, 3, 2),  # published at steps 2, 4, ...: batch 3 by step 2's weights
        (0, 2, 4, 2),  # batch 4 too (step 3 published nothing)
        (1, 2, 4, 2),  # batch 4, one step ahead: step 2's
        (1, 2, 3, 0),  # batch 3, one step ahead: step 1 published nothing, so the start's
    ],
)
def test_a_row_older_than_its_batch_allows_is_refused_and_one_within_is_accepted(offset, interval, step, oldest):
    ledger = ledger_of(6, offset, interval)
    trainer_version = step - 1
    within = [row(v, ledger.sent[v], step) for v in range(oldest, trainer_version + 1)]
    ledger.check(step, within, trainer_version)  # every sent version from the oldest allowed on
    if oldest == 0:
        return  # nothing is older than the start
    stale = row(oldest - 1, ledger.sent[oldest - 1], step, task="late")
    got = refusal(ledger, step, [*within, stale], trainer_version)
    assert got[:4] == (step, oldest - 1, ledger.sent[oldest - 1], ledger.sent[oldest])
    assert f"the batch of step {step} needs v{oldest} or newer" in got[4]
    assert f"synchronizer.offset {offset}, interval {interval}" in got[4]


def test_the_window_is_the_rows_batch_not_the_training_step():
    """A smaller ``buffer.train_batch_size`` leaves rows of batch 2 for step 4: their age at
    training is the sample strategy's (``staleness``), not a broken sync."""
    ledger = ledger_of(4, offset=0, interval=1)
    ledger.check(4, [row(1, ledger.sent[1], 2), row(3, ledger.sent[3], 4)], 3)
    assert refusal(ledger, 4, [row(1, ledger.sent[1], 3)], 3)[:2] == (4, 1)  # batch 3 needed v2
    ledger.check(4, [row(0, ledger.sent[0], 0)], 3)  # no batch recorded (an older buffer's row): no window


def test_a_row_of_a_version_newer_than_the_trainer_is_still_refused():
    ledger = ledger_of(4, offset=1, interval=1)
    got = refusal(ledger, 3, [row(3, ledger.sent[3], 3)], 2)
    assert got[1] == 3 and "the trainer never sent v3 (it is at v2)" in got[4]


# -- one engine of two ---------------------------------------------------------------------------
PROMPTS = [[1, 5, 9, 14], [2, 7, 3]]


@pytest.fixture(scope="module")
def trained():
    """Version 1 as a trainer sends it: the tiny model's weights after a change of every tensor."""
    model, _ = load_model("tiny-random", dtype=torch.float32)
    gen = torch.Generator().manual_seed(7)
    state = {k: v + 0.05 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
    return {**state, "lm_head.weight": state["model.embed_tokens.weight"]}


def rows_of(engine, explore_step: int) -> list[Experience]:
    """Batch ``explore_step``'s rows as the explorer stamps them: the engine's version and digest."""
    groups = engine.generate(PROMPTS, SamplingParams(n=2, max_new_tokens=4, seed=explore_step))
    return [
        Experience(
            tokens=PROMPTS[s.prompt_index] + s.token_ids,
            prompt_length=len(PROMPTS[s.prompt_index]),
            logprobs=s.logprobs,
            model_version=s.model_version,
            weights_digest=s.weights_digest,
            explore_step=explore_step,
            task_id=f"p{s.prompt_index}",
        )
        for group in groups
        for s in group
    ]


def two_engines():
    return [build_rollout_engine("native", "tiny-random", device="cpu", dtype="float32") for _ in range(2)]


def test_an_update_that_never_reached_the_second_engine_is_refused_by_the_window(trained, record_property):
    start, _ = load_model("tiny-random", dtype=torch.float32)
    ledger = WeightLedger(torch.float32)
    ledger.record(0, start.state_dict())
    ledger.record(1, trained)  # the sync after step 1
    first, second = two_engines()
    first.update_weights(trained, version=1)  # the second engine is skipped: weights and version stay
    batch = rows_of(first, 2) + rows_of(second, 2)  # batch 2, half from each engine
    ledger.check(2, rows_of(first, 2), 1)  # the updated engine's rows train
    step, version, found, expected, why = refusal(ledger, 2, batch, 1)
    assert (step, version) == (2, 0)
    assert found == model_digest(start)  # oracle: the starting model digested on its own
    assert expected == weights_digest(trained, dtype=torch.float32) != found
    assert "needs v1 or newer" in why
    record(
        record_property,
        "weight update applied to one rollout engine of two (two engines in one process, one ledger)",
        "the first check of the batch refuses the skipped engine's first row: one line, step, v0, both digests",
        "-",
        "none trained on stale weights",
    )


def test_an_update_dropped_on_the_second_engine_is_refused_by_the_digest(trained, monkeypatch):
    from trinity_like import fault_points

    start, _ = load_model("tiny-random", dtype=torch.float32)
    ledger = WeightLedger(torch.float32)
    ledger.record(0, start.state_dict())
    ledger.record(1, trained)
    first, second = two_engines()
    first.update_weights(trained, version=1)
    monkeypatch.setattr(fault_points, "_loads", 0)
    monkeypatch.setenv(fault_points.WEIGHT_ENV_VAR, "drop:1")  # the second engine's load is lost on the way
    assert second.update_weights(trained, version=1) == 1  # it takes the version number all the same
    monkeypatch.delenv(fault_points.WEIGHT_ENV_VAR)
    step, version, found, expected, why = refusal(ledger, 2, rows_of(first, 2) + rows_of(second, 2), 1)
    assert (step, version) == (2, 1)
    assert found == model_digest(start) and expected == weights_digest(trained, dtype=torch.float32)
    assert "does not hold the weights sent" in why
