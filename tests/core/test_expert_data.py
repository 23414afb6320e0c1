"""Expert rows in RL batches are a declared property of a sample strategy, not a name the core knows."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from trinity_like.config import load_plan
from trinity_like.errors import ConfigError
from trinity_like.runner import run_plan

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def test_a_strategy_that_mixes_expert_rows_needs_expert_data():
    with pytest.raises(ConfigError, match=r"buffer.expert_data: the sample strategy 'mix' mixes expert rows"):
        load_plan(EXAMPLES / "mix.yaml", ["buffer.expert_data=null"])


def test_expert_data_no_strategy_reads_is_an_error_not_silently_ignored():
    with pytest.raises(
        ConfigError, match=r"mix.yaml:\d+: buffer.expert_data: the sample strategy 'default' uses no expert data"
    ):
        load_plan(
            EXAMPLES / "mix.yaml", ["algorithm.type=grpo", "algorithm.policy_loss={}", "algorithm.sample_strategy={}"]
        )


def test_the_loss_must_tell_expert_rows_from_sampled_ones():
    with pytest.raises(ConfigError, match=r"algorithm.policy_loss.name: 'ppo' cannot tell the expert rows"):
        load_plan(EXAMPLES / "mix.yaml", ["algorithm.policy_loss={name: ppo}"])


def test_a_plugin_strategy_that_declares_expert_data_gets_it_without_core_changes(tmp_path):
    plugin = tmp_path / "half_expert.py"
    plugin.write_text(
        textwrap.dedent('''
        from dataclasses import dataclass

        from trinity_like.registry import SAMPLE_STRATEGY

        @dataclass(frozen=True)
        class HalfParams:
            pass

        @SAMPLE_STRATEGY.register_module("half_expert")
        class HalfExpert:
            """Every rollout row plus as many expert rows."""
            uses_expert_data = True

            def __init__(self, *, params: HalfParams):
                pass

            def sample(self, *, experiences, batch_size, model_version, expert=None):
                rows = experiences.claim(batch_size)
                return rows + expert.next_batch(len(rows))

            def state_dict(self):
                return {}

            def load_state_dict(self, state):
                pass
    ''')
    )
    plan = load_plan(
        EXAMPLES / "mix.yaml",
        [
            "algorithm.sample_strategy={name: half_expert}",
            f"run_root={tmp_path}",
            "model.path=tiny-random",
            "trainer.engine=local",
            "trainer.total_steps=1",
            "monitor.progress=false",
            "buffer.eval_tasks=null",
            "explorer.batch_size=2",
            "explorer.group_size=4",
        ],
        plugins=[str(plugin)],
    )
    assert plan.stages[0].components["sample_strategy"].name == "half_expert"
    assert run_plan(plan) == 0
    rows = [json.loads(line) for line in (tmp_path / "mix" / "metrics.jsonl").read_text().splitlines()]
    (row,) = [r for r in rows if "time/step" in r]  # the step's line (its checkpoint's time follows on its own)
    assert row["expert_rows"] == 8.0 and row["staleness/mean"] == 0.0
