"""The model forward both train engines run: each group's prompt once, logits only where scored.

A GRPO group is G responses to one prompt, and the prompt is often most of the tokens.
Trainers run the padded batch ``[B, P+R]`` and so the prompt G times, forward and
backward. Here the rows of a micro-batch are *packed*: every distinct prompt becomes one
sequence, followed by the real tokens of each response to it::

    row b = prompt_g + response_b   ->   sequence g = prompt_g | response_b1 | response_b2 | ...

and a 4-D attention mask lets each response token see the prompt and its own earlier
tokens, never a sibling's. Position ids are the row's own, so every response token gets
exactly the keys, values and positions it had in the padded row: the outputs are those of
the padded forward up to floating-point order, and the gradient reaching the shared
prompt is the sum over its G responses, which autograd does by itself.

Rows share a prompt when their prompt tokens are equal -- GRPO groups, preference pairs,
the same task sampled twice -- whatever their order in the batch; a row whose prompt is
its own (multi-turn rows, SFT) is a sequence by itself, as before minus its padding.
``share_prompts=False`` (the recipe's ``trainer.share_prompts``) packs each row alone.

The head runs only on the positions that predict a response token (R per row, not T)
and, past :data:`HEAD_CHUNK` positions, chunk by chunk under activation checkpointing:
no ``[B, T, V]`` tensor exists, and at most one chunk's ``[C, V]`` logits are alive.

Attention kernels: ``sdpa`` and ``eager`` take the 4-D mask. Others (flash-attention
on GPUs) run the plain padded layout, with the head still on response positions only.

Letters: B rows, P prompt columns, R response columns, T = P + R, N packed sequences,
L their (padded) length, M scored positions, H hidden size, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from trinity_like.ops import last_token_index
from trinity_like.trainer.base import TARGET_IDS, Batch, micro_batches, row_unit

HEAD_CHUNK = 1024  # scored positions per head chunk: [1024, 49152] fp32 logits are 200 MB
PACKING_KERNELS = ("sdpa", "eager")  # attention kernels that take a custom 4-D mask


@dataclass(frozen=True)
class Packing:
    """Where the rows of a micro-batch sit in its packed sequences.

    ``input_ids``/``position_ids`` ``[N, L]`` and ``segment`` ``[N, L]`` (0 prompt, k > 0 the
    k-th response of the sequence, -1 padding) describe the sequences; for every row
    ``b`` and response column ``j`` that holds a real token, ``source`` ``[B, R]`` is the flat
    index (``n * L + l``) of the hidden state that predicts it (the last prompt token for
    ``j = 0``), ``-1`` elsewhere; ``last`` ``[B]`` is the flat index of each row's last real token.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    segment: torch.Tensor
    source: torch.Tensor
    last: torch.Tensor

    @property
    def tokens(self) -> int:
        """Real tokens the model runs over (prompts counted once)."""
        return int((self.segment >= 0).sum())

    def attention_mask(self, dtype: torch.dtype, kernel: str) -> torch.Tensor:
        """``[N, 1, L, L]``: query i sees key k when k <= i and k is in the prompt or in i's own
        response; a padding position sees itself (no empty softmax row). Boolean for
        ``sdpa``; additive (0 / dtype min) for ``eager``."""
        seg = self.segment
        length = seg.shape[1]
        causal = torch.ones(length, length, dtype=torch.bool, device=seg.device).tril()
        same = (seg.unsqueeze(2) == seg.unsqueeze(1)) & (seg.unsqueeze(2) >= 0)
        visible = (seg.unsqueeze(1) == 0) & (seg.unsqueeze(2) >= 0)
        allowed = (same | visible) & causal
        allowed |= torch.eye(length, dtype=torch.bool, device=seg.device)
        allowed = allowed.unsqueeze(1)
        if kernel == "sdpa":
            return allowed
        return torch.zeros(allowed.shape, dtype=dtype, device=seg.device).masked_fill(~allowed, torch.finfo(dtype).min)


def pack(batch: Batch, *, share_prompts: bool = True) -> Packing | None:
    """Pack a micro-batch in our padded layout (:mod:`~trinity_like.trainer.base`); None when a
    row has no prompt token (nothing would predict its first response token: run it padded).

    Where every token goes is worked out on the host from one copy of the ids and the mask (a
    device batch is read back once, not row by row); the packed ids and positions are then
    gathered on the batch's device in one indexing each.
    """
    input_ids, positions = batch["input_ids"], batch["position_ids"]
    device = input_ids.device
    rows, width = input_ids.shape
    response_len = batch["response_mask"].shape[1]
    prompt_len = width - response_len
    # Copies even on the CPU (cheap): the per-row work below never touches the batch's own tensors.
    ids_host = input_ids.to("cpu", copy=True)
    attention_host = batch["attention_mask"].to("cpu", dtype=torch.bool, copy=True)
    sequences: list[dict] = []  # per sequence: flat source columns (b * width + c) and segment of each token
    by_prompt: dict[tuple[int, ...] | int, int] = {}
    placed = []  # per row: (sequence, offset of its response, response length, prompt length, response columns)
    for b in range(rows):
        prompt_cols = attention_host[b, :prompt_len].nonzero().squeeze(-1)
        if prompt_cols.numel() == 0:
            return None
        response_cols = attention_host[b, prompt_len:].nonzero().squeeze(-1)
        key = tuple(ids_host[b, prompt_cols].tolist()) if share_prompts else b
        if key not in by_prompt:
            by_prompt[key] = len(sequences)
            flat = (prompt_cols + b * width).tolist()
            sequences.append({"flat": flat, "seg": [0] * len(flat), "responses": 0})
        seq = sequences[by_prompt[key]]
        seq["responses"] += 1
        cols = (response_cols + prompt_len + b * width).tolist()
        placed.append((by_prompt[key], len(seq["flat"]), len(cols), prompt_cols.numel(), response_cols))
        seq["flat"] += cols
        seq["seg"] += [seq["responses"]] * len(cols)
    length = max(len(s["flat"]) for s in sequences)
    n = len(sequences)
    flat_NL = torch.tensor([s["flat"] + [-1] * (length - len(s["flat"])) for s in sequences])
    seg_NL = torch.tensor([s["seg"] + [-1] * (length - len(s["seg"])) for s in sequences])
    source = torch.full((rows, response_len), -1, dtype=torch.long)
    last = torch.empty(rows, dtype=torch.long)
    for b, (i, offset, count, prompt_count, response_cols) in enumerate(placed):
        base = i * length
        if count:
            # response token t is predicted by the token before it: the prompt's last for t = 0
            before = torch.arange(offset - 1, offset + count - 1)
            before[0] = prompt_count - 1
            source[b, response_cols] = base + before
        last[b] = base + (offset + count - 1 if count else prompt_count - 1)
    flat_NL, seg_NL = flat_NL.to(device), seg_NL.to(device)
    taken_NL = flat_NL.clamp(min=0)
    real_NL = seg_NL >= 0
    ids = torch.where(real_NL, input_ids.reshape(-1)[taken_NL], 0).view(n, length)
    pos = torch.where(real_NL, positions.reshape(-1)[taken_NL], 0).view(n, length)
    return Packing(input_ids=ids, position_ids=pos, segment=seg_NL, source=source.to(device), last=last.to(device))


def length_order(batch: Batch, *, share_prompts: bool = True, unit: int = 1) -> torch.Tensor:
    """A row order (a permutation ``[B]``) that keeps each prompt's rows together and puts
    prompts whose packed sequences are about as long next to each other, longest first:
    micro-batches cut from it pack with little padding. Rows move in whole examples of
    ``unit`` rows (preference pairs), placed by their first row's prompt. The order changes
    nothing but floating-point order: losses divide by whole-batch normalisers."""
    input_ids, attention = batch["input_ids"], batch["attention_mask"].bool()
    prompt_len = input_ids.shape[1] - batch["response_mask"].shape[1]
    keys, length, first_seen = [], {}, {}
    for b in range(input_ids.shape[0]):
        prompt = input_ids[b, :prompt_len][attention[b, :prompt_len]]
        key = tuple(prompt.tolist()) if share_prompts else b
        keys.append(key)
        first_seen.setdefault(key, b)
        length[key] = length.get(key, prompt.numel()) + int(attention[b, prompt_len:].sum())
    units = range(0, input_ids.shape[0], unit)
    ordered = sorted(units, key=lambda u: (-length[keys[u]], first_seen[keys[u]], u))
    return torch.tensor([u + i for u in ordered for i in range(unit)], device=input_ids.device)


def sorted_micro_batches(
    batch: Batch, micro_batch_size: int, *, share_prompts: bool = True
) -> tuple[list[Batch], torch.Tensor]:
    """``batch``'s micro-batches (:func:`~trinity_like.trainer.base.micro_batches`) cut from its
    rows in :func:`length_order`, and the permutation that puts the rows of their concatenated
    outputs back in the batch's order."""
    order = length_order(batch, share_prompts=share_prompts, unit=row_unit(batch))
    rows = {k: (v if v.dim() == 0 else v[order]) for k, v in batch.items()}
    return micro_batches(rows, micro_batch_size), torch.argsort(order)


def head_outputs(
    hidden_MH: torch.Tensor, head: nn.Module, targets_M: torch.Tensor, need_entropy: bool, chunk: int = HEAD_CHUNK
) -> dict[str, torch.Tensor]:
    """``logprob [M]`` (and ``entropy [M]``) of ``targets`` under ``head(hidden)``, in chunks.

    logprob = logit[target] - logsumexp(logits); entropy = logsumexp - sum softmax * logits.
    One chunk keeps its logits for backward; with several, each is recomputed in backward
    (activation checkpointing), so at most one ``[chunk, V]`` block is alive at a time.
    """

    def scored(h: torch.Tensor, t: torch.Tensor) -> tuple[torch.Tensor, ...]:
        logits = at_least_fp32(head(h))
        lse = torch.logsumexp(logits, dim=-1)
        out = (logits.gather(-1, t.unsqueeze(-1)).squeeze(-1) - lse,)
        if need_entropy:
            out += (lse - (torch.softmax(logits, dim=-1) * logits).sum(-1),)
        return out

    if hidden_MH.shape[0] <= chunk:
        parts = [scored(hidden_MH, targets_M)]
    else:
        recompute = torch.is_grad_enabled()
        parts = [
            checkpoint(scored, hidden_MH[i : i + chunk], targets_M[i : i + chunk], use_reentrant=False)
            if recompute
            else scored(hidden_MH[i : i + chunk], targets_M[i : i + chunk])
            for i in range(0, hidden_MH.shape[0], chunk)
        ]
    names = ("logprob", "entropy") if need_entropy else ("logprob",)
    return {name: torch.cat([p[k] for p in parts]) for k, name in enumerate(names)}


def at_least_fp32(x: torch.Tensor) -> torch.Tensor:
    """``x`` in float32 when it is in a narrower float (bf16 logits), else as it is (fp64 stays fp64)."""
    return x.float() if torch.finfo(x.dtype).bits < 32 else x


def kernel_of(model: nn.Module) -> str:
    """The attention kernel a transformers model runs (``sdpa``, ``eager``, ``flash_attention_2``, ...)."""
    return getattr(model.config, "_attn_implementation", None) or "eager"


def model_outputs(
    model: nn.Module,
    batch: Batch,
    kind: str,
    *,
    need_entropy: bool = False,
    share_prompts: bool = True,
    stats: dict[str, float] | None = None,
) -> dict[str, torch.Tensor]:
    """What the model produces for the response columns of one micro-batch (the loss callables'
    ``outputs``, :mod:`~trinity_like.trainer.base`): ``logprob [B, R]`` (and ``entropy``) for
    ``kind="lm"``, ``values [B, R]`` for ``"value"``, ``scores [B]`` for ``"reward"``.

    ``model``: the transformers model (``*ForCausalLM``, or ``*ForTokenClassification`` for a
    value or reward model; with LoRA, peft's layers inside it). Columns that hold no real
    token read 0. ``stats``, when given, accumulates ``rows`` (sequences run), ``tokens`` (real
    tokens run) and ``grid`` (the positions the backbone ran, padding included).
    """
    if stats is not None:
        stats["rows"] = stats.get("rows", 0) + batch["input_ids"].shape[0]
    packing = pack(batch, share_prompts=share_prompts) if kernel_of(model) in PACKING_KERNELS else None
    if packing is None:
        return padded_outputs(model, batch, kind, need_entropy, stats)
    dtype = next(model.parameters()).dtype
    hidden = model.base_model(
        input_ids=packing.input_ids,
        position_ids=packing.position_ids,
        attention_mask=packing.attention_mask(dtype, kernel_of(model)),
        use_cache=False,
    ).last_hidden_state
    if stats is not None:
        stats["tokens"] = stats.get("tokens", 0) + packing.tokens
        stats["grid"] = stats.get("grid", 0) + packing.segment.numel()
    flat = hidden.reshape(-1, hidden.shape[-1])
    if kind == "reward":
        return {"scores": at_least_fp32(model.score(flat[packing.last]).squeeze(-1))}
    where = packing.source >= 0
    picked = flat[packing.source[where]]
    if kind == "value":
        values = at_least_fp32(model.score(picked).squeeze(-1))
        return {"values": scatter(values, where)}
    response_len = batch["response_mask"].shape[1]
    targets = batch.get(TARGET_IDS)
    targets = batch["input_ids"][:, -response_len:] if targets is None else targets
    out = head_outputs(picked, model.get_output_embeddings(), targets[where], need_entropy)
    return {k: scatter(v, where) for k, v in out.items()}


def packing_metrics(stats: dict[str, float]) -> dict[str, float]:
    """A step's ``perf/train_rows`` (sequences trained), ``perf/train_tokens`` (real tokens the backbone
    ran) and ``perf/padded_fraction`` (padding's share of what it ran) from the ``stats``
    :func:`model_outputs` accumulated: the compute beside a step count (``trinity-like compare``)."""
    if not stats.get("grid"):
        return {}
    return {
        "perf/train_rows": float(stats["rows"]),
        "perf/train_tokens": float(stats["tokens"]),
        "perf/padded_fraction": 1.0 - stats["tokens"] / stats["grid"],
    }


def scatter(values_M: torch.Tensor, where_BR: torch.Tensor) -> torch.Tensor:
    """``[M]`` values at the True entries of ``where [B, R]``, 0 elsewhere (differentiable)."""
    out = values_M.new_zeros(where_BR.shape)
    return out.masked_scatter(where_BR, values_M)


def padded_outputs(
    model: nn.Module, batch: Batch, kind: str, need_entropy: bool, stats: dict[str, float] | None = None
) -> dict[str, torch.Tensor]:
    """:func:`model_outputs` over the padded ``[B, T]`` layout itself (kernels without 4-D masks)."""
    input_ids, attention = batch["input_ids"], batch["attention_mask"]
    response_len = batch["response_mask"].shape[1]
    hidden = model.base_model(
        input_ids=input_ids, attention_mask=attention, position_ids=batch["position_ids"], use_cache=False
    ).last_hidden_state
    if stats is not None:
        stats["tokens"] = stats.get("tokens", 0) + int(attention.sum())
        stats["grid"] = stats.get("grid", 0) + attention.numel()
    if kind == "reward":
        last = last_token_index(attention)
        return {
            "scores": at_least_fp32(
                model.score(hidden[torch.arange(hidden.shape[0], device=hidden.device), last]).squeeze(-1)
            )
        }
    before = hidden[:, -response_len - 1 : -1, :]
    if kind == "value":
        return {"values": at_least_fp32(model.score(before).squeeze(-1))}
    where = attention[:, -response_len:].bool()
    targets = batch.get(TARGET_IDS)
    targets = input_ids[:, -response_len:] if targets is None else targets
    out = head_outputs(before[where], model.get_output_embeddings(), targets[where], need_entropy)
    return {k: scatter(v, where) for k, v in out.items()}


@contextmanager
def as_forward(module: nn.Module, fn: Callable[..., object]):
    """Make ``fn`` the forward of ``module`` for a while, so that ``module(...)`` runs it inside
    the module's hooks: FSDP's unshard before, reshard and gradient reduction after."""
    had = "forward" in module.__dict__
    previous = module.__dict__.get("forward")
    module.forward = fn
    try:
        yield module
    finally:
        if had:
            module.forward = previous
        else:
            del module.forward
