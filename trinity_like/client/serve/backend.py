"""What ``trinity-like serve`` does for each request of the SDK, on the in-process client.

Every training and sampling call lands on the very objects ``trinity_like.client`` hands
to in-process users -- one :class:`~trinity_like.client.service.ServiceClient`, its
:class:`TrainingClient` per model, :class:`SamplingClient` per sampler -- so the two doors
share engines, losses and request queues. What the server adds is the SDK's bookkeeping:

- **futures**: a mutating call is answered at once with a request id; its result is
  fetched later (``retrieve``). One training client's requests run in arrival order, and the
  SDK sends them one after another in ``seq_id`` order, so arrival order is its order.
- **idempotency**: a request the SDK sends again after a lost answer (same model or sampler
  and ``seq_id``) gets the first one's request id: it is never applied twice. A request
  without a ``seq_id`` (raw HTTP; the SDK always numbers its own) is always a new one.
- **limits at the door**: what the engines could not survive, or what would hold them for
  hours, is refused before it is queued (HTTP 400 naming the field and the limit): data
  that do not fit the model (:func:`~trinity_like.client.data.check_data`, the in-process
  client's own check), more than ``max_batch_datums`` datums or ``max_num_samples``
  samples, a prompt plus ``max_tokens`` beyond the model's context, a bad checkpoint name.
- **a bounded queue**: at most ``max_pending`` requests wait or run; beyond that a request
  is refused with :class:`Busy` (HTTP 429), which the SDK retries after a back-off.
- **bounded memory**: at most ``max_models`` training clients (more: HTTP 400) and the ``max_samplers``
  most recently used sampling sessions (older ones let go: HTTP 404); an RL loop makes one per step.

Example::

    backend = Backend(ServeParams(data_dir=Path("serve-data")))
    session = backend.create_session()
    fut = backend.create_model(types.CreateModelRequest(session_id=session, model_seq_id=0,
                                                        base_model="smollm2-135m-instruct"))
"""

from __future__ import annotations

import json
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from tinker import types

from trinity_like.client.data import ModelLimits, check_data, prompt_ids
from trinity_like.client.sampling import SamplingClient, engine_sampling
from trinity_like.client.serve.config import ServeParams
from trinity_like.client.serve.paths import PathError, Store, check_name
from trinity_like.client.service import ServiceClient, model_entry
from trinity_like.client.training import TrainingClient
from trinity_like.errors import TrinityError
from trinity_like.models.resolve import BUILTIN_MODELS, resolve_model_path

# Errors of the caller's making: reported with the SDK's "user" category (others: "server").
USER_ERRORS = (
    TrinityError,
    ValueError,
    TypeError,
    LookupError,
    FileNotFoundError,
    FileExistsError,
    NotImplementedError,
)


class NotFound(TrinityError, LookupError):
    """An id (session, model, sampler, request) this server does not know: HTTP 404."""


class Busy(TrinityError):
    """The queue is full or a model is still being created: HTTP 429, retried by the SDK."""


class Closing(TrinityError):
    """The server is shutting down and takes no new work: HTTP 503."""


def then(source: Future, fn: Callable[[Any], Any]) -> Future:
    """A future of ``fn(source's result)``; ``source``'s exception passes through unchanged."""
    out: Future = Future()

    def done(f: Future) -> None:
        if f.cancelled():
            out.cancel()
            return
        exc = f.exception()
        if exc is not None:
            out.set_exception(exc)
            return
        try:
            out.set_result(fn(f.result()))
        except BaseException as err:  # noqa: BLE001 -- handed to the request's future, never swallowed
            out.set_exception(err)

    source.add_done_callback(done)
    return out


@dataclass
class Sampler:
    client: SamplingClient
    base_model: str
    model_path: str | None  # the tinker:// path it was made from; None for a base model or snapshot
    limits: ModelLimits  # what its prompts must fit (vocabulary, context)


class Backend:
    """The server's state: sessions, training clients, samplers and futures; see the module doc."""

    def __init__(self, params: ServeParams) -> None:
        self.params = params
        self.store = Store(params.data_dir)
        self.service = ServiceClient(
            log_dir=self.store.runs_dir,
            train_engine=params.train_engine,
            micro_batch_size=params.micro_batch_size,
            dtype=params.dtype,
        )
        self._creating = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trinity-like-serve-create")
        self._lock = threading.RLock()  # make() may register a model while a request registers
        self._sessions: set[str] = set()
        self._models: dict[str, Future] = {}  # model id -> Future[TrainingClient]
        self._samplers: OrderedDict[str, Sampler] = OrderedDict()  # least recently used first
        self._released: OrderedDict[str, None] = OrderedDict()  # sampler ids let go (for the 404's words)
        self._futures: OrderedDict[str, Future] = OrderedDict()
        self._seen: dict[tuple[str, int], str] = {}  # (model or sampler id, seq_id) -> request id
        self._pending = 0
        self._closing = False

    # -- errors -------------------------------------------------------------------------------
    def hide_paths(self, message: str) -> str:
        """``message`` with the data directory's location replaced by ``<data-dir>``: a caller
        learns nothing of the server's file system from an error."""
        for folder in sorted({str(self.store.data_dir.resolve()), str(self.store.data_dir)}, key=len, reverse=True):
            message = message.replace(folder, "<data-dir>")
        return message

    def error_body(self, exc: BaseException) -> dict[str, str]:
        """A failed request as the SDK's ``RequestFailedResponse``, on one line."""
        user = isinstance(exc, USER_ERRORS)
        category = types.RequestErrorCategory.User if user else types.RequestErrorCategory.Server
        return {"error": self.hide_paths(" ".join(f"{type(exc).__name__}: {exc}".split())), "category": category.value}

    # -- sessions and capabilities ----------------------------------------------------------
    def create_session(self) -> str:
        session = uuid.uuid4().hex[:12]
        with self._lock:
            self._sessions.add(session)
        return session

    def check_session(self, session: str) -> None:
        if session not in self._sessions:
            raise NotFound(f"unknown session {session!r} (sessions end when the server restarts)")

    def capabilities(self) -> types.GetServerCapabilitiesResponse:
        names = sorted(BUILTIN_MODELS) + [m for m in self.params.models if m not in BUILTIN_MODELS]
        return types.GetServerCapabilitiesResponse(
            supported_models=[model_entry(name, resolve_model_path(name)) for name in names]
        )

    # -- futures ----------------------------------------------------------------------------
    def _register(self, key: tuple[str, int] | None, make: Callable[[], Future]) -> types.UntypedAPIFuture:
        """Run ``make()`` unless ``key`` (id, seq_id) was seen; the request id of its future."""
        with self._lock:
            if key is not None and key in self._seen:
                return types.UntypedAPIFuture(request_id=self._seen[key], model_id=key[0])
            if self._closing:
                raise Closing("the server is shutting down; it takes no new requests")
            if self._pending >= self.params.max_pending:
                raise Busy(f"{self._pending} requests are queued (max_pending={self.params.max_pending}); retry later")
            future = make()
            request_id = uuid.uuid4().hex
            self._pending += 1
            self._futures[request_id] = future
            if key is not None:
                self._seen[key] = request_id
            self._forget_old()
        future.add_done_callback(self._finished)
        return types.UntypedAPIFuture(request_id=request_id, model_id=key[0] if key else None)

    def _finished(self, _: Future) -> None:
        with self._lock:
            self._pending -= 1

    def _forget_old(self) -> None:
        """Keep at most ``keep_results`` finished results (oldest dropped first)."""
        excess = len(self._futures) - self.params.keep_results
        for request_id in list(self._futures)[: max(excess, 0)]:
            if self._futures[request_id].done():
                del self._futures[request_id]

    def future(self, request_id: str) -> Future:
        with self._lock:
            future = self._futures.get(request_id)
        if future is None:
            raise NotFound(
                f"unknown request {request_id!r} (results are kept for the last "
                f"{self.params.keep_results} requests of this server's life)"
            )
        return future

    # -- training clients -------------------------------------------------------------------
    def _new_model(
        self,
        session: str,
        seq: int,
        create: Callable[[str], TrainingClient],
        respond: Callable[[str, TrainingClient], Any],
    ) -> types.UntypedAPIFuture:
        self.check_session(session)
        model_id = check_name(f"{session}:train:{seq}", "model id")

        def make() -> Future:  # under the lock, after a retried request got its first answer
            held = sum(1 for f in self._models.values() if not (f.done() and f.exception() is not None))
            if held >= self.params.max_models:
                limit = f"its limit (--max-models {self.params.max_models}): start it with a larger one, or use those"
                raise ValueError(f"this server holds {held} training models, {limit}")
            created = self._creating.submit(create, model_id)
            self._models[model_id] = created
            return then(created, lambda client: respond(model_id, client))

        return self._register((model_id, -1), make)

    def create_model(self, req: types.CreateModelRequest) -> types.UntypedAPIFuture:
        lora = req.lora_config or types.LoraConfig(rank=0)
        if req.optimizer_config.type != "adamw":
            raise ValueError(f"optimizer {req.optimizer_config.type!r}: only AdamW is available here")
        if lora.seed is not None and not 0 <= lora.seed < 2**63:
            raise ValueError(f"lora_config.seed {lora.seed}: must be in [0, 2**63)")

        def create(model_id: str) -> TrainingClient:
            hidden = json.loads((resolve_model_path(req.base_model) / "config.json").read_text()).get("hidden_size")
            if isinstance(hidden, int) and lora.rank > hidden:  # A and B would outgrow the weights they adapt
                raise ValueError(f"lora_config.rank {lora.rank}: at most the model's hidden size, {hidden}")
            client = self.service.create_lora_training_client(
                req.base_model,
                rank=lora.rank,
                seed=lora.seed,
                train_mlp=lora.train_mlp,
                train_attn=lora.train_attn,
                train_unembed=lora.train_unembed,
                run_name=model_id,
            )
            self.store.write_run(model_id, req.base_model, lora.rank or None)
            return client

        return self._new_model(
            req.session_id, req.model_seq_id, create, lambda model_id, _: types.CreateModelResponse(model_id=model_id)
        )

    def training(self, model_id: str) -> TrainingClient:
        with self._lock:
            created = self._models.get(model_id)
        if created is None:
            raise NotFound(f"unknown model {model_id!r}")
        if not created.done():
            raise Busy(f"model {model_id!r} is still being created")
        if created.exception() is not None:
            raise ValueError(f"model {model_id!r} failed to be created: {created.exception()}")
        return created.result()

    def get_info(self, model_id: str) -> types.GetInfoResponse:
        client = self.training(model_id)
        info = client.get_info()
        folder = str(resolve_model_path(client.base_model).resolve())
        return info.model_copy(
            update={"model_id": model_id, "model_data": info.model_data.model_copy(update={"tokenizer_id": folder})}
        )  # a local folder: the SDK's get_tokenizer loads it offline

    def forward_backward(self, req: types.ForwardBackwardRequest, forward_only: bool) -> types.UntypedAPIFuture:
        client = self.training(req.model_id)
        run = client.forward if forward_only else client.forward_backward
        args = req.forward_backward_input
        if len(args.data) > self.params.max_batch_datums:
            raise ValueError(
                f"forward_backward of {len(args.data)} datums: at most {self.params.max_batch_datums} per request "
                "(--max-batch-datums; the SDK splits a larger batch by itself)"
            )
        check_data(args.data, client.limits)
        return self._register(
            _key(req.model_id, req.seq_id), lambda: run(args.data, args.loss_fn, args.loss_fn_config).future()
        )

    def optim_step(self, req: types.OptimStepRequest) -> types.UntypedAPIFuture:
        client = self.training(req.model_id)
        return self._register(_key(req.model_id, req.seq_id), lambda: client.optim_step(req.optim_params).future())

    def save_state(self, req: types.SaveWeightsRequest) -> types.UntypedAPIFuture:
        client = self.training(req.model_id)
        name = check_name(req.path, "checkpoint name (save_weights' path)")
        return self._register(
            _key(req.model_id, req.seq_id),
            lambda: then(
                client.save_state(name, overwrite=req.overwrite).future(),
                lambda r: types.SaveWeightsResponse(path=self.store.tinker_path(req.model_id, r.path)),
            ),
        )

    def save_for_sampler(self, req: types.SaveWeightsForSamplerRequest) -> types.UntypedAPIFuture:
        client = self.training(req.model_id)
        if req.kind != "snapshot":
            raise ValueError(f"kind {req.kind!r}: only 'snapshot' sampling clients exist here")
        if req.path is not None:
            name = check_name(req.path, "checkpoint name (save_weights_for_sampler's path)")
            return self._register(
                _key(req.model_id, req.seq_id),
                lambda: then(
                    client.save_weights_for_sampler(name).future(),
                    lambda r: types.SaveWeightsForSamplerResponseInternal(
                        path=self.store.tinker_path(req.model_id, r.path)
                    ),
                ),
            )
        if req.sampling_session_seq_id is None:
            raise ValueError("save_weights_for_sampler needs a path (a checkpoint name) or a sampling_session_seq_id")
        session = req.model_id.split(":train:")[0]
        sampler_id = f"{session}:sample:{req.sampling_session_seq_id}"

        def registered(sampler: SamplingClient) -> types.SaveWeightsForSamplerResponseInternal:
            self._hold(sampler_id, Sampler(sampler, client.base_model, None, client.limits))
            return types.SaveWeightsForSamplerResponseInternal(sampling_session_id=sampler_id)

        return self._register(
            _key(req.model_id, req.seq_id), lambda: then(client.snapshot_sampler().future(), registered)
        )

    def load_state(self, req: types.LoadWeightsRequest) -> types.UntypedAPIFuture:
        """Into an existing model (``model_id``), or a new one (``session_id`` + ``model_seq_id``)."""
        folder = self.store.existing(req.path, "weights")
        if req.model_id is not None:
            client = self.training(req.model_id)
            load = client.load_state_with_optimizer if req.optimizer else client.load_state
            return self._register(
                _key(req.model_id, req.seq_id),
                lambda: then(
                    load(str(folder)).future(),
                    lambda _: types.LoadWeightsResponse(path=req.path, model_id=req.model_id),
                ),
            )
        if req.session_id is None or req.model_seq_id is None:
            raise ValueError("load_weights needs model_id, or session_id and model_seq_id for a new model")
        if req.optimizer_config is not None and req.optimizer_config.type != "adamw":
            raise ValueError(f"optimizer {req.optimizer_config.type!r}: only AdamW is available here")
        source = self.store.read_run(req.path[len("tinker://") :].split("/")[0])

        def create(model_id: str) -> TrainingClient:
            make = (
                self.service.create_training_client_from_state_with_optimizer
                if req.optimizer
                else self.service.create_training_client_from_state
            )
            client = make(str(folder), base_model=req.base_model, run_name=model_id)
            self.store.write_run(model_id, req.base_model or source["base_model"], source["lora_rank"])
            return client

        return self._new_model(
            req.session_id,
            req.model_seq_id,
            create,
            lambda model_id, _: types.LoadWeightsResponse(path=req.path, model_id=model_id),
        )

    # -- samplers ---------------------------------------------------------------------------
    def create_sampler(self, req: types.CreateSamplingSessionRequest) -> str:
        self.check_session(req.session_id)
        sampler_id = f"{req.session_id}:sample:{req.sampling_session_seq_id}"
        if req.model_path is not None:
            folder = self.store.existing(req.model_path, "sampler_weights")
            base = req.base_model or self.store.read_run(req.model_path[len("tinker://") :].split("/")[0])["base_model"]
            client = SamplingClient(base, model_path=folder)
            sampler = Sampler(client, base, req.model_path, ModelLimits.of(resolve_model_path(base)))
        elif req.base_model is not None:
            client = SamplingClient(req.base_model)
            sampler = Sampler(client, req.base_model, None, ModelLimits.of(resolve_model_path(req.base_model)))
        else:
            raise ValueError("create_sampling_session needs model_path or base_model")
        self._hold(sampler_id, sampler)
        return sampler_id

    def _hold(self, sampler_id: str, sampler: Sampler) -> None:
        """Keep ``sampler``; beyond ``max_samplers`` the least recently used one is let go."""
        with self._lock:
            self._samplers[sampler_id] = sampler
            self._samplers.move_to_end(sampler_id)
            self._released.pop(sampler_id, None)
            while len(self._samplers) > self.params.max_samplers:
                old, _ = self._samplers.popitem(last=False)  # a request already queued on it still runs
                self._released[old] = None
            while len(self._released) > self.params.keep_results:
                self._released.popitem(last=False)

    def sampler(self, sampler_id: str | None) -> Sampler:
        key = sampler_id or ""
        with self._lock:
            sampler, released = self._samplers.get(key), key in self._released
            if sampler is not None:
                self._samplers.move_to_end(key)
        if sampler is None:
            let_go = f"was let go: this server keeps the {self.params.max_samplers} most recently used (--max-samplers)"
            raise NotFound(
                f"sampling session {sampler_id!r} {let_go}" if released else f"unknown sampling session {sampler_id!r}"
            )
        return sampler

    def sample(self, req: types.SampleRequest) -> types.UntypedAPIFuture:
        sampler = self.sampler(req.sampling_session_id)
        target = None if req.target_prompt_logprobs is None else req.target_prompt_logprobs
        if not 1 <= req.num_samples <= self.params.max_num_samples:
            raise ValueError(
                f"num_samples {req.num_samples}: must be between 1 and {self.params.max_num_samples} "
                "(--max-num-samples)"
            )
        ids = prompt_ids(req.prompt, sampler.limits.vocab_size, sampler.limits.context)
        engine_sampling(req.sampling_params, req.num_samples, len(ids), sampler.limits.context, ())  # its checks

        def make() -> Future:
            return sampler.client.sample(
                req.prompt,
                req.num_samples,
                req.sampling_params,
                include_prompt_logprobs=bool(req.prompt_logprobs),
                topk_prompt_logprobs=req.topk_prompt_logprobs,
                topk_sample_logprobs=req.topk_sample_logprobs,
                target_prompt_logprobs=target,
                prompt_alt_tokens_k=req.prompt_alt_tokens_k,
                prompt_logprobs_last_n=req.prompt_logprobs_last_n,
            ).future()

        key = None if req.seq_id is None else (f"{req.sampling_session_id}", req.seq_id)
        answer = self._register(key, make)
        return answer.model_copy(
            update={"model_id": None, "sample_sequence_ids": [uuid.uuid4().hex for _ in range(req.num_samples)]}
        )

    # -- shutdown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Refuse new work, then let every queued training request finish (saves included)."""
        with self._lock:
            self._closing = True
        self._creating.shutdown(wait=True)
        self.service.close()


def _key(model_id: str, seq_id: int | None) -> tuple[str, int] | None:
    """What makes a request a resend of an earlier one: its model and ``seq_id``; none without a ``seq_id``."""
    return None if seq_id is None else (model_id, seq_id)


__all__ = ["Backend", "Busy", "Closing", "NotFound", "PathError", "then"]
