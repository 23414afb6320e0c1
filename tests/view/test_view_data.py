"""What the view reads from a run directory: rollouts, filters, pages, held-out answers, bad input, read-only."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from trinity_like.buffer.rows import TrainedRecord
from trinity_like.buffer.sqlite_storage import SqliteParams, SqliteStorage
from trinity_like.errors import TrinityError
from trinity_like.experience import Experience, PairExperience
from trinity_like.models.resolve import load_tokenizer
from trinity_like.monitor.evals import TRAINED_PAIRS_FILE, append_evals
from trinity_like.view.report import write_report
from trinity_like.view.rollouts import NOT_STORED, step_page
from trinity_like.view.run import Filters, Run


def make_run(path: Path, rows: list, metrics: list[dict] | None = None, storage: str = "sqlite") -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(
        json.dumps(
            {
                "name": "demo",
                "model": {"path": "tiny-random"},
                "buffer": {"experience": {"storage": storage, "args": {}}},
            }
        )
    )
    if metrics is not None:
        (path / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    if rows:
        with SqliteStorage(params=SqliteParams(), run_dir=path) as buf:
            buf.put(rows)
    return path


def rollouts(tok, version: int, groups: int = 3, size: int = 4) -> list[Experience]:
    """``groups`` prompts x ``size`` answers; sample j of a group answers "j" and has reward j % 2."""
    out = []
    for g in range(groups):
        prompt = tok.encode(f"What is {g} + {version}?")
        for j in range(size):
            response = tok.encode(f" answer {j}" + " more" * j)
            out.append(
                Experience(
                    tokens=prompt + response,
                    prompt_length=len(prompt),
                    logprobs=[-0.1 * (k + 1) for k in range(len(response))],
                    reward=float(j % 2),
                    group_id=f"v{version}g{g}",
                    task_id=f"task-{g}",
                    model_version=version,
                    finish_reason="stop" if j < 2 else "length",
                )
            )
    return out


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer("tiny-random")


@pytest.fixture
def run_dir(tmp_path, tok):
    return make_run(tmp_path / "run", rollouts(tok, 0) + rollouts(tok, 1), [{"step": 1, "reward/mean": 0.5}])


def test_a_step_shows_its_groups_with_text_and_per_token_logprobs(run_dir, tok):
    run = Run.open(run_dir)
    assert run.buffer().versions() == [{"version": 0, "rows": 12}, {"version": 1, "rows": 12}]
    page = step_page(run, 1)
    assert [g["prompt"] for g in page["groups"]] == [f"What is {g} + 1?" for g in range(3)]
    sample = page["groups"][0]["samples"][3]
    assert sample["response"] == tok.decode(tok.encode(" answer 3 more more more"))
    assert len(sample["tokens"]) == len(sample["logprobs"]) == sample["length"]
    assert sample["logprobs"][0] == pytest.approx(-0.1) and sample["reward"] == 1.0 and sample["status"] == "available"
    assert page["stored"] == {
        "logprobs": True,
        "advantages": False,
        "action_mask": False,
        "token_level_reward": False,
        "trainer_logprobs": False,
    }
    assert page["notes"] == [NOT_STORED["not_trained"]]


def test_filters_and_pages(run_dir):
    run = Run.open(run_dir)
    rewards = [s["reward"] for g in step_page(run, 0, Filters(reward_min=1.0))["groups"] for s in g["samples"]]
    assert rewards == [1.0] * 6
    page = step_page(run, 0, Filters(finish_reason="length", length_min=5))
    assert page["matching"] == 6 and all(
        s["finish_reason"] == "length" and s["length"] >= 5 for g in page["groups"] for s in g["samples"]
    )
    assert step_page(run, 0, Filters(text="what is 2 +"))["matching"] == 4  # the prompt of group 2
    assert step_page(run, 0, Filters(text="MORE MORE MORE"))["matching"] == 3
    first, last = step_page(run, 0, page=0, page_size=5), step_page(run, 0, page=2, page_size=5)
    assert first["pages"] == 3 and sum(len(g["samples"]) for g in last["groups"]) == 2
    assert step_page(run, 7)["rows"] == 0  # a version with no rows is an empty page


def test_stored_advantages_and_multi_turn_masks_are_shown(tmp_path, tok):
    prompt, turn1, env, turn2 = (tok.encode(t) for t in ("Guess.", " 5", " higher", " 7"))
    mask = [1] * len(turn1) + [0] * len(env) + [1] * len(turn2)
    row = Experience(
        tokens=prompt + turn1 + env + turn2,
        prompt_length=len(prompt),
        action_mask=mask,
        logprobs=[-0.5] * len(mask),
        advantages=[0.25 if m else 0.0 for m in mask],
        reward=1.0,
        group_id="g",
    )
    page = step_page(Run.open(make_run(tmp_path / "run", [row])), 0)
    sample = page["groups"][0]["samples"][0]
    assert sample["mask"] == mask and sample["advantage"] == 0.25  # the mean over the policy's tokens
    assert page["stored"]["advantages"] and not page["stored"]["trainer_logprobs"]


def test_pairs_in_a_buffer_are_shown_as_pairs(tmp_path, tok):
    pair = PairExperience(
        prompt_tokens=tok.encode("2+2?"), chosen_tokens=tok.encode("4"), rejected_tokens=tok.encode("5")
    )
    page = step_page(Run.open(make_run(tmp_path / "run", [pair])), 0)
    assert [(p["prompt"], p["chosen"], p["rejected"]) for p in page["pairs"]] == [("2+2?", "4", "5")]


def test_metrics_are_read_by_complete_lines_from_an_offset(tmp_path):
    run = Run.open(make_run(tmp_path / "run", [], [{"step": 1, "loss": 1.0}]))
    rows, offset, _ = run.metrics()
    with open(run.path / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 2, "loss": 0.5}\n{"step": 3, "lo')  # a line being written
    new, offset2, _ = run.metrics(offset)
    assert [r["step"] for r in rows] == [1] and [r["step"] for r in new] == [2]
    assert run.metrics(offset2) == ([], offset2, 0)


def tree_digest(path: Path) -> dict[str, str]:
    return {
        str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.rglob("*"))
        if p.is_file()
    }


def test_viewing_a_finished_run_changes_nothing_in_it(run_dir, tmp_path):
    before = tree_digest(run_dir)
    run = Run.open(run_dir)
    step_page(run, 0, Filters(text="answer"))
    write_report([str(run_dir)], tmp_path / "report.html")
    assert tree_digest(run_dir) == before  # no -wal/-shm files left behind either


def test_a_run_being_written_is_read_without_blocking_its_writer(tmp_path, tok):
    run_dir = make_run(tmp_path / "run", rollouts(tok, 0))
    buffer = Run.open(run_dir).buffer()
    seen, errors = [], []
    with SqliteStorage(
        params=SqliteParams(busy_timeout_s=0.0), run_dir=run_dir
    ) as writer:  # a busy writer fails at once

        def write() -> None:
            try:
                for v in range(1, 40):
                    writer.put(rollouts(tok, v, groups=2, size=2))
            except Exception as exc:  # noqa: BLE001 -- reported by the assertion below
                errors.append(exc)

        thread = threading.Thread(target=write)
        thread.start()
        while thread.is_alive():
            seen.append(sum(v["rows"] for v in buffer.versions()))
            buffer.rows(len(seen) % 3)
        thread.join()
    assert not errors
    assert seen == sorted(seen) and seen[0] >= 12  # what the reader saw only grew
    assert sum(v["rows"] for v in buffer.versions()) == 12 + 39 * 4


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "trinity_like.cli", *args], capture_output=True, text=True)

    (tmp_path / "notarun").mkdir()
    for args, message in [
        (("view", str(tmp_path / "missing")), "no such folder"),
        (("view", str(tmp_path / "notarun")), "not a run directory"),
        (("report", str(tmp_path / "notarun"), "--out", str(tmp_path / "r.html")), "not a run directory"),
    ]:
        r = cli(*args)
        assert r.returncode == 2 and message in r.stderr and r.stderr.count("\n") == 1, r.stderr
    empty = make_run(tmp_path / "empty", [])
    r = cli("report", str(empty), "--out", str(tmp_path / "r.html"))
    assert r.returncode == 2 and "nothing to report yet" in r.stderr and r.stderr.count("\n") == 1


def test_a_run_without_a_buffer_says_why(tmp_path):
    run = Run.open(make_run(tmp_path / "run", [], [{"step": 1, "reward/mean": 0.5}], storage="memory"))
    assert run.buffer() is None and "buffer.experience.storage: memory" in run.buffer_missing()
    assert "buffer.experience.storage: memory" in step_page(run, 0)["error"]


def test_a_copied_run_without_its_model_shows_token_ids(tmp_path, tok):
    run_dir = make_run(tmp_path / "run", rollouts(tok, 0, groups=1, size=1))
    config = json.loads((run_dir / "config.json").read_text())
    config["model"]["path"] = "/elsewhere/model"  # the machine the run came from
    (run_dir / "config.json").write_text(json.dumps(config))
    page = step_page(Run.open(run_dir), 0)
    sample = page["groups"][0]["samples"][0]
    assert sample["tokens"] == [f"[{t}]" for t in sample["token_ids"]] and "/elsewhere/model" in page["notes"][0]
    (run_dir / "config.json").write_text("{")
    with pytest.raises(TrinityError, match="not valid JSON"):
        Run.open(run_dir)


def test_what_the_trainer_recorded_colours_the_rows_it_trained_on(run_dir):
    with SqliteStorage(params=SqliteParams(), run_dir=run_dir) as buf:
        rows = buf.claim(12, order="fifo", timeout=0)  # version 0
        trained = rows[:4]  # group 0; dynamic sampling could have dropped the others
        buf.record_trained(
            1,
            [
                TrainedRecord(
                    r.eid, {"advantages": [0.5 * i] * r.response_length, "trainer_logprob": [-0.2] * r.response_length}
                )
                for i, r in enumerate(trained)
            ],
        )
        buf.commit(1)
    page = step_page(Run.open(run_dir), 0)
    assert page["stored"]["advantages"] and page["stored"]["trainer_logprobs"] and page["notes"] == []
    samples = [s for g in page["groups"] for s in g["samples"]]
    for i, s in enumerate(samples[:4]):
        assert s["advantages"] == [0.5 * i] * s["length"] and s["advantage"] == 0.5 * i
        assert s["trainer_logprobs"] == [-0.2] * s["length"] and s["trained_at"] == 1 and s["consumed_by"] == 1
    assert all(
        s["advantages"] is None and s["trainer_logprobs"] is None and s["trained_at"] is None for s in samples[4:]
    )


def test_a_buffer_from_before_training_records_opens_and_says_so(run_dir):
    db = sqlite3.connect(run_dir / "buffer.sqlite")
    db.execute("DROP TABLE trained")
    db.commit()
    db.close()
    page = step_page(Run.open(run_dir), 0)
    assert page["rows"] == 12 and page["notes"] == [NOT_STORED["no_records"]]
    assert not page["stored"]["trainer_logprobs"] and not page["stored"]["advantages"]


def test_an_explorer_process_metrics_join_the_curves_beside_the_trainers(tmp_path):
    """Split mode: the explorer logs to explorer/metrics.jsonl; its keys that the trainer also
    logs get an ``explorer/`` prefix, held-out metrics keep their names."""
    run = Run.open(make_run(tmp_path / "run", [], [{"step": 1, "reward/mean": 0.5, "time/update": 2.0}]))
    (run.path / "explorer").mkdir()
    explorer_rows = [
        {"step": 0, "eval/accuracy": 0.25},
        {"step": 1, "reward/mean": 0.75, "time/rollout": 3.0, "explorer/model_version": 0.0},
    ]
    (run.path / "explorer" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in explorer_rows))
    rows, offset, explorer_offset = run.metrics()
    assert rows == [
        {"step": 1, "reward/mean": 0.5, "time/update": 2.0},
        {"step": 0, "eval/accuracy": 0.25},
        {"step": 1, "explorer/reward/mean": 0.75, "explorer/time/rollout": 3.0, "explorer/model_version": 0.0},
    ]
    with open(run.path / "explorer" / "metrics.jsonl", "a") as fh:
        fh.write(json.dumps({"step": 2, "reward/mean": 1.0}) + "\n")
    assert run.metrics(offset, explorer_offset)[0] == [{"step": 2, "explorer/reward/mean": 1.0}]


def test_a_pair_run_shows_each_steps_training_pairs_with_their_scores(tmp_path):
    run = Run.open(make_run(tmp_path / "run", [], [{"step": 1, "loss": 0.7}]))

    def pair(i: int, margin: float) -> dict:
        return {
            "kind": "pair",
            "task_id": f"p{i}",
            "prompt": f"q{i}",
            "chosen": "good",
            "rejected": "bad",
            "metrics": {"reward_chosen": margin, "reward_rejected": 0.0, "reward_margin": margin},
        }

    append_evals(run.path / TRAINED_PAIRS_FILE, 1, [pair(0, 0.1), pair(1, 0.2)])
    append_evals(run.path / TRAINED_PAIRS_FILE, 2, [pair(2, 0.3), pair(3, 0.4)])
    append_evals(run.path / TRAINED_PAIRS_FILE, 2, [pair(2, 0.5), pair(3, 0.6)])  # resumed: step 2 again
    assert run.buffer_missing() == "" and run.steps() == [{"version": 1, "rows": 2}, {"version": 2, "rows": 2}]
    page = step_page(run, 2)
    assert [(p["task_id"], p["metrics"]["reward_margin"]) for p in page["pairs"]] == [("p2", 0.5), ("p3", 0.6)]
    assert step_page(run, 1, Filters(text="Q1"))["matching"] == 1
