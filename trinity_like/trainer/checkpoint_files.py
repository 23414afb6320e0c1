"""The checkpoint files every train engine writes and reads (the layout in
:mod:`trinity_like.trainer.base`'s docstring): torch's optimiser state as safetensors, the
step count, the RNG state -- nothing pickled -- and a saved optimiser state fitted to a live
optimiser's param groups.

Example::

    save_optimizer_state(full_state, folder / OPTIMIZER_FILE)
    write_trainer_state(folder, step)
    state = load_optimizer_state(folder / OPTIMIZER_FILE)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trinity_like.errors import TrinityError


def conform_param_groups(saved: dict, optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> dict:
    """A saved full optimiser state whose param groups are exactly ``optimizer``'s.

    The engines' optimisers differ in bookkeeping keys (verl's ``LambdaLR`` adds
    ``initial_lr``) and, with LoRA, in what they hold (verl's AdamW holds the frozen base
    too, the local one the adapter alone): each group takes its keys and its parameters --
    by name, in the optimiser's own order, which is how torch pairs them with the state --
    from ``optimizer``, and its hyper-parameters from the saved state.
    """
    names = {id(p): name for name, p in model.named_parameters()}
    groups = []
    for saved_group, current in zip(saved["param_groups"], optimizer.param_groups, strict=True):
        groups.append({k: saved_group.get(k, v) for k, v in current.items() if k != "params"})
        groups[-1]["params"] = [names[id(p)] for p in current["params"]]
    return {**saved, "param_groups": groups}


# -- checkpoint files (the layout in the module docstring) --------------------------------
OPTIMIZER_FILE = "optimizer.safetensors"
LEGACY_OPTIMIZER_FILE = "optimizer.pt"  # the pickled format before; never read
STATE_FILE = "trainer_state.json"
RNG_FILE = "rng_state.safetensors"
_SEP = "/"  # tensor name = "<parameter name>/<entry>" (entries such as exp_avg hold no "/")


def save_optimizer_state(state: Mapping[str, Any], file: Path) -> None:
    """Write torch's full optimiser state dict (keyed by parameter name) as safetensors.

    Each tensor entry becomes one tensor ``<name>/<entry>`` (``...q_proj.weight/exp_avg``);
    non-tensor entries and the param groups go to the file's metadata as JSON (tuples such
    as ``betas`` as lists, restored by :func:`load_optimizer_state`).
    """
    from safetensors.torch import save_file

    tensors, scalars = {}, {}
    for name, entries in state["state"].items():
        for key, value in entries.items():
            if isinstance(value, torch.Tensor):
                tensors[f"{name}{_SEP}{key}"] = value.detach().cpu().contiguous()
            else:
                scalars.setdefault(name, {})[key] = value
    groups = [{k: list(v) if isinstance(v, tuple) else v for k, v in g.items()} for g in state["param_groups"]]
    save_file(tensors, str(file), metadata={"param_groups": json.dumps(groups), "scalars": json.dumps(scalars)})


def load_optimizer_state(file: Path) -> dict[str, Any]:
    """The optimiser state dict :func:`save_optimizer_state` wrote."""
    from safetensors import safe_open

    state: dict[str, dict[str, Any]] = {}
    with safe_open(str(file), framework="pt") as f:
        metadata = f.metadata()
        for key in f.keys():  # noqa: SIM118 -- safe_open is no dict
            name, _, entry = key.rpartition(_SEP)
            state.setdefault(name, {})[entry] = f.get_tensor(key)
    for name, entries in json.loads(metadata["scalars"]).items():
        state.setdefault(name, {}).update(entries)
    groups = [
        {k: tuple(v) if isinstance(v, list) and k != "params" else v for k, v in g.items()}
        for g in json.loads(metadata["param_groups"])
    ]
    return {"state": state, "param_groups": groups}


def check_no_legacy_optimizer(folder: Path) -> None:
    """A checkpoint of the pickled format: one clear error instead of a silently fresh optimiser."""
    if (folder / LEGACY_OPTIMIZER_FILE).is_file() and not (folder / OPTIMIZER_FILE).is_file():
        raise TrinityError(
            f"{folder}: optimiser state in the old pickled format ({LEGACY_OPTIMIZER_FILE}) is "
            f"not read; load the weights alone (with_optimizer=False)"
        )


def write_trainer_state(folder: Path, step: int) -> None:
    (folder / STATE_FILE).write_text(json.dumps({"step": step}))


def read_trainer_state(folder: Path) -> int:
    """Optimiser steps a checkpoint had taken (0 when it says nothing)."""
    file = folder / STATE_FILE
    return int(json.loads(file.read_text())["step"]) if file.is_file() else 0


def rng_state() -> dict[str, torch.Tensor]:
    """This process's torch RNG state as tensors: ``cpu``, and ``cuda`` (the current device) once CUDA is in use."""
    state = {"cpu": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Mapping[str, torch.Tensor]) -> None:
    """Restore what :func:`rng_state` returned (a ``cuda`` entry only where CUDA is available)."""
    torch.set_rng_state(state["cpu"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])
