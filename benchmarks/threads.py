"""A run's step alone and beside a competing CPU-bound process: OpenMP's default wait policy
against the run's own (trinity_like/threads.py), interleaved.

    python benchmarks/threads.py                  # SmolLM2-135M, the main job's batch, local engine
    python benchmarks/threads.py --tiny           # tiny random model, one repetition (CI)

Each contender is ``trinity-like run --config examples/grpo_arith.yaml`` in its own process
and run folder, ``--steps`` steps; the figure is the median ``time/step`` of the steps after
the first (the first holds warm-up). Contenders differ only in the environment the run
starts with: ``default`` sets libgomp's own default spin count (300,000, what a process
gets with nothing set), ``ours`` sets nothing (the run chooses: :data:`trinity_like.threads.SPINCOUNT`),
``passive`` sets ``OMP_WAIT_POLICY=PASSIVE``. Beside each contender in the ``busy`` condition
runs a competitor: a float32 matmul loop with torch's default threads (one per core), the
shape of another training job on the same laptop. Order: every repetition runs each
(condition, contender) once, in a rotated order. Results: ``benchmarks/results/threads{_tiny}.{md,json}``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, ROOT, command, cpu_name, git_commit, interleaved, md_table, write_results  # noqa: E402

RECIPE = ROOT / "examples" / "grpo_arith.yaml"
CONTENDERS = {
    "default": {"GOMP_SPINCOUNT": "300000"},  # libgomp's default when nothing is set
    "ours": {},
    "passive": {"OMP_WAIT_POLICY": "PASSIVE"},
}
COMPETITOR = "import time, torch\na = torch.randn(768, 768)\nwhile True:\n    a @ a\n"


def step_times(label: str, env_extra: dict[str, str], overrides: list[str], root: Path) -> list[float]:
    name = f"threads_{label}"
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    env.update(env_extra)
    argv = [sys.executable, "-m", "trinity_like.cli", "run", "--config", str(RECIPE), f"run_root={root}"]
    argv += [f"name={name}", "monitor.progress=false", "monitor.eval_at_start=false", *overrides]
    out = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"threads: {label} failed (exit {out.returncode}): {out.stderr[-2000:]}")
    rows = [json.loads(line) for line in (root / name / "metrics.jsonl").read_text().splitlines()]
    return [r["time/step"] for r in rows if "time/step" in r]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tiny", action="store_true", help="tiny random model, one repetition (CI)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--contenders", default="default,ours,passive")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    reps = 1 if args.tiny else args.reps
    steps = 2 if args.tiny else args.steps
    overrides = ["trainer.engine=local", f"trainer.total_steps={steps}", "checkpoint.interval=1000"]
    overrides += ["buffer.eval_tasks.size=4"]
    if args.tiny:
        overrides += ["model.path=tiny-random", "explorer.batch_size=2", "explorer.group_size=4"]
    names = args.contenders.split(",")
    cells = [(cond, name) for cond in ("quiet", "busy") for name in names]

    def run(cell: tuple[str, str], rep: int) -> list[float]:
        cond, name = cell
        competitor = subprocess.Popen([sys.executable, "-c", COMPETITOR]) if cond == "busy" else None
        time.sleep(1.0 if competitor else 0.0)
        try:
            got = step_times(f"{cond}_{name}_{rep}", CONTENDERS[name], overrides, Path(tmp))
        finally:
            if competitor:
                competitor.kill(), competitor.wait()
        print(f"rep {rep} {cond:5s} {name:8s} steps {[round(t, 2) for t in got]}", flush=True)
        return got[1:] or got

    with tempfile.TemporaryDirectory(prefix="threads-bench-") as tmp:
        runs = interleaved(run, cells, reps, rotate=True)
    times = {c: [t for got in runs[c] for t in got] for c in cells}
    med = {f"{c}/{n}": statistics.median(v) for (c, n), v in times.items()}
    result = {
        "command": command("threads.py"),
        "cpu": cpu_name(),
        "commit": git_commit(),
        "steps": steps,
        "reps": reps,
        "median_step_s": med,
        "all_step_s": {f"{c}/{n}": v for (c, n), v in times.items()},
    }
    rows = [[n, f"{med[f'quiet/{n}']:.2f}", f"{med[f'busy/{n}']:.2f}", f"{med[f'busy/{n}'] / med[f'quiet/{n}']:.2f}x"]
            for n in names]  # fmt: skip
    lines = [
        f"# A run's step alone and beside a CPU-bound competitor ({'tiny model' if args.tiny else 'SmolLM2-135M'})",
        "",
        f"`{result['command']}` -- {result['cpu']}, commit {result['commit']}; local engine, "
        f"{steps} steps a run (the first left out), {reps} interleaved repetitions; median seconds per step.",
        "",
        *md_table(["contender", "quiet", "beside the competitor", "busy / quiet"], rows),
    ]
    base = med.get("quiet/default")
    if base and "ours" in names:
        lines += ["", f"ours quiet / default quiet: {med['quiet/ours'] / base:.2f}x"]
    out = Path(args.out) if args.out else RESULTS / f"threads{'_tiny' if args.tiny else ''}"
    print(write_results(out, result, lines, indent=2), end="")


if __name__ == "__main__":
    main()
