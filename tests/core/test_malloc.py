"""trinity_like.malloc: freed large blocks are reused, not handed back and faulted in again."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

# Allocate, touch and free a 64 MB tensor again and again; count the page faults of the last
# ones, after the heap has settled. In a fresh interpreter: the tuning is per process, for good.
PROBE = """
import json, resource, sys, torch
from trinity_like.malloc import retain_freed_memory
tuned = retain_freed_memory() if sys.argv[1] == "tune" else False
torch.set_num_threads(1)
def faults_of_a_fresh_block():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    x = torch.empty(16 * 1024 * 1024).fill_(1.0)  # 64 MB, above glibc's largest mmap threshold
    del x
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
faults = [faults_of_a_fresh_block() for _ in range(16)]  # the heap settles after a few blocks
print(json.dumps({"tuned": tuned, "faults": min(faults[-4:])}))
"""


def probe(mode: str, env: dict | None = None) -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE, mode], capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_tuned_allocator_reuses_freed_large_blocks():
    pages = 64 * 1024 * 1024 // 4096
    stock, tuned = probe("stock"), probe("tune")
    assert stock["faults"] > pages // 2  # each fresh 64 MB block faults in page by page
    assert tuned["tuned"] and tuned["faults"] < pages // 20  # the freed block is reused


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's mallopt")
def test_env_var_leaves_the_allocator_alone():
    import os

    result = probe("tune", env={**os.environ, "TRINITY_LIKE_MALLOC": "system"})
    assert not result["tuned"] and result["faults"] > 64 * 1024 * 1024 // 4096 // 2


RELEASE_PROBE = """
import json, psutil, torch
from trinity_like.malloc import release_freed_memory, retain_freed_memory
assert retain_freed_memory()
blocks = [torch.ones(16 * 1024 * 1024) for _ in range(4)]  # 256 MB, touched
del blocks
kept = psutil.Process().memory_info().rss
released = release_freed_memory()
print(json.dumps({"released": released, "freed_mb": (kept - psutil.Process().memory_info().rss) / 2**20}))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_release_hands_retained_memory_back():
    """Tuned, the freed 256 MB stay resident; released, they leave the process."""
    out = subprocess.run([sys.executable, "-c", RELEASE_PROBE], capture_output=True, text=True, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["released"] and result["freed_mb"] > 200
