"""A ``trinity-like compare`` folder in the view: each entry's mean curve over seeds with its 95 % band.

``trinity-like view COMPARE_DIR`` (alone or among run folders) opens the folder's
``compare.json`` and the run folders of its finished runs (``runs/<label>/seed_<s>``, each
stage where ``run_dirs`` says). Every run joins the page's runs (its rollouts and held-out
answers, named ``<label>/seed_<s>``); the comparison adds one chart per metric -- held-out
accuracy and train reward, under the keys the comparison read (``compare.json``'s ``keys``)
-- with one line per entry, the mean over its seeds at each step, and a band, the 95 %
Student-t interval of that mean (:func:`trinity_like.compare.stats.summarize`, as the
report's ``compare.png``), beside the verdict lines of ``compare.json``.

The curves are read as the comparison reads them (:func:`trinity_like.compare.results.step_rows`:
a step redone after a resume counts once, as its latest attempt logged it), from the
run's ``metrics.jsonl`` through the view's own reader (a damaged line is skipped and named).
``compare.json`` is a file anyone may have edited: what it holds is checked before use (a
label must name a folder inside the comparison, a seed is a whole number, a path that leads
out of the folder is not followed), and anything wrong is one warning, never an error page::

    runs, comparisons = open_folders(["runs/compare_add2", "runs/grpo_arith"])
    comparisons[0].data(ids)   # entries, verdict lines, and per metric each entry's steps, mean, low, high
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from trinity_like.compare.results import Keys, series, step_rows
from trinity_like.compare.stats import CONFIDENCE, summarize
from trinity_like.errors import TrinityError
from trinity_like.monitor.jsonl import warn
from trinity_like.view.run import MAX_WARNINGS, METRICS_FILE, Run

COMPARE_FILE = "compare.json"
MAX_COMPARE_BYTES = 16 * 2**20  # a comparison of 10 entries x 10 seeds writes well under 1 MiB
LABEL = re.compile(r"^[A-Za-z0-9_.+-]+$")  # as trinity-like compare allows (it names a folder)
# the statuses of the runs a comparison reports (trinity_like.compare.report.OK, which imports the recipe
# machinery: a second of start-up the view does without; a test holds the two equal)
FINISHED = ("done", "reused")
PANELS = (("accuracy", "held-out accuracy"), ("reward", "train reward"))  # Keys fields, titles


@dataclass
class Member:
    """One finished run of a comparison: its entry, its seed, and its stages' folders (the last one with
    metrics gives the curves, as the comparison's own read does)."""

    label: str
    seed: int
    stages: list[Run]


@dataclass
class Comparison:
    """An opened comparison folder: what of ``compare.json`` survived its checks, and its runs."""

    path: Path
    name: str
    labels: list[str] = field(default_factory=list)
    baseline: str | None = None
    seeds: list[int] = field(default_factory=list)
    lines: dict[str, list[str]] = field(default_factory=dict)  # label -> its verdict lines against the baseline
    keys: Keys = field(default_factory=Keys)
    members: list[Member] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        """One warning about this comparison: on stderr once, and kept for the page."""
        if message not in self.warnings and len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(message)
            warn(message)

    @property
    def runs(self) -> list[Run]:
        return [run for m in self.members for run in m.stages]

    def curves(self, panel: str) -> list[dict[str, Any]]:
        """Per entry: ``steps``, ``mean``, ``low``, ``high`` (None where one seed logged the step) and ``n``
        (seeds at that step) of metric ``panel`` ("accuracy" | "reward"), over its runs' curves."""
        key = getattr(self.keys, panel)
        out = []
        for label in self.labels:
            by_step: dict[int, list[float]] = {}
            runs = 0
            for member in self.members:
                if member.label != label:
                    continue
                logged = [run for run in member.stages if (run.path / METRICS_FILE).is_file()]
                curve = series(step_rows(logged[-1].main_metrics()), key) if logged else []
                runs += bool(curve)
                for step, value in curve:
                    by_step.setdefault(step, []).append(value)
            stats = [(step, summarize(by_step[step])) for step in sorted(by_step)]
            out.append(
                {
                    "label": label,
                    "runs": runs,
                    "steps": [step for step, _ in stats],
                    "mean": [s.mean for _, s in stats],
                    "low": [s.low for _, s in stats],
                    "high": [s.high for _, s in stats],
                    "n": [s.n for _, s in stats],
                }
            )
        return out

    def data(self, ids: dict[int, int]) -> dict[str, Any]:
        """What the page draws; ``ids``: ``id(run)`` -> the run's index among the page's runs."""
        return {
            "name": self.name,
            "path": str(self.path),
            "baseline": self.baseline,
            "seeds": self.seeds,
            "confidence": CONFIDENCE,
            "entries": [
                {
                    "label": label,
                    "runs": [ids[id(r)] for m in self.members if m.label == label for r in m.stages],
                    "lines": self.lines.get(label, []),
                }
                for label in self.labels
            ],
            "panels": [
                {"title": title, "key": getattr(self.keys, panel), "entries": self.curves(panel)}
                for panel, title in PANELS
            ],
            "warnings": self.warnings,
        }


def is_compare_folder(path: str | Path) -> bool:
    return (Path(path) / COMPARE_FILE).is_file()


def _load(path: Path, c: Comparison) -> dict[str, Any]:
    """``compare.json`` as a dict, or {} after one warning saying why not."""
    where = path / COMPARE_FILE
    try:
        with open(where, "rb") as fh:
            text = fh.read(MAX_COMPARE_BYTES + 1)
        if len(text) > MAX_COMPARE_BYTES:
            c.warn(f"{where}: larger than {MAX_COMPARE_BYTES // 2**20} MiB: not a comparison's report; not shown")
            return {}
        got = json.loads(text)
    except (ValueError, RecursionError) as exc:
        c.warn(f"{where}: not valid JSON ({' '.join(str(exc).split())[:200]}); the comparison is not shown")
        return {}
    except OSError as exc:
        c.warn(f"{where}: cannot be read ({exc.strerror}); the comparison is not shown")
        return {}
    if not isinstance(got, dict):
        c.warn(f"{where}: a JSON {type(got).__name__}, not a comparison's report (an object); not shown")
        return {}
    return got


def _list(report: dict[str, Any], key: str, c: Comparison) -> list[Any]:
    value = report.get(key, [])
    if isinstance(value, list):
        return value
    c.warn(f"{c.path / COMPARE_FILE}: {key} must be a list (got a JSON {type(value).__name__}); ignored")
    return []


def _keys(report: dict[str, Any], c: Comparison) -> Keys:
    given = report.get("keys")
    if given is None:  # written before compare.json kept its keys: the defaults it then always read
        return Keys()
    names = ("accuracy", "reward")
    if not isinstance(given, dict) or not all(isinstance(given.get(k), str) and given.get(k) for k in names):
        c.warn(f"{c.path / COMPARE_FILE}: keys must map accuracy and reward to metric names; the defaults are used")
        return Keys()
    return Keys(accuracy=given["accuracy"], reward=given["reward"])


def _stage_dir(c: Comparison, label: str, seed: int, given: Any, where: str) -> Path | None:
    """The folder of one stage of run ``label`` / ``seed``, inside the comparison's folder, or None (warned)."""
    root = c.path.resolve()
    if not isinstance(given, str) or not given or "\0" in given or Path(given).is_absolute():
        c.warn(f"{where}: run_dirs must be paths inside the run's folder (got {json.dumps(given)[:80]}); not read")
        return None
    folder = (c.path / "runs" / label / f"seed_{seed}" / given).resolve()
    if not folder.is_relative_to(root):
        c.warn(f"{where}: {given!r} leads out of {c.path}; not read")
        return None
    return folder


def _members(report: dict[str, Any], c: Comparison) -> None:
    for i, row in enumerate(_list(report, "runs", c)):
        where = f"{c.path / COMPARE_FILE}: runs.{i}"
        if not isinstance(row, dict):
            c.warn(f"{where}: not an object; skipped")
            continue
        label, seed, status = row.get("label"), row.get("seed"), row.get("status")
        if label not in c.labels or type(seed) is not int or not isinstance(status, str):
            c.warn(f"{where}: needs the label of an entry, a whole-number seed and a status; skipped")
            continue
        if status not in FINISHED:
            continue  # failed, invalid or not run: the comparison left it out too
        if any(m.label == label and m.seed == seed for m in c.members):
            c.warn(f"{where}: {label}/seed_{seed} is listed twice; the first is drawn")
            continue
        given = row.get("run_dirs", ["."])  # a single-stage run wrote into its own folder
        if not isinstance(given, list) or not given:
            c.warn(f"{where}: run_dirs must be a list of paths; skipped")
            continue
        stages = []
        for stage in given:
            folder = _stage_dir(c, label, seed, stage, where)
            if folder is None:
                continue
            try:
                run = Run.open(folder)
            except TrinityError as exc:
                c.warn(f"{where} ({label}/seed_{seed}): {exc}; not shown")
                continue
            run.name = f"{label}/seed_{seed}" + ("" if stage == "." else f"/{stage}")
            stages.append(run)
        if stages:
            c.members.append(Member(label, seed, stages))


def open_comparison(path: str | Path) -> Comparison:
    """The comparison in ``path`` (a folder with ``compare.json``); whatever of it is damaged is warned and left out."""
    path = Path(path)
    c = Comparison(path, path.resolve().name)
    report = _load(path, c)
    for i, entry in enumerate(_list(report, "entries", c)):
        label = entry.get("label") if isinstance(entry, dict) else None
        if not isinstance(label, str) or not LABEL.match(label) or label in (".", "..") or label in c.labels:
            c.warn(f"{path / COMPARE_FILE}: entries.{i}: needs a label that names a folder (letters, digits, _ . + -)")
            continue
        c.labels.append(label)
    baseline = report.get("baseline")
    c.baseline = baseline if baseline in c.labels else (c.labels[0] if c.labels else None)
    c.seeds = sorted({s for s in _list(report, "seeds", c) if type(s) is int})
    c.keys = _keys(report, c)
    comparisons = report.get("comparisons", {})
    for label in c.labels:
        blocks = comparisons.get(label) if isinstance(comparisons, dict) else None
        if isinstance(blocks, list):
            c.lines[label] = [b["line"] for b in blocks if isinstance(b, dict) and isinstance(b.get("line"), str)]
    _members(report, c)
    return c


def open_folders(folders: list[str]) -> tuple[list[Run], list[Comparison]]:
    """Each folder opened as a comparison (it holds ``compare.json``) or a run; a comparison's runs join the
    runs after it. A folder that is neither is a one-line :class:`TrinityError`."""
    runs: list[Run] = []
    comparisons: list[Comparison] = []
    for folder in folders:
        if is_compare_folder(folder):
            comparison = open_comparison(folder)
            comparisons.append(comparison)
            runs += comparison.runs
        else:
            runs.append(Run.open(folder))
    return runs, comparisons


def comparisons_data(runs: list[Run], comparisons: list[Comparison]) -> list[dict[str, Any]]:
    """Every comparison as the page draws it (``GET /api/compares``, and a report's ``compares``)."""
    ids = {id(run): i for i, run in enumerate(runs)}
    return [c.data(ids) for c in comparisons]
