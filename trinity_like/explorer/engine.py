"""The rollout engine: batched incremental decoding with continuous batching.

Generation dominates the time of online RL, so this is written for throughput on the
workload RL produces -- P prompts x G samples each, short answers of uneven length:

- **A group's prompt is prefilled once.** Its keys/values are copied into each sample's
  cache slot; ``generate(num_return_sequences=G)`` prefills every copy instead.
- **Continuous batching.** Every sample owns a slot of a preallocated cache
  (:mod:`.kv_cache`). When one finishes, a waiting sample takes its slot at once; when none
  waits, the last active slot moves into the hole, so a decode step only ever computes
  live rows and a long sample never holds a finished batch hostage.
- **Cheap, per-sequence sampling** (:mod:`.sampling`): inverse-CDF draws from each
  sample's own seeded generator. A sample's tokens depend on its seed, not on which
  other samples share its batch: a group sampled together equals its samples sampled
  one by one with the same seeds.
- **Prefix reuse across turns** (:mod:`.prefix_cache`): the keys/values of finished
  sequences are kept (bounded, LRU); a prompt that starts with a kept sequence's tokens
  (the next turn of a multi-turn episode: history + response + observation) copies them
  into its slot and prefills only its new tokens, from position ``matched`` on. Callers
  send the full token history each turn; nothing else changes. New weights clear it.

Here: the engine itself -- its weights (updated in place, or shared with the trainer's
memory), its stop tokens, the prefix cache and timings that outlive a call. What a call
takes and returns is in :mod:`.engine_contract`; the decode loop of one call in :mod:`.decode`.

Example::

    engine = RolloutEngine(model, tokenizer)
    groups = engine.generate([prompt_ids_a, prompt_ids_b], SamplingParams(n=8, seed=1))
    groups[0][3].token_ids, groups[0][3].logprobs, groups[0][3].finish_reason
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trinity_like.errors import TrinityError
from trinity_like.explorer.decode import DecodeRun
from trinity_like.explorer.engine_contract import EngineParams, Request, Sample, SamplingParams, sample_seed
from trinity_like.explorer.kv_cache import use_attention
from trinity_like.explorer.prefix_cache import PrefixCache
from trinity_like.models.tied import (
    gives_tied_output_its_own,
    retie_output_embeddings,
    ties_output_again,
    untie_output_embeddings,
)

__all__ = ["TIMING_KEYS", "EngineParams", "Request", "RolloutEngine", "Sample", "SamplingParams", "sample_seed"]
TIMING_KEYS = ("prefill", "decode_forward", "sampling", "cache", "bookkeeping")
DEFAULT_PARAMS = EngineParams()  # frozen: one shared default


def _stop_ids(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase | None) -> tuple[int, ...]:
    ids: set[int] = set()
    for source in (getattr(model, "generation_config", None), model.config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if isinstance(eos, int):
            ids.add(eos)
        elif eos:
            ids.update(int(i) for i in eos)
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(int(tokenizer.eos_token_id))
    return tuple(sorted(ids))


class RolloutEngine:
    """Samples responses from a Hugging Face causal LM; see the module docstring."""

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase | None = None,
        params: EngineParams = DEFAULT_PARAMS,
        *,
        model_version: int = 0,
    ) -> None:
        layer_types = getattr(model.config, "layer_types", None) or ()
        if any(t != "full_attention" for t in layer_types):
            raise TrinityError(
                f"the rollout engine supports full attention only; {type(model).__name__} has layer types "
                f"{sorted(set(layer_types))}"
            )
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.params = params
        self.model_version = model_version
        self.default_stop_ids = _stop_ids(model, tokenizer)
        self.timings = dict.fromkeys(TIMING_KEYS, 0.0)  # seconds, accumulated over calls
        pad = tokenizer.pad_token_id if tokenizer is not None else None
        self.pad_id = int(pad) if pad is not None else (self.default_stop_ids or (0,))[0]
        self.prefix_cache = PrefixCache(params.prefix_cache_tokens)
        self._shared: set[str] = set()  # parameters that are the caller's tensors (update_weights(share=True))
        self.pace: Callable[[], object] | None = (
            None  # called before every decode step (cpu_share: the threads to take)
        )

    # -- weights ----------------------------------------------------------------------
    def update_weights(
        self,
        state_dict: Mapping[str, torch.Tensor],
        *,
        version: int | None = None,
        strict: bool = True,
        share: bool = False,
    ) -> int:
        """Copy ``state_dict`` into the model in place; returns the new model version.

        The version becomes ``version`` when given (the trainer's step), else it is bumped
        by one. ``strict=False`` accepts a partial update (e.g. only the trained layers).
        ``share`` keeps the given tensors as the model's weights instead of copying them
        (those of matching dtype, shape and device): the caller promises that nothing
        writes them while the engine samples, and that a later update replaces them.
        """
        if gives_tied_output_its_own(self.model, state_dict):
            untie_output_embeddings(self.model)  # merged LoRA weights that trained a tied lm_head
        elif ties_output_again(self.model, state_dict):
            retie_output_embeddings(self.model)  # the base model's weights after those
        params = dict(self.model.named_parameters())  # a tied parameter once, under its first name
        shared = {
            n
            for n, t in state_dict.items()
            if share
            and n in params
            and (t.dtype, t.shape, t.device) == (params[n].dtype, params[n].shape, params[n].device)
        }
        with torch.no_grad():
            for name in self._shared - shared:  # the caller's memory is never written: own a copy again
                params[name].data = params[name].data.clone()
            for name in shared:
                params[name].data = state_dict[name]
            result = self.model.load_state_dict({n: t for n, t in state_dict.items() if n not in shared}, strict=False)
        self._shared = shared
        missing = set(result.missing_keys) - shared - self._tied_keys()  # a tied copy follows its source
        self.prefix_cache.clear()  # before any error: a partial load has changed weights too
        if strict and (missing or result.unexpected_keys):
            raise TrinityError(f"update_weights: missing {sorted(missing)}, unexpected {result.unexpected_keys}")
        self.model_version = self.model_version + 1 if version is None else int(version)
        return self.model_version

    def _tied_keys(self) -> set[str]:
        """State-dict names that share their storage with an earlier name (tied embeddings)."""
        seen: set[int] = set()
        tied = set()
        for name, tensor in self.model.state_dict(keep_vars=True).items():
            ptr = tensor.data_ptr()
            if ptr in seen:
                tied.add(name)
            seen.add(ptr)
        return tied

    # -- public entry points ------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[list[Sample]]:
        """``sampling.n`` samples for each prompt; sample (p, s) uses ``sample_seed(seed, p, s)``."""
        requests = [
            Request(tuple(int(t) for t in ids), tuple(sample_seed(sampling.seed, p, s) for s in range(sampling.n)))
            for p, ids in enumerate(prompts)
        ]
        return self.run(requests, sampling)

    def run(self, requests: Sequence[Request], sampling: SamplingParams) -> list[list[Sample]]:
        """Samples for each request (one per seed), in request order; ``sampling.n`` is unused."""
        for i, req in enumerate(requests):
            if not req.prompt_ids:
                raise TrinityError(f"request {i}: empty prompt")
            if not req.seeds:
                raise TrinityError(f"request {i}: no seeds, so no samples")
        with torch.inference_mode(), use_attention(self.model):
            return DecodeRun(self, list(requests), sampling).loop()

    def reset_timings(self) -> None:
        self.timings = dict.fromkeys(TIMING_KEYS, 0.0)
