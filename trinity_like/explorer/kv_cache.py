"""Preallocated slot KV cache and the attention kernel that reads it without copies.

Why our own cache: ``DynamicCache`` concatenates every layer's keys and values at every
decode step (a copy of the whole cache per token), and dropping finished rows from it
copies everything again. Here each layer owns two tensors allocated once::

    keys_SHLD, values_SHLD: [S slots, H kv heads, L max length, D head dim]

A sequence lives in one slot; its token at position ``p`` sits at index ``p`` (the prompt
at ``0..P-1``, generated tokens after it), so a slot's length is also the next position id.
A decode step writes one key/value per active slot at that slot's own length and hands the
attention a *view* ``[:B, :, :L]`` -- no copy. Slots shorter than ``L`` are masked.
Active sequences always occupy slots ``0..B-1``: a finished one is replaced by a waiting
one (its prompt's keys copied in) or by the last active slot (one row copied). Copies are
batched -- one gather per layer for every prompt admitted at once, one per layer for every
row moved -- so a GPU launches a few kernels per refill, not a few per sample.

The attention function :func:`slot_attention` is registered with ``transformers``'
``AttentionInterface`` and selected only while the engine runs a forward pass
(:func:`use_attention`); it does grouped-query attention by reshaping the queries instead
of repeating keys, so strided cache views are read where they lie. On CUDA the decode
step runs the card's fused kernel (``scaled_dot_product_attention``, memory-efficient
attention with the mask as a bias) over those views; on the CPU two ``matmul`` calls read
them without the copy SDPA makes. Masks are additive float masks ``[B, 1, Q, L]`` built by
the engine (transformers passes a 4-D mask through as it is); a fresh prefill has none (its
prompts are right-padded: plain causal attention, on SDPA's fused kernels).

Letters: S slots, B active rows, H kv heads, G query heads per kv head, Q query length,
L key length, D head dim, P prompt length.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:  # transformers' model layer costs ~1.6 s to import: only when a model runs
    from transformers import PreTrainedModel

ATTENTION_NAME = "trinity_slot"


def slot_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **_ignored: object,  # transformers passes model-specific extras (position ids, ...)
) -> tuple[torch.Tensor, None]:
    """Softmax attention over a (possibly strided) cache view, grouped-query aware.

    Decoding (Q = 1) folds the G query heads of each kv head into query rows: ``[B, H, G, D]``
    against the ``[B, H, L, D]`` cache views, plain multi-head attention with no repeated keys.
    On CUDA that goes to SDPA's fused kernels; on the CPU ``matmul`` reads the strided views
    without copying them, where SDPA would make them contiguous.

    query: [B, H*G, Q, D]; key, value: [B, H, L, D]; attention_mask: [B, 1, Q, L] additive.
    Returns [B, Q, H*G, D], the layout transformers' attention modules expect.
    """
    del module, dropout  # inference only
    b, hq, q, d = query.shape
    if q > 1:
        # Prefill: torch's fused kernels never materialise the [B, H, Q, L] scores in full,
        # which matters for long prompts. Without a mask (fresh, right-padded prompts) it is
        # plain causal attention, grouped heads included: the flash kernel takes both. A mask
        # (prompts after kept keys) rules out flash, and the memory-efficient kernel takes no
        # grouped heads: the kv heads are repeated for it (a prefill-sized copy, once).
        if attention_mask is None:
            out_BXQD = torch.nn.functional.scaled_dot_product_attention(
                query, key, value, is_causal=True, scale=scaling, enable_gqa=True
            )
        else:
            g = hq // key.shape[1]
            out_BXQD = torch.nn.functional.scaled_dot_product_attention(
                query,
                key.repeat_interleave(g, dim=1),
                value.repeat_interleave(g, dim=1),
                attn_mask=attention_mask,
                scale=scaling,
            )
        return out_BXQD.transpose(1, 2), None
    h = key.shape[1]
    # Head j of the query uses kv head j // G (the order `repeat_kv` produces).
    out_BHXD = decode_attention(query.reshape(b, h, hq // h * q, d), key, value, attention_mask, scaling)
    return out_BHXD.view(b, hq, q, d).transpose(1, 2), None


def decode_attention(
    query_BHXD: torch.Tensor,
    key_BHLD: torch.Tensor,
    value_BHLD: torch.Tensor,
    mask_B1QL: torch.Tensor | None,
    scaling: float | None,
) -> torch.Tensor:
    """Attention of X = G*Q query rows per kv head over that head's keys: ``[B, H, X, D]``.

    ``scaling`` None: the queries are scaled already (:mod:`.lean_forward` folds a power-of-two
    scale into their rotation). On CUDA SDPA's fused kernel; on the CPU two ``matmul`` calls
    read the strided cache views without the copy SDPA makes.
    """
    if query_BHXD.is_cuda:
        return torch.nn.functional.scaled_dot_product_attention(
            query_BHXD, key_BHLD, value_BHLD, attn_mask=mask_B1QL, scale=1.0 if scaling is None else scaling
        )
    b, h, x, _ = query_BHXD.shape
    scores_BHXL = torch.matmul(query_BHXD, key_BHLD.transpose(-1, -2))
    if scaling is not None:
        scores_BHXL.mul_(scaling)
    if mask_B1QL is not None:
        q = mask_B1QL.shape[2]
        scores_BHGQL = scores_BHXL.view(b, h, x // q, q, -1)
        scores_BHGQL.add_(mask_B1QL.unsqueeze(2))
    probs_BHXL = torch.softmax(scores_BHXL, dim=-1, dtype=torch.float32).to(value_BHLD.dtype)
    return torch.matmul(probs_BHXL, value_BHLD)


@contextlib.contextmanager
def use_attention(model: PreTrainedModel) -> Iterator[None]:
    """Route ``model``'s attention through :func:`slot_attention` for the block's duration.

    The model may be shared (a trainer in the same process): its own setting is restored
    afterwards, so plain ``model(...)`` calls keep their usual attention.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, slot_attention)  # a dict update: the same entry each time
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = ATTENTION_NAME
    try:
        yield
    finally:
        config._attn_implementation = before


class PrefillCache:
    """Captures the keys and values of a prefill pass, layer by layer.

    Passed as ``past_key_values`` to a forward over whole (padded) prompts: ``update``
    keeps each layer's new keys/values and returns them unchanged as the attention input
    (no copy). With ``past > 0`` the forward runs only the new tokens of prompts whose
    first tokens' keys are kept (:mod:`.prefix_cache`): :meth:`reserve` allocates
    ``[N, H, past + Q, D]`` per layer, the engine copies kept keys into the first ``past``
    columns, and ``update`` writes the new keys after them and returns the whole buffer.
    """

    def __init__(self, num_layers: int, past: int = 0) -> None:
        self.past = past
        self.keys: list[torch.Tensor | None] = [None] * num_layers  # [N, H, past + Q, D] each
        self.values: list[torch.Tensor | None] = [None] * num_layers

    def reserve(self, rows: int, num_kv_heads: int, length: int, head_dim: int, dtype, device) -> None:
        """Allocate every layer's buffer of ``length = past + Q`` columns (zeros: see SlotCache)."""
        shape = (rows, num_kv_heads, length, head_dim)
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.keys]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in self.values]

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *_: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.past:
            self.keys[layer_idx] = key_states
            self.values[layer_idx] = value_states
            return key_states, value_states
        keys, values = self.keys[layer_idx], self.values[layer_idx]
        assert keys is not None and values is not None, "reserve() first"
        keys[:, :, self.past :] = key_states
        values[:, :, self.past :] = value_states
        return keys, values

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.past


class SlotCache:
    """Per-layer ``[S, H, L, D]`` key/value tensors, written at each slot's own position."""

    def __init__(
        self,
        *,
        num_layers: int,
        num_slots: int,
        num_kv_heads: int,
        max_length: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        shape = (num_slots, num_kv_heads, max_length, head_dim)
        # Zeros, not `empty`: masked positions are multiplied by a zero weight, and stale
        # NaN bit patterns would survive that (NaN * 0 = NaN).
        self.keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        self.max_length = max_length
        self.num_slots = num_slots
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        # Set by the engine before each decode forward:
        self.index_BH1D = torch.zeros((0, num_kv_heads, 1, head_dim), dtype=torch.long)  # row b -> its position
        self.key_length = 0  # L of the view handed to attention (max position + 1, or a bucket above)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.keys, *self.values))

    def prepare_step(self, positions_B: torch.Tensor, key_length: int) -> None:
        """Set where the next ``update`` writes: row b at ``positions_B[b]`` (a device tensor)."""
        b = positions_B.shape[0]
        self.index_BH1D = positions_B.view(b, 1, 1, 1).expand(b, self.num_kv_heads, 1, self.head_dim)
        self.key_length = key_length

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, layer_idx: int, *_: object
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one token per row ([B, H, 1, D]) and return the ``[:B, :, :L]`` views."""
        b = key_states.shape[0]
        keys, values = self.keys[layer_idx][:b], self.values[layer_idx][:b]
        keys.scatter_(2, self.index_BH1D, key_states)
        values.scatter_(2, self.index_BH1D, value_states)
        return keys[:, :, : self.key_length], values[:, :, : self.key_length]

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.key_length

    def load_prompts(
        self,
        slots: Sequence[int],
        prefill: PrefillCache,
        rows: Sequence[int],
        spans: Sequence[Sequence[tuple[int, int]]],
    ) -> None:
        """Copy prefilled prompts into ``slots``: for each, row ``rows[i]``'s ``(start, count)``
        column spans of ``prefill``, in order, to columns ``0, 1, ...`` of the slot.

        A fresh prompt is one span; one that reused kept keys is two (those keys, then the
        new tokens), which sit apart in the prefill buffer when the chunk is padded. One gather
        per layer takes every prompt: columns past a prompt's end get whatever the index pads
        with, which the mask hides until the slot's own tokens overwrite them.
        """
        columns = [[c for start, count in sp for c in range(start, start + count)] for sp in spans]
        width = max(len(c) for c in columns)
        device = self.keys[0].device
        cols_NW = torch.tensor([c + [c[-1]] * (width - len(c)) for c in columns], device=device)
        rows_N, slots_N = torch.tensor(list(rows), device=device), torch.tensor(list(slots), device=device)
        index_NHWD = cols_NW[:, None, :, None].expand(-1, self.num_kv_heads, -1, self.head_dim)
        for layer, (k, v) in enumerate(zip(prefill.keys, prefill.values)):
            assert k is not None and v is not None
            self.keys[layer][slots_N, :, :width] = k[rows_N].gather(2, index_NHWD)
            self.values[layer][slots_N, :, :width] = v[rows_N].gather(2, index_NHWD)

    def read(self, slot: int, length: int) -> torch.Tensor:
        """A copy of the first ``length`` positions of ``slot``: ``[layers, 2, H, length, D]``."""
        first = self.keys[0]
        out = torch.empty(
            (len(self.keys), 2, first.shape[1], length, first.shape[3]), dtype=first.dtype, device=first.device
        )
        for layer, (k, v) in enumerate(zip(self.keys, self.values)):
            out[layer, 0] = k[slot, :, :length]
            out[layer, 1] = v[slot, :, :length]
        return out

    def move(self, src: Sequence[int], dst: Sequence[int], length: int) -> None:
        """Copy the first ``length`` positions of slots ``src`` into slots ``dst`` (no slot is both)."""
        device = self.keys[0].device
        s, d = torch.tensor(list(src), device=device), torch.tensor(list(dst), device=device)
        for k, v in zip(self.keys, self.values):
            k[d, :, :length] = k[s, :, :length]
            v[d, :, :length] = v[s, :, :length]
