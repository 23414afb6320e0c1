"""The markdown of ``benchmarks/gpu_check.py``'s report, with the issue's targets checked at its end.

It reads whatever the report holds so far -- a section cut off, an entry failed, timed out or
skipped -- and never raises on a missing figure: it is rewritten after every entry."""

from __future__ import annotations

from typing import Any

from harness import md_table

SHAPES = ("smollm2-135m", "qwen2.5-1.5b")
CONTENDERS = {
    "ours": "ours (native engine, defaults)",
    "generate": "`generate`, plain",
    "generate_static_compiled": "`generate`, static cache + `torch.compile` (own process)",
    "hf_generate_engine": "`hf_generate` plugin engine (per-seed draws)",
}
BAD = ("failed", "timeout")


def _num(value: Any, fmt: str = "{:,.0f}") -> str:
    return fmt.format(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else "-"


def entries(report: dict, section: str) -> dict[str, dict]:
    return report["sections"].get(section, {}).get("entries", {})


def rate(report: dict, shape: str, contender: str) -> float | None:
    return entries(report, "rollout").get(f"{shape}/{contender}", {}).get("tokens_per_s")


def ours_over(report: dict, shape: str, contender: str) -> float | None:
    ours, theirs = rate(report, shape, "ours"), rate(report, shape, contender)
    return ours / theirs if ours and theirs else None


def step_ops_total(report: dict, shape: str, entry: str = "step_ops") -> str:
    e = entries(report, "where_time").get(f"{shape}/{entry}")
    if e is None:
        return "not measured"
    if "total" not in e:
        return f"{e.get('status', '-')} ({e.get('error', '')})"
    return f"{_num(e['total'])} ({_num(e.get('kernels'))} kernels)"


def targets(report: dict) -> list[tuple[str, str, str]]:
    """(target, measured, verdict) for each of the issue's targets."""
    tiny = report["meta"].get("tiny")

    def verdict(value: float | None, floor: float) -> str:
        if tiny:
            return "not measured (tiny mode)"
        if value is None:
            return "not measured"
        return "met" if value >= floor else "NOT met"

    rows = []
    for shape in SHAPES:
        plain, compiled = ours_over(report, shape, "generate"), ours_over(report, shape, "generate_static_compiled")
        rows.append((f"{shape}: ours >= 2x plain `generate`", _num(plain, "{:.2f}x"), verdict(plain, 2.0)))
        rows.append(
            (f"{shape}: ours >= static-cache compiled `generate`", _num(compiled, "{:.2f}x"), verdict(compiled, 1.0))
        )
    frac = entries(report, "rollout").get("qwen2.5-1.5b/ours", {}).get("fraction_of_bound")
    rows.append(("qwen2.5-1.5b: ours >= 20 % of the decode-bandwidth bound", _num(frac, "{:.1%}"), verdict(frac, 0.2)))
    step = entries(report, "train_step").get("smollm2-135m", {}).get("ours_over_plain")
    rows.append(("train step >= plain torch at equal work", _num(step, "{:.2f}x"), verdict(step, 1.0)))
    return rows


def header(report: dict) -> list[str]:
    meta, sections = report["meta"], report["sections"]
    lines = [
        "# GPU check",
        "",
        f"Command: `{meta['command']}`. Device: {meta['device']}; torch {meta.get('torch', '-')}, transformers "
        f"{meta.get('transformers', '-')}, Python {meta['python']}; commit {meta['commit']}; wall "
        f"{meta.get('wall_s', '-')} s of a {meta['budget_s']:.0f} s budget.",
    ]
    if meta.get("tiny"):
        lines += [
            "",
            "**Tiny mode**: every workload shrunk to the tiny shape; the figures prove the code runs, nothing else.",
        ]
    rows = []
    for name, plan in meta["plan_s"].items():
        s = sections.get(name)
        status = "not started" if s is None else s.get("status") or ("running" if "seconds" not in s else "ok")
        s = s or {}
        rows.append([name, f"{plan:.0f}", _num(s.get("limit_s")), _num(s.get("seconds"), "{:.1f}"), status])
    lines += ["", *md_table(["section", "plan s", "limit s", "took s", "status"], rows)]
    for name, s in sections.items():
        bad = {n: e for n, e in s.get("entries", {}).items() if e.get("status") in BAD}
        if s.get("error") or bad:
            lines += ["", f"## {name}: FAILED", ""]
            if s.get("error"):
                lines += ["```", s["error"][-1500:], "```"]
            lines += [f"- `{n}` {e['status']}: {e.get('error', '')[-600:]}" for n, e in bad.items()]
    return lines


def where_time(report: dict) -> list[str]:
    got = entries(report, "where_time")
    shapes = sorted({name.split("/")[0] for name in got if not name.endswith("/step_ops_cpu")})
    lines = []
    for shape in shapes:
        att, graph = got.get(f"{shape}/attention", {}), got.get(f"{shape}/graph", {})
        prof = got.get(f"{shape}/profile", {})
        lines += ["", f"## Where a decode step's time goes, {shape} shape", ""]
        if "rows" in att:
            lines.append(f"{att['rows']} rows, keys {att['key_length']} long, {att['layers']} layers, {att['dtype']}.")
        for phase in ("prefill", "decode"):
            p = att.get(phase)
            if p:
                backends = ", ".join(f"{b}: {v}" for b, v in p.get("backends", {}).items()) or "-"
                lines.append(f"- {phase} attention: `{p['call']}`; backends: {backends}")
        if "captured" in graph:
            lines.append(
                f"- CUDA graph: {'captured' if graph['captured'] else 'NOT captured: ' + str(graph['capture_error'])}; "
                f"host syncs in a warm step: {graph['host_syncs_in_warm_step']}; eager step "
                f"{_num(graph['eager_step_ms'], '{:.2f}')} ms, replay {_num(graph.get('replay_ms'), '{:.2f}')} ms"
            )
        elif graph:
            lines.append(f"- CUDA graph: {graph.get('status', graph.get('error', '-'))}")
        if "aten_ops_top_level" in prof:
            lines.append(
                f"- one warm eager step: {prof['aten_ops_top_level']} aten operations at the top level "
                f"({prof['aten_ops_all']} in all), {_num(prof.get('kernels'))} kernels, GPU busy "
                f"{_num(prof.get('gpu_busy_ms'), '{:.2f}')} ms of {prof['profiled_step_ms']:.2f} ms profiled; "
                f"step {prof['step_ms']:.2f} ms unprofiled"
            )
        lines.append(f"- operations per decode step (`count_decode_step_ops`): {step_ops_total(report, shape)}")
    cpu = step_ops_total(report, "smollm2-135m", "step_ops_cpu")
    lines.append(f"- operations per decode step at smollm2-135m's shape on the CPU, float32, 64 rows x 256 keys: {cpu}")
    return lines


def rollout(report: dict) -> list[str]:
    got = entries(report, "rollout")
    lines = []
    for shape in sorted({name.split("/")[0] for name in got}):
        r = got.get(f"{shape}/workload", {})
        lines += [
            "",
            f"## Rollout, {shape} shape ({r.get('params_m', '-')} M parameters, random weights, {r.get('dtype', '-')})",
            "",
        ]
        if "rows" in r:
            lines += [
                f"{r['prompts']} prompts x {r['group']} samples, {r['prompt_tokens']}-token prompts, {r['new_tokens']} "
                f"sampled tokens each (no early stop), temperature 1. Decode-bandwidth bound: "
                f"{_num(r['decode_bound_tokens_per_s'])} tokens/s ({_num(r['bandwidth_gb_per_s'])} GB/s, "
                f"{r['bandwidth_from']}). Operations per decode step: {step_ops_total(report, shape)}.",
                "",
            ]
        rows = []
        for key, label in CONTENDERS.items():
            c = got.get(f"{shape}/{key}", {})
            note = c.get("status", "not run") if "tokens_per_s" not in c else ""
            if key == "ours" and "slots" in c:
                note = f"{c['slots']} slots, {c['cuda_graphs']} CUDA graphs" + (
                    f", graphs off: {c['graph_error']}" if c.get("graph_error") else ""
                )
            if key == "generate_static_compiled" and "compiled" in c:
                note = "compiled" if c["compiled"] else "not compiled (static cache only)"
            rows.append([label, _num(c.get("tokens_per_s")), _num(ours_over(report, shape, key), "{:.2f}x")])
            rows[-1] += [_num(c.get("fraction_of_bound"), "{:.1%}"), _num(c.get("warmup_s"), "{:.1f}"), note]
        lines += md_table(["contender", "tokens/s", "ours / this", "% of bound", "warm-up s", "note"], rows)
    return lines


def the_rest(report: dict) -> list[str]:
    lines = []
    tests = entries(report, "cuda_tests")
    if tests:
        lines += ["", "## CUDA tests", ""]
        for name, t in tests.items():
            counts = (
                f"{t['passed']} passed, {t['failed']} failed, {t['errors']} errors, {t['skipped']} skipped"
                if "passed" in t
                else f"{t.get('status', '-')}: {t.get('error', '')}"
            )
            lines.append(f"- `{t.get('command', name)}`: {counts}")
    bw = entries(report, "bandwidth").get("copy", {})
    if "gb_per_s" in bw:
        lines += ["", f"Device copy bandwidth (read + written): {bw['gb_per_s']:,.0f} GB/s."]
    for step in entries(report, "train_step").values():
        if "ours" not in step:
            continue
        rows = [[label, f"{step[k]['step_s']:.3f}", _num(step[k]["tokens_per_s"]), f"{step['first_loss'][k]:.3e}"]
                for k, label in (("ours", "ours (local engine)"), ("plain_torch", "plain torch"))]  # fmt: skip
        lines += [
            "",
            f"## Train step, {step['shape']} shape: {step['rows']} rows x {step['tokens_per_row']} tokens, "
            f"micro-batch {step['micro_batch']}, {step['precision']}",
            "",
            *md_table(["variant", "step s", "tokens/s", "first loss"], rows),
            "",
            f"Ours / plain torch: {step['ours_over_plain']:.2f}x.",
        ]
    for run in entries(report, "grpo_run").values():
        if "steps" in run:
            lines += [
                "",
                "## GRPO run of the recipe path (local engine, explorer in process, Ray unimportable)",
                "",
                f"`{run['command']}`: {run['steps']} steps in {run['wall_s']:.1f} s (start-up and evaluations "
                f"included); median step {_num(run.get('time/step'), '{:.2f}')} s, rollout "
                f"{_num(run.get('time/rollout'), '{:.2f}')} s, trained tokens/s {_num(run.get('throughput/tokens_per_s'))}.",
            ]
    par = entries(report, "parity")
    ref = par.get("cpu_reference", {})
    if ref:
        lines += ["", "## Parity: one tiny GRPO step on the device against a float64 reference", ""]
        if "k" in ref:
            lines.append(
                f"Reference: {ref['reference']}. Allowed: {ref['k']:g} x the error the CPU measured for the same "
                "precision in this run (relative loss, grad-norm and update errors)."
            )
            for kind in ("float32", "bfloat16"):
                e = ref[f"cpu_{kind}_errors"]
                lines.append(
                    f"- CPU {kind} against float64: update {e['update']:.2e}, grad norm {e['grad_norm']:.2e}, loss {e['loss']:.2e}"
                )
        for p in par.values():
            if "errors" in p:
                e = p["errors"]
                lines.append(
                    f"- {p['device']} {p['precision']}: update {e['update']:.2e} (allowed {p['allowed']['update']:.2e}), "
                    f"grad norm {e['grad_norm']:.2e}, loss {e['loss']:.2e}: {'close' if p['close'] else 'NOT close'}"
                    + (f" ({p['note']})" if p.get("note") else "")
                )
    return lines


def markdown(report: dict) -> str:
    lines = header(report) + where_time(report) + rollout(report) + the_rest(report)
    lines += ["", "## Targets (issue 35)", "", *md_table(["target", "measured", "verdict"], targets(report))]
    return "\n".join(lines) + "\n"
