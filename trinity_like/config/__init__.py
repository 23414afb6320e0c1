"""Recipes: typed schema, YAML/TOML loading with line numbers, overrides, presets."""

from __future__ import annotations

from trinity_like.components import OFF, ComponentSpec
from trinity_like.config.data_checks import describe_data
from trinity_like.config.resolve import ResolvedComponent, ResolvedStage, RunPlan, load_plan
from trinity_like.config.schema import Config
from trinity_like.models.device import describe as describe_precision
from trinity_like.models.device import resolve_device
from trinity_like.registry import WORKFLOW

__all__ = ["ComponentSpec", "Config", "ResolvedComponent", "ResolvedStage", "RunPlan", "describe_plan", "load_plan"]


def _params_text(params: object) -> str:
    import dataclasses

    if params is None:
        return ""
    if dataclasses.is_dataclass(params):
        items = dataclasses.asdict(params)
        return "(" + ", ".join(f"{k}={v!r}" for k, v in items.items()) + ")"
    return f"({params!r})"


def _slot_lines(st: ResolvedStage) -> list[str]:
    """One line per slot; a slot the recipe swapped or switched off says what the algorithm uses."""
    algo_name, own, swapped = st.config.algorithm.type, st.algorithm.components(), st.swapped
    lines = []
    for slot, comp in st.components.items():
        coef = f" coef={comp.coef}" if comp.coef is not None else ""
        note = ""
        if slot in swapped:
            note = f" (swapped; algorithm {algo_name} uses {swapped[slot]})"
        elif slot not in own:
            note = f" (added; algorithm {algo_name} has no {slot})"
        lines.append(f"    {slot}: {comp.name}{coef}{note} {_params_text(comp.params)}".rstrip())
    for slot in own:
        if slot not in st.components:
            lines.append(f"    {slot}: {OFF} (switched off; algorithm {algo_name} uses {own[slot]})")
    return lines


def _engine_text(c: Config) -> str:
    """The train engine the run will really use, and where its workers run (its declared traits)."""
    from trinity_like.trainer.engines import train_engine_traits

    name, traits = c.trainer.engine, train_engine_traits(c.trainer.engine)
    if not traits.ray_workers:
        return f"{name} ({traits.plan_text or 'in this process'})"
    where = f"{c.cluster.num_gpus} GPU(s)" if c.cluster.num_gpus else "CPU over gloo"
    ray = c.cluster.ray_address or "a Ray started here"
    return f"{name} ({c.cluster.workers} {traits.plan_text or 'worker(s)'} on {where}, through {ray})"


def _eval_text(c: Config) -> str:
    """When the held-out sets are evaluated (``monitor.eval_interval``: None, 0 or N)."""
    b, m = c.buffer, c.monitor
    if b.eval_tasks is None and b.eval_data is None:
        return "none (no buffer.eval_tasks / eval_data)"
    if m.eval_interval == 0:
        return "never (monitor.eval_interval: 0; leave it unset to evaluate at the start and the end)"
    parts = ["at the start"] * m.eval_at_start + [f"every {m.eval_interval} steps"] * bool(m.eval_interval)
    return ", ".join(parts) + " and at the end" if parts else "at the end"


def describe_plan(plan: RunPlan) -> str:
    """A human-readable summary of what a run would do."""
    lines = [f"recipe: {plan.source}", f"plugins loaded: {', '.join(plan.plugins) or '(none)'}"]
    for i, st in enumerate(plan.stages, 1):
        c, a = st.config, st.algorithm
        lines.append(f"stage {i}/{len(plan.stages)}: {c.name}  mode={c.mode}  seed={c.seed}  run_dir={c.run_dir()}")
        lines.append(
            f"  model: {c.model.path} ({c.model.dtype}), prompt <= {c.model.max_prompt_tokens}, response <= {c.model.max_response_tokens} tokens"
        )
        lines.append(f"  {describe_precision(c.model.dtype, c.explorer.dtype, resolve_device(c.cluster.device))}")
        flags = [f for f in ("use_rollout", "use_reference", "use_critic") if getattr(a, f)]
        flags += ["dynamic_sampling"] if st.dynamic_sampling else []
        lines.append(
            f"  algorithm: {c.algorithm.type} - {a.description}  [{', '.join(flags) or 'offline'}; schema={a.schema}]"
        )
        lines += _slot_lines(st)
        lines.append(
            f"    batch inputs: {', '.join(sorted(st.needs))}; reference model: {'yes' if st.needs_reference else 'no'}"
        )
        b = c.buffer
        lines += describe_data(c, a)
        lines.append(
            f"  experience storage: {b.experience.storage}; {st.train_batch_size} "
            f"{'pairs' if a.schema == 'pair' else 'rows'} per train step"
            + (f", claimed in whole groups of {c.explorer.group_size}" if st.whole_groups else "")
        )
        if a.use_rollout:
            e = c.explorer
            s = e.sampling
            # A workflow that runs other settings than these (the env workflow: the env's reward and
            # action limits) says what it runs through its `plan_text`.
            own = getattr(WORKFLOW.get(e.workflow), "plan_text", None)
            runs = (
                own(c)
                if own is not None
                else f"reward={e.reward_fn}, T={s.temperature}, top_k={s.top_k}, top_p={s.top_p}, "
                f"max_new_tokens={s.max_new_tokens or c.model.max_response_tokens}"
            )
            lines.append(
                f"  explorer: {e.placement} placement, {e.batch_size} prompts x {e.group_size} samples, workflow={e.workflow}, "
                + runs
            )
            lines.append(
                f"  synchronizer: {c.sync_method()} every {c.synchronizer.interval} step(s), offset {c.synchronizer.offset}"
            )
        t, o = c.trainer, c.trainer.optimizer
        lines.append(f"  trainer: {_engine_text(c)}")
        lines.append(
            f"    {t.total_steps} steps, micro batch {t.micro_batch_size}, AdamW lr={o.lr} wd={o.weight_decay} "
            f"clip={o.grad_clip} warmup={o.warmup_steps} {o.scheduler}"
        )
        lines.append(
            f"  checkpoints: every {c.checkpoint.interval} steps, keep {c.checkpoint.keep_last}, resume={c.checkpoint.resume}"
        )
        lines.append(f"  monitor: {', '.join(c.monitor.backends)}; held-out evaluation {_eval_text(c)}")
    return "\n".join(lines)
