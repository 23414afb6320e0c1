"""What a ``code_exec`` call costs: the reward at ``--ref`` and this checkout's, interleaved.

Two tasks, each scored by real reward calls with a passing solution, in one process:
``add(a, b)`` with three value tests, and the same function with the nine lines of
tests/faults/test_code_exec_forgery.py (value, bare-assert, statement and loop tests, one
``assert False``). Each is scored two ways:

- ``before``: the reward at ``--ref`` (``git show <ref>:trinity_like/explorer/code_exec.py``,
  loaded as a module; at issue 43's start: the bwrap jail, the child's report judged by the
  host where a line has a literal);
- ``after``: this checkout's reward: the same jail, the host running every test line and
  asking the jail for the code's values (one round trip per value).

Each round runs every variant ``--calls`` times, in a rotated order, and the medians over
``--rounds`` rounds are reported (tasks scored per second). Run::

    python benchmarks/code_exec.py                 # 5 rounds x 20 calls, about a minute here
    python benchmarks/code_exec.py --ref main

Results: ``benchmarks/results/code_exec.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import sys
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, ROOT, cpu_model, git_commit, interleaved, md_table, timer, write_results  # noqa: E402

sys.path.insert(0, str(ROOT))
from trinity_like.explorer import code_exec  # noqa: E402

CODE = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]
NINE = [
    "assert False",
    "assert add(2, 3) == 5",
    "assert [0, 0, 0, 0, 1][add(2, 2)]",
    "assert not [1, 1, 1, 0, 1][add(1, 2)]",
    "x = {5: 'ok'}[add(2, 3)]",
    "assert x == 'ok'",
    "for i in range(1, 4): assert add(i, i) == 2 * i",
    "s = str({42: add(20, 22)}[add(20, 22)])",
    "assert s == '42'",
]


def module_at(ref: str) -> types.ModuleType:
    """``trinity_like/explorer/code_exec.py`` as it was at ``ref``, loaded under another name."""
    source = subprocess.run(
        ["git", "show", f"{ref}:trinity_like/explorer/code_exec.py"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    module = types.ModuleType("code_exec_before")
    module.__file__ = f"{ref}:trinity_like/explorer/code_exec.py"
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, module.__file__, "exec"), module.__dict__)
    return module


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="main", help="the commit whose code_exec.py is 'before' (default: main)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--calls", type=int, default=20, help="tasks scored per variant per round")
    ap.add_argument("--out", type=Path, default=RESULTS / "code_exec")
    args = ap.parse_args(argv)

    old = module_at(args.ref)
    before = old.CodeExecReward(params=old.CodeExecParams())
    after = code_exec.CodeExecReward(params=code_exec.CodeExecParams())

    variants = {
        "before, 3 lines": lambda: before.run(CODE, TESTS).passed,
        "after, 3 lines": lambda: after.run(CODE, TESTS).passed,
        "before, 9 lines": lambda: before.run(CODE, NINE).passed,
        "after, 9 lines": lambda: after.run(CODE, NINE).passed,
    }
    expected = {"3 lines": len(TESTS), "9 lines": len(NINE) - 1}
    for name, call in variants.items():  # warm-up, and each variant scores the task right
        assert call() == expected[name.split(", ")[1]], name

    def rate(name: str, _round: int) -> float:
        return args.calls / timer(lambda: [variants[name]() for _ in range(args.calls)])

    names = list(variants)
    rates = interleaved(rate, names, args.rounds, rotate=True)
    median = {name: statistics.median(v) for name, v in rates.items()}
    result = {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "as_root": os.geteuid() == 0,
        "ref_before": args.ref,
        "commit": git_commit(),
        "rounds": args.rounds,
        "calls": args.calls,
        "tasks_per_s": rates,
        "median_tasks_per_s": median,
        "median_ms_per_call": {name: 1000 / rate for name, rate in median.items()},
        "after_over_before": {n: median[f"after, {n}"] / median[f"before, {n}"] for n in expected},
    }
    rows = [[n, f"{median[n]:.1f}", f"{1000 / median[n]:.1f}", ", ".join(f"{x:.1f}" for x in rates[n])] for n in names]
    lines = [
        "# code_exec: tasks scored per second, before and after the host runs the test lines",
        "",
        f"Command: `python benchmarks/code_exec.py --rounds {args.rounds} --calls {args.calls}` "
        f"(before = `{args.ref}`, commit {result['commit']}); {result['cpu']}, {result['cores']} cores, "
        f"Python {result['python']}, {'as root' if result['as_root'] else 'not root'}.",
        "",
        *md_table(["variant", "median tasks/s", "ms per call", "per round (tasks/s)"], rows),
        "",
        "after / before (rate): "
        + "; ".join(f"{n}: {r:.2f}x" for n, r in result["after_over_before"].items())
        + ". The 9-line task's `assert False` fails in both: 8 of 9 lines pass.",
    ]
    print(write_results(args.out, result, lines, indent=2), end="")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
