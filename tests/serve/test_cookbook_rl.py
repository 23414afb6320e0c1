"""examples/serve/cookbook_rl.py -- tinker-cookbook's own RL loop (`tinker_cookbook.rl.train.main`)
against `trinity-like serve` -- runs as a user runs it, on the tiny model in seconds."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

ROOT = Path(__file__).resolve().parents[2]
SERVE_EXAMPLES = ROOT / "examples" / "serve"
SCRIPT = SERVE_EXAMPLES / "cookbook_rl.py"
TINY = ["--iterations", "2", "--batch", "2", "--group", "4", "--max-tokens", "4", "--eval", "4", "--eval-every", "1"]
RESULT = r"held-out greedy accuracy: [\d.]+% -> [\d.]+% after 2 iterations"

# The tiny model's answers are noise, so every reward is equal and every advantage 0: the loop
# would run but train nothing. This runs the script with a grade that varies within a group
# (whether the answer's text has an even length), so the loss moves the weights; the script
# itself is unchanged.
VARIED_GRADE = """
import importlib.util, sys
sys.argv = sys.argv[1:]
spec = importlib.util.spec_from_file_location("cookbook_rl", sys.argv[0])
module = sys.modules["cookbook_rl"] = importlib.util.module_from_spec(spec)  # chz looks its module up
spec.loader.exec_module(module)
module.ArithmeticEnv.check_answer = lambda self, text: len(text) % 2 == 0
module.main()
"""


def run(args: list[str]) -> str:
    done = subprocess.run([sys.executable, *args], check=False, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout + done.stderr


def rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def example_module():
    spec = importlib.util.spec_from_file_location("cookbook_rl", SCRIPT)
    module = sys.modules["cookbook_rl"] = importlib.util.module_from_spec(spec)  # chz looks its module up
    spec.loader.exec_module(module)
    return module


def test_every_serve_example_has_a_smoke_test():
    assert sorted(p.name for p in SERVE_EXAMPLES.glob("*.py")) == ["cookbook_rl.py"]


def test_the_cookbook_renderer_writes_the_models_own_chat_template(tiny_model):
    """Oracle: the tokenizer's chat template (HF's Jinja); and our client's ChatML renderer token for token."""
    from tinker_cookbook import renderers
    from tinker_cookbook.renderers.base import ParseTermination

    from trinity_like.client.renderers import ChatMLRenderer as OurChatML
    from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
    from trinity_like.models.resolve import load_tokenizer

    module = example_module()
    tok = load_tokenizer(tiny_model)
    renderer = renderers.get_renderer(module.RENDERER, tok)
    for task in arithmetic_tasks(ArithmeticParams(), "eval", 3):
        messages = task.messages()
        prompt = renderer.build_generation_prompt(messages).to_ints()
        assert tok.decode(prompt) == tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        assert prompt == OurChatML(tok).build_generation_prompt(messages).to_ints()
    end = tok.convert_tokens_to_ids("<|im_end|>")
    assert renderer.get_stop_sequences() == [end]
    answer = tok.encode("57", add_special_tokens=False)
    assert renderer.parse_response([*answer, end]) == (
        {"role": "assistant", "content": "57"},
        ParseTermination.STOP_SEQUENCE,
    )
    assert renderer.parse_response(answer)[1] is ParseTermination.MALFORMED  # cut off by max_tokens
    assert renderer.parse_response([*answer, end, *answer])[1] is ParseTermination.MALFORMED


def test_the_env_grades_our_tasks_with_our_reward(tiny_model):
    from tinker_cookbook import renderers

    from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
    from trinity_like.models.resolve import load_tokenizer

    module = example_module()
    tok = load_tokenizer(tiny_model)
    renderer = renderers.get_renderer(module.RENDERER, tok)
    task = arithmetic_tasks(ArithmeticParams(), "train", 1)[0]
    env = module.ArithmeticEnv(task, renderer)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    right = asyncio.run(env.step([*tok.encode(task.answer, add_special_tokens=False), end]))
    wrong = asyncio.run(env.step([*tok.encode(str(int(task.answer) + 1), add_special_tokens=False), end]))
    unended = asyncio.run(env.step(tok.encode(task.answer, add_special_tokens=False)))
    assert (right.reward, wrong.reward) == (1.0, 0.0)
    assert unended.reward == pytest.approx(0.9)  # ProblemEnv's format penalty: no <|im_end|>
    assert right.episode_done and right.metrics == {"format": 1.0, "correct": 1.0}


def docs_command() -> list[str]:
    """docs/serve.md's command for the example (``python examples/serve/cookbook_rl.py ...``)."""
    text = (ROOT / "docs" / "serve.md").read_text()
    blocks = re.findall(r"^```bash\n(.*?)^```", text, flags=re.DOTALL | re.MULTILINE)
    command = shlex.split(next(b for b in blocks if "cookbook_rl.py" in b).strip())
    assert command[:2] == ["python", "examples/serve/cookbook_rl.py"]
    return command[1:]


def test_cookbook_rl_runs_as_written_and_resumes(tmp_path):
    log_path = tmp_path / "run"
    # The documented command, shrunk to the tiny model by flags given after it (the last one wins).
    args = [*docs_command(), "--model", "tiny-random", *TINY, "--log-path", str(log_path)]
    out = run(args)
    assert re.search(r"server: http://127\.0\.0\.1:\d+", out), out[-3000:]
    assert re.search(RESULT, out), out[-3000:]
    metrics = rows(log_path / "metrics.jsonl")
    assert [r["step"] for r in metrics] == [0, 1]
    assert all("test/env/all/correct" in r and r["env/all/total_episodes"] == 8 for r in metrics)  # 2 x 4 episodes
    assert rows(log_path / "checkpoints.jsonl")[-1]["name"] == "final"
    assert "trinity-like serve: stopped" in (log_path / "serve" / "server.log").read_text()  # by the script (SIGINT)

    # The same log path, a new server on the same data directory: the cookbook finds its final
    # checkpoint (a tinker:// path that outlived the first server) and has nothing left to train.
    again = run(args)
    assert "Training was already complete" in again and re.search(RESULT, again), again[-3000:]
    assert len(rows(log_path / "metrics.jsonl")) == 2


def test_cookbook_rl_trains_the_weights_on_a_given_server(server, tiny_model, tmp_path):
    url, data_dir = server
    log_path = tmp_path / "run"
    out = run(
        ["-c", VARIED_GRADE, str(SCRIPT), "--base-url", url, "--model", tiny_model, *TINY, "--log-path", str(log_path)]
    )
    assert re.search(RESULT, out), out[-3000:]
    assert "server: http" not in out  # --base-url: no server of its own
    metrics = rows(log_path / "metrics.jsonl")
    mixed = [r for r in metrics if r["env/all/by_group/frac_mixed"] > 0]  # groups whose grades differ
    assert mixed and all(r["grad_norm"] > 0 for r in mixed)  # nonzero advantages reached the loss

    final = rows(log_path / "checkpoints.jsonl")[-1]["sampler_path"]  # tinker://<model id>/sampler_weights/final
    model_id, name = re.fullmatch(r"tinker://([^/]+)/sampler_weights/(.+)", final).groups()
    trained = load_file(data_dir / "runs" / model_id / "sampler_weights" / name / "model.safetensors")
    base = load_file(Path(tiny_model) / "model.safetensors")
    assert base.keys() <= trained.keys()  # (the saved folder also writes the tied lm_head out)
    assert any(not torch.equal(trained[k], base[k]) for k in base)


@pytest.mark.parametrize(
    ("flags", "code", "says"),
    [
        (["--eval-every", "0"], 2, "--eval-every must be >= 1, got 0"),
        (["--model", "no-such-model"], 1, "model 'no-such-model' not found"),
    ],
    ids=["flag", "model"],
)
def test_bad_input_is_one_line_and_starts_nothing(tmp_path, flags, code, says):
    done = subprocess.run(
        [sys.executable, str(SCRIPT), *flags, "--log-path", str(tmp_path / "run")],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = done.stderr.strip().splitlines()
    assert done.returncode == code and says in lines[-1] and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "run").exists()
