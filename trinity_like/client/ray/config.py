"""Where the client's Ray actors go: one learner and N samplers, each in a placement-group bundle.

    RayClientConfig()                                          # Ray started here; 1 learner + 1 sampler, 1 CPU each
    RayClientConfig.from_dict({"learner": {"CPU": 1}, "samplers": {"count": 2, "CPU": 1}, "strategy": "STRICT_PACK"})
    RayClientConfig(address="auto")                            # an existing cluster (``ray start --head``)

The bundles are reserved together as one placement group (``PACK`` by default: on as few
nodes as fit; ``STRICT_PACK``: all on one node). A bundle with ``GPU`` > 0 gives its actor
that GPU (Ray sets ``CUDA_VISIBLE_DEVICES``): the sampler then runs its model on ``cuda``.
On a CPU machine every bundle is CPUs only; an actor runs torch with ``max(1, int(CPU))``
threads.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from trinity_like.errors import ConfigError

STRATEGIES = ("PACK", "STRICT_PACK", "SPREAD", "STRICT_SPREAD")


@dataclass(frozen=True)
class Bundle:
    """The resources one actor reserves."""

    CPU: float = 1.0  # logical CPUs; the actor's torch threads are max(1, int(CPU))
    GPU: float = 0.0  # GPUs; > 0 pins the actor to its own device(s)

    def __post_init__(self) -> None:
        if not (self.CPU >= 0 and self.GPU >= 0) or self.CPU + self.GPU <= 0:
            raise ConfigError(f"a bundle needs CPU >= 0, GPU >= 0 and some of either, got {self}")

    @property
    def threads(self) -> int:
        return max(1, int(self.CPU))

    def resources(self) -> dict[str, float]:
        """As a Ray placement-group bundle (zero entries left out: Ray rejects them)."""
        return {k: v for k, v in (("CPU", self.CPU), ("GPU", self.GPU)) if v > 0}


@dataclass(frozen=True)
class RayClientConfig:
    """The Ray runtime of ``ServiceClient(backend="ray")``; unknown keys and bad values are ConfigErrors."""

    address: str | None = None  # an existing cluster ("auto", "host:port"); None starts Ray in this process
    num_cpus: int | None = None  # logical CPUs of a Ray started here; None: the machine's, or the bundles' if more
    learner: Bundle = Bundle()  # the learner actor's bundle
    samplers: tuple[Bundle, ...] = (Bundle(),)  # one bundle per sampler actor
    strategy: str = "PACK"  # placement-group strategy: PACK, STRICT_PACK (one node), SPREAD, STRICT_SPREAD
    max_in_flight: int = 2  # sampling requests handed to one sampler at a time; the rest wait in the controller
    max_restarts: int = 3  # times Ray restarts a killed sampler (its requests are retried); the learner: never
    placement_timeout_s: float = 120.0  # how long to wait for the bundles before a one-line error
    sampler_delay_s: float = 0.0  # TEST ONLY: each sampling request sleeps this long first (a slow sampler)
    learner_delay_s: float = 0.0  # TEST ONLY: each forward_backward sleeps this long first (a slow learner)

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"ray.strategy {self.strategy!r} unknown; expected one of {', '.join(STRATEGIES)}")
        if not self.samplers:
            raise ConfigError("ray.samplers must hold at least one bundle")
        if self.max_in_flight < 1:
            raise ConfigError(f"ray.max_in_flight must be >= 1, got {self.max_in_flight}")
        if self.max_restarts < 0:
            raise ConfigError(f"ray.max_restarts must be >= 0, got {self.max_restarts}")
        for name in ("placement_timeout_s", "sampler_delay_s", "learner_delay_s"):
            if getattr(self, name) < 0:
                raise ConfigError(f"ray.{name} must be >= 0, got {getattr(self, name)}")
        if self.num_cpus is not None and self.address is not None:
            raise ConfigError("ray.num_cpus sizes a Ray started here; an existing cluster (ray.address) has its own")

    def cpus(self) -> float:
        """CPUs of every bundle together."""
        return self.learner.CPU + sum(s.CPU for s in self.samplers)

    def gpus(self) -> float:
        """GPUs of every bundle together."""
        return self.learner.GPU + sum(s.GPU for s in self.samplers)

    def bundles(self) -> list[dict[str, float]]:
        """The placement group: the learner's bundle first (index 0), then one per sampler."""
        return [self.learner.resources(), *(s.resources() for s in self.samplers)]

    @classmethod
    def from_dict(cls, values: Mapping[str, Any]) -> RayClientConfig:
        """From plain data (a YAML section): ``samplers`` is a list of bundles or ``{count: n, CPU: .., GPU: ..}``."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ConfigError(f"ray.{unknown[0]}: unknown key; expected one of {', '.join(sorted(known))}")
        out = dict(values)
        if "learner" in out:
            out["learner"] = _bundle(out["learner"], "ray.learner")
        if "samplers" in out:
            samplers = out["samplers"]
            if isinstance(samplers, Mapping):
                spec = dict(samplers)
                count = spec.pop("count", 1)
                if not isinstance(count, int) or isinstance(count, bool) or count < 1:
                    raise ConfigError(f"ray.samplers.count must be an integer >= 1, got {count!r}")
                out["samplers"] = (_bundle(spec, "ray.samplers"),) * count
            elif isinstance(samplers, (list, tuple)):
                out["samplers"] = tuple(_bundle(s, f"ray.samplers[{i}]") for i, s in enumerate(samplers))
            else:
                raise ConfigError(f"ray.samplers must be a list of bundles or {{count: n, CPU: ..}}, got {samplers!r}")
        return cls(**out)


def _bundle(values: Any, where: str) -> Bundle:
    if isinstance(values, Bundle):
        return values
    if not isinstance(values, Mapping):
        raise ConfigError(f"{where} must be a mapping like {{CPU: 1, GPU: 0}}, got {values!r}")
    unknown = sorted(set(values) - {"CPU", "GPU"})
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown resource; expected CPU or GPU")
    for key, value in values.items():
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where}.{key} must be a number, got {value!r}")
    return Bundle(**values)
