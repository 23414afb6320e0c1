"""Rollout throughput: our engine vs ``transformers`` ``generate``, interleaved in one run.

A GRPO-shaped workload -- P prompts x G samples, up to N new tokens, temperature 1.0 --
on the same model, prompts and sampling distribution (``generate`` with ``top_k=0,
top_p=1.0``, which otherwise defaults to top-k 50). Four contenders per repetition, in
rotating order so load drifts on a shared machine hit all of them alike:

- ``ours``: :class:`NativeEngine` (prefill once per group, slot KV cache, continuous
  batching, per-token logprobs always returned);
- ``generate``: ``model.generate(num_return_sequences=G)`` with the KV cache on;
- ``generate+logprobs``: the same with ``output_scores`` and per-token logprob extraction,
  which is what an RL trainer needs from it;
- ``generate-compiled``: ``generate`` with a static cache and its decode step compiled by
  ``torch.compile`` (transformers' ``CompileConfig``, told to compile on a CPU too), the
  compiled ``generate`` a user would try next; compiled once, before the repetitions (the
  compile time is reported apart).

Generated tokens are counted the same way for all: response tokens up to and including
the first stop token. Reported: medians over repetitions of tokens/s, and the median of
the per-repetition ratios ours / generate (ratios are fair under load; absolute times
are not). Run (about 10 minutes on one core)::

    python benchmarks/rollout.py --reps 3 --precision both    # fp32 and bf16 (weights, KV cache), interleaved
    python benchmarks/rollout.py --tiny                       # seconds (a test runs it)

``--ab DIR`` times our engine alone against the engine of another checkout ``DIR`` (e.g. the
commit before a change: ``git worktree add /tmp/base main``), same workload, each run in its own
process with that checkout's ``trinity_like`` first on ``PYTHONPATH``, alternating which side goes
first; writes ``OUT_ab.{md,json}``::

    python benchmarks/rollout.py --ab /tmp/base --reps 3 --models tiny-random smollm2-135m-instruct
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from functools import partial
from pathlib import Path

import torch

from trinity_like.explorer.engine import NativeEngine, SamplingParams
from trinity_like.models import load_model, render_prompt

sys.path.insert(0, str(Path(__file__).parent))
from harness import command as command_line  # noqa: E402
from harness import cpu_model, cpu_name, git_commit, interleaved, md_table, write_results  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def build_prompts(tokenizer, count: int) -> list[list[int]]:
    """'What is a + b?' prompts under the model's default chat template (as in baselines.md)."""
    out = []
    for i in range(count):
        a, b = 10 + (37 * i) % 90, 1 + (5 * i) % 9
        msg = [{"role": "user", "content": f"What is {a} + {b}? Answer with just the number."}]
        out.append(render_prompt(tokenizer, msg))
    return out


def count_response_tokens(rows: list[list[int]], stop_ids: set[int]) -> int:
    """Tokens up to and including the first stop token of each row (the rest is padding)."""
    return sum(next((i + 1 for i, token in enumerate(row) if token in stop_ids), len(row)) for row in rows)


def run_ours(engine: NativeEngine, prompts, group: int, max_new: int, seed: int) -> dict:
    engine.reset_timings()
    t0 = time.perf_counter()
    groups = engine.generate(prompts, SamplingParams(n=group, max_new_tokens=max_new, temperature=1.0, seed=seed))
    wall = time.perf_counter() - t0
    tokens = sum(len(s.token_ids) for g in groups for s in g)
    return {"wall_s": wall, "tokens": tokens, "split_s": dict(engine.timings)}


def compile_config():
    """``generate``'s compile settings, with compilation allowed off CUDA (transformers compiles only on
    accelerators unless told; its ``_compile_all_devices`` flag is how it tests the CPU path)."""
    from transformers import CompileConfig

    config = CompileConfig(fullgraph=False, mode="default")
    config._compile_all_devices = True
    return config


def run_generate(
    model, tokenizer, prompts, group: int, max_new: int, seed: int, logprobs: bool, compiled: bool = False
) -> dict:
    stop_ids = {tokenizer.eos_token_id}
    width = max(len(p) for p in prompts)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(
            input_ids=ids,
            attention_mask=mask,
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=max_new,
            num_return_sequences=group,
            pad_token_id=pad,
            eos_token_id=sorted(stop_ids),
            return_dict_in_generate=logprobs,
            output_scores=logprobs,
            **({"cache_implementation": "static", "compile_config": compile_config()} if compiled else {}),
        )
        if logprobs:
            seqs = out.sequences
            scores = model.compute_transition_scores(seqs, out.scores, normalize_logits=True)
            assert scores.shape[1] == seqs.shape[1] - width
        else:
            seqs = out
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "tokens": count_response_tokens(seqs[:, width:].tolist(), stop_ids)}


SUFFIX = {"fp32": "", "bf16": "-bf16"}  # contender names per precision: ours, ours-bf16, ...
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
BASES = ("generate", "generate+logprobs", "generate-compiled")


def precisions_of(args) -> tuple[str, ...]:
    """``--precision`` as a tuple (``--bf16``: both, as before)."""
    chosen = "both" if getattr(args, "bf16", False) else getattr(args, "precision", "fp32")
    return tuple(SUFFIX) if chosen == "both" else (chosen,)


def bench_model(ref: str, args) -> dict:
    """Every contender in every precision asked (both sides in the same dtype: weights, KV cache,
    ``generate``'s model), interleaved; medians and per-repetition ratios ours / ``generate``."""
    contenders, warm_ups, engines, params, compile_s = {}, [], {}, 0.0, {}
    g, n = args.group, args.max_new_tokens
    for precision in precisions_of(args):
        model, tokenizer = load_model(ref, dtype=DTYPES[precision])
        params = sum(p.numel() for p in model.parameters()) / 1e6
        prompts = build_prompts(tokenizer, args.prompts)  # the same token ids in every precision
        engine = engines[precision] = NativeEngine(model, tokenizer)
        x = SUFFIX[precision]
        contenders[f"ours{x}"] = partial(run_ours, engine, prompts, g, n)
        contenders[f"generate{x}"] = partial(run_generate, model, tokenizer, prompts, g, n, logprobs=False)
        contenders[f"generate+logprobs{x}"] = partial(run_generate, model, tokenizer, prompts, g, n, logprobs=True)
        compiled = partial(run_generate, model, tokenizer, prompts, g, n, logprobs=False, compiled=True)
        contenders[f"generate-compiled{x}"] = compiled
        warm_ups += [  # first calls allocate and pick kernels
            partial(run_ours, engine, prompts[:2], 2, 4, 0),
            partial(run_generate, model, tokenizer, prompts[:2], 2, 4, 0, logprobs=False),
        ]
    for warm_up in warm_ups:
        warm_up()
    for name in [c for c in contenders if c.startswith("generate-compiled")]:  # compiles at the workload's shapes
        compile_s[name] = contenders[name](0)["wall_s"]
        model = contenders[name].args[0]
        assert getattr(model, "_compiled_call", None) is not None, f"{name}: generate did not compile its forward"
        print(f"{ref} {name}: compiled and ran once in {compile_s[name]:.1f} s", file=sys.stderr, flush=True)
    names = list(contenders)

    def run(name: str, rep: int) -> dict:
        result = contenders[name](1000 + rep)
        result["tokens_per_s"] = result["tokens"] / result["wall_s"]
        print(
            f"{ref} rep {rep} {name}: {result['tokens']} tokens in {result['wall_s']:.2f} s "
            f"= {result['tokens_per_s']:.1f} tok/s",
            file=sys.stderr,
            flush=True,
        )
        return result

    runs = interleaved(run, names, args.reps, rotate=True)
    summary = {
        n: {
            "tokens_per_s": statistics.median(r["tokens_per_s"] for r in runs[n]),
            "wall_s": statistics.median(r["wall_s"] for r in runs[n]),
            "tokens": statistics.median(r["tokens"] for r in runs[n]),
        }
        for n in names
    }
    for precision in engines:
        x = SUFFIX[precision]
        ours = summary[f"ours{x}"]
        for base in BASES:
            ratios = [o["tokens_per_s"] / b["tokens_per_s"] for o, b in zip(runs[f"ours{x}"], runs[f"{base}{x}"])]
            ours[f"ratio_vs_{base}{x}"] = statistics.median(ratios)
            ours[f"ratios_vs_{base}{x}"] = ratios
        split = runs[f"ours{x}"][0]["split_s"]
        ours["split_s"] = {k: statistics.median(r["split_s"][k] for r in runs[f"ours{x}"]) for k in split}
    if len(engines) == 2:  # ours in bf16 against ours in fp32, per repetition
        ratios = [b["tokens_per_s"] / f["tokens_per_s"] for b, f in zip(runs["ours-bf16"], runs["ours"])]
        summary["ours-bf16"]["ratio_vs_ours"] = statistics.median(ratios)
    for name, seconds in compile_s.items():
        summary[name]["compile_and_first_call_s"] = seconds
    return {
        "model": ref,
        "params_m": params,
        "prompt_tokens": [len(p) for p in prompts],
        "summary": summary,
        "runs": runs,
    }


def markdown(results: list[dict], args, command: str, commit: str) -> str:
    lines = [
        "# Rollout throughput: our engine vs `transformers` `generate`",
        "",
        f"Command: `{command}`",
        "",
        f"Workload: {args.prompts} prompts x group {args.group}, up to {args.max_new_tokens} new tokens, "
        f"temperature 1.0, top_k=0, top_p=1.0; torch threads {args.threads}; {args.reps} interleaved repetitions "
        f"(medians). Machine: {cpu_name()}, torch {torch.__version__}, shared "
        f"with other jobs -- compare ratios, not absolute times. Code measured: commit {commit}.",
        "",
        "tokens/s, wall and tokens: medians per contender; `ours / this`: median of the per-repetition ratios "
        "of tokens/s. Tokens counted alike: response tokens up to and including the first stop token.",
        "",
    ]
    rows = []
    for res in results:
        s = res["summary"]
        for x in (x for x in SUFFIX.values() if f"ours{x}" in s):
            for name in (f"ours{x}", *(f"{b}{x}" for b in BASES if f"{b}{x}" in s)):
                ratio = "-" if name.startswith("ours") else f"{s[f'ours{x}'][f'ratio_vs_{name}']:.2f}x"
                o = s[name]
                rows.append(
                    [res["model"], name, f"{o['tokens_per_s']:.1f}", f"{o['wall_s']:.2f}", f"{o['tokens']:.0f}", ratio]
                )
        if "ratio_vs_ours" in s.get("ours-bf16", {}):
            rows.append(
                [res["model"], "ours-bf16 / ours (fp32)", "", "", "", f"{s['ours-bf16']['ratio_vs_ours']:.2f}x"]
            )
    lines += md_table(["model", "contender", "tokens/s", "wall s", "tokens", "ours / this"], rows)
    compiles = [
        f"{res['model']} {name} {o['compile_and_first_call_s']:.1f} s"
        for res in results
        for name, o in res["summary"].items()
        if "compile_and_first_call_s" in o
    ]
    if compiles:
        lines += ["", "`generate-compiled`, compiling and its first call (before the repetitions, not in the medians): "
                  + ", ".join(compiles) + "."]  # fmt: skip
    lines += ["", "Per-repetition ratios ours / generate, same precision (spread under load):", ""]
    for res in results:
        s = res["summary"]
        for x in (x for x in SUFFIX.values() if f"ours{x}" in s):
            for base in BASES:
                if f"ratios_vs_{base}{x}" in s[f"ours{x}"]:
                    ratios = s[f"ours{x}"][f"ratios_vs_{base}{x}"]
                    lines.append(f"- {res['model']} ours{x} vs {base}{x}: " + ", ".join(f"{r:.2f}x" for r in ratios))
    lines += ["", "Our time split (median seconds per run):", ""]
    parts = ("prefill", "decode_forward", "sampling", "cache", "bookkeeping")
    rows = [[res["model"], name, *(f"{o['split_s'][k]:.2f}" for k in parts)]
            for res in results for name, o in res["summary"].items() if "split_s" in o]  # fmt: skip
    header = ["model", "contender", "prefill", "decode forward", "sampling", "cache management", "bookkeeping"]
    return "\n".join([*lines, *md_table(header, rows)]) + "\n"


# One timed call of a checkout's engine: run with that checkout first on PYTHONPATH (either class name).
AB_CHILD = """
import json, time, torch
torch.set_num_threads({threads})
import trinity_like.explorer.engine as E
from trinity_like.models import load_model, render_prompt
model, tokenizer = load_model({model!r})
engine = (getattr(E, "NativeEngine", None) or E.RolloutEngine)(model, tokenizer)
prompts = []  # build_prompts above, inlined: this process may run another checkout's code
for i in range({prompts}):
    a, b = 10 + (37 * i) % 90, 1 + (5 * i) % 9
    msg = [{{"role": "user", "content": f"What is {{a}} + {{b}}? Answer with just the number."}}]
    prompts.append(render_prompt(tokenizer, msg))
engine.generate(prompts[:2], E.SamplingParams(n=2, max_new_tokens=4, seed=0))
runs = []
for k in range({calls}):  # the process's median call; CPU time too: other jobs' load inflates the wall
    t0, c0 = time.perf_counter(), time.process_time()
    sp = E.SamplingParams(n={group}, max_new_tokens={new}, temperature=1.0, seed={seed} + k)
    tokens = sum(len(s.token_ids) for g in engine.generate(prompts, sp) for s in g)
    runs.append((time.perf_counter() - t0, time.process_time() - c0, tokens))
wall, cpu, tokens = sorted(runs)[len(runs) // 2]
print(json.dumps({{"file": E.__file__, "wall_s": wall, "cpu_s": cpu, "tokens": tokens,
                  "tokens_per_s": tokens / wall, "tokens_per_cpu_s": tokens / cpu}}))
"""


def run_ab(args, command: str) -> None:
    """This checkout's engine against ``args.ab``'s, alternating sides, one process per run."""
    import os

    sides = {"this": str(Path(__file__).resolve().parent.parent), "other": str(args.ab.resolve())}

    def run(cell: tuple[str, str], rep: int) -> dict:
        ref, side = cell
        code = AB_CHILD.format(
            threads=args.threads, model=ref, prompts=args.prompts, group=args.group,
            new=args.max_new_tokens, seed=1000 + rep, calls=args.ab_calls,
        )  # fmt: skip
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([sides[side], os.environ.get("PYTHONPATH", "")])}
        out = subprocess.run(  # cwd: `python -c` puts it first on sys.path
            [sys.executable, "-c", code], cwd=sides[side], env=env, capture_output=True, text=True, check=True
        )
        result = json.loads(out.stdout.strip().splitlines()[-1])
        assert result["file"].startswith(sides[side]), (result["file"], sides[side])
        rate = f"{result['tokens_per_s']:.1f} tok/s, {result['tokens_per_cpu_s']:.1f} tok/cpu-s"
        print(f"{ref} rep {rep} {side}: {rate}", file=sys.stderr, flush=True)
        return result

    by_cell = interleaved(run, [(ref, side) for ref in args.models for side in sides], args.reps)
    runs = {ref: {side: by_cell[ref, side] for side in sides} for ref in args.models}
    lines = [
        "# Rollout throughput: this checkout's engine against another's, interleaved",
        "",
        f"Command: `{command}`. This: {git_commit()}; other: `{args.ab}`. Workload: {args.prompts} prompts x "
        f"group {args.group}, up to {args.max_new_tokens} new tokens, temperature 1.0; torch threads "
        f"{args.threads}; {args.reps} repetitions, sides alternating, each its own process timing "
        f"{args.ab_calls} calls (its median); medians over repetitions. Tokens per CPU-second (the process's "
        f"CPU time): what other jobs on a shared machine disturb least. Machine: "
        f"{cpu_model()}, torch {torch.__version__}.",
        "",
    ]
    rows = []
    for ref, by_side in runs.items():
        this, other = by_side["this"], by_side["other"]
        for key, label in (("tokens_per_cpu_s", "tokens per CPU-s"), ("tokens_per_s", "tokens/s (wall)")):
            ratios = [a[key] / b[key] for a, b in zip(this, other)]
            medians = [f"{statistics.median(r[key] for r in side):.1f}" for side in (this, other)]
            rows.append(
                [ref, label, *medians, f"{statistics.median(ratios):.2f}x", ", ".join(f"{r:.2f}" for r in ratios)]
            )
    header = ["model", "measure", "this", "other", "this / other (median of per-rep ratios)", "per-rep ratios"]
    lines += md_table(header, rows)
    out = args.out.with_name(args.out.name + "_ab")
    print(write_results(out, {"command": command, "args": str(vars(args)), "runs": runs}, lines))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m-instruct", "tiny-random"])
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--reps", type=int, default=3, help="interleaved repetitions (medians)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: as in docs/machines.md)")
    parser.add_argument(
        "--precision",
        choices=("fp32", "bf16", "both"),
        default="both",
        help="every contender's weights and KV cache in fp32, in bf16, or both (interleaved)",
    )
    parser.add_argument("--bf16", action="store_true", help="the same as --precision both (older commands)")
    parser.add_argument("--tiny", action="store_true", help="the tiny random model, 1 repetition: a smoke run")
    parser.add_argument("--render", type=Path, help="only re-render the markdown of a saved JSON result")
    parser.add_argument("--out", type=Path, default=RESULTS / "rollout", help="writes OUT.md and OUT.json")
    parser.add_argument("--ab", type=Path, help="time our engine alone against this other checkout's (OUT_ab.*)")
    parser.add_argument("--ab-calls", type=int, default=3, help="--ab: timed calls per process (its median)")
    args = parser.parse_args(argv)
    if args.tiny:
        args.models, args.reps, args.prompts, args.max_new_tokens = ["tiny-random"], 1, 4, 8
    if args.render:
        saved = json.loads(args.render.read_text())
        for res in saved["results"]:  # older files lack the per-repetition ratio lists
            runs, o = res["runs"], res["summary"]["ours"]
            for base in ("generate", "generate+logprobs"):
                o.setdefault(
                    f"ratios_vs_{base}",
                    [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs["ours"], runs[base])],
                )
        saved_args, commit = argparse.Namespace(**saved["args"]), saved.get("commit", "unknown")
        text = markdown(saved["results"], saved_args, saved["command"].strip(), commit)
        args.render.with_suffix(".md").write_text(text)
        print(text)
        return
    torch.set_num_threads(args.threads)
    commit = git_commit()
    command = command_line("rollout.py", argv)
    if args.ab:
        run_ab(args, command.strip())
        return
    results = []
    for ref in args.models:  # files rewritten after each model: a long run leaves partial results
        results.append(bench_model(ref, args))
        text = markdown(results, args, command.strip(), commit)
        meta = {
            "command": command,
            "commit": commit,
            "args": vars(args) | {"out": str(args.out), "render": None},
            "results": results,
        }
        write_results(args.out, meta, text)
    print(text)


if __name__ == "__main__":
    main()
