"""The buffer: between explorer and trainer, and the door for offline data.

- :mod:`.base` -- what sample strategies call (``ExperienceSource``, ``ExpertSource``).
- :mod:`.storage` -- the registered storages (``BUFFER_STORAGE``) and ``open_storage``:
  :mod:`.sqlite_storage` (default; persistent, crash-safe, exactly-once),
  :mod:`.memory_storage` (bounded queue with back-pressure, in-process or a Ray actor),
  :mod:`.jsonl_storage` (JSON Lines files).
- :mod:`.rows` -- how rows are serialised (JSON, or JSON + packed arrays; never pickle).
- :mod:`.datasets` -- validated task / SFT / pair / expert sets with a resumable order; their
  rows read and checked line by line in :mod:`.records`.
- :mod:`.task_sources` -- a generated data set's task source (TASK_SOURCE) looked up by name.
- :mod:`.chat` -- chat rows to tokens with assistant-only masks.
"""
