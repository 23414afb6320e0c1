"""The CPU mixed-precision path (models/device.py ``precision``): chosen by the CPU's bf16 units,
bf16 compute over fp32 master weights and fp32 AdamW state, fp32 logprobs and loss.

The hardware probe ``cpu_bf16_flags`` is replaced here, so these run alike on any CPU (bf16
autocast runs everywhere; only its speed needs the units). Oracle: plain torch in float64 --
the same model's logits, ``log_softmax``, the token-mean NLL and its gradient -- which the
mixed path must match within bf16's tolerance, and the fp32 path far more tightly.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch
from _lib.trainer_batches import make_batch, nll_loss

from trinity_like.errors import TrinityError
from trinity_like.explorer.engine import SamplingParams
from trinity_like.explorer.engines import build_rollout_engine
from trinity_like.models import device as dev
from trinity_like.models.tiny import build_tiny_model
from trinity_like.trainer.local_engine import LocalEngine
from trinity_like.trainer.params import ModelParams, OptimParams

CPU = torch.device("cpu")


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    """The tiny model at a real model's init scale (0.02, SmolLM2's initializer_range): the tests'
    default 0.5 saturates attention, where bf16's rounding swings gradients by half (measured)."""
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3, init_std=0.02))


@pytest.fixture
def bf16_cpu(monkeypatch):
    """A CPU with AVX512-BF16, as far as precision() can tell."""
    monkeypatch.setattr(dev, "cpu_bf16_flags", lambda: frozenset({"avx512_bf16"}))


@pytest.fixture
def avx2_cpu(monkeypatch):
    monkeypatch.setattr(dev, "cpu_bf16_flags", lambda: frozenset())


def test_a_cpu_with_bf16_units_gets_the_cuda_mixed_path(bf16_cpu):
    p = dev.precision(CPU)
    want_train = torch.bfloat16 if "train" in dev.CPU_BF16_PARTS else None
    want_rollout = torch.bfloat16 if "rollout" in dev.CPU_BF16_PARTS else torch.float32
    assert (p.rollout, p.train_weights, p.train_compute) == (want_rollout, torch.float32, want_train)
    assert p.why.startswith("CPU has avx512_bf16")
    assert dev.train_dtypes("auto", CPU) == (torch.float32, want_train)
    assert dev.train_dtypes("float32", CPU) == (torch.float32, None)  # a recipe still pins fp32
    assert dev.rollout_dtype("float32", CPU) is torch.float32


def test_a_cpu_without_them_stays_fp32_and_says_why(avx2_cpu):
    p = dev.precision(CPU)
    assert (p.rollout, p.train_weights, p.train_compute) == (torch.float32, torch.float32, None)
    assert "no avx512_bf16 or amx_bf16" in p.why and "slower" in p.why


@pytest.mark.skipif(not shutil.which("lscpu"), reason="lscpu is the oracle")
def test_the_probe_reads_the_flags_and_the_environment_can_switch_it_off(monkeypatch):
    monkeypatch.delenv(dev.CPU_BF16_ENV, raising=False)
    lscpu = subprocess.run(["lscpu"], capture_output=True, text=True, check=True).stdout
    flags = next((line.split(":", 1)[1].split() for line in lscpu.splitlines() if line.startswith("Flags:")), [])
    assert dev.cpu_bf16_flags() == {f for f in flags if f in ("avx512_bf16", "amx_bf16")}
    monkeypatch.setenv(dev.CPU_BF16_ENV, "off")
    assert dev.cpu_bf16_flags() == frozenset()
    assert dev.precision(CPU).train_compute is None
    monkeypatch.setenv(dev.CPU_BF16_ENV, "on")
    assert dev.cpu_bf16_flags() == {"TRINITY_LIKE_CPU_BF16=on"}
    assert dev.precision(CPU).why.startswith("CPU has TRINITY_LIKE_CPU_BF16=on")
    monkeypatch.setenv(dev.CPU_BF16_ENV, "yes")
    with pytest.raises(
        TrinityError, match=r"^environment variable TRINITY_LIKE_CPU_BF16='yes': expected auto, on or off$"
    ):
        dev.cpu_bf16_flags()


def test_the_run_log_line_names_each_path_and_the_reason(bf16_cpu):
    line = dev.describe("auto", "auto", CPU)
    assert line.startswith("precision on cpu: train ")
    assert "auto because: CPU has avx512_bf16" in line
    if "train" in dev.CPU_BF16_PARTS:
        assert "train bf16 compute over fp32 master weights (model.dtype auto)" in line
    pinned = dev.describe("float32", "float32", CPU)
    assert pinned == (
        "precision on cpu: train fp32 (model.dtype = float32), rollout fp32 weights and KV cache (explorer.dtype = float32)"
    )


def oracle_loss_and_grads(model: torch.nn.Module, batch) -> tuple[float, dict[str, torch.Tensor]]:
    """Float64 plain torch: full logits, log_softmax, -sum(mask * logprob) / num_tokens, its gradient."""
    model = model.double()
    model.zero_grad(set_to_none=True)
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]
    ).logits
    R = batch["response_mask"].shape[1]
    logp = torch.log_softmax(logits[:, -R - 1 : -1], dim=-1).gather(-1, batch["input_ids"][:, -R:, None])[..., 0]
    loss = -(logp * batch["response_mask"]).sum() / batch["response_mask"].sum()
    loss.backward()
    return float(loss.detach()), {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double() - want).norm() / want.norm().clamp_min(1e-12))


@pytest.mark.skipif("train" not in dev.CPU_BF16_PARTS, reason="the CPU default trains in fp32")
def test_the_mixed_step_is_the_fp64_oracle_within_bf16_tolerance_and_keeps_fp32_state(tiny_path, bf16_cpu):
    batch = make_batch(400, 8, 6, 5, seed=11)
    mixed = LocalEngine(ModelParams(path=tiny_path), OptimParams(lr=1e-3))  # model.dtype auto
    fp32 = LocalEngine(ModelParams(path=tiny_path, dtype="float32"), OptimParams(lr=1e-3))
    assert mixed.compute_dtype == torch.bfloat16 and fp32.compute_dtype is None
    assert all(p.dtype == torch.float32 for p in mixed.model.parameters())  # fp32 masters
    want_loss, want_grads = oracle_loss_and_grads(
        LocalEngine(ModelParams(path=tiny_path, dtype="float32")).model, batch
    )
    seen = {}

    def spy(outputs, mb):
        seen["logprob"] = outputs["logprob"].dtype
        loss, metrics = nll_loss(outputs, mb)
        seen["loss"] = loss.dtype
        return loss, metrics

    got = {name: engine.forward_backward(batch, spy)["loss"] for name, engine in (("mixed", mixed), ("fp32", fp32))}
    assert seen == {"logprob": torch.float32, "loss": torch.float32}
    assert got["fp32"] == pytest.approx(want_loss, rel=1e-6)
    assert got["mixed"] == pytest.approx(want_loss, rel=1e-3)  # bf16 keeps 8 bits of mantissa
    assert got["mixed"] != got["fp32"]  # it did compute in bf16
    errors = {}
    for name, engine in (("mixed", mixed), ("fp32", fp32)):
        params = dict(engine.model.named_parameters())
        assert all(params[n].grad.dtype == torch.float32 for n in want_grads)  # gradients land in fp32
        got_grad = torch.cat([params[n].grad.flatten() for n in want_grads])
        errors[name] = relative_error(got_grad, torch.cat([want_grads[n].flatten() for n in want_grads]))
    assert errors["fp32"] < 1e-5, errors
    assert 1e-4 < errors["mixed"] < 2e-2, errors  # measured 0.5 %: bf16's rounding, and no more

    mixed.optim_step()
    first = next(iter(mixed.model.parameters()))
    state = mixed.optimizer.state[first]
    assert first.dtype == state["exp_avg"].dtype == state["exp_avg_sq"].dtype == torch.float32
    assert mixed.compute_logprobs(batch)["logprob"].dtype == torch.float32


@pytest.mark.skipif("rollout" not in dev.CPU_BF16_PARTS, reason="the CPU default samples in fp32")
def test_the_rollout_engine_holds_bf16_weights_and_reports_fp32_logprobs(tiny_path, bf16_cpu):
    engine = build_rollout_engine("native", tiny_path, device="cpu")  # explorer.dtype auto
    assert engine.model.dtype == torch.bfloat16
    pinned = build_rollout_engine("native", tiny_path, device="cpu", dtype="float32")
    assert pinned.model.dtype == torch.float32
    sp = SamplingParams(n=2, max_new_tokens=6, seed=4)
    (group,) = engine.generate([[5, 6, 7, 8]], sp)
    # Oracle: the bf16 model's own full forward, log_softmax in fp64, at each sampled token.
    for sample in group:
        ids = torch.tensor([[5, 6, 7, 8, *sample.token_ids]])
        with torch.no_grad():
            logits = engine.model(input_ids=ids).logits[0].double()
        logp = torch.log_softmax(logits[3:-1], dim=-1).gather(-1, ids[0, 4:, None])[:, 0]
        assert torch.allclose(torch.tensor(sample.logprobs, dtype=torch.float64), logp, atol=5e-2)


@pytest.mark.skipif("train" not in dev.CPU_BF16_PARTS, reason="the CPU default trains in fp32")
def test_a_head_in_checkpointed_chunks_recomputes_under_the_same_autocast(tiny_path, bf16_cpu, monkeypatch):
    """The head's chunks are recomputed in backward, where the engine has switched autocast off for the
    loss: torch's checkpoint restores the forward's autocast state, so the gradients are the unchunked ones."""
    from functools import partial

    from trinity_like.trainer import forward

    batch = make_batch(400, 8, 6, 5, seed=12)
    grads = {}
    plain = forward.head_outputs
    for chunk in (forward.HEAD_CHUNK, 7):  # 7: several chunks for this batch's ~30 scored positions
        monkeypatch.setattr(forward, "head_outputs", partial(plain, chunk=chunk))
        engine = LocalEngine(ModelParams(path=tiny_path), OptimParams(lr=1e-3))
        assert engine.compute_dtype == torch.bfloat16
        engine.forward_backward(batch, nll_loss)
        grads[chunk] = torch.cat([p.grad.flatten() for p in engine.model.parameters()])
    _, oracle = oracle_loss_and_grads(LocalEngine(ModelParams(path=tiny_path, dtype="float32")).model, batch)
    want = torch.cat([g.flatten() for g in oracle.values()])
    errors = {chunk: relative_error(g, want) for chunk, g in grads.items()}
    assert max(errors.values()) < 2e-2, errors  # bf16's rounding (each chunk rounds its own part), no more


@pytest.mark.skipif("train" not in dev.CPU_BF16_PARTS, reason="the CPU default trains in fp32")
def test_micro_batches_in_one_autocast_region_add_up_to_the_full_gradient(tiny_path, bf16_cpu):
    """One autocast region spans every micro-batch (the weights' cached bf16 copies serve each): the gradient
    accumulated over 3-row micro-batches is the whole batch's, up to bf16's rounding."""
    batch = make_batch(400, 8, 6, 5, seed=13)
    _, oracle = oracle_loss_and_grads(LocalEngine(ModelParams(path=tiny_path, dtype="float32")).model, batch)
    want = torch.cat([g.flatten() for g in oracle.values()])
    for micro in (8, 3):
        engine = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=micro), OptimParams(lr=1e-3))
        engine.forward_backward(batch, nll_loss)
        got = torch.cat([p.grad.flatten() for p in engine.model.parameters()])
        assert relative_error(got, want) < 2e-2, micro
