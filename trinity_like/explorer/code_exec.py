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

**The verdict is the host's.** The jailed process holds the model's code and nothing of
the verdict: the host runs each test line itself (:mod:`trinity_like.explorer.code_verdict`)
and asks the jail, one JSON line per question on the process's stdin and stdout, only for
what the code's own objects do -- the value of ``add(2, 3)``, ``len`` of an object it made --
answered as plain data (or a handle for an object that stays in the jail). Comparisons,
``assert``, ``not``, the builtins and the verdict run here, so anything the code writes,
to any descriptor, at any time, is at most a value it could have returned honestly:
``assert False`` fails whatever the jail says, ``assert add(2, 3) == 5`` passes only if the
jail's value for ``add(2, 3)`` is 5 (the 5 never enters the jail), an object whose ``__eq__``
says True fails (the host compares plain data only), and the code sees no test's expected
value (no frame of the test's exists in its process). A reply that breaks the protocol
(not one JSON line, not ``{"value": ...}`` or ``{"raised": true}``) scores 0 for the call;
the reason is counted in :attr:`CodeExecReward.rejected` and logged the first time it occurs.

A child that dies (a limit hit, a crash, ``os._exit`` anywhere, SIGKILL from outside)
before the last line is judged scores 0 for that call (``sys.exit`` is an exception: it fails
the line that raised it, or every line at import); the next call starts a new jail. Where
the jail cannot be built (no bwrap, user namespaces disabled, an interpreter the jail cannot read) the reward refuses to start and
says what is missing; ``sandbox: false`` (with ``network_isolation: false``) opts out and
runs the child unconfined. docs/reliability.md has the trust model. Example::

    reward = CodeExecReward(params=CodeExecParams(cpu_s=2))
    reward(response="def add(a, b):\\n    return a + b", answer="assert add(2, 3) == 5")   # 1.0
"""

from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
from dataclasses import dataclass

from trinity_like.errors import TrinityError
from trinity_like.explorer.code_values import OutOfTime, Rejected
from trinity_like.explorer.code_verdict import Judge
from trinity_like.explorer.sandbox import Ended, Session, jail_argv, sandbox_problem

_LOG = logging.getLogger(__name__)
REPLY_BYTES = 1 << 20  # longest reply line (one value): the child answers "raised" past it; a longer line scores 0

# The child's program: set its limits (argv: CPU s, address space and file size in bytes,
# processes; then the longest reply), read the code (one JSON line), run it, say whether it loaded, then answer
# queries {"eval"|"exec": src, "bind": {name: value}} one line each: {"value": v} or
# {"raised": true}. Values are plain data (exact builtin types, tagged where JSON has no
# such type) or a handle into a table of the objects kept here. It is passed with -c:
# nothing of the parent's is imported. The limits are set by the child itself, before any
# of the model's code runs, rather than between fork and exec (preexec_fn is unsafe in the
# explorer, which has threads). Nothing here is trusted by the host: it only serves values.
CHILD = r"""
import builtins, json, os, resource, sys
cpu, memory, fsize, nproc, reply_bytes = map(int, sys.argv[1:6])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
if nproc > 0:  # in the jail: counts the jail's own processes only
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
queries, replies = os.fdopen(os.dup(0), "r"), os.fdopen(os.dup(1), "w")
os.dup2(os.open(os.devnull, os.O_RDONLY), 0)  # input() in the code reads nothing, not the queries
os.dup2(2, 1)  # what the code prints, even to fd 1, is not a reply
sys.stdin, sys.stdout = open(os.devnull), sys.stderr
ns, table = {"__name__": "__solution__"}, []
def frozen(v):
    t = type(v)
    return t in (int, float, complex, str, bytes, bool, type(None)) or t in (tuple, frozenset) and all(map(frozen, v))
def enc(v, depth=0):
    t = type(v)
    if v is None or t is bool or t is str or t is int and -2**63 < v < 2**63:
        return v
    if t in (int, float, bytes, complex):
        return {t.__name__: hex(v) if t is int else repr(v) if t is float else v.hex() if t is bytes
                else [repr(v.real), repr(v.imag)]}
    if depth < 100 and (t in (list, tuple) or t in (set, frozenset) and all(map(frozen, v))):
        return {t.__name__: [enc(i, depth + 1) for i in v]}
    if depth < 100 and t is dict and all(map(frozen, v)):
        return {"dict": [[enc(k), enc(i, depth + 1)] for k, i in v.items()]}
    table.append(v)
    return {"handle": len(table) - 1}
def dec(x):
    if type(x) is not dict:
        return x
    (tag, v), = x.items()
    if tag in ("list", "tuple", "set", "frozenset"):
        return {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[tag](map(dec, v))
    simple = {"handle": table.__getitem__, "int": lambda s: int(s, 16), "float": float, "bytes": bytes.fromhex,
              "complex": lambda p: complex(float(p[0]), float(p[1])), "range": lambda p: range(*p),
              "dict": lambda p: {dec(k): dec(i) for k, i in p}, "module": __import__,
              "builtin": lambda n: getattr(builtins, n),
              "lambda": lambda p: eval(p["lambda"], {**ns, **{k: dec(i) for k, i in p["bind"].items()}})}
    return simple[tag](x if tag == "lambda" else v)
def reply(obj):
    text = json.dumps(obj)
    replies.write((text if len(text) < reply_bytes else '{"raised": true}') + "\n")  # too large: the line fails
    replies.flush()
try:
    exec(compile(json.loads(queries.readline()), "<solution>", "exec"), ns)
    reply({"loaded": True})
except BaseException:
    reply({"loaded": False})
for line in queries:
    try:
        q = json.loads(line)
        ns.update({k: dec(v) for k, v in q["bind"].items()})
        if "eval" in q:
            out = {"value": enc(eval(compile(q["eval"], "<test>", "eval"), ns))}
        else:
            exec(compile(q["exec"], "<test>", "exec"), ns)
            out = {"value": None}
    except BaseException:
        out = {"raised": True}
    reply(out)
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
    passed: int  # test lines that passed (each verdict decided by the host)
    total: int  # test lines
    status: str  # "ok", "died (...)", "wall time" or "rejected report (...)"
    verdicts: tuple[bool, ...] = ()  # each line's verdict, when the call ended "ok"


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
        """Run ``code`` in a fresh jail and judge ``tests`` here; what passed and how it ended."""
        mb, p, n = 1024 * 1024, self.params, len(tests)
        nproc = p.max_procs if p.sandbox else -1  # unconfined, RLIMIT_NPROC would count all this user's processes
        limits = [str(p.cpu_s), str(p.memory_mb * mb), str(p.file_mb * mb), str(nproc), str(REPLY_BYTES)]
        cmd = [*self.argv, "-I", "-S", "-c", CHILD, *limits]
        folder = contextlib.nullcontext("/") if p.sandbox else tempfile.TemporaryDirectory(prefix="code-exec-")
        with folder as cwd:  # the jail chdirs to its /tmp; the unconfined child gets an empty folder
            session = Session(cmd, wall_s=p.wall_s, line_cap=REPLY_BYTES, cwd=cwd)
            try:
                verdicts = self._judge(session, code, tests)
            except OutOfTime:
                return RunResult(0, n, "wall time")
            except Ended as exc:
                if str(exc) == "too large":
                    self._count(Rejected("too large", f"a reply over {REPLY_BYTES} bytes"))
                    return RunResult(0, n, f"rejected report (a reply over {REPLY_BYTES} bytes)")
                if str(exc) == "wall time":
                    return RunResult(0, n, "wall time")
                return RunResult(0, n, f"died ({_how(session.returncode(), p.sandbox)})")
            except Rejected as exc:
                self._count(exc)
                return RunResult(0, n, f"rejected report ({exc})")
            finally:
                session.close()
        return RunResult(sum(verdicts), n, "ok", tuple(verdicts))

    @staticmethod
    def _judge(session: Session, code: str, tests: list[str]) -> list[bool]:
        def ask(query: dict) -> bytes:
            session.send(json.dumps(query).encode() + b"\n")
            return session.receive()

        session.send(json.dumps(code).encode() + b"\n")
        loaded = session.receive()
        if loaded not in (b'{"loaded": true}', b'{"loaded": false}'):
            raise Rejected("not loaded", f"{loaded[:40]!r} where {{'loaded': ...}} belongs")
        if loaded == b'{"loaded": false}':  # the code raised: no line can pass
            return [False] * len(tests)
        judge = Judge(ask, deadline=session.deadline)
        return [judge.line(line) for line in tests]

    def _count(self, exc: Rejected) -> None:
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
