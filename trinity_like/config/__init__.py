"""Recipes: typed schema, YAML/TOML loading with line numbers, overrides, presets."""

from __future__ import annotations

from trinity_like.config.resolve import ResolvedComponent, ResolvedStage, RunPlan, load_plan
from trinity_like.config.schema import Config

__all__ = ["Config", "ResolvedComponent", "ResolvedStage", "RunPlan", "describe_plan", "load_plan"]


def _params_text(params: object) -> str:
    import dataclasses

    if params is None:
        return ""
    if dataclasses.is_dataclass(params):
        items = dataclasses.asdict(params)
        return "(" + ", ".join(f"{k}={v!r}" for k, v in items.items()) + ")"
    return f"({params!r})"


def describe_plan(plan: RunPlan) -> str:
    """A human-readable summary of what a run would do."""
    lines = [f"recipe: {plan.source}", f"plugins loaded: {', '.join(plan.plugins) or '(none)'}"]
    for i, st in enumerate(plan.stages, 1):
        c, a = st.config, st.algorithm
        lines.append(f"stage {i}/{len(plan.stages)}: {c.name}  mode={c.mode}  seed={c.seed}  run_dir={c.run_dir()}")
        lines.append(f"  model: {c.model.path} ({c.model.dtype}), prompt <= {c.model.max_prompt_tokens}, response <= {c.model.max_response_tokens} tokens")
        flags = [f for f in ("use_rollout", "use_reference", "use_critic") if getattr(a, f)]
        flags += ["dynamic_sampling"] if st.dynamic_sampling else []
        lines.append(f"  algorithm: {c.algorithm.type} - {a.description}  [{', '.join(flags) or 'offline'}; schema={a.schema}]")
        for slot, comp in st.components.items():
            coef = f" coef={comp.coef}" if comp.coef is not None else ""
            lines.append(f"    {slot}: {comp.name}{coef} {_params_text(comp.params)}")
        lines.append(f"    batch inputs: {', '.join(sorted(st.needs))}; reference model: {'yes' if st.needs_reference else 'no'}")
        b = c.buffer
        for key in ("tasks", "eval_tasks", "train_data", "eval_data", "expert_data"):
            ds = getattr(b, key)
            if ds is not None:
                src = ds.path or f"generator {ds.generator} {ds.generator_args or ''} split={ds.split}"
                lines.append(f"  {key}: {src}" + (f" size={ds.size}" if ds.size else ""))
        lines.append(f"  experience storage: {b.experience.storage}")
        if a.use_rollout:
            e = c.explorer
            s = e.sampling
            lines.append(
                f"  explorer: {e.engine}, {e.batch_size} prompts x {e.group_size} samples, workflow={e.workflow}, "
                f"reward={e.reward_fn}, T={s.temperature}, top_k={s.top_k}, top_p={s.top_p}, "
                f"max_new_tokens={s.max_new_tokens or c.model.max_response_tokens}"
            )
            lines.append(f"  synchronizer: {c.sync_method()} every {c.synchronizer.interval} step(s), offset {c.synchronizer.offset}")
        t, o = c.trainer, c.trainer.optimizer
        lines.append(
            f"  trainer: {t.engine} ({c.cluster.trainer_workers} workers)" if t.engine == "verl" else f"  trainer: {t.engine}"
        )
        lines.append(
            f"    {t.total_steps} steps, micro batch {t.micro_batch_size}, AdamW lr={o.lr} wd={o.weight_decay} "
            f"clip={o.grad_clip} warmup={o.warmup_steps} {o.scheduler}"
        )
        lines.append(f"  checkpoints: every {c.checkpoint.interval} steps, keep {c.checkpoint.keep_last}, resume={c.checkpoint.resume}")
        lines.append(f"  monitor: {', '.join(c.monitor.backends)}; eval every {c.monitor.eval_interval or 'start/end'}")
        ray = c.cluster.ray_address or "local"
        lines.append(f"  cluster: ray={ray}, gpus={c.cluster.num_gpus}, nodes={c.cluster.nnodes}")
    return "\n".join(lines)
