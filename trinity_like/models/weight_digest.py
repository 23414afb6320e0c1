"""A name for a set of weights: a cheap digest of the tensors, the same wherever it is computed.

The trainer computes it over the tensors it sends at each sync; every rollout engine
computes it again over what its model holds after the load (read back from the model's
parameters), and each sample carries the engine's digest. The trainer then refuses a row
whose (version, digest) is not one it sent (:mod:`trinity_like.pipeline.weight_ledger`).

The recipe, per tensor, in name order: its name, shape and dtype, and two sums of the
integer bit patterns of a fixed strided sample of :data:`SAMPLE` elements (every element
when it has fewer): their plain sum and a sum weighted by position. All of it is torch ops
on the tensor's own device -- only two numbers per tensor reach the host -- so a GPU's
weights are never copied out, and a 135M model costs milliseconds (docs/reliability.md).
Bit patterns, not float sums: an integer sum is exact in any order, so a CPU and a GPU, or
2 and 16 threads, give the same digest for the same weights.

Canonical form (what makes the sender's and the engine's views agree):

- ``dtype``: the digest of weights cast to the engine's dtype (``explorer.dtype``). The
  cast is applied to the sampled elements only, and rounds as ``load_state_dict``'s copy
  does, so the trainer's fp32 weights and a bf16 engine that loaded them agree.
- A tied output embedding counts once: an output-embedding entry (:data:`OUTPUT_NAME`, or
  the name the model gives it) whose sample equals that of another entry of its shape is
  left out. So a state dict that sends it, one that leaves it out (verl's export, a model
  folder) and a tied model agree; merged LoRA weights of an adapter on the output layer
  make it differ from the input embedding, and it then counts, on both sides.

What it can miss (a sample, not a hash of every byte): a change confined to elements
outside the sample (a tensor of more than :data:`SAMPLE` elements updated in a few rows
only, e.g. embedding rows of tokens no sampled element falls in) and changes whose sums
cancel exactly in both sums. A whole update dropped, an engine that missed it, a tensor left
out of a load, a LoRA adapter not merged change every sampled element of the tensors the
step trained, and are caught (``tests/faults/test_weight_identity.py``).

Example::

    sent = weights_digest(model.state_dict())              # the trainer, at a sync
    held = model_digest(engine.model)                      # the engine, after its load
    assert sent == held
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from pathlib import Path

import torch
from torch import nn

SAMPLE = 1024  # elements sampled per tensor (a strided sample over the flattened tensor)
OUTPUT_NAME = "lm_head.weight"  # Hugging Face causal LMs' output embedding, when no model says otherwise
DIGEST_CHARS = 16  # hex characters of a digest (64 bits)
DIGEST_FILE = "weights_digest.json"  # beside saved weights: their digest per dtype an engine may hold
DIGEST_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _sample(tensor: torch.Tensor) -> torch.Tensor:
    """A strided view of at most :data:`SAMPLE` elements of ``tensor`` flattened (no copy when it is contiguous)."""
    flat = tensor.detach().reshape(-1)
    n = flat.numel()
    stride = max(1, -(-n // SAMPLE))
    return flat.as_strided((-(-n // stride) if n else 0,), (stride,), flat.storage_offset())


def _sums(samples: list[torch.Tensor], dtype: torch.dtype | None) -> list[tuple[int, int]]:
    """Per sample (all on one device, of one dtype), the plain and the position-weighted sums
    of its bit patterns (int64, wrapping), computed in a few ops over all of them at once."""
    flat = torch.cat(samples)
    if dtype is not None and flat.dtype != dtype and flat.is_floating_point():
        flat = flat.to(dtype)
    if flat.is_floating_point():
        flat = flat + 0.0  # -0.0 -> +0.0: a LoRA merge W + 0 * BA turns one into the other, same weights
    if flat.dtype == torch.bool:
        flat = flat.to(torch.uint8)
    bits = flat.view(_BITS[flat.element_size()]).to(torch.int64)
    # segment sums as differences of running sums (wrapping int64 arithmetic is exact modulo 2^64)
    ends = torch.tensor([0] + [s.numel() for s in samples], device=flat.device).cumsum(0)
    position = torch.arange(1, bits.numel() + 1, device=flat.device)
    running = torch.zeros(2, bits.numel() + 1, dtype=torch.int64, device=flat.device)
    torch.cumsum(bits, 0, out=running[0, 1:])
    torch.cumsum(bits * position, 0, out=running[1, 1:])
    plain = running[0, ends[1:]] - running[0, ends[:-1]]
    weighted = running[1, ends[1:]] - running[1, ends[:-1]] - ends[:-1] * plain  # positions from 1 in each sample
    out = torch.stack([plain, weighted])
    return [tuple(v) for v in out.T.tolist()]  # one trip to the host per (device, dtype)


def weights_digest(
    state: Mapping[str, torch.Tensor], *, dtype: torch.dtype | None = None, output_name: str = OUTPUT_NAME
) -> str:
    """The digest of a state dict (see the module doc); ``dtype``: the engine's dtype."""
    names = sorted(state)
    groups: dict[tuple[torch.device, torch.dtype], list[str]] = {}
    for name in names:
        groups.setdefault((state[name].device, state[name].dtype), []).append(name)
    signature: dict[str, tuple] = {}
    for group in groups.values():
        for name, sums in zip(group, _sums([_sample(state[n]) for n in group], dtype)):
            signature[name] = (tuple(state[name].shape), *sums)
    h = hashlib.blake2b(digest_size=DIGEST_CHARS // 2)
    for name in names:
        if name == output_name and any(other != name and sig == signature[name] for other, sig in signature.items()):
            continue  # a tied output embedding: counted once, under the input embedding's name
        tensor = state[name]
        kind = dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype
        shape, plain, weighted = signature[name]
        h.update(f"{name}|{shape}|{kind}|{plain}|{weighted};".encode())
    return h.hexdigest()


def output_embedding_name(model: nn.Module) -> str:
    """The state-dict name of ``model``'s output embedding weight (:data:`OUTPUT_NAME` if it has none)."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if output is None:
        return OUTPUT_NAME
    for name, p in model.named_parameters(remove_duplicate=False):
        if p is output.weight and name.endswith(OUTPUT_NAME.split(".")[0] + ".weight"):
            return name
    for name, p in model.named_parameters(remove_duplicate=False):
        if p is output.weight:
            return name
    return OUTPUT_NAME


def model_digest(model: nn.Module) -> str:
    """The digest of the weights ``model`` holds, read back from its parameters and persistent
    buffers (a tied parameter under each of its names: the canonical form drops the alias)."""
    state = model.state_dict(keep_vars=True)
    dtypes = {t.dtype for t in state.values() if t.is_floating_point()}
    dtype = dtypes.pop() if len(dtypes) == 1 else None
    return weights_digest(state, dtype=dtype, output_name=output_embedding_name(model))


def save_digests(folder: Path, state: Mapping[str, torch.Tensor]) -> None:
    """Write the digest of ``state`` in each of :data:`DIGEST_DTYPES` beside weights saved in ``folder``."""
    digests = {str(d).removeprefix("torch."): weights_digest(state, dtype=d) for d in DIGEST_DTYPES}
    (Path(folder) / DIGEST_FILE).write_text(json.dumps(digests))


def saved_digest(folder: Path, dtype: torch.dtype) -> str | None:
    """The digest :func:`save_digests` wrote for ``dtype`` in ``folder`` (None: none was written)."""
    file = Path(folder) / DIGEST_FILE
    found = json.loads(file.read_text()).get(str(dtype).removeprefix("torch.")) if file.is_file() else None
    return str(found) if found else None
