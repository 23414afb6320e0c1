"""Setting a stage up: :func:`build_stage`, the one way for every role, online or offline.

It validates the data *before* anything is written to the run directory, then opens the
directory and builds what the stage's role needs:

============  ===============================================  ===============================
role          builds                                           driven by
============  ===============================================  ===============================
``both``      tasks, explorer, buffer, strategy, train engines  :func:`.rl_loop.run_online`
                                                                 (:func:`.async_loop.run_concurrent`)
``explore``   tasks, explorer, buffer                           :mod:`.explorer_process`
``train``     buffer, strategy, train engines                   :func:`.rl_loop.run_trainer`
``offline``   training rows, train engine (+ explorer to eval)  :mod:`.offline_loop`
============  ===============================================  ===============================

Nothing is resumed here: a loop restores the latest checkpoint when it starts
(:meth:`.stage.Stage.load_checkpoint`). A build that fails closes what it built.
"""

from __future__ import annotations

import dataclasses
import os
import random

import numpy as np
import torch

from trinity_like.buffer.storage import open_storage
from trinity_like.config import ResolvedStage
from trinity_like.config.engine_params import build_engine, explorer_params, verl_params
from trinity_like.config.schema import Config
from trinity_like.cpu_share import CoreShare
from trinity_like.errors import TrinityError
from trinity_like.explorer.worker import ExplorerWorker, RemoteExplorer
from trinity_like.models.device import describe as describe_precision
from trinity_like.models.device import run_device, set_run_device
from trinity_like.pipeline.data_sources import load_stage_data
from trinity_like.pipeline.reward_watch import RewardWatch
from trinity_like.pipeline.run_dir import RunDir
from trinity_like.pipeline.self_pairs import add_self_pairs
from trinity_like.pipeline.stage import Stage, Trainer
from trinity_like.pipeline.weight_ledger import WeightLedger
from trinity_like.registry import SAMPLE_STRATEGY
from trinity_like.threads import describe as describe_threads
from trinity_like.trainer.engines import train_engine_traits
from trinity_like.trainer.objective import Objective, objective_from_stage

ROLES = ("both", "explore", "train", "offline")


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def remote_explorer(spec: ResolvedStage) -> bool:
    """The explorer runs as a Ray actor: asked for, or beside a train engine's Ray workers in one process."""
    cfg = spec.config
    auto = (
        cfg.explorer.placement == "auto" and train_engine_traits(cfg.trainer.engine).ray_workers and cfg.mode == "both"
    )
    return spec.algorithm.use_rollout and cfg.mode != "train" and (cfg.explorer.placement == "ray" or auto)


def uses_ray(spec: ResolvedStage) -> bool:
    cfg = spec.config
    return (cfg.mode != "explore" and train_engine_traits(cfg.trainer.engine).ray_workers) or remote_explorer(spec)


def start_ray_for(spec: ResolvedStage, engines: int) -> bool:
    """Start (or join) Ray before any engine, so the stage owns its lifetime; True if started here.

    Every Ray worker of a train engine (verl's) holds one logical Ray CPU, so a locally started
    Ray gets at least as many logical CPUs as the stage's worker groups need (actor, reference,
    critic), whatever the machine's core count: they take turns, they do not all compute at once.
    """
    if not uses_ray(spec):  # the local engine with an in-process explorer never imports Ray
        return False
    import ray

    from trinity_like.trainer.verl_engine import start_ray

    if ray.is_initialized():
        return False
    cfg = spec.config
    ray_workers = train_engine_traits(cfg.trainer.engine).ray_workers
    needed = cfg.cluster.workers * engines if ray_workers else 0
    num_cpus = cfg.cluster.num_cpus or max(os.cpu_count() or 1, needed)
    started = start_ray(dataclasses.replace(verl_params(cfg), num_cpus=num_cpus))
    gpus = ray.cluster_resources().get("GPU", 0.0)
    if ray_workers and cfg.cluster.num_gpus > gpus:
        if started:
            ray.shutdown()
        raise TrinityError(
            f"cluster.num_gpus: {cfg.cluster.num_gpus} GPUs asked for the {cfg.trainer.engine} workers, but the Ray "
            f"cluster at {cfg.cluster.ray_address} has {gpus:g}; set cluster.num_gpus: 0 to train on CPU"
        )
    return started


def check_gpus(cfg: Config) -> None:
    """GPU workers on a machine without them fail here, before the run directory is touched.
    (An existing Ray cluster's GPUs are counted once connected: :func:`start_ray_for`.)"""
    ray_workers = train_engine_traits(cfg.trainer.engine).ray_workers
    if not ray_workers or not cfg.cluster.num_gpus or cfg.cluster.ray_address is not None:
        return
    found = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if found < cfg.cluster.num_gpus:
        raise TrinityError(
            f"cluster.num_gpus: {cfg.cluster.num_gpus} GPUs asked for the {cfg.trainer.engine} workers, but this "
            f"machine has {found} usable by torch; set cluster.num_gpus: 0 to train on CPU"
        )


def one_update(spec: ResolvedStage) -> bool:
    """Every batch gets one optimiser step, so its old logprobs are the current ones (see
    Objective.one_update): with any ``synchronizer.offset`` or ``interval``."""
    return not spec.algorithm.use_rollout or spec.config.trainer.update_epochs == 1


def _build_trainer(stage: Stage, objective: Objective, needs: frozenset[str]) -> None:
    """The buffer's sample strategy, the actor (and reference, critic) and the losses. Each engine
    joins the stage as soon as it exists, so a failed build closes it."""
    spec, cfg, path, cores = stage.spec, stage.config, str(stage.model_path), stage.resources.cores
    if stage.role != "offline":
        strat = spec.components["sample_strategy"]
        stage.strategy = SAMPLE_STRATEGY.get(strat.name)(params=strat.params)
    kind = "reward" if "scores" in needs else "lm"
    stage.trainer = Trainer(actor=build_engine(cfg, path, kind=kind, cores=cores), objective=objective, needs=needs)
    if "ref_logprob" in needs and stage.role != "offline":  # offline: only until its cache is full
        stage.trainer.reference = build_engine(cfg, path, forward_only=True, cores=cores)
    if spec.algorithm.use_critic:
        from trinity_like.models.resolve import resolve_model_path

        critic_path = str(resolve_model_path(cfg.model.critic_path)) if cfg.model.critic_path else path
        stage.trainer.critic = build_engine(cfg, critic_path, kind="value", critic=True, cores=cores)
        vl = spec.components.get("value_loss")
        if vl is None:
            raise TrinityError(f"algorithm {cfg.algorithm.type!r} uses a critic but names no value_loss")
        stage.trainer.value_objective = Objective(policy_loss=vl, loss_metric="value_loss")


def _build_explorer(stage: Stage) -> None:
    """The explorer (a Ray actor beside verl's workers, sharing their cores through a board) and its reward watch."""
    cfg, model_path = stage.config, str(stage.model_path)
    remote = remote_explorer(stage.spec)
    threads = cfg.cpu_threads()
    if remote and stage.role == "both":
        stage.resources.cores = CoreShare.for_threads(threads)
    if stage.resources.cores is not None:
        stage.run.logger.write(
            f"the explorer explores beside the trainer on the same cores: each takes all {threads.explorer_alone} "
            f"while the other waits, {threads.explorer} (explorer) and {threads.trainer} (each trainer "
            f"worker) while both compute (cluster.explorer_threads / trainer_threads fix them)"
        )
    stage.explorer = (
        RemoteExplorer(explorer_params(cfg), model_path, stage.resources.cores)
        if remote
        else ExplorerWorker(explorer_params(cfg), model_path)
    )
    stage.reward_watch = RewardWatch.for_stage(cfg, stage.run_dir, stage.model_path, stage.role, stage.run.logger.write)


def build_stage(spec: ResolvedStage, role: str, run: RunDir | None = None) -> Stage:
    """Validate data, then build what ``role`` needs (see the module doc) in ``run``, the run
    directory a restarted stage keeps (:mod:`.restart`; None: open it)."""
    from trinity_like.models.resolve import load_tokenizer, resolve_model_path

    if role not in ROLES:
        raise ValueError(f"role {role!r}: expected one of {ROLES}")
    cfg = spec.config
    seed_everything(cfg.seed)
    check_gpus(cfg)
    set_run_device(cfg.cluster.device)  # every model of the run goes there; a GPU that is not there fails here
    model_path = resolve_model_path(cfg.model.path)
    tokenizer = load_tokenizer(model_path)
    trains = role != "explore"
    # Data first: a bad data file fails before the run directory is touched.
    data = load_stage_data(spec, role, tokenizer)
    objective = objective_from_stage(spec, one_update=one_update(spec)) if trains else None
    needs = frozenset(spec.needs | objective.inputs_needed()) if objective else frozenset()
    if run is None:
        run = RunDir.open(cfg, role)
        run.logger.write(describe_precision(cfg.model.dtype, cfg.explorer.dtype, run_device()))
        widths = cfg.cpu_threads()
        run.logger.write(describe_threads(widths.explorer_alone, widths.trainer_alone, cfg.cluster.workers))
    stage = Stage(spec=spec, role=role, model_path=model_path, tokenizer=tokenizer, data=data, run=run)
    try:
        if role != "offline":
            stage.storage = open_storage(cfg.buffer.experience.storage, cfg.buffer.experience.args, run_dir=run.path)
        engines = (1 + ("ref_logprob" in needs) + spec.algorithm.use_critic) if trains else 0
        stage.resources.owns_ray = start_ray_for(spec, engines)
        if role in ("both", "explore"):
            _build_explorer(stage)
        if role == "offline":
            add_self_pairs(stage)  # the starting model answers before any train engine takes memory
            if data.eval_tasks and stage.explorer is None:
                stage.explorer = ExplorerWorker(explorer_params(cfg), str(model_path))
        if objective is not None:
            _build_trainer(stage, objective, needs)
            if spec.algorithm.use_rollout and role != "offline":  # every trained row names its weights
                stage.ledger = WeightLedger.for_config(cfg)
    except BaseException:
        stage.close()
        raise
    return stage
