"""``trinity-like report RUN_DIR --out report.html``: the view's page as one self-contained file.

The same page as ``trinity-like view`` with its script, styles and chart library inlined
and the run's data embedded (``window.REPORT``): every curve, the held-out answers, and
the first :data:`ROWS_PER_STEP` rollouts of up to :data:`MAX_STEPS` steps spread over the
run. It opens from disk, offline, and can be attached to a paper or an issue.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from trinity_like.errors import TrinityError
from trinity_like.view.rollouts import step_page
from trinity_like.view.run import Run
from trinity_like.view.server import STATIC, run_summary

ROWS_PER_STEP = 8  # rollouts kept per step: one group of the main job
MAX_STEPS = 50  # steps with rollouts, evenly spread over the run


def spread(items: list[Any], n: int) -> list[Any]:
    """At most ``n`` of ``items``, evenly spaced, first and last included."""
    if len(items) <= n:
        return items
    return [items[round(j * (len(items) - 1) / (n - 1))] for j in range(n)]


def report_data(runs: list[Run]) -> dict[str, Any]:
    data: dict[str, Any] = {"runs": [], "metrics": [], "versions": [], "rollouts": [], "evals": []}
    for i, run in enumerate(runs):
        versions = run.steps()
        data["runs"].append(run_summary(i, run))
        data["metrics"].append(run.metrics()[0])
        data["versions"].append(versions)
        data["rollouts"].append(
            {v["version"]: step_page(run, v["version"], page_size=ROWS_PER_STEP) for v in spread(versions, MAX_STEPS)}
        )
        data["evals"].append(run.evals())
    return data


def _script(text: str) -> str:
    return "<script>" + text.replace("</", "<\\/") + "</script>"  # no "</script>" inside may end it early


def write_report(run_dirs: list[str], out: str | Path) -> Path:
    """Write the report of ``run_dirs`` to ``out``; a run with nothing to show is a one-line error."""
    runs = [Run.open(d) for d in run_dirs]
    data = report_data(runs)
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
    page = page.replace(
        "<script>", _script("window.REPORT = " + json.dumps(data, separators=(",", ":")) + ";") + "<script>", 1
    )
    out = Path(out)
    out.write_text(page, encoding="utf-8")
    return out
