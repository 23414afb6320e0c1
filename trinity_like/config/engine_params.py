"""A recipe turned into the engines' own params: the one place that reads the recipe for them.

The trainer and the explorer never import the recipe schema (``tests/core/test_layering.py``):
they take typed params objects, and this module builds those from a :class:`Config` --
train engines (:func:`build_engine`, over :func:`model_params`, :func:`optim_params`,
:func:`verl_params`), the explorer (:func:`explorer_params`, its workflow's settings in
:func:`workflow_settings`) and its sampling per step (:func:`sampling_params`). Example::

    actor = build_engine(config, "/path/to/hf_folder")                       # the policy
    reference = build_engine(config, path, forward_only=True)                 # frozen
    critic = build_engine(config, path, kind="value", critic=True)           # PPO's value model
    explorer = ExplorerWorker(explorer_params(config), model_folder)
    result = explorer.run(tasks, sampling_params(config, step=1))
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trinity_like.config.schema import Config, ExplorerConfig, OptimizerConfig
from trinity_like.cpu_share import CoreShare
from trinity_like.errors import TrinityError
from trinity_like.explorer.engine_contract import SamplingParams
from trinity_like.explorer.worker import ExplorerParams, WorkflowSettings, build_workflow_params
from trinity_like.trainer.engines import TrainEngineSpec, build_train_engine
from trinity_like.trainer.lora import LoraParams
from trinity_like.trainer.params import ModelParams, OptimParams
from trinity_like.trainer.verl_config import VerlParams

if TYPE_CHECKING:
    from trinity_like.trainer.base import TrainEngine


# -- train engines -------------------------------------------------------------------------
def build_engine(
    config: Config,
    path: str,
    *,
    kind: str = "lm",
    forward_only: bool = False,
    critic: bool = False,
    cores: CoreShare | None = None,
) -> TrainEngine:
    """The ``TRAIN_ENGINE`` entry ``trainer.engine`` of a recipe, holding the model folder ``path``.

    ``kind``: "lm" (logprobs), "value" (a critic's values) or "reward" (a reward model's
    scores); ``critic`` takes the optimiser from ``trainer.critic_optimizer``; ``cores``: the
    board the `verl` workers share the CPU cores through with the explorer (:mod:`trinity_like.cpu_share`).
    ``model.lora_rank > 0`` trains the policy as a LoRA adapter on either engine
    (:mod:`~trinity_like.trainer.lora`); the explorer then samples from the merged weights.
    """
    spec = TrainEngineSpec(
        model=model_params(config, path, kind=kind, forward_only=forward_only),
        optim=optim_params(config, critic=critic),
        cluster=verl_params(config, cores),
    )
    return build_train_engine(config.trainer.engine, spec)


def optim_params(config: Config, *, critic: bool = False) -> OptimParams:
    """The policy's (or the critic's) optimiser of a recipe: ``trainer.optimizer`` / ``trainer.critic_optimizer``."""
    t = config.trainer
    o = t.critic_optimizer if critic else t.optimizer
    values = {k: getattr(o, k) for k in OptimizerConfig.model_fields}
    return OptimParams(**values, total_steps=t.total_steps * t.update_epochs)


def model_params(config: Config, path: str, *, kind: str = "lm", forward_only: bool = False) -> ModelParams:
    """How a train engine holds the model folder ``path`` for a recipe.

    ``model.lora_rank > 0`` puts a LoRA adapter (seeded by the recipe's ``seed``) on the
    trained policy; a frozen reference is the base model itself and a critic trains every
    weight. A reward model with LoRA is an error rather than a silently full fine-tune.
    """
    m = config.model
    lora = None
    if m.lora_rank > 0:
        if kind == "reward":
            raise TrinityError(
                "model.lora_rank: LoRA adapts a language-model policy; a reward model trains "
                "every weight here (set model.lora_rank: 0)"
            )
        if kind == "lm" and not forward_only:
            lora = LoraParams(
                rank=m.lora_rank,
                alpha=m.lora_alpha,
                train_attn=m.lora_train_attn,
                train_mlp=m.lora_train_mlp,
                train_unembed=m.lora_train_unembed,
                seed=config.seed,
            )
    return ModelParams(
        path=path,
        kind=kind,
        micro_batch_size=config.trainer.micro_batch_size,
        share_prompts=config.trainer.share_prompts,
        gradient_checkpointing=config.trainer.gradient_checkpointing,
        dtype=m.dtype,
        device=config.cluster.device,
        attn_implementation=m.attn_implementation,
        forward_only=forward_only,
        head_seed=config.seed,
        lora=lora,
    )


def verl_params(config: Config, cores: CoreShare | None = None) -> VerlParams:
    """A recipe's ``cluster`` section as verl worker placement (``cores``: :mod:`trinity_like.cpu_share`)."""
    c, threads = config.cluster, config.cpu_threads()
    return VerlParams(
        num_workers=c.workers,
        ray_address=c.ray_address,
        num_cpus=c.num_cpus,
        use_gpu=c.num_gpus > 0,
        placement=c.placement,
        seed=config.seed,
        threads=threads.trainer_alone if cores is not None else threads.trainer,
        cores=cores,
    )


# -- the explorer --------------------------------------------------------------------------
def explorer_params(config: Config) -> ExplorerParams:
    """What an explorer (in-process or a Ray actor) is built from: its engine, workflow and threads."""
    e = config.explorer
    threads = config.cpu_threads()
    return ExplorerParams(
        engine=e.engine,
        dtype=e.dtype,
        device=config.cluster.device,
        max_concurrent=e.max_concurrent,
        workflow=e.workflow,
        settings=workflow_settings(config),
        eval_settings=workflow_settings(config, evaluation=True) if e.eval_reward_fn else None,
        threads=threads.explorer,
        threads_alone=threads.explorer_alone,
    )


def gold_reward(explorer: ExplorerConfig) -> tuple[str, dict[str, Any]]:
    """The gold reward fn's name and params (``""``: none): ``gold_reward_fn`` when set, else
    ``eval_reward_fn`` when it is set and is not the trained ``reward_fn``."""
    if explorer.gold_reward_fn is not None:
        return explorer.gold_reward_fn, dict(explorer.gold_reward_args)
    if explorer.eval_reward_fn is not None and explorer.eval_reward_fn != explorer.reward_fn:
        return explorer.eval_reward_fn, dict(explorer.eval_reward_args)
    return "", {}


def workflow_settings(config: Config, *, evaluation: bool = False) -> WorkflowSettings:
    """The explorer's reward settings offered to its workflow, and the recipe's ``workflow_args``."""
    e = config.explorer
    use_eval = evaluation and e.eval_reward_fn is not None
    gold_fn, gold_args = ("", {}) if evaluation else gold_reward(e)  # evaluation scores with the gold reward itself
    offered = {
        "reward_fn": e.eval_reward_fn if use_eval else e.reward_fn,
        "reward_params": dict(e.eval_reward_args if use_eval else e.reward_args),
        "gold_reward_fn": gold_fn,
        "gold_reward_params": gold_args,
        "reward_timeout_s": e.reward_timeout_s,
        "reward_retries": e.reward_retries,
        "max_total_tokens": config.model.max_prompt_tokens + config.model.max_response_tokens,
    }
    return WorkflowSettings(offered=offered, args=dict(e.workflow_args))


def workflow_params(config: Config, cls: type, *, evaluation: bool = False) -> Any:
    """The params the explorer builds the workflow ``cls`` with, for a recipe."""
    return build_workflow_params(cls, workflow_settings(config, evaluation=evaluation))


def sampling_params(config: Config, *, step: int, evaluation: bool = False) -> SamplingParams:
    """The explorer's sampling for ``step``; seeds depend on (run seed, step) only."""
    s = config.explorer.eval_sampling if evaluation else config.explorer.sampling
    return SamplingParams(
        n=1 if evaluation else config.explorer.group_size,
        max_new_tokens=s.max_new_tokens or config.model.max_response_tokens,
        temperature=s.temperature if s.temperature > 0 else 1.0,
        greedy=s.temperature == 0,
        top_k=s.top_k,
        top_p=s.top_p,
        seed=(config.seed * 1_000_003 + step) % 2**62,
        stop_token_ids=tuple(s.stop_token_ids) or None,
        stop_strings=tuple(s.stop),
    )
