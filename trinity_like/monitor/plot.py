"""``trinity-like plot RUN_DIR``: the curves a person looks at after a run, as one PNG.

Reads ``metrics.jsonl`` (what every run writes) and draws reward (with the gold reward of a
learned-reward run on a right-hand axis), held-out accuracy (with
its standard error), the loss terms, response length and the time of each phase per step.
"""

from __future__ import annotations

from pathlib import Path

from trinity_like.errors import TrinityError
from trinity_like.monitor.sinks import read_jsonl_metrics

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


def phase_rows(rows: list[dict]) -> list[dict]:
    """One row per trained step with its phase times, merged over the step's lines (its
    checkpoint's time is logged on a line of its own, after the step's).

    >>> phase_rows([{"step": 1, "time/step": 2.0, "time/update": 1.5}, {"step": 1, "time/checkpoint": 0.4},
    ...             {"step": 0, "time/eval": 3.0}])
    [{'step': 1, 'time/step': 2.0, 'time/update': 1.5, 'time/checkpoint': 0.4}]
    """
    merged: dict[int, dict] = {}
    for r in rows:
        merged.setdefault(r["step"], {}).update({k: v for k, v in r.items() if k in PHASES or k == "time/step"})
    return [{"step": s, **m} for s, m in sorted(merged.items()) if "time/step" in m]


def _gold_beside_reward(ax, rows: list[dict]) -> None:
    """The verifier's reward (``reward/gold_mean``) on the reward chart, on its own right-hand
    axis (a learned reward's scale is arbitrary): the two curves parting is reward hacking."""
    pts = [(r["step"], r["reward/gold_mean"]) for r in rows if isinstance(r.get("reward/gold_mean"), (int, float))]
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
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        raise TrinityError(f"{run_dir}: no metrics.jsonl (is it a run directory?)")
    rows = read_jsonl_metrics(path)
    if not rows:
        raise TrinityError(f"{path}: no metrics yet")
    fig, axes = plt.subplots(2, 3, figsize=(15, 8), constrained_layout=True)
    for ax, (title, keys) in zip(axes.flat, PANELS):
        for key in keys:
            pts = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if not pts:
                continue
            xs, ys = zip(*pts)
            if key == "eval/accuracy":
                errs = [r.get("eval/accuracy_stderr", 0.0) for r in rows if isinstance(r.get(key), (int, float))]
                ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=key)
                ax.set_ylim(0, 1)
            else:
                ax.plot(xs, ys, marker=".", label=key)
        ax.set_title(title)
        ax.set_xlabel("step")
        if ax.lines or ax.containers:
            ax.legend(fontsize=8)
    _gold_beside_reward(axes.flat[0], rows)
    ax = axes.flat[4]
    steps = phase_rows(rows)
    bottom = [0.0] * len(steps)
    for phase in PHASES:
        vals = [float(r.get(phase, 0.0)) for r in steps]
        if any(vals):
            ax.bar([r["step"] for r in steps], vals, bottom=bottom, label=phase.split("/")[1])
            bottom = [b + v for b, v in zip(bottom, vals)]
    ax.set_title("seconds per step, by phase")
    ax.set_xlabel("step")
    if steps:
        ax.legend(fontsize=8)
    ax = axes.flat[5]
    pts = [(r["step"], r["throughput/tokens_per_s"]) for r in rows if "throughput/tokens_per_s" in r]
    if pts:
        ax.plot(*zip(*pts), marker=".")
    ax.set_title("trained tokens / s")
    ax.set_xlabel("step")
    fig.suptitle(str(run_dir))
    target = Path(out) if out else run_dir / "metrics.png"
    fig.savefig(target, dpi=90)
    plt.close(fig)
    return target


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
    path = run_dir / TIMELINE_FILE
    if not path.exists():
        raise TrinityError(f"{run_dir}: no {TIMELINE_FILE} (is it a run directory of mode both, train or explore?)")
    spans = read_spans(path)
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
    target = Path(out) if out else run_dir / "timeline.png"
    fig.savefig(target, dpi=90)
    plt.close(fig)
    return target
