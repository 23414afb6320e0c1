"""The operations of one decode step (step_ops.py): counted right, and held down at the 30-layer shape.

The count depends on the layer structure, not the widths: a narrow Llama with SmolLM2-135M's 30 layers
and grouped heads (9 over 3) dispatches what the real one does, in a fraction of the time.
"""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from trinity_like.explorer import decode_step
from trinity_like.explorer.engine_contract import SamplingParams
from trinity_like.explorer.step_ops import count_decode_step_ops

LAYERS = 30
# The lean step's kernels per layer on the CPU, from its design (lean_forward.py): two norms of 4
# (2-norm, hypot, addcdiv, weight), 3 projection matmuls into q/k/v, the rotation (flip, mul_,
# addcmul_), 2 cache writes, attention (baddbmm, softmax, bmm), the output projection with the
# residual (addmm), the MLP (mm, silu_, mm, mul_) and its down projection with the residual (addmm).
LEAN_KERNELS_PER_LAYER = 2 * 4 + 3 + 3 + 2 + 3 + 1 + 4 + 1


def narrow(layers: int):
    config = LlamaConfig(
        vocab_size=512,
        hidden_size=72,
        intermediate_size=96,
        num_hidden_layers=layers,
        num_attention_heads=9,
        num_key_value_heads=3,
        head_dim=64,  # SmolLM2-135M's (576 / 9)
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        eos_token_id=2,
    )
    torch.manual_seed(0)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def narrow_30():
    return narrow(LAYERS)


def test_the_count_sees_every_projection_and_does_not_depend_on_rows_or_keys(narrow_30):
    ops = count_decode_step_ops(narrow_30, rows=8, key_length=40)
    # Oracle from the architecture: q, k, v, o, gate, up, down per layer, then the output head -- one
    # matmul each, whichever form it takes (into a buffer, or with the residual added in).
    by_op = ops["by_op"]
    matmuls = by_op.get("aten.mm.default", 0) + by_op.get("aten.mm.out", 0) + by_op.get("aten.addmm.default", 0)
    assert matmuls == 7 * LAYERS + 1
    assert ops["total"] == sum(ops["by_op"].values())
    assert 0 < ops["kernels"] < ops["total"]
    assert count_decode_step_ops(narrow_30, rows=3, key_length=17)["total"] == ops["total"]
    assert narrow_30.training is False


@pytest.mark.parametrize("sampling", [SamplingParams(), SamplingParams(greedy=True)], ids=["sampled", "greedy"])
def test_a_decode_step_at_the_30_layer_shape_stays_lean(narrow_30, monkeypatch, sampling):
    lean = count_decode_step_ops(narrow_30, rows=16, key_length=64, sampling=sampling)
    # Per layer: the difference from a 2-layer model of the same widths, against the design's list.
    two = count_decode_step_ops(narrow(2), rows=16, key_length=64, sampling=sampling)
    per_layer = (lean["kernels"] - two["kernels"]) / (LAYERS - 2)
    assert per_layer <= LEAN_KERNELS_PER_LAYER, lean["by_op"]
    # Against the model's own forward (the path of the families the lean forward does not know).
    monkeypatch.setattr(decode_step, "lean_forward", lambda model: None)
    own = count_decode_step_ops(narrow_30, rows=16, key_length=64, sampling=sampling)
    # Measured (fp32, sampled): own forward 2926 operations / 1266 kernels; lean 1721 / 815 (25 per layer).
    assert lean["kernels"] <= 0.7 * own["kernels"], (lean["kernels"], own["kernels"])
    assert lean["total"] <= 0.65 * own["total"], (lean["total"], own["total"])
