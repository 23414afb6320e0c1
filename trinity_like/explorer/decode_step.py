"""The device half of a decode run: every slot's state on the device, the decode step over it,
and that step captured as a CUDA graph.

Why: on a GPU the step itself is a few milliseconds of kernels, and a loop that asks the host
anything between steps (the sampled tokens, whether a sample finished, the positions for the
next mask) waits for the device each time and launches thousands of kernels from Python
(docs/machines.md: 87 % of an H100 idle). Here a step reads and writes only device tensors --
the last token, position, sample count, seed and liveness of each slot, the sampled tokens
and their logprobs -- so any number of steps run back to back without the host, and a step of
one shape (rows, key length, sampling settings) is captured once as a CUDA graph and replayed.
The host looks at the slots every ``sync_every`` steps (:mod:`.decode`): finished samples are
collected, waiting ones admitted, holes closed. A finished row that waits for the look keeps
running: its token goes to a trash column, its position stays, its cache row is its own.

On the CPU the same step runs eagerly, and the host looks after every step, as it always did.

Letters: S slots, B rows of a step (a prefix of the slots), N the response cap (column N is
the trash column), L key length, V vocabulary.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from trinity_like.explorer.engine_contract import SamplingParams
from trinity_like.explorer.kv_cache import SlotCache
from trinity_like.explorer.lean_forward import lean_forward
from trinity_like.explorer.sampling import greedy_tokens, sample_tokens, uniforms
from trinity_like.models.device import DEVICE_TURN

if TYPE_CHECKING:  # transformers' model layer costs ~1.6 s to import: only when a model runs
    from transformers import PreTrainedModel

RUNNING, STOP, LENGTH = 0, 1, 2  # a slot's reason code: decoding, stopped by a stop token, hit the cap
REASONS = {STOP: "stop", LENGTH: "length"}


@dataclass(frozen=True)
class StepSettings:
    """What one call's steps share; a captured graph holds these values, so they key it."""

    greedy: bool
    temperature: float
    top_k: int
    top_p: float
    stop_ids: tuple[int, ...]
    max_new: int

    @classmethod
    def of(cls, sampling: SamplingParams, stop_ids: frozenset[int]) -> StepSettings:
        return cls(
            sampling.greedy,
            sampling.temperature,
            sampling.top_k,
            sampling.top_p,
            tuple(sorted(stop_ids)),
            sampling.max_new_tokens,
        )


class SlotState:
    """Per-slot decode state on the device (``S`` slots, responses of at most ``N`` tokens)."""

    def __init__(self, slots: int, max_new: int, max_length: int, device: torch.device) -> None:
        def longs(*shape: int) -> torch.Tensor:
            return torch.zeros(shape, dtype=torch.long, device=device)

        self.last_S = longs(slots)  # the token the next step feeds
        self.pos_S = longs(slots)  # where that token goes: keys 0..pos-1 are cached
        self.count_S = longs(slots)  # tokens sampled so far (the next draw's index)
        self.seed_S = longs(slots)  # the sample's random stream (int64 bits of its seed)
        self.live_S = torch.zeros(slots, dtype=torch.bool, device=device)  # decoding, not finished
        self.reason_S = torch.zeros(slots, dtype=torch.int8, device=device)  # RUNNING, STOP or LENGTH
        self.tokens_SN = longs(slots, max_new + 1)  # sampled tokens; column N takes those of finished rows
        self.logprobs_SN = torch.zeros((slots, max_new + 1), dtype=torch.float32, device=device)
        self.rows_S = torch.arange(slots, device=device)
        self.columns_L = torch.arange(max_length, device=device)
        self.slots, self.max_new, self.max_length = slots, max_new, max_length
        self.stop_ids: dict[tuple[int, ...], torch.Tensor] = {}  # the stop-id tensor of each settings
        self.zeros: dict[torch.dtype, torch.Tensor] = {}  # a 0-d zero of each dtype (the masks' visible entries)

    def zero(self, dtype: torch.dtype) -> torch.Tensor:
        z = self.zeros.get(dtype)
        if z is None:
            z = self.zeros[dtype] = torch.zeros((), dtype=dtype, device=self.rows_S.device)
        return z

    def stop_tensor(self, settings: StepSettings) -> torch.Tensor:
        ids = self.stop_ids.get(settings.stop_ids)
        if ids is None:
            ids = torch.tensor(settings.stop_ids, dtype=torch.long, device=self.rows_S.device)
            self.stop_ids[settings.stop_ids] = ids
        return ids

    def admit(self, rows: list[int], positions: list[int], seeds: list[int]) -> None:
        """Slots ``rows`` start new samples whose prompts fill ``positions`` cache columns."""
        dev = self.rows_S.device
        index = torch.tensor(rows, device=dev)
        self.pos_S[index] = torch.tensor(positions, device=dev)
        self.seed_S[index] = torch.tensor(seeds, dtype=torch.long, device=dev)
        self.count_S[index] = 0
        self.live_S[index] = True
        self.reason_S[index] = RUNNING

    def move(self, src: list[int], dst: list[int]) -> None:
        """Rows ``src`` take the place of rows ``dst`` (compaction)."""
        dev = self.rows_S.device
        s, d = torch.tensor(src, device=dev), torch.tensor(dst, device=dev)
        for t in (self.last_S, self.pos_S, self.count_S, self.seed_S, self.live_S, self.reason_S):
            t[d] = t[s]
        for t in (self.tokens_SN, self.logprobs_SN):
            t[d] = t[s]
        self.live_S[s] = False  # the rows left behind idle: a graph's bucket may still run them

    def fits(self, slots: int, max_new: int, max_length: int) -> bool:
        return slots <= self.slots and max_new <= self.max_new and max_length <= self.max_length


def sample_into(
    state: SlotState,
    rows: int | torch.Tensor,
    logits_BV: torch.Tensor,
    settings: StepSettings,
    stop_ids: torch.Tensor,
) -> None:
    """Draw one token for each slot of ``rows`` from its logits and record it on the device.

    ``rows``: the slots ``0..rows-1`` (a decode step: the state is read and written through
    views, in place) or a tensor of slot indices (admission: gathered, recorded, written back).
    A live slot's token and logprob go to column ``count`` of its row, its count grows, and it
    finishes on a stop token or at the cap; a finished slot's draw goes to the trash column and
    changes nothing it reports. Draw ``i`` of a sample uses ``uniforms(seed, i)``: its tokens
    depend on its seed, never on its batch-mates.
    """
    names = ("live_S", "count_S", "seed_S", "reason_S", "last_S", "tokens_SN", "logprobs_SN")
    if isinstance(rows, int):
        views = [getattr(state, n)[:rows] for n in names]
    else:
        views = [getattr(state, n)[rows] for n in names]
    live_B, count_B, seed_B, reason_B, last_B, tokens_BN, logprobs_BN = views
    if settings.greedy:
        token_B, logprob_B = greedy_tokens(logits_BV)
    else:
        token_B, logprob_B = sample_tokens(
            logits_BV,
            uniforms(seed_B, count_B),
            temperature=settings.temperature,
            top_k=settings.top_k,
            top_p=settings.top_p,
        )
    column_B1 = torch.where(live_B, count_B, state.max_new)[:, None]
    tokens_BN.scatter_(1, column_B1, token_B[:, None])
    logprobs_BN.scatter_(1, column_B1, logprob_B[:, None].float())
    count_B.add_(live_B)
    stopped_B = live_B & (token_B[:, None] == stop_ids).any(dim=1)
    capped_B = live_B & (count_B >= settings.max_new)
    reason_B.masked_fill_(capped_B, LENGTH).masked_fill_(stopped_B, STOP)  # a stop token at the cap is a stop
    live_B.logical_and_(reason_B == RUNNING)
    # Every row feeds its draw next: a finished row's input changes nothing it reports (its
    # draws go to the trash column, its position stays, its cached keys end before it).
    last_B.copy_(token_B)
    if not isinstance(rows, int):
        for name, view in zip(names, views):
            getattr(state, name)[rows] = view


def decode_step(
    model: PreTrainedModel,
    cache: SlotCache,
    state: SlotState,
    rows: int,
    key_length: int,
    settings: StepSettings,
    stop_ids: torch.Tensor,
) -> None:
    """One forward over slots ``0..rows-1`` (keys ``0..key_length-1``) and one token each, all on the device.

    The forward is :mod:`.lean_forward`'s for the model families it knows (same logits, fewer
    operations), else the model's own through the slot attention.
    """
    pos_B = state.pos_S[:rows]
    cache.prepare_step(pos_B, key_length)
    visible_BL = state.columns_L[:key_length] <= pos_B[:, None]
    dtype = model.dtype
    mask_B11L = torch.where(visible_BL, state.zero(dtype), torch.finfo(dtype).min)[:, None, None, :]
    lean = lean_forward(model)
    if lean is not None:
        logits_BV = lean(state.last_S[:rows], pos_B, mask_B11L, cache)
    else:
        logits_BV = model(
            input_ids=state.last_S[:rows, None],
            position_ids=pos_B[:, None],
            attention_mask=mask_B11L,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
    pos_B.add_(state.live_S[:rows])  # the fed token is cached now; a finished row stays put
    sample_into(state, rows, logits_BV, settings, stop_ids)


class StepGraphs:
    """Decode steps replayed as CUDA graphs, one per shape and settings, captured on first use.

    The first step of a new key runs eagerly on a side stream (it is a real step, and it warms
    cuBLAS and the allocator as capture requires), then the same step is captured -- capture
    records kernels without running them -- and every later step of that key replays it.
    Graphs read the weights, the cache and the slot state at fixed addresses: the owner drops
    them (:meth:`clear`) when any of those moves; weights updated in place keep them.

    Capture is safe beside a trainer in another thread: it holds :data:`DEVICE_TURN` (a trainer
    on the same GPU holds it through each step) and captures in ``thread_local`` mode (another
    thread's allocator calls do not invalidate it). A capture that fails ends the capture and
    leaves the thread on its own stream, drops the graphs' memory pool, and turns graphs off for
    this engine with one warning that names the step's own error; steps then run eagerly.
    """

    def __init__(self) -> None:
        self.graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self.pool = None  # one memory pool shared by every graph (they never run at once)
        self.failed: str | None = None  # why capture was turned off
        self.captures = 0  # graphs captured so far (a kept workspace's graphs are not captured again)

    def run(self, key: tuple, step: Callable[[], None]) -> None:
        graph = self.graphs.get(key)
        if graph is not None:
            graph.replay()
            return
        if self.failed is not None:
            step()
            return
        with DEVICE_TURN:
            error = self._capture(key, step)
        if error is not None:
            self.failed = f"{type(error).__name__}: {error}".splitlines()[0]
            self.clear()
            warnings.warn(f"rollout engine: CUDA graph capture failed, decoding eagerly ({self.failed})", stacklevel=2)

    def _capture(self, key: tuple, step: Callable[[], None]) -> BaseException | None:
        """Run ``step`` once for real, then capture it under ``key``; the error that stopped the capture, if any.

        The error reported is the step's own (an operation a graph cannot hold) when it raised,
        else ``capture_end``'s (the capture was invalidated). Either way the capture has ended
        and the current stream is the caller's again when this returns.
        """
        caller = torch.cuda.current_stream()
        side = torch.cuda.Stream()
        side.wait_stream(caller)
        with torch.cuda.stream(side):
            step()
        caller.wait_stream(side)
        torch.cuda.synchronize()  # nothing of the real step pending when the capture starts
        graph = torch.cuda.CUDAGraph()
        if self.pool is None:
            self.pool = torch.cuda.graph_pool_handle()
        error: BaseException | None = None
        with torch.cuda.stream(side):
            try:
                graph.capture_begin(pool=self.pool, capture_error_mode="thread_local")
            except RuntimeError as exc:
                return exc
            try:
                step()
            except Exception as exc:  # noqa: BLE001 -- reported by the caller (graphs off), never swallowed
                error = exc
            finally:
                try:
                    graph.capture_end()
                except RuntimeError as exc:
                    error = error or exc
        caller.wait_stream(side)
        if error is None:
            self.graphs[key] = graph
            self.captures += 1
        return error

    def clear(self) -> None:
        self.graphs.clear()
        self.pool = None
