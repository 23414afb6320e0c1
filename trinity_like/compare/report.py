"""A comparison's report: ``compare.md`` for people, ``compare.json`` for tools, from the runs' results.

The report opens with what the compared entries differ in (their resolved plans), then per
entry the mean and 95 % interval over seeds of held-out accuracy, the learning signal and
the compute spent; then each entry against the first (the baseline), paired by seed, with a
one-line verdict; then every run with its status (a failed run with its log's last line),
the curves, and the exact command of every run.
"""

from __future__ import annotations

import json
import platform
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from trinity_like.compare.entries import Entry, Run
from trinity_like.compare.results import Keys, RunResult
from trinity_like.compare.scheduler import Outcome, Sizing
from trinity_like.compare.stats import (
    CONFIDENCE,
    Summary,
    fmt_number,
    fmt_p,
    holm,
    paired,
    summarize,
    verdict,
    verdict_line,
)

OK = ("done", "reused")


def _ci(s: Summary | None, scale: float = 1.0, digits: int = 1, unit: str = "") -> str:
    if s is None:
        return "-"
    if s.low is None:
        return f"{fmt_number(s.mean, scale, digits)}{unit} (1 seed)"
    half = (s.high - s.mean) * scale
    return f"{fmt_number(s.mean, scale, digits)}{unit} +- {half:.{digits}f}"


def _duration(s: Summary | None) -> str:
    """Seconds below two minutes, else minutes."""
    if s is None or s.mean < 120:
        return _ci(s, 1, 1, " s")
    return _ci(s, 1 / 60, 1, " min")


def _values(results: dict[int, RunResult], attr: str) -> dict[int, float]:
    return {seed: getattr(r, attr) for seed, r in results.items() if getattr(r, attr) is not None}


def _paired_block(
    base: str,
    other: str,
    a: dict[int, float],
    b: dict[int, float],
    what: str,
    scale: float,
    unit: str,
    digits: int,
    higher: bool,
) -> dict[str, Any] | None:
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    d = paired([a[s] for s in seeds], [b[s] for s in seeds])
    line = verdict_line(
        d, what=what, name_a=base, name_b=other, scale=scale, unit=unit, digits=digits, higher_is_better=higher
    )
    return {
        "metric": what,
        "seeds": seeds,
        **d.as_dict(),
        "verdict": verdict(d, higher_is_better=higher, name_a=base, name_b=other),
        "line": line,
    }


REWARD_KEYS = ("explorer.reward_fn", "explorer.reward_args")


def rewarded_differently(diff: list[tuple[str, dict[str, Any]]], a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` train on different rewards (a learned reward model against exact match):
    their train rewards are then on different scales, and not compared."""
    return any(key.endswith(REWARD_KEYS) and values.get(a) != values.get(b) for key, values in diff)


def correct_for_family(comparisons: dict[str, list[dict[str, Any]]]) -> None:
    """Adjust the p-values of one metric across every challenger (Holm) and let a verdict stand
    only where the adjusted p is below 5 %; each block keeps its own p and says both."""
    family: dict[str, list[dict[str, Any]]] = {}
    for blocks in comparisons.values():
        for block in blocks:
            if block.get("p") is not None:
                family.setdefault(block["metric"], []).append(block)
    for blocks in family.values():
        if len(blocks) < 2:
            continue
        for block, adjusted in zip(blocks, holm([b["p"] for b in blocks])):
            block["p_holm"], block["family"] = adjusted, len(blocks)
            head, says = block["line"].rsplit(": ", 1)  # verdict_line's "<what> ... seeds: <verdict>"
            if adjusted >= 1 - CONFIDENCE and block["verdict"] != "no difference shown":
                block["verdict_alone"] = block["verdict"]
                block["verdict"] = f"no difference shown after correcting for {len(blocks)} comparisons"
                says = f"{block['verdict']} (alone: {block['verdict_alone']})"
            block["line"] = f"{head}, Holm {fmt_p(adjusted)} over {len(blocks)} comparisons: {says}"


def build_report(
    entries: list[Entry],
    runs: list[Run],
    outcomes: dict[str, Outcome],
    results: dict[str, RunResult],
    diff: list[tuple[str, dict[str, Any]]],
    held_out_keys: list[str],
    sizing: Sizing | None,
    command: str,
    keys: Keys | None = None,
) -> dict[str, Any]:
    """The report as one JSON-able dict (``compare.json``); :func:`markdown` renders it.

    ``keys``: the metric keys the results were read with, kept so that ``trinity-like view`` draws the same curves.
    """
    labels = [e.label for e in entries]
    base = labels[0]
    per: dict[str, dict[int, RunResult]] = {label: {} for label in labels}
    for run in runs:
        if outcomes[run.key].status in OK:
            per[run.label][run.seed] = results[run.key]
    summary: dict[str, Any] = {}
    for label in labels:
        res = per[label]
        row: dict[str, Any] = {"seeds_done": sorted(res)}
        for attr in ("accuracy_start", "accuracy", "signal_start", "signal_end", "rows", "tokens", "step_s", "wall_s"):
            vals = list(_values(res, attr).values())
            row[attr] = summarize(vals).as_dict() if vals else None
        signals = {r.signal for r in res.values() if r.signal}
        row["signal"] = signals.pop() if len(signals) == 1 else (" / ".join(sorted(signals)) or None)
        row["higher_is_better"] = next((r.signal_higher_is_better for r in res.values() if r.signal), True)
        kinds = {r.accuracy_kind for r in res.values() if r.accuracy is not None}
        row["accuracy_kind"] = kinds.pop() if len(kinds) == 1 else "held-out accuracy"
        row["steps"] = sorted({r.steps for r in res.values()})
        extra_keys = sorted({k for r in res.values() for k in r.extra})
        row["extra"] = {k: summarize([r.extra[k] for r in res.values() if k in r.extra]).as_dict() for k in extra_keys}
        summary[label] = row
    comparisons: dict[str, list[dict[str, Any]]] = {}
    for label in labels[1:]:
        blocks = []
        a, b = per[base], per[label]
        block = _paired_block(
            base,
            label,
            _values(a, "accuracy"),
            _values(b, "accuracy"),
            f"{summary[label]['accuracy_kind']} at the end",
            100.0,
            " points",
            1,
            True,
        )
        blocks.append(block)
        same_signal = summary[base]["signal"] and summary[base]["signal"] == summary[label]["signal"]
        what = f"{summary[label]['signal']}, at the end"
        if same_signal and rewarded_differently(diff, base, label):
            says = "not compared: the two are rewarded by different functions (explorer.reward_fn / reward_args)"
            blocks.append(
                {"metric": what, "seeds": [], "p": None, "verdict": "not compared", "line": f"{what}: {says}"}
            )
        elif same_signal:
            higher = summary[label]["higher_is_better"]
            blocks.append(
                _paired_block(base, label, _values(a, "signal_end"), _values(b, "signal_end"), what, 1.0, "", 3, higher)
            )
        for key in summary[label]["extra"]:
            va = {s: r.extra[key] for s, r in a.items() if key in r.extra}
            vb = {s: r.extra[key] for s, r in b.items() if key in r.extra}
            blocks.append(_paired_block(base, label, va, vb, f"{key} at the end", 1.0, "", 3, True))
        comparisons[label] = [x for x in blocks if x is not None]
    correct_for_family(comparisons)
    run_rows = []
    for run in runs:
        o = outcomes[run.key]
        r = results.get(run.key)
        run_rows.append(
            {
                "key": run.key,
                "label": run.label,
                "seed": run.seed,
                "status": o.status,
                "message": o.message,
                "attempts": o.attempts,
                "command": run.command if run.argv else None,
                # where each stage wrote metrics.jsonl, relative to <out>/runs/<label>/seed_<seed> (trinity-like view)
                "run_dirs": [_relative(d, run.folder) for d in run.run_dirs],
                "result": {k: v for k, v in asdict(r).items()} if r is not None and o.status in OK else None,
            }
        )
    return {
        "command": command,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "machine": f"{platform.machine()}, {sizing.cores if sizing else '?'} cores",
        "sizing": sizing.describe() if sizing else None,
        "baseline": base,
        "entries": [
            {"label": e.label, "recipe": str(e.recipe) if e.recipe else None, "script": e.script} for e in entries
        ],
        "seeds": sorted({r.seed for r in runs}),
        "keys": asdict(keys or Keys()),
        "plan_diff": [{"key": k, "values": v} for k, v in diff],
        "held_out_differs": held_out_keys,
        "summary": summary,
        "comparisons": comparisons,
        "runs": run_rows,
        "all_finished": all(outcomes[r.key].status in OK for r in runs),
    }


def _relative(path: Path, folder: Path) -> str:
    """``path`` relative to ``folder`` when inside it (the comparison's folder may move), else as given."""
    try:
        return path.relative_to(folder).as_posix() or "."
    except ValueError:
        return str(path)


def _cell(v: Any) -> str:
    text = json.dumps(v) if not isinstance(v, str) else v
    return text.replace("|", "\\|")


def markdown(report: dict[str, Any], png: str | None) -> str:
    labels = [e["label"] for e in report["entries"]]
    seeds = report["seeds"]
    lines = [f"# Comparison: {' vs '.join(labels)} (baseline: {report['baseline']})", ""]
    lines += [f"Command: `{report['command']}`", ""]
    lines += [
        f"Seeds: {', '.join(map(str, seeds))}. Seed s is the same in every entry (training tasks, their order, "
        "sampling and init), so runs pair by seed; held-out sets are as the recipes write them.",
        "",
        f"Machine: {report['machine']}; {report['sizing'] or ''}; {report['date']}.",
        "",
        "## What the entries differ in",
        "",
    ]
    if report["plan_diff"]:
        lines += [
            "Every resolved key whose value differs (recipe values after presets, and what the plan derives):",
            "",
        ]
        lines += ["| key | " + " | ".join(labels) + " |", "| --- |" + " --- |" * len(labels)]
        for row in report["plan_diff"]:
            lines.append(f"| `{row['key']}` | " + " | ".join(_cell(row["values"].get(x, "-")) for x in labels) + " |")
    else:
        lines.append("Nothing: the resolved plans are the same (scripts are compared by their commands, below).")
    if report["held_out_differs"]:
        lines += ["", f"**Warning**: the held-out sets differ ({', '.join(report['held_out_differs'])}): "
                  "held-out accuracies are not comparable."]  # fmt: skip
    lines += ["", "## Results: mean +- 95 % interval (Student t) over seeds", ""]
    lines += [
        "| entry | seeds done | held-out accuracy start -> end | signal | start -> end | steps | rows trained "
        "| tokens trained | step time | wall per run |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label in labels:
        s = report["summary"][label]
        acc = f"{_ci(_s(s['accuracy_start']), 100, 1, ' %')} -> {_ci(_s(s['accuracy']), 100, 1, ' %')}"
        sig = f"{_ci(_s(s['signal_start']), 1, 3)} -> {_ci(_s(s['signal_end']), 1, 3)}"
        steps = ", ".join(map(str, s["steps"])) or "-"
        lines.append(
            f"| {label} | {len(s['seeds_done'])}/{len(seeds)} | {acc} | {s['signal'] or '-'} | {sig} | {steps} "
            f"| {_ci(_s(s['rows']), 1, 0)} | {_ci(_s(s['tokens']), 1, 0)} | {_duration(_s(s['step_s']))} "
            f"| {_duration(_s(s['wall_s']))} |"
        )
    lines += ["", f"## Against {report['baseline']}, paired by seed", ""]
    for label in labels[1:]:
        for block in report["comparisons"].get(label) or [{"line": f"{label}: no seed finished on both sides"}]:
            lines.append(f"- {block['line']}")
    lines += ["", "## Runs", "", "| run | status | held-out accuracy | signal end | attempts | note |",
              "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for r in report["runs"]:
        res = r["result"] or {}
        acc = fmt_number(res.get("accuracy"), 100, 1) + (" %" if res.get("accuracy") is not None else "")
        lines.append(
            f"| {r['key']} | {r['status']} | {acc} | {fmt_number(res.get('signal_end'), 1, 3)} | {r['attempts']} "
            f"| {_cell(r['message'])} |"
        )
    if png:
        lines += ["", "## Curves", "", f"![held-out accuracy and train reward per step]({png})"]
    lines += ["", "## Each run's command", ""]
    lines += [f"- {r['key']}: `{r['command']}`" for r in report["runs"] if r["command"]]
    return "\n".join(lines) + "\n"


def _s(d: dict | None) -> Summary | None:
    return Summary(**d) if d else None


def write_report(report: dict[str, Any], stem: Path, png: Path | None) -> tuple[Path, Path]:
    """``stem.md`` and ``stem.json`` (the markdown links the PNG by its name: keep them side by side)."""
    stem.parent.mkdir(parents=True, exist_ok=True)
    md, js = stem.parent / f"{stem.name}.md", stem.parent / f"{stem.name}.json"
    js.write_text(json.dumps(report, indent=1, default=str))
    md.write_text(markdown(report, png.name if png else None))
    return md, js
