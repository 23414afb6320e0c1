"""Train engines: the contract (``base``), their params (``params``), the ``TRAIN_ENGINE`` factory (``engines``).

- ``local_engine``: in-process torch engine over a Hugging Face model.
- ``verl_engine``: verl 0.9.1's FSDP workers through Ray (``verl_worker`` runs inside them;
  ``verl_cpu`` registers verl's CPU platform and engines when the cluster has no GPU).
"""
