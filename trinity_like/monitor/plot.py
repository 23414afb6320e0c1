"""``trinity-like plot RUN_DIR``: the curves a person looks at after a run, as one PNG.

Reads ``metrics.jsonl`` (what every run writes) and draws reward (with the gold reward of a
learned-reward run on a right-hand axis), held-out accuracy (with
its standard error), the loss terms, response length and the time of each phase per step.
A damaged line is skipped with a warning naming it; a value that is not a number, or too
large to draw (beyond +-:data:`DRAWABLE`), is left out of its chart with one warning per metric.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from trinity_like.atomic import write_atomic
from trinity_like.errors import TrinityError
from trinity_like.monitor.jsonl import warn
from trinity_like.monitor.sinks import read_jsonl_metrics

DRAWABLE = 1e100  # matplotlib cannot lay out an axis that spans values near a float's limit

PANELS = (
    ("reward", ("reward/mean",)),
    ("held-out accuracy", ("eval/accuracy",)),
    ("loss", ("loss", "policy_loss", "kl", "entropy")),
    ("response length (tokens)", ("response_length/mean",)),
)
PHASES = (
    "time/rollout",
    "time/reference",
    "time/old_logprob",
    "time/update",
    "time/sync",
    "time/eval",
    "time/checkpoint",
)


def number(value: Any) -> float | None:
    """``value`` as a float a chart can draw, or None (not a number, a boolean, or too large)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and abs(value) <= DRAWABLE:
        return float(value)
    return None


def points(rows: list[dict], key: str, where: str = "") -> list[tuple[float, float]]:
    """``(step, value)`` of each row with a drawable ``key``; one warning when some value of it was left out."""
    pts, left_out = [], 0
    for r in rows:
        if key not in r or r[key] is None:
            continue
        x, y = number(r["step"]), number(r[key])
        if x is None or y is None:
            left_out += 1
        else:
            pts.append((x, y))
    if left_out:
        warn(f"{where}: {key}: {left_out} values not drawn (not a number, or beyond +-{DRAWABLE:g})")
    return pts


def out_file(out: str | Path, formats: dict[str, str] | None = None) -> Path:
    """``out`` checked before any work: its folder exists, it is a regular file or not there yet,
    and (``formats``: suffix -> name) its suffix is one of them."""
    out = Path(out)
    if out.is_dir():
        raise TrinityError(f"--out {out}: is a folder; give a file name")
    if (out.exists() or out.is_symlink()) and not out.is_file():
        raise TrinityError(f"--out {out}: exists and is not a regular file")
    if not out.parent.is_dir():
        raise TrinityError(f"--out {out}: no folder {out.parent}")
    if formats is not None and out.suffix.lstrip(".").lower() not in formats:
        raise TrinityError(
            f"--out {out}: not an image format matplotlib writes (use one of {', '.join(sorted(formats))})"
        )
    return out


def write_out(out: Path, write: Callable[[str], None]) -> None:
    """Write ``--out`` atomically (:func:`trinity_like.atomic.write_atomic`; ``write(tmp_path)``
    fills the new file): a failed write leaves nothing behind, and an OSError is one line."""
    try:
        write_atomic(out, write)
    except OSError as exc:
        raise TrinityError(f"--out {out}: cannot be written ({exc.strerror})") from None


def image_formats() -> dict[str, str]:
    """Suffix -> format name of every image file matplotlib writes."""
    from matplotlib.backend_bases import FigureCanvasBase

    return FigureCanvasBase.get_supported_filetypes()


def _source(run_dir: Path, name: str, hint: str) -> Path:
    path = run_dir / name
    if not path.exists() and not path.is_symlink():
        raise TrinityError(f"{run_dir}: no {name} ({hint})")
    if not path.is_file():
        raise TrinityError(f"{path}: not a regular file")
    return path


def _save(fig: Any, target: Path) -> Path:
    import matplotlib.pyplot as plt

    try:
        write_out(target, lambda tmp: fig.savefig(tmp, dpi=90, format=target.suffix.lstrip(".").lower()))
    finally:
        plt.close(fig)
    return target


def phase_rows(rows: list[dict]) -> list[dict]:
    """One row per trained step with its phase times, merged over the step's lines (its
    checkpoint's time is logged on a line of its own, after the step's).

    >>> phase_rows([{"step": 1, "time/step": 2.0, "time/update": 1.5}, {"step": 1, "time/checkpoint": 0.4},
    ...             {"step": 0, "time/eval": 3.0}])
    [{'step': 1, 'time/step': 2.0, 'time/update': 1.5, 'time/checkpoint': 0.4}]
    """
    merged: dict[int, dict] = {}
    for r in rows:
        if number(r["step"]) is not None:
            merged.setdefault(r["step"], {}).update(
                {k: v for k, v in r.items() if (k in PHASES or k == "time/step") and number(v) is not None}
            )
    return [{"step": s, **m} for s, m in sorted(merged.items()) if "time/step" in m]


def _gold_beside_reward(ax, rows: list[dict], where: str) -> None:
    """The verifier's reward (``reward/gold_mean``) on the reward chart, on its own right-hand
    axis (a learned reward's scale is arbitrary): the two curves parting is reward hacking."""
    pts = points(rows, "reward/gold_mean", where)
    if not pts:
        return
    twin = ax.twinx()
    twin.plot(*zip(*pts), marker=".", color="tab:green", label="reward/gold_mean (right axis)")
    twin.set_ylabel("gold reward (verifier)")
    twin.legend(fontsize=8, loc="lower right")


def plot_run(run_dir: str | Path, out: str | Path | None = None) -> Path:
    """Write ``<run_dir>/metrics.png`` (or ``out``); returns its path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    run_dir = Path(run_dir)
    path = _source(run_dir, "metrics.jsonl", "is it a run directory?")
    target = out_file(out if out else run_dir / "metrics.png", image_formats())
    rows = read_jsonl_metrics(path, step=True)
    if not rows:
        raise TrinityError(f"{path}: no metrics yet")
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), constrained_layout=True)
    for ax, (title, keys) in zip(axes.flat, PANELS):
        for key in keys:
            pts = points(rows, key, str(path))
            if not pts:
                continue
            xs, ys = zip(*pts)
            if key == "eval/accuracy":
                stderr = {number(r["step"]): number(r.get("eval/accuracy_stderr")) for r in rows if key in r}
                errs = [stderr.get(x) or 0.0 for x in xs]
                ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=key)
                ax.set_ylim(0, 1)
            else:
                ax.plot(xs, ys, marker=".", label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines or ax.containers:
            ax.legend(fontsize=8)
    _gold_beside_reward(axes.flat[0], rows, str(path))
    ax = axes.flat[4]
    steps = phase_rows(rows)
    bottom = [0.0] * len(steps)
    for phase in PHASES:
        vals = [number(r.get(phase, 0.0)) or 0.0 for r in steps]
        if any(vals):
            ax.bar([r["step"] for r in steps], vals, bottom=bottom, label=phase.split("/")[1])
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_title("seconds per step, by phase")
    ax.set_xlabel("step")
    if steps:
        ax.legend(fontsize=8)
    ax = axes.flat[5]
    pts = points(rows, "throughput/tokens_per_s", str(path))
    if pts:
        ax.plot(*zip(*pts), marker=".")
    ax.set_title("trained tokens / s")
    ax.set_xlabel("step")
    fig.suptitle(str(run_dir))
    return _save(fig, target)


# Colours of the timeline's phases (any other phase gets the next free colour).
PHASE_COLOURS = {
    "rollout": "tab:blue",
    "update": "tab:orange",
    "sync": "tab:green",
    "checkpoint": "tab:red",
    "eval": "tab:purple",
    "buffer_write": "tab:brown",
    "wait": "0.85",
}


def plot_timeline(run_dir: str | Path, out: str | Path | None = None, last_s: float | None = None) -> Path:
    """Write ``<run_dir>/timeline.png`` (or ``out``): one row per actor, a bar per span of
    ``timeline.jsonl`` (:mod:`~trinity_like.monitor.timeline`), coloured by phase; the title
    gives the share of rollout time hidden behind training. ``last_s``: only the run's last seconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    from trinity_like.monitor.timeline import (
        TIMELINE_FILE,
        overlap_fraction,
        read_spans,
    )

    run_dir = Path(run_dir)
    path = _source(run_dir, TIMELINE_FILE, "is it a run directory of mode both, train or explore?")
    target = out_file(out if out else run_dir / "timeline.png", image_formats())
    if last_s is not None and not 0 < last_s <= DRAWABLE:
        raise TrinityError(f"--last {last_s}: must be a positive number of seconds")
    spans = read_spans(path)
    drawable = [s for s in spans if 0 <= s.start <= s.end <= DRAWABLE]
    if len(drawable) < len(spans):
        warn(
            f"{path}: {len(spans) - len(drawable)} spans not drawn (an end before its start, or times beyond +-{DRAWABLE:g})"
        )
    spans = drawable
    if not spans:
        raise TrinityError(f"{path}: no spans yet")
    if last_s is not None:
        end = max(s.end for s in spans)
        spans = [s for s in spans if s.end >= end - last_s]
    t0 = min(s.start for s in spans)
    actors = sorted({s.actor for s in spans}, key=lambda a: (a != "explorer", a))
    colours = dict(PHASE_COLOURS)
    width = max(s.end for s in spans) - t0
    fig, ax = plt.subplots(figsize=(14, 1.2 + 0.9 * len(actors)), constrained_layout=True)
    for row, actor in enumerate(actors):
        for s in spans:
            if s.actor != actor:
                continue
            colour = colours.setdefault(s.phase, f"C{len(colours) % 10}")
            ax.broken_barh(
                [(s.start - t0, max(s.end - s.start, 1e-3))],
                (row - 0.4, 0.8),
                facecolors=colour,
                edgecolors="white",
                linewidth=0.8,
            )
            if s.busy and s.end - s.start > 0.04 * width:  # the step of a wide bar, inside it
                ax.text((s.start + s.end) / 2 - t0, row, str(s.step), ha="center", va="center", fontsize=8)
    ax.set_yticks(range(len(actors)), actors)
    ax.set_xlabel("seconds")
    shown = sorted({s.phase for s in spans}, key=list(colours).index)
    ax.legend(
        handles=[Patch(color=colours[p], label=p) for p in shown],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35 if len(actors) < 3 else -0.2),
        ncol=len(shown),
        fontsize=8,
    )
    hidden = overlap_fraction(spans)
    note = "no rollouts" if hidden is None else f"{hidden:.0%} of rollout time hidden behind training"
    ax.set_title(f"{run_dir}: {note}")
    return _save(fig, target)
