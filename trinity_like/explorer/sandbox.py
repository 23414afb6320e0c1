"""A bubblewrap jail for one untrusted Python program, and running it with a wall time and capped output.

Used by the ``code_exec`` reward (:mod:`trinity_like.explorer.code_exec`). :func:`jail_argv`
builds a ``bwrap`` (bubblewrap, Debian package ``bubblewrap``) command line that runs the
interpreter with

- new user, PID, mount, IPC, UTS and cgroup namespaces, and a network namespace with no
  interface up unless ``network`` is False (``--unshare-all``); no further user namespaces
  inside (``--disable-userns``), every capability dropped (``--cap-drop ALL``),
  ``no_new_privs`` (bwrap always sets it), a session of its own (``--new-session``: no
  TIOCSTI into the explorer's terminal), SIGKILLed if the explorer dies (``--die-with-parent``);
- uid and gid 65534 inside. When the explorer runs as root, the host uid and gid 65534
  (nobody) too, with no supplementary groups, so root's files stay root's: an outer bwrap
  (run as root, a mount namespace only) makes the interpreter's folders reachable for that
  uid (pyenv's under ``/root``, mode 700, are not), then ``setpriv`` switches to it and
  drops every capability before the jail's own (unprivileged) bwrap starts. As another
  user, the jail maps 65534 inside to that user outside;
- a filesystem of its own: ``/usr`` and the top-level links or folders of the system
  (``/bin``, ``/lib``, ...), the dynamic loader's cache and the interpreter's prefix, all
  read-only, with the interpreter's site-packages folders hidden under empty read-only
  tmpfs (nothing pip installed is readable or importable); a fresh ``/proc`` of its own PID
  namespace; a minimal read-only ``/dev``; and one writable place, a fresh ``/tmp`` of
  ``tmp_mb`` (a tmpfs, also mounted at ``/dev/shm``, the working directory and ``HOME``).
  Everything else -- the project, the run folder, ``/etc`` beyond the loader's files,
  ``/root``, ``/home``, the host's ``/tmp`` and ``/run`` with their unix sockets -- is absent;
- an environment of ``PATH``, ``HOME`` and ``LANG`` alone.

:func:`sandbox_problem` checks once per command line that it runs here (bwrap installed,
user namespaces allowed, the interpreter readable by the sandbox's uid) and says what is
missing. :func:`run_capped` runs a program to its end with a wall time and capped output;
:class:`Session` speaks to one line by line (a query, a reply), within one wall time. Example::

    argv = jail_argv(os.path.realpath(sys.executable), network=True, tmp_mb=16)
    assert sandbox_problem(tuple(argv)) is None
    ran = run_capped([*argv, "-I", "-S", "-c", "print(2 + 3)"], b"", wall_s=5, cap=1024)
    assert ran.out == b"5\\n" and ran.returncode == 0
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from functools import cache

SANDBOX_UID = 65534  # uid/gid inside the jail, and on the host when the explorer is root ("nobody")
_LOADER_FILES = ("/etc/ld.so.cache", "/etc/ld.so.conf", "/etc/ld.so.conf.d", "/etc/localtime", "/etc/alternatives")
_TOP_LEVEL = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
# The interpreter's prefixes and its site-packages folders, asked of the interpreter itself.
_PREFIXES = (
    "import json, site, sys, sysconfig\n"
    "paths = sysconfig.get_paths()\n"
    "print(json.dumps({'prefixes': [sys.base_prefix, sys.base_exec_prefix],\n"
    "                  'site': site.getsitepackages() + [paths['purelib'], paths['platlib']]}))\n"
)


@cache
def interpreter_layout(python: str) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The real paths of ``python``'s prefixes and of its site-packages folders that exist."""
    done = subprocess.run(
        [python, "-I", "-S", "-c", _PREFIXES], capture_output=True, text=True, timeout=30, check=False
    )
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise OSError(f"{python} -I -S failed: {last}")
    layout = json.loads(done.stdout)
    prefixes = tuple(dict.fromkeys(os.path.realpath(p) for p in layout["prefixes"]))
    site = tuple(dict.fromkeys(os.path.realpath(p) for p in layout["site"] if os.path.isdir(p)))
    return prefixes, site


def _under(path: str, roots: list[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def jail_argv(python: str, *, network: bool, tmp_mb: int, bwrap: str = "bwrap", setpriv: str = "setpriv") -> list[str]:
    """The command line (ending in the interpreter's path) that runs ``python`` jailed.

    ``python`` is an absolute real path (no symlink to resolve inside the jail). Raises
    OSError when the interpreter cannot say where its files are. As root, an outer bwrap
    (privileged: a mount namespace only) makes the interpreter's folders reachable by
    uid 65534 (an interpreter under ``/root``, mode 700, is not) and ``setpriv`` switches
    to that uid, with no groups and no capabilities, before the jail's own bwrap starts.
    """
    prefixes, site = interpreter_layout(python)
    argv = [bwrap, "--unshare-all", "--unshare-user", "--disable-userns", "--cap-drop", "ALL"]
    argv += [] if network else ["--share-net"]
    argv += ["--die-with-parent", "--new-session", "--uid", str(SANDBOX_UID), "--gid", str(SANDBOX_UID)]
    argv += ["--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp"]
    argv += ["--setenv", "LANG", "C.UTF-8"]
    bound = ["/usr"]
    argv += ["--ro-bind", "/usr", "/usr"]
    for top in _TOP_LEVEL:
        if os.path.islink(top):  # merged /usr: /bin -> usr/bin
            argv += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            argv += ["--ro-bind", top, top]
            bound.append(top)
    for path in _LOADER_FILES:
        argv += ["--ro-bind-try", path, path]
    extra = []
    for path in (*prefixes, os.path.dirname(python)):
        if not _under(path, bound):  # an interpreter outside /usr (pyenv, conda, a built Python)
            argv += ["--ro-bind", path, path]
            bound.append(path)
            extra.append(path)
    for path in site:  # hidden: empty and read-only
        if _under(path, bound):
            argv += ["--size", "4096", "--tmpfs", path, "--remount-ro", path]
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--size", str(tmp_mb * 1024 * 1024), "--tmpfs", "/tmp", "--bind", "/tmp", "/dev/shm"]
    argv += ["--remount-ro", "/dev", "--remount-ro", "/", "--chdir", "/tmp", "--", python]
    if os.geteuid() != 0:
        return argv
    outer = [bwrap, "--dev-bind", "/", "/", "--die-with-parent"]
    for blocker in dict.fromkeys(b for b in map(_unreachable_ancestor, extra) if b):
        outer += ["--tmpfs", blocker]  # e.g. /root, then the interpreter's folders bound back inside
        for path in (p for p in extra if _under(p, [blocker])):
            between = path[len(blocker) :].strip("/").split("/")[:-1]
            for i in range(1, len(between) + 1):  # bwrap would make them 0700
                outer += ["--perms", "0755", "--dir", os.path.join(blocker, *between[:i])]
            outer += ["--ro-bind", path, path]
    ids = str(SANDBOX_UID)
    outer += ["--", setpriv, "--reuid", ids, "--regid", ids, "--clear-groups", "--inh-caps=-all", "--"]
    return outer + argv


def _unreachable_ancestor(path: str) -> str | None:
    """The first folder on the way to ``path`` that uid/gid 65534 may not enter, or None."""
    parts = path.strip("/").split("/")
    for i in range(1, len(parts) + 1):
        folder = "/" + "/".join(parts[:i])
        st = os.stat(folder)
        bit = 0o100 if st.st_uid == SANDBOX_UID else 0o010 if st.st_gid == SANDBOX_UID else 0o001
        if not st.st_mode & bit:
            return folder
    return None


@cache
def sandbox_problem(argv: tuple[str, ...]) -> str | None:
    """Why the jail ``argv`` (from :func:`jail_argv`) cannot run here, in a few words; None when it runs.

    Runs the interpreter once in it (as the explorer's calls will: as nobody when root).
    """
    try:
        ran = run_capped([*argv, "-I", "-S", "-c", "print('jailed')"], b"", wall_s=30, cap=4096, keep_stderr=True)
    except OSError as exc:
        return f"cannot start {argv[0]}: {exc.strerror or exc}"
    if ran.returncode == 0 and ran.out == b"jailed\n":
        return None
    last = (ran.err.decode(errors="replace").strip().splitlines() or [f"exit status {ran.returncode}"])[-1]
    return f"{os.path.basename(argv[0])} failed: {last}"


@dataclass(frozen=True)
class Ran:
    returncode: int | None  # None when it was killed at the wall time or for its output
    out: bytes  # its stdout, at most cap + 64 KiB
    timed_out: bool = False  # ran past wall_s and was killed
    overflow: bool = False  # wrote more than cap bytes to stdout and was killed
    err: bytes = b""  # its stderr (only with keep_stderr)


def run_capped(
    cmd: list[str], data: bytes, *, wall_s: float, cap: int, cwd: str = "/", keep_stderr: bool = False
) -> Ran:
    """Run ``cmd`` with ``data`` on stdin; kill its process group at ``wall_s`` or past ``cap`` bytes of stdout.

    Stdin and stdout are served in one loop without threads, so a child that reads nothing,
    writes too much or leaves a descendant holding stdout open can block neither the caller
    nor its memory.
    """
    child = subprocess.Popen(
        cmd,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE if keep_stderr else subprocess.DEVNULL,
        cwd=cwd,
        env={"PATH": os.defpath},
        close_fds=True,
        start_new_session=True,  # its own process group, killed whole below
    )
    deadline = time.monotonic() + wall_s
    out, pending = bytearray(), memoryview(data)
    timed_out = overflow = False
    try:
        with selectors.DefaultSelector() as sel:
            for pipe in (child.stdin, child.stdout):
                os.set_blocking(pipe.fileno(), False)
            sel.register(child.stdout, selectors.EVENT_READ)
            if pending:
                sel.register(child.stdin, selectors.EVENT_WRITE)
            else:
                child.stdin.close()
            while _open(sel, child.stdout):
                left = deadline - time.monotonic()
                if left <= 0:
                    timed_out = True
                    break
                events = sel.select(min(left, 0.1))
                for key, _ in events:
                    if key.fileobj is child.stdin:
                        pending = _feed(sel, child.stdin, pending)
                    elif chunk := os.read(child.stdout.fileno(), 65536):
                        out += chunk
                    else:  # EOF: in the jail, the whole PID namespace is gone
                        sel.unregister(child.stdout)
                if len(out) > cap:
                    overflow = True
                    break
                if not events and child.poll() is not None:
                    # exited while a descendant (unjailed) holds stdout: take what is there
                    with contextlib.suppress(BlockingIOError):
                        out += os.read(child.stdout.fileno(), cap + 1 - len(out))
                    break
        if not (timed_out or overflow):
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                timed_out = True
    finally:
        _kill_group(child)
        err = child.stderr.read() if keep_stderr else b""
        for pipe in (child.stdin, child.stdout, child.stderr):
            if pipe is not None:
                pipe.close()
    code = None if timed_out or overflow else child.returncode
    return Ran(code, bytes(out), timed_out, overflow, err)


class Session:
    """A jailed program spoken to in lines: the caller writes one, reads one back, within one wall time.

    ``send`` and ``receive`` raise :class:`Ended` when the program is gone (its exit status
    in ``returncode``), past ``wall_s`` or past ``line_cap`` bytes in a line; :meth:`close`
    kills its whole process group. Only its stdout is read: nothing else it could write to
    reaches the caller.
    """

    def __init__(self, cmd: list[str], *, wall_s: float, line_cap: int, cwd: str = "/") -> None:
        self.child = subprocess.Popen(
            cmd,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            cwd=cwd,
            env={"PATH": os.defpath},
            close_fds=True,
            start_new_session=True,  # its own process group, killed whole by close()
        )
        for pipe in (self.child.stdin, self.child.stdout):
            os.set_blocking(pipe.fileno(), False)
        self.deadline, self.line_cap, self.buffer = time.monotonic() + wall_s, line_cap, bytearray()

    def _wait(self, pipe, event: int) -> None:
        with selectors.DefaultSelector() as sel:
            sel.register(pipe, event)
            while not sel.select(min(0.1, max(0.0, self.deadline - time.monotonic()))):
                if time.monotonic() >= self.deadline:
                    raise Ended("wall time")
                if self.child.poll() is not None:  # gone, while a descendant may hold the pipe open
                    raise Ended("died")

    def send(self, line: bytes) -> None:
        pending = memoryview(line)
        while pending:
            self._wait(self.child.stdin, selectors.EVENT_WRITE)
            try:
                pending = pending[os.write(self.child.stdin.fileno(), pending[:65536]) :]
            except BrokenPipeError:
                raise Ended("died") from None

    def receive(self) -> bytes:
        while (end := self.buffer.find(b"\n")) < 0:
            if len(self.buffer) > self.line_cap:
                raise Ended("too large")
            self._wait(self.child.stdout, selectors.EVENT_READ)
            chunk = os.read(self.child.stdout.fileno(), 65536)
            if not chunk:
                raise Ended("died")
            self.buffer += chunk
        line, self.buffer = bytes(self.buffer[:end]), self.buffer[end + 1 :]
        if len(line) > self.line_cap:
            raise Ended("too large")
        return line

    def returncode(self) -> int | None:
        """The program's exit status once it is gone (waits up to the wall time), else None."""
        try:
            return self.child.wait(timeout=max(0.0, self.deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            return None

    def close(self) -> None:
        _kill_group(self.child)
        for pipe in (self.child.stdin, self.child.stdout):
            with contextlib.suppress(OSError):
                pipe.close()


class Ended(Exception):
    """A :class:`Session`'s program is gone (``died``), past its wall time or past its line cap."""


def _open(sel: selectors.BaseSelector, pipe) -> bool:
    try:
        sel.get_key(pipe)
    except KeyError:
        return False
    return True


def _feed(sel: selectors.BaseSelector, stdin, pending: memoryview) -> memoryview:
    try:
        pending = pending[os.write(stdin.fileno(), pending[:65536]) :]
    except BrokenPipeError:  # it exited before reading everything: its exit status says how
        pending = pending[:0]
    if not pending:
        sel.unregister(stdin)
        stdin.close()
    return pending


def _kill_group(child: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(child.pid, signal.SIGKILL)
    child.wait()
