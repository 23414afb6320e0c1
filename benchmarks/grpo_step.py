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
raylet), sampled by the parent (:class:`common.PeakMemory`): RSS every 0.25 s, PSS every 2 s
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
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import argparse  # noqa: E402
import contextlib
import dataclasses  # noqa: E402
import importlib.metadata  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import torch  # noqa: E402
from common import PeakMemory, cpu_name, git_commit, matmul_peak_gflops, stop_group  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
RECIPE = ROOT / "examples" / "grpo_arith.yaml"
TRL_PATH = Path(os.environ.get("TRL_PATH", "~/.cache/trinity-like-bench/trl-1.16.0")).expanduser()

EQUAL_WORK = ("trl", "verl", "local")  # every group trained on both sides
DYNAMIC = ("verl-dyn", "local-dyn")  # the recipe as shipped: groups without reward signal skipped
CONTENDERS = EQUAL_WORK + DYNAMIC
WORKLOAD = (
    "model",
    "steps",
    "prompts",
    "group",
    "max_new_tokens",
    "micro_batch",
    "lr",
    "threads",
    "nice",
    "recipe",
    "precision",
)
PRECISIONS = ("fp32", "bf16")
PRECISION_TEXT = {
    "fp32": "fp32 on both sides",
    "bf16": "bf16 compute over fp32 weights on both sides (ours: the mixed path and a bf16 rollout; TRL: bf16=True)",
}
# Our recipe keys per precision (bf16: the mixed path model.dtype auto gives where the CPU has bf16 units).
OUR_DTYPES = {
    "fp32": ["model.dtype=float32", "explorer.dtype=float32"],
    "bf16": ["model.dtype=auto", "explorer.dtype=bfloat16"],
}
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


def log(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


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


# == one contender, in its own process ======================================================
# -- ours ----------------------------------------------------------------------------------
def check_mixed_path() -> None:
    """``--precision bf16`` times our mixed path: stop where ``model.dtype=auto`` would train fp32 here."""
    from trinity_like.models.device import precision

    p = precision(torch.device("cpu"))
    if p.train_compute is None:
        raise SystemExit(
            f"--precision bf16: model.dtype auto trains fp32 on this CPU ({p.why}); "
            "TRINITY_LIKE_CPU_BF16=on forces the bf16 path"
        )


class Ours:
    """One online stage of our default GRPO recipe, stepped one ``run_online`` step at a time."""

    def __init__(self, name: str, args: argparse.Namespace, run_root: str) -> None:
        from trinity_like.config import load_plan
        from trinity_like.pipeline.build import build_stage
        from trinity_like.pipeline.rl_loop import LoopState

        engine, _, dyn = name.partition("-")
        self.overrides = [
            f"name=ours-{name}",
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
        ] + ([] if dyn else ["algorithm.dynamic_sampling=false"])
        self.overrides += OUR_DTYPES[args.precision]
        self.stage = load_plan(args.recipe, self.overrides).stages[0]
        if args.precision == "bf16":
            check_mixed_path()
        self.ctx = build_stage(self.stage, "both")
        self.ctx.data.eval_tasks = None  # no evaluation (the loop evaluates after its last step)
        self.ctx.save_checkpoint = lambda step, loop_state: (
            None
        )  # the loop checkpoints at its last step; TRL saves nothing either
        self.extra: dict[str, float] = {}
        self.loop = LoopState.resume(self.ctx)  # a fresh run directory: step 0
        actor = self.ctx.trainer.actor
        actor.forward_backward = self.counted(timed(actor.forward_backward, self.extra, "time/update.forward_backward"))
        actor.optim_step = timed(actor.optim_step, self.extra, "time/update.optim_step")
        actor.export_weights = timed(actor.export_weights, self.extra, "time/sync.gather")
        self.step_no = 0

    def counted(self, fn: Callable) -> Callable:
        """``forward_backward`` that records the rows and tokens of the batch it trains."""

        def wrapper(batch: dict[str, torch.Tensor], *args: Any, **kwargs: Any) -> Any:
            add = {"rows_trained": batch["input_ids"].shape[0], "real_tokens": float(batch["attention_mask"].sum())}
            for k, v in add.items():
                self.extra[k] = self.extra.get(k, 0.0) + v
            return fn(batch, *args, **kwargs)

        return wrapper

    def step(self) -> dict[str, Any]:
        from trinity_like.pipeline.rl_loop import run_online

        self.step_no += 1
        cfg = self.stage.config
        trainer = cfg.trainer.model_copy(update={"total_steps": self.step_no})
        self.ctx.spec = dataclasses.replace(self.stage, config=cfg.model_copy(update={"trainer": trainer}))
        self.extra.clear()
        m: dict[str, Any] = dict(run_online(self.ctx, self.loop))
        m.update(self.extra)
        if "time/sync" in m and "time/sync.gather" in m:
            m["time/sync.transfer"] = m["time/sync"] - m["time/sync.gather"]
        m["train_s"] = m.get("time/update", 0.0)
        m.setdefault("rows_trained", 0)
        m.setdefault("real_tokens", 0.0)
        if "perf/train_tokens" in m:  # the engine's count: each group's prompt once
            m["run_tokens"], m["run_tokens_source"] = m["perf/train_tokens"], "`perf/train_tokens`"
        else:
            m["run_tokens"], m["run_tokens_source"] = m["real_tokens"], "real tokens of the rows"
        return m

    def info(self) -> dict[str, Any]:
        return {
            "overrides": self.overrides,
            "dynamic_sampling": self.stage.dynamic_sampling,
            "verl_worker_threads": verl_worker_threads(),
        }

    def close(self) -> None:
        self.ctx.close()


def verl_worker_threads() -> list[dict[str, str]]:
    """OMP_NUM_THREADS and OS thread count of this process's verl workers (children of its raylet)."""

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
        out.append(
            {
                "pid": proc.name,
                "OMP_NUM_THREADS": env.get(b"OMP_NUM_THREADS", b"unset").decode(),
                "os_threads": st.get("Threads", "?"),
            }
        )
    return out


def renice_self(nice: int) -> None:
    """Every thread of this process at niceness ``nice`` (Linux niceness is per thread)."""
    if not nice:
        return
    for tid in os.listdir("/proc/self/task"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, int(tid), nice)


# -- TRL -----------------------------------------------------------------------------------
def exact_match_reward(completions: list, answer: list, **_: Any) -> list[float]:
    """Our ``exact_match`` reward fn on TRL's conversational completions."""
    from trinity_like.explorer.rewards import exact_match

    return [exact_match(response=c[0]["content"], answer=a) for c, a in zip(completions, answer)]


class Trl:
    """``trl.GRPOTrainer`` on the workload; :meth:`steps` trains and returns one record per step."""

    def __init__(self, args: argparse.Namespace, out_dir: str) -> None:
        from datasets import Dataset
        from transformers import AutoModelForCausalLM, TrainerCallback

        from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
        from trinity_like.models.resolve import load_tokenizer, resolve_model_path

        trl = import_trl()
        path = resolve_model_path(args.model)
        tokenizer = load_tokenizer(path)
        tokenizer.padding_side = "left"
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")
        tasks = arithmetic_tasks(ArithmeticParams(), split="train", count=args.prompts * (args.steps + 2))
        data = Dataset.from_list([{"prompt": t.messages(), "answer": t.answer} for t in tasks])
        rows = args.prompts * args.group
        config = trl.GRPOConfig(
            output_dir=out_dir,
            use_cpu=True,
            bf16=args.precision == "bf16",
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
        self.records: list[dict[str, Any]] = []
        phases: dict[str, float] = {}
        records = self.records

        class Record(TrainerCallback):
            """One record per optimizer step: its time, phases, tokens and logged values."""

            def on_step_begin(self, args, state, control, **kw):
                phases.clear()
                self.t0 = time.perf_counter()

            def on_pre_optimizer_step(self, args, state, control, **kw):
                self.t_opt = time.perf_counter()

            def on_optimizer_step(self, args, state, control, **kw):
                phases["time/optim_step"] = time.perf_counter() - self.t_opt

            def on_step_end(self, args, state, control, **kw):
                m = {"time/step": time.perf_counter() - self.t0, **phases, "load1": os.getloadavg()[0]}
                m["time/train"] = m["train_s"] = m["time/step"] - m.get("time/rollout", 0.0)
                m["run_tokens_source"] = "real tokens of the rows"
                records.append(m)

            def on_log(self, args, state, control, logs=None, **kw):
                keep = ("completions/mean_length", "reward", "loss", "grad_norm")
                if logs and records:
                    records[-1].update({f"log/{k}": float(v) for k, v in logs.items() if k in keep})

        self.trainer = trl.GRPOTrainer(
            model=model,
            reward_funcs=exact_match_reward,
            args=config,
            train_dataset=data,
            processing_class=tokenizer,
            callbacks=[Record()],
        )
        self.trainer.model.generate = timed(self.trainer.model.generate, phases, "time/generate")
        generate_and_score = timed(self.trainer._generate_and_score_completions, phases, "time/rollout")

        def counted(inputs: Any) -> dict[str, Any]:
            """The batch every micro-batch is cut from (rows only: each keeps the full width)."""
            out = generate_and_score(inputs)
            prompt, completion = out["prompt_ids"], out["completion_ids"]
            real = float(out["prompt_mask"].sum() + out["completion_mask"].sum())
            phases.update(
                rows_trained=prompt.shape[0],
                real_tokens=real,
                run_tokens=real,
                padded_tokens=float(prompt.shape[0] * (prompt.shape[1] + completion.shape[1])),
            )
            return out

        self.trainer._generate_and_score_completions = counted
        self.params = sum(p.numel() for p in model.parameters())

    def steps(self) -> list[dict[str, Any]]:
        self.trainer.train()
        return self.records

    def info(self) -> dict[str, Any]:
        return {"trl": import_trl().__version__}

    def close(self) -> None:
        pass


def run_contender(args: argparse.Namespace) -> None:
    """Internal mode: build ``args.contender``, one warm-up step + ``args.steps`` timed, write ``args.child_json``."""
    torch.set_num_threads(args.threads)
    name = args.contender
    tmp = tempfile.mkdtemp(prefix=f"grpo_step_{name}_")
    t0 = time.perf_counter()
    contender = Trl(args, os.path.join(tmp, "trl")) if name == "trl" else Ours(name, args, tmp)
    setup_s = time.perf_counter() - t0
    log(f"{name}: built in {setup_s:.1f} s")
    renice_self(args.nice)  # after Ray started: its workers take 15 relative to the raylet's niceness
    records: list[dict[str, Any]] = []
    try:
        if isinstance(contender, Trl):
            records = contender.steps()
        else:
            for _ in range(args.steps + 1):
                records.append(contender.step())
                records[-1]["load1"] = os.getloadavg()[0]
        for i, m in enumerate(records):
            phases = ", ".join(f"{k[5:]} {v:.2f}" for k, v in m.items() if k.startswith("time/") and "." not in k)
            log(f"{name} {'warm-up' if i == 0 else f'step {i}'}: {m['time/step']:.2f} s ({phases})")
        info = contender.info()
    finally:
        contender.close()
        if "ray" in sys.modules:
            import ray

            if ray.is_initialized():
                ray.shutdown()
    out = {"name": name, "setup_s": setup_s, "warmup": records[0], "steps": records[1:], **info}
    Path(args.child_json).write_text(json.dumps(out, indent=1, default=float))


# == the parent: rounds of isolated contenders ==============================================
def run_child(name: str, args: argparse.Namespace, rnd: int, folder: Path) -> dict[str, Any]:
    """Run contender ``name`` in its own process; its JSON plus peak memory and wall time."""
    out = folder / f"round{rnd}_{name}.json"
    argv = [sys.executable, str(Path(__file__).resolve()), "--contender", name, "--child-json", str(out)]
    for key in WORKLOAD:
        argv += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    memory = PeakMemory()
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, env=memory.env, cwd=ROOT)
    memory.start(proc.pid)
    try:
        rc = proc.wait(timeout=args.child_timeout)
    except subprocess.TimeoutExpired:
        log(f"{name}: still running after {args.child_timeout} s; stopping it")
        rc = None
    wall = time.perf_counter() - t0
    peak = memory.stop()
    leftover = stop_group(memory, proc)
    if rc != 0:
        raise RuntimeError(f"contender {name} (round {rnd}) failed: exit status {rc}; its log is above")
    result = json.loads(out.read_text())
    result.update(memory=peak, wall_s=wall, leftover_processes=leftover)
    return result


def model_parameters(model: str) -> int:
    """Parameter count of ``model`` (tied weights once), from its config on the meta device."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from trinity_like.models.resolve import resolve_model_path

    with torch.device("meta"):
        net = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(resolve_model_path(model)))
    return sum(p.numel() for p in net.parameters())


def summarise(rounds: list[dict[str, dict]], params: int, peak_gflops: float) -> dict[str, Any]:
    """Per contender: medians over every timed step, the median of per-round speed ratios vs
    TRL, training-pass rates and peak memory."""
    names = [n for n in CONTENDERS if any(n in r for r in rounds)]
    trl_rounds = [statistics.median(s["time/step"] for s in r["trl"]["steps"]) for r in rounds if "trl" in r]
    out: dict[str, Any] = {}
    for name in names:
        runs = [r[name] for r in rounds if name in r]
        steps = [s for run in runs for s in run["steps"]]
        keys = sorted({k for s in steps for k in s if k.startswith("time/")})
        trained = [s for s in steps if s["train_s"] > 0]
        s_out: dict[str, Any] = {
            "steps": len(steps),
            "rounds": len(runs),
            "median_step_s": statistics.median(s["time/step"] for s in steps),
            "round_median_step_s": [statistics.median(s["time/step"] for s in run["steps"]) for run in runs],
            "phases_median_s": {k: statistics.median(s.get(k, 0.0) for s in steps) for k in keys},
            "mean_rows_trained": statistics.fmean(s["rows_trained"] for s in steps),
            "mean_real_tokens": statistics.fmean(s["real_tokens"] for s in steps),
            "mean_run_tokens": statistics.fmean(s["run_tokens"] for s in steps),
            "run_tokens_source": sorted({s["run_tokens_source"] for s in trained}) or ["no row trained"],
            "median_train_s": statistics.median(s["train_s"] for s in steps),
            "peak_rss_gb": max(run["memory"]["peak_rss_gb"] for run in runs),
            "peak_pss_gb": max(run["memory"]["peak_pss_gb"] for run in runs),
            "median_setup_s": statistics.median(run["setup_s"] for run in runs),
            "mean_reward": statistics.fmean(s.get("reward/mean", s.get("log/reward", float("nan"))) for s in steps),
            "mean_response_tokens": statistics.fmean(
                s.get("response_length/mean", s.get("log/completions/mean_length", float("nan"))) for s in steps
            ),
        }
        if trained:
            s_out["train_tokens_per_s"] = statistics.median(s["real_tokens"] / s["train_s"] for s in trained)
            s_out["peak_fraction"] = statistics.median(
                6 * params * s["run_tokens"] / s["train_s"] / 1e9 / peak_gflops for s in trained
            )
        out[name] = s_out
    if "trl" in out:
        for name, s in out.items():
            if name != "trl":
                per_round = [t / o for t, o in zip(trl_rounds, s["round_median_step_s"])]
                s["speed_vs_trl_per_round"] = per_round
                s["speed_vs_trl_median_of_rounds"] = statistics.median(per_round)
                s["speed_vs_trl_ratio_of_medians"] = out["trl"]["median_step_s"] / s["median_step_s"]
    return out


OUR_PHASES = (
    "rollout",
    "buffer_write",
    "sample",
    "advantage",
    "reference",
    "old_logprob",
    "update",
    "update.forward_backward",
    "update.optim_step",
    "sync",
    "sync.gather",
    "sync.transfer",
)
LABELS = {
    "trl": "TRL `GRPOTrainer` (`use_cpu=True`)",
    "verl": "ours, `verl` engine (FSDP worker, the recipe default: 1 on CPU), every group",
    "local": "ours, `local` engine, every group",
    "verl-dyn": "ours, `verl`, dynamic sampling (recipe default)",
    "local-dyn": "ours, `local`, dynamic sampling (recipe default)",
}


def table(summary: dict, names: tuple[str, ...], rows: int) -> list[str]:
    def x(v: float | None, bold: bool = False) -> str:
        return "-" if v is None else f"**{v:.2f}x**" if bold else f"{v:.2f}x"

    header = (
        "| contender | median step s | speed vs TRL (median of per-round ratios) | (ratio of medians) "
        f"| rows trained / step (of {rows}) | training pass s | equal-work tokens/s | tokens run / step "
        "| % of peak | peak RSS GB | peak PSS GB |"
    )
    lines = [header, "|---" * 11 + "|"]
    for name in (n for n in names if n in summary):
        s = summary[name]
        rate, frac = s.get("train_tokens_per_s"), s.get("peak_fraction")
        lines.append(
            f"| {LABELS[name]} | {s['median_step_s']:.2f} | {x(s.get('speed_vs_trl_median_of_rounds'), bold=True)} "
            f"| {x(s.get('speed_vs_trl_ratio_of_medians'))} | {s['mean_rows_trained']:.1f} | {s['median_train_s']:.2f} "
            f"| {'-' if rate is None else f'{rate:,.0f}'} | {s['mean_run_tokens']:,.0f} "
            f"| {'-' if frac is None else f'{frac:.1%}'} | {s['peak_rss_gb']:.2f} | {s['peak_pss_gb']:.2f} |"
        )
    return lines


def markdown(summary: dict, meta: dict) -> str:
    a = meta["args"]
    rows = a["prompts"] * a["group"]
    done = meta["rounds_done"]
    when = (
        f"Commit {meta['commit']}, {meta['date_utc']} UTC. Machine: {meta['machine']}. Load average (1 min) at "
        f"start {meta['load_start']:.1f}, at end {meta['load_end']:.1f}, median over timed steps "
        f"{meta['load_median']:.1f} -- a shared machine: compare the ratios, not absolute times."
    )
    workload = (
        f"Workload: `{a['model']}` ({meta['params'] / 1e6:.2f} M parameters), {a['prompts']} prompts x "
        f"{a['group']} samples, up to {a['max_new_tokens']} new tokens, T=1.0, top_k/top_p off, lr {a['lr']:g}, "
        f"micro-batch {a['micro_batch']}, one AdamW step per batch, {PRECISION_TEXT[a['precision']]}, no "
        "reference model, no gradient "
        f"checkpointing. Each contender in its own process, one at a time: build, 1 warm-up step, "
        f"{a['steps']} timed steps; {done} round(s) of {a['rounds']} asked, order alternating (round 0: "
        f"{', '.join(meta['orders'][0])}). Torch threads {a['threads']}, niceness {a['nice']} (Ray starts its "
        "workers at 15)."
    )
    dynamic = (
        f"Ours trains only the groups whose rewards differ (DAPO's dynamic sampling); TRL trains all {rows} "
        "rows, zero-advantage ones included. The ratio is of step rates on unequal work, not a like-for-like "
        "speed-up."
    )
    sources = "; ".join(f"{n}: {', '.join(s['run_tokens_source'])}" for n, s in summary.items())
    notes = (
        "Speed vs TRL: TRL's median step time in a round / the contender's in the same round (> 1: faster), "
        "median over rounds. Training pass: ours the `update` phase, TRL its step minus generation and "
        "scoring. Equal-work tokens/s: real tokens (prompt + response) of the rows trained / training-pass "
        f"seconds. % of peak: 6 x {meta['params'] / 1e6:.2f} M parameters x tokens run through the model "
        f"(padding left out) / training-pass seconds / {meta['peak_gflops']:.1f} GFLOP/s (this machine's "
        f"{a['precision']} "
        f"matmul, {meta['peak_size']}^3, best of 5, measured here before and after the rounds). Tokens run -- "
        f"{sources}. Peak memory: summed over the contender's processes (Ray's included), RSS sampled every "
        "0.25 s, PSS every 2 s (reading it walks page tables: more often, the sampler slowed the contenders it "
        "measured); RSS counts shared pages once per process, PSS splits them."
    )
    lines = [
        f"# GRPO step rate: ours vs TRL `GRPOTrainer`, equal work first ({a['precision']})",
        "",
        f"Command: `{meta['command']}`",
        "",
        when,
        "",
        workload,
        "",
        "## Equal work: every group trained on both sides",
        "",
        *table(summary, EQUAL_WORK, rows),
        "",
        "## Dynamic sampling (the recipe as shipped): fewer rows trained",
        "",
        dynamic,
        "",
        *table(summary, ("trl", *DYNAMIC), rows),
        "",
        notes,
        "",
        "## Phases",
        "",
        "Ours (median seconds per step; `a.b` is a part of `a`):",
        "",
        "| contender | step | " + " | ".join(OUR_PHASES) + " |",
        "|---" * (len(OUR_PHASES) + 2) + "|",
    ]
    for name, s in summary.items():
        if name == "trl":
            continue
        p = s["phases_median_s"]
        cells = [f"{p[f'time/{k}']:.2f}" if f"time/{k}" in p else "-" for k in OUR_PHASES]
        lines.append(f"| {name} | {p['time/step']:.2f} | " + " | ".join(cells) + " |")
    if "trl" in summary:
        p = summary["trl"]["phases_median_s"]
        lines += [
            "",
            (
                f"TRL (median seconds per step): step {p['time/step']:.2f}; generation + scoring "
                f"(`_generate_and_score_completions`) {p.get('time/rollout', 0):.2f}, of which `model.generate` "
                f"{p.get('time/generate', 0):.2f}; training pass {p.get('time/train', 0):.2f}, of which "
                f"optimizer step {p.get('time/optim_step', 0):.2f}."
            ),
        ]
    names = list(summary)
    lines += [
        "",
        "## Rounds (median step s of each contender's timed steps; setup s in brackets)",
        "",
        "| round | order | " + " | ".join(names) + " |",
        "|---" * (len(names) + 2) + "|",
    ]
    for r, order in enumerate(meta["orders"][:done]):
        cells = [f"{summary[n]['round_median_step_s'][r]:.2f} ({meta['setup_s'][n][r]:.0f})" for n in names]
        lines.append(f"| {r} | {' > '.join(order)} | " + " | ".join(cells) + " |")
    others = "; ".join(
        f"{n} mean reward {s['mean_reward']:.3f}, mean response {s['mean_response_tokens']:.1f} tokens"
        for n, s in summary.items()
    )
    lines += ["", f"Other: {others}."]
    return "\n".join(lines) + "\n"


def write_results(args: argparse.Namespace, meta: dict, rounds: list[dict[str, dict]]) -> str:
    """Write OUT.md and OUT.json from the rounds so far (called after every round: a cut-off run keeps them)."""
    summary = summarise(rounds, meta["params"], meta["peak_gflops"])
    loads = [s["load1"] for r in rounds for run in r.values() for s in run["steps"]]
    meta = {
        **meta,
        "rounds_done": len(rounds),
        "load_end": os.getloadavg()[0],
        "load_median": statistics.median(loads) if loads else float("nan"),
        "setup_s": {n: [r[n]["setup_s"] for r in rounds] for n in summary},
    }
    text = markdown(summary, meta)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(text)
    args.out.with_suffix(".json").write_text(
        json.dumps({**meta, "summary": summary, "rounds": rounds}, indent=1, default=float)
    )
    return text


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
    names = [n.strip() for n in args.contenders.split(",") if n.strip()]
    unknown = sorted(set(names) - set(CONTENDERS))
    if unknown or not names:
        parser.error(f"--contenders: unknown {unknown or 'empty list'}; known: {', '.join(CONTENDERS)}")
    names = [n for n in CONTENDERS if n in names]

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
        "command": "python benchmarks/grpo_step.py " + " ".join(sys.argv[1:] if argv is None else argv),
        "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "commit": git_commit(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "machine": f"{cpu_name()}, python {platform.python_version()}, {versions}",
        "load_start": load_start,
        "params": model_parameters(args.model),
        "peak_gflops": peak,
        "peak_size": args.peak_size,
        "orders": [names if r % 2 == 0 else names[::-1] for r in range(args.rounds)],
    }
    folder = Path(tempfile.mkdtemp(prefix="grpo_step_"))
    rounds: list[dict[str, dict]] = []
    text = ""
    for rnd, order in enumerate(meta["orders"]):
        results: dict[str, dict] = {}
        for name in order:
            log(f"round {rnd}: {name} ({args.precision})")
            r = results[name] = run_child(name, args, rnd, folder)
            times = ", ".join(f"{s['time/step']:.2f}" for s in r["steps"])
            log(
                f"round {rnd} {name}: steps {times} s; peak RSS {r['memory']['peak_rss_gb']:.2f} GB "
                f"(PSS {r['memory']['peak_pss_gb']:.2f}) over {r['memory']['max_processes']} processes"
            )
        rounds.append(results)
        if rnd == len(meta["orders"]) - 1:  # the peak again, after the rounds: the best of both
            meta["peak_gflops"] = max(peak, matmul_peak_gflops(args.peak_size, dtype=dtype))
        text = write_results(args, meta, rounds)
    return text


if __name__ == "__main__":
    main()
