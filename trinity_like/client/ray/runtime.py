"""Ray, one placement group and the sampler pool of a ``ServiceClient(backend="ray")``.

``ServiceClient(backend="ray", ray=RayClientConfig(...))`` builds a :class:`RayRuntime`:
Ray (started here, or an existing cluster), one placement group (learner bundle first,
then one per sampler) and the :class:`~.pool.SamplerPool`. Its training clients
(:mod:`.clients`) each get a :class:`~.actors.LearnerActor` in the learner bundle from
:meth:`RayRuntime.learner`; its sampling clients (:mod:`.sampling`) send their requests to
the pool::

    runtime = RayRuntime(RayClientConfig())   # Ray started here unless config.address names one
    runtime.pool.size()                       # the number of sampler actors
    runtime.close()                           # its actors and group; Ray itself only if it started it
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Mapping
from typing import Any

import ray
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from trinity_like import fault_points
from trinity_like.client.ray.actors import LearnerActor, SamplerActor
from trinity_like.client.ray.config import RayClientConfig
from trinity_like.client.ray.pool import SamplerPool
from trinity_like.errors import TrinityError
from trinity_like.plugins import ray_runtime_env


def _compute(resources: Mapping[str, float]) -> dict[str, float]:
    return {k: resources[k] for k in ("CPU", "GPU") if k in resources}


class RayRuntime:
    """Ray, the placement group and the samplers of one ServiceClient; :meth:`close` undoes
    only what it did (its actors and group; Ray itself only if it started or connected it)."""

    def __init__(self, config: RayClientConfig) -> None:
        from trinity_like.trainer.verl_engine import check_reachable

        self.config = config
        self._own_ray = False
        self._group = None
        self.pool: SamplerPool | None = None
        self._learner_taken = False
        if not ray.is_initialized():
            if config.address is not None:
                check_reachable(config.address)
                ray.init(address=config.address, runtime_env=ray_runtime_env(), log_to_driver=False)
            else:  # logical CPUs: by default enough for every bundle, even beyond the machine's cores
                cpus = config.num_cpus if config.num_cpus is not None else max(os.cpu_count() or 1, config.cpus())
                ray.init(
                    address="local",
                    num_cpus=cpus,
                    include_dashboard=False,
                    runtime_env=ray_runtime_env(),
                    log_to_driver=False,
                )
            self._own_ray = True
        try:
            self._place()
            self.pool = SamplerPool(
                [self._sampler(i) for i in range(len(config.samplers))],
                max_in_flight=config.max_in_flight,
                max_retries=config.max_restarts + 1,
            )
        except BaseException:
            self.close()
            raise

    @property
    def placement_group(self) -> Any:
        """The Ray placement group holding this runtime's bundles (None once closed)."""
        return self._group

    def _place(self) -> None:
        c = self.config
        total = ray.cluster_resources()
        short = {k: v for k, v in (("CPU", c.cpus()), ("GPU", c.gpus())) if v > total.get(k, 0)}
        if short and self._own_ray:  # a Ray of ours will never grow: say so now instead of waiting
            raise TrinityError(
                f"the client's bundles need {short} but the Ray started here has "
                f"{ {k: total.get(k, 0) for k in short} } (set ray.num_cpus, or fewer bundles)"
            )
        self._group = placement_group(
            c.bundles(), strategy=c.strategy, name=f"trinity-like-client-{uuid.uuid4().hex[:8]}"
        )
        ready, _ = ray.wait([self._group.ready()], timeout=c.placement_timeout_s)
        if not ready:
            raise TrinityError(
                f"Ray could not place the client's bundles {c.bundles()} ({c.strategy}) within "
                f"{c.placement_timeout_s:.0f} s; the cluster has {_compute(ray.available_resources())} free"
            )

    def _at(self, index: int, bundle: Any) -> dict[str, Any]:
        """Actor options: the bundle's resources, in bundle ``index`` of the group."""
        return {
            "num_cpus": bundle.CPU,
            "num_gpus": bundle.GPU,
            "runtime_env": ray_runtime_env({"env_vars": fault_points.env()}),  # a fault test's, when armed
            "scheduling_strategy": PlacementGroupSchedulingStrategy(self._group, placement_group_bundle_index=index),
        }

    def _sampler(self, i: int) -> Any:
        bundle = self.config.samplers[i]
        cls = ray.remote(SamplerActor).options(
            max_restarts=self.config.max_restarts,
            max_task_retries=0,
            max_concurrency=self.config.max_in_flight,
            **self._at(1 + i, bundle),
        )
        return cls.remote(bundle.threads, self.config.sampler_delay_s)

    def learner(self, service_cls: type, service: dict[str, Any], create: str, args: dict[str, Any]) -> Any:
        """A new LearnerActor in the learner bundle (one live learner per ServiceClient):
        ``service_cls(**service).<create>(**args)`` is its in-process training client."""
        if self._learner_taken:
            raise TrinityError(
                "this ServiceClient(backend='ray') has one learner bundle and its training client is "
                "still open: close() it first, or use another ServiceClient"
            )
        bundle = self.config.learner
        cls = ray.remote(LearnerActor).options(max_restarts=0, max_task_retries=0, **self._at(0, bundle))
        self._learner_taken = True
        return cls.remote(service_cls, service, create, args, bundle.threads, self.config.learner_delay_s)

    def learner_released(self) -> None:
        self._learner_taken = False

    def close(self) -> None:
        if self.pool is not None:
            self.pool.close()
            self.pool = None
        if self._group is not None and ray.is_initialized():
            remove_placement_group(self._group)
            self._group = None
        if self._own_ray and ray.is_initialized():
            ray.shutdown()
            self._own_ray = False
