"""The learning-signals table again, with seeds and intervals: the RL recipes a researcher
compares, on a task where methods separate (2-digit + 2-digit addition), through
``trinity-like compare``.

Each RL recipe of ``examples/`` runs on the ``arithmetic_add2`` task (its own algorithm,
sampling and optimiser as written; only the task is swapped, so every run answers the same
200 held-out problems) at ``--seeds`` seeds, paired by seed against GRPO:

    grpo (grpo_arith.yaml), dr_grpo, dapo, rloo, gspo, cispo, mix (mix_hard.yaml: its expert
    rows are 2-digit sums), grpo_with_rm (a Bradley-Terry reward model trained first on
    pairs of the policy's own answers on this task: ``trinity-like rm-pairs`` then
    ``examples/rm_policy.yaml`` on them)

RL recipes run ``--steps`` steps (default 10, as ``benchmarks/signals.py``) on the ``local``
engine. Run::

    python benchmarks/signals_seeds.py                    # all 8 recipes x 3 seeds: hours on 2 cores
    python benchmarks/signals_seeds.py --only grpo dapo   # a subset (grpo, the baseline, always runs)
    python benchmarks/signals_seeds.py --tiny             # the whole path on the tiny model, in a minute

Everything is resumable (run it again: finished runs are reused). Results:
``benchmarks/results/signals_seeds.{md,json,png}`` (the tiny mode writes under the run root).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, ROOT, run_cli  # noqa: E402

ADD2 = [f"buffer.{key}.generator=arithmetic_add2" for key in ("tasks", "eval_tasks")]
ADD2 += [f"buffer.{key}.generator_args={{}}" for key in ("tasks", "eval_tasks")]

# label -> recipe file; the first is the baseline every other one is paired with
RECIPES = {
    "grpo": "grpo_arith.yaml",
    "dr_grpo": "dr_grpo.yaml",
    "dapo": "dapo.yaml",
    "rloo": "rloo.yaml",
    "gspo": "gspo.yaml",
    "cispo": "cispo.yaml",
    "mix": "mix_hard.yaml",
    "grpo_with_rm": "grpo_with_rm.yaml",
}
TINY = ["model.path=tiny-random", "explorer.batch_size=2", "explorer.group_size=4", "buffer.eval_tasks.size=4"]


def train_reward_model(root: Path, tiny: bool) -> Path:
    """Pairs of the starting policy's own answers on the task, then a reward model on them."""
    if tiny:  # the tiny random model never answers right: no pair of its own; the 4 tiny pairs instead
        train = evals = ROOT / "examples" / "data" / "pairs_tiny.jsonl"
    else:
        pairs = root / "pairs_add2"
        if not (pairs / "pairs.jsonl").exists():
            recipe = str(ROOT / "examples" / "grpo_add2.yaml")
            run_cli(["rm-pairs", recipe, "--out", str(pairs)], root / "logs" / "rm_pairs.log")
        train, evals = pairs / "pairs.jsonl", pairs / "pairs_eval.jsonl"
    args = ["run", "--config", str(ROOT / "examples" / "rm_policy.yaml"), f"run_root={root}", "name=rm_add2"]
    args += ["trainer.engine=local", "monitor.progress=false"]
    args += [f"buffer.train_data.path={train}", f"buffer.eval_data.path={evals}"]
    args += ["model.path=tiny-random", "buffer.train_batch_size=4", "trainer.total_steps=2"] if tiny else []
    run_cli(args, root / "logs" / "rm_add2.log")
    return root / "rm_add2"


def listing(labels: list[str], rm_dir: Path | None, tiny: bool) -> dict:
    runs = []
    for label in labels:
        sets = list(ADD2) + (TINY if tiny else [])
        if label == "grpo_with_rm":
            sets += [
                f"explorer.reward_args.path={rm_dir}",
                "monitor.rm_check_tasks=2" if tiny else "monitor.rm_check_tasks=16",
            ]
        if label == "mix" and tiny:
            sets += ["buffer.train_batch_size=4"]
        runs.append({"recipe": str(ROOT / "examples" / RECIPES[label]), "label": label, "set": sets})
    return {"runs": runs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", choices=list(RECIPES), help="recipes besides the baseline (default: all)")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10, help="steps of each RL recipe")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (default 1: this is a shared machine)")
    parser.add_argument("--run-root", default=str(ROOT / "runs" / "signals_seeds"))
    parser.add_argument("--tiny", action="store_true", help="the tiny model, 2 steps: the path, not the figures")
    args = parser.parse_args()
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    root = Path(args.run_root).resolve()
    labels = ["grpo", *[name for name in RECIPES if name != "grpo" and (not args.only or name in args.only)]]
    rm_dir = train_reward_model(root, args.tiny) if "grpo_with_rm" in labels else None
    spec = root / "signals_add2.yaml"
    spec.parent.mkdir(parents=True, exist_ok=True)
    spec.write_text(yaml.safe_dump(listing(labels, rm_dir, args.tiny), sort_keys=False))
    report = root / "signals_seeds" if args.tiny else RESULTS / "signals_seeds"
    steps = 2 if args.tiny else args.steps
    command = [sys.executable, "-m", "trinity_like.cli", "compare", str(spec), "--seeds", str(args.seeds)]
    command += ["--set", "trainer.engine=local", "--set", f"trainer.total_steps={steps}"]
    command += ["--set", "monitor.progress=false"]
    command += ["--out", str(root / "compare"), "--report", str(report), "--jobs", str(args.jobs)]
    raise SystemExit(subprocess.run(command, cwd=ROOT).returncode)


if __name__ == "__main__":
    main()
