"""Train-engine traits: the core asks what an engine declares beside its registration, never its name.

A plugin's engine registered here with traits (and no edit of the core) gets what ``verl`` or
``local`` get for the same traits: Ray and a GPU count for workers that are Ray processes, the
cores shared with an explorer beside them, the plan's wording, the compare scheduler's memory
and thread overrides, the client's target check and backend choice.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from trinity_like.registry import TRAIN_ENGINE
from trinity_like.trainer.engines import TrainEngineSpec, TrainEngineTraits, declare_traits, train_engine_traits
from trinity_like.trainer.local_engine import LocalEngine

# In this process only: the one backend="ray" below is refused before Ray is touched (tests/_lib/tiers.py
# would read it as a Ray start).
pytestmark = pytest.mark.unit
REPO = Path(__file__).resolve().parents[2]
WORKERS = TrainEngineTraits(ray_workers=True, own_threads=True, extra_memory_gb=2.5, plan_text="test worker(s)")
EXACT = TrainEngineTraits(exact_targets=True)


def workers_engine(spec: TrainEngineSpec) -> LocalEngine:
    """A plugin engine declaring Ray workers (built in-process here: what is tested is what the core asks)."""
    return LocalEngine(spec.model, spec.optim)


def exact_engine(spec: TrainEngineSpec) -> LocalEngine:
    """A plugin engine in this process that scores any target tokens."""
    return LocalEngine(spec.model, spec.optim)


def plain_engine(spec: TrainEngineSpec) -> LocalEngine:
    """A plugin engine that declares nothing."""
    return LocalEngine(spec.model, spec.optim)


@pytest.fixture(autouse=True)
def plugin_engines():
    """The three engines registered as a plugin registers them, for this module's tests only: other
    modules list the registered engines (an unknown name's message)."""
    declared = {
        "test_traits_workers": declare_traits(WORKERS)(workers_engine),
        "test_traits_exact": declare_traits(EXACT)(exact_engine),
        "test_traits_none": plain_engine,
    }
    for name, factory in declared.items():
        TRAIN_ENGINE.register_module(name, module=factory)
    yield
    for name in [*declared, "test_traits_wrong"]:
        TRAIN_ENGINE._entries.pop(name, None)
        TRAIN_ENGINE._origin.pop(name, None)


def _config(engine: str, **sections):
    from trinity_like.config.schema import Config

    return Config.model_validate({"trainer": {"engine": engine}, **sections})


def test_our_engines_declare_their_traits_and_an_undeclared_engine_gets_the_defaults():
    verl, local = train_engine_traits("verl"), train_engine_traits("local")
    assert verl.ray_workers and verl.own_threads and verl.extra_memory_gb > 0 and not verl.exact_targets
    assert not local.ray_workers and not local.own_threads and local.extra_memory_gb == 0 and local.exact_targets
    assert train_engine_traits("test_traits_workers") is WORKERS
    assert train_engine_traits("test_traits_none") == TrainEngineTraits()
    with pytest.raises(KeyError, match="registered: .*local.*verl"):
        train_engine_traits("no_such_engine")


def test_traits_of_another_type_are_refused_by_name():
    @TRAIN_ENGINE.register_module("test_traits_wrong")
    def wrong(spec: TrainEngineSpec) -> LocalEngine:
        """Traits as a dict, not TrainEngineTraits."""
        return LocalEngine(spec.model, spec.optim)

    wrong.traits = {"ray_workers": True}  # type: ignore[attr-defined]
    with pytest.raises(TypeError, match="test_traits_wrong.*dict"):
        train_engine_traits("test_traits_wrong")


def test_a_run_asks_the_traits_for_ray_gpus_and_the_explorers_place():
    from trinity_like.config import load_plan
    from trinity_like.errors import TrinityError
    from trinity_like.pipeline.build import check_gpus, remote_explorer, uses_ray

    def stage(engine: str):
        return load_plan(REPO / "examples" / "grpo_arith.yaml", [f"trainer.engine={engine}"]).stages[0]

    for engine, ray in (("test_traits_workers", True), ("verl", True), ("test_traits_exact", False), ("local", False)):
        spec = stage(engine)
        assert spec.config.explorer.placement == "auto"
        assert uses_ray(spec) is ray and remote_explorer(spec) is ray, engine

    import torch

    more = (torch.cuda.device_count() if torch.cuda.is_available() else 0) + 1  # one more GPU than this machine has
    with pytest.raises(TrinityError, match=f"{more} GPUs asked for the test_traits_workers workers"):
        check_gpus(_config("test_traits_workers", cluster={"num_gpus": more}))
    check_gpus(_config("test_traits_exact", cluster={"num_gpus": more}))  # in-process: no workers to place


def test_cores_are_shared_beside_workers_that_are_ray_processes():
    concurrent = {"mode": "both", "synchronizer": {"offset": 1, "concurrent": True}, "cluster": {"num_cpus": 4}}
    assert _config("test_traits_workers", **concurrent).cpu_threads().shared
    assert _config("verl", **concurrent).cpu_threads().shared
    assert not _config("test_traits_exact", **concurrent).cpu_threads().shared
    assert not _config("test_traits_workers", mode="both").cpu_threads().shared  # in turn: nothing beside


def test_the_plan_names_an_engine_by_its_traits():
    from trinity_like.config import _engine_text

    text = _engine_text(_config("test_traits_workers", cluster={"trainer_workers": 3}))
    assert text == "test_traits_workers (3 test worker(s) on CPU over gloo, through a Ray started here)"
    assert _engine_text(_config("test_traits_none")) == "test_traits_none (in this process)"


def test_the_compare_scheduler_asks_the_traits_for_memory_and_threads(tmp_path):
    from trinity_like.compare.entries import Run
    from trinity_like.compare.scheduler import _argv, estimate_gb

    local = Run("a", 0, tmp_path, argv=["run"], model="tiny-random", engine="local")
    workers = dataclasses.replace(local, engine="test_traits_workers")
    verl = dataclasses.replace(local, engine="verl")
    assert estimate_gb(workers, "tiny-random") - estimate_gb(local, "tiny-random") == pytest.approx(2.5)
    assert estimate_gb(verl, "tiny-random") > estimate_gb(local, "tiny-random")
    assert _argv(local, 2) == ["run"]
    overrides = ["run", "cluster.explorer_threads=2", "cluster.trainer_threads=2"]
    assert _argv(workers, 2) == _argv(verl, 2) == overrides


def test_the_client_checks_targets_and_places_the_engine_by_its_traits(tmp_path):
    import trinity_like.client as tinker
    from trinity_like.client.data import DataError

    types = tinker.types
    datum = types.Datum(  # the target of position 1 is not the next input token
        model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
        loss_fn_inputs={"target_tokens": [6, 9, 8, 10], "weights": [1.0, 1.0, 1.0, 1.0]},
    )
    with tinker.ServiceClient(log_dir=tmp_path, train_engine="test_traits_exact") as service:
        training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
        assert training.forward_backward([datum], "cross_entropy").result().loss_fn_outputs  # any target scored
    with tinker.ServiceClient(log_dir=tmp_path, train_engine="test_traits_none") as service:
        training = service.create_lora_training_client("tiny-random", rank=0, seed=0)
        with pytest.raises(DataError, match="not the next model_input token"):
            training.forward_backward([datum], "cross_entropy").result()
    with pytest.raises(ValueError, match="cannot place Ray workers"):
        tinker.ServiceClient(log_dir=tmp_path, train_engine="test_traits_workers", backend="ray")
    with pytest.raises(ValueError, match="unknown train engine 'no_such_engine'"):
        tinker.ServiceClient(log_dir=tmp_path, train_engine="no_such_engine")
