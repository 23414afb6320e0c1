"""The ``TrainingClient``: Tinker's training calls over one of our train engines.

Every call returns a future at once (:mod:`.futures`); one client's requests run one at a
time in call order, so ``optim_step`` may be submitted before ``forward_backward``'s
result is read. Requests and responses are the ``tinker.types`` objects (plain,
serialisable); the work is the engine's: ``forward_backward`` is one forward and backward
pass over the batch (:mod:`.data` lays Datums out as engine rows), with the named loss
taken from the registry a recipe uses (:mod:`.losses`).

Example (the SDK's own loop, unchanged but for the import)::

    from trinity_like.client import ServiceClient, types
    service = ServiceClient()
    training = service.create_lora_training_client("smollm2-135m-instruct", rank=16)
    fwd = training.forward_backward(data, "cross_entropy")
    opt = training.optim_step(types.AdamParams(learning_rate=1e-4))
    print(fwd.result().metrics["loss:sum"], opt.result().metrics)
    sampler = training.save_weights_and_get_sampling_client()
"""

from __future__ import annotations

import functools
import math
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tinker import types
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

from trinity_like.client.data import (
    Layout,
    ModelLimits,
    check_next_token_targets,
    per_datum,
    to_batch,
)
from trinity_like.client.futures import RequestQueue, checkpoint_path, sampler_weights_path
from trinity_like.client.losses import (
    custom_loss_result,
    loss_inputs,
    loss_spec,
    reported_metrics,
    required_arrays,
)
from trinity_like.client.sampling import SamplingClient
from trinity_like.client.spellings import TrainingAsyncSpellings
from trinity_like.components import ComponentSpec, call_component
from trinity_like.models.resolve import resolve_model_path
from trinity_like.pipeline.checkpoint import write_manifest
from trinity_like.trainer.base import TrainEngine
from trinity_like.trainer.lora import BASE_MODEL_FILE
from trinity_like.trainer.params import AdamStep

CustomLossFn = Callable[[list[types.Datum], list[torch.Tensor]], tuple[torch.Tensor, dict[str, float]]]
CHECKPOINT_NAME_MAX = 128  # characters of a checkpoint name: with the run's folder, far below a file system's limit


@dataclass(frozen=True)
class ClientLoss:
    """A named loss as the engines' loss callable: ``(outputs, batch) -> (loss, metrics)``.

    Token-sum reduction makes each micro-batch's loss its own share of the whole, so the
    engine's micro-batch gradients add up to the full batch's. Picklable (verl workers).
    """

    name: str  # the Tinker name (or a registered one) the caller gave
    spec: ComponentSpec  # the registered loss and its params

    def __call__(self, outputs: Mapping[str, torch.Tensor], batch: Mapping[str, torch.Tensor]):
        inputs = loss_inputs(self.name, outputs["logprob"], batch, batch["response_mask"])
        loss, metrics = call_component(self.spec.fn, inputs, self.spec.params)
        return loss, dict(metrics)


def sampler_diagnostics(logprob_BR: torch.Tensor, batch: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """KL between the sampler and the learner over the sampled tokens: the positions whose
    ``logprobs`` (the sampler's) are non-zero -- the cookbook pads prompt positions with 0.

    k1 = E[log p_sampler - log p_learner]; k3 = E[(r - 1) - log r], r = p_learner / p_sampler
    (Schulman, "Approximating KL divergence", 2020): both estimate KL(sampler || learner).
    """
    out: dict[str, float] = {}
    if "logprobs" in batch:
        counted = batch["response_mask"] * (batch["logprobs"] != 0)
        n = counted.sum()
        if n > 0:
            log_r = (logprob_BR.detach() - batch["logprobs"]) * counted
            out["kl_sample_train_k1:mean"] = float(-log_r.sum() / n)
            out["kl_sample_train_k3:mean"] = float(((log_r.exp() - 1 - log_r) * counted).sum() / n)
    return out


def entropy_mean(entropy_BR: torch.Tensor, mask_BR: torch.Tensor) -> float:
    return float((entropy_BR * mask_BR).sum() / mask_BR.sum().clamp(min=1))


class TrainingClient(TrainingAsyncSpellings):
    """Tinker's ``TrainingClient`` over a :class:`~trinity_like.trainer.base.TrainEngine`.

    Made by :class:`~trinity_like.client.service.ServiceClient`; holds one engine, its
    requests queue and the folder its checkpoints go to.
    """

    def __init__(
        self,
        engine: TrainEngine,
        *,
        base_model: str,
        model_id: str,
        run_dir: Path,
        lora: Any,
        tokenizer: Any,
        exact_targets: bool = True,
        device: str = "auto",
    ) -> None:
        self._engine = engine
        self.device = device  # where its samplers run (the service's device)
        self._lora = lora  # the engine's LoraParams, None for a full fine-tune
        self._queue = RequestQueue(f"training-{model_id}")
        self._run_dir = Path(run_dir)
        self._tokenizer = tokenizer
        self._exact_targets = exact_targets  # the engine scores target_ids (else next tokens only)
        self._version = 0  # optimiser steps taken through this client
        self.base_model = base_model
        self.model_id = model_id
        self._info = types.GetInfoResponse(
            model_data=types.ModelData(arch=engine.architecture, model_name=base_model, tokenizer_id=base_model),
            model_id=model_id,
            is_lora=lora is not None,
            lora_rank=lora.rank if lora else None,
            model_name=base_model,
        )

    # -- the SDK's 0.38 transitional future: a created client is also its own future --------
    def result(self, timeout: float | None = None) -> TrainingClient:
        """This client (``create_*`` returns it directly; ``.result()`` and ``await`` give it back)."""
        return self

    def __await__(self):
        yield from ()
        return self

    @functools.cached_property
    def limits(self) -> ModelLimits:
        """The vocabulary and context every datum is checked against (the base model's config)."""
        return ModelLimits.of(resolve_model_path(self.base_model))

    # -- forward / backward ---------------------------------------------------------------
    def forward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> AwaitableConcurrentFuture[types.ForwardBackwardOutput]:
        """The loss and per-datum logprobs, without gradients."""
        return self._queue.submit(self._run, data, loss_fn, loss_fn_config, backward=False)

    def forward_backward(
        self,
        data: list[types.Datum],
        loss_fn: types.LossFnType,
        loss_fn_config: Mapping[str, float | str] | None = None,
    ) -> AwaitableConcurrentFuture[types.ForwardBackwardOutput]:
        """Accumulate the gradient of the named loss (token sum) over ``data``; ``optim_step`` applies it."""
        return self._queue.submit(self._run, data, loss_fn, loss_fn_config, backward=True)

    def forward_backward_custom(
        self,
        data: list[types.Datum],
        loss_fn: CustomLossFn,
        *,
        loss_type_input: str | None = None,
    ) -> AwaitableConcurrentFuture[types.ForwardBackwardOutput]:
        """Accumulate the gradient of ``loss_fn(data, logprobs_list) -> (loss, metrics)``.

        As in Tinker: a forward pass gives each datum's logprobs (``logprobs_list[i]``: float32
        ``[T_i]``, position t the learner's log p(target_tokens[t] | tokens 0..t), every position
        scored), ``loss_fn`` runs on them as leaf tensors with the datums as given (every
        ``loss_fn_inputs`` key; ``target_tokens`` is required), and a backward pass of the linear
        surrogate ``sum(dloss/dlogprob * logprob)`` carries its exact gradient into the weights.
        ``loss`` is a one-element tensor, finite; ``metrics`` a dict of str -> float, returned as
        given (:func:`~.losses.custom_loss_result`; anything else is one error line).
        """
        if loss_type_input not in (None, "logprobs"):
            raise ValueError(f"loss_type_input must be None or 'logprobs', got {loss_type_input!r}")
        if not callable(loss_fn):
            raise TypeError(f"loss_fn must be callable (data, logprobs_list) -> (loss, metrics), got {loss_fn!r}")
        return self._queue.submit(self._run_custom, data, loss_fn)

    def _run(
        self, data: Sequence[types.Datum], loss_fn: str, config: Mapping[str, Any] | None, *, backward: bool
    ) -> types.ForwardBackwardOutput:
        if not isinstance(loss_fn, str):
            raise TypeError(
                f"loss_fn must be a loss name (str), got {type(loss_fn).__name__}; "
                "a callable goes to forward_backward_custom"
            )
        loss = ClientLoss(loss_fn, loss_spec(loss_fn, config))
        batch, layout = self._batch(data, required_arrays(loss_fn), what=repr(loss_fn), score_all=not backward)
        started = time.perf_counter()
        outputs: dict[str, torch.Tensor] = {}
        if backward:
            metrics = self._engine.forward_backward(batch, loss, need_entropy=True, out=outputs)
            loss_sum = metrics.pop("loss")
        else:
            outputs = self._engine.compute_logprobs(batch, need_entropy=True)
            with torch.no_grad():
                value, metrics = loss(outputs, batch)
            loss_sum = float(value)
        metrics = reported_metrics(loss_fn, metrics)
        return self._output(batch, layout, outputs, metrics, loss_sum, time.perf_counter() - started)

    def _run_custom(self, data: Sequence[types.Datum], loss_fn: CustomLossFn) -> types.ForwardBackwardOutput:
        batch, layout = self._batch(data, ("target_tokens",), what="forward_backward_custom", extra_ok=True)
        started = time.perf_counter()
        leaves = [lp.requires_grad_(True) for lp in per_datum(self._engine.compute_logprobs(batch)["logprob"], layout)]
        value, user_metrics = custom_loss_result(loss_fn(list(data), leaves))
        value.backward()
        for i, leaf in enumerate(leaves):
            if leaf.grad is not None and not torch.isfinite(leaf.grad).all():
                raise ValueError(
                    f"forward_backward_custom: the loss's gradient with respect to datum {i}'s logprobs is not "
                    "finite (a log or division of 0?); no gradient was applied"
                )
        linear = [  # cross-entropy's -(w * logprob) has gradient -w: weights = -dloss/dlogprob
            types.Datum(
                model_input=d.model_input,
                loss_fn_inputs={
                    "target_tokens": d.loss_fn_inputs["target_tokens"],
                    "weights": -leaf.grad if leaf.grad is not None else torch.zeros_like(leaf),
                },
            )
            for d, leaf in zip(data, leaves, strict=True)
        ]
        batch, layout = self._batch(
            linear, ("target_tokens", "weights"), what="forward_backward_custom", score_all=False
        )
        surrogate = ClientLoss("cross_entropy", loss_spec("cross_entropy"))
        outputs: dict[str, torch.Tensor] = {}
        metrics = self._engine.forward_backward(batch, surrogate, need_entropy=True, out=outputs)
        surrogate_sum = metrics.pop("loss")  # the SDK's order: the user's metrics, then the two sums
        metrics = {**reported_metrics("cross_entropy", metrics), **user_metrics, "surrogate_loss:sum": surrogate_sum}
        return self._output(batch, layout, outputs, metrics, float(value.detach()), time.perf_counter() - started)

    def _batch(
        self,
        data: Sequence[types.Datum],
        keys: Sequence[str],
        *,
        what: str,
        extra_ok: bool = False,
        score_all: bool = True,
    ) -> tuple[dict[str, torch.Tensor], Layout]:
        batch, layout = to_batch(data, keys, what=what, extra_ok=extra_ok, score_all=score_all, limits=self.limits)
        if not self._exact_targets:
            check_next_token_targets(batch)
        return batch, layout

    def _output(self, batch, layout, outputs, metrics, loss_sum, seconds):
        """The response: per-datum logprobs, ``metrics`` (named as they are reported) and the diagnostics."""
        logprob_BR = outputs["logprob"]
        mask = batch["response_mask"]
        out = {**metrics, "loss:sum": float(loss_sum)}
        out.update(sampler_diagnostics(logprob_BR, batch))
        if "entropy" in outputs:
            out["entropy:mean"] = entropy_mean(outputs["entropy"], mask)
        out["tokens_per_s:mean"] = float(mask.sum()) / max(seconds, 1e-9)
        return types.ForwardBackwardOutput(
            loss_fn_output_type="ArrayRecord",
            loss_fn_outputs=[{"logprobs": types.TensorData.from_torch(lp)} for lp in per_datum(logprob_BR, layout)],
            metrics=out,
        )

    # -- optimiser --------------------------------------------------------------------------
    def optim_step(
        self, optim_params: types.AdamParams | None = None, *, adam_params: types.AdamParams | None = None
    ) -> AwaitableConcurrentFuture[types.OptimStepResponse]:
        """Apply the accumulated gradients with AdamW at ``optim_params``' values, then zero them."""
        if optim_params is not None and adam_params is not None:
            raise ValueError("Specify optim_params or legacy adam_params, not both")
        params = optim_params if optim_params is not None else adam_params
        if not isinstance(params, types.AdamParams):
            raise TypeError(f"Expected AdamParams (the only optimizer here), got {type(params).__name__}")
        for field, value in params.model_dump().items():
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError(f"AdamParams.{field} must be finite, got {value}")
        adam = AdamStep(
            lr=params.learning_rate,
            betas=(params.beta1, params.beta2),
            eps=params.eps,
            weight_decay=params.weight_decay,
            grad_clip=params.grad_clip_norm,
        )
        return self._queue.submit(self._optim_step, adam)

    def _optim_step(self, adam: AdamStep) -> types.OptimStepResponse:
        stats = self._engine.optim_step(adam)
        self._version += 1
        return types.OptimStepResponse(metrics={"grad_norm": stats["grad_norm"], "learning_rate": stats["lr"]})

    # -- checkpoints and sampling ----------------------------------------------------------
    def save_state(
        self,
        name: str,
        ttl_seconds: int | None = None,
        overwrite: bool = False,
        user_metadata: dict[str, str] | None = None,
    ) -> AwaitableConcurrentFuture[types.SaveWeightsResponse]:
        """Weights (adapter or full), optimiser state and RNG as safetensors under ``<run>/state/<name>``;
        the response's ``path`` is that folder (resume with ``load_state*``, merge with ``trinity-like export``)."""
        return self._queue.submit(self._save, "state", name, overwrite)

    def _save(self, kind: str, name: str, overwrite: bool) -> types.SaveWeightsResponse:
        folder = self._checkpoint_folder(kind, name, overwrite)
        # Written beside its final name, then renamed: a save cut short (Ctrl-C, a crash)
        # leaves no half-written checkpoint under the name, and an overwritten one stays whole.
        partial = folder.with_name(f".{name}.partial-{os.getpid()}")
        shutil.rmtree(partial, ignore_errors=True)
        self._engine.save(str(partial))  # its base_model.json says what to resume it on
        write_manifest(partial)  # the content hashes `trinity-like export` checks it against
        if folder.exists():
            shutil.rmtree(folder)
        partial.rename(folder)
        return types.SaveWeightsResponse(path=str(folder))

    def _checkpoint_folder(self, kind: str, name: str, overwrite: bool) -> Path:
        if not isinstance(name, str) or not name or "/" in name or "\0" in name or name in (".", ".."):
            raise ValueError(f"checkpoint name {name!r} must be a plain, non-empty file name")
        if len(name) > CHECKPOINT_NAME_MAX:
            raise ValueError(f"checkpoint name of {len(name)} characters: at most {CHECKPOINT_NAME_MAX}")
        folder = self._run_dir / kind / name
        if folder.exists() and not overwrite:
            raise FileExistsError(f"checkpoint {folder} exists (pass overwrite=True to replace it)")
        return folder

    def load_state(self, path: str) -> AwaitableConcurrentFuture[types.LoadWeightsResponse]:
        """Load the weights of a ``save_state`` checkpoint; the optimiser starts fresh."""
        return self._queue.submit(self._load, checkpoint_path(path, "load_state"), False)

    def load_state_with_optimizer(self, path: str) -> AwaitableConcurrentFuture[types.LoadWeightsResponse]:
        """Load weights and optimiser state (moments, step) of a ``save_state`` checkpoint."""
        return self._queue.submit(self._load, checkpoint_path(path, "load_state_with_optimizer"), True)

    def _load(self, path: str, with_optimizer: bool) -> types.LoadWeightsResponse:
        if not (Path(path) / BASE_MODEL_FILE).is_file():
            raise FileNotFoundError(f"{path!r} is not a save_state checkpoint (no {BASE_MODEL_FILE})")
        self._engine.load(str(path), with_optimizer=with_optimizer)
        return types.LoadWeightsResponse(path=str(path))

    def save_weights_for_sampler(
        self,
        name: str,
        ttl_seconds: int | None = None,
        user_metadata: dict[str, str] | None = None,
    ) -> AwaitableConcurrentFuture[types.SaveWeightsForSamplerResponse]:
        """The merged weights as a plain Hugging Face folder under ``<run>/sampler_weights/<name>``."""
        return self._queue.submit(self._save_for_sampler, name)

    def _save_for_sampler(self, name: str) -> types.SaveWeightsForSamplerResponse:
        folder = self._checkpoint_folder("sampler_weights", name, overwrite=True)
        SamplingClient(self.base_model, weights=self._engine.state_dict(), device=self.device).save_weights(folder)
        return types.SaveWeightsForSamplerResponse(path=str(folder))

    def save_weights_and_get_sampling_client(
        self,
        name: str | None = None,
        retry_config: Any = None,
        record_stability_info: bool = False,
        kind: str = "snapshot",
    ) -> SamplingClient:
        """A sampler over the current (merged) weights, handed over in memory: no disk write.

        Returns the client itself once every earlier request has run (it also answers
        ``.result()`` / ``await`` with itself, like the SDK's transitional future).
        """
        if kind != "snapshot":
            raise ValueError(f"kind {kind!r}: only 'snapshot' sampling clients exist here")
        return self.snapshot_sampler().result()

    def snapshot_sampler(self) -> AwaitableConcurrentFuture[SamplingClient]:
        """A future of the sampler ``save_weights_and_get_sampling_client`` returns, queued
        in call order without waiting (``trinity-like serve`` answers the request at once)."""
        return self._queue.submit(self._snapshot)

    def _snapshot(self) -> SamplingClient:
        return SamplingClient(
            self.base_model, weights=self._engine.state_dict(), version=self._version, device=self.device
        )

    def create_sampling_client(self, model_path: str, retry_config: Any = None) -> SamplingClient:
        """A sampler over the weights saved by ``save_weights_for_sampler`` at ``model_path``."""
        model_path = sampler_weights_path(model_path, "create_sampling_client")
        return SamplingClient(self.base_model, model_path=model_path, device=self.device)

    # -- information ------------------------------------------------------------------------
    def get_info(self) -> types.GetInfoResponse:
        return self._info

    def get_tokenizer(self) -> Any:
        return self._tokenizer

    def close(self) -> None:
        """Finish queued requests and release the engine."""
        self._queue.close()
        self._engine.close()
