"""Tinker ``Datum`` lists <-> the train engines' padded batch, checked datum by datum.

A Datum is one sequence: ``model_input`` holds T tokens x_0..x_{T-1} and every
``loss_fn_inputs`` array holds T values, one per position; position i predicts
``target_tokens[i]`` (usually x_{i+1}) from x_0..x_i. The engines' layout (see
:mod:`trinity_like.trainer.base`) scores R response columns from the column before each,
so a datum becomes a row whose prompt is x_0 alone and whose R = T response columns are
x_1..x_{T-1} plus one more column; the logits at column i then belong to position i::

    input_ids       x_0 | x_1 ... x_{T-1}  t_{T-1}  pad ...     (1 + R columns)
    target_ids          | t_0 ... t_{T-2}  t_{T-1}  0 ...       (R columns, position i -> column i)
    response_mask       |  1  ...   1        1      0 ...

The extra last column is never attended to by an earlier position, so any token serves;
the target is used so that an engine that scores the response tokens themselves
(``verl``) gets position T-1 right. Arrays become ``[B, R]`` batch fields of the same name
(``weights``, ``advantages``, ``logprobs``), zero on padding.

What the engine could not survive is refused first, by :func:`check_datum_values` (the
in-process client, before a request reaches its engine, and ``trinity-like serve`` at the
door, one code): a token id outside ``[0, vocabulary)``, a datum longer than the model's
context, a NaN or infinite value in any ``loss_fn_inputs`` array. A sampling prompt is
checked against the same :class:`ModelLimits` by :func:`prompt_ids`.

Example::

    datum = tinker.types.Datum(model_input=tinker.types.ModelInput.from_ints([5, 6, 7]),
                               loss_fn_inputs={"target_tokens": [6, 7, 8], "weights": [0, 1, 1]})
    batch, lengths = to_batch([datum], ("target_tokens", "weights"))
    batch["input_ids"]   # [[5, 6, 7, 8]]
    batch["weights"]     # [[0., 1., 1.]]
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import tinker
import torch

from trinity_like.errors import TrinityError
from trinity_like.trainer.base import TARGET_IDS

INT_KEYS = frozenset({"target_tokens"})
FLOAT_KEYS = frozenset({"weights", "advantages", "logprobs"})


class DataError(TrinityError, ValueError):
    """A Datum (or the list of them) the client cannot train on; the message names the datum and key."""


@dataclass(frozen=True)
class ModelLimits:
    """What a model's inputs must fit: token ids below ``vocab_size``, at most ``context`` tokens."""

    vocab_size: int | None  # token ids lie in [0, vocab_size); None: unchecked
    context: int | None  # max_position_embeddings: tokens one sequence may hold; None: unchecked

    @staticmethod
    def of(folder: str | Path) -> ModelLimits:
        """The limits a Hugging Face folder's ``config.json`` states (a multimodal one's ``text_config``)."""
        config = json.loads((Path(folder) / "config.json").read_text())
        config = {**config.get("text_config", {}), **config}

        def positive(key: str) -> int | None:
            value = config.get(key)
            return value if isinstance(value, int) and value > 0 else None

        return ModelLimits(positive("vocab_size"), positive("max_position_embeddings"))


def check_token_ids(ids: np.ndarray, limits: ModelLimits, where: str) -> None:
    """Every id of ``ids`` lies in ``[0, vocab_size)``; the error names ``where`` and the first position.
    (An array of Python ints too large for int64 has dtype object: compared all the same.)"""
    if limits.vocab_size is None or ids.size == 0:
        return
    bad = np.flatnonzero((ids < 0) | (ids >= limits.vocab_size))
    if bad.size:
        p = int(bad[0])
        raise DataError(
            f"{where}: token {int(ids[p])} is outside the model's vocabulary of {limits.vocab_size} "
            f"(ids 0..{limits.vocab_size - 1}), at position {p}"
        )


def check_datum_values(datum: tinker.types.Datum, index: int, limits: ModelLimits) -> None:
    """Datum ``index`` fits the model and holds only finite numbers (every ``loss_fn_inputs`` key,
    a loss's or not): its length against the context, its token ids against the vocabulary."""
    tokens = np.asarray(datum_tokens(datum, index))
    if limits.context is not None and tokens.size > limits.context:
        raise DataError(
            f"datum {index}: model_input has {tokens.size} tokens, more than the model's context "
            f"of {limits.context} (max_position_embeddings)"
        )
    check_token_ids(tokens, limits, f"datum {index}: model_input")
    for key, tensor in datum.loss_fn_inputs.items():
        values = tensor.to_numpy()
        if np.issubdtype(values.dtype, np.floating):
            bad = np.flatnonzero(~np.isfinite(values.ravel()))
            if bad.size:
                p = int(bad[0])
                raise DataError(
                    f"datum {index}: loss_fn_inputs[{key!r}] holds {values.ravel()[p]} at position {p} "
                    "(every value must be finite)"
                )
        elif key in INT_KEYS and np.issubdtype(values.dtype, np.integer):
            check_token_ids(values.ravel(), limits, f"datum {index}: loss_fn_inputs[{key!r}]")


def check_data(data: Sequence[tinker.types.Datum], limits: ModelLimits) -> None:
    """:func:`check_datum_values` for each datum of a list (the list itself checked first)."""
    if not isinstance(data, Sequence) or isinstance(data, (str, bytes)):
        raise DataError(f"data must be a list of tinker.types.Datum, got {type(data).__name__}")
    if len(data) == 0:
        raise DataError("data is empty: forward/backward needs at least one Datum")
    for i, datum in enumerate(data):
        check_datum_values(datum, i, limits)


def prompt_ids(prompt: tinker.types.ModelInput, vocab_size: int | None, context: int | None = None) -> list[int]:
    """The token ids of a text-only sampling ``prompt`` that fits the model (``vocab_size``,
    ``context``: :class:`ModelLimits`); errors name the offending chunk or token."""
    if not isinstance(prompt, tinker.types.ModelInput):
        raise TypeError(f"prompt must be a tinker.types.ModelInput, got {type(prompt).__name__}")
    for i, chunk in enumerate(prompt.chunks):
        if chunk.type != "encoded_text":
            raise ValueError(f"prompt chunk {i} is of type {chunk.type!r}; this sampler reads token chunks only")
    ids = [int(t) for t in prompt.to_ints()]
    if not ids:
        raise ValueError("prompt is empty: sampling needs at least one token")
    if context is not None and len(ids) > context:
        raise ValueError(f"prompt has {len(ids)} tokens, more than the model's context of {context}")
    check_token_ids(np.asarray(ids), ModelLimits(vocab_size, context), "prompt")
    return ids


def datum_tokens(datum: tinker.types.Datum, index: int) -> list[int]:
    """The model input's token ids (text chunks only)."""
    if not isinstance(datum, tinker.types.Datum):
        raise DataError(f"datum {index}: expected tinker.types.Datum, got {type(datum).__name__}")
    for chunk in datum.model_input.chunks:
        if not isinstance(chunk, tinker.types.EncodedTextChunk):
            raise DataError(f"datum {index}: model_input chunk of type {chunk.type!r} is not supported (text only)")
    tokens = datum.model_input.to_ints()
    if not tokens:
        raise DataError(f"datum {index}: model_input is empty")
    return tokens


def datum_array(datum: tinker.types.Datum, index: int, key: str, length: int) -> np.ndarray:
    """``loss_fn_inputs[key]`` as a 1-D numpy array of ``length`` values, of the key's kind."""
    value = datum.loss_fn_inputs[key].to_numpy()
    if value.ndim != 1 or value.shape[0] != length:
        raise DataError(
            f"datum {index}: loss_fn_inputs[{key!r}] has shape {list(value.shape)}, "
            f"model_input has {length} tokens (one value per position expected)"
        )
    if key in INT_KEYS and not np.issubdtype(value.dtype, np.integer):
        raise DataError(f"datum {index}: loss_fn_inputs[{key!r}] must hold integers (int64), got {value.dtype}")
    if key in FLOAT_KEYS and not np.issubdtype(value.dtype, np.floating):
        raise DataError(f"datum {index}: loss_fn_inputs[{key!r}] must hold floats (float32), got {value.dtype}")
    return value


def check_keys(datum: tinker.types.Datum, index: int, keys: Sequence[str], what: str, *, extra_ok: bool) -> None:
    """Every key of ``keys`` is present and (unless ``extra_ok``) nothing else."""
    given = set(datum.loss_fn_inputs)
    missing = [k for k in keys if k not in given]
    if missing:
        raise DataError(f"datum {index}: loss_fn_inputs has no {missing[0]!r} ({what} needs {', '.join(keys)})")
    extra = sorted(given - set(keys))
    if extra and not extra_ok:
        raise DataError(
            f"datum {index}: loss_fn_inputs key {extra[0]!r} is not an input of {what} (it takes {', '.join(keys)})"
        )


@dataclass(frozen=True)
class Layout:
    """Where each datum sits in the batch: its length T and the first position scored."""

    lengths: tuple[int, ...]  # T per datum
    starts: tuple[int, ...]  # first position with a logprob computed; earlier ones come back as 0.0


def first_loss_position(arrays: dict[str, np.ndarray], length: int) -> int:
    """The first position any float array is non-zero at (the last position when none is):
    positions before it carry no loss, so their logits need not be computed."""
    used = np.zeros(length, dtype=bool)
    for key, values in arrays.items():
        if key in FLOAT_KEYS:
            used |= values != 0
    hits = np.flatnonzero(used)
    return int(hits[0]) if hits.size else length - 1


def to_batch(
    data: Sequence[tinker.types.Datum],
    keys: Sequence[str],
    *,
    what: str = "this loss",
    extra_ok: bool = False,
    score_all: bool = True,
    pad_id: int = 0,
    limits: ModelLimits | None = None,
) -> tuple[dict[str, torch.Tensor], Layout]:
    """The engines' batch for ``data`` carrying the arrays ``keys`` (which include ``target_tokens``).

    ``score_all``: every position is scored. Otherwise a datum's leading positions that carry
    no loss (all its arrays zero there, as over an RL prompt) join the prompt, whose logits
    the engines never compute: the same work as the recipe path on the same sequences.
    ``limits``: the model's (:func:`check_data`); None checks no values. Errors name the datum index and key.
    """
    check_data(data, limits or ModelLimits(None, None))
    rows = []
    for i, datum in enumerate(data):
        tokens = datum_tokens(datum, i)
        check_keys(datum, i, keys, what, extra_ok=extra_ok)
        arrays = {k: datum_array(datum, i, k, len(tokens)) for k in keys}
        start = 0 if score_all else first_loss_position(arrays, len(tokens))
        rows.append((tokens, arrays, start))
    layout = Layout(tuple(len(t) for t, _, _ in rows), tuple(s for _, _, s in rows))
    B = len(rows)
    P = max(s + 1 for _, _, s in rows)  # prompt x_0..x_start, left-padded
    R = max(len(t) - s for t, _, s in rows)  # scored positions start..T-1, right-padded
    input_ids = torch.full((B, P + R), pad_id, dtype=torch.long)
    attention = torch.zeros((B, P + R), dtype=torch.long)
    fields = {k: torch.zeros((B, R), dtype=torch.float32) for k in keys if k != "target_tokens"}
    targets = torch.zeros((B, R), dtype=torch.long)
    mask = torch.zeros((B, R), dtype=torch.float32)
    for b, (tokens, arrays, start) in enumerate(rows):
        n = len(tokens) - start  # scored positions start..T-1
        target = torch.from_numpy(arrays["target_tokens"].astype(np.int64))
        input_ids[b, P - start - 1 : P + n - 1] = torch.tensor(tokens)
        input_ids[b, P + n - 1] = target[-1]  # never attended to by a scored position; see the module doc
        attention[b, P - start - 1 : P + n] = 1
        targets[b, :n] = target[start:]
        mask[b, :n] = 1.0
        for k in fields:
            fields[k][b, :n] = torch.from_numpy(arrays[k][start:].astype(np.float32))
    # A datum of exactly ``context`` tokens puts its extra column (never attended to) at position
    # ``context``: clamped, so a model with learned positions never indexes past its table.
    top = limits.context - 1 if limits is not None and limits.context is not None else None
    batch = {
        "input_ids": input_ids,
        "attention_mask": attention,
        "position_ids": (attention.cumsum(-1) - 1).clamp(min=0, max=top),
        "response_mask": mask,
        TARGET_IDS: targets,
        **fields,
    }
    return batch, layout


def per_datum(values_BR: torch.Tensor, layout: Layout) -> list[torch.Tensor]:
    """Each datum's T values (position i at row column i - start; 0.0 before ``start``)."""
    out = []
    for b, (T, start) in enumerate(zip(layout.lengths, layout.starts, strict=True)):
        values = torch.zeros(T, dtype=torch.float32)
        values[start:] = values_BR[b, : T - start].detach().float().cpu()
        out.append(values)
    return out


def check_next_token_targets(batch: dict[str, torch.Tensor]) -> None:
    """For an engine that scores each position's next input token (``verl``; one that does not
    declare ``TrainEngineTraits.exact_targets``): the targets must be those tokens wherever the
    datum's arrays are non-zero (masked positions are free)."""
    mask = batch["response_mask"].bool()
    used = torch.zeros_like(mask)
    for key in FLOAT_KEYS & set(batch):
        used |= batch[key] != 0
    R = mask.shape[1]
    differs = (batch[TARGET_IDS] != batch["input_ids"][:, -R:]) & mask & used
    if differs.any():
        b = int(differs.nonzero()[0][0])
        raise DataError(
            f"datum {b}: a target token that carries loss is not the next model_input token; this train "
            "engine scores next tokens only (the local engine scores any targets)"
        )
