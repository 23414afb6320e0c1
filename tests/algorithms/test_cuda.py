"""The same numbers on a CUDA device as on the CPU (skipped without a GPU)."""

from __future__ import annotations

import pytest
import torch
from _lib.algo_testlib import DT, rand_batch

from trinity_like import ops
from trinity_like.components import build_params, call_component
from trinity_like.registry import ADVANTAGE_FN, ENTROPY_LOSS_FN, KL_FN, POLICY_LOSS_FN

pytestmark = pytest.mark.gpu


def batch():
    b = rand_batch(B=8, R=6)
    b["scores"] = torch.randn(8, dtype=DT)
    b["rewards"] = torch.randn(8, dtype=DT)
    b["group_index"] = torch.tensor([4, 4, 4, 9, 9, 1, 1, 1])
    b["token_level_rewards"] = ops.token_level_rewards(b["rewards"], b["action_mask"])
    b.update(ops.normalizers(b["action_mask"], b["is_expert"]))
    return b


@pytest.mark.parametrize("registry", [POLICY_LOSS_FN, ADVANTAGE_FN, ENTROPY_LOSS_FN, KL_FN], ids=lambda r: r.name)
def test_every_component_gives_the_cpu_result_on_cuda(registry):
    cpu = batch()
    gpu = {k: v.cuda() for k, v in cpu.items()}
    for name in registry.names():
        fn = registry.get(name)
        params = build_params(fn, {}) if registry is not KL_FN else None
        want, got = call_component(fn, cpu, params), call_component(fn, gpu, params)
        want, got = (want[0], got[0]) if isinstance(want, tuple) else (want, got)
        assert got.device.type == "cuda" and torch.allclose(got.cpu(), want, atol=1e-10), (registry.name, name)
