"""The core's own registered components, imported by :func:`trinity_like.plugins.load_plugins`.

The core registers a few components itself (workflows, the ``env`` workflow included,
reward functions, task sources, buffer storages, monitors, the ``native`` rollout engine, the ``local`` and ``verl`` train engines) because it cannot run without
them. They are imported here, in one place, before any plugin, so every process sees the
same built-in entries. Concrete environments are not among them: they are the ``cookbook``
pack's, found through its entry point like any plugin's.
"""

from __future__ import annotations

import importlib

BUILTIN_MODULES = (
    "trinity_like.explorer.workflows",
    "trinity_like.explorer.rewards",
    "trinity_like.explorer.reward_mitigations",
    "trinity_like.explorer.reward_isolation",
    "trinity_like.explorer.tasks",
    "trinity_like.explorer.arithmetic_presets",
    "trinity_like.explorer.engines",
    "trinity_like.trainer.engines",
    "trinity_like.buffer.storage",
    "trinity_like.monitor.sinks",
    "trinity_like.monitor.wandb_sink",
    "trinity_like.monitor.mlflow_sink",
    "trinity_like.envs.workflow",
)


def load_builtins() -> None:
    for name in BUILTIN_MODULES:
        importlib.import_module(name)
