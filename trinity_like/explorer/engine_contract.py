"""The rollout-engine contract: what an engine is asked (:class:`SamplingParams` per call, one
:class:`Request` per prompt, capacity in :class:`EngineParams`), what it answers (a
:class:`Sample` per seed), how each sample's seed is drawn (:func:`sample_seed`), and the
small protocol every engine implements (:class:`RolloutEngine`), as train engines implement
:class:`~trinity_like.trainer.base.TrainEngine`.

Engines are registered in ``ROLLOUT_ENGINE`` and built by :func:`~trinity_like.explorer.engines.build_rollout_engine`
from an :class:`EngineSpec` (a recipe's ``explorer.engine``; ``native`` is ours,
:class:`~trinity_like.explorer.engine.NativeEngine`). Whoever drives an engine (the explorer's
workflows, the client's sampler, environments) needs only these types::

    sampling = SamplingParams(n=8, max_new_tokens=64, seed=1)
    requests = [Request(tuple(prompt_ids), tuple(sample_seed(sampling.seed, 0, s) for s in range(8)))]
    samples = engine.run(requests, sampling)[0]          # list[Sample], one per seed
    samples[3].token_ids, samples[3].logprobs, samples[3].finish_reason
    samples[3].model_version, samples[3].weights_digest   # which weights sampled it
    groups = generate(engine, [prompt_ids], sampling)    # the helper over run: seeds from sample_seed
    engine.update_weights(state_dict, version=1)         # copied in; Borrowed(state_dict): used as they are
    engine.update_weights(model.named_parameters())      # (name, tensor) pairs, as verl streams them

An engine writes :meth:`RolloutEngine.run` alone; :func:`generate` (``sampling.n`` samples
per prompt, seeded by :func:`sample_seed`) is built on it here, once for every engine.
New weights arrive as a mapping or as an iterable of ``(name, tensor)`` pairs (verl's seam,
``verl/workers/rollout/base.py``, streams pairs); an engine turns either into a mapping with
:func:`weight_mapping`, the one place they are told apart.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, Union, runtime_checkable

from trinity_like.errors import TrinityError

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class SamplingParams:
    """How to sample: one object per call, shared by every prompt of the call."""

    n: int = 1  # samples per prompt (the group size)
    max_new_tokens: int = 64  # response length cap; reaching it finishes with "length"
    temperature: float = 1.0  # logits are divided by it; must be > 0 unless greedy
    top_k: int = 0  # keep the k most likely tokens; 0 keeps all
    top_p: float = 1.0  # keep the smallest set of top tokens with this mass; 1.0 keeps all
    greedy: bool = False  # argmax decoding (temperature, top-k/p and seed unused)
    seed: int = 0  # base seed; sample (p, s) draws from its own generator, see sample_seed
    stop_token_ids: tuple[int, ...] | None = None  # None: the model's/tokenizer's eos ids
    stop_strings: tuple[str, ...] = ()  # finish once the response text contains one

    def __post_init__(self) -> None:
        if self.n < 1:
            raise TrinityError(f"SamplingParams.n must be >= 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise TrinityError(f"SamplingParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if not self.greedy and not self.temperature > 0:
            raise TrinityError(
                f"SamplingParams.temperature must be > 0 (got {self.temperature}); set greedy=True for argmax"
            )
        if not 0.0 < self.top_p <= 1.0:
            raise TrinityError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise TrinityError(f"SamplingParams.top_k must be >= 0, got {self.top_k}")


@dataclass(frozen=True)
class EngineParams:
    """Capacity knobs of the engine; they change speed and memory, never results (beyond the
    float rounding a different batch composition gives)."""

    # Cache slots = most sequences decoded in one forward. None: sized to the work -- 128 on
    # CPU; on CUDA one slot per sample of the call, as many as half the free device memory holds.
    max_batch_size: int | None = None
    prefill_batch_size: int = 16  # prompts per prefill forward
    # Tokens of finished sequences whose keys/values are kept for prompts that extend them
    # (multi-turn); costs layers x 2 x kv heads x head dim x dtype bytes per token (46 KB
    # for SmolLM2-135M in fp32: 8192 tokens = 377 MB). 0 disables prefix reuse.
    prefix_cache_tokens: int = 8192
    # Decode steps between the host's looks at the batch (finished samples collected, waiting
    # ones admitted, holes closed). None: 1 on CPU (no step is ever computed for a finished
    # sample), 16 on CUDA (the host stays out of the loop; a finished row idles until the look).
    sync_every: int | None = None
    cuda_graphs: bool = True  # on CUDA: replay each decode step as a captured CUDA graph
    # On CUDA with graphs: release_memory keeps the slot cache and its captured graphs, so the
    # next rollout replays them (no capture: 0.1-0.2 s each) -- a trainer on the same GPU has that
    # much less memory meanwhile. False frees them at every release and captures again.
    keep_graphs: bool = True

    def __post_init__(self) -> None:
        for name in ("max_batch_size", "sync_every"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise TrinityError(f"EngineParams.{name} must be >= 1 (or None), got {value}")
        if self.prefill_batch_size < 1:
            raise TrinityError(f"EngineParams.prefill_batch_size must be >= 1, got {self.prefill_batch_size}")
        if self.prefix_cache_tokens < 0:
            raise TrinityError(f"EngineParams.prefix_cache_tokens must be >= 0, got {self.prefix_cache_tokens}")


@dataclass(frozen=True)
class Request:
    """One prompt and the seeds of its samples (one sample per seed)."""

    prompt_ids: tuple[int, ...]  # already rendered with the chat template
    seeds: tuple[int, ...]  # per sample; unused by greedy decoding except for the count


@dataclass
class Sample:
    """One generated response."""

    prompt_index: int  # position of its prompt in the call
    sample_index: int  # position within its group
    token_ids: list[int]  # response tokens, the stop token included
    logprobs: list[float]  # per response token, under the sampling distribution
    finish_reason: str  # "stop" (stop token or string) or "length" (max_new_tokens)
    model_version: int  # version of the weights that produced it
    weights_digest: str = ""  # the engine's digest of those weights (models/weight_digest.py)


def sample_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """A well-mixed 63-bit seed for sample ``sample_index`` of prompt ``prompt_index``."""
    digest = hashlib.blake2b(f"{seed}:{prompt_index}:{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


# New weights: a state dict, or ``(name, tensor)`` pairs in any order (a generator is read once).
Weights = Union["Mapping[str, torch.Tensor]", "Iterable[tuple[str, torch.Tensor]]"]


@dataclass(frozen=True)
class Borrowed:
    """Weights an engine may use as its own, without a copy, until its next ``update_weights``.

    The owner promises that nothing writes them meanwhile and that it keeps them alive: a
    mailbox in shared memory that is rewritten only after the engine moved on
    (:mod:`~trinity_like.trainer.shared_weights`), or device tensors of a trainer that waits.
    A plain mapping passed to ``update_weights`` is copied instead. An engine that cannot
    borrow (other device, other dtype) copies.
    """

    tensors: Weights


def weight_mapping(weights: Weights | Borrowed) -> tuple[Mapping[str, torch.Tensor], bool]:
    """The weights an engine's ``update_weights`` was given as a mapping (a given mapping as it is;
    pairs gathered into a dict that refers to the same tensors, no copy), and whether they are
    :class:`Borrowed`. A name given twice is an error: which tensor is meant would be a guess."""
    borrowed = isinstance(weights, Borrowed)
    given = weights.tensors if isinstance(weights, Borrowed) else weights
    if isinstance(given, Mapping):
        return given, borrowed
    state: dict[str, torch.Tensor] = {}
    for pair in given:
        name, tensor = pair
        if name in state:
            raise TrinityError(f"update_weights: {name!r} given twice")
        state[name] = tensor
    return state, borrowed


@dataclass(frozen=True)
class EngineSpec:
    """What a registered rollout-engine factory builds an engine from."""

    model_path: Path  # a Hugging Face model folder (resolved: built-in ids are converted first)
    device: torch.device  # where the model runs (trinity_like.models.device)
    dtype: torch.dtype  # the weights' (and KV cache's) dtype
    params: EngineParams = EngineParams()  # capacity knobs


@runtime_checkable
class RolloutEngine(Protocol):
    """What the explorer, the client's sampler and environments need of a rollout engine.

    Calls come one at a time (an engine need not be thread-safe). Example plugin engine:
    ``plugins/example_plugin`` (``hf_generate``, over ``transformers``' ``generate``).
    """

    tokenizer: Any  # the model's tokenizer (workflows render prompts and decode with it)
    model_version: int  # stamped on every sample; set by update_weights
    # digest of the weights the engine holds, computed from its model after every load
    # (trinity_like.models.weight_digest.model_digest), stamped on every sample
    weights_digest: str
    default_stop_ids: tuple[int, ...]  # stop tokens when a call names none (the model's eos ids)
    # Called before every decode step when set (the explorer sets it to take its share of the CPU
    # cores, trinity_like/cpu_share.py); None: nothing to call. Engines start with None.
    pace: Callable[[], object] | None

    def run(self, requests: Sequence[Request], sampling: SamplingParams) -> list[list[Sample]]:
        """One sample per seed of each request, in request order (``sampling.n`` unused); a sample's
        tokens depend on its seed and the weights, not on what else the call holds."""

    def update_weights(self, weights: Weights | Borrowed, *, version: int | None = None, strict: bool = True) -> int:
        """Sample with ``weights`` -- a mapping or ``(name, tensor)`` pairs (:func:`weight_mapping`) --
        from now on (copied in; a :class:`Borrowed` may be used as it is); returns the model version:
        ``version``, or the last one + 1. ``strict=False`` takes a partial state dict (a tied output
        embedding may always be left out). Then :attr:`weights_digest` is computed again from the
        weights the engine holds."""

    def release_memory(self) -> None:
        """Free what the engine holds between calls (KV cache, captured graphs, kept prefixes), so
        another part (a trainer on the same GPU) can use the memory; the weights stay."""

    def resume_memory(self) -> None:
        """Take back what :meth:`release_memory` freed, before the next call (or let that call do it)."""

    def close(self) -> None:
        """Free the model and everything else; the engine is not used again."""


def generate(engine: RolloutEngine, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[list[Sample]]:
    """``sampling.n`` samples per prompt from ``engine``, in prompt order: sample (p, s) is drawn
    with ``sample_seed(sampling.seed, p, s)`` -- one :class:`Request` per prompt through ``engine.run``."""
    requests = [
        Request(tuple(int(t) for t in ids), tuple(sample_seed(sampling.seed, p, s) for s in range(sampling.n)))
        for p, ids in enumerate(prompts)
    ]
    return engine.run(requests, sampling)
