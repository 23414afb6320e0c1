"""The contracts between the core and the components plugins register.

**Functions** (policy losses, advantage fns, KL estimators, entropy losses, reward fns)
declare what they need by their keyword-only parameters. Tensor inputs are named after
the batch fields (``logprob``, ``old_logprob``, ``ref_logprob``, ``advantages``,
``action_mask``, ``values``, ``returns``, ``entropy``, ``is_expert``, ``rewards``,
``group_index``, ...); hyper-parameters come in one keyword ``params`` whose annotation is
a frozen dataclass with one default per field. Example::

    @dataclass(frozen=True)
    class PPOParams:
        clip_ratio_low: float = 0.2    # lower clip of the ratio (PPO eq. 7)
        clip_ratio_high: float = 0.2   # upper clip; 0.28 is DAPO's clip-higher

    @POLICY_LOSS_FN.register_module("ppo")
    def ppo_loss(*, logprob, old_logprob, advantages, action_mask, params: PPOParams):
        \"\"\"PPO clipped surrogate (Schulman et al. 2017).\"\"\"
        ...
        return loss, {"clip_frac": ...}

The trainer reads :func:`required_inputs` to compute only what some component asks for
(no reference forward pass unless a component takes ``ref_logprob``), and builds the
params object from the recipe with :func:`build_params` -- unknown keys and wrong types
are errors, never silently ignored.

**Classes** (workflows, sample strategies, storages, monitors) take the same ``params``
keyword in ``__init__``.

An :class:`AlgorithmType` is a declarative bundle of component names, default params and
flags; it holds no control flow. A resolved recipe stage holds one :class:`ComponentSpec`
per slot: the component's registry and name, its params object and the slot's weight.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

import pydantic

from trinity_like.errors import ConfigError
from trinity_like.registry import REGISTRIES

# Component slots of an algorithm, and the registry each slot's name is looked up in.
SLOTS: dict[str, str] = {
    "policy_loss": "POLICY_LOSS_FN",
    "advantage": "ADVANTAGE_FN",
    "kl_loss": "KL_FN",  # KL as a loss term: coef * KL(pi || ref)
    "kl_penalty": "KL_FN",  # KL as reward shaping, subtracted per token before advantages
    "entropy_loss": "ENTROPY_LOSS_FN",  # coef * the entropy loss (a bonus: minus the entropy)
    "sample_strategy": "SAMPLE_STRATEGY",
    "value_loss": "POLICY_LOSS_FN",  # the critic's loss: a policy-loss-shaped fn of the value model's outputs
    "rollout_correction": "ROLLOUT_CORRECTION",  # sampler-trainer gap -> weights on the advantages, mask on the tokens
}
# Slots whose term is weighted: their `coef` is a key of the slot, never a param of the
# component (the component computes the unweighted term; the core multiplies).
WEIGHTED_SLOTS = ("kl_loss", "kl_penalty", "entropy_loss")
# Slots a recipe may not switch off (`name: none`): every stage that trains needs them.
REQUIRED_SLOTS = ("policy_loss", "sample_strategy")
# The name that switches a slot off, in a recipe or on the command line.
OFF = "none"


def _frozen(mapping: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return MappingProxyType(dict(mapping or {}))


@dataclass(frozen=True)
class AlgorithmType:
    """A declarative algorithm: which components, their default params, which models.

    ``params`` holds per-slot default hyper-parameters (``{"policy_loss": {"clip_ratio_high":
    0.28}}``, a weighted slot's ``{"coef": ...}``); a recipe may change them. ``requires``
    holds config values the algorithm cannot work without (``{"mode": "train"}`` for an
    offline algorithm, or a slot's name ``{"algorithm.policy_loss.name": ...}``); a recipe
    that sets one of them to something else is a validation error, never a silent rewrite.
    Every slot not pinned there can be swapped by a recipe; ``params[slot]`` then stays with
    the algorithm's own component (only a weighted slot's ``coef`` carries over).
    ``defaults`` holds config values filled in only where the recipe left them unset.
    """

    description: str  # one line: what it is and the paper it comes from
    policy_loss: str  # POLICY_LOSS_FN name
    advantage: str | None = None  # ADVANTAGE_FN name; None for offline objectives
    kl_loss: str | None = None  # KL_FN name when KL is a loss term (coef in params)
    kl_penalty: str | None = None  # KL_FN name when KL shapes the reward (coef in params)
    entropy_loss: str | None = None  # ENTROPY_LOSS_FN name, e.g. "entropy"
    sample_strategy: str = "default"  # SAMPLE_STRATEGY name
    value_loss: str | None = None  # POLICY_LOSS_FN name of the critic's loss (use_critic; PPO: "value_clip")
    rollout_correction: str | None = None  # ROLLOUT_CORRECTION name; None: the gap is only measured
    use_rollout: bool = True  # needs the explorer (online RL)
    use_reference: bool = False  # needs a frozen reference model's logprobs
    use_critic: bool = False  # trains a value model (PPO with GAE)
    schema: str = "experience"  # row type it trains on: "experience" | "pair"
    dynamic_sampling: bool = False  # drop groups whose rewards are all equal (DAPO)
    params: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)  # config path -> value
    requires: Mapping[str, Any] = field(default_factory=dict)  # config path -> value

    def __post_init__(self) -> None:
        unknown = set(self.params) - set(SLOTS)
        if unknown:
            raise ValueError(f"AlgorithmType.params has unknown slots {sorted(unknown)}; slots: {list(SLOTS)}")
        object.__setattr__(self, "params", _frozen({k: _frozen(v) for k, v in self.params.items()}))
        object.__setattr__(self, "defaults", _frozen(self.defaults))
        object.__setattr__(self, "requires", _frozen(self.requires))

    def components(self) -> dict[str, str]:
        """Slot -> component name, for the slots this algorithm fills."""
        return {slot: getattr(self, slot) for slot in SLOTS if getattr(self, slot)}


@dataclass(frozen=True)
class ComponentSpec:
    """One slot of a resolved stage: a registered component by name, its params, the slot's weight.

    It holds names only, so it pickles to Ray workers; :attr:`fn` looks the component up
    in the registry of the process that reads it (after that process loaded the plugins)::

        spec = ComponentSpec("KL_FN", "k3", params=None, coef=0.001)
        spec.fn(logprob=lp, ref_logprob=ref)    # the registered k3
    """

    registry: str  # registry name, e.g. "POLICY_LOSS_FN"
    name: str  # registered name
    params: Any = None  # the component's params dataclass instance, or None
    coef: float | None = None  # weight of the term (WEIGHTED_SLOTS); None for the others

    @property
    def fn(self) -> Any:
        """The registered function or class."""
        return REGISTRIES[self.registry].get(self.name)


# -- params objects -----------------------------------------------------------------
def _signature_target(component: Any) -> Callable[..., Any]:
    return component.__init__ if inspect.isclass(component) else component


def params_type(component: Any) -> type | None:
    """The dataclass annotated on ``component``'s ``params`` keyword, or None."""
    target = _signature_target(component)
    try:
        sig = inspect.signature(target)
    except (TypeError, ValueError):
        return None
    if "params" not in sig.parameters:
        return None
    hints = typing.get_type_hints(target)
    ptype = hints.get("params")
    if ptype is None or not dataclasses.is_dataclass(ptype):
        raise TypeError(f"{component!r}: the `params` parameter must be annotated with a dataclass")
    return ptype


def build_params(component: Any, values: Mapping[str, Any] | None, where: str = "params") -> Any:
    """Build ``component``'s params object from ``values``, validating keys and types.

    ``where`` names the config key path in error messages (``algorithm.policy_loss``).
    """
    values = dict(values or {})
    ptype = params_type(component)
    if ptype is None:
        if values:
            raise ConfigError(f"{where}: {_name(component)} takes no parameters, got {sorted(values)}")
        return None
    known = [f.name for f in dataclasses.fields(ptype)]
    for key in values:
        if key not in known:
            import difflib

            close = difflib.get_close_matches(key, known, n=1)
            hint = f"; did you mean {close[0]!r}?" if close else ""
            raise ConfigError(
                f"{where}.{key}: unknown parameter of {_name(component)}{hint} (known: {', '.join(known)})"
            )
    try:
        return pydantic.TypeAdapter(ptype).validate_python(values, strict=False)
    except pydantic.ValidationError as exc:
        err = exc.errors()[0]
        loc = ".".join(str(p) for p in err["loc"])
        raise ConfigError(f"{where}.{loc}: {err['msg']} (got {err.get('input')!r})") from None


def _name(component: Any) -> str:
    return getattr(component, "__name__", repr(component))


def required_inputs(component: Any) -> set[str]:
    """Names of the keyword inputs ``component`` needs (``params`` excluded)."""
    sig = inspect.signature(_signature_target(component))
    names = set()
    for name, p in sig.parameters.items():
        if name in ("self", "params") or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty:
            names.add(name)
    return names


def optional_inputs(component: Any) -> set[str]:
    """Names of keyword inputs ``component`` accepts but can do without."""
    sig = inspect.signature(_signature_target(component))
    return {
        name
        for name, p in sig.parameters.items()
        if name not in ("self", "params")
        and p.default is not p.empty
        and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)
    }


def call_component(component: Callable[..., Any], inputs: Mapping[str, Any], params: Any = None) -> Any:
    """Call ``component`` with the inputs it declares, taken from ``inputs``."""
    needed = required_inputs(component)
    missing = needed - set(inputs)
    if missing:
        raise ConfigError(
            f"{_name(component)} needs {sorted(missing)}, which no component provides (available: {sorted(inputs)})"
        )
    wanted = needed | (optional_inputs(component) & set(inputs))
    kwargs = {k: inputs[k] for k in wanted}
    if params_type(component) is not None:
        kwargs["params"] = params if params is not None else build_params(component, {})
    return component(**kwargs)
