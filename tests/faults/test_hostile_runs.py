"""Run names, checkpoints and exports that try to leave the run folder (issue 36, part 4),
through the real CLI in child processes.

Each case checks the whole contract: exit status 2, one ``trinity-like: error:`` line naming
what is wrong (the recipe key and line, or the checkpoint file), and nothing written outside
the run folder -- every path under the test's folder (links not followed) keeps its kind,
size and modification time, except inside the run folder a resume opens. A case that
"resumes" copies the uninterrupted 3-step run (``straight``), breaks one thing, and runs the
same command with one more step.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import stat
import sys
from pathlib import Path

import torch
from _lib.faultlib import RECIPE, command, one_line_error, record, run
from safetensors.torch import save_file

from trinity_like.pipeline.checkpoint import write_manifest

RUN = "grpo_arith"  # the recipe's name: the run folder is <run_root>/grpo_arith


def tree(root: Path, skip: Path | None = None) -> dict[str, tuple[int, int, int]]:
    """Every path under ``root`` (links not followed), but those under ``skip``: kind, size, mtime."""
    out = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top) / name
            if skip is not None and (path == skip or skip in path.parents):
                continue
            st = path.lstat()
            out[str(path.relative_to(root))] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
    return out


# -- run and stage names ---------------------------------------------------------------------------
def recipe_named(folder: Path, name_line: str, extra: str = "") -> Path:
    """The fault suite's recipe with its ``name:`` line (line 9) replaced; ``extra`` appended."""
    text = RECIPE.read_text().replace("name: grpo_arith\n", f"{name_line}\n")
    assert text.splitlines()[8] == name_line
    path = folder / "r.yaml"
    path.write_text(text + extra)
    return path


NAME_CASES = [  # (id, override or None, the recipe's name line, extra recipe text, expected message after the file)
    ("parent", "name=../../x", None, "", r": override 'name=\.\./\.\./x': name: '\.\./\.\./x' is not"),
    ("absolute", "name={abs}", None, "", r": override 'name=/.*/abs': name: '/.*/abs' is not"),
    ("dot", "name=.", None, "", r": override 'name=\.': name: '\.' is not"),
    ("empty", "name=", None, "", r": override 'name=': name: '' is not"),
    ("slash", "name=a/b", None, "", r": override 'name=a/b': name: 'a/b' is not"),
    ("long", "name=" + "x" * 101, None, "", r": override 'name=x{101}': name: 'x{101}' is not"),
    ("newline", None, 'name: "a\\nb"', "", r":9: name: 'a\\nb' is not"),
    ("nul", None, 'name: "a\\0b"', "", r":9: name: 'a\\x00b' is not"),
    ("control", None, 'name: "a\\x1bb"', "", r":9: name: 'a\\x1bb' is not"),
    ("stage", None, "name: grpo_arith", "stages:\n  - name: ../x\n", r":\d+: stages\.0\.name: '\.\./x' is not"),
]


def test_run_and_stage_names_that_leave_run_root_are_refused_and_nothing_is_written(tmp_path, record_property):
    work = tmp_path / "home" / "work"
    work.mkdir(parents=True)
    ok = 0
    for case, override, name_line, extra, expect in NAME_CASES:
        recipe = recipe_named(work, name_line, extra) if name_line else RECIPE
        args = [override.format(abs=tmp_path / "abs")] if override else []
        cmd = [*command(work / "runs", *args)]
        cmd[cmd.index("--config") + 1] = str(recipe)
        before = tree(tmp_path)
        line = one_line_error(run(cmd))
        assert re.fullmatch(
            rf"trinity-like: error: {re.escape(str(recipe))}{expect} a run or stage name: one folder name .*", line
        ), (case, line)
        assert tree(tmp_path) == before, f"{case}: something was written"
        ok += 1
    record(
        record_property,
        "run or stage name that leaves run_root: ../../x, absolute, '.', empty, 'a/b', 101 characters, "
        "a newline, a NUL, an escape character (recipe), a stage named ../x",
        f"clean one-line error naming the key (the override, or the recipe's line), exit 2, nothing written "
        f"anywhere: {ok}/{len(NAME_CASES)}",
        "-",
        "-",
    )


def test_a_run_folder_linked_out_of_run_root_is_refused(tmp_path, record_property):
    """Defence in depth: the code that makes the run folder refuses a path that resolves outside
    ``run_root`` whatever the name (here a plain one whose folder is a link to elsewhere)."""
    (tmp_path / "runs").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "runs" / RUN).symlink_to(tmp_path / "elsewhere")
    before = tree(tmp_path)
    line = one_line_error(run(command(tmp_path / "runs")))
    assert line == (
        f"trinity-like: error: run directory {tmp_path / 'runs' / RUN} resolves to {tmp_path / 'elsewhere'}, "
        f"not a folder inside run_root {tmp_path / 'runs'}: a run writes only there (a plain name=..., and no "
        "symbolic link out of run_root)"
    )
    assert tree(tmp_path) == before and not any((tmp_path / "elsewhere").iterdir())
    record(
        record_property,
        "a run folder that is a symbolic link out of run_root (defence in depth behind the name check)",
        "clean one-line error before anything is created, exit 2; the link's target untouched",
        "-",
        "-",
    )


# -- checkpoints a resume must not trust -------------------------------------------------------------------
def copy_run(straight: Path, folder: Path) -> Path:
    """A copy of the uninterrupted 3-step run under ``folder/runs``; returns its run folder."""
    run_dir = folder / "runs" / RUN
    shutil.copytree(straight, run_dir, symlinks=True)
    return run_dir


def latest_symlink(run_dir: Path, outside: Path) -> str:
    shutil.copytree(run_dir / "checkpoints" / "step_000003", outside / "step_000003")
    (run_dir / "checkpoints" / "latest").unlink()
    (run_dir / "checkpoints" / "latest").symlink_to(outside / "step_000003")
    return rf"{run_dir}/checkpoints/latest is a symbolic link \(to {outside}/step_000003\), not the file a save writes"


def latest_names_elsewhere(run_dir: Path, outside: Path) -> str:
    shutil.copytree(run_dir / "checkpoints" / "step_000003", outside / "step_000003")
    rel = os.path.relpath(outside / "step_000003", run_dir / "checkpoints")
    (run_dir / "checkpoints" / "latest").write_text(rel)
    return rf"{run_dir}/checkpoints/latest names '{re.escape(rel)}', not a checkpoint folder \(step_NNNNNN\)"


def step_folder_linked(run_dir: Path, outside: Path) -> str:
    shutil.copytree(run_dir / "checkpoints" / "step_000003", outside / "step_000004")
    (run_dir / "checkpoints" / "step_000004").symlink_to(outside / "step_000004")
    (run_dir / "checkpoints" / "latest").write_text("step_000004")
    return rf"checkpoint {run_dir}/checkpoints/step_000004 resolves to {outside}/step_000004, not a folder inside"


def rewritten(rel: str, content: bytes):
    """Replace ``rel`` of the latest checkpoint with ``content`` and rewrite its manifest to match."""

    def breaks(run_dir: Path, outside: Path) -> str:
        ckpt = run_dir / "checkpoints" / "step_000003"
        (ckpt / rel).write_bytes(content)
        write_manifest(ckpt, 3)
        return rf"checkpoint {ckpt}: {re.escape(rel)} "

    return breaks


def added(rel: str):
    def breaks(run_dir: Path, outside: Path) -> str:
        ckpt = run_dir / "checkpoints" / "step_000003"
        save_file({"w": torch.zeros(2)}, str(ckpt / rel))
        return rf"checkpoint {ckpt}: {re.escape(rel)} "

    return breaks


NOT_SAFETENSORS = b"\x10\x00\x00\x00\x00\x00\x00\x00{not a header}   " + bytes(64)
ESCAPES = {  # id -> (break the copy, what the line says)
    "latest_symlink": (latest_symlink, "a symbolic link"),
    "latest_names_elsewhere": (latest_names_elsewhere, "names '../"),
    "step_folder_linked": (step_folder_linked, "resolves to"),
}
TAMPERED = {
    "bad_safetensors": (rewritten("model/model.safetensors", NOT_SAFETENSORS), "is not a readable safetensors file"),
    "bad_state_json": (rewritten("state.json", b'{"step": 3, "tasks": '), "is not JSON"),
    "bad_config_json": (rewritten("model/config.json", b'{"hidden_size": 8}'), "is not a model config"),
    "pickle_added": (added("model/pytorch_model.bin"), "is a pickle file"),
    "file_added": (added("model/extra.safetensors"), "is not in the manifest"),
}


def resume_refuses(cases: dict, tmp_path: Path, straight: Path) -> int:
    """Each case on a fresh copy of the run: the resume is one line, trains nothing, and writes
    nothing outside the run folder. Returns the cases passed."""
    for case, (breaks, what) in cases.items():
        folder = tmp_path / case
        run_dir = copy_run(straight, folder)
        outside = folder / "elsewhere"
        outside.mkdir()
        expect = breaks(run_dir, outside)
        before = tree(folder, skip=run_dir)
        line = one_line_error(run(command(folder / "runs", "trainer.total_steps=4")))
        assert re.match(rf"trinity-like: error: {expect}", line) and what in line, (case, line)
        assert tree(folder, skip=run_dir) == before, f"{case}: something outside the run folder was written"
        metrics = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
        assert max(m["step"] for m in metrics) == 3, f"{case}: a step was trained from what it read"
    return len(cases)


def test_a_resume_reads_only_checkpoint_folders_inside_its_run(tmp_path, straight, record_property):
    ok = resume_refuses(ESCAPES, tmp_path, straight)
    record(
        record_property,
        "checkpoints/latest a symbolic link to a checkpoint outside the run, or a file naming "
        "../../elsewhere/step_000003; a checkpoint folder linked to one outside the run",
        f"clean one-line error naming the pointer or folder, exit 2; nothing read from outside the run, nothing "
        f"written outside the run folder, no step trained: {ok}/{len(ESCAPES)}",
        "-",
        "-",
    )


def test_a_resume_refuses_a_checkpoint_whose_files_are_not_what_the_save_wrote(tmp_path, straight, record_property):
    ok = resume_refuses(TAMPERED, tmp_path, straight)
    record(
        record_property,
        "resume from a checkpoint whose manifest was rewritten over a bad model.safetensors, state.json or "
        "config.json; a pickle file or a file the manifest does not list added to it",
        f"clean one-line error naming the file and the way back, exit 2; nothing written outside the run "
        f"folder, no step trained: {ok}/{len(TAMPERED)}",
        "-",
        "-",
    )


def test_a_save_replaces_a_hostile_pointer_and_never_writes_through_it(tmp_path):
    """A run that does not resume (checkpoint.resume: false) never reads ``latest``; its first
    save replaces the pointer itself, and what a link pointed to stays as it was."""
    from trinity_like.pipeline.checkpoint import CheckpointManager

    target = tmp_path / "elsewhere.txt"
    target.write_text("step_000009")
    mgr = CheckpointManager(tmp_path / "run")
    mgr.root.mkdir(parents=True)
    (mgr.root / "latest").symlink_to(target)

    def write(folder: str) -> None:
        Path(folder).mkdir()
        save_file({"w": torch.ones(2)}, f"{folder}/w.safetensors")

    path = mgr.save(1, {}, {"model": write})
    assert mgr.latest() == path and not (mgr.root / "latest").is_symlink()
    assert target.read_text() == "step_000009"


# -- export ----------------------------------------------------------------------------------------------
def export_cmd(src: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "trinity_like.cli", "export", str(src), "--out", str(out)]


def test_export_checks_the_checkpoint_before_writing_anything(tmp_path, straight, record_property):
    """Each case breaks a copy of a real checkpoint; export must refuse it with one line naming
    the file and write nothing (no --out, no temporary folder beside it)."""
    good = straight / "checkpoints" / "step_000003"

    def fresh(name: str) -> Path:
        ckpt = tmp_path / "ckpts" / name
        shutil.copytree(good, ckpt)
        return ckpt

    def truncated(c: Path) -> None:
        f = c / "model" / "model.safetensors"
        f.write_bytes(f.read_bytes()[:-100])

    def pickle(c: Path) -> None:
        (c / "model" / "pytorch_model.bin").write_bytes(b"\x80\x04K\x01.")  # pickle of 1

    def unlisted(c: Path) -> None:
        (c / "model" / "notes.txt").write_text("hello")

    def linked(c: Path) -> None:
        (tmp_path / "secret.txt").write_text("not for export")
        (c / "model" / "tokenizer.json").unlink()
        (c / "model" / "tokenizer.json").symlink_to(tmp_path / "secret.txt")

    def remanifest(rel: str, content: bytes):
        def breaks(c: Path) -> None:
            (c / rel).write_bytes(content)
            write_manifest(c, 3)

        return breaks

    def no_manifest(c: Path) -> None:
        (c / "manifest.json").unlink()

    cases = {
        "truncated": (truncated, r"model/model\.safetensors is \d+ bytes, \d+ when saved \(truncated\?\)"),
        "pickle": (pickle, r"model/pytorch_model\.bin is a pickle file"),
        "unlisted": (unlisted, r"model/notes\.txt is not in the manifest"),
        "linked": (linked, r"model/tokenizer\.json is a symbolic link"),
        "bad_safetensors": (
            remanifest("model/model.safetensors", NOT_SAFETENSORS),
            r"model/model\.safetensors is not a readable safetensors file",
        ),
        "bad_config": (remanifest("model/config.json", b"[1, 2"), r"model/config\.json is not JSON"),
        "bad_state": (remanifest("state.json", b'{"step": "three"}'), r"state\.json has no whole-number 'step'"),
        "no_manifest": (no_manifest, r"is not a checkpoint: no manifest\.json there or in its parent"),
    }
    for name, (breaks, expect) in cases.items():
        ckpt = fresh(name)
        breaks(ckpt)
        src = ckpt if name != "no_manifest" else ckpt / "model"
        before = tree(tmp_path)
        line = one_line_error(run(export_cmd(src, tmp_path / "out" / name)))
        assert re.search(expect, line) and line.startswith("trinity-like: error: "), (name, line)
        assert tree(tmp_path) == before, f"{name}: export wrote something"
    # the control: the same checkpoint, unbroken, exports (the checks pass an honest one)
    out = run(export_cmd(good, tmp_path / "out" / "good"))
    assert out.returncode == 0 and out.stdout.strip() == str(tmp_path / "out" / "good"), out.stderr[-2000:]
    assert (tmp_path / "out" / "good" / "model.safetensors").is_file()
    record(
        record_property,
        "export of a checkpoint: truncated weights, a pickle file, a file not in the manifest, a symbolic "
        "link, no manifest; a manifest rewritten over a bad safetensors / config.json / state.json",
        f"clean one-line error naming the file, exit 2, nothing written (no --out, no temporary folder): "
        f"{len(cases)}/{len(cases)}; the unbroken checkpoint exports",
        "-",
        "-",
    )
