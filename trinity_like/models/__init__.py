"""Models: resolve a reference (local folder or built-in id) to a loaded causal LM and tokenizer.

The tiny test model lives in :mod:`trinity_like.models.tiny` (import it directly; it is
not re-exported so importing this package stays light).
"""

from trinity_like.models.chat import render_prompt
from trinity_like.models.resolve import (
    BUILTIN_MODELS,
    cache_dir,
    ensure_converted,
    load_model,
    load_tokenizer,
    resolve_model_path,
)

__all__ = [
    "BUILTIN_MODELS",
    "cache_dir",
    "ensure_converted",
    "load_model",
    "load_tokenizer",
    "render_prompt",
    "resolve_model_path",
]
