"""The weight digest against a naive re-implementation, and what it must see and agree on."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch

from trinity_like.models.resolve import load_model, resolve_model_path
from trinity_like.models.weight_digest import SAMPLE, model_digest, weights_digest
from trinity_like.trainer.lora import LoraParams, apply_lora, merged_state_dict

BITS = {2: np.int16, 4: np.int32, 8: np.int64}


def naive_digest(state: dict[str, torch.Tensor], dtype: torch.dtype | None = None) -> str:
    """The documented recipe, one element at a time in Python integers (mod 2^64), from numpy bits."""
    sigs = {}
    for name in sorted(state):
        t = state[name].detach().reshape(-1)
        n = t.numel()
        stride = max(1, -(-n // SAMPLE))
        sample = t[::stride]
        if dtype is not None and t.is_floating_point():
            sample = sample.to(dtype)
        if sample.is_floating_point():
            sample = sample + 0.0  # -0.0 counts as +0.0
        raw = sample.contiguous().view(torch.int16 if sample.element_size() == 2 else torch.int32).numpy()
        plain = sum(int(b) for b in raw) % 2**64
        weighted = sum(int(b) * (i + 1) for i, b in enumerate(raw)) % 2**64
        signed = lambda v: v - 2**64 if v >= 2**63 else v  # noqa: E731 -- int64 as torch wraps it
        sigs[name] = (tuple(state[name].shape), signed(plain), signed(weighted))
    h = hashlib.blake2b(digest_size=8)
    for name in sorted(state):
        if name == "lm_head.weight" and any(o != name and s == sigs[name] for o, s in sigs.items()):
            continue
        kind = dtype if dtype is not None and state[name].is_floating_point() else state[name].dtype
        shape, plain, weighted = sigs[name]
        h.update(f"{name}|{shape}|{kind}|{plain}|{weighted};".encode())
    return h.hexdigest()


@pytest.fixture(scope="module")
def model():
    return load_model(resolve_model_path("tiny-random"))[0]


def big_state():
    gen = torch.Generator().manual_seed(0)
    return {"a.weight": torch.randn(3000, 7, generator=gen), "b.bias": torch.randn(5, generator=gen)}


@pytest.mark.parametrize("dtype", [None, torch.bfloat16])
def test_equals_the_naive_recipe(model, dtype):
    for state in (model.state_dict(), big_state()):  # large tensors sampled with a stride, small ones whole
        assert weights_digest(state, dtype=dtype) == naive_digest(state, dtype)


def test_a_model_a_state_dict_with_or_without_the_tied_output_and_a_cast_model_agree(model):
    state = {k: v.clone() for k, v in model.state_dict().items()}
    without = {k: v for k, v in state.items() if k != "lm_head.weight"}
    assert model_digest(model) == weights_digest(state) == weights_digest(without)
    bf16 = load_model(resolve_model_path("tiny-random"), dtype=torch.bfloat16)[0]
    assert model_digest(bf16) == weights_digest(state, dtype=torch.bfloat16) != weights_digest(state)


def test_any_single_tensor_changed_changes_it(model):
    state = {k: v.clone() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    seen = {weights_digest(state)}
    for name in state:  # an update (every element moves) and one sampled element
        for change in (lambda t: t + 1e-3, lambda t: t.reshape(-1).index_add(0, torch.tensor([0]), torch.ones(1))):
            digest = weights_digest({**state, name: change(state[name]).reshape(state[name].shape)})
            assert digest not in seen, name
            seen.add(digest)
    assert weights_digest({**state, "b": torch.zeros(2, 3)}) != weights_digest({**state, "b": torch.zeros(3, 2)})


def test_a_lora_merge_changes_it_and_an_untied_output_counts(model):
    base = {k: v.clone() for k, v in model.state_dict().items()}
    peft = apply_lora(load_model(resolve_model_path("tiny-random"))[0], LoraParams(rank=2, seed=0))
    with torch.no_grad():
        for name, p in peft.named_parameters():
            if "lora_B" in name:
                p.add_(0.01)
    merged = merged_state_dict(peft.state_dict(), LoraParams(rank=2, seed=0))
    assert not torch.equal(merged["lm_head.weight"], merged["model.embed_tokens.weight"])
    assert weights_digest(merged) != weights_digest(base)
    tied_again = {**merged, "lm_head.weight": merged["model.embed_tokens.weight"]}
    assert weights_digest(tied_again) != weights_digest(merged)  # the merged output layer is counted


@pytest.mark.slow
def test_the_cost_benchmark_in_the_docs_runs():
    """docs/reliability.md's command (one repetition: its figures are in the doc, not checked here)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    assert "python benchmarks/weight_digest.py" in (root / "docs" / "reliability.md").read_text()
    out = subprocess.run(
        [sys.executable, str(root / "benchmarks" / "weight_digest.py"), "--reps", "1"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    assert "% of a 5.0 s main-job step" in out.stdout


def test_negative_zero_is_zero():
    """A merge of an untrained adapter (W + 0 * BA) turns -0.0 into +0.0: the same weights, the same digest."""
    state = {"w": torch.tensor([-0.0, 1.0, -2.0])}
    assert weights_digest(state) == weights_digest({"w": state["w"] + 0.0}) == naive_digest(state)
    assert weights_digest(state) != weights_digest({"w": torch.tensor([0.0, 1.0, 2.0])})
