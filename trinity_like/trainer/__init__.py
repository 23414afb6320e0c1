"""Train engines: the contract (``base``), their params (``params``), the ``TRAIN_ENGINE`` factory (``engines``),
their checkpoint files (``checkpoint_files``). A recipe is turned into their params in
:mod:`trinity_like.config.engine_params`: nothing here reads it.

- ``local_engine``: in-process torch engine over a Hugging Face model.
- ``verl_engine``: verl 0.9.1's FSDP workers through Ray (``verl_worker`` runs inside them;
  ``verl_cpu`` registers verl's CPU platform and engines when the cluster has no GPU).
"""
