"""Every registered policy loss on a language model, and the batches that show whether its logged metrics
depend on the micro-batching (tests/trainer/test_metric_invariance.py, the local engine; the verl engine's
workers in tests/trainer/test_verl_engine.py, which ship this module to them by value).

Value and reward-model losses run on the same language model: ``AsHeads`` reads ``values`` and ``scores``
off its logprobs, which is all the reduction over micro-batches can see of a head.
"""

from __future__ import annotations

import math

import torch

import algorithms  # noqa: F401  (registers the pack, as the entry point does)
from _lib.trainer_batches import make_batch
from trinity_like.components import build_params
from trinity_like.ops import normalizers
from trinity_like.registry import POLICY_LOSS_FN
from trinity_like.trainer.base import is_summed_metric
from trinity_like.trainer.objective import ComponentSpec, Objective

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


def batches_of(engine) -> dict[str, dict[str, torch.Tensor]]:
    """The ragged and the uniform batch, old/ref logprobs near ``engine``'s own."""
    logprob_of = lambda b: engine.compute_logprobs(b)["logprob"]  # noqa: E731
    return {"ragged": engine_batch(logprob_of, uniform=False), "uniform": engine_batch(logprob_of, uniform=True)}
