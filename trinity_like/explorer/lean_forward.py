"""The decode forward of a Llama-family model in few operations, from the model's own weights.

Why: a decode step is a few thousand tiny operations (``transformers``' layer reshapes and
transposes every projection, rotates queries and keys apart, through ``cat``/``neg`` and
slices), and on a GPU each kernel costs a launch floor of microseconds whatever its size
(:mod:`.step_ops` counts them). This forward reads the same modules' weights at call time (an
in-place or borrowed update is seen at once: no fused copy of any weight is kept, which would
go stale and cost memory) and computes the same function in fewer operations:

- queries and keys land in one buffer -- all rows' queries, then all rows' keys, each head a
  contiguous run of ``D`` -- through ``mm(..., out=)``: no ``cat``, and the queries are
  contiguous for the attention's batched matmul;
- they are rotated together in place, ``x * cos + flip(x) * sin'`` as one ``mul_`` and one
  ``addcmul_``, with the sign of ``rotate_half`` (and a power-of-two attention scale: head dim
  64 gives 1/8) folded into ``cos``/``sin'`` once per step; ``cos``/``sin`` come from the
  rotary module's ``inv_freq`` in a handful of operations per step;
- the residual adds ride in the output projections (``addmm``); the MLP's SiLU and product run
  in place;
- the norms are ``rms_norm`` on CUDA (one fused kernel); on the CPU, where ``rms_norm`` is six
  element-wise passes, ``x * sqrt(n) / hypot(|x|, sqrt(n * eps)) * w`` in four;
- on the CPU the attention is ``baddbmm`` (mask and scale in the matmul), ``softmax``, ``bmm``;
  on CUDA SDPA's fused kernel.

The logits are not bit-identical to the model's (a different rounding order: ``addmm``
accumulates the residual inside the matmul, the norm's statistics are a 2-norm); they agree
within the model's own float32 rounding error, measured against a float64 oracle
(tests/explorer/test_lean_forward.py).

Supported: ``llama``, ``qwen2`` and ``qwen3`` (per-head query/key norms) with SiLU MLPs and
position-wise rotary embeddings; :func:`lean_forward` returns ``None`` for anything else and
the caller runs the model's own forward. Call it under ``no_grad`` or ``inference_mode`` (the
engine's decode step does): the in-place and ``out=`` operations have no gradient.

Letters: B rows, E hidden size, X query + kv heads, H kv heads, G query heads per kv head,
D head dim, L key length, V vocabulary, F the flat query-and-key buffer (B*X*D).
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


class _Norms:
    """RMSNorm (float32 statistics) in as few operations as the device allows; on the CPU with the
    model's order (the weight applied after the cast back to the input's dtype)."""

    def __init__(self) -> None:
        self.consts: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, x: torch.Tensor, module: torch.nn.Module) -> torch.Tensor:
        n, eps = x.shape[-1], module.variance_epsilon
        if x.is_cuda:  # one fused kernel there (float32 statistics)
            return F.rms_norm(x, (n,), module.weight, eps)
        # x / sqrt(mean(x^2) + eps) == x * sqrt(n) / sqrt(|x|^2 + n * eps): a 2-norm and a hypot
        # in place of pow, mean, add, rsqrt (one pass over x instead of two).
        key = (n, eps, x.device)
        consts = self.consts.get(key)
        if consts is None:
            consts = tuple(torch.tensor(v, dtype=torch.float32, device=x.device) for v in (0.0, math.sqrt(n * eps)))
            self.consts[key] = consts
        zero, floor = consts
        stats = torch.float64 if x.dtype == torch.float64 else torch.float32  # never narrower than x
        norm_B1 = torch.linalg.vector_norm(x, dim=-1, keepdim=True, dtype=stats)
        y = torch.addcdiv(zero, x, torch.hypot(norm_B1, floor), value=math.sqrt(n))  # in `stats`
        return (y if y.dtype == x.dtype else y.to(x.dtype)).mul_(module.weight)


def _linear_into(x: torch.Tensor, linear: torch.nn.Linear, out: torch.Tensor) -> None:
    if linear.bias is None:
        torch.mm(x, linear.weight.t(), out=out)
    else:
        torch.addmm(linear.bias, x, linear.weight.t(), out=out)


def _residual(x_BE: torch.Tensor, a: torch.Tensor, linear: torch.nn.Linear) -> torch.Tensor:
    """``x + linear(a)`` with the add inside the matmul."""
    y = torch.addmm(x_BE, a, linear.weight.t())
    return y if linear.bias is None else y.add_(linear.bias)


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
        self.norm = _Norms()
        self._rope_parts: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def _parts(self, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head factors ``[2, 1, heads, 2, D/2]`` of (cos, signed sin): the queries', the keys'."""
        key = (device, dtype)
        parts = self._rope_parts.get(key)
        if parts is None:
            half = self.head_dim // 2
            scale = float(getattr(self.model.model.rotary_emb, "attention_scaling", 1.0))
            sign_2 = torch.tensor([-1.0, 1.0])[:, None]  # rotate_half: (-x2, x1)

            def factors(heads: int, s: float) -> torch.Tensor:
                cos_2K, sin_2K = torch.full((2, half), s), (s * sign_2).expand(2, half)
                return torch.stack([cos_2K, sin_2K])[:, None, None].expand(2, 1, heads, 2, half)

            q_scale = scale * (self.scaling if self.fold_scale else 1.0)
            parts = tuple(
                f.to(device=device, dtype=dtype) for f in (factors(self.heads, q_scale), factors(self.kv_heads, scale))
            )
            self._rope_parts[key] = parts
        return parts

    def _rotation(self, pos_B: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """``cos`` and signed ``sin`` ``[F]`` in the query-and-key buffer's layout: the rotary module's
        arithmetic (float32 angles and cos/sin, cast to the model's dtype), times the head factors."""
        inv_freq = self.model.model.rotary_emb.inv_freq
        angles_BK = pos_B[:, None] * inv_freq.float()  # positions < 2**24: exact in float32
        cs_2BK = torch.stack([angles_BK.cos(), angles_BK.sin()])
        if dtype != torch.float32:
            cs_2BK = cs_2BK.to(dtype)
        cs_2B11K = cs_2BK[:, :, None, None, :]  # each half of a head takes the same angles
        q_part, k_part = self._parts(pos_B.device, dtype)
        cs_2F = torch.cat([(cs_2B11K * q_part).flatten(1), (cs_2B11K * k_part).flatten(1)], dim=1)
        return cs_2F[0], cs_2F[1]

    def __call__(
        self, ids_B: torch.Tensor, pos_B: torch.Tensor, mask_B11L: torch.Tensor, cache: SlotCache
    ) -> torch.Tensor:
        """Logits ``[B, V]`` of the next token of each row; writes the rows' keys/values to ``cache``."""
        inner = self.model.model
        b, hq, h, d = ids_B.shape[0], self.heads, self.kv_heads, self.head_dim
        nq, nk = b * hq * d, b * h * d
        # Through the module (its hooks run: a [B, 1] step, as the model's own forward shows it).
        x_BE = inner.embed_tokens(ids_B[:, None]).view(b, -1)
        dtype, device = x_BE.dtype, x_BE.device
        cos_F, sin_F = self._rotation(pos_B, dtype)
        scaling = None if self.fold_scale else self.scaling
        cpu = not x_BE.is_cuda
        if cpu:  # the mask as baddbmm's input, one [B*H, 1, L] copy per step
            mask_X1L = mask_B11L.expand(b, h, 1, -1).reshape(b * h, 1, -1)
        for index, layer in enumerate(self.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h_BE = self.norm(x_BE, layer.input_layernorm)
            qk_F = torch.empty(nq + nk, dtype=dtype, device=device)
            _linear_into(h_BE, attn.q_proj, qk_F[:nq].view(b, hq * d))
            _linear_into(h_BE, attn.k_proj, qk_F[nq:].view(b, h * d))
            v_BHD = F.linear(h_BE, attn.v_proj.weight, attn.v_proj.bias).view(b, h, 1, d)
            if self.qk_norm:
                q, k = self.norm(qk_F[:nq].view(b, hq, d), attn.q_norm), self.norm(qk_F[nq:].view(b, h, d), attn.k_norm)
                qk_F = torch.cat([q.view(-1), k.view(-1)])
            turned_F = qk_F.view(-1, 2, d // 2).flip(1).view(-1)
            qk_F.mul_(cos_F).addcmul_(turned_F, sin_F)
            keys, values = cache.update(qk_F[nq:].view(b, h, 1, d), v_BHD, index)
            query_BHGD = qk_F[:nq].view(b, h, hq // h, d)
            if cpu:
                out_BE = _cpu_attention(query_BHGD, keys, values, mask_X1L, scaling).view(b, hq * d)
            else:
                out_BE = decode_attention(query_BHGD, keys, values, mask_B11L, scaling).view(b, hq * d)
            x_BE = _residual(x_BE, out_BE, attn.o_proj)
            h_BE = self.norm(x_BE, layer.post_attention_layernorm)
            gate = F.silu(F.linear(h_BE, mlp.gate_proj.weight, mlp.gate_proj.bias), inplace=True)
            gate.mul_(F.linear(h_BE, mlp.up_proj.weight, mlp.up_proj.bias))
            x_BE = _residual(x_BE, gate, mlp.down_proj)
        head = self.model.lm_head
        return F.linear(self.norm(x_BE, inner.norm), head.weight, head.bias)


def _cpu_attention(
    query_BHGD: torch.Tensor,
    key_BHLD: torch.Tensor,
    value_BHLD: torch.Tensor,
    mask_X1L: torch.Tensor,
    scaling: float | None,
) -> torch.Tensor:
    """:func:`~.kv_cache.decode_attention` in three operations: ``[B, H, G, D]``. The cache views
    fold to ``[B*H, L, D]`` without a copy (a slot's heads are adjacent); the mask and the scale
    go into the scores' matmul."""
    b, h, g, d = query_BHGD.shape
    keys_XLD, values_XLD = key_BHLD.view(b * h, -1, d), value_BHLD.view(b * h, -1, d)
    scores_XGL = torch.baddbmm(
        mask_X1L, query_BHGD.view(b * h, g, d), keys_XLD.transpose(1, 2), alpha=1.0 if scaling is None else scaling
    )
    # In the scores' dtype: the CPU's bf16 softmax accumulates in float32 and rounds once, as
    # softmax(dtype=float32).to(bf16) does, without the two casts.
    probs_XGL = torch.softmax(scores_XGL, dim=-1)
    return torch.bmm(probs_XGL, values_XLD).view(b, h, g, d)


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
