"""The local engine against independent oracles: a naive full forward, plain autograd + AdamW."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from _lib.trainer_batches import ClippedPPOLoss, make_batch, naive_outputs, nll_loss, value_mse_loss
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoModelForTokenClassification

from trinity_like.config.engine_params import build_engine
from trinity_like.errors import TrinityError
from trinity_like.models.tiny import build_tiny_model
from trinity_like.trainer.base import TrainEngine, with_normalisers
from trinity_like.trainer.local_engine import LocalEngine
from trinity_like.trainer.params import ModelParams, OptimParams

B, P, R = 8, 6, 5


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3))


@pytest.fixture(scope="module")
def batch(tiny_path) -> dict[str, torch.Tensor]:
    vocab = AutoModelForCausalLM.from_pretrained(tiny_path).config.vocab_size
    return make_batch(vocab, B, P, R, seed=11)


def reference_model(path: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, attn_implementation="sdpa")


def test_is_a_train_engine(tiny_path):
    assert isinstance(LocalEngine(ModelParams(path=tiny_path)), TrainEngine)


def test_engines_are_built_from_a_recipe_with_its_values(tiny_path):
    from trinity_like.config.schema import Config

    cfg = Config.model_validate({"trainer": {"engine": "local", "micro_batch_size": 3, "optimizer": {"lr": 3e-4}}})
    engine = build_engine(cfg, tiny_path)
    assert isinstance(engine, LocalEngine)
    assert engine.params.micro_batch_size == 3 and engine.optim_params.lr == 3e-4
    critic = build_engine(cfg, tiny_path, kind="value", critic=True)
    assert critic.optim_params.lr == cfg.trainer.critic_optimizer.lr


def test_a_registered_train_engine_is_what_a_recipe_names(tiny_path):
    """TRAIN_ENGINE: an entry registered through the public decorator is built for ``trainer.engine``;
    an entry that builds something without the TrainEngine members is refused by name."""
    from trinity_like.config.schema import Config
    from trinity_like.registry import TRAIN_ENGINE
    from trinity_like.trainer.engines import TrainEngineSpec, build_train_engine

    built: list[TrainEngineSpec] = []

    @TRAIN_ENGINE.register_module("test_recording_local", force=True)
    def recording(spec: TrainEngineSpec) -> LocalEngine:
        """The local engine, recording the spec it was built from."""
        built.append(spec)
        return LocalEngine(spec.model, spec.optim)

    @TRAIN_ENGINE.register_module("test_not_an_engine", force=True)
    def not_an_engine(spec: TrainEngineSpec) -> object:
        """Something without the TrainEngine members."""
        return object()

    cfg = Config.model_validate({"trainer": {"engine": "test_recording_local", "micro_batch_size": 2}})
    engine = build_engine(cfg, tiny_path)
    assert isinstance(engine, LocalEngine) and len(built) == 1
    assert built[0].model.micro_batch_size == 2 and built[0].model.path == tiny_path
    with pytest.raises(TypeError, match="test_not_an_engine"):
        build_train_engine("test_not_an_engine", built[-1])


def test_engine_params_take_every_default_from_the_schema():
    """One default per value: the engines' parameter objects never disagree with a recipe's defaults."""
    from trinity_like.config.engine_params import model_params, optim_params
    from trinity_like.config.schema import Config

    cfg = Config()
    assert optim_params(cfg) == dataclasses.replace(OptimParams(), total_steps=cfg.trainer.total_steps)
    assert model_params(cfg, "p") == ModelParams(path="p")


def test_missing_model_is_one_clear_error(tmp_path):
    with pytest.raises(TrinityError, match="not found"):
        LocalEngine(ModelParams(path=str(tmp_path / "nope")))


def test_logprobs_and_entropy_match_a_naive_full_forward(tiny_path, batch):
    engine = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=3))
    out = engine.compute_logprobs(batch, need_entropy=True)
    with torch.no_grad():
        expected = naive_outputs(reference_model(tiny_path), batch)
    attended = batch["attention_mask"][:, P:].bool()
    assert out["logprob"].shape == (B, R)
    assert not out["logprob"].requires_grad  # old logprobs are constants to the loss
    torch.testing.assert_close(out["logprob"][attended], expected["logprob"][attended], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out["entropy"][attended], expected["entropy"][attended], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("loss_fn", [nll_loss, ClippedPPOLoss(clip=0.2, entropy_coef=0.01)], ids=["nll", "ppo"])
def test_micro_batches_add_up_to_the_full_batch_gradient_and_adamw_step(tiny_path, batch, loss_fn):
    """Engine with micro-batches of 3 rows == one autograd pass over all 8 rows + torch AdamW."""
    # Adam's first step is lr * g / (|g| + eps): where |g| << eps it is flat in g, where |g| is
    # near 0 it jumps, so fp32 summation-order noise in g could move it by a fraction of lr.
    # A large eps keeps the step Lipschitz in g (slope lr / eps = 10): the gradient tolerance
    # (atol 1e-6) then bounds the weight difference by 1e-5.
    optim = OptimParams(lr=1e-2, weight_decay=0.1, betas=(0.8, 0.95), eps=1e-3, grad_clip=1e9)
    engine = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=3), optim)
    metrics = engine.forward_backward(batch, loss_fn, need_entropy=True)

    model = reference_model(tiny_path)
    full = with_normalisers(batch)
    loss, _ = loss_fn(naive_outputs(model, full), full)
    loss.backward()
    assert metrics["loss"] == pytest.approx(loss.item(), rel=1e-5)
    engine_grads = {n: p.grad for n, p in engine.model.named_parameters()}
    for name, p in model.named_parameters():
        torch.testing.assert_close(engine_grads[name], p.grad, rtol=1e-4, atol=1e-6)

    engine.optim_step()
    torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1, betas=(0.8, 0.95), eps=1e-3).step()
    after = engine.state_dict()
    for name, p in model.named_parameters():
        torch.testing.assert_close(after[name], p.detach(), rtol=1e-5, atol=1e-5)


def test_grad_clip_zero_means_no_clipping(tiny_path, batch):
    """``trainer.optimizer.grad_clip: 0`` turns clipping off (it used to scale every gradient to 0)."""
    off = LocalEngine(ModelParams(path=tiny_path), OptimParams(lr=1e-3, grad_clip=0.0))
    huge = LocalEngine(ModelParams(path=tiny_path), OptimParams(lr=1e-3, grad_clip=1e9))
    before = off.state_dict()
    for engine in (off, huge):
        engine.forward_backward(batch, nll_loss)
        assert engine.optim_step()["grad_norm"] > 0
    after_off, after_huge = off.state_dict(), huge.state_dict()
    assert any(not torch.equal(before[k], after_off[k]) for k in before)
    for k in after_off:
        torch.testing.assert_close(after_off[k], after_huge[k], rtol=0, atol=0)


def test_gradients_accumulate_over_calls_that_share_the_global_normalisers(tiny_path, batch):
    """Two half batches carrying the full batch's num_tokens == the full batch in one call."""
    whole = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=8))
    halves = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=2))
    whole.forward_backward(batch, nll_loss)
    full = with_normalisers(batch)
    for rows in (slice(0, 3), slice(3, B)):
        halves.forward_backward({k: v if v.dim() == 0 else v[rows] for k, v in full.items()}, nll_loss)
    for p, q in zip(whole.model.parameters(), halves.model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)


def test_gradient_checkpointing_from_the_recipe_gives_the_same_gradients(tiny_path, batch):
    """trainer.gradient_checkpointing recomputes activations in backward: memory, not results."""
    from trinity_like.config.schema import Config

    cfg = Config.model_validate({"trainer": {"engine": "local", "gradient_checkpointing": True}})
    recomputing = build_engine(cfg, tiny_path)
    assert recomputing.params.gradient_checkpointing and recomputing.model.is_gradient_checkpointing
    plain = LocalEngine(ModelParams(path=tiny_path))
    loss_fn = ClippedPPOLoss(clip=0.2, entropy_coef=0.01)
    assert recomputing.forward_backward(batch, loss_fn, need_entropy=True)["loss"] == pytest.approx(
        plain.forward_backward(batch, loss_fn, need_entropy=True)["loss"]
    )
    for p, q in zip(plain.model.parameters(), recomputing.model.parameters(), strict=True):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7)


def test_grad_clipping_bounds_the_update_norm(tiny_path, batch):
    engine = LocalEngine(ModelParams(path=tiny_path), OptimParams(lr=1e-3, grad_clip=0.5))
    engine.forward_backward(batch, nll_loss)
    grads = [p.grad.clone() for p in engine.model.parameters()]
    norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads]))
    metrics = engine.optim_step()
    assert metrics["grad_norm"] == pytest.approx(float(norm), rel=1e-5)
    assert metrics["grad_norm"] > 0.5  # so clipping was active; the AdamW step is scale-free anyway


def test_save_load_round_trip_is_byte_identical_and_resumes_identically(tiny_path, batch, tmp_path):
    optim = OptimParams(lr=1e-3, warmup_steps=2)
    first = LocalEngine(ModelParams(path=tiny_path), optim)
    for _ in range(2):
        first.forward_backward(batch, nll_loss)
        first.optim_step()
    first.save(str(tmp_path / "ckpt"))

    second = LocalEngine(ModelParams(path=tiny_path), optim)
    second.load(str(tmp_path / "ckpt"))
    a, b = first.state_dict(), second.state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)

    for engine in (first, second):
        engine.forward_backward(batch, nll_loss)
        assert engine.optim_step()["lr"] == pytest.approx(1e-3)  # step 2: warmup over
    a, b = first.state_dict(), second.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)

    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ckpt")
    assert (tmp_path / "ckpt" / "tokenizer_config.json").is_file()
    saved_weights = load_file(str(tmp_path / "ckpt" / "model.safetensors"))
    for name, tensor in saved_weights.items():
        assert torch.equal(loaded.state_dict()[name], tensor)


def test_forward_only_engine_refuses_to_train(tiny_path, batch):
    ref = LocalEngine(ModelParams(path=tiny_path, forward_only=True))
    assert ref.compute_logprobs(batch)["logprob"].shape == (B, R)
    with pytest.raises(TrinityError, match="forward-only"):
        ref.forward_backward(batch, nll_loss)


def unpadded_hidden(model: torch.nn.Module, batch, row: int) -> tuple[torch.Tensor, int]:
    """Oracle: the backbone over one row with its padding removed; returns (hidden [L, H], prompt length)."""
    keep = batch["attention_mask"][row].bool()
    ids = batch["input_ids"][row][keep].unsqueeze(0)
    with torch.no_grad():
        hidden = model.base_model(input_ids=ids).last_hidden_state[0]
    return hidden, int(keep[:P].sum())


def test_value_and_reward_heads_read_the_right_positions(tiny_path, batch, tmp_path):
    critic = LocalEngine(ModelParams(path=tiny_path, kind="value", head_seed=5))
    rm = LocalEngine(ModelParams(path=tiny_path, kind="reward", head_seed=5))
    values = critic.compute_logprobs(batch)["values"]
    scores = rm.compute_logprobs(batch)["scores"]
    assert values.shape == (B, R) and scores.shape == (B,)
    model, head = reference_model(tiny_path), critic.model.score
    assert torch.equal(head.weight, rm.model.score.weight)  # the same seed, the same fresh head
    for row in range(B):
        hidden, plen = unpadded_hidden(model, batch, row)
        rlen = hidden.shape[0] - plen
        with torch.no_grad():
            expect_values = head(hidden[plen - 1 : plen - 1 + rlen]).squeeze(-1)
            expect_score = head(hidden[-1]).squeeze(-1)
        torch.testing.assert_close(values[row, :rlen], expect_values, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(scores[row], expect_score, rtol=1e-4, atol=1e-5)

    critic.forward_backward(batch, value_mse_loss)
    critic.optim_step()
    critic.save(str(tmp_path / "critic"))
    loaded = AutoModelForTokenClassification.from_pretrained(tmp_path / "critic")
    reloaded = LocalEngine(ModelParams(path=str(tmp_path / "critic"), kind="value", head_seed=99))
    a, b = critic.state_dict(), reloaded.state_dict()
    assert a.keys() == loaded.state_dict().keys()
    assert all(torch.equal(a[k], b[k]) and torch.equal(a[k], loaded.state_dict()[k]) for k in a)


def test_pair_batches_micro_batch_between_pairs_only(tiny_path):
    """DPO over micro-batches of 3 rows (rounded to whole pairs) == the whole batch at once."""
    from trinity_like.components import build_params
    from trinity_like.experience import PairExperience
    from trinity_like.pipeline.batching import pair_batch
    from trinity_like.registry import POLICY_LOSS_FN
    from trinity_like.trainer.base import micro_batches
    from trinity_like.trainer.objective import ComponentSpec, Objective

    g = torch.Generator().manual_seed(4)

    def tokens(n):
        return torch.randint(3, 100, (n,), generator=g).tolist()

    pairs = [
        PairExperience(prompt_tokens=tokens(4 + i % 2), chosen_tokens=tokens(2 + i % 3), rejected_tokens=tokens(3))
        for i in range(5)
    ]
    batch = pair_batch(pairs, pad_id=0)
    assert [mb["input_ids"].shape[0] for mb in micro_batches(batch, 3)] == [2, 2, 2, 2, 2]
    batch["ref_logprob"] = torch.zeros_like(batch["response_mask"]) - 2.0
    fn = POLICY_LOSS_FN.get("dpo")
    dpo = Objective(
        policy_loss=ComponentSpec("POLICY_LOSS_FN", "dpo", build_params(fn, {"beta": 0.5})), one_update=True
    )
    results = []
    for micro in (3, 10):
        engine = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=micro), OptimParams(lr=0.0))
        metrics = engine.forward_backward(batch, dpo)
        grads = torch.cat([p.grad.flatten() for p in engine.model.parameters() if p.grad is not None])
        results.append((metrics, grads))
    (split, g_split), (whole, g_whole) = results
    assert split["loss"] == pytest.approx(whole["loss"], rel=1e-5)
    assert split["policy_loss"] == pytest.approx(whole["policy_loss"], rel=1e-5)
    torch.testing.assert_close(g_split, g_whole, rtol=1e-4, atol=1e-6)
