"""The first-party algorithm pack: GRPO, PPO, DPO, SFT, RM, MIX and friends.

Registered through the public registries and found through the ``trinity_like.plugins``
entry point, exactly as a third-party plugin is. Importing this package registers
every component of the pack.
"""
