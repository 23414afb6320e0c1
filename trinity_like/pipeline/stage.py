"""One stage of a run and everything it holds: data, engines, explorer, buffer, checkpoints.

:func:`build_stage` is the one way a stage is set up, online or offline, in any mode. It
validates the data *before* anything is written to the run directory, then builds what
the stage's role needs and resumes from the latest checkpoint (``checkpoint.resume``):

============  ===============================================  ===============================
role          builds                                           used by
============  ===============================================  ===============================
``both``      tasks, explorer, buffer, strategy, train engines  :func:`.rl_loop.run_online`
``explore``   tasks, explorer, buffer                           :mod:`.explorer_process`
``train``     buffer, strategy, train engines                   :func:`.rl_loop.run_trainer`
``offline``   training rows, train engine (+ explorer to eval)  :mod:`.offline_loop`
============  ===============================================  ===============================

The :class:`Stage` then offers the loop its few verbs: ``explore``, ``evaluate``,
``sync_weights``, ``checkpoint``, ``resume``, ``log`` and ``close``.
"""

from __future__ import annotations

import dataclasses
import os
import random
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import psutil
import torch

from trinity_like import fault_points
from trinity_like.buffer.base import ExperienceSource, SampleStrategy
from trinity_like.buffer.storage import open_storage
from trinity_like.config import ResolvedStage
from trinity_like.config.schema import Config
from trinity_like.cpu_share import CoreShare
from trinity_like.errors import TrinityError
from trinity_like.experience import Experience, Task, rollout_id
from trinity_like.explorer.worker import Explorer, ExplorerWorker, RemoteExplorer, sampling_params
from trinity_like.monitor.evals import EVALS_FILE, append_evals
from trinity_like.monitor.logger import MetricsLogger
from trinity_like.monitor.reward_hacking import RewardHackingGuard, guard_for, watch_rollouts
from trinity_like.monitor.timeline import TIMELINE_FILE, Timeline
from trinity_like.pipeline.checkpoint import CheckpointManager
from trinity_like.pipeline.data_sources import StageData, load_stage_data
from trinity_like.pipeline.disk_full import disk_full_as_error
from trinity_like.pipeline.run_lock import RunLock
from trinity_like.pipeline.self_pairs import add_self_pairs
from trinity_like.pipeline.weight_channel import WeightChannel
from trinity_like.registry import SAMPLE_STRATEGY
from trinity_like.trainer.base import TrainEngine
from trinity_like.trainer.engines import build_engine
from trinity_like.trainer.objective import Objective, objective_from_stage

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

    from trinity_like.explorer.workflows import WorkflowResult

ROLES = ("both", "explore", "train", "offline")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


@dataclass
class Stage:
    """What one stage holds while it runs. Fields a role does not use stay None."""

    spec: ResolvedStage  # the validated recipe stage: config, algorithm type, components
    role: str  # one of ROLES
    run_dir: Path
    model_path: Path  # the starting model's folder
    tokenizer: PreTrainedTokenizerBase  # the model's tokenizer (its chat template renders prompts)
    data: StageData  # tasks / rows the stage reads (positions are checkpointed)
    logger: MetricsLogger
    checkpoints: CheckpointManager
    objective: Objective | None = None  # the actor's loss (None: an explorer process)
    value_objective: Objective | None = None  # the critic's loss (algorithms with a critic)
    batch_needs: frozenset[str] = frozenset()  # batch fields some component asks for
    actor: TrainEngine | None = None
    reference: TrainEngine | None = None
    critic: TrainEngine | None = None
    explorer: Explorer | None = None
    storage: ExperienceSource | None = None  # the experience buffer (online)
    strategy: SampleStrategy | None = None  # picks each training batch from the buffer
    model_version: int = 0  # the trainer's weights: the last step trained
    start_step: int = 0  # the step a resumed stage continues after
    owns_ray: bool = False  # this stage started Ray and shuts it down when it closes
    nan_streak: int = 0  # consecutive steps skipped for a non-finite loss
    extra_state: dict[str, Any] = field(default_factory=dict)  # loop-specific state saved with checkpoints
    eval_log: Path | None = None  # where evaluate() appends each held-out answer (None: nowhere)
    run_lock: RunLock | None = None  # this stage's claim on its run directory (:mod:`.run_lock`), freed by close()
    timeline: Timeline | None = (
        None  # when each actor was busy (<run_dir>/timeline.jsonl, :mod:`~trinity_like.monitor.timeline`)
    )
    reward_guard: RewardHackingGuard | None = (
        None  # watches gold vs learned reward (:mod:`~trinity_like.monitor.reward_hacking`)
    )
    cores: CoreShare | None = (
        None  # the CPU cores the explorer actor and verl's workers share (:mod:`~trinity_like.cpu_share`)
    )

    @property
    def config(self) -> Config:
        return self.spec.config

    @property
    def pad_id(self) -> int:
        return int(self.tokenizer.pad_token_id)

    @property
    def eval_tasks(self) -> list[Task] | None:
        return self.data.eval_tasks

    # -- explorer side -----------------------------------------------------------------
    def explore(self, step: int) -> tuple[list[Experience], dict[str, float]]:
        """The next ``explorer.batch_size`` tasks, answered ``group_size`` times each and scored."""
        return self.explored(step, self.explorer.run(self.draw_tasks(), sampling_params(self.config, step=step)))

    def draw_tasks(self) -> list[Task]:
        """The next ``explorer.batch_size`` tasks (their position is checkpointed)."""
        tasks = self.data.train.next_batch(self.config.explorer.batch_size)
        if not tasks:
            raise TrinityError("the task set is exhausted")
        return tasks

    def explored(self, step: int, result: WorkflowResult) -> tuple[list[Experience], dict[str, float]]:
        """The rows and metrics of step ``step``'s explored batch; skipped tasks are logged."""
        for sk in result.skipped:
            self.logger.write(f"step {step}: task {sk.task_id} skipped: {sk.reason}")
        metrics = {**result.metrics, "explorer/restarts": float(self.explorer.restarts)}
        if self.reward_guard is not None:  # the gold reward falling while the learned one rises (issue 22)
            metrics.update(
                watch_rollouts(self.reward_guard, self, step, metrics, [e.model_version for e in result.experiences])
            )
        return result.experiences, metrics

    def put_rows(self, rows: list[Experience], step: int) -> None:
        """Write step ``step``'s explored rows into the buffer; a full disk is one line (:mod:`.disk_full`).

        Each row gets the id of its (run name, step, task, place in the task's group)
        (:func:`~trinity_like.experience.rollout_id`): a step that a resumed run explores
        again writes the ids of its first attempt, which the buffer keeps once. The run's
        name, not its folder's path, so a run directory moved before its resume still
        matches."""
        seen: dict[str, int] = {}
        for row in rows:
            index = seen.get(row.task_id, 0)
            seen[row.task_id] = index + 1
            row.eid = rollout_id(self.config.name, step, row.task_id, index)
        target = getattr(self.storage, "path", self.run_dir)
        with disk_full_as_error(f"step {step}'s rollouts into the buffer ({target})", self._intact("the buffer")):
            fault_points.write("buffer_write", target)
            self.storage.put(rows)

    def _intact(self, what: str) -> str:
        latest = self.checkpoints.latest()
        return f"{what} keeps every earlier row and {f'checkpoint {latest.name}' if latest else 'the run'} is intact"

    def evaluate(self, step: int) -> dict[str, float]:
        """Mean evaluation reward (``eval_reward_fn``, else ``reward_fn``) on the held-out tasks,
        greedy by default: with a 0/1 reward, the answer accuracy. Skipped tasks score 0.

        ``step``: the trainer step whose weights answer; each answer goes to ``eval_log``."""
        if not self.eval_tasks:
            return {}
        n = len(self.eval_tasks)
        if self.actor is not None:
            self.actor.release_memory()  # the trainer waits through it: its peak and the explorer's must not add up
        result = self.explorer.run(self.eval_tasks, sampling_params(self.config, step=0, evaluation=True), True)
        if self.eval_log is not None:
            append_evals(self.eval_log, step, answer_items(self.eval_tasks, result.experiences, self.tokenizer))
        rewards = [float(r.reward or 0.0) for r in result.experiences] + [0.0] * (n - len(result.experiences))
        acc = sum(rewards) / n
        stderr = (sum((x - acc) ** 2 for x in rewards) / n / n) ** 0.5  # sqrt(p(1-p)/n) for 0/1 rewards
        lengths = [len(r.response_tokens) for r in result.experiences]
        return {
            "eval/accuracy": acc,
            "eval/accuracy_stderr": stderr,
            "eval/tasks": float(n),
            "eval/response_length": sum(lengths) / max(len(lengths), 1),
        }

    def sync_weights(self, version: int) -> None:
        """Explorer weights <- trainer weights, in memory or through the file channel (:mod:`.weight_channel`).

        In ``train`` mode there is no explorer here: the weights are published for the
        explorer process to pick up.
        """
        if self.config.sync_method() == "memory":
            if self.explorer is not None:
                self.explorer.receive_weights(self.actor.export_weights(), version)
            return
        folder = WeightChannel(self.run_dir).publish(version, self._save_weights)
        if self.explorer is not None:
            self.explorer.receive_weights(folder, version)

    def _save_weights(self, folder: str) -> None:
        """The actor's weights alone (no optimiser state): what an explorer loads."""
        from safetensors.torch import save_file

        Path(folder).mkdir(parents=True, exist_ok=True)
        save_file(
            {k: v.contiguous() for k, v in self.actor.state_dict().items()}, str(Path(folder) / "model.safetensors")
        )

    # -- checkpoints ---------------------------------------------------------------------
    def _positions(self) -> dict[str, Any]:
        """Everything besides the weights that a resumed stage needs to continue exactly."""

        def state(x: Any) -> Any:
            return x.state_dict() if x is not None else None

        return {
            "model_version": self.model_version,
            "tasks": state(self.data.train),
            "strategy": state(self.strategy),
            "expert": state(self.data.expert),
            **self.extra_state,
        }

    def checkpoint(self, step: int) -> Path:
        """Weights, optimiser and positions of ``step``; then the buffer marks what it trained consumed."""
        writers = {"model": self.actor.save}
        if self.critic is not None:
            writers["critic"] = self.critic.save
        path = self.checkpoints.save(step, self._positions(), writers)
        if self.storage is not None:  # a run stopped here resumes from `path` and marks the step then
            with disk_full_as_error(f"step {step}'s consumed rows into the buffer", self._intact("the buffer")):
                self.storage.commit(step)
        return path

    def resume(self) -> None:
        """Load the latest checkpoint of the run directory, if any, and reconcile the buffer with it."""
        self.checkpoints.clean_partial()
        latest = self.checkpoints.latest() if self.config.checkpoint.resume else None
        if latest is None:
            if self.storage is not None:
                self.storage.recover(None)
            return
        self.checkpoints.verify(latest)
        state = self.checkpoints.read_state(latest)
        self.actor.load(str(latest / "model"))
        if self.critic is not None:
            self.critic.load(str(latest / "critic"))
        for key, target in (("tasks", self.data.train), ("strategy", self.strategy), ("expert", self.data.expert)):
            if target is not None and state.get(key) is not None:
                target.load_state_dict(state[key])
        self.start_step = int(state["step"])
        self.model_version = int(state.get("model_version", self.start_step))
        known = ("step", "model_version", "tasks", "strategy", "expert")
        self.extra_state = {k: v for k, v in state.items() if k not in known}
        if self.storage is not None:
            moved = self.storage.recover(self.start_step)
            if any(moved.values()):
                self.logger.write(f"buffer reconciled with checkpoint {latest.name}: {moved}")
        self.checkpoints.restore_rng(latest)
        if self.spec.algorithm.use_rollout:  # offline stages hand their evaluator the weights when they evaluate
            self.sync_weights(self.model_version)
        if self.logger.bar is not None:
            self.logger.bar.update(self.start_step)
        self.logger.write(f"resumed from {latest} (step {self.start_step})")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.logger.log(step, metrics)

    def span(self, actor: str, phase: str, step: int) -> AbstractContextManager[None]:
        """Record a span of ``actor`` in the timeline (:mod:`~trinity_like.monitor.timeline`), if the stage keeps one."""
        return self.timeline.span(actor, phase, step) if self.timeline is not None else nullcontext()

    def memory(self) -> dict[str, float]:
        """Memory (GB, :func:`resident_bytes`) of this process, the verl workers of every engine
        and the explorer actor, and their total (``memory/*``); processes on other nodes are left out."""
        gb = 1024**3
        out = {"memory/driver_gb": resident_bytes([os.getpid()]) / gb}
        pids = [pid for engine in (self.actor, self.reference, self.critic) for pid in getattr(engine, "pids", [])]
        if pids:
            out["memory/trainer_workers_gb"] = resident_bytes(pids) / gb
        if isinstance(self.explorer, RemoteExplorer):
            out["memory/explorer_gb"] = resident_bytes([self.explorer.pid()]) / gb
        out["memory/total_gb"] = sum(out.values())
        return out

    def close(self) -> None:
        for engine in (self.actor, self.reference, self.critic):
            if engine is not None:
                engine.close()
        if self.explorer is not None:
            self.explorer.close()
        if self.cores is not None:
            self.cores.close()
        if self.owns_ray:
            import ray

            ray.shutdown()
        if self.storage is not None:
            self.storage.close()
        self.logger.close()
        if self.run_lock is not None:
            self.run_lock.release()


def answer_items(
    tasks: list[Task], answered: list[Experience], tokenizer: PreTrainedTokenizerBase
) -> list[dict[str, Any]]:
    """The ``evals.jsonl`` items (:mod:`trinity_like.monitor.evals`) of one held-out evaluation."""
    by_id = {t.task_id: t for t in tasks}
    texts = tokenizer.batch_decode([e.response_tokens for e in answered], skip_special_tokens=True)
    return [
        {
            "kind": "answer",
            "task_id": e.task_id,
            "prompt": by_id[e.task_id].messages()[-1]["content"],
            "answer": by_id[e.task_id].answer,
            "response": text,
            "reward": e.reward,
            "finish_reason": e.finish_reason,
            "length": e.response_length,
        }
        for e, text in zip(answered, texts)
    ]


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


# -- building a stage --------------------------------------------------------------------
def remote_explorer(spec: ResolvedStage) -> bool:
    """The explorer runs as a Ray actor: asked for, or beside verl's workers in one process."""
    cfg = spec.config
    auto = cfg.explorer.placement == "auto" and cfg.trainer.engine == "verl" and cfg.mode == "both"
    return spec.algorithm.use_rollout and cfg.mode != "train" and (cfg.explorer.placement == "ray" or auto)


def uses_ray(spec: ResolvedStage) -> bool:
    cfg = spec.config
    return (cfg.mode != "explore" and cfg.trainer.engine == "verl") or remote_explorer(spec)


def start_ray_for(spec: ResolvedStage, engines: int) -> bool:
    """Start (or join) Ray before any engine, so the stage owns its lifetime; True if started here.

    Every verl worker holds one logical Ray CPU, so a locally started Ray gets at least as
    many logical CPUs as the stage's worker groups need (actor, reference, critic), whatever
    the machine's core count: they take turns, they do not all compute at once.
    """
    import os

    import ray

    from trinity_like.trainer.verl_engine import start_ray, verl_params

    if not uses_ray(spec) or ray.is_initialized():
        return False
    cfg = spec.config
    needed = cfg.cluster.workers * engines if cfg.trainer.engine == "verl" else 0
    num_cpus = cfg.cluster.num_cpus or max(os.cpu_count() or 1, needed)
    started = start_ray(dataclasses.replace(verl_params(cfg), num_cpus=num_cpus))
    gpus = ray.cluster_resources().get("GPU", 0.0)
    if cfg.trainer.engine == "verl" and cfg.cluster.num_gpus > gpus:
        if started:
            ray.shutdown()
        raise TrinityError(
            f"cluster.num_gpus: {cfg.cluster.num_gpus} GPUs asked for the verl workers, but the Ray "
            f"cluster at {cfg.cluster.ray_address} has {gpus:g}; set cluster.num_gpus: 0 to train on CPU"
        )
    return started


def check_gpus(cfg: Config) -> None:
    """GPU workers on a machine without them fail here, before the run directory is touched.
    (An existing Ray cluster's GPUs are counted once connected: :func:`start_ray_for`.)"""
    if cfg.trainer.engine != "verl" or not cfg.cluster.num_gpus or cfg.cluster.ray_address is not None:
        return
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < cfg.cluster.num_gpus:
        raise TrinityError(
            f"cluster.num_gpus: {cfg.cluster.num_gpus} GPUs asked for the verl workers, but this "
            f"machine has {found} usable by torch; set cluster.num_gpus: 0 to train on CPU"
        )


def one_update(spec: ResolvedStage) -> bool:
    """Every batch gets one optimiser step, so its old logprobs are the current ones (see
    Objective.one_update): with any ``synchronizer.offset`` or ``interval``."""
    return not spec.algorithm.use_rollout or spec.config.trainer.update_epochs == 1


def _open_run_dir(cfg: Config, role: str) -> tuple[Path, MetricsLogger, RunLock]:
    run_dir = Path(cfg.run_dir())
    lock = RunLock.acquire(run_dir, role)  # before anything is written: a second run on the directory stops here
    (run_dir / "config.json").write_text(cfg.model_dump_json(indent=1))
    explorer_only = role == "explore"  # an explorer process logs beside the trainer, not over it
    logger = MetricsLogger(
        str(run_dir / "explorer" if explorer_only else run_dir),
        cfg.monitor.backends,
        total_steps=cfg.trainer.total_steps,
        start_step=0,
        progress=cfg.monitor.progress,
        desc=f"{cfg.name} explorer" if explorer_only else cfg.name,
    )
    return run_dir, logger, lock


def _build_trainer(stage: Stage) -> None:
    """The actor (and reference, critic), the buffer's sample strategy and the losses."""
    spec, cfg, path = stage.spec, stage.config, str(stage.model_path)
    if stage.role != "offline":
        strat = spec.components["sample_strategy"]
        stage.strategy = SAMPLE_STRATEGY.get(strat.name)(params=strat.params)
    kind = "reward" if "scores" in stage.batch_needs else "lm"
    stage.actor = build_engine(cfg, path, kind=kind, cores=stage.cores)
    if "ref_logprob" in stage.batch_needs and stage.role != "offline":  # offline: only until its cache is full
        stage.reference = build_engine(cfg, path, forward_only=True, cores=stage.cores)
    if spec.algorithm.use_critic:
        from trinity_like.models.resolve import resolve_model_path

        critic_path = str(resolve_model_path(cfg.model.critic_path)) if cfg.model.critic_path else path
        stage.critic = build_engine(cfg, critic_path, kind="value", critic=True, cores=stage.cores)
        vl = spec.components.get("value_loss")
        if vl is None:
            raise TrinityError(f"algorithm {cfg.algorithm.type!r} uses a critic but names no value_loss")
        stage.value_objective = Objective(policy_loss=vl, loss_metric="value_loss")


def build_stage(spec: ResolvedStage, role: str) -> Stage:
    """Validate data, then build what ``role`` needs (see the module doc), and resume."""
    from trinity_like.models.resolve import load_tokenizer, resolve_model_path

    if role not in ROLES:
        raise ValueError(f"role {role!r}: expected one of {ROLES}")
    cfg = spec.config
    seed_everything(cfg.seed)
    check_gpus(cfg)
    model_path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(model_path)
    trains = role != "explore"
    # Data first: a bad data file fails before the run directory is touched.
    data = load_stage_data(spec, role, tokenizer)
    objective = objective_from_stage(spec, one_update=one_update(spec)) if trains else None
    run_dir, logger, lock = _open_run_dir(cfg, role)
    stage = Stage(
        spec=spec,
        role=role,
        run_dir=run_dir,
        model_path=model_path,
        tokenizer=tokenizer,
        data=data,
        run_lock=lock,
        logger=logger,
        checkpoints=CheckpointManager(run_dir, cfg.checkpoint.keep_last),
        objective=objective,
        eval_log=run_dir / EVALS_FILE,
        timeline=Timeline(run_dir / TIMELINE_FILE),
        batch_needs=frozenset(spec.needs | objective.inputs_needed()) if objective else frozenset(),
    )
    try:
        if role != "offline":
            stage.storage = open_storage(cfg.buffer.experience.storage, cfg.buffer.experience.args, run_dir=run_dir)
        engines = (1 + ("ref_logprob" in stage.batch_needs) + spec.algorithm.use_critic) if trains else 0
        stage.owns_ray = start_ray_for(spec, engines)
        if role in ("both", "explore"):
            remote = remote_explorer(spec)
            threads = cfg.cpu_threads()
            if remote and role == "both":
                stage.cores = CoreShare.for_threads(threads)
            if stage.cores is not None:
                stage.logger.write(
                    f"the explorer explores beside the trainer on the same cores: each takes all {threads.explorer_alone} "
                    f"while the other waits, {threads.explorer} (explorer) and {threads.trainer} (each trainer "
                    f"worker) while both compute (cluster.explorer_threads / trainer_threads fix them)"
                )
            stage.explorer = (
                RemoteExplorer(cfg, str(model_path), stage.cores) if remote else ExplorerWorker(cfg, str(model_path))
            )
            stage.reward_guard = guard_for(cfg, run_dir, role)
        if role == "offline":
            add_self_pairs(stage)  # the starting model answers before any train engine takes memory
            if data.eval_tasks and stage.explorer is None:
                stage.explorer = ExplorerWorker(cfg, str(model_path))
        if trains:
            _build_trainer(stage)
            stage.resume()
        if role == "both" and stage.start_step == 0 and stage.reward_guard is not None and cfg.monitor.rm_check_tasks:
            from trinity_like.rm_check.check import start_check  # the trained reward vs the gold one (issue 22)

            metrics, line = start_check(stage.explorer, (data.eval_tasks or [])[: cfg.monitor.rm_check_tasks], cfg)
            stage.logger.write(line)
            stage.log(0, metrics)
    except BaseException:
        stage.close()
        raise
    return stage
