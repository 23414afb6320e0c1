"""Each test's tier, decided from what its module and its fixtures use (docs/contributing.md):

- ``system``: starts Ray (a local instance or a cluster), a browser, the bubblewrap jail of the code_exec
  reward, a fuzzing run (schemathesis), or needs a GPU;
- ``integration``: starts another process (the CLI, a server, a benchmark's smoke run: anything through
  ``subprocess``), or is marked ``slow`` (the real small model);
- ``unit``: the rest, in this process only; ``pytest -m unit`` is the fast loop.

A test module's own source, the sources of the ``_lib`` helpers it imports, and the fixtures a test uses
from a conftest (with the ``_lib`` helpers they call) are read for the signals below. A test that
already carries one of the three marks keeps it (the way to overrule the rules for one test).
"""

from __future__ import annotations

import inspect
import re
import sys
from functools import cache
from pathlib import Path

import pytest

TIERS = ("unit", "integration", "system")

# (tier, what the test starts, pattern in the source): the first tier that matches, in TIERS' reverse order
SIGNALS = (
    (
        "system",
        "Ray",
        r"^\s*(import ray|from ray\b)|\bray\.init\(|backend\s*=\s*[\"']ray[\"']|[\"']ray[\"'],\s*[\"']start[\"']",
    ),
    ("system", "a browser", r"\bplaywright\b"),
    ("system", "the bubblewrap jail (code_exec)", r"\bcode_exec\b|\bbwrap\b"),
    ("system", "a fuzzing run", r"\bschemathesis\b"),
    ("integration", "another process", r"\bsubprocess\b|\bPopen\b|\bsys\.executable\b|\bmultiprocessing\b"),
    ("integration", "another process (wandb's service)", r"\bwandb\b"),
)
# Folders whose every test is at least this tier: tests/pipeline runs whole recipes (the orchestration
# layer: explorer, trainer, buffer and their threads or Ray actors), 10-50 s each; tests/rm trains reward
# models and runs recipes on them, 13-100 s each (measured on 2 cores, pytest -n 2, a busy machine).
FOLDERS = {"pipeline": ("integration", "whole recipe runs"), "rm": ("integration", "reward-model runs")}
# In-process tests measured at 5 s or more on 2 cores (pytest -n 2 --durations, a busy machine): out of
# the fast loop, into integration. A test id here is "folder/file.py::test name" without parameters.
MEASURED_SLOW = {
    "cookbook/test_calculator.py::test_a_model_that_learnt_to_call_the_calculator_reads_its_result",  # 38 s
    "compare/test_trackers.py::test_wandb_holds_every_step_of_the_jsonl_offline",  # 21 s
    "envs/test_rollout.py::test_seeds_are_per_episode_and_turn",  # 8 s
    "envs/test_env_workflow.py::test_a_recipe_trains_on_two_turn_episodes_with_only_the_policy_tokens_in_the_loss",
    "core/test_expert_data.py::test_a_plugin_strategy_that_declares_expert_data_gets_it_without_core_changes",
    "buffer/test_rows_jsonl.py::test_both_codecs_round_trip_exactly",  # 6 s
    "cookbook/test_arithmetic.py::test_a_failing_reward_drops_the_group_like_the_workflow_skips_it",  # 6 s
    "cookbook/test_rl_train.py::test_the_loop_logs_kl_to_the_base_and_each_stage",  # 5 s
    "explorer/test_engine.py::test_greedy_matches_full_recompute_with_ragged_prompts_and_stops",  # 27 s
    "explorer/test_engine.py::test_continuous_batching_does_not_change_results",  # 10 s
    "explorer/test_engine.py::test_stop_strings_and_max_tokens",  # 8 s
    "explorer/test_engine.py::test_sampled_logprobs_match_full_forward_under_the_sampling_distribution",  # 5 s
    "explorer/test_decode_device.py::test_looking_every_16_steps_gives_the_samples_of_looking_every_step",  # 22 s
    "explorer/test_step_ops.py::test_the_count_sees_every_projection_and_does_not_depend_on_rows_or_keys",  # 16 s
    "explorer/test_step_ops.py::test_a_decode_step_at_the_30_layer_shape_stays_lean",  # 11 s
    "explorer/test_token_parity.py::test_a_sample_of_other_uniforms_is_caught",  # 14 s
    "explorer/test_token_parity.py::test_a_greedy_token_that_trails_the_argmax_is_caught",  # 6 s
    "explorer/test_token_parity.py::test_fp32_samples_agree_with_the_float64_oracle",  # 5 s
    "explorer/test_prefix_cache.py::test_a_group_whose_prompt_extends_a_kept_sequence",  # 10 s
    "explorer/test_prefix_cache.py::test_eviction_under_a_small_budget_stays_correct",  # 6 s
    "explorer/test_step_graphs.py::test_in_a_concurrent_run_captures_and_trainer_steps_take_turns",  # 8 s
}
LIB = Path(__file__).resolve().parent


def _lib_sources(module) -> str:
    """The sources of the ``_lib`` helper modules that ``module`` imports names or modules from."""
    names = {
        getattr(value, "__module__", None) or getattr(value, "__name__", "")
        for value in vars(module).values()
        if inspect.isfunction(value) or inspect.isclass(value) or inspect.ismodule(value)
    }
    return "\n".join(
        _source(sys.modules[n].__file__) for n in sorted(names) if n.startswith("_lib.") and n in sys.modules
    )


@cache
def _source(file: str) -> str:
    return Path(file).read_text(encoding="utf-8")


@cache
def _module_text(module_name: str) -> str:
    module = sys.modules[module_name]
    return _source(module.__file__) + "\n" + _lib_sources(module)


def _fixture_text(item: pytest.Item) -> str:
    """The fixtures this test uses that live outside its module (conftests, ``_lib``), each with the
    ``_lib`` helpers its module imports and it names."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return ""
    own = getattr(item, "module", None)
    funcs = (d.func for defs in info.name2fixturedefs.values() for d in defs)
    return "\n".join(_fixture_source(f) for f in funcs if sys.modules.get(f.__module__) not in (None, own))


@cache
def _fixture_source(func) -> str:
    """One fixture's source with the ``_lib`` helpers its module imports and it names (once per fixture:
    thousands of tests share a few dozen fixtures)."""
    try:
        source = inspect.getsource(func)
    except (OSError, TypeError):  # a built-in fixture without a source file
        return ""
    parts = [source]
    for name, value in vars(sys.modules[func.__module__]).items():
        lib = getattr(value, "__module__", "") or ""
        if lib.startswith("_lib.") and re.search(rf"\b{re.escape(name)}\b", source):
            parts.append(_source(sys.modules[lib].__file__))
    return "\n".join(parts)


@cache
def _signals_in(text: str) -> frozenset[int]:
    """Which of SIGNALS appear in ``text`` (once per module text and per fixture set)."""
    return frozenset(i for i, (_, _, pattern) in enumerate(SIGNALS) if re.search(pattern, text, flags=re.M))


def tier_of(item: pytest.Item) -> tuple[str, str]:
    """(tier, why) for one collected test."""
    for tier in TIERS:
        if item.get_closest_marker(tier) is not None:
            return tier, "marked"
    if item.get_closest_marker("gpu") is not None:
        return "system", "a GPU"
    if f"{item.path.parent.name}/{item.path.name}::{getattr(item, 'originalname', item.name)}" in MEASURED_SLOW:
        return "integration", "measured slow"
    folder = FOLDERS.get(item.path.parent.name) if item.path.parent.parent.name == "tests" else None
    module = getattr(item, "module", None)
    found = _signals_in(_module_text(module.__name__) if module is not None else "") | _signals_in(_fixture_text(item))
    for i, (tier, what, _) in enumerate(SIGNALS):
        if i in found:
            return tier, what
    if folder is not None:
        return folder
    if item.get_closest_marker("slow") is not None:
        return "integration", "marked slow"
    return "unit", "in this process"


def mark_tiers(items: list[pytest.Item]) -> None:
    """Give every test exactly one tier mark (``pytest -m unit``, ``-m "not system"``)."""
    for item in items:
        tier, _ = tier_of(item)
        if item.get_closest_marker(tier) is None:
            item.add_marker(getattr(pytest.mark, tier))
