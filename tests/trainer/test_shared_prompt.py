"""The packed forward (each group's prompt once, :mod:`trinity_like.trainer.forward`) against the
plain padded forward: the same outputs and the same gradients, on every shape of batch."""

from __future__ import annotations

import pytest
import torch
from _lib.trainer_batches import ClippedPPOLoss, make_batch, nll_loss

from trinity_like.models.tiny import build_tiny_model
from trinity_like.trainer.base import micro_batches
from trinity_like.trainer.forward import (
    head_outputs,
    length_order,
    model_outputs,
    pack,
    padded_outputs,
    sorted_micro_batches,
)
from trinity_like.trainer.local_engine import LocalEngine
from trinity_like.trainer.params import ModelParams, OptimParams


def grouped_batch(vocab: int, groups: list[int], prompt_len: int, response_len: int, seed: int) -> dict:
    """Groups of rows sharing one prompt (``groups``: the size of each), prompts of different
    lengths, responses ragged, in our padded layout; rows of a group are not adjacent when
    ``seed`` is odd (sharing is by prompt tokens, not by position)."""
    rows = sum(groups)
    batch = make_batch(vocab, rows, prompt_len, response_len, seed)
    g = torch.Generator().manual_seed(seed)
    first = 0
    for size in groups:
        for r in range(first + 1, first + size):
            for key in ("input_ids", "attention_mask"):
                batch[key][r, :prompt_len] = batch[key][first, :prompt_len]
        first += size
    if seed % 2:
        order = torch.randperm(rows, generator=g)
        batch = {k: v[order] for k, v in batch.items()}
    batch["position_ids"] = (batch["attention_mask"].cumsum(1) - 1).clamp(min=0)
    return batch


class ExactRMSNorm(torch.nn.Module):
    """transformers' RMSNorm computes in float32 whatever the model's dtype, which caps a float64
    model's agreement at ~1e-7; this one keeps the input's dtype, so float64 is float64 throughout."""

    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


def float64_exact(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` in float64 with every RMSNorm computed in float64 (:class:`ExactRMSNorm`)."""
    model = model.double()
    for name, module in list(model.named_modules()):
        if type(module).__name__.endswith("RMSNorm"):
            parent, _, attr = name.rpartition(".")
            setattr(model.get_submodule(parent) if parent else model, attr, ExactRMSNorm(module))
    return model


@pytest.fixture(scope="module")
def tiny64():
    model, _ = build_tiny_model(seed=0)
    return float64_exact(model)


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def outputs_and_grads(model, batch, share: bool, kind: str = "lm"):
    model.zero_grad(set_to_none=True)
    if share is None:
        out = padded_outputs(model, batch, kind, need_entropy=kind == "lm")
    else:
        out = model_outputs(model, batch, kind, need_entropy=kind == "lm", share_prompts=share)
    where = batch["attention_mask"][:, -batch["response_mask"].shape[1] :].bool()
    if kind == "lm":
        loss = (out["logprob"] * batch["advantages"] * batch["response_mask"]).sum() + 0.1 * (
            out["entropy"] * where
        ).sum()
    elif kind == "value":
        loss = ((out["values"] - batch["advantages"]) ** 2 * batch["response_mask"]).sum()
    else:
        loss = torch.nn.functional.logsigmoid(out["scores"][0::2] - out["scores"][1::2]).sum()
    loss.backward()
    return out, grads(model), where


@pytest.mark.parametrize("seed", [0, 1])
def test_packed_equals_padded_outputs_and_grads(tiny64, seed):
    """Groups of 3, 1 and 4 rows, prompts of different lengths, ragged responses, rows in any order:
    logprobs, entropies and every parameter's gradient equal the padded forward's to 1e-10."""
    batch = grouped_batch(tiny64.config.vocab_size, [3, 1, 4], prompt_len=9, response_len=6, seed=seed)
    ref, ref_grads, where = outputs_and_grads(tiny64, batch, None)
    packing = pack(batch)
    assert packing.input_ids.shape[0] == 3  # one sequence per prompt
    for share in (True, False):
        out, got, _ = outputs_and_grads(tiny64, batch, share)
        for k in ("logprob", "entropy"):
            torch.testing.assert_close(out[k][where], ref[k][where], rtol=0, atol=1e-10)
            assert (out[k][~where] == 0).all()
        assert got.keys() == ref_grads.keys()
        for name in ref_grads:
            torch.testing.assert_close(got[name], ref_grads[name], rtol=1e-10, atol=1e-10, msg=name)


def test_eager_attention_takes_the_packed_mask(tiny64):
    """The ``eager`` kernel gets an additive mask: the same outputs and grads as ``sdpa`` (to the
    float32 softmax transformers' eager attention computes in)."""
    batch = grouped_batch(tiny64.config.vocab_size, [3, 1, 4], prompt_len=9, response_len=6, seed=1)
    ref, ref_grads, where = outputs_and_grads(tiny64, batch, True)
    tiny64.config._attn_implementation = "eager"
    try:
        out, got, _ = outputs_and_grads(tiny64, batch, True)
    finally:
        tiny64.config._attn_implementation = "sdpa"
    torch.testing.assert_close(out["logprob"][where], ref["logprob"][where], rtol=1e-5, atol=1e-5)
    for name in ref_grads:
        torch.testing.assert_close(got[name], ref_grads[name], rtol=1e-4, atol=1e-4 * ref_grads[name].abs().max())


def test_value_and_reward_heads_share_prompts_exactly():
    """A critic (values read before each response token) and a reward model on preference pairs
    (chosen and rejected share their prompt): outputs and gradients as padded."""
    from transformers import AutoModelForTokenClassification

    model, _ = build_tiny_model(seed=0)
    config = model.config
    config.num_labels = 1
    torch.manual_seed(0)
    scorer = float64_exact(AutoModelForTokenClassification.from_config(config))
    batch = grouped_batch(config.vocab_size, [2, 2, 2], prompt_len=8, response_len=5, seed=4)
    assert pack(batch).input_ids.shape[0] == 3
    for kind, key in (("value", "values"), ("reward", "scores")):
        ref, ref_grads, where = outputs_and_grads(scorer, batch, None, kind)
        out, got, _ = outputs_and_grads(scorer, batch, True, kind)
        picked = (lambda t, where=where: t[where]) if kind == "value" else (lambda t: t)
        torch.testing.assert_close(picked(out[key]), picked(ref[key]), rtol=0, atol=1e-10)
        for name in ref_grads:
            torch.testing.assert_close(got[name], ref_grads[name], rtol=1e-10, atol=1e-10, msg=name)


def test_rows_with_their_own_prompts_pack_alone(tiny64):
    """Multi-turn rows (distinct prompts, environment tokens masked out of the loss) share
    nothing: one sequence each, outputs as padded."""
    batch = make_batch(tiny64.config.vocab_size, 5, prompt_len=6, response_len=8, seed=3)
    batch["response_mask"][:, 2:4] = 0  # an environment turn inside each response
    packing = pack(batch)
    assert packing.input_ids.shape[0] == 5
    ref, ref_grads, where = outputs_and_grads(tiny64, batch, None)
    out, got, _ = outputs_and_grads(tiny64, batch, True)
    torch.testing.assert_close(out["logprob"][where], ref["logprob"][where], rtol=0, atol=1e-10)
    for name in ref_grads:
        torch.testing.assert_close(got[name], ref_grads[name], rtol=1e-10, atol=1e-10, msg=name)


def test_chunked_head_equals_one_chunk(tiny64):
    """The head in chunks (recomputed in backward) gives the same logprobs, entropies and grads."""
    head = tiny64.get_output_embeddings()
    hidden = torch.randn(37, tiny64.config.hidden_size, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, tiny64.config.vocab_size, (37,))
    results = []
    for chunk in (1024, 5):
        head.weight.grad, hidden.grad = None, None
        out = head_outputs(hidden, head, targets, need_entropy=True, chunk=chunk)
        (out["logprob"].sum() + out["entropy"].square().sum()).backward()
        results.append((out, hidden.grad.clone(), head.weight.grad.clone()))
    (a, ha, wa), (b, hb, wb) = results
    for k in a:
        torch.testing.assert_close(a[k], b[k], rtol=0, atol=1e-12)
    torch.testing.assert_close(ha, hb, rtol=0, atol=1e-12)
    torch.testing.assert_close(wa, wb, rtol=0, atol=1e-12)


def test_padding_is_reported_and_small_for_groups():
    """GRPO-shaped groups pack with little padding; the prompt is counted once."""
    batch = grouped_batch(400, [4, 4], prompt_len=12, response_len=6, seed=0)
    packing = pack(batch)
    prompts = [int(batch["attention_mask"][r, :12].sum()) for r in (0, 4)]
    responses = int(batch["attention_mask"][:, 12:].sum())
    assert packing.tokens == sum(prompts) + responses
    unshared = pack(batch, share_prompts=False)
    assert unshared.tokens == int(batch["attention_mask"].sum())


@pytest.mark.parametrize("micro", [8, 3])
def test_local_engine_shared_or_not_gives_the_same_gradient(tmp_path, micro):
    """The local engine with and without prompt sharing, micro-batches that keep groups whole (8)
    or split them (3): the same loss and the same accumulated gradient (fp32)."""
    folder = build_tiny_model(tmp_path / "tiny")
    batch = grouped_batch(400, [4, 4], prompt_len=10, response_len=6, seed=5)
    results = []
    for share in (True, False):
        engine = LocalEngine(
            ModelParams(path=str(folder), micro_batch_size=micro, share_prompts=share), OptimParams(lr=1e-2)
        )
        metrics = engine.forward_backward(batch, ClippedPPOLoss())
        results.append((metrics["loss"], grads(engine.model)))
    (loss_a, grads_a), (loss_b, grads_b) = results
    assert loss_a == pytest.approx(loss_b, rel=1e-5)
    for name in grads_b:
        torch.testing.assert_close(grads_a[name], grads_b[name], rtol=1e-4, atol=1e-5 * grads_b[name].abs().max())


def test_local_engine_reports_tokens_and_padding(tmp_path):
    folder = build_tiny_model(tmp_path / "tiny")
    batch = grouped_batch(400, [4, 4], prompt_len=10, response_len=6, seed=0)
    engine = LocalEngine(ModelParams(path=str(folder), micro_batch_size=8), OptimParams(lr=1e-3))
    metrics = engine.forward_backward(batch, nll_loss)
    assert metrics["perf/train_tokens"] < int(batch["attention_mask"].sum())
    assert 0 <= metrics["perf/padded_fraction"] < 0.5


@pytest.mark.slow
def test_smollm2_shared_forward_matches_padded():
    """The real model in fp32: logprobs and gradients within 1e-4 relative of the padded forward."""
    from trinity_like.models import load_model

    model, tok = load_model("smollm2-135m-instruct")
    model.float()
    batch = grouped_batch(tok.vocab_size, [4, 3], prompt_len=24, response_len=8, seed=1)
    ref, ref_grads, where = outputs_and_grads(model, batch, None)
    out, got, _ = outputs_and_grads(model, batch, True)
    torch.testing.assert_close(out["logprob"][where], ref["logprob"][where], rtol=1e-4, atol=1e-4)
    for name in (
        "model.embed_tokens.weight",
        "model.layers.0.self_attn.q_proj.weight",
        "model.layers.29.mlp.down_proj.weight",
        "model.norm.weight",
    ):
        scale = ref_grads[name].abs().max()
        assert (got[name] - ref_grads[name]).abs().max() <= 1e-4 * scale, name


def test_length_order_keeps_groups_and_pairs_and_cuts_padding():
    """Rows of a prompt stay together, pairs stay whole, and micro-batches cut from the sorted
    rows pack with less padding than from the batch's own order; outputs come back in order."""
    batch = grouped_batch(400, [2, 2, 2, 2, 2, 2], prompt_len=12, response_len=10, seed=6)
    batch["attention_mask"][:] = 1  # every prompt 12 tokens, every response 10 ...
    batch["attention_mask"][[2, 3, 6, 7, 10, 11], 14:] = 0  # ... but three short groups between long ones
    batch["position_ids"] = (batch["attention_mask"].cumsum(1) - 1).clamp(min=0)
    batch["response_mask"] = batch["attention_mask"][:, 12:].float()
    order = length_order(batch, unit=2)
    assert sorted(order.tolist()) == list(range(12))
    pairs = order.view(-1, 2)
    assert (pairs[:, 1] == pairs[:, 0] + 1).all() and (pairs[:, 0] % 2 == 0).all()
    batch["rows_per_example"] = torch.tensor(2)
    parts, restore = sorted_micro_batches(batch, 4)
    padding = lambda mbs: sum(pack(mb).segment.numel() - pack(mb).tokens for mb in mbs)  # noqa: E731
    assert padding(micro_batches(batch, 4)) == 3 * 16 and padding(parts) == 16
    ids = torch.cat([mb["input_ids"] for mb in parts])[restore]
    assert torch.equal(ids, batch["input_ids"])
