"""One call of the rollout engine (:meth:`~.engine.RolloutEngine.run`): the decode loop.

A run admits waiting samples into cache slots, prefills their prompts (each prompt once,
its keys copied into each of its samples' slots; a prompt that extends a kept sequence only
from where it differs, :mod:`.prefix_cache`), then takes decode steps over the live slots:
one forward, one sampled token per slot (:mod:`.sampling`), finished samples retired, their
slots given to waiting samples or closed up (compaction), until nothing waits or decodes.
What it reads from its engine is :class:`Decoder`; the keys/values live in :mod:`.kv_cache`::

    results = DecodeRun(engine, requests, sampling).loop()   # list[list[Sample]], in request order

Letters: B active rows, N prompts in a prefill chunk, P prompt length, L key length,
V vocabulary, S new columns of a prefill, M kept columns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trinity_like.errors import TrinityError
from trinity_like.explorer.engine_contract import EngineParams, Request, Sample, SamplingParams
from trinity_like.explorer.kv_cache import PrefillCache, SlotCache
from trinity_like.explorer.prefix_cache import PrefixCache, PrefixEntry
from trinity_like.explorer.sampling import greedy_tokens, sample_tokens, uniforms


class Decoder(Protocol):
    """What a decode run reads from the engine that starts it."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None  # decodes tails for stop strings
    params: EngineParams  # slots and prefill chunk size
    model_version: int  # stamped on every sample
    default_stop_ids: tuple[int, ...]  # when the call names none
    pad_id: int  # left padding of a prefill
    prefix_cache: PrefixCache  # kept sequences: read at prefill, offered each finished one
    timings: dict[str, float]  # seconds per TIMING_KEYS phase, accumulated
    pace: Callable[[], object] | None  # called before every decode step


@dataclass(eq=False)  # identity comparison: slots are found in the slot list by `is`
class _Slot:
    """A sequence being decoded."""

    request: int
    sample: int
    seed: int  # the sample's random stream; draw i is uniforms(seed, i)
    cached: int  # positions 0..cached-1 are in the KV cache; the last token goes at `cached`
    source: PrefixEntry | None  # the kept sequence its prompt extends in full (replaced when it is kept)
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)


@dataclass
class _Prefilled:
    """A prefilled prompt: where its keys are and the logits of its next token."""

    cache: PrefillCache
    row: int
    spans: tuple[tuple[int, int], ...]  # (start, count) columns of row `row` holding the prompt, in order
    length: int
    logits_V: torch.Tensor
    remaining: int  # samples not yet admitted; the entry is dropped at zero
    source: PrefixEntry | None  # see _Slot.source


class DecodeRun:
    """The state of one ``RolloutEngine.run`` call: waiting samples, slots, results."""

    def __init__(self, engine: Decoder, requests: list[Request], sampling: SamplingParams) -> None:
        self.engine = engine
        self.model = engine.model
        self.requests = requests
        self.sampling = sampling
        self.version = engine.model_version
        self.device = next(self.model.parameters()).device
        stop_ids = sampling.stop_token_ids if sampling.stop_token_ids is not None else engine.default_stop_ids
        self.stop_ids = frozenset(stop_ids)
        if sampling.stop_strings and engine.tokenizer is None:
            raise TrinityError("stop_strings need the engine to have a tokenizer")
        # Tokens a stop string can span: each token decodes to at least one byte.
        self.stop_window = max((len(s.encode()) for s in sampling.stop_strings), default=0) + 1
        self.waiting = [(r, s) for r, req in enumerate(requests) for s in range(len(req.seeds))]
        self.waiting.reverse()  # pop() from the end takes them in order
        self.next_prefill = 0  # first request not yet prefilled
        self.prefilled: dict[int, _Prefilled] = {}
        self.results: list[list[Sample | None]] = [[None] * len(req.seeds) for req in requests]
        self.slots: list[_Slot | None] = []
        self.cache: SlotCache | None = None
        self.num_slots = min(engine.params.max_batch_size, len(self.waiting))
        self.max_length = max(len(r.prompt_ids) for r in requests) + sampling.max_new_tokens
        self.t = engine.timings

    # -- the loop -------------------------------------------------------------------------
    def loop(self) -> list[list[Sample]]:
        pace = self.engine.pace or (lambda: None)
        pace()
        self.refill()
        while self.slots:
            pace()
            self.decode_step()
            self.refill()
        return [[s for s in group if s is not None] for group in self.results]

    def decode_step(self) -> None:
        t0 = time.perf_counter()
        assert self.cache is not None
        slots = [s for s in self.slots if s is not None]
        positions_B = torch.tensor([s.cached for s in slots], device=self.device)
        key_length = int(positions_B.max()) + 1
        self.cache.prepare_step(positions_B, key_length)
        visible_BL = torch.arange(key_length, device=self.device)[None, :] <= positions_B[:, None]
        mask_B11L = self._additive(visible_BL)[:, None, None, :]
        input_B1 = torch.tensor([[s.tokens[-1]] for s in slots], device=self.device)
        t1 = time.perf_counter()
        logits_BV = self.model(
            input_ids=input_B1,
            position_ids=positions_B[:, None],
            attention_mask=mask_B11L,
            past_key_values=self.cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        t2 = time.perf_counter()
        for s in slots:
            s.cached += 1
        self.t["cache"] += t1 - t0
        self.t["decode_forward"] += t2 - t1
        self.append_tokens(slots, logits_BV)

    def append_tokens(self, slots: list[_Slot], logits_BV: torch.Tensor) -> None:
        """Sample one token for each of ``slots``, append it, and retire finished slots."""
        t0 = time.perf_counter()
        sp = self.sampling
        if sp.greedy:
            token_B, logprob_B = greedy_tokens(logits_BV)
        else:
            seeds_B = np.fromiter((s.seed for s in slots), dtype=np.uint64, count=len(slots))
            draws_B = np.fromiter((len(s.tokens) for s in slots), dtype=np.uint64, count=len(slots))
            u_B = uniforms(seeds_B, draws_B).to(logits_BV.device)
            token_B, logprob_B = sample_tokens(
                logits_BV, u_B, temperature=sp.temperature, top_k=sp.top_k, top_p=sp.top_p
            )
        tokens, logprobs = token_B.tolist(), logprob_B.tolist()
        t1 = time.perf_counter()
        self.t["sampling"] += t1 - t0
        for slot, token, logprob in zip(slots, tokens, logprobs):
            slot.tokens.append(token)
            slot.logprobs.append(logprob)
            reason = self.finish_reason(slot)
            if reason:
                self.results[slot.request][slot.sample] = Sample(
                    slot.request, slot.sample, slot.tokens, slot.logprobs, reason, self.version
                )
                index = self.slots.index(slot)
                self.keep(index, slot)
                self.slots[index] = None
        self.t["bookkeeping"] += time.perf_counter() - t1

    def keep(self, index: int, slot: _Slot) -> None:
        """Offer a finished sequence's cached tokens to the prefix cache (its next turn may extend it)."""
        store = self.engine.prefix_cache
        if not store.budget:
            return
        t0 = time.perf_counter()
        tokens = self.requests[slot.request].prompt_ids + tuple(slot.tokens[:-1])  # the last was never fed
        assert len(tokens) == slot.cached
        cache = self.cache
        assert cache is not None
        store.insert(tokens, lambda: cache.read(index, slot.cached), slot.source)
        self.t["cache"] += time.perf_counter() - t0

    def finish_reason(self, slot: _Slot) -> str:
        if slot.tokens[-1] in self.stop_ids:
            return "stop"
        if self.sampling.stop_strings:
            tail = self.engine.tokenizer.decode(slot.tokens[-self.stop_window :])  # type: ignore[union-attr]
            if any(s in tail for s in self.sampling.stop_strings):
                return "stop"
        if len(slot.tokens) >= self.sampling.max_new_tokens:
            return "length"
        return ""

    # -- admission and compaction -----------------------------------------------------------
    def refill(self) -> None:
        """Give free slots to waiting samples, then close the remaining holes."""
        while self.waiting and (None in self.slots or len(self.slots) < self.num_slots):
            admitted: list[_Slot] = []
            while self.waiting and (None in self.slots or len(self.slots) < self.num_slots):
                admitted.append(self.admit(*self.waiting.pop()))
            # Each new sample's first token comes from its prompt's prefill logits.
            logits_BV = torch.stack([self.prefilled_of(s.request).logits_V for s in admitted])
            for s in admitted:
                self.release_prompt(s.request)
            self.append_tokens(admitted, logits_BV)
        self.compact()

    def admit(self, request: int, sample: int) -> _Slot:
        entry = self.prefilled_of(request)
        t0 = time.perf_counter()
        seed = self.requests[request].seeds[sample]
        slot = _Slot(request, sample, seed % 2**64, cached=entry.length, source=entry.source)
        index = self.slots.index(None) if None in self.slots else len(self.slots)
        if self.cache is None:
            self.cache = self._allocate(entry.cache)
        self.cache.load_prompt(index, entry.cache, entry.row, entry.spans)
        if index == len(self.slots):
            self.slots.append(slot)
        else:
            self.slots[index] = slot
        self.t["cache"] += time.perf_counter() - t0
        return slot

    def compact(self) -> None:
        """Move the last active slots into holes so active rows are exactly 0..B-1."""
        t0 = time.perf_counter()
        assert self.cache is not None or not self.slots
        while self.slots and self.slots[-1] is None:
            self.slots.pop()
        while None in self.slots:
            hole = self.slots.index(None)
            last = self.slots.pop()
            assert last is not None
            self.cache.move(len(self.slots), hole, last.cached)  # type: ignore[union-attr]
            self.slots[hole] = last
            while self.slots and self.slots[-1] is None:
                self.slots.pop()
        self.t["cache"] += time.perf_counter() - t0

    def _allocate(self, example: PrefillCache) -> SlotCache:
        k = example.keys[0]
        assert k is not None
        return SlotCache(
            num_layers=len(example.keys),
            num_slots=self.num_slots,
            num_kv_heads=k.shape[1],
            max_length=self.max_length,
            head_dim=k.shape[3],
            dtype=k.dtype,
            device=k.device,
        )

    # -- prefill --------------------------------------------------------------------------
    def prefilled_of(self, request: int) -> _Prefilled:
        while request >= self.next_prefill:
            self.prefill_chunk()
        return self.prefilled[request]

    def release_prompt(self, request: int) -> None:
        entry = self.prefilled[request]
        entry.remaining -= 1
        if entry.remaining == 0:
            del self.prefilled[request]

    def prefill_chunk(self) -> None:
        """Prefill the next ``prefill_batch_size`` prompts, left-padded, in at most two forwards.

        Prompts that extend a kept sequence run only their new tokens, batched together;
        the others run whole, as before. Two forwards rather than one: a whole prompt
        beside short suffixes would pad every suffix row to the prompt's length.
        """
        t0 = time.perf_counter()
        first = self.next_prefill
        chunk = range(first, min(first + self.engine.params.prefill_batch_size, len(self.requests)))
        self.next_prefill = chunk.stop
        found = {r: self.engine.prefix_cache.lookup(self.requests[r].prompt_ids) for r in chunk}
        fresh = [r for r in chunk if found[r][0] is None]
        reused = [r for r in chunk if found[r][0] is not None]
        for rows in (fresh, reused):
            if rows:
                self.prefill_rows(rows, [found[r] for r in rows])
        self.t["prefill"] += time.perf_counter() - t0

    def prefill_rows(self, requests: list[int], found: list[tuple[PrefixEntry | None, int]]) -> None:
        """One forward over the prompts of ``requests`` after their ``found`` (entry, matched) prefixes.

        Keys are ``[M kept columns | S new columns]``: row n's kept keys are right-aligned
        in the first M (= most matched), its new tokens right-aligned in the last S, at
        positions ``matched, matched + 1, ...`` -- the positions a whole-prompt prefill
        would give them, so rotary embeddings agree. Without kept keys (M = 0) this is
        the plain left-padded prefill.
        """
        dev = self.device
        matched = [m for _, m in found]
        news = [self.requests[r].prompt_ids[m:] for r, m in zip(requests, matched)]
        width, past = max(len(t) for t in news), max(matched)  # S, M
        pads_N = torch.tensor([width - len(t) for t in news], device=dev)
        matched_N = torch.tensor(matched, device=dev)
        ids_NS = torch.tensor([[self.engine.pad_id] * (width - len(t)) + list(t) for t in news], device=dev)
        columns_S = torch.arange(width, device=dev)
        positions_NS = (columns_S[None, :] - pads_N[:, None] + matched_N[:, None]).clamp(min=0)
        # Causal over the new tokens, padding invisible; every query sees itself so padded
        # rows stay finite.
        causal_SS = columns_S[None, :] <= columns_S[:, None]
        real_NS = columns_S[None, :] >= pads_N[:, None]
        visible_NSS = (causal_SS[None] & real_NS[:, None, :]) | torch.eye(width, dtype=torch.bool, device=dev)
        cache = PrefillCache(self._num_layers(), past)
        if past:
            kept_NM = torch.arange(past, device=dev)[None, :] >= (past - matched_N)[:, None]
            visible_NSS = torch.cat([kept_NM[:, None, :].expand(-1, width, -1), visible_NSS], dim=2)
            kv = found[0][0].kv_L2HnD  # type: ignore[union-attr]  # every row here has an entry
            cache.reserve(len(requests), kv.shape[2], past + width, kv.shape[4], kv.dtype, kv.device)
            for row, (entry, m) in enumerate(found):
                assert entry is not None
                for layer, (k, v) in enumerate(zip(cache.keys, cache.values)):
                    assert k is not None and v is not None
                    k[row, :, past - m : past] = entry.kv_L2HnD[layer, 0, :, :m]
                    v[row, :, past - m : past] = entry.kv_L2HnD[layer, 1, :, :m]
        logits_NV = self.model(
            input_ids=ids_NS,
            position_ids=positions_NS,
            attention_mask=self._additive(visible_NSS)[:, None],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        for row, (r, (entry, m), new) in enumerate(zip(requests, found, news)):
            spans = ((past - m, m), (past + width - len(new), len(new))) if m else ((width - len(new), len(new)),)
            source = entry if entry is not None and m == len(entry.tokens) else None
            self.prefilled[r] = _Prefilled(
                cache, row, spans, m + len(new), logits_NV[row], len(self.requests[r].seeds), source
            )

    def _num_layers(self) -> int:
        n = getattr(self.model.config, "num_hidden_layers", None)
        if n is None:
            raise TrinityError(f"{type(self.model).__name__}: config has no num_hidden_layers")
        return int(n)

    def _additive(self, visible: torch.Tensor) -> torch.Tensor:
        """Boolean visibility -> additive mask in the model's dtype (0 or the dtype's min)."""
        dtype = self.model.dtype
        zero = torch.zeros((), dtype=dtype, device=self.device)
        return torch.where(visible, zero, torch.finfo(dtype).min)
