"""Random-weight models in the shapes of real ones, for measurements where real weights cannot go.

A GPU machine here takes at most 64 MiB per job (docs/machines.md): SmolLM2-135M's weights
(270 MB) and Qwen2.5-1.5B's (3 GB) do not travel, but speed depends on the shape, not on the
values. :data:`SHAPES` holds the architectures of the two (layers, widths, heads, vocabulary,
tied embeddings, rope base), :func:`shaped_model` builds one with random weights where it
will run, and :func:`shaped_folder` writes one as a Hugging Face folder with the tiny test
tokenizer (:mod:`.tiny`, trained offline in a second) so a recipe can run it. Such a
model's samples are noise: good for throughput, never for accuracy.

Example::

    model = shaped_model("smollm2-135m", device="cuda", dtype=torch.bfloat16)   # 134.5 M parameters
    folder = shaped_folder("smollm2-135m", tmp / "smollm2-shape")                 # model.path of a recipe
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from trinity_like.errors import TrinityError

if TYPE_CHECKING:
    import torch
    from transformers import PretrainedConfig, PreTrainedModel

# The published configs' architecture fields (HuggingFaceTB/SmolLM2-135M-Instruct, Qwen/Qwen2.5-1.5B-Instruct).
SHAPES: dict[str, tuple[str, dict[str, Any]]] = {
    "smollm2-135m": (
        "llama",
        dict(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=8192,
            rope_theta=100000.0,
            rms_norm_eps=1e-5,
            tie_word_embeddings=True,
        ),
    ),
    "qwen2.5-1.5b": (
        "qwen2",
        dict(
            vocab_size=151936,
            hidden_size=1536,
            intermediate_size=8960,
            num_hidden_layers=28,
            num_attention_heads=12,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            rms_norm_eps=1e-6,
            tie_word_embeddings=True,
            use_sliding_window=False,
        ),
    ),
    # The tiny test model's shape (models/tiny.py): the CPU smoke runs of what uses the two above.
    "tiny": (
        "qwen2",
        dict(
            vocab_size=400,
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
        ),
    ),
}


def shape_config(name: str, *, eos_token_id: int | None = None) -> PretrainedConfig:
    """The transformers config of shape ``name`` (pad = eos = ``eos_token_id``, no bos)."""
    from transformers import LlamaConfig, Qwen2Config

    if name not in SHAPES:
        raise TrinityError(f"model shape {name!r} unknown; expected one of {', '.join(SHAPES)}")
    kind, fields = SHAPES[name]
    cls = LlamaConfig if kind == "llama" else Qwen2Config
    return cls(**fields, bos_token_id=None, eos_token_id=eos_token_id, pad_token_id=eos_token_id)


def shaped_model(
    name: str, *, device: str | torch.device = "cpu", dtype: torch.dtype | None = None, seed: int = 0
) -> PreTrainedModel:
    """A random model of shape ``name``, initialised on ``device`` in ``dtype`` (default float32), in eval mode.

    The tiny tokenizer's ``<|im_end|>`` (id 2) is its eos and pad, as in SmolLM2.
    """
    import torch
    from transformers import AutoModelForCausalLM

    from trinity_like.models.tiny import build_tiny_tokenizer

    config = shape_config(name, eos_token_id=build_tiny_tokenizer().eos_token_id)
    where = torch.device(device)
    cuda = [where.index or 0] if where.type == "cuda" else []
    with torch.random.fork_rng(devices=cuda), where:  # the caller's generators are left as they were
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, dtype=dtype or torch.float32)
    model.generation_config.eos_token_id = model.generation_config.pad_token_id = config.eos_token_id
    model.generation_config.bos_token_id = None
    return model.eval()


def shaped_folder(name: str, path: str | Path, *, seed: int = 0) -> Path:
    """Write a random model of shape ``name`` (float32) and the tiny tokenizer as a Hugging Face folder."""
    import copy

    from trinity_like.models.tiny import build_tiny_tokenizer

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    shaped_model(name, seed=seed).save_pretrained(path, safe_serialization=True)
    copy.copy(build_tiny_tokenizer()).save_pretrained(path)
    return path
