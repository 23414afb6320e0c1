"""Every logged metric of every registered policy loss reads the same whatever the micro-batching.

The convention under test (``trinity_like.trainer.base.mean_metrics``): a ``*_loss`` metric
is each micro-batch's share of a whole-batch total and is summed; any other metric is a
mean over what a micro-batch holds and is averaged over the micro-batches that report it.

What is asserted, for each loss in ``POLICY_LOSS_FN`` (iterated, so a new loss is covered):

- ``*_loss`` metrics are equal with 1 and with 4 micro-batches on a *ragged* batch
  (responses of random lengths, MIX's expert rows at the end as the pipeline puts them);
  summing shares is exact whatever the micro-batches hold.
- every metric, means included, is equal on a *uniform* batch: full-length responses and
  expert rows spread evenly, so each micro-batch holds the same number of tokens, rows,
  pairs and expert rows. Averaging micro-batch means weighs micro-batches equally (verl's
  convention); it equals the whole-batch mean exactly when they weigh the same, and only
  then, so a mean metric on a ragged batch may differ a little -- not asserted.
- the same on the ``verl`` engine (2 FSDP workers x 4 micro-batches of 2 rows) against the local
  engine's single micro-batch, to the engines' logprob agreement: in tests/trainer/test_verl_engine.py,
  on that module's engine (a verl start costs a minute on 2 cores).

The losses, the ``AsHeads`` adapter (value and reward-model losses read their heads off a language
model's logprobs) and the batches are in tests/_lib/metric_invariance.py, shared with that test.
"""

from __future__ import annotations

import math

import pytest
from _lib.metric_invariance import LOSSES, B, assert_same, batches_of, objective_keys, run

from trinity_like.components import build_params
from trinity_like.models.tiny import build_tiny_model
from trinity_like.registry import POLICY_LOSS_FN
from trinity_like.trainer.base import is_summed_metric, mean_metrics
from trinity_like.trainer.local_engine import LocalEngine
from trinity_like.trainer.params import ModelParams


def test_loss_metrics_are_summed_by_suffix_and_means_averaged_over_the_reporters():
    per_micro = [
        {"policy_loss": 0.25, "clip_frac": 0.5, "nonfinite_loss": 1.0},
        {"policy_loss": 0.5, "clip_frac": 0.1, "expert_nll": 2.0},
        {"policy_loss": 0.25, "expert_nll": 4.0},
    ]
    assert mean_metrics(per_micro) == {"policy_loss": 1.0, "clip_frac": 0.3, "expert_nll": 3.0, "nonfinite_loss": 1.0}
    assert is_summed_metric("rl_loss") and is_summed_metric("value_loss") and not is_summed_metric("loss_scale")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3))


@pytest.fixture(scope="module")
def local_engines(tiny_path):
    """The same weights with one micro-batch of 16 rows and with four of 4."""
    return LocalEngine(ModelParams(path=tiny_path, micro_batch_size=B)), LocalEngine(
        ModelParams(path=tiny_path, micro_batch_size=B // 4)
    )


@pytest.fixture(scope="module")
def batches(local_engines):
    return batches_of(local_engines[0])


@pytest.mark.parametrize("name", LOSSES)
def test_local_engine_metrics_do_not_depend_on_the_micro_batch_size(name, local_engines, batches):
    one, four = local_engines
    for layout, batch in batches.items():
        whole, split = run(one, name, batch), run(four, name, batch)
        assert whole.keys() == split.keys(), (name, layout)
        assert "policy_loss" in whole and all(math.isfinite(v) for v in whole.values()), (name, layout)
        keys = objective_keys(whole, layout)
        assert_same(split, whole, keys, rel=1e-5, abs_=1e-6, what=(name, layout))


def test_mix_reports_each_part_once_whatever_the_micro_batches(local_engines, batches):
    """MIX's two parts: shares summed to the whole batch's, means only where a part has rows."""
    one, four = local_engines
    batch = batches["ragged"]  # the last micro-batch of four holds every expert row, the others none
    whole, split = run(one, "mix", batch), run(four, "mix", batch)
    mu = build_params(POLICY_LOSS_FN.get("mix"), {}).mu
    assert whole["policy_loss"] == pytest.approx((1 - mu) * whole["rl_loss"] + mu * whole["sft_loss"], rel=1e-5)
    assert split["expert_nll"] == pytest.approx(whole["expert_nll"], rel=1e-5)  # not diluted by 3 empty ones
    assert split["expert_frac"] == whole["expert_frac"] == 0.25
    # the SFT part is token-mean NLL over the expert tokens: the same number as expert_nll
    assert whole["sft_loss"] == pytest.approx(whole["expert_nll"], rel=1e-5)
