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
from trinity_like.pipeline.stage import Stage, StageVerbs
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
    assert {"explore", "put", "sync_weights", "evaluate", "save_checkpoint", "load_checkpoint", "log", "close"} <= set(
        verbs
    )
    assert StageVerbs not in Stage.__mro__
    for name, verb in verbs.items():
        assert inspect.signature(getattr(Stage, name)) == inspect.signature(verb), name
        assert verb.__doc__ and "\n" not in verb.__doc__.strip(), name
