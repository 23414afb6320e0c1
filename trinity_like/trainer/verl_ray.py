"""Ray for the ``verl`` engine: starting or joining it, and placing the worker group.

A locally started Ray is a new instance (``ray.init(address="local")``), never a cluster
that ``ray start`` left on this machine; ``ray_address`` joins an existing one after a quick
reachability check. Workers get one placement bundle each (a CPU, and a GPU on GPUs),
packed on one node or spread over as many (``cluster.placement``), checked to fit first so
that a group Ray cannot place is an error rather than a hang.
"""

from __future__ import annotations

import socket
from typing import Any

import ray

from trinity_like import stopping
from trinity_like.errors import TrinityError
from trinity_like.plugins import ray_runtime_env
from trinity_like.trainer.verl_config import PLACEMENTS, VerlParams


def check_reachable(address: str, timeout_s: float = 5.0) -> None:
    """Fail fast on an unreachable ``host:port`` (``ray.init`` would retry GCS for minutes)."""
    if address == "auto":
        return  # Ray finds the local cluster itself and fails at once when there is none
    hostport = address.removeprefix("ray://").rsplit("/", 1)[0]
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        raise TrinityError(f"Ray address {address!r} is not of the form host:port or ray://host:port")
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as exc:
        raise TrinityError(f"cannot reach the Ray cluster at {address!r}: {exc}") from exc


def start_ray(params: VerlParams) -> bool:
    """Connect to ``ray_address`` or start Ray here; True when this call started it."""
    if ray.is_initialized():
        return False
    if params.ray_address is not None:
        check_reachable(params.ray_address)
    env = ray_runtime_env()
    for attempt in range(3):
        try:
            if params.ray_address is None:
                ray.init(
                    address="local",
                    num_cpus=params.num_cpus,
                    include_dashboard=False,
                    runtime_env=env,
                    log_to_driver=False,
                )
            else:
                ray.init(address=params.ray_address, runtime_env=env, log_to_driver=False)
            stopping.reinstall()  # ray.init took SIGTERM for a bare sys.exit: a run keeps its own
            return True
        except ConnectionError as exc:
            raise TrinityError(f"cannot reach the Ray cluster at {params.ray_address!r}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 -- only Ray's own start-up timeout is retried
            # Ray gives a starting raylet a fixed 30 s to register; on a loaded laptop it can
            # take longer. That one failure is retried; anything else propagates as it is.
            if "timed out during startup" not in str(exc) or attempt == 2 or params.ray_address is not None:
                raise
            ray.shutdown()
    return True


def check_free_resources(workers: int, resource: str, placement: str = "pack") -> None:
    """Each worker's placement bundle takes one CPU (or GPU); Ray would wait forever for a
    placement group it cannot place, so one that does not fit now is an error instead of a
    hang: ``pack`` needs one node with a free unit per worker, ``spread`` ``workers`` nodes
    with one free unit each."""
    free = ray.available_resources().get(resource, 0.0)
    if free < workers:
        raise TrinityError(
            f"Ray has {free:g} free {resource} for {workers} verl workers (one each; actor, reference and "
            f"critic groups add up): start Ray with more logical CPUs (num_cpus) or use fewer workers"
        )
    # Ray has no public per-node view of free resources; its own `ray status` reads this one
    from ray._private.state import available_resources_per_node

    per_node = sorted((float(r.get(resource, 0.0)) for r in available_resources_per_node().values()), reverse=True)
    if placement == "pack" and per_node[0] < workers:
        raise TrinityError(
            f"cluster.placement: pack puts all {workers} verl workers on one node, but the most free {resource} "
            f"on one node is {per_node[0]:g} (free per node: {', '.join(f'{n:g}' for n in per_node)}): "
            f"set cluster.placement: spread to put them on several nodes, or use fewer workers"
        )
    if placement == "spread" and sum(n >= 1 for n in per_node) < workers:
        raise TrinityError(
            f"cluster.placement: spread puts each of the {workers} verl workers on a node of its own, but "
            f"{sum(n >= 1 for n in per_node)} of the cluster's {len(per_node)} nodes have a free {resource}: "
            f"add nodes, set cluster.placement: pack, or use fewer workers"
        )


def placement_group_for(workers: int, use_gpu: bool, placement: str) -> Any:
    """One placement group of ``workers`` bundles (a CPU each, and a GPU each on GPUs), packed on
    one node or spread over as many nodes: what verl's ``RayResourcePool`` would build for
    ``process_on_nodes=[workers]``, with the strategy it cannot be told."""
    from ray.util.placement_group import placement_group

    bundle = {"CPU": 1.0, **({"GPU": 1.0} if use_gpu else {})}
    pg = placement_group([dict(bundle) for _ in range(workers)], strategy=PLACEMENTS[placement])
    if not pg.wait(timeout_seconds=120):  # checked to fit before; a cluster that changed meanwhile
        ray.util.remove_placement_group(pg)
        raise TrinityError(f"Ray could not place {workers} verl workers ({PLACEMENTS[placement]}) within 120 s")
    return pg
