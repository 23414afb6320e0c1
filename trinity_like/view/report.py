"""``trinity-like report RUN_DIR --out report.html``: the view's page as one self-contained file.

The same page as ``trinity-like view`` with its script, styles and chart library inlined
and the run's data embedded (``window.REPORT``): every curve, the held-out answers, and
the first :data:`ROWS_PER_STEP` rollouts of up to :data:`MAX_STEPS` steps spread over the
run. It opens from disk, offline, and can be attached to a paper or an issue.

The run's data is text a model wrote: it sits in the page as JSON inside a ``<script>``,
with ``<``, ``>``, ``&`` and U+2028/U+2029 written as ``\\uXXXX`` escapes, so no text
(``</script>``, ``<!--<script>``, ``]]>``) can end the script early or change how the
browser parses it, and the page puts every text into the document as a text node.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trinity_like.errors import TrinityError
from trinity_like.monitor.jsonl import finite, warn
from trinity_like.monitor.plot import out_file, write_out
from trinity_like.view.compare import Comparison, comparisons_data, open_folders
from trinity_like.view.rollouts import step_page
from trinity_like.view.run import BufferUnreadable, Run
from trinity_like.view.server import STATIC, run_summary

ROWS_PER_STEP = 8  # rollouts kept per step: one group of the main job
MAX_STEPS = 50  # steps with rollouts, evenly spread over the run


def spread(items: list[Any], n: int) -> list[Any]:
    """At most ``n`` of ``items``, evenly spaced, first and last included."""
    if len(items) <= n:
        return items
    return [items[round(j * (len(items) - 1) / (n - 1))] for j in range(n)]


def report_data(runs: list[Run], comparisons: list[Comparison] | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"runs": [], "metrics": [], "versions": [], "rollouts": [], "evals": [], "compares": []}
    for i, run in enumerate(runs):
        unreadable = ""
        try:
            versions = run.steps()
            rollouts = {
                v["version"]: step_page(run, v["version"], page_size=ROWS_PER_STEP) for v in spread(versions, MAX_STEPS)
            }
        except BufferUnreadable as exc:  # the curves and held-out answers are still worth a report
            warn(f"{exc}; the report has no rollouts of this run")
            unreadable, versions, rollouts = f"{exc}: rollouts cannot be shown", [], {}
        data["metrics"].append(run.metrics()[0])
        data["versions"].append(versions)
        data["rollouts"].append(rollouts)
        data["evals"].append(run.evals())
        summary = run_summary(i, run)  # last: with the warnings of everything read above
        summary["buffer_missing"] = unreadable or summary["buffer_missing"]
        data["runs"].append(summary)
    data["compares"] = comparisons_data(runs, comparisons or [])
    return data


def _script(text: str) -> str:
    """One of the page's own files inlined (no "</script>" inside may end it early)."""
    return "<script>" + text.replace("</", "<\\/") + "</script>"


_IN_SCRIPT = str.maketrans({"<": "\\u003c", ">": "\\u003e", "&": "\\u0026"})  # U+2028/9: ensure_ascii escapes them


def data_script(data: dict[str, Any]) -> str:
    """``<script>window.REPORT = {...};</script>`` of run data: strict JSON (a NaN is null) whose every
    character that HTML or JavaScript would read as markup or a line end is a JSON escape."""
    text = json.dumps(finite(data), allow_nan=False, separators=(",", ":"))  # ASCII: a lone surrogate is an escape too
    return "<script>window.REPORT = " + text.translate(_IN_SCRIPT) + ";</script>"


def write_report(run_dirs: list[str], out: str | Path) -> Path:
    """Write the report of ``run_dirs`` (runs and comparison folders) to ``out``; a run with nothing to
    show is a one-line error."""
    out = out_file(out)
    runs, comparisons = open_folders(run_dirs)
    data = report_data(runs, comparisons)
    for i, run in enumerate(runs):
        if not data["metrics"][i] and not data["versions"][i] and not data["evals"][i]:
            raise TrinityError(f"{run.path}: nothing to report yet (no metrics, no rollouts, no held-out answers)")
    page = (STATIC / "index.html").read_text()
    page = re.sub(
        r'<link rel="stylesheet" href="static/([^"]+)">',
        lambda m: f"<style>{(STATIC / m.group(1)).read_text()}</style>",
        page,
    )
    page = re.sub(r'<script src="static/([^"]+)"></script>', lambda m: _script((STATIC / m.group(1)).read_text()), page)
    # the data first: the page's script reads it when it starts
    page = page.replace("<script>", data_script(data) + "<script>", 1)
    write_out(out, lambda tmp: Path(tmp).write_text(page, encoding="utf-8"))
    return out
