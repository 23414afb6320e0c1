"""``code_exec``: a unit-test reward for programming tasks, the model's code run in a bubblewrap jail.

Registered in REWARD_FN as ``code_exec`` by :mod:`trinity_like.explorer.rewards`.

The model's response is Python code (the last fenced ```python block, else the whole
text); the task's ``answer`` holds its unit tests, one statement per line
(``assert add(2, 3) == 5``). The reward is the fraction of test lines that pass. The
explorer never imports or runs the model's code itself: each call starts a fresh
``python -I -S`` (no site packages, no user environment) in the jail of
:mod:`trinity_like.explorer.sandbox` -- its own user, PID, mount, IPC and network
namespaces; uid 65534 with no capabilities and ``no_new_privs``; nothing of the host's
filesystem but ``/usr``, the loader's files and the interpreter (its site-packages hidden),
read-only; one writable place, a fresh ``/tmp`` of ``tmp_mb``; a fresh ``/proc``; no network and no host unix socket -- where the
child sets, before the code runs, ``RLIMIT_CPU`` (``cpu_s``), ``RLIMIT_AS`` (``memory_mb``),
``RLIMIT_FSIZE`` (``file_mb``), ``RLIMIT_NPROC`` (``max_procs`` processes and threads: a
fork bomb stops there) and 64 open files; after ``wall_s`` the whole jail is SIGKILLed.

**The report is untrusted.** The code shares a process with the harness that runs the
tests, so it can write any report it likes. The host therefore decides each verdict:

- a line ``assert <expr> <op> <literal>`` (or ``<literal> <op> <expr>``; ``op`` one of
  ``== != < <= > >= in not in``, or ``is``/``is not`` with None/True/False) sends only
  ``<expr>`` to the jail, which returns ``repr`` of its value; the host parses it with
  ``ast.literal_eval`` and applies the comparison itself. The literal never enters the
  jail, so passing such a line means producing its expected value: a forged report
  cannot pass it (nor can an object whose ``__eq__`` always says True). A value that is
  not a Python literal (an object, ``inf``) fails the line;
- ``assert <expr>`` and ``assert not <expr>`` send ``<expr>``; the jail returns its truth
  value (it does not know which one the line wants);
- any other line (``x = f(3)``, a chained comparison, a comparison with no literal side)
  runs whole in the jail and passes if it does not raise: a forged report *can* pass those.

A report that is not exactly one line of ASCII JSON ``{"results": [...]}``, one entry per
line sent, each ``null`` or a string of the right form, is rejected: the call scores 0,
the reason is counted in :attr:`CodeExecReward.rejected` and logged the first time it
occurs. Rewards are in [0, 1] by construction (the host counts the passes).

A child that dies (a limit hit, a crash, ``os._exit``, SIGKILL from outside) scores 0 for
that call; the next call starts a new jail. Where the jail cannot be built (no bwrap, user
namespaces disabled, an interpreter the jail cannot read) the reward refuses to start and
says what is missing; ``sandbox: false`` (with ``network_isolation: false``) opts out and
runs the child unconfined. docs/reliability.md has the trust model. Example::

    reward = CodeExecReward(params=CodeExecParams(cpu_s=2))
    reward(response="def add(a, b):\\n    return a + b", answer="assert add(2, 3) == 5")   # 1.0
"""

from __future__ import annotations

import ast
import collections
import contextlib
import json
import logging
import operator
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from trinity_like.errors import TrinityError
from trinity_like.explorer.sandbox import jail_argv, run_capped, sandbox_problem

_LOG = logging.getLogger(__name__)
VALUE_CHARS = 65536  # longest repr of a test expression's value the jail may return; longer fails the line

# The child's program: set its limits (argv: CPU s, address space and file size in bytes,
# processes, VALUE_CHARS), read {code, checks}, run the code, then each check, and write
# one line {"results": [...]} on a private copy of stdout. It is passed with -c: nothing of
# the parent's is imported. The limits are set by the child itself, before any of the
# model's code runs, rather than between fork and exec (preexec_fn is unsafe in the
# explorer, which has threads).
CHILD = r"""
import json, os, resource, sys
cpu, memory, fsize, nproc, value_chars = map(int, sys.argv[1:6])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
if nproc > 0:  # in the jail: counts the jail's own processes only
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
job = json.loads(sys.stdin.read())
sys.stdin.close()
report = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)  # what the code prints, even to fd 1, does not reach the report
sys.stdout = sys.stderr
ns = {"__name__": "__solution__"}
try:
    exec(compile(job["code"], "<solution>", "exec"), ns)
    ok = True
except BaseException:
    ok = False
results = []
for kind, src in job["checks"]:
    if not ok:
        results.append(None)
        continue
    try:
        if kind == "exec":
            exec(compile(src, "<test>", "exec"), ns)
            results.append("ok")
        else:
            value = eval(compile(src, "<test>", "eval"), ns)
            text = ("True" if value else "False") if kind == "truth" else repr(value)
            results.append(text if len(text) <= value_chars else None)
    except BaseException:
        results.append(None)
report.write(json.dumps({"results": results}) + "\n")
report.flush()
os._exit(0)
"""

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(response: str) -> str:
    """The last fenced code block of ``response`` (```python ... ```), else the whole response."""
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else response


def unit_tests(answer: str) -> list[str]:
    """The task's unit tests: one statement per non-blank, non-comment line."""
    return [line for line in answer.splitlines() if line.strip() and not line.lstrip().startswith("#")]


# -- how each test line is judged -----------------------------------------------------------------
_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
    ast.In: lambda a, b: a in b,
    ast.NotIn: lambda a, b: a not in b,
    ast.Is: operator.is_,
    ast.IsNot: operator.is_not,
}
_NOT_LITERAL = object()
_PARSE_ERRORS = (ValueError, TypeError, SyntaxError, MemoryError, RecursionError)


@dataclass(frozen=True)
class Check:
    """How one test line is judged (see the module docstring)."""

    kind: (
        str  # "exec": runs whole in the jail; "truth": the jail returns bool(src); "value": the jail returns repr(src)
    )
    src: str  # what the jail runs: the whole line ("exec") or one expression of it
    want: Any = None  # "truth": the truth value the line asserts; "value": the literal it compares with
    op: Callable[[Any, Any], Any] | None = None  # "value": the comparison, applied by the host
    literal_left: bool = False  # "value": the literal is the left operand (``5 == add(2, 3)``)

    def passes(self, entry: str | None) -> bool:
        """This line's verdict from its (validated) report entry: null is a line that raised."""
        if entry is None:
            return False
        if self.kind == "exec":
            return True
        if self.kind == "truth":
            return entry == str(self.want)
        try:
            value = ast.literal_eval(entry)  # builtin literals only: no code of the model's runs here
        except _PARSE_ERRORS:
            return False
        a, b = (self.want, value) if self.literal_left else (value, self.want)
        try:
            return bool(self.op(a, b))
        except (TypeError, ValueError, RecursionError):  # 1 < "a": the line would have raised
            return False


def _literal(node: ast.AST) -> Any:
    try:
        return ast.literal_eval(node)
    except _PARSE_ERRORS:
        return _NOT_LITERAL


def plan(line: str) -> Check:
    """How ``line`` is judged: host-side where its expected value is a literal or a truth value."""
    whole = Check("exec", line)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # SyntaxWarning of an `assert (x, "msg")`: the line's own business
            body = ast.parse(line).body
    except _PARSE_ERRORS:  # the jail compiles it and reports the line failed, as before
        return whole
    if len(body) != 1 or not isinstance(body[0], ast.Assert):
        return whole
    test = body[0].test
    if isinstance(test, ast.Compare):
        if len(test.ops) != 1:
            return whole
        left, right = _literal(test.left), _literal(test.comparators[0])
        if (left is _NOT_LITERAL) == (right is _NOT_LITERAL):
            return whole
        literal_left = right is _NOT_LITERAL
        want, expr = (left, test.comparators[0]) if literal_left else (right, test.left)
        if isinstance(test.ops[0], (ast.Is, ast.IsNot)) and not any(want is c for c in (None, True, False)):
            return whole
        return Check("value", ast.get_source_segment(line, expr), want, _OPS[type(test.ops[0])], literal_left)
    negated = isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not)
    return Check("truth", ast.get_source_segment(line, test.operand if negated else test), not negated)


class RejectedReport(Exception):
    """The jail's report breaks the protocol: ``key`` is counted, the message logged once."""

    def __init__(self, key: str, detail: str) -> None:
        super().__init__(detail)
        self.key = key


def verdicts(out: bytes, checks: list[Check]) -> list[bool]:
    """Each check's verdict from the jail's stdout; :class:`RejectedReport` when it is not exactly one report."""
    try:
        text = out.decode("ascii")
    except UnicodeDecodeError:
        raise RejectedReport("not ascii", "not ASCII") from None
    lines = text.splitlines()
    if len(lines) != 1 or not text.endswith("\n"):
        raise RejectedReport("duplicated" if len(lines) > 1 else "not one line", f"{len(lines)} lines, not one")
    try:
        report = json.loads(lines[0])
    except (ValueError, RecursionError):
        raise RejectedReport("not json", "not JSON") from None
    if not isinstance(report, dict) or list(report) != ["results"] or not isinstance(report["results"], list):
        raise RejectedReport("wrong shape", 'not {"results": [...]}')
    results = report["results"]
    if len(results) != len(checks):
        raise RejectedReport("wrong count", f"{len(results)} results for {len(checks)} test lines")
    forms = {"exec": (None, "ok"), "truth": (None, "True", "False")}
    for i, (check, entry) in enumerate(zip(checks, results, strict=True)):
        allowed = forms.get(check.kind)
        good = entry in allowed if allowed else entry is None or (type(entry) is str and len(entry) <= VALUE_CHARS)
        if not good:
            raise RejectedReport("bad entry", f"result {i} is {entry!r:.40} for a {check.kind} line")
    return [check.passes(entry) for check, entry in zip(checks, results, strict=True)]


# -- the reward -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class CodeExecParams:
    cpu_s: int = 2  # CPU seconds the child may use (RLIMIT_CPU); then the kernel kills it
    wall_s: float = 5.0  # wall seconds before the jail is killed (keep < explorer.reward_timeout_s)
    memory_mb: int = 512  # address space of each process in the jail (RLIMIT_AS), interpreter included
    file_mb: int = 8  # largest file the child may write (RLIMIT_FSIZE)
    tmp_mb: int = 16  # size of the jail's one writable place, a fresh /tmp (tmpfs; also /dev/shm), in host memory
    max_procs: int = 16  # processes and threads in the jail (RLIMIT_NPROC), its own init and the child included
    network_isolation: bool = True  # no network in the jail; False shares the explorer's (host abstract sockets too)
    sandbox: bool = True  # run in the bwrap jail; False runs the child unconfined (needs network_isolation: false)
    python: str = ""  # interpreter for the child; "": the one running the explorer


@dataclass(frozen=True)
class RunResult:
    passed: int  # test lines that passed (verdicts decided by the host where the line allows)
    total: int  # test lines
    status: str  # "ok", "died (...)", "wall time" or "rejected report (...)"


class CodeExecReward:
    """Fraction of the task's unit tests (``answer``, one per line) the response's code passes, jailed."""

    def __init__(self, *, params: CodeExecParams) -> None:
        p = params
        if p.cpu_s < 1 or p.wall_s <= 0 or p.memory_mb < 64 or p.file_mb < 0 or p.tmp_mb < 1 or p.max_procs < 3:
            raise TrinityError(
                "code_exec: cpu_s >= 1, wall_s > 0, memory_mb >= 64, file_mb >= 0, tmp_mb >= 1 and "
                f"max_procs >= 3 needed, got {p}"
            )
        self.params = p
        self.rejected: collections.Counter[str] = collections.Counter()  # rejected reports by reason
        self._lock = threading.Lock()
        python = os.path.realpath(shutil.which(p.python) or p.python if p.python else sys.executable)
        if not os.access(python, os.X_OK):
            raise TrinityError(f"code_exec: python: {p.python!r} is not an executable interpreter here")
        if not p.sandbox:
            if p.network_isolation:
                raise TrinityError(
                    "code_exec: sandbox: false runs the model's code without namespaces, the network "
                    "included; set network_isolation: false as well to say so"
                )
            _LOG.warning("code_exec: sandbox: false: the model's code runs unconfined (this user, this filesystem)")
            self.argv = [python]
            return
        problem = _jail_problem(python, p)
        if problem:
            raise TrinityError(
                f"code_exec: cannot build the sandbox for the model's code: {problem}; install bubblewrap "
                "(scripts/setup.sh does) and allow user namespaces, or set sandbox: false and "
                "network_isolation: false in the reward's args to run it unconfined"
            )
        self.argv = _jail(python, p)

    def run(self, code: str, tests: list[str]) -> RunResult:
        """Run ``code`` and ``tests`` in a fresh jail; what passed (decided here) and how it ended."""
        checks = [plan(line) for line in tests]
        job = json.dumps({"code": code, "checks": [[c.kind, c.src] for c in checks]}).encode()
        mb, p = 1024 * 1024, self.params
        nproc = p.max_procs if p.sandbox else -1  # unconfined, RLIMIT_NPROC would count all this user's processes
        limits = [str(p.cpu_s), str(p.memory_mb * mb), str(p.file_mb * mb), str(nproc), str(VALUE_CHARS)]
        cmd = [*self.argv, "-I", "-S", "-c", CHILD, *limits]
        cap = len(checks) * (12 * VALUE_CHARS + 8) + 64  # a true report's most (JSON escapes: 12 bytes a char)
        folder = contextlib.nullcontext("/") if p.sandbox else tempfile.TemporaryDirectory(prefix="code-exec-")
        with folder as cwd:  # the jail chdirs to its /tmp; the unconfined child gets an empty folder
            ran = run_capped(cmd, job, wall_s=p.wall_s, cap=cap, cwd=cwd)
        if ran.timed_out:
            return RunResult(0, len(tests), "wall time")
        try:
            if ran.overflow:
                raise RejectedReport("too large", f"over {cap} bytes")
            if ran.returncode != 0:
                return RunResult(0, len(tests), f"died ({_how(ran.returncode, p.sandbox)})")
            if not ran.out:
                raise RejectedReport("missing", "exit status 0 and no report (os._exit before it)")
            passed = sum(verdicts(ran.out, checks))
        except RejectedReport as exc:
            self._count(exc)
            return RunResult(0, len(tests), f"rejected report ({exc})")
        return RunResult(passed, len(tests), "ok")

    def _count(self, exc: RejectedReport) -> None:
        with self._lock:
            first = exc.key not in self.rejected
            self.rejected[exc.key] += 1
        if first:
            _LOG.warning(
                "code_exec: rejected a report of the sandboxed code (%s): the call scores 0; later rejections "
                "of this kind are counted in CodeExecReward.rejected[%r], not logged",
                exc,
                exc.key,
            )

    def __call__(self, *, response: str, answer: str) -> float:
        tests = unit_tests(answer)
        if not tests:
            raise TrinityError("code_exec: the task's answer holds no unit tests (one statement per line)")
        result = self.run(extract_code(response), tests)
        return result.passed / result.total


def _jail_problem(python: str, p: CodeExecParams) -> str | None:
    """What stops the jail from running here, in a few words; None when it runs."""
    for tool in ("bwrap", "setpriv") if os.geteuid() == 0 else ("bwrap",):
        if shutil.which(tool) is None:
            return f"{tool} is not on PATH ({'Debian package bubblewrap' if tool == 'bwrap' else 'util-linux'})"
    try:
        argv = _jail(python, p)
    except OSError as exc:
        return str(exc)
    return sandbox_problem(tuple(argv))


def _jail(python: str, p: CodeExecParams) -> list[str]:
    bwrap, setpriv = shutil.which("bwrap"), shutil.which("setpriv") or "setpriv"
    return jail_argv(python, network=p.network_isolation, tmp_mb=p.tmp_mb, bwrap=bwrap, setpriv=setpriv)


def _how(code: int | None, jailed: bool) -> str:
    if code is not None and code < 0:  # the jail (or the unconfined child) itself was killed
        return f"signal {signal.Signals(-code).name}"
    if jailed and code is not None and 128 < code < 128 + signal.NSIG:  # bwrap's way to pass a signal on
        try:
            name = signal.Signals(code - 128).name
        except ValueError:
            name = str(code - 128)
        return f"exit status {code}: signal {name}"
    return f"exit status {code}"
