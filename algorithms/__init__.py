"""The first-party algorithm pack: GRPO, PPO, DPO, SFT, RM, MIX and friends.

Registered through the public registries and found through the ``trinity_like.plugins``
entry point, exactly as a third-party plugin is. Importing this package registers
every component of the pack:

- ``algorithms.losses``      policy losses (POLICY_LOSS_FN), the critic's ``value_clip``
- ``algorithms.advantages``  advantage fns (ADVANTAGE_FN)
- ``algorithms.kl``          KL estimators (KL_FN)
- ``algorithms.entropy``     entropy losses (ENTROPY_LOSS_FN)
- ``algorithms.sampling``    sample strategies (SAMPLE_STRATEGY)
- ``algorithms.rollout_correction``  sampler-trainer gap corrections (ROLLOUT_CORRECTION)
- ``algorithms.types``       algorithm types (ALGORITHM_TYPE)
"""

from algorithms import advantages, entropy, kl, losses, rollout_correction, sampling, types  # noqa: F401  (importing registers)
