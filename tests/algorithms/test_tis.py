"""ppo_tis (algorithms/losses/tis.py): PPO with a truncated importance weight min(pi_old / mu, C),
against hand-computed values and gradients and a per-token loop; reached from a recipe
(the pipeline's objective hands it the sampler's logprobs) and from the client (``tis``)."""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest
import torch
from _lib.algo_testlib import DT, autograd_grad, rand_batch

import trinity_like.client as tinker
from trinity_like.client.losses import loss_inputs, loss_spec
from trinity_like.components import build_params, call_component
from trinity_like.config import load_plan
from trinity_like.errors import ConfigError
from trinity_like.registry import POLICY_LOSS_FN
from trinity_like.runner import run_plan
from trinity_like.trainer.objective import objective_from_stage

types = tinker.types


def run(batch, **params):
    fn = POLICY_LOSS_FN.get("ppo_tis")
    return call_component(fn, batch, build_params(fn, params))


def one_token(ratio: float, weight: float, adv: float):
    """One token with pi / pi_old = ratio and pi_old / mu = weight."""
    old = math.log(0.5)
    return {
        "logprob": torch.tensor([[old + math.log(ratio)]], dtype=DT),
        "old_logprob": torch.tensor([[old]], dtype=DT),
        "rollout_logprob": torch.tensor([[old - math.log(weight)]], dtype=DT),
        "advantages": torch.tensor([[adv]], dtype=DT),
        "action_mask": torch.ones(1, 1, dtype=DT),
    }


@pytest.mark.parametrize(
    "ratio, weight, adv, loss, grad",
    [
        (1.1, 1.25, 1.0, -1.25 * 1.1, -1.25 * 1.1),  # w under the cap: -w A r, gradient -w A r
        (1.1, 2.5, 1.0, -2.0 * 1.1, -2.0 * 1.1),  # w = 2.5 truncated at C = 2
        (1.5, 2.5, 1.0, -2.0 * 1.2, 0.0),  # PPO's clip still acts: ratio beyond 1.2 with A > 0, no gradient
        (0.9, 0.25, -2.0, 0.25 * 2.0 * 0.9, 0.25 * 2.0 * 0.9),  # a weight below 1 is kept as it is
    ],
)
def test_ppo_tis_by_hand(ratio, weight, adv, loss, grad):
    b = one_token(ratio, weight, adv)
    value, metrics = run(b, tis_cap=2.0)
    assert value.item() == pytest.approx(loss)
    g = autograd_grad(lambda lp: run({**b, "logprob": lp}, tis_cap=2.0)[0], b["logprob"])
    assert g.item() == pytest.approx(grad)  # d(-w A r)/d logprob = -w A r where not clipped
    assert metrics["tis_weight_mean"] == pytest.approx(min(weight, 2.0))
    assert metrics["tis_truncated_frac"] == (1.0 if weight > 2.0 else 0.0)


def test_ppo_tis_is_a_per_token_loop_and_ppo_when_the_sampler_is_the_proximal_policy():
    b = rand_batch(seed=3)
    value, metrics = run(b, tis_cap=1.3, clip_ratio_high=0.28)
    total, count = 0.0, 0.0
    for i in range(b["logprob"].shape[0]):  # token-mean over the masked tokens, written out
        for t in range(b["logprob"].shape[1]):
            if b["action_mask"][i, t]:
                r = math.exp(b["logprob"][i, t] - b["old_logprob"][i, t])
                w = min(math.exp(b["old_logprob"][i, t] - b["rollout_logprob"][i, t]), 1.3)
                a = float(b["advantages"][i, t])
                total += w * max(-a * r, -a * min(max(r, 0.8), 1.28))
                count += 1
    assert value.item() == pytest.approx(total / count)
    assert 0 < metrics["tis_truncated_frac"] < 1  # both sides of the cap are exercised
    same = {**b, "rollout_logprob": b["old_logprob"]}  # mu = pi_old: weight 1, plain PPO
    ppo = POLICY_LOSS_FN.get("ppo")
    expected = call_component(ppo, same, build_params(ppo, {}))[0]
    assert run(same)[0].item() == pytest.approx(expected.item())


def test_bad_cap_is_a_config_error():
    with pytest.raises(ConfigError, match="tis_cap must be > 0"):
        build_params(POLICY_LOSS_FN.get("ppo_tis"), {"tis_cap": 0.0})


# -- a recipe ----------------------------------------------------------------------------------------------
RECIPE = textwrap.dedent("""\
    name: tis
    model:
      path: tiny-random
      max_response_tokens: 4
    algorithm:
      type: grpo
      policy_loss:
        name: ppo_tis
        tis_cap: 1.5
      kl_loss:
        name: none
    buffer:
      tasks:
        generator: arithmetic
    explorer:
      batch_size: 2
      group_size: 4
    trainer:
      engine: local
      total_steps: 1
    monitor:
      progress: false
    """)


def test_a_recipe_trains_with_ppo_tis_on_the_samplers_logprobs(tmp_path):
    path = tmp_path / "tis.yaml"
    path.write_text(RECIPE)
    plan = load_plan(path, [f"run_root={tmp_path}"])
    (stage,) = plan.stages
    assert stage.components["policy_loss"].name == "ppo_tis" and stage.components["policy_loss"].params.tis_cap == 1.5
    # The objective hands the loss the batch's rollout_logprob (the sampler's) beside the learner's.
    objective = objective_from_stage(stage, one_update=True)
    b = rand_batch(seed=1)
    batch = {k: b[k] for k in ("advantages", "rollout_logprob")} | {"response_mask": b["action_mask"]}
    loss, _ = objective({"logprob": b["logprob"]}, batch)
    w = (b["logprob"] - b["rollout_logprob"]).exp().clamp(max=1.5)  # on-policy: pi_old is the current weights
    expected = (-(b["advantages"] * w) * b["action_mask"]).sum() / b["action_mask"].sum()
    assert loss.item() == pytest.approx(expected.item(), rel=1e-4)
    assert run_plan(plan) == 0  # and a real step on the tiny model
    rows = [json.loads(line) for line in (tmp_path / "tis" / "metrics.jsonl").read_text().splitlines()]
    step = next(r for r in rows if r.get("step") == 1 and any("tis_weight_mean" in k for k in r))
    assert any(0 < v <= 1.5 for k, v in step.items() if "tis_weight_mean" in k)


# -- the client ---------------------------------------------------------------------------------------------
def test_the_clients_tis_is_the_truncated_importance_sampling_gradient(tmp_path):
    """The client's ``tis``: value -sum A min(pi / mu, C) at the learner's current logprobs; and a
    step on it equals a step on cross-entropy weighted by A * C when every ratio is above C."""
    lp_BT = torch.tensor([[-1.0, -2.0, -0.5]], dtype=DT, requires_grad=True)
    arrays = {
        "logprobs": torch.tensor([[-1.5, -1.0, -3.0]], dtype=DT),
        "advantages": torch.tensor([[1.0, -1.0, 2.0]], dtype=DT),
    }
    mask = torch.ones(1, 3, dtype=DT)
    spec = loss_spec("tis", {"tis_cap": 2.0})
    loss, _ = call_component(spec.fn, loss_inputs("tis", lp_BT, arrays, mask), spec.params)
    w = [min(math.exp(0.5), 2.0), min(math.exp(-1.0), 2.0), min(math.exp(2.5), 2.0)]  # 1.65, 0.37, 2 (cut)
    assert loss.item() == pytest.approx(-(1.0 * w[0] - 1.0 * w[1] + 2.0 * w[2]))  # token sum
    loss.backward()
    np.testing.assert_allclose(lp_BT.grad[0].numpy(), [-w[0], w[1], -2.0 * w[2]])

    with tinker.ServiceClient(log_dir=tmp_path) as service:
        a = service.create_lora_training_client("tiny-random", rank=0, seed=0)
        b = service.create_lora_training_client("tiny-random", rank=0, seed=0)
        ids = a.get_tokenizer().encode("What is 2 + 3? 5 and more")
        adv = np.linspace(-1.0, 1.0, len(ids) - 1).astype(np.float32)
        far = types.Datum(
            model_input=types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={  # mu tiny: r >> C
                "target_tokens": ids[1:],
                "logprobs": np.full(len(ids) - 1, -60.0, dtype=np.float32),
                "advantages": adv,
            },
        )
        out = a.forward_backward([far], "tis", {"tis_cap": 0.5}).result()
        assert out.metrics["loss:sum"] == pytest.approx(-0.5 * adv.sum(), abs=1e-5)
        weighted = types.Datum(
            model_input=far.model_input, loss_fn_inputs={"target_tokens": ids[1:], "weights": 0.5 * adv}
        )
        b.forward_backward([weighted], "cross_entropy").result()
        for client in (a, b):
            client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        probe = types.Datum(
            model_input=far.model_input, loss_fn_inputs={"target_tokens": ids[1:], "weights": np.ones(len(ids) - 1)}
        )
        after = [c.forward([probe], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy() for c in (a, b)]
        np.testing.assert_allclose(after[0], after[1], atol=1e-5)
        start = service.create_lora_training_client("tiny-random", rank=0, seed=0)
        before = start.forward([probe], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        assert np.abs(after[0] - before).max() > 1e-3  # the step did move the weights
