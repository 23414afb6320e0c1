"""The loops that drive a recipe: explorer -> buffer -> trainer -> weight sync.

Start with :mod:`.rl_loop`: one GRPO step reads top to bottom there, and the few verbs it
calls on the stage (explore, evaluate, sync_weights, checkpoint) are in :mod:`.stage`.

- :mod:`.rl_loop` -- the online loop (mode ``both``) and the trainer alone (mode ``train``):
  sample a batch, dynamic sampling, advantages, update, end of step. :func:`.rl_loop.update`
  and :func:`.rl_loop.end_step` serve every loop.
- :mod:`.stage` -- :class:`.stage.Stage` (what one stage holds) and :func:`.stage.build_stage`,
  the one way a stage is set up for any role (``both``, ``explore``, ``train``, ``offline``).
- :mod:`.offline_loop` -- SFT, DPO and reward models from a dataset (cached reference logprobs).
- :mod:`.explorer_process` -- mode ``explore``: the explorer as its own process, fed weights
  through :mod:`.weight_channel` (``<run_dir>/sync``), writing to the shared buffer.
- :mod:`.evaluate_checkpoints` -- mode ``bench``: held-out accuracy of every checkpoint.
- :mod:`.data_sources` -- what a stage reads (tasks, offline rows, expert rows), loaded and
  validated before anything is written; :mod:`.batching` turns rows into padded tensor batches.
- :mod:`.self_pairs` -- DPO/RM pairs from the starting model's own wrong answers.
- :mod:`.checkpoint` -- atomic, content-hashed checkpoints (keep-last-N, RNG states as JSON).

Engines live in :mod:`trinity_like.trainer` (train) and :mod:`trinity_like.explorer`
(rollout); metrics and the progress bar in :mod:`trinity_like.monitor`. ``docs/architecture.md``
maps the whole package.
"""
