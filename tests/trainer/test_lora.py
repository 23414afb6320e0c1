"""LoRA on the local engine against independent oracles: hand-written merges, a functional
forward over ``W + (alpha / rank) B A`` for the gradients, peft's own loader for the files."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from _lib.trainer_batches import make_batch, naive_outputs, nll_loss
from torch.func import functional_call
from transformers import AutoModelForCausalLM

from trinity_like.config.engine_params import model_params
from trinity_like.config.schema import Config
from trinity_like.errors import TrinityError
from trinity_like.models.tiny import build_tiny_model
from trinity_like.trainer import lora as lora_lib
from trinity_like.trainer.base import with_normalisers
from trinity_like.trainer.local_engine import LocalEngine
from trinity_like.trainer.lora import LoraParams
from trinity_like.trainer.params import ModelParams, OptimParams

B, P, R = 6, 5, 4
LORA = LoraParams(rank=4, alpha=8.0, seed=7)
OPTIM = OptimParams(lr=1e-2, grad_clip=0.0)
LAYERS = 2
ATTN = [f"model.layers.{i}.self_attn.{p}_proj" for i in range(LAYERS) for p in "qkvo"]
MLP = [f"model.layers.{i}.mlp.{p}_proj" for i in range(LAYERS) for p in ("gate", "up", "down")]


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3))


@pytest.fixture(scope="module")
def batch() -> dict[str, torch.Tensor]:
    return make_batch(400, B, P, R, seed=5)


def base_model(path: str) -> torch.nn.Module:
    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def trained(path: str, batch, lora: LoraParams = LORA, steps: int = 2) -> LocalEngine:
    engine = LocalEngine(ModelParams(path=path, micro_batch_size=4, lora=lora), OPTIM)
    for _ in range(steps):
        engine.forward_backward(batch, nll_loss)
        engine.optim_step()
    return engine


def adapter_of(engine: LocalEngine) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """layer -> (A, B) read straight from the peft model's parameters."""
    named = dict(engine.model.named_parameters())
    out = {}
    for name, a in named.items():
        if ".lora_A.default." in name:
            layer = name.removeprefix("base_model.model.").split(".lora_A.")[0]
            out[layer] = (a.detach().clone(), named[name.replace("lora_A", "lora_B")].detach().clone())
    return out


# -- params ---------------------------------------------------------------------------
def test_params_defaults_and_one_line_errors():
    assert LoraParams().rank == 0 and not LoraParams().enabled  # off unless a rank is given
    assert LoraParams(rank=8).alpha == 32.0 and LoraParams(rank=8).scaling == 4.0
    for bad, match in (
        ({"rank": -1}, "rank"),
        ({"rank": 4, "alpha": 0.0}, "alpha"),
        ({"rank": 4, "train_attn": False, "train_mlp": False, "train_unembed": False}, "nothing"),
    ):
        with pytest.raises(TrinityError, match=match):
            LoraParams(**bad)
    with pytest.raises(TrinityError, match="frozen model"):
        ModelParams(path="p", lora=LORA, forward_only=True)
    with pytest.raises(TrinityError, match="value model"):
        ModelParams(path="p", lora=LORA, kind="value")
    assert ModelParams(path="p", lora=LoraParams(rank=0)).adapter is None


def test_recipe_keys_reach_the_actor_only():
    cfg = Config.model_validate({"seed": 3, "model": {"lora_rank": 8, "lora_alpha": 16, "lora_train_mlp": False}})
    actor = model_params(cfg, "p")
    assert actor.lora == LoraParams(rank=8, alpha=16.0, train_mlp=False, seed=3)
    assert model_params(cfg, "p", forward_only=True).lora is None  # the reference is the base model
    assert model_params(cfg, "p", kind="value").lora is None  # a critic trains every weight
    with pytest.raises(TrinityError, match="reward model"):
        model_params(cfg, "p", kind="reward")
    assert model_params(Config(), "p").lora is None


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({}, ATTN + MLP + ["lm_head"]),
        ({"train_mlp": False, "train_unembed": False}, ATTN),
        ({"train_attn": False, "train_unembed": False}, MLP),
        ({"train_attn": False, "train_mlp": False}, ["lm_head"]),
    ],
)
def test_flags_select_the_layers(tiny_path, flags, expected):
    params = dataclasses.replace(LORA, **flags)
    assert sorted(lora_lib.target_layers(base_model(tiny_path), params)) == sorted(expected)
    engine = LocalEngine(ModelParams(path=tiny_path, lora=params))
    assert sorted(adapter_of(engine)) == sorted(expected)


def test_initial_adapter_is_seeded_bounded_and_starts_at_the_base(tiny_path):
    before = torch.get_rng_state()
    engine = LocalEngine(ModelParams(path=tiny_path, lora=LORA))
    assert torch.equal(torch.get_rng_state(), before)  # building an engine draws nothing from the global RNG
    again = adapter_of(LocalEngine(ModelParams(path=tiny_path, lora=LORA)))
    other = adapter_of(LocalEngine(ModelParams(path=tiny_path, lora=dataclasses.replace(LORA, seed=8))))
    for layer, (a, b) in adapter_of(engine).items():
        assert a.shape[0] == b.shape[1] == LORA.rank
        assert float(a.abs().max()) <= a.shape[1] ** -0.5 and float(a.abs().max()) > 0.5 * a.shape[1] ** -0.5
        assert not b.any()
        assert torch.equal(a, again[layer][0]) and not torch.equal(a, other[layer][0])
    base = base_model(tiny_path).state_dict()
    merged = engine.state_dict()
    assert merged.keys() == base.keys()
    assert all(torch.equal(merged[k], base[k]) for k in base)  # B = 0: exactly the base model


# -- training -------------------------------------------------------------------------
def test_only_the_adapter_trains_and_the_base_stays_bitwise(tiny_path, batch):
    engine = LocalEngine(ModelParams(path=tiny_path, micro_batch_size=4, lora=LORA), OPTIM)
    frozen = {k: v.clone() for k, v in engine.model.state_dict().items() if ".lora_" not in k}
    start = adapter_of(engine)
    for _ in range(2):
        engine.forward_backward(batch, nll_loss)
        engine.optim_step()
    optimised = {id(p) for group in engine.optimizer.param_groups for p in group["params"]}
    lora_params = {id(p) for n, p in engine.model.named_parameters() if ".lora_" in n}
    assert optimised == lora_params
    assert all(id(p) in lora_params for p in engine.optimizer.state)
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    names = get_optimizer_state_dict(engine.model, engine.optimizer)["state"]
    assert names and all(".lora_" in name for name in names)
    now = engine.model.state_dict()
    assert all(torch.equal(now[k], v) for k, v in frozen.items())
    assert all(not torch.equal(b, adapter_of(engine)[layer][1]) for layer, (_, b) in start.items())


def test_lora_gradients_match_autograd_through_merged_weights(tiny_path, batch):
    """Oracle without peft: the plain model run on ``W + s B A`` (torch.func), grads of A and B."""
    lora = dataclasses.replace(LORA, train_mlp=False)
    engine = trained(tiny_path, batch, lora, steps=1)  # B != 0 now, so A gets gradient too
    adapter = adapter_of(engine)
    engine.forward_backward(batch, nll_loss)
    grads = {
        n.removeprefix("base_model.model."): p.grad for n, p in engine.model.named_parameters() if p.grad is not None
    }

    plain = AutoModelForCausalLM.from_pretrained(tiny_path, dtype=torch.float32, tie_word_embeddings=False)
    plain.lm_head.weight = torch.nn.Parameter(plain.model.embed_tokens.weight.detach().clone())  # untied by hand
    leaves = {layer: (a.requires_grad_(), b.requires_grad_()) for layer, (a, b) in adapter.items()}
    weights = dict(plain.named_parameters())
    weights.update(
        {
            f"{layer}.weight": weights[f"{layer}.weight"].detach() + lora.scaling * b @ a
            for layer, (a, b) in leaves.items()
        }
    )

    class Wrapped(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = plain

        def forward(self, **kw):
            return functional_call(plain, weights, args=(), kwargs=kw)

    full = with_normalisers(batch)
    loss, _ = nll_loss(naive_outputs(Wrapped(), full), full)
    loss.backward()
    assert set(grads) == {f"{layer}.lora_{x}.default.weight" for layer in leaves for x in "AB"}
    for layer, (a, b) in leaves.items():
        torch.testing.assert_close(grads[f"{layer}.lora_A.default.weight"], a.grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(grads[f"{layer}.lora_B.default.weight"], b.grad, rtol=1e-4, atol=1e-6)


# -- merged weights -------------------------------------------------------------------
def test_merged_weights_are_w_plus_scaled_ba_under_plain_names(tiny_path, batch):
    engine = trained(tiny_path, batch)
    adapter = adapter_of(engine)
    peft_state = {k: v.clone() for k, v in engine.model.state_dict().items()}
    merged = engine.state_dict()
    assert {k: v for k, v in engine.model.state_dict().items()}.keys() == peft_state.keys()
    assert all(torch.equal(engine.model.state_dict()[k], v) for k, v in peft_state.items())  # model untouched
    base = base_model(tiny_path).state_dict()
    assert merged.keys() == base.keys()
    for name, w in base.items():
        layer = name.removesuffix(".weight")
        if layer in adapter:
            a, b = adapter[layer]
            expected = w.double() + LORA.alpha / LORA.rank * (b.double() @ a.double())
            torch.testing.assert_close(merged[name].double(), expected, rtol=0, atol=1e-6)
            assert not torch.equal(merged[name], w)
        else:
            assert torch.equal(merged[name], w)
    # with an adapter on the tied output layer, the two embeddings part ways
    assert not torch.equal(merged["lm_head.weight"], merged["model.embed_tokens.weight"])
    assert torch.equal(merged["model.embed_tokens.weight"], base["model.embed_tokens.weight"])


def test_merged_weights_give_the_engines_logprobs_in_an_untied_model(tiny_path, batch):
    engine = trained(tiny_path, batch)
    expected = engine.compute_logprobs(batch)["logprob"]
    merged = engine.state_dict()
    config = base_model(tiny_path).config
    assert lora_lib.unties_embeddings(LORA, config)
    assert not lora_lib.unties_embeddings(dataclasses.replace(LORA, train_unembed=False), config)
    assert not lora_lib.unties_embeddings(None, config)
    assert lora_lib.merged_config(config, LORA).tie_word_embeddings is False and config.tie_word_embeddings

    attended = batch["attention_mask"][:, P:].bool()
    plain = AutoModelForCausalLM.from_config(lora_lib.merged_config(config, LORA))
    plain.load_state_dict(merged, strict=True)
    untied = lora_lib.untie_output_embeddings(base_model(tiny_path))
    untied.load_state_dict(merged, strict=True)
    tied = base_model(tiny_path)
    tied.load_state_dict(merged, strict=True)  # loads without a word, and is wrong: one matrix for both
    with torch.no_grad():
        for model in (plain, untied):
            got = naive_outputs(model.eval(), batch)["logprob"]
            torch.testing.assert_close(got[attended], expected[attended], rtol=1e-5, atol=1e-5)
        wrong = naive_outputs(tied.eval(), batch)["logprob"]
    assert not torch.allclose(wrong[attended], expected[attended], atol=1e-5)


def test_peft_merge_agrees(tiny_path, batch, tmp_path):
    """peft's own merge_and_unload of the saved adapter gives the engine's merged weights."""
    from peft import PeftModel

    engine = trained(tiny_path, batch)
    engine.save(str(tmp_path / "ckpt"))
    peft_model = PeftModel.from_pretrained(
        lora_lib.untie_output_embeddings(base_model(tiny_path)), str(tmp_path / "ckpt")
    )
    theirs = peft_model.merge_and_unload().state_dict()
    ours = engine.state_dict()
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-6)


# -- checkpoints ----------------------------------------------------------------------
def test_lora_checkpoint_is_peft_adapter_folder(tiny_path, batch, tmp_path):
    from peft import PeftModel

    engine = trained(tiny_path, batch)
    engine.save(str(tmp_path / "ckpt"))
    files = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    assert files == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "base_model.json",
        "optimizer.safetensors",
        "rng_state.safetensors",
        "trainer_state.json",
    ]
    note = json.loads((tmp_path / "ckpt" / "base_model.json").read_text())
    assert note == {"base_model": tiny_path, "lora": dataclasses.asdict(LORA)}
    assert lora_lib.read_base_note(tmp_path / "ckpt") == (tiny_path, LORA)

    peft_model = PeftModel.from_pretrained(base_model(tiny_path), str(tmp_path / "ckpt")).eval()
    attended = batch["attention_mask"][:, P:].bool()
    with torch.no_grad():
        theirs = naive_outputs(peft_model, batch)["logprob"]
    ours = engine.compute_logprobs(batch)["logprob"]
    torch.testing.assert_close(ours[attended], theirs[attended], rtol=1e-5, atol=1e-5)


def test_loading_the_wrong_kind_of_checkpoint_is_one_clear_error(tiny_path, batch, tmp_path):
    trained(tiny_path, batch, steps=1).save(str(tmp_path / "lora"))
    LocalEngine(ModelParams(path=tiny_path)).save(str(tmp_path / "full"))
    with pytest.raises(TrinityError, match="holds a LoRA adapter"):
        LocalEngine(ModelParams(path=tiny_path)).load(str(tmp_path / "lora"))
    with pytest.raises(TrinityError, match="holds full weights, not a LoRA adapter"):
        LocalEngine(ModelParams(path=tiny_path, lora=LORA)).load(str(tmp_path / "full"))
    with pytest.raises(TrinityError, match="is not the one this engine trains"):
        LocalEngine(ModelParams(path=tiny_path, lora=dataclasses.replace(LORA, rank=2))).load(str(tmp_path / "lora"))
    with pytest.raises(TrinityError, match="does not exist"):
        LocalEngine(ModelParams(path=tiny_path, lora=LORA)).load(str(tmp_path / "missing"))
    # another seed is the same adapter shape: it loads
    LocalEngine(ModelParams(path=tiny_path, lora=dataclasses.replace(LORA, seed=1))).load(str(tmp_path / "lora"))
