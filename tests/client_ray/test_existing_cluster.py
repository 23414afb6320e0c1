"""``ServiceClient(backend="ray", ray={"address": "auto"})`` on a Ray cluster started separately.

The test starts a Ray head on loopback (``ray start --head --block``, its own ports, temp
folder and 4 logical CPUs) and points the client at it through ``RAY_ADDRESS`` and
``address: auto``. The client trains and samples there; at close it removes its actors and
placement group and disconnects, and the cluster stays up with all its CPUs free again
(a new driver sees them). The test stops the head it started -- never ``ray stop``.

This module must not share a Ray with the others: a process holds one Ray connection.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time

import psutil
import pytest

import trinity_like.client as tinker

types = tinker.types


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def probe(address: str) -> str:
    """Free CPUs of the cluster, as a new driver sees them (empty while it is not up)."""
    code = (
        f"import ray; ray.init(address={address!r}, log_to_driver=False); print(ray.available_resources().get('CPU'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    return out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else ""


@pytest.fixture
def ray_head(tmp_path):
    import ray

    assert not ray.is_initialized()
    port = free_port()
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
            "--include-dashboard=false",
            f"--temp-dir={temp}",
            "--disable-usage-stats",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, "RAY_AUTH_MODE": "disabled"},
    )
    address = f"127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while probe(address) != "4.0":
            assert time.monotonic() < deadline and head.poll() is None, (
                f"the Ray head did not come up: {(tmp_path / 'ray_head.log').read_text()[-2000:]}"
            )
            time.sleep(1)
        yield head, address
    finally:
        processes = psutil.Process(head.pid).children(recursive=True) if head.poll() is None else []
        head.terminate()  # ray start --block stops the processes it started
        head.wait(timeout=90)
        psutil.wait_procs(processes, timeout=30)
        log.close()
        shutil.rmtree(temp, ignore_errors=True)


def test_the_client_runs_on_an_existing_cluster_and_leaves_it_running(ray_head, tmp_path, monkeypatch):
    import ray

    head, address = ray_head
    monkeypatch.setenv("RAY_ADDRESS", address)
    config = {"address": "auto", "samplers": {"count": 2, "CPU": 1}}
    with tinker.ServiceClient(backend="ray", ray=config, log_dir=tmp_path) as service:
        # That cluster (Ray names its GCS by the machine's address: compare the port), not a new one.
        assert ray.get_runtime_context().gcs_address.rsplit(":", 1)[1] == address.rsplit(":", 1)[1]
        assert ray.cluster_resources()["CPU"] == 4
        assert ray.available_resources().get("CPU", 0) == 1  # 3 of its 4 CPUs are our bundles
        training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
        ids = training.get_tokenizer().encode("one two three")
        training.forward_backward(
            [
                types.Datum(
                    model_input=types.ModelInput.from_ints(ids[:-1]),
                    loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
                )
            ],
            "cross_entropy",
        )
        assert training.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=60).metrics["grad_norm"] > 0
        sampler = training.save_weights_and_get_sampling_client()
        out = sampler.sample(types.ModelInput.from_ints(ids), 2, types.SamplingParams(max_tokens=3, seed=0, stop=[]))
        assert [len(s.tokens) for s in out.result(timeout=60).sequences] == [3, 3]
    assert not ray.is_initialized()  # it disconnected from what it connected to...
    assert head.poll() is None and probe(address) == "4.0"  # ...and the cluster is up, all its CPUs free


def test_a_ray_started_here_too_small_for_the_bundles_is_one_line_and_is_shut_down(tmp_path):
    import ray

    from trinity_like.errors import TrinityError

    assert not ray.is_initialized()
    with pytest.raises(
        TrinityError,
        match=r"^the client's bundles need \{'CPU': 2\.0\} but the Ray started here "
        r"has \{'CPU': 1\.0\} \(set ray.num_cpus, or fewer bundles\)$",
    ):
        tinker.ServiceClient(backend="ray", ray={"num_cpus": 1}, log_dir=tmp_path)
    assert not ray.is_initialized()  # the Ray it started for nothing is gone again
