"""Our rollout engine (``native``): batched incremental decoding with continuous batching.

Generation dominates the time of online RL, so this is written for throughput on the
workload RL produces -- P prompts x G samples each, short answers of uneven length:

- **A group's prompt is prefilled once.** Its keys/values are copied into each sample's
  cache slot; ``generate(num_return_sequences=G)`` prefills every copy instead.
- **Continuous batching.** Every sample owns a slot of a preallocated cache
  (:mod:`.kv_cache`). When one finishes, a waiting sample takes its slot at once; when none
  waits, the last active slot moves into the hole, so a decode step only ever computes
  live rows and a long sample never holds a finished batch hostage.
- **Cheap, per-sequence sampling** (:mod:`.sampling`): inverse-CDF draws from each
  sample's own counter-based generator (seed, draw index), computed on the device. A
  sample's tokens depend on its seed, not on which other samples share its batch: a group
  sampled together equals its samples sampled one by one with the same seeds.
- **The host out of the loop on a GPU** (:mod:`.decode_step`): slot state, sampling and
  stop detection live on the device; the host looks every ``sync_every`` steps; each step
  shape is a captured CUDA graph; attention is the card's fused SDPA kernel. The cache is
  sized to the work (one slot per sample where memory allows) and kept between calls,
  with its graphs, until :meth:`NativeEngine.release_memory`.
- **Prefix reuse across turns** (:mod:`.prefix_cache`): the keys/values of finished
  sequences are kept (bounded, LRU); a prompt that starts with a kept sequence's tokens
  (the next turn of a multi-turn episode: history + response + observation) copies them
  into its slot and prefills only its new tokens, from position ``matched`` on. Callers
  send the full token history each turn; nothing else changes. New weights clear it.

Here: the engine itself -- its weights (updated in place, or borrowed from the trainer's
memory), its stop tokens, the prefix cache, the device workspace and timings that outlive a
call. What a call takes and returns is in :mod:`.engine_contract`; the decode loop of one
call in :mod:`.decode`, its device half in :mod:`.decode_step`.

Example::

    engine = NativeEngine(model, tokenizer)          # or build_rollout_engine("native", path)
    groups = engine.generate([prompt_ids_a, prompt_ids_b], SamplingParams(n=8, seed=1))
    groups[0][3].token_ids, groups[0][3].logprobs, groups[0][3].finish_reason
"""

from __future__ import annotations

import gc
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import torch

from trinity_like import fault_points
from trinity_like.errors import TrinityError
from trinity_like.explorer.decode import DecodeRun, Workspace
from trinity_like.explorer.decode_step import SlotState, StepGraphs
from trinity_like.explorer.engine_contract import (
    Borrowed,
    EngineParams,
    Request,
    RolloutEngine,
    Sample,
    SamplingParams,
    Weights,
    generate,
    sample_seed,
    weight_mapping,
)
from trinity_like.explorer.kv_cache import PrefillCache, SlotCache, use_attention
from trinity_like.explorer.prefix_cache import PrefixCache
from trinity_like.models.tied import (
    gives_tied_output_its_own,
    retie_output_embeddings,
    ties_output_again,
    untie_output_embeddings,
)
from trinity_like.models.weight_digest import model_digest

if TYPE_CHECKING:  # transformers' model layer costs ~1.6 s to import: only when a model runs
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "TIMING_KEYS",
    "Borrowed",
    "EngineParams",
    "NativeEngine",
    "Request",
    "RolloutEngine",
    "Sample",
    "SamplingParams",
    "sample_seed",
]
TIMING_KEYS = ("prefill", "decode_forward", "sampling", "cache", "bookkeeping")
DEFAULT_PARAMS = EngineParams()  # frozen: one shared default
CPU_SLOTS = 128  # cache slots on the CPU when EngineParams.max_batch_size is None (measured there)
CUDA_MEMORY_SHARE = 0.5  # of the device's free memory, the most a sized-to-the-work cache takes


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


class NativeEngine:
    """Samples responses from a Hugging Face causal LM on its device; see the module docstring.

    Implements :class:`~trinity_like.explorer.engine_contract.RolloutEngine`.
    """

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
        self.weights_digest = model_digest(self.model)  # of what it holds: stamped on every sample
        self.default_stop_ids = _stop_ids(model, tokenizer)
        self.timings = dict.fromkeys(TIMING_KEYS, 0.0)  # seconds, accumulated over calls
        pad = tokenizer.pad_token_id if tokenizer is not None else None
        self.pad_id = int(pad) if pad is not None else (self.default_stop_ids or (0,))[0]
        self.prefix_cache = PrefixCache(params.prefix_cache_tokens)
        self._borrowed: set[str] = set()  # parameters that are the caller's tensors (a Borrowed update)
        self._workspace: Workspace | None = None  # kept between calls on CUDA (its graphs point into it)
        self.last_slots = 0  # cache slots of the last call (reports)
        self.pace: Callable[[], object] | None = (
            None  # called before every decode step (cpu_share: the threads to take)
        )

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    # -- weights ----------------------------------------------------------------------
    def update_weights(self, weights: Weights | Borrowed, *, version: int | None = None, strict: bool = True) -> int:
        """Copy ``weights`` (a state dict or ``(name, tensor)`` pairs) into the model in place, or -- a
        :class:`Borrowed` -- use them as they
        are (those of matching dtype, shape and device; the rest are copied); returns the new
        model version.

        The version becomes ``version`` when given (the trainer's step), else it is bumped
        by one. ``strict=False`` accepts a partial update (e.g. only the trained layers).
        Parameters borrowed before and not now get memory of the engine's own again: the
        owner's is never written.
        """
        state_dict, borrow = weight_mapping(weights)
        arrived = fault_points.arriving_weights(
            state_dict, self.model.state_dict(), getattr(self.model, "name_or_path", None)
        )  # the sync path's fault injection (tests/faults/test_weight_identity.py); unset: `state_dict`
        if arrived is fault_points.MISSED:  # an engine the sync skipped: neither weights nor version move
            return self.model_version
        if arrived is None:  # an update lost on the way: the version moves, the weights do not
            self.model_version = self.model_version + 1 if version is None else int(version)
            return self.model_version
        state_dict = arrived
        before = [p.data_ptr() for p in self.model.parameters()]
        if gives_tied_output_its_own(self.model, state_dict):
            untie_output_embeddings(self.model)  # merged LoRA weights that trained a tied lm_head
        elif ties_output_again(self.model, state_dict):
            retie_output_embeddings(self.model)  # the base model's weights after those
        params = dict(self.model.named_parameters())  # a tied parameter once, under its first name
        borrowed = {
            n
            for n, t in state_dict.items()
            if borrow
            and n in params
            and (t.dtype, t.shape, t.device) == (params[n].dtype, params[n].shape, params[n].device)
        }
        with torch.no_grad():
            for name in self._borrowed - borrowed:  # the caller's memory is never written: own a copy again
                params[name].data = params[name].data.clone()
            for name in borrowed:
                params[name].data = state_dict[name]
            result = self.model.load_state_dict(
                {n: t for n, t in state_dict.items() if n not in borrowed}, strict=False
            )
        self._borrowed = borrowed
        moved = [p.data_ptr() for p in self.model.parameters()] != before
        if moved and self._workspace is not None and self._workspace.graphs is not None:
            self._workspace.graphs.clear()  # captured steps read the weights where they were
        missing = set(result.missing_keys) - borrowed - self._tied_keys()  # a tied copy follows its source
        self.prefix_cache.clear()  # before any error: a partial load has changed weights too
        if strict and (missing or result.unexpected_keys):
            raise TrinityError(f"update_weights: missing {sorted(missing)}, unexpected {result.unexpected_keys}")
        self.model_version = self.model_version + 1 if version is None else int(version)
        self.weights_digest = model_digest(self.model)  # read back from the parameters, after the load
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

    # -- the device workspace (the Decoder side of a DecodeRun) -------------------------
    def slots_for(self, samples: int, max_length: int, example: PrefillCache) -> int:
        """Cache slots for a call of ``samples`` samples: ``max_batch_size`` when set; else 128 on
        the CPU, and on CUDA one per sample, as many as :data:`CUDA_MEMORY_SHARE` of the free
        device memory (plus what a kept workspace already holds) has room for."""
        if self.params.max_batch_size is not None:
            return min(self.params.max_batch_size, samples)
        if self.device.type != "cuda":
            return min(CPU_SLOTS, samples)
        k = example.keys[0]
        assert k is not None
        per_slot = 2 * len(example.keys) * k.shape[1] * max_length * k.shape[3] * k.element_size()
        free, _ = torch.cuda.mem_get_info(self.device)
        held = self._workspace.cache.nbytes() if self._workspace is not None else 0
        return max(1, min(samples, int((free + held) * CUDA_MEMORY_SHARE) // per_slot))

    def workspace(self, slots: int, max_new: int, max_length: int, example: PrefillCache) -> Workspace:
        """The slot cache and state of a call: on CUDA the kept one when it is big enough (its
        graphs stay valid), else a new one that is kept; on the CPU a fresh one per call."""
        kept = self._workspace
        if kept is not None and kept.state.fits(slots, max_new, max_length):
            self.last_slots = kept.state.slots
            return kept
        self._drop_workspace()
        k = example.keys[0]
        assert k is not None
        cache = SlotCache(
            num_layers=len(example.keys),
            num_slots=slots,
            num_kv_heads=k.shape[1],
            max_length=max_length,
            head_dim=k.shape[3],
            dtype=k.dtype,
            device=k.device,
        )
        cuda = k.device.type == "cuda"
        graphs = self._new_graphs(k.device)
        ws = Workspace(cache, SlotState(slots, max_new, max_length, k.device), graphs)
        if cuda or graphs is not None:
            self._workspace = ws
        self.last_slots = slots
        return ws

    def _new_graphs(self, device: torch.device) -> StepGraphs | None:
        """The captured steps of a new workspace: on CUDA unless ``cuda_graphs`` is off."""
        return StepGraphs() if device.type == "cuda" and self.params.cuda_graphs else None

    def workspace_stats(self) -> dict[str, object]:
        """The last call's slots, captured graphs and why graphs are off, if they are (reports)."""
        graphs = self._workspace.graphs if self._workspace is not None else None
        return {
            "slots": self.last_slots,
            "cuda_graphs": len(graphs.graphs) if graphs is not None else 0,
            "graph_error": graphs.failed if graphs is not None else None,
        }

    def release_memory(self) -> None:
        """Drop the kept prefixes and -- unless ``keep_graphs`` holds captured graphs -- the kept
        workspace (cache, slot state, graphs), and hand the freed device memory back (a trainer
        on the same GPU takes it next). A kept workspace's graphs replay at the next call without
        a new capture: weights updated in place stay where the graphs read them."""
        self.prefix_cache.clear()
        ws = self._workspace
        if self.params.keep_graphs and ws is not None and ws.graphs is not None and ws.graphs.graphs:
            return
        self._drop_workspace()

    def _drop_workspace(self) -> None:
        if self._workspace is None:
            return
        self._workspace = None
        gc.collect()  # graphs and their pool go with the last reference
        if torch.cuda.is_initialized():
            torch.cuda.empty_cache()

    def resume_memory(self) -> None:
        """Nothing ahead of time: the next call allocates its workspace (sized to that call)."""

    def close(self) -> None:
        self.release_memory()
        self.model = None  # type: ignore[assignment]

    # -- public entry points ------------------------------------------------------------
    def generate(self, prompts: Sequence[Sequence[int]], sampling: SamplingParams) -> list[list[Sample]]:
        """``sampling.n`` samples for each prompt: the contract's :func:`~.engine_contract.generate` over :meth:`run`."""
        return generate(self, prompts, sampling)

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
