"""The pack registers everything through the public registries; every algorithm type resolves and validates."""

from __future__ import annotations

import importlib.metadata
import inspect
from pathlib import Path

import pytest

import algorithms
from trinity_like.components import OFF, SLOTS, WEIGHTED_SLOTS, AlgorithmType, build_params, required_inputs
from trinity_like.registry import ALGORITHM_TYPE, REGISTRIES

EXPECTED = {
    "ALGORITHM_TYPE": {
        "sft",
        "dpo",
        "rm",
        "grpo",
        "dr_grpo",
        "dapo",
        "rloo",
        "reinforce_plus_plus",
        "ppo",
        "gspo",
        "cispo",
        "mix",
    },
    "POLICY_LOSS_FN": {
        "ppo",
        "importance_sampling",
        "gspo",
        "cispo",
        "sft",
        "dpo",
        "bradley_terry",
        "mix",
        "value_clip",
    },
    "ADVANTAGE_FN": {"grpo", "group_centered", "rloo", "reinforce_plus_plus", "gae"},
    "KL_FN": {"k1", "k2", "k3", "low_var_kl", "abs"},
    "ENTROPY_LOSS_FN": {"entropy"},
    "SAMPLE_STRATEGY": {"default", "mix", "staleness"},
}
# Batch fields a component may ask for (trinity_like.components, trainer/base.py).
BATCH_FIELDS = {
    "logprob",
    "old_logprob",
    "ref_logprob",
    "advantages",
    "action_mask",
    "entropy",
    "values",
    "old_values",
    "returns",
    "is_expert",
    "rewards",
    "group_index",
    "token_level_rewards",
    "scores",
}
NORMALISERS = {"num_tokens", "num_seqs", "num_expert_tokens", "num_expert_seqs"}


def test_the_pack_is_an_installed_plugin_entry_point():
    eps = importlib.metadata.entry_points(group="trinity_like.plugins")
    assert any(ep.name == "algorithms" and ep.value == "algorithms" for ep in eps)


@pytest.mark.parametrize("registry", sorted(EXPECTED))
def test_importing_the_pack_registers_everything_with_a_description(registry):
    reg = REGISTRIES[registry]
    assert EXPECTED[registry] <= set(reg.names())
    for name in EXPECTED[registry]:
        assert reg.origin(name).startswith("algorithms.") or registry == "ALGORITHM_TYPE"
        line = reg.describe(name)
        assert line and "\n" not in line and len(line) < 130, (registry, name, line)


def test_trinity_like_list_shows_the_pack(capsys):
    from trinity_like.cli import main

    assert main(["list"]) == 0
    out = capsys.readouterr().out
    for registry, names in EXPECTED.items():
        for name in names:
            assert any(
                ln.split()[:1] == [name] and REGISTRIES[registry].describe(name) in ln for ln in out.splitlines()
            )


def _slot_params(algo: AlgorithmType, slot: str) -> dict:
    params = dict(algo.params.get(slot, {}))
    if slot in WEIGHTED_SLOTS:  # a weighted slot's coefficient belongs to the slot, not the component
        assert isinstance(params.pop("coef"), float)
    return params


def test_off_is_a_name_of_the_recipe_never_a_registered_component():
    """`name: none` switches a slot off in the resolver; no registry holds a stand-in `none`."""
    assert not [reg.name for reg in REGISTRIES.values() if OFF in reg.names()]


@pytest.mark.parametrize("name", sorted(EXPECTED["ALGORITHM_TYPE"]))
def test_every_algorithm_type_resolves_its_components_and_params(name):
    algo = ALGORITHM_TYPE.get(name)
    assert isinstance(algo, AlgorithmType) and ALGORITHM_TYPE.describe(name) == algo.description
    needs: set[str] = set()
    for slot, component_name in algo.components().items():
        component = REGISTRIES[SLOTS[slot]].get(component_name)
        build_params(component, _slot_params(algo, slot), where=f"{name}.{slot}")
        if slot != "sample_strategy":
            assert required_inputs(component) <= BATCH_FIELDS, (slot, component_name)
            sig = inspect.signature(component)
            assert set(sig.parameters) - {"params"} <= BATCH_FIELDS | NORMALISERS
            needs |= required_inputs(component)
    # the flags agree with what the components ask for
    assert algo.use_reference == ("ref_logprob" in needs)
    assert algo.use_critic == bool({"values", "old_values"} & needs)
    assert (algo.schema == "pair") == (not needs & {"old_logprob", "rewards", "token_level_rewards"} and name != "sft")
    assert algo.use_rollout == (algo.advantage is not None)
    if not algo.use_rollout:
        assert algo.requires == {"mode": "train"}


def test_the_flags_each_type_is_known_by():
    t = {name: ALGORITHM_TYPE.get(name) for name in EXPECTED["ALGORITHM_TYPE"]}
    assert (t["dpo"].use_reference, t["dpo"].schema, t["dpo"].use_rollout) == (True, "pair", False)
    assert (t["rm"].schema, t["rm"].policy_loss, t["rm"].use_rollout) == ("pair", "bradley_terry", False)
    assert (t["sft"].schema, t["sft"].use_rollout) == ("experience", False)
    assert (t["ppo"].use_critic, t["ppo"].advantage, t["ppo"].kl_penalty, t["ppo"].value_loss) == (
        True,
        "gae",
        "k1",
        "value_clip",
    )
    assert t["dapo"].dynamic_sampling and t["dapo"].params["policy_loss"]["clip_ratio_high"] == 0.28
    assert not any(a.dynamic_sampling for n, a in t.items() if n != "dapo")
    assert t["dr_grpo"].params["advantage"]["norm_by_std"] is False
    assert t["dr_grpo"].params["policy_loss"]["loss_agg_mode"] == "seq-mean-token-sum-norm"
    assert (t["mix"].policy_loss, t["mix"].sample_strategy) == ("mix", "mix")
    assert (t["gspo"].policy_loss, t["cispo"].policy_loss, t["rloo"].advantage) == ("gspo", "cispo", "rloo")


def test_each_algorithm_module_is_short_with_its_equation_and_paper():
    root = Path(algorithms.__file__).parent
    for path in sorted((root / "losses").glob("*.py")) + sorted((root / "advantages").glob("*.py")) + [root / "kl.py"]:
        if path.name == "__init__.py":
            continue
        text = path.read_text()
        doc = text.split('"""')[1]
        assert "=" in doc, f"{path.name}: no equation in the module docstring"
        assert any(s in doc for s in ("arXiv", "19", "20")), f"{path.name}: no paper reference"
        assert len(text.splitlines()) < 120, f"{path.name} is long"


@pytest.mark.parametrize("name", sorted(EXPECTED["ALGORITHM_TYPE"]))
def test_every_algorithm_type_validates_as_a_recipe(name, tmp_path):
    """Through the real recipe resolver: presets applied, components resolved, inputs provided."""
    from trinity_like.config import load_plan

    (tmp_path / "data.jsonl").write_text("")
    algo = ALGORITHM_TYPE.get(name)
    if algo.use_rollout:
        from trinity_like.registry import SAMPLE_STRATEGY

        mixes = getattr(SAMPLE_STRATEGY.get(algo.sample_strategy), "uses_expert_data", False)
        expert = "  expert_data: {path: data.jsonl}\n" if mixes else ""
        data = f"mode: both\nbuffer:\n  tasks: {{path: data.jsonl}}\n{expert}"
    else:
        data = "mode: train\nbuffer:\n  train_data: {path: data.jsonl}\n"
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"name: t\nalgorithm:\n  type: {name}\n{data}")
    (stage,) = load_plan(recipe).stages
    assert stage.algorithm is algo
    assert stage.components["policy_loss"].name == algo.policy_loss
