"""The explorer as a Ray actor: a crash mid-step is survived (the run restarts it from its checkpoint)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from trinity_like.config import load_plan
from trinity_like.runner import run_plan

REPO = Path(__file__).resolve().parents[2]
RECIPE = REPO / "examples" / "grpo_arith.yaml"

KILLER = textwrap.dedent(
    '''
    import os
    from dataclasses import dataclass
    from pathlib import Path
    from trinity_like.registry import REWARD_FN

    @dataclass(frozen=True)
    class DieOnceParams:
        marker: str = ""   # file created by the one call that kills its process
        at_call: int = 20  # which call (in this process) dies

    CALLS = {"n": 0}

    @REWARD_FN.register_module("die_once")
    def die_once(*, response: str, answer: str, params: DieOnceParams) -> float:
        """Test: kills its own process once, on the at_call-th call."""
        CALLS["n"] += 1
        if CALLS["n"] == params.at_call and not Path(params.marker).exists():
            Path(params.marker).write_text(str(os.getpid()))
            os._exit(1)  # as abrupt as an OOM kill
        return float(response.strip() == answer)
    '''
)


@pytest.mark.slow
def test_a_crashed_explorer_actor_is_restarted_and_the_run_continues(tmp_path, capsys):
    plugin = tmp_path / "killer.py"
    plugin.write_text(KILLER)
    marker = tmp_path / "died"
    plan = load_plan(
        RECIPE,
        [
            f"run_root={tmp_path}",
            "model.path=tiny-random",
            "trainer.engine=local",
            "explorer.placement=ray",
            "explorer.batch_size=2",
            "explorer.group_size=4",
            "trainer.total_steps=4",
            "checkpoint.interval=1",
            "monitor.progress=false",
            "monitor.eval_at_start=false",
            "buffer.eval_tasks.size=4",
            "explorer.reward_fn=die_once",
            f"explorer.reward_args={{marker: {marker}, at_call: 12}}",
        ],
        plugins=[str(plugin)],
    )
    try:
        assert run_plan(plan) == 0
    finally:
        import ray

        ray.shutdown()
    assert marker.exists(), "the reward fn never killed the actor"
    rows = [json.loads(line) for line in (tmp_path / "grpo_arith" / "metrics.jsonl").read_text().splitlines()]
    # 8 reward calls a step: the 12th is in step 2, which is explored again from step 1's checkpoint
    assert [r["step"] for r in rows if "time/rollout" in r] == [1, 2, 3, 4]  # the death came before step 2 logged
    assert [(r["step"], r["fault/restarts"]) for r in rows if "fault/restarts" in r] == [(2, 1.0)]
    said = [line for line in capsys.readouterr().out.splitlines() if line.startswith("restart ")]
    assert len(said) == 1 and said[0].startswith("restart 1 of 2: the explorer actor (pid "), said
    assert said[0].endswith(", in step 2; resuming from checkpoint step_000001"), said
