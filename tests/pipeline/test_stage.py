"""What the one stage builder and the shared end of step guarantee, online and offline."""

from __future__ import annotations

import inspect
import json
import re
import textwrap
from pathlib import Path

import pytest
import torch
from _lib.tiny_runs import TINY, run

from trinity_like.config import load_plan
from trinity_like.errors import ConfigError, TrinityError
from trinity_like.experience import Experience
from trinity_like.pipeline.batching import experience_batch
from trinity_like.pipeline.rl_loop import drop_uninformative_groups
from trinity_like.pipeline.stage import Stage
from trinity_like.pipeline.verbs import StageVerbs
from trinity_like.runner import run_plan

REPO = Path(__file__).resolve().parents[2]

NAN_SFT_PLUGIN = textwrap.dedent(
    '''
    from trinity_like.components import AlgorithmType
    from trinity_like.registry import ALGORITHM_TYPE, POLICY_LOSS_FN

    CALLS = {"n": 0}

    @POLICY_LOSS_FN.register_module("nan_after_first")
    def nan_after_first(*, logprob, action_mask):
        """Finite on the first call, NaN afterwards."""
        CALLS["n"] += 1
        loss = -(logprob * action_mask).sum() / action_mask.sum()
        return (loss if CALLS["n"] == 1 else loss * float("nan")), {}

    ALGORITHM_TYPE.register_module("nan_sft", module=AlgorithmType(
        description="Test: an offline objective that turns NaN.", policy_loss="nan_after_first",
        use_rollout=False, requires={"mode": "train"}))
    '''
)


def test_an_offline_stage_stops_after_max_nan_steps_like_an_online_one(tmp_path):
    plugin = tmp_path / "nan_sft.py"
    plugin.write_text(NAN_SFT_PLUGIN)
    plan = load_plan(
        REPO / "examples" / "sft.yaml",
        [
            f"run_root={tmp_path}",
            "model.path=tiny-random",
            "trainer.engine=local",
            "monitor.progress=false",
            "algorithm.type=nan_sft",
            "buffer.eval_tasks=null",
            "buffer.eval_data=null",
            "buffer.train_batch_size=4",
            "trainer.total_steps=10",
            "trainer.max_nan_steps=2",
            "checkpoint.interval=1",
        ],
        plugins=[str(plugin)],
    )
    with pytest.raises(TrinityError, match="3 non-finite losses in a row"):
        run_plan(plan)
    rows = [json.loads(line) for line in (tmp_path / "sft" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("skipped/nan_loss")] == [2, 3]


def _row(group: str, reward: float, expert: bool = False) -> Experience:
    return Experience(
        tokens=[1, 2, 3, 4],
        prompt_length=2,
        reward=reward,
        group_id=group,
        is_expert=expert,
        logprobs=None if expert else [-1.0, -1.0],
    )


def test_dynamic_sampling_drops_equal_groups_but_keeps_expert_rows():
    rows = [
        _row("a", 1.0),
        _row("a", 1.0),
        _row("b", 0.0),
        _row("b", 1.0),
        _row("e1", 0.0, True),
        _row("e2", 0.0, True),
    ]
    batch, dropped, keep = drop_uninformative_groups(experience_batch(rows, pad_id=0))
    assert dropped == 2 and keep.tolist() == [2, 3, 4, 5]
    assert batch["is_expert"].tolist() == [False, False, True, True]
    assert batch["rewards"].tolist() == [0.0, 1.0, 0.0, 0.0]
    assert float(batch["num_expert_seqs"]) == 2 and float(batch["num_seqs"]) == 4


def test_held_out_accuracy_is_the_eval_reward_fn_from_the_registry(tmp_path):
    """No task-specific answer parser in the core: the registered eval reward decides."""
    run_dir = run(
        tmp_path,
        "trainer.total_steps=1",
        "explorer.eval_reward_fn=format",
        "explorer.eval_reward_args={pattern: '(?s).*'}",
    )
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = [r for r in rows if "eval/accuracy" in r]
    assert [r["step"] for r in evals] == [0, 1] and all(r["eval/accuracy"] == 1.0 for r in evals)
    assert all(r["eval/tasks"] == 8.0 and r["eval/response_length"] > 0 for r in evals)


def test_gpu_workers_on_a_machine_without_gpus_fail_before_anything_is_written(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("this machine has GPUs")
    plan = load_plan(
        REPO / "examples" / "grpo_arith.yaml",
        [f"run_root={tmp_path}", *TINY, "trainer.engine=verl", "cluster.num_gpus=2"],
    )
    with pytest.raises(
        TrinityError, match=r"^cluster.num_gpus: 2 GPUs asked for the verl workers, but this machine has 0"
    ):
        run_plan(plan)
    assert not (tmp_path / "grpo_arith").exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.dtype=float16", "model.dtype: Input should be 'auto', 'float32' or 'bfloat16'"),
        (
            "cluster.trainer_workers=2 cluster.num_gpus=1",
            "cluster: Value error, num_gpus must be 0 (CPU workers) or trainer_workers (2)",
        ),
        ("cluster.nnodes=2", "cluster.nnodes: unknown key"),
        ("explorer.engine=hf", "explorer.engine: unknown rollout engine 'hf'"),
        ("cluster.device=gpu", "cluster.device: String should match pattern"),
        ("cluster.device=cpu cluster.num_gpus=1", "cluster: Value error, device: cpu keeps every model on the CPU"),
    ],
)
def test_values_the_engines_cannot_honour_are_rejected_by_the_schema(override, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        load_plan(REPO / "examples" / "grpo_arith.yaml", override.split())


def test_memory_of_processes_is_counted_and_gone_ones_are_zero():
    import os
    import subprocess

    from trinity_like.pipeline.stage import resident_bytes

    here = resident_bytes([os.getpid()])
    assert here > 10 * 1024**2  # this process holds torch
    gone = subprocess.Popen(["true"])
    gone.wait()
    assert resident_bytes([gone.pid]) == 0
    assert resident_bytes([os.getpid(), gone.pid]) == pytest.approx(here, rel=0.1)


def test_the_stage_implements_each_verb_of_the_protocol_as_declared():
    """:class:`StageVerbs` is the loops' contract (a protocol, no base class): the stage has every
    verb with the same signature, and each verb's contract is one line."""
    verbs = {name: fn for name, fn in vars(StageVerbs).items() if inspect.isfunction(fn) and not name.startswith("_")}
    assert {
        "explore",
        "put",
        "next_batch",
        "learner",
        "sync_weights",
        "evaluate",
        "save_checkpoint",
        "load_checkpoint",
        "log",
        "note",
        "span",
        "close",
    } <= set(verbs)
    assert StageVerbs not in Stage.__mro__
    for name, verb in verbs.items():
        assert inspect.signature(getattr(Stage, name)) == inspect.signature(verb), name
        assert verb.__doc__ and "\n" not in verb.__doc__.strip(), name


LOOPS = ("rl_loop", "async_loop", "offline_loop", "explorer_process", "steps")


def _stage_reads(module: str) -> list[tuple[int, str]]:
    """``(line, member)`` of every ``stage.<member>`` / ``self.stage.<member>`` in a loop module's code."""
    import ast

    tree = ast.parse((REPO / "trinity_like" / "pipeline" / f"{module}.py").read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            owner = node.value
            if (isinstance(owner, ast.Name) and owner.id == "stage") or (
                isinstance(owner, ast.Attribute) and owner.attr == "stage"
            ):
                out.append((node.lineno, node.attr))
    return out


def test_the_loops_reach_a_stage_only_through_the_protocol():
    """The loops are typed against :class:`StageVerbs`, not the concrete stage: none imports
    ``Stage``, and every member they use on a stage is one the protocol declares. Of those,
    only ``params`` (what they need of the recipe) is read as data; the rest are verbs."""
    declared = {name for name in vars(StageVerbs) if not name.startswith("_")}
    for module in LOOPS:
        source = (REPO / "trinity_like" / "pipeline" / f"{module}.py").read_text()
        assert "pipeline.stage import" not in source, module
        reads = _stage_reads(module)
        assert reads, module
        assert not [(line, m) for line, m in reads if m not in declared], module
        assert {m for _, m in reads if not callable(getattr(StageVerbs, m, None))} <= {"params"}, module


def test_a_step_is_taken_through_hooks_without_patching_the_stage(tmp_path):
    """One :func:`.rl_loop.step` at a time, as a benchmark takes it: hooks that skip the
    checkpoint and the evaluation change the step, the stage object stays as built."""
    from trinity_like.pipeline.build import build_stage
    from trinity_like.pipeline.rl_loop import InTurn, step
    from trinity_like.pipeline.steps import LoopState

    class Bench(InTurn):
        evaluated: list[int] = []

        def evaluate(self, stage, at):
            self.evaluated.append(at)
            return {}

        def checkpoint(self, stage, loop, at):
            pass

    spec = load_plan(
        REPO / "examples" / "grpo_arith.yaml",
        [f"run_root={tmp_path}", *TINY, "trainer.total_steps=2", "monitor.eval_interval=1"],
    ).stages[0]
    stage = build_stage(spec, "both")
    try:
        before = dict(vars(stage))
        loop = LoopState.resume(stage)
        hooks = Bench()
        first, second = step(stage, loop, hooks), step(stage, loop, hooks)
        assert loop.step == 2 and loop.model_version == 2
        assert "time/update" in first and "time/rollout" in second and second["reward/mean"] >= 0
        assert hooks.evaluated == [1]  # the last step is left to the loop's final evaluation
        assert not stage.run.checkpoints.list()
        assert vars(stage) == before
    finally:
        stage.close()
