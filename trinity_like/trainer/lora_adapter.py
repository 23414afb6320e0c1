"""A LoRA adapter on a live model: its params, the layers it adapts, its seeded start, peft's wrapping.

What LoRA is, and how merged weights and checkpoints look, is told in :mod:`.lora`, which
re-exports everything here. Layers are found by where they sit: a linear layer under a module
named for attention or for the MLP, and the output embedding. The start is a function of the
seed alone (A uniform, B zero), so every engine given the same seed starts from the same adapter.

Example::

    model = apply_lora(base_model, LoraParams(rank=4, seed=0))   # a peft model; only A and B train
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from trinity_like.errors import TrinityError
from trinity_like.trainer.params import DEFAULT_SEED, LoraParams  # noqa: F401 -- re-exported

PEFT_PREFIX = "base_model.model."  # what peft puts before the wrapped model's own names
ADAPTER_NAME = "default"  # peft's name of the one adapter (in memory; files leave it out)
ATTENTION_WORDS = ("attn", "attention")  # a linear layer under a module so named is an attention projection
MLP_WORDS = ("mlp", "feed_forward", "ffn")  # ... an MLP projection


# -- which layers ---------------------------------------------------------------------
def _group(name: str) -> str | None:
    """ "attn" or "mlp" for a layer under a module named for either, else None."""
    parents = name.split(".")[:-1]
    if any(word in part for part in parents for word in ATTENTION_WORDS):
        return "attn"
    if any(word in part for part in parents for word in MLP_WORDS):
        return "mlp"
    return None


def target_layers(model: nn.Module, params: LoraParams) -> list[str]:
    """Full names of the linear layers of ``model`` (a transformers causal LM) that get adapters."""
    output = model.get_output_embeddings()
    wanted = {"attn": params.train_attn, "mlp": params.train_mlp, "unembed": params.train_unembed}
    found, chosen = set(), []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear):
            continue
        group = "unembed" if module is output else _group(name)
        if group is None:
            continue
        found.add(group)
        if wanted[group]:
            chosen.append(name)
    missing = [g for g, on in wanted.items() if on and g not in found]
    if missing:
        raise TrinityError(
            f"LoRA: {type(model).__name__} has no linear {' or '.join(missing)} layers to adapt "
            f"(looked for modules named {ATTENTION_WORDS + MLP_WORDS} and the output embedding)"
        )
    return chosen


def target_modules(model: nn.Module, params: LoraParams) -> list[str]:
    """peft's ``target_modules`` for :func:`target_layers`: their last names (``q_proj``) when
    those select exactly these layers (peft matches a name by suffix), else the full names."""
    layers = target_layers(model, params)
    leaves = sorted({name.rsplit(".", 1)[-1] for name in layers})
    selected = {name for name, _ in model.named_modules() if name and name.rsplit(".", 1)[-1] in leaves}
    return leaves if selected == set(layers) else sorted(layers)


def lora_config(model: nn.Module, params: LoraParams, base_path: str | None = None):
    """peft's ``LoraConfig`` for ``params`` on ``model``: no dropout, no bias, plain 1/rank scaling."""
    from peft import LoraConfig

    return LoraConfig(
        r=params.rank,
        lora_alpha=params.alpha,
        target_modules=target_modules(model, params),
        lora_dropout=0.0,
        bias="none",
        task_type="CAUSAL_LM",
        base_model_name_or_path=base_path,
    )


def initial_adapter_from_shapes(shapes: Mapping[str, Any], params: LoraParams) -> dict[str, torch.Tensor]:
    """The adapter at step 0 for peft parameter names -> shapes, in model order: each
    A ~ U(-1/sqrt(in), 1/sqrt(in)) drawn in turn from one generator seeded by ``params.seed``,
    each B = 0. (verl's sharded workers call this with their global shapes.)"""
    generator = torch.Generator().manual_seed(params.seed)
    out = {}
    for name, shape in shapes.items():
        if f".lora_A.{ADAPTER_NAME}." in name:
            bound = 1.0 / shape[1] ** 0.5
            out[name] = torch.empty(tuple(shape)).uniform_(-bound, bound, generator=generator)
        elif f".lora_B.{ADAPTER_NAME}." in name:
            out[name] = torch.zeros(tuple(shape))
    return out


def initial_adapter(peft_model: nn.Module, params: LoraParams) -> dict[str, torch.Tensor]:
    """:func:`initial_adapter_from_shapes` for ``peft_model``'s parameters (shapes only: meta is fine)."""
    return initial_adapter_from_shapes({n: p.shape for n, p in peft_model.named_parameters()}, params)


def wrap_with_peft(model: nn.Module, params: LoraParams, base_path: str | None = None):
    """``model`` wrapped by peft with freshly created (not yet seeded) adapters; the global RNG is left as it was."""
    from peft import get_peft_model

    config = lora_config(model, params, base_path)
    with torch.random.fork_rng(devices=[]), warnings.catch_warnings():
        # peft warns when an adapter sits on a tied output layer: here that is the point (see above)
        warnings.filterwarnings("ignore", message=".*tie_word_embeddings.*")
        return get_peft_model(model, config)


def apply_lora(model: nn.Module, params: LoraParams, base_path: str | None = None):
    """``model`` as a peft LoRA model on the layers ``params`` selects, initialised from ``params.seed``."""
    peft_model = wrap_with_peft(model, params, base_path)
    named = dict(peft_model.named_parameters())
    with torch.no_grad():
        for name, value in initial_adapter(peft_model, params).items():
            named[name].copy_(value)
    return peft_model
