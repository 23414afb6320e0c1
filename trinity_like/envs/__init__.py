"""Environments: single- and multi-turn episodes (tools, other models as players), one API
for both front doors -- see :mod:`.types` for the API, :mod:`.rollout` for how episodes are
run on the rollout engine, :mod:`.experience` for how they become training rows, and
``docs/envs.md`` for how to write one."""
