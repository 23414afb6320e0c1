"""Our contender in benchmarks/grpo_step.py: one online stage of the default GRPO recipe
(``examples/grpo_arith.yaml``, the workload overridden), stepped one loop ``step`` at a
time, with the phases and trained rows the step itself logs. See grpo_step.py for the workload."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import torch

# Our recipe keys per precision (bf16: the mixed path model.dtype auto gives where the CPU has bf16 units).
OUR_DTYPES = {
    "fp32": ["model.dtype=float32", "explorer.dtype=float32"],
    "bf16": ["model.dtype=auto", "explorer.dtype=bfloat16"],
}


def check_mixed_path() -> None:
    """``--precision bf16`` times our mixed path: stop where ``model.dtype=auto`` would train fp32 here."""
    from trinity_like.models.device import precision

    p = precision(torch.device("cpu"))
    if p.train_compute is None:
        raise SystemExit(
            f"--precision bf16: model.dtype auto trains fp32 on this CPU ({p.why}); "
            "TRINITY_LIKE_CPU_BF16=on forces the bf16 path"
        )


def bench_hooks() -> type:
    """The in-turn loop's own step hooks, without held-out evaluation or checkpoints (TRL does
    neither): the benchmark steps through the loop's ``step`` with them, patching no stage."""
    from trinity_like.pipeline.rl_loop import InTurn

    class BenchStep(InTurn):
        def evaluate(self, stage: Any, step: int) -> dict[str, float]:
            return {}

        def checkpoint(self, stage: Any, loop: Any, step: int) -> None:
            pass

    return BenchStep


class Ours:
    """One online stage of our default GRPO recipe, stepped one loop ``step`` at a time."""

    def __init__(self, name: str, args: argparse.Namespace, run_root: str) -> None:
        from trinity_like.config import load_plan
        from trinity_like.pipeline.build import build_stage
        from trinity_like.pipeline.rl_loop import LoopState

        engine, _, dyn = name.partition("-")
        self.overrides = [
            f"name=ours-{name}",
            f"run_root={run_root}",
            f"model.path={args.model}",
            f"model.max_response_tokens={args.max_new_tokens}",
            f"explorer.batch_size={args.prompts}",
            f"explorer.group_size={args.group}",
            "explorer.sampling.temperature=1.0",
            f"trainer.engine={engine}",
            f"trainer.micro_batch_size={args.micro_batch}",
            f"trainer.optimizer.lr={args.lr:.6e}",
            f"trainer.total_steps={args.steps + 1}",
            f"checkpoint.interval={10**6}",
            "monitor.eval_at_start=false",
            "monitor.eval_interval=0",
            "monitor.progress=false",
        ] + ([] if dyn else ["algorithm.dynamic_sampling=false"])
        self.overrides += OUR_DTYPES[args.precision]
        self.stage = load_plan(args.recipe, self.overrides).stages[0]
        if args.precision == "bf16":
            check_mixed_path()
        self.ctx = build_stage(self.stage, "both")
        self.hooks = bench_hooks()()
        self.loop = LoopState.resume(self.ctx)  # a fresh run directory: step 0
        self.step_no = 0

    def step(self) -> dict[str, Any]:
        from trinity_like.pipeline.rl_loop import step

        self.step_no += 1
        # the step's own metrics: its phases (time/update.forward_backward, .optim_step, time/sync.gather)
        # and what it trained (perf/train_rows, perf/batch_tokens), as every run logs them
        m: dict[str, Any] = dict(step(self.ctx, self.loop, self.hooks))
        m["rows_trained"], m["real_tokens"] = m.get("perf/train_rows", 0), m.get("perf/batch_tokens", 0.0)
        if "time/sync" in m and "time/sync.gather" in m:
            m["time/sync.transfer"] = m["time/sync"] - m["time/sync.gather"]
        m["train_s"] = m.get("time/update", 0.0)
        if "perf/train_tokens" in m:  # the engine's count: each group's prompt once
            m["run_tokens"], m["run_tokens_source"] = m["perf/train_tokens"], "`perf/train_tokens`"
        else:
            m["run_tokens"], m["run_tokens_source"] = m["real_tokens"], "real tokens of the rows"
        return m

    def steps(self, count: int) -> list[dict[str, Any]]:
        """``count`` steps, one record each, with the load average at its end."""
        return [{**self.step(), "load1": os.getloadavg()[0]} for _ in range(count)]

    def info(self) -> dict[str, Any]:
        return {
            "overrides": self.overrides,
            "dynamic_sampling": self.stage.dynamic_sampling,
            "verl_worker_threads": verl_worker_threads(),
        }

    def close(self) -> None:
        self.ctx.close()
        if "ray" in sys.modules:  # the Ray this process started goes with it
            import ray

            if ray.is_initialized():
                ray.shutdown()


def verl_worker_threads() -> list[dict[str, str]]:
    """OMP_NUM_THREADS and OS thread count of this process's verl workers (children of its raylet)."""

    def status(pid: str) -> dict[str, str]:
        rows = (Path("/proc") / pid / "status").read_text().splitlines()
        return {k: v.strip() for k, _, v in (r.partition(":") for r in rows)}

    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"TrinityVerlWorker" not in (proc / "cmdline").read_bytes():
                continue
            st = status(proc.name)
            if status(st["PPid"])["PPid"] != str(os.getpid()):
                continue
            env = dict(kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(b"\0") if b"=" in kv)
        except (OSError, KeyError):
            continue
        out.append(
            {
                "pid": proc.name,
                "OMP_NUM_THREADS": env.get(b"OMP_NUM_THREADS", b"unset").decode(),
                "os_threads": st.get("Threads", "?"),
            }
        )
    return out
