"""The concurrent explorer of mode ``both`` (trinity_like/pipeline/async_loop.py), in real tiny runs.

Oracles: the reference loop (``synchronizer.concurrent=false``: explore, then train, in turn)
for what is trained; the timeline for what ran at the same time; an independent forward
pass of each checkpoint's weights for which weights sampled each buffered row.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path

import pytest
import torch
from _lib.tiny_runs import final_weights, run

from trinity_like.buffer.rows import STATUSES, unpack
from trinity_like.errors import ConfigError
from trinity_like.monitor.timeline import TIMELINE_FILE, overlap_fraction, read_spans

STEPS = 4
BASE = [f"trainer.total_steps={STEPS}", "algorithm.dynamic_sampling=false", "checkpoint.keep_last=10"]


def rewards(run_dir: Path) -> dict[int, float]:
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        if "loss" in row:
            out[int(row["step"])] = row["reward/mean"]
    return out


def metric_max(run_dir: Path, key: str) -> float:
    return max(json.loads(line).get(key, 0.0) for line in (run_dir / "metrics.jsonl").read_text().splitlines())


def buffer_rows(run_dir: Path) -> list[tuple]:
    """(experience, status, consuming step) of every row the run wrote."""
    db = sqlite3.connect(f"file:{run_dir / 'buffer.sqlite'}?mode=ro", uri=True)
    try:
        got = db.execute("SELECT r.kind, r.header, r.arrays, s.status, s.step FROM rows r JOIN state s USING (seq)")
        return [(unpack(kind, header, blob), STATUSES[status], step) for kind, header, blob, status, step in got]
    finally:
        db.close()


def evals(run_dir: Path) -> list[tuple]:
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["eval/accuracy"], r["eval/response_length"]) for r in rows if "eval/accuracy" in r]


@pytest.mark.parametrize(
    ("offset", "extra"), [(1, []), (2, []), (1, ["monitor.eval_interval=2", "checkpoint.interval=3"])]
)
def test_concurrent_trains_what_the_reference_loop_trains_and_overlaps(tmp_path, offset, extra):
    """Same seed, sync_style fixed: the background explorer samples every batch with the weights
    the in-turn loop uses, so the per-step rewards, the held-out answers (also those between
    steps, which pause the explorer) and the final weights are the same -- and its rollouts
    ran while the trainer trained (the reference loop's never do)."""
    common = [*BASE, f"synchronizer.offset={offset}", *extra]
    ref = run(tmp_path / "ref", *common, "synchronizer.concurrent=false")
    conc = run(tmp_path / "conc", *common)
    assert rewards(conc) == rewards(ref) and len(rewards(ref)) == STEPS
    assert evals(conc) == evals(ref) and len(evals(ref)) == (3 if extra else 2)  # at 0, (2,) and the end
    assert final_weights(conc) == final_weights(ref)
    assert metric_max(conc, "staleness/max") == metric_max(ref, "staleness/max") == offset
    assert overlap_fraction(read_spans(ref / TIMELINE_FILE)) == 0.0
    assert overlap_fraction(read_spans(conc / TIMELINE_FILE)) > 0.0


def test_offset_0_is_the_loop_in_turn(tmp_path):
    """Offset 0 leaves no room to run ahead: the `concurrent` flag changes nothing, nothing overlaps."""
    on = run(tmp_path / "on", *BASE)
    off = run(tmp_path / "off", *BASE, "synchronizer.concurrent=false")
    assert rewards(on) == rewards(off) and final_weights(on) == final_weights(off)
    spans = read_spans(on / TIMELINE_FILE)
    assert overlap_fraction(spans) == 0.0
    assert not [s for s in spans if s.phase == "wait"]  # no explorer thread to wait for
    assert metric_max(on, "staleness/max") == 0


def test_an_off_policy_batch_trained_once_pays_no_old_logprob_pass(tmp_path):
    """One optimiser step per batch: the old (proximal) policy is the step's own weights, so
    even stale batches (offset 1) take ``logprob.detach()`` and no second forward pass runs;
    with two update epochs the old logprobs are computed before the first."""

    def timed(run_dir: Path) -> list[bool]:
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        return ["time/old_logprob" in r for r in rows if "loss" in r]

    once = run(tmp_path / "once", *BASE, "synchronizer.offset=1")
    twice = run(tmp_path / "twice", *BASE, "synchronizer.offset=1", "trainer.update_epochs=2")
    assert timed(once) == [False] * STEPS
    assert timed(twice) == [True] * STEPS


def test_verl_workers_and_the_explorer_actor_share_the_cores_through_a_board(tmp_path, capsys):
    """The default recipe's layout (verl's CPU worker, the explorer as a Ray actor) with offset 1:
    the run says it shares the cores, trains every step with staleness 1, and removes its board."""
    from trinity_like.cpu_share import PREFIX
    from trinity_like.shm import shm_dir

    run_dir = run(
        tmp_path,
        "trainer.total_steps=2",
        "algorithm.dynamic_sampling=false",
        "synchronizer.offset=1",
        "trainer.engine=verl",
        "monitor.eval_at_start=false",
    )
    assert "the explorer explores beside the trainer on the same cores" in capsys.readouterr().out
    assert len(rewards(run_dir)) == 2 and metric_max(run_dir, "staleness/max") == 1
    assert overlap_fraction(read_spans(run_dir / TIMELINE_FILE)) > 0.0
    assert not list(shm_dir().glob(f"{PREFIX}{os.getpid()}-*"))


def test_the_explorer_actor_runs_ahead_too(tmp_path, monkeypatch):
    """The explorer as a Ray actor (its own process): the same batches as the in-turn loop in the
    driver. It maps each published version where the trainer wrote it; 6 publishes take 3
    mailboxes (the version sampled with, the one loaded, the next one), reused, removed at the end."""
    from trinity_like.pipeline import async_loop
    from trinity_like.shm import shm_dir
    from trinity_like.trainer.shared_weights import PREFIX, WeightMailbox

    made = []
    monkeypatch.setattr(async_loop, "WeightMailbox", lambda: made.append(WeightMailbox()) or made[-1])
    common = [*BASE, "trainer.total_steps=6", "synchronizer.offset=1"]
    ref = run(tmp_path / "ref", *common, "synchronizer.concurrent=false")
    conc = run(tmp_path / "conc", *common, "explorer.placement=ray")
    assert rewards(conc) == rewards(ref) and len(rewards(ref)) == 6
    assert overlap_fraction(read_spans(conc / TIMELINE_FILE)) > 0.0
    assert 1 <= len(made) <= 3
    assert not [box for box in made if Path(box.path).exists()]
    assert not list(shm_dir().glob(f"{PREFIX}{os.getpid()}-*"))


def _logprobs(model: torch.nn.Module, tokens: list[int], prompt_length: int) -> torch.Tensor:
    ids = torch.tensor([tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits.float()[0, prompt_length - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, ids[0, prompt_length:, None])[:, 0]


@pytest.mark.parametrize("style", ["fixed", "explorer_driven"])
def test_every_row_was_sampled_by_the_whole_weights_it_records(tmp_path, style):
    """The trainer changes its weights in place while the explorer samples. Each buffered row's
    sampling logprobs are recomputed, by a plain forward pass, with the weights of the version
    it records (the checkpoint of that step; 0: the initial model): they agree. A row sampled
    from half-updated weights, or from another version, would not: with this learning rate the
    next version's logprobs differ (checked). Staleness stays within the offset."""
    from transformers import AutoModelForCausalLM

    from trinity_like.models.resolve import resolve_model_path

    offset = 2
    run_dir = run(
        tmp_path,
        *BASE,
        f"synchronizer.offset={offset}",
        f"synchronizer.sync_style={style}",
        "trainer.optimizer.lr=0.05",
        "explorer.sampling.temperature=1.0",
        # lr 0.05 moves the policy far each step on purpose (versions must be told apart), so rows
        # two versions old are far off-policy (k3 ~6): the gap bound would rightly stop the run.
        "trainer.sampler_gap.max_kl_k3=null",
    )
    folders = {0: resolve_model_path("tiny-random")}
    folders.update({s: run_dir / "checkpoints" / f"step_{s:06d}" / "model" for s in range(1, STEPS + 1)})
    models = {v: AutoModelForCausalLM.from_pretrained(str(f), dtype=torch.float32).eval() for v, f in folders.items()}
    rows = buffer_rows(run_dir)
    assert len(rows) >= STEPS * 16
    differs = 0
    for exp, status, step in rows:
        got = torch.tensor(exp.logprobs)
        want = _logprobs(models[exp.model_version], exp.tokens, exp.prompt_length)
        torch.testing.assert_close(got, want, atol=2e-4, rtol=0)
        if exp.model_version + 1 in models:
            other = _logprobs(models[exp.model_version + 1], exp.tokens, exp.prompt_length)
            differs += bool((other - got).abs().max() > 1e-2)
        if status == "consumed":  # trained at `step` by the weights of step - 1
            assert step - 1 - exp.model_version <= offset
    assert differs >= len(rows) // 2
    assert metric_max(run_dir, "staleness/max") <= offset


def test_explorer_driven_takes_the_newest_weights(tmp_path):
    """explorer_driven samples each trained batch with weights at least as new as fixed does,
    and never older than the bound (batch s: the weights of step s - 1 - offset)."""
    common = [*BASE, "synchronizer.offset=2"]

    def oldest_version_by_step(run_dir: Path) -> dict[int, int]:
        out: dict[int, int] = {}
        for exp, status, step in buffer_rows(run_dir):
            if status == "consumed":
                out[step] = min(out.get(step, 10**9), exp.model_version)
        return out

    fixed = oldest_version_by_step(run(tmp_path / "f", *common))
    driven = oldest_version_by_step(run(tmp_path / "d", *common, "synchronizer.sync_style=explorer_driven"))
    assert sorted(driven) == sorted(fixed) == list(range(1, STEPS + 1))
    assert fixed == {s: max(0, s - 3) for s in fixed}  # exactly needed(s)
    assert all(driven[s] >= fixed[s] for s in fixed)


def test_explorer_driven_without_room_is_a_config_error(tmp_path):
    from trinity_like.config import load_plan

    recipe = Path(__file__).resolve().parents[2] / "examples" / "grpo_arith.yaml"
    with pytest.raises(ConfigError, match=r"grpo_arith.yaml:\d+: synchronizer: .*explorer_driven.*set offset >= 1"):
        load_plan(recipe, [f"run_root={tmp_path}", "synchronizer.sync_style=explorer_driven"])
    assert not list(tmp_path.iterdir())
