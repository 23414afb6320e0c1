"""The GPU check: every GPU claim of the project measured in one job of at most 7 minutes on an H100.

    python benchmarks/gpu_check.py                          # a GPU machine (docs/gpu.md: the one command)
    python benchmarks/gpu_check.py --device cpu --tiny      # the same code paths on the CPU, tiny shapes (CI)

Writes ``benchmarks/results/gpu_check.{json,md}`` (``--out``), rewritten after every section so
a job stopped at its time limit still leaves what it measured. Sections, in order:

- ``cuda_tests``: ``pytest -m gpu`` over the CUDA test files (:data:`CUDA_TESTS`);
- ``bandwidth``: the device's copy bandwidth (bytes read + written per second over a large copy);
- ``rollout``: our engine at its defaults against ``transformers`` ``generate`` -- plain, and with a
  static cache + ``torch.compile`` -- and against the example plugin's ``hf_generate`` engine, at the
  SmolLM2-135M (64 prompts x 8) and Qwen2.5-1.5B (32 x 8) shapes with random weights, 64-token
  prompts, 256 sampled tokens, no early stop, temperature 1; warm-up at full size before timing;
  beside each figure the decode-bandwidth bound: measured bandwidth over the bytes one decode step
  must read (the weights once, plus the KV cache at its mean length), times the rows;
- ``train_step``: one GRPO update (the recipe's objective, AdamW) of the local engine against the
  same update in plain torch (padded forward, full logits), 64 rows x (64 + 256) tokens, 135M shape;
- ``grpo_run``: ``trinity-like run`` of ``examples/grpo_arith.yaml`` itself -- local engine,
  explorer in the same process, Ray unimportable -- on random 135M-shaped weights, 20 steps;
- ``parity``: one tiny-model GRPO step on the device against the same step on the CPU (losses and
  updated weights; float32, and the device's default precision).

The issue's targets (docs/gpu.md) are checked at the end of the markdown. ``--tiny`` shrinks every
workload to the tiny shape (seconds on a CPU): it proves the code runs, its numbers mean nothing.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
import traceback  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from anywhere, installed or not (a GPU machine's copy is not)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_parts as parts  # noqa: E402

from trinity_like.models.device import resolve_device  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
CUDA_TESTS = (
    "tests/algorithms/test_cuda.py",
    "tests/explorer/test_sampling.py",
    "tests/explorer/test_engine_cuda.py",
    "tests/trainer/test_device.py",
)
BUDGET_S = 420.0  # the job's 7 minutes


@dataclass
class Check:
    """What every section reads: the device, the workload sizes, the clock."""

    device: torch.device
    tiny: bool
    work: Path
    deadline: float
    results: dict = field(default_factory=dict)

    def left(self) -> float:
        return self.deadline - time.monotonic()


def cuda_tests(check: Check) -> dict:
    if check.device.type != "cuda":
        return {"status": "skipped: no CUDA device (the tests skip there)"}
    report = check.work / "cuda_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", f"--junitxml={report}"]
    proc = subprocess.run([*cmd, *CUDA_TESTS], cwd=ROOT, env=parts.plugin_env(), capture_output=True, text=True)
    out = {"command": " ".join(["python -m pytest -q -m gpu", *CUDA_TESTS]), "returncode": proc.returncode}
    out.update(parts.junit_counts(report))
    out["tail"] = proc.stdout[-1500:]
    if proc.returncode != 0:
        out["status"] = "failed"
    return out


def bandwidth(check: Check) -> dict:
    gib = parts.copy_bandwidth(check.device, 2**26 if check.tiny else 2**30)
    check.results["bandwidth_gbs"] = gib
    return {"bytes_per_s": gib * 1e9, "gb_per_s": gib}


def rollout(check: Check) -> dict:
    shapes = (
        {"tiny": (4, 4, 16, 24)} if check.tiny else {"smollm2-135m": (64, 8, 64, 256), "qwen2.5-1.5b": (32, 8, 64, 256)}
    )
    out = {}
    for shape, (prompts, group, prompt_len, new) in shapes.items():
        out[shape] = parts.rollout_shape(check, shape, prompts, group, prompt_len, new)
        parts.free(check.device)
    return out


def train_step(check: Check) -> dict:
    shape = "tiny" if check.tiny else "smollm2-135m"
    rows, group, prompt_len, response_len = (8, 4, 16, 32) if check.tiny else (64, 8, 64, 256)
    out = parts.train_step(check, shape, rows, group, prompt_len, response_len, micro_batch=8)
    parts.free(check.device)
    return out


def grpo_run(check: Check) -> dict:
    return parts.grpo_run(check, "tiny" if check.tiny else "smollm2-135m")


def parity(check: Check) -> dict:
    return parts.parity(check)


SECTIONS = {
    "cuda_tests": cuda_tests,
    "bandwidth": bandwidth,
    "rollout": rollout,
    "train_step": train_step,
    "grpo_run": grpo_run,
    "parity": parity,
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (auto: CUDA when torch sees one)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and workloads (the CPU smoke run)")
    parser.add_argument("--budget-s", type=float, default=BUDGET_S, help="stop starting timed work past this")
    parser.add_argument("--only", nargs="*", choices=list(SECTIONS), help="run these sections alone")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_check", help="writes OUT.json and OUT.md")
    parser.add_argument("--commit", help="the commit measured, where the tree has no git repository (a GPU machine)")
    args = parser.parse_args(argv)
    device = resolve_device(args.device, where="--device")
    start = time.monotonic()
    command = "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:] if argv is None else argv)
    meta = {
        "command": command.strip(),
        "commit": args.commit or parts.git_commit(),
        "device": parts.device_name(device),
        "torch": torch.__version__,
        "transformers": parts.version_of("transformers"),
        "python": platform.python_version(),
        "tiny": args.tiny,
        "budget_s": args.budget_s,
    }
    report: dict = {"meta": meta, "sections": {}}
    failed = []
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        check = Check(device, args.tiny, Path(work), start + args.budget_s)
        for name, section in SECTIONS.items():
            if args.only and name not in args.only:
                continue
            t0 = time.monotonic()
            print(f"gpu_check: {name} ...", file=sys.stderr, flush=True)
            try:
                result = section(check)
            except Exception as exc:  # noqa: BLE001 -- recorded, reported FAILED, and the exit code says so
                result = {
                    "status": "failed",
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-3000:],
                }
            if result.get("status") == "failed":
                failed.append(name)
            result["seconds"] = round(time.monotonic() - t0, 1)
            report["sections"][name] = result
            meta["wall_s"] = round(time.monotonic() - start, 1)
            parts.write(report, args.out)
    text = parts.write(report, args.out)
    print(text)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
