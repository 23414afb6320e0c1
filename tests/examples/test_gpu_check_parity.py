"""The GPU check's parity judgement on the CPU: fp32 and bf16-autocast steps of the local engine
against the float64 reference stand in for the device's. A correct fp32 step computed another way
(another accumulation order, as another device has) passes with the tolerance measured from the
CPU's own fp32 step, where the old fixed tolerance failed a correct step; a wrong step fails; bf16
passes by its own measured tolerance and fails by fp32's."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from _lib.scripts import load_script

ROOT = Path(__file__).resolve().parents[2]
load_script("benchmarks/gpu_check.py")  # the check's entry point: it makes its sibling modules importable

from gpu_check_parity import Errors, errors, judge, one_step, tolerance  # noqa: E402
from gpu_check_train import grpo_batch, grpo_objective  # noqa: E402

from trinity_like.models.shapes import shaped_folder  # noqa: E402


@pytest.fixture(scope="module")
def steps(tmp_path_factory):
    folder = shaped_folder("tiny", tmp_path_factory.mktemp("tiny"))
    objective, batch = grpo_objective(folder), grpo_batch(400, 8, 4, 16, 24)

    def step(kind: str, **kw):
        return one_step(folder, objective, batch, "cpu", kind, **kw)

    return {
        "ref": step("float64"),
        "fp32": step("float32"),
        "fp32_other_order": step("float32", micro_batch=2),
        "fp32_wrong_lr": step("float32", lr=1.02e-3),
        "bf16": step("bfloat16"),
        "bf16_other_order": step("bfloat16", micro_batch=2),
    }


def test_the_old_fixed_tolerance_fails_a_correct_fp32_step(steps):
    ref, fp32 = steps["ref"], steps["fp32"]
    diff = max(float((fp32["after"][k].double() - ref["after"][k]).abs().max()) for k in ref["after"])
    update = max(float((ref["after"][k] - ref["before"][k]).abs().max()) for k in ref["after"])
    assert diff > 1e-3 * update + 1e-7  # what the check allowed before: a correct step reported FAILED


def test_a_correct_fp32_step_computed_another_way_is_within_the_measured_tolerance(steps):
    allowed = tolerance(errors(steps["fp32"], steps["ref"]), "float32")
    got = errors(steps["fp32_other_order"], steps["ref"])
    assert got.update > 0 and judge(got, allowed) == []


def test_a_wrong_step_fails(steps):
    allowed = tolerance(errors(steps["fp32"], steps["ref"]), "float32")
    bad = judge(errors(steps["fp32_wrong_lr"], steps["ref"]), allowed)
    assert len(bad) == 1 and bad[0].startswith("update error")  # 2 % too large a step: the update says so


def test_bf16_is_judged_by_its_own_measured_tolerance(steps):
    ref = steps["ref"]
    fp32_allowed = tolerance(errors(steps["fp32"], ref), "float32")
    bf16_allowed = tolerance(errors(steps["bf16"], ref), "bfloat16")
    got = errors(steps["bf16_other_order"], ref)
    assert judge(got, fp32_allowed) and judge(got, bf16_allowed) == []
    assert bf16_allowed.update < 1.0  # still rejects an update unrelated to the reference's


def test_a_nan_is_never_within_tolerance():
    allowed = Errors(1.0, 1.0, 1.0)
    assert judge(Errors(math.nan, 0.0, 0.0), allowed) == ["loss error nan > allowed 1.00e+00"]
