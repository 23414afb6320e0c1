"""The first-party cookbook: what is built *on* the Tinker-compatible client, beside the core.

As tinker-cookbook stands beside tinker, this pack stands beside ``trinity_like`` (the core:
the env contracts, the ENV registry, the rollout of envs, the ``env`` workflow, the engines
and the client) and ``algorithms`` (the losses and advantage fns). It is found through the
``trinity_like.plugins`` entry point and registers through the public registries, exactly
as a third-party plugin does. Importing this package registers every component of the pack:

- ``cookbook.envs``            environments (ENV): ``arithmetic``, ``calculator``, ``twenty_questions``,
                               and the ``twenty_questions`` task source (TASK_SOURCE)

and holds, imported on use (they register nothing):

- ``cookbook.rl.train``        the client's reusable RL loop: ``RLTrainConfig``, ``train``
- ``cookbook.rl.core``         its parts: episodes, datums, the training step, evaluation, checkpoints
- ``cookbook.rl.advantages``   per-episode / per-turn advantages by an advantage fn looked up in ADVANTAGE_FN
- ``cookbook.rl.stream``       streaming minibatches and off-by-K sampling (docs/async.md)
"""

from cookbook import envs  # noqa: F401  (importing registers)
