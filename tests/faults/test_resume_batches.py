"""A run of mode ``both`` resumed from a checkpoint older than its last explored step trains,
step by step, the batches an uninterrupted run trains (issue 19, found by this test).

The killed run had written step ``t``'s rollouts; on resume the buffer hands them back
(available) and the explorer, restarted from the checkpoint's task position, explores step
``t`` again. Before the fix the copy got new random row ids: step ``t`` claimed the old rows,
step ``t + 1`` the re-explored copy, and step ``t + 1``'s own rollouts were left over. Rows
now get deterministic ids (run, step, task, place in the group; ``Stage.put``), so the
buffer's ``INSERT OR IGNORE`` drops the copy. Buffer rows by id are each consumed once either
way, so row counts cannot show it; the content of each step's batch (task ids, model
versions, rewards) against an uninterrupted run does.
"""

from __future__ import annotations

from _lib.faultlib import FAULT_ENV, STEPS, command, consumed_batches, record, run, split_groups


def test_each_step_trains_the_batch_an_uninterrupted_run_trains(tmp_path, straight, record_property):
    cmd = command(tmp_path, f"trainer.total_steps={STEPS}")
    killed = run(cmd, **{FAULT_ENV: "before_latest:2"})  # step 2 trained, its checkpoint not yet the latest
    assert killed.returncode == -9, killed.stderr[-3000:]
    resumed = run(cmd)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    ours, theirs = consumed_batches(tmp_path / "grpo_arith"), consumed_batches(straight)
    twice = [s for s in ours if any(ours[s] == ours[r] for r in ours if r < s)]
    record(
        record_property,
        "SIGKILL before step 2's checkpoint is the latest, resumed: batch content per step "
        "(task ids, model versions) vs an uninterrupted run",
        "each step trains the batch of an uninterrupted run; the re-explored copy of step 2 adds no rows"
        if not twice
        else f"step(s) {twice} trained an earlier step's batch again (re-explored copy)",
        "yes",
        f"0 lost / 0 twice by row id; {len(twice)} batch(es) twice by content",
    )
    assert ours == theirs
    assert split_groups(tmp_path / "grpo_arith") == {}  # the resumed run's steps trained whole groups
