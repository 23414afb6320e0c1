"""ServiceClient: clients over the built-in tiny model, the sampler and the learner agreeing,
checkpoints that resume exactly, and call-time errors."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest
import torch

import trinity_like.client as tinker
from trinity_like.errors import TrinityError

types = tinker.types


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    with tinker.ServiceClient(log_dir=tmp_path_factory.mktemp("client")) as s:
        yield s


def sft_data(tokenizer, texts):
    data = []
    for text in texts:
        ids = tokenizer.encode(text)
        data.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
            )
        )
    return data


def test_capabilities_list_the_built_in_models(service):
    models = {m.model_name: m for m in service.get_server_capabilities().supported_models}
    assert {"smollm2-135m-instruct", "tiny-random"} <= set(models)
    assert models["tiny-random"].max_context_length > 0 and models["tiny-random"].trainable


@pytest.mark.parametrize("rank", [0, 4])
def test_sampler_logprobs_equal_the_learners_for_the_same_weights_and_tokens(service, rank):
    """What the sampler reports for its own tokens is what the learner computes: an
    importance ratio of exactly 1 on-policy (fp32, to 1e-4). With LoRA the sampler gets the
    merged weights -- a trained lm_head of this tied model included (it is untied for that)."""
    training = service.create_lora_training_client("tiny-random", rank=rank, seed=0)
    tok = training.get_tokenizer()
    training.forward_backward(sft_data(tok, ["one two three", "four five"]), "cross_entropy")
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=60)  # weights != base
    sampler = training.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints(tok.encode("What is 2 + 3?"))
    seqs = sampler.sample(prompt, 4, types.SamplingParams(max_tokens=8, seed=3, stop=[])).result(timeout=60).sequences
    ob = prompt.length - 1
    data = [
        types.Datum(
            model_input=prompt.append(types.EncodedTextChunk(tokens=s.tokens[:-1])),
            loss_fn_inputs={"target_tokens": [0] * ob + s.tokens, "weights": [0.0] * ob + [1.0] * 8},
        )
        for s in seqs
    ]
    learner = training.forward(data, "cross_entropy").result(timeout=60).loss_fn_outputs
    for seq, out in zip(seqs, learner, strict=True):
        torch.testing.assert_close(out["logprobs"].to_torch()[ob:], torch.tensor(seq.logprobs), atol=1e-4, rtol=0)


@pytest.mark.parametrize("rank", [0, 4])
def test_save_state_and_load_state_with_optimizer_resume_exactly(service, tmp_path, rank):
    training = service.create_lora_training_client("tiny-random", rank=rank, seed=0)
    data = sft_data(training.get_tokenizer(), ["a b c d", "e f g"])
    adam = types.AdamParams(learning_rate=1e-3)

    def step(client):
        client.forward_backward(data, "cross_entropy")
        client.optim_step(adam).result(timeout=60)

    step(training)
    path = training.save_state("after-1").result(timeout=60).path
    step(training)
    resumed = service.create_training_client_from_state_with_optimizer(path)
    step(resumed)
    ours, theirs = training._engine.state_dict(), resumed._engine.state_dict()
    assert all(torch.equal(ours[k], theirs[k]) for k in ours)
    weights_only = service.create_training_client_from_state(path)
    step(weights_only)  # a fresh optimiser: the same data takes a different step
    assert not all(torch.equal(ours[k], weights_only._engine.state_dict()[k]) for k in ours)
    with pytest.raises(FileExistsError, match="overwrite=True"):
        training.save_state("after-1").result(timeout=60)
    saved = {f.name for f in Path(path).iterdir()}
    assert not any(name.endswith((".pt", ".bin", ".pkl")) for name in saved)  # safetensors and JSON only
    assert ("adapter_model.safetensors" in saved) == (rank > 0) and "optimizer.safetensors" in saved


def test_save_weights_for_sampler_is_a_folder_a_sampler_and_a_pickle_read(service):
    training = service.create_lora_training_client("tiny-random", rank=0, seed=1)
    path = training.save_weights_for_sampler("w").result(timeout=60).path
    prompt = types.ModelInput.from_ints([1, 2, 3])
    greedy = types.SamplingParams(max_tokens=5, temperature=0.0, stop=[])
    a = service.create_sampling_client(model_path=path).sample(prompt, 1, greedy).result(timeout=60)
    clone = pickle.loads(pickle.dumps(training.save_weights_and_get_sampling_client()))
    b = clone.sample(prompt, 1, greedy).result(timeout=60)
    assert a.sequences[0].tokens == b.sequences[0].tokens


def test_call_time_errors_are_clear(service):
    with pytest.raises(ValueError, match="Either model_path or base_model"):
        service.create_sampling_client()
    with pytest.raises(TrinityError, match="model 'no-such-model' not found.*tiny-random"):
        service.create_lora_training_client("no-such-model")
    with pytest.raises(ValueError, match="in-process"):
        tinker.ServiceClient(base_url="http://example.invalid")
    with pytest.raises(ValueError, match="rank must be >= 0"):
        service.create_lora_training_client("tiny-random", rank=-1)
