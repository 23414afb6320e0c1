"""Keep freed memory in the process for reuse: large tensors without a page fault per page.

glibc serves every allocation above its mmap threshold (at most 32 MB) with a fresh ``mmap``
and gives it back to the kernel on ``free``. A training step allocates and frees tensors of
that size all the time (the LM head's logits chunk is ``[tokens, 49152]`` fp32: 157 MB for
800 tokens), so each one starts on fresh pages and faults once per 4 KB page: an element-wise
op on such a tensor runs 4-5x slower than on memory already mapped (``a - 1``, ``a.exp()``
on ``[800, 49152]``: 35 ms against 7.4 ms on the 2-core machine of ``benchmarks/``).

:func:`retain_freed_memory` asks glibc (``mallopt``) to serve large blocks from its heap too
and to keep freed memory instead of trimming it, so a step reuses the previous step's pages.
The cost is memory that stays mapped after a peak: the process's resident size holds at its
high-water mark instead of falling back between steps. Training engines call it: their
peak comes back every step anyway (a verl worker training SmolLM2 on the main job's batches:
peak 5.9 GB either way, forward/backward 20-25 % faster). The rollout engine does not: its
peak is an occasional evaluation over many prompts, worth handing back. A training worker
in a process of its own hands its freed memory back before an evaluation
(:func:`release_freed_memory`), so that its peak and the explorer's do not add up; not
after every step, where faulting the pages in again made a verl worker's forward/backward
~20 % slower (SmolLM2, the main job's batches: 8.9 s against 7.4 s).
``TRINITY_LIKE_MALLOC=system`` leaves the C allocator as it is (and a C library without
``mallopt`` is left alone).
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys

ENV_VAR = "TRINITY_LIKE_MALLOC"
M_TRIM_THRESHOLD = -1  # glibc's <malloc.h>: free memory at the heap top kept up to this many bytes
M_MMAP_MAX = -4  # most blocks served by mmap at once; 0: none, every block from the heap
KEEP_BYTES = 1 << 30  # freed memory kept at the heap top (1 GiB) before glibc trims it


def _glibc(function: str):
    """``function`` of the C library this process runs on, where the allocator is ours to
    tune (Linux, ``TRINITY_LIKE_MALLOC`` not ``system``, a C library that has it); else None."""
    if not sys.platform.startswith("linux") or os.environ.get(ENV_VAR, "") == "system":
        return None
    return getattr(ctypes.CDLL(None), function, None)


@functools.cache
def retain_freed_memory() -> bool:
    """Tune this process's glibc allocator as described above (once); True if it is tuned."""
    mallopt = _glibc("mallopt")
    return mallopt is not None and mallopt(M_MMAP_MAX, 0) == 1 and mallopt(M_TRIM_THRESHOLD, KEEP_BYTES) == 1


def release_freed_memory() -> bool:
    """Hand the memory freed so far back to the kernel (glibc's ``malloc_trim``); True if done.
    The pages of live tensors stay; the next peak faults its pages in again."""
    trim = _glibc("malloc_trim")
    return trim is not None and trim(0) in (0, 1)
