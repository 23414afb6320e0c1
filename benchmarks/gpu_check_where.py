"""The first section of ``benchmarks/gpu_check.py``: where a decode step's time goes, at both shapes.

Why first: when the rollout misses its targets, these figures say why, and they cost under two
minutes. For each shape (SmolLM2-135M-like, 30 layers, 512 rows; Qwen2.5-1.5B-like, 256 rows;
keys 192 long: a 64-token prompt plus half of 256 new tokens), the engine's own step
(``decode_step.decode_step`` over a ``SlotCache``) is measured by itself:

- ``attention``: the SDPA calls the engine makes in a short real ``generate`` -- recorded from its
  prefill and its decode -- replayed under each backend of ``torch.nn.attention.sdpa_kernel``:
  which accept the call (the one torch picks is among them; math is the slow one);
- ``graph`` (CUDA): whether the step captures as a CUDA graph (``StepGraphs``, the engine's own),
  the error if not, host syncs in a warm eager step (``torch.cuda.set_sync_debug_mode``), and the
  time per replay against the eager step;
- ``profile``: one warm eager step under ``torch.profiler``: aten operations (top-level and all),
  device kernels and GPU-busy time, the step's wall time;
- ``step_ops``: ``trinity_like.explorer.step_ops.count_decode_step_ops``, the project's own count
  of operations and kernels per warm decode step (absent from a tree that lacks it: recorded as
  unavailable); ``smollm2-135m/step_ops_cpu`` counts the 30-layer shape on the CPU in every mode.

On the CPU (``--tiny``) the tiny shape runs what a CPU can: backends, operations, step time.
"""

from __future__ import annotations

import functools
import statistics
import time
import warnings
from collections import Counter
from typing import Any

import torch
from gpu_check_parts import Check, sync
from gpu_check_run import Entry

from trinity_like.explorer.decode_step import SlotState, StepGraphs, StepSettings, decode_step
from trinity_like.explorer.engine import NativeEngine, SamplingParams
from trinity_like.explorer.kv_cache import SlotCache, use_attention
from trinity_like.models.device import precision
from trinity_like.models.shapes import shaped_model

# shape -> (rows of a decode step, key length)
SHAPES = {"smollm2-135m": (512, 192), "qwen2.5-1.5b": (256, 192)}
TINY = {"tiny": (16, 48)}
HEADROOM = 48  # steps a harness may take: its rows start this far below the key length
STEP_OPS = "trinity_like.explorer.step_ops"
CPU_OPS_SHAPE = (64, 256)  # rows, key length of the CPU count at the 30-layer shape (docs/gpu.md)


def entries(check: Check) -> list[Entry]:
    out: list[Entry] = []
    for shape, (rows, keys) in (TINY if check.tiny else SHAPES).items():
        out += shape_entries(check, shape, rows, keys)
    return [*out, Entry("smollm2-135m/step_ops_cpu", check.limit(20), cpu_step_ops)]


def cpu_step_ops() -> dict:
    """The count at SmolLM2-135M's shape on the CPU in float32 (64 rows, 256 keys), in every mode:
    the CPU's own operations (its norms and attention are more of them than CUDA's fused ones)."""
    from trinity_like.explorer.step_ops import count_decode_step_ops

    rows, key_length = CPU_OPS_SHAPE
    model = shaped_model("smollm2-135m", device=torch.device("cpu"), dtype=torch.float32)
    counted = count_decode_step_ops(model, rows=rows, key_length=key_length)
    out = {"device": "cpu", "dtype": "float32", "rows": rows, "key_length": key_length}
    return {**out, "total": counted["total"], "kernels": counted["kernels"], "by_op": top_ops(counted)}


def top_ops(counted: dict) -> dict:
    return dict(Counter(counted["by_op"]).most_common(12))


class Harness:
    """One decode step of the engine over ``rows`` slots at ``key_length`` keys, repeatable: every
    row is live, starts ``HEADROOM`` positions below the key length and never reaches its cap."""

    def __init__(self, model, rows: int, key_length: int) -> None:
        cfg, device = model.config, model.device
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.model, self.rows, self.key_length, self.steps = model, rows, key_length, 0
        self.cache = SlotCache(
            num_layers=cfg.num_hidden_layers,
            num_slots=rows,
            num_kv_heads=cfg.num_key_value_heads,
            max_length=key_length,
            head_dim=head_dim,
            dtype=model.dtype,
            device=device,
        )
        self.state = SlotState(rows, HEADROOM + 16, key_length, device)
        self.state.admit(list(range(rows)), [key_length - HEADROOM] * rows, list(range(rows)))
        self.settings = StepSettings(
            greedy=False, temperature=1.0, top_k=0, top_p=1.0, stop_ids=(), max_new=HEADROOM + 16
        )
        self.stop_ids = self.state.stop_tensor(self.settings)

    def __call__(self) -> None:
        self.steps += 1
        if self.steps > HEADROOM:
            raise RuntimeError(f"the harness ran past its {HEADROOM} steps (positions would pass the cache)")
        with torch.inference_mode(), use_attention(self.model):
            decode_step(self.model, self.cache, self.state, self.rows, self.key_length, self.settings, self.stop_ids)


def shape_entries(check: Check, shape: str, rows: int, key_length: int) -> list[Entry]:
    device = check.device
    cuda = device.type == "cuda"

    @functools.cache
    def model():
        return shaped_model(shape, device=device, dtype=precision(device).rollout)

    def describe() -> dict:
        m = model()
        info = {"rows": rows, "key_length": key_length, "dtype": str(m.dtype).removeprefix("torch.")}
        return {**info, "layers": m.config.num_hidden_layers, "params_m": round(m.num_parameters() / 1e6, 1)}

    def attention() -> dict:
        calls = recorded_sdpa_calls(model(), prompts=4, group=2, prompt_len=64, new=8)
        out: dict[str, Any] = describe()
        for phase in ("prefill", "decode"):
            call = calls.get(phase)
            if call is None:
                out[phase] = {
                    "call": "no SDPA call (the CPU decode path: two matmuls)" if phase == "decode" else "none"
                }
                continue
            out[phase] = {"call": call_summary(*call), "backends": backends_accepting(*call)}
        return out

    def graph() -> dict:
        if not cuda:
            return {"status": "skipped: CUDA graphs and host syncs are CUDA only"}
        h = Harness(model(), rows, key_length)
        h(), h()  # warm: cuBLAS handles, the allocator
        syncs = host_syncs(h)
        eager_ms = per_step_ms(device, h, 5)
        graphs = StepGraphs()
        graphs.run("step", h)  # a real eager step on a side stream, then the capture
        out: dict[str, Any] = {"host_syncs_in_warm_step": syncs, "eager_step_ms": eager_ms}
        out["captured"] = graphs.failed is None and "step" in graphs.graphs
        out["capture_error"] = graphs.failed
        if out["captured"]:
            replay = graphs.graphs["step"].replay
            out["replay_ms"] = per_step_ms(device, lambda: (replay(), setattr(h, "steps", h.steps + 1)), 20)
        return out

    def profile() -> dict:
        h = Harness(model(), rows, key_length)
        h(), h()
        return profiled_step(device, h)

    def step_ops() -> dict:
        try:
            from trinity_like.explorer.step_ops import count_decode_step_ops
        except ModuleNotFoundError as exc:
            if exc.name != STEP_OPS:
                raise
            return {"status": "unavailable", "error": f"{type(exc).__name__}: {exc}"}
        counted = count_decode_step_ops(model(), rows=rows, key_length=key_length)
        return {"total": counted["total"], "kernels": counted["kernels"], "by_op": top_ops(counted)}

    return [
        Entry(f"{shape}/attention", check.limit(15), attention),
        Entry(f"{shape}/graph", check.limit(10), graph),
        Entry(f"{shape}/profile", check.limit(10), profile),
        Entry(f"{shape}/step_ops", check.limit(5), step_ops),
    ]


def recorded_sdpa_calls(model, prompts: int, group: int, prompt_len: int, new: int) -> dict[str, tuple]:
    """The first SDPA call of the engine's prefill and of its decode in a real ``generate``:
    ``(args, kwargs)`` with the tensors cloned. The phase is read from the forward's input: one
    token per row is a decode step."""
    F = torch.nn.functional
    real = F.scaled_dot_product_attention
    phase = {"now": "prefill"}
    calls: dict[str, tuple] = {}

    def hook(_module, _args, kwargs):
        ids = kwargs.get("input_ids")
        phase["now"] = "decode" if ids is not None and ids.shape[1] == 1 else "prefill"

    def recording(*args, **kwargs):
        if phase["now"] not in calls:
            clone = lambda v: v.clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
            calls[phase["now"]] = (tuple(clone(a) for a in args), {k: clone(v) for k, v in kwargs.items()})
        return real(*args, **kwargs)

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    F.scaled_dot_product_attention = recording  # the real function, called through: only the arguments are kept
    try:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(3, model.config.vocab_size, (prompts, prompt_len), generator=g).tolist()
        engine = NativeEngine(model)
        engine.generate(ids, SamplingParams(n=group, max_new_tokens=new, seed=0, stop_token_ids=()))
        engine.release_memory()
    finally:
        F.scaled_dot_product_attention = real
        handle.remove()
    return calls


def call_summary(args: tuple, kwargs: dict) -> dict:
    q, k = args[0], args[1]
    mask = kwargs.get("attn_mask")
    return {
        "query": list(q.shape),
        "key": list(k.shape),
        "dtype": str(q.dtype).removeprefix("torch."),
        "mask": None if mask is None else f"{list(mask.shape)} {str(mask.dtype).removeprefix('torch.')}",
        "is_causal": bool(kwargs.get("is_causal", False)),
        "enable_gqa": bool(kwargs.get("enable_gqa", False)),
        "key_contiguous": k.is_contiguous(),
    }


def backends_accepting(args: tuple, kwargs: dict) -> dict[str, str]:
    """Each SDPA backend on the recorded call: ``accepts``, or the first line of its refusal."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = {}
    for backend in (
        SDPBackend.FLASH_ATTENTION,
        SDPBackend.EFFICIENT_ATTENTION,
        SDPBackend.CUDNN_ATTENTION,
        SDPBackend.MATH,
    ):
        try:
            with sdpa_kernel(backend), warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch explains each refusal in a warning, then raises
                torch.nn.functional.scaled_dot_product_attention(*args, **kwargs)
            out[backend.name.lower()] = "accepts"
        except (RuntimeError, NotImplementedError, ValueError, TypeError) as exc:  # how backends refuse a call
            out[backend.name.lower()] = f"refuses: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    return out


def host_syncs(step) -> int:
    """Synchronising CUDA calls made by one ``step`` (torch's sync debug mode warns on each)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sum("synchroniz" in str(w.message) for w in caught)


def per_step_ms(device: torch.device, step, reps: int) -> float:
    times = []
    for _ in range(reps):
        sync(device)
        t0 = time.perf_counter()
        step()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def profiled_step(device: torch.device, step) -> dict:
    """One ``step`` under ``torch.profiler``: operations, kernels, GPU-busy and wall time."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    sync(device)
    with profile(activities=activities) as prof:
        t0 = time.perf_counter()
        step()
        sync(device)
        wall_ms = (time.perf_counter() - t0) * 1e3
    events = prof.events()
    aten = [e for e in events if e.name.startswith("aten::") and e.device_type == DeviceType.CPU]
    top = [e for e in aten if not _under_aten(e)]
    kernels = [e for e in events if e.device_type == DeviceType.CUDA]  # kernels, memcpys and memsets
    out: dict[str, Any] = {
        "aten_ops_top_level": len(top),
        "aten_ops_all": len(aten),
        "top_level_by_op": dict(Counter(e.name for e in top).most_common(12)),
        "profiled_step_ms": wall_ms,
        "step_ms": per_step_ms(device, step, 3),
    }
    if device.type == "cuda":
        busy_us = sum(e.time_range.elapsed_us() for e in kernels)  # one stream: kernels do not overlap
        out.update(kernels=len(kernels), gpu_busy_ms=busy_us / 1e3, gpu_busy_share=busy_us / 1e3 / max(wall_ms, 1e-9))
    return out


def _under_aten(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False
