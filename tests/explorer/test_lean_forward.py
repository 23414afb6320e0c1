"""The lean decode forward (lean_forward.py) against a float64 oracle: the model's own HF forward in
float64 with eager attention over the same cached keys (appended, as its own cache does, with a mask
that shows each row what the slot cache shows it). The lean forward rounds in another order than the
model's own float32 forward, so it is not bit-identical to it; its error must be of the size of the
model's own float32 error against the same oracle (measured here, per model), and the keys and
values it writes must be the oracle's too.

Measured (this file's inputs, CPU): the lean logits' error is 1.0x to 1.5x the model's own, the keys' and
values' 0.6x to 1.7x, in float32 and bf16.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from trinity_like.explorer.kv_cache import SlotCache, use_attention
from trinity_like.explorer.lean_forward import lean_forward
from trinity_like.models.tiny import build_tiny_model

SIZES = dict(vocab_size=300, hidden_size=48, intermediate_size=80, num_hidden_layers=3, max_position_embeddings=256)
MARGIN = 4.0  # the lean forward's error may be this many times the model's own (measured: at most 1.7x)


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
        dtype=model.dtype,
        device=torch.device("cpu"),
    )
    for t in (*cache.keys, *cache.values):
        t.copy_(torch.randn(t.shape, generator=gen))
    pos_B = torch.tensor([length - 1, 0, 7, length - 3, 12][:rows])
    ids_B = torch.randint(0, config.vocab_size, (rows,), generator=gen)
    visible_BL = torch.arange(length) <= pos_B[:, None]
    mask_B11L = torch.where(visible_BL, 0.0, torch.finfo(model.dtype).min)[:, None, None, :].to(model.dtype)
    return cache, ids_B, pos_B, mask_B11L, length


def oracle(model, cache: SlotCache, ids_B, pos_B, length):
    """float64 logits ``[B, V]`` and the new keys/values per layer ``[B, H, D]``, from the HF model's
    own eager forward: cache columns ``0..length-2`` as its past, the new token appended at column
    ``length-1``; the mask shows row b its columns below ``pos_B[b]`` and the new one."""
    model64 = copy.deepcopy(model).double()
    model64.config._attn_implementation = "eager"
    b = ids_B.shape[0]
    past = DynamicCache()
    for layer, (k, v) in enumerate(zip(cache.keys, cache.values)):
        past.update(k[:b, :, : length - 1].double(), v[:b, :, : length - 1].double(), layer)
    columns_L = torch.arange(length)
    visible_BL = (columns_L < pos_B[:, None]) | (columns_L == length - 1)
    mask_B11L = torch.zeros(visible_BL.shape, dtype=torch.float64).masked_fill_(~visible_BL, -torch.inf)[
        :, None, None, :
    ]
    with torch.no_grad():
        logits = model64(
            input_ids=ids_B[:, None], position_ids=pos_B[:, None], attention_mask=mask_B11L, past_key_values=past
        ).logits[:, -1]
    new_kv = [(layer.keys[:, :, -1], layer.values[:, :, -1]) for layer in past.layers]
    return logits, new_kv


def own_and_lean(model):
    """The model's own decode forward and the lean one, each over its own copy of the cache."""
    cache_own, ids_B, pos_B, mask, length = step_inputs(model)
    cache_lean, *_ = step_inputs(model)
    with torch.inference_mode(), use_attention(model):
        cache_own.prepare_step(pos_B, length)
        own_BV = model(
            input_ids=ids_B[:, None],
            position_ids=pos_B[:, None],
            attention_mask=mask,
            past_key_values=cache_own,
            use_cache=True,
            logits_to_keep=1,
        ).logits[:, -1]
        cache_lean.prepare_step(pos_B, length)
        lean_BV = lean_forward(model)(ids_B, pos_B, mask, cache_lean)
    logits64, kv64 = oracle(model, step_inputs(model)[0], ids_B, pos_B, length)
    return (own_BV, cache_own), (lean_BV, cache_lean), (logits64, kv64), pos_B


def errors(logits_BV, cache: SlotCache, logits64, kv64, pos_B) -> tuple[float, float]:
    """Largest |x - oracle| of the logits, and of the keys/values written at each row's position."""
    rows = torch.arange(pos_B.shape[0])
    kv_err = 0.0
    for k, v, (k64, v64) in zip(cache.keys, cache.values, kv64):
        for written, want in ((k[rows, :, pos_B], k64), (v[rows, :, pos_B], v64)):
            kv_err = max(kv_err, float((written.double() - want).abs().max()))
    return float((logits_BV.double() - logits64).abs().max()), kv_err


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lean_forward_is_as_close_to_the_float64_oracle_as_the_models_own(name):
    model = MODELS[name]()
    assert lean_forward(model) is not None
    (own_BV, own_cache), (lean_BV, lean_cache), (logits64, kv64), pos_B = own_and_lean(model)
    own_logit_err, own_kv_err = errors(own_BV, own_cache, logits64, kv64, pos_B)
    lean_logit_err, lean_kv_err = errors(lean_BV, lean_cache, logits64, kv64, pos_B)
    assert 0 < own_logit_err < 1e-4 and own_kv_err < 1e-4  # the oracle is the model: float32 rounding apart
    assert lean_logit_err <= MARGIN * own_logit_err, (lean_logit_err, own_logit_err)
    assert lean_kv_err <= MARGIN * max(own_kv_err, 1e-7), (lean_kv_err, own_kv_err)
    assert torch.equal(lean_BV.argmax(-1), logits64.argmax(-1))


def test_lean_forward_in_bf16_is_as_close_as_the_models_own():
    model = llama(64).to(torch.bfloat16)
    (own_BV, own_cache), (lean_BV, lean_cache), (logits64, kv64), pos_B = own_and_lean(model)
    own_logit_err, own_kv_err = errors(own_BV, own_cache, logits64, kv64, pos_B)
    lean_logit_err, lean_kv_err = errors(lean_BV, lean_cache, logits64, kv64, pos_B)
    assert 0 < own_logit_err < 0.1
    assert lean_logit_err <= MARGIN * own_logit_err, (lean_logit_err, own_logit_err)
    assert lean_kv_err <= MARGIN * max(own_kv_err, 1e-2), (lean_kv_err, own_kv_err)


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
