"""The ``code_exec`` reward: the model's code runs in a jailed child, never in the explorer.

Each case is code a model could write; the oracle is what the parent can observe from
outside: the reward, how long the call took, whether the parent's own state, files and
network peers were touched, and whether anything the child started outlived the call.
Then a real tiny run trains on programming tasks with ``code_exec`` as its reward. The
escape attempts are in test_code_exec_escapes.py, forged verdicts in
test_code_exec_forgery.py.
"""

from __future__ import annotations

import builtins
import json
import shutil
import socket
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
import yaml
from _lib.faultlib import command, record, run

from trinity_like.errors import TrinityError
from trinity_like.explorer.code_exec import (
    CodeExecParams,
    CodeExecReward,
    extract_code,
    unit_tests,
)
from trinity_like.explorer.rewards import build_reward_fn

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="no bwrap (Debian package bubblewrap; scripts/setup.sh installs it as root)"
)

TASKS = Path(__file__).parent / "data" / "code_tasks.jsonl"
ADD_TESTS = "assert add(2, 3) == 5\nassert add(-1, 1) == 0\n# a comment is not a test\n\nassert add(0, 0) == 1"


def reward(response: str, answer: str = ADD_TESTS, **params) -> float:
    return build_reward_fn("code_exec", {"cpu_s": 1, "wall_s": 20, **params})({"response": response, "answer": answer})


def test_the_reward_is_the_fraction_of_unit_tests_passed():
    assert unit_tests(ADD_TESTS) == ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(0, 0) == 1"]
    assert reward("def add(a, b):\n    return a + b") == pytest.approx(2 / 3)  # the third test is wrong on purpose
    fenced = "Here you go:\n```python\ndef add(a, b):\n    return a - b\n```\nand\n```python\ndef add(a, b):\n    return a + b\n```"
    assert extract_code(fenced) == "def add(a, b):\n    return a + b\n"  # the last block
    assert reward(fenced) == pytest.approx(2 / 3)
    assert reward("def add(a, b) return") == 0.0  # a syntax error passes nothing
    assert reward("def add(a, b):\n    print('1 3 3')\n    return a + b") == pytest.approx(
        2 / 3
    )  # printing cannot fake it
    with pytest.raises(TrinityError, match="holds no unit tests"):
        reward("x = 1", answer="# nothing\n")


def test_code_that_hangs_spins_or_allocates_is_stopped_and_scores_zero():
    t0 = time.monotonic()
    assert reward("while True:\n    pass", cpu_s=1, wall_s=20) == 0.0  # RLIMIT_CPU: killed after 1 CPU second
    spun = time.monotonic() - t0
    assert spun < 19, f"the CPU limit did not stop it ({spun:.1f} s)"
    t0 = time.monotonic()
    assert reward("import time\nwhile True:\n    time.sleep(1)", wall_s=1.5) == 0.0  # no CPU used: the wall limit
    assert 1.5 <= time.monotonic() - t0 < 10
    before = psutil.Process().memory_info().rss
    assert reward("x = bytearray(4 * 1024**3)\ndef add(a, b):\n    return a + b", memory_mb=256) == 0.0  # MemoryError
    assert psutil.Process().memory_info().rss - before < 200 * 1024**2  # the parent did not hold it


def test_a_child_that_dies_scores_zero_and_the_next_call_gets_a_new_one():
    r = CodeExecReward(params=CodeExecParams(wall_s=20))
    crashed = r.run("import ctypes\nctypes.string_at(0)", ["assert True"])  # a segfault
    assert (crashed.passed, crashed.status) == (0, "died (exit status 139: signal SIGSEGV)")  # bwrap: 128 + 11
    outcome = []
    call = threading.Thread(target=lambda: outcome.append(r.run("import time\ntime.sleep(15)", ["assert True"])))
    call.start()
    deadline = time.monotonic() + 10
    while not (victims := [c for c in psutil.Process().children(recursive=True) if "-I" in c.cmdline()[1:3]]):
        assert time.monotonic() < deadline, "the sandboxed child never started"
        time.sleep(0.05)
    t0 = time.monotonic()
    for child in victims:
        child.kill()  # SIGKILL from outside, mid-call
    call.join()
    assert time.monotonic() - t0 < 5 and outcome[0].passed == 0 and outcome[0].status.startswith("died"), outcome
    assert r.run("import os\nos._exit(3)", ["assert True"]).status == "died (exit status 3)"
    assert r.run("def add(a, b):\n    return a + b", unit_tests(ADD_TESTS)).passed == 2  # next call, fresh process


def test_the_parent_never_runs_the_code_and_nothing_outlives_the_call(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code = (
        "import builtins, subprocess\nbuiltins.TOUCHED = True\nopen('marker', 'w').write('x')\n"
        "subprocess.Popen(['sleep', '61.25'], start_new_session=True)\ndef add(a, b):\n    return a + b"
    )
    assert reward(code) == pytest.approx(2 / 3)
    assert not hasattr(builtins, "TOUCHED") and not (tmp_path / "marker").exists()
    time.sleep(0.5)
    left = [p for p in psutil.process_iter(["cmdline"]) if p.info["cmdline"] == ["sleep", "61.25"]]
    assert not left, "a process the code started outlived the call"


def test_the_code_has_no_network(record_property):
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    probe = (
        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2).close()\n"
        "    reached = True\nexcept OSError:\n    reached = False\n"
    )
    try:
        assert reward(probe, answer="assert reached") == 0.0
        assert reward(probe, answer="assert reached", network_isolation=False) == 1.0  # the probe can tell
    finally:
        server.close()
    record(
        record_property,
        "model-written code: loops, allocates, forks, dies, opens the network (code_exec reward)",
        "contained: CPU/memory/process/wall limits, no network, each call a fresh bwrap jail; scores 0",
        "not needed (the explorer goes on)",
        "-",
    )


def test_a_run_trains_on_programming_tasks_with_the_sandboxed_reward(tmp_path):
    cmd = command(
        tmp_path,
        "trainer.total_steps=2",
        f"buffer.tasks={{path: {TASKS}}}",
        f"buffer.eval_tasks={{path: {TASKS}}}",
        "explorer.reward_fn=code_exec",
        "explorer.reward_args={cpu_s: 1, wall_s: 5}",
        "explorer.eval_reward_fn=code_exec",
    )
    out = run(cmd)
    assert out.returncode == 0, out.stderr[-3000:]
    metrics = (tmp_path / "grpo_arith" / "metrics.jsonl").read_text()
    assert '"reward/mean"' in metrics and '"eval/accuracy"' in metrics


def test_the_documented_example_builds_the_reward():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "reliability.md").read_text()
    block = doc.partition("Example (tests/faults/data/code_tasks.jsonl holds eight such tasks):\n\n")[2]
    recipe = yaml.safe_load(textwrap.dedent(block.partition("\n\n")[0]))
    assert recipe["explorer"]["reward_fn"] == "code_exec"
    fn = build_reward_fn("code_exec", recipe["explorer"]["reward_args"])
    task = json.loads(TASKS.read_text().splitlines()[0])  # add(a, b)
    assert fn({"response": "def add(a, b):\n    return a + b", "answer": task["answer"]}) == 1.0
