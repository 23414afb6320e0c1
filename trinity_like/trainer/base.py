"""The train-engine contract every engine (``local``, ``verl``) implements.

Batch layout (verl's, so batches cross to verl without copies): a batch is a ``dict`` of
tensors, B rows, prompts left-padded to P columns and responses right-padded to R::

    input_ids      [B, P+R]  long   prompt tokens (left-padded) then response tokens (right-padded)
    attention_mask [B, P+R]  long   1 on real tokens
    position_ids   [B, P+R]  long   cumsum(attention_mask) - 1, clamped at 0
    response_mask  [B, R]    float  1 on real response tokens that are trained on

plus per-row / per-token fields the components asked for (``old_logprob [B, R]``,
``advantages [B, R]``, ``ref_logprob [B, R]``, ``rewards [B]``, ``is_expert [B]``, ...), and
optionally ``target_ids [B, R]`` (:data:`TARGET_IDS`): the tokens to score in place of the
response tokens themselves (the client's ``target_tokens``; the ``local`` engine reads it).
Letters: B batch rows, P prompt columns, R response columns, T = P + R.

Checkpoints (:meth:`TrainEngine.save`), the same layout from every engine so that one
engine resumes another's, and nothing pickled:

    config.json, *.safetensors, tokenizer   the model, a Hugging Face folder (full weights)
    adapter_model.safetensors,              or, with LoRA, peft's adapter folder (the frozen
      adapter_config.json                     base stays where base_model.json says)
    base_model.json                         {"base_model": folder trained from, "lora": params or null}
    optimizer.safetensors                   torch's full optimiser state: one tensor per (parameter
                                              name, entry); param groups in the file's metadata
    trainer_state.json                      {"step": optimiser steps taken} (places the lr schedule)
    rng_state.safetensors                   torch RNG state (``cpu``; per rank on verl)

(the files are written and read by :mod:`~trinity_like.trainer.checkpoint_files`).

A *loss callable* maps ``(outputs, batch) -> (loss, metrics)`` where ``outputs`` holds
what the model produced for the response columns: ``logprob [B, R]`` for a language
model (``entropy [B, R]`` when asked for), ``values [B, R]`` for a value model (read at the
position before each response token), ``scores [B]`` for a reward model (read at each
row's last real token). It must be
picklable (the ``verl`` engine ships it to Ray workers) and must return, for each
micro-batch, that micro-batch's share of the whole batch's loss, so that micro-batch
gradients add up to the full-batch gradient (the batch carries the global normalisers
``num_tokens`` and ``num_seqs`` for that). Its metrics follow the naming convention of
:func:`mean_metrics`: a ``*_loss`` metric is a share too (summed), any other is a mean.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

import torch

from trinity_like.trainer.params import AdamStep
from trinity_like.trainer.shared_weights import WeightMailbox

Batch = dict[str, torch.Tensor]
LossCallable = Callable[[Mapping[str, torch.Tensor], Mapping[str, torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]


@runtime_checkable
class TrainEngine(Protocol):
    """What the trainer, the pipeline and the client API need of a train engine: every member a
    caller uses is declared here. Engines are registered in ``TRAIN_ENGINE``
    (:mod:`~trinity_like.trainer.engines`)."""

    # Where the weights export_weights hands over live: the local engine's device; the CPU for an
    # engine whose workers are other processes (their weights reach the explorer in shared memory).
    device: torch.device
    pids: list[int]  # the processes of the engine's workers besides this one (memory metrics); [] in-process

    @property
    def architecture(self) -> str:
        """The model's class name (``LlamaForCausalLM``; what the client reports as ``arch``)."""

    def forward_backward(
        self,
        batch: Batch,
        loss_fn: LossCallable,
        *,
        need_entropy: bool = False,
        out: dict[str, torch.Tensor] | None = None,
    ) -> dict[str, float]:
        """Run forward and backward over ``batch`` (in micro-batches); accumulate grads.

        Returns the loss callable's metrics reduced over micro-batches (:func:`mean_metrics`:
        ``*_loss`` shares summed, means averaged), plus ``loss``. ``out``, when given, is
        filled with the detached model outputs of every row (``logprob [B, R]``, ...), the
        ones the loss saw (the client returns them per datum).
        """

    def optim_step(self, adam: AdamStep | None = None) -> dict[str, float]:
        """Clip gradients, step the optimizer and scheduler, zero grads; returns ``grad_norm``, ``lr``.

        ``adam``: this step's own lr, betas, eps, weight decay and clip norm, in place of the
        schedule's (the client's ``optim_step(AdamParams)``).
        """

    def zero_grad(self) -> None:
        """Drop accumulated gradients without stepping (a skipped step)."""

    def compute_logprobs(self, batch: Batch, *, need_entropy: bool = False) -> dict[str, torch.Tensor]:
        """``logprob [B, R]`` (and ``entropy [B, R]``) of the response tokens, without grad, on the CPU.

        A value model returns ``values [B, R]`` and a reward model ``scores [B]`` instead.
        """

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Full (unsharded) model weights on CPU, Hugging Face names -- for weight sync."""

    def export_weights(self, mailbox: WeightMailbox | None = None) -> Any:
        """The full weights for an explorer: a state dict (views of the live weights: copy
        them before the next step), or, when the engine's workers live in Ray, a handle to
        them in shared memory (:class:`~trinity_like.trainer.shared_weights.SharedWeights`)
        that the explorer actor maps directly.

        With ``mailbox``, every engine writes them there and returns the handle: a snapshot
        that stays as it is until that mailbox is written again (the concurrent explorer
        keeps one mailbox per version a batch may still load)."""

    def save(self, path: str) -> None:
        """Write a checkpoint folder, safetensors and JSON only (no pickle; see "Checkpoints" below)."""

    def load(self, path: str, *, with_optimizer: bool = True) -> None:
        """Restore what :meth:`save` wrote: weights, and with ``with_optimizer`` the optimiser
        state, step count and RNG state (else a fresh optimiser at step 0)."""

    def release_memory(self) -> None:
        """Hand memory the last step freed back to the machine (device memory on a GPU), before
        another part uses it (an evaluation; an explorer sampling on the same GPU): the next step
        takes it again."""

    def resume_memory(self) -> None:
        """The other part is done: the engine may take memory again (engines that allocate on
        demand do nothing here)."""

    def close(self) -> None:
        """Release workers and memory."""


def with_normalisers(batch: Batch) -> Batch:
    """``batch`` plus the global normalisers ``num_tokens`` and ``num_seqs`` (0-dim float tensors).

    Engines call this on the whole batch before splitting it, so every micro-batch (and,
    in the ``verl`` engine, every data-parallel rank) divides by the same full-batch
    counts. A caller that accumulates gradients over several ``forward_backward`` calls
    sets them itself, to the counts of everything accumulated; existing values are kept.
    """
    out = dict(batch)
    if "num_tokens" not in out:
        out["num_tokens"] = batch["response_mask"].sum().to(torch.float32)
    if "num_seqs" not in out:
        out["num_seqs"] = torch.tensor(float(batch["response_mask"].shape[0]))
    return out


def batch_rows(batch: Batch) -> int:
    """Number of rows B of a batch (from ``input_ids``)."""
    return int(batch["input_ids"].shape[0])


def slice_rows(batch: Batch, start: int, stop: int) -> Batch:
    """Rows ``start:stop`` of every per-row field; 0-dim fields (normalisers) are shared."""
    return {k: (v if v.dim() == 0 else v[start:stop]) for k, v in batch.items()}


TARGET_IDS = "target_ids"  # optional batch field [B, R]: the tokens to score, when not the response's own

# A 0-dim batch field: how many consecutive rows form one example that a loss reads
# together (2 for preference pairs: chosen, rejected). Engines split batches only at
# multiples of it -- into micro-batches and into data-parallel shards -- and reorder rows
# only in whole examples (a loss callable sees a micro-batch's rows in an order of the
# engine's choosing, trainer/forward.length_order; the outputs come back in batch order).
ROWS_PER_EXAMPLE = "rows_per_example"


def row_unit(batch: Batch) -> int:
    """The batch's ``rows_per_example`` (1 unless set)."""
    unit = batch.get(ROWS_PER_EXAMPLE)
    return 1 if unit is None else int(unit)


def micro_batches(batch: Batch, micro_batch_size: int) -> list[Batch]:
    """Split a batch into consecutive micro-batches of at most ``micro_batch_size`` rows
    (rounded down to whole examples, at least one example each)."""
    rows, unit = batch_rows(batch), row_unit(batch)
    size = max(unit, micro_batch_size // unit * unit)
    return [slice_rows(batch, i, min(i + size, rows)) for i in range(0, rows, size)]


# -- metrics over micro-batches ----------------------------------------------------------
# A loss callable runs once per micro-batch (on every data-parallel worker) and reports
# metrics that follow one convention, by name, so that every metric reads the same
# whatever the micro-batch size and the number of workers:
#
# - ``<name>_loss``: the micro-batch's *share* of a whole-batch total (its term divided by
#   the whole batch's normaliser, like the loss itself), so the shares are summed:
#   ``policy_loss``, ``value_loss``, MIX's ``rl_loss`` / ``sft_loss``; ``nonfinite_loss``
#   counts the micro-batches whose loss was not finite.
# - anything else: a mean over what the micro-batch holds (clip fraction, KL, margins),
#   averaged over the micro-batches that reported it. A loss leaves a mean out of a
#   micro-batch that holds nothing to average (MIX: ``expert_nll`` without expert rows), so
#   it is never diluted by zeros. Micro-batches weigh equally (verl's convention): exact
#   when they hold equal numbers of what the metric averages over, close otherwise.
SUMMED_SUFFIX = "_loss"


def is_summed_metric(name: str) -> bool:
    """Whether ``name`` is a share of a whole-batch total (summed over micro-batches), by its suffix."""
    return name.endswith(SUMMED_SUFFIX)


def mean_metrics(per_micro: list[dict[str, float]]) -> dict[str, float]:
    """Each metric over the micro-batches that reported it: summed (``*_loss``) or averaged (the rest)."""
    keys = sorted({k for m in per_micro for k in m})
    out = {}
    for k in keys:
        values = [m[k] for m in per_micro if k in m]
        out[k] = sum(values) if is_summed_metric(k) else sum(values) / len(values)
    return out
