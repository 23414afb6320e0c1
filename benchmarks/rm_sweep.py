"""Which KL leash and which preference data make GRPO on a learned reward improve the task?

A sweep of ``examples/grpo_with_rm.yaml`` (issue 22) on ``smollm2-135m-instruct``: the
reward model's pairs data x the KL coefficient, each cell a real run through the CLI for
``--steps`` steps (10) on the local engine (as ``benchmarks/signals.py`` runs every recipe),
one after another.

- pairs data: ``hand`` is the reward model of ``examples/rm.yaml`` (hand-made pairs, a
  correct bare number against a near-miss), ``policy`` the one of ``examples/rm_policy.yaml``
  (pairs drawn from the starting policy's own samples, labelled by exact match);
- KL: GRPO's KL to the reference as a loss term (``algorithm.kl_loss``, the k3 estimator)
  with coefficient ``--kl`` (0 measures the KL and applies none).

Each cell reports held-out exact match (the 200 eval problems, greedy) at the start and
the end, the exact-match reward of the rollouts (``reward/gold_mean``) and the learned
reward (``reward/mean``) over the first and the last three steps, and the policy's KL to
the reference at the last step. The recipe's check of the reward model before step 1 is
off in the cells (its numbers per reward model are in docs/learned_rewards.md). The reward models are trained first, by their own recipes,
unless ``--rm-root`` already holds their run directories (``rm/`` and ``rm_policy/``).
Run::

    python benchmarks/rm_sweep.py                         # 2 x 3 cells, about an hour here
    python benchmarks/rm_sweep.py --rm-root runs --kl 0.01  # more cells, reward models of earlier runs

Cells of earlier runs stay in the results (a cell run again replaces its row).

Results: ``benchmarks/results/rm_sweep.md`` and ``.json`` (runs under ``runs/rm_sweep/``).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, ROOT, command, md_table, run_cli, write_results  # noqa: E402
from signals import mean, read_metrics  # noqa: E402

PAIRS = {"hand": "rm", "policy": "rm_policy"}  # pairs data -> the reward model recipe (and run name)


def cell_overrides(pairs: str, kl: float, rm_root: Path, run_root: Path, steps: int) -> list[str]:
    return [
        f"name=rm_sweep_{pairs}_kl{kl:g}",
        f"run_root={run_root}",
        f"trainer.total_steps={steps}",
        f"explorer.reward_args.path={rm_root / PAIRS[pairs]}",
        "trainer.engine=local",
        "monitor.progress=false",
        "monitor.rm_check_tasks=0",
        f"algorithm.kl_loss={{name: k3, coef: {kl:g}}}",
    ]


def summarize(rows: list[dict]) -> dict:
    steps = [r for r in rows if "reward/mean" in r and "time/step" in r]
    evals = [r for r in rows if "eval/accuracy" in r]
    kls = [r[k] for r in rows for k in r if k.endswith("/kl") or k == "kl"]

    def first_last(key: str) -> tuple[float, float]:
        found = [r[key] for r in steps if key in r]
        return mean(found[:3]), mean(found[-3:])

    return {
        "accuracy": (evals[0]["eval/accuracy"], evals[-1]["eval/accuracy"]),
        "accuracy_stderr": evals[-1]["eval/accuracy_stderr"],
        "gold": first_last("reward/gold_mean"),
        "learned": first_last("reward/mean"),
        "kl_end": kls[-1] if kls else float("nan"),
        "steps": len(steps),
    }


def row(r: dict) -> list[str]:
    (a0, a1), (g0, g1), (l0, l1) = r["accuracy"], r["gold"], r["learned"]
    held_out = f"{100 * a0:.1f} % -> {100 * a1:.1f} % +- {100 * r['accuracy_stderr']:.1f}"
    return [r["pairs"], f"{r['kl']:g}", held_out, f"{g0:.3f} -> {g1:.3f}", f"{l0:.2f} -> {l1:.2f}",
            f"{r['kl_end']:.4f}", f"{r['wall_s'] / 60:.1f} min"]  # fmt: skip


def markdown(results: list[dict]) -> str:
    commands = list(dict.fromkeys(r["by"] for r in results))
    lines = [
        "# GRPO on a learned reward: KL coefficient x pairs data (issue 22)",
        "",
        f"Commands: {', then '.join(f'`{c}`' for c in commands)}. smollm2-135m-instruct, `examples/grpo_with_rm.yaml` with the cell's reward",
        "model and `algorithm.kl_loss = {name: k3, coef}`, 10 steps on the local engine. Held-out: exact",
        "match on the 200 eval problems (greedy), +- its standard error. Gold / learned: mean exact-match",
        "reward and mean learned reward of the rollouts, first 3 steps -> last 3.",
        "",
    ]
    header = ["pairs data", "KL coef", "held-out exact match start -> end", "gold reward", "learned reward"]
    lines += md_table([*header, "KL at the end", "wall"], map(row, results))
    return "\n".join([*lines, "", "Each cell's command:", ""] + [f"- `{r['command']}`" for r in results])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS))
    parser.add_argument("--kl", nargs="+", type=float, default=[0.0, 0.1, 1.0], help="KL loss coefficients")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument(
        "--rm-root", help="a run root holding rm/ and rm_policy/ (default: train them under --run-root)"
    )
    parser.add_argument("--run-root", default=str(ROOT / "runs" / "rm_sweep"))
    parser.add_argument("--out", default="rm_sweep", help="results file stem in benchmarks/results")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    run_root = Path(args.run_root).resolve()
    rm_root = Path(args.rm_root).resolve() if args.rm_root else run_root
    (run_root / "logs").mkdir(parents=True, exist_ok=True)
    for pairs in args.pairs:
        name = PAIRS[pairs]
        if not (rm_root / name / "checkpoints").is_dir():
            print(f"{name}: training the reward model", flush=True)
            recipe = ["run", "--config", f"examples/{name}.yaml", f"run_root={rm_root}", "monitor.progress=false"]
            run_cli(recipe, run_root / "logs" / f"{name}.log")
    out_json = RESULTS / f"{args.out}.json"
    # cells of earlier runs of the script stay, a cell run again replaces its row
    cells = {(r["pairs"], r["kl"]): r for r in json.loads(out_json.read_text())} if out_json.exists() else {}
    for pairs in args.pairs:
        for kl in args.kl:
            overrides = cell_overrides(pairs, kl, rm_root, run_root, args.steps)
            name = overrides[0].split("=", 1)[1]
            print(f"{name}: running", flush=True)
            wall = run_cli(
                ["run", "--config", "examples/grpo_with_rm.yaml", *overrides], run_root / "logs" / f"{name}.log"
            )
            result = {
                "pairs": pairs,
                "kl": kl,
                **summarize(read_metrics(run_root / name)),
                "wall_s": wall,
                "command": shlex.join(["trinity-like", "run", "--config", "examples/grpo_with_rm.yaml", *overrides]),
                "by": command("rm_sweep.py"),
                "date": time.strftime("%Y-%m-%d"),
            }
            print(
                f"{name}: held-out {result['accuracy']}, gold {result['gold']}, KL {result['kl_end']:.4f} "
                f"({wall / 60:.1f} min)",
                flush=True,
            )
            cells[pairs, kl] = result
            results = [cells[k] for k in sorted(cells, key=lambda k: (list(PAIRS).index(k[0]), k[1]))]
            write_results(RESULTS / args.out, results, markdown(results))


if __name__ == "__main__":
    main()
