"""The README's main job as a user runs it: wall time, and the peak memory of all its processes.

    python benchmarks/main_job.py                                    # examples/grpo_arith.yaml as shipped
    python benchmarks/main_job.py --variant checkpointing:trainer.gradient_checkpointing=true

Each variant is ``trinity-like run --config <recipe> <overrides>`` in its own run folder,
one after another (never two at once), under :class:`harness.PeakMemory`: the peak over
samples of the summed PSS of the command and every process it starts, Ray's included (RSS
every 0.25 s, PSS every 2 s). The per-step ``memory/total_gb`` of ``metrics.jsonl`` (PSS of
driver, trainer workers and explorer at step ends) and the phase times come from the run
itself. Results: ``benchmarks/results/main_job.{md,json}`` (``--out``).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import ROOT, command, cpu_name, git_commit, isolated, md_table, utc_now, write_results  # noqa: E402

RECIPE = ROOT / "examples" / "grpo_arith.yaml"


def run_variant(label: str, recipe: Path, overrides: list[str], runs_root: Path) -> dict:
    """One run of the recipe: wall time, peak memory, and the figures its metrics hold."""
    name = f"main_job_{label}"
    argv = [
        sys.executable,
        "-m",
        "trinity_like.cli",
        "run",
        "--config",
        str(recipe),
        f"run_root={runs_root}",
        f"name={name}",
        "monitor.progress=false",
        *overrides,
    ]
    run = isolated(argv)
    if "error" in run:
        raise SystemExit(f"main_job: variant {label!r} failed ({run['error']}); its log is above")
    rows = [json.loads(line) for line in (runs_root / name / "metrics.jsonl").read_text().splitlines()]

    def values(key: str) -> list[float]:
        return [r[key] for r in rows if key in r]

    def median(key: str) -> float | None:
        found = values(key)
        return statistics.median(found) if found else None

    evals = values("eval/accuracy")
    return {
        "label": label,
        "overrides": overrides,
        "wall_s": run["wall_s"],
        **run["memory"],
        "memory_total_gb_median": median("memory/total_gb"),
        "memory_total_gb_max": max(values("memory/total_gb"), default=None),
        "memory_trainer_gb_max": max(values("memory/trainer_workers_gb"), default=None),
        "memory_explorer_gb_max": max(values("memory/explorer_gb"), default=None),
        "step_s_median": median("time/step"),
        "update_s_median": median("time/update"),
        "eval_start": evals[0] if evals else None,
        "eval_end": evals[-1] if evals else None,
        "rewards": [round(r, 4) for r in values("reward/mean")],
    }


def markdown(results: list[dict], meta: dict) -> str:
    def f(v: float | None, digits: int = 2) -> str:
        return "-" if v is None else f"{v:.{digits}f}"

    lines = [
        "# The main job: wall time and peak memory of the whole process tree",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Commit {meta['commit']}, {meta['date']}. Recipe `{meta['recipe']}`. Machine: {meta['machine']}.",
        "",
    ]
    header = ["variant", "overrides", "wall s", "peak PSS GB (all processes)", "peak RSS GB", "memory/total_gb median"]
    header += ["max", "trainer max GB", "explorer max GB", "step s", "update s", "eval start", "eval end"]
    two = ("memory_total_gb_median", "memory_total_gb_max", "memory_trainer_gb_max", "memory_explorer_gb_max")
    rows = [[r["label"], f"`{' '.join(r['overrides']) or '-'}`", f"{r['wall_s']:.0f}", f"**{r['peak_pss_gb']:.2f}**",
             f"{r['peak_rss_gb']:.2f}", *(f(r[k]) for k in (*two, "step_s_median", "update_s_median")),
             f(r["eval_start"], 3), f(r["eval_end"], 3)] for r in results]  # fmt: skip
    lines += md_table(header, rows)
    lines += [
        "",
        "Peak PSS: the largest sum, over samples, of the proportional set size of the command and every "
        "process it started (Ray's raylet, GCS, agents and workers included); each shared page is split "
        "between the processes that map it, so the sum is what the run costs the machine. RSS counts shared "
        "pages once per process. `memory/total_gb`: the run's own per-step figure (driver + trainer workers "
        "+ explorer, at step ends).",
        "",
        "At the peak, each kind of process's PSS (GB):",
        "",
    ]
    lines += [
        f"- {r['label']}: " + ", ".join(f"{k} {v:.2f}" for k, v in r["peak_pss_gb_by_process"].items()) for r in results
    ]
    lines += ["", "Rewards per step (same seed: equal across variants up to floating-point order):", ""]
    lines += [f"- {r['label']}: {r['rewards']}" for r in results]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=RECIPE, help="the recipe (default: the README's main job)")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="LABEL:KEY=VALUE[,KEY=VALUE...]",
        help="a run with these overrides (repeatable); default: the recipe as it is",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an override for every variant (e.g. a smaller run)",
    )
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "main_job")
    args = parser.parse_args(argv)
    variants = [("default", [])]
    if args.variant:
        variants = []
        for spec in args.variant:
            label, _, rest = spec.partition(":")
            variants.append((label, [o for o in rest.split(",") if o]))
    results = []
    with tempfile.TemporaryDirectory(prefix="main_job_") as tmp:
        for label, overrides in variants:
            print(f"main_job: {label} ...", flush=True)
            results.append(run_variant(label, args.config, [*args.set, *overrides], Path(tmp)))

    import torch

    meta = {
        "command": command("main_job.py", argv),
        "commit": git_commit(),
        "date": utc_now(),
        "recipe": str(Path(args.config).resolve().relative_to(ROOT))
        if Path(args.config).resolve().is_relative_to(ROOT)
        else str(args.config),
        "machine": f"{cpu_name()}, {torch.get_num_threads()} threads, torch {torch.__version__}",
    }
    text = markdown(results, meta)
    write_results(args.out, {"meta": meta, "results": results}, text)
    print(text)


if __name__ == "__main__":
    main()
