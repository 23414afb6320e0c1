"""The wandb and mlflow sinks, without network: a tiny run logs to both, and what they stored is read back
with each tool's own reader and checked against the run's metrics.jsonl."""

from __future__ import annotations

import json
import struct
import sys
from pathlib import Path

import pytest
from _lib.compare_testlib import ROOT, TINY_SETS

from trinity_like.cli import main
from trinity_like.config import load_plan
from trinity_like.errors import TrinityError
from trinity_like.runner import run_plan

RECIPE = ROOT / "examples" / "grpo_add2.yaml"


def wandb_history(run_file: Path) -> list[dict]:
    """The history rows of an offline W&B run file: W&B's record log (a ':W&B' header, then 32 KiB
    blocks of records, each a 7-byte header -- CRC, length, type -- and a piece of a protobuf Record)."""
    from wandb.proto import wandb_internal_pb2 as pb

    raw = run_file.read_bytes()
    assert raw[:4] == b":W&B"
    block, pos, pending, rows = 32768, 7, b"", []
    while pos + 7 <= len(raw):
        if block - pos % block < 7:
            pos += block - pos % block
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        if kind == 0 and length == 0:
            break
        pending += raw[pos + 7 : pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # a whole record, or the last piece of one
            record = pb.Record()
            record.ParseFromString(pending)
            pending = b""
            if record.WhichOneof("record_type") == "history":
                rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item})
    return rows


def expected_by_step(run_dir: Path, keys: tuple[str, ...]) -> dict[int, dict[str, float]]:
    out: dict[int, dict[str, float]] = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        row = json.loads(line)
        out.setdefault(row["step"], {}).update({k: row[k] for k in keys if isinstance(row.get(k), (int, float))})
    return out


@pytest.fixture(scope="module")
def tracked_run(tmp_path_factory) -> Path:
    pytest.importorskip("wandb", reason="the wandb sink needs the trackers extra: pip install 'trinity-like[trackers]'")
    pytest.importorskip(
        "mlflow", reason="the mlflow sink needs the trackers extra: pip install 'trinity-like[trackers]'"
    )
    root = tmp_path_factory.mktemp("tracked")
    mp = pytest.MonkeyPatch()
    for var in ("WANDB_MODE", "WANDB_DIR", "WANDB_PROJECT", "WANDB_NAME", "MLFLOW_TRACKING_URI"):
        mp.delenv(var, raising=False)  # the defaults: offline W&B, a file store beside the run
    mp.setenv("TRINITY_LIKE_RUN_GROUP", "grpo_add2")
    try:
        plan = load_plan(RECIPE, [*TINY_SETS, f"run_root={root}", "monitor.backends=[jsonl, wandb, mlflow]"])
        assert run_plan(plan) == 0
    finally:
        mp.undo()
    return Path(plan.stages[0].config.run_dir())


KEYS = ("reward/mean", "eval/accuracy", "perf/train_rows", "time/step")


def test_wandb_holds_every_step_of_the_jsonl_offline(tracked_run):
    (run_file,) = tracked_run.glob("wandb/offline-run-*/run-*.wandb")  # offline by default: nothing uploaded
    rows = {r["_step"]: r for r in wandb_history(run_file)}
    want = expected_by_step(tracked_run, KEYS)
    assert sorted(rows) == sorted(want) == [0, 1, 2]
    for step, values in want.items():
        for key, value in values.items():
            assert rows[step][key] == pytest.approx(value), (step, key)


def test_mlflow_holds_every_step_of_the_jsonl_in_a_local_file_store(tracked_run):
    from mlflow.tracking import MlflowClient

    store = tracked_run.parent / "mlruns"
    assert store.is_dir()  # beside the run directory: every run of the run root in one store
    client = MlflowClient(tracking_uri=store.as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("trinity-like").experiment_id])
    assert run.info.run_name == tracked_run.name and run.info.status == "FINISHED"
    assert run.data.tags["trinity_like.group"] == "grpo_add2"
    assert run.data.tags["trinity_like.run_dir"] == str(tracked_run.resolve())
    want = expected_by_step(tracked_run, KEYS)
    for key in KEYS:
        history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, key)}
        assert history == pytest.approx({s: v[key] for s, v in want.items() if key in v}), key


@pytest.mark.parametrize("sink", ["wandb", "mlflow"])
def test_a_sink_without_its_package_is_one_line_naming_the_extra(sink, tmp_path, monkeypatch, capsys):
    from trinity_like.components import build_params
    from trinity_like.registry import MONITOR

    monkeypatch.setitem(sys.modules, sink, None)  # as if the package were not installed
    cls = MONITOR.get(sink)
    with pytest.raises(
        TrinityError, match=rf"'{sink}' needs the {sink} package: pip install 'trinity-like\[trackers\]'"
    ):
        cls(run_dir=str(tmp_path), params=build_params(cls, {}))
    code = main(
        ["run", "--config", str(RECIPE), *TINY_SETS, f"run_root={tmp_path}", f"monitor.backends=[jsonl, {sink}]"]
    )
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert (
        err
        == f"trinity-like: error: monitor.backends: {sink!r} needs the {sink} package: pip install 'trinity-like[trackers]'\n"
    )
