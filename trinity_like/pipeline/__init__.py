"""The loops that drive a recipe: explorer -> buffer -> trainer -> weight sync.

Start with :mod:`.rl_loop`: one GRPO step reads top to bottom there, and the verbs it calls
on the stage (explore, put, next_batch, sync_weights, evaluate, save/load_checkpoint, log)
are declared in :mod:`.verbs` -- with the loss in :mod:`trinity_like.trainer.objective`, the
whole step.

- :mod:`.rl_loop` -- the online loop in turn (mode ``both``) and the trainer alone (mode
  ``train``): :func:`.rl_loop.step`, one step every online loop (and a benchmark) takes
  with hooks of its own; sample a batch, dynamic sampling, advantages.
- :mod:`.steps` -- what every loop's step shares: :class:`.steps.LoopState`,
  :class:`.steps.StepHooks`, :func:`.steps.update` and :func:`.steps.end_step`.
- :mod:`.verbs` -- :class:`.verbs.StageVerbs`, the protocol the loops are typed against,
  each verb with its one-line contract; what they read of the recipe is its ``params``
  (:class:`.loop_params.LoopParams`, built once with the stage); :mod:`.stage` --
  :class:`.stage.Stage`, which holds one stage's parts and implements it (its train side
  and machine resources: :mod:`.resources`).
- :mod:`.build` -- :func:`.build.build_stage`, the one way a stage is set up for any role
  (``both``, ``explore``, ``train``, ``offline``).
- :mod:`.async_loop` -- mode ``both`` with ``synchronizer.offset >= 1``: the explorer
  explores in the background while the trainer trains.
- :mod:`.offline_loop` -- SFT, DPO and reward models from a dataset (cached reference logprobs).
- :mod:`.explorer_process` -- mode ``explore``: the explorer as its own process, fed weights
  through :mod:`.weight_channel` (``<run_dir>/sync``), writing to the shared buffer.
- :mod:`.evaluate_checkpoints` -- mode ``bench``: held-out accuracy of every checkpoint.
- :mod:`.data_sources` -- what a stage reads (tasks, offline rows, expert rows), loaded and
  validated before anything is written; :mod:`.batching` turns rows into padded tensor batches.
- :mod:`.run_dir` -- the run directory: lock (:mod:`.run_lock`), logger, checkpoints
  (:mod:`.checkpoint`: atomic, content-hashed, keep-last-N), timeline, evals log.
- :mod:`.reward_watch` -- a learned reward watched against the gold one (check at start, guard).
- :mod:`.self_pairs` -- DPO/RM pairs from the starting model's own wrong answers.

Engines live in :mod:`trinity_like.trainer` (train) and :mod:`trinity_like.explorer`
(rollout); metrics and the progress bar in :mod:`trinity_like.monitor`. ``docs/architecture.md``
maps the whole package.
"""
