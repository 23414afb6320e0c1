"""What a run explores does not depend on the machine's load (issue 36, part 6).

The same command run twice must explore and train the same batches: the resume and NaN-skip
oracles (test_nan_loss.py, test_resume_batches.py, ...) compare a broken run with an
uninterrupted one step by step. Here one run is quiet and the other is pinned to a single
core that three busy processes share with it, so its threads get about a quarter of a core.
Its reward fn computes for ``SPIN_S`` of CPU time per call, well inside
``explorer.reward_timeout_s``; on the loaded core each call takes several times that in wall
time. A reward limit on wall time cut those calls (retried, then every task of the step
skipped); the time charged to a call now leaves out what its thread waited for a CPU
(``call_with_deadline(..., unstarved=True)``), so both runs explore, score and train alike,
bit for bit.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from _lib.faultlib import BATCH, GROUP, child_env, command, record, rows_by_step, step_metrics

SPIN_S, TIMEOUT_S, BUSY = 0.1, 0.25, 3  # CPU seconds per reward call, its limit, processes beside the run
STEPS = 2

PLUGIN = textwrap.dedent(f'''
    import time

    from trinity_like.registry import REWARD_FN

    @REWARD_FN.register_module("faulttest_cpu_format")
    def cpu_format(*, response):
        """Test: computes for {SPIN_S} s of its thread's CPU time, then 1.0 if the response holds a digit."""
        end = time.thread_time() + {SPIN_S}
        while time.thread_time() < end:
            pass
        return float(any(c.isdigit() for c in response))
''')


def run_cmd(tmp_path: Path, root: Path) -> list[str]:
    plugin = tmp_path / "cpu_reward_plugin.py"
    plugin.write_text(PLUGIN)
    overrides = [
        f"trainer.total_steps={STEPS}",
        "explorer.reward_fn=faulttest_cpu_format",
        "explorer.reward_args={}",
        f"explorer.reward_timeout_s={TIMEOUT_S}",
        "explorer.reward_retries=1",
    ]
    return [*command(root, *overrides), "--plugin", str(plugin)]


def weights_sha(run_dir: Path) -> str:
    return hashlib.sha256(
        (run_dir / "checkpoints" / f"step_{STEPS:06d}" / "model" / "model.safetensors").read_bytes()
    ).hexdigest()


def test_a_run_on_a_loaded_core_explores_and_trains_what_a_quiet_run_does(tmp_path, record_property):
    quiet = tmp_path / "quiet"
    out = subprocess.run(run_cmd(tmp_path, quiet), capture_output=True, text=True, timeout=600, env=child_env())
    assert out.returncode == 0, out.stderr[-3000:]

    core = min(os.sched_getaffinity(0))

    def pin() -> None:
        os.sched_setaffinity(0, {core})

    busy = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=pin) for _ in range(BUSY)
    ]  # stopped by their pids below, whatever happens
    try:
        loaded = tmp_path / "loaded"
        out = subprocess.run(
            run_cmd(tmp_path, loaded), capture_output=True, text=True, timeout=900, env=child_env(), preexec_fn=pin
        )
    finally:
        for proc in busy:
            proc.kill()
            proc.wait()
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(x) for x in (loaded / "grpo_arith" / "metrics.jsonl").read_text().splitlines()]
    explored = [r for r in rows if "workflow/reward_timeouts" in r]
    assert len(explored) == STEPS
    cut = {r["step"]: (r["workflow/reward_timeouts"], r["workflow/skipped_tasks"]) for r in explored}
    assert all(v == (0.0, 0.0) for v in cut.values()), f"reward calls cut on the loaded core: {cut}"
    ours, theirs = step_metrics(loaded / "grpo_arith", "reward/mean"), step_metrics(quiet / "grpo_arith", "reward/mean")
    assert ours == theirs and len(ours) == STEPS
    assert weights_sha(loaded / "grpo_arith") == weights_sha(quiet / "grpo_arith")
    rows = rows_by_step(loaded / "grpo_arith")
    assert {s: rows.get(s) for s in range(1, STEPS + 1)} == {s: BATCH * GROUP for s in range(1, STEPS + 1)}, rows
    record(
        record_property,
        f"machine load: the run pinned to one core beside {BUSY} busy processes, its reward fn computing "
        f"{SPIN_S} s per call (explorer.reward_timeout_s={TIMEOUT_S})",
        "no reward call cut, no task skipped (time a call waits for a CPU is not charged to it); per-step "
        "rewards and the final weights equal a quiet run's, bit for bit",
        "-",
        "0 lost, 0 twice",
    )
