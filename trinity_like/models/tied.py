"""Tied output layers: a model whose output layer is its input embedding (SmolLM2, the tiny
test models) holding weights that give the two different values.

Merged LoRA weights of an adapter on the output layer do that (:mod:`trinity_like.trainer.lora`).
Loaded into the tied model as they are, whichever of the two loads last overwrites the
other; the model must first get an output layer of its own.

Weights of a tied model (its safetensors, which hold the shared matrix once, under the
input embedding's name) loaded into a model untied that way tie it again: an engine that
sampled a LoRA adapter's weights can sample the base model's next.

Example::

    if gives_tied_output_its_own(model, merged):
        untie_output_embeddings(model)
    model.load_state_dict(merged)
    ...
    if ties_output_again(model, base):
        retie_output_embeddings(model)
    model.load_state_dict(base, strict=False)
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn


def gives_tied_output_its_own(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``state_dict`` holds different values for the output layer and the input
    embedding of a ``model`` that ties them."""
    inputs, output = model.get_input_embeddings(), model.get_output_embeddings()
    if inputs is None or output is None or output.weight is not inputs.weight:
        return False
    values = [
        state_dict[n]
        for n, p in model.named_parameters(remove_duplicate=False)
        if p is inputs.weight and n in state_dict
    ]
    return len(values) == 2 and not torch.equal(values[0], values[1])


def untie_output_embeddings(model: nn.Module) -> nn.Module:
    """Give a loaded tied model an output layer of its own (a copy of the shared matrix), in
    place, so it can load weights whose output layer differs; returns ``model``."""
    output, inputs = model.get_output_embeddings(), model.get_input_embeddings()
    if output is not None and inputs is not None and output.weight is inputs.weight:
        output.weight = nn.Parameter(output.weight.detach().clone(), requires_grad=output.weight.requires_grad)
        model._trinity_untied = True  # tied by its weights: a tied model's weights may tie it again
    model.config.tie_word_embeddings = False
    return model


def ties_output_again(model: nn.Module, state_dict: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``model``, once tied and untied by :func:`untie_output_embeddings`, is given a
    tied model's weights: the input embedding and no output layer."""
    inputs, output = model.get_input_embeddings(), model.get_output_embeddings()
    if (
        inputs is None
        or output is None
        or output.weight is inputs.weight
        or not getattr(model, "_trinity_untied", False)
    ):
        return False
    names = {id(p): n for n, p in model.named_parameters()}
    return names[id(inputs.weight)] in state_dict and names[id(output.weight)] not in state_dict


def retie_output_embeddings(model: nn.Module) -> nn.Module:
    """Undo :func:`untie_output_embeddings`: the output layer is the input embedding again; returns ``model``."""
    model.get_output_embeddings().weight = model.get_input_embeddings().weight
    model.config.tie_word_embeddings = True
    model._trinity_untied = False
    return model
