"""The one train-engine factory: a recipe's ``trainer.engine`` over a model folder.

Example::

    actor = build_engine(config, "/path/to/hf_folder")                       # the policy
    reference = build_engine(config, path, forward_only=True)                 # frozen
    critic = build_engine(config, path, kind="value", critic=True)           # PPO's value model

``local`` is an in-process torch engine; ``verl`` starts verl's FSDP workers through Ray
(``cluster.trainer_workers`` of them, on GPUs when ``cluster.num_gpus`` is set). verl and
Ray are imported only for the ``verl`` engine, so the ``local`` one starts without them.

``model.lora_rank > 0`` trains the policy as a LoRA adapter on either engine
(:mod:`~trinity_like.trainer.lora`); the explorer then samples from the merged weights.
"""

from __future__ import annotations

from trinity_like.config.schema import Config
from trinity_like.cpu_share import CoreShare
from trinity_like.trainer.base import TrainEngine
from trinity_like.trainer.params import model_params, optim_params


def build_engine(
    config: Config,
    path: str,
    *,
    kind: str = "lm",
    forward_only: bool = False,
    critic: bool = False,
    cores: CoreShare | None = None,
) -> TrainEngine:
    """A train engine of kind ``config.trainer.engine`` holding the model folder ``path``.

    ``kind``: "lm" (logprobs), "value" (a critic's values) or "reward" (a reward model's
    scores); ``critic`` takes the optimiser from ``trainer.critic_optimizer``; ``cores``: the
    board the `verl` workers share the CPU cores through with the explorer (:mod:`trinity_like.cpu_share`).
    """
    model = model_params(config, path, kind=kind, forward_only=forward_only)
    optim = optim_params(config, critic=critic)
    if config.trainer.engine == "local":
        from trinity_like.trainer.local_engine import LocalEngine

        return LocalEngine(model, optim)
    from trinity_like.trainer.verl_engine import VerlEngine, verl_params

    return VerlEngine(model, optim, verl_params(config, cores))
