"""One convention for every slot: swaps, weights (`coef`) and `none`, and one component handle."""

from __future__ import annotations

import pickle
import textwrap

import pytest
import torch

from trinity_like.components import ComponentSpec
from trinity_like.config import ResolvedComponent, describe_plan, load_plan
from trinity_like.errors import ConfigError
from trinity_like.ops import AggParams
from trinity_like.trainer import objective

GRPO = textwrap.dedent(
    """\
    name: t
    algorithm:
      type: grpo
    buffer:
      tasks:
        generator: arithmetic
    trainer:
      engine: local
    """
)


@pytest.fixture
def recipe(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(GRPO)
    return path


def error_of(path, overrides) -> str:
    with pytest.raises(ConfigError) as info:
        load_plan(path, overrides)
    return str(info.value)


def test_every_weighted_slot_takes_coef_as_a_slot_key(recipe):
    (stage,) = load_plan(recipe, ["algorithm.entropy_loss.name=entropy", "algorithm.entropy_loss.coef=0.01"]).stages
    assert stage.components["kl_loss"] == ComponentSpec("KL_FN", "k3", None, 0.001)  # grpo's weight
    assert stage.components["entropy_loss"] == ComponentSpec("ENTROPY_LOSS_FN", "entropy", AggParams(), 0.01)
    # a swapped KL estimator keeps the slot's weight: coef weighs the term, not the estimator
    (stage,) = load_plan(recipe, ["algorithm.kl_loss.name=k2"]).stages
    assert stage.components["kl_loss"] == ComponentSpec("KL_FN", "k2", None, 0.001)
    assert "kl_loss: k2 coef=0.001 (swapped; algorithm grpo uses k3)" in describe_plan(
        load_plan(recipe, ["algorithm.kl_loss.name=k2"])
    )


def test_a_weight_is_required_and_checked_with_file_and_line(recipe):
    msg = error_of(recipe, ["algorithm.entropy_loss.name=entropy"])
    assert msg.startswith(
        f"{recipe}: override 'algorithm.entropy_loss.name=entropy': algorithm.entropy_loss.coef: "
        "set the weight of the 'entropy' entropy_loss"
    )
    msg = error_of(recipe, ["algorithm.kl_loss.coef=-1"])
    assert "algorithm.kl_loss.coef: must be a number >= 0 (got -1)" in msg
    # coef is no param of a component: on an unweighted slot it is an unknown parameter
    assert "algorithm.policy_loss.coef: unknown parameter of ppo_loss" in error_of(
        recipe, ["algorithm.policy_loss.coef=1"]
    )


def test_none_switches_a_slot_off_and_dry_run_says_so(recipe):
    plan = load_plan(recipe, ["algorithm.kl_loss.name=none", "algorithm.entropy_loss.name=none"])
    (stage,) = plan.stages
    assert "kl_loss" not in stage.components and "entropy_loss" not in stage.components
    assert not stage.needs_reference  # nothing asks for the reference model any more
    assert "    kl_loss: none (switched off; algorithm grpo uses k3)" in describe_plan(plan)
    obj = objective.objective_from_stage(stage, one_update=True)
    assert obj.kl_loss is None and obj.entropy_loss is None


def test_slots_a_stage_cannot_train_without_cannot_be_off(recipe):
    msg = error_of(recipe, ["algorithm.policy_loss.name=none"])
    assert "algorithm.policy_loss.name: cannot be 'none': algorithm 'grpo' needs a policy_loss" in msg
    assert "cannot be 'none'" in error_of(recipe, ["algorithm.sample_strategy.name=none"])
    assert "algorithm.value_loss.name: algorithm 'grpo' trains no critic" in error_of(
        recipe, ["algorithm.value_loss.name=value_clip"]
    )


def test_the_objective_weights_the_entropy_term_by_the_slot_coef(recipe):
    (stage,) = load_plan(
        recipe,
        ["algorithm.entropy_loss.name=entropy", "algorithm.entropy_loss.coef=0.1", "algorithm.kl_loss.name=none"],
    ).stages
    obj = objective.objective_from_stage(stage, one_update=True)
    g = torch.Generator().manual_seed(0)
    logprob = -torch.rand(3, 4, generator=g, dtype=torch.float64)
    entropy = torch.rand(3, 4, generator=g, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.float64)
    batch = {
        "response_mask": mask,
        "advantages": torch.randn(3, 4, generator=g, dtype=torch.float64),
        "num_tokens": mask.sum(),
        "num_seqs": torch.tensor(3),
    }
    with_entropy, metrics = obj({"logprob": logprob, "entropy": entropy}, batch)
    without, _ = objective.Objective(policy_loss=stage.components["policy_loss"], one_update=True)(
        {"logprob": logprob}, batch
    )
    # oracle: -coef * mean over the 7 response tokens of the entropy, summed by hand
    by_hand = sum(float(entropy[i, j]) for i in range(3) for j in range(4) if mask[i, j]) / 7
    assert float(with_entropy - without) == pytest.approx(-0.1 * by_hand)
    assert metrics["entropy"] == pytest.approx(by_hand)


def test_one_picklable_component_handle_everywhere(recipe):
    assert ResolvedComponent is ComponentSpec and objective.ComponentSpec is ComponentSpec
    (stage,) = load_plan(recipe).stages
    comp = stage.components["policy_loss"]
    clone = pickle.loads(pickle.dumps(comp))
    assert clone == comp and clone.fn is comp.fn and comp.fn.__name__ == "ppo_loss"
    assert (comp.registry, comp.name, comp.coef) == ("POLICY_LOSS_FN", "ppo", None)
