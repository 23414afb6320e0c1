"""What a loop asks of a stage (:class:`StageVerbs`), and the stage that answers (:class:`Stage`).

A stage is one recipe stage set up for one role by :func:`.build.build_stage`: its data,
engines, buffer and run directory. The loops (:mod:`.rl_loop`, :mod:`.async_loop`,
:mod:`.explorer_process`, :mod:`.offline_loop`) drive it through the few verbs of
:class:`StageVerbs`, each with a one-line contract, and keep what is theirs to themselves:
which step they are at, their NaN streak, what they save beside the stage's state in a
checkpoint (:class:`.rl_loop.LoopState`). Like torchtune's recipe interface, the protocol is
a contract to read and to check against (``tests/pipeline/test_stage.py``), not a base class.

What a stage holds, grouped by what needs it:

================  ===========================================================================
``spec``          the validated recipe stage: config, algorithm type, components
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
from collections import Counter
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import psutil

from trinity_like import fault_points
from trinity_like.buffer.base import ExperienceSource, SampleStrategy
from trinity_like.config import ResolvedStage
from trinity_like.config.engine_params import sampling_params
from trinity_like.config.schema import Config
from trinity_like.cpu_share import TRAINER, CoreShare
from trinity_like.envs.rollout import eval_env_metrics
from trinity_like.envs.workflow import check_step
from trinity_like.errors import TrinityError
from trinity_like.experience import Experience, rollout_group_id, rollout_id
from trinity_like.explorer.worker import Explorer, RemoteExplorer
from trinity_like.models.device import DEVICE_TURN
from trinity_like.monitor.evals import answer_items, append_evals
from trinity_like.pipeline.data_sources import StageData
from trinity_like.pipeline.disk_full import disk_full_as_error
from trinity_like.pipeline.reward_watch import RewardWatch
from trinity_like.pipeline.run_dir import RunDir
from trinity_like.pipeline.weight_channel import WeightChannel
from trinity_like.pipeline.weight_ledger import KEY as WEIGHTS_SENT
from trinity_like.pipeline.weight_ledger import WeightLedger
from trinity_like.registry import REWARD_FN
from trinity_like.trainer.base import TrainEngine
from trinity_like.trainer.objective import Objective

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# what a checkpoint's state holds for the stage itself
STAGE_KEYS = ("step", "tasks", "strategy", "expert", WEIGHTS_SENT)


class StageVerbs(Protocol):
    """The verbs a loop calls on a stage. Each docstring is the verb's whole contract."""

    def explore(self, step: int) -> tuple[list[Experience], dict[str, float]]:
        """Draw the next ``explorer.batch_size`` tasks, answer each ``group_size`` times, score: rows, metrics."""

    def put(self, rows: list[Experience], step: int) -> None:
        """Write step ``step``'s rows into the buffer under their rollout ids (explored again: kept once)."""

    def sync_weights(self, version: int) -> None:
        """The trainer's weights to the explorer as ``version`` (mode ``train``: published for its process)."""

    def evaluate(self, step: int) -> dict[str, float]:
        """Held-out answer accuracy of the explorer's weights, answers logged under ``step`` ({}: no tasks)."""

    def save_checkpoint(self, step: int, loop_state: dict[str, Any]) -> Path:
        """Weights, optimiser, data positions, RNG, ``loop_state`` after ``step``; then the buffer commits ``step``."""

    def load_checkpoint(self) -> tuple[int, dict[str, Any]]:
        """Restore the latest checkpoint, explorer weights too: ``(step, loop_state)``; ``(0, {})`` if none."""

    def log(self, step: int, metrics: dict[str, float]) -> None:
        """Step ``step``'s metrics to every monitor (``metrics.jsonl``, TensorBoard, the progress bar)."""

    def memory(self) -> dict[str, float]:
        """Memory (GB) of this process, the trainer's workers and the explorer actor, and their total."""

    def close(self) -> None:
        """Free engines, explorer, Ray, CPU board, buffer and run directory (also after a partial build)."""


@dataclass
class Trainer:
    """The train side of a stage: the actor and its loss; a reference and a critic where a component asks for them."""

    actor: TrainEngine
    objective: Objective  # the actor's loss (:mod:`~trinity_like.trainer.objective`)
    needs: frozenset[str]  # batch fields some component asks for (ref_logprob, old_logprob, values, ...)
    reference: TrainEngine | None = None  # reference logprobs (offline: only while a pair is not cached)
    critic: TrainEngine | None = None  # values, for algorithms with a critic
    value_objective: Objective | None = None  # the critic's loss

    def engines(self) -> list[TrainEngine]:
        return [e for e in (self.actor, self.reference, self.critic) if e is not None]

    def close(self) -> None:
        for engine in self.engines():
            engine.close()


@dataclass
class Resources:
    """What a stage started on this machine besides its engines, freed when it closes: Ray (if this
    stage started it) and the board through which the explorer actor and the trainer's workers
    share the CPU cores (:mod:`~trinity_like.cpu_share`)."""

    owns_ray: bool = False
    cores: CoreShare | None = None

    def trainer_computing(self) -> AbstractContextManager[None]:
        """Mark the trainer busy on the board for the body (the explorer then takes its share only)."""
        return self.cores.computing(TRAINER) if self.cores is not None else nullcontext()

    def close(self) -> None:
        if self.cores is not None:
            self.cores.close()
        if self.owns_ray:
            import ray

            ray.shutdown()


@dataclass
class Stage:
    """One stage's parts (see the module doc) and the verbs of :class:`StageVerbs`."""

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

    def sync_weights(self, version: int) -> None:
        """In memory, or through the file channel (:mod:`.weight_channel`), as ``synchronizer.method`` says."""
        if self.config.sync_method() == "memory":
            if self.explorer is not None:
                weights = self.trainer.actor.export_weights()
                self.name_weights(version, weights)
                self.explorer.receive_weights(weights, version)
            return
        saved: dict = {}
        folder = WeightChannel(self.run_dir).publish(version, lambda f: saved.update(self._save_weights(f)))
        self.name_weights(version, saved or folder)  # a folder published before a resume: read back
        if self.explorer is not None:
            self.explorer.receive_weights(folder, version)

    def name_weights(self, version: int, weights: Any) -> None:
        """Record the identity of the weights sent as ``version`` (:mod:`.weight_ledger`)."""
        if self.ledger is not None:
            self.ledger.record(version, weights)

    # -- checkpoints -----------------------------------------------------------------------
    def save_checkpoint(self, step: int, loop_state: dict[str, Any]) -> Path:
        """Atomic and content-hashed (:mod:`.checkpoint`); the buffer commits ``step`` only once
        the checkpoint is whole (a run stopped in between marks the step when it resumes)."""
        if set(loop_state) & set(STAGE_KEYS):
            raise ValueError(f"loop state keys {sorted(set(loop_state) & set(STAGE_KEYS))} are the stage's own")
        writers = {"model": self.trainer.actor.save}
        if self.trainer.critic is not None:
            writers["critic"] = self.trainer.critic.save
        positions = {
            "tasks": _state(self.data.train),
            "strategy": _state(self.strategy),
            "expert": _state(self.data.expert),
            WEIGHTS_SENT: _state(self.ledger),
        }
        path = self.run.checkpoints.save(step, {**loop_state, **positions}, writers)
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
            raise TrinityError(f"checkpoint {latest}: its weights do not load ({_first_line(exc)})") from None
        for key, target in (("tasks", self.data.train), ("strategy", self.strategy), ("expert", self.data.expert)):
            if target is not None and state.get(key) is not None:
                try:
                    target.load_state_dict(state[key])
                except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
                    raise TrinityError(
                        f"checkpoint {latest}: state.json: its {key!r} position does not load ({_first_line(exc)})"
                    ) from None
        step = int(state["step"])
        if self.ledger is not None:
            self.ledger.load_state_dict(state.get(WEIGHTS_SENT))
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
        return step, {k: v for k, v in state.items() if k not in STAGE_KEYS}

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

    # -- helpers ---------------------------------------------------------------------------
    def _save_weights(self, folder: str) -> dict[str, Any]:
        """The actor's weights alone (no optimiser state): what an explorer loads."""
        from safetensors.torch import save_file

        Path(folder).mkdir(parents=True, exist_ok=True)
        state = {k: v.contiguous() for k, v in self.trainer.actor.state_dict().items()}
        save_file(state, str(Path(folder) / "model.safetensors"))
        return state

    def _intact(self, what: str) -> str:
        latest = self.run.checkpoints.latest()
        return f"{what} keeps every earlier row and {f'checkpoint {latest.name}' if latest else 'the run'} is intact"


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {lines[0] if lines else ''}"[:300]


def _state(x: Any) -> Any:
    return x.state_dict() if x is not None else None


def resident_bytes(pids: list[int]) -> int:
    """Memory the processes ``pids`` of this machine hold, summed (gone or foreign ones: 0).

    Proportional set size where the OS reports it (Linux): a page shared by n processes
    counts 1/n in each, so weights in Ray's shared-memory object store, mapped by the
    trainer worker and the explorer alike, count once in the total. Elsewhere the resident
    set size, which counts them in each process.
    """
    total = 0
    for pid in pids:
        try:
            process = psutil.Process(pid)
            try:
                total += process.memory_full_info().pss
            except (AttributeError, psutil.AccessDenied):
                total += process.memory_info().rss
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return total
