"""Injected NaN losses in a real run: each such step is skipped and counted, more than
``trainer.max_nan_steps`` in a row stop the run with one line and the last good weights in
its latest checkpoint, and the same command resumes it.

The NaN comes from a plugin loss (a plain policy-gradient loss, loaded with ``--plugin`` as
a user's would be) that returns NaN on the calls listed in ``FAULTTEST_NAN_CALLS``. With the
tiny recipe a step is one loss call (8 rows, one micro-batch, one epoch), so call ``n`` is
step ``n`` of the process.
"""

from __future__ import annotations

import json
import textwrap
import time
from pathlib import Path

import torch
from _lib.faultlib import (
    BATCH,
    GROUP,
    command,
    one_line_error,
    record,
    rows_by_step,
    run,
    step_metrics,
)
from safetensors.torch import load_file

from trinity_like.pipeline.checkpoint import CheckpointManager

PLUGIN = textwrap.dedent('''
    import os

    from trinity_like.components import AlgorithmType
    from trinity_like.registry import ALGORITHM_TYPE, POLICY_LOSS_FN

    CALLS = {"n": 0}

    @POLICY_LOSS_FN.register_module("faulttest_nan_pg")
    def nan_pg(*, logprob, advantages, action_mask):
        """Test: -A * logprob over the response tokens; NaN on the calls FAULTTEST_NAN_CALLS lists."""
        CALLS["n"] += 1
        loss = -(advantages * logprob * action_mask).sum() / action_mask.sum()
        poisoned = {int(c) for c in os.environ.get("FAULTTEST_NAN_CALLS", "").split(",") if c}
        return (loss * float("nan") if CALLS["n"] in poisoned else loss), {}

    ALGORITHM_TYPE.register_module("faulttest_nan_algo", module=AlgorithmType(
        description="Test: a policy gradient whose loss is NaN on chosen calls.",
        policy_loss="faulttest_nan_pg", advantage="grpo"))
''')
STEPS, MAX_NAN = 5, 2


def nan_command(tmp_path: Path, root: Path) -> list[str]:
    plugin = tmp_path / "nan_loss_plugin.py"
    plugin.write_text(PLUGIN)
    return [
        *command(
            root,
            f"trainer.total_steps={STEPS}",
            "algorithm.type=faulttest_nan_algo",
            f"trainer.max_nan_steps={MAX_NAN}",
        ),
        "--plugin",
        str(plugin),
    ]


def weights(ckpt: Path) -> dict:
    return load_file(str(ckpt / "model" / "model.safetensors"))


def test_nan_losses_skip_steps_then_stop_with_the_last_good_weights_and_resume(tmp_path, record_property):
    cmd = nan_command(tmp_path, tmp_path / "faulted")
    # NaN at steps 2, 3 (skipped: max_nan_steps=2 tolerates two in a row) and 4 (the third: stop)
    line = one_line_error(run(cmd, FAULTTEST_NAN_CALLS="2,3,4"))
    assert line == (
        f"trinity-like: error: step 4: 3 non-finite losses in a row (trainer.max_nan_steps={MAX_NAN}); "
        "stopping with the weights of the last good step"
    )
    run_dir = tmp_path / "faulted" / "grpo_arith"
    mgr = CheckpointManager(run_dir)
    latest = mgr.latest()
    mgr.verify(latest)
    assert latest.name == "step_000003"
    # the last good weights: those saved after step 1, untouched by the two skipped steps
    good, kept = weights(run_dir / "checkpoints" / "step_000001"), weights(latest)
    assert good.keys() == kept.keys() and all(torch.equal(good[k], kept[k]) for k in good)
    skipped = [
        json.loads(x)["step"]
        for x in (run_dir / "metrics.jsonl").read_text().splitlines()
        if json.loads(x).get("skipped/nan_loss") == 1.0
    ]
    assert skipped == [2, 3]

    t0 = time.monotonic()
    resumed = run(cmd)  # the same command; the fault is no longer injected
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    seconds = time.monotonic() - t0
    after = weights(run_dir / "checkpoints" / "step_000004")
    assert not all(torch.equal(after[k], good[k]) for k in good), "step 4 of the resumed run did not train"
    rows = rows_by_step(run_dir)
    assert {s: rows.get(s) for s in range(1, STEPS + 1)} == {s: BATCH * GROUP for s in range(1, STEPS + 1)}, rows
    assert rows.get("claimed", 0) == 0 and set(rows) - {"available"} == set(range(1, STEPS + 1)), rows

    # oracle: one uninterrupted run whose steps 2 and 3 are NaN (tolerated, no stop). Every
    # step's rewards, and the weights after steps 4 and 5, equal it: the resumed run explores
    # step 4 again, and its copy adds no rows (rows have deterministic ids, test_resume_batches.py),
    # so step 5 trains its own batch; what is explored does not depend on the machine's load
    # (test_load_determinism.py).
    straight = tmp_path / "straight" / "grpo_arith"
    out = run(nan_command(tmp_path, straight.parent), FAULTTEST_NAN_CALLS="2,3")
    assert out.returncode == 0, out.stderr[-3000:]
    ours, theirs = step_metrics(run_dir, "reward/mean"), step_metrics(straight, "reward/mean")
    assert [ours[s] for s in range(1, STEPS + 1)] == [theirs[s] for s in range(1, STEPS + 1)]
    for step, mine in ((4, after), (STEPS, weights(run_dir / "checkpoints" / f"step_{STEPS:06d}"))):
        oracle = weights(straight / "checkpoints" / f"step_{step:06d}")
        assert mine.keys() == oracle.keys() and all(torch.equal(mine[k], oracle[k]) for k in mine), step
    record(
        record_property,
        f"NaN loss at steps 2-4 (plugin loss; trainer.max_nan_steps={MAX_NAN})",
        "steps 2, 3 skipped and counted (skipped/nan_loss); clean error at step 4; latest checkpoint holds "
        "step 1's weights (compared bitwise)",
        f"yes ({seconds:.0f} s); every step's rewards, and the weights after steps 4 and 5, equal an "
        "uninterrupted run's with NaN at steps 2, 3",
        "0 lost, 0 twice (the skipped steps' rows consumed, not trained)",
    )
