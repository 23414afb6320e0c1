"""Learning curves of a comparison: per recipe the mean over seeds and a band, as one PNG.

Two panels, held-out accuracy and train reward against the step; each recipe is a line (the
mean over its seeds at each step) with a shaded band: the 95 % Student-t interval of that
mean where at least two seeds logged the step (one seed: the line alone). Drawn with
matplotlib's Agg backend, as ``trinity-like plot`` draws one run.
"""

from __future__ import annotations

from pathlib import Path

from trinity_like.compare.stats import summarize

PANELS = (("accuracy_curve", "held-out accuracy"), ("reward_curve", "train reward"))


def band(curves: list[list[tuple[int, float]]]) -> list[tuple[int, float, float | None, float | None]]:
    """``(step, mean, low, high)`` over the curves at each step any of them has.

    >>> band([[(0, 0.2), (1, 0.4)], [(0, 0.4), (1, 0.4)]])[1]
    (1, 0.4, 0.4, 0.4)
    """
    by_step: dict[int, list[float]] = {}
    for curve in curves:
        for step, value in curve:
            by_step.setdefault(step, []).append(value)
    out = []
    for step in sorted(by_step):
        s = summarize(by_step[step])
        out.append((step, s.mean, s.low, s.high))
    return out


def plot_comparison(curves: dict[str, dict[str, list[list[tuple[int, float]]]]], target: Path, title: str) -> Path:
    """``curves[label][panel]``: one curve per seed; writes ``target`` (PNG) and returns it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(PANELS), figsize=(6 * len(PANELS), 4.2), constrained_layout=True)
    for ax, (panel, name) in zip(axes, PANELS):
        for i, (label, per) in enumerate(curves.items()):
            points = band(per.get(panel, []))
            if not points:
                continue
            colour = f"C{i}"
            steps = [p[0] for p in points]
            n = len(per.get(panel, []))
            ax.plot(steps, [p[1] for p in points], marker=".", color=colour, label=f"{label} (mean of {n})")
            shaded = [p for p in points if p[2] is not None]
            if shaded:
                ax.fill_between(
                    [p[0] for p in shaded], [p[2] for p in shaded], [p[3] for p in shaded], color=colour, alpha=0.2
                )
        ax.set_title(f"{name}: mean over seeds, 95 % interval")
        ax.set_xlabel("step")
        if panel == "accuracy_curve":
            ax.set_ylim(0, 1)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=90)
    plt.close(fig)
    return target
