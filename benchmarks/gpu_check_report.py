"""The markdown of ``benchmarks/gpu_check.py``'s report, with the issue's targets checked at its end."""

from __future__ import annotations

from typing import Any

SHAPES = ("smollm2-135m", "qwen2.5-1.5b")
CONTENDERS = {
    "ours": "ours (native engine, defaults)",
    "generate": "`generate`, plain",
    "generate_static_compiled": "`generate`, static cache + `torch.compile`",
    "hf_generate_engine": "`hf_generate` plugin engine (per-seed draws)",
}


def _num(value: Any, fmt: str = "{:,.0f}") -> str:
    return fmt.format(value) if isinstance(value, (int, float)) else "-"


def targets(report: dict) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for each of the issue's targets."""
    sections = report["sections"]
    tiny = report["meta"].get("tiny")
    rollout = sections.get("rollout", {})

    def verdict(value: float | None, floor: float) -> str:
        if tiny:
            return "not measured (tiny mode)"
        if value is None:
            return "not measured"
        return "met" if value >= floor else "NOT met"

    rows = []
    for shape in SHAPES:
        c = rollout.get(shape, {}).get("contenders", {})
        plain = c.get("generate", {}).get("ours_over_this")
        compiled = c.get("generate_static_compiled", {}).get("ours_over_this")
        rows.append((f"{shape}: ours >= 2x plain `generate`", _num(plain, "{:.2f}x"), verdict(plain, 2.0)))
        rows.append(
            (f"{shape}: ours >= static-cache compiled `generate`", _num(compiled, "{:.2f}x"), verdict(compiled, 1.0))
        )
    frac = rollout.get("qwen2.5-1.5b", {}).get("contenders", {}).get("ours", {}).get("fraction_of_bound")
    rows.append(("qwen2.5-1.5b: ours >= 20 % of the decode-bandwidth bound", _num(frac, "{:.1%}"), verdict(frac, 0.2)))
    step = sections.get("train_step", {}).get("ours_over_plain")
    rows.append(("train step >= plain torch at equal work", _num(step, "{:.2f}x"), verdict(step, 1.0)))
    return rows


def markdown(report: dict) -> str:
    meta, sections = report["meta"], report["sections"]
    lines = [
        "# GPU check",
        "",
        f"Command: `{meta['command']}`. Device: {meta['device']}; torch {meta['torch']}, transformers "
        f"{meta['transformers']}, Python {meta['python']}; commit {meta['commit']}; wall {meta.get('wall_s', '-')} s "
        f"(budget {meta['budget_s']:.0f} s).",
    ]
    if meta.get("tiny"):
        lines += [
            "",
            "**Tiny mode**: every workload shrunk to the tiny shape; the figures prove the code runs, nothing else.",
        ]
    failed = [name for name, s in sections.items() if s.get("status") == "failed"]
    lines += ["", f"Sections: {', '.join(sections)}; failed: {', '.join(failed) or 'none'}."]
    for name, s in sections.items():
        if s.get("status") == "failed":
            lines += ["", f"## {name}: FAILED", "", "```", s.get("error") or s.get("stderr", "")[-1500:] or "", "```"]
    tests = sections.get("cuda_tests")
    if tests:
        lines += ["", "## CUDA tests", ""]
        if "passed" in tests:
            lines.append(f"`{tests['command']}`: {tests['passed']} passed, {tests['failed']} failed, "
                         f"{tests['errors']} errors, {tests['skipped']} skipped.")  # fmt: skip
        else:
            lines.append(tests.get("status", "-"))
    bw = sections.get("bandwidth", {})
    if "gb_per_s" in bw:
        lines += ["", f"Device copy bandwidth (read + written): {bw['gb_per_s']:,.0f} GB/s."]
    for shape, r in sections.get("rollout", {}).items():
        if not isinstance(r, dict) or "contenders" not in r:
            continue
        lines += [
            "",
            f"## Rollout, {shape} shape ({r['params_m']} M parameters, random weights, {r['dtype']})",
            "",
            f"{r['prompts']} prompts x {r['group']} samples, {r['prompt_tokens']}-token prompts, {r['new_tokens']} "
            f"sampled tokens each (no early stop), temperature 1. Decode-bandwidth bound: "
            f"{_num(r['decode_bound_tokens_per_s'])} tokens/s.",
            "",
            "| contender | tokens/s | ours / this | % of bound | warm-up s | note |",
            "|---|---|---|---|---|---|",
        ]
        for key, label in CONTENDERS.items():
            c = r["contenders"].get(key, {})
            note = c.get("status", "")
            if key == "ours" and "slots" in c:
                note = f"{c['slots']} slots, {c['cuda_graphs']} CUDA graphs" + (
                    f", graphs off: {c['graph_error']}" if c.get("graph_error") else ""
                )
            if key == "generate_static_compiled" and "compiled" in c:
                note = "compiled" if c["compiled"] else "not compiled (static cache only)"
            lines.append(
                f"| {label} | {_num(c.get('tokens_per_s'))} | {_num(c.get('ours_over_this'), '{:.2f}x')} "
                f"| {_num(c.get('fraction_of_bound'), '{:.1%}')} | {_num(c.get('warmup_s'), '{:.1f}')} | {note} |"
            )
    step = sections.get("train_step", {})
    if "ours" in step:
        lines += [
            "",
            f"## Train step, {step['shape']} shape: {step['rows']} rows x {step['tokens_per_row']} tokens, "
            f"micro-batch {step['micro_batch']}, {step['precision']}",
            "",
            "| variant | step s | tokens/s | first loss |",
            "|---|---|---|---|",
            f"| ours (local engine) | {step['ours']['step_s']:.3f} | {_num(step['ours']['tokens_per_s'])} "
            f"| {step['first_loss']['ours']:.3e} |",
            f"| plain torch | {step['plain_torch']['step_s']:.3f} | {_num(step['plain_torch']['tokens_per_s'])} "
            f"| {step['first_loss']['plain_torch']:.3e} |",
            "",
            f"Ours / plain torch: {step['ours_over_plain']:.2f}x.",
        ]
    run = sections.get("grpo_run", {})
    if "steps" in run:
        lines += [
            "",
            "## GRPO run of the recipe path (local engine, explorer in process, Ray unimportable)",
            "",
            f"`{run['command']}`: {run['steps']} steps in {run['wall_s']:.1f} s (start-up and evaluations included); "
            f"median step {_num(run.get('time/step'), '{:.2f}')} s, rollout {_num(run.get('time/rollout'), '{:.2f}')} s, "
            f"trained tokens/s {_num(run.get('throughput/tokens_per_s'))}.",
        ]
    par = sections.get("parity", {})
    if par:
        lines += ["", "## Parity: one tiny GRPO step on the device against the CPU", ""]
        if "status" in par:
            lines.append(par["status"])
        for dtype in ("float32", "auto"):
            p = par.get(dtype)
            if p:
                lines.append(
                    f"- {dtype}: loss {p['loss_device']:.6f} vs {p['loss_cpu']:.6f} (CPU); largest weight difference "
                    f"{p['max_weight_diff']:.2e} against a largest update of {p['max_update']:.2e}: "
                    f"{'close' if p['close'] else 'NOT close'}."
                )
    lines += ["", "## Targets (issue 35)", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {t} | {m} | {v} |" for t, m, v in targets(report)]
    return "\n".join(lines) + "\n"
