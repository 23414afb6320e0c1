"""One call of the rollout engine (:meth:`~.engine.NativeEngine.run`): the decode loop.

A run admits waiting samples into cache slots, prefills their prompts (each prompt once,
its keys copied into each of its samples' slots; a prompt that extends a kept sequence only
from where it differs, :mod:`.prefix_cache`), then takes decode steps over the live slots:
one forward and one sampled token per slot, entirely on the device (:mod:`.decode_step`).
Every ``sync_every`` steps the host looks: finished samples are collected, their slots
given to waiting samples or closed up (compaction), until nothing waits or decodes. On the
CPU it looks after every step, so no step is ever computed for a finished sample; on CUDA
every 16, so the device runs (captured) steps back to back. What it reads from its engine
is :class:`Decoder`; the keys/values live in :mod:`.kv_cache`::

    results = DecodeRun(engine, requests, sampling).loop()   # list[list[Sample]], in request order

Letters: B active rows, N prompts in a prefill chunk, P prompt length, L key length,
V vocabulary, S new columns of a prefill, M kept columns.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from trinity_like.errors import TrinityError
from trinity_like.explorer.decode_step import (
    REASONS,
    STOP,
    SlotState,
    StepGraphs,
    StepSettings,
    decode_step,
    sample_into,
)
from trinity_like.explorer.engine_contract import EngineParams, Request, Sample, SamplingParams
from trinity_like.explorer.kv_cache import PrefillCache, SlotCache
from trinity_like.explorer.prefix_cache import PrefixCache, PrefixEntry
from trinity_like.explorer.sampling import seed_bits

if TYPE_CHECKING:  # transformers' model layer costs ~1.6 s to import: only when a model runs
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

KEY_BUCKET = 64  # CUDA graphs: key lengths rounded up to a multiple of this (one graph per bucket)


def row_bucket(rows: int, limit: int) -> int:
    """The graph batch for ``rows`` live rows: the first of 1, 2, 3, 4, 6, 8, 12, 16, 24, ... that holds
    them (a graph per bucket, at most a third of its rows idle), capped at ``limit`` (the slots).

    >>> [row_bucket(n, 100) for n in (1, 3, 5, 7, 9, 17, 97)]
    [1, 3, 6, 8, 12, 24, 100]
    """
    power = 1
    while True:
        for size in (power, power * 3 // 2):
            if size >= rows:
                return min(size, limit)
        power *= 2


@dataclass
class Workspace:
    """What decoding keeps on the device: the slot cache, the slots' state, the captured steps."""

    cache: SlotCache
    state: SlotState
    graphs: StepGraphs | None  # None: steps run eagerly (CPU, or graphs off)


class Decoder(Protocol):
    """What a decode run reads from the engine that starts it."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None  # decodes tails for stop strings
    params: EngineParams  # slots and prefill chunk size
    model_version: int  # stamped on every sample
    weights_digest: str  # stamped on every sample
    default_stop_ids: tuple[int, ...]  # when the call names none
    pad_id: int  # padding of a prefill (right of fresh prompts, left of those after kept keys)
    prefix_cache: PrefixCache  # kept sequences: read at prefill, offered each finished one
    timings: dict[str, float]  # seconds per TIMING_KEYS phase, accumulated
    pace: Callable[[], object] | None  # called before every decode step

    def workspace(self, slots: int, max_new: int, max_length: int, example: PrefillCache) -> Workspace:
        """Slot cache and state for at least ``slots`` x ``max_length`` (fresh, or the engine's kept one)."""

    def slots_for(self, samples: int, max_length: int, example: PrefillCache) -> int:
        """How many cache slots a call of ``samples`` samples decodes with."""


@dataclass(eq=False)  # identity comparison: slots are found in the slot list by `is`
class _Slot:
    """A sequence being decoded; its tokens are on the device until it finishes."""

    request: int
    sample: int
    pos: int  # positions 0..pos-1 are cached (as of the host's last look)
    source: PrefixEntry | None  # the kept sequence its prompt extends in full (replaced when it is kept)
    count: int = 0  # tokens sampled (as of the last look)
    tail: list[int] = field(default_factory=list)  # its last tokens, kept on the host for stop strings


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
    """The state of one ``NativeEngine.run`` call: waiting samples, slots, results."""

    def __init__(self, engine: Decoder, requests: list[Request], sampling: SamplingParams) -> None:
        self.engine = engine
        self.model = engine.model
        self.requests = requests
        self.sampling = sampling
        self.version, self.digest = engine.model_version, engine.weights_digest
        self.device = next(self.model.parameters()).device
        stop_ids = sampling.stop_token_ids if sampling.stop_token_ids is not None else engine.default_stop_ids
        self.settings = StepSettings.of(sampling, frozenset(stop_ids))
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
        self.ws: Workspace | None = None
        self.num_slots = 0  # set at the first admission (it needs the cache's shape)
        self.max_length = max(len(r.prompt_ids) for r in requests) + sampling.max_new_tokens
        sync = engine.params.sync_every or (16 if self.device.type == "cuda" else 1)
        self.sync_every = 1 if sampling.stop_strings else sync  # stop strings are checked on the host
        self.since_look = 0  # decode steps since the host last looked
        self.t = engine.timings

    # -- the loop -------------------------------------------------------------------------
    def loop(self) -> list[list[Sample]]:
        pace = self.engine.pace or (lambda: None)
        pace()
        self.refill()
        while self.slots:
            for _ in range(self.steps_until_look()):
                pace()
                self.step()
            self.look()
            self.refill()
        return [[s for s in group if s is not None] for group in self.results]

    def steps_until_look(self) -> int:
        """``sync_every``, but never past the step where the last live sample reaches the cap."""
        left = max(self.sampling.max_new_tokens - s.count for s in self.slots if s is not None)
        return max(1, min(self.sync_every, left))

    def step(self) -> None:
        """One decode step over the live rows (a graph's row bucket on CUDA), keys up to the furthest position."""
        t0 = time.perf_counter()
        assert self.ws is not None
        ws, b = self.ws, len(self.slots)
        self.since_look += 1
        furthest = max(s.pos for s in self.slots if s is not None) + self.since_look  # cached after this step
        stop_ids = ws.state.stop_tensor(self.settings)
        if ws.graphs is None:
            decode_step(self.model, ws.cache, ws.state, b, furthest, self.settings, stop_ids)
        else:
            rows = row_bucket(b, ws.state.slots)
            length = min(-(-furthest // KEY_BUCKET) * KEY_BUCKET, ws.state.max_length)
            ws.graphs.run(
                (rows, length, self.settings),
                lambda: decode_step(self.model, ws.cache, ws.state, rows, length, self.settings, stop_ids),
            )
        self.t["decode_forward"] += time.perf_counter() - t0

    def look(self) -> None:
        """The host's look at the slots: counts and positions refreshed, finished samples collected."""
        t0 = time.perf_counter()
        self.since_look = 0
        b = len(self.slots)
        if b == 0:
            return
        st = self.ws.state  # type: ignore[union-attr]
        snap = torch.stack([st.live_S[:b].long(), st.reason_S[:b].long(), st.pos_S[:b], st.count_S[:b], st.last_S[:b]])
        finished: list[tuple[int, int]] = []  # (row, reason)
        host_stops: list[int] = []
        for i, (live, reason, pos, count, last) in enumerate(zip(*snap.tolist())):
            slot = self.slots[i]
            if slot is None:
                continue
            grew = count > slot.count  # one token at most: with stop strings the host looks every step
            slot.pos, slot.count = pos, count
            if self.sampling.stop_strings and grew and reason != STOP:
                slot.tail = (slot.tail + [last])[-self.stop_window :]
                text = self.engine.tokenizer.decode(slot.tail)  # type: ignore[union-attr]
                if any(s in text for s in self.sampling.stop_strings):
                    host_stops += [i] if live else []
                    live, reason = False, STOP
            if not live:
                finished.append((i, reason))
        if host_stops:
            st.live_S[torch.tensor(host_stops, device=self.device)] = False
        self.t["bookkeeping"] += time.perf_counter() - t0
        if finished:
            self.retire(finished)

    def retire(self, finished: list[tuple[int, int]]) -> None:
        """Collect finished samples (one transfer for all), offer their keys to the prefix cache, free their slots."""
        t0 = time.perf_counter()
        st = self.ws.state  # type: ignore[union-attr]
        rows = torch.tensor([i for i, _ in finished], device=self.device)
        width = max(self.slots[i].count for i, _ in finished)  # type: ignore[union-attr]
        tokens, logprobs = st.tokens_SN[rows, :width].tolist(), st.logprobs_SN[rows, :width].tolist()
        for (i, reason), toks, lps in zip(finished, tokens, logprobs):
            slot = self.slots[i]
            assert slot is not None
            n = slot.count
            self.results[slot.request][slot.sample] = Sample(
                slot.request, slot.sample, toks[:n], lps[:n], REASONS.get(reason, "stop"), self.version, self.digest
            )
            self.keep(i, slot, toks[:n])
            self.slots[i] = None
        self.t["bookkeeping"] += time.perf_counter() - t0

    def keep(self, index: int, slot: _Slot, tokens: list[int]) -> None:
        """Offer a finished sequence's cached tokens to the prefix cache (its next turn may extend it)."""
        store = self.engine.prefix_cache
        if not store.budget:
            return
        t0 = time.perf_counter()
        kept = self.requests[slot.request].prompt_ids + tuple(tokens[:-1])  # the last was never fed
        assert len(kept) == slot.pos, (len(kept), slot.pos)
        cache = self.ws.cache  # type: ignore[union-attr]
        store.insert(kept, lambda: cache.read(index, slot.pos), slot.source)
        self.t["cache"] += time.perf_counter() - t0

    # -- admission and compaction -----------------------------------------------------------
    def free(self) -> bool:
        return None in self.slots or len(self.slots) < self.num_slots or not self.num_slots

    def refill(self) -> None:
        """Give free slots to waiting samples (their first tokens sampled from the prefill), then close the holes."""
        while self.waiting and self.free():
            admitted: list[tuple[int, _Slot]] = []
            while self.waiting and self.free():
                admitted.append(self.admit(*self.waiting.pop()))
            self.start(admitted)
            self.look()  # a first token may finish its sample at once
        self.compact()

    def admit(self, request: int, sample: int) -> tuple[int, _Slot]:
        entry = self.prefilled_of(request)
        if self.ws is None:
            self.num_slots = self.engine.slots_for(len(self.waiting) + 1, self.max_length, entry.cache)
            self.ws = self.engine.workspace(self.num_slots, self.sampling.max_new_tokens, self.max_length, entry.cache)
        slot = _Slot(request, sample, pos=entry.length, source=entry.source)
        index = self.slots.index(None) if None in self.slots else len(self.slots)
        if index == len(self.slots):
            self.slots.append(slot)
        else:
            self.slots[index] = slot
        return index, slot

    def start(self, admitted: list[tuple[int, _Slot]]) -> None:
        """Copy the admitted samples' prompts into their slots (one gather per prefill chunk and
        layer) and draw each one's first token from its prompt's prefill logits."""
        t0 = time.perf_counter()
        ws = self.ws
        assert ws is not None
        by_chunk: dict[int, list[tuple[int, _Slot]]] = {}
        for index, slot in admitted:
            by_chunk.setdefault(id(self.prefilled[slot.request].cache), []).append((index, slot))
        for group in by_chunk.values():
            entries = [self.prefilled[s.request] for _, s in group]
            ws.cache.load_prompts(
                [i for i, _ in group], entries[0].cache, [e.row for e in entries], [e.spans for e in entries]
            )
        rows = [i for i, _ in admitted]
        seeds = [seed_bits(self.requests[s.request].seeds[s.sample]) for _, s in admitted]
        ws.state.admit(rows, [s.pos for _, s in admitted], seeds)
        logits_BV = torch.stack([self.prefilled[s.request].logits_V for _, s in admitted])
        for _, s in admitted:
            self.release_prompt(s.request)
        self.t["cache"] += time.perf_counter() - t0
        t1 = time.perf_counter()
        index_B = torch.tensor(rows, device=self.device)
        sample_into(ws.state, index_B, logits_BV, self.settings, ws.state.stop_tensor(self.settings))
        self.t["sampling"] += time.perf_counter() - t1

    def compact(self) -> None:
        """Move the last active slots into holes so active rows are exactly 0..B-1 (one batched copy)."""
        t0 = time.perf_counter()
        while self.slots and self.slots[-1] is None:
            self.slots.pop()
        holes = [i for i, s in enumerate(self.slots) if s is None]
        if holes:
            live = len(self.slots) - len(holes)
            src = [i for i in range(len(self.slots) - 1, live - 1, -1) if self.slots[i] is not None]
            dst = [h for h in holes if h < live]
            assert len(src) == len(dst)
            length = max(self.slots[i].pos for i in src) + 1  # type: ignore[union-attr]
            ws = self.ws
            assert ws is not None
            ws.cache.move(src, dst, min(length, ws.cache.max_length))
            ws.state.move(src, dst)
            for s, d in zip(src, dst):
                self.slots[d] = self.slots[s]
            del self.slots[live:]
        self.t["cache"] += time.perf_counter() - t0

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
        """Prefill the next ``prefill_batch_size`` prompts in at most two forwards.

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

        Fresh prompts (nothing kept) are right-padded: every real token sees only the real
        tokens before it, so the forward is plain causal attention with no mask at all, which
        SDPA runs on its fused kernels (flash / memory-efficient) rather than the masked math
        path; each row's logits are read at its own last token. Prompts that extend kept
        sequences need a mask: keys are ``[M kept columns | S new columns]``, row n's kept
        keys right-aligned in the first M (= most matched), its new tokens right-aligned in
        the last S, at positions ``matched, matched + 1, ...`` -- the positions a whole-prompt
        prefill would give them, so rotary embeddings agree.
        """
        dev = self.device
        matched = [m for _, m in found]
        news = [self.requests[r].prompt_ids[m:] for r, m in zip(requests, matched)]
        width, past = max(len(t) for t in news), max(matched)  # S, M
        cache = PrefillCache(self._num_layers(), past)
        pad = self.engine.pad_id
        if not past:
            ids_NS = torch.tensor([list(t) + [pad] * (width - len(t)) for t in news], device=dev)
            positions_NS = torch.arange(width, device=dev).expand(len(news), -1)
            lasts = sorted({len(t) - 1 for t in news})  # the columns whose logits some row needs
            logits_NKV = self.model(
                input_ids=ids_NS,
                position_ids=positions_NS,
                attention_mask=None,  # causal: slot_attention runs SDPA with is_causal=True
                past_key_values=cache,
                use_cache=True,
                logits_to_keep=torch.tensor(lasts, device=dev),
            ).logits
            column = {c: i for i, c in enumerate(lasts)}
            logits_NV = logits_NKV[torch.arange(len(news), device=dev), [column[len(t) - 1] for t in news]]
            spans_of = [((0, len(t)),) for t in news]
        else:
            logits_NV = self._prefill_after_kept(cache, news, found, width, past)
            spans_of = [
                ((past - m, m), (past + width - len(new), len(new))) if m else ((past + width - len(new), len(new)),)
                for (_, m), new in zip(found, news)
            ]
        for row, (r, (entry, m), new) in enumerate(zip(requests, found, news)):
            source = entry if entry is not None and m == len(entry.tokens) else None
            self.prefilled[r] = _Prefilled(
                cache, row, spans_of[row], m + len(new), logits_NV[row], len(self.requests[r].seeds), source
            )

    def _prefill_after_kept(
        self,
        cache: PrefillCache,
        news: list[tuple[int, ...]],
        found: list[tuple[PrefixEntry | None, int]],
        width: int,
        past: int,
    ) -> torch.Tensor:
        """The masked prefill of new tokens after kept keys (left-padded; see :meth:`prefill_rows`)."""
        dev = self.device
        matched = [m for _, m in found]
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
        kept_NM = torch.arange(past, device=dev)[None, :] >= (past - matched_N)[:, None]
        visible_NSS = torch.cat([kept_NM[:, None, :].expand(-1, width, -1), visible_NSS], dim=2)
        kv = next(e for e, _ in found if e is not None).kv_L2HnD
        cache.reserve(len(news), kv.shape[2], past + width, kv.shape[4], kv.dtype, kv.device)
        for row, (entry, m) in enumerate(found):
            if entry is None or not m:
                continue
            for layer, (k, v) in enumerate(zip(cache.keys, cache.values)):
                assert k is not None and v is not None
                k[row, :, past - m : past] = entry.kv_L2HnD[layer, 0, :, :m]
                v[row, :, past - m : past] = entry.kv_L2HnD[layer, 1, :, :m]
        return self.model(
            input_ids=ids_NS,
            position_ids=positions_NS,
            attention_mask=self._additive(visible_NSS)[:, None],
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]

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
