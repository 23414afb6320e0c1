"""Policy losses (POLICY_LOSS_FN): one short pure function per file, equation and paper in its docstring.

Shared contract: keyword-only tensors named after batch fields (``logprob [B, R]``,
``old_logprob [B, R]``, ``advantages [B, R]``, ``action_mask [B, R]``, ...), the whole
batch's normalisers ``num_tokens`` / ``num_seqs`` when the trainer splits it into
micro-batches, hyper-parameters in ``params``; returns ``(loss, metrics)``.
"""

from algorithms.losses import (  # noqa: F401  (importing registers)
    bradley_terry,
    cispo,
    dpo,
    dro,
    gspo,
    importance_sampling,
    mix,
    ppo,
    sft,
    tis,
    value,
)
