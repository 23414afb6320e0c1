"""Reward code that hangs, raises, or returns NaN, None or a string: rejected per call, retried,
then the task is skipped and counted -- and the run goes on."""

from __future__ import annotations

import json
import textwrap
import time

import pytest
from faultlib import RECIPE, TINY, record

from trinity_like.config import load_plan
from trinity_like.explorer.rewards import build_reward_fn, score_with_retries
from trinity_like.registry import REWARD_FN
from trinity_like.runner import run_plan

BAD_RETURNS = {"none": None, "text": "1.0", "nan": float("nan"), "inf": float("-inf"), "list": [1.0, 0.0]}
for _key, _value in BAD_RETURNS.items():
    REWARD_FN.register_module(f"faulttest_returns_{_key}", module=lambda *, response, _v=_value: _v, force=True)


@pytest.mark.parametrize("key", BAD_RETURNS)
def test_a_reward_that_is_not_a_finite_number_is_rejected_and_retried(key):
    fn = build_reward_fn(f"faulttest_returns_{key}")
    out = score_with_retries(fn, {"response": "4"}, retries=2, timeout_s=5)
    assert out.reward is None and out.attempts == 3
    if key in ("nan", "inf"):
        assert out.error.startswith("non-finite reward")
    else:
        assert out.error.startswith(f"RewardTypeError: reward function 'faulttest_returns_{key}' returned "), out.error
        assert out.error.endswith("not a number")


PLUGIN = textwrap.dedent('''
    import time
    from trinity_like.registry import REWARD_FN

    CALLS = {"n": 0}
    MISBEHAVE = ["hang", "raise", "nan", "none", "text"]  # the first five calls, in order; then honest

    @REWARD_FN.register_module("faulttest_misbehaving")
    def misbehaving(*, response):
        """Test: each way a reward function goes wrong, once."""
        CALLS["n"] += 1
        how = MISBEHAVE[CALLS["n"] - 1] if CALLS["n"] <= len(MISBEHAVE) else "ok"
        if how == "hang":
            time.sleep(3600)
        if how == "raise":
            raise RuntimeError("reward server unreachable")
        return {"nan": float("nan"), "none": None, "text": "one", "ok": float(any(c.isdigit() for c in response))}[how]
''')


def test_a_run_survives_every_kind_of_bad_reward_call(tmp_path, record_property):
    plugin = tmp_path / "misbehaving_reward.py"
    plugin.write_text(PLUGIN)
    plan = load_plan(RECIPE, [f"run_root={tmp_path}", *TINY, "explorer.batch_size=4", "buffer.train_batch_size=8",
                              "explorer.reward_fn=faulttest_misbehaving", "explorer.reward_args={}",
                              "explorer.reward_timeout_s=0.5", "explorer.reward_retries=1", "trainer.total_steps=2"],
                     plugins=[str(plugin)])
    t0 = time.monotonic()
    assert run_plan(plan) == 0
    rows = [json.loads(line) for line in (tmp_path / "grpo_arith" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r["step"] == 1 and "workflow/skipped_tasks" in r)
    # calls 1+2 (hang, then raise on retry) skip task 1; 3+4 (NaN, then None) skip task 2;
    # call 5 returns a string, its retry is honest: task 3 is kept.
    assert first["workflow/skipped_tasks"] == 2.0
    assert first["workflow/reward_timeouts"] == 0.0 and first["workflow/reward_errors"] == 2.0  # last attempt of each
    assert first["workflow/reward_retries"] == 3.0
    assert [r["step"] for r in rows if "time/rollout" in r] == [1, 2]
    record(record_property, "reward fn hangs / raises / returns NaN, None, a string",
           "survived: each call timed out or rejected, retried, 2 tasks skipped and counted",
           f"not needed (run finished in {time.monotonic() - t0:.0f} s)", "not counted by this test")
