"""A sampling client's weights as files: read from and written to a model folder (safetensors beside
the base model's config and tokenizer, with the digests a sampler checks what it loaded against),
and checked against the model's shapes before any is copied into it."""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from trinity_like.models.weight_digest import save_digests

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".gguf", ".index.json")  # not copied beside new weights


def folder_id(folder: Path) -> str:
    """Names a folder's weights as they are now: a rewritten folder is loaded again."""
    stamp = max((f.stat().st_mtime_ns for f in folder.glob("*.safetensors")), default=0)
    return f"folder:{folder}:{stamp}"


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files in ``folder`` (one or sharded)."""
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"model_path {folder} holds no *.safetensors weights")
    weights: dict[str, torch.Tensor] = {}
    for file in files:
        weights.update(load_file(file))
    return weights


def write_weights(weights: Mapping[str, torch.Tensor], base_folder: Path, dest: Path) -> None:
    """``dest`` as a model folder: ``weights`` in safetensors beside the base's config and tokenizer."""
    dest.mkdir(parents=True, exist_ok=True)
    for stale in [*dest.glob("*.safetensors"), *dest.glob("*.safetensors.index.json")]:
        stale.unlink()  # earlier weights (another shard layout) would be read back with ours
    for file in base_folder.iterdir():
        if file.is_file() and not file.name.endswith(WEIGHT_SUFFIXES):
            shutil.copy(file, dest / file.name)
    # Clones: safetensors refuses tensors sharing storage (tied embeddings) and views.
    save_file({k: v.detach().to("cpu").clone() for k, v in weights.items()}, str(dest / "model.safetensors"))
    save_digests(dest, weights)  # a sampler created from the folder checks what it loaded against them


def check_shapes(model: PreTrainedModel, weights: Mapping[str, torch.Tensor]) -> None:
    """A tensor whose shape differs from the model's fails before any is copied (names: ``update_weights``)."""
    expected = model.state_dict()
    for name, tensor in weights.items():
        if name in expected and tuple(tensor.shape) != tuple(expected[name].shape):
            shapes = f"{tuple(tensor.shape)}, the model's is {tuple(expected[name].shape)}"
            raise ValueError(f"weights[{name!r}] has shape {shapes}")
