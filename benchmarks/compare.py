"""What ``trinity-like compare`` costs beyond the runs it starts: the same runs by hand against the runner.

The runs are those of a comparison of ``examples/grpo_add2.yaml`` and
``examples/dr_grpo_add2.yaml`` on the tiny model (``--seeds`` seeds, ``--steps`` steps, the
local engine). Two arms, interleaved (by hand first, then the runner, ``--reps`` times):

- **by hand**: each run's ``trinity-like run`` command, exactly as the comparison builds it
  (:func:`trinity_like.compare.entries.recipe_runs`), one after another, as a person would
  type them, with the torch threads the runner gives a run (``OMP_NUM_THREADS``: every core,
  as with ``--jobs 1``; torch's own default here too): the sum of their wall times;
- **runner**: ``trinity-like compare ... --jobs 1`` from its start to its exit, into a fresh
  folder: planning every run (recipes loaded and resolved, model sizes read), the same runs one
  at a time, and the report and its PNG.

The overhead is the runner's own time -- its wall less the wall of the runs it started, as
their state files record them -- as a share of the same runs by hand; the end-to-end ratio
runner / by hand - 1 is reported beside it. Medians over repetitions (the machine is shared:
ratios measured side by side, never one absolute time). The runner's own cost is
mostly fixed (importing the registries to resolve plans, about as long as one run's own start,
and drawing the PNG), so its share falls as runs get longer: the SmolLM2 runs of a real
comparison take minutes each. Run::

    python benchmarks/compare.py             # 2 recipes x 3 seeds x 10 steps, 3 repetitions (~4 min here)
    python benchmarks/compare.py --tiny      # 2 x 1 x 1, once: the smoke test
    python benchmarks/compare.py --model smollm2-135m-instruct --seeds 2 --reps 2   # real runs (~15 min here)

``--model``: the same runs on a real model (the recipes' own exact-match reward, same small
batches and eval set); results then go to ``compare_overhead_<model>.*``.

Results: ``benchmarks/results/compare_overhead.md`` and ``.json`` (``--tiny``: ``compare_overhead_tiny.*``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, ROOT, command, cpu_name, interleaved, md_table, write_results  # noqa: E402

RECIPES = ("examples/grpo_add2.yaml", "examples/dr_grpo_add2.yaml")
SMALL = ["trainer.engine=local", "buffer.eval_tasks.size=8", "explorer.batch_size=4", "explorer.group_size=4"]
TINY = [  # the recipes on the tiny model; "contains a digit" rewards it, so every step trains
    "model.path=tiny-random",
    *SMALL,
    "explorer.reward_fn=format",
    "explorer.reward_args={pattern: '.*[0-9].*'}",
    "explorer.eval_reward_fn=exact_match",
]


def env(threads: int | None = None) -> dict[str, str]:
    out = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    if threads:  # what the runner gives each run with --jobs 1 (all cores): the arms differ in the runner alone
        out.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    return out


def by_hand(sets: list[str], seeds: int, out: Path) -> tuple[float, list[str]]:
    """Every run's command, one after another; returns the summed wall time and the commands."""
    from trinity_like.compare.entries import parse_entries, recipe_runs

    runs = []
    for entry in parse_entries(list(RECIPES), []):
        entry_runs, plan = recipe_runs(entry, list(range(seeds)), out, sets, [])
        assert plan is not None, entry_runs[0].error
        runs += entry_runs
    from trinity_like.compare.scheduler import cores

    total = 0.0
    for run in runs:
        t0 = time.perf_counter()
        done = subprocess.run(run.argv, cwd=ROOT, env=env(cores()), capture_output=True, text=True, check=False)
        total += time.perf_counter() - t0
        if done.returncode != 0:
            raise SystemExit(f"{run.key}: exit {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return total, [run.command for run in runs]


def runner(sets: list[str], seeds: int, out: Path) -> tuple[float, float]:
    """The comparison's wall time, and the part of it that is the runner's own: its wall less the wall
    of the runs it started (each run's state file records the wall of its process)."""
    argv = [sys.executable, "-m", "trinity_like.cli", "compare", *RECIPES, "--seeds", str(seeds), "--jobs", "1"]
    argv += [f"--set={s}" for s in sets] + ["--out", str(out)]
    t0 = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env(), capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"compare: exit {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
    report = json.loads((out / "compare.json").read_text())
    assert all(r["status"] == "done" for r in report["runs"]), report["runs"]
    runs_s = sum(json.loads(p.read_text())["wall_s"] for p in (out / "runs").glob("*/seed_*.json"))
    return wall, wall - runs_s


def markdown(result: dict) -> str:
    lines = [
        "# `trinity-like compare`: the runner's overhead against the same runs by hand",
        "",
        f"Command: `{result['command']}` ({result['date']}, {result['machine']}).",
        "",
        f"Runs: {' and '.join(RECIPES)} on {result.get('model', 'tiny-random')}, {result['seeds']} seed(s) each, "
        f"{result['steps']} step(s), local engine: {result['runs']} runs per arm, the arms interleaved "
        f"{result['reps']} time(s). By hand: the runs' commands one after another (wall summed); "
        "runner: `trinity-like compare --jobs 1` from start to exit, planning and report included.",
        "",
    ]
    rows = [[i, f"{hand:.1f} s", f"{run:.1f} s", f"{100 * (run / hand - 1):+.1f} %", f"{own:.1f} s", f"{100 * own / hand:.1f} %"]
            for i, (hand, run, own) in enumerate(zip(result["by_hand_s"], result["runner_s"], result["own_s"]), 1)]  # fmt: skip
    header = ["repetition", "by hand", "runner", "runner / by hand - 1", "the runner's own time"]
    lines += md_table([*header, "its share of by hand"], rows)
    within = result["own_share_median"] <= result["budget"]
    lines += [
        "",
        f"**The runner's own time: {result['own_s_median']:.1f} s per comparison (median), "
        f"{100 * result['own_share_median']:.1f} % of the same runs by hand** "
        f"(budget {100 * result['budget']:.0f} %: {'within' if within else 'OVER'}); end to end, the runner took "
        f"{100 * result['overhead_median']:+.1f} % (median) against the runs by hand.",
        "",
        "The runner's own time is its wall less the wall of the processes it started (each run's state file "
        "records it): planning (importing the registries, resolving every run's plan, reading the model's size), "
        "the gaps of its 0.05 s poll between runs, and the report and its PNG. The end-to-end ratio holds it too, "
        "but also whatever the shared machine did to either arm: its spread across repetitions is that noise.",
        "",
        "The commands run by hand (the runner runs the same ones, into its own folder):",
        "",
    ]
    lines += [f"- `{c}`" for c in result["commands"]]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="smoke test: 1 seed, 1 step, once")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--model", default="tiny-random", help="model.path of every run (a built-in id or a folder)")
    parser.add_argument("--results", default=str(RESULTS), help="folder for compare_overhead*.md/.json")
    args = parser.parse_args()
    if args.tiny:
        args.seeds, args.steps, args.reps = 1, 1, 1
    base = TINY if args.model == "tiny-random" else [f"model.path={args.model}", *SMALL]
    sets = [*base, f"trainer.total_steps={args.steps}"]
    work = Path(tempfile.mkdtemp(prefix="compare-bench-"))

    def run(arm: str, rep: int) -> tuple:  # by hand: (wall, commands); runner: (wall, its own time)
        return (by_hand if arm == "hand" else runner)(sets, args.seeds, work / f"{arm}{rep}")

    def after(rep: int, got: dict[str, list[tuple]]) -> None:
        (hand, _), (ran, own) = got["hand"][-1], got["runner"][-1]
        print(f"repetition {rep + 1}: by hand {hand:.1f} s, runner {ran:.1f} s ({100 * (ran / hand - 1):+.1f} %), "
              f"the runner's own {own:.1f} s ({100 * own / hand:.1f} %)")  # fmt: skip

    try:
        got = interleaved(run, ["hand", "runner"], args.reps, after_round=after)  # who goes first alternates
    finally:
        shutil.rmtree(work, ignore_errors=True)
    hand_s, commands = [h for h, _ in got["hand"]], got["hand"][-1][1]
    runner_s, own_s = [r for r, _ in got["runner"]], [o for _, o in got["runner"]]
    ratios = [r / h - 1 for h, r in zip(hand_s, runner_s)]
    result = {
        "command": command("compare.py"),
        "date": time.strftime("%Y-%m-%d"),
        "machine": f"{cpu_name()}, shared",
        "model": args.model,
        "seeds": args.seeds,
        "steps": args.steps,
        "reps": args.reps,
        "runs": len(RECIPES) * args.seeds,
        "by_hand_s": hand_s,
        "runner_s": runner_s,
        "overhead_median": statistics.median(ratios),
        "own_s": own_s,
        "own_s_median": statistics.median(own_s),
        "own_share_median": statistics.median([o / h for h, o in zip(hand_s, own_s)]),
        "budget": 0.05,
        "commands": commands,
    }
    stem = "compare_overhead_tiny" if args.tiny else "compare_overhead"
    if args.model != "tiny-random":
        stem += f"_{Path(args.model).name}"
    out = Path(args.results)
    write_results(out / stem, result, markdown(result))
    print(
        f"the runner's own time {100 * result['own_share_median']:.1f} % of the runs by hand, end to end "
        f"{100 * result['overhead_median']:+.1f} % (medians): {out / stem}.md"
    )


if __name__ == "__main__":
    main()
