"""SamplingClient against independent oracles: the rollout engine, full forwards, a fresh process."""

from __future__ import annotations

import asyncio
import json
import os
import pickle
import shutil
import subprocess
import sys
import threading

import pytest
import torch
from tinker import types
from transformers import AutoModelForCausalLM

from trinity_like.client import sampling as sampling_module
from trinity_like.client.sampling import SamplingClient, stop_conditions
from trinity_like.errors import TrinityError
from trinity_like.explorer.engine import NativeEngine, SamplingParams
from trinity_like.models.resolve import load_model, resolve_model_path

TEXT = "What is 23 + 5?"


@pytest.fixture(scope="module")
def base():
    """An independent copy of the base model (not the client's shared one) and its tokenizer."""
    return load_model(resolve_model_path("tiny-random"))


@pytest.fixture(scope="module")
def client():
    return SamplingClient("tiny-random")


@pytest.fixture(scope="module")
def ids(base):
    return base[1].encode(TEXT)


def params(**kw):
    return types.SamplingParams(**{"max_tokens": 12, "stop": [], "seed": 0, **kw})


def sample(client, ids, n=1, **kw):
    return client.sample(types.ModelInput.from_ints(ids), n, params(**kw)).result(timeout=60)


def full_logprobs(model, tokens, temperature=1.0):
    """log p(tokens[i] | tokens[:i]) for i >= 1 by one full forward, float32."""
    with torch.no_grad():
        logits_TV = model(torch.tensor([tokens])).logits[0, :-1].float()
    return torch.log_softmax(logits_TV / temperature, -1).gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]


def close(values, expected_T):
    return torch.allclose(torch.tensor(values, dtype=torch.float32), expected_T, atol=1e-4)


def perturbed(model, seed):
    """The model's weights plus noise; the tied output embedding stays equal to the input one."""
    gen = torch.Generator().manual_seed(seed)
    weights = {k: v + 0.5 * torch.randn(v.shape, generator=gen) for k, v in model.state_dict().items()}
    return {**weights, "lm_head.weight": weights["model.embed_tokens.weight"]}


def test_greedy_equals_the_engine_and_runs_to_max_tokens_without_stops(client, base, ids):
    model, tok = base
    greedy = SamplingParams(greedy=True, max_new_tokens=12, stop_token_ids=())
    expected = NativeEngine(model, tok).generate([ids], greedy)
    (seq,) = sample(client, ids, temperature=0.0).sequences
    assert seq.tokens == expected[0][0].token_ids and len(seq.tokens) == 12 and seq.stop_reason == "length"
    assert isinstance(seq.sequence_id, str) and client.get_base_model() == "tiny-random"


def test_sampled_logprobs_equal_a_full_forward_recompute(client, base, ids):
    model, _ = base
    result = sample(client, ids, n=4, seed=3)
    assert len(result.sequences) == 4 and result.prompt_logprobs is None
    for seq in result.sequences:
        expected = full_logprobs(model, ids + seq.tokens)[len(ids) - 1 :]
        assert close(seq.logprobs, expected)
    for seq in sample(client, ids, n=2, seed=3, temperature=0.7).sequences:  # the distribution sampled from
        assert close(seq.logprobs, full_logprobs(model, ids + seq.tokens, temperature=0.7)[len(ids) - 1 :])


def test_seeds_reproduce_and_no_seed_draws_fresh(client, ids):
    def tokens(result):
        return [s.tokens for s in result.sequences]

    assert tokens(sample(client, ids, n=3, seed=7)) == tokens(sample(client, ids, n=3, seed=7))
    assert tokens(sample(client, ids, n=3, seed=7)) != tokens(sample(client, ids, n=3, seed=8))
    assert tokens(sample(client, ids, n=3, seed=None)) != tokens(sample(client, ids, n=3, seed=None))


def test_stop_token_ids_and_strings_stop_with_the_stopping_token_kept(client, base, ids):
    tok = base[1]
    free = sample(client, ids, temperature=0.0, max_tokens=20).sequences[0].tokens
    k = next(i for i in range(3, 20) if free[i] not in free[:i])
    (seq,) = sample(client, ids, temperature=0.0, max_tokens=20, stop=[free[k]]).sequences
    assert seq.tokens == free[: k + 1] and seq.stop_reason == "stop"
    text = next(t for t in (tok.decode([x]).strip() for x in free[3:]) if t.isascii() and t.isalnum())
    first = next(i for i in range(20) if text in tok.decode(free[: i + 1]))  # oracle: first completing token
    (seq,) = sample(client, ids, temperature=0.0, max_tokens=20, stop=text).sequences
    assert seq.tokens == free[: first + 1] and seq.stop_reason == ("stop" if first < 19 else "length")


def test_stop_semantics_follow_tinker():
    assert stop_conditions(None, (2,)) == ((2,), ())  # the model's EOS
    assert stop_conditions([], (2,)) == ((), ())  # nothing, EOS included
    assert stop_conditions([5, 1], (2,)) == ((1, 2, 5), ())  # ids as well as EOS
    assert stop_conditions("ab", (2,)) == ((2,), ("ab",))
    with pytest.raises(ValueError, match="not a mix"):
        stop_conditions(["a", 3], (2,))


def test_compute_logprobs_and_prompt_logprobs_equal_a_manual_forward(client, base, ids):
    expected = full_logprobs(base[0], ids)
    logprobs = client.compute_logprobs(types.ModelInput.from_ints(ids)).result(timeout=60)
    assert logprobs[0] is None and len(logprobs) == len(ids)
    assert close(logprobs[1:], expected)
    result = client.sample(types.ModelInput.from_ints(ids), 1, params(), include_prompt_logprobs=True).result()
    assert result.prompt_logprobs[0] is None and close(result.prompt_logprobs[1:], expected)
    last = client.compute_logprobs(types.ModelInput.from_ints(ids), prompt_logprobs_last_n=2).result()
    assert last[:-2] == [None] * (len(ids) - 2) and last[-2:] == logprobs[-2:]
    prompt = types.ModelInput.from_ints(ids)
    result = client.sample(prompt, 1, params(), include_prompt_logprobs=True, prompt_logprobs_last_n=2).result()
    assert result.prompt_logprobs == last
    assert asyncio.run(client.compute_logprobs_async(types.ModelInput.from_ints(ids))) == logprobs


def test_in_memory_weights_are_each_clients_own(client, base, ids):
    model, _ = base
    w1, w2 = perturbed(model, 1), perturbed(model, 2)
    one = SamplingClient("tiny-random", weights=w1, version=1)
    two = SamplingClient("tiny-random", weights=w2, version=2)
    reference = model.__class__(model.config).eval()
    prompt = types.ModelInput.from_ints(ids)
    before = sample(client, ids, temperature=0.0).sequences[0].tokens
    for weights, c in [(w1, one), (w2, two), (w1, one)]:  # switching back and forth
        reference.load_state_dict(weights)
        assert close(c.compute_logprobs(prompt).result()[1:], full_logprobs(reference, ids))
        seq = sample(c, ids, seed=4).sequences[0]
        assert close(seq.logprobs, full_logprobs(reference, ids + seq.tokens)[len(ids) - 1 :])
    assert sample(one, ids, temperature=0.0).sequences[0].tokens != before
    assert sample(client, ids, temperature=0.0).sequences[0].tokens == before  # the base is back


def test_the_base_after_weights_with_their_own_output_layer(client, base, ids):
    """Merged LoRA weights that trained the tied output layer untie the shared engine's model;
    the base's weights after them (safetensors: the shared matrix once) tie it again."""
    model, _ = base
    prompt = types.ModelInput.from_ints(ids)
    before = client.compute_logprobs(prompt).result()[1:]
    untied = {**perturbed(model, 3), "lm_head.weight": model.state_dict()["lm_head.weight"] + 0.5}
    reference = model.__class__(model.config).eval()
    reference.lm_head.weight = torch.nn.Parameter(reference.lm_head.weight.detach().clone())
    reference.load_state_dict(untied)
    own = SamplingClient("tiny-random", weights=untied, version=1)
    assert close(own.compute_logprobs(prompt).result()[1:], full_logprobs(reference, ids))
    assert close(client.compute_logprobs(prompt).result()[1:], torch.tensor(before))  # failed: missing lm_head
    engine = client._engine().model
    assert engine.get_output_embeddings().weight is engine.get_input_embeddings().weight
    assert close(own.compute_logprobs(prompt).result()[1:], full_logprobs(reference, ids))  # and back


def test_a_pickled_client_samples_the_same_in_another_process(base, ids, tmp_path):
    original = SamplingClient("tiny-random", weights=perturbed(base[0], 3))
    (tmp_path / "client.pkl").write_bytes(pickle.dumps(original))
    try:
        script = (
            "import json, pickle, sys; from tinker import types\n"
            "c = pickle.loads(open(sys.argv[1], 'rb').read())\n"
            "p = types.SamplingParams(max_tokens=12, stop=[], seed=5)\n"
            "r = c.sample(types.ModelInput.from_ints(json.loads(sys.argv[2])), 2, p).result()\n"
            "print(json.dumps([s.tokens for s in r.sequences]))\n"
        )
        env = {**os.environ, "RAY_AUTH_MODE": "disabled", "HF_HUB_OFFLINE": "1"}
        out = subprocess.run(
            [sys.executable, "-c", script, str(tmp_path / "client.pkl"), json.dumps(ids)],
            capture_output=True, text=True, env=env, timeout=300, check=True,
        )  # fmt: skip
        here = [s.tokens for s in sample(original, ids, n=2, seed=5).sequences]
        assert json.loads(out.stdout.strip().splitlines()[-1]) == here
    finally:
        shutil.rmtree(original.model_path, ignore_errors=True)


def test_model_path_folder_samples_its_weights(base, ids, tmp_path):
    model, _ = base
    weights = perturbed(model, 6)
    in_memory = SamplingClient("tiny-random", weights=weights)
    folder = in_memory.save_weights(tmp_path / "m")
    assert (
        AutoModelForCausalLM.from_pretrained(folder)
        .state_dict()["model.norm.weight"]
        .equal(weights["model.norm.weight"])
    )
    from_folder = sample(SamplingClient("tiny-random", model_path=folder), ids, seed=9).sequences[0]
    assert from_folder.tokens == sample(in_memory, ids, seed=9).sequences[0].tokens
    assert sample(SamplingClient(folder, model_path=folder), ids, seed=9).sequences[0].tokens == from_folder.tokens


def test_bad_weights_fail_in_their_result_and_leave_the_shared_engine_usable(client, base, ids):
    before = sample(client, ids, temperature=0.0).sequences[0].tokens
    half = dict(list(perturbed(base[0], 7).items())[:3])
    wrong = {**perturbed(base[0], 7), "model.norm.weight": torch.ones(3)}
    shape = r"weights\['model.norm.weight'\] has shape \(3,\)"
    for weights, error, message in [(half, TrinityError, "missing"), (wrong, ValueError, shape)]:
        with pytest.raises(error, match=message):
            sample(SamplingClient("tiny-random", weights=weights), ids)
        assert sample(client, ids, temperature=0.0).sequences[0].tokens == before
    with pytest.raises(ValueError, match="not both"):
        SamplingClient("tiny-random", weights=half, model_path=resolve_model_path("tiny-random"))


def test_sample_async_and_await(client, ids):
    prompt = types.ModelInput.from_ints(ids)
    direct = [s.tokens for s in client.sample(prompt, 2, params()).result().sequences]

    async def main():
        awaited = await client.sample(prompt, 2, params())
        deprecated = await client.sample_async(prompt, 2, params())
        return [[s.tokens for s in r.sequences] for r in (awaited, deprecated)]

    assert asyncio.run(main()) == [direct, direct]


def test_a_sampler_is_its_own_future_like_the_sdks_transitional_one(client):
    """SDK 0.38 code writes ``training.save_weights_and_get_sampling_client().result()`` or awaits it."""

    async def awaited():
        return await client

    assert client.result() is client and client.result(timeout=1.0) is client
    assert asyncio.run(awaited()) is client


@pytest.mark.parametrize(
    ("prompt", "n", "kw", "message"),
    [
        (types.ModelInput.empty(), 1, {}, "prompt is empty"),
        (None, 0, {}, "num_samples must be >= 1"),
        (types.ModelInput(chunks=[types.ImageChunk(data=b"x", format="png")]), 1, {}, "chunk 0 is of type 'image'"),
        (None, 1, {"temperature": -1.0}, "temperature must be >= 0"),
        # below 1e-5, logits / temperature overflow to inf and the sampled id to the vocabulary's end
        (None, 1, {"temperature": 1e-257}, r"temperature must be >= 0 \(0 is greedy; others finite and >= 1e-05\)"),
        (None, 1, {"temperature": float("inf")}, r"others finite and >= 1e-05\), got inf"),
        (None, 1, {"top_p": 9e-202}, r"top_p must be in \(0, 1\] and >= 1e-05, got 9e-202"),  # 0 in float32
        (
            types.ModelInput.from_ints([5] * 1100),
            1,
            {},
            "prompt has 1100 tokens, more than the model's context of 1024",
        ),
        (None, 1, {"max_tokens": None}, "max_tokens is required"),
        (None, 1, {"max_tokens": 5000}, "exceed the model's context of 1024"),
        (None, 1, {"top_p": 0.0}, "top_p must be in"),
        (None, 1, {"top_k": -3}, "top_k must be -1"),
        (types.ModelInput.from_ints([1, 99999]), 1, {}, "token 99999 is outside"),
    ],
)
def test_bad_requests_fail_in_their_result_and_the_client_stays_usable(client, ids, prompt, n, kw, message):
    future = client.sample(prompt or types.ModelInput.from_ints(ids), n, params(**kw))
    with pytest.raises(ValueError, match=message):
        future.result(timeout=60)
    assert len(sample(client, ids).sequences[0].tokens) == 12


@pytest.mark.parametrize(
    "kw",
    [
        {"topk_prompt_logprobs": 3},
        {"topk_sample_logprobs": 2},
        {"prompt_alt_tokens_k": 4},
        {"prompt_logprobs_last_n": 2},  # without include_prompt_logprobs, as the SDK refuses
    ],
)
def test_unsupported_options_fail_at_call_time_by_name(client, ids, kw):
    with pytest.raises(ValueError, match=next(iter(kw))):
        client.sample(types.ModelInput.from_ints(ids), 1, params(), **kw)


def test_requests_waiting_together_share_one_engine_run_and_get_their_solo_samples(client, ids, monkeypatch):
    """Tinker code sends one sample() per prompt: queued together they decode as one batch,
    and each still gets exactly the samples it gets alone (its own seeds)."""
    prompts = [types.ModelInput.from_ints(ids[: 3 + i]) for i in range(4)]
    alone = [client.sample(p, 3, params(seed=7 + i)).result(timeout=60) for i, p in enumerate(prompts)]
    runs, started, gate = [], threading.Event(), threading.Event()
    real_run = NativeEngine.run
    monkeypatch.setattr(NativeEngine, "run", lambda self, r, s: runs.append(len(r)) or real_run(self, r, s))
    blocker = sampling_module._queue().submit(None, lambda jobs: [started.set() or gate.wait(10)])
    assert started.wait(10)  # the worker is busy: every request below waits in the queue
    futures = [client.sample(p, 3, params(seed=7 + i)) for i, p in enumerate(prompts)]
    gate.set()
    together = [f.result(timeout=60) for f in futures]
    assert blocker.result(timeout=10) is True and runs == [4]
    for a, b in zip(alone, together, strict=True):
        assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
        for x, y in zip(a.sequences, b.sequences, strict=True):
            assert x.logprobs == pytest.approx(y.logprobs, abs=1e-4)  # batched fp32 rounding
