"""Weight syncs that fail silently, caught by the weights' identity at the first step that would train on them.

Each run is the tiny recipe as a child process; ``TRINITY_LIKE_WEIGHT_FAULT=<kind>:1`` spoils
the first weight update the rollout engine receives (:func:`trinity_like.fault_points.arriving_weights`,
on the engine's own load path), while the engine takes the new version number as a real
failure does: the update dropped, applied to all tensors but one, or a LoRA adapter never
merged (the engine keeps the base model's weights). The first update is the sync after
step 1, so step 2 is the first to train on rows sampled by it: the run must stop there,
exit 2, with one line naming step 2, version 1, the digest the engine found and the one
the trainer sent -- each checked against an independent computation from the files (the
step-1 checkpoint's weights, the starting model). Modes: the explorer in the driver's
process, as a Ray actor, and as its own process beside a ``mode=train`` trainer.
"""

from __future__ import annotations

import json
import re
import sqlite3
from pathlib import Path

import pytest
import torch
from _lib.faultlib import command, kill, one_line_error, record, run, start
from safetensors.torch import load_file

from trinity_like.models.resolve import load_model
from trinity_like.models.weight_digest import model_digest, weights_digest

LINE = re.compile(
    r"^trinity-like: error: step (\d+): row \w+ of task '[^']*' was sampled by weights v(\d+) "
    r"with digest (\w+), expected (\w+): (.*); refusing to train on it$"
)
ENV = "TRINITY_LIKE_WEIGHT_FAULT"
STEPS = 3


def refused(line: str) -> tuple[int, int, str, str]:
    m = LINE.match(line)
    assert m, line
    return int(m[1]), int(m[2]), m[3], m[4]


def error_line(out) -> str:
    """The run's one error line; Ray may log its start on stderr before it (``Started a local Ray instance``)."""
    errors = [x for x in out.stderr.splitlines() if x.startswith("trinity-like: error: ")]
    assert out.returncode == 2 and len(errors) == 1 and out.stderr.splitlines()[-1] == errors[0], out.stderr[-3000:]
    return errors[0]


def sent_digest(run_dir: Path, step: int, dtype: torch.dtype) -> str:
    """The oracle of what the trainer sent as ``step``: its checkpoint's weights, digested here."""
    return weights_digest(
        load_file(str(run_dir / "checkpoints" / f"step_{step:06d}" / "model" / "model.safetensors")), dtype=dtype
    )


def start_digest(dtype: torch.dtype) -> str:
    model, _ = load_model("tiny-random", dtype=dtype)
    return model_digest(model)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_dropped_update_stops_the_run_at_the_first_step_that_trains_on_it(tmp_path, dtype, record_property):
    out = run(command(tmp_path, f"trainer.total_steps={STEPS}", f"explorer.dtype={dtype}"), **{ENV: "drop:1"})
    step, version, found, expected = refused(one_line_error(out))
    torch_dtype = getattr(torch, dtype)
    assert (step, version) == (2, 1)
    assert found == start_digest(torch_dtype)  # the engine still holds the starting weights
    assert expected == sent_digest(tmp_path / "grpo_arith", 1, torch_dtype)
    if dtype == "bfloat16":
        record(
            record_property,
            "weight update dropped on the way (explorer in the driver, bf16 sampler, fp32 trainer)",
            "stops at step 2, exit 2, one line: step, version, both digests",
            "-",
            "none trained on stale weights",
        )


def test_an_update_applied_to_all_tensors_but_one_is_refused(tmp_path, record_property):
    out = run(command(tmp_path, f"trainer.total_steps={STEPS}", "explorer.dtype=float32"), **{ENV: "all_but_one:1"})
    step, version, found, expected = refused(one_line_error(out))
    assert (step, version) == (2, 1)
    assert expected == sent_digest(tmp_path / "grpo_arith", 1, torch.float32)
    assert found not in (expected, start_digest(torch.float32))  # neither the old weights nor the new
    record(
        record_property,
        "weight update applied to all tensors but one",
        "stops at step 2, exit 2, one line: step, version, both digests",
        "-",
        "none trained on stale weights",
    )


def test_a_lora_adapter_never_merged_is_refused(tmp_path, record_property):
    out = run(
        command(tmp_path, f"trainer.total_steps={STEPS}", "explorer.dtype=float32", "model.lora_rank=4"),
        **{ENV: "unmerged:1"},
    )
    step, version, found, expected = refused(one_line_error(out))
    assert (step, version) == (2, 1)
    assert found == start_digest(torch.float32)  # the base model: the adapter never reached the engine
    assert expected != found
    record(
        record_property,
        "LoRA adapter not merged into the sampler's weights",
        "stops at step 2, exit 2, one line: step, version, both digests",
        "-",
        "none trained on stale weights",
    )


def test_a_dropped_update_in_the_explorer_actor_is_refused(tmp_path, record_property):
    out = run(
        command(tmp_path, f"trainer.total_steps={STEPS}", "explorer.dtype=float32", "explorer.placement=ray"),
        timeout=300,
        **{ENV: "drop:1"},
    )
    step, version, found, expected = refused(error_line(out))
    assert (step, version) == (2, 1)
    assert found == start_digest(torch.float32)
    assert expected == sent_digest(tmp_path / "grpo_arith", 1, torch.float32)
    record(
        record_property,
        "weight update dropped in the explorer's Ray actor",
        "stops at step 2, exit 2, one line: step, version, both digests",
        "-",
        "none trained on stale weights",
    )


def test_a_dropped_update_in_the_explorer_process_stops_the_trainer_process(tmp_path, record_property):
    common = (f"trainer.total_steps={STEPS}", "explorer.dtype=float32")
    explorer = start(command(tmp_path, *common, "mode=explore"), **{ENV: "drop:1"})
    try:
        out = run(command(tmp_path, *common, "mode=train"), timeout=300)
    finally:
        kill(explorer)  # it waits for weights the stopped trainer will never publish
    step, version, found, expected = refused(one_line_error(out))
    assert (step, version) == (2, 1)
    assert found == start_digest(torch.float32)
    assert expected == sent_digest(tmp_path / "grpo_arith", 1, torch.float32)
    record(
        record_property,
        "weight update dropped in the explorer process (split modes)",
        "the trainer process stops at step 2, exit 2, one line: step, version, both digests",
        "-",
        "none trained on stale weights",
    )


@pytest.mark.parametrize(
    "mode, offset, first",
    [
        ("driver", 0, 2),  # batch 2 needs the weights of step 1
        ("driver", 1, 3),  # one step ahead, concurrent: batch 2 may use v0; batch 3 needs v1
        ("ray", 0, 2),  # the explorer as a Ray actor (the fault reaches it through its runtime_env)
        ("split", 0, 2),  # a mode=explore process beside a mode=train trainer
    ],
)
def test_an_update_that_never_reached_the_engine_is_refused_by_the_staleness_window(
    tmp_path, mode, offset, first, record_property
):
    """The update never reaches the engine, which keeps its version number too (``missed``): its
    rows name weights the trainer did send (v0), only older than their batch allows."""
    common = (f"trainer.total_steps={STEPS + offset}", "explorer.dtype=float32", f"synchronizer.offset={offset}")
    if mode == "split":
        explorer = start(command(tmp_path, *common, "mode=explore"), **{ENV: "missed:1"})
        try:
            out = run(command(tmp_path, *common, "mode=train"), timeout=300)
        finally:
            kill(explorer)
    else:
        placement = ("explorer.placement=ray",) if mode == "ray" else ()
        out = run(command(tmp_path, *common, *placement), timeout=300, **{ENV: "missed:1"})
    line = error_line(out) if mode == "ray" else one_line_error(out)
    step, version, found, expected = refused(line)
    assert (step, version) == (first, 0)
    assert found == start_digest(torch.float32)  # the starting weights, under their own version
    assert expected == sent_digest(tmp_path / "grpo_arith", 1, torch.float32)
    assert f"the batch of step {first} needs v1 or newer (synchronizer.offset {offset}, interval 1)" in line
    where = {
        "driver": "explorer in the driver",
        "ray": "explorer's Ray actor",
        "split": "explorer process, split modes",
    }
    where = where[mode]
    record(
        record_property,
        f"weight update that never reached the engine, version number and all ({where}, offset {offset})",
        f"stops at step {first}, exit 2, one line: step, version, both digests, the window it breaks",
        "-",
        "none trained on stale weights",
    )


def test_without_a_fault_every_stored_row_names_the_weights_the_trainer_sent(tmp_path):
    out = run(command(tmp_path, f"trainer.total_steps={STEPS}", "explorer.dtype=float32"))
    assert out.returncode == 0, out.stderr[-3000:]
    run_dir = tmp_path / "grpo_arith"
    db = sqlite3.connect(f"file:{run_dir / 'buffer.sqlite'}?mode=ro", uri=True)
    try:
        rows = [json.loads(h) for (h,) in db.execute("SELECT header FROM rows")]
    finally:
        db.close()
    expected = {0: start_digest(torch.float32)} | {s: sent_digest(run_dir, s, torch.float32) for s in (1, 2)}
    assert len(expected) == len(set(expected.values()))  # every step changed the weights, and the digest
    assert {r["model_version"] for r in rows} == {0, 1, 2}
    assert all(r["weights_digest"] == expected[r["model_version"]] for r in rows)
