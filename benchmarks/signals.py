"""Does every recipe move its learning signal the right way? Run each one and read its metrics.

Each recipe of ``examples/`` runs for real on ``smollm2-135m-instruct`` through the CLI
(``trinity-like run``), one after another, and the signal it is meant to move is read back
from its ``metrics.jsonl``:

- RL recipes: mean train reward of the first three steps vs the last three, and greedy
  held-out accuracy on the 200 held-out problems at the start and the end;
- ``sft``: held-out loss on ``data/sft_arith_eval.jsonl`` (and held-out answer accuracy);
- ``dpo``: held-out reward margin and preference accuracy on ``data/pairs_arith_eval.jsonl``,
  and held-out answer accuracy, whichever way it goes;
- ``rm``: held-out pairwise accuracy (chance is 50 %).

A row may be a variant of another recipe, run under its own name with overrides
(``grpo_hard``: ``grpo_arith`` on the 2-digit + 2-digit task of ``mix_hard``, the GRPO
baseline MIX is compared with there).

The smaller setting that fits this 2-core machine (documented in the table): RL recipes
run ``--steps`` steps (default 10 instead of the recipes' 20) on the ``local`` engine
(``--engine``; the ``verl`` engine computes the same update, see the parity test, at a
slower step here); offline recipes run as written. Everything else is the recipe's own.
Run::

    python benchmarks/signals.py                      # every recipe, about an hour here
    python benchmarks/signals.py --only sft dpo rm    # a subset

Results: ``benchmarks/results/signals.md`` and ``.json`` (runs under ``runs/signals/``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, ROOT, command, cpu_name, md_table, run_cli, write_results  # noqa: E402


@dataclass(frozen=True)
class Recipe:
    name: str  # the row's name, and its run directory under the run root
    kind: str  # "rl" | "sft" | "dpo" | "rm"
    extra: tuple[str, ...] = ()
    config: str | None = None  # recipe file examples/<config>.yaml when the row is a variant of another; None: name

    @property
    def file(self) -> str:
        return f"examples/{self.config or self.name}.yaml"


# 2-digit + 2-digit addition, the task of examples/mix_hard.yaml, for any arithmetic recipe.
HARD_TASKS = tuple(f"buffer.{key}.generator_args={{ranges: [[10, 99], [10, 99]]}}" for key in ("tasks", "eval_tasks"))


RECIPES = [
    Recipe("grpo_arith", "rl"),
    Recipe("dr_grpo", "rl"),
    Recipe("dapo", "rl"),
    Recipe("rloo", "rl"),
    Recipe("reinforce_plus_plus", "rl"),
    Recipe("gspo", "rl"),
    Recipe("cispo", "rl"),
    Recipe("ppo", "rl"),
    Recipe("mix", "rl"),
    Recipe("mix_bare_answers", "rl"),  # the lesson: expert data in another answer style than RL's
    Recipe("grpo_hard", "rl", HARD_TASKS, config="grpo_arith"),  # GRPO alone on mix_hard's task
    Recipe("mix_hard", "rl"),
    Recipe("sft", "sft"),
    Recipe("dpo", "dpo"),
    Recipe("dpo_self_pairs", "dpo"),
    Recipe("rm", "rm"),
    Recipe("rm_policy", "rm"),
    Recipe("grpo_with_rm", "rl", ("explorer.reward_args.path={run_root}/rm_policy",)),
    Recipe("grpo_with_rm_hacking", "rl", ("explorer.reward_args.path={run_root}/rm",)),  # the lesson
    Recipe("sft_then_grpo", "rl"),  # stages set their own step counts (10 + 10)
]


def read_metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]


def first_last(rows: list[dict], key: str) -> tuple[float, float] | None:
    """The value of ``key`` at the first and the last row that has it."""
    found = [r[key] for r in rows if key in r]
    return (found[0], found[-1]) if found else None


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def summarize(recipe: Recipe, run_dirs: list[Path]) -> dict:
    """The recipe's signal (start, end) and held-out answer accuracy, from its metrics."""
    rows_per_stage = [read_metrics(d) for d in run_dirs]
    rows = rows_per_stage[-1]
    out: dict = {"recipe": recipe.name, "kind": recipe.kind}
    if recipe.kind == "rl":
        rewards = [r["reward/mean"] for r in rows if "reward/mean" in r and "time/step" in r]
        k = min(3, len(rewards) // 2)
        out["signal"] = f"train reward (mean of first {k} steps -> last {k})"
        out["start"], out["end"] = mean(rewards[:k]), mean(rewards[-k:])
        out["steps"] = len(rewards)
    elif recipe.kind == "sft":
        out["signal"] = "held-out loss (NLL per assistant token)"
        out["start"], out["end"] = first_last(rows, "eval/nll")
    elif recipe.kind == "dpo":
        out["signal"] = "held-out reward margin"
        out["start"], out["end"] = first_last(rows, "eval/reward_margin")
        out["preference_accuracy"] = first_last(rows, "eval/reward_accuracy")
        built = next((r for r in rows if "self_pairs/train_data/pairs" in r), None)
        if built:  # pairs sampled from the model: how many problems it got wrong at least once
            out["self_pairs"] = {k.split("/", 1)[1]: v for k, v in built.items() if k.startswith("self_pairs/")}
    elif recipe.kind == "rm":
        out["signal"] = "held-out pairwise accuracy"
        out["start"], out["end"] = first_last(rows, "eval/accuracy")
    if recipe.kind != "rm":
        # held-out answer accuracy from the first stage's start to the last stage's end
        first = [r for r in rows_per_stage[0] if "eval/accuracy" in r]
        last = [r for r in rows if "eval/accuracy" in r]
        if first and last:
            out["accuracy"] = (first[0]["eval/accuracy"], last[-1]["eval/accuracy"])
            out["accuracy_stderr"] = (first[0]["eval/accuracy_stderr"], last[-1]["eval/accuracy_stderr"])
    out["moved_right_way"] = out["end"] < out["start"] if recipe.kind == "sft" else out["end"] > out["start"]
    return out


def run_recipe(
    recipe: Recipe, args: argparse.Namespace, run_root: Path, log_dir: Path
) -> tuple[list[Path], float, list[str]]:
    overrides = [f"run_root={run_root}", f"trainer.engine={args.engine}", "monitor.progress=false"]
    if args.model != "smollm2-135m-instruct":
        overrides.append(f"model.path={args.model}")
    if recipe.kind == "rl" and recipe.name != "sft_then_grpo":
        overrides.append(f"trainer.total_steps={args.steps}")
    if recipe.config:  # a variant runs under its own name (and run directory)
        overrides.append(f"name={recipe.name}")
    overrides += [e.replace("{run_root}", str(run_root)) for e in recipe.extra]
    wall = run_cli(["run", "--config", recipe.file, *overrides], log_dir / f"{recipe.name}.log")
    base = run_root / recipe.name
    run_dirs = [base / "sft", base / "grpo"] if recipe.name == "sft_then_grpo" else [base]  # its two stages
    return run_dirs, wall, ["trinity-like run --config", recipe.file, *map(shlex.quote, overrides)]


def fmt(x: float) -> str:
    return f"{x:.3f}"


def markdown(results: list[dict], args: argparse.Namespace) -> str:
    lines = [
        f"# Learning signals of every recipe on {args.model}",
        "",
        "Command: `python benchmarks/signals.py` (a row re-measured on its own names its command in the last column).",
        "",
        f"Machine: {cpu_name()}, torch threads per process as the recipe sets them.",
        "",
    ]
    rows = []
    for r in results:
        acc = "-"
        if "accuracy" in r:
            (a0, a1), (s0, s1) = r["accuracy"], r["accuracy_stderr"]
            acc = f"{100 * a0:.1f} % +- {100 * s0:.1f} -> {100 * a1:.1f} % +- {100 * s1:.1f}"
        signal = r["signal"]
        if "preference_accuracy" in r and r["preference_accuracy"]:
            p0, p1 = r["preference_accuracy"]
            signal += f" (preference accuracy {fmt(p0)} -> {fmt(p1)})"
        by = f"{r.get('date', '')} {'`' + r['by'] + '`' if r.get('by') else ''}"
        rows.append([r["recipe"], signal, fmt(r["start"]), fmt(r["end"]), "yes" if r["moved_right_way"] else "**no**"])
        rows[-1] += [acc, f"{r['wall_s'] / 60:.1f} min", by]
    header = ["recipe", "signal", "start", "end", "right way", "held-out answer accuracy start -> end", "wall"]
    lines += [*md_table([*header, "measured"], rows), "", "Each recipe's own command (as run):", ""]
    return "\n".join(lines + [f"- `{' '.join(r['command'])}`" for r in results]) + "\n"


READING = "## Reading it"


def kept_reading(md: Path) -> str:
    """The hand-written section of a results file (from its ``## Reading it`` heading on), kept
    when the table above it is written again."""
    text = md.read_text() if md.exists() else ""
    return "\n" + text[text.index(READING) :] if READING in text else ""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="recipe names to run (default: all)")
    parser.add_argument("--steps", type=int, default=10, help="steps of each RL recipe")
    parser.add_argument("--engine", default="local", choices=["local", "verl"])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="tiny-random: a smoke run of this script")
    parser.add_argument("--run-root", default=str(ROOT / "runs" / "signals"))
    parser.add_argument("--out", help="results file stem in benchmarks/results (default: signals)")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    run_root = Path(args.run_root).resolve()
    log_dir = run_root / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    chosen = [r for r in RECIPES if not args.only or r.name in args.only]
    unknown = set(args.only or ()) - {r.name for r in RECIPES}
    if unknown:
        raise SystemExit(f"--only: unknown recipe(s) {sorted(unknown)}; known: {[r.name for r in RECIPES]}")
    results = []
    stem = args.out or ("signals" if args.model == "smollm2-135m-instruct" else f"signals_{args.model}")
    out_json = RESULTS / f"{stem}.json"
    previous = {r["recipe"]: r for r in json.loads(out_json.read_text())} if out_json.exists() and args.only else {}
    for recipe in chosen:
        print(f"{recipe.name}: running", flush=True)
        run_dirs, wall, recipe_command = run_recipe(recipe, args, run_root, log_dir)
        result = {
            **summarize(recipe, run_dirs),
            "wall_s": wall,
            "command": recipe_command,
            "date": time.strftime("%Y-%m-%d"),
            "by": command("signals.py"),
        }
        print(
            f"{recipe.name}: {result['signal']} {fmt(result['start'])} -> {fmt(result['end'])} "
            f"accuracy {result.get('accuracy')} ({wall / 60:.1f} min)",
            flush=True,
        )
        previous[recipe.name] = result
        results = [previous[r.name] for r in RECIPES if r.name in previous]
        write_results(out_json, results, markdown(results, args) + kept_reading(RESULTS / f"{stem}.md"))


if __name__ == "__main__":
    main()
