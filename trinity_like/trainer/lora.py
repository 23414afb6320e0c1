"""LoRA adapters on a train engine's model, and the plain weights they merge into.

LoRA (Hu et al. 2021, arXiv:2106.09685) freezes a pretrained weight W ``[out, in]`` and
trains a low-rank update beside it: ``y = W x + (alpha / rank) * B A x`` with A
``[rank, in]`` and B ``[out, rank]``. ``ModelParams(lora=LoraParams(rank=8))`` makes an
engine wrap its model in a ``peft`` LoRA model on the layers the flags select:

- ``train_attn``: the attention projections (Llama / Qwen2: q_proj, k_proj, v_proj, o_proj);
- ``train_mlp``: the MLP projections (gate_proj, up_proj, down_proj);
- ``train_unembed``: the output layer (lm_head).

Layers are found by where they sit, not from a list of names per architecture: a linear
layer under a module named for attention (``attn``, ``attention``) or for the MLP
(``mlp``, ``feed_forward``, ``ffn``), and the model's output embedding. Only A and B get
gradients and optimiser state; W stays bitwise as loaded.

``alpha`` defaults to 32 whatever the rank (Tinker's convention): with the 1/rank scale
the best learning rate hardly moves with the rank (Schulman et al., "LoRA Without Regret",
Thinking Machines 2025), so a recipe can change the rank without retuning ``lr``.

Initialisation is a function of ``seed`` alone: A ~ U(-1/sqrt(in), 1/sqrt(in)) (the
paper's and peft's default, kaiming-uniform with a = sqrt(5)), drawn layer after layer in
model order from one generator, and B = 0, so training starts exactly at the base model
and two engines (local, verl) given the same seed start from the same adapter.

Weights leave an engine merged: :func:`merged_state_dict` is ``W + (alpha / rank) B A``
under the base model's plain Hugging Face names -- what a sampler loads and runs at no
extra cost per token -- computed from the adapter without touching the training model.

Tied embeddings. SmolLM2 and the tiny test models use one matrix as input embedding and
output layer. With ``train_unembed`` the merged output layer differs from the input
embedding, so merged weights carry both (``lm_head.weight`` and
``model.embed_tokens.weight``) and only a model whose output layer is its own can hold
them: :func:`unties_embeddings` tells a reader whether that is the case,
:func:`merged_config` is the config to build or save such a model with
(``tie_word_embeddings=False``), and :func:`untie_output_embeddings` (from
:mod:`trinity_like.models.tied`, which the rollout engine uses too) turns an already
loaded tied model (a sampler built from the base folder) into one.

On disk an adapter is peft's own layout (:func:`write_adapter`):
``adapter_model.safetensors`` + ``adapter_config.json``, which
``peft.PeftModel.from_pretrained(base, folder)`` loads; engines add ``base_model.json``
(:data:`BASE_MODEL_FILE`: the base folder and these params). ``trinity-like export
CHECKPOINT --out DIR`` (:func:`export_checkpoint`) merges such a checkpoint into its base
as a plain Hugging Face folder, untied where :func:`unties_embeddings` says so.

Example::

    from transformers import AutoModelForCausalLM
    from trinity_like.models.tiny import build_tiny_model

    base = AutoModelForCausalLM.from_pretrained(build_tiny_model("/tmp/tiny", seed=0))
    params = LoraParams(rank=4, seed=0)
    model = apply_lora(base, params)                         # a peft model; only A and B train
    merged = merged_state_dict(model.state_dict(), params)   # plain names: W + (alpha / rank) B A
    plain = AutoModelForCausalLM.from_config(merged_config(model.config, params))
    plain.load_state_dict(merged)                            # the same logprobs as `model`
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trinity_like.errors import TrinityError
from trinity_like.models.tied import untie_output_embeddings  # noqa: F401  (re-exported beside merged_config)

# The adapter on a live model -- its params, which layers, its seeded start, peft's wrapping -- is
# lora_adapter's; the names are re-exported here, where callers have always found them.
from trinity_like.trainer.lora_adapter import (
    ADAPTER_NAME,
    PEFT_PREFIX,
    LoraParams,
    apply_lora,
    initial_adapter,
    initial_adapter_from_shapes,
    lora_config,
    target_layers,
    target_modules,
    wrap_with_peft,
)

__all__ = [
    "ADAPTER_NAME",
    "PEFT_PREFIX",
    "LoraParams",
    "apply_lora",
    "initial_adapter",
    "initial_adapter_from_shapes",
    "lora_config",
    "target_layers",
    "target_modules",
    "wrap_with_peft",
]

ADAPTER_WEIGHTS = "adapter_model.safetensors"  # peft's file of A and B
ADAPTER_CONFIG = "adapter_config.json"  # peft's LoraConfig
BASE_MODEL_FILE = "base_model.json"  # {"base_model": folder trained from, "lora": LoraParams fields or null}


# -- merging --------------------------------------------------------------------------
def split_state(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A peft model's state dict -> (base weights under plain names, adapter under peft's file names).

    ``base_model.model.<layer>.base_layer.weight`` -> ``<layer>.weight``;
    ``base_model.model.<layer>.lora_A.default.weight`` -> ``base_model.model.<layer>.lora_A.weight``.
    """
    base, adapter = {}, {}
    for key, value in state.items():
        name = key.removeprefix(PEFT_PREFIX)
        layer, sep, rest = name.partition(".lora_")
        if sep:
            which, _, leaf = rest.partition(".")
            adapter[f"{PEFT_PREFIX}{layer}.lora_{which}.{leaf.removeprefix(ADAPTER_NAME + '.')}"] = value
        else:
            base[name.replace(".base_layer.", ".")] = value
    return base, adapter


def adapter_layers(adapter: Mapping[str, torch.Tensor]) -> list[str]:
    """The layer names an adapter (peft's file names) holds A and B for."""
    suffix = ".lora_A.weight"
    return [k.removeprefix(PEFT_PREFIX).removesuffix(suffix) for k in adapter if k.endswith(suffix)]


def merge_adapter(
    base: Mapping[str, torch.Tensor], adapter: Mapping[str, torch.Tensor], scaling: float
) -> dict[str, torch.Tensor]:
    """``base`` with ``W + scaling * B A`` in place of each adapted layer's W (in float32, cast back).

    Merged tensors are new; the others are ``base``'s own.
    """
    out = dict(base)
    for layer in adapter_layers(adapter):
        a, b = adapter[f"{PEFT_PREFIX}{layer}.lora_A.weight"], adapter[f"{PEFT_PREFIX}{layer}.lora_B.weight"]
        w = base[f"{layer}.weight"]
        out[f"{layer}.weight"] = (w.float() + (b.float() @ a.float()) * scaling).to(w.dtype)
    return out


def merged_state_dict(peft_state: Mapping[str, torch.Tensor], params: LoraParams) -> dict[str, torch.Tensor]:
    """A peft LoRA model's state dict merged into plain Hugging Face weights (see :func:`merge_adapter`)."""
    base, adapter = split_state(peft_state)
    return merge_adapter(base, adapter, params.scaling)


def adapter_to_peft_state(adapter: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """peft's file names -> the in-memory parameter names (``lora_A.weight`` -> ``lora_A.default.weight``)."""
    out = {}
    for key, value in adapter.items():
        head, _, rest = key.partition(".lora_")
        which, _, leaf = rest.partition(".")
        out[f"{head}.lora_{which}.{ADAPTER_NAME}.{leaf}"] = value
    return out


# -- tied embeddings ------------------------------------------------------------------
def unties_embeddings(params: LoraParams | None, config: Any) -> bool:
    """Whether weights merged under ``params`` need a model whose output layer is not its input
    embedding: an adapter on the output layer of a model ``config`` says is tied."""
    return (
        params is not None
        and params.enabled
        and params.train_unembed
        and bool(getattr(config, "tie_word_embeddings", False))
    )


def merged_config(config: Any, params: LoraParams | None) -> Any:
    """A copy of a transformers ``config`` that holds merged weights: ``tie_word_embeddings=False``
    when :func:`unties_embeddings`, else the same values."""
    out = copy.deepcopy(config)
    if unties_embeddings(params, config):
        out.tie_word_embeddings = False
    return out


# -- files ----------------------------------------------------------------------------
def write_adapter(folder: Path, adapter: Mapping[str, torch.Tensor], config: Any) -> None:
    """peft's adapter layout: ``adapter_model.safetensors`` (file names) + ``adapter_config.json``."""
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().cpu().contiguous() for k, v in adapter.items()}
    save_file(tensors, str(folder / ADAPTER_WEIGHTS), metadata={"format": "pt"})
    config.save_pretrained(str(folder))


def read_adapter(folder: Path) -> dict[str, torch.Tensor]:
    """The adapter tensors of a folder :func:`write_adapter` (or peft) wrote, under peft's file names."""
    from safetensors.torch import load_file

    file = folder / ADAPTER_WEIGHTS
    if not file.is_file():
        raise TrinityError(f"{folder}: no {ADAPTER_WEIGHTS} (not a LoRA checkpoint)")
    return load_file(str(file))


def is_adapter_folder(folder: str | Path) -> bool:
    """Whether ``folder`` holds a LoRA adapter (peft's ``adapter_config.json``)."""
    return (Path(folder) / ADAPTER_CONFIG).is_file()


def write_base_note(folder: Path, base_model: str, params: LoraParams | None) -> None:
    """``base_model.json``: the folder training started from and the adapter's params (null: full weights)."""
    lora = dataclasses.asdict(params) if params is not None and params.enabled else None
    (folder / BASE_MODEL_FILE).write_text(json.dumps({"base_model": base_model, "lora": lora}, indent=1))


def read_base_note(folder: str | Path) -> tuple[str, LoraParams | None]:
    """(base model folder, adapter params or None) of a checkpoint; one clear error when there is no note."""
    note = Path(folder) / BASE_MODEL_FILE
    if not note.is_file():
        raise TrinityError(f"{folder}: no {BASE_MODEL_FILE} (not a checkpoint written by a train engine)")
    try:  # one line for a hand-edited note too (export and resume read it)
        data = json.loads(note.read_text())
        return str(data["base_model"]), (LoraParams(**data["lora"]) if data.get("lora") else None)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise TrinityError(f"{note}: not the note a train engine writes ({type(exc).__name__}: {exc})") from None


def check_checkpoint(folder: Path, params: LoraParams | None) -> None:
    """One clear error unless ``folder`` is a checkpoint an engine training ``params`` (None:
    every weight) can load: a Hugging Face folder for a full engine, an adapter of the same
    shape and scale for a LoRA one."""
    adapter = is_adapter_folder(folder)
    if not adapter and not (folder / "config.json").is_file():
        why = "does not exist" if not folder.exists() else f"holds neither config.json nor {ADAPTER_CONFIG}"
        raise TrinityError(f"checkpoint {folder} {why}")
    if params is None and adapter:
        raise TrinityError(
            f"{folder} holds a LoRA adapter, and this engine trains every weight: build it with "
            f"the LoRA params of the checkpoint's {BASE_MODEL_FILE}"
        )
    if params is not None and not adapter:
        raise TrinityError(
            f"{folder} holds full weights, not a LoRA adapter (no {ADAPTER_CONFIG}), and this engine "
            f"trains a rank-{params.rank} adapter"
        )
    if params is not None and (folder / BASE_MODEL_FILE).is_file():
        _, saved = read_base_note(folder)
        if saved is None or not saved.same_adapter(params):
            raise TrinityError(f"{folder}: its adapter ({saved}) is not the one this engine trains ({params})")


# -- export ---------------------------------------------------------------------------
TRAINING_FILES = (
    BASE_MODEL_FILE,
    "optimizer.safetensors",
    "rng_state.safetensors",
    "trainer_state.json",
    "optimizer.pt",
)  # what a checkpoint holds beside the model: left out of an export


def checkpoint_model_folder(path: Path) -> Path:
    """The model checkpoint in ``path``: ``path`` itself, or the ``model`` folder of a run's
    checkpoint (``runs/<name>/checkpoints/step_000010``)."""
    if not is_adapter_folder(path) and not (path / "config.json").is_file() and (path / "model").is_dir():
        return path / "model"
    return path


def export_checkpoint(checkpoint: str | Path, out: str | Path, base: str | None = None) -> Path:
    """Write a train engine's checkpoint as a plain Hugging Face folder at ``out``.

    A LoRA checkpoint is merged into its base model (``base_model.json``, or ``base``: a
    folder or built-in id), float32, with ``tie_word_embeddings=False`` when the adapter
    parts the output layer from the input embedding (:func:`merged_config`); the base's
    tokenizer and generation config come along. A full-weights checkpoint is copied without
    its training state (optimiser, RNG, step). Everything is written into a temporary folder
    beside ``out`` and renamed into place, so a failure leaves nothing half-written; an
    ``out`` that exists must be an empty folder.
    """
    src, dest = checkpoint_model_folder(Path(checkpoint)), Path(out)
    adapter = is_adapter_folder(src)
    if not adapter and not (src / "config.json").is_file():
        why = "does not exist" if not src.exists() else f"is not a checkpoint (no config.json, no {ADAPTER_CONFIG})"
        raise TrinityError(f"{src} {why}")
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise TrinityError(f"{dest} already exists and is not an empty folder; choose another --out")
    dest.parent.mkdir(parents=True, exist_ok=True)
    import os
    import shutil
    import tempfile

    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        if adapter:
            _write_merged(src, tmp, base)
        else:
            for item in src.iterdir():
                if item.is_symlink() or item.suffix in (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt"):
                    raise TrinityError(f"{item}: a symbolic link or a pickle file (never read, never exported)")
                if item.name not in TRAINING_FILES:
                    (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp / item.name)
        _usual_permissions(tmp)
        if dest.exists():
            dest.rmdir()  # empty, checked above
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _usual_permissions(root: Path) -> None:
    """What a plain ``mkdir`` / ``open`` would have given under the umask (the temporary
    folder, and files some writers create through temporary files, start private)."""
    import os

    mask = os.umask(0)
    os.umask(mask)
    for path in [root, *root.rglob("*")]:
        path.chmod((0o777 if path.is_dir() else 0o666) & ~mask)


def _write_merged(src: Path, out: Path, base: str | None) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from trinity_like.models.resolve import resolve_model_path

    noted, params = read_base_note(src)
    if params is None:
        raise TrinityError(f"{src}: {BASE_MODEL_FILE} names no LoRA params for its adapter")
    base_path = resolve_model_path(base) if base is not None else Path(noted)
    if not (base_path / "config.json").is_file():
        raise TrinityError(f"base model {base_path} of {src} not found (pass --base FOLDER)")
    model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32, use_safetensors=True)
    adapter = read_adapter(src)
    state = model.state_dict()
    unknown = [layer for layer in adapter_layers(adapter) if f"{layer}.weight" not in state]
    if unknown:
        raise TrinityError(f"{src}: the adapter does not fit base model {base_path} (no layer {unknown[0]})")
    merged = merge_adapter(state, adapter, params.scaling)
    with torch.device("meta"):
        plain = AutoModelForCausalLM.from_config(merged_config(model.config, params))
    plain.load_state_dict(merged, assign=True, strict=True)
    plain.generation_config = model.generation_config
    plain.save_pretrained(out, safe_serialization=True)
    if (base_path / "tokenizer_config.json").is_file():
        AutoTokenizer.from_pretrained(base_path).save_pretrained(out)
