"""The client RL loop synchronous vs off-by-K (K = 1, 2), interleaved, log, pick, medians.

Each variant runs ``cookbook.rl.train.train`` from the same weights, with the
same seed, tasks and iteration count, on the ``arithmetic`` env ("What is a + b?",
exact-match reward, the calculator system prompt) -- only ``max_steps_off_policy`` (and,
with ``--stream M``, ``num_minibatches`` for every variant) differs. Every group is
trained, zero advantages included, so the learner's work does not depend on the rewards
(on the tiny model every reward is 0). A short warm-up run of the first variant, not
counted, goes before the rounds (``--warmup``; a cold first run was 15 % slower). Rounds
rotate which variant goes first; per variant the script reports the median over rounds of:

- iterations/hour: iterations / wall time of the whole run (client set-up included), and
  the median per-round ratio to ``sync``;
- reward at equal iterations: the mean sampled reward of the first and the last third of
  the iterations (every iteration's is in the JSON);
- overlap: ``async/overlap_fraction``, the share of sampling time the learner did not wait
  through (0 for the synchronous loop), and the groups dropped as too stale.

In-process on a CPU, sampling and learning share the same cores, so hiding one behind the
other gains little; measure on a quiet machine (a busy one's numbers are noise). With
the learner and the samplers on different devices (a GPU, the Ray backend) the hidden
sampling time is the gain. Run::

    python benchmarks/async_client.py --tiny --iterations 2 --reps 1 --batch 2 --group 4   # smoke
    python benchmarks/async_client.py --iterations 12 --reps 3                             # SmolLM2, quiet machine
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from harness import RESULTS, cpu_name, git_commit, interleaved, log, md_table, pick, write_results

import trinity_like.client as tinker
from cookbook.rl.train import RLTrainConfig, train
from trinity_like.envs.dataset import build_env_factory
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks

VARIANTS = {"sync": 0, "k1": 1, "k2": 2}  # name -> max_steps_off_policy


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--tiny", action="store_true", help="the tiny random model (a quick check of the script)")
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--reps", type=int, default=3, help="rounds: every variant runs once per round")
    p.add_argument("--batch", type=int, default=8, help="problems (groups) per iteration")
    p.add_argument("--group", type=int, default=8, help="episodes per problem")
    p.add_argument("--max-tokens", type=int, default=16, help="most answer tokens")
    p.add_argument("--stream", type=int, default=0, help="num_minibatches for every variant (0: no streaming)")
    p.add_argument("--loss", default="ppo", help="the loss of every variant (ppo: docs/async.md)")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument(
        "--warmup", type=int, default=2, help="iterations of an uncounted first run before the rounds (0: none)"
    )
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"a comma list of {', '.join(VARIANTS)}")
    p.add_argument(
        "--out", default=None, help="results path without suffix (default benchmarks/results/async_client[_tiny])"
    )
    return p.parse_args()


def run_variant(args: argparse.Namespace, model: str, k: int, folder: Path) -> dict:
    """One training run; its wall time, per-iteration rewards and overlap."""
    config = RLTrainConfig(
        log_path=str(folder / "run"),
        iterations=args.iterations,
        batch_size=args.batch,
        group_size=args.group,
        loss_fn=args.loss,
        learning_rate=args.lr,
        eval_every=0,
        save_every=0,
        progress=False,
        seed=0,
        max_steps_off_policy=k,
        num_minibatches=args.stream,
        skip_zero_advantage_groups=False,
    )
    tasks = arithmetic_tasks(ArithmeticParams(), "train", args.iterations * args.batch)
    started = time.perf_counter()
    with tinker.ServiceClient(log_dir=folder / "client") as service:
        training = service.create_lora_training_client(model, rank=0, seed=0)
        factory = build_env_factory("arithmetic", {"max_tokens": args.max_tokens}, tokenizer=training.get_tokenizer())
        result = train(config, training, factory, tasks)
    wall = time.perf_counter() - started
    return {
        "wall_s": wall,
        "iterations_per_hour": args.iterations / wall * 3600,
        "rewards": [m["reward/mean"] for m in result.metrics],
        "overlap": [m.get("async/overlap_fraction", 0.0) for m in result.metrics],
        "discarded": sum(m.get("async/discarded_stale", 0.0) for m in result.metrics),
        "staleness_mean": statistics.fmean(m.get("async/staleness_mean", 0.0) for m in result.metrics),
    }


def summarise(name: str, runs: list[dict], sync_runs: list[dict] | None, iterations: int) -> dict:
    third = max(1, iterations // 3)
    out = {
        "variant": name,
        "runs": runs,
        "iterations_per_hour_median": statistics.median(r["iterations_per_hour"] for r in runs),
        "reward_first_third_median": statistics.median(statistics.fmean(r["rewards"][:third]) for r in runs),
        "reward_last_third_median": statistics.median(statistics.fmean(r["rewards"][-third:]) for r in runs),
        "overlap_median": statistics.median(statistics.median(r["overlap"]) for r in runs),
        "discarded_median": statistics.median(r["discarded"] for r in runs),
    }
    if sync_runs is not None:
        out["speed_ratio_to_sync_median"] = statistics.median(
            r["iterations_per_hour"] / s["iterations_per_hour"] for r, s in zip(runs, sync_runs, strict=True)
        )
    return out


def main() -> None:
    args = parse_args()
    model = "tiny-random" if args.tiny else args.model
    names = pick("--variants", args.variants, VARIANTS)
    out = Path(args.out) if args.out else RESULTS / ("async_client_tiny" if args.tiny else "async_client")
    scratch = Path(tempfile.mkdtemp(prefix="async-client-bench-"))
    try:
        if args.warmup > 0:
            warm_args = argparse.Namespace(**{**vars(args), "iterations": args.warmup})
            r = run_variant(warm_args, model, VARIANTS[names[0]], scratch / "warmup")
            log(f"warm-up ({names[0]}, {args.warmup} iterations, not counted): {r['iterations_per_hour']:.0f} it/h")

        def run(name: str, rep: int) -> dict:
            r = run_variant(args, model, VARIANTS[name], scratch / f"{name}-{rep}")
            print(
                f"round {rep + 1}/{args.reps} {name}: {r['iterations_per_hour']:.0f} it/h, "
                f"reward {statistics.fmean(r['rewards']):.3f}, overlap {statistics.median(r['overlap']):.2f}",
                flush=True,
            )
            return r

        runs = interleaved(run, names, args.reps, rotate=True)  # who goes first rotates
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    sync = runs.get("sync")
    results = [summarise(n, runs[n], sync if n != "sync" else None, args.iterations) for n in names]
    settings = ("iterations", "reps", "warmup", "batch", "group", "max_tokens", "stream", "loss", "lr")
    meta = {
        "model": model,
        **{key: getattr(args, key) for key in settings},
        "commit": git_commit(),
        "cpus": os.cpu_count(),
        "machine": cpu_name(),
        "load_avg": os.getloadavg(),
    }
    streaming = f", num_minibatches {args.stream} in every variant" if args.stream else ""
    title = f"# Client RL loop: sync (K = 0) vs off-by-K ({model}, {args.iterations} iterations, {args.reps} rounds"
    rows = [[r["variant"], f"{r['iterations_per_hour_median']:.0f}", f"{r.get('speed_ratio_to_sync_median', 1.0):.2f}x",
             f"{r['reward_first_third_median']:.3f}", f"{r['reward_last_third_median']:.3f}",
             f"{r['overlap_median']:.2f}", f"{r['discarded_median']:.0f}"] for r in results]  # fmt: skip
    header = [
        "variant",
        "iterations/hour",
        "vs sync",
        "reward, first third",
        "reward, last third",
        "overlap",
        "dropped",
    ]
    lines = [f"{title}{streaming})", "", *md_table(header, rows), ""]
    lines += [f"Medians over rounds; commit {meta['commit']}, load average {meta['load_avg'][0]:.1f} at the end."]
    print(write_results(out, {"meta": meta, "results": results}, lines), end="")


if __name__ == "__main__":
    main()
