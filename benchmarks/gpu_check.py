"""The GPU check: every GPU claim of the project measured in one job of at most 6 minutes on an H100/H200.

    python benchmarks/gpu_check.py                          # a GPU machine (docs/gpu.md: the one command)
    python benchmarks/gpu_check.py --device cpu --tiny      # the same code paths on the CPU, tiny shapes (CI)

Writes ``benchmarks/results/gpu_check.{json,md}`` (``--out``; the children's logs beside them in
``OUT_logs/``), rewritten atomically after every finished entry. Every section runs in a child
process under its own time limit, every entry in it under its own; a failed or hung entry is
recorded with its error and the rest run (``gpu_check_run.py``). Sections, in order, with the
seconds the plan gives each (:data:`PLAN_S`; time a section leaves unused goes to the next ones;
a section whose time is gone is skipped with the reason):

- ``where_time``: where a decode step's time goes, at both shapes -- the SDPA backend prefill and
  decode get, CUDA-graph capture, host syncs in a warm step, replay time, operations and GPU-busy
  time per step (``gpu_check_where.py``);
- ``parity``: one tiny GRPO step on the device against a float64 reference, judged by tolerances
  measured in the same run on the CPU (``gpu_check_parity.py``);
- ``cuda_tests``: ``pytest -m gpu``, one entry per file of :data:`CUDA_TESTS`;
- ``bandwidth``: the device's copy bandwidth (bytes read + written per second over a large copy);
- ``rollout``: our engine at its defaults against ``transformers`` ``generate`` -- plain, and with a
  static cache + ``torch.compile`` (in a process of its own) -- and against the example plugin's
  ``hf_generate`` engine, at the SmolLM2-135M (64 prompts x 8) and Qwen2.5-1.5B (32 x 8) shapes with
  random weights, 64-token prompts, 256 sampled tokens, no early stop, temperature 1; beside each
  figure the decode-bandwidth bound (measured bandwidth over the bytes one decode step must read);
- ``train_step``: one GRPO update (the recipe's objective, AdamW) of the local engine against the
  same update in plain torch (padded forward, full logits), 64 rows x (64 + 256) tokens, 135M shape;
- ``grpo_run``: ``trinity-like run`` of ``examples/grpo_arith.yaml`` itself -- local engine,
  explorer in the same process, Ray unimportable -- on random 135M-shaped weights, 10 steps.

``--tiny`` shrinks every workload to the tiny shape (seconds on a CPU): it proves the code runs,
its numbers mean nothing; its limits are :data:`TINY_SLACK` times the plan's (a loaded CPU).
``--limit-scale`` multiplies every limit and the budget (a slower card; the tests' short limits).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from anywhere, installed or not (a GPU machine's copy is not)
sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_check_run as runner  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
BUDGET_S = 360.0  # the job's 6 minutes, by the check's own clock
# Seconds per section on an H100/H200 (the sum leaves BUDGET_S - 340 s for start-up and children).
PLAN_S = {
    "where_time": 75.0,
    "parity": 15.0,
    "cuda_tests": 60.0,
    "bandwidth": 5.0,
    "rollout": 130.0,
    "train_step": 25.0,
    "grpo_run": 30.0,
}
TINY_SLACK = 3.0
MIN_SECTION_S = 3.0  # less than this left: the section is skipped, with the reason


def sections() -> dict:
    """Section name -> ``fn(check) -> list[Entry]`` (imported here: the parent never loads torch)."""
    import gpu_check_parity
    import gpu_check_parts as parts
    import gpu_check_train as train
    import gpu_check_where

    return {
        "where_time": gpu_check_where.entries,
        "parity": gpu_check_parity.entries,
        "cuda_tests": parts.cuda_test_entries,
        "bandwidth": parts.bandwidth_entries,
        "rollout": parts.rollout_entries,
        "train_step": train.train_step_entries,
        "grpo_run": train.grpo_run_entries,
    }


def child(args: argparse.Namespace) -> int:
    """One section in this process (``--child NAME``): its entries, each recorded in ``--events``."""
    import gpu_check_parts as parts
    import torch

    from trinity_like.models.device import resolve_device

    device = resolve_device(args.device, where="--device")
    context = json.loads(Path(args.context).read_text()) if args.context else {"sections": {}}
    check = parts.Check(device, args.tiny, Path(args.work), context["sections"], scale=scale_of(args))
    torch.manual_seed(0)
    own = [sys.executable, str(Path(__file__).resolve()), "--child", args.child, "--device", args.device]
    own += ["--work", args.work, "--context", args.context or "", "--events", args.events]
    own += ["--tiny"] if args.tiny else []
    own += ["--limit-scale", str(args.limit_scale)]
    events = runner.Events(Path(args.events))
    env = {"device": parts.device_name(device), "torch": torch.__version__}
    events.write(event="env", env={**env, "transformers": parts.version_of("transformers")})
    listed = lambda: sections()[args.child](check)  # noqa: E731
    runner.run_entries(args.child, listed, events, set(args.skip), args.entry, own)
    return 0


def scale_of(args: argparse.Namespace) -> float:
    return (TINY_SLACK if args.tiny else 1.0) * args.limit_scale


def section_limits(name: str, started: float, budget: float, spent: dict[str, float], slack: float) -> float:
    """The seconds section ``name`` may take: its plan plus what earlier sections left unused, within the budget."""
    saved = sum(PLAN_S[n] * slack - s for n, s in spent.items())
    left = budget - (time.monotonic() - started)
    return min(PLAN_S[name] * slack + max(0.0, saved), left - 1.0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (auto: CUDA when torch sees one)")
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and workloads (the CPU smoke run)")
    parser.add_argument("--budget-s", type=float, help=f"the whole check's seconds (default {BUDGET_S:.0f}; tiny x3)")
    parser.add_argument("--limit-scale", type=float, default=1.0, help="multiply every time limit and the budget")
    parser.add_argument("--only", nargs="+", choices=list(PLAN_S), help="run these sections alone")
    parser.add_argument("--out", type=Path, default=RESULTS / "gpu_check", help="writes OUT.json, OUT.md, OUT_logs/")
    parser.add_argument("--commit", help="the commit measured, where the tree has no git repository (a GPU machine)")
    for hidden in ("--child", "--work", "--context", "--events", "--entry"):
        parser.add_argument(hidden, help=argparse.SUPPRESS)
    parser.add_argument("--skip", nargs="*", default=[], help=argparse.SUPPRESS)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.child:
        return child(args)
    return parent(args, "python benchmarks/gpu_check.py " + " ".join(sys.argv[1:] if argv is None else argv))


def parent(args: argparse.Namespace, command: str) -> int:
    import gpu_check_report

    start = time.monotonic()
    slack = scale_of(args)
    budget = args.budget_s if args.budget_s is not None else BUDGET_S * slack
    names = [n for n in PLAN_S if not args.only or n in args.only]
    meta = {
        "command": command.strip(),
        "commit": args.commit or runner.git_commit(ROOT),
        "device": args.device,
        "python": platform.python_version(),
        "tiny": args.tiny,
        "budget_s": budget,
        "plan_s": {n: PLAN_S[n] * slack for n in names},
    }
    report: dict = {"meta": meta, "sections": {}}
    out: Path = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    logs = out.with_name(out.name + "_logs")
    logs.mkdir(exist_ok=True)

    def write() -> None:
        meta["wall_s"] = round(time.monotonic() - start, 1)
        runner.write_atomically(out.with_suffix(".json"), json.dumps(report, indent=1, default=str))
        runner.write_atomically(out.with_suffix(".md"), gpu_check_report.markdown(report))

    spent: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="gpu-check-") as work:
        argv = [sys.executable, str(Path(__file__).resolve()), "--device", args.device, "--work", work]
        argv += ["--tiny"] if args.tiny else []
        argv += ["--limit-scale", str(args.limit_scale)]
        for name in names:
            limit = section_limits(name, start, budget, spent, slack)
            if limit < MIN_SECTION_S:
                report["sections"][name] = {"status": f"skipped: the budget is spent ({limit:.0f} s left)"}
                write()
                continue
            context = Path(work) / f"context-{name}.json"
            context.write_text(json.dumps(report, default=str))  # what earlier sections measured
            run = runner.SectionRun(name, limit)
            run.result["limit_s"] = round(limit, 1)
            report["sections"][name] = run.result
            write()
            runner.supervise(run, [*argv, "--child", name, "--context", str(context)], logs, write)
            spent[name] = run.result["seconds"]
            meta.update(run.result.pop("env", {}))  # the device's name and versions, as a child saw them
    write()
    print(out.with_suffix(".md").read_text())
    failed = [n for n, s in report["sections"].items() if s.get("status") == "failed"]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
