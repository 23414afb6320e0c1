"""Our lr schedule against verl's own LambdaLR schedules (the verl engine steps with those)."""

from __future__ import annotations

import pytest
import torch
from verl.utils.torch_functional import get_constant_schedule_with_warmup, get_cosine_schedule_with_warmup

from trinity_like.errors import TrinityError
from trinity_like.trainer.params import OptimParams, lr_factor


def verl_lrs(make, steps: int) -> list[float]:
    opt = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    sched = make(opt)
    lrs = []
    for _ in range(steps):
        lrs.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    return lrs


@pytest.mark.parametrize("warmup", [0, 3])
def test_constant_with_warmup_matches_verl(warmup):
    ours = [lr_factor(s, OptimParams(warmup_steps=warmup)) for s in range(10)]
    assert ours == pytest.approx(verl_lrs(lambda o: get_constant_schedule_with_warmup(o, warmup), 10))


@pytest.mark.parametrize("warmup,min_ratio", [(0, 0.0), (2, 0.1)])
def test_cosine_with_warmup_matches_verl(warmup, min_ratio):
    params = OptimParams(warmup_steps=warmup, scheduler="cosine", total_steps=12, min_lr_ratio=min_ratio)
    ours = [lr_factor(s, params) for s in range(14)]
    theirs = verl_lrs(lambda o: get_cosine_schedule_with_warmup(o, warmup, 12, min_lr_ratio=min_ratio), 14)
    assert ours == pytest.approx(theirs)
    assert ours[warmup] == pytest.approx(1.0) and ours[12] == pytest.approx(min_ratio)


def test_cosine_needs_total_steps():
    with pytest.raises(TrinityError, match="total_steps"):
        OptimParams(scheduler="cosine")
