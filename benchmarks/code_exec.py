"""What the ``code_exec`` jail costs per call: the reward before and after issue #36, interleaved.

Three ways to score one programming task (``add(a, b)``, three unit-test lines, a passing
solution), each a real reward call, in one process:

- ``before``: the reward as it was (``git show <ref>:trinity_like/explorer/code_exec.py``,
  loaded as a module): ``unshare -n -p -f``, rlimits, the verdict counted inside the child;
- ``after``: this checkout's reward: the bwrap jail (as root: an outer bwrap and setpriv
  too), host-side verdicts;
- ``per line``: the alternative design of a fresh jail per test line (this checkout's
  reward called once per line), which the report argues against; its cost, measured.

Each round runs every variant ``--calls`` times, in a rotated order, and the medians over
``--rounds`` rounds are reported (tasks scored per second). Run::

    python benchmarks/code_exec.py                 # 5 rounds x 20 calls, about a minute here
    python benchmarks/code_exec.py --ref main

Results: ``benchmarks/results/code_exec.md`` and ``.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
sys.path.insert(0, str(ROOT))

from trinity_like.explorer import code_exec  # noqa: E402

CODE = "def add(a, b):\n    return a + b\n"
TESTS = ["assert add(2, 3) == 5", "assert add(-1, 1) == 0", "assert add(10, 5) == 15"]


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


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


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

    def per_line() -> int:
        return sum(after.run(CODE, [line]).passed for line in TESTS)

    variants = {
        "before": lambda: before.run(CODE, TESTS).passed,
        "after": lambda: after.run(CODE, TESTS).passed,
        "per line": per_line,
    }
    for name, call in variants.items():  # warm-up, and each variant scores the task right
        assert call() == len(TESTS), name
    rates: dict[str, list[float]] = {name: [] for name in variants}
    names = list(variants)
    for r in range(args.rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            t0 = time.perf_counter()
            for _ in range(args.calls):
                variants[name]()
            rates[name].append(args.calls / (time.perf_counter() - t0))
    median = {name: statistics.median(v) for name, v in rates.items()}
    result = {
        "cpu": cpu_name(),
        "cores": os.cpu_count(),
        "python": platform.python_version(),
        "as_root": os.geteuid() == 0,
        "ref_before": args.ref,
        "commit": subprocess.run(
            ["git", "describe", "--always", "--dirty=+dirty"], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip(),
        "rounds": args.rounds,
        "calls": args.calls,
        "tasks_per_s": rates,
        "median_tasks_per_s": median,
        "after_over_before": median["after"] / median["before"],
        "per_line_over_after": median["per line"] / median["after"],
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# code_exec: tasks scored per second, before and after the bwrap jail",
        "",
        f"Command: `python benchmarks/code_exec.py --rounds {args.rounds} --calls {args.calls}` "
        f"(before = `{args.ref}`, commit {result['commit']}); {result['cpu']}, {result['cores']} cores, "
        f"Python {result['python']}, {'as root' if result['as_root'] else 'not root'}.",
        "",
        "| variant | median tasks/s | per round |",
        "|---|---|---|",
        *(f"| {n} | {median[n]:.1f} | {', '.join(f'{x:.1f}' for x in rates[n])} |" for n in names),
        "",
        f"after / before: {result['after_over_before']:.2f}x; a jail per test line / after: "
        f"{result['per_line_over_after']:.2f}x ({len(TESTS)} test lines).",
    ]
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
