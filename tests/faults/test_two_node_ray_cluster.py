"""A two-node Ray cluster on this one machine: the verl trainer with one worker per node.

The test starts a Ray head and a worker node itself (``ray start --block``, one logical CPU
each, on 127.0.0.1, its own ports and temporary folder), then runs the default recipe on
it with the verl engine, ``cluster.trainer_workers: 2`` and ``cluster.placement: spread``.
Ray's state API, read after the run (it keeps dead actors with their node), shows one verl
worker on each node and the explorer on one of them. The two FSDP ranks meet over gloo on
this host's address as they would across machines. Before that, ``placement: pack`` on the
same cluster (no node has two free CPUs) is one line when the trainer starts instead of a
placement group that Ray would wait on for ever (the run directory is opened by then: Ray
starts after it). Both nodes are stopped by the processes the test started,
never ``ray stop``.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import psutil
import pytest
from _lib.faultlib import BATCH, GROUP, command, record, rows_by_step, run, start

RUN_ACTORS = {"TrinityVerlWorker", "ExplorerWorker"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ray_start(args: list[str], log: Path) -> subprocess.Popen:
    """``ray start --block`` with ``args``: the node runs until this process is terminated."""
    with log.open("w") as out:  # the child keeps its own handle
        return subprocess.Popen(
            ["ray", "start", "--block", "--node-ip-address=127.0.0.1", "--num-cpus=1", "--disable-usage-stats", *args],
            stdout=out,
            stderr=subprocess.STDOUT,
            env={**os.environ, "RAY_AUTH_MODE": "disabled"},
        )


def stop(node: subprocess.Popen) -> None:
    """Terminate a ``ray start --block`` (it stops the processes it started) and wait for them."""
    processes = psutil.Process(node.pid).children(recursive=True) if node.poll() is None else []
    node.terminate()
    node.wait(timeout=90)
    psutil.wait_procs(processes, timeout=30)


@pytest.fixture
def two_nodes(tmp_path):
    """A head and a worker node: yields (GCS address, dashboard address, the nodes' processes)."""
    port, dashboard = free_port(), free_port()
    temp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths live under it (107-byte limit)
    nodes = [
        ray_start(
            [
                "--head",
                f"--port={port}",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dashboard}",
                f"--temp-dir={temp}",
            ],
            tmp_path / "ray_head.log",
        )
    ]
    try:
        wait_alive(f"http://127.0.0.1:{dashboard}", 1, nodes, tmp_path)
        # a second raylet on this host: its agent needs a port of its own (the default is the head's)
        nodes.append(
            ray_start(
                [f"--address=127.0.0.1:{port}", f"--temp-dir={temp}", f"--dashboard-agent-listen-port={free_port()}"],
                tmp_path / "ray_worker.log",
            )
        )
        wait_alive(f"http://127.0.0.1:{dashboard}", 2, nodes, tmp_path)
        yield f"127.0.0.1:{port}", f"http://127.0.0.1:{dashboard}", nodes
    finally:
        for node in reversed(nodes):
            stop(node)
        shutil.rmtree(temp, ignore_errors=True)


def wait_alive(dashboard: str, count: int, nodes: list[subprocess.Popen], tmp_path: Path) -> None:
    """Until Ray's state API lists ``count`` nodes alive."""
    from ray.util.state import list_nodes
    from ray.util.state.exception import RayStateApiException

    deadline = time.monotonic() + 120
    while True:
        try:
            if sum(n.state == "ALIVE" for n in list_nodes(address=dashboard)) >= count:
                return
        except (RayStateApiException, OSError):  # not up yet (requests' errors are OSErrors), until the deadline
            pass
        logs = "".join(p.read_text()[-1500:] for p in sorted(tmp_path.glob("ray_*.log")))
        assert time.monotonic() < deadline and all(n.poll() is None for n in nodes), f"Ray did not come up: {logs}"
        time.sleep(1)


@pytest.mark.slow
def test_the_verl_trainer_spreads_one_worker_per_node(tmp_path, two_nodes, record_property):
    from ray.util.state import list_actors, list_nodes

    address, dashboard, nodes = two_nodes
    base = ["trainer.engine=verl", "trainer.total_steps=2", "cluster.ray_address=auto", "cluster.trainer_workers=2"]
    t0 = time.monotonic()
    out = run(command(tmp_path / "packed", *base, "cluster.placement=pack"), RAY_ADDRESS=address)
    packed = out.stderr.strip().splitlines()[-1]  # after Ray's own lines on connecting
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr[-3000:]
    assert packed == (
        "trinity-like: error: cluster.placement: pack puts all 2 verl workers on one node, but the "
        "most free CPU on one node is 1 (free per node: 1, 1): set cluster.placement: spread to put "
        "them on several nodes, or use fewer workers"
    ), packed
    refused_s = time.monotonic() - t0

    t0 = time.monotonic()
    proc = start(command(tmp_path, *base, "cluster.placement=spread"), RAY_ADDRESS=address)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    seconds = time.monotonic() - t0
    node_ids = {n.node_id for n in list_nodes(address=dashboard)}
    assert len(node_ids) == 2
    # the state API keeps dead actors with the node they ran on (the run has ended); the refused
    # run had started an explorer too, so the run's actors are those of its verl workers' job
    actors = [
        (a.class_name, a.node_id, a.state, a.job_id)
        for a in list_actors(address=dashboard, raise_on_missing_output=False)
        if a.class_name in RUN_ACTORS
    ]
    [job] = {job for cls, _, _, job in actors if cls == "TrinityVerlWorker"}
    actors = [(cls, node, state) for cls, node, state, j in actors if j == job]
    workers = [node for cls, node, _ in actors if cls == "TrinityVerlWorker"]
    explorers = [node for cls, node, _ in actors if cls == "ExplorerWorker"]
    assert sorted(workers) == sorted(node_ids), actors  # one verl worker on each node
    assert len(explorers) == 1 and explorers[0] in node_ids, actors
    assert all(state == "DEAD" for _, _, state in actors), actors  # the run's end took its actors down
    assert all(n.poll() is None for n in nodes)  # and left the cluster up
    rows = rows_by_step(tmp_path / "grpo_arith")
    assert {s: rows.get(s) for s in (1, 2)} == {1: BATCH * GROUP, 2: BATCH * GROUP}, rows
    record(
        record_property,
        "a two-node Ray cluster on one machine (head + worker node, 1 CPU each; "
        "cluster.trainer_workers: 2, placement: spread)",
        f"ran: one verl worker on each node (Ray's state API), the explorer on one; gloo across the nodes "
        f"({seconds:.0f} s); placement: pack refused at start in {refused_s:.0f} s instead of waiting for ever",
        "-",
        "0 lost, 0 twice",
    )


def test_spread_on_a_one_node_cluster_is_a_clear_error_not_a_hang():
    import ray

    from trinity_like.errors import TrinityError
    from trinity_like.trainer.verl_engine import check_free_resources

    assert not ray.is_initialized()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        check_free_resources(2, "CPU", "pack")  # two free CPUs on the one node: fits
        with pytest.raises(TrinityError) as info:
            check_free_resources(2, "CPU", "spread")
        assert str(info.value) == (
            "cluster.placement: spread puts each of the 2 verl workers on a node of its own, "
            "but 1 of the cluster's 1 nodes have a free CPU: add nodes, set cluster.placement: "
            "pack, or use fewer workers"
        )
    finally:
        ray.shutdown()
