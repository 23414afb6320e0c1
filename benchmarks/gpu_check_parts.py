"""The plumbing, bandwidth, CUDA-test and rollout sections of ``benchmarks/gpu_check.py`` (see that
module for what and why). A section is a function of the :class:`Check` returning its entries
(``gpu_check_run.Entry``); what entries share -- a model, a workload -- is built once, by the
first entry that needs it, so an entry run alone (its own process, a restart) builds it too."""

from __future__ import annotations

import functools
import gc
import importlib.metadata
import statistics
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from gpu_check_run import Entry
from harness import cpu_model

from trinity_like.explorer.engine import NativeEngine, SamplingParams
from trinity_like.models.device import precision
from trinity_like.models.shapes import shaped_model
from trinity_like.models.tiny import build_tiny_tokenizer
from trinity_like.plugins import ENV_VAR, entry_points, load_plugins

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_PLUGIN = ROOT / "plugins" / "example_plugin" / "src" / "example_plugin"
PACKS = "algorithms" + ":" + "cookbook"  # the first-party packs, by module name where they are not installed
CUDA_TESTS = (
    "tests/algorithms/test_cuda.py",
    "tests/explorer/test_sampling.py",
    "tests/explorer/test_engine_cuda.py",
    "tests/trainer/test_device.py",
)
# (prompts, samples per prompt, prompt tokens, new tokens) of the rollout shapes
ROLLOUT_SHAPES = {"smollm2-135m": (64, 8, 64, 256), "qwen2.5-1.5b": (32, 8, 64, 256)}
TINY_ROLLOUT = {"tiny": (4, 4, 16, 24)}


@dataclass
class Check:
    """What every section reads: the device, the workload sizes, a scratch folder shared by the
    check's processes, and the report's sections finished before this one."""

    device: torch.device
    tiny: bool
    work: Path
    context: dict = field(default_factory=dict)
    scale: float = 1.0  # every limit's factor (gpu_check.py: x3 in tiny mode, times --limit-scale)

    def limit(self, seconds: float) -> float:
        """An entry's limit: the seconds it is given on an H100/H200, scaled."""
        return seconds * self.scale


# -- plumbing --------------------------------------------------------------------------------
def plugin_env() -> dict[str, str]:
    """This process's environment for a child, plus the first-party packs by module name when they
    are not installed (a GPU machine runs the checkout from its folder: no entry points there)."""
    import os

    env = dict(os.environ)
    if not entry_points():
        env[ENV_VAR] = PACKS if not env.get(ENV_VAR) else f"{PACKS}{os.pathsep}{env[ENV_VAR]}"
    env.setdefault("RAY_AUTH_MODE", "disabled")
    return env


def load_packs() -> None:
    """The first-party packs in this process: through their entry points, or by module name."""
    load_plugins([] if entry_points() else PACKS.split(":"))


def junit_counts(report: Path) -> dict[str, int]:
    """Passed / failed / skipped / errors of a pytest ``--junitxml`` report."""
    if not report.is_file():
        return {"passed": 0, "failed": 0, "skipped": 0, "errors": 0}
    suite = ET.parse(report).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    tests, failures = int(suite.get("tests", 0)), int(suite.get("failures", 0))
    errors, skipped = int(suite.get("errors", 0)), int(suite.get("skipped", 0))
    return {"passed": tests - failures - errors - skipped, "failed": failures, "skipped": skipped, "errors": errors}


def version_of(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} ({device})"
    return f"cpu: {cpu_model()}"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], Any]) -> tuple[float, Any]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


def free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


# -- bandwidth -------------------------------------------------------------------------------
def copy_bandwidth(device: torch.device, nbytes: int, reps: int = 10) -> float:
    """GB/s of a device-to-device copy, counting bytes read + written (the best of ``reps``)."""
    buffers = torch.empty((2, nbytes), dtype=torch.uint8, device=device).fill_(1)
    buffers[1].copy_(buffers[0])  # warm
    best = min(timed(device, lambda: buffers[1].copy_(buffers[0]))[0] for _ in range(reps))
    return 2 * nbytes / best / 1e9


def bandwidth_entries(check: Check) -> list[Entry]:
    def copy() -> dict:
        gbs = copy_bandwidth(check.device, 2**26 if check.tiny else 2**30)
        return {"bytes_per_s": gbs * 1e9, "gb_per_s": gbs}

    return [Entry("copy", check.limit(5), copy)]


def measured_bandwidth(check: Check) -> tuple[float, str]:
    """GB/s from the ``bandwidth`` section when it ran (``--only rollout`` runs without it: then a
    smaller copy measured here), and where the figure comes from."""
    copy = check.context.get("bandwidth", {}).get("entries", {}).get("copy", {})
    if "gb_per_s" in copy:
        return copy["gb_per_s"], "the bandwidth section"
    return copy_bandwidth(check.device, 2**26 if check.tiny else 2**28), "measured by this section (256 MiB copy)"


def decode_bound(model: torch.nn.Module, rows: int, prompt_len: int, new: int, bytes_per_s: float) -> float:
    """Tokens/s if each decode step only read the weights once and every row's KV cache (at its mean
    length over the run) at the measured bandwidth: the ceiling of a memory-bound decoder."""
    cfg = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())  # a tied matrix once
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    itemsize = next(model.parameters()).element_size()
    per_token = cfg.num_hidden_layers * 2 * cfg.num_key_value_heads * head_dim * itemsize
    mean_keys = prompt_len + (new - 1) / 2
    return rows * bytes_per_s / (weights + rows * per_token * mean_keys)


# -- CUDA tests ------------------------------------------------------------------------------
def cuda_test_entries(check: Check) -> list[Entry]:
    """``pytest -m gpu`` over each file of :data:`CUDA_TESTS`, one entry (and one time limit) per file;
    a timeout keeps the output so far (which test hung)."""

    def one(path: str) -> Callable[[], dict]:
        def run() -> dict:
            report = check.work / f"{Path(path).stem}.xml"
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", f"--junitxml={report}"]
            out: dict[str, Any] = {"command": f"python -m pytest -q -m gpu {path}"}
            try:  # ended here, under the entry's limit, so that its output tail is kept
                proc = subprocess.run(
                    [*cmd, path], cwd=ROOT, env=plugin_env(), capture_output=True, text=True, timeout=limit - 3
                )
            except subprocess.TimeoutExpired as exc:
                tail = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout or ""
                return {
                    **out,
                    "status": "timeout",
                    "error": f"pytest killed after {limit - 3:.0f} s",
                    "tail": tail[-1500:],
                }
            out.update(returncode=proc.returncode, tail=proc.stdout[-1500:], **junit_counts(report))
            if proc.returncode not in (0, 5):  # 5: nothing collected (no gpu test left in the file)
                out.update(status="failed", error=f"pytest exited with {proc.returncode}")
            elif check.device.type != "cuda":
                out["note"] = "no CUDA device: the tests skip here (run to exercise this path)"
            return out

        return run

    limit = check.limit(20)
    # On the CPU every test skips: the first file alone exercises this path (the rest would add
    # nothing but start-up time).
    files = CUDA_TESTS if check.device.type == "cuda" else CUDA_TESTS[:1]
    return [Entry(Path(p).stem, limit, one(p)) for p in files]


# -- rollout ---------------------------------------------------------------------------------
def hf_generate(model, ids: list[list[int]], group: int, new: int, static: bool) -> int:
    """``model.generate`` sampling ``group`` per prompt, exactly ``new`` tokens each; returns the tokens made."""
    x = torch.tensor(ids, device=model.device)
    kwargs: dict[str, Any] = dict(
        input_ids=x,
        attention_mask=torch.ones_like(x),
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=new,
        min_new_tokens=new,
        num_return_sequences=group,
        pad_token_id=model.generation_config.pad_token_id,
    )
    if static:
        kwargs["cache_implementation"] = "static"  # compiled by generate itself on CUDA (transformers' auto-compile)
    with torch.inference_mode():
        out = model.generate(**kwargs)
    return int(out.shape[0] * (out.shape[1] - x.shape[1]))


def rollout_entries(check: Check) -> list[Entry]:
    shapes = TINY_ROLLOUT if check.tiny else ROLLOUT_SHAPES
    entries = []
    for shape, (prompts, group, prompt_len, new) in shapes.items():
        entries += rollout_shape(check, shape, prompts, group, prompt_len, new)
    return entries


def rollout_shape(check: Check, shape: str, prompts: int, group: int, prompt_len: int, new: int) -> list[Entry]:
    """The workload of one shape, then each contender as an entry: a warm-up, then timed runs (medians).

    The compiled contender runs in a process of its own (a slow compile is ended at its limit and
    its compile state never reaches the others); the plugin engine is ``generate`` with a logits
    processor: warmed up by the plain ``generate`` before it, timed once.
    """
    device, reps = check.device, 1

    @functools.cache
    def workload() -> dict[str, Any]:
        load_plugins([str(EXAMPLE_PLUGIN)])
        dtype = precision(device).rollout
        model = shaped_model(shape, device=device, dtype=dtype)
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(3, model.config.vocab_size, (prompts, prompt_len), generator=g).tolist()
        gbs, source = measured_bandwidth(check)
        info = {
            "rows": prompts * group,
            "prompts": prompts,
            "group": group,
            "prompt_tokens": prompt_len,
            "new_tokens": new,
            "dtype": str(dtype).removeprefix("torch."),
            "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
            "bandwidth_gb_per_s": gbs,
            "bandwidth_from": source,
            "decode_bound_tokens_per_s": decode_bound(model, prompts * group, prompt_len, new, gbs * 1e9),
        }
        return {"model": model, "ids": ids, "info": info}

    sp = SamplingParams(n=group, max_new_tokens=new, temperature=1.0, seed=1, stop_token_ids=())

    def contender(name: str, make: Callable[[dict], Callable[[], int]], warm: bool = True) -> Callable[[], dict]:
        def run() -> dict:
            w = workload()
            fn = make(w)
            torch.manual_seed(0)
            warm_s = timed(device, fn)[0] if warm else 0.0
            runs = [timed(device, fn) for _ in range(reps)]
            seconds = statistics.median(t for t, _ in runs)
            made = runs[0][1]
            entry = {"tokens": made, "warmup_s": round(warm_s, 2), "seconds": seconds, "tokens_per_s": made / seconds}
            entry["fraction_of_bound"] = entry["tokens_per_s"] / w["info"]["decode_bound_tokens_per_s"]
            if name == "generate_static_compiled":
                entry["compiled"] = getattr(w["model"], "_compiled_call", None) is not None
            if name == "ours":
                engine = w.pop("engine")
                entry.update(engine.workspace_stats())
                engine.release_memory()
            free(device)
            return entry

        return run

    def ours(w: dict) -> Callable[[], int]:
        engine = w["engine"] = NativeEngine(w["model"], build_tiny_tokenizer())

        def go() -> int:
            return sum(len(s.token_ids) for grp in engine.generate(w["ids"], sp) for s in grp)

        return go

    def plugin(w: dict) -> Callable[[], int]:
        from trinity_like.explorer.engine_contract import generate as contract_generate
        from trinity_like.registry import ROLLOUT_ENGINE

        engine = ROLLOUT_ENGINE.get("hf_generate").over(w["model"], build_tiny_tokenizer())
        return lambda: sum(len(s.token_ids) for grp in contract_generate(engine, w["ids"], sp) for s in grp)

    def generate(static: bool) -> Callable[[dict], Callable[[], int]]:
        return lambda w: lambda: hf_generate(w["model"], w["ids"], group, new, static=static)

    def info() -> dict:
        return dict(workload()["info"])

    return [
        Entry(f"{shape}/workload", check.limit(15), info),
        Entry(f"{shape}/ours", check.limit(15), contender("ours", ours)),
        Entry(f"{shape}/generate", check.limit(20), contender("generate", generate(False))),
        Entry(f"{shape}/hf_generate_engine", check.limit(12), contender("hf", plugin, warm=False)),
        Entry(
            f"{shape}/generate_static_compiled",
            check.limit(40),
            contender("generate_static_compiled", generate(True)),
            own_process=True,
        ),
    ]
