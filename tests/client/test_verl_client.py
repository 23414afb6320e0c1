"""The client on verl's FSDP workers (2 CPU ranks over gloo) gives what it gives on the local engine."""

from __future__ import annotations

import pytest
import torch

import trinity_like.client as tinker
from trinity_like.client.data import DataError

pytestmark = pytest.mark.slow
types = tinker.types


def rl_data():
    out = []
    for prompt, sampled, lp, adv in (
        ([4, 5, 6], [7, 8, 9], [-1.0, -2.0, -0.5], 1.0),
        ([4, 5], [10, 2, 3, 4], [-3.0, -0.1, -1.0, -2.0], -0.5),
        ([9, 9, 9, 9], [11], [-0.7], 0.25),
    ):
        ob = len(prompt) - 1
        out.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(prompt + sampled[:-1]),
                loss_fn_inputs={
                    "target_tokens": [0] * ob + sampled,
                    "logprobs": [0.0] * ob + lp,
                    "advantages": [0.0] * ob + [adv] * len(sampled),
                },
            )
        )
    return out


def test_verl_and_local_clients_agree_on_outputs_and_updated_weights(tmp_path):
    clients = []
    for engine in ("local", "verl"):
        service = tinker.ServiceClient(
            log_dir=tmp_path / engine, train_engine=engine, trainer_workers=2, micro_batch_size=2
        )
        clients.append((service, service.create_lora_training_client("tiny-random", rank=0, seed=0)))
    outs = []
    for _, client in clients:
        fwd = client.forward_backward(rl_data(), "ppo")
        opt = client.optim_step(types.AdamParams(learning_rate=1e-3))
        outs.append(fwd.result(timeout=300))
        opt.result(timeout=300)
    local, verl = outs
    assert verl.metrics["loss:sum"] == pytest.approx(local.metrics["loss:sum"], rel=1e-5)
    for a, b in zip(local.loss_fn_outputs, verl.loss_fn_outputs, strict=True):
        torch.testing.assert_close(a["logprobs"].to_torch(), b["logprobs"].to_torch(), atol=1e-5, rtol=1e-5)
    ours, theirs = (c._engine.state_dict() for _, c in clients)
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], atol=1e-5, rtol=0, msg=name)
    bad = [
        types.Datum(
            model_input=types.ModelInput.from_ints([1, 2, 3]),
            loss_fn_inputs={"target_tokens": [2, 3, 4], "weights": [1.0, 0.0, 0.0]},
        ),
        types.Datum(
            model_input=types.ModelInput.from_ints([1, 2, 3]),
            loss_fn_inputs={"target_tokens": [2, 7, 4], "weights": [1.0, 1.0, 1.0]},
        ),
    ]
    with pytest.raises(DataError, match="datum 1: a target token that carries loss is not the next"):
        clients[1][1].forward_backward(bad, "cross_entropy").result(timeout=300)
    for service, _ in reversed(clients):
        service.close()
