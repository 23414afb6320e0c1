"""The TrainingClient against independent oracles: a plain full forward of a copy of the
model, hand-written losses and torch's own AdamW; errors named by datum and key."""

from __future__ import annotations

import copy

import pytest
import torch
from tinker import types

from trinity_like.client.data import DataError
from trinity_like.client.training import TrainingClient
from trinity_like.errors import ConfigError
from trinity_like.models.tiny import build_tiny_model
from trinity_like.plugins import load_plugins
from trinity_like.trainer.local_engine import LocalEngine
from trinity_like.trainer.params import ModelParams, OptimParams

load_plugins()


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=5))


@pytest.fixture
def client(tiny_path, tmp_path):
    engine = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=2), OptimParams())
    c = TrainingClient(engine, base_model=tiny_path, model_id="t", run_dir=tmp_path / "run", lora=None, tokenizer=None)
    yield c
    c.close()


def rl_datum(prompt, sampled, sampler_lp, advantage) -> types.Datum:
    """As tinker-cookbook's rl_loop builds it: target 0 and zeros over the prompt positions."""
    ob = len(prompt) - 1
    tokens = prompt + sampled[:-1]
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens),
        loss_fn_inputs={
            "target_tokens": [0] * ob + sampled,
            "logprobs": [0.0] * ob + sampler_lp,
            "advantages": [0.0] * ob + [advantage] * len(sampled),
        },
    )


def sft_datum(tokens, weights) -> types.Datum:
    return types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )


def oracle_logprobs(model, datum: types.Datum) -> torch.Tensor:
    """log p(target_i | x_0..x_i) from one plain forward of the datum alone, float64 softmax."""
    ids = torch.tensor([datum.model_input.to_ints()])
    logits = model(input_ids=ids).logits[0].double()
    target = datum.loss_fn_inputs["target_tokens"].to_torch().long()
    return torch.log_softmax(logits, -1).gather(-1, target[:, None])[:, 0]


def assert_close_by_norm(ours: torch.Tensor, theirs: torch.Tensor, name: str, rel: float = 1e-4) -> None:
    """fp32 against a float64 oracle: the difference is rounding, small against the whole tensor."""
    diff, size = float((ours.double() - theirs.double()).norm()), float(theirs.double().norm())
    assert diff <= rel * size + 1e-9, f"{name}: |diff| {diff:.3g} vs |grad| {size:.3g}"


def grads_of(client) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in client._engine.model.named_parameters() if p.grad is not None}


DATA = [
    sft_datum([3, 17, 40, 8, 99, 12], [0, 0, 1, 1, 1]),
    sft_datum([5, 6, 7], [1, 0.5]),
    sft_datum([9, 10, 11, 12, 13, 14, 15, 16], [0, 0, 0, 1, 1, 1, 1]),
]


def test_cross_entropy_loss_logprobs_and_gradient_equal_a_plain_forward(client):
    oracle = copy.deepcopy(client._engine.model).double()
    out = client.forward_backward(DATA, "cross_entropy").result(timeout=60)
    loss = 0
    scored = client.forward(DATA, "cross_entropy").result(timeout=60).loss_fn_outputs
    for datum, record, full in zip(DATA, out.loss_fn_outputs, scored, strict=True):
        lp = oracle_logprobs(oracle, datum)
        torch.testing.assert_close(full["logprobs"].to_torch().double(), lp, atol=1e-5, rtol=1e-5)
        # forward_backward leaves out the positions before the first one with loss (0.0 there)
        start = int(torch.nonzero(datum.loss_fn_inputs["weights"].to_torch())[0])
        got = record["logprobs"].to_torch().double()
        assert torch.all(got[:start] == 0)
        torch.testing.assert_close(got[start:], lp[start:], atol=1e-5, rtol=1e-5)
        loss = loss - (lp * datum.loss_fn_inputs["weights"].to_torch().double()).sum()
    assert out.metrics["loss:sum"] == pytest.approx(float(loss.detach()), rel=1e-5)
    loss.backward()
    ours = grads_of(client)
    for name, param in oracle.named_parameters():
        if param.grad is not None and name in ours:
            assert_close_by_norm(ours[name], param.grad, name)


def test_optim_step_is_torch_adamw_at_the_given_params(client):
    reference = copy.deepcopy(client._engine.model)
    start = [p.detach().clone() for p in reference.parameters()]
    adam = types.AdamParams(learning_rate=1e-2, beta1=0.8, beta2=0.9, eps=1e-6, weight_decay=0.1)
    fwd = client.forward_backward(DATA, "cross_entropy")
    opt = client.optim_step(adam)  # submitted before fwd is read: requests run in call order
    fwd.result(timeout=60)
    assert opt.result(timeout=60).metrics["learning_rate"] == pytest.approx(1e-2)
    torch_opt = torch.optim.AdamW(reference.parameters(), lr=1e-2, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.1)
    ids = [
        (d.model_input.to_ints(), d.loss_fn_inputs["target_tokens"].to_torch(), d.loss_fn_inputs["weights"].to_torch())
        for d in DATA
    ]
    loss = sum(
        -(
            torch.log_softmax(reference(input_ids=torch.tensor([x])).logits[0], -1).gather(-1, t[:, None])[:, 0] * w
        ).sum()
        for x, t, w in ids
    )
    loss.backward()
    torch_opt.step()
    # Adam's first step is about lr * sign(grad): entries whose grad is rounding noise may
    # step either way, so the weights are compared by norm against the size of the update.
    diff = torch.cat(
        [(a - b).detach().flatten() for a, b in zip(client._engine.model.parameters(), reference.parameters())]
    )
    update = torch.cat([(b.detach() - a).flatten() for a, b in zip(start, reference.parameters())])
    assert float(update.norm()) > 1e-2 and float(diff.norm()) < 1e-3 * float(update.norm())


def test_importance_sampling_on_cookbook_datums_and_a_custom_loss_written_as_it(client):
    data = [rl_datum([4, 5, 6], [7, 8, 9], [-1.0, -2.0, -0.5], 1.0), rl_datum([4, 5], [10, 2], [-3.0, -0.1], -0.5)]
    oracle = copy.deepcopy(client._engine.model).double()
    out = client.forward_backward(data, "importance_sampling").result(timeout=60)
    expected = 0
    for datum in data:
        lp = oracle_logprobs(oracle, datum)
        old = datum.loss_fn_inputs["logprobs"].to_torch().double()
        adv = datum.loss_fn_inputs["advantages"].to_torch().double()
        expected = expected - (torch.exp(lp - old) * adv).sum()
    assert out.metrics["loss:sum"] == pytest.approx(float(expected), rel=1e-5)
    assert "kl_sample_train_k1:mean" in out.metrics and "entropy:mean" in out.metrics
    builtin = grads_of(client)
    client._engine.zero_grad()

    def custom_is(batch, logprobs_list):
        loss = 0
        for datum, lp in zip(batch, logprobs_list, strict=True):
            old, adv = datum.loss_fn_inputs["logprobs"].to_torch(), datum.loss_fn_inputs["advantages"].to_torch()
            loss = loss - (torch.exp(lp - old) * adv).sum()
        return loss, {"custom": 1.0}

    custom = client.forward_backward_custom(data, custom_is).result(timeout=60)
    assert custom.metrics["loss:sum"] == pytest.approx(out.metrics["loss:sum"], rel=1e-5)
    assert custom.metrics["custom"] == 1.0
    for name, grad in grads_of(client).items():
        assert_close_by_norm(grad, builtin[name], name)


def test_forward_accumulates_no_gradient(client):
    out = client.forward(DATA, "cross_entropy").result(timeout=60)
    assert out.metrics["loss:sum"] > 0 and not grads_of(client)


@pytest.mark.parametrize(
    ("data", "loss", "error", "match"),
    [
        ([], "cross_entropy", DataError, "data is empty"),
        (
            [sft_datum([1, 2, 3], [1.0])],
            "cross_entropy",
            DataError,
            r"datum 0: loss_fn_inputs\['weights'\] has shape \[1\]",
        ),
        (
            [
                DATA[0],
                types.Datum(model_input=types.ModelInput.from_ints([1, 2]), loss_fn_inputs={"target_tokens": [2, 3]}),
            ],
            "cross_entropy",
            DataError,
            "datum 1: loss_fn_inputs has no 'weights'",
        ),
        (
            [
                types.Datum(
                    model_input=types.ModelInput.from_ints([1, 2]),
                    loss_fn_inputs={"target_tokens": [2, 3], "weights": [1.0, 1.0], "advantages": [1.0, 1.0]},
                )
            ],
            "cross_entropy",
            DataError,
            "datum 0: loss_fn_inputs key 'advantages' is not an input",
        ),
        (
            [
                types.Datum(
                    model_input=types.ModelInput.from_ints([1, 2]),
                    loss_fn_inputs={"target_tokens": torch.tensor([2.0, 3.0]), "weights": [1.0, 1.0]},
                )
            ],
            "cross_entropy",
            DataError,
            r"datum 0: loss_fn_inputs\['target_tokens'\] must hold integers",
        ),
        (DATA, "no_such_loss", ConfigError, "unknown loss_fn 'no_such_loss'.*cross_entropy.*registered"),
        # what the engine could not survive: refused before it runs (the server's door runs the same check)
        (
            [DATA[0], sft_datum([1, 2, 3], [1.0, float("nan")])],
            "cross_entropy",
            DataError,
            r"^datum 1: loss_fn_inputs\['weights'\] holds nan at position 1 \(every value must be finite\)$",
        ),
        (
            [rl_datum([5, 6], [7, 8], [-1.0, -1.0], float("inf"))],
            "importance_sampling",
            DataError,
            r"^datum 0: loss_fn_inputs\['advantages'\] holds inf at position 1 ",
        ),
        (
            [sft_datum([1, 10**6, 3], [1.0, 1.0])],
            "cross_entropy",
            DataError,
            r"^datum 0: model_input: token 1000000 is outside the model's vocabulary of \d+ \(ids 0\.\.\d+\), "
            r"at position 1$",
        ),
        (
            [sft_datum([1, 2, -3], [1.0, 1.0])],
            "cross_entropy",
            DataError,
            r"^datum 0: loss_fn_inputs\['target_tokens'\]: token -3 is outside .* at position 1$",
        ),
        (
            [sft_datum(list(range(1, 100)) * 11, [1.0] * 1088)],
            "cross_entropy",
            DataError,
            r"^datum 0: model_input has 1088 tokens, more than the model's context of 1024 \(max_position_embeddings\)$",
        ),
    ],
)
def test_bad_input_is_one_clear_error_from_result_and_the_client_stays_usable(client, data, loss, error, match):
    future = client.forward_backward(data, loss)
    with pytest.raises(error, match=match):
        future.result(timeout=60)
    assert client.forward_backward(DATA, "cross_entropy").result(timeout=60).metrics["loss:sum"] > 0


def test_optim_step_rejects_what_is_not_adam_params_at_call_time(client):
    with pytest.raises(TypeError, match="AdamParams"):
        client.optim_step({"learning_rate": 1e-4})
    for field in ("learning_rate", "beta1", "eps"):
        with pytest.raises(ValueError, match=rf"^AdamParams\.{field} must be finite, got nan$"):
            client.optim_step(types.AdamParams(learning_rate=1e-4).model_copy(update={field: float("nan")}))


def test_a_datum_of_exactly_the_context_trains_and_one_more_token_is_refused(client):
    """The longest datum the model takes (1024 tokens) trains; its logprobs equal a plain forward's."""
    tokens = [(7 * i) % 300 + 1 for i in range(1025)]
    datum = sft_datum(tokens, [1.0] * 1024)
    out = client.forward([datum], "cross_entropy").result(timeout=120)
    with torch.no_grad():
        want = oracle_logprobs(copy.deepcopy(client._engine.model).double(), datum)
    torch.testing.assert_close(out.loss_fn_outputs[0]["logprobs"].to_torch().double(), want, atol=1e-4, rtol=1e-4)
    with pytest.raises(DataError, match="model_input has 1025 tokens"):
        client.forward([sft_datum([*tokens, 5], [1.0] * 1025)], "cross_entropy").result(timeout=120)


def test_a_custom_loss_sees_every_position_of_every_datum_as_given(client):
    """``logprobs_list[i]``: float32 ``[T_i]``, position t = log p(target_tokens[t] | x_0..x_t),
    prompt positions included (none is left at 0.0); the datums come with every key they hold."""
    data = [rl_datum([4, 5, 6], [7, 8, 9], [-1.0, -2.0, -0.5], 1.0), rl_datum([4, 5], [10, 2], [-3.0, -0.1], -0.5)]
    oracle = copy.deepcopy(client._engine.model).double()
    seen = []

    def record(batch, logprobs_list):
        seen.append((batch, logprobs_list))
        return sum(lp.sum() for lp in logprobs_list), {}

    client.forward_backward_custom(data, record).result(timeout=60)
    batch, logprobs_list = seen[0]
    assert batch == data  # the datums as given, extra keys (logprobs, advantages) included
    for datum, lp in zip(data, logprobs_list, strict=True):
        assert lp.dtype == torch.float32 and lp.shape == (datum.model_input.length,) and lp.requires_grad
        torch.testing.assert_close(lp.detach().double(), oracle_logprobs(oracle, datum), atol=1e-5, rtol=1e-5)


def nan_grad(batch, logprobs_list):
    return sum(torch.sqrt(lp - lp.detach()).sum() for lp in logprobs_list), {}  # value 0, gradient inf


@pytest.mark.parametrize(
    ("loss_fn", "error", "message"),
    [
        (
            lambda b, lps: sum(lp.sum() for lp in lps),
            TypeError,
            "the loss function must return (loss, metrics), got a bare tensor of shape []; "
            "return (loss, {}) for no metrics",
        ),
        (  # a 2-element tensor would unpack into (loss, metrics) silently
            lambda b, lps: torch.stack([lps[0].sum(), lps[1].sum()]),
            TypeError,
            "got a bare tensor of shape [2]",
        ),
        (lambda b, lps: (lps[0].sum(), {}, 1), TypeError, "got tuple of length 3"),
        (lambda b, lps: (lps[0], {}), ValueError, "loss must hold one value, got shape [5] (sum or mean it)"),
        (lambda b, lps: (1.5, {}), TypeError, "loss must be a torch tensor computed from the logprobs, got float"),
        (lambda b, lps: (torch.tensor(1.0), {}), ValueError, "loss does not depend on the logprobs"),
        (lambda b, lps: (lps[0].sum() * float("nan"), {}), ValueError, "loss is nan, not finite"),
        (lambda b, lps: (lps[0].sum(), [("acc", 1.0)]), TypeError, "metrics must be a dict of str -> float, got list"),
        (lambda b, lps: (lps[0].sum(), {"acc": "high"}), TypeError, "metrics['acc'] must be a number, got str"),
        (nan_grad, ValueError, "gradient with respect to datum 0's logprobs is not finite"),
    ],
    ids=[
        "bare-scalar",
        "bare-pair",
        "triple",
        "vector",
        "float",
        "no-grad",
        "nan",
        "list-metrics",
        "str-metric",
        "inf-grad",
    ],
)
def test_a_custom_loss_that_breaks_the_contract_is_one_line_and_applies_nothing(client, loss_fn, error, message):
    data = [sft_datum([3, 17, 40, 8, 99, 12], [0, 0, 1, 1, 1]), sft_datum([5, 6, 7], [1, 0.5])]
    with pytest.raises(error) as exc:
        client.forward_backward_custom(data, loss_fn).result(timeout=60)
    assert message in str(exc.value) and "\n" not in str(exc.value), str(exc.value)
    assert str(exc.value).startswith("forward_backward_custom: ")
    assert not grads_of(client)  # nothing accumulated
    out = client.forward_backward_custom(data, lambda b, lps: (lps[0].sum().reshape(1), {})).result(timeout=60)
    assert out.metrics["loss:sum"] < 0  # the client stays usable; a [1]-shaped loss is one value too


def test_metric_keys_name_their_reduction_where_the_sdk_reduces_them(client):
    """A named loss's keys are ``name:reduction`` -- the SDK's own combiner (the oracle) reduces
    two chunks' outputs -- while a custom loss's own metrics come back as given, as the SDK
    returns them (merged after combining; tinker-cookbook's custom losses use plain keys)."""
    from tinker.lib.chunked_fwdbwd_helpers import REDUCE_MAP, combine_fwd_bwd_output_results

    data = [rl_datum([4, 5, 6], [7, 8, 9], [-1.0, -2.0, -0.5], 1.0), rl_datum([4, 5], [10, 2], [-3.0, -0.1], -0.5)]
    chunks = [client.forward_backward([d], "ppo").result(timeout=60) for d in data]
    for key in chunks[0].metrics:
        name, reduction = key.split(":")  # exactly one colon
        assert name and reduction in REDUCE_MAP, key
    combined = combine_fwd_bwd_output_results(chunks)
    assert combined.metrics.keys() == chunks[0].metrics.keys()
    assert combined.metrics["loss:sum"] == pytest.approx(sum(c.metrics["loss:sum"] for c in chunks))

    custom = client.forward_backward_custom(data, lambda b, lps: (lps[0].sum(), {"accuracy": 0.5, "kl:max": 2}))
    metrics = custom.result(timeout=60).metrics
    assert metrics["accuracy"] == 0.5 and metrics["kl:max"] == 2.0
    assert {"loss:sum", "surrogate_loss:sum"} <= metrics.keys()


def test_a_registered_loss_whose_metric_key_holds_a_colon_is_one_line(client):
    from trinity_like.registry import POLICY_LOSS_FN

    name = "test_client_colon_metric"
    if name not in POLICY_LOSS_FN:

        @POLICY_LOSS_FN.register_module(name)
        def colon_metric(*, logprob, action_mask):
            return -(logprob * action_mask).sum(), {"tokens:sum": float(action_mask.sum())}

    data = [types.Datum(model_input=types.ModelInput.from_ints([3, 4, 5]), loss_fn_inputs={"target_tokens": [4, 5, 6]})]
    with pytest.raises(ConfigError) as exc:
        client.forward_backward(data, name).result(timeout=60)
    message = str(exc.value)
    assert "\n" not in message and f"loss {name!r} reports metric 'tokens:sum'" in message
    assert "mean, sum, min, max" in message
