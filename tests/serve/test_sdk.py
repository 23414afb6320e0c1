"""The official ``tinker`` SDK against ``trinity-like serve``, checked against the in-process
client on the same data: the same losses and logprobs, the same weights after ``optim_step``,
the same samples; and the SDK's own error, checkpoint and resume paths."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tinker
import torch
from _lib.serve_helpers import TEXTS, sft_data
from safetensors.torch import load_file
from tinker import types

import trinity_like.client as ours

RANK, SEED = 4, 3


@pytest.fixture(scope="module")
def service(server):
    url, _ = server
    svc = tinker.ServiceClient(base_url=url)
    yield svc
    svc.close("success").result()


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    with ours.ServiceClient(log_dir=tmp_path_factory.mktemp("local")) as svc:
        yield svc


def rl_data(tok, texts, seed=0):
    """As tinker-cookbook builds them: zero arrays over the prompt, sampler logprobs and advantages after."""
    rng = np.random.default_rng(seed)
    out = []
    for i, text in enumerate(texts):
        ids = tok.encode(text)
        ob = 3
        n = len(ids) - 1
        lp = [0.0] * ob + list(-rng.uniform(2, 6, n - ob))
        adv = [0.0] * ob + [float(i % 2) - 0.5] * (n - ob)
        out.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={
                    "target_tokens": ids[1:],
                    "logprobs": np.asarray(lp, np.float32),
                    "advantages": np.asarray(adv, np.float32),
                },
            )
        )
    return out


def sampler_file(data_dir: Path, tinker_path: str) -> Path:
    run, kind, name = tinker_path[len("tinker://") :].split("/")
    return data_dir / "runs" / run / kind / name / "model.safetensors"


def assert_same_weights(a: Path, b: Path) -> None:
    wa, wb = load_file(a), load_file(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], rtol=1e-5, atol=1e-6, msg=k)


def test_capabilities_list_the_served_folder(service, tiny_model):
    models = {
        m.model_name
        for m in tinker.RestClient(base_url=service._base_url).get_server_capabilities().result().supported_models
    }
    assert {"smollm2-135m-instruct", tiny_model} <= models


def test_training_and_sampling_match_the_in_process_client(server, service, local, tiny_model, tmp_path):
    _, data_dir = server
    remote = service.create_lora_training_client(tiny_model, rank=RANK, seed=SEED).result()
    inproc = local.create_lora_training_client(tiny_model, rank=RANK, seed=SEED)
    info = remote.get_info()
    assert info.is_lora and info.lora_rank == RANK and info.model_data.tokenizer_id == str(Path(tiny_model).resolve())
    tok = remote.get_tokenizer()  # a local folder: loads offline
    assert tok.encode("one plus") == inproc.get_tokenizer().encode("one plus")

    for loss, data in [
        ("cross_entropy", sft_data(tok, TEXTS)),
        ("importance_sampling", rl_data(tok, TEXTS)),
        ("ppo", rl_data(tok, TEXTS, seed=1)),
    ]:
        fwd_r = remote.forward(data, loss).result()
        got = remote.forward_backward(data, loss).result()
        want = inproc.forward_backward(data, loss).result()
        assert got.metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-5)
        assert fwd_r.metrics["loss:sum"] == pytest.approx(want.metrics["loss:sum"], rel=1e-5)
        for g, w in zip(got.loss_fn_outputs, want.loss_fn_outputs, strict=True):
            np.testing.assert_allclose(g["logprobs"].to_numpy(), w["logprobs"].to_numpy(), rtol=1e-5, atol=1e-6)
        adam = types.AdamParams(learning_rate=1e-2)
        assert remote.optim_step(adam).result().metrics["grad_norm"] == pytest.approx(
            inproc.optim_step(adam).result().metrics["grad_norm"], rel=1e-4
        )

    # the same weights after three steps: each side's sampler folder, tensor by tensor
    path = remote.save_weights_for_sampler("after3").result().path
    assert path == f"tinker://{remote.model_id}/sampler_weights/after3"
    mine = inproc.save_weights_for_sampler("after3").result().path
    assert_same_weights(sampler_file(data_dir, path), Path(mine) / "model.safetensors")

    # samples and prompt logprobs from the snapshot equal the in-process sampler's
    prompt = types.ModelInput.from_ints(tok.encode("one plus two"))
    params = types.SamplingParams(max_tokens=6, seed=11, temperature=1.0)
    r_sampler = remote.save_weights_and_get_sampling_client().result()
    l_sampler = inproc.save_weights_and_get_sampling_client()
    got = r_sampler.sample(prompt, num_samples=3, sampling_params=params, include_prompt_logprobs=True).result()
    want = l_sampler.sample(prompt, num_samples=3, sampling_params=params, include_prompt_logprobs=True).result()
    assert [s.tokens for s in got.sequences] == [s.tokens for s in want.sequences]
    for g, w in zip(got.sequences, want.sequences, strict=True):
        np.testing.assert_allclose(g.logprobs, w.logprobs, rtol=1e-5, atol=1e-6)
        assert g.stop_reason == w.stop_reason and g.sequence_id  # the SDK stamps our sequence ids
    assert got.prompt_logprobs[0] is None
    np.testing.assert_allclose(got.prompt_logprobs[1:], want.prompt_logprobs[1:], rtol=1e-5)
    np.testing.assert_allclose(
        r_sampler.compute_logprobs(prompt).result()[1:], l_sampler.compute_logprobs(prompt).result()[1:], rtol=1e-5
    )
    # stop strings and tokens, greedy
    greedy = types.SamplingParams(max_tokens=8, temperature=0.0, stop=[tok.encode(" the")[0]])
    assert [s.tokens for s in r_sampler.sample(prompt, 1, greedy).result().sequences] == [
        s.tokens for s in l_sampler.sample(prompt, 1, greedy).result().sequences
    ]

    # a sampler over the saved folder samples what the snapshot samples
    from_path = service.create_sampling_client(model_path=path).result()
    assert [s.tokens for s in from_path.sample(prompt, 3, params).result().sequences] == [
        s.tokens for s in got.sequences
    ]
    inproc.close()


def test_forward_backward_custom_runs_through_the_sdk(service, local, tiny_model, server):
    """The SDK computes a custom loss client-side over forward + forward_backward: the same update."""
    _, data_dir = server
    remote = service.create_lora_training_client(tiny_model, rank=RANK, seed=SEED).result()
    inproc = local.create_lora_training_client(tiny_model, rank=RANK, seed=SEED)
    data = sft_data(remote.get_tokenizer(), TEXTS)

    def loss_fn(data, logprobs):
        loss = sum((lp.exp() * torch.arange(len(lp))).sum() for lp in logprobs) / 10
        return loss, {"custom": float(loss)}

    got = remote.forward_backward_custom(data, loss_fn).result()
    want = inproc.forward_backward_custom(data, loss_fn).result()
    assert got.metrics["custom"] == pytest.approx(want.metrics["custom"], rel=1e-5)
    remote.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    inproc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert_same_weights(
        sampler_file(data_dir, remote.save_weights_for_sampler("c").result().path),
        Path(inproc.save_weights_for_sampler("c").result().path) / "model.safetensors",
    )
    inproc.close()


def test_state_resumes_and_checkpoints_are_listed(service, tiny_model, server):
    remote = service.create_lora_training_client(tiny_model, rank=RANK, seed=SEED).result()
    data = sft_data(remote.get_tokenizer(), TEXTS)
    adam = types.AdamParams(learning_rate=1e-2)
    remote.forward_backward(data, "cross_entropy").result()
    remote.optim_step(adam).result()
    state = remote.save_state("s1").result().path
    assert state == f"tinker://{remote.model_id}/weights/s1"
    # the next step, from the original and from a resumed copy (weights + Adam moments): equal losses
    remote.forward_backward(data, "cross_entropy")
    remote.optim_step(adam)
    after = remote.forward(data, "cross_entropy").result().metrics["loss:sum"]
    resumed = service.create_training_client_from_state_with_optimizer(state).result()
    assert resumed.get_info().lora_rank == RANK
    resumed.forward_backward(data, "cross_entropy")
    resumed.optim_step(adam)
    assert resumed.forward(data, "cross_entropy").result().metrics["loss:sum"] == pytest.approx(after, rel=1e-5)
    # weights only: a fresh optimiser moves differently
    fresh = service.create_training_client_from_state(state).result()
    fresh.forward_backward(data, "cross_entropy")
    fresh.optim_step(adam)
    assert fresh.forward(data, "cross_entropy").result().metrics["loss:sum"] != pytest.approx(after, rel=1e-5)
    # load_state into an existing client puts it back at the checkpoint
    fresh.load_state(state).result()
    resumed.load_state_with_optimizer(state).result()
    rest = service.create_rest_client()
    listed = [c.tinker_path for c in rest.list_checkpoints(remote.model_id).result().checkpoints]
    assert listed == [state]
    assert rest.get_training_run(remote.model_id).result().last_checkpoint.tinker_path == state


def test_errors_reach_the_user_in_the_sdks_categories(service, tiny_model):
    remote = service.create_lora_training_client(tiny_model, rank=RANK, seed=SEED).result()
    tok = remote.get_tokenizer()
    with pytest.raises(tinker.RequestFailedError, match="unknown loss_fn 'nope'") as err:
        remote.forward_backward(sft_data(tok, TEXTS), "nope").result()
    assert err.value.category == types.RequestErrorCategory.User
    bad = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]), loss_fn_inputs={"target_tokens": [2, 3]})
    with pytest.raises(tinker.RequestFailedError, match="datum 0"):
        remote.forward_backward([bad], "cross_entropy").result()
    with pytest.raises(tinker.BadRequestError, match="no such checkpoint"):
        service.create_sampling_client(model_path="tinker://nope:train:0/sampler_weights/x").result()
    with pytest.raises(tinker.BadRequestError, match="plain name"):
        remote.save_state("../escape").result()
    # the client still works after its user errors
    assert remote.forward(sft_data(tok, TEXTS[:1]), "cross_entropy").result().metrics["loss:sum"] > 0
