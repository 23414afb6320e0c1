"""What a step computed for the rows it trained on is kept (for ``trinity-like view``): in the
buffer for RL rows, in ``trained_pairs.jsonl`` for the pairs of a DPO / RM stage (no buffer).

Checked against independent oracles: GRPO's advantages computed by hand from the stored
rewards, and the trainer's logprobs recomputed with plain ``transformers`` from the
weights the step started from (the previous step's checkpoint, the model itself at step 1).
"""

from __future__ import annotations

import json
import sqlite3
import statistics
from pathlib import Path

import pytest
import torch
from _lib.tiny_runs import REPO, run
from transformers import AutoModelForCausalLM

from trinity_like.buffer.rows import unpack
from trinity_like.buffer.sqlite_storage import SqliteParams, SqliteStorage
from trinity_like.config import load_plan
from trinity_like.models.resolve import resolve_model_path
from trinity_like.monitor.evals import TRAINED_PAIRS_FILE, read_jsonl
from trinity_like.runner import run_plan


def logprobs_of(model, row) -> list[float]:
    """Each response token's logprob under ``model``, one unpadded sequence at a time."""
    ids = torch.tensor([row.tokens])
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0].double()
    lp = torch.log_softmax(logits, -1)
    return [float(lp[t - 1, row.tokens[t]]) for t in range(row.prompt_length, len(row.tokens))]


@pytest.mark.parametrize("engine", ["local", "verl"])
def test_each_trained_row_keeps_its_advantages_and_the_trainers_logprobs(engine, tmp_path):
    """On both train engines: verl's workers hand back the outputs the loss saw, as the local engine does."""
    run_dir = run(tmp_path, "trainer.total_steps=2", f"trainer.engine={engine}")
    with SqliteStorage(params=SqliteParams(), run_dir=run_dir) as buf:
        trained, statuses = buf.trained(), buf.statuses()
    db = sqlite3.connect(run_dir / "buffer.sqlite")
    rows = {r.eid: r for r in (unpack(*x) for x in db.execute("SELECT kind, header, arrays FROM rows"))}
    db.close()
    consumed = {eid: step for eid, (status, step) in statuses.items() if status == "consumed"}
    assert consumed and set(trained) <= set(consumed)
    checked_groups = 0
    for step in (1, 2):
        model = AutoModelForCausalLM.from_pretrained(
            resolve_model_path("tiny-random") if step == 1 else run_dir / "checkpoints" / "step_000001" / "model"
        )
        groups: dict[str, list] = {}
        for eid, s in consumed.items():
            if s == step:
                groups.setdefault(rows[eid].group_id, []).append(rows[eid])
        for members in groups.values():
            rewards = [r.reward for r in members]
            if len(set(rewards)) == 1:  # dynamic sampling dropped the group: not trained, nothing recorded
                assert not any(r.eid in trained for r in members)
                continue
            checked_groups += 1
            mean, std = statistics.fmean(rewards), statistics.stdev(rewards)
            for r in members:
                got_step, arrays = trained[r.eid]
                assert got_step == step
                assert arrays["advantages"] == pytest.approx(
                    [(r.reward - mean) / (std + 1e-6)] * r.response_length, abs=1e-5
                )
                assert arrays["trainer_logprob"] == pytest.approx(logprobs_of(model, r), abs=1e-4)
    assert checked_groups >= 2


@pytest.mark.parametrize("recipe, margin", [("dpo.yaml", "reward_margin"), ("rm_tiny.yaml", "margin")])
def test_pair_runs_keep_each_training_pair_with_its_scores(recipe, margin, tmp_path):
    """``trained_pairs.jsonl``: each step's pairs add up to the step's own metric (computed over the
    whole batch by the loss); DPO's implicit rewards are exactly 0 at step 1 (policy = reference)."""
    overrides = [
        f"run_root={tmp_path}",
        "model.path=tiny-random",
        "trainer.engine=local",
        "trainer.total_steps=2",
        "monitor.progress=false",
        "buffer.train_batch_size=4",
        "trainer.optimizer.lr=1e-3",
    ]
    if recipe == "dpo.yaml":
        overrides += ["buffer.eval_tasks=null"]
    plan = load_plan(REPO / "examples" / recipe, overrides)
    assert run_plan(plan) == 0
    run_dir = Path(plan.stages[0].config.run_dir())
    items = read_jsonl(run_dir / TRAINED_PAIRS_FILE)
    logged = {
        r["step"]: r for r in map(json.loads, (run_dir / "metrics.jsonl").read_text().splitlines()) if margin in r
    }
    assert sorted({it["step"] for it in items}) == [1, 2]
    for step in (1, 2):
        pairs = [it for it in items if it["step"] == step]
        assert len(pairs) == 4 and all(it["kind"] == "pair" and it["chosen"] != it["rejected"] for it in pairs)
        assert sum(it["metrics"][margin] for it in pairs) / 4 == pytest.approx(logged[step][margin], abs=1e-5)
        score = "reward" if recipe == "dpo.yaml" else "scores"
        for it in pairs:
            m = it["metrics"]
            assert m[f"{score}_chosen"] - m[f"{score}_rejected"] == pytest.approx(m[margin], abs=1e-5)
            if recipe == "dpo.yaml" and step == 1:
                assert m["reward_chosen"] == m["reward_rejected"] == 0.0
    assert any(it["metrics"][margin] != 0 for it in items if it["step"] == 2)
