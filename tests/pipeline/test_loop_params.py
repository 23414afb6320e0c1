"""LoopParams: what the loops read of a recipe, built once with the stage; the loops need nothing else of it."""

from __future__ import annotations

import ast
import dataclasses
from contextlib import nullcontext
from pathlib import Path

import pytest

from trinity_like.config import load_plan
from trinity_like.pipeline.loop_params import LoopParams
from trinity_like.pipeline.steps import LoopState, StepHooks, StepRecord, end_step

REPO = Path(__file__).resolve().parents[2]


def _spec(*overrides: str, recipe: str = "grpo_arith.yaml"):
    return load_plan(REPO / "examples" / recipe, list(overrides)).stages[0]


def test_the_params_are_the_recipes_values():
    spec = _spec(
        "trainer.total_steps=7",
        "trainer.update_epochs=2",
        "trainer.max_nan_steps=5",
        "synchronizer.offset=2",
        "synchronizer.interval=3",
        "synchronizer.concurrent=true",
        "synchronizer.sync_style=explorer_driven",
        "trainer.sampler_gap.max_kl_k3=0.25",
        "trainer.sampler_gap.action=warn",
        "monitor.eval_interval=4",
        "monitor.eval_at_start=false",
        "checkpoint.interval=6",
        "checkpoint.resume=false",
        "buffer.train_batch_size=16",
        "algorithm.dynamic_sampling=true",
    )
    p = LoopParams.of(spec)
    assert (p.total_steps, p.update_epochs, p.max_nan_steps) == (7, 2, 5)
    assert (p.sync_offset, p.sync_interval, p.sync_newest_first, p.sync_at_end) == (2, 3, True, False)
    assert (p.gap_max_kl_k3, p.gap_stop) == (0.25, False)
    assert (p.eval_interval, p.eval_at_start, p.rm_check_tasks) == (4, False, 0)
    assert (p.checkpoint_interval, p.resume, p.train_batch_size) == (6, False, 16)
    assert p.use_rollout and p.dynamic_sampling and not p.pairs
    assert p.advantage is not None and p.advantage.name == "grpo" and p.kl_penalty is None
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.total_steps = 1  # type: ignore[misc]


def test_unset_and_zero_eval_intervals_both_mean_never_between_start_and_end():
    assert LoopParams.of(_spec()).eval_interval == 0
    assert LoopParams.of(_spec("monitor.eval_interval=0")).eval_interval == 0
    assert LoopParams.of(_spec("mode=train")).sync_at_end


def test_an_offline_pair_stage_has_pairs_and_no_rollout():
    p = LoopParams.of(_spec(recipe="dpo.yaml"))
    assert p.pairs and not p.use_rollout and p.advantage is None


def test_every_field_says_where_it_comes_from():
    """One comment per field (STYLE 7), on its line."""
    source = (REPO / "trinity_like" / "pipeline" / "loop_params.py").read_text().splitlines()
    tree = ast.parse("\n".join(source))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "LoopParams")
    fields = [n for n in cls.body if isinstance(n, ast.AnnAssign)]
    assert [f.target.id for f in fields] == [f.name for f in dataclasses.fields(LoopParams)]
    assert all("#" in source[f.lineno - 1] for f in fields)


class Standin:
    """A stage of the loops' protocol holding no recipe, only ``params``: what ``end_step`` calls on it is recorded."""

    def __init__(self, params: LoopParams) -> None:
        self.params = params
        self.calls: list[tuple[str, int]] = []

    def span(self, actor: str, phase: str, step: int):
        return nullcontext()

    def sync_weights(self, version: int) -> None:
        self.calls.append(("sync", version))

    def evaluate(self, step: int) -> dict[str, float]:
        self.calls.append(("eval", step))
        return {}

    def save_checkpoint(self, step: int, loop_state: dict) -> Path:
        self.calls.append(("checkpoint", step))
        return Path()

    def log(self, step: int, metrics: dict[str, float]) -> None:
        pass

    def memory(self) -> dict[str, float]:
        return {}

    def advance(self, steps: int = 1) -> None:
        pass


@pytest.mark.parametrize("at_end", [False, True], ids=["both", "train"])
def test_a_step_ends_on_the_params_schedule(at_end):
    """Sync every 2 steps (and at the last for an explorer process), evaluate every 2 but the last,
    checkpoint every 3 and at the last: the schedule written out by hand for 5 steps."""
    params = dataclasses.replace(
        LoopParams.of(_spec()),
        total_steps=5,
        sync_interval=2,
        sync_at_end=at_end,
        eval_interval=2,
        checkpoint_interval=3,
    )
    stage, loop = Standin(params), LoopState()
    for step in range(1, 6):
        end_step(stage, loop, StepRecord(step), StepHooks())
    last_sync = [("sync", 5)] if at_end else []
    assert stage.calls == [
        ("sync", 2),
        ("eval", 2),
        ("checkpoint", 3),
        ("sync", 4),
        ("eval", 4),
        *last_sync,
        ("checkpoint", 5),
    ]
    assert loop.step == 5


def test_a_reward_model_with_held_out_tasks_is_refused_before_anything_is_built(tmp_path):
    """The one recipe check of an offline stage (now the runner's, not the loop's): a reward model
    has no answers to grade, so ``buffer.eval_tasks`` is one line, and no run directory appears."""
    from trinity_like.errors import TrinityError
    from trinity_like.runner import run_stage

    spec = _spec(
        f"run_root={tmp_path}",
        "model.path=tiny-random",
        "trainer.engine=local",
        "buffer.eval_tasks.generator=arithmetic",
        "buffer.eval_tasks.split=eval",
        recipe="rm_tiny.yaml",
    )
    with pytest.raises(TrinityError, match="buffer.eval_tasks: answer accuracy needs a language model"):
        run_stage(spec)
    assert not any(tmp_path.iterdir())
