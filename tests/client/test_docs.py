"""The client's snippets in README.md and docs/client.md run as written (on the tiny test
model where they say so), and the doc's tables match what they describe: the SDK's AdamParams
defaults, SmolLM2's export sizes, the example scripts."""

from __future__ import annotations

import ast
import math
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = (ROOT / "docs" / "client.md").read_text()


def doc_block(marker: str, lang: str = "python") -> str:
    """The one ``lang`` block of docs/client.md that contains ``marker``."""
    found = [b for b in re.findall(rf"^```{lang}\n(.*?)^```", DOC, flags=re.S | re.M) if marker in b]
    assert len(found) == 1, f"{len(found)} {lang} blocks hold {marker!r}"
    return found[0]


def section(title: str) -> str:
    """The text of docs/client.md under the heading that starts with ``title``, up to the next one."""
    return re.split(r"^#{2,3} ", DOC.split(f"\n{title}", 1)[1], flags=re.M)[0]


def run_python(code: str, cwd: Path) -> list[str]:
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout.strip().splitlines()


def first_client_block(path: Path) -> str:
    blocks = re.findall(r"^```python\n(.*?)^```", path.read_text(), flags=re.S | re.M)
    return next(b for b in blocks if "import trinity_like.client as tinker" in b)


@pytest.mark.parametrize("doc", ["README.md", "docs/client.md"])
def test_snippet_runs_as_written(doc, tmp_path):
    code = first_client_block(ROOT / doc)
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert float(lines[0].split()[0]) > 0  # loss:sum of the example
    if doc == "docs/client.md":  # parse_response's (message, ok), as the text below the block says
        message, ok = ast.literal_eval(lines[-1])
        assert message.keys() == {"role", "content"} and message["role"] == "assistant" and isinstance(ok, bool)


def test_the_rl_train_snippet_runs_as_written(tmp_path):
    text = (ROOT / "docs" / "client.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    code = next(b for b in blocks if "cookbook.rl.train import" in b)
    result = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    records, accuracy = result.stdout.split()
    assert int(records) == 3 and 0 <= float(accuracy) <= 1
    rows = (tmp_path / "runs" / "calc" / "metrics.jsonl").read_text().splitlines()
    assert len(rows) == 3 and (tmp_path / "runs" / "calc" / "checkpoints.jsonl").exists()


def test_the_importance_sampling_datum_block_runs_on_policy(tmp_path):
    """The datums line up position for position with the sampler's tokens: the learner's
    logprobs of the sampled tokens equal the sampler's, so k1 is ~0 (targets shifted by one
    position gave k1 = 13 on the same run)."""
    loss, k1 = map(float, run_python(doc_block('"importance_sampling"'), tmp_path)[-1].split())
    assert math.isfinite(loss) and abs(k1) < 1e-3, (loss, k1)


def test_the_custom_loss_block_runs(tmp_path):
    loss, nll, datums, grad_norm = map(float, run_python(doc_block("forward_backward_custom("), tmp_path)[-1].split())
    assert loss == pytest.approx(nll) and loss > 0 and datums == 2 and grad_norm > 0


def test_the_checkpoint_block_and_the_export_command_run_as_written(tmp_path):
    path, weights, resumed = run_python(doc_block('run_name="mult"'), tmp_path)[-1].split()
    assert (path, weights) == ("runs/client/mult/state/step-0", "runs/client/mult/sampler_weights/step-0")
    assert re.fullmatch(r"tiny-random-\d{8}-\d{6}(-\d+)?", resumed)
    command = shlex.split(doc_block("trinity-like export", lang="bash").strip())
    assert command[0] == "trinity-like"
    result = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", *command[1:]],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    import torch
    from safetensors.torch import load_file

    exported = load_file(tmp_path / command[command.index("--out") + 1] / "model.safetensors")
    assert exported and all(t.dtype == torch.bfloat16 for t in exported.values())
    assert "lm_head.weight" in exported  # rank 8 with train_unembed (the default): the head is untied


def test_the_adam_params_table_is_the_sdks_defaults():
    from tinker import types

    rows = dict(re.findall(r"^\| `(\w+)` \| ([^ |]+) \|", section("## The optimiser"), flags=re.M))
    fields = types.AdamParams.model_fields
    assert rows.keys() == fields.keys()
    for name, value in rows.items():
        assert float(value) == fields[name].default, name


def test_the_export_sizes_are_smollm2s_parameters_times_bytes():
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from trinity_like.models.resolve import resolve_model_path

    config = AutoConfig.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    with torch.device("meta"):
        params = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters())  # tied: counted once
    head = config.vocab_size * config.hidden_size
    text = section("## Checkpoints")
    assert config.tie_word_embeddings and f"{config.vocab_size} x {config.hidden_size} matrix" in text
    assert f"{head / 1e6:.1f} M more parameters" in text and f"({params / 1e6:.1f} M parameters)" in text
    table = re.findall(r"^\| [^|]*`train_unembed=(\w+)`[^|]*\| (\d+) MB \| (\d+) MB \|", text, flags=re.M)
    sizes = {unembed: (int(fp32), int(bf16)) for unembed, fp32, bf16 in table}
    untied = params + head
    assert sizes == {
        "False": (round(params * 4 / 1e6), round(params * 2 / 1e6)),
        "True": (round(untied * 4 / 1e6), round(untied * 2 / 1e6)),
    }


def test_every_example_in_the_table_is_a_script_of_the_repo():
    commands = re.findall(r"^\| `python (examples/client/\w+\.py)[^`]*` \|", DOC, flags=re.M)
    assert commands and all((ROOT / c).is_file() for c in commands)
