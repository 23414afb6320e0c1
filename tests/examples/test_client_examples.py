"""Every client example runs as a user runs it (``python examples/client/<file>.py``), on the
tiny model in seconds, and ends with its result line."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CLIENT = ROOT / "examples" / "client"
RL_TINY = ["--model", "tiny-random", "--steps", "2", "--batch", "2", "--group", "4", "--max-tokens", "4", "--eval", "4"]
ENV_TINY = [
    "--model",
    "tiny-random",
    "--iterations",
    "2",
    "--batch",
    "2",
    "--group",
    "4",
    "--eval",
    "4",
    "--eval-every",
    "1",
]
SL_TINY = [
    "--model",
    "tiny-random",
    "--steps",
    "3",
    "--batch",
    "4",
    "--eval",
    "4",
    "--eval-every",
    "2",
    "--max-tokens",
    "4",
]

# The tiny model's answers are noise, so every reward is 0 and rl_basic would skip every group
# (equal rewards teach nothing) without calling the loss. This runs the script with a reward
# that varies within a group (the parity of the first sampled token), so every variant's loss
# path runs; the script itself is unchanged.
VARIED_REWARD = """
import importlib.util, sys
sys.argv = sys.argv[1:]
spec = importlib.util.spec_from_file_location("rl_basic", sys.argv[0])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
module.reward = lambda renderer, tokens, answer: float(tokens[0] % 2)
module.main()
"""


def run(args: list[str]) -> str:
    done = subprocess.run([sys.executable, *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    return done.stdout


def test_every_client_example_has_a_smoke_test():
    assert sorted(p.name for p in CLIENT.glob("*.py")) == [
        "rl_basic.py",
        "rl_env.py",
        "sl_basic.py",
        "twenty_questions.py",
    ]


@pytest.mark.parametrize("variant", [[], ["--custom"], ["--loss", "ppo"]], ids=["is", "custom", "ppo"])
def test_rl_basic_trains_and_reports(variant):
    out = run(["-c", VARIED_REWARD, str(CLIENT / "rl_basic.py"), *RL_TINY, *variant])
    trained = [int(n) for n in re.findall(r"trained on (\d+) sequences", out)]
    assert len(trained) == 2 and sum(trained) > 0, out  # the loss ran
    assert re.search(r"held-out greedy accuracy: [\d.]+% -> [\d.]+% in 2 steps", out), out


def test_rl_basic_runs_as_written():
    out = run([str(CLIENT / "rl_basic.py"), *RL_TINY])
    assert re.search(r"held-out greedy accuracy: [\d.]+% -> [\d.]+% in 2 steps", out), out


@pytest.mark.parametrize(
    "variant",
    [[], ["--kl", "0.01", "--per-turn", "--substeps", "2", "--loss", "ppo", "--advantage", "rloo"]],
    ids=["as_written", "kl_per_turn_ppo_rloo"],
)
def test_rl_env_trains_evaluates_and_resumes(tmp_path, variant):
    args = [str(CLIENT / "rl_env.py"), *ENV_TINY, "--log-path", str(tmp_path / "run"), *variant]
    result = r"held-out greedy accuracy: [\d.]+% -> [\d.]+% \(tool use [\d.]+% -> [\d.]+%\) after iteration 2"
    assert re.search(result, run(args))
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and all("eval/accuracy" in r for r in rows)
    if variant:
        assert all(r["train/substeps"] == min(2, r["train/datums"]) and "kl/ref_k1" in r for r in rows[1:])
    again = run(args)  # the same log path: resumed from the last checkpoint, nothing left to train
    assert "resumed from the checkpoint of iteration 2" in again and re.search(result, again)
    assert len((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()) == 3


def test_twenty_questions_trains_two_models_game_and_reports_both_word_lists(tmp_path):
    args = [
        str(CLIENT / "twenty_questions.py"),
        "--model",
        "tiny-random",
        "--answerer",
        "tiny-random",
        "--iterations",
        "2",
        "--batch",
        "2",
        "--group",
        "4",
        "--eval-games",
        "1",
        "--eval-every",
        "1",
        "--log-path",
        str(tmp_path / "run"),
    ]
    out = run(args)
    assert re.search(
        r"success, training words \(24 games\): [\d.]+% -> [\d.]+%; held-out words \(16 games\): "
        r"[\d.]+% -> [\d.]+%; after iteration 2",
        out,
    ), out
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["iterations"] == 2 and set(summary) >= {"training_words", "held_out_words", "questions_per_game"}
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2] and all("env/solved" in r for r in rows[1:])


@pytest.mark.parametrize("rank", ["0", "4"], ids=["full", "lora"])
def test_sl_basic_trains_and_reports(rank):
    out = run([str(CLIENT / "sl_basic.py"), *SL_TINY, "--rank", rank])
    assert len(re.findall(r"step \d/3: train CE [\d.]+ per token", out)) == 3, out
    assert "held-out CE" in out.split("step 2/3")[1].splitlines()[0], out  # measured during training
    assert len(re.findall(r"(before|after): 'What is", out)) == 6, out  # 3 greedy samples, before and after
    assert re.search(r"held-out CE per token: [\d.]+ -> [\d.]+, exact answers [\d.]+% -> [\d.]+% in 3 steps", out), out
