"""Resolved plans as flat ``key -> value`` tables: what a comparison's recipes differ in, and each run's identity.

A comparison is fair only when the recipes differ in what is being compared. The report
therefore opens with every *resolved* key that differs (:func:`plan_diff`): the recipe's
values after its algorithm's preset filled what it left unset -- what ``trinity-like run
--dry-run`` describes -- plus what the plan derives (the components of each slot with their
params, dynamic sampling, rows per train step, whether a reference model runs). So
``grpo_hard`` against ``mix_hard`` shows dynamic sampling beside the expert term.

The same table, with the run's seed and its folder relative to the comparison's, is a run's
identity (:func:`plan_hash`): a finished run is reused only while its plan hashes the same, also
after the comparison folder was moved or copied.

Seeds (:func:`seed_overrides`): seed ``s`` sets the recipe's ``seed`` (sampling, init) and
the ``seed`` of every training data set (which tasks are drawn, in which order), the same for
every recipe; held-out sets are left as the recipes write them, so that all runs answer the
same held-out problems.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

from trinity_like.config import RunPlan
from trinity_like.errors import ConfigError

# What a comparison sets itself on every run: a recipe or --set giving them would be overruled.
OWNED = ("seed", "run_root", "name")
TRAINING_DATA = ("tasks", "train_data", "expert_data")  # buffer keys whose order the seed decides
HELD_OUT = ("eval_tasks", "eval_data")
# Per-run and per-comparison keys that say nothing about the method: left out of the diff.
NOT_COMPARED = frozenset({"name", "run_root", "seed", "stages"})


def _flatten(value: Any, prefix: str, out: dict[str, Any]) -> None:
    if isinstance(value, dict) and value:
        for k, v in value.items():
            _flatten(v, f"{prefix}.{k}" if prefix else str(k), out)
    else:
        out[prefix] = value


def _params(params: Any) -> Any:
    if params is None:
        return None
    if dataclasses.is_dataclass(params):
        return dataclasses.asdict(params)
    return repr(params)


def flat_plan(plan: RunPlan) -> dict[str, Any]:
    """Every resolved key of every stage, ``"[stage] key"`` for a multi-stage recipe.

    Values are JSON-able (tuples become lists). Keys under ``resolved.`` are derived by the
    plan: ``resolved.<slot>`` (component name), ``resolved.<slot>.<param>`` (its params, the
    algorithm's defaults included), ``resolved.<slot>.coef``, ``resolved.dynamic_sampling``,
    ``resolved.train_batch_size``, ``resolved.reference_model``, ``resolved.critic``."""
    out: dict[str, Any] = {}
    staged = len(plan.stages) > 1
    for stage in plan.stages:
        prefix = f"[{stage.config.name.rsplit('/', 1)[-1]}] " if staged else ""
        table: dict[str, Any] = {}
        _flatten(stage.config.model_dump(mode="json"), "", table)
        for slot, comp in stage.components.items():
            table[f"resolved.{slot}"] = comp.name
            _flatten(_params(comp.params), f"resolved.{slot}", table)
            if comp.coef is not None:
                table[f"resolved.{slot}.coef"] = comp.coef
        table["resolved.dynamic_sampling"] = stage.dynamic_sampling
        table["resolved.train_batch_size"] = stage.train_batch_size
        table["resolved.reference_model"] = stage.needs_reference
        table["resolved.critic"] = stage.algorithm.use_critic
        for key, value in table.items():
            out[prefix + key] = json.loads(json.dumps(value, default=str))
    return out


def _compared(key: str) -> bool:
    """Keys the diff shows: not per-run ones, and not the recipe's raw ``algorithm.<slot>`` mappings or
    ``algorithm.dynamic_sampling``, which ``resolved.*`` states as the run uses them (a slot switched
    off has no ``resolved.<slot>``, whatever coef its raw mapping kept)."""
    from trinity_like.components import SLOTS

    bare = key.split("] ", 1)[-1]
    parts = bare.split(".")
    if parts[0] in NOT_COMPARED:
        return False
    return not (parts[0] == "algorithm" and len(parts) > 1 and (parts[1] in SLOTS or parts[1] == "dynamic_sampling"))


MISSING = "(not set)"


def plan_diff(plans: dict[str, dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """``(key, {label: value})`` for every key whose value is not the same in every plan, sorted by key.

    A key one plan lacks (a slot another switched off, a stage another has not) reads ``MISSING``.
    A section one plan leaves out (``buffer.expert_data: None``, ``generator_args: {}``) is one row,
    the other plans' values under it gathered into a mapping."""
    keys = sorted({k for p in plans.values() for k in p if _compared(k)})
    rows: dict[str, dict[str, Any]] = {}
    for key in keys:
        values = {label: p.get(key, MISSING) for label, p in plans.items()}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) == 1:
            continue
        top = _section(key, plans)
        if top is None:
            rows[key] = values
        elif top not in rows:
            rows[top] = {label: _under(p, top) for label, p in plans.items()}
    return sorted(rows.items())


def _section(key: str, plans: dict[str, dict[str, Any]]) -> str | None:
    """The shortest prefix of ``key`` (itself included) that one plan holds as an empty value (None, ``{}``: a
    section it left out) while another has keys under it; None when there is none."""
    parts = key.split(".")
    for i in range(1, len(parts) + 1):
        prefix = ".".join(parts[:i])
        empty = any(prefix in p and p[prefix] in (None, {}) for p in plans.values())
        if empty and any(k.startswith(prefix + ".") for p in plans.values() for k in p):
            return prefix
    return None


def _under(plan: dict[str, Any], prefix: str) -> Any:
    if prefix in plan and plan[prefix] in (None, {}):
        return plan[prefix]
    sub = {k[len(prefix) + 1 :]: v for k, v in plan.items() if k.startswith(prefix + ".")}
    return sub or MISSING


def held_out_differs(rows: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Keys of the diff that change the held-out sets: accuracies are then not comparable."""
    return [k for k, _ in rows if k.split("] ", 1)[-1].startswith(tuple(f"buffer.{h}" for h in HELD_OUT))]


def plan_hash(identity: dict[str, Any]) -> str:
    """A short stable hash of a run's identity (its flat plan, or a script's command and seed)."""
    text = json.dumps(identity, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def check_not_owned(overrides: list[str]) -> None:
    """``--set`` may not set what the comparison sets on every run."""
    for text in overrides:
        key = text.split("=", 1)[0].strip()
        if "=" not in text:
            raise ConfigError(f"--set {text!r}: expected key.path=value")
        last = key.rsplit(".", 1)[-1]
        top = key.split(".", 1)[0]
        if top in OWNED or (last == "seed" and any(f"buffer.{d}." in f"{key}." for d in TRAINING_DATA)):
            raise ConfigError(
                f"--set {key}: compare sets it on every run (seeds come from --seeds/--first-seed, folders from --out)"
            )


def seed_overrides(plan: RunPlan, seed: int, staged: bool) -> list[str]:
    """The overrides that make a run of ``plan`` seed ``seed``: ``seed``, and the ``seed`` of each
    training data set the plan reads (``stages.<i>.buffer.<key>.seed`` in a multi-stage recipe)."""
    out = [f"seed={seed}"]
    for i, stage in enumerate(plan.stages):
        prefix = f"stages.{i}." if staged else ""
        for key in TRAINING_DATA:
            if getattr(stage.config.buffer, key) is not None:
                out.append(f"{prefix}buffer.{key}.seed={seed}")
    return out
