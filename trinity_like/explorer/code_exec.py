"""``code_exec``: a unit-test reward for programming tasks, run in a sandboxed process.

Registered in REWARD_FN as ``code_exec`` by :mod:`trinity_like.explorer.rewards`.

The model's response is Python code (the last fenced ```python block, else the whole
text); the task's ``answer`` holds its unit tests, one statement per line
(``assert add(2, 3) == 5``). The reward is the fraction of test lines that run without
raising. The explorer never imports or runs the model's code itself: each call starts a
fresh interpreter (``python -I -S``: no site packages, no user environment) in an empty
temporary folder, with

- CPU time (``RLIMIT_CPU``), address space (``RLIMIT_AS``), file size (``RLIMIT_FSIZE``)
  and open files (``RLIMIT_NOFILE``) limited, set by the child before the code runs;
- a wall-time limit: after ``wall_s`` the child's whole process group is SIGKILLed;
- no network: the child runs under ``unshare -n`` (``unshare -rn`` without root), in a
  network namespace of its own with no interface up, not even loopback. Where neither
  works the reward refuses to start unless ``network_isolation: false`` says to run without;
- a PID namespace of its own (``unshare -p -f``): every process the code starts dies with
  the child, even one that detached into a session of its own;
- nothing inherited: an environment of ``PATH`` alone, stdin closed after the payload.

A child that dies (a limit hit, a crash, ``os._exit``, SIGKILL from outside) scores 0 for
that call: it was the model's code that died; the next call starts a new process. What
cannot be contained here: the child runs as the same user (it can read what that user can
read, within its time), and a determined program could fake the result line it shares a
process with -- the sandbox contains damage, not reward hacking. docs/reliability.md has
the trust model. Example::

    reward = CodeExecReward(params=CodeExecParams(cpu_s=2))
    reward(response="def add(a, b):\\n    return a + b", answer="assert add(2, 3) == 5")   # 1.0
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from functools import cache

from trinity_like.errors import TrinityError

# The child's program: set its limits (argv: CPU s, address space and file size in bytes),
# read {code, tests, nonce}, run the code, then each test line, and print
# "<nonce> <passed> <total>". It is passed with -c: nothing of the parent's is imported.
# The limits are set by the child itself, before any of the model's code runs, rather than
# between fork and exec (preexec_fn is unsafe in the explorer, which has threads).
CHILD = r"""
import json, resource, sys
cpu, memory, fsize = map(int, sys.argv[1:4])
resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
resource.setrlimit(resource.RLIMIT_FSIZE, (fsize, fsize))
resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
job = json.loads(sys.stdin.read())
sys.stdin.close()
nonce, tests = job.pop("nonce"), job["tests"]
out = sys.stdout
sys.stdout = sys.stderr  # what the code prints does not reach the result line
ns = {"__name__": "__solution__"}
try:
    exec(compile(job["code"], "<solution>", "exec"), ns)
    ok = True
except BaseException:
    ok = False
passed = 0
for line in tests if ok else []:
    try:
        exec(compile(line, "<test>", "exec"), ns)
        passed += 1
    except BaseException:
        pass
out.write(f"{nonce} {passed} {len(tests)}\n")
out.flush()
"""

_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


def extract_code(response: str) -> str:
    """The last fenced code block of ``response`` (```python ... ```), else the whole response."""
    blocks = _FENCE.findall(response)
    return blocks[-1] if blocks else response


def unit_tests(answer: str) -> list[str]:
    """The task's unit tests: one statement per non-blank, non-comment line."""
    return [line for line in answer.splitlines() if line.strip() and not line.lstrip().startswith("#")]


@cache
def namespaces(network: bool) -> tuple[str, ...] | None:
    """The ``unshare`` prefix that runs a child in a PID namespace of its own (everything it
    starts dies with it, however it detaches) and, with ``network``, a network namespace
    with no interface up; ``-r`` (a user namespace) where plain ``unshare`` needs root.
    None where neither works."""
    unshare = shutil.which("unshare")
    if unshare is None:
        return None
    flags = ("-n", "-p", "-f") if network else ("-p", "-f")
    for prefix in ((unshare, *flags), (unshare, "-r", *flags)):
        try:
            done = subprocess.run([*prefix, "true"], capture_output=True, timeout=10, check=False)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if done.returncode == 0:
            return prefix
    return None


@dataclass(frozen=True)
class CodeExecParams:
    cpu_s: int = 2  # CPU seconds the child may use (RLIMIT_CPU); then the kernel kills it
    wall_s: float = 5.0  # wall seconds before the child's process group is killed (keep < explorer.reward_timeout_s)
    memory_mb: int = 512  # address space of the child (RLIMIT_AS), interpreter included
    file_mb: int = 8  # largest file the child may write (RLIMIT_FSIZE), in its own temporary folder
    network_isolation: bool = True  # run under `unshare -n`; False runs with the network (no unshare here)
    python: str = ""  # interpreter for the child; "": the one running the explorer


@dataclass(frozen=True)
class RunResult:
    passed: int  # test lines that ran without raising
    total: int  # test lines
    status: str  # "ok", "died (<signal or exit status>)" or "wall time"


class CodeExecReward:
    """Fraction of the task's unit tests (``answer``, one per line) the response's code passes, sandboxed."""

    def __init__(self, *, params: CodeExecParams) -> None:
        if params.cpu_s < 1 or params.wall_s <= 0 or params.memory_mb < 64 or params.file_mb < 0:
            raise TrinityError(
                f"code_exec: cpu_s >= 1, wall_s > 0, memory_mb >= 64 and file_mb >= 0 needed, got {params}"
            )
        self.params = params
        jail = namespaces(params.network_isolation)
        if jail is None and params.network_isolation:
            raise TrinityError(
                "code_exec: cannot isolate the network here (`unshare -n` and `unshare -rn` both "
                "failed: no util-linux, or user namespaces disabled); set network_isolation: false "
                "in the reward's args to run the model's code with the network"
            )
        self.jail: tuple[str, ...] = jail or ()  # () without unshare: processes the code detaches may outlive it

    def run(self, code: str, tests: list[str]) -> RunResult:
        """Run ``code`` and ``tests`` in a fresh sandboxed child; what passed and how it ended."""
        nonce = secrets.token_hex(16)
        job = json.dumps({"code": code, "tests": tests, "nonce": nonce})
        mb = 1024 * 1024
        limits = [str(self.params.cpu_s), str(self.params.memory_mb * mb), str(self.params.file_mb * mb)]
        cmd = [*self.jail, self.params.python or sys.executable, "-I", "-S", "-c", CHILD, *limits]
        with tempfile.TemporaryDirectory(prefix="code-exec-") as cwd:
            child = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                cwd=cwd,
                env={"PATH": os.defpath},
                close_fds=True,
                text=True,
                start_new_session=True,
            )  # its own process group, killed whole below
            try:
                child.stdin.write(job)
                child.stdin.close()
            except BrokenPipeError:  # it died before reading: its exit status says how
                pass
            try:
                child.wait(timeout=self.params.wall_s)  # not communicate(): what it started may hold stdout open
            except subprocess.TimeoutExpired:
                return RunResult(0, len(tests), "wall time")
            finally:
                _kill_group(child)  # whatever it started is gone too
            os.set_blocking(child.stdout.fileno(), False)
            out = child.stdout.read() or ""
            child.stdout.close()
        for line in reversed(out.splitlines()):
            parts = line.split()
            if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit() and parts[2].isdigit():
                return RunResult(int(parts[1]), int(parts[2]), "ok")
        code_ = child.returncode
        how = f"signal {signal.Signals(-code_).name}" if code_ < 0 else f"exit status {code_}"
        return RunResult(0, len(tests), f"died ({how})")

    def __call__(self, *, response: str, answer: str) -> float:
        tests = unit_tests(answer)
        if not tests:
            raise TrinityError("code_exec: the task's answer holds no unit tests (one statement per line)")
        result = self.run(extract_code(response), tests)
        return result.passed / result.total


def _kill_group(child: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
