"""The parity section of ``benchmarks/gpu_check.py``: one tiny GRPO step on the device against a
float64 reference, judged by tolerances measured in the same run.

Why not "the device against the CPU, within a fixed tolerance": AdamW's first step divides each
gradient by its own magnitude, so a near-zero gradient's rounding becomes a visible change of its
weight. The same fp32 step on the CPU differs from float64 by more than the old fixed allowance
(1.1e-6 at lr 1e-3): a fixed number fails a correct step, or passes a wrong one when widened.

Here one step (the local engine, the recipe's GRPO objective, AdamW) runs four times: on the CPU
in float64 (the reference), on the CPU in float32 and under bf16 autocast over fp32 weights (the
CUDA default, the same mixed path), and on the device. Each is compared with the reference by
its loss, gradient norm, and update (``||after - ref_after|| / ||ref_update||``); the device's
float32 step must be within :data:`K` times what the CPU's float32 step measured, and its default
precision within ``K`` times what the CPU measured for that precision -- bf16 judged as bf16.
On the CPU the device *is* the CPU: the code runs, the judgement is trivially met.
"""

from __future__ import annotations

import functools
import math
from dataclasses import asdict, dataclass

import torch
from gpu_check_parts import Check
from gpu_check_run import Entry
from gpu_check_train import folder_of, grpo_batch, grpo_objective

from trinity_like.models.device import precision

K = 5.0  # allowed: this many times the error the same precision measured on the CPU
# Below these the CPU's measured error is no scale (an error that happened to cancel): relative
# to the reference, a few units in the last place of the precision.
FLOORS = {"float32": 4 * torch.finfo(torch.float32).eps, "bfloat16": 4 * torch.finfo(torch.bfloat16).eps}


@dataclass(frozen=True)
class Errors:
    """How far one step is from the reference: relative loss, grad-norm and update errors."""

    loss: float
    grad_norm: float
    update: float


def errors(step: dict, ref: dict) -> Errors:
    """``step`` against ``ref`` (both as :func:`one_step` returns them, ``ref`` in float64)."""
    diff = sum(float(((step["after"][k].double() - ref["after"][k]) ** 2).sum()) for k in ref["after"])
    size = sum(float(((ref["after"][k] - ref["before"][k]) ** 2).sum()) for k in ref["after"])
    return Errors(
        loss=abs(step["loss"] - ref["loss"]) / max(abs(ref["loss"]), 1e-30),
        grad_norm=abs(step["grad_norm"] - ref["grad_norm"]) / max(ref["grad_norm"], 1e-30),
        update=math.sqrt(diff / max(size, 1e-300)),
    )


def tolerance(measured: Errors, precision: str, k: float = K) -> Errors:
    """What a step of ``precision`` may differ by: ``k`` x the error the CPU measured, at least the floor."""
    floor = FLOORS[precision]
    return Errors(*(k * max(value, floor) for value in asdict(measured).values()))


def judge(got: Errors, allowed: Errors) -> list[str]:
    """The figures past their tolerance (empty: the step agrees with the reference)."""
    return [
        f"{name} error {value:.2e} > allowed {limit:.2e}"
        for (name, value), limit in zip(asdict(got).items(), asdict(allowed).values())
        if not value <= limit  # a NaN fails too
    ]


def one_step(folder, objective, batch, device: str, kind: str, *, micro_batch: int = 4, lr: float = 1e-3) -> dict:
    """One GRPO step of the local engine: ``kind`` float64 (the reference), float32, or bfloat16
    (bf16 autocast over fp32 weights: the CUDA default, the same mixed path on any device)."""
    from trinity_like.trainer.local_engine import LocalEngine
    from trinity_like.trainer.params import ModelParams, OptimParams

    engine = LocalEngine(
        ModelParams(path=str(folder), micro_batch_size=micro_batch, device=device, dtype="float32"), OptimParams(lr=lr)
    )
    if kind == "float64":
        engine.model.double()  # in place: the optimiser's parameters are these; its state starts float64
    engine.compute_dtype = torch.bfloat16 if kind == "bfloat16" else None
    before = {k: v.double() for k, v in engine.state_dict().items()}
    loss = engine.forward_backward(batch, objective)["loss"]
    grad_norm = engine.optim_step()["grad_norm"]
    after = engine.state_dict()
    engine.close()
    return {"loss": loss, "grad_norm": grad_norm, "before": before, "after": after}


def entries(check: Check) -> list[Entry]:
    device = str(check.device)
    default = "bfloat16" if precision(check.device).train_compute == torch.bfloat16 else "float32"

    @functools.cache
    def setup() -> dict:
        folder = folder_of(check, "tiny")
        objective, batch = grpo_objective(folder), grpo_batch(400, 8, 4, 16, 24)
        ref = one_step(folder, objective, batch, "cpu", "float64")
        cpu = {kind: errors(one_step(folder, objective, batch, "cpu", kind), ref) for kind in ("float32", "bfloat16")}
        return {"folder": folder, "objective": objective, "batch": batch, "ref": ref, "cpu": cpu}

    def reference() -> dict:
        s = setup()
        out = {"reference": "cpu, float64", "k": K, "loss": s["ref"]["loss"], "grad_norm": s["ref"]["grad_norm"]}
        for kind, err in s["cpu"].items():
            out[f"cpu_{kind}_errors"] = asdict(err)
        return out

    def on_device(kind: str):
        def run() -> dict:
            s = setup()
            step = one_step(s["folder"], s["objective"], s["batch"], device, kind)
            got, allowed = errors(step, s["ref"]), tolerance(s["cpu"][kind], kind)
            bad = judge(got, allowed)
            out = {"device": device, "precision": kind, "loss": step["loss"], "errors": asdict(got)}
            out.update(allowed=asdict(allowed), close=not bad)
            if check.device.type == "cpu":
                out["note"] = "the device is the CPU: the code runs, the judgement is trivially met"
            if bad:
                out.update(status="failed", error="; ".join(bad))
            return out

        return run

    return [
        Entry("cpu_reference", check.limit(8), reference),
        Entry("float32", check.limit(5), on_device("float32")),
        Entry(f"default_{default}", check.limit(5), on_device(default)),
    ]
