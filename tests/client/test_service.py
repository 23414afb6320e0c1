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


def one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message, message
    return message


def test_a_future_or_a_response_in_place_of_a_path_is_one_line_saying_what_to_pass(service):
    """The SDK takes the path string only (its requests reject a future: the oracle below);
    here every call that takes a path says in one line what to pass instead."""
    from concurrent.futures import Future

    import pydantic
    from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

    with pytest.raises(pydantic.ValidationError):  # what the SDK builds from load_state(path)
        types.LoadWeightsRequest(path=AwaitableConcurrentFuture(Future()), model_id="m", seq_id=1, optimizer=False)

    training = service.create_lora_training_client("tiny-random", rank=2, seed=0)
    state = training.save_state("s")
    sampler_weights = training.save_weights_for_sampler("w")
    from_state = (
        service.create_training_client_from_state,
        service.create_training_client_from_state_with_optimizer,
        training.load_state,
        training.load_state_with_optimizer,
    )
    for call in from_state:
        with pytest.raises(TypeError) as exc:
            call(state)
        assert one_line(exc) == (
            f"{call.__name__}: path must be the checkpoint's path (a str), got a future "
            "(AwaitableConcurrentFuture); pass save_state(...).result().path"
        )
        with pytest.raises(TypeError, match=r"got a SaveWeightsResponse \(its \.path is the path\)") as exc:
            call(state.result(timeout=60))
        one_line(exc)
    for call in (service.create_sampling_client, training.create_sampling_client):
        with pytest.raises(TypeError, match=r"^create_sampling_client: .* pass save_weights_for_sampler\(\.\.\.\)"):
            call(sampler_weights)
        with pytest.raises(ValueError, match="is a save_state checkpoint .* save_weights_for_sampler") as exc:
            call(state.result().path)  # training state, not weights a sampler reads
        one_line(exc)

    path = state.result().path  # what to pass: the path, as a str or a Path
    training.load_state(path).result(timeout=60)
    training.load_state_with_optimizer(Path(path)).result(timeout=60)
    assert service.create_training_client_from_state(path).get_info().is_lora
    service.create_sampling_client(model_path=sampler_weights.result().path)


def test_run_folders_are_named_by_base_model_and_time_or_by_run_name(tmp_path):
    """Default: ``<base>-<YYYYmmdd-HHMMSS>`` (``-2``, ... when taken), sorted by creation;
    ``run_name``: that folder, so another process finds a checkpoint without being told."""
    import re
    import subprocess
    import sys
    import time

    with tinker.ServiceClient(log_dir=tmp_path) as service:
        before = time.strftime("%Y%m%d-%H%M%S")
        names = [service.create_lora_training_client("tiny-random", rank=0).model_id for _ in range(3)]
        after = time.strftime("%Y%m%d-%H%M%S")
    order = []
    for name in names:
        match = re.fullmatch(r"tiny-random-(\d{8}-\d{6})(?:-(\d+))?", name)
        assert match and before <= match.group(1) <= after, name
        order.append((match.group(1), int(match.group(2) or 1)))
    assert len(set(names)) == 3 and sorted(order) == order  # (time, n): the order they were made in
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(names)  # claimed at creation

    script = f"""
import trinity_like.client as tinker
types = tinker.types
with tinker.ServiceClient(log_dir={str(tmp_path)!r}) as service:
    for run_name in ("mult", None):
        training = service.create_lora_training_client("tiny-random", rank=0, seed=0, run_name=run_name)
        ids = training.get_tokenizer().encode("two times three is six")
        datum = types.Datum(model_input=types.ModelInput.from_ints(ids[:-1]),
                            loss_fn_inputs={{"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)}})
        training.forward_backward([datum], "cross_entropy")
        training.optim_step(types.AdamParams(learning_rate=1e-2))
        training.save_state("final").result()
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    named = tmp_path / "mult" / "state" / "final"  # known before the other process ran
    newest = sorted(tmp_path.glob("tiny-random-*/state/final"))[-1]  # the documented way to find the newest
    from safetensors.torch import load_file

    assert newest.parent.parent.name not in names  # the other process's run, not one of the three above
    with tinker.ServiceClient(log_dir=tmp_path) as service:
        base = service.create_lora_training_client("tiny-random", rank=0)._engine.state_dict()
        for path in (named, newest):
            saved = load_file(path / "model.safetensors")
            resumed = service.create_training_client_from_state_with_optimizer(str(path))._engine.state_dict()
            assert all(torch.equal(resumed[k], saved[k]) for k in saved)
            assert not all(torch.equal(base[k], saved[k]) for k in saved)  # the trained weights, not the base
