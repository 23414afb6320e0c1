"""Mode ``both``: a step whose exploration skipped tasks trains on the rows it has, and a step
that explored no rows at all is skipped and counted; neither waits for rows that never come.

Real runs (``trinity-like run`` as a child process, the tiny model, 2 tasks x 4 samples = the
8 rows ``buffer.train_batch_size`` asks for) with a reward plugin that fails on purpose: its
first two calls (one call and its retry) fail, so one task of step 1 is skipped; or every call
fails, so no step has rows. Each run has a time bound: before the fix the claim waited for ever.
"""

from __future__ import annotations

import json
import textwrap

import pytest
from _lib.faultlib import BATCH, GROUP, command, record, rows_by_step, run, split_groups

PLUGIN = textwrap.dedent('''
    from trinity_like.registry import REWARD_FN

    CALLS = {"n": 0}

    @REWARD_FN.register_module("faulttest_fails_first_two")
    def fails_first_two(*, response):
        """Test: the first call and its retry fail (one task skipped), then honest."""
        CALLS["n"] += 1
        if CALLS["n"] <= 2:
            raise RuntimeError("reward server unreachable")
        return float(any(c.isdigit() for c in response))

    @REWARD_FN.register_module("faulttest_always_fails")
    def always_fails(*, response):
        """Test: every call fails (every task skipped)."""
        raise RuntimeError("reward server unreachable")
''')


def _metrics(run_dir, step: int) -> dict:
    out: dict = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if row["step"] == step:
            out.update(row)
    return out


@pytest.fixture
def plugin(tmp_path):
    path = tmp_path / "failing_reward.py"
    path.write_text(PLUGIN)
    return str(path)


def _run_two_steps(tmp_path, plugin: str, reward_fn: str, retries: int):
    """Two steps of the default recipe with the plugin's ``reward_fn``; it must finish (no hang)."""
    cmd = command(
        tmp_path,
        "trainer.total_steps=2",
        f"explorer.reward_fn={reward_fn}",
        "explorer.reward_args={}",
        f"explorer.reward_retries={retries}",
        "--plugin",
        plugin,
    )
    done = run(cmd, timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    return tmp_path / "grpo_arith"


def test_a_step_short_of_rows_trains_on_the_rows_it_explored(tmp_path, plugin, record_property):
    run_dir = _run_two_steps(tmp_path, plugin, "faulttest_fails_first_two", retries=1)
    first, second = _metrics(run_dir, 1), _metrics(run_dir, 2)
    assert first["workflow/skipped_tasks"] == 1.0
    assert first["skipped/short_batch_rows"] == GROUP and "loss" in first
    assert "skipped/short_batch_rows" not in second and "loss" in second
    assert rows_by_step(run_dir) == {1: (BATCH - 1) * GROUP, 2: BATCH * GROUP}
    assert split_groups(run_dir) == {}  # a skipped task takes its whole group with it
    record(
        record_property,
        "reward fails for one task: a step short of rows (mode both)",
        "trained on the 4 rows explored, short rows counted",
        "not needed (no hang)",
        "0 lost, 0 twice",
    )


def test_a_step_with_no_rows_is_skipped_and_counted(tmp_path, plugin, record_property):
    run_dir = _run_two_steps(tmp_path, plugin, "faulttest_always_fails", retries=0)
    for step in (1, 2):
        metrics = _metrics(run_dir, step)
        assert metrics["workflow/skipped_tasks"] == BATCH and metrics["skipped/empty_batch"] == 1.0
        assert "loss" not in metrics
    assert rows_by_step(run_dir) == {}
    record(
        record_property,
        "reward fails for every task: a step with no rows (mode both)",
        "step skipped and counted",
        "not needed (no hang)",
        "nothing to lose",
    )
