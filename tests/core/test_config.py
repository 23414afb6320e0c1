"""Recipe loading: schema validation with file/key/line, overrides, presets, stages, TOML."""

from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import pydantic
import pytest
import torch

from trinity_like.components import AlgorithmType
from trinity_like.config import describe_plan, load_plan
from trinity_like.config.schema import Config, StageConfig
from trinity_like.errors import ConfigError
from trinity_like.registry import ADVANTAGE_FN, ALGORITHM_TYPE, POLICY_LOSS_FN, SAMPLE_STRATEGY


@dataclasses.dataclass(frozen=True)
class _LossParams:
    clip: float = 0.2  # a clip range
    mode: str = "token-mean"  # aggregation


def _cfgtest_loss(*, logprob: torch.Tensor, advantages: torch.Tensor, action_mask: torch.Tensor, params: _LossParams):
    """Test loss."""
    return (-(logprob * advantages * action_mask).sum(), {})


def _cfgtest_needs_values(*, logprob: torch.Tensor, values: torch.Tensor, params: _LossParams):
    """Test loss that needs a critic."""
    return (values.sum(), {})


@dataclasses.dataclass(frozen=True)
class _OtherParams:
    scale: float = 1.0  # a scale


def _cfgtest_other(*, logprob: torch.Tensor, advantages: torch.Tensor, action_mask: torch.Tensor, params: _OtherParams):
    """Test loss with other params."""
    return (-(params.scale * logprob * advantages * action_mask).sum(), {})


def _cfgtest_nll(*, logprob: torch.Tensor, action_mask: torch.Tensor):
    """Test offline loss."""
    return (-(logprob * action_mask).sum(), {})


def _cfgtest_adv(*, rewards: torch.Tensor, action_mask: torch.Tensor, group_index: torch.Tensor):
    """Test advantage."""
    return rewards[:, None] * action_mask, rewards[:, None] * action_mask


class _CfgtestSample:
    """Test sample strategy."""


SAMPLE_STRATEGY.register_module("cfgtest_sample", module=_CfgtestSample, force=True)
POLICY_LOSS_FN.register_module("cfgtest_loss", module=_cfgtest_loss, force=True)
POLICY_LOSS_FN.register_module("cfgtest_nll", module=_cfgtest_nll, force=True)
POLICY_LOSS_FN.register_module("cfgtest_other", module=_cfgtest_other, force=True)
POLICY_LOSS_FN.register_module("cfgtest_needs_values", module=_cfgtest_needs_values, force=True)
ADVANTAGE_FN.register_module("cfgtest_adv", module=_cfgtest_adv, force=True)
ALGORITHM_TYPE.register_module(
    "cfgtest_online",
    module=AlgorithmType(
        description="Test online algorithm.",
        policy_loss="cfgtest_loss",
        advantage="cfgtest_adv",
        sample_strategy="cfgtest_sample",
        params={"policy_loss": {"clip": 0.28}},
        defaults={"explorer.group_size": 4},
        requires={"synchronizer.offset": 0},
    ),
    force=True,
)
ALGORITHM_TYPE.register_module(
    "cfgtest_pinned",
    module=AlgorithmType(
        description="Test algorithm that cannot work without its loss.",
        policy_loss="cfgtest_loss",
        advantage="cfgtest_adv",
        sample_strategy="cfgtest_sample",
        requires={"algorithm.policy_loss.name": "cfgtest_loss"},
    ),
    force=True,
)
ALGORITHM_TYPE.register_module(
    "cfgtest_offline",
    module=AlgorithmType(
        description="Test offline algorithm.",
        policy_loss="cfgtest_nll",
        use_rollout=False,
        sample_strategy="cfgtest_sample",
        requires={"mode": "train"},
    ),
    force=True,
)
ALGORITHM_TYPE.register_module(
    "cfgtest_bad_inputs",
    module=AlgorithmType(
        description="Loss needs values but no critic.",
        policy_loss="cfgtest_needs_values",
        advantage="cfgtest_adv",
        sample_strategy="cfgtest_sample",
    ),
    force=True,
)

BASE = """\
name: t
algorithm:
  type: cfgtest_online
buffer:
  tasks:
    generator: arithmetic
trainer:
  engine: local
  total_steps: 3
  optimizer:
    lr: 1e-5
"""


def write(tmp_path: Path, text: str, name: str = "r.yaml") -> Path:
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return p


def error_of(path: Path, overrides: list[str] | None = None) -> str:
    with pytest.raises(ConfigError) as info:
        load_plan(path, overrides)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


def test_valid_recipe_resolves_to_frozen_typed_config(tmp_path):
    plan = load_plan(write(tmp_path, BASE))
    (stage,) = plan.stages
    cfg = stage.config
    assert cfg.trainer.optimizer.lr == 1e-5 and isinstance(cfg.trainer.optimizer.lr, float)
    assert cfg.trainer.total_steps == 3
    assert stage.components["policy_loss"].params == _LossParams(clip=0.28)  # preset param filled
    assert cfg.explorer.group_size == 4  # preset default filled
    with pytest.raises(pydantic.ValidationError):
        cfg.trainer.total_steps = 5  # type: ignore[misc]


def test_unknown_key_names_file_line_and_suggests(tmp_path):
    p = write(tmp_path, BASE.replace("  total_steps: 3", "  totl_steps: 3"))
    msg = error_of(p)
    assert msg.startswith(f"{p}:9: trainer.totl_steps: unknown key")
    assert "did you mean 'total_steps'" in msg


def test_wrong_type_names_file_line_and_key(tmp_path):
    p = write(tmp_path, BASE.replace("total_steps: 3", "total_steps: three"))
    msg = error_of(p)
    assert msg.startswith(f"{p}:9: trainer.total_steps:") and "integer" in msg and "'three'" in msg
    p = write(tmp_path, BASE.replace("total_steps: 3", "total_steps: true"))
    assert error_of(p).startswith(f"{p}:9: trainer.total_steps:")


def test_out_of_range_value(tmp_path):
    p = write(tmp_path, BASE.replace("lr: 1e-5", "lr: -0.1"))
    msg = error_of(p)
    assert msg.startswith(f"{p}:11: trainer.optimizer.lr:") and "greater than 0" in msg


def test_bad_yaml_names_the_line(tmp_path):
    p = write(tmp_path, "name: t\ntrainer:\n  total_steps: 3\n   bad: [1, 2\n")
    msg = error_of(p)
    assert msg.startswith(f"{p}:") and "bad YAML" in msg


def test_duplicate_yaml_key_is_an_error(tmp_path):
    p = write(tmp_path, BASE + "name: again\n")
    assert error_of(p) == f"{p}:12: name: duplicate key"


def test_missing_file_and_bad_extension(tmp_path):
    assert "no such recipe file" in error_of(tmp_path / "missing.yaml")
    p = tmp_path / "r.json"
    p.write_text("{}")
    assert "unknown recipe format" in error_of(p)


def test_overrides_apply_and_their_errors_name_the_override(tmp_path):
    p = write(tmp_path, BASE)
    plan = load_plan(p, ["trainer.total_steps=7", "trainer.optimizer.lr=3e-4", "explorer.sampling.stop=[a, b]"])
    cfg = plan.stages[0].config
    assert (cfg.trainer.total_steps, cfg.trainer.optimizer.lr, cfg.explorer.sampling.stop) == (7, 3e-4, ["a", "b"])
    msg = error_of(p, ["trainer.total_steps=-2"])
    assert "override 'trainer.total_steps=-2'" in msg and "trainer.total_steps" in msg
    assert "expected key.path=value" in error_of(p, ["trainer.total_steps"])


def test_preset_fills_only_unset_values_and_user_params_win(tmp_path):
    p = write(
        tmp_path,
        BASE.replace(
            "algorithm:\n  type: cfgtest_online\n",
            "algorithm:\n  type: cfgtest_online\n  policy_loss:\n    clip: 0.1\n",
        )
        + "explorer:\n  group_size: 16\n",
    )
    stage = load_plan(p).stages[0]
    assert stage.config.explorer.group_size == 16
    assert stage.components["policy_loss"].params.clip == 0.1


def test_preset_conflicts_are_errors_not_rewrites(tmp_path):
    p = write(tmp_path, BASE + "synchronizer:\n  offset: 2\n")
    msg = error_of(p)
    assert msg.startswith(f"{p}:13: synchronizer.offset: 2 conflicts with algorithm type 'cfgtest_online'")
    p = write(
        tmp_path,
        BASE.replace("  type: cfgtest_online\n", "  type: cfgtest_pinned\n  policy_loss:\n    name: cfgtest_other\n"),
    )
    msg = error_of(p)  # a slot the algorithm pins in `requires` cannot be swapped
    assert msg.startswith(
        f"{p}:5: algorithm.policy_loss.name: 'cfgtest_other' conflicts with algorithm type "
        "'cfgtest_pinned', which requires 'cfgtest_loss'"
    )
    offline = "algorithm:\n  type: cfgtest_offline\nmode: both\nbuffer:\n  train_data:\n    generator: arithmetic\n"
    msg = error_of(write(tmp_path, offline))
    assert ":3: mode: 'both' conflicts with algorithm type 'cfgtest_offline', which requires 'train'" in msg


def test_a_slot_swapped_from_the_recipe_or_command_line_is_accepted_and_printed(tmp_path):
    """The researcher's path (plugins/README.md): a new loss on an existing algorithm type."""
    in_file = write(
        tmp_path,
        BASE.replace("  type: cfgtest_online\n", "  type: cfgtest_online\n  policy_loss:\n    name: cfgtest_other\n"),
        "a.yaml",
    )
    on_cli = load_plan(write(tmp_path, BASE), ["algorithm.policy_loss.name=cfgtest_other"])
    for plan in (load_plan(in_file), on_cli):
        (stage,) = plan.stages
        comp = stage.components["policy_loss"]
        # the algorithm's params (clip 0.28) stay with its own loss: the new one gets its defaults
        assert (comp.name, comp.params, comp.fn) == ("cfgtest_other", _OtherParams(), _cfgtest_other)
        assert stage.swapped == {"policy_loss": "cfgtest_loss"}
        text = describe_plan(plan)
        assert (
            "    policy_loss: cfgtest_other (swapped; algorithm cfgtest_online uses cfgtest_loss) (scale=1.0)" in text
        )
    # a swapped-in component's params are its own, validated against its dataclass
    plan = load_plan(
        write(tmp_path, BASE), ["algorithm.policy_loss.name=cfgtest_other", "algorithm.policy_loss.scale=2"]
    )
    assert plan.stages[0].components["policy_loss"].params == _OtherParams(scale=2.0)
    msg = error_of(
        write(tmp_path, BASE), ["algorithm.policy_loss.name=cfgtest_other", "algorithm.policy_loss.clip=0.1"]
    )
    assert "algorithm.policy_loss.clip: unknown parameter of _cfgtest_other" in msg


def test_a_swap_needing_an_input_the_algorithm_lacks_is_rejected_with_file_and_line(tmp_path):
    p = write(
        tmp_path,
        BASE.replace(
            "  type: cfgtest_online\n", "  type: cfgtest_online\n  policy_loss:\n    name: cfgtest_needs_values\n"
        ),
    )
    msg = error_of(p)
    assert msg.startswith(
        f"{p}:5: algorithm.policy_loss.name: 'cfgtest_needs_values' needs ['values'], which "
        "algorithm 'cfgtest_online' does not provide (swapped in for 'cfgtest_loss'): values comes "
        "from a critic"
    )
    msg = error_of(write(tmp_path, BASE), ["algorithm.policy_loss.name=cfgtest_needs_values"])
    assert msg.startswith(
        f"{tmp_path / 'r.yaml'}: override 'algorithm.policy_loss.name=cfgtest_needs_values': "
        "algorithm.policy_loss.name: 'cfgtest_needs_values' needs ['values']"
    )


def test_component_params_are_validated(tmp_path):
    p = write(
        tmp_path, BASE.replace("  type: cfgtest_online\n", "  type: cfgtest_online\n  policy_loss:\n    clipp: 0.1\n")
    )
    msg = error_of(p)
    assert msg.startswith(f"{p}:5:") and "algorithm.policy_loss.clipp: unknown parameter" in msg and "'clip'" in msg
    p = write(
        tmp_path, BASE.replace("  type: cfgtest_online\n", "  type: cfgtest_online\n  policy_loss:\n    clip: wide\n")
    )
    assert "algorithm.policy_loss.clip" in error_of(p)


def test_unknown_algorithm_lists_known_names(tmp_path):
    p = write(tmp_path, BASE.replace("cfgtest_online", "cfgtest_onlin"))
    msg = error_of(p)
    assert msg.startswith(f"{p}:3: algorithm.type: unknown algorithm type 'cfgtest_onlin'")
    assert "did you mean 'cfgtest_online'" in msg


def test_unknown_train_engine_lists_the_registered_ones(tmp_path):
    p = write(tmp_path, BASE.replace("  engine: local", "  engine: lokal"))
    msg = error_of(p)
    assert msg.startswith(f"{p}:8: trainer.engine: unknown train engine 'lokal'")
    assert "did you mean 'local'" in msg and "local, verl" in msg


def test_a_loss_needing_an_input_nobody_provides_is_rejected(tmp_path):
    p = write(tmp_path, BASE.replace("cfgtest_online", "cfgtest_bad_inputs"))
    msg = error_of(p)
    assert "'cfgtest_needs_values' needs ['values']" in msg


def test_stages_merge_over_the_top_level_and_errors_point_into_the_stage(tmp_path):
    text = BASE + textwrap.dedent(
        """\
        stages:
          - name: warmup
            algorithm:
              type: cfgtest_offline
            mode: train
            buffer:
              train_data:
                generator: arithmetic
          - name: rl
            trainer:
              total_steps: 5
        """
    )
    plan = load_plan(write(tmp_path, text))
    a, b = plan.stages
    assert a.config.algorithm.type == "cfgtest_offline" and a.config.mode == "train"
    assert b.config.algorithm.type == "cfgtest_online" and b.config.trainer.total_steps == 5
    assert a.config.name == "t/warmup" and b.config.name == "t/rl"
    assert a.config.trainer.optimizer.lr == b.config.trainer.optimizer.lr == 1e-5
    bad = write(tmp_path, text.replace("total_steps: 5", "total_steps: 0"))
    msg = error_of(bad)
    assert msg.startswith(f"{bad}:22: stages.1.trainer.total_steps:")


def test_toml_recipe_equals_yaml_and_names_lines(tmp_path):
    toml = textwrap.dedent(
        """\
        name = "t"

        [algorithm]
        type = "cfgtest_online"

        [buffer.tasks]
        generator = "arithmetic"

        [trainer]
        engine = "local"
        total_steps = 3

        [trainer.optimizer]
        lr = 1e-5
        """
    )
    p = write(tmp_path, toml, "r.toml")
    assert load_plan(p).stages[0].config == load_plan(write(tmp_path, BASE)).stages[0].config
    bad = write(tmp_path, toml.replace("total_steps = 3", "total_stepz = 3"), "bad.toml")
    assert error_of(bad).startswith(f"{bad}:11: trainer.total_stepz: unknown key")
    broken = write(tmp_path, "name = \n", "broken.toml")
    assert "bad TOML" in error_of(broken)


def test_dataset_needs_exactly_one_source(tmp_path):
    p = write(tmp_path, BASE.replace("    generator: arithmetic\n", "    generator: arithmetic\n    path: x.jsonl\n"))
    assert "exactly one of `path` and `generator`" in error_of(p)


def test_cpu_threads_share_the_cores_only_when_the_explorer_runs_beside_cpu_workers(monkeypatch):
    """In turn each side gets the cores while it works; beside a concurrent CPU verl trainer on a
    Ray started here they share them (half each while both compute, all to one alone); explicit
    cluster.*_threads fix the widths."""
    from trinity_like import threads
    from trinity_like.config.schema import Config

    monkeypatch.setattr(threads, "cores_given", lambda: 8)  # the cores this process may use
    assert Config(cluster={"num_cpus": 16}).cpu_threads().explorer == 8  # never more threads than cores

    def plan(**sections):
        return tuple(Config(cluster={"num_cpus": 8, **sections.pop("cluster", {})}, **sections).cpu_threads())

    # (explorer, trainer per worker, explorer alone, trainer alone, shared)
    assert plan() == (8, 8, 8, 8, False)
    assert plan(cluster={"trainer_workers": 2}) == (8, 4, 8, 4, False)
    ahead = {"synchronizer": {"offset": 1}}
    assert plan(**ahead) == (4, 4, 8, 8, True)
    assert plan(**ahead, cluster={"trainer_workers": 2}) == (4, 2, 8, 4, True)
    assert plan(synchronizer={"offset": 1, "concurrent": False}) == (8, 8, 8, 8, False)  # the same schedule in turn
    assert plan(**ahead, mode="train") == (8, 8, 8, 8, False)  # no explorer in this process
    assert plan(**ahead, trainer={"engine": "local"}) == (8, 8, 8, 8, False)  # the trainer is this process
    assert plan(**ahead, cluster={"num_gpus": 1}) == (8, 8, 8, 8, False)  # the trainer is on a GPU
    assert plan(**ahead, cluster={"ray_address": "auto"}) == (8, 8, 8, 8, False)  # the workers may be elsewhere
    assert plan(**ahead, cluster={"explorer_threads": 2, "trainer_threads": 6}) == (2, 6, 2, 6, False)
    assert Config(cluster={"num_cpus": 1}, synchronizer={"offset": 1}).cpu_threads() == (1, 1, 1, 1, True)


# -- hostile recipe files: bounded reads and bounded aliases (tests/faults/test_hostile_recipes.py runs them
# through the CLI) ---------------------------------------------------------------------------------------------
def test_anchors_and_aliases_a_person_writes_still_work(tmp_path):
    p = write(
        tmp_path,
        BASE.replace("trainer:\n  engine: local", "trainer: &trainer\n  engine: local")
        + "stages:\n  - name: a\n    trainer: *trainer\n  - name: b\n    trainer:\n      total_steps: 5\n",
    )
    plan = load_plan(p)
    assert [(s.config.trainer.total_steps, s.config.trainer.optimizer.lr) for s in plan.stages] == [
        (3, 1e-5),
        (5, 1e-5),
    ]


def test_aliases_may_expand_to_the_bound_and_not_past_it(tmp_path):
    from trinity_like.config.loader import MAX_ALIAS_NODES, load_recipe

    assert MAX_ALIAS_NODES == 10_000
    anchor = "a: &a [" + ", ".join(["1"] * 99) + "]\n"  # 100 nodes: the list and its 99 items
    hundred = "b: [" + ", ".join(["*a"] * 100) + "]\n"  # 100 aliases of it: 10,000 nodes
    assert len(load_recipe(write(tmp_path, anchor + hundred)).data["b"]) == 100
    p = write(tmp_path, anchor + hundred + "c: *a\n")
    with pytest.raises(ConfigError, match=rf"^{p}:3: alias \*a: aliases expand to more than 10000 nodes in all"):
        load_recipe(p)


def test_a_recipe_that_is_not_a_regular_file_or_too_large_is_refused(tmp_path):
    from trinity_like.config.loader import MAX_RECIPE_BYTES, load_recipe

    link = tmp_path / "r.yaml"
    link.symlink_to("/dev/null")
    with pytest.raises(ConfigError, match=r"r\.yaml: not a regular file \(a device\); a recipe is read from a file$"):
        load_recipe(link)
    big = write(tmp_path, BASE + "#" * MAX_RECIPE_BYTES, name="big.yaml")
    with pytest.raises(ConfigError, match=r"big\.yaml: larger than 4 MB; a recipe is read up to 4 MB$"):
        load_recipe(big)


def test_override_values_are_bounded_like_the_recipe(tmp_path):
    p = write(tmp_path, BASE)
    plan = load_plan(p, ["explorer.sampling.stop=[&s x, *s]"])
    assert plan.stages[0].config.explorer.sampling.stop == ["x", "x"]
    msg = error_of(p, ["explorer.sampling.stop=&s [*s]"])
    assert (
        msg == "override 'explorer.sampling.stop=&s [*s]': alias *s is inside the node &s it names (a recursive alias)"
    )


# -- run and stage names: one folder name, so the run directory stays inside run_root -----------
@pytest.mark.parametrize(
    "name",
    ["../../x", "/tmp/abs", ".", "..", "", "a/b", "a\nb", "nul\x00", "bell\x07", ".hidden", "-flag", "x" * 101, "é"],
    ids=[
        "parent",
        "absolute",
        "dot",
        "dotdot",
        "empty",
        "slash",
        "newline",
        "nul",
        "control",
        "hidden",
        "dash",
        "long",
        "non-ascii",
    ],
)
def test_a_run_name_that_is_not_one_plain_folder_name_is_refused_with_its_line(tmp_path, name):
    p = write(tmp_path, BASE.replace("name: t", f"name: {json.dumps(name)}"))
    assert error_of(p).startswith(f"{p}:1: name: {name!r} is not a run or stage name: one folder name of letters")
    # the same check on the command line, and on the schema itself (a Config built in code)
    override = f"name={json.dumps(name)}"
    assert error_of(write(tmp_path, BASE), [override]).startswith(
        f"{tmp_path / 'r.yaml'}: override {override!r}: name: {name!r} is not a run or stage name"
    )
    if name != "a/b":  # a Config's name may be "<run>/<stage>": what a stage of a recipe runs under
        with pytest.raises(pydantic.ValidationError, match="is not a run or stage name"):
            Config(name=name)


def test_a_stage_name_that_leaves_its_run_folder_is_refused_with_its_line(tmp_path):
    p = write(tmp_path, BASE + "stages:\n  - name: ok\n  - name: ../escape\n")
    assert error_of(p).startswith(f"{p}:14: stages.1.name: '../escape' is not a run or stage name")
    p = write(tmp_path, BASE.replace("name: t", "name: 7") + "stages:\n  - name: ok\n")
    assert error_of(p) == f"{p}:1: name: must be a string (got 7)"
    with pytest.raises(pydantic.ValidationError, match="is not a run or stage name"):
        StageConfig(name="a/b")


def test_plain_names_are_accepted_and_a_stage_runs_under_its_run(tmp_path):
    for name in ("grpo_arith", "run-2.lr1e-5", "_x", "r" + "9" * 99):
        assert load_plan(write(tmp_path, BASE), [f"name={name}"]).stages[0].config.name == name
    assert Config(name="t/warmup").run_dir() == "runs/t/warmup"  # what a stage of run t runs under
    with pytest.raises(pydantic.ValidationError):
        Config(name="t/a/b")
