"""Checkpoints without pickle: the files, and a resumed run that is bitwise the uninterrupted one."""

from __future__ import annotations

import json

import pytest
import torch
from _lib.trainer_batches import ClippedPPOLoss, make_batch
from safetensors import safe_open

from trinity_like.errors import TrinityError
from trinity_like.models.tiny import build_tiny_model
from trinity_like.trainer.checkpoint_files import load_optimizer_state, save_optimizer_state
from trinity_like.trainer.local_engine import LocalEngine
from trinity_like.trainer.lora import LoraParams
from trinity_like.trainer.params import ModelParams, OptimParams

B, P, R = 6, 5, 4
# warmup 3: the resumed engine must also pick up the lr schedule where it was
OPTIM = OptimParams(lr=1e-2, warmup_steps=3, weight_decay=0.01, grad_clip=0.5)
ENGINES = {"full": None, "lora": LoraParams(rank=4, seed=2)}


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3))


@pytest.fixture(scope="module")
def batches() -> list[dict[str, torch.Tensor]]:
    return [make_batch(400, B, P, R, seed=s) for s in range(4)]


def engine(path: str, lora: LoraParams | None) -> LocalEngine:
    return LocalEngine(ModelParams(path=path, micro_batch_size=4, lora=lora), OPTIM)


def train(eng: LocalEngine, batches) -> None:
    loss = ClippedPPOLoss(clip=0.2)
    for batch in batches:
        eng.forward_backward(batch, loss)
        eng.optim_step()


@pytest.mark.parametrize("kind", list(ENGINES))
def test_resume_is_bitwise_the_uninterrupted_run(tiny_path, batches, tmp_path, kind):
    """Train 2 steps, save, 2 more -> W1; a fresh engine loads the checkpoint and trains the same 2 -> W2 == W1."""
    first = engine(tiny_path, ENGINES[kind])
    train(first, batches[:2])
    first.save(str(tmp_path / "ckpt"))
    train(first, batches[2:])
    w1 = first.state_dict()

    second = engine(tiny_path, ENGINES[kind])
    second.load(str(tmp_path / "ckpt"))
    assert second.step == 2
    train(second, batches[2:])
    w2 = second.state_dict()
    assert w1.keys() == w2.keys()
    assert all(torch.equal(w1[k], w2[k]) for k in w1)
    assert any(not torch.equal(w1[k], engine(tiny_path, None).state_dict()[k]) for k in w1)  # it did train


@pytest.mark.parametrize("kind", list(ENGINES))
def test_weights_only_load_starts_a_fresh_optimiser(tiny_path, batches, tmp_path, kind):
    first = engine(tiny_path, ENGINES[kind])
    train(first, batches[:2])
    first.save(str(tmp_path / "ckpt"))
    saved = first.state_dict()

    fresh = engine(tiny_path, ENGINES[kind])
    fresh.load(str(tmp_path / "ckpt"), with_optimizer=False)
    assert fresh.step == 0 and not fresh.optimizer.state
    now = fresh.state_dict()
    assert all(torch.equal(now[k], saved[k]) for k in saved)


def test_no_pickle_anywhere_and_the_optimizer_file_is_torchs_state(tiny_path, batches, tmp_path):
    eng = engine(tiny_path, None)
    train(eng, batches[:2])
    eng.save(str(tmp_path / "ckpt"))
    names = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "optimizer.safetensors",
        "trainer_state.json",
        "rng_state.safetensors",
        "base_model.json",
    } <= names
    assert not {n for n in names if n.endswith((".pt", ".pth", ".bin", ".pkl"))}
    assert json.loads((tmp_path / "ckpt" / "trainer_state.json").read_text()) == {"step": 2}
    assert json.loads((tmp_path / "ckpt" / "base_model.json").read_text()) == {"base_model": tiny_path, "lora": None}
    with safe_open(str(tmp_path / "ckpt" / "rng_state.safetensors"), "pt") as f:
        assert torch.equal(f.get_tensor("cpu"), torch.get_rng_state())

    # oracle: torch's own (id-keyed) optimiser state, entry by entry, in named-parameter order
    theirs = eng.optimizer.state_dict()
    ours = load_optimizer_state(tmp_path / "ckpt" / "optimizer.safetensors")
    names_in_order = [n for n, _ in eng.model.named_parameters()]
    assert ours["param_groups"][0]["params"] == names_in_order
    for index, name in enumerate(names_in_order):
        assert ours["state"][name].keys() == theirs["state"][index].keys()
        for key, value in theirs["state"][index].items():
            assert torch.equal(ours["state"][name][key], value)
    for key, value in theirs["param_groups"][0].items():
        if key != "params":
            assert ours["param_groups"][0][key] == value


def test_optimizer_file_round_trips_non_tensor_entries(tmp_path):
    state = {
        "state": {"w": {"step": 3, "exp_avg": torch.ones(2)}},
        "param_groups": [{"lr": 0.1, "betas": (0.9, 0.99), "foreach": None, "params": ["w"]}],
    }
    save_optimizer_state(state, tmp_path / "o.safetensors")
    back = load_optimizer_state(tmp_path / "o.safetensors")
    assert back["param_groups"] == state["param_groups"]
    assert back["state"]["w"]["step"] == 3 and torch.equal(back["state"]["w"]["exp_avg"], torch.ones(2))


def test_old_pickled_optimizer_is_a_clear_error_unless_weights_only(tiny_path, tmp_path):
    eng = engine(tiny_path, None)
    eng.save(str(tmp_path / "ckpt"))
    (tmp_path / "ckpt" / "optimizer.safetensors").rename(tmp_path / "ckpt" / "optimizer.pt")
    with pytest.raises(TrinityError, match="old pickled format"):
        engine(tiny_path, None).load(str(tmp_path / "ckpt"))
    engine(tiny_path, None).load(str(tmp_path / "ckpt"), with_optimizer=False)


def test_a_checkpoint_before_the_first_step_resumes(tiny_path, batches, tmp_path):
    first = engine(tiny_path, ENGINES["lora"])
    first.save(str(tmp_path / "ckpt"))
    second = engine(tiny_path, ENGINES["lora"])
    second.load(str(tmp_path / "ckpt"))
    for eng in (first, second):
        train(eng, batches[:1])
    a, b = first.state_dict(), second.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_load_restores_the_rng(tiny_path, batches, tmp_path):
    """The RNG file puts torch's generator back where it was at save time."""
    eng = engine(tiny_path, None)
    train(eng, batches[:1])
    eng.save(str(tmp_path / "ckpt"))
    expected = torch.rand(3)
    torch.rand(100)
    engine(tiny_path, None).load(str(tmp_path / "ckpt"))
    assert torch.equal(torch.rand(3), expected)
