"""The board through which the explorer and the trainer share a node's CPU cores (trinity_like/cpu_share.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trinity_like.config.schema import Config
from trinity_like.cpu_share import EXPLORER, PREFIX, TRAINER, CoreShare
from trinity_like.shm import shm_dir


@pytest.fixture
def board():
    cores = CoreShare.create(share=(1, 3), wide=(4, 5))
    yield cores
    cores.close()


def test_each_side_takes_its_share_while_the_other_computes_and_every_core_alone(board):
    assert (board.threads(EXPLORER), board.threads(TRAINER)) == (4, 5)
    with board.computing(TRAINER):
        assert (board.threads(EXPLORER), board.threads(TRAINER)) == (1, 5)  # its own flag does not narrow it
        with board.computing(EXPLORER):
            assert (board.threads(EXPLORER), board.threads(TRAINER)) == (1, 3)
    assert (board.threads(EXPLORER), board.threads(TRAINER)) == (4, 5)
    with pytest.raises(RuntimeError), board.computing(EXPLORER):  # an error inside clears the flag too
        raise RuntimeError("boom")
    assert board.threads(TRAINER) == 5


HOLD = """
import sys
from trinity_like.cpu_share import CoreShare
cores = CoreShare(sys.argv[1], (1, 3), (4, 5))
with cores.computing(int(sys.argv[2])):
    print("computing", flush=True)
    sys.stdin.readline()
"""


def test_another_process_sees_the_flag_and_fit_sets_torch_threads(board):
    """Another process maps the same board: its explorer computing narrows this trainer."""
    before = torch.get_num_threads()
    child = subprocess.Popen(
        [sys.executable, "-c", HOLD, board.path, str(EXPLORER)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "computing"
        assert board.fit(TRAINER) == 3 and torch.get_num_threads() == 3
        child.communicate("done\n", timeout=60)
        assert child.returncode == 0
        assert board.fit(TRAINER) == 5 and torch.get_num_threads() == 5
    finally:
        child.kill()
        torch.set_num_threads(before)


def test_a_board_left_by_a_killed_driver_is_removed_by_the_next_and_close_removes_its_own():
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True
    )
    orphan = shm_dir() / f"{PREFIX}{int(gone.stdout)}-deadbeef0000"
    orphan.write_bytes(b"\0\0")
    cores = CoreShare.create((1, 1), (2, 2))
    assert not orphan.exists() and Path(cores.path).exists()
    cores.close()
    assert not Path(cores.path).exists()


def test_a_recipe_shares_the_cores_only_when_its_explorer_runs_beside_cpu_workers(monkeypatch):
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    ahead = Config(synchronizer={"offset": 1})
    cores = CoreShare.for_threads(ahead.cpu_threads())
    try:
        assert cores is not None and (cores.share, cores.wide) == ((1, 1), (2, 2))
    finally:
        cores.close()
    assert CoreShare.for_threads(Config().cpu_threads()) is None


def test_the_explorer_flags_its_rollouts_and_takes_its_width_at_every_decode_step(board):
    """An explorer with a board: flagged while it runs; every forward of a rollout runs at its
    share while the trainer computes, and at every core once the trainer stops mid-rollout."""
    from trinity_like.config import load_plan
    from trinity_like.config.engine_params import explorer_params, sampling_params
    from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
    from trinity_like.explorer.worker import ExplorerWorker
    from trinity_like.models.resolve import resolve_model_path

    cfg = (
        load_plan(
            Path(__file__).resolve().parents[2] / "examples" / "grpo_arith.yaml",
            ["model.path=tiny-random", "explorer.batch_size=2", "explorer.group_size=2"],
        )
        .stages[0]
        .config
    )
    before = torch.get_num_threads()
    try:
        worker = ExplorerWorker(
            explorer_params(cfg), str(resolve_model_path("tiny-random")), num_threads=4, cores=board
        )
        widths, flags, trainer = [], [], board.computing(TRAINER)

        def hook(*_):
            widths.append(torch.get_num_threads())
            flags.append(board.threads(TRAINER))  # 3: the explorer's flag is up
            if len(widths) == 3:  # the trainer finishes during the rollout
                trainer.__exit__(None, None, None)

        # every forward embeds its tokens once, the model's own and the lean decode step's (explorer/lean_forward.py)
        worker.engine.model.get_input_embeddings().register_forward_pre_hook(hook)
        trainer.__enter__()
        worker.run(arithmetic_tasks(ArithmeticParams(), "train", 2), sampling_params(cfg, step=1))
        assert widths[:3] == [1, 1, 1] and set(widths[3:]) == {4} and len(widths) > 4
        assert set(flags) == {3} and board.threads(TRAINER) == 5  # lowered after the run
    finally:
        torch.set_num_threads(before)
