"""Checkpoints: atomic publish, keep-last-N, manifest verification, RNG round trip."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from trinity_like.errors import TrinityError
from trinity_like.pipeline.checkpoint import CheckpointManager


def writer(value: float):
    def write(folder: str) -> None:
        Path(folder).mkdir()
        save_file({"w": torch.full((4,), value)}, f"{folder}/model.safetensors")

    return write


def test_save_publishes_latest_and_prunes(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=2)
    for step in (1, 2, 3):
        mgr.save(step, {"model_version": step}, {"model": writer(float(step))})
    names = [p.name for p in mgr.list()]
    assert names == ["step_000002", "step_000003"]
    latest = mgr.latest()
    assert latest.name == "step_000003"
    assert mgr.read_state(latest) == {"step": 3, "model_version": 3}
    manifest = mgr.verify(latest)
    assert set(manifest["files"]) == {"model/model.safetensors", "state.json", "rng.json"}


def test_a_kill_mid_save_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    mgr.save(1, {}, {"model": writer(1.0)})

    def dies(folder: str) -> None:
        Path(folder).mkdir()
        (Path(folder) / "half.safetensors").write_bytes(b"partial")
        raise KeyboardInterrupt  # stands for SIGKILL in the middle of writing

    with pytest.raises(KeyboardInterrupt):
        mgr.save(2, {}, {"model": dies})
    assert mgr.latest().name == "step_000001"
    assert [p.name for p in mgr.list()] == ["step_000001"]
    assert mgr.clean_partial() == [".tmp-step_000002-" + str(__import__("os").getpid())]
    assert not any(p.name.startswith(".tmp") for p in mgr.root.iterdir())


def test_verify_detects_a_changed_weight_file(tmp_path):
    mgr = CheckpointManager(tmp_path)
    path = mgr.save(5, {}, {"model": writer(5.0)})
    save_file({"w": torch.zeros(4)}, str(path / "model" / "model.safetensors"))
    with pytest.raises(TrinityError, match="model/model.safetensors does not match its sha256 in the manifest"):
        mgr.verify(path)


def test_a_flipped_byte_or_a_truncated_file_names_the_file_and_the_way_back(tmp_path):
    mgr = CheckpointManager(tmp_path, keep_last=3)
    first = mgr.save(1, {}, {"model": writer(1.0)})
    path = mgr.save(2, {}, {"model": writer(2.0)})
    weights = path / "model" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 0x01  # one bit of the last weight
    weights.write_bytes(bytes(data))
    way_back = (
        f"to resume from the checkpoint before it (step_000001), move this one aside "
        f"(mv {path} {path.parent / 'corrupt-step_000002'}) and run the same command"
    )
    with pytest.raises(TrinityError) as info:
        mgr.verify(path)
    assert str(info.value) == (
        f"checkpoint {path}: model/model.safetensors does not match its sha256 in the "
        f"manifest (bytes changed); {way_back}"
    )
    weights.write_bytes(bytes(data[:-10]))
    with pytest.raises(TrinityError) as info:
        mgr.verify(path)
    assert str(info.value) == (
        f"checkpoint {path}: model/model.safetensors is {len(data) - 10} bytes, "
        f"{len(data)} when saved (truncated?); {way_back}"
    )
    path.rename(path.parent / "corrupt-step_000002")  # as the message says
    assert mgr.latest() == first and mgr.verify(first)["step"] == 1
    with pytest.raises(TrinityError, match="model/model.safetensors does not match .*; no earlier checkpoint is left"):
        save_file({"w": torch.zeros(4)}, str(first / "model" / "model.safetensors"))
        mgr.verify(first)


def test_weights_hash_depends_only_on_weights(tmp_path):
    a = CheckpointManager(tmp_path / "a").save(1, {"x": 1}, {"model": writer(1.0)})
    b = CheckpointManager(tmp_path / "b").save(1, {"x": 2}, {"model": writer(1.0)})
    c = CheckpointManager(tmp_path / "c").save(1, {"x": 1}, {"model": writer(2.0)})
    h = [json.loads((p / "manifest.json").read_text())["weights_sha256"] for p in (a, b, c)]
    assert h[0] == h[1] != h[2]


def test_rng_round_trip(tmp_path):
    mgr = CheckpointManager(tmp_path)
    random.seed(3)
    torch.manual_seed(3)
    path = mgr.save(1, {}, {})
    expected = (random.random(), torch.rand(3))
    random.seed(99)
    torch.manual_seed(99)
    mgr.restore_rng(path)
    got = (random.random(), torch.rand(3))
    assert got[0] == expected[0] and torch.equal(got[1], expected[1])
