"""The ``ServiceClient``: where training and sampling clients come from, in-process or on Ray.

Tinker's ``ServiceClient`` talks to a remote GPU service; this one builds the same clients
over our engines in this process -- the ``local`` train engine by default, verl's FSDP
workers through Ray with ``train_engine="verl"`` -- on the built-in models or any local
Hugging Face folder. Checkpoints go under ``log_dir`` (``$TRINITY_LIKE_CACHE/client`` or
``~/.cache/trinity_like/client``), one folder per training client: ``run_name`` if given, else
``<base model>-<YYYYmmdd-HHMMSS>`` (:func:`new_run_name`).

Example::

    from trinity_like.client import ServiceClient
    with ServiceClient() as service:
        print([m.model_name for m in service.get_server_capabilities().supported_models])
        training = service.create_lora_training_client("smollm2-135m-instruct", rank=16, seed=0)
        sampler = service.create_sampling_client(base_model="smollm2-135m-instruct")

``backend="ray"`` gives the same clients over Ray actors -- a learner and a pool of
samplers in one placement group (:mod:`trinity_like.client.ray`)::

    from trinity_like.client.ray import RayClientConfig
    service = ServiceClient(backend="ray", ray=RayClientConfig.from_dict({"samplers": {"count": 2, "CPU": 1}}))
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import re
import secrets
import time
from pathlib import Path
from typing import Any

from tinker import types

from trinity_like.client.futures import checkpoint_path, sampler_weights_path
from trinity_like.client.sampling import SamplingClient
from trinity_like.client.training import TrainingClient
from trinity_like.models.device import resolve_device
from trinity_like.models.resolve import BUILTIN_MODELS, CACHE_ENV, load_tokenizer, resolve_model_path
from trinity_like.plugins import load_plugins
from trinity_like.registry import UnknownNameError
from trinity_like.trainer.engines import train_engine_traits
from trinity_like.trainer.lora import LoraParams, read_base_note
from trinity_like.trainer.params import ModelParams, OptimParams

BACKENDS = ("local", "ray")  # where the clients run: this process, or Ray actors


def client_dir() -> Path:
    """Default root of the clients' checkpoints."""
    root = os.environ.get(CACHE_ENV)
    return (Path(root).expanduser() if root else Path.home() / ".cache" / "trinity_like") / "client"


def new_run_name(log_dir: Path, base_model: str) -> str:
    """``<base model>-<YYYYmmdd-HHMMSS>``, the local time the client was made (``-2``, ``-3``, ...
    when that folder exists), claimed by creating ``log_dir/<name>``: unique across processes and
    sorted by creation, so ``ls <log_dir>`` finds a run again by when and on what it ran."""
    stem = f"{re.sub(r'[^A-Za-z0-9_.-]+', '_', Path(base_model).name)}-{time.strftime('%Y%m%d-%H%M%S')}"
    log_dir.mkdir(parents=True, exist_ok=True)
    for n in itertools.count(1):
        name = stem if n == 1 else f"{stem}-{n}"
        with contextlib.suppress(FileExistsError):
            (log_dir / name).mkdir()
            return name


def model_entry(name: str, folder: Path) -> types.SupportedModel:
    config = json.loads((folder / "config.json").read_text())
    return types.SupportedModel(
        model_name=name, max_context_length=config.get("max_position_embeddings"), trainable=True, sampleable=True
    )


class ServiceClient:
    """Creates :class:`TrainingClient` and :class:`SamplingClient` objects over local engines.

    ``train_engine``: a ``TRAIN_ENGINE`` name: "local" (in-process torch), "verl" (``trainer_workers``
    FSDP workers through Ray) or a plugin's; ``micro_batch_size`` rows per forward/backward; ``dtype`` of the weights
    ("auto": bf16 compute over fp32 weights on a GPU and on a CPU with bf16 units, else fp32); ``device`` of the local
    learner and the samplers ("auto": a GPU when torch sees one, "cpu", "cuda:N").
    ``backend``: "local" (this process) or "ray" (a learner actor and ``ray.samplers`` sampler
    actors, placed by ``ray``: a :class:`~trinity_like.client.ray.RayClientConfig` or its dict;
    the learner actor runs an in-process train engine). Tinker's remote-connection options (``base_url``,
    ``api_key``) have nothing to connect to here and are errors when set.
    """

    def __init__(
        self,
        user_metadata: dict[str, str] | None = None,
        project_id: str | None = None,
        *,
        log_dir: str | os.PathLike[str] | None = None,
        train_engine: str = "local",
        trainer_workers: int = 1,
        micro_batch_size: int = 8,
        dtype: str = "auto",
        device: str = "auto",
        base_url: str | None = None,
        api_key: str | None = None,
        backend: str = "local",
        ray: Any = None,
    ) -> None:
        if base_url is not None or api_key is not None:
            raise ValueError("this ServiceClient runs in-process: base_url / api_key have no server to reach")
        try:
            traits = train_engine_traits(train_engine)  # what the engine declares, beside its registration
        except UnknownNameError as exc:
            raise ValueError(f"train_engine: {exc}") from None
        if backend not in BACKENDS:
            raise ValueError(f"backend {backend!r} unknown; expected one of {', '.join(BACKENDS)}")
        if backend == "local" and ray is not None:
            raise ValueError("ray= places Ray actors: it needs backend='ray'")
        if backend == "ray" and traits.ray_workers:
            raise ValueError(
                "backend='ray' runs the train engine inside its learner actor, where it cannot place Ray workers; "
                f"train_engine={train_engine!r} is for the in-process backend"
            )
        load_plugins()  # the named losses live in the registry a recipe uses, plugins included
        self.log_dir = Path(log_dir) if log_dir is not None else client_dir()
        self.train_engine = train_engine
        self.engine_traits = traits
        self.trainer_workers = trainer_workers
        self.micro_batch_size = micro_batch_size
        self.dtype = dtype
        self.device = device
        resolve_device(device, where="ServiceClient(device=...)")  # a GPU that is not there fails here
        self._clients: list[Any] = []  # TrainingClient, or RayTrainingClient on Ray
        self.backend = backend
        self._ray = None  # the RayRuntime of backend "ray"
        if backend == "ray":
            from trinity_like.client.ray import RayClientConfig, RayRuntime

            config = ray if isinstance(ray, RayClientConfig) else RayClientConfig.from_dict(ray or {})
            self._ray = RayRuntime(config)

    def __enter__(self) -> ServiceClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Finish and release every training client this service created."""
        for client in self._clients:
            client.close()
        self._clients.clear()
        if self._ray is not None:
            self._ray.close()
            self._ray = None

    @property
    def sampler_pool(self) -> Any:
        """backend "ray": the :class:`~trinity_like.client.ray.pool.SamplerPool` (pids, stats); else None."""
        return None if self._ray is None else self._ray.pool

    # -- what can be trained -----------------------------------------------------------------
    def get_server_capabilities(self) -> types.GetServerCapabilitiesResponse:
        """The built-in models (any local Hugging Face folder works too, by its path)."""
        models = [model_entry(name, resolve_model_path(name)) for name in sorted(BUILTIN_MODELS)]
        return types.GetServerCapabilitiesResponse(supported_models=models)

    # -- training clients --------------------------------------------------------------------
    def create_lora_training_client(
        self,
        base_model: str,
        rank: int = 32,
        seed: int | None = None,
        train_mlp: bool = True,
        train_attn: bool = True,
        train_unembed: bool = True,
        user_metadata: dict[str, str] | None = None,
        optimizer: types.OptimizerConfig | None = None,
        *,
        run_name: str | None = None,
    ) -> TrainingClient:
        """A training client over ``base_model`` with a fresh LoRA adapter of ``rank``.

        ``rank=0`` (ours) trains every weight instead: a full fine-tune. ``run_name`` (ours):
        its folder under ``log_dir`` and its ``model_id``, reused if it exists (default: a new
        one, :func:`new_run_name`); ``save_state(name)`` writes ``<log_dir>/<run_name>/state/<name>``.
        """
        if optimizer is not None and getattr(optimizer, "type", "adamw") != "adamw":
            raise ValueError(f"optimizer {optimizer.type!r}: only AdamW is available here")
        if rank < 0:
            raise ValueError(f"rank must be >= 0 (0: full fine-tune), got {rank}")
        folder = resolve_model_path(base_model)
        lora = None
        if rank > 0:  # seed None: a fresh adapter draw (without reseeding torch's global generator)
            seed = seed if seed is not None else secrets.randbits(31)
            lora = LoraParams(
                rank=rank, train_attn=train_attn, train_mlp=train_mlp, train_unembed=train_unembed, seed=seed
            )
        if self._ray is not None:
            return self._ray_client(
                base_model,
                lora,
                "create_lora_training_client",
                {
                    "base_model": base_model,
                    "rank": rank,
                    "seed": seed,
                    "train_mlp": train_mlp,
                    "train_attn": train_attn,
                    "train_unembed": train_unembed,
                    "run_name": run_name,
                },
            )
        return self._training_client(base_model, folder, lora, run_name)

    def _ray_client(self, base_model: str, lora: LoraParams | None, create: str, args: dict[str, Any]) -> Any:
        """A RayTrainingClient: the learner actor makes the in-process client with ``create(**args)``."""
        from trinity_like.client.ray import RayTrainingClient

        service = {
            "log_dir": str(self.log_dir),
            "train_engine": self.train_engine,
            "micro_batch_size": self.micro_batch_size,
            "dtype": self.dtype,
        }
        actor = self._ray.learner(ServiceClient, service, create, args)
        client = RayTrainingClient(self._ray, actor, base_model=base_model, lora=lora)
        self._clients.append(client)
        return client

    def create_training_client_from_state(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: types.OptimizerConfig | None = None,
        *,
        run_name: str | None = None,
    ) -> TrainingClient:
        """A training client resumed from ``save_state``'s folder: its weights, a fresh optimiser."""
        path = checkpoint_path(path, "create_training_client_from_state")
        return self._from_state(path, base_model, with_optimizer=False, run_name=run_name)

    def create_training_client_from_state_with_optimizer(
        self,
        path: str,
        base_model: str | None = None,
        user_metadata: dict[str, str] | None = None,
        weights_access_token: str | None = None,
        optimizer: types.OptimizerConfig | None = None,
        *,
        run_name: str | None = None,
    ) -> TrainingClient:
        """A training client resumed from ``save_state``'s folder: weights and optimiser state."""
        path = checkpoint_path(path, "create_training_client_from_state_with_optimizer")
        return self._from_state(path, base_model, with_optimizer=True, run_name=run_name)

    def _from_state(
        self, path: str, base_model: str | None, *, with_optimizer: bool, run_name: str | None
    ) -> TrainingClient:
        saved_base, lora = read_base_note(path)
        base = base_model or saved_base
        if self._ray is not None:
            create = (
                "create_training_client_from_state_with_optimizer"
                if with_optimizer
                else "create_training_client_from_state"
            )
            return self._ray_client(
                base, lora, create, {"path": str(path), "base_model": base_model, "run_name": run_name}
            )
        client = self._training_client(base, resolve_model_path(base), lora, run_name)
        client._load(str(path), with_optimizer)
        return client

    def _training_client(
        self, base_model: str, folder: Path, lora: LoraParams | None, run_name: str | None = None
    ) -> TrainingClient:
        """``lora``: the adapter's params, None for a full fine-tune."""
        if run_name is not None and (not re.fullmatch(r"[A-Za-z0-9_.:-]+", run_name) or run_name in (".", "..")):
            raise ValueError(f"run_name {run_name!r} must be a plain folder name (letters, digits, _ . : -)")
        model = ModelParams(
            path=str(folder), micro_batch_size=self.micro_batch_size, dtype=self.dtype, device=self.device, lora=lora
        )
        from trinity_like.trainer.engines import TrainEngineSpec, build_train_engine
        from trinity_like.trainer.verl_config import VerlParams

        spec = TrainEngineSpec(model, OptimParams(), VerlParams(num_workers=self.trainer_workers))
        engine = build_train_engine(self.train_engine, spec)  # the TRAIN_ENGINE entry, as a recipe's
        model_id = run_name or new_run_name(self.log_dir, base_model)
        client = TrainingClient(
            engine,
            base_model=base_model,
            model_id=model_id,
            run_dir=self.log_dir / model_id,
            lora=lora,
            tokenizer=load_tokenizer(folder),
            exact_targets=self.engine_traits.exact_targets,
            device=self.device,
        )
        self._clients.append(client)
        return client

    # -- sampling clients --------------------------------------------------------------------
    def create_sampling_client(
        self,
        model_path: str | None = None,
        base_model: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
    ) -> SamplingClient:
        """A sampler over ``model_path`` (a ``save_weights_for_sampler`` folder) or ``base_model``'s own weights."""
        if model_path is None and base_model is None:
            raise ValueError("Either model_path or base_model must be provided")
        if model_path is not None:
            model_path = sampler_weights_path(model_path, "create_sampling_client")
        if self._ray is not None:
            from trinity_like.client.ray.sampling import base_sampler

            if model_path is None:
                resolve_model_path(base_model)
            return base_sampler(
                self._ray, base_model or str(model_path), None if model_path is None else str(model_path)
            )
        if model_path is not None:
            return SamplingClient(base_model or model_path, model_path=model_path, device=self.device)
        resolve_model_path(base_model)  # an unknown model fails here, at call time
        return SamplingClient(base_model, device=self.device)

    # -- the SDK's async spellings -------------------------------------------------------------
    async def get_server_capabilities_async(self) -> types.GetServerCapabilitiesResponse:
        return self.get_server_capabilities()

    async def create_lora_training_client_async(self, *args: Any, **kwargs: Any) -> TrainingClient:
        return self.create_lora_training_client(*args, **kwargs)

    async def create_training_client_from_state_async(self, *args: Any, **kwargs: Any) -> TrainingClient:
        return self.create_training_client_from_state(*args, **kwargs)

    async def create_training_client_from_state_with_optimizer_async(self, *args: Any, **kwargs: Any):
        return self.create_training_client_from_state_with_optimizer(*args, **kwargs)

    async def create_sampling_client_async(self, *args: Any, **kwargs: Any) -> SamplingClient:
        return self.create_sampling_client(*args, **kwargs)
