"""A Tinker-compatible ``SamplingClient`` that samples in this process with our rollout engine.

Code written for the ``tinker`` SDK ports by changing the import: the methods, their
arguments and defaults, and the ``tinker.types`` objects in and out are the SDK's::

    client = SamplingClient("tiny-random")
    prompt = types.ModelInput.from_ints(client.get_tokenizer().encode("What is 2 + 3?"))
    params = types.SamplingParams(max_tokens=16, seed=1)
    result = client.sample(prompt, num_samples=4, sampling_params=params).result()
    result.sequences[0].tokens, result.sequences[0].logprobs, result.sequences[0].stop_reason
    client.compute_logprobs(prompt).result()  # [None, logprob of token 1 given token 0, ...]

What a sampled sequence holds, where Tinker's documentation leaves a choice:

- ``tokens``: the response. A stop *token* is kept as its last token (renderers'
  ``parse_response`` expects it); a stop *string* keeps every token up to and including
  the one that completed the string, so the decoded text may run a little past it.
- ``logprobs``: per token, under the distribution sampled from (temperature, top-k and
  top-p applied, renormalised): the behaviour policy an importance ratio needs.
  Temperature 0 is greedy and reports the model's own logprob at temperature 1.
- ``stop``: None stops at the model's EOS; ``[]`` never stops before ``max_tokens``;
  strings or token ids stop *as well as* EOS (as in vLLM: ``[]`` alone turns EOS off).
- ``max_tokens`` is required: None would size every sample's cache to the whole context.
- ``seed`` None draws a fresh seed per call; ``top_k`` -1 (or 0) keeps every token.
- Prompt logprobs (``include_prompt_logprobs``, ``compute_logprobs``) are at temperature 1.

The model and engine (``native``; ``device="auto"``: a GPU when torch sees one, bf16 there) are
heavy, so one per base folder and device is built lazily and shared by every client of this
process; before a request runs, the engine is given the weights of the client that made it (a
full, strict copy when they differ). Requests run one at a time on one queue.
"""

from __future__ import annotations

import math
import os
import secrets
import tempfile
import threading
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from trinity_like.client.data import prompt_ids
from trinity_like.client.futures import Job, RequestBatcher, sampler_weights_path
from trinity_like.client.weight_files import check_shapes, folder_id, read_weights, write_weights
from trinity_like.config.schema import ExplorerConfig, field_default
from trinity_like.explorer.engine_contract import Request, RolloutEngine, Sample, sample_seed
from trinity_like.explorer.engine_contract import SamplingParams as EngineSampling
from trinity_like.explorer.engines import build_rollout_engine
from trinity_like.models.device import resolve_device
from trinity_like.models.resolve import load_tokenizer, resolve_model_path
from trinity_like.models.weight_digest import saved_digest, weights_digest

# Below it, temperature (but 0, greedy) overflows logits / temperature in float32, and top_p rounds to 0 in
# float32 and masks every token: both would sample past the vocabulary. For the most likely token: 0 or top_k=1.
MIN_TEMPERATURE = MIN_TOP_P = 1e-5


@dataclass
class _Shared:
    """One process's engine for one base folder and device."""

    engine: RolloutEngine
    loaded: str | None  # weights id the model holds; None after a load that failed half-way


_LOCK = threading.Lock()  # guards _SHARED (held while a model loads)
_SHARED: dict[tuple[str, str], _Shared] = {}
_QUEUE_LOCK = threading.Lock()  # its own lock: submitting never waits for a model to load
_QUEUE: RequestBatcher | None = None


def _after_fork() -> None:
    """A forked child owns neither the parent's worker thread, nor its locks, nor a half-done load."""
    global _LOCK, _QUEUE_LOCK, _QUEUE
    _LOCK, _QUEUE_LOCK, _QUEUE = threading.Lock(), threading.Lock(), None
    _SHARED.clear()


os.register_at_fork(after_in_child=_after_fork)


def _queue() -> RequestBatcher:
    """The one queue every sampling request of this process runs on."""
    global _QUEUE
    with _QUEUE_LOCK:
        if _QUEUE is None:
            _QUEUE = RequestBatcher()
        return _QUEUE


def stop_conditions(stop: str | Any | None, eos_ids: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[str, ...]]:
    """Tinker's ``SamplingParams.stop`` as ``(stop token ids, stop strings)`` for the engine.

    >>> stop_conditions(None, (2,)), stop_conditions([], (2,)), stop_conditions(["\\n\\n"], (2,))
    (((2,), ()), ((), ()), ((2,), ('\\n\\n',)))
    """
    if stop is None:
        return eos_ids, ()
    items = [stop] if isinstance(stop, str) else list(stop)
    if all(isinstance(s, str) for s in items):
        if "" in items:
            raise ValueError("sampling_params.stop holds an empty string, which would stop at once")
        return (eos_ids if items else ()), tuple(items)
    if all(isinstance(s, int) and not isinstance(s, bool) for s in items):
        return tuple(sorted({*eos_ids, *items})), ()
    raise ValueError(f"sampling_params.stop must be strings or token ids, not a mix: {items!r}")


def engine_sampling(
    params: types.SamplingParams, num_samples: int, prompt_length: int, context: int | None, eos_ids: tuple[int, ...]
) -> EngineSampling:
    """Tinker's ``SamplingParams`` as the engine's, with one-line errors for values it rejects."""
    if params.max_tokens is None:
        raise ValueError("sampling_params.max_tokens is required (None would reserve the whole context per sample)")
    if params.max_tokens < 1:
        raise ValueError(f"sampling_params.max_tokens must be >= 1, got {params.max_tokens}")
    if context is not None and prompt_length + params.max_tokens > context:
        raise ValueError(
            f"prompt ({prompt_length} tokens) + max_tokens ({params.max_tokens}) "
            f"exceed the model's context of {context}"
        )
    if not (params.temperature == 0 or MIN_TEMPERATURE <= params.temperature < math.inf):
        bounds = f"0 is greedy; others finite and >= {MIN_TEMPERATURE}"
        raise ValueError(f"sampling_params.temperature must be >= 0 ({bounds}), got {params.temperature}")
    if params.top_k < -1:
        raise ValueError(f"sampling_params.top_k must be -1 (all tokens) or >= 1, got {params.top_k}")
    if not MIN_TOP_P <= params.top_p <= 1:
        raise ValueError(f"sampling_params.top_p must be in (0, 1] and >= {MIN_TOP_P}, got {params.top_p}")
    stop_ids, stop_strings = stop_conditions(params.stop, eos_ids)
    greedy = params.temperature == 0
    return EngineSampling(
        n=num_samples,
        max_new_tokens=params.max_tokens,
        temperature=1.0 if greedy else params.temperature,
        top_k=max(params.top_k, 0),
        top_p=params.top_p,
        greedy=greedy,
        seed=secrets.randbits(63) if params.seed is None else params.seed,
        stop_token_ids=stop_ids,
        stop_strings=stop_strings,
    )


def prompt_logprobs(model: PreTrainedModel, ids: list[int], last_n: int | None = None) -> np.ndarray:
    """float32 ``[P]``: log p(token i | tokens < i) at temperature 1, one forward; NaN at 0 and before ``last_n``."""
    if last_n is not None and not 1 <= last_n <= len(ids) - 1:
        raise ValueError(f"prompt_logprobs_last_n must be between 1 and len(prompt) - 1 = {len(ids) - 1}, got {last_n}")
    device = next(model.parameters()).device
    logprob_P = torch.full((len(ids),), float("nan"))
    with torch.inference_mode():
        logits_PV = model(input_ids=torch.tensor([ids], device=device)).logits[0, :-1].float()
        next_P = torch.tensor(ids[1:], dtype=torch.long, device=device)
        logprob_P[1:] = (logits_PV.gather(1, next_P[:, None])[:, 0] - logits_PV.logsumexp(-1)).cpu()
    if last_n is not None:
        logprob_P[: len(ids) - last_n] = float("nan")
    return logprob_P.numpy().astype(np.float32)


def check_sample_options(include_prompt_logprobs: bool, prompt_logprobs_last_n: int | None, **unsupported: Any) -> None:
    """``sample``'s options, checked at call time in both samplers (in-process and on Ray): the SDK's
    options this sampler does not implement fail by name, and ``prompt_logprobs_last_n`` needs
    ``include_prompt_logprobs``."""
    for name, value in unsupported.items():
        if value:
            raise ValueError(f"{name}={value!r} is not supported by trinity_like's SamplingClient (leave it unset)")
    if prompt_logprobs_last_n is not None and not include_prompt_logprobs:
        raise ValueError("prompt_logprobs_last_n applies to prompt logprobs; set include_prompt_logprobs")


class SamplingClient:
    """Samples from ``base_model``'s architecture with the weights of ``model_path``, ``weights``
    or the base itself, exactly like ``tinker.SamplingClient``; see the module docstring.

    ``weights`` (a full state dict) is held by reference, not copied: hand over a snapshot.
    Pickling writes in-memory weights once to a new temporary folder (left in place: the
    unpickled copy may read it after this process ends) and carries only paths.
    """

    def __init__(
        self,
        base_model: str,
        *,
        model_path: str | os.PathLike[str] | None = None,
        weights: Mapping[str, torch.Tensor] | None = None,
        version: int = 0,
        device: str = "auto",
    ) -> None:
        if model_path is not None and weights is not None:
            raise ValueError("give model_path or weights, not both")
        if model_path is not None:
            model_path = sampler_weights_path(model_path, "SamplingClient(model_path=...)")
        self._base_model = str(base_model)
        self._base_folder = resolve_model_path(base_model).resolve()
        self._model_path = None if model_path is None else Path(model_path).expanduser().resolve()
        if self._model_path is not None and not any(self._model_path.glob("*.safetensors")):
            raise ValueError(f"model_path {model_path}: no *.safetensors weights there")
        self._weights = weights
        self._memory_id = f"memory:{uuid.uuid4().hex}"
        self.version = version  # the model version the engine reports while it holds these weights
        self.device = device  # where the shared model runs: "auto" (a GPU when torch sees one), "cpu", "cuda:1", ...
        self._tokenizer: PreTrainedTokenizerBase | None = None
        self._digest: str | None = None  # of the weights the engine holds for this client, once checked

    # -- the SDK's 0.38 transitional future: a sampler handed back is also its own future ----------
    def result(self, timeout: float | None = None) -> SamplingClient:
        """This client (``save_weights_and_get_sampling_client`` returns it; SDK code calls ``.result()``)."""
        return self

    def __await__(self):
        yield from ()
        return self

    @property
    def model_path(self) -> Path | None:
        """The folder the weights come from (set for in-memory weights once pickled); None: the base."""
        return self._model_path

    def save_weights(self, folder: str | os.PathLike[str]) -> Path:
        """Write this client's weights as a Hugging Face folder (safetensors, the base's config
        and tokenizer) that ``SamplingClient(base, model_path=folder)`` samples from."""
        weights = self._weights if self._weights is not None else read_weights(self._model_path or self._base_folder)
        write_weights(weights, self._base_folder, Path(folder))
        return Path(folder)

    # -- pickling: plain data only ---------------------------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        if self._weights is not None and self._model_path is None:
            self._model_path = self.save_weights(tempfile.mkdtemp(prefix="trinity-like-weights-"))
        path = None if self._model_path is None else str(self._model_path)
        return {"base_model": self._base_model, "base_folder": str(self._base_folder), "model_path": path,
                "version": self.version, "device": self.device}  # fmt: skip

    def __setstate__(self, state: dict[str, Any]) -> None:
        self._base_model, self.version, self.device = state["base_model"], state["version"], state["device"]
        self._base_folder = Path(state["base_folder"])
        self._model_path = None if state["model_path"] is None else Path(state["model_path"])
        self._weights, self._memory_id, self._tokenizer = None, f"memory:{uuid.uuid4().hex}", None
        self._digest = None

    # -- the shared engine ---------------------------------------------------------------------
    def _weights_id(self) -> str:
        return self._memory_id if self._weights is not None else folder_id(self._model_path or self._base_folder)

    def _engine(self) -> RolloutEngine:
        """The shared engine of this base and device, holding this client's weights."""
        device = str(resolve_device(self.device, where="SamplingClient(device=...)"))
        key = (str(self._base_folder), device)
        with _LOCK:
            shared = _SHARED.get(key)
            if shared is None:
                engine = build_rollout_engine(field_default(ExplorerConfig, "engine"), self._base_folder, device=device)
                shared = _Shared(engine, folder_id(self._base_folder))
                _SHARED[key] = shared
            wanted = self._weights_id()
            if shared.loaded != wanted:
                shared.loaded = None
                folder = self._model_path or self._base_folder
                weights = self._weights if self._weights is not None else read_weights(folder)
                check_shapes(shared.engine.model, weights)  # type: ignore[attr-defined]  # native: an HF model
                dtype = next(shared.engine.model.parameters()).dtype  # type: ignore[attr-defined]
                saved = saved_digest(folder, dtype) if self._weights is None else None
                expected = saved or weights_digest(weights, dtype=dtype)  # as saved, else as handed over
                shared.engine.update_weights(weights, version=self.version, strict=True)
                found = shared.engine.weights_digest
                if found != expected:  # the engine does not hold what it was given: never sample from it
                    raise ValueError(
                        f"sampler weights v{self.version} ({folder if self._weights is None else 'in memory'}): "
                        f"the engine holds digest {found}, expected {expected}"
                    )
                shared.loaded = wanted
                self._digest = found
            elif self._digest is None:
                self._digest = shared.engine.weights_digest
            return shared.engine

    @property
    def weights_digest(self) -> str:
        """The digest (:mod:`trinity_like.models.weight_digest`) of the weights this client samples
        with, as the engine computed it from its model after loading them, checked against the
        digest of the weights handed over (or saved beside ``model_path``). Loads them if need be."""
        if self._digest is None:
            _queue().submit(None, lambda jobs: [jobs[0].args[0]._engine()], self).result()
        assert self._digest is not None
        return self._digest

    # -- requests (each runs on the process's sampling queue) ----------------------------------
    def run_requests(self, requests: Sequence[Request], sampling: EngineSampling) -> list[list[Sample]]:
        """Our engine's own requests on this client's weights, each with a seed per sample --
        what an env rollout sends (a seed per episode and turn), beside the SDK's ``sample``
        (one seed per request). Blocks until done; runs on the same queue as ``sample``."""
        return _queue().submit(None, SamplingClient._run, self, list(requests), sampling).result()

    @staticmethod
    def _run(jobs: list[Job]) -> list[list[list[Sample]]]:
        client, requests, sampling = jobs[0].args
        return [client._engine().run(requests, sampling)]

    @staticmethod
    def _sample(jobs: list[Job]) -> list[types.SampleResponse]:
        """The sample requests ``jobs`` (one client, one set of settings) in one engine run."""
        client = jobs[0].args[0]
        engine = client._engine()
        model = engine.model  # type: ignore[attr-defined]
        requests, prompt_lps = [], []
        for job in jobs:
            _, prompt, n, params, with_prompt, last_n = job.args
            if n < 1:
                raise ValueError(f"num_samples must be >= 1, got {n}")
            context = getattr(model.config, "max_position_embeddings", None)
            ids = prompt_ids(prompt, model.get_input_embeddings().num_embeddings, context)
            sampling = engine_sampling(params, n, len(ids), context, engine.default_stop_ids)
            # The seeds generate(engine, ...) would give this prompt alone: batching changes no sample.
            requests.append(Request(tuple(ids), tuple(sample_seed(sampling.seed, 0, s) for s in range(n))))
            prompt_lps.append(prompt_logprobs(model, ids, last_n) if with_prompt else None)
        groups = engine.run(requests, sampling)
        return [
            types.SampleResponse(
                sequences=[
                    types.SampledSequence(
                        stop_reason=s.finish_reason,  # type: ignore[arg-type]  # "stop" or "length"
                        sequence_id=uuid.uuid4().hex,
                        tokens_np=np.asarray(s.token_ids, dtype=np.int32),
                        logprobs_np=np.asarray(s.logprobs, dtype=np.float32),
                    )
                    for s in group
                ],
                prompt_logprobs_np=lp,
            )
            for group, lp in zip(groups, prompt_lps, strict=True)
        ]

    def _batch_key(self, params: types.SamplingParams, with_prompt: bool) -> Any:
        """Requests with equal keys may share one engine run: same weights and settings but the seed."""
        if with_prompt:
            return None  # prompt logprobs run a forward of their own
        settings = params.model_dump(exclude={"seed"})
        stop = settings.get("stop")
        settings["stop"] = tuple(stop) if isinstance(stop, list) else stop
        return (self._weights_id(), str(self._base_folder), self.device, tuple(sorted(settings.items())))

    @staticmethod
    def _compute_logprobs(jobs: list[Job]) -> list[list[float | None]]:
        self, prompt, last_n = jobs[0].args
        model = self._engine().model
        context = getattr(model.config, "max_position_embeddings", None)
        ids = prompt_ids(prompt, model.get_input_embeddings().num_embeddings, context)
        logprob_P = prompt_logprobs(model, ids, last_n)
        return [[None if math.isnan(x) else x for x in logprob_P.tolist()]]

    # -- the SDK's methods -----------------------------------------------------------------------
    def sample(
        self,
        prompt: types.ModelInput,
        num_samples: int,
        sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False,
        topk_prompt_logprobs: int = 0,
        topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None,
        prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> AwaitableConcurrentFuture[types.SampleResponse]:
        """``num_samples`` responses to ``prompt``; a future, returned at once (``.result()``, ``await``)."""
        check_sample_options(
            include_prompt_logprobs,
            prompt_logprobs_last_n,
            topk_prompt_logprobs=topk_prompt_logprobs,
            topk_sample_logprobs=topk_sample_logprobs,
            target_prompt_logprobs=target_prompt_logprobs,
            prompt_alt_tokens_k=prompt_alt_tokens_k,
        )
        key = None
        if isinstance(sampling_params, types.SamplingParams):
            if sampling_params.seed is None:  # a fresh seed per request, drawn now
                sampling_params = sampling_params.model_copy(update={"seed": secrets.randbits(63)})
            key = self._batch_key(sampling_params, include_prompt_logprobs)
        return _queue().submit(
            key,
            self._sample,
            self,
            prompt,
            num_samples,
            sampling_params,
            include_prompt_logprobs,
            prompt_logprobs_last_n,
        )

    async def sample_async(
        self, prompt: types.ModelInput, num_samples: int, sampling_params: types.SamplingParams,
        include_prompt_logprobs: bool = False, topk_prompt_logprobs: int = 0, topk_sample_logprobs: int = 0,
        target_prompt_logprobs: types.TensorData | None = None, prompt_alt_tokens_k: int = 0,
        prompt_logprobs_last_n: int | None = None,
    ) -> types.SampleResponse:  # fmt: skip
        """``await sample(...)`` (kept because the SDK keeps it, deprecated)."""
        return await self.sample(
            prompt, num_samples, sampling_params, include_prompt_logprobs, topk_prompt_logprobs,
            topk_sample_logprobs, target_prompt_logprobs, prompt_alt_tokens_k, prompt_logprobs_last_n,
        )  # fmt: skip

    def compute_logprobs(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> AwaitableConcurrentFuture[list[float | None]]:
        """Logprob of each prompt token given the ones before it (one forward, temperature 1); None at 0."""
        return _queue().submit(None, self._compute_logprobs, self, prompt, prompt_logprobs_last_n)

    async def compute_logprobs_async(
        self, prompt: types.ModelInput, prompt_logprobs_last_n: int | None = None
    ) -> list[float | None]:
        """``await compute_logprobs(...)`` (kept because the SDK keeps it, deprecated)."""
        return await self.compute_logprobs(prompt, prompt_logprobs_last_n)

    def get_tokenizer(self) -> PreTrainedTokenizerBase:
        """The base model's tokenizer."""
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(self._base_folder)
        return self._tokenizer

    def get_base_model(self) -> str:
        """The base model reference this client was made with."""
        return self._base_model
