"""``trinity-like compare``: its arguments, and the command from entries to report.

    trinity-like compare A.yaml B.yaml ... --seeds N [--set key=value ...] [--out DIR]
    trinity-like compare --script "python loop.py --seed {seed} --log-path {run_dir}" --script ... --seeds N
    trinity-like compare listing.yaml --seeds N

The exit status is 0 when every run finished (reused or run now), 1 when some did not (their
rows in the report say why), 2 on bad input (one line).
"""

from __future__ import annotations

import argparse
import shlex
import threading
from pathlib import Path

from trinity_like.errors import TrinityError


def add_parser(sub: argparse._SubParsersAction) -> None:
    """The ``compare`` sub-command, added to the ``trinity-like`` parser."""
    p = sub.add_parser(
        "compare",
        help="run recipes (or client scripts) over seeds and compare them: mean +- 95 %% interval, paired "
        "differences against the first, a verdict, curves",
    )
    p.add_argument(
        "recipes",
        nargs="*",
        metavar="RECIPE",
        help="recipe files (label=path.yaml names one), or a listing YAML (runs: [{recipe|script, label, set}]); "
        "the first entry is the baseline",
    )
    p.add_argument(
        "--script",
        action="append",
        default=[],
        metavar="CMD",
        help="a command to compare, with {seed} and {run_dir} (where it writes metrics.jsonl); label=CMD names it",
    )
    p.add_argument("--seeds", type=int, default=3, help="runs per entry, seeds FIRST..FIRST+N-1 (default 3)")
    p.add_argument("--first-seed", type=int, default=0, help="the first seed (default 0)")
    p.add_argument(
        "--set", action="append", default=[], metavar="key.path=value", help="override every recipe (repeatable)"
    )
    p.add_argument("--out", default="runs/compare", help="output folder: runs, logs, compare.md/.json/.png")
    p.add_argument(
        "--report", metavar="PATH", help="write the report as PATH.md, PATH.json, PATH.png (default: <out>/compare)"
    )
    p.add_argument("--jobs", type=int, help="runs at once (default: as cores and memory allow)")
    p.add_argument("--threads", type=int, help="torch threads per run (default: cores / jobs)")
    p.add_argument("--memory-gb", type=float, help="memory per run instead of the estimate from the model size")
    p.add_argument("--accuracy-key", default="eval/accuracy", help="held-out accuracy metric (default eval/accuracy)")
    p.add_argument("--reward-key", default="reward/mean", help="train reward metric (default reward/mean)")
    p.add_argument("--rows-key", default="perf/train_rows", help="rows trained per step (default perf/train_rows)")
    p.add_argument(
        "--tokens-key", default="perf/train_tokens", help="tokens trained per step (default perf/train_tokens)"
    )
    p.add_argument(
        "--metric", action="append", default=[], metavar="KEY", help="another metric compared at its last value"
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the plan difference and every run's command; run nothing"
    )
    p.add_argument(
        "--no-run",
        action="store_true",
        help="report the runs that finished so far (another compare may be running them)",
    )
    p.add_argument("--no-plot", action="store_true", help="skip the PNG of curves")
    p.add_argument(
        "--plugin", action="append", default=[], metavar="P", help="plugin module, .py file or package folder to load"
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def _command(args: argparse.Namespace) -> str:
    """The invocation, rebuilt from its arguments (for the report)."""
    words = ["trinity-like", "compare", *args.recipes]
    for s in args.script:
        words += ["--script", s]
    words += ["--seeds", str(args.seeds)]
    if args.first_seed:
        words += ["--first-seed", str(args.first_seed)]
    for s in args.set:
        words += ["--set", s]
    for key in args.metric:
        words += ["--metric", key]
    for flag in ("jobs", "threads", "memory_gb"):
        if getattr(args, flag) is not None:
            words += [f"--{flag.replace('_', '-')}", str(getattr(args, flag))]
    words += ["--out", args.out]
    if args.report:
        words += ["--report", args.report]
    if args.no_run:
        words.append("--no-run")
    return shlex.join(words)


def _check(args: argparse.Namespace) -> None:
    for name in ("seeds", "jobs", "threads"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise TrinityError(f"compare: --{name} must be at least 1 (got {value})")
    if args.memory_gb is not None and args.memory_gb <= 0:
        raise TrinityError(f"compare: --memory-gb must be positive (got {args.memory_gb})")


def run(args: argparse.Namespace) -> int:
    """The ``compare`` command: plan, run (or reuse), read back, report; exit 0 when every run finished."""
    import os

    from trinity_like.compare.entries import recipe_runs, script_runs
    from trinity_like.compare.plans import check_not_owned, held_out_differs, plan_diff
    from trinity_like.compare.scheduler import estimate_gb, execute, size_jobs
    from trinity_like.config.schema import ModelConfig, field_default
    from trinity_like.plugins import load_plugins

    _check(args)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here loads a model: no library's bars to quiet
    check_not_owned(args.set)
    from trinity_like.compare.entries import parse_entries

    entries = parse_entries(args.recipes, args.script)
    load_plugins(args.plugin)
    out = Path(args.out).resolve()
    seeds = list(range(args.first_seed, args.first_seed + args.seeds))
    runs, plans = [], {}
    for entry in entries:
        if entry.recipe is not None:
            entry_runs, plan = recipe_runs(entry, seeds, out, args.set, args.plugin)
            if plan is not None:
                plans[entry.label] = plan
            else:
                print(f"{entry.label}: not run: {entry_runs[0].error}", flush=True)
        else:
            entry_runs = script_runs(entry, seeds, out)
            plans[entry.label] = {"script": entry.script}
        runs += entry_runs
    diff = plan_diff(plans)
    held_out = held_out_differs(diff)
    default_model = field_default(ModelConfig, "path")
    estimates = {
        r.key: (args.memory_gb if args.memory_gb is not None else estimate_gb(r, default_model))
        for r in runs
        if not r.error
    }
    sizing = size_jobs(list(estimates.values()), len(estimates), args.jobs, args.threads)
    print(_diff_text(diff, held_out), flush=True)
    print(f"{len(runs)} runs ({len(entries)} entries x {len(seeds)} seeds): {sizing.describe()}", flush=True)
    if args.dry_run:
        for r in runs:
            print(f"{r.key}: {r.error or r.command}")
        return 0
    # seed by seed (every entry's seed 0, then seed 1, ...): a comparison stopped early still has pairs
    labels = [e.label for e in entries]
    order = sorted(runs, key=lambda r: (r.seed, labels.index(r.label)))
    if not args.no_plot:  # the report's plotting library loads while the runs run, not after them
        threading.Thread(target=_preload_matplotlib, daemon=True).start()
    outcomes = execute(order, out, sizing, estimates, start=not args.no_run)
    return _report(args, entries, runs, outcomes, diff, held_out, sizing, out)


def _preload_matplotlib() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot  # noqa: F401


def _diff_text(diff: list, held_out: list[str]) -> str:
    if not diff:
        return "plans: the resolved plans are the same"
    lines = [f"plans: {len(diff)} resolved key(s) differ:"]
    for key, values in diff:
        lines.append(f"  {key}: " + ", ".join(f"{label}={v!r}" for label, v in values.items()))
    if held_out:
        lines.append(f"warning: the held-out sets differ ({', '.join(held_out)}): accuracies are not comparable")
    return "\n".join(lines)


def _report(args, entries, runs, outcomes, diff, held_out, sizing, out: Path) -> int:
    from trinity_like.compare.plot import plot_comparison
    from trinity_like.compare.report import OK, build_report, write_report
    from trinity_like.compare.results import Keys, read_run

    keys = Keys(args.accuracy_key, args.reward_key, args.rows_key, args.tokens_key, tuple(args.metric))
    results = {r.key: read_run(r.run_dirs, keys, outcomes[r.key].wall_s) for r in runs if outcomes[r.key].status in OK}
    report = build_report(entries, runs, outcomes, results, diff, held_out, sizing, _command(args), keys)
    stem = Path(args.report).resolve() if args.report else out / "compare"
    png = None
    if not args.no_plot and results:
        curves: dict = {e.label: {"accuracy_curve": [], "reward_curve": []} for e in entries}
        for r in runs:
            if r.key in results:
                for panel in curves[r.label]:
                    curve = getattr(results[r.key], panel)
                    if curve:
                        curves[r.label][panel].append(curve)
        title = f"{' vs '.join(curves)} ({len(report['seeds'])} seeds)"
        png = plot_comparison(curves, stem.parent / f"{stem.name}.png", title)
    md, js = write_report(report, stem, png)
    for label in [e.label for e in entries][1:]:
        for block in report["comparisons"].get(label, []):
            print(block["line"], flush=True)
    failed = [r for r in report["runs"] if r["status"] not in OK]
    for r in failed:
        print(f"{r['key']}: {r['status']}: {r['message']}", flush=True)
    print(f"report: {md} ({js.name}{', ' + png.name if png else ''})", flush=True)
    return 0 if not failed else 1
