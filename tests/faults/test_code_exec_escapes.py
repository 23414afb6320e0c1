"""Model-written code tries to get out of the ``code_exec`` jail; every attempt must fail.

Each probe is code a model could write, run through the real reward. It sets ``outcome`` (or
a few such names) and the task's test lines assert ``outcome == "blocked"``: lines the host
decides itself (the literal never enters the jail), so the reward is 1.0 only if every attempt
failed. Outside the jail the test checks what the attempt would have touched (the file's bytes
and mtime, the listening socket's queue, the host uid of the jailed process). Where the same
attempt succeeds without the jail (``sandbox: false``), that control run shows the probe can
tell. As root, the probes run again with the explorer as an unprivileged user (uid 65534).
Attempts to forge the verdict itself: test_code_exec_forgery.py.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import tempfile
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest
from _lib.faultlib import record

from trinity_like.explorer import code_exec
from trinity_like.explorer.code_exec import CodeExecParams, CodeExecReward
from trinity_like.explorer.sandbox import SANDBOX_UID

REPO = Path(__file__).resolve().parents[2]
ROOT = os.geteuid() == 0
pytestmark = pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="no bwrap (Debian package bubblewrap; scripts/setup.sh installs it as root)"
)


def jailed(**params) -> CodeExecReward:
    return CodeExecReward(params=CodeExecParams(**{"wall_s": 20, **params}))


def unconfined() -> CodeExecReward:
    return CodeExecReward(params=CodeExecParams(wall_s=20, sandbox=False, network_isolation=False))


def blocked(names: str) -> list[str]:
    """Test lines: each name in ``names`` (space-separated) must be the string "blocked"."""
    return [f"assert {n} == 'blocked'" for n in names.split()]


def attempt(name: str, body: str) -> str:
    """Code that runs ``body`` and sets ``name`` to "escaped" if it got through, "blocked" if it raised OSError."""
    return f"try:\n{textwrap.indent(body, '    ')}\n    {name} = 'escaped'\nexcept OSError:\n    {name} = 'blocked'\n"


WRITES = "".join(
    attempt(name, f"os.close(os.open({path!r}, os.O_WRONLY | os.O_APPEND | os.O_CREAT))")
    for name, path in [("to_root", "/x"), ("to_usr", "/usr/x"), ("to_etc", "/etc/passwd"), ("to_dev", "/dev/x")]
)


def test_writes_stay_in_the_jails_own_fresh_tmp(tmp_path, record_property):
    source = Path(code_exec.__file__)  # the project's own source, imported by the explorer
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    before = (source.read_bytes(), source.stat().st_mtime_ns)
    marker = f"/tmp/code-exec-{secrets.token_hex(4)}"
    code = "import os\n" + WRITES
    code += attempt("to_source", f"os.close(os.open({str(source)!r}, os.O_WRONLY | os.O_APPEND))")
    code += attempt("to_run_dir", f"open({str(run_dir / 'metrics.jsonl')!r}, 'a').write('x')")
    code += f"open({marker!r}, 'w').write('mine')\nmine = open({marker!r}).read()\n"
    code += attempt("fill_tmp", "open('/tmp/big', 'wb').write(b'x' * (20 * 1024 * 1024))")  # over tmp_mb=16
    tests = [*blocked("to_root to_usr to_etc to_dev to_source to_run_dir fill_tmp"), "assert mine == 'mine'"]
    r = jailed()
    with tempfile.TemporaryDirectory(dir="/tmp") as shared:  # writable by anyone: only the mount namespace stops it
        os.chmod(shared, 0o777)
        code += attempt("to_shared", f"open({shared + '/x'!r}, 'w').write('x')")
        result = r.run(code, [*tests, *blocked("to_shared")])
        assert os.listdir(shared) == []
    assert (result.passed, result.total, result.status) == (len(tests) + 1, len(tests) + 1, "ok")
    assert (source.read_bytes(), source.stat().st_mtime_ns) == before
    assert list(run_dir.iterdir()) == [] and not Path(marker).exists()  # its /tmp was its own
    assert r.run(f"import os\nseen = os.path.exists({marker!r})", ["assert seen is False"]).passed == 1  # and fresh
    control = unconfined().run("import os\n" + attempt("to_run_dir", f"open({str(run_dir / 'm')!r}, 'a')"), tests[5:6])
    assert control.passed == 0 and (run_dir / "m").exists()  # the probe can tell
    record(
        record_property,
        "model-written code writes outside its folder: project source, run folder, a world-writable host /tmp folder, /, /usr, /etc, /dev",
        "blocked: absent or read-only in the jail; its one writable place is a fresh 16 MB /tmp of its own",
        "not needed (the explorer goes on)",
        "-",
    )


PROCS = """
import os
pids = [p for p in os.listdir('/proc') if p.isdigit()]
n_pids = len(pids)
pid1 = os.path.basename(open('/proc/1/cmdline', 'rb').read().split(bytes(1))[0].decode())
seen, leaked = False, SECRET in str(os.environ)
for p in pids:
    for part, mark in (('cmdline', CMDLINE), ('environ', SECRET)):
        try:
            found = mark.encode() in open(f'/proc/{p}/{part}', 'rb').read()
        except OSError:
            found = False
        seen, leaked = (seen or found, leaked) if part == 'cmdline' else (seen, leaked or found)
"""
PROC_TESTS = ["assert n_pids <= 3", "assert pid1 == 'bwrap'", "assert seen is False", "assert leaked is False"]


def neighbour() -> tuple[subprocess.Popen, str, str]:
    """A process beside the explorer (as Ray's raylet is) with a secret in its environment."""
    cmdline, secret = f"60.{secrets.randbelow(10**6):06d}", secrets.token_hex(8)
    proc = subprocess.Popen(["sleep", cmdline], env={"PATH": os.defpath, "TRINITY_LIKE_TEST_SECRET": secret})
    return proc, cmdline, secret


def procs_probe(cmdline: str, secret: str) -> str:
    return PROCS.replace("CMDLINE", repr(cmdline)).replace("SECRET", repr(secret))


def test_no_view_of_other_processes_their_environment_or_etc_shadow(record_property):
    proc, cmdline, secret = neighbour()
    code = procs_probe(cmdline, secret) + attempt("shadow", "open('/etc/shadow').read()")
    tests = [*PROC_TESTS, *blocked("shadow")]
    try:
        assert jailed().run(code, tests).passed == len(tests)
        if ROOT:  # unconfined, as root, each line fails: the probes can tell
            assert unconfined().run(code, tests).passed == 0
    finally:
        proc.kill()
        proc.wait()
    record(
        record_property,
        "model-written code reads other processes (host /proc, their cmdlines and environments) and /etc/shadow",
        "blocked: own PID namespace and /proc (its init and itself), environment of PATH/HOME/LANG, /etc/shadow absent",
        "not needed (the explorer goes on)",
        "-",
    )


PRIVILEGE = """
import ctypes, os, subprocess
uid, gid = os.getuid(), os.getgid()
status = dict(line.split(':', 1) for line in open('/proc/self/status').read().splitlines())
caps = {status[k].strip() for k in ('CapInh', 'CapPrm', 'CapEff', 'CapBnd', 'CapAmb')}
nnp = status['NoNewPrivs'].strip()
"""
PRIVILEGE += attempt("setuid", "os.setuid(0)") + attempt("setgid", "os.setgid(0)")
PRIVILEGE += attempt("chroot", "os.chroot('/tmp')")
PRIVILEGE += "userns = 'blocked' if ctypes.CDLL(None).unshare(0x10000000) else 'escaped'\n"  # CLONE_NEWUSER
PRIVILEGE_TESTS = [
    "assert uid == 65534",
    "assert gid == 65534",
    "assert caps == {'0000000000000000'}",
    "assert nnp == '1'",
    *blocked("setuid setgid chroot userns"),
]
BOMB = "import os\nwhile True:\n    os.fork()\n"
FORKS = "import os, time\nforks = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(5)\n            os._exit(0)\n        forks += 1\nexcept OSError:\n    pass\n"


def jailed_children() -> list[psutil.Process]:
    """The interpreters this process runs (through bwrap), as the host sees them."""
    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if child.cmdline()[1:3] == ["-I", "-S"]:
                found.append(child)
        except psutil.Error:  # gone meanwhile
            pass
    return found


def test_not_root_no_capabilities_and_a_fork_bomb_is_bounded(record_property):
    r = jailed(max_procs=16)
    assert r.run(PRIVILEGE, PRIVILEGE_TESTS).passed == len(PRIVILEGE_TESTS)
    # seen from the host: the jailed interpreter is not root there either
    outcome = []
    call = threading.Thread(target=lambda: outcome.append(r.run("import time\ntime.sleep(3)", ["assert True"])))
    call.start()
    deadline = time.monotonic() + 10
    while not (kids := jailed_children()):
        assert time.monotonic() < deadline, "the jailed child never started"
        time.sleep(0.05)
    assert {k.uids().real for k in kids} == {SANDBOX_UID if ROOT else os.getuid()}
    call.join()
    assert outcome[0].passed == 1
    # RLIMIT_NPROC: forks stop at the limit (the jail's init and the child count too) ...
    assert r.run(FORKS, ["assert forks < 16", "assert forks >= 8"]).passed == 2
    # ... and a fork bomb ends at the wall time, leaving nothing behind
    t0 = time.monotonic()
    bombed = jailed(wall_s=2, cpu_s=1, max_procs=16).run(BOMB, ["assert True"])
    assert bombed.passed == 0 and time.monotonic() - t0 < 6, (bombed, time.monotonic() - t0)
    time.sleep(0.5)
    left = [p for p in psutil.process_iter(["cmdline"]) if code_exec.CHILD in (p.info["cmdline"] or [])]
    assert not left, "a forked process outlived the call"
    if ROOT:  # root can setuid(0): the probe tells
        assert unconfined().run("import os\n" + attempt("setuid", "os.setuid(0)"), blocked("setuid")).passed == 0
    record(
        record_property,
        "model-written code as root: setuid(0), setgid, chroot, a nested user namespace, capabilities, a fork bomb",
        "blocked: uid 65534 in the jail and on the host, no capabilities, no_new_privs; RLIMIT_NPROC 16; "
        "the bomb ends at the wall time (2 s) with nothing left",
        "not needed (the explorer goes on)",
        "-",
    )


def sockets_probe(path: str, abstract: str, port: int) -> str:
    code = "import socket\n"
    code += attempt("unix_file", f"socket.socket(socket.AF_UNIX).connect({path!r})")
    code += attempt("unix_abstract", f"socket.socket(socket.AF_UNIX).connect({abstract!r})")
    code += attempt("tcp", f"socket.create_connection(('127.0.0.1', {port}), timeout=2).close()")
    return code


def pending(server: socket.socket) -> int:
    """Connections waiting in ``server``'s queue (accepted and closed here)."""
    server.setblocking(False)
    n = 0
    while True:
        try:
            server.accept()[0].close()
        except BlockingIOError:
            return n
        n += 1


def listeners(folder: Path) -> tuple[list[socket.socket], str, str, int]:
    path = str(folder / "raylet.sock")  # a filesystem socket, as Ray's session sockets are
    abstract = f"\0trinity-like-test-{secrets.token_hex(4)}"
    servers = [socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX), socket.create_server(("127.0.0.1", 0))]
    servers[0].bind(path)
    os.chmod(path, 0o777)  # anyone outside a jail may connect
    servers[1].bind(abstract)
    for s in servers[:2]:
        s.listen()
    return servers, path, abstract, servers[2].getsockname()[1]


def test_no_sockets_out_filesystem_abstract_or_tcp(tmp_path, record_property):
    servers, path, abstract, port = listeners(tmp_path)
    code, tests = sockets_probe(path, abstract, port), blocked("unix_file unix_abstract tcp")
    try:
        assert jailed().run(code, tests).passed == 3
        assert [pending(s) for s in servers] == [0, 0, 0]
        assert unconfined().run(code, tests).passed == 0  # the probe can tell: all three reached
        assert [pending(s) for s in servers] == [1, 1, 1]
        # network_isolation: false shares the network namespace, abstract sockets included
        assert jailed(network_isolation=False).run(code, tests).passed == 1  # the socket file is still absent
    finally:
        for s in servers:
            s.close()
    record(
        record_property,
        "model-written code connects to host unix sockets (a listening socket file, an abstract one) and TCP",
        "blocked: host socket files absent (own mount namespace), abstract and TCP unreachable (own network namespace)",
        "not needed (the explorer goes on)",
        "-",
    )


AS_NOBODY = """
import json, os, socket, sys
sys.path.insert(0, sys.argv[1])
from trinity_like.explorer.code_exec import CodeExecParams, CodeExecReward
args = json.loads(sys.argv[2])
out = {}
for name, params in (("jailed", {}), ("unconfined", {"sandbox": False, "network_isolation": False})):
    r = CodeExecReward(params=CodeExecParams(wall_s=20, **params))
    out[name] = [r.run(code, tests).passed for code, tests in args]
print(json.dumps(out))
"""


@pytest.mark.skipif(not ROOT or not os.path.exists("/usr/bin/python3"), reason="needs root (to become uid 65534)")
def test_the_same_escapes_fail_when_the_explorer_is_not_root(record_property):
    """The explorer as uid 65534 (setpriv, /usr/bin/python3): its own files, its own sockets, its view of /proc."""
    with tempfile.TemporaryDirectory(dir="/tmp") as folder:  # pytest's tmp_path is root's (0700)
        home = Path(folder)
        (home / "secret").write_text("mine")
        (home / "secret").chmod(0o600)
        for p in (home, home / "secret"):
            os.chown(p, SANDBOX_UID, SANDBOX_UID)
        home.chmod(0o755)
        as_nobody(home, record_property)


def as_nobody(home: Path, record_property) -> None:
    servers, path, abstract, port = listeners(home)
    proc, cmdline, secret = neighbour()
    probes = [
        ("import os\n" + attempt("own_file", f"open({str(home / 'secret')!r}).read()"), blocked("own_file")),
        ("import os\n" + attempt("own_dir", f"open({str(home / 'new')!r}, 'w')"), blocked("own_dir")),
        (procs_probe(cmdline, secret), PROC_TESTS),
        (sockets_probe(path, abstract, port), blocked("unix_file unix_abstract tcp")),
        (PRIVILEGE, PRIVILEGE_TESTS[2:]),  # uid/gid 65534 hold unconfined too
    ]
    cmd = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", AS_NOBODY]
    try:
        done = subprocess.run(
            [*cmd, str(REPO), json.dumps(probes)], capture_output=True, text=True, timeout=300, cwd="/", check=False
        )
    finally:
        proc.kill()
        proc.wait()
        for s in servers:
            s.close()
    assert done.returncode == 0, done.stderr[-2000:]
    out = json.loads(done.stdout)
    assert out["jailed"] == [len(t) for _, t in probes], out
    # without the jail it reads and writes its own files, reaches the sockets, sees the neighbour
    # (its cmdline; not its environment, another user's): the probes can tell
    assert out["unconfined"][:4] == [0, 0, 1, 0], out
    record(
        record_property,
        "the same escapes with the explorer as an unprivileged user (uid 65534): its own files, sockets, /proc",
        "blocked: its own files absent in the jail, sockets unreachable, no other process visible, no capabilities",
        "not needed (the explorer goes on)",
        "-",
    )
