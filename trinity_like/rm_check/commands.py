"""``trinity-like rm-check`` and ``rm-pairs``: the command-line handlers (their parsers are in
:mod:`trinity_like.cli`). The heavy imports wait until a command runs."""

from __future__ import annotations

import argparse

from trinity_like.errors import TrinityError


def cmd_rm_check(args: argparse.Namespace) -> int:
    import json

    import yaml

    from trinity_like.runner import _quiet_libraries

    if (args.rm is None) == (args.reward_fn is None):
        raise TrinityError("rm-check: give a reward model (RM_RUN) or --reward-fn, not both and not neither")
    for name in ("samples", "num_tasks"):
        if getattr(args, name) < 1:
            raise TrinityError(f"rm-check: --{name.replace('_', '-')} must be at least 1")
    try:
        reward_args = yaml.safe_load(args.reward_args)
    except yaml.YAMLError as exc:
        raise TrinityError(f"rm-check: --reward-args is not YAML/JSON: {' '.join(str(exc).split())}") from None
    if not isinstance(reward_args, dict):
        raise TrinityError(f"rm-check: --reward-args must be a mapping, got {args.reward_args!r}")
    _quiet_libraries()
    from trinity_like.explorer.rewards import build_reward_fn
    from trinity_like.plugins import load_plugins
    from trinity_like.rm_check.check import check_setup, format_report, run_check

    load_plugins(args.plugin)
    setup = check_setup(
        args.tasks, num_tasks=args.num_tasks, model=args.model, verifier=args.verifier, plugins=args.plugin
    )
    if args.rm is not None:
        scorer, name = build_reward_fn("reward_model", {"path": args.rm}), args.rm
    else:
        scorer, name = build_reward_fn(args.reward_fn, reward_args), args.reward_fn
    report = run_check(setup, scorer, name, samples=args.samples)
    from pathlib import Path

    Path(args.out).write_text(json.dumps(report, indent=1))
    print(format_report(report))
    print(f"report: {args.out}")
    return 0


def cmd_rm_pairs(args: argparse.Namespace) -> int:
    import json

    from trinity_like.runner import _quiet_libraries

    for name in ("samples", "num_tasks", "num_eval_tasks"):
        if getattr(args, name) < 1:
            raise TrinityError(f"rm-pairs: --{name.replace('_', '-')} must be at least 1")
    _quiet_libraries()
    from trinity_like.plugins import load_plugins
    from trinity_like.rm_check.pairs import write_policy_pairs

    load_plugins(args.plugin)
    summary = write_policy_pairs(
        args.recipe,
        args.out,
        samples=args.samples,
        num_tasks=args.num_tasks,
        num_eval_tasks=args.num_eval_tasks,
        model=args.model,
        plugins=args.plugin,
        overrides=args.overrides,
    )
    for key in ("tasks", "eval_tasks"):
        print(f"{key}: {json.dumps(summary[key])}")
    print(f"pairs: {args.out}/pairs.jsonl, {args.out}/pairs_eval.jsonl")
    return 0
