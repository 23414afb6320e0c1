"""Every storage keeps the row's weight identity (version and digest) as written, and an older row without one reads back."""

from __future__ import annotations

import json

import pytest

from trinity_like.buffer.storage import open_storage
from trinity_like.experience import Experience
from trinity_like.plugins import load_plugins

load_plugins()


@pytest.mark.parametrize("name", ["memory", "sqlite", "jsonl"])
def test_the_weights_digest_is_stored_and_claimed_back(tmp_path, name):
    storage = open_storage(name, run_dir=tmp_path)
    try:
        rows = [
            Experience(tokens=[1, 2, 3], prompt_length=1, model_version=v, weights_digest=f"{v:016x}", eid=f"e{v}")
            for v in (4, 7)
        ]
        storage.put(rows)
        got = storage.claim(2, order="fifo", timeout=5.0)
        assert sorted((r.model_version, r.weights_digest) for r in got) == [
            (4, "0000000000000004"),
            (7, "0000000000000007"),
        ]
    finally:
        storage.close()


def test_a_row_written_before_the_field_reads_with_no_digest():
    old = Experience(tokens=[1, 2], prompt_length=1).to_dict()
    del old["weights_digest"]
    assert Experience.from_json(json.dumps(old)).weights_digest == ""  # the trainer then refuses it by name
