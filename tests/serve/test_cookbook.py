"""tinker-cookbook (installed by scripts/setup.sh, --no-deps) imports with our transformers and
its building blocks talk to `trinity-like serve` through the SDK unchanged."""

from __future__ import annotations

import importlib

import pytest

MODULES = [
    "tinker_cookbook",
    "tinker_cookbook.rl.train",
    "tinker_cookbook.rl.types",
    "tinker_cookbook.renderers",
    "tinker_cookbook.tokenizer_utils",
    "tinker_cookbook.checkpoint_utils",
]


@pytest.mark.parametrize("name", MODULES)
def test_cookbook_imports(name):
    importlib.import_module(name)


def test_cookbook_tokenizer_and_checkpoint_helpers_against_the_server(server, tiny_model):
    import tinker
    from tinker_cookbook.tokenizer_utils import get_tokenizer

    url, _ = server
    tokenizer = get_tokenizer(tiny_model)  # a folder name loads offline
    service = tinker.ServiceClient(base_url=url)
    training = service.create_lora_training_client(tiny_model, rank=2, seed=0).result()
    assert training.get_tokenizer().encode("one plus") == tokenizer.encode("one plus")
    service.close("success").result()
