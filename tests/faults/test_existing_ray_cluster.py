"""``cluster.ray_address: auto`` on a Ray cluster started separately: the run uses it and leaves it running.

The test starts a Ray head on this machine (``ray start --head --block``, its own ports,
temporary folder and 4 logical CPUs), points a run of the default recipe with the verl
engine at it through ``RAY_ADDRESS`` and ``cluster.ray_address=auto``, and watches
Ray's state API while the run trains: the verl worker and the explorer actor are placed
on that cluster's node. At the end the run's actors are dead, the cluster is alive (a
new driver connects to it), and the head is stopped by the test that started it -- never
``ray stop``, which would stop every Ray on the machine.

Slow (a Ray head and a verl start-up: about 3 minutes on the busy 2-core machine).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest
from _lib.faultlib import BATCH, GROUP, command, record, rows_by_step, start

RUN_ACTORS = {"TrinityVerlWorker", "ExplorerWorker"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def ray_head(tmp_path):
    """A Ray head on loopback ports: yields (GCS address, dashboard address); stopped after."""
    port, dashboard = free_port(), free_port()
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths live under it (107-byte limit)
    log = open(tmp_path / "ray_head.log", "w")  # noqa: SIM115 -- open while the head runs
    head = subprocess.Popen(
        [
            "ray",
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--node-ip-address=127.0.0.1",
            "--num-cpus=4",
            "--include-dashboard=true",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={dashboard}",
            f"--temp-dir={temp}",
            "--disable-usage-stats",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    try:
        yield head, f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard}"
    finally:
        processes = psutil.Process(head.pid).children(recursive=True) if head.poll() is None else []
        head.terminate()  # ray start --block stops the processes it started
        head.wait(timeout=90)
        psutil.wait_procs(processes, timeout=30)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def run_actors(dashboard: str) -> dict[str, tuple[str, str]]:
    """actor id -> (class, state, node id) of this run's actors, from Ray's state API."""
    from ray.util.state import list_actors

    return {
        a.actor_id: (a.class_name, a.state, a.node_id)
        for a in list_actors(address=dashboard, raise_on_missing_output=False)
        if a.class_name in RUN_ACTORS
    }


@pytest.mark.slow
def test_a_run_on_an_existing_cluster_places_its_actors_there_and_leaves_it_running(
    tmp_path, ray_head, record_property
):
    from ray.util.state import list_nodes
    from ray.util.state.exception import RayStateApiException

    head, address, dashboard = ray_head
    deadline = time.monotonic() + 120
    nodes = []
    while not nodes:  # the head is up when its state API lists its node alive
        # not up yet (requests' errors are OSErrors), until the deadline
        with contextlib.suppress(RayStateApiException, OSError):
            nodes = [n for n in list_nodes(address=dashboard) if n.state == "ALIVE"]
        assert time.monotonic() < deadline and head.poll() is None, (
            f"the Ray head did not come up: {(tmp_path / 'ray_head.log').read_text()[-2000:]}"
        )
        time.sleep(1)
    [node] = nodes
    cmd = command(tmp_path, "trainer.engine=verl", "trainer.total_steps=2", "cluster.ray_address=auto")
    t0 = time.monotonic()
    run = start(cmd, RAY_ADDRESS=address)
    placed: dict[str, tuple[str, str, str]] = {}
    while run.poll() is None:
        assert time.monotonic() - t0 < 540, "the run did not end"
        placed.update(run_actors(dashboard))
        time.sleep(1)
    _, err = run.communicate()
    assert run.returncode == 0, err[-3000:]
    # An actor may live between two polls (the tiny run is quick): the state API still lists
    # the dead ones, with the node they ran on.
    placed.update(run_actors(dashboard))
    assert {cls for cls, _, _ in placed.values()} == RUN_ACTORS, placed
    assert {n for _, _, n in placed.values()} == {node.node_id}
    # The run's end: its actors are gone, the cluster is not.
    after = run_actors(dashboard)
    assert all(after[k][1] == "DEAD" for k in placed), after
    assert head.poll() is None
    code = f"import ray; ray.init(address={address!r}); print(ray.cluster_resources()['CPU'])"
    probe = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    assert probe.stdout.strip().splitlines()[-1] == "4.0", probe.stderr[-2000:]
    rows = rows_by_step(tmp_path / "grpo_arith")
    assert {s: rows.get(s) for s in (1, 2)} == {1: BATCH * GROUP, 2: BATCH * GROUP}, rows
    record(
        record_property,
        "an existing Ray cluster (cluster.ray_address: auto, ray start --head by the test)",
        f"ran on it: verl worker and explorer placed on its node; at the end its actors dead, the cluster up "
        f"({time.monotonic() - t0:.0f} s)",
        "-",
        "0 lost, 0 twice",
    )
