"""Registry behaviour: decorators on functions and classes, duplicates, unknown names."""

from __future__ import annotations

import pytest

from trinity_like.components import AlgorithmType
from trinity_like.registry import REGISTRIES, Registry, RegistryError, UnknownNameError, find_registry


def test_the_registries_exist():
    assert set(REGISTRIES) == {
        "ALGORITHM_TYPE",
        "POLICY_LOSS_FN",
        "ADVANTAGE_FN",
        "KL_FN",
        "ENTROPY_LOSS_FN",
        "SAMPLE_STRATEGY",
        "WORKFLOW",
        "REWARD_FN",
        "BUFFER_STORAGE",
        "MONITOR",
        "TASK_SOURCE",
        "ENV",
        "REWARD_TRANSFORM",
        "ROLLOUT_ENGINE",
        "TRAIN_ENGINE",
        "ROLLOUT_CORRECTION",
    }


def test_decorator_registers_functions_and_classes_with_descriptions():
    reg = Registry("T")

    @reg.register_module("double")
    def double(x):
        """Twice x.

        More text that is not part of the one-line description.
        """
        return 2 * x

    @reg.register_module()
    class Thing:
        """A thing."""

    assert reg.get("double")(4) == 8
    assert reg.get("Thing") is Thing
    assert reg.describe("double") == "Twice x."
    assert reg.describe("Thing") == "A thing."
    assert reg.names() == ["Thing", "double"]


def test_instance_entries_use_their_description_field():
    reg = Registry("T")
    reg.register_module("a", module=AlgorithmType(description="An algorithm.", policy_loss="x"))
    assert reg.describe("a") == "An algorithm."


def test_duplicate_name_is_an_error_unless_forced():
    reg = Registry("T")
    reg.register_module("x", module=lambda: 1)
    with pytest.raises(RegistryError, match="already registered"):
        reg.register_module("x", module=lambda: 2)
    reg.register_module("x", module=lambda: 3, force=True)
    assert reg.get("x")() == 3


def test_unknown_name_lists_registered_names_and_closest_match():
    reg = Registry("T", "policy loss")
    for name in ("ppo", "gspo", "cispo"):
        reg.register_module(name, module=lambda: None)
    with pytest.raises(UnknownNameError) as info:
        reg.get("gpso")
    msg = str(info.value)
    assert "did you mean 'gspo'" in msg
    assert "registered: cispo, gspo, ppo" in msg
    with pytest.raises(KeyError):  # still a KeyError for callers that catch that
        reg.get("nothing-like-it")


def test_find_registry_is_case_insensitive_and_helpful():
    assert find_registry("policy_loss_fn").name == "POLICY_LOSS_FN"
    with pytest.raises(UnknownNameError, match="did you mean 'POLICY_LOSS_FN'"):
        find_registry("POLICY_LOS_FN")


def test_bad_names_are_rejected():
    reg = Registry("T")
    with pytest.raises(RegistryError):
        reg.register_module("", module=lambda: None)
