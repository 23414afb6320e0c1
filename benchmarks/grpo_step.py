"""GRPO step rate: our pipeline (verl and local train engines) vs TRL's ``GRPOTrainer``, equal work first.

The same workload on every side: P prompts x G samples of the built-in arithmetic task
(system + user chat messages under the model's chat template), up to N new tokens at
temperature 1.0 with top-k/top-p off, reward = our ``exact_match``, one AdamW step per
batch (lr 1e-6, grad clip 1.0, constant schedule), both sides in one precision, no reference model (beta 0 /
no KL loss), no old-logprob pass (on-policy), gradient checkpointing off, micro-batch M
rows on both sides (TRL: ``per_device_train_batch_size=M``, gradient accumulation P*G/M).

Contenders (``--contenders``, default all five):

- ``trl``: ``trl.GRPOTrainer`` (``use_cpu=True``), timed from ``on_step_begin`` to
  ``on_step_end``; ``model.generate`` and ``_generate_and_score_completions`` are wrapped
  to split generation / scoring from the training pass. Trains every row.
- ``verl`` / ``local``: ``examples/grpo_arith.yaml`` (our default GRPO recipe) with the
  workload overridden and ``algorithm.dynamic_sampling=false``: every group trained, the
  same work as TRL. Built by ``build_stage`` and stepped by the real ``run_online`` loop,
  one step per call (``trainer.total_steps`` raised by one, the loop's ``LoopState`` kept;
  checkpointing and evaluation off). The step time is the loop's ``time/step``, the phases
  its ``time/*`` metrics, with ``update`` split into forward_backward / optim_step and
  ``sync`` into gather (``export_weights``) / transfer by timing wrappers on the engine.
- ``verl-dyn`` / ``local-dyn``: the recipe as it ships, dynamic sampling on (DAPO): only
  groups whose rewards differ are trained, so these steps do *less work* than TRL's. They
  are reported in a second table, never as a like-for-like speed-up.

Isolation and interleaving: every contender runs in its own process, one at a time (this
script again, ``--contender NAME``): build, one warm-up step, ``--steps`` timed steps,
write a JSON, shut down the Ray it started, exit. No two contenders share memory or
cores. A round runs every contender once; the order alternates between rounds, so
drifting load on a shared machine falls on every side alike. Reported: per-contender
medians over all timed steps, and the median over rounds of the per-round speed ratio
(TRL's median step in round r / ours in round r). Each process starts from the same
weights and seeds, so every round repeats the same work.

Memory: the peak over the contender's run of the summed RSS (and PSS) of its process,
its descendants and every process carrying its environment tag (Ray's workers and
raylet), sampled by the parent (:class:`harness.PeakMemory`): RSS every 0.25 s, PSS every 2 s
(reading PSS walks the process's page tables; more often, it slowed the larger contenders).

Training-pass rate: equal-work tokens/s = real tokens of the rows trained (prompt +
response, per row) / training seconds (ours: the ``update`` phase; TRL: step minus
generation and scoring). % of peak = 6 x parameters x tokens the side ran through the
model / training seconds / the fp32 matmul peak measured here on the same cores. Tokens
run, padding left out on both sides: ours, the engine's ``perf/train_tokens`` when it
reports it (each group's prompt runs once), else the rows' real tokens; TRL, the rows'
real tokens (every row runs its prompt; its padded micro-batches, rows x (prompt width +
completion width), are kept in the JSON as ``padded_tokens``). Run::

    python benchmarks/grpo_step.py --tiny --contenders local --out /tmp/gs_tiny   # smoke (a test runs it)
    python benchmarks/grpo_step.py --model smollm2-135m-instruct --rounds 3 --steps 2

Precision (``--precision fp32|bf16|both``, default both: the rounds run once per precision and
write ``OUT_fp32.*`` and ``OUT_bf16.*``), the same on both sides: ``fp32`` is ours with
``model.dtype=float32 explorer.dtype=float32`` and TRL with ``bf16=False``; ``bf16`` is ours
with the mixed path (``model.dtype=auto``: bf16 compute over fp32 masters, which needs a CPU
whose ``auto`` is bf16 -- ``TRINITY_LIKE_CPU_BF16=on`` forces it elsewhere -- and
``explorer.dtype=bfloat16``) and TRL with ``bf16=True`` (accelerate's bf16 autocast over its
fp32 model). % of peak is against the matmul peak in that precision.

TRL (``trl==1.16.0``, the ``bench`` extra) is loaded from ``$TRL_PATH`` when that
folder exists (default ``~/.cache/trinity-like-bench/trl-1.16.0``), else from the
environment. A private folder keeps it out of verl's Ray workers: verl 0.9.1's model
patching imports ``AutoModelForCausalLMWithValueHead`` whenever ``trl`` is importable,
which TRL 1.16 no longer has (``verl_worker.skip_verl_trl_patch_without_value_head``
now works around it)::

    pip install --no-deps --target ~/.cache/trinity-like-bench/trl-1.16.0 trl==1.16.0

Modules: this one runs the rounds (the parent) and one contender (the child, ``--contender``);
grpo_step_ours.py and grpo_step_trl.py are the two sides, grpo_step_report.py the tables.
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import importlib.metadata  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import harness  # noqa: E402
import torch  # noqa: E402
from grpo_step_report import CONTENDERS, write_results  # noqa: E402
from harness import RESULTS, ROOT, contender_main, interleaved, isolated, log, matmul_peak_gflops  # noqa: E402

RECIPE = ROOT / "examples" / "grpo_arith.yaml"
# what a contender's process is told (``--key value``)
WORKLOAD = ("model", "steps", "prompts", "group", "max_new_tokens", "micro_batch", "lr", "threads", "nice", "recipe")
WORKLOAD += ("precision",)
PRECISIONS = ("fp32", "bf16")
PEAK_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
TINY = {
    "model": "tiny-random",
    "rounds": 1,
    "steps": 1,
    "prompts": 2,
    "group": 4,
    "max_new_tokens": 8,
    "micro_batch": 8,
}


# == one contender, in its own process ======================================================
def renice_self(nice: int) -> None:
    """Every thread of this process at niceness ``nice`` (Linux niceness is per thread)."""
    if not nice:
        return
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


def build_contender(args: argparse.Namespace, folder: str) -> Any:
    """The contender ``args.contender``, built, and this process reniced (after Ray started:
    its workers take 15 relative to the raylet's niceness)."""
    if args.contender == "trl":
        from grpo_step_trl import Trl

        contender = Trl(args, os.path.join(folder, "trl"))
    else:
        from grpo_step_ours import Ours

        contender = Ours(args.contender, args, folder)
    renice_self(args.nice)
    return contender


def run_contender(args: argparse.Namespace) -> None:
    """Internal mode: build ``args.contender``, one warm-up step + ``args.steps`` timed, write ``args.child_json``."""
    torch.set_num_threads(args.threads)
    name = args.contender
    tmp = tempfile.mkdtemp(prefix=f"grpo_step_{name}_")
    result = contender_main(lambda: build_contender(args, tmp), args.steps + 1, Path(args.child_json), name)
    for i, m in enumerate([result["warmup"], *result["steps"]]):
        phases = ", ".join(f"{k[5:]} {v:.2f}" for k, v in m.items() if k.startswith("time/") and "." not in k)
        log(f"{name} {'warm-up' if i == 0 else f'step {i}'}: {m['time/step']:.2f} s ({phases})")


# == the parent: rounds of isolated contenders ==============================================
def run_child(name: str, args: argparse.Namespace, rnd: int, folder: Path) -> dict[str, Any]:
    """Run contender ``name`` in its own process; its JSON plus peak memory and wall time."""
    out = folder / f"round{rnd}_{name}.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--contender", name, "--child-json", str(out)]
    for key in WORKLOAD:
        argv += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    result = isolated(argv, out, timeout=args.child_timeout)
    if "error" in result:
        raise SystemExit(f"contender {name} (round {rnd}) failed: {result['error']}; its log is above")
    return result


def model_parameters(model: str) -> int:
    """Parameter count of ``model`` (tied weights once), from its config on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trinity_like.models.resolve import resolve_model_path

    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model_path(model)))
    return sum(p.numel() for p in net.parameters())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in id or model folder")
    parser.add_argument(
        "--contenders",
        default=",".join(CONTENDERS),
        help=f"comma-separated, of: {', '.join(CONTENDERS)} (speed ratios need trl)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds; each runs every contender once")
    parser.add_argument("--steps", type=int, default=2, help="timed steps per contender per round (after 1 warm-up)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=16, help="rows per forward/backward, both sides")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads of each contender")
    parser.add_argument(
        "--nice",
        type=int,
        default=15,
        help="niceness of each contender's process: Ray starts its workers (our verl workers and "
        "explorer actor) at niceness 15, so driver-side work (TRL, ours-local) runs at the same "
        "CPU priority under load; 0 keeps the process as started",
    )
    parser.add_argument("--recipe", type=Path, default=RECIPE)
    parser.add_argument("--peak-size", type=int, default=2048, help="matrix size of the fp32 matmul peak")
    parser.add_argument("--child-timeout", type=float, default=3600, help="seconds one contender process may run")
    parser.add_argument("--out", type=Path, default=RESULTS / "grpo_step", help="writes OUT.md and OUT.json")
    parser.add_argument(
        "--precision",
        choices=(*PRECISIONS, "both"),
        default="both",
        help="both sides in fp32, both in bf16 (ours mixed, TRL bf16=True), or each in turn (OUT_fp32, OUT_bf16)",
    )
    parser.add_argument("--tiny", action="store_true", help="the tiny random model, 1 round of 1 step: a smoke run")
    parser.add_argument("--contender", choices=CONTENDERS, help=argparse.SUPPRESS)  # internal: one contender
    parser.add_argument("--child-json", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.tiny:
        for key, value in TINY.items():
            setattr(args, key, value)
    if (args.prompts * args.group) % args.micro_batch:
        parser.error("prompts x group must be a multiple of --micro-batch")
    if args.contender:
        return run_contender(args)
    names = [n for n in CONTENDERS if n in harness.pick("--contenders", args.contenders, CONTENDERS)]

    torch.set_num_threads(args.threads)
    precisions = PRECISIONS if args.precision == "both" else (args.precision,)
    out = args.out
    for precision in precisions:
        args.precision = precision
        args.out = out.with_name(f"{out.name}_{precision}") if len(precisions) > 1 else out
        print(run_rounds(args, names, argv))


def run_rounds(args: argparse.Namespace, names: list[str], argv: list[str] | None) -> str:
    """Every round of ``names`` at ``args.precision``; writes ``args.out``.{md,json} after each round."""
    load_start = os.getloadavg()[0]
    dtype = PEAK_DTYPES[args.precision]
    peak = matmul_peak_gflops(args.peak_size, dtype=dtype)
    log(f"{args.precision} matmul peak {peak:.1f} GFLOP/s ({args.peak_size}^3, {args.threads} threads)")
    versions = ", ".join(f"{p} {importlib.metadata.version(p)}" for p in ("torch", "transformers", "verl", "ray"))
    meta = {
        "command": harness.command("grpo_step.py", argv),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "commit": harness.git_commit(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{harness.cpu_name()}, python {platform.python_version()}, {versions}",
        "load_start": load_start,
        "params": model_parameters(args.model),
        "peak_gflops": peak,
        "peak_size": args.peak_size,
        "orders": harness.orders(names, args.rounds),
    }
    folder = Path(tempfile.mkdtemp(prefix="grpo_step_"))

    def run(name: str, rnd: int) -> dict:
        log(f"round {rnd}: {name} ({args.precision})")
        r = run_child(name, args, rnd, folder)
        times, m = ", ".join(f"{s['time/step']:.2f}" for s in r["steps"]), r["memory"]
        mem = f"peak RSS {m['peak_rss_gb']:.2f} GB (PSS {m['peak_pss_gb']:.2f}) over {m['max_processes']} processes"
        log(f"round {rnd} {name}: steps {times} s; {mem}")
        return r

    texts = [""]

    def after(rnd: int, results: dict[str, list[dict]]) -> None:  # written after every round: a cut-off run keeps them
        if rnd == args.rounds - 1:  # the peak again, after the rounds: the best of both
            meta["peak_gflops"] = max(peak, matmul_peak_gflops(args.peak_size, dtype=dtype))
        rounds = [{n: results[n][k] for n in meta["orders"][k]} for k in range(rnd + 1)]
        texts.append(write_results(args, meta, rounds))

    interleaved(run, names, args.rounds, after_round=after)
    return texts[-1]


if __name__ == "__main__":
    main()
