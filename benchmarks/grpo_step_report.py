"""The layout of benchmarks/grpo_step.py's results: per-contender summaries over the rounds
(medians, per-round speed ratios vs TRL, training-pass rates, peak memory), the markdown
tables, and OUT.md / OUT.json written after every round."""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from harness import md_table
from harness import write_results as write_files

EQUAL_WORK = ("trl", "verl", "local")  # every group trained on both sides
DYNAMIC = ("verl-dyn", "local-dyn")  # the recipe as shipped: groups without reward signal skipped
CONTENDERS = EQUAL_WORK + DYNAMIC
PRECISION_TEXT = {
    "fp32": "fp32 on both sides",
    "bf16": "bf16 compute over fp32 weights on both sides (ours: the mixed path and a bf16 rollout; TRL: bf16=True)",
}


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

    header = ["contender", "median step s", "speed vs TRL (median of per-round ratios)", "(ratio of medians)"]
    header += [f"rows trained / step (of {rows})", "training pass s", "equal-work tokens/s", "tokens run / step"]
    out = []
    for s, label in ((summary[n], LABELS[n]) for n in names if n in summary):
        rate, frac = s.get("train_tokens_per_s"), s.get("peak_fraction")
        speed = [x(s.get("speed_vs_trl_median_of_rounds"), bold=True), x(s.get("speed_vs_trl_ratio_of_medians"))]
        work = [f"{s['mean_rows_trained']:.1f}", f"{s['median_train_s']:.2f}", "-" if rate is None else f"{rate:,.0f}"]
        use = [f"{s['mean_run_tokens']:,.0f}", "-" if frac is None else f"{frac:.1%}", f"{s['peak_rss_gb']:.2f}"]
        out.append([label, f"{s['median_step_s']:.2f}", *speed, *work, *use, f"{s['peak_pss_gb']:.2f}"])
    return md_table([*header, "% of peak", "peak RSS GB", "peak PSS GB"], out)


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
    ]
    phases = {n: s["phases_median_s"] for n, s in summary.items() if n != "trl"}
    cells = [
        [n, *(f"{p[f'time/{k}']:.2f}" if f"time/{k}" in p else "-" for k in ("step", *OUR_PHASES))]
        for n, p in phases.items()
    ]
    lines += md_table(["contender", "step", *OUR_PHASES], cells)
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
    ]
    per_round = [[r, " > ".join(order), *(f"{summary[n]['round_median_step_s'][r]:.2f} ({meta['setup_s'][n][r]:.0f})" for n in names)]
                 for r, order in enumerate(meta["orders"][:done])]  # fmt: skip
    lines += md_table(["round", "order", *names], per_round)
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
    return write_files(args.out, {**meta, "summary": summary, "rounds": rounds}, markdown(summary, meta))
