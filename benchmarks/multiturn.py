"""Multi-turn rollout throughput: prefix reuse vs re-prefilling the history, and ``generate``.

A tool-use-shaped workload: E episodes x T turns. Each turn samples up to N tokens
(temperature 1.0, top_k=0, top_p=1.0), then appends a calculator result rendered as a
user turn under the model's chat template (about 50 tokens on SmolLM2); the next turn's prompt is
the whole history, token for token (what an environment sends). Three contenders, each
running the same episodes (same openings, same seeds per round), in rotating order per
round so load drifts on a shared machine hit all of them alike:

- ``reuse``: our :class:`NativeEngine` as shipped: each turn copies the kept keys of the
  episode's history and prefills only the new tokens (:mod:`trinity_like.explorer.prefix_cache`);
- ``reprefill``: the same engine with ``prefix_cache_tokens=0``: every turn prefills the
  whole history (everything else equal: the ratio is the prefix cache's alone);
- ``generate``: ``transformers`` ``generate`` with the KV cache on and per-token logprobs
  (``output_scores``; an RL trainer needs them), the history left-padded and re-prefilled
  every turn -- what a user would otherwise write.

Samples differ between ``generate`` and ours (different random streams), so each is
reported as generated tokens / wall seconds over the whole episode batch (response
tokens up to and including the first stop token). Medians over rounds; ratios are the
median of per-round ratios (fair under load; absolute times are not). The machine's fp32
matmul peak is measured beside them. Run::

    python benchmarks/multiturn.py --model tiny-random --rounds 1        # smoke, seconds
    python benchmarks/multiturn.py --model smollm2-135m-instruct --rounds 2   # about 6 minutes
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

from trinity_like.explorer.engine import EngineParams, NativeEngine, SamplingParams  # noqa: E402
from trinity_like.models import load_model, render_prompt  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from harness import RESULTS, cpu_model, git_commit, interleaved, matmul_peak_gflops, md_table, write_results  # noqa: E402
from harness import command as command_line  # noqa: E402

CONTENDERS = ("reuse", "reprefill", "generate")


def openings(tokenizer, episodes: int) -> list[list[int]]:
    """First prompts: a multiplication the model may hand to a calculator tool."""
    out = []
    for i in range(episodes):
        a, b = 12 + (37 * i) % 80, 3 + (7 * i) % 20
        msg = (
            f"What is {a} * {b}? You may call the calculator by writing <calc>EXPRESSION</calc>; "
            "its result comes back to you. End with the final answer."
        )
        out.append(render_prompt(tokenizer, [{"role": "user", "content": msg}]))
    return out


def observation(tokenizer, response: list[int], episode: int, turn: int) -> list[int]:
    """The tool result after ``response``, as a user turn that reopens the assistant's.

    Token-in, token-out: the response's tokens stay as sampled; when it was cut by the
    length cap (no end-of-turn token), the observation closes the turn itself.
    """
    a, b = 12 + (37 * episode) % 80, 3 + (7 * episode) % 20
    body = (
        f'<tool_result>{{"tool": "calculator", "call": {turn + 1}, "expression": "{a} * {b}", '
        f'"value": {a * b}}}</tool_result>'
    )
    closed = bool(response) and response[-1] == tokenizer.eos_token_id
    text = ("" if closed else tokenizer.eos_token) + f"\n<|im_start|>user\n{body}<|im_end|>\n<|im_start|>assistant\n"
    return list(tokenizer.encode(text, add_special_tokens=False))


def until_stop(row: list[int], stop_ids: set[int]) -> list[int]:
    for i, token in enumerate(row):
        if token in stop_ids:
            return row[: i + 1]
    return row


def run_engine(engine: NativeEngine, tokenizer, starts, args, seed: int) -> dict:
    """All episodes, turn by turn, through our engine; the prefix cache starts empty."""
    engine.prefix_cache.clear()
    engine.reset_timings()
    stats0 = dict(engine.prefix_cache.stats)
    histories = [list(p) for p in starts]
    tokens = prompt_tokens = 0
    t0 = time.perf_counter()
    for turn in range(args.turns):
        sp = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0, seed=seed * 100 + turn)
        groups = engine.generate(histories, sp)
        prompt_tokens += sum(len(h) for h in histories)
        for e, (sample,) in enumerate(groups):
            tokens += len(sample.token_ids)
            histories[e] = histories[e] + sample.token_ids + observation(tokenizer, sample.token_ids, e, turn)
    wall = time.perf_counter() - t0
    reused = engine.prefix_cache.stats["reused_tokens"] - stats0["reused_tokens"]
    return {
        "wall_s": wall,
        "tokens": tokens,
        "prompt_tokens": prompt_tokens,
        "prefilled_tokens": prompt_tokens - reused,
        "final_history_tokens": statistics.mean(len(h) for h in histories),
        "split_s": dict(engine.timings),
    }


def run_generate(model, tokenizer, starts, args, seed: int, stop_ids: set[int]) -> dict:
    """All episodes through ``generate``: each turn re-prefills the left-padded histories."""
    histories = [list(p) for p in starts]
    pad = tokenizer.pad_token_id
    tokens = prompt_tokens = 0
    t0 = time.perf_counter()
    for turn in range(args.turns):
        width = max(len(h) for h in histories)
        ids = torch.tensor([[pad] * (width - len(h)) + h for h in histories])
        mask = torch.tensor([[0] * (width - len(h)) + [1] * len(h) for h in histories])
        torch.manual_seed(seed * 100 + turn)
        with torch.inference_mode():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                temperature=1.0,
                top_k=0,
                top_p=1.0,
                max_new_tokens=args.max_new_tokens,
                pad_token_id=pad,
                eos_token_id=sorted(stop_ids),
                return_dict_in_generate=True,
                output_scores=True,
            )
            logprobs = model.compute_transition_scores(out.sequences, out.scores, normalize_logits=True)
        prompt_tokens += sum(len(h) for h in histories)
        for e, row in enumerate(out.sequences[:, width:].tolist()):
            response = until_stop(row, stop_ids)
            assert logprobs.shape[1] >= len(response)
            tokens += len(response)
            histories[e] = histories[e] + response + observation(tokenizer, response, e, turn)
    wall = time.perf_counter() - t0
    return {
        "wall_s": wall,
        "tokens": tokens,
        "prompt_tokens": prompt_tokens,
        "prefilled_tokens": prompt_tokens,
        "final_history_tokens": statistics.mean(len(h) for h in histories),
    }


def bench(args) -> dict:
    model, tokenizer = load_model(args.model)
    starts = openings(tokenizer, args.episodes)
    reuse = NativeEngine(model, tokenizer)
    reprefill = NativeEngine(model, tokenizer, EngineParams(prefix_cache_tokens=0))
    stop_ids = set(reuse.default_stop_ids)
    obs = [len(observation(tokenizer, [], e, t)) for e in range(args.episodes) for t in range(args.turns)]
    contenders = {
        "reuse": lambda s: run_engine(reuse, tokenizer, starts, args, s),
        "reprefill": lambda s: run_engine(reprefill, tokenizer, starts, args, s),
        "generate": lambda s: run_generate(model, tokenizer, starts, args, s, stop_ids),
    }
    # Warm-up: first calls allocate and pick kernels.
    warm = argparse.Namespace(**{**vars(args), "turns": 2, "max_new_tokens": 4})
    run_engine(reuse, tokenizer, starts[:2], warm, 0)
    run_generate(model, tokenizer, starts[:2], warm, 0, stop_ids)
    peaks = [matmul_peak_gflops()]

    def run(name: str, rnd: int) -> dict:
        result = contenders[name](1 + rnd)
        result["tokens_per_s"] = result["tokens"] / result["wall_s"]
        print(
            f"round {rnd} {name}: {result['tokens']} tokens in {result['wall_s']:.2f} s = "
            f"{result['tokens_per_s']:.1f} tok/s; prefilled {result['prefilled_tokens']} of "
            f"{result['prompt_tokens']} prompt tokens",
            file=sys.stderr,
            flush=True,
        )
        return result

    runs = interleaved(run, CONTENDERS, args.rounds, rotate=True)
    peaks.append(matmul_peak_gflops())
    summary = {
        n: {
            k: statistics.median(r[k] for r in runs[n])
            for k in ("tokens_per_s", "wall_s", "tokens", "prompt_tokens", "prefilled_tokens", "final_history_tokens")
        }
        for n in CONTENDERS
    }
    for base in ("reprefill", "generate"):
        ratios = [a["tokens_per_s"] / b["tokens_per_s"] for a, b in zip(runs["reuse"], runs[base])]
        summary["reuse"][f"ratio_vs_{base}"] = statistics.median(ratios)
        summary["reuse"][f"ratios_vs_{base}"] = ratios
    for name in ("reuse", "reprefill"):
        summary[name]["split_s"] = {
            k: statistics.median(r["split_s"][k] for r in runs[name]) for k in runs[name][0]["split_s"]
        }
    return {
        "model": args.model,
        "params_m": sum(p.numel() for p in model.parameters()) / 1e6,
        "observation_tokens": {"min": min(obs), "mean": statistics.mean(obs), "max": max(obs)},
        "opening_tokens": statistics.mean(len(p) for p in starts),
        "matmul_peak_gflops": peaks,
        "summary": summary,
        "runs": runs,
    }


def markdown(res: dict, args, command: str, commit: str) -> str:
    s, o = res["summary"], res["summary"]["reuse"]
    peaks = res["matmul_peak_gflops"]
    lines = [
        "# Multi-turn rollout: prefix reuse vs re-prefilling the history",
        "",
        f"Command: `{command}`",
        "",
        f"Workload: {args.episodes} episodes x {args.turns} turns on `{res['model']}` "
        f"({res['params_m']:.1f} M parameters); openings of {res['opening_tokens']:.0f} tokens (chat template), "
        f"each turn samples up to {args.max_new_tokens} tokens (temperature 1.0, top_k=0, top_p=1.0, one sample "
        f"per episode) and appends a calculator result of {res['observation_tokens']['min']}-"
        f"{res['observation_tokens']['max']} tokens; final histories {s['reuse']['final_history_tokens']:.0f} "
        f"tokens on average. torch threads {args.threads}; {args.rounds} interleaved rounds (medians). Machine: "
        f"{cpu_model()}, torch {torch.__version__}, fp32 matmul peak "
        f"{peaks[0]:.0f} GFLOP/s before and {peaks[1]:.0f} after the rounds; shared with other jobs -- compare "
        f"ratios, not absolute times. Code measured: commit {commit}.",
        "",
        "tokens/s: generated tokens (up to and including the first stop) / wall seconds for the whole episode "
        "batch; `reuse / this`: median of the per-round ratios of tokens/s. Prefilled: prompt tokens that ran "
        "through the model, of all prompt tokens sent over the turns.",
        "",
    ]
    rows = [[n, f"{s[n]['tokens_per_s']:.1f}", f"{s[n]['wall_s']:.2f}", f"{s[n]['tokens']:.0f}",
             f"{s[n]['prefilled_tokens']:.0f} / {s[n]['prompt_tokens']:.0f}",
             "-" if n == "reuse" else f"{o[f'ratio_vs_{n}']:.2f}x"] for n in CONTENDERS]  # fmt: skip
    header = ["contender", "tokens/s", "wall s", "generated", "prefilled / sent prompt tokens", "reuse / this"]
    lines += [*md_table(header, rows), "", "Per-round ratios (spread under load):", ""]
    lines += [
        f"- reuse / {b}: " + ", ".join(f"{r:.2f}x" for r in o[f"ratios_vs_{b}"]) for b in ("reprefill", "generate")
    ]
    lines += ["", "Our time split (median seconds per run):", ""]
    parts = ("prefill", "decode_forward", "sampling", "cache", "bookkeeping")
    rows = [[n, *(f"{s[n]['split_s'][k]:.2f}" for k in parts)] for n in ("reuse", "reprefill")]
    header = ["contender", "prefill", "decode forward", "sampling", "cache management", "bookkeeping"]
    return "\n".join([*lines, *md_table(header, rows)]) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--episodes", type=int, default=16)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    threads = "torch threads (1: two threads on a shared 2-core machine stall when another job runs)"
    parser.add_argument("--threads", type=int, default=1, help=threads)
    out = "writes OUT.md and OUT.json (default: results/multiturn, results/multiturn_tiny for tiny-random)"
    parser.add_argument("--out", type=Path, help=out)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    out = args.out or RESULTS / ("multiturn_tiny" if args.model == "tiny-random" else "multiturn")
    command = command_line("multiturn.py", argv)
    commit = git_commit()
    res = bench(args)
    meta = {"command": command.strip(), "commit": commit, "args": vars(args) | {"out": str(out)}, "result": res}
    print(write_results(out, meta, markdown(res, args, command.strip(), commit)), end="")


if __name__ == "__main__":
    main()
