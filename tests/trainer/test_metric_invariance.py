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
- the same on the ``verl`` engine (2 FSDP workers x 4 micro-batches of 2 rows, one engine
  start) against the local engine's single micro-batch, to the engines' logprob agreement.

Value and reward-model losses run on the same language model: the test's ``AsHeads``
adapter reads ``values`` and ``scores`` off its logprobs, which is all the reduction
over micro-batches can see of a head.
"""

from __future__ import annotations

import math
import sys

import pytest
import torch
from _lib.trainer_batches import make_batch

import algorithms  # noqa: F401  (registers the pack, as the entry point does)
from trinity_like.components import build_params
from trinity_like.models.tiny import build_tiny_model
from trinity_like.ops import normalizers
from trinity_like.registry import POLICY_LOSS_FN
from trinity_like.trainer.base import is_summed_metric, mean_metrics
from trinity_like.trainer.local_engine import LocalEngine
from trinity_like.trainer.objective import ComponentSpec, Objective
from trinity_like.trainer.params import ModelParams

B, P, R, VOCAB = 16, 5, 6, 400
# Every loss of the first-party pack: other test modules register losses of their own in
# this process (at collection), which verl's Ray workers cannot import.
LOSSES = sorted(n for n in POLICY_LOSS_FN.names() if POLICY_LOSS_FN.get(n).__module__.startswith("algorithms."))


class AsHeads:
    """Any registered loss on a language model: ``values [B, R]`` and ``scores [B]`` read off its logprobs."""

    def __init__(self, objective: Objective) -> None:
        self.objective = objective

    def __call__(self, outputs, batch):
        lp = outputs["logprob"]
        heads = {"values": lp, "scores": (lp * batch["response_mask"]).sum(-1) / batch["response_mask"].shape[1]}
        return self.objective({**outputs, **heads}, batch)


def loss_callable(name: str) -> AsHeads:
    fn = POLICY_LOSS_FN.get(name)
    return AsHeads(Objective(policy_loss=ComponentSpec("POLICY_LOSS_FN", name, build_params(fn, {}))))


def engine_batch(logprob_of, *, uniform: bool, seed: int = 5) -> dict[str, torch.Tensor]:
    """A batch with every field a loss may ask for, old/ref logprobs near the model's own.

    ``uniform``: every prompt and response full length and every other row an expert row; else ragged
    lengths and the last quarter of the rows expert rows (MIX's layout), the longest. Pairs (DPO, BT) are
    rows 2i, 2i + 1 either way, and every micro-batch size used here is even.
    """
    batch = make_batch(VOCAB, B, P, R, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    if uniform:
        batch["attention_mask"][:] = 1  # rows of one length: the engines' length order keeps them in place
        batch["input_ids"][:] = torch.randint(3, VOCAB, (B, P + R), generator=g)
        batch["position_ids"] = (batch["attention_mask"].cumsum(1) - 1).clamp(min=0)
        batch["response_mask"] = torch.ones(B, R)
        batch["is_expert"] = torch.arange(B) % 2 == 1
    else:
        batch["is_expert"] = torch.arange(B) >= B * 3 // 4
        # the expert rows are the longest (the engines' length order keeps them in one
        # micro-batch of four), every other row is shorter
        batch["attention_mask"][B * 3 // 4 :] = 1
        batch["attention_mask"][: B * 3 // 4, -1] = 0
        batch["response_mask"] = batch["response_mask"] * batch["attention_mask"][:, P:]
        batch["position_ids"] = (batch["attention_mask"].cumsum(1) - 1).clamp(min=0)
    lp = logprob_of(batch)
    batch["old_logprob"] = lp + 0.2 * torch.randn(B, R, generator=g)  # ratios near 1: some clipped, some not
    batch["ref_logprob"] = lp + 0.2 * torch.randn(B, R, generator=g)
    batch["old_values"] = lp + 0.5 * torch.randn(B, R, generator=g)
    batch["returns"] = lp + torch.randn(B, R, generator=g)
    batch["rewards"] = torch.randint(0, 2, (B,), generator=g).float()
    batch["group_index"] = torch.arange(B) // 4
    batch["rollout_logprob"] = lp + 0.2 * torch.randn(B, R, generator=g)  # the sampler's, for TIS
    batch.update(normalizers(batch["response_mask"], batch["is_expert"]))  # as the pipeline does
    batch["rows_per_example"] = torch.tensor(2)  # pairs move together (the pipeline marks pair batches so)
    return batch


def run(engine, name: str, batch) -> dict[str, float]:
    loss = loss_callable(name)
    metrics = engine.forward_backward(batch, loss, need_entropy=loss.objective.need_entropy)
    engine.zero_grad()  # no step: every call sees the same weights
    return metrics


def objective_keys(metrics: dict, layout: str) -> list[str]:
    """The metrics of the objective that must not depend on how the batch is split: all of them
    on a uniform layout, the summed ones otherwise. ``perf/*`` describe the work the engine did
    (tokens run, padding), which micro-batching changes by design."""
    keys = [k for k in metrics if not k.startswith("perf/")]
    return keys if layout == "uniform" else [k for k in keys if is_summed_metric(k) or k == "loss"]


def assert_same(got: dict, want: dict, keys, rel: float, abs_: float, what: str) -> None:
    for k in keys:
        assert math.isclose(got[k], want[k], rel_tol=rel, abs_tol=abs_), (what, k, got[k], want[k])


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
    one, _ = local_engines
    logprob_of = lambda b: one.compute_logprobs(b)["logprob"]  # noqa: E731
    return {"ragged": engine_batch(logprob_of, uniform=False), "uniform": engine_batch(logprob_of, uniform=True)}


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


# -- the verl engine ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def verl_engine(tiny_path):
    import ray
    import ray.cloudpickle

    from trinity_like.trainer.verl_engine import VerlEngine, VerlParams

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # AsHeads lives in this test module
    engine = VerlEngine(ModelParams(path=tiny_path, micro_batch_size=2), verl=VerlParams(num_workers=2))
    yield engine
    engine.close()
    ray.shutdown()


@pytest.mark.slow
def test_verl_engine_metrics_equal_the_local_engines_single_micro_batch(verl_engine, local_engines, batches):
    """2 workers x 4 micro-batches of 2 rows (verl) against 1 micro-batch of 16 rows (local), every loss."""
    one, _ = local_engines
    for name in LOSSES:
        for layout, batch in batches.items():
            whole, sharded = run(one, name, batch), run(verl_engine, name, batch)
            assert whole.keys() == sharded.keys(), (name, layout)
            keys = objective_keys(whole, layout)
            # the engines' logprobs agree to ~1e-6 (test_verl_engine's parity test)
            assert_same(sharded, whole, keys, rel=1e-4, abs_=1e-5, what=(name, layout))
