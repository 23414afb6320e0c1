"""Everything one stage of a run holds: data, engines, buffer, strategy, checkpoints, metrics.

:func:`build_context` validates the data *before* anything is written to the run
directory, then builds the engines, opens the buffer and resumes from the latest
checkpoint when there is one (``checkpoint.resume``).
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from trinity_like.buffer.storage import open_storage
from trinity_like.components import build_params
from trinity_like.errors import TrinityError
from trinity_like.experience import Experience
from trinity_like.pipeline.checkpoint import CheckpointManager
from trinity_like.pipeline.data import expert_set, task_set
from trinity_like.pipeline.engines import make_engine
from trinity_like.pipeline.metrics import MetricsLogger
from trinity_like.pipeline.sync import WeightChannel
from trinity_like.registry import SAMPLE_STRATEGY
from trinity_like.trainer.objective import ComponentSpec, Objective, objective_from_stage


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def workflow_params(config: Any, cls: type, *, evaluation: bool = False) -> Any:
    """The workflow's params: the explorer's reward settings it declares, plus nothing else."""
    e = config.explorer
    use_eval = evaluation and e.eval_reward_fn is not None
    offered = {
        "reward_fn": e.eval_reward_fn if use_eval else e.reward_fn,
        "reward_params": dict(e.eval_reward_args if use_eval else e.reward_args),
        "reward_timeout_s": e.reward_timeout_s,
        "reward_retries": e.reward_retries,
    }
    from trinity_like.components import params_type

    ptype = params_type(cls)
    known = {f.name for f in dataclasses.fields(ptype)} if ptype else set()
    return build_params(cls, {k: v for k, v in offered.items() if k in known}, where="explorer")


def sampling_params(stage: Any, *, step: int, evaluation: bool = False) -> Any:
    """The explorer's sampling for ``step``; seeds depend on (run seed, step) only."""
    from trinity_like.explorer.engine import SamplingParams

    cfg = stage.config
    s = cfg.explorer.eval_sampling if evaluation else cfg.explorer.sampling
    return SamplingParams(
        n=1 if evaluation else cfg.explorer.group_size,
        max_new_tokens=s.max_new_tokens or cfg.model.max_response_tokens,
        temperature=s.temperature if s.temperature > 0 else 1.0,
        greedy=s.temperature == 0,
        top_k=s.top_k,
        top_p=s.top_p,
        seed=(cfg.seed * 1_000_003 + step) % 2**62,
        stop_token_ids=tuple(s.stop_token_ids) or None,
        stop_strings=tuple(s.stop),
    )


@dataclass
class StageContext:
    stage: Any
    run_dir: Path
    model_path: Path
    tokenizer: Any
    pad_id: int
    logger: MetricsLogger
    checkpoints: CheckpointManager
    actor: Any = None
    reference: Any = None
    critic: Any = None
    explorer: Any = None  # ExplorerWorker (in-process) or RemoteExplorer (Ray actor)
    tasks: Any = None
    eval_tasks: list | None = None
    storage: Any = None
    strategy: Any = None
    expert: Any = None
    objective: Objective | None = None
    value_objective: Objective | None = None
    train_batch_size: int = 0
    batch_needs: frozenset[str] = frozenset()
    model_version: int = 0
    start_step: int = 0
    owns_ray: bool = False  # this stage started Ray and shuts it down when it closes
    nan_streak: int = 0  # consecutive steps skipped for a non-finite loss
    extra_state: dict[str, Any] = field(default_factory=dict)

    # -- explorer side -----------------------------------------------------------------
    def explore(self, step: int) -> tuple[list[Experience], dict[str, float]]:
        tasks = self.tasks.next_batch(self.stage.config.explorer.batch_size)
        if not tasks:
            raise TrinityError("the task set is exhausted")
        result = self.explorer.run(tasks, sampling_params(self.stage, step=step))
        for sk in result.skipped:
            self.logger.write(f"step {step}: task {sk.task_id} skipped: {sk.reason}")
        metrics = dict(result.metrics)
        metrics["explorer/restarts"] = float(getattr(self.explorer, "restarts", 0))
        return result.experiences, metrics

    def evaluate(self) -> dict[str, float]:
        """Greedy accuracy (mean reward) and answer-format rate on the held-out tasks."""
        from trinity_like.explorer.rewards import parse_final_answer

        if not self.eval_tasks:
            return {}
        result = self.explorer.run(self.eval_tasks, sampling_params(self.stage, step=0, evaluation=True), True)
        rows = result.experiences
        n = len(self.eval_tasks)
        rewards = [float(r.reward or 0.0) for r in rows] + [0.0] * (n - len(rows))  # skipped tasks score 0
        acc = sum(rewards) / n
        formatted = sum(parse_final_answer(r.info.get("response_text", "")) is not None for r in rows) / n
        stderr = (sum((x - acc) ** 2 for x in rewards) / n / n) ** 0.5  # sqrt(p(1-p)/n) for 0/1 rewards
        return {"eval/accuracy": acc, "eval/accuracy_stderr": stderr, "eval/format_rate": formatted, "eval/tasks": float(n)}

    def sync_weights(self, version: int) -> None:
        """Explorer weights <- trainer weights: in memory, or through the file channel (:mod:`.sync`).

        In ``train`` mode there is no explorer here: the weights are published for the
        explorer process to pick up.
        """
        if self.stage.config.sync_method() == "memory":
            if self.explorer is None:
                return
            from trinity_like.pipeline.explorer_actor import RemoteExplorer

            if hasattr(self.actor, "state_dict_ref") and isinstance(self.explorer, RemoteExplorer):
                # verl workers -> explorer actor through the object store, skipping the driver
                self.explorer.update_weights(self.actor.state_dict_ref(), version)
            else:
                self.explorer.update_weights(self.actor.state_dict(), version)
            return
        folder = WeightChannel(self.run_dir).publish(version, self._save_weights)
        if self.explorer is not None:
            self.explorer.load_weights(str(folder), version)

    def _save_weights(self, folder: str) -> None:
        """The actor's weights alone (no optimiser state): what an explorer loads."""
        from safetensors.torch import save_file

        Path(folder).mkdir(parents=True, exist_ok=True)
        save_file({k: v.contiguous() for k, v in self.actor.state_dict().items()}, str(Path(folder) / "model.safetensors"))

    # -- checkpoints ---------------------------------------------------------------------
    def checkpoint(self, step: int) -> Path:
        writers = {"model": self.actor.save}
        if self.critic is not None:
            writers["critic"] = self.critic.save
        state = {
            "model_version": self.model_version,
            "tasks": self.tasks.state_dict() if self.tasks is not None else None,
            "strategy": self.strategy.state_dict() if self.strategy is not None else None,
            "expert": self.expert.state_dict() if self.expert is not None else None,
            **self.extra_state,
        }
        path = self.checkpoints.save(step, state, writers)
        if self.storage is not None and hasattr(self.storage, "commit"):
            self.storage.commit(step)
        return path

    def resume(self) -> None:
        """Load the latest checkpoint of the run directory, if any."""
        self.checkpoints.clean_partial()
        latest = self.checkpoints.latest() if self.stage.config.checkpoint.resume else None
        if latest is None:
            if self.storage is not None and hasattr(self.storage, "recover"):
                self.storage.recover(None)
            return
        self.checkpoints.verify(latest)
        state = self.checkpoints.read_state(latest)
        self.actor.load(str(latest / "model"))
        if self.critic is not None:
            self.critic.load(str(latest / "critic"))
        if self.tasks is not None and state.get("tasks") is not None:
            self.tasks.load_state_dict(state["tasks"])
        if self.strategy is not None and state.get("strategy") is not None:
            self.strategy.load_state_dict(state["strategy"])
        if self.expert is not None and state.get("expert") is not None:
            self.expert.load_state_dict(state["expert"])
        self.start_step = int(state["step"])
        self.model_version = int(state.get("model_version", self.start_step))
        self.extra_state = {k: v for k, v in state.items() if k not in ("step", "model_version", "tasks", "strategy", "expert")}
        if self.storage is not None and hasattr(self.storage, "recover"):
            moved = self.storage.recover(self.start_step)
            if any(moved.values()):
                self.logger.write(f"buffer reconciled with checkpoint {latest.name}: {moved}")
        self.checkpoints.restore_rng(latest)
        if self.stage.algorithm.use_rollout:  # offline stages hand their evaluator the weights themselves
            self.sync_weights(self.model_version)
        self.logger.write(f"resumed from {latest} (step {self.start_step})")

    def log(self, step: int, metrics: dict[str, float]) -> None:
        self.logger.log(step, metrics)

    def close(self) -> None:
        for engine in (self.actor, self.reference, self.critic):
            if engine is not None:
                engine.close()
        if self.explorer is not None and hasattr(self.explorer, "close"):
            self.explorer.close()
        if self.owns_ray:
            import ray

            ray.shutdown()
        if self.storage is not None and hasattr(self.storage, "close"):
            self.storage.close()
        self.logger.close()


def remote_explorer(stage: Any) -> bool:
    """The explorer runs as a Ray actor: asked for, or beside verl's workers in one process."""
    cfg = stage.config
    auto = cfg.explorer.placement == "auto" and cfg.trainer.engine == "verl" and cfg.mode == "both"
    return stage.algorithm.use_rollout and cfg.mode != "train" and (cfg.explorer.placement == "ray" or auto)


def uses_ray(stage: Any) -> bool:
    cfg = stage.config
    return (cfg.mode != "explore" and cfg.trainer.engine == "verl") or remote_explorer(stage)


def start_ray_for(stage: Any, engines: int) -> bool:
    """Start (or join) Ray before any engine, so the stage owns its lifetime; True if started here.

    Every verl worker holds one logical Ray CPU, so a locally started Ray gets at least as
    many logical CPUs as the stage's worker groups need (actor, reference, critic), whatever
    the machine's core count: they take turns, they do not all compute at once.
    """
    import os

    import ray

    from trinity_like.trainer.verl_engine import VerlParams, start_ray

    if not uses_ray(stage) or ray.is_initialized():
        return False
    cfg = stage.config
    needed = cfg.cluster.trainer_workers * engines if cfg.trainer.engine == "verl" else 0
    num_cpus = cfg.cluster.num_cpus or max(os.cpu_count() or 1, needed)
    return start_ray(VerlParams(ray_address=cfg.cluster.ray_address, num_cpus=num_cpus))


def is_on_policy(stage: Any) -> bool:
    """Every batch is sampled by the weights it trains and gets one update (see Objective.on_policy)."""
    cfg = stage.config
    return cfg.synchronizer.interval == 1 and cfg.synchronizer.offset == 0 and cfg.trainer.update_epochs == 1


def _train_batch_size(stage: Any) -> int:
    cfg = stage.config
    return cfg.buffer.train_batch_size or cfg.explorer.batch_size * cfg.explorer.group_size


def build_online_context(stage: Any, role: str = "both") -> StageContext:
    """Validate data, then build engines, buffer and strategy for an online stage, and resume.

    ``role``: "both" (one process), "explore" (the explorer alone: no train engines) or
    "train" (the trainer alone: no explorer, no task data). An explorer process logs to
    ``<run_dir>/explorer`` and keeps its own position there (:mod:`.split`).
    """
    from trinity_like.models.resolve import load_tokenizer, resolve_model_path
    from trinity_like.pipeline.explorer_actor import ExplorerWorker, RemoteExplorer

    explores, trains = role in ("both", "explore"), role in ("both", "train")
    cfg = stage.config
    seed_everything(cfg.seed)
    # Data first: a bad data file fails before the run directory is touched.
    tasks = task_set(cfg.buffer.tasks, "buffer.tasks", train=True) if explores else None
    eval_tasks = list(task_set(cfg.buffer.eval_tasks, "buffer.eval_tasks", train=False)) if cfg.buffer.eval_tasks and explores else None
    model_path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(model_path)
    max_tokens = cfg.model.max_prompt_tokens + cfg.model.max_response_tokens
    expert = expert_set(cfg.buffer.expert_data, tokenizer, max_tokens=max_tokens) if cfg.buffer.expert_data and trains else None

    run_dir = Path(cfg.run_dir())
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.json").write_text(cfg.model_dump_json(indent=1))
    ctx = StageContext(
        stage=stage, run_dir=run_dir, model_path=model_path, tokenizer=tokenizer,
        pad_id=int(tokenizer.pad_token_id), checkpoints=CheckpointManager(run_dir, cfg.checkpoint.keep_last),
        logger=MetricsLogger(str(run_dir if trains else run_dir / "explorer"), cfg.monitor.backends,
                             total_steps=cfg.trainer.total_steps, start_step=0, progress=cfg.monitor.progress,
                             desc=cfg.name if trains else f"{cfg.name} explorer"),
    )
    try:
        ctx.tasks, ctx.eval_tasks, ctx.expert = tasks, eval_tasks, expert
        ctx.storage = open_storage(cfg.buffer.experience.storage, cfg.buffer.experience.args, run_dir=run_dir)
        if trains:
            strat = stage.components["sample_strategy"]
            ctx.strategy = SAMPLE_STRATEGY.get(strat.name)(params=strat.params)
            ctx.objective = objective_from_stage(stage, on_policy=is_on_policy(stage))
            ctx.batch_needs = frozenset(stage.needs | ctx.objective.inputs_needed())
            ctx.train_batch_size = _train_batch_size(stage)
        engines = (1 + ("ref_logprob" in ctx.batch_needs) + bool(stage.algorithm.use_critic)) if trains else 0
        ctx.owns_ray = start_ray_for(stage, engines)
        if trains:
            ctx.actor = make_engine(stage, str(model_path))
            if "ref_logprob" in ctx.batch_needs:
                ctx.reference = make_engine(stage, str(model_path), forward_only=True)
            if stage.algorithm.use_critic:
                critic_path = str(resolve_model_path(cfg.model.critic_path)) if cfg.model.critic_path else str(model_path)
                ctx.critic = make_engine(stage, critic_path, kind="value", critic=True)
                vl = stage.components.get("value_loss")
                if vl is None:
                    raise TrinityError(f"algorithm {cfg.algorithm.type!r} uses a critic but names no value_loss")
                ctx.value_objective = Objective(
                    policy_loss=ComponentSpec("POLICY_LOSS_FN", vl.name, vl.params), loss_metric="value_loss"
                )
        if explores:
            ctx.explorer = RemoteExplorer(cfg, str(model_path)) if remote_explorer(stage) else ExplorerWorker(cfg, str(model_path))
        if trains:
            ctx.resume()
    except BaseException:
        ctx.close()
        raise
    if ctx.logger.bar is not None and ctx.start_step:
        ctx.logger.bar.update(ctx.start_step)
    return ctx
