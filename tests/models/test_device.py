"""Device and precision resolution: one place decides both (trinity_like/models/device.py)."""

from __future__ import annotations

import pytest
import torch

from trinity_like.errors import TrinityError
from trinity_like.models import device as dev


def test_auto_is_cuda_when_torch_sees_one_else_cpu():
    want = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    assert dev.resolve_device("auto") == want
    assert dev.resolve_device("cpu") == torch.device("cpu")


@pytest.mark.parametrize("spec", ["gpu", "cuda:", "cuda:x", "CPU", "cuda:0:1", ""])
def test_a_malformed_device_is_one_line_naming_the_key(spec):
    with pytest.raises(
        TrinityError, match=r"^cluster\.device: .* is not a device; expected auto, cpu, cuda or cuda:N$"
    ):
        dev.resolve_device(spec)


def test_a_gpu_that_is_not_there_is_an_error_not_a_silent_cpu_run():
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(TrinityError, match=rf"^explorer device: cuda:{count} asked for, but torch sees"):
        dev.resolve_device(f"cuda:{count}", where="explorer device")


def test_the_run_device_is_what_parts_built_without_a_config_see():
    before = dev._run_device
    try:
        dev.set_run_device("cpu")
        assert dev.run_device() == torch.device("cpu") == dev.resolve_device(None)
        with pytest.raises(TrinityError):
            dev.set_run_device("tpu")
        assert dev._run_device == "cpu"  # a bad one changes nothing
    finally:
        dev._run_device = before


def test_precision_on_a_cpu_without_bf16_units_is_fp32_and_on_cuda_is_bf16_over_fp32_masters(monkeypatch):
    monkeypatch.setattr(
        dev, "cpu_bf16_flags", lambda: frozenset()
    )  # an AVX2 CPU (tests/trainer/test_precision.py: others)
    cpu = dev.precision(torch.device("cpu"))
    assert (cpu.rollout, cpu.train_weights, cpu.train_compute) == (torch.float32, torch.float32, None)
    cuda = dev.precision(torch.device("cuda", 0))  # a device object needs no GPU
    assert (cuda.rollout, cuda.train_weights, cuda.train_compute) == (torch.bfloat16, torch.float32, torch.bfloat16)


def test_explicit_dtypes_win_over_auto(monkeypatch):
    monkeypatch.setattr(dev, "cpu_bf16_flags", lambda: frozenset())
    cuda = torch.device("cuda", 0)
    assert dev.rollout_dtype("auto", cuda) is torch.bfloat16
    assert dev.rollout_dtype("float32", cuda) is torch.float32
    assert dev.rollout_dtype("bfloat16", torch.device("cpu")) is torch.bfloat16
    assert dev.train_dtypes("auto", cuda) == (torch.float32, torch.bfloat16)
    assert dev.train_dtypes("auto", torch.device("cpu")) == (torch.float32, None)
    assert dev.train_dtypes("float32", cuda) == (torch.float32, None)
    assert dev.train_dtypes("bfloat16", torch.device("cpu")) == (torch.bfloat16, None)  # the parameters themselves
    with pytest.raises(TrinityError, match="dtype 'float16' unknown"):
        dev.rollout_dtype("float16", cuda)
