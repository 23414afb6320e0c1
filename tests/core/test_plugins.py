"""Plugin loading: entry points, module names, files and folders, failures, child processes.

Plugin loading is process-global, so each case runs in a fresh interpreter.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "plugins" / "example_plugin"

LOSS_SRC = textwrap.dedent(
    '''
    """A test plugin."""
    from trinity_like.registry import POLICY_LOSS_FN

    @POLICY_LOSS_FN.register_module("{name}")
    def loss(*, logprob, action_mask):
        """Test loss {name}."""
        return (-(logprob * action_mask).sum(), {{}})
    '''
)


def run_py(code: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=300,
    )


def cli(*args: str, env: dict | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", *args],
        capture_output=True,
        text=True,
        env=full_env,
        cwd=cwd,
        timeout=300,
    )


@pytest.mark.parametrize("pack", ["algorithms", "cookbook"])
def test_first_party_pack_is_loaded_through_its_entry_point(pack):
    r = run_py(
        f"""
        import sys
        from trinity_like.plugins import entry_points, load_plugins
        names = [e.name for e in entry_points()]
        assert {pack!r} in names, names
        import trinity_like.builtins, trinity_like.registry
        assert {pack!r} not in sys.modules  # nothing in the core imports it
        loaded = load_plugins()
        assert any(k.startswith("entry-point:{pack}=") for k in loaded), loaded
        assert {pack!r} in sys.modules
        """
    )
    assert r.returncode == 0, r.stderr


def test_module_file_and_folder_plugins_resolve_and_reach_child_processes(tmp_path):
    (tmp_path / "mod_plugin.py").write_text(LOSS_SRC.format(name="from_module"))
    (tmp_path / "file_plugin.py").write_text(LOSS_SRC.format(name="from_file"))
    pkg = tmp_path / "folder_plugin"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from . import impl\n")
    (pkg / "impl.py").write_text(LOSS_SRC.format(name="from_folder"))
    r = run_py(
        f"""
        import subprocess, sys
        sys.path.insert(0, {str(tmp_path)!r})
        from trinity_like.plugins import load_plugins
        from trinity_like.registry import POLICY_LOSS_FN
        load_plugins(["mod_plugin", {str(tmp_path / "file_plugin.py")!r}, {str(pkg)!r}])
        load_plugins(["mod_plugin"])  # loading twice is a no-op, not a duplicate error
        for n in ("from_module", "from_file", "from_folder"):
            assert POLICY_LOSS_FN.describe(n) == f"Test loss {{n}}.", n
        # A child process inherits TRINITY_LIKE_PLUGINS and sees the same names.
        child = "from trinity_like.registry import POLICY_LOSS_FN as R; R.get('from_file'); R.get('from_folder')"
        subprocess.run([sys.executable, "-c", child], check=True, env={{**__import__('os').environ, "PYTHONPATH": {str(tmp_path)!r}}})
        """
    )
    assert r.returncode == 0, r.stderr


def test_failing_plugin_stops_with_its_real_error(tmp_path):
    bad = tmp_path / "broken_plugin.py"
    bad.write_text("x = 1\nraise ZeroDivisionError('plugin exploded')\n")
    r = run_py(
        f"""
        from trinity_like.plugins import load_plugins
        from trinity_like.errors import PluginError
        try:
            load_plugins([{str(bad)!r}])
        except PluginError as exc:
            assert isinstance(exc.__cause__, ZeroDivisionError)
            assert "ZeroDivisionError: plugin exploded" in str(exc), str(exc)
            assert "broken_plugin.py:2" in str(exc), str(exc)
        else:
            raise SystemExit("no error")
        """
    )
    assert r.returncode == 0, r.stderr + r.stdout
    out = cli("list", "--plugin", str(bad))
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "plugin exploded" in out.stderr and "Traceback" not in out.stderr


def test_missing_plugin_is_a_clear_error(tmp_path):
    out = cli("list", "--plugin", "no_such_plugin_pkg")
    assert out.returncode == 2
    assert "plugin 'no_such_plugin_pkg' not found" in out.stderr
    out = cli("list", "--plugin", str(tmp_path / "nope.py"))
    assert out.returncode == 2 and "no such module" in out.stderr


def test_plugin_import_error_inside_plugin_is_not_reported_as_missing(tmp_path):
    (tmp_path / "needs_dep.py").write_text("import a_dependency_that_is_not_installed\n")
    out = cli("list", "--plugin", "needs_dep", env={"PYTHONPATH": str(tmp_path)})
    assert out.returncode == 2
    assert "ModuleNotFoundError" in out.stderr and "a_dependency_that_is_not_installed" in out.stderr


@pytest.mark.slow
def test_example_plugin_installs_and_resolves_like_first_party(tmp_path):
    target = tmp_path / "site"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--disable-pip-version-check",
            "--target",
            str(target),
            str(EXAMPLE),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    env = {"PYTHONPATH": str(target)}
    out = cli("list", "POLICY_LOSS_FN", env=env)
    assert out.returncode == 0, out.stderr
    assert "tis_reinforce" in out.stdout and "truncated importance weight" in out.stdout
    out = cli("list", "algorithm_type", env=env)
    assert "grpo_tis" in out.stdout
    r = run_py(
        """
        from trinity_like.registry import ALGORITHM_TYPE, POLICY_LOSS_FN
        algo = ALGORITHM_TYPE.get("grpo_tis")
        assert POLICY_LOSS_FN.get(algo.policy_loss).__module__ == "example_plugin"
        """,
        env=env,
    )
    assert r.returncode == 0, r.stderr
    # Nothing was written into site-packages: the plugin lives only in the target folder. Asked of a
    # fresh interpreter: this worker's sys.path may hold the plugin's source folder, which another
    # test loaded by path (--plugin) in this process.
    r = run_py("import importlib.util, sys; sys.exit(importlib.util.find_spec('example_plugin') is not None)")
    assert r.returncode == 0, "example_plugin is importable without the target folder: " + r.stderr


def test_example_plugin_runs_from_a_path_without_installing():
    src = EXAMPLE / "src" / "example_plugin"
    out = cli("list", "policy_loss_fn", "--plugin", str(src))
    assert out.returncode == 0, out.stderr
    assert "tis_reinforce" in out.stdout


@pytest.mark.slow
def test_ray_workers_load_the_same_plugins(tmp_path):
    (tmp_path / "ray_plugin.py").write_text(LOSS_SRC.format(name="seen_by_ray"))
    r = run_py(
        f"""
        import ray
        from trinity_like.plugins import load_plugins, ray_runtime_env
        load_plugins([{str(tmp_path / "ray_plugin.py")!r}])
        ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False, runtime_env=ray_runtime_env())
        try:
            @ray.remote
            def lookup():
                from trinity_like.registry import POLICY_LOSS_FN
                return POLICY_LOSS_FN.describe("seen_by_ray")
            assert ray.get(lookup.remote()) == "Test loss seen_by_ray."
        finally:
            ray.shutdown()
        """,
        env={"RAY_AUTH_MODE": "disabled"},
    )
    assert r.returncode == 0, r.stderr[-3000:]


def test_example_plugin_loss_is_truncated_importance_weighted_reinforce():
    src = EXAMPLE / "src" / "example_plugin"
    r = run_py(
        f"""
        import torch
        from trinity_like.plugins import load_plugins
        from trinity_like.registry import POLICY_LOSS_FN
        from trinity_like.components import build_params, call_component
        load_plugins([{str(src)!r}])
        fn = POLICY_LOSS_FN.get("tis_reinforce")
        lp = torch.tensor([[-1.0, -2.0], [-0.5, -3.0]], dtype=torch.float64, requires_grad=True)
        old = torch.tensor([[-1.0, -4.0], [-0.5, -3.0]], dtype=torch.float64)  # token (0,1): ratio e^2 > C=2
        adv = torch.tensor([[1.0, 1.0], [-2.0, -2.0]], dtype=torch.float64)
        mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]], dtype=torch.float64)
        loss, m = call_component(fn, dict(logprob=lp, old_logprob=old, advantages=adv, action_mask=mask),
                                 build_params(fn, {{"truncation": 2.0}}))
        loss.backward()
        # by hand: d loss / d logprob_t = -min(ratio_t, C) * A_t * mask_t / 3 tokens
        expected = -torch.tensor([[1.0, 2.0], [1.0, 0.0]], dtype=torch.float64) * adv * mask / 3
        assert torch.allclose(lp.grad, expected), lp.grad
        assert abs(m["tis/truncated_frac"] - 1 / 3) < 1e-6
        """
    )
    assert r.returncode == 0, r.stderr


ENV_SRC = textwrap.dedent(
    '''
    """A plugin another plugin imports."""
    from trinity_like.registry import POLICY_LOSS_FN

    @POLICY_LOSS_FN.register_module("shared_loss")
    def loss(*, logprob, action_mask):
        """Registered once, however the file is reached."""
        return (-(logprob * action_mask).sum(), {})
    '''
)
USER_SRC = "import my_env  # noqa: F401  (a plugin that uses its sibling)\n"


@pytest.mark.parametrize("order", ["user_first", "imported_first"])
def test_a_plugin_file_imported_by_another_plugin_is_loaded_once(tmp_path, order):
    (tmp_path / "my_env.py").write_text(ENV_SRC)
    (tmp_path / "my_plugin.py").write_text(USER_SRC)
    listed = ["./my_plugin.py", "./my_env.py"] if order == "user_first" else ["./my_env.py", "./my_plugin.py"]
    recipe = "name: r\nbuffer:\n  tasks:\n    generator: arithmetic\nplugins:\n" + "".join(f"  - {p}\n" for p in listed)
    (tmp_path / "r.yaml").write_text(recipe)
    # the recipe's folder is on sys.path (the working directory), as when the researcher ran it
    out = cli("run", "--config", "r.yaml", "--dry-run", "model.path=tiny-random", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    r = run_py(
        f"""
        import sys
        sys.path.insert(0, {str(tmp_path)!r})
        from trinity_like.plugins import load_plugins
        from trinity_like.registry import POLICY_LOSS_FN
        load_plugins({[str(tmp_path / p) for p in listed]!r})
        load_plugins([{str(tmp_path / "my_env.py")!r}, "my_env"])  # by another spelling: still that module
        import my_env
        assert POLICY_LOSS_FN.get("shared_loss") is my_env.loss
        assert [m for m in sys.modules.values() if getattr(m, "__file__", None) == my_env.__file__] == [my_env]
        """
    )
    assert r.returncode == 0, r.stderr


def test_a_listed_file_a_later_plugin_imports_is_that_module_without_sys_path(tmp_path):
    """The folder is not on sys.path: a file listed first is importable by its own name for the plugins after it."""
    (tmp_path / "my_env.py").write_text(ENV_SRC)
    (tmp_path / "my_plugin.py").write_text(USER_SRC)
    r = run_py(
        f"""
        import sys
        from trinity_like.plugins import load_plugins
        from trinity_like.registry import POLICY_LOSS_FN
        load_plugins([{str(tmp_path / "my_env.py")!r}, {str(tmp_path / "my_plugin.py")!r}])
        assert POLICY_LOSS_FN.get("shared_loss") is sys.modules["my_env"].loss
        """,
        cwd=tmp_path.parent,
    )
    assert r.returncode == 0, r.stderr


def test_two_files_with_one_name_still_load_apart(tmp_path):
    for folder, name in (("a", "loss_a"), ("b", "loss_b")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "plugin.py").write_text(LOSS_SRC.format(name=name))
    r = run_py(
        f"""
        from trinity_like.plugins import load_plugins
        from trinity_like.registry import POLICY_LOSS_FN
        load_plugins([{str(tmp_path / "a" / "plugin.py")!r}, {str(tmp_path / "b" / "plugin.py")!r}])
        assert POLICY_LOSS_FN.describe("loss_a") == "Test loss loss_a." and POLICY_LOSS_FN.describe("loss_b")
        """
    )
    assert r.returncode == 0, r.stderr


def test_a_true_duplicate_names_both_places_and_does_not_suggest_force(tmp_path):
    (tmp_path / "first.py").write_text(LOSS_SRC.format(name="twice"))
    (tmp_path / "second.py").write_text(LOSS_SRC.format(name="twice"))
    out = cli("list", "--plugin", str(tmp_path / "first.py"), "--plugin", str(tmp_path / "second.py"))
    assert out.returncode == 2 and out.stderr.count("\n") == 1, out.stderr
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    assert f"the name 'twice' is already registered by first.loss ({first}:5)" in out.stderr, out.stderr
    assert f"registered again by second.loss ({second}:5): give one of them another name" in out.stderr
    assert "force" not in out.stderr
