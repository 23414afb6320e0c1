"""The gold reward on the same chart as the trained one: `trinity-like plot` and TensorBoard."""

from __future__ import annotations

import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from trinity_like.cli import main
from trinity_like.monitor.plot import _gold_beside_reward
from trinity_like.monitor.sinks import TensorBoardMonitor, TensorBoardParams

ROWS = [{"step": s, "reward/mean": 1.0 + 0.3 * s, "reward/gold_mean": 0.5 - 0.1 * s} for s in (1, 2, 3)]


def test_the_reward_chart_gets_the_gold_reward_on_a_right_hand_axis(tmp_path):
    fig, ax = plt.subplots()
    _gold_beside_reward(ax, ROWS, "metrics.jsonl")
    assert len(fig.axes) == 2
    (line,) = fig.axes[1].lines
    assert list(line.get_xdata()) == [1, 2, 3] and list(line.get_ydata()) == [r["reward/gold_mean"] for r in ROWS]
    fig2, ax2 = plt.subplots()
    _gold_beside_reward(ax2, [{"step": 1, "reward/mean": 1.0}], "metrics.jsonl")  # no gold: nothing added
    assert len(fig2.axes) == 1
    plt.close("all")
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    assert main(["plot", str(tmp_path)]) == 0 and (tmp_path / "metrics.png").stat().st_size > 0


def test_tensorboard_has_a_chart_with_both_rewards(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.plugins.custom_scalar import layout_pb2

    sink = TensorBoardMonitor(run_dir=str(tmp_path), params=TensorBoardParams())
    for r in ROWS:
        sink.log(r["step"], r)
    sink.close()
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    assert {"reward/mean", "reward/gold_mean"} <= set(acc.Tags()["scalars"])
    (config,) = [e for e in acc.Tensors("custom_scalars__config__")]
    layout = layout_pb2.Layout()
    layout.ParseFromString(config.tensor_proto.string_val[0])
    charts = [c for cat in layout.category for c in cat.chart]
    assert [list(c.multiline.tag) for c in charts] == [["reward/mean", "reward/gold_mean"]]
