"""GRPO step rate: our pipeline (verl and local train engines) vs TRL's ``GRPOTrainer``, interleaved.

The same workload on every side: P prompts x G samples of the built-in arithmetic task
(system + user chat messages under the model's chat template), up to N new tokens at
temperature 1.0 with top-k/top-p off, reward = our ``exact_match``, one AdamW step per
batch (lr 1e-6, grad clip 1.0, constant schedule), fp32, no reference model (beta 0 /
no KL loss), no old-logprob pass (on-policy), gradient checkpointing off, micro-batch M
rows on both sides (TRL: ``per_device_train_batch_size=M``, gradient accumulation P*G/M).

Contenders:

- ``ours-verl`` / ``ours-local``: ``examples/grpo_arith.yaml`` (our default GRPO recipe)
  with the workload overridden, built by ``build_stage`` and stepped by the real
  ``run_online`` loop -- one step per call, by raising ``trainer.total_steps`` by one and
  setting ``start_step`` (checkpointing and evaluation switched off; the loop has no
  single-step entry point). The step time is the loop's own ``time/step`` and the phases
  its ``time/*`` metrics (rollout, buffer_write, sample, advantage, update, sync), with
  ``update`` split into forward_backward / optim_step and ``sync`` into gather
  (``export_weights``: the state dict, or for verl gathered and put in Ray's object store by
  rank 0) / transfer (the explorer fetching and loading them) by timing wrappers on the
  engine object.
- ``trl``: ``trl.GRPOTrainer`` (``use_cpu=True``), timed from ``on_step_begin`` to
  ``on_step_end``; ``model.generate`` and ``_generate_and_score_completions`` are wrapped
  to split generation / scoring from the training pass.

Interleaving: our steps run inside TRL's ``on_step_end`` callback, so every round is one
TRL step followed by one step of each of ours (their order alternates per round); the
first round is warm-up and not counted. Reported: medians, the ratio of median step
rates and the median of per-round ratios (fair under drifting load; absolute times on a
shared machine are not). Run::

    python benchmarks/grpo_step.py --model tiny-random --steps 3         # smoke, ~2 min
    python benchmarks/grpo_step.py --model smollm2-135m-instruct --steps 8 [--allgroups verl]

TRL (``trl==1.16.0``, the ``bench`` extra) is loaded from ``$TRL_PATH`` when that
folder exists (default ``~/.cache/trinity-like-bench/trl-1.16.0``), else from the
environment. A private folder keeps it out of verl's Ray workers: verl 0.9.1's model
patching imports ``AutoModelForCausalLMWithValueHead`` whenever ``trl`` is importable,
which TRL 1.16 no longer has (``verl_worker.skip_verl_trl_patch_without_value_head``
now works around it)::

    pip install --no-deps --target ~/.cache/trinity-like-bench/trl-1.16.0 trl==1.16.0
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import dataclasses  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any, Callable  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
RECIPE = ROOT / "examples" / "grpo_arith.yaml"
TRL_PATH = Path(os.environ.get("TRL_PATH", "~/.cache/trinity-like-bench/trl-1.16.0")).expanduser()


def import_trl() -> Any:
    """``trl`` from its private folder if there is one (see the module docstring), else the installed one."""
    if TRL_PATH.is_dir() and str(TRL_PATH) not in sys.path:
        sys.path.insert(0, str(TRL_PATH))
    import trl

    return trl


def timed(fn: Callable, sink: dict[str, float], key: str) -> Callable:
    """``fn`` that adds its wall time to ``sink[key]``."""

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            sink[key] = sink.get(key, 0.0) + time.perf_counter() - t0

    return wrapper


# -- ours ----------------------------------------------------------------------------------
class Ours:
    """One online stage of our default GRPO recipe, stepped one ``run_online`` step at a time."""

    def __init__(self, engine: str, args: argparse.Namespace, run_root: str, all_groups: bool = False,
                 ray_cpus: int | None = None) -> None:
        from trinity_like.config import load_plan
        from trinity_like.pipeline.stage import build_stage

        self.name = f"ours-{engine}" + ("-allgroups" if all_groups else "")
        overrides = [
            f"name={self.name}",
            f"run_root={run_root}",
            f"model.path={args.model}",
            f"model.max_response_tokens={args.max_new_tokens}",
            f"explorer.batch_size={args.prompts}",
            f"explorer.group_size={args.group}",
            "explorer.sampling.temperature=1.0",
            f"trainer.engine={engine}",
            f"trainer.micro_batch_size={args.micro_batch}",
            f"trainer.optimizer.lr={args.lr:.6e}",
            f"trainer.total_steps={args.steps + 1}",
            f"checkpoint.interval={10**6}",
            "monitor.eval_at_start=false",
            "monitor.progress=false",
        ] + (["algorithm.dynamic_sampling=false"] if all_groups else [])
        # Each verl engine's placement group takes one Ray CPU per worker: with several verl
        # contenders in one Ray session, the session needs that many logical CPUs.
        overrides += [f"cluster.num_cpus={ray_cpus}"] if ray_cpus else []
        self.stage = load_plan(args.recipe, overrides).stages[0]
        t0 = time.perf_counter()
        self.ctx = build_stage(self.stage, "both")
        self.setup_s = time.perf_counter() - t0
        self.ctx.data.eval_tasks = None  # no evaluation (the loop evaluates after its last step)
        self.ctx.checkpoint = lambda step: None  # the loop checkpoints at its last step; TRL saves nothing either
        self.extra: dict[str, float] = {}
        actor = self.ctx.actor
        actor.forward_backward = timed(actor.forward_backward, self.extra, "time/update.forward_backward")
        actor.optim_step = timed(actor.optim_step, self.extra, "time/update.optim_step")
        actor.export_weights = timed(actor.export_weights, self.extra, "time/sync.gather")
        self.step_no = 0
        self.overrides = overrides

    def step(self) -> dict[str, float]:
        from trinity_like.pipeline.rl_loop import run_online

        self.step_no += 1
        cfg = self.stage.config
        trainer = cfg.trainer.model_copy(update={"total_steps": self.step_no})
        self.ctx.spec = dataclasses.replace(self.stage, config=cfg.model_copy(update={"trainer": trainer}))
        self.ctx.start_step = self.step_no - 1
        self.extra.clear()
        t0 = time.perf_counter()
        metrics = dict(run_online(self.ctx))
        metrics["time/wall"] = time.perf_counter() - t0
        metrics.update(self.extra)
        if "time/sync" in metrics and "time/sync.gather" in metrics:
            metrics["time/sync.transfer"] = metrics["time/sync"] - metrics["time/sync.gather"]
        return metrics

    def close_explorer(self) -> None:
        if self.ctx.explorer is not None:
            self.ctx.explorer.close()
        self.ctx.explorer = None


def verl_worker_threads() -> list[dict[str, str]]:
    """OMP_NUM_THREADS and OS thread count of this run's verl worker processes (what Ray gave them).

    This run's workers are children of the raylet this process started (other runs on the
    machine have their own)."""

    def status(pid: str) -> dict[str, str]:
        rows = (Path("/proc") / pid / "status").read_text().splitlines()
        return {k: v.strip() for k, _, v in (r.partition(":") for r in rows)}

    out = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if b"TrinityVerlWorker" not in (proc / "cmdline").read_bytes():
                continue
            st = status(proc.name)
            if status(st["PPid"])["PPid"] != str(os.getpid()):
                continue
            env = dict(kv.split(b"=", 1) for kv in (proc / "environ").read_bytes().split(b"\0") if b"=" in kv)
        except (OSError, KeyError):
            continue
        out.append({"pid": proc.name, "OMP_NUM_THREADS": env.get(b"OMP_NUM_THREADS", b"unset").decode(),
                    "os_threads": st.get("Threads", "?")})
    return out


def renice_self(nice: int) -> None:
    """Every thread of this process at niceness ``nice`` (Linux niceness is per thread)."""
    if not nice:
        return
    for tid in os.listdir("/proc/self/task"):
        try:
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)
        except OSError:
            pass


# -- TRL -----------------------------------------------------------------------------------
def exact_match_reward(completions: list, answer: list, **_: Any) -> list[float]:
    """Our ``exact_match`` reward fn on TRL's conversational completions."""
    from trinity_like.explorer.rewards import exact_match

    return [exact_match(response=c[0]["content"], answer=a) for c, a in zip(completions, answer)]


def build_trl(args: argparse.Namespace, out_dir: str, callback: Any) -> Any:
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    trl = import_trl()
    GRPOConfig, GRPOTrainer = trl.GRPOConfig, trl.GRPOTrainer

    from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
    from trinity_like.models.resolve import load_tokenizer, resolve_model_path

    path = resolve_model_path(args.model)
    tokenizer = load_tokenizer(path)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
    tasks = arithmetic_tasks(ArithmeticParams(), split="train", count=args.prompts * (args.steps + 2))
    data = Dataset.from_list([{"prompt": t.messages(), "answer": t.answer} for t in tasks])
    rows = args.prompts * args.group
    config = GRPOConfig(
        output_dir=out_dir,
        use_cpu=True,
        bf16=False,
        per_device_train_batch_size=args.micro_batch,
        gradient_accumulation_steps=rows // args.micro_batch,
        num_generations=args.group,
        max_completion_length=args.max_new_tokens,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        beta=0.0,
        num_iterations=1,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        max_grad_norm=1.0,
        weight_decay=0.0,
        gradient_checkpointing=False,
        max_steps=args.steps + 1,
        logging_steps=1,
        report_to="none",
        save_strategy="no",
        seed=42,
        dataloader_num_workers=0,
    )
    trainer = GRPOTrainer(
        model=model, reward_funcs=exact_match_reward, args=config, train_dataset=data,
        processing_class=tokenizer, callbacks=[callback],
    )
    sink = callback.trl_phases
    trainer.model.generate = timed(trainer.model.generate, sink, "time/generate")
    trainer._generate_and_score_completions = timed(trainer._generate_and_score_completions, sink, "time/rollout")
    return trainer


def make_callback(ours: list[Ours], runs: dict[str, list[dict]], log: Callable[[str], None],
                  after_round: Callable[[], Any]) -> Any:
    from transformers import TrainerCallback

    class Interleave(TrainerCallback):
        """Times TRL's step, then runs one step of each of ours (alternating order)."""

        def __init__(self) -> None:
            self.trl_phases: dict[str, float] = {}
            self.t0 = 0.0
            self.round = 0
            self.logs: dict[str, float] = {}

        def on_step_begin(self, args, state, control, **kw):
            self.trl_phases.clear()
            self.t0 = time.perf_counter()

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self.t_opt = time.perf_counter()

        def on_optimizer_step(self, args, state, control, **kw):
            self.trl_phases["time/optim_step"] = time.perf_counter() - self.t_opt

        def on_step_end(self, args, state, control, **kw):
            step_s = time.perf_counter() - self.t0
            m = {"time/step": step_s, **self.trl_phases, "load1": os.getloadavg()[0]}
            m["time/train"] = step_s - m.get("time/rollout", 0.0)
            runs["trl"].append(m)
            log(f"round {self.round} trl: {step_s:.2f} s (generate {m.get('time/generate', 0):.2f} s)")
            order = ours if self.round % 2 == 0 else ours[::-1]
            for o in order:
                om = o.step()
                om["load1"] = os.getloadavg()[0]
                runs[o.name].append(om)
                phases = ", ".join(f"{k[5:]} {v:.2f}" for k, v in om.items() if k.startswith("time/") and "." not in k)
                log(f"round {self.round} {o.name}: {om['time/step']:.2f} s ({phases})")
            self.round += 1
            after_round()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and runs["trl"]:
                keep = ("completions/mean_length", "reward", "loss", "grad_norm")
                runs["trl"][-1].update({f"log/{k}": float(v) for k, v in logs.items() if k in keep})

    return Interleave()


# -- summary -------------------------------------------------------------------------------
def summarise(runs: dict[str, list[dict]], warmup: int, rows: int) -> dict[str, Any]:
    counted = {name: rs[warmup:] for name, rs in runs.items()}
    out: dict[str, Any] = {}
    for name, rs in counted.items():
        if not rs:
            continue
        keys = sorted({k for r in rs for k in r if k.startswith("time/")})
        med = {k: statistics.median(r.get(k, 0.0) for r in rs) for k in keys}
        out[name] = {"steps": len(rs), "median_step_s": med["time/step"], "steps_per_s": 1.0 / med["time/step"],
                     "phases_median_s": med}
        lengths = [r.get("response_length/mean", r.get("log/completions/mean_length")) for r in rs]
        lengths = [x for x in lengths if x is not None]
        if lengths:
            out[name]["mean_response_tokens"] = statistics.fmean(lengths)
        out[name]["mean_reward"] = statistics.fmean(r.get("reward/mean", r.get("log/reward", float("nan"))) for r in rs)
        out[name]["mean_rows_trained"] = statistics.fmean(
            0 if r.get("skipped/no_signal") else rows - r.get("dynamic_sampling/dropped_rows", 0) for r in rs)
    trl = counted.get("trl", [])
    for name in out:
        if name == "trl" or not trl:
            continue
        per_round = [t["time/step"] / o["time/step"] for o, t in zip(counted[name], trl)]
        out[name]["speedup_vs_trl_median_of_rounds"] = statistics.median(per_round)
        out[name]["speedup_vs_trl_ratio_of_medians"] = out[name]["steps_per_s"] / out["trl"]["steps_per_s"]
    return out


OUR_PHASES = ("rollout", "buffer_write", "sample", "advantage", "reference", "old_logprob",
              "update", "update.forward_backward", "update.optim_step", "sync", "sync.gather", "sync.transfer")


def markdown(summary: dict, meta: dict) -> str:
    a = meta["args"]
    lines = [
        "# GRPO step rate: ours vs TRL `GRPOTrainer`",
        "",
        f"Command: `{meta['command']}`",
        "",
        f"Workload: `{a['model']}`, {a['prompts']} prompts x {a['group']} samples, up to {a['max_new_tokens']} new "
        f"tokens, T=1.0, top_k/top_p off, lr {a['lr']:g}, micro-batch {a['micro_batch']}, fp32, no reference model, "
        f"no gradient checkpointing; {max((s['steps'] for s in summary.values()), default=0)} counted rounds "
        f"(of {a['steps']} asked) after 1 warm-up, interleaved (TRL step, then ours). "
        f"Driver torch threads {a['threads']}, niceness {a['nice']} (Ray starts its workers at 15); "
        "verl worker processes (OMP_NUM_THREADS): "
        f"{', '.join(w['OMP_NUM_THREADS'] for w in meta['verl_worker_threads']) or '-'}.",
        "",
        f"Machine: {meta['machine']}. Load average (1 min) at start {meta['load_start']:.1f}, at end "
        f"{meta['load_end']:.1f}, median during counted steps {meta['load_median']:.1f} -- a shared machine: "
        "compare the ratios, not absolute times.",
        "",
        "| contender | median step s | steps/s | speedup vs TRL (ratio of medians) | (median of per-round ratios) "
        "| mean response tokens | mean rows trained | mean reward |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for name, s in summary.items():
        r1 = s.get("speedup_vs_trl_ratio_of_medians")
        r2 = s.get("speedup_vs_trl_median_of_rounds")
        fmt = (lambda x: f"{x:.2f}x") if r1 is not None else (lambda x: "-")
        lines.append(f"| {name} | {s['median_step_s']:.2f} | {s['steps_per_s']:.4f} | {fmt(r1)} | {fmt(r2)} "
                     f"| {s.get('mean_response_tokens', float('nan')):.1f} | {s['mean_rows_trained']:.1f} "
                     f"| {s['mean_reward']:.3f} |")
    lines += ["", "Our phases (median seconds per step; `a.b` is a part of `a`):", "",
              "| contender | step | " + " | ".join(OUR_PHASES) + " |", "|---" * (len(OUR_PHASES) + 2) + "|"]
    for name, s in summary.items():
        if name == "trl":
            continue
        p = s["phases_median_s"]
        cells = [f"{p[f'time/{k}']:.2f}" if f"time/{k}" in p else "-" for k in OUR_PHASES]
        lines.append(f"| {name} | {p['time/step']:.2f} | " + " | ".join(cells) + " |")
    if "trl" in summary:
        p = summary["trl"]["phases_median_s"]
        lines += ["", "TRL phases (median seconds per step): "
                  f"step {p['time/step']:.2f}; generation + scoring (`_generate_and_score_completions`) "
                  f"{p.get('time/rollout', 0):.2f}, of which `model.generate` {p.get('time/generate', 0):.2f}; "
                  f"training pass {p.get('time/train', 0):.2f}, "
                  f"of which optimizer step {p.get('time/optim_step', 0):.2f}."]
    return "\n".join(lines) + "\n"


def write_results(args: argparse.Namespace, command: str, runs: dict[str, list[dict]], load_start: float,
                  threads: list, setup: dict, ours: list[Ours]) -> str:
    """Write OUT.md and OUT.json from the rounds so far (called after every round: a cut-off run keeps them)."""
    summary = summarise(runs, warmup=1, rows=args.prompts * args.group)
    loads = [r["load1"] for rs in runs.values() for r in rs[1:] if "load1" in r]
    import transformers
    import verl

    meta = {
        "command": command.strip(),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, torch "
                   f"{torch.__version__}, transformers {transformers.__version__}, verl {verl.__version__}"
                   + ("" if args.no_trl else f", trl {import_trl().__version__}"),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "load_start": load_start, "load_end": os.getloadavg()[0],
        "load_median": statistics.median(loads) if loads else float("nan"),
        "verl_worker_threads": threads,
        "setup_s": setup,
        "our_overrides": ours[0].overrides if ours else [],
    }
    text = markdown(summary, meta)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    full = {**meta, "summary": summary, "runs": runs}
    args.out.with_suffix(".json").write_text(json.dumps(full, indent=1, default=float))
    return text


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct", help="built-in id or model folder")
    parser.add_argument("--steps", type=int, default=8, help="counted rounds (after one warm-up round)")
    parser.add_argument("--engine", choices=["verl", "local", "both", "none"], default="both",
                        help="which of our train engines to run beside TRL")
    parser.add_argument("--allgroups", choices=["none", "verl", "local", "both"], default="none",
                        help="also run this engine with dynamic sampling off (every group trained, as TRL does; "
                             "the recipe skips groups of equal rewards)")
    parser.add_argument("--no-trl", action="store_true", help="only ours (then rounds are driven here)")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--micro-batch", type=int, default=16, help="rows per forward/backward, both sides")
    parser.add_argument("--lr", type=float, default=1e-6)
    parser.add_argument("--threads", type=int, default=os.cpu_count(), help="torch threads of this process")
    parser.add_argument("--nice", type=int, default=15,
                        help="niceness of this process: Ray starts its workers (our verl workers and explorer "
                             "actor) at niceness 15, so the driver-side contenders (TRL, ours-local) run at the "
                             "same CPU priority under load; 0 keeps this process as started")
    parser.add_argument("--recipe", type=Path, default=RECIPE)
    parser.add_argument("--out", type=Path, default=RESULTS / "grpo_step", help="writes OUT.md and OUT.json")
    args = parser.parse_args(argv)
    if (args.prompts * args.group) % args.micro_batch:
        parser.error("prompts x group must be a multiple of --micro-batch")
    torch.set_num_threads(args.threads)
    command = "python benchmarks/grpo_step.py " + " ".join(sys.argv[1:] if argv is None else argv)

    def log(text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)

    load_start = os.getloadavg()[0]
    engines = {"both": ["verl", "local"], "none": []}.get(args.engine, [args.engine])
    tmp = tempfile.mkdtemp(prefix="grpo_step_")
    ours: list[Ours] = []
    runs: dict[str, list[dict]] = {}
    setup: dict[str, float] = {}
    try:
        extra = {"both": ["verl", "local"], "none": []}.get(args.allgroups, [args.allgroups])
        variants = [(e, False) for e in engines] + [(e, True) for e in extra]
        n_verl = sum(e == "verl" for e, _ in variants)
        ray_cpus = 2 * n_verl if n_verl > 1 else None
        for engine, all_groups in variants:
            o = Ours(engine, args, tmp, all_groups, ray_cpus)
            ours.append(o)
            setup[o.name] = o.setup_s
            runs[o.name] = []
            log(f"{o.name} built in {o.setup_s:.1f} s")
        threads = verl_worker_threads()
        renice_self(args.nice)  # after Ray started: its workers take 15 relative to the raylet's niceness

        def after_round() -> None:
            write_results(args, command, runs, load_start, threads, setup, ours)

        if args.no_trl:
            for rnd in range(args.steps + 1):
                for o in ours if rnd % 2 == 0 else ours[::-1]:
                    m = o.step()
                    m["load1"] = os.getloadavg()[0]
                    runs[o.name].append(m)
                    log(f"round {rnd} {o.name}: {m['time/step']:.2f} s")
                after_round()
        else:
            runs["trl"] = []
            callback = make_callback(ours, runs, log, after_round)
            t0 = time.perf_counter()
            trainer = build_trl(args, os.path.join(tmp, "trl"), callback)
            setup["trl"] = time.perf_counter() - t0
            trainer.train()
    finally:
        # Explorer actors first, then the contexts newest first: the first verl engine
        # started Ray and shuts it down on close, which would orphan the other handles.
        for o in ours:
            o.close_explorer()
        for o in reversed(ours):
            o.ctx.close()
    print(write_results(args, command, runs, load_start, threads, setup, ours))


if __name__ == "__main__":
    main()
