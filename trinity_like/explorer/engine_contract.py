"""The rollout engine's contract: what it is asked (:class:`SamplingParams` per call, one
:class:`Request` per prompt, capacity in :class:`EngineParams`) and what it answers (a
:class:`Sample` per seed), and how each sample's seed is drawn (:func:`sample_seed`).

:class:`~trinity_like.explorer.engine.RolloutEngine` implements it over a Hugging Face model
with a KV cache; whoever drives an engine (the explorer's workflows, the client's sampler,
environments) needs only these types::

    sampling = SamplingParams(n=8, max_new_tokens=64, seed=1)
    requests = [Request(tuple(prompt_ids), tuple(sample_seed(sampling.seed, 0, s) for s in range(8)))]
    samples = engine.run(requests, sampling)[0]          # list[Sample], one per seed
    samples[3].token_ids, samples[3].logprobs, samples[3].finish_reason
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from trinity_like.errors import TrinityError


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
    """Capacity knobs of the engine; they change speed and memory, never results."""

    max_batch_size: int = 128  # cache slots = most sequences decoded in one forward
    prefill_batch_size: int = 16  # prompts per prefill forward
    # Tokens of finished sequences whose keys/values are kept for prompts that extend them
    # (multi-turn); costs layers x 2 x kv heads x head dim x dtype bytes per token (46 KB
    # for SmolLM2-135M in fp32: 8192 tokens = 377 MB). 0 disables prefix reuse.
    prefix_cache_tokens: int = 8192


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


def sample_seed(seed: int, prompt_index: int, sample_index: int) -> int:
    """A well-mixed 63-bit seed for sample ``sample_index`` of prompt ``prompt_index``."""
    digest = hashlib.blake2b(f"{seed}:{prompt_index}:{sample_index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1
