"""Weights through one shared-memory file (trinity_like/trainer/shared_weights.py)."""

import os
import pickle
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from trinity_like.errors import TrinityError
from trinity_like.trainer.shared_weights import PREFIX, WeightMailbox, remove_orphans


def state():
    g = torch.Generator().manual_seed(0)
    return {
        "w": torch.randn(3, 5, generator=g),
        "ids": torch.arange(7),
        "half": torch.randn(2, 3, generator=g).to(torch.bfloat16),
        "scalar": torch.tensor(2.5, dtype=torch.float64),
    }


def test_a_write_reads_back_bit_for_bit_and_the_next_overwrites_it_in_place(tmp_path):
    box = WeightMailbox(tmp_path)
    sd = state()
    handle = box.write(sd)
    seen = handle.tensors()
    assert seen.keys() == sd.keys()
    assert all(torch.equal(seen[k], sd[k]) and seen[k].dtype == sd[k].dtype for k in sd)
    inode, size = os.stat(handle.path).st_ino, os.path.getsize(handle.path)
    sd["w"] += 1
    again = box.write(sd)
    assert again == handle  # same file, same layout
    assert (os.stat(handle.path).st_ino, os.path.getsize(handle.path)) == (inode, size)
    assert torch.equal(again.tensors()["w"], sd["w"])
    assert len(list(tmp_path.iterdir())) == 1
    box.close()
    assert not os.path.exists(handle.path)


def test_a_new_layout_resizes_the_file(tmp_path):
    box = WeightMailbox(tmp_path)
    small = box.write({"a": torch.ones(4)})
    small_size = os.path.getsize(small.path)
    big = box.write({"a": torch.ones(4), "b": torch.full((1000,), 3.0)})
    assert big.path == small.path and os.path.getsize(big.path) >= 4000 + small_size
    assert float(big.tensors()["b"].sum()) == 3000.0
    box.close()


def test_another_process_reads_the_handle(tmp_path):
    box = WeightMailbox(tmp_path)
    sd = state()
    handle = box.write(sd)
    code = (
        "import pickle, sys, torch; h = pickle.loads(sys.stdin.buffer.read()); t = h.tensors(); "
        "print(float(t['w'].double().sum()), int(t['ids'].sum()), t['half'].dtype)"
    )
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(handle), capture_output=True, check=True)
    w, ids, dtype = out.stdout.decode().split()
    assert float(w) == pytest.approx(float(sd["w"].double().sum())) and int(ids) == 21 and dtype == "torch.bfloat16"
    box.close()


def test_a_reader_on_another_machine_or_after_close_gets_a_clear_error(tmp_path):
    box = WeightMailbox(tmp_path)
    handle = box.write(state())
    with pytest.raises(TrinityError, match="share a machine"):
        replace(handle, machine="elsewhere/0").tensors()
    box.close()
    with pytest.raises(TrinityError, match="gone"):
        replace(handle, path=handle.path + "-other").tensors()


def test_files_of_killed_owners_are_removed_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    orphan = tmp_path / f"{PREFIX}{dead.stdout.strip()}-abc"
    orphan.write_bytes(b"x" * 64)
    live = WeightMailbox(tmp_path)
    live.write({"a": torch.ones(2)})
    assert not orphan.exists()  # the new mailbox swept it
    remove_orphans(tmp_path)
    assert os.path.exists(live.path)  # ours: this process is alive
    live.close()
