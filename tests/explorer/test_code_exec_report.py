"""``code_exec``'s host-side verdicts and its checks on the jail's report, without a jail.

The oracle of a verdict is Python itself: the test line run in this process against a
function returning the value (the host's verdict must agree with ``assert`` whenever the
value is a literal). The report checks take every shape a forger could write. The jail
itself and forged reports written from inside it: tests/faults/test_code_exec_escapes.py.
"""

from __future__ import annotations

import itertools
import json
import os
import stat

import pytest

from trinity_like.errors import TrinityError
from trinity_like.explorer import code_exec
from trinity_like.explorer.code_exec import VALUE_CHARS, Check, RejectedReport, plan, verdicts

VALUES = [5, 5.0, True, False, None, 0, -3, "", "abc", b"x", [1, 2], (1, 2), {1: "a"}, {1, 2}, 3 + 0j, 0.1 + 0.2]
LINES = [
    "assert f() == 5",
    "assert 5 == f()",
    "assert f() != 5",
    "assert f() < 3",
    "assert f() >= -3",
    "assert f() in [1, 2, 5]",
    "assert 'a' in f()",
    "assert 1 not in f()",
    "assert f() is None",
    "assert f() is not None",
    "assert f() is True",
    "assert f() == (1, 2)",
    "assert f() == {1: 'a'}",
    "assert f() == {2, 1}",
    "assert f() == -3",
    "assert f() == 0.30000000000000004",
    "assert f() == 'abc', 'a message'",
    "assert f()",
    "assert not f()",
    "assert (f())",
]


def python_says(line: str, value) -> bool:
    """The oracle: does ``line`` pass in Python when ``f()`` returns ``value``?"""
    try:
        exec(compile(line, "<oracle>", "exec"), {"f": lambda: value})
    except (AssertionError, TypeError):
        return False
    return True


def host_says(line: str, value) -> bool:
    """The host's verdict when the jail honestly reports ``f()``'s value."""
    check = plan(line)
    assert check.kind in ("value", "truth") and check.src in ("f()", "(f())"), check
    entry = ("True" if value else "False") if check.kind == "truth" else repr(value)
    return verdicts(json.dumps({"results": [entry]}).encode() + b"\n", [check]) == [True]


@pytest.mark.parametrize("line", LINES)
def test_the_host_verdict_agrees_with_python_on_every_literal_value(line):
    for value in VALUES:
        assert host_says(line, value) == python_says(line, value), (line, value)


def test_which_lines_the_host_decides():
    assert plan("assert add(2, 3) == 5") == Check("value", "add(2, 3)", 5, code_exec._OPS[code_exec.ast.Eq])
    assert plan("assert [1, -2] == sort( x )").literal_left and plan("assert [1, -2] == sort( x )").src == "sort( x )"
    assert plan("assert not is_prime(8)") == Check("truth", "is_prime(8)", False)
    for line in [
        "x = add(1, 2)",  # not an assert
        "add(1, 2)",
        "assert 0 < f() < 3",  # chained
        "assert f() == g()",  # no literal side
        "assert 1 == 1",  # both literal
        "assert f() is 5",  # identity with a number
        "assert f() == 1; assert g() == 2",  # two statements
        "  assert f() == 1",  # indented: fails to compile in the jail, as it would in Python
        "assert f() == 0.1 + 0.2",  # an expression, not a literal
    ]:
        assert plan(line) == Check("exec", line), line


def test_values_that_are_not_literals_fail_their_line():
    check = plan("assert f() == 5")
    for entry in [
        "<__main__.A object at 0x7f>",
        "inf",
        "nan",
        "ok",
        "1" * 5000,
        "(" * 300 + ")" * 300,
        "__import__('os')",
    ]:
        assert verdicts(json.dumps({"results": [entry]}).encode() + b"\n", [check]) == [False], entry


CHECKS = [plan("assert add(2, 3) == 5"), plan("x = add(1, 1)"), plan("assert add(1, 1)")]
GOOD = {"results": ["5", "ok", "True"]}
FORGED = [
    (b"", "not one line"),
    (b"abc123 1000 1\n", "not json"),  # the old report: nonce, passed, total
    (b'{"results": ["5", "ok", "True"]}', "not one line"),  # no newline
    (b'{"results": ["5", "ok", "True"]}\n{"results": ["5", "ok", "True"]}\n', "duplicated"),
    (b'{"results": ["5", "ok", "True"]}\r{"results": []}\n', "duplicated"),
    (b'\xc3\xa9{"results": ["5", "ok", "True"]}\n', "not ascii"),
    (b'["5", "ok", "True"]\n', "wrong shape"),
    (b'{"passed": 3, "total": 3}\n', "wrong shape"),
    (b'{"results": ["5", "ok", "True"], "passed": 3}\n', "wrong shape"),
    (b'{"results": "5 ok True"}\n', "wrong shape"),
    (b'{"results": ["5", "ok"]}\n', "wrong count"),
    (b'{"results": ["5", "ok", "True", "ok"]}\n', "wrong count"),
    (b'{"results": []}\n', "wrong count"),
    (b'{"results": [5, "ok", "True"]}\n', "bad entry"),  # a number where a repr belongs
    (b'{"results": ["5", 1, "True"]}\n', "bad entry"),
    (b'{"results": ["5", true, "True"]}\n', "bad entry"),
    (b'{"results": ["5", "passed", "True"]}\n', "bad entry"),
    (b'{"results": ["5", "ok", 1000]}\n', "bad entry"),
    (b'{"results": ["5", "ok", -1]}\n', "bad entry"),
    (b'{"results": ["5", "ok", 1.5]}\n', "bad entry"),
    (b'{"results": ["5", "ok", "true"]}\n', "bad entry"),
    (b'{"results": [["5"], "ok", "True"]}\n', "bad entry"),
    (json.dumps({"results": ["5" * (VALUE_CHARS + 1), "ok", "True"]}).encode() + b"\n", "bad entry"),
    (b"[" * 100000 + b"\n", "not json"),
]


@pytest.mark.parametrize(("out", "key"), FORGED)
def test_a_malformed_report_is_rejected_with_its_reason(out, key):
    with pytest.raises(RejectedReport) as caught:
        verdicts(out, CHECKS)
    assert caught.value.key == key


def test_a_well_formed_report_counts_each_line_once():
    assert verdicts(json.dumps(GOOD).encode() + b"\n", CHECKS) == [True, True, True]
    assert verdicts(b'{"results": [null, null, null]}\n', CHECKS) == [False, False, False]
    assert verdicts(b'{"results": ["6", "ok", "False"]}\n', CHECKS) == [False, True, False]
    for entries in itertools.product([None, "5", "4"], [None, "ok"], [None, "True", "False"]):
        passed = sum(verdicts(json.dumps({"results": list(entries)}).encode() + b"\n", CHECKS))
        assert 0 <= passed <= len(CHECKS)


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
