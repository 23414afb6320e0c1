"""One Ray for a test module (about 5 s to start): started here and shut down after the module.

A ServiceClient(backend="ray") finds it running, so it places its own actors and group in
it and, at close, removes only those (never Ray itself).
"""

from __future__ import annotations

import pytest

CPUS = 8  # logical CPUs: room for two services' bundles at once on the 2-core machine


@pytest.fixture(scope="module")
def ray_here():
    import ray

    if ray.is_initialized():  # a test before, in this worker, failed before it shut its Ray down
        ray.shutdown()
    ray.init(address="local", num_cpus=CPUS, include_dashboard=False, log_to_driver=False)
    try:
        yield ray
    finally:
        ray.shutdown()


@pytest.fixture
def threads_one():
    """torch on 1 thread in this process, as in a 1-CPU actor: the same float reductions."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
