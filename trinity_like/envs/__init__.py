"""Environments: single- and multi-turn episodes (tools, other models as players), one API
for both front doors -- see :mod:`.types` for the API, :mod:`.rollout` for how episodes are
run on the rollout engine, :mod:`.experience` for how they become training rows, :mod:`.workflow`
for how a recipe plays them, and ``docs/envs.md`` for how to write one. The core holds only
these contracts and machinery; the concrete environments (``arithmetic``, ``calculator``,
``twenty_questions``) are the ``cookbook`` pack's, registered in ``ENV`` like a plugin's."""
