"""The lean decode forward (lean_forward.py) against the model's own forward: the same logits, bit for bit
in float32, and the same keys/values written to the slot cache, for each supported family."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from trinity_like.explorer.kv_cache import SlotCache, use_attention
from trinity_like.explorer.lean_forward import lean_forward
from trinity_like.models.tiny import build_tiny_model

SIZES = dict(vocab_size=300, hidden_size=48, intermediate_size=80, num_hidden_layers=3, max_position_embeddings=256)


def llama(head_dim: int):
    torch.manual_seed(1)
    config = LlamaConfig(**SIZES, num_attention_heads=6, num_key_value_heads=2, head_dim=head_dim, eos_token_id=2)
    return LlamaForCausalLM(config).eval()


def qwen3():
    torch.manual_seed(2)
    config = Qwen3Config(**SIZES, num_attention_heads=4, num_key_value_heads=2, head_dim=16, eos_token_id=2)
    return Qwen3ForCausalLM(config).eval()


MODELS = {
    "llama-scale-folded": lambda: llama(64),  # 1/8: a power of two, folded into the rotation
    "llama-scale-applied": lambda: llama(12),
    "qwen2-bias": lambda: build_tiny_model(seed=0)[0],
    "qwen3-qk-norm": qwen3,
}


def step_inputs(model, rows=5, length=23):
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    gen = torch.Generator().manual_seed(3)
    cache = SlotCache(
        num_layers=config.num_hidden_layers,
        num_slots=rows + 2,
        num_kv_heads=config.num_key_value_heads,
        max_length=length + 4,
        head_dim=head_dim,
        dtype=torch.float32,
        device=torch.device("cpu"),
    )
    for t in (*cache.keys, *cache.values):
        t.copy_(torch.randn(t.shape, generator=gen))
    pos_B = torch.tensor([length - 1, 0, 7, length - 3, 12][:rows])
    ids_B = torch.randint(0, config.vocab_size, (rows,), generator=gen)
    visible_BL = torch.arange(length) <= pos_B[:, None]
    mask_B11L = torch.where(visible_BL, 0.0, torch.finfo(torch.float32).min)[:, None, None, :]
    return cache, ids_B, pos_B, mask_B11L, length


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lean_forward_gives_the_models_own_logits_and_cache(name):
    model = MODELS[name]()
    lean = lean_forward(model)
    assert lean is not None
    cache_a, ids_B, pos_B, mask, length = step_inputs(model)
    cache_b, *_ = step_inputs(model)
    with torch.inference_mode(), use_attention(model):
        cache_a.prepare_step(pos_B, length)
        own_BV = model(
            input_ids=ids_B[:, None],
            position_ids=pos_B[:, None],
            attention_mask=mask,
            past_key_values=cache_a,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        cache_b.prepare_step(pos_B, length)
        lean_BV = lean(ids_B, pos_B, mask, cache_b)
    assert torch.equal(lean_BV, own_BV), (lean_BV - own_BV).abs().max()
    for a, b in zip((*cache_a.keys, *cache_a.values), (*cache_b.keys, *cache_b.values)):
        assert torch.equal(a, b)


def test_lean_forward_is_exact_in_bf16_too_where_the_model_rounds_the_same():
    model = llama(64).to(torch.bfloat16)
    cache_a, ids_B, pos_B, mask, length = step_inputs(model)
    for t in (*cache_a.keys, *cache_a.values):
        t.data = t.to(torch.bfloat16)
    mask = mask.to(torch.bfloat16)
    with torch.inference_mode(), use_attention(model):
        cache_a.prepare_step(pos_B, length)
        own_BV = model(
            input_ids=ids_B[:, None], position_ids=pos_B[:, None], attention_mask=mask, past_key_values=cache_a
        ).logits[:, -1]
        cache_b, *_ = step_inputs(model)
        for t in (*cache_b.keys, *cache_b.values):
            t.data = t.to(torch.bfloat16)
        cache_b.prepare_step(pos_B, length)
        lean_BV = lean_forward(model)(ids_B, pos_B, mask, cache_b)
    assert torch.equal(lean_BV, own_BV), (lean_BV.float() - own_BV.float()).abs().max()


def test_unsupported_families_get_the_models_own_forward():
    model = llama(12)
    model.config.hidden_act = "gelu"  # not the SiLU MLP the lean forward computes
    assert lean_forward(model) is None

    class Adapted(torch.nn.Linear):  # a wrapped projection (LoRA-like) computes more than its weight
        pass

    wrapped = llama(12)
    old = wrapped.model.layers[1].self_attn.v_proj
    wrapped.model.layers[1].self_attn.v_proj = Adapted(old.in_features, old.out_features, bias=False)
    assert lean_forward(wrapped) is None
