"""The local engine on its device, and weights from it to an explorer in the same process.

On a GPU the trainer and the explorer share the card: the explorer copies the trainer's live
device tensors (or borrows them) and nothing goes through the host. The checks that need no
GPU run here on the CPU, on the same code: where the weights are, whether they are the same
tensors, and whether the hand-off ever asks for a host copy (``.cpu()``, ``.numpy()``,
``.tolist()``, ``.item()``, ``.to("cpu")``), watched at torch's Python API (no meta tensors).
The ``gpu`` tests repeat them on CUDA and compare a step there with the step on the CPU.
"""

from __future__ import annotations

import pytest
import torch
from _lib.trainer_batches import ClippedPPOLoss, make_batch
from torch.overrides import TorchFunctionMode

from trinity_like.config.engine_params import explorer_params
from trinity_like.config.schema import Config
from trinity_like.explorer.engine import Borrowed, NativeEngine, SamplingParams
from trinity_like.explorer.worker import ExplorerWorker
from trinity_like.models import device as device_lib
from trinity_like.models.tiny import build_tiny_model
from trinity_like.trainer.local_engine import LocalEngine
from trinity_like.trainer.params import ModelParams, OptimParams

HOST_CALLS = {torch.Tensor.cpu, torch.Tensor.numpy, torch.Tensor.tolist, torch.Tensor.item}


class HostCopies(TorchFunctionMode):
    """Records every call that would bring a tensor to the host."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.sizes: list[int] = []  # elements each call brought over

    def weights_stayed(self, tensors: int) -> bool:
        """Nothing came to the host but the weight digest's one table of two sums per tensor
        (models/weight_digest.py: one trip per device and dtype)."""
        return self.calls in ([], ["tolist"]) and all(0 <= n <= 2 * tensors for n in self.sizes)

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in HOST_CALLS:
            self.calls.append(func.__name__)
            self.sizes.append(args[0].numel() if args and isinstance(args[0], torch.Tensor) else -1)
        elif func is torch.Tensor.to:
            target = kwargs.get("device", args[1] if len(args) > 1 else None)
            if isinstance(target, (str, torch.device)) and torch.device(target).type == "cpu":
                self.calls.append("to(cpu)")
        return func(*args, **kwargs)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3))


@pytest.fixture(scope="module")
def batch():
    return make_batch(400, 8, 6, 5, seed=11)


def explorer_of(path: str, device: str) -> ExplorerWorker:
    config = Config.model_validate(
        {"model": {"path": path}, "trainer": {"engine": "local"}, "cluster": {"device": device}}
    )
    return ExplorerWorker(explorer_params(config), path)


def test_on_a_cpu_nothing_changes_fp32_weights_no_autocast(tiny_path, batch):
    engine = LocalEngine(ModelParams(path=tiny_path))  # cluster.device auto, model.dtype auto
    assert engine.device == torch.device("cpu") and engine.compute_dtype is None
    assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in engine.model.parameters())
    out = engine.compute_logprobs(batch)
    assert out["logprob"].dtype == torch.float32 and out["logprob"].device.type == "cpu"


def test_the_gpu_precision_path_runs_on_the_cpu_bf16_compute_over_fp32_masters(tiny_path, batch, monkeypatch):
    """The CUDA policy (bf16 autocast, fp32 weights and optimiser state) forced onto the CPU: the same
    code the GPU runs. Logprobs and the loss stay fp32; the step lands near the fp32 step."""
    fp32 = LocalEngine(ModelParams(path=tiny_path), OptimParams(lr=1e-3))
    cuda_policy = device_lib.precision(torch.device("cuda", 0))
    monkeypatch.setattr(device_lib, "precision", lambda device: cuda_policy)
    mixed = LocalEngine(ModelParams(path=tiny_path), OptimParams(lr=1e-3))
    assert mixed.compute_dtype == torch.bfloat16
    loss = ClippedPPOLoss()
    seen = {}

    def spy(outputs, mb):
        seen["logprob"] = outputs["logprob"].dtype
        return loss(outputs, mb)

    m_mixed, m_fp32 = mixed.forward_backward(batch, spy), fp32.forward_backward(batch, loss)
    assert seen["logprob"] == torch.float32
    assert abs(m_mixed["loss"] - m_fp32["loss"]) <= 0.05 * abs(m_fp32["loss"]) + 1e-3
    mixed.optim_step(), fp32.optim_step()
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())
    state = mixed.optimizer.state[next(iter(mixed.model.parameters()))]
    assert state["exp_avg"].dtype == torch.float32
    for (name, a), b in zip(mixed.model.named_parameters(), fp32.model.parameters()):
        assert torch.allclose(a, b, atol=5e-3), name  # lr 1e-3: one Adam step moves each weight ~1e-3


def test_weights_reach_an_in_process_explorer_without_a_host_copy(tiny_path):
    """The recipe's sync: actor.export_weights() -> explorer.receive_weights(). The exported tensors
    are the live parameters themselves (no snapshot); the explorer copies them into its own model
    with no call that would bring a tensor to the host -- on a GPU, a device-to-device copy."""
    trainer = LocalEngine(ModelParams(path=tiny_path), OptimParams(lr=1e-2))
    with torch.no_grad():
        for p in trainer.model.parameters():
            p.add_(0.01)  # the trainer moved on from the folder's weights
    exported = trainer.export_weights()
    live = {n: p for n, p in trainer.model.named_parameters()}
    assert all(exported[n].data_ptr() == live[n].data_ptr() for n in live)
    explorer = explorer_of(tiny_path, "cpu")
    with HostCopies() as watch:
        explorer.receive_weights(exported, version=3)
    assert watch.weights_stayed(len(exported)), (watch.calls, watch.sizes)
    engine = explorer.engine
    assert engine.model_version == 3
    mine = dict(engine.model.named_parameters())
    assert all(torch.equal(mine[n], live[n]) and mine[n].data_ptr() != live[n].data_ptr() for n in live)


def test_borrowed_weights_are_the_trainers_tensors(tiny_path):
    """A Borrowed hand-off (the owner waits while the engine samples) uses the tensors in place."""
    trainer = LocalEngine(ModelParams(path=tiny_path))
    engine = NativeEngine(*build_tiny_model(seed=0))
    with HostCopies() as watch:
        engine.update_weights(Borrowed(trainer.export_weights()), version=1)
    assert watch.weights_stayed(len(trainer.export_weights())), (watch.calls, watch.sizes)
    live = dict(trainer.model.named_parameters())
    assert all(p.data_ptr() == live[n].data_ptr() for n, p in engine.model.named_parameters())
    engine.update_weights(trainer.state_dict(), version=2)  # a copy again: the trainer's memory is left alone
    assert all(p.data_ptr() != live[n].data_ptr() for n, p in engine.model.named_parameters())


def test_memory_verbs_of_both_engines_run_and_leave_them_working(tiny_path, batch):
    trainer = LocalEngine(ModelParams(path=tiny_path))
    explorer = explorer_of(tiny_path, "cpu")
    trainer.release_memory(), explorer.resume_memory()
    sp = SamplingParams(n=2, max_new_tokens=4)
    assert len(explorer.engine.generate([[5, 6, 7]], sp)[0]) == 2
    explorer.release_memory(), trainer.resume_memory()
    assert (
        trainer.forward_backward(batch, ClippedPPOLoss())["loss"]
        == trainer.forward_backward(batch, ClippedPPOLoss())["loss"]
    )


# -- on a GPU ---------------------------------------------------------------------------------
@pytest.mark.gpu
def test_the_local_engine_trains_on_cuda_in_bf16_over_fp32_and_hands_device_tensors_over(tiny_path, batch):
    trainer = LocalEngine(ModelParams(path=tiny_path), OptimParams(lr=1e-3))  # auto: CUDA here
    assert trainer.device.type == "cuda" and trainer.compute_dtype == torch.bfloat16
    assert all(p.is_cuda and p.dtype == torch.float32 for p in trainer.model.parameters())
    metrics = trainer.forward_backward(batch, ClippedPPOLoss())
    trainer.optim_step()
    assert torch.isfinite(torch.tensor(metrics["loss"]))
    assert trainer.compute_logprobs(batch)["logprob"].device.type == "cpu"
    explorer = explorer_of(tiny_path, "cuda")
    exported = trainer.export_weights()
    assert all(t.is_cuda for t in exported.values())
    with HostCopies() as watch:
        explorer.receive_weights(exported, version=1)
    assert watch.calls == []
    engine = explorer.engine
    assert engine.model.dtype == torch.bfloat16 and next(engine.model.parameters()).is_cuda
    mine = dict(engine.model.named_parameters())
    for name, p in trainer.model.named_parameters():
        assert torch.equal(mine[name], p.detach().to(torch.bfloat16)), name


@pytest.mark.gpu
def test_a_float32_step_on_cuda_is_the_step_on_the_cpu(tiny_path, batch):
    engines = {
        where: LocalEngine(ModelParams(path=tiny_path, device=where, dtype="float32"), OptimParams(lr=1e-3))
        for where in ("cpu", "cuda")
    }
    loss = {w: e.forward_backward(batch, ClippedPPOLoss())["loss"] for w, e in engines.items()}
    for e in engines.values():
        e.optim_step()
    assert abs(loss["cuda"] - loss["cpu"]) <= 1e-5 * max(1.0, abs(loss["cpu"]))
    cpu, gpu = engines["cpu"].state_dict(), engines["cuda"].state_dict()
    assert all(torch.allclose(gpu[k], cpu[k], atol=1e-5) for k in cpu)
