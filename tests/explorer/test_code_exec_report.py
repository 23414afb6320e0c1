"""``code_exec``'s verdicts are the host's: the test lines run here, the jail answers only for the code's values.

The oracle of a verdict is Python itself: the code and the test lines run in this process,
in one namespace; the host's verdicts (the reward's child run unconfined, no jail needed for
the semantics) must agree line by line wherever the code's values are plain data. Replies
that break the protocol are fed to the :class:`Judge` directly, in every shape a forger could
write. Forgery from inside the jail: tests/faults/test_code_exec_forgery.py.
"""

from __future__ import annotations

import json
import os
import stat
import time

import pytest

from trinity_like.errors import TrinityError
from trinity_like.explorer import code_exec
from trinity_like.explorer.code_verdict import Judge, Rejected

VALUES = [5, 5.0, True, False, None, 0, -3, "", "abc", b"x", [1, 2], (1, 2), {1: "a"}, {1, 2}, 3 + 0j, 0.1 + 0.2]
VALUES += [float("inf"), float("nan"), 10**30, frozenset({1}), [[1, (2, b"z")], {"k": None}]]
LINES = [
    "assert f() == 5",
    "assert 5 == f()",
    "assert f() != 5",
    "assert f() < 3",
    "assert f() >= -3",
    "assert 0 < f() < 6",
    "assert f() in [1, 2, 5]",
    "assert 'a' in f()",
    "assert 1 not in f()",
    "assert f() is None",
    "assert f() is not None",
    "assert f() is True",
    "assert f() == (1, 2)",
    "assert f() == {1: 'a'}",
    "assert f() == {2, 1}",
    "assert f() == 0.30000000000000004",
    "assert f() == 'abc', 'a message'",
    "assert f()",
    "assert not f()",
    "assert (f())",
    "assert f() == 0.1 + 0.2",
    "assert f() == g()",
    "assert len(f()) == 2",
    "assert sorted(f()) == [1, 2]",
    "assert str(f()) == '5'",
    "assert isinstance(f(), int)",
    "assert f() * 2 == 10",
    "assert [v for v in f()] == [1, 2]",
    "assert f() == float('inf')",
    "assert f() == 10 ** 30",
    "assert f()[0] == 1",
    "assert f() and f() == 5",
    "x = f()",
    "x = f(); assert x == 5",
    "a, b = f()",
    "for v in f(): assert v > 0",
    "for v in f():\n    if v == 1:\n        break\n    assert False",
    "for v in f():\n    if v:\n        continue\n    assert v\nelse:\n    assert f() != 5",
    "if f(): assert f() == 5",
    "import math",
    "from math import isclose; assert isclose(f(), 5.0)",
    "assert f'{f()}' == '5'",
    "assert f() == 5 if f() else True",
    "assert {k: 1 for k in f()} == {1: 1, 2: 1}",
    "assert any(v == 2 for v in f())",
    "assert (lambda v: v + 1)(f()) == 6",
    "assert f().upper() == 'ABC'",
    "assert g(f()) == f()",
    "assert f() == 5 or raise_it()",
]


def python_says(code: str, lines: list[str]) -> list[bool]:
    """The oracle: ``code`` and then each line, run by Python in one namespace."""
    ns: dict = {}
    exec(compile(code, "<oracle>", "exec"), ns)
    out = []
    for line in lines:
        try:
            exec(compile(line, "<oracle>", "exec"), ns)
            out.append(True)
        except Exception:  # noqa: BLE001 (any exception fails the line, as in the reward)
            out.append(False)
    return out


@pytest.fixture(scope="module")
def unconfined() -> code_exec.CodeExecReward:
    return code_exec.CodeExecReward(params=code_exec.CodeExecParams(sandbox=False, network_isolation=False, wall_s=20))


@pytest.mark.parametrize("value", VALUES, ids=repr)
def test_the_host_verdict_agrees_with_python_on_plain_values(value, unconfined):
    code = f"import math\ndef f():\n    return {value!r}\ndef g(*a):\n    return {value!r}\n"
    code = code.replace("inf", "math.inf").replace("nan", "math.nan")
    result = unconfined.run(code, LINES)
    assert result.status == "ok", result
    expected = python_says(code, LINES)
    if value != value:  # nan: the host compares its own float('nan'), Python the function's same object
        expected[LINES.index("assert g(f()) == f()")] = False
    assert list(result.verdicts) == expected, [(ln, e) for ln, r, e in zip(LINES, result.verdicts, expected) if r != e]


OBJECTS = """
class P:
    def __init__(self, v): self.v = v
    def __eq__(self, o): return True
    def __hash__(self): return hash(5)
    def __lt__(self, o): return False
    def __len__(self): return 2
    def __bool__(self): return True
    def get(self): return self.v
def f():
    return P(5)
"""


def test_objects_of_the_code_answer_for_themselves_but_never_in_a_comparison(unconfined):
    lines = ["assert f() == 5", "assert f() == f()", "assert len(f()) == 2", "assert f().get() == 5", "assert f()"]
    lines += ["assert {5: 1}[f()] == 1", "assert max(f(), 5) == 5", "p = f(); p.v = 7; assert p.get() == 7"]
    assert python_says(OBJECTS, lines) == [True] * len(lines)  # Python trusts the object's __eq__ and __hash__
    assert unconfined.run(OBJECTS, lines).verdicts == (False, False, True, True, True, False, False, True)


def test_lines_the_host_does_not_judge_fail_even_where_python_passes(unconfined):
    code = "def f():\n    return 5\n"
    lines = [
        "def g(): return f()",
        "class C: pass",
        "try:\n    f()\nexcept Exception:\n    pass",
        "while False: pass",
        "import os",
        "assert f().__class__ is int",
        "with open('x') as h: pass",
    ]
    assert unconfined.run(code, lines).verdicts == (False,) * len(lines)


def test_values_of_the_code_cannot_make_the_host_build_something_huge(unconfined):
    code = "def f():\n    return 10 ** 9\ndef s():\n    return 'x' * 100000\n"
    lines = [
        "assert s() * 5 == s() + s() + s() + s() + s()",  # within the bound: passes
        "assert len('x' * f()) > 0",
        "assert 2 ** f() > 0",
        "assert 1 << f()",
        "assert len(list(range(f()))) > 0",
        "assert 'a'.ljust(f())",
        "assert len(s().replace('x', s())) > 0",
        "assert len(s().join([s()] * 100)) > 0",
        "assert ('%' + str(f()) + 'd') % 1",
        "assert len(list(map(list, [range(f() // 10**4)] * (f() // 10**4)))) > 0",  # 10^5 aliases of 10^5 items
        "assert len(list(map(lambda i: list(range(f() // 10**4)), range(f() // 10**4)))) > 0",  # each copy counted
        "assert len([list(range(f() // 10**4)) for i in range(f() // 10**4)]) > 0",
        "for i in range(1000):\n    for j in range(1000): pass",  # past the step bound
        "assert [1] == [1]",  # the call's budget is spent: a line that builds anything fails
    ]
    t0 = time.monotonic()
    assert unconfined.run(code, lines).verdicts == (True,) + (False,) * (len(lines) - 1)
    assert time.monotonic() - t0 < 10


def test_a_value_too_large_to_send_fails_its_line_only(unconfined):
    code = "def f(n):\n    return 'x' * n\n"
    lines = ["assert len(f(2_000_000)) == 2_000_000", "assert f(3) == 'xxx'"]
    assert python_says(code, lines) == [True, True]
    assert unconfined.run(code, lines) == code_exec.RunResult(1, 2, "ok", (False, True))
    assert not unconfined.rejected


def test_the_hosts_own_work_stops_at_the_calls_wall_time():
    short = code_exec.CodeExecReward(params=code_exec.CodeExecParams(sandbox=False, network_isolation=False, wall_s=2))
    code = "def f():\n    return list(range(100000))\n"
    t0 = time.monotonic()
    result = short.run(code, ["big = f()", "for i in range(100000, 200000): assert i not in big"])  # 10^10 comparisons
    assert result.status == "wall time" and result.passed == 0 and time.monotonic() - t0 < 4, result


def judge_with(replies: list[bytes]) -> Judge:
    it = iter(replies)
    return Judge(lambda query: next(it))


MALFORMED = [
    (b"abc123 1000 1", "not json"),  # the old report: nonce, passed, total
    (b'{"results": ["True"]}', "wrong shape"),  # the reward's previous report
    (b'{"value": 5, "passed": 3}', "wrong shape"),
    (b'{"raised": false}', "wrong shape"),
    (b"[5]", "wrong shape"),
    (b'{"value": {"int": "xyz"}}', "bad value"),
    (b'{"value": {"float": "five"}}', "bad value"),
    (b'{"value": {"set": [{"list": []}]}}', "bad value"),  # an unhashable member
    (b'{"value": {"set": [{"handle": 0}]}}', "bad value"),  # a handle cannot be hashed here
    (b'{"value": {"module": "os"}}', "bad value"),  # only the host sends modules
    (b'{"value": {"builtin": "eval"}}', "bad value"),
    (b'{"value": {"handle": -1}}', "bad value"),
    (b'{"value": {"int": "1", "float": "2"}}', "bad value"),
    (b'{"value": 1.5}', "bad value"),  # floats travel tagged
    (b'{"value": ' + b"[" * 100000 + b"]" * 100000 + b"}", "not json"),
    (b'{"value": ' + b'{"list": [' * 5000 + b"]}" * 5000 + b"}", "not json"),
]


@pytest.mark.parametrize(("reply", "key"), MALFORMED, ids=[f"{i}-{k}" for i, (_, k) in enumerate(MALFORMED)])
def test_a_malformed_reply_is_rejected_with_its_reason(reply, key):
    with pytest.raises(Rejected) as caught:
        judge_with([reply]).line("assert add(2, 3) == 5")
    assert caught.value.key == key


def test_a_reply_is_only_ever_a_value():
    """What any reply can do to a line: be a value the line judges, be a raise, or end the call."""
    assert judge_with([b'{"value": 5}']).line("assert add(2, 3) == 5")
    assert not judge_with([b'{"value": 6}']).line("assert add(2, 3) == 5")
    assert not judge_with([b'{"raised": true}']).line("assert add(2, 3) == 5")
    assert not judge_with([]).line("assert False")  # the jail is never asked
    assert judge_with([]).line("assert [1][0] == 1")
    sent = []
    Judge(lambda q: sent.append(q) or b'{"value": 5}').line("assert add(2, 3) == 5")
    assert (
        json.dumps(sent) == '[{"eval": "add(*__a0, **__a1)", "bind": {"__a0": {"list": [2, 3]}, "__a1": {"dict": []}}}]'
    )


def test_the_reward_refuses_to_start_without_a_sandbox(tmp_path, monkeypatch):
    with pytest.raises(TrinityError, match="set network_isolation: false as well"):
        code_exec.CodeExecReward(params=code_exec.CodeExecParams(sandbox=False))
    with pytest.raises(TrinityError, match="python: '/no/python3' is not an executable interpreter"):
        code_exec.CodeExecReward(params=code_exec.CodeExecParams(python="/no/python3"))
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    with pytest.raises(TrinityError) as caught:
        code_exec.CodeExecReward(params=code_exec.CodeExecParams())
    message = str(caught.value)
    assert "bwrap is not on PATH" in message and "set sandbox: false and network_isolation: false" in message
    assert "\n" not in message
    # a bwrap that cannot make namespaces (what bwrap prints where user namespaces are disabled)
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "setpriv").symlink_to("/usr/bin/setpriv")
    with pytest.raises(TrinityError, match="bwrap failed: bwrap: No permissions to create new namespace; install"):
        code_exec.CodeExecReward(params=code_exec.CodeExecParams())
    monkeypatch.setenv("PATH", os.defpath)
    unconfined = code_exec.CodeExecReward(params=code_exec.CodeExecParams(sandbox=False, network_isolation=False))
    assert unconfined(response="def add(a, b):\n    return a + b", answer="assert add(2, 3) == 5") == 1.0
