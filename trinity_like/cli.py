"""The ``trinity-like`` command line.

    trinity-like run --config recipe.yaml [key.path=value ...] [--plugin P] [--dry-run]
    trinity-like validate recipe.yaml [key.path=value ...]
    trinity-like list [REGISTRY | models]
    trinity-like plot RUN_DIR [--out FILE]  |  trinity-like plot --timeline RUN_DIR [--last SECONDS]
    trinity-like view RUN_DIR [RUN_DIR ...] [--port N]
    trinity-like report RUN_DIR [RUN_DIR ...] --out FILE.html
    trinity-like export CHECKPOINT --out DIR [--base MODEL] [--dtype bfloat16]
    trinity-like serve [--port N] [--host H --api-key K] [--data-dir DIR] [--model M ...]
    trinity-like rm-check RM_RUN --tasks RECIPE_OR_TASKS [--samples N] [--out FILE.json]
    trinity-like rm-pairs RECIPE [key.path=value ...] --out DIR [--samples N] [--num-tasks N] [--num-eval-tasks N]
    trinity-like compare A.yaml B.yaml ... --seeds N [--set key=value ...] [--out DIR]  |  trinity-like version

A user error (bad recipe, bad data, unknown name, failing plugin) prints one line and
exits with status 2; ``--debug`` shows the traceback instead.
"""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from collections.abc import Sequence

from trinity_like.compare import cli as compare_cli
from trinity_like.errors import TrinityError
from trinity_like.rm_check import commands as rm_commands

EXIT_USAGE = 2


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse exits 2 too; keep it to one line
        sys.stderr.write(f"trinity-like: error: {message} (see --help)\n")
        raise SystemExit(EXIT_USAGE)


def _port(text: str) -> int:
    """A TCP port for ``view --port``: a whole number 1..65535."""
    try:
        port = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a port number: {text!r}") from None
    if not 1 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{port} is not a TCP port (1..65535)")
    return port


def _seconds(text: str) -> float:
    """A positive, finite number of seconds (``plot --last``)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text} is not a positive number of seconds")
    return value


def _add_common(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--plugin",
        action="append",
        default=[],
        metavar="P",
        help="plugin module, .py file or package folder to load (repeatable)",
    )
    p.add_argument("--debug", action="store_true", help="show tracebacks")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="trinity-like", description="Reinforcement fine-tuning of language models.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    run = sub.add_parser("run", help="run a recipe")
    run.add_argument("--config", "-c", required=True, help="recipe file (.yaml or .toml)")
    run.add_argument("overrides", nargs="*", metavar="key.path=value", help="override recipe values")
    run.add_argument("--dry-run", action="store_true", help="validate and print the resolved plan, run nothing")
    _add_common(run)

    val = sub.add_parser("validate", help="validate a recipe and exit")
    val.add_argument("config", help="recipe file (.yaml or .toml)")
    val.add_argument("overrides", nargs="*", metavar="key.path=value")
    _add_common(val)

    lst = sub.add_parser("list", help="list registered components (all registries, or one) and the built-in models")
    lst.add_argument("registry", nargs="?", help="e.g. POLICY_LOSS_FN, policy_loss_fn, task_source, or models")
    _add_common(lst)

    plot = sub.add_parser("plot", help="draw a run's curves (reward, accuracy, loss, phase times) as a PNG")
    plot.add_argument("run_dir", help="run directory, e.g. runs/grpo_arith")
    plot.add_argument("--out", help="PNG path (default: <run_dir>/metrics.png, or timeline.png)")
    plot.add_argument(
        "--timeline",
        action="store_true",
        help="draw when each actor (explorer, trainer) was busy, from <run_dir>/timeline.jsonl",
    )
    plot.add_argument("--last", type=_seconds, metavar="SECONDS", help="with --timeline: only the run's last SECONDS")
    plot.add_argument("--debug", action="store_true", help="show tracebacks")

    view = sub.add_parser(
        "view", help="a local web page over runs: curves, every rollout in the buffer, held-out answers"
    )
    view.add_argument(
        "run_dirs",
        nargs="+",
        metavar="RUN_DIR",
        help="run directories or trinity-like compare folders (several: curves overlaid)",
    )
    view.add_argument("--port", type=_port, default=8420, help="port on 127.0.0.1 (default 8420)")
    view.add_argument("--debug", action="store_true", help="show tracebacks")

    rep = sub.add_parser("report", help="the view's page as one self-contained HTML file (curves, sampled rollouts)")
    rep.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories or trinity-like compare folders")
    rep.add_argument("--out", required=True, help="HTML file to write")
    rep.add_argument("--debug", action="store_true", help="show tracebacks")

    exp = sub.add_parser(
        "export", help="write a checkpoint as a plain Hugging Face folder (a LoRA adapter merged into its base)"
    )
    exp.add_argument("checkpoint", help="a train engine's checkpoint folder (or a run's checkpoints/step_N)")
    exp.add_argument("--out", required=True, help="new folder to write (must not exist, or be empty)")
    exp.add_argument("--base", help="base model of a LoRA checkpoint, when not where its base_model.json says")
    exp.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        default="float32",
        help="dtype of the written weights (default float32, as trained; bfloat16 halves the folder)",
    )
    exp.add_argument("--debug", action="store_true", help="show tracebacks")

    srv = sub.add_parser(
        "serve",
        help="Tinker's HTTP protocol over our engines: the official tinker SDK runs "
        "against it with base_url=http://HOST:PORT",
    )
    srv.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1; others need --api-key)")
    srv.add_argument("--port", type=int, default=8000, help="TCP port (default 8000; 0: any free port)")
    key_help = "require this key (tml-...) on every request (default: $TRINITY_LIKE_SERVE_API_KEY)"
    srv.add_argument("--api-key", default=os.environ.get("TRINITY_LIKE_SERVE_API_KEY"), help=key_help)
    data_help = "where tinker:// checkpoints live (default: $TRINITY_LIKE_CACHE/serve or ~/.cache/trinity_like/serve)"
    srv.add_argument("--data-dir", default=None, help=data_help)
    model_help = "a model id or Hugging Face folder to list beside the built-ins (repeatable)"
    srv.add_argument("--model", action="append", default=[], metavar="M", help=model_help)
    srv.add_argument("--train-engine", default="local", help="local (in-process torch, default) or verl")
    for flag, kind, default, what in (  # the server's numbers; docs/serve.md's table says more
        ("--micro-batch-size", int, 8, "rows per forward/backward pass"),
        ("--max-pending", int, 512, "requests queued at once before HTTP 429"),
        ("--max-body-mb", float, 64.0, "largest request body in MiB"),
        ("--max-num-samples", int, 128, "most samples one sample request may ask for"),
        ("--max-batch-datums", int, 1024, "most datums in one forward_backward request (the SDK splits larger)"),
        ("--poll-seconds", float, 10.0, "how long a result fetch waits before the SDK is told to poll again"),
        ("--max-models", int, 4, "training clients held at once; more is HTTP 400"),
        ("--max-samplers", int, 8, "sampling sessions kept (least recently used let go first)"),
    ):
        srv.add_argument(flag, type=kind, default=default, help=f"{what} (default {default:g})")
    _add_common(srv)

    rmc = sub.add_parser(
        "rm-check",
        help="a reward model against the task's verifier on the starting policy's own "
        "samples: AUC overall, by format, within prompt groups; probes; length bias",
    )
    rmc.add_argument(
        "rm", nargs="?", metavar="RM_RUN", help="reward model folder or rm run directory (its latest checkpoint)"
    )
    rmc.add_argument(
        "--tasks",
        required=True,
        metavar="RECIPE_OR_TASKS",
        help="an RL recipe (its model, sampling, buffer.eval_tasks, eval_reward_fn) or a task file",
    )
    rmc.add_argument("--samples", type=int, default=8, help="samples per task (default 8)")
    rmc.add_argument("--num-tasks", type=int, default=64, help="held-out tasks used (the first N; default 64)")
    rmc.add_argument("--model", help="the policy to sample (default: the recipe's model.path)")
    rmc.add_argument(
        "--verifier", help="REWARD_FN of right/wrong (default: the recipe's eval_reward_fn, else exact_match)"
    )
    rmc.add_argument("--reward-fn", help="score with this REWARD_FN instead of RM_RUN (rm_ensemble, composite, ...)")
    rmc.add_argument("--reward-args", default="{}", help="its params, a YAML/JSON mapping (default {})")
    rmc.add_argument("--out", default="rm_check.json", help="JSON report to write (default rm_check.json)")
    _add_common(rmc)

    rmp = sub.add_parser(
        "rm-pairs",
        help="preference pairs (train and held-out) from the starting policy's own samples, "
        "labelled by the verifier: right vs wrong within a format and across formats",
    )
    rmp.add_argument("recipe", help="an RL recipe: its model, sampling, verifier, buffer.tasks and buffer.eval_tasks")
    rmp.add_argument("overrides", nargs="*", metavar="key.path=value", help="override recipe values")
    rmp.add_argument("--out", required=True, help="folder for pairs.jsonl, pairs_eval.jsonl and pairs.json")
    rmp.add_argument("--samples", type=int, default=8, help="samples per task (default 8)")
    rmp.add_argument(
        "--num-tasks", type=int, default=256, help="training tasks (the first N of buffer.tasks; default 256)"
    )
    rmp.add_argument("--num-eval-tasks", type=int, default=64, help="held-out tasks (of buffer.eval_tasks; default 64)")
    rmp.add_argument("--model", help="the policy to sample (default: the recipe's model.path)")
    _add_common(rmp)

    compare_cli.add_parser(sub)
    sub.add_parser("version", help="print versions")
    return parser


# -- commands ---------------------------------------------------------------------------
def cmd_version(_: argparse.Namespace) -> int:
    import platform

    import trinity_like

    print(f"trinity-like {trinity_like.__version__} (python {platform.python_version()})")
    return 0


MODELS = "MODELS"  # the `list` section of built-in model ids (`model.path`), beside the registries


def _print_section(title: str, entries: list[tuple[str, str]]) -> None:
    print(f"{title} ({len(entries)})")
    width = max((len(n) for n, _ in entries), default=0)
    for name, desc in entries:
        print(f"  {name.ljust(width)}  {desc or '(no description)'}")


def cmd_list(args: argparse.Namespace) -> int:
    from trinity_like.models.resolve import BUILTIN_MODELS
    from trinity_like.plugins import load_plugins
    from trinity_like.registry import REGISTRIES, UnknownNameError, find_registry

    load_plugins(args.plugin)
    wants_models = args.registry is not None and args.registry.upper() == MODELS
    if args.registry is None or not wants_models:
        try:
            regs = [find_registry(args.registry)] if args.registry else list(REGISTRIES.values())
        except UnknownNameError as exc:
            close = difflib.get_close_matches(args.registry.upper(), [MODELS], n=1, cutoff=0.6)
            raise UnknownNameError(f"did you mean 'models'? ({exc})" if close else f"{exc}, or 'models'") from None
        for reg in regs:
            _print_section(reg.name, [(name, reg.describe(name)) for name in reg.names()])
    if args.registry is None or wants_models:
        _print_section(MODELS, [(name, m.description) for name, m in sorted(BUILTIN_MODELS.items())])
    return 0


def cmd_validate(args: argparse.Namespace) -> int:
    from trinity_like.config import load_plan

    plan = load_plan(args.config, args.overrides, args.plugin)
    print(f"{args.config}: ok ({len(plan.stages)} stage{'s' if len(plan.stages) != 1 else ''})")
    return 0


def cmd_run(args: argparse.Namespace) -> int:
    from trinity_like import stopping, threads

    if not args.dry_run:  # before torch loads: OpenMP reads its wait policy once; a plan starts no threads
        threads.apply()  # (trinity_like/threads.py: it watches the machine for a quarter second)
    from trinity_like.config import describe_plan, load_plan
    from trinity_like.runner import probe_recipe, stopped_line

    with stopping.taking_signals():  # SIGINT and SIGTERM: one line, what was kept, 128 + signal
        try:
            if not args.dry_run:  # a run directory in use refuses at once, before models and plugins load
                probe_recipe(args.config, args.overrides)
            plan = load_plan(args.config, args.overrides, args.plugin)
        except stopping.StopRequested as exc:
            sys.stderr.write(stopped_line(exc, None) + "\n")
            return exc.exit_status
        if args.dry_run:
            print(describe_plan(plan))
            return 0
        from trinity_like.runner import run_plan

        return run_plan(plan)


def cmd_plot(args: argparse.Namespace) -> int:
    from trinity_like.monitor.plot import plot_run, plot_timeline

    if args.timeline:
        print(plot_timeline(args.run_dir, args.out, args.last))
        return 0
    if args.last is not None:
        raise TrinityError("plot: --last applies to --timeline only")
    print(plot_run(args.run_dir, args.out))
    return 0


def cmd_view(args: argparse.Namespace) -> int:
    from trinity_like.view.server import serve

    serve(args.run_dirs, args.port)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from trinity_like.view.report import write_report

    print(write_report(args.run_dirs, args.out))
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers.utils import logging as hf_logging

    from trinity_like.pipeline.checkpoint import verify_export_source
    from trinity_like.trainer.lora import export_checkpoint

    hf_logging.disable_progress_bar()  # the one line printed is the folder written
    verify_export_source(args.checkpoint)  # its manifest, no pickle or link, every file parses: before any write
    if args.dtype == "float32":  # the engines' own dtype: written as trained
        print(export_checkpoint(args.checkpoint, args.out, args.base))
        return 0
    import shutil
    import tempfile
    from pathlib import Path

    import torch
    from transformers import AutoModelForCausalLM

    out = Path(args.out)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TrinityError(f"{out} already exists and is not an empty folder; choose another --out")
    out.parent.mkdir(parents=True, exist_ok=True)
    staged = Path(tempfile.mkdtemp(prefix=f".{out.name}.{args.dtype}-", dir=out.parent))
    try:  # exported, cast, then renamed into place: a failure leaves nothing under --out
        export_checkpoint(args.checkpoint, staged, args.base)
        model = AutoModelForCausalLM.from_pretrained(staged, dtype=getattr(torch, args.dtype))
        for old in [*staged.glob("*.safetensors"), *staged.glob("*.safetensors.index.json")]:
            old.unlink()  # the model holds its own cast copies
        model.save_pretrained(staged)  # the config says the new dtype
        if out.exists():
            out.rmdir()  # empty, checked above
        os.replace(staged, out)
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    print(out)
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from pathlib import Path

    from trinity_like.client.serve import ServeParams, serve
    from trinity_like.models.resolve import CACHE_ENV
    from trinity_like.plugins import load_plugins

    load_plugins(args.plugin)
    root = os.environ.get(CACHE_ENV)
    default_dir = (Path(root).expanduser() if root else Path.home() / ".cache" / "trinity_like") / "serve"
    params = ServeParams(
        data_dir=Path(args.data_dir) if args.data_dir else default_dir,
        host=args.host,
        port=args.port,
        api_key=args.api_key,
        max_body_bytes=int(args.max_body_mb * 2**20),
        max_pending=args.max_pending,
        train_engine=args.train_engine,
        micro_batch_size=args.micro_batch_size,
        models=tuple(args.model),
        poll_seconds=args.poll_seconds,
        max_num_samples=args.max_num_samples,
        max_batch_datums=args.max_batch_datums,
        max_models=args.max_models,
        max_samplers=args.max_samplers,
    )
    serve(params)
    return 0


COMMANDS = {
    "run": cmd_run,
    "validate": cmd_validate,
    "list": cmd_list,
    "plot": cmd_plot,
    "view": cmd_view,
    "report": cmd_report,
    "export": cmd_export,
    "serve": cmd_serve,
    "rm-check": rm_commands.cmd_rm_check,
    "rm-pairs": rm_commands.cmd_rm_pairs,
    "compare": compare_cli.run,
    "version": cmd_version,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    debug = getattr(args, "debug", False) or "--debug" in (argv if argv is not None else sys.argv)
    try:
        status = COMMANDS[args.command](args)
    except TrinityError as exc:
        if debug:
            raise
        msg = " ".join(str(exc).split("\n"))
        sys.stderr.write(f"trinity-like: error: {msg}\n")
        return EXIT_USAGE
    except KeyboardInterrupt:
        sys.stderr.write("trinity-like: interrupted\n")
        return 130
    except BrokenPipeError:  # the reader left early (`trinity-like list | head`): nothing went wrong here
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush stays quiet
        return 0
    if argv is None and args.command == "run":  # the command itself, not a caller in Python
        from trinity_like import stopping

        if stopping.was_stopped():
            stopping.exit_now(status)
    return status


if __name__ == "__main__":
    sys.exit(main())
