"""What compared recipes differ in (resolved plans), and how a seed reaches every run of a recipe."""

from __future__ import annotations

from pathlib import Path

import pytest

from trinity_like.compare.entries import Entry, parse_entries, recipe_runs, script_runs
from trinity_like.compare.plans import check_not_owned, held_out_differs, plan_diff
from trinity_like.config import load_plan
from trinity_like.errors import ConfigError

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
HARD = [f"buffer.{k}.generator_args={{ranges: [[10, 99], [10, 99]]}}" for k in ("tasks", "eval_tasks")]


def plans_of(tmp_path: Path, *entries: Entry, sets: list[str] = ()) -> dict:
    out = {}
    for e in entries:
        runs, plan = recipe_runs(e, [0], tmp_path, list(sets), [])
        assert plan is not None, runs[0].error
        out[e.label] = plan
    return out


def test_grpo_hard_against_mix_hard_shows_dynamic_sampling_beside_the_expert_term(tmp_path):
    grpo_hard = Entry("grpo_hard", "grpo_hard", recipe=EXAMPLES / "grpo_arith.yaml", overrides=tuple(HARD))
    mix_hard = Entry("mix_hard", "mix_hard", recipe=EXAMPLES / "mix_hard.yaml")
    diff = dict(plan_diff(plans_of(tmp_path, grpo_hard, mix_hard)))
    # the expert term: MIX's loss and sample strategy, with their params, and the expert data
    assert diff["resolved.policy_loss"] == {"grpo_hard": "ppo", "mix_hard": "mix"}
    assert diff["resolved.policy_loss.mu"]["mix_hard"] == 0.1
    assert diff["resolved.sample_strategy.expert_ratio"]["mix_hard"] == 0.25
    assert diff["buffer.expert_data"]["grpo_hard"] is None
    assert diff["buffer.expert_data"]["mix_hard"]["path"].endswith("data/mix_hard_arith.jsonl")
    # ... and what a reader of the two headers might miss: grpo_arith samples dynamically, mix does not
    assert diff["resolved.dynamic_sampling"] == {"grpo_hard": True, "mix_hard": False}
    assert diff["model.max_prompt_tokens"] == {"grpo_hard": 128, "mix_hard": 256}
    # the same task and held-out set on both sides: not in the diff
    assert not held_out_differs(list(diff.items()))
    assert not any(k.startswith(("buffer.tasks", "buffer.eval_tasks", "seed", "name", "run_root")) for k in diff)


def test_grpo_and_dr_grpo_on_add2_differ_in_exactly_what_dr_grpo_changes(tmp_path):
    a = Entry("grpo", "a", recipe=EXAMPLES / "grpo_add2.yaml")
    b = Entry("dr_grpo", "b", recipe=EXAMPLES / "dr_grpo_add2.yaml")
    diff = plan_diff(plans_of(tmp_path, a, b, sets=["trainer.engine=local"]))
    assert [k for k, _ in diff] == [
        "algorithm.type",
        "resolved.advantage.norm_by_std",
        "resolved.policy_loss.loss_agg_mode",
    ]
    same = plan_diff(plans_of(tmp_path, a, Entry("grpo2", "c", recipe=EXAMPLES / "grpo_add2.yaml")))
    assert same == []


def test_a_different_held_out_set_is_flagged(tmp_path):
    a = Entry("a", "a", recipe=EXAMPLES / "grpo_add2.yaml")
    b = Entry("b", "b", recipe=EXAMPLES / "grpo_add2.yaml", overrides=("buffer.eval_tasks.size=100",))
    diff = plan_diff(plans_of(tmp_path, a, b))
    assert held_out_differs(diff) == ["buffer.eval_tasks.size"]


def test_seed_s_sets_sampling_and_training_data_of_every_stage_and_leaves_held_out_sets(tmp_path):
    entry = Entry("staged", "staged", recipe=EXAMPLES / "sft_then_grpo.yaml")
    runs, _ = recipe_runs(entry, [7, 8], tmp_path, ["trainer.engine=local"], [])
    base = load_plan(EXAMPLES / "sft_then_grpo.yaml")
    for run in runs:
        assert run.error is None
        config = run.argv.index("--config")
        plan = load_plan(run.argv[config + 1], run.argv[config + 2 :])
        for stage, orig in zip(plan.stages, base.stages):
            c = stage.config
            assert c.seed == run.seed
            for key in ("tasks", "train_data", "expert_data"):
                ds = getattr(c.buffer, key)
                assert ds is None or ds.seed == run.seed, (c.name, key)
            assert c.buffer.eval_tasks == orig.config.buffer.eval_tasks  # held out: untouched
            assert Path(c.run_dir()).parent == tmp_path / "runs" / "staged" / f"seed_{run.seed}"
        assert run.run_dirs == [Path(s.config.run_dir()) for s in plan.stages]
        assert run.total_steps == 10
    assert runs[0].hash != runs[1].hash


def test_the_run_identity_changes_with_the_plan_only(tmp_path):
    entry = Entry("g", "g", recipe=EXAMPLES / "grpo_add2.yaml")
    (first,), _ = recipe_runs(entry, [0], tmp_path, ["trainer.engine=local"], [])
    (again,), _ = recipe_runs(entry, [0], tmp_path, ["trainer.engine=local"], [])
    (other,), _ = recipe_runs(entry, [0], tmp_path, ["trainer.engine=local", "trainer.optimizer.lr=3e-5"], [])
    assert first.hash == again.hash != other.hash


def test_a_moved_comparison_keeps_its_identities_and_older_state_files_still_match(tmp_path):
    entry = Entry("g", "g", recipe=EXAMPLES / "grpo_add2.yaml")
    (here,), _ = recipe_runs(entry, [0], tmp_path / "a", ["trainer.engine=local"], [])
    (moved,), _ = recipe_runs(entry, [0], tmp_path / "b" / "deeper", ["trainer.engine=local"], [])
    assert here.hash == moved.hash and here.folder != moved.folder
    # a state file written before identities were relative (its hash named the absolute folder)
    assert here.same_plan(here.legacy_hash) and here.legacy_hash != moved.legacy_hash
    assert not moved.same_plan(here.legacy_hash) and not here.same_plan(None)
    (script,) = script_runs(Entry("s", "s", script="python loop.py --seed {seed} --log {run_dir}"), [0], tmp_path)
    assert script.identity["run_dir"] == "runs/s/seed_0" and script.same_plan(script.legacy_hash)


def test_a_recipe_that_does_not_validate_becomes_runs_with_its_error(tmp_path):
    entry = Entry("bad", "bad.yaml", recipe=EXAMPLES / "grpo_add2.yaml", overrides=("trainer.total_stepz=3",))
    runs, plan = recipe_runs(entry, [0, 1], tmp_path, [], [])
    assert plan is None and len(runs) == 2
    assert all(r.error and r.error.startswith("bad.yaml: ") and "total_stepz" in r.error for r in runs)
    assert "\n" not in runs[0].error


@pytest.mark.parametrize(
    "key", ["seed=3", "run_root=/tmp", "name=x", "buffer.tasks.seed=1", "stages.0.buffer.train_data.seed=2"]
)
def test_compare_owns_seeds_and_folders(key):
    with pytest.raises(ConfigError, match="compare sets it on every run"):
        check_not_owned([key])
    check_not_owned(["buffer.eval_tasks.seed=5", "trainer.total_steps=3"])  # a held-out seed is the user's


def test_entries_labels_and_scripts(tmp_path):
    recipe = str(EXAMPLES / "grpo_add2.yaml")
    entries = parse_entries([recipe, f"mine={recipe}"], ["python loop.py --seed {seed} --log-path {run_dir}"])
    assert [e.label for e in entries] == ["grpo_add2", "mine", "loop"]
    (run,) = script_runs(entries[2], [4], tmp_path)
    assert run.argv == ["python", "loop.py", "--seed", "4", "--log-path", str(tmp_path / "runs" / "loop" / "seed_4")]
    with pytest.raises(ConfigError, match="also"):
        parse_entries([recipe, recipe], [])
    with pytest.raises(ConfigError, match=r"needs \{run_dir\}"):
        parse_entries([recipe], ["python loop.py --seed {seed}"])
    with pytest.raises(ConfigError, match="at least two"):
        parse_entries([recipe], [])
    with pytest.raises(ConfigError, match="no such file"):
        parse_entries([recipe, "missing.yaml"], [])


def test_a_listing_names_recipes_with_their_own_overrides_and_scripts(tmp_path):
    listing = tmp_path / "compare.yaml"
    listing.write_text(
        f"runs:\n  - recipe: {EXAMPLES / 'grpo_add2.yaml'}\n"
        f"  - recipe: {EXAMPLES / 'grpo_add2.yaml'}\n    label: lr3e-5\n    set: [trainer.optimizer.lr=3.0e-5]\n"
        "  - script: python loop.py --seed {seed} --log-path {run_dir}\n    label: loop\n"
    )
    entries = parse_entries([str(listing)], [])
    assert [(e.label, e.overrides) for e in entries] == [
        ("grpo_add2", ()),
        ("lr3e-5", ("trainer.optimizer.lr=3.0e-5",)),
        ("loop", ()),
    ]
    diff = plan_diff(plans_of(tmp_path, *entries[:2]))
    assert diff == [("trainer.optimizer.lr", {"grpo_add2": 1e-05, "lr3e-5": 3e-05})]
    listing.write_text("runs:\n  - recipe: a.yaml\n    script: b\n")
    with pytest.raises(ConfigError, match="runs.0: give exactly one of recipe and script"):
        parse_entries([str(listing)], [])


def test_the_mul1_benchmark_listing_differs_in_what_dr_grpo_changes_only(tmp_path):
    listing = EXAMPLES.parent / "benchmarks" / "compare_mul1.yaml"
    entries = parse_entries([str(listing)], [])
    assert [e.label for e in entries] == ["grpo", "dr_grpo"]
    diff = dict(plan_diff(plans_of(tmp_path, *entries, sets=["trainer.engine=local"])))
    assert set(diff) == {
        "algorithm.type",
        "resolved.advantage.norm_by_std",
        "resolved.policy_loss.loss_agg_mode",
    }, diff


def test_the_rollout_correction_listing_differs_in_the_correction_only(tmp_path):
    listing = EXAMPLES.parent / "benchmarks" / "compare_rollout_correction.yaml"
    entries = parse_entries([str(listing)], [])
    names = ["token_tis", "seq_tis", "token_mis", "seq_mis", "geo_mask", "icepop"]
    assert [e.label for e in entries] == ["none", *names]
    sets = ["trainer.engine=local", "explorer.dtype=bfloat16", "model.dtype=float32"]
    diff = dict(plan_diff(plans_of(tmp_path, *entries, sets=sets)))
    assert set(diff) == {f"resolved.rollout_correction{k}" for k in ("", ".cap", ".lower", ".upper")}, diff
    assert list(diff["resolved.rollout_correction"].values())[1:] == names


def test_a_plugin_the_environment_loads_does_not_change_a_runs_identity(tmp_path, monkeypatch):
    entry = Entry("g", "g", recipe=EXAMPLES / "grpo_add2.yaml")
    (before,), _ = recipe_runs(entry, [0], tmp_path, ["trainer.engine=local"], [])
    example = EXAMPLES.parent / "plugins" / "example_plugin" / "src" / "example_plugin"
    monkeypatch.setenv("TRINITY_LIKE_PLUGINS", str(example))  # what load_plugins exports to child processes
    (after,), _ = recipe_runs(entry, [0], tmp_path, ["trainer.engine=local"], [])
    assert after.error is None and after.hash == before.hash
    (named,), _ = recipe_runs(entry, [0], tmp_path, ["trainer.engine=local"], [str(example)])
    assert named.hash != before.hash  # a plugin the comparison names is part of what it compares
