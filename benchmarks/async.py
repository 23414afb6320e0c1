"""The default GRPO recipe explored in turn vs with the explorer running ahead (offset 1, 2), interleaved.

Each variant is ``trinity-like run --config examples/grpo_arith.yaml`` (the README's main
job: SmolLM2-135M-Instruct, verl's FSDP worker, the explorer as a Ray actor) in its own
process and run folder, with the same seed and step count; only ``synchronizer.offset``
differs:

- ``sync``: offset 0 -- explore, then train, in turn;
- ``off1`` / ``off2``: offset 1 / 2 -- the explorer explores batch t+1 (t+2) while the
  trainer trains step t (``trinity_like/pipeline/async_loop.py``, docs/async.md).

Every variant trains every group (``algorithm.dynamic_sampling=false``): with dynamic
sampling the rows trained per step depend on the rewards, which differ between variants, so
the trainer's work would too; this way each step trains ``batch_size x group_size`` rows in
every variant. A short warm-up run of the first variant, not counted, goes before the rounds
(``--warmup``): the first run on a machine loads the model and the libraries from a cold
disk cache and ran 5-15 % slower than the same run later. Rounds rotate which variant goes
first. Per variant the script reports the median over rounds of:

- steps/hour: trained steps / the loop's wall time, from the run's ``timeline.jsonl`` (first
  span to last trainer span: model loading and the held-out evaluations at start and end left
  out, evaluations in between kept), and the median per-round ratio to ``sync``;
- reward at equal steps: the mean sampled reward of the first and the last third of the
  steps (every step's, in the JSON), and the final held-out accuracy when it was measured;
- overlap: the fraction of the explorer's rollout time during which the trainer was busy
  (:func:`trinity_like.monitor.timeline.overlap_fraction`; 0 for ``sync`` by construction),
  the rollout seconds per step and the trainer's wait for batches per step.

On a 2-core CPU the explorer and the trainer share the same cores: overlap hides waiting,
not work, so expect about the same speed (the target there is no slowdown) and measure on a
quiet machine. On a GPU machine (``--gpus 1``: ``cluster.num_gpus=1``) the figures go to
files of their own (``async_gpu.*``). ``--client`` also runs the client loop's benchmark
(``benchmarks/async_client.py``, sync vs off-by-K) with the same rounds and includes its
results. Run::

    python benchmarks/async.py --tiny                        # the tiny model, a check of the script (a minute)
    python benchmarks/async.py --steps 12 --reps 3 --client  # SmolLM2, a quiet machine (hours)

Results: ``benchmarks/results/async.{json,md}`` (``async_tiny.*`` with ``--tiny``; ``--out``).
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
from harness import RESULTS, ROOT, cpu_name, git_commit, gpu_name, interleaved, log, md_table, pick, write_results

from trinity_like.monitor.timeline import (
    TIMELINE_FILE,
    busy_seconds,
    overlap_fraction,
    read_spans,
)

RECIPE = ROOT / "examples" / "grpo_arith.yaml"
VARIANTS = {"sync": 0, "off1": 1, "off2": 2}  # name -> synchronizer.offset
TINY = [  # the tests' shrunk recipe (tests/_lib/tiny_runs.py): the tiny model, the local engine
    "model.path=tiny-random",
    "trainer.engine=local",
    "buffer.eval_tasks.size=8",
    "explorer.batch_size=4",
    "explorer.group_size=4",
    "explorer.reward_fn=format",
    "explorer.reward_args={pattern: '.*[0-9].*'}",
    "explorer.eval_reward_fn=exact_match",
]
CLIENT_BENCH = ROOT / "benchmarks" / "async_client.py"


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument(
        "--tiny", action="store_true", help="the tiny random model and the local engine (a check of the script)"
    )
    p.add_argument("--steps", type=int, default=None, help="trained steps of every run (default 12; 6 with --tiny)")
    p.add_argument(
        "--reps", type=int, default=None, help="rounds: every variant runs once per round (default 3; 1 with --tiny)"
    )
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"a comma list of {', '.join(VARIANTS)}")
    p.add_argument("--warmup", type=int, default=2, help="steps of an uncounted first run before the rounds (0: none)")
    p.add_argument("--gpus", type=int, default=0, help="cluster.num_gpus of the verl workers (a GPU machine)")
    p.add_argument("--client", action="store_true", help=f"also run {CLIENT_BENCH.name} (the client RL loop)")
    p.add_argument(
        "--out", default=None, help="results path without suffix (default benchmarks/results/async[_tiny|_gpu])"
    )
    p.add_argument("overrides", nargs="*", metavar="key.path=value", help="more overrides for every variant")
    return p.parse_args()


def run_variant(offset: int, steps: int, extra: list[str], folder: Path) -> dict:
    """One run of the recipe with ``synchronizer.offset=offset``; its figures."""
    argv = [
        sys.executable,
        "-m",
        "trinity_like.cli",
        "run",
        "--config",
        str(RECIPE),
        f"run_root={folder}",
        "name=bench",
        f"trainer.total_steps={steps}",
        f"synchronizer.offset={offset}",
        "monitor.progress=false",
        "algorithm.dynamic_sampling=false",
        *extra,
    ]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"async: offset {offset} failed (exit status {done.returncode}):\n{done.stderr[-3000:]}")
    run_dir = folder / "bench"
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "time/step" in r and "reward/mean" in r]  # a step's line (not an eval's)
    rewards = {int(r["step"]): r["reward/mean"] for r in trained}
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    spans = read_spans(run_dir / TIMELINE_FILE)
    trainer_end = max(s.end for s in spans if s.actor == "trainer" and s.phase != "wait")
    loop_s = trainer_end - min(s.start for s in spans)
    third = max(1, steps // 3)
    ordered = [rewards[s] for s in sorted(rewards)]
    waits = [r.get("time/rollout", 0.0) for r in trained]
    shutil.rmtree(folder, ignore_errors=True)  # its checkpoints (3 GB): nine runs of them filled a disk
    return {
        "offset": offset,
        "wall_s": wall,
        "loop_s": loop_s,
        "steps_per_hour": steps / loop_s * 3600,
        "rewards": ordered,
        "reward_first_third": statistics.fmean(ordered[:third]),
        "reward_last_third": statistics.fmean(ordered[-third:]),
        "eval_final": evals[-1] if evals else None,
        "eval_start": evals[0] if len(evals) > 1 else None,
        "overlap": overlap_fraction(spans) or 0.0,
        "rollout_s_per_step": busy_seconds(spans, "explorer", "rollout") / steps,
        "update_s_per_step": busy_seconds(spans, "trainer", "update") / steps,
        "trainer_wait_s_per_step": statistics.fmean(waits) if waits else 0.0,
        "staleness_max": max((r.get("staleness/max", 0.0) for r in rows), default=0.0),
    }


def summarise(name: str, runs: list[dict], sync_runs: list[dict] | None) -> dict:
    def med(key: str) -> float | None:
        values = [r[key] for r in runs if r[key] is not None]
        return statistics.median(values) if values else None

    out = {
        "variant": name,
        "offset": runs[0]["offset"],
        "runs": runs,
        **{
            f"{k}_median": med(k)
            for k in (
                "steps_per_hour",
                "reward_first_third",
                "reward_last_third",
                "eval_final",
                "overlap",
                "rollout_s_per_step",
                "update_s_per_step",
                "trainer_wait_s_per_step",
                "staleness_max",
            )
        },
    }
    if sync_runs is not None:
        out["speed_ratio_to_sync_median"] = statistics.median(
            r["steps_per_hour"] / s["steps_per_hour"] for r, s in zip(runs, sync_runs, strict=True)
        )
    return out


def run_client_bench(args: argparse.Namespace, reps: int, scratch: Path) -> dict:
    """``benchmarks/async_client.py`` with the same rounds (and ``--tiny``); its JSON results."""
    if not CLIENT_BENCH.exists():
        raise SystemExit(f"--client: {CLIENT_BENCH} is not there")
    out = scratch / "async_client"
    argv = [sys.executable, str(CLIENT_BENCH), "--reps", str(reps), "--warmup", str(args.warmup), "--out", str(out)]
    if args.tiny:
        argv += ["--tiny", "--iterations", "2"]
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
    if (done := subprocess.run(argv, cwd=ROOT, env=env, check=False)).returncode != 0:
        raise SystemExit(f"--client: {CLIENT_BENCH.name} failed (exit status {done.returncode})")
    return json.loads(out.with_suffix(".json").read_text())


def main() -> None:
    args = parse_args()
    steps = args.steps or (6 if args.tiny else 12)
    reps = args.reps or (1 if args.tiny else 3)
    names = pick("--variants", args.variants, VARIANTS)
    extra = [*(TINY if args.tiny else []), *([f"cluster.num_gpus={args.gpus}"] if args.gpus else []), *args.overrides]
    suffix = "_tiny" if args.tiny else "_gpu" if args.gpus else ""
    out = Path(args.out) if args.out else RESULTS / f"async{suffix}"
    scratch = Path(tempfile.mkdtemp(prefix="async-bench-"))
    client = None
    try:
        if args.warmup > 0:
            r = run_variant(VARIANTS[names[0]], args.warmup, extra, scratch / "warmup")
            log(f"warm-up ({names[0]}, {args.warmup} steps, not counted): {r['steps_per_hour']:.0f} steps/h")

        def run(name: str, rep: int) -> dict:
            r = run_variant(VARIANTS[name], steps, extra, scratch / f"{name}-{rep}")
            print(
                f"round {rep + 1}/{reps} {name}: {r['steps_per_hour']:.0f} steps/h, reward "
                f"{statistics.fmean(r['rewards']):.3f}, overlap {r['overlap']:.2f}",
                flush=True,
            )
            return r

        runs = interleaved(run, names, reps, rotate=True)  # who goes first rotates
        if args.client:
            client = run_client_bench(args, reps, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    sync = runs.get("sync")
    results = [summarise(n, runs[n], sync if n != "sync" else None) for n in names]
    device = (gpu_name() or "cpu") if args.gpus else "cpu"
    meta = {
        "recipe": str(RECIPE.relative_to(ROOT)),
        "tiny": args.tiny,
        "steps": steps,
        "reps": reps,
        "warmup": args.warmup,
        "overrides": extra,
        "device": device,
        "commit": git_commit(),
        "cpus": os.cpu_count(),
        "machine": cpu_name(),
        "load_avg": os.getloadavg(),
    }
    title = f"# GRPO recipe: in turn vs explorer ahead ({'tiny model' if args.tiny else 'SmolLM2'}, {device}, {steps} steps, {reps} rounds)"
    header = ["variant", "steps/hour", "vs sync", "reward, first third", "reward, last third", "held-out, end"]
    header += ["overlap", "rollout s/step", "trainer wait s/step"]
    rows = [[r["variant"], f"{r['steps_per_hour_median']:.0f}", f"{r.get('speed_ratio_to_sync_median', 1.0):.2f}x",
             f"{r['reward_first_third_median']:.3f}", f"{r['reward_last_third_median']:.3f}",
             "-" if r["eval_final_median"] is None else f"{r['eval_final_median']:.3f}", f"{r['overlap_median']:.2f}",
             f"{r['rollout_s_per_step_median']:.2f}", f"{r['trainer_wait_s_per_step_median']:.2f}"]
            for r in results]  # fmt: skip
    lines = [title, "", *md_table(header, rows)]
    lines += ["", f"Medians over rounds; commit {meta['commit']}, load average {meta['load_avg'][0]:.1f} at the end."]
    if client is not None:
        lines += ["", f"Client RL loop ({CLIENT_BENCH.name}): see the `client` entry of {out.name}.json."]
    print(write_results(out, {"meta": meta, "results": results, "client": client}, lines), end="")


if __name__ == "__main__":
    main()
