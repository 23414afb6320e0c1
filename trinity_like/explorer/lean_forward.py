"""The decode forward of a Llama-family model in fewer operations, with the model's own numbers.

Why: a decode step is a few thousand tiny operations (``transformers``' layer reshapes and
transposes every projection, rotates queries and keys apart, through ``cat``/``neg`` and
slices), and on a GPU each kernel costs a launch floor of microseconds whatever its size
(:mod:`.step_ops` counts them). This forward reads the same modules' weights at call time
(an in-place or borrowed update is seen at once) and computes the same arithmetic in the
same order, so its logits are bit-identical to the model's in float32 (tested), in fewer
operations:

- queries and keys are rotated together: one ``cat`` of the two projections, then
  ``x * cos + flip(x) * sin'`` with the sign of ``rotate_half`` folded into ``sin'`` once
  per step (``-a * b == a * -b`` exactly);
- when the attention scale is a power of two (head dim 64: 1/8) it is folded into the
  queries' ``cos``/``sin`` once per step, exactly, so the scores need no scaling pass;
- no reshapes, transposes or per-layer masks: activations stay ``[B, features]``, the
  mask is built once per step by the caller and read by every layer;
- the norms go through ``rms_norm`` (one fused kernel on CUDA; on the CPU the same
  operations as the model's, hence the same bits).

Supported: ``llama``, ``qwen2`` and ``qwen3`` (per-head query/key norms) with SiLU MLPs and
position-wise rotary embeddings; :func:`lean_forward` returns ``None`` for anything else and
the caller runs the model's own forward.

Letters: B rows, E hidden size, X query + kv heads, H kv heads, G query heads per kv head,
D head dim, L key length, V vocabulary.
"""

from __future__ import annotations

import math
import weakref
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F  # noqa: N812

from trinity_like.explorer.kv_cache import SlotCache, decode_attention

if TYPE_CHECKING:
    from transformers import PreTrainedModel

MODEL_TYPES = ("llama", "qwen2", "qwen3")
# Rotary types whose cos/sin depend on the position alone (not on the sequence length seen so far).
STATIC_ROPE = ("default", "linear", "llama3")
_FORWARDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _norm(x: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
    """``module`` (an RMSNorm) of ``x`` with its arithmetic: float32 statistics, the weight applied
    after the cast back to ``x``'s dtype."""
    shape = (x.shape[-1],)
    if x.dtype == torch.float32:
        return F.rms_norm(x, shape, module.weight, module.variance_epsilon)
    return module.weight * F.rms_norm(x.float(), shape, None, module.variance_epsilon).to(x.dtype)


class LeanForward:
    """The decode forward of one model (see the module docstring); build with :func:`lean_forward`."""

    def __init__(self, model: PreTrainedModel) -> None:
        config = model.config
        self.model = model
        self.layers = list(model.model.layers)
        attn = self.layers[0].self_attn
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = attn.head_dim
        self.scaling = float(attn.scaling)
        # A power of two scales exactly: folded into the queries' rotation, not a pass over the scores.
        self.fold_scale = math.frexp(self.scaling)[0] == 0.5
        self.qk_norm = hasattr(attn, "q_norm")
        self._rope_parts: dict[tuple, torch.Tensor] = {}

    def _rotation(self, cos_B1D: torch.Tensor, sin_B1D: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head ``cos`` and signed ``sin`` ``[B, X, D]`` for the step (query heads scaled when folded)."""
        key = (cos_B1D.dtype, cos_B1D.device)
        parts = self._rope_parts.get(key)
        if parts is None:
            half = self.head_dim // 2
            sign_D = torch.tensor([-1.0] * half + [1.0] * half, dtype=cos_B1D.dtype)
            scale_X1 = torch.tensor(
                [self.scaling if self.fold_scale else 1.0] * self.heads + [1.0] * self.kv_heads, dtype=cos_B1D.dtype
            )[:, None]
            parts = torch.stack([scale_X1.expand(-1, self.head_dim), scale_X1 * sign_D]).to(cos_B1D.device)
            self._rope_parts[key] = parts  # [2, X, D]: cos factor, signed sin factor
        return cos_B1D * parts[0], sin_B1D * parts[1]

    def __call__(
        self, ids_B: torch.Tensor, pos_B: torch.Tensor, mask_B11L: torch.Tensor, cache: SlotCache
    ) -> torch.Tensor:
        """Logits ``[B, V]`` of the next token of each row; writes the rows' keys/values to ``cache``."""
        inner = self.model.model
        b, hq, h, d = ids_B.shape[0], self.heads, self.kv_heads, self.head_dim
        # Through the module (its hooks run: a [B, 1] step, as the model's own forward shows it).
        x_BE = inner.embed_tokens(ids_B[:, None]).view(b, -1)
        cos_B1D, sin_B1D = inner.rotary_emb(x_BE, pos_B[:, None])
        cos_BXD, sin_BXD = self._rotation(cos_B1D, sin_B1D)
        scaling = None if self.fold_scale else self.scaling
        for index, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h_BE = _norm(x_BE, layer.input_layernorm)
            q = F.linear(h_BE, attn.q_proj.weight, attn.q_proj.bias)
            k = F.linear(h_BE, attn.k_proj.weight, attn.k_proj.bias)
            v_BHD = F.linear(h_BE, attn.v_proj.weight, attn.v_proj.bias).view(b, h, 1, d)
            if self.qk_norm:
                q, k = _norm(q.view(b, hq, d), attn.q_norm), _norm(k.view(b, h, d), attn.k_norm)
            qk_BXD = torch.cat([q.view(b, hq, d), k.view(b, h, d)], dim=1)
            turned_BXD = qk_BXD.view(b, hq + h, 2, d // 2).flip(2).view(b, hq + h, d)
            qk_BXD = qk_BXD * cos_BXD + turned_BXD * sin_BXD
            keys, values = cache.update(qk_BXD[:, hq:, None], v_BHD, index)
            out_BHGD = decode_attention(qk_BXD[:, :hq].view(b, h, hq // h, d), keys, values, mask_B11L, scaling)
            x_BE = x_BE + F.linear(out_BHGD.view(b, hq * d), attn.o_proj.weight, attn.o_proj.bias)
            h_BE = _norm(x_BE, layer.post_attention_layernorm)
            gate = F.silu(F.linear(h_BE, mlp.gate_proj.weight, mlp.gate_proj.bias))
            up = F.linear(h_BE, mlp.up_proj.weight, mlp.up_proj.bias)
            x_BE = x_BE + F.linear(gate * up, mlp.down_proj.weight, mlp.down_proj.bias)
        head = self.model.lm_head
        return F.linear(_norm(x_BE, inner.norm), head.weight, head.bias)


def lean_forward(model: PreTrainedModel) -> LeanForward | None:
    """The model's :class:`LeanForward` (built once per model), or ``None`` when it is not supported."""
    if model in _FORWARDS:
        return _FORWARDS[model]
    forward = LeanForward(model) if supports(model) else None
    _FORWARDS[model] = forward
    return forward


def supports(model: PreTrainedModel) -> bool:
    """Whether :class:`LeanForward` computes ``model``'s own decode step (family, activation, rotary)."""
    config = model.config
    inner = getattr(model, "model", None)
    rope = getattr(getattr(inner, "rotary_emb", None), "rope_type", None)
    if (
        getattr(config, "model_type", None) not in MODEL_TYPES
        or getattr(config, "hidden_act", None) != "silu"
        or rope not in STATIC_ROPE
        or not hasattr(model, "lm_head")
        or getattr(config, "final_logit_softcapping", None)
    ):
        return False
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    attn = inner.layers[0].self_attn
    if heads % kv_heads or attn.head_dim % 2:
        return False
    # Plain linear layers only: a wrapped one (a LoRA adapter, a quantised layer) computes more than
    # its `.weight`, and only its own forward knows what.
    linears = [model.lm_head]
    norms = [inner.norm]
    for layer in inner.layers:
        a, m = layer.self_attn, layer.mlp
        linears += [a.q_proj, a.k_proj, a.v_proj, a.o_proj, m.gate_proj, m.up_proj, m.down_proj]
        norms += [layer.input_layernorm, layer.post_attention_layernorm]
        norms += [a.q_norm, a.k_norm] if hasattr(a, "q_norm") else []
    return all(type(x) is torch.nn.Linear for x in linears) and all(hasattr(n, "variance_epsilon") for n in norms)
