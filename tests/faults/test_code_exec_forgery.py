"""Model-written code tries to forge its ``code_exec`` verdict; a wrong solution must earn 0 every time.

Each attempt is a wrong ``add`` (``a - b``) plus code that attacks the way the verdict is
reached: writes claims of success to every descriptor it holds, exits 0 early (``os._exit``,
``sys.exit``, ``atexit``), patches the builtins, ``AssertionError``, ``__import__``,
``sys.modules`` and ``json``, fires signal handlers mid-call, leaves a child that writes
later, floods its output, returns objects equal to everything, or writes report files. The
test lines hold a bare ``assert False`` (the issue's repro), value, bare-assert and statement
tests, each written so that no generic value (True, 1, None, "ok") passes it: only the
right ``add`` does. The oracle is Python itself: the same lines run here against the right
``add`` pass (except ``assert False``), and the reward agrees line by line.
"""

from __future__ import annotations

import shutil
import time

import psutil
import pytest
from _lib.faultlib import record

from trinity_like.explorer import code_exec
from trinity_like.explorer.code_exec import CodeExecParams, CodeExecReward

pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="no bwrap (Debian package bubblewrap; scripts/setup.sh installs it as root)"
)

RIGHT = "def add(a, b):\n    return a + b\n"
WRONG = "def add(a, b):\n    return a - b\n"
TESTS = [
    "assert False",
    "assert add(2, 3) == 5",
    "assert [0, 0, 0, 0, 1][add(2, 2)]",  # bare assert: truthy only at index 4
    "assert not [1, 1, 1, 0, 1][add(1, 2)]",  # bare assert with not: falsy only at index 3
    "x = {5: 'ok'}[add(2, 3)]",  # a statement: raises unless add(2, 3) == 5
    "assert x == 'ok'",
    "for i in range(1, 4): assert add(i, i) == 2 * i",
    "s = str({42: add(20, 22)}[add(20, 22)])",  # a statement: raises unless add(20, 22) == 42
    "assert s == '42'",
]
# what a forger would claim: the old report, the protocol's own replies with generic values
CLAIMS = (
    b'{"results": ["True", "True", "True", "True", "ok", "ok", "ok", "ok", "ok"]}\n{"loaded": true}\n'
    + b'{"value": true}\n{"value": 1}\n{"value": "ok"}\n{"value": null}\n{"raised": false}\n' * 4
)
SPRAY = f"""
import os
def spray():
    for fd in range(256):
        try:
            os.write(fd, {CLAIMS!r})
        except OSError:
            pass
"""
ATTEMPTS = {
    "the issue's repro: __main__.report": (
        'import __main__, os\n__main__.report.write(\'{"results": ["True"]}\\n\'); __main__.report.flush(); os._exit(0)\n'
    ),
    "claims written to fds 0-255 at import": SPRAY + "spray()\n",
    "claims written to each fd in /proc/self/fd, then os._exit(0)": SPRAY.replace(
        "range(256)", "map(int, os.listdir('/proc/self/fd'))"
    )
    + "spray()\nos._exit(0)\n",
    "os._exit(0) at import": "import os\nos._exit(0)\n",
    "sys.exit(0) at import": "import sys\nsys.exit(0)\n",
    "os._exit(0) and sys.exit(0) from inside the tested function": SPRAY
    + "def add(a, b):\n    spray()\n    if a == 2:\n        os._exit(0)\n    import sys\n    sys.exit(0)\n",
    "builtins, AssertionError and json patched": (
        "import builtins, json\nbuiltins.AssertionError = type('AssertionError', (Exception,), {})\n"
        "builtins.bool = lambda *a: True\nbuiltins.isinstance = lambda *a: True\nbuiltins.len = lambda *a: 5\n"
        "builtins.str = lambda *a: '42'\njson.dumps = lambda *a, **k: '{\"value\": true}'\n"
    ),
    "__import__ and sys.modules monkeypatched": (
        "import builtins, sys, types\nfake = types.ModuleType('json')\nfake.dumps = lambda *a, **k: '{\"value\": 5}'\n"
        "fake.loads = lambda *a, **k: {'eval': 'True', 'bind': {}}\nsys.modules['json'] = fake\n"
        "real = builtins.__import__\nbuiltins.__import__ = lambda name, *a, **k: fake if name == 'json' else real(name, *a, **k)\n"
    ),
    "atexit handler spraying claims, then sys.exit(0)": SPRAY
    + "import atexit, sys\natexit.register(spray)\nsys.exit(0)\n",
    "SIGALRM every millisecond and a SIGTERM handler spraying claims": SPRAY
    + "import signal\nsignal.signal(signal.SIGALRM, lambda *a: spray())\nsignal.signal(signal.SIGTERM, lambda *a: spray())\n"
    "signal.setitimer(signal.ITIMER_REAL, 0.001, 0.001)\n",
    "a child that outlives the call and writes later": SPRAY
    + "import time\nif os.fork() == 0:\n    os.setsid()\n    for _ in range(400):\n        time.sleep(0.005)\n        spray()\n    os._exit(0)\n",
    "stdout, stderr and every fd flooded (8 MB each)": "import os, sys\nsys.stdout.write('1' * 8_000_000)\n"
    + "for fd in range(3, 64):\n    try:\n        os.write(fd, b'{\"value\": true}' * 500_000)\n    except OSError:\n        pass\n",
    "objects equal to everything, truthy, hashing as 5": (
        "class Any:\n    __eq__ = lambda s, o: True\n    __ne__ = lambda s, o: False\n    __hash__ = lambda s: hash(5)\n"
        "    __bool__ = lambda s: True\n    __index__ = lambda s: 4\n    __str__ = __repr__ = lambda s: '42'\n"
        "def add(a, b):\n    return Any()\n"
    ),
    "report files written where a harness might look": (
        "import os\nfor path in ('report.json', '/tmp/report.json', '/dev/shm/report.json', 'results.json'):\n"
        '    try:\n        open(path, \'w\').write(\'{"results": ["True"], "passed": 9}\')\n    except OSError:\n        pass\n'
    ),
}


def python_says(code: str, lines: list[str]) -> list[bool]:
    """The oracle: each line run by Python after ``code``, in one namespace."""
    ns: dict = {}
    exec(compile(code, "<oracle>", "exec"), ns)
    verdicts = []
    for line in lines:
        try:
            exec(compile(line, "<oracle>", "exec"), ns)
            verdicts.append(True)
        except (AssertionError, LookupError, NameError, TypeError):
            verdicts.append(False)
    return verdicts


@pytest.fixture(scope="module")
def reward() -> CodeExecReward:
    return CodeExecReward(params=CodeExecParams(wall_s=20))


def test_the_right_solution_passes_every_line_but_assert_false(reward):
    expected = python_says(RIGHT, TESTS)
    assert expected == [False] + [True] * (len(TESTS) - 1)
    assert reward.run(RIGHT, TESTS) == code_exec.RunResult(len(TESTS) - 1, len(TESTS), "ok", tuple(expected))
    assert python_says(WRONG, TESTS) == [False] * len(TESTS)
    assert reward.run(WRONG, TESTS).passed == 0


@pytest.mark.parametrize("name", list(ATTEMPTS))
def test_a_forging_wrong_solution_earns_nothing(name, reward):
    t0 = time.monotonic()
    result = reward.run(WRONG + ATTEMPTS[name], TESTS)
    assert result.passed == 0, (name, result)
    assert time.monotonic() - t0 < 15, "the attempt held the call to the wall time"
    time.sleep(0.2)
    left = [p for p in psutil.process_iter(["cmdline"]) if code_exec.CHILD in (p.info["cmdline"] or [])]
    assert not left, "a process of the attempt outlived the call"
    assert reward.run(RIGHT, TESTS[1:]).passed == len(TESTS) - 1  # the next call: fresh, unaffected


UNCONFINED = [  # the attempts whose processes cannot outlive the call without a jail's PID namespace
    "the issue's repro: __main__.report",
    "claims written to each fd in /proc/self/fd, then os._exit(0)",
    "builtins, AssertionError and json patched",
    "objects equal to everything, truthy, hashing as 5",
    "report files written where a harness might look",
]


@pytest.mark.parametrize("name", UNCONFINED)
def test_forging_fails_without_the_jail_too(name, tmp_path, monkeypatch):
    """The verdict's protection is the protocol, not the jail: ``sandbox: false`` (files in a shared folder) too."""
    monkeypatch.chdir(tmp_path)
    r = CodeExecReward(params=CodeExecParams(wall_s=20, sandbox=False, network_isolation=False))
    assert r.run(WRONG + ATTEMPTS[name], TESTS).passed == 0
    assert r.run(RIGHT, TESTS[1:]).passed == len(TESTS) - 1


def test_code_that_prints_patches_or_writes_files_keeps_what_it_earned(reward):
    """Only the verdict is out of the code's reach: output, patched builtins and files cost a right solution nothing."""
    benign = [
        ATTEMPTS["report files written where a harness might look"],
        "import sys\nprint('1' * 8_000_000)\nsys.stderr.write('2' * 8_000_000)\n",
        "import builtins\nbuiltins.sorted = builtins.range = lambda *a: [0]\nbuiltins.AssertionError = KeyError\n",
    ]
    for code in benign:
        assert reward.run(code + RIGHT, TESTS[1:]).passed == len(TESTS) - 1, code
    # a claim injected into the reply channel breaks the protocol: the call scores 0 and is counted
    before = sum(reward.rejected.values())
    spray = reward.run(ATTEMPTS["claims written to fds 0-255 at import"] + RIGHT, TESTS)
    assert (
        spray.passed == 0 and spray.status.startswith("rejected report") and sum(reward.rejected.values()) == before + 1
    )


def test_forgery_row(reward, record_property):
    outcomes = {name: reward.run(WRONG + code, TESTS) for name, code in ATTEMPTS.items()}
    assert all(r.passed == 0 for r in outcomes.values()), outcomes
    record(
        record_property,
        f"model-written code forges its verdict ({len(ATTEMPTS)} attempts: the issue's repro, claims on every fd, "
        "os._exit/sys.exit at import and mid-test, patched builtins/AssertionError/__import__/sys.modules/json, "
        "atexit, SIGALRM/SIGTERM handlers, a child writing later, floods, always-equal objects, report files)",
        "each wrong solution earns 0 on value, bare-assert and statement tests: the host runs every test line "
        "and takes only plain values of the code's own expressions from the jail",
        "not needed (the explorer goes on)",
        "-",
    )
