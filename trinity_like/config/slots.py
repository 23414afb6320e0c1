"""An algorithm's slots resolved: each slot's component looked up in its registry, its params
object built, and every batch field it asks for checked against what the algorithm provides.

Step 5 of :mod:`.resolve`. A slot named ``none`` is off; a weighted slot's ``coef`` is read
here, the one place. The input check is what makes a swapped slot safe: a component that
asks for ``ref_logprob`` in an algorithm without a reference model is an error naming the
slot's line, not a crash at the first step. Every error names the recipe's file and line
(:class:`~trinity_like.config.loader.Locator`).
"""

from __future__ import annotations

from typing import Any

from trinity_like.components import (
    OFF,
    REQUIRED_SLOTS,
    SLOTS,
    WEIGHTED_SLOTS,
    AlgorithmType,
    ComponentSpec,
    build_params,
    optional_inputs,
    required_inputs,
)
from trinity_like.config.loader import KeyPath, Locator
from trinity_like.config.schema import Config
from trinity_like.errors import ConfigError
from trinity_like.registry import REGISTRIES, UnknownNameError


def resolve_name(registry: Any, name: str, loc: Locator, path: KeyPath) -> Any:
    try:
        return registry.get(name)
    except UnknownNameError as exc:
        raise loc.error(path, str(exc)) from None


def params_of(component: Any, values: Any, where: str, loc: Locator) -> Any:
    """``component``'s params object from ``values``; errors name the file and line of ``where``."""
    try:
        return build_params(component, values, where=where)
    except ConfigError as exc:
        raise loc.reraise(exc) from None


def resolve_components(cfg: Config, algo: AlgorithmType, loc: Locator) -> dict[str, ComponentSpec]:
    """One :class:`ComponentSpec` per slot that is on; ``coef`` of a weighted slot taken here, the one place."""
    out: dict[str, ComponentSpec] = {}
    for slot, reg_name in SLOTS.items():
        spec = dict(getattr(cfg.algorithm, slot))
        if not spec:
            continue
        if "name" not in spec:
            raise loc.error(
                ("algorithm", slot), f"set `name` (algorithm {cfg.algorithm.type!r} does not fill this slot)"
            )
        name = spec.pop("name")
        if not isinstance(name, str):
            raise loc.error(
                ("algorithm", slot, "name"),
                f"must be a registered name, or {OFF!r} to switch the slot off (got {name!r})",
            )
        if name == OFF:  # off: the slot's other keys have nothing to configure
            if slot in REQUIRED_SLOTS or (slot == "value_loss" and algo.use_critic):
                raise loc.error(
                    ("algorithm", slot, "name"), f"cannot be {OFF!r}: algorithm {cfg.algorithm.type!r} needs a {slot}"
                )
            continue
        fn = resolve_name(REGISTRIES[reg_name], name, loc, ("algorithm", slot, "name"))
        coef = None
        if slot in WEIGHTED_SLOTS:
            coef = spec.pop("coef", None)
            if coef is None:
                raise loc.error(
                    ("algorithm", slot, "coef"),
                    f"set the weight of the {name!r} {slot} (or name: {OFF} to switch it off)",
                    at=("algorithm", slot, "name"),
                )
            if isinstance(coef, bool) or not isinstance(coef, (int, float)) or coef < 0:
                raise loc.error(("algorithm", slot, "coef"), f"must be a number >= 0 (got {coef!r})")
            coef = float(coef)
        if slot == "value_loss" and not algo.use_critic:
            raise loc.error(
                ("algorithm", slot, "name"),
                f"algorithm {cfg.algorithm.type!r} trains no critic: nothing would use a value loss",
            )
        params = params_of(fn, spec, f"algorithm.{slot}", loc)
        out[slot] = ComponentSpec(reg_name, name, params, coef)
    return out


# Where a batch field comes from, for the error of a component that asks for a missing one.
_SOURCE_OF = {
    "ref_logprob": "a reference model (an algorithm type with use_reference, or a KL slot)",
    "values": "a critic (an algorithm type with use_critic)",
    "old_values": "a critic (an algorithm type with use_critic)",
    "advantages": "an advantage slot",
    "returns": "an advantage slot or a critic",
    "scores": "a reward-model head (schema: pair)",
}


def _provided_inputs(algo: AlgorithmType, comps: dict[str, ComponentSpec]) -> set[str]:
    """Batch fields the pipeline can provide for this algorithm."""
    fields = {"logprob", "entropy", "action_mask", "num_tokens", "num_seqs"}
    if algo.schema == "pair":
        fields |= {"scores"}
    else:
        fields |= {"old_logprob", "rollout_logprob", "rewards", "group_index", "is_expert", "token_level_rewards"}
    if "advantage" in comps:
        fields |= {"advantages", "returns"}
    if algo.use_reference or "kl_loss" in comps or "kl_penalty" in comps:
        fields |= {"ref_logprob"}
    if algo.use_critic:
        fields |= {"values", "old_values", "returns"}
    return fields


def check_inputs(algo: AlgorithmType, comps: dict[str, ComponentSpec], loc: Locator, algo_name: str) -> frozenset[str]:
    """Every input a component asks for is provided: what makes a swapped slot safe."""
    provided = _provided_inputs(algo, comps)
    own = algo.components()
    needs: set[str] = set()
    for slot, comp in comps.items():
        if slot in ("sample_strategy", "value_loss"):  # a class / the critic's loss: fed by their own stages
            continue
        req = required_inputs(comp.fn)
        if SLOTS[slot] == "KL_FN":  # a KL estimator's logprob and ref_logprob are the core's to provide
            req -= {"logprob", "ref_logprob"}
        missing = req - provided
        if missing:
            how = "" if own.get(slot) == comp.name else f"swapped in for {own[slot]!r}" if slot in own else "added"
            sources = "; ".join(f"{m} comes from {_SOURCE_OF[m]}" for m in sorted(missing) if m in _SOURCE_OF)
            raise loc.error(
                ("algorithm", slot, "name"),
                f"{comp.name!r} needs {sorted(missing)}, which algorithm {algo_name!r} does not provide"
                + (f" ({how})" if how else "")
                + (f": {sources}" if sources else "")
                + f"; it provides {', '.join(sorted(provided))}",
            )
        needs |= req
    if "kl_loss" in comps or "kl_penalty" in comps:
        needs |= {"ref_logprob"}
    return frozenset(needs)


def check_expert_data(cfg: Config, comps: dict[str, ComponentSpec], loc: Locator) -> None:
    """Expert rows come with a sample strategy that declares ``uses_expert_data`` (MIX), and
    then the policy loss must tell them from sampled rows (it takes ``is_expert``)."""
    strategy = comps["sample_strategy"]
    mixes = bool(getattr(strategy.fn, "uses_expert_data", False))
    if mixes and cfg.buffer.expert_data is None:
        raise loc.error(
            ("buffer", "expert_data"),
            f"the sample strategy {strategy.name!r} mixes expert rows into each batch: set buffer.expert_data",
        )
    if not mixes and cfg.buffer.expert_data is not None:
        raise loc.error(
            ("buffer", "expert_data"),
            f"the sample strategy {strategy.name!r} uses no expert data; "
            "pick one that does (e.g. algorithm.type: mix) or remove buffer.expert_data",
        )
    loss = comps["policy_loss"]
    if mixes and "is_expert" not in required_inputs(loss.fn) | optional_inputs(loss.fn):
        raise loc.error(
            ("algorithm", "policy_loss", "name"),
            f"{loss.name!r} cannot tell the expert rows that "
            f"the sample strategy {strategy.name!r} mixes in from sampled ones (it takes no is_expert)",
        )


def check_rollout_correction(comps: dict[str, ComponentSpec], loc: Locator) -> None:
    """A rollout correction weights the policy loss's advantages and masks its tokens: the loss must
    take both, and must not correct the same gap itself (a loss that reads ``rollout_logprob``,
    as ``ppo_tis`` does, would apply two corrections)."""
    corr = comps.get("rollout_correction")
    if corr is None:
        return
    loss = comps["policy_loss"]
    takes = required_inputs(loss.fn) | optional_inputs(loss.fn)
    if not {"advantages", "action_mask"} <= takes:
        raise loc.error(
            ("algorithm", "rollout_correction", "name"),
            f"the rollout correction {corr.name!r} weights the advantages and masks the tokens of the policy loss, "
            f"but {loss.name!r} takes no {'advantages' if 'advantages' not in takes else 'action_mask'}",
        )
    if "rollout_logprob" in takes:
        raise loc.error(
            ("algorithm", "rollout_correction", "name"),
            f"the policy loss {loss.name!r} already corrects with the sampler's logprobs (it takes rollout_logprob): "
            f"use one correction (for {loss.name!r} + {corr.name!r}, pick a loss without its own, e.g. ppo)",
        )
