"""Keys and values of finished sequences, kept so a prompt that extends one skips its prefill.

Why: in a multi-turn episode turn k's prompt is turn k-1's prompt + the sampled response
+ the observation, token for token. Re-prefilling that history every turn makes the cost
of a turn grow with the episode's length; reusing the keys/values the engine already
computed leaves only the new tokens (the last response token and the observation) to run.

What is kept: when a sample finishes, the tokens whose keys are in its cache slot (the
prompt and every response token but the last, which was never fed back) and a copy of
those keys/values, ``kv_L2HnD: [layers, 2 (key, value), kv heads, n tokens, head dim]``.
Keys are stored after rotary embedding, at positions ``0..n-1``: a prompt that starts
with the same tokens has them at the same positions, so they are reused as they are and
its remaining tokens are computed from position ``matched`` on.

How a prompt finds its longest kept prefix -- exact on token ids. The index is a hash
of block-aligned prefixes (as vLLM's automatic prefix caching): every full block of
``BLOCK`` tokens of a kept sequence is named by a chained hash ``h_k = hash((h_{k-1},
block_k))``, so ``h_k`` names the whole prefix up to block k, and ``index[h_k]`` holds
the kept sequences that start with it. A lookup walks the prompt's blocks until a hash is
missing (one tuple hash per 16 tokens), then compares the token ids of the few sequences
under the deepest hash with the prompt's (numpy, exact) to extend the match past the
block boundary to the first differing token. Collisions cannot give wrong keys: the
match length is always the verified count of equal tokens. Why not a token trie: one
Python node per token costs far more memory and time than the keys' bookkeeping is worth,
and evicting a sequence means pruning node chains; here eviction drops one dict entry
per block. Matches shorter than one block are not reused (they would save little).

Memory: bounded by ``budget`` tokens over all kept sequences, least recently used first
out (a hit or a new entry counts as a use). Kept sequences do not share storage: a group
of G samples keeps its prompt G times -- simple, and the budget counts it honestly. A
sequence that fully contains the one its prompt matched replaces it (any prompt matching
the older one matches the newer at least as far), so an episode holds one entry, not one
per turn.

Keys depend on the weights: the engine clears this store whenever its weights change.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

BLOCK = 16  # tokens per hashed block: the granularity of the index, not of reuse


@dataclass(eq=False)  # identity: entries are found by `is` and used as dict values
class PrefixEntry:
    """One kept sequence: its token ids and their keys/values."""

    tokens: np.ndarray  # int64 [n]
    kv_L2HnD: torch.Tensor  # [layers, 2, kv heads, n, head dim]
    hashes: tuple[int, ...]  # chained hash of each full block prefix, see block_hashes


def block_hashes(tokens: Sequence[int], blocks: int) -> list[int]:
    """Chained hashes of the first ``blocks`` full blocks: entry k names ``tokens[:BLOCK*(k+1)]``."""
    out, h = [], 0
    for k in range(blocks):
        h = hash((h, tuple(tokens[k * BLOCK : (k + 1) * BLOCK])))
        out.append(h)
    return out


class PrefixCache:
    """LRU store of kept sequences with a block-hash index; see the module docstring."""

    def __init__(self, budget: int) -> None:
        self.budget = budget  # tokens over all entries; 0 keeps nothing
        self.entries: OrderedDict[int, PrefixEntry] = OrderedDict()  # id(entry) -> entry, oldest first
        self.index: dict[int, dict[int, PrefixEntry]] = {}  # block hash -> entries under it
        self.tokens = 0  # kept tokens now
        self.stats = {"lookups": 0, "hits": 0, "prompt_tokens": 0, "reused_tokens": 0}

    def clear(self) -> None:
        """Drop every entry (their keys belong to weights that are gone)."""
        self.entries.clear()
        self.index.clear()
        self.tokens = 0

    def lookup(self, prompt: Sequence[int]) -> tuple[PrefixEntry | None, int]:
        """The kept sequence sharing the longest prefix with ``prompt``, and that length.

        At most ``len(prompt) - 1`` tokens match: the prompt's last token always runs,
        since its logits give the first response token. ``(None, 0)`` when nothing
        shares a full block.
        """
        limit = len(prompt) - 1
        self.stats["lookups"] += 1
        self.stats["prompt_tokens"] += len(prompt)
        if not self.entries or limit < BLOCK:
            return None, 0
        candidates: dict[int, PrefixEntry] | None = None
        h = 0
        for k in range(limit // BLOCK):
            h = hash((h, tuple(prompt[k * BLOCK : (k + 1) * BLOCK])))
            found = self.index.get(h)
            if not found:
                break
            candidates = found
        if candidates is None:
            return None, 0
        ids = np.asarray(prompt[:limit], dtype=np.int64)
        best, best_len = None, 0
        for entry in candidates.values():
            n = min(len(entry.tokens), limit)
            differ = np.flatnonzero(entry.tokens[:n] != ids[:n])
            length = int(differ[0]) if differ.size else n
            if length > best_len:
                best, best_len = entry, length
        if best is None or best_len < BLOCK:  # only a hash collision gets here
            return None, 0
        self.entries.move_to_end(id(best))
        self.stats["hits"] += 1
        self.stats["reused_tokens"] += best_len
        return best, best_len

    def insert(
        self, tokens: Sequence[int], read_kv: Callable[[], torch.Tensor], source: PrefixEntry | None = None
    ) -> None:
        """Keep ``tokens`` with the keys/values ``read_kv()`` returns (called only if kept).

        ``source``: the entry this sequence's prompt matched in full; it is dropped,
        since the new sequence extends it. A sequence already contained in a kept one
        (a greedy group's identical samples) is not kept twice.
        """
        n = len(tokens)
        if n < BLOCK or n > self.budget:
            return
        hashes = block_hashes(tokens, n // BLOCK)
        ids = np.asarray(tokens, dtype=np.int64)
        for entry in self.index.get(hashes[-1], {}).values():
            if len(entry.tokens) >= n and np.array_equal(entry.tokens[:n], ids):
                self.entries.move_to_end(id(entry))
                return
        if source is not None and self.entries.get(id(source)) is source and len(source.tokens) <= n:
            self._remove(source)
        entry = PrefixEntry(ids, read_kv(), tuple(hashes))
        assert entry.kv_L2HnD.shape[3] == n, (entry.kv_L2HnD.shape, n)
        while self.tokens + n > self.budget:
            self._remove(next(iter(self.entries.values())))
        self.entries[id(entry)] = entry
        for h in entry.hashes:
            self.index.setdefault(h, {})[id(entry)] = entry
        self.tokens += n

    def _remove(self, entry: PrefixEntry) -> None:
        del self.entries[id(entry)]
        for h in entry.hashes:
            under = self.index[h]
            del under[id(entry)]
            if not under:
                del self.index[h]
        self.tokens -= len(entry.tokens)
