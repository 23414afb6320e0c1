"""Model resolution: local folders, built-in ids, clear errors, atomic and exclusive conversion."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from trinity_like.errors import TrinityError
from trinity_like.models import ensure_converted, load_model, render_prompt, resolve_model_path
from trinity_like.models.tiny import build_tiny_model


def test_local_folder_loads(tmp_path):
    path = build_tiny_model(tmp_path / "m", seed=2)
    model, tok = load_model(path)
    ref, _ = build_tiny_model(seed=2)
    ids = torch.tensor([tok.encode("What is 1 + 2?")])
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, rtol=1e-5, atol=1e-5)
    assert resolve_model_path(str(path)) == path


def test_missing_model_names_what_was_tried(tmp_path):
    with pytest.raises(TrinityError) as err:
        resolve_model_path(tmp_path / "nowhere")
    msg = str(err.value)
    assert "nowhere" in msg and "is not a folder" in msg and "smollm2-135m-instruct" in msg and "\n" not in msg
    (tmp_path / "empty").mkdir()
    with pytest.raises(TrinityError, match="without config.json"):
        resolve_model_path(tmp_path / "empty")


def test_builtin_tiny_converts_once_into_the_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRINITY_LIKE_CACHE", str(tmp_path))
    path = resolve_model_path("tiny-random")
    assert path == tmp_path / "models" / "tiny-random" and (path / "config.json").is_file()
    stamp = (path / "config.json").stat().st_mtime_ns
    assert resolve_model_path("tiny-random") == path
    assert (path / "config.json").stat().st_mtime_ns == stamp
    model, tok = load_model("tiny-random")
    assert render_prompt(tok, [{"role": "user", "content": "hi"}]) == tok.encode(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    )


def test_failed_conversion_leaves_nothing(tmp_path):
    def broken(dest: Path) -> None:
        (dest / "config.json").write_text("{}")  # half written ...
        raise OSError("disk full")

    with pytest.raises(OSError):
        ensure_converted(tmp_path / "m", broken)
    assert not (tmp_path / "m").exists()
    assert not list(tmp_path.glob(".m.tmp-*"))


KILLED = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from trinity_like.models import ensure_converted
    def slow(dest):
        (dest / "config.json").write_text("{}")
        print("started", flush=True)
        time.sleep(60)
    ensure_converted(Path(sys.argv[1]), slow)
    """
)


def test_killed_conversion_leaves_no_half_folder_and_the_next_one_cleans_up(tmp_path):
    target = tmp_path / "m"
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(target)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "started"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not target.exists()
    assert len(list(tmp_path.glob(".m.tmp-*"))) == 1  # the dead process's scratch folder

    def good(dest: Path) -> None:
        (dest / "config.json").write_text("{}")

    assert ensure_converted(target, good) == target
    assert (target / "config.json").is_file()
    assert not list(tmp_path.glob(".m.tmp-*"))


COUNTING = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from trinity_like.models import ensure_converted
    def slow(dest):
        with open(sys.argv[2], "a") as f:
            f.write("convert\\n")
        time.sleep(0.5)
        (dest / "config.json").write_text("{}")
    ensure_converted(Path(sys.argv[1]), slow)
    """
)


def test_two_processes_convert_once(tmp_path):
    log = tmp_path / "log.txt"
    args = [sys.executable, "-c", COUNTING, str(tmp_path / "m"), str(log)]
    procs = [subprocess.Popen(args) for _ in range(2)]
    assert [p.wait(120) for p in procs] == [0, 0]
    assert log.read_text().count("convert") == 1
    assert (tmp_path / "m" / "config.json").is_file()


@pytest.mark.slow
def test_smollm2_converts_and_knows_paris(tmp_path, monkeypatch):
    pytest.importorskip("gguf")
    monkeypatch.setenv("TRINITY_LIKE_CACHE", str(tmp_path))
    model, tok = load_model("smollm2-135m-instruct")
    assert tok.eos_token == tok.pad_token == "<|im_end|>"
    ids = tok("The capital of France is", return_tensors="pt")
    out = model.generate(**ids, max_new_tokens=2, do_sample=False)
    assert tok.decode(out[0, ids.input_ids.shape[1] :]).startswith(" Paris")
