"""Where models run and in what precision: the one place both are decided.

A recipe's ``cluster.device`` (``auto`` | ``cpu`` | ``cuda`` | ``cuda:N``) places every model of
a run -- the local train engine, the explorer, env players, reward models -- and the client's
``ServiceClient(device=...)`` does the same for its learner and samplers. ``auto`` is the
first CUDA device when torch sees one, else the CPU::

    device = resolve_device("auto")              # torch.device("cuda", 0) on a GPU machine
    p = precision(device)                        # what runs in which dtype there
    p.rollout, p.train_compute                   # bf16, bf16 on CUDA and on a CPU with bf16 units
    p.why                                        # "CPU has avx512_bf16": what decided it

What stays float32 everywhere: the train engines' master weights and optimiser state
(AdamW moments), the logprobs and every loss (the head's logits are upcast before
``logsumexp``: :func:`~trinity_like.trainer.forward.at_least_fp32`), the sampler's softmax
and the logprobs it reports. On CUDA, and on a CPU with bf16 units (AVX512-BF16, AMX-BF16:
:func:`cpu_bf16_flags`), the train engines compute forward and backward in bf16 over those
fp32 weights (autocast on the local engine, FSDP's mixed precision on verl), and the rollout
engine holds its weights and KV cache in bf16 (what decoding reads every step). Measured on a
2-core AMD EPYC with AVX512-BF16 and no AMX (``benchmarks/precision.py``): the update 2.5x and
the rollout 2.2x faster than fp32 (``docs/precision.md``). A CPU without the units (AVX2)
stays float32: bf16 arithmetic is emulated there and slower. ``model.dtype`` /
``explorer.dtype`` set to ``float32`` or ``bfloat16`` win over this; :func:`describe` is the
line the run log and ``--dry-run`` print.

The process's run device (:func:`set_run_device`) is what parts built without a config see
(environments' frozen players, reward models): a run sets it from ``cluster.device`` before
it builds anything.
"""

from __future__ import annotations

import os
import re
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trinity_like.errors import TrinityError

if TYPE_CHECKING:
    import torch

DEVICE_PATTERN = r"auto|cpu|cuda(:\d+)?"  # what cluster.device accepts
DTYPE_NAMES = ("auto", "float32", "bfloat16")  # model.dtype / explorer.dtype; auto: precision(device)
_run_device = "auto"  # this process's device spec (set_run_device)

# Held by whoever needs the GPU's allocator and streams quiet for a moment: the rollout engine
# while it captures a CUDA graph (decode_step.StepGraphs), and a trainer on the same GPU while
# it computes a step or hands memory over (pipeline.stage). PyTorch forbids allocating, syncing
# or emptying the cache in one thread while another captures (torch.cuda.graph's docs); with
# the explorer in a thread beside the trainer (synchronizer.offset >= 1, one GPU) both happen.
# Re-entrant: the explorer thread hands the trainer's memory over while it holds it. Uncontended
# (a CPU run, or one thread) it costs a lock acquisition.
DEVICE_TURN = threading.RLock()


def resolve_device(spec: str | None = None, *, where: str = "cluster.device") -> torch.device:
    """The torch device of ``spec`` (None: this process's run device).

    ``auto``: ``cuda`` (device 0) when torch sees a CUDA device, else ``cpu``. Asking for a
    CUDA device torch cannot see is an error naming ``where`` -- never a silent CPU run.
    """
    import torch

    spec = _run_device if spec is None else str(spec)
    if not re.fullmatch(DEVICE_PATTERN, spec):
        raise TrinityError(f"{where}: {spec!r} is not a device; expected auto, cpu, cuda or cuda:N")
    if spec == "auto":
        return torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    if spec == "cpu":
        return torch.device("cpu")
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    index = int(spec.partition(":")[2] or 0)
    if index >= count:
        seen = f"{count} CUDA device{'s' * (count != 1)}" if count else "no CUDA device"
        raise TrinityError(f"{where}: {spec} asked for, but torch sees {seen}; set {where}: cpu (or auto)")
    return torch.device("cuda", index)


def set_run_device(spec: str) -> None:
    """Make ``spec`` this process's run device (checked now: a bad one fails here)."""
    global _run_device
    resolve_device(spec)
    _run_device = spec


def run_device() -> torch.device:
    """This process's run device, resolved (``auto`` until :func:`set_run_device`)."""
    return resolve_device(None)


CPU_BF16_FLAGS = ("avx512_bf16", "amx_bf16")  # /proc/cpuinfo flags of native bf16 dot products
# What runs in bf16 by default on a CPU with those units: each part measured faster there than in fp32
# (benchmarks/precision.py on a 2-core AMD EPYC with avx512_bf16, no AMX; benchmarks/RESULTS.md).
CPU_BF16_PARTS = frozenset({"train", "rollout"})
CPU_BF16_ENV = "TRINITY_LIKE_CPU_BF16"  # auto | on | off: see cpu_bf16_flags
CPU_BF16_NOTE = ""  # why a part stays fp32 there, when one does


def cpu_bf16_flags() -> frozenset[str]:
    """The CPU's bf16 units: which of :data:`CPU_BF16_FLAGS` ``/proc/cpuinfo`` lists (empty where
    there is no such file). The one hardware probe :func:`precision` reads; tests replace it.

    The environment variable ``TRINITY_LIKE_CPU_BF16`` (read in every process a run starts)
    overrides the probe: ``off`` reports no units (CPU defaults as on an AVX2 machine; the test
    suite sets it, so that its numbers do not depend on the CPU that runs it), ``on`` reports
    ``TRINITY_LIKE_CPU_BF16=on`` as if it were a unit (the bf16 path on any CPU: slow where
    bf16 is emulated, for tests and benchmarks), ``auto`` (or unset) looks.
    """
    setting = os.environ.get(CPU_BF16_ENV, "auto")
    if setting not in ("auto", "off", "on"):
        raise TrinityError(f"environment variable {CPU_BF16_ENV}={setting!r}: expected auto, on or off")
    if setting != "auto":
        return frozenset({f"{CPU_BF16_ENV}=on"}) if setting == "on" else frozenset()
    info = Path("/proc/cpuinfo")
    if not info.is_file():
        return frozenset()
    for line in info.read_text(errors="replace").splitlines():
        if line.startswith("flags"):
            return frozenset(CPU_BF16_FLAGS) & set(line.partition(":")[2].split())
    return frozenset()


@dataclass(frozen=True)
class Precision:
    """What runs in which dtype on one device (see the module docstring), and why."""

    rollout: torch.dtype  # the rollout engine's weights and KV cache
    train_weights: torch.dtype  # train engines' master weights and optimiser state
    train_compute: torch.dtype | None  # autocast dtype of train forward/backward; None: the weights' own
    why: str = ""  # what on the device decided it, for the run log


def precision(device: torch.device) -> Precision:
    """The default precision on ``device`` (``model.dtype`` / ``explorer.dtype`` ``auto``).

    - CUDA: bf16 autocast over fp32 masters for training, bf16 rollout weights and KV cache.
    - A CPU with bf16 units (:func:`cpu_bf16_flags`: AVX512-BF16 or AMX-BF16): the parts
      :data:`CPU_BF16_PARTS` names -- measured faster in bf16 there (``benchmarks/precision.py``,
      ``docs/precision.md``) -- in bf16, the same mixed path as CUDA; the rest fp32.
    - Any other CPU (AVX2): fp32 everything -- bf16 matmuls are emulated there, slower than fp32.
    """
    import torch

    bf16, fp32 = torch.bfloat16, torch.float32
    if device.type == "cuda":
        return Precision(rollout=bf16, train_weights=fp32, train_compute=bf16, why="CUDA")
    flags = cpu_bf16_flags()
    if not flags:
        return Precision(
            rollout=fp32,
            train_weights=fp32,
            train_compute=None,
            why=f"CPU without bf16 units (no {' or '.join(CPU_BF16_FLAGS)}): bf16 is slower than fp32 there",
        )
    return Precision(
        rollout=bf16 if "rollout" in CPU_BF16_PARTS else fp32,
        train_weights=fp32,
        train_compute=bf16 if "train" in CPU_BF16_PARTS else None,
        why=f"CPU has {', '.join(sorted(flags))}" + CPU_BF16_NOTE,
    )


def describe(model_dtype: str, explorer_dtype: str, device: torch.device) -> str:
    """One line for the run log and the resolved plan: which precision path each part runs, and why.

    e.g. ``precision on cpu: train bf16 compute over fp32 master weights (model.dtype auto), rollout bf16
    weights and KV cache (explorer.dtype auto); auto because the CPU has avx512_bf16``.
    """
    weights, compute = train_dtypes(model_dtype, device)
    train = f"bf16 compute over {_short(weights)} master weights" if compute is not None else f"{_short(weights)}"
    rollout = _short(rollout_dtype(explorer_dtype, device))
    parts = [
        f"train {train} (model.dtype {'auto' if model_dtype == 'auto' else '= ' + model_dtype})",
        f"rollout {rollout} weights and KV cache (explorer.dtype "
        f"{'auto' if explorer_dtype == 'auto' else '= ' + explorer_dtype})",
    ]
    why = f"; auto because: {precision(device).why}" if "auto" in (model_dtype, explorer_dtype) else ""
    return f"precision on {device.type}: {', '.join(parts)}{why}"


def _short(dtype: torch.dtype) -> str:
    return {"torch.float32": "fp32", "torch.bfloat16": "bf16"}.get(str(dtype), str(dtype))


def rollout_dtype(name: str, device: torch.device) -> torch.dtype:
    """The dtype a rollout engine holds its weights in: ``name`` (``explorer.dtype``), auto: :func:`precision`."""
    import torch

    return precision(device).rollout if name == "auto" else getattr(torch, _checked(name))


def train_dtypes(name: str, device: torch.device) -> tuple[torch.dtype, torch.dtype | None]:
    """``(parameter dtype, autocast dtype or None)`` of a train engine for ``model.dtype`` = ``name``.

    ``auto``: :func:`precision` (fp32 weights, bf16 autocast on CUDA); ``float32``: fp32, no
    autocast; ``bfloat16``: the parameters themselves in bf16 (the local engine's meaning since
    before devices; the verl engine computes in bf16 over fp32 masters).
    """
    import torch

    if name == "auto":
        p = precision(device)
        return p.train_weights, p.train_compute
    return getattr(torch, _checked(name)), None


def _checked(name: str) -> str:
    if name not in DTYPE_NAMES:
        raise TrinityError(f"dtype {name!r} unknown; expected one of {', '.join(DTYPE_NAMES)}")
    return name
