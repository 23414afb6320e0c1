"""The stage that answers a loop's verbs (:class:`Stage`; the verbs: :class:`.verbs.StageVerbs`).

A stage is one recipe stage set up for one role by :func:`.build.build_stage`: its data,
engines, buffer and run directory. The loops (:mod:`.rl_loop`, :mod:`.async_loop`,
:mod:`.explorer_process`, :mod:`.offline_loop`) are typed against the protocol
:class:`.verbs.StageVerbs`, each verb with a one-line contract, and keep what is theirs to
themselves: which step they are at, their NaN streak, what they save beside the stage's
state in a checkpoint (:class:`.steps.LoopState`).

What a stage holds, grouped by what needs it:

================  ===========================================================================
``spec``          the validated recipe stage: config, algorithm type, components
``params``        :class:`~.loop_params.LoopParams`: what the loops read of it, built here once
``data``          the tasks / rows it reads (their positions are checkpointed)
``trainer``       :class:`Trainer`: the actor (+ reference, critic) and their losses; None in
                  an explorer process
``explorer``      where rollouts run (in this process or a Ray actor); None in a trainer process
``storage``       the experience buffer; ``strategy`` picks each training batch from it
``run``           :class:`~.run_dir.RunDir`: lock, logger, checkpoints, timeline, evals log
``reward_watch``  the gold-vs-learned checks behind :meth:`Stage.explore` (:mod:`.reward_watch`)
``resources``     :class:`Resources`: Ray (when this stage started it) and the CPU board
================  ===========================================================================
"""

from __future__ import annotations

import os
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity_like import fault_points
from trinity_like.buffer.base import ExperienceSource, SampleStrategy, TrainingRecorder
from trinity_like.config import ResolvedStage
from trinity_like.config.engine_params import build_engine, sampling_params
from trinity_like.config.schema import Config
from trinity_like.envs.rollout import eval_env_metrics
from trinity_like.envs.workflow import check_step
from trinity_like.errors import TrinityError
from trinity_like.experience import Experience, rollout_group_id, rollout_id
from trinity_like.explorer.worker import Explorer, RemoteExplorer
from trinity_like.models.device import DEVICE_TURN
from trinity_like.monitor.evals import TRAINED_PAIRS_FILE, answer_items, append_evals
from trinity_like.monitor.timeline import Span
from trinity_like.pipeline.batching import experience_batch, pair_batch
from trinity_like.pipeline.data_sources import StageData
from trinity_like.pipeline.disk_full import disk_full_as_error
from trinity_like.pipeline.loop_params import LoopParams
from trinity_like.pipeline.positions import Positions, first_line_of, loop_state_of
from trinity_like.pipeline.resources import Resources, Trainer, resident_bytes
from trinity_like.pipeline.reward_watch import RewardWatch
from trinity_like.pipeline.run_dir import RunDir
from trinity_like.pipeline.weight_channel import WeightChannel
from trinity_like.pipeline.weight_ledger import WeightLedger
from trinity_like.registry import REWARD_FN
from trinity_like.trainer.base import TrainEngine

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase


@dataclass
class Stage:
    """One stage's parts (see the module doc) and the verbs of :class:`.verbs.StageVerbs`."""

    spec: ResolvedStage
    role: str  # both | explore | train | offline (:data:`.build.ROLES`)
    model_path: Path  # the starting model's folder
    tokenizer: PreTrainedTokenizerBase  # the model's tokenizer (its chat template renders prompts)
    data: StageData
    run: RunDir
    trainer: Trainer | None = None
    explorer: Explorer | None = None
    storage: ExperienceSource | None = None
    strategy: SampleStrategy | None = None
    reward_watch: RewardWatch | None = None
    ledger: WeightLedger | None = None  # the weights the trainer sent, by name (a trainer with an explorer)
    resources: Resources = field(default_factory=Resources)
    params: LoopParams = field(init=False)  # what the loops read of ``spec`` (:meth:`LoopParams.of`)

    def __post_init__(self) -> None:
        self.params = LoopParams.of(self.spec)

    @property
    def config(self) -> Config:
        return self.spec.config

    @property
    def run_dir(self) -> Path:
        return self.run.path

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    # -- explorer side -------------------------------------------------------------------
    def _one_gpu(self) -> bool:
        """The trainer and an in-process explorer share a GPU (``cluster.device`` on CUDA, the
        ``local`` engine): memory changes hands around every rollout (:meth:`_rollout_phase`)."""
        in_process = self.explorer is not None and not isinstance(self.explorer, RemoteExplorer)
        return in_process and self.trainer is not None and self.trainer.actor.device.type == "cuda"

    @contextmanager
    def _rollout_phase(self) -> Iterator[None]:
        """On one shared GPU: the trainer's freed memory (activations, cached blocks) goes back to
        the device before a rollout, the explorer's KV cache and graphs after it, before the update
        takes the card. Elsewhere nothing changes hands."""
        shared = self._one_gpu()
        if shared:
            with DEVICE_TURN:  # not while the trainer computes in another thread (offset >= 1)
                self.trainer.actor.release_memory()
                self.explorer.resume_memory()
        try:
            yield
        finally:
            if shared:
                with DEVICE_TURN:
                    self.explorer.release_memory()
                    self.trainer.actor.resume_memory()

    def explore(self, step: int) -> tuple[list[Experience], dict[str, float]]:
        tasks = self.data.train.next_batch(self.config.explorer.batch_size)  # the position is checkpointed
        if not tasks:
            raise TrinityError("the task set is exhausted")
        with self._rollout_phase():
            result = self.explorer.run(tasks, sampling_params(self.config, step=step))
        for sk in result.skipped:
            self.run.logger.write(f"step {step}: task {sk.task_id} skipped: {sk.reason}")
        check_step(self.config, result.skipped, len(tasks), step)  # most tasks skipped: stop with the first's error
        metrics = dict(result.metrics)
        if self.reward_watch is not None:  # the gold reward falling while the learned one rises (issue 22)
            versions = [e.model_version for e in result.experiences]
            # The actor holds the weights that sampled the batch only in turn with offset 0, where
            # explore(step) comes right after step - 1 trained, and no optimiser step runs while
            # they are read (with offset >= 1 the explorer may run in a thread).
            on_policy = (
                self.trainer is not None and self.config.synchronizer.offset == 0 and set(versions) == {step - 1}
            )
            metrics.update(
                self.reward_watch.observe(step, metrics, versions, self._save_weights if on_policy else None)
            )
        return result.experiences, metrics

    def put(self, rows: list[Experience], step: int) -> None:
        """Each row's id is that of its (run name, step, task, place in the task's group)
        (:func:`~trinity_like.experience.rollout_id`): a step that a resumed run explores again
        writes the ids of its first attempt, which the buffer keeps once. The run's name, not
        its folder's path, so a run directory moved before its resume still matches. Group
        ids are made the same way (:func:`~trinity_like.experience.rollout_group_id`); when the
        trainer needs whole groups (:attr:`~trinity_like.config.ResolvedStage.whole_groups`)
        each row also carries its group's size, set here where the whole group is known, so
        the buffer hands groups out whole (:mod:`trinity_like.buffer.groups`). A full disk is
        one line (:mod:`.disk_full`)."""
        seen: dict[str, int] = {}
        groups: dict[str, str] = {}  # the workflow's group id -> this step's
        ordinals: dict[str, int] = {}  # task -> groups of it so far in this step
        sizes = Counter(row.group_id for row in rows)
        whole = self.spec.whole_groups
        for row in rows:
            index = seen.get(row.task_id, 0)
            seen[row.task_id] = index + 1
            row.eid = rollout_id(self.config.name, step, row.task_id, index)
            row.explore_step = step  # the batch it was explored for: how old its weights may be (weight_ledger)
            if row.group_id:
                if row.group_id not in groups:
                    ordinals[row.task_id] = ordinals.get(row.task_id, -1) + 1
                    groups[row.group_id] = rollout_group_id(self.config.name, step, row.task_id, ordinals[row.task_id])
                row.group_size = sizes[row.group_id] if whole else 0
                row.group_id = groups[row.group_id]
        target = getattr(self.storage, "path", self.run_dir)
        with disk_full_as_error(f"step {step}'s rollouts into the buffer ({target})", self._intact("the buffer")):
            fault_points.write("buffer_write", target)
            self.storage.put(rows)

    def evaluate(self, step: int) -> dict[str, float]:
        """Mean evaluation reward (``eval_reward_fn``, else ``reward_fn``), greedy by default: with
        a 0/1 reward, the answer accuracy. Skipped tasks score 0. An env workflow's own metrics
        come with it as the client loop logs them (``eval/env/*``, :func:`eval_env_metrics`)."""
        tasks = self.data.eval_tasks
        if not tasks:
            return {}
        n = len(tasks)
        if self.trainer is not None:
            # the trainer waits through it: its peak and the explorer's must not add up
            self.trainer.actor.release_memory()
        with self._rollout_phase():
            result = self.explorer.run(tasks, sampling_params(self.config, step=0, evaluation=True), True)
        if self.run.eval_log is not None:
            e = self.config.explorer
            reward = REWARD_FN.get(e.eval_reward_fn or e.reward_fn)
            append_evals(self.run.eval_log, step, answer_items(tasks, result.experiences, self.tokenizer, reward))
        rewards = [float(r.reward or 0.0) for r in result.experiences] + [0.0] * (n - len(result.experiences))
        acc = sum(rewards) / n
        stderr = (sum((x - acc) ** 2 for x in rewards) / n / n) ** 0.5  # sqrt(p(1-p)/n) for 0/1 rewards
        lengths = [len(r.response_tokens) for r in result.experiences]
        env = eval_env_metrics(result.metrics, len(result.skipped)) if "rollout/groups" in result.metrics else {}
        return {
            "eval/accuracy": acc,
            "eval/accuracy_stderr": stderr,
            "eval/tasks": float(n),
            "eval/response_length": sum(lengths) / max(len(lengths), 1),
            **env,
        }

    def sync_weights(self, version: int) -> dict[str, float]:
        """In memory, or through the file channel (:mod:`.weight_channel`), as ``synchronizer.method`` says."""
        t0 = time.perf_counter()
        if self.config.sync_method() == "memory":
            if self.explorer is None:
                return {}
            weights = self.trainer.actor.export_weights()
            gathered = {"time/sync.gather": time.perf_counter() - t0}
            self.name_weights(version, weights)
            self.explorer.receive_weights(weights, version)
            return gathered
        saved: dict = {}
        folder = WeightChannel(self.run_dir).publish(version, lambda f: saved.update(self._save_weights(f)))
        self.name_weights(version, saved or folder)  # a folder published before a resume: read back
        if self.explorer is not None:
            self.explorer.receive_weights(folder, version)
        return {}

    def name_weights(self, version: int, weights: Any) -> None:
        """Record the identity of the weights sent as ``version`` (:mod:`.weight_ledger`)."""
        if self.ledger is not None:
            self.ledger.record(version, weights)

    # -- checkpoints -----------------------------------------------------------------------
    def save_checkpoint(self, step: int, loop_state: dict[str, Any]) -> Path:
        """Atomic and content-hashed (:mod:`.checkpoint`); the buffer commits ``step`` only once
        the checkpoint is whole (a run stopped in between marks the step when it resumes)."""
        writers = {"model": self.trainer.actor.save}
        if self.trainer.critic is not None:
            writers["critic"] = self.trainer.critic.save
        path = self.run.checkpoints.save(step, self._positions().state(loop_state), writers)
        if self.storage is not None:
            with disk_full_as_error(f"step {step}'s consumed rows into the buffer", self._intact("the buffer")):
                self.storage.commit(step)
        return path

    def load_checkpoint(self) -> tuple[int, dict[str, Any]]:
        """Partial checkpoints of a killed save are removed first; with ``checkpoint.resume: false``
        the run starts fresh. The buffer is reconciled with the checkpoint either way."""
        checkpoints = self.run.checkpoints
        checkpoints.clean_partial()
        latest = checkpoints.latest() if self.config.checkpoint.resume else None
        if latest is None:
            if self.storage is not None:
                self.storage.recover(None)
            if self.ledger is not None:  # version 0: the starting weights, which the explorer loaded itself
                self.name_weights(0, self.trainer.actor.export_weights())
            return 0, {}
        checkpoints.verify(latest)  # every file as saved and readable: what follows reads only those
        state = checkpoints.read_state(latest)
        try:
            self.trainer.actor.load(str(latest / "model"))
            if self.trainer.critic is not None:
                self.trainer.critic.load(str(latest / "critic"))
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:  # a manifest written to match
            raise TrinityError(f"checkpoint {latest}: its weights do not load ({first_line_of(exc)})") from None
        step = self._positions().restore(latest, state)
        if self.storage is not None:
            moved = self.storage.recover(step)
            if any(moved.values()):
                self.run.logger.write(f"buffer reconciled with checkpoint {latest.name}: {moved}")
        checkpoints.restore_rng(latest)
        if self.spec.algorithm.use_rollout:  # offline stages hand their evaluator the weights when they evaluate
            self.sync_weights(step)  # a checkpoint's weights are those after its step trained: version `step`
        if self.run.logger.bar is not None:
            self.run.logger.bar.update(step)
        self.run.logger.write(f"resumed from {latest} (step {step})")
        return step, loop_state_of(state)

    # -- metrics and closing -----------------------------------------------------------------
    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.run.logger.log(step, metrics)

    def memory(self) -> dict[str, float]:
        """Processes on other nodes are left out (:func:`resident_bytes`)."""
        gb = 1024**3
        out = {"memory/driver_gb": resident_bytes([os.getpid()]) / gb}
        engines = self.trainer.engines() if self.trainer is not None else []
        pids = [pid for engine in engines for pid in engine.pids]
        if pids:
            out["memory/trainer_workers_gb"] = resident_bytes(pids) / gb
        if isinstance(self.explorer, RemoteExplorer):
            out["memory/explorer_gb"] = resident_bytes([self.explorer.pid()]) / gb
        out["memory/total_gb"] = sum(out.values())
        return out

    def close(self) -> None:
        if self.trainer is not None:
            self.trainer.close()
        if self.explorer is not None:
            self.explorer.close()
        self.resources.close()
        if self.storage is not None:
            self.storage.close()
        self.run.close()

    # -- the trainer side: its handle and the batch source -----------------------------------
    def learner(self) -> Trainer:
        if self.trainer is None:
            raise TrinityError(f"a stage in role {self.role!r} has no trainer")
        return self.trainer

    def next_batch(self, step: int, model_version: int) -> tuple[list[Any], dict[str, float]]:
        """Offline: the training set's next rows. Online: the sample strategy's pick, each row
        checked against the weights sent (:mod:`.weight_ledger`); a stage that explored every
        row itself (``both``) takes what the buffer holds (waiting for more would hang)."""
        size = self.spec.train_batch_size
        if self.role == "offline":
            rows = self.data.train.next_batch(size)
            if not rows:
                raise TrinityError("the training set is empty")
            return rows, {}
        short: dict[str, float] = {}
        if self.role == "both":
            available = self.storage.count("available")
            if available == 0:
                self.note(f"step {step}: exploration produced no rows (every task skipped); step skipped")
                return [], {"skipped/empty_batch": 1.0}
            if available < size:
                self.note(
                    f"step {step}: {available} rows explored for a batch of {size} "
                    f"(buffer.train_batch_size); training on them"
                )
                size, short = available, {"skipped/short_batch_rows": float(size - available)}
        rows = self.strategy.sample(
            experiences=self.storage, batch_size=size, model_version=model_version, expert=self.data.expert
        )
        if not rows:
            raise TrinityError(f"step {step}: the buffer gave no experiences (explorer produced none?)")
        if self.ledger is not None:
            self.ledger.check(step, rows, model_version)
        return rows, short

    def collate(self, rows: list[Any]) -> dict[str, torch.Tensor]:
        return pair_batch(rows, self.pad_id) if self.params.pairs else experience_batch(rows, self.pad_id)

    def recorder(self) -> TrainingRecorder | None:
        return self.storage if isinstance(self.storage, TrainingRecorder) else None

    def trainer_computing(self) -> AbstractContextManager[None]:
        return self.resources.trainer_computing()

    def lend_weights(self, version: int) -> None:
        if self.explorer is not None:
            self.explorer.receive_weights(self.learner().actor.export_weights(), version)

    # -- the explorer side -------------------------------------------------------------------
    def receive_weights(self, weights: Any, version: int) -> None:
        self.explorer.receive_weights(weights, version)

    def check_rewards(self, tasks: int) -> dict[str, float] | None:
        if self.reward_watch is None:
            return None
        metrics, line = self.reward_watch.check_at_start(self.explorer, (self.data.eval_tasks or [])[:tasks])
        self.note(line)
        return metrics

    def task_position(self) -> dict[str, Any]:
        return self.data.train.state_dict()

    def restore_task_position(self, state: dict[str, Any]) -> None:
        self.data.train.load_state_dict(state)

    def writer_done(self) -> None:
        self.storage.mark_writer_done()

    # -- offline data ------------------------------------------------------------------------
    def held_out_rows(self) -> list[Any]:
        return self.data.eval_rows

    def training_rows(self) -> list[Any]:
        return self.data.train.rows

    def data_summary(self) -> dict[str, float]:
        return self.data.summary

    def reference(self) -> TrainEngine:
        trainer = self.learner()
        if trainer.reference is None:
            trainer.reference = build_engine(self.config, str(self.model_path), forward_only=True)
        return trainer.reference

    def decode(self, token_lists: list[list[int]]) -> list[str]:
        return self.tokenizer.batch_decode(token_lists, skip_special_tokens=True)

    # -- the run directory ---------------------------------------------------------------------
    def note(self, line: str) -> None:
        self.run.logger.write(line)

    def advance(self, steps: int = 1) -> None:
        if self.run.logger.bar is not None:
            self.run.logger.bar.update(steps)

    def span(self, actor: str, phase: str, step: int) -> AbstractContextManager[None]:
        return self.run.span(actor, phase, step)

    def add_span(self, span: Span) -> None:
        if self.run.timeline is not None:
            self.run.timeline.add(span)

    def file(self, name: str) -> Path:
        return self.run.path / name

    def write_evals(self, step: int, items: list[dict[str, Any]], trained: bool = False) -> None:
        path = self.file(TRAINED_PAIRS_FILE) if trained else self.run.eval_log
        if path is not None:
            append_evals(path, step, items)

    def has_eval(self) -> bool:
        return bool(self.data.eval_rows or self.data.eval_tasks)

    # -- helpers ---------------------------------------------------------------------------
    def _save_weights(self, folder: str) -> dict[str, Any]:
        """The actor's weights alone (no optimiser state): what an explorer loads."""
        from safetensors.torch import save_file

        Path(folder).mkdir(parents=True, exist_ok=True)
        state = {k: v.contiguous() for k, v in self.trainer.actor.state_dict().items()}
        save_file(state, str(Path(folder) / "model.safetensors"))
        return state

    def _positions(self) -> Positions:
        return Positions(self.data.train, self.strategy, self.data.expert, self.ledger)

    def _intact(self, what: str) -> str:
        latest = self.run.checkpoints.latest()
        return f"{what} keeps every earlier row and {f'checkpoint {latest.name}' if latest else 'the run'} is intact"
