"""``trinity-like export``: a checkpoint as a plain Hugging Face folder, run the way a user runs it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer

from trinity_like.cli import main
from trinity_like.models.tiny import build_tiny_model
from trinity_like.pipeline.checkpoint import write_manifest
from trinity_like.trainer.local_engine import LocalEngine
from trinity_like.trainer.lora import LoraParams
from trinity_like.trainer.params import ModelParams, OptimParams

B, P, R = 4, 5, 4
TRAINING_FILES = {"optimizer.safetensors", "rng_state.safetensors", "trainer_state.json", "base_model.json"}


def export(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RAY_AUTH_MODE": "disabled"}
    return subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "export", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory) -> str:
    return str(build_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=3))


@pytest.fixture(scope="module")
def batch() -> dict[str, torch.Tensor]:
    """Unpadded rows of random tokens: P prompt then R response tokens."""
    ids = torch.randint(3, 400, (B, P + R), generator=torch.Generator().manual_seed(2))
    return {
        "input_ids": ids,
        "attention_mask": torch.ones_like(ids),
        "position_ids": torch.arange(P + R).expand(B, -1),
        "response_mask": torch.ones(B, R),
    }


def nll(outputs, batch):
    return -(outputs["logprob"] * batch["response_mask"]).sum() / batch["num_tokens"], {}


def trained(path: str, batch, lora: LoraParams | None) -> LocalEngine:
    engine = LocalEngine(ModelParams(path=path, lora=lora), OptimParams(lr=5e-2))
    for _ in range(2):
        engine.forward_backward(batch, nll)
        engine.optim_step()
    return engine


def save_state(engine: LocalEngine, folder) -> None:
    """What a client's ``save_state`` writes: the engine's folder and its manifest of content hashes."""
    engine.save(str(folder))
    write_manifest(folder)


def logprobs(model: torch.nn.Module, batch) -> torch.Tensor:
    """Oracle: a plain forward, log_softmax over the vocabulary, the response tokens' entries."""
    with torch.no_grad():
        logits = model.eval()(input_ids=batch["input_ids"]).logits[:, P - 1 : -1].float()
    return torch.log_softmax(logits, -1).gather(-1, batch["input_ids"][:, P:, None]).squeeze(-1)


@pytest.mark.parametrize("train_unembed", [True, False], ids=["unembed", "no-unembed"])
def test_lora_checkpoint_exports_a_merged_folder_with_the_engines_logprobs(tiny_path, batch, tmp_path, train_unembed):
    engine = trained(tiny_path, batch, LoraParams(rank=4, seed=1, train_unembed=train_unembed))
    save_state(engine, tmp_path / "ckpt")
    result = export(str(tmp_path / "ckpt"), "--out", str(tmp_path / "plain"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "plain") and not result.stderr  # no progress bars either

    names = {p.name for p in (tmp_path / "plain").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer_config.json"} <= names
    mask = os.umask(0)
    os.umask(mask)
    assert (tmp_path / "plain").stat().st_mode & 0o777 == 0o777 & ~mask  # not the temporary folder's 0700
    assert (tmp_path / "plain" / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~mask
    assert not names & TRAINING_FILES and not any(n.startswith("adapter") for n in names)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "plain")
    assert model.config.tie_word_embeddings is not train_unembed  # the merged output layer is its own
    expected = engine.compute_logprobs(batch)["logprob"]
    torch.testing.assert_close(logprobs(model, batch), expected, rtol=1e-5, atol=1e-5)
    base = AutoModelForCausalLM.from_pretrained(tiny_path)
    assert not torch.allclose(logprobs(base, batch), expected, atol=1e-3)  # training moved them
    assert AutoTokenizer.from_pretrained(tmp_path / "plain").encode("What is 2 + 3?") == AutoTokenizer.from_pretrained(
        tiny_path
    ).encode("What is 2 + 3?")


def test_full_checkpoint_is_copied_without_its_training_state(tiny_path, batch, tmp_path):
    engine = trained(tiny_path, batch, None)
    engine.save(str(tmp_path / "run" / "checkpoints" / "step_000002" / "model"))
    write_manifest(tmp_path / "run" / "checkpoints" / "step_000002", 2)  # as a run's checkpoint holds it
    (tmp_path / "plain").mkdir()  # an empty folder is fine
    result = export(str(tmp_path / "run" / "checkpoints" / "step_000002"), "--out", str(tmp_path / "plain"))
    assert result.returncode == 0, result.stderr
    names = {p.name for p in (tmp_path / "plain").iterdir()}
    assert "model.safetensors" in names and not names & TRAINING_FILES
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "plain").state_dict()
    ours = engine.state_dict()
    assert all(torch.equal(loaded[k], ours[k]) for k in ours)


def test_bad_input_is_one_line_and_writes_nothing(tiny_path, tmp_path, capsys):
    save_state(LocalEngine(ModelParams(path=tiny_path, lora=LoraParams(rank=2))), tmp_path / "ckpt")
    (tmp_path / "junk").mkdir()
    (tmp_path / "junk" / "notes.txt").write_text("hello")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    # a save_state folder is checked against its manifest like a run's checkpoint
    shutil.copytree(tmp_path / "ckpt", tmp_path / "cut")
    weights = tmp_path / "cut" / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-8])
    shutil.copytree(tmp_path / "ckpt", tmp_path / "pickled")
    (tmp_path / "pickled" / "optimizer.pt").write_bytes(b"\x80\x04K\x01.")
    shutil.copytree(tmp_path / "ckpt", tmp_path / "bare")
    (tmp_path / "bare" / "manifest.json").unlink()  # an engine's folder as it saves it: nothing to check it by
    cases = [
        ([str(tmp_path / "nope"), "--out", str(tmp_path / "o1")], "does not exist"),
        ([str(tmp_path / "junk"), "--out", str(tmp_path / "o2")], "is not a checkpoint"),
        ([str(tmp_path / "cut"), "--out", str(tmp_path / "o4")], "adapter_model.safetensors is "),
        ([str(tmp_path / "pickled"), "--out", str(tmp_path / "o5")], "optimizer.pt is a pickle file"),
        ([str(tmp_path / "bare"), "--out", str(tmp_path / "o6")], "is not a checkpoint: no manifest.json"),
        ([str(tmp_path / "ckpt"), "--out", str(tmp_path / "taken")], "already exists and is not an empty folder"),
        ([str(tmp_path / "ckpt"), "--out", str(tmp_path / "o3"), "--base", str(tmp_path / "junk")], "not found"),
    ]
    before = sorted(p.name for p in tmp_path.iterdir())
    capsys.readouterr()
    result = export(*cases[0][0])  # as a user runs it
    assert result.returncode == 2 and result.stderr.count("\n") == 1 and cases[0][1] in result.stderr, result.stderr
    for args, message in cases[1:]:  # the same entry point, in-process (a subprocess costs seconds of imports)
        assert main(["export", *args]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.startswith("trinity-like: error: ") and message in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == before  # no output, no temporary leftovers
    assert (tmp_path / "taken" / "keep.txt").read_text() == "mine"


def test_dtype_bfloat16_writes_the_float32_export_cast_in_half_the_bytes(tiny_path, batch, tmp_path):
    """A LoRA on the unembedding unties the output layer (it has its own merged weights), so
    the export carries one more vocab x hidden matrix; ``--dtype bfloat16`` halves the folder.
    Oracle: the float32 export's tensors rounded to bfloat16 by torch."""
    engine = trained(tiny_path, batch, LoraParams(rank=4, seed=1, train_unembed=True))
    save_state(engine, tmp_path / "ckpt")
    assert export(str(tmp_path / "ckpt"), "--out", str(tmp_path / "fp32")).returncode == 0
    result = export(str(tmp_path / "ckpt"), "--out", str(tmp_path / "bf16"), "--dtype", "bfloat16")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(tmp_path / "bf16") and not result.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bf16", "ckpt", "fp32"]  # nothing staged left behind
    full = load_file(tmp_path / "fp32" / "model.safetensors")
    half = load_file(tmp_path / "bf16" / "model.safetensors")
    assert "lm_head.weight" in full and full.keys() == half.keys()  # untied: its own output layer
    for name, tensor in full.items():
        assert half[name].dtype == torch.bfloat16 and torch.equal(half[name], tensor.to(torch.bfloat16)), name
    size = {d: (tmp_path / d / "model.safetensors").stat().st_size for d in ("fp32", "bf16")}
    assert abs(size["bf16"] / size["fp32"] - 0.5) < 0.01, size
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "bf16")
    assert model.config.dtype == torch.bfloat16 and not model.config.tie_word_embeddings
    assert {p.name for p in (tmp_path / "bf16").iterdir()} >= {"tokenizer_config.json", "generation_config.json"}


def test_dtype_is_checked_and_a_taken_out_writes_nothing(tiny_path, tmp_path, capsys):
    save_state(LocalEngine(ModelParams(path=tiny_path, lora=LoraParams(rank=2))), tmp_path / "ckpt")
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "keep.txt").write_text("mine")
    with pytest.raises(SystemExit):
        main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "o"), "--dtype", "int8"])
    assert "invalid choice: 'int8'" in capsys.readouterr().err
    assert main(["export", str(tmp_path / "ckpt"), "--out", str(tmp_path / "taken"), "--dtype", "bfloat16"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "already exists and is not an empty folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt", "taken"]
