"""verl 0.9.1 on a machine without a GPU: the only module that registers anything for CPU.

verl's FSDP workers assume an accelerator: they start nccl, build the device mesh for
``cuda`` and look engines up by device. verl has extension points for new hardware, and
this module uses only those (``docs/machines.md`` quotes the failures they fix):

1. a platform named ``cpu`` registered with ``PlatformRegistry`` (device ``cpu``, backend
   ``gloo``, Ray resource ``CPU``, current device the string ``"cpu"``, memory statistics
   answered with zeros), selected in workers by ``VERL_PLATFORM=cpu``;
2. verl's own ``FSDPEngineWithLMHead`` / ``FSDPEngineWithValueHead`` registered with
   ``EngineRegistry`` for ``device="cpu"`` (verl registers them for cuda and npu only);
3. critics: verl's value-model loader insists on flash-attention; it is replaced by the
   same load with the configured attention kernel (the one patch of verl code).

The last piece, starting a gloo process group before verl's worker ``__init__`` would
start ``cpu:gloo,cpu:gloo``, lives in the worker class (``verl_worker.py``).

It is installed only for a Ray cluster without GPUs: by the driver, which then starts the
workers with ``VERL_PLATFORM=cpu``, and first thing in each such worker (before the rest
of verl resolves its platform). With GPUs nothing here runs and verl keeps nccl. verl internals change between minor
releases: this is written against verl==0.9.1.
"""

from __future__ import annotations

import os
import warnings
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch

# verl announces each optional engine it cannot import (torchtitan, megatron, ...) on every
# start; none of them is used here, so the announcements are noise in a user's terminal.
warnings.filterwarnings("ignore", message=r".* engine is not available", category=UserWarning)

PLATFORM_NAME = "cpu"
ENV_VAR = "VERL_PLATFORM"


class CpuDeviceModule:
    """What verl calls on ``get_torch_device()`` (normally ``torch.cuda``), answered for CPU.

    Memory statistics are zeros: the CPU allocator keeps none, and verl only logs them.
    """

    Stream = torch.cpu.Stream
    Event = torch.cpu.Event
    stream = staticmethod(torch.cpu.stream)
    current_stream = staticmethod(torch.cpu.current_stream)
    get_rng_state = staticmethod(torch.get_rng_state)
    set_rng_state = staticmethod(torch.set_rng_state)
    manual_seed = staticmethod(torch.manual_seed)
    manual_seed_all = staticmethod(torch.manual_seed)

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def current_device() -> str:
        return "cpu"

    @staticmethod
    def device_count() -> int:
        return 1

    @staticmethod
    def set_device(device: Any) -> None:
        """There is one CPU device; nothing to select."""

    @staticmethod
    def synchronize(device: Any = None) -> None:
        """CPU ops are synchronous."""

    @staticmethod
    def empty_cache() -> None:
        """No caching allocator on CPU."""

    @staticmethod
    def ipc_collect() -> None:
        """No CUDA IPC handles on CPU."""

    @staticmethod
    def set_per_process_memory_fraction(fraction: float, device: Any = None) -> None:
        """No device memory to cap."""

    @staticmethod
    def reset_peak_memory_stats(device: Any = None) -> None:
        """No statistics kept."""

    @staticmethod
    def mem_get_info(device: Any = None) -> tuple[int, int]:
        return 0, 0

    @staticmethod
    def memory_allocated(device: Any = None) -> int:
        return 0

    @staticmethod
    def memory_reserved(device: Any = None) -> int:
        return 0

    @staticmethod
    def max_memory_allocated(device: Any = None) -> int:
        return 0

    @staticmethod
    def max_memory_reserved(device: Any = None) -> int:
        return 0

    @staticmethod
    def get_device_name(device: Any = None) -> str:
        return "CPU"


def _platform_class() -> type:
    """Build the platform class (verl is imported here, not at module import, see :func:`install`)."""
    from verl.plugin.platform import PlatformBase

    class PlatformCPU(PlatformBase):
        """verl platform for CPU-only hosts: gloo collectives, Ray's ``CPU`` resource."""

        device_name = "cpu"
        vendor_name = "cpu"
        device_module = CpuDeviceModule  # type: ignore[assignment]

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return not torch.cuda.is_available()

        def current_device(self) -> str:  # type: ignore[override]
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            """One CPU device."""

        def synchronize(self, device_index: int | None = None) -> None:
            """CPU ops are synchronous."""

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            """No caching allocator on CPU."""

        def empty_cache(self) -> None:
            """No caching allocator on CPU."""

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextmanager
        def nvtx_range(self, msg: str):
            yield

        def profiler_start(self) -> None:
            """No device profiler on CPU."""

        def profiler_stop(self) -> None:
            """No device profiler on CPU."""

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_resource_options(self, num_gpus: float) -> dict[str, Any]:
            return {}

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> ModuleType | None:
            return None

    return PlatformCPU


_installed = False


def install() -> None:
    """Register the ``cpu`` platform and the CPU FSDP engines with verl; idempotent.

    Also makes ``cpu`` this process's verl platform (setting ``VERL_PLATFORM`` for code that
    reads it, and replacing a platform resolved earlier by auto-detection's fallback).
    """
    global _installed
    if _installed:
        return
    if torch.cuda.is_available():
        raise RuntimeError("verl_cpu.install() on a machine with a CUDA GPU: verl runs unpatched there")
    os.environ[ENV_VAR] = PLATFORM_NAME
    from verl.plugin.platform import PlatformRegistry, get_platform, set_platform

    platform_cls = PlatformRegistry.register(platform=PLATFORM_NAME)(_platform_class())
    if get_platform().device_name != "cpu":
        set_platform(platform_cls())

    from verl.workers.engine.base import EngineRegistry
    from verl.workers.engine.fsdp.transformer_impl import FSDPEngineWithLMHead, FSDPEngineWithValueHead

    _use_configured_attention_for_value_models()
    EngineRegistry.register(model_type="language_model", backend=["fsdp", "fsdp2"], device="cpu")(FSDPEngineWithLMHead)
    EngineRegistry.register(model_type="value_model", backend=["fsdp", "fsdp2"], device="cpu")(FSDPEngineWithValueHead)
    _installed = True


def _use_configured_attention_for_value_models() -> None:
    """Replace ``verl.utils.model.load_valuehead_model``, the one patch of verl code here.

    verl 0.9.1's loader for critics hard-codes ``attn_implementation="flash_attention_2"``,
    which cannot load without CUDA, and then falls back to ``trl`` (not a dependency). The
    replacement is the same ``AutoModelForTokenClassification.from_pretrained`` call with
    the attention kernel of the model config (``sdpa`` or ``eager``, from our params).
    ``FSDPEngine._build_module`` imports the function at call time, so the module attribute
    is what it gets.
    """
    import verl.utils.model as verl_model
    from transformers import AutoModelForTokenClassification

    def load_valuehead_model(local_path, torch_dtype, model_config, trust_remote_code):
        return AutoModelForTokenClassification.from_pretrained(
            local_path, torch_dtype=torch_dtype, config=model_config, trust_remote_code=trust_remote_code
        )

    verl_model.load_valuehead_model = load_valuehead_model


def requested() -> bool:
    """Whether this process was told to run verl on CPU (``VERL_PLATFORM=cpu``, set for workers)."""
    return os.environ.get(ENV_VAR, "").strip().lower() == PLATFORM_NAME


def worker_env() -> dict[str, str]:
    """Environment variables a Ray worker needs to pick the ``cpu`` platform."""
    return {ENV_VAR: PLATFORM_NAME}
