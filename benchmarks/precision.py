"""Where the update's time goes in fp32 and in bf16 mixed precision, and what the rollout costs in each.

One GRPO batch in the README main job's shape -- P prompts x G samples, prompts of about
``--prompt-tokens`` tokens, responses of up to ``--response-tokens`` (random token ids; the
model is the shape of SmolLM2-135M with random weights, :mod:`trinity_like.models.shapes`:
speed depends on the shape, not on the values) -- trained by the ``local`` engine (the same
forward the ``verl`` workers run, :mod:`trinity_like.trainer.forward`) in two precisions:

- ``fp32``: ``model.dtype=float32``, everything float32;
- ``bf16``: the mixed path (``model.dtype=auto`` where :func:`~trinity_like.models.device.precision`
  picks it): bf16 autocast compute over fp32 master weights, fp32 logprobs, loss and AdamW.

For each: the median seconds of one update (forward + backward over every micro-batch +
AdamW), A/B interleaved; a torch.profiler breakdown of one update into matmul, attention,
element-wise, copies + casts and the optimiser (self CPU time of each aten op, grouped by
name: :data:`GROUPS`); and the share of the matmul peak the update reaches, with both peaks
(fp32, bf16, a 2048^3 matmul, best of 5) measured in the same run. Then the rollout engine
in both dtypes (weights and KV cache in bf16, logprobs fp32) on the same prompts. Run::

    python benchmarks/precision.py --tiny                 # seconds: the smoke a test runs
    python benchmarks/precision.py --reps 5               # the main job's shape, a few minutes

Writes ``OUT.md`` and ``OUT.json`` (``--out``, default ``benchmarks/results/precision``).
"""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import argparse  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile, record_function  # noqa: E402

from trinity_like.experience import Experience  # noqa: E402
from trinity_like.explorer.engine import NativeEngine, SamplingParams  # noqa: E402
from trinity_like.models.shapes import shaped_folder, shaped_model  # noqa: E402
from trinity_like.pipeline.batching import experience_batch  # noqa: E402
from trinity_like.trainer.local_engine import LocalEngine  # noqa: E402
from trinity_like.trainer.objective import sampler_gap  # noqa: E402
from trinity_like.trainer.params import ModelParams, OptimParams  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from harness import command, cpu_name, git_commit, interleaved, md_table, utc_now, write_results  # noqa: E402

OUT = Path(__file__).parent / "results" / "precision"
PRECISIONS = {"fp32": None, "bf16": torch.bfloat16}  # train: autocast dtype over the fp32 weights
ROLLOUT_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}  # rollout: weights and KV cache
# aten op names (self CPU time) -> what they are. First match wins; whatever matches none is element-wise.
GROUPS = (
    ("attention", ("scaled_dot_product", "flash_attention", "_softmax", "softmax_backward")),
    ("matmul", ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "mkldnn_matmul", "linear")),
    ("copies+casts", ("aten::copy_", "aten::_to_copy", "aten::to", "aten::clone", "aten::contiguous", "aten::cat")),
)
OPTIMISER = "optimiser"  # every op under the optimiser step (clipping, AdamW), whatever its name


def group_of(name: str) -> str:
    """The group of one profiler op name (:data:`GROUPS`), ``element-wise`` when none matches."""
    low = name.lower()
    for group, needles in GROUPS:
        if any(n.lower() in low for n in needles):
            return group
    return "element-wise"


def matmul_peak(dtype: torch.dtype, size: int = 2048, reps: int = 5) -> float:
    """GFLOP per CPU second (this process) of the best of ``reps`` ``size``^3 matmuls in ``dtype``."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):
        start = time.process_time()
        a @ b
        best = min(best, time.process_time() - start)
    return 2 * size**3 / best / 1e9


def grpo_batch(args, vocab: int) -> dict[str, torch.Tensor]:
    """P groups of G rows: one random prompt each, G random responses of uneven length, +-1 advantages."""
    gen = torch.Generator().manual_seed(args.seed)
    rows = []
    for p in range(args.prompts):
        prompt = torch.randint(3, vocab, (args.prompt_tokens - p % 3,), generator=gen).tolist()
        for g in range(args.group):
            length = 1 + (p * 7 + g * 5) % args.response_tokens
            response = torch.randint(3, vocab, (length,), generator=gen).tolist()
            adv = 1.0 if g % 2 else -1.0
            rows.append(
                Experience(
                    tokens=prompt + response,
                    prompt_length=len(prompt),
                    logprobs=[-1.0] * length,
                    advantages=[adv] * length,
                    group_id=f"g{p}",
                )
            )
    batch = experience_batch(rows, pad_id=2)
    batch["old_logprob"] = batch["rollout_logprob"]
    return batch


def grpo_loss(outputs, mb):
    """GRPO's clipped surrogate, token-mean over the whole batch."""
    ratio = torch.exp(outputs["logprob"] - outputs["logprob"].detach())  # on-policy: 1, with logprob's gradient
    adv = mb["advantages"]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.28) * adv)
    return -(surrogate * mb["response_mask"]).sum() / mb["num_tokens"], {}


def update(engine: LocalEngine, batch) -> tuple[float, float]:
    """Wall and CPU seconds (this process, every thread) of one update."""
    wall, cpu = time.perf_counter(), time.process_time()
    engine.forward_backward(batch, grpo_loss)
    engine.optim_step()
    return time.perf_counter() - wall, time.process_time() - cpu


def breakdown(engine: LocalEngine, batch) -> dict[str, float]:
    """Self CPU seconds of one profiled update, by group (:data:`GROUPS`, :data:`OPTIMISER`, element-wise)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        engine.forward_backward(batch, grpo_loss)
        with record_function(OPTIMISER):
            engine.optim_step()
    out: dict[str, float] = defaultdict(float)
    for event in prof.events():
        parent, group = event, None
        while parent is not None and group is None:
            group = OPTIMISER if parent.name == OPTIMISER else None
            parent = parent.cpu_parent
        out[group or group_of(event.name)] += event.self_cpu_time_total / 1e6
    return dict(out)


def update_flops(model: torch.nn.Module, batch) -> float:
    """6 FLOPs per weight per position the backbone runs (forward 2, backward 4), the head's weights only
    over the scored positions; prompts counted once (the shared forward runs each group's prompt once)."""
    head = model.get_output_embeddings().weight.numel()
    body = sum(p.numel() for p in model.parameters()) - head  # the tied input embedding costs no FLOPs
    mask = batch["attention_mask"].bool()
    response_len = batch["response_mask"].shape[1]
    scored = int(mask[:, -response_len:].sum())
    group = batch["group_index"]
    prompts = sum(int(mask[(group == g).nonzero()[0, 0], :-response_len].sum()) for g in group.unique())
    return 6.0 * body * (prompts + scored) + 6.0 * head * scored


def rollout(engine: NativeEngine, prompts, args) -> tuple[float, float]:
    """Tokens per wall second and per CPU second of one GRPO-shaped generate call (no early stop)."""
    sp = SamplingParams(n=args.group, max_new_tokens=args.response_tokens, seed=args.seed, stop_token_ids=())
    wall, cpu = time.perf_counter(), time.process_time()
    groups = engine.generate(prompts, sp)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    tokens = sum(len(s.token_ids) for g in groups for s in g)
    return tokens / wall, tokens / cpu


def sampler_trainer_gap(args) -> dict[str, dict[str, float]]:
    """The gap (:func:`~trinity_like.trainer.objective.sampler_gap`) between the rollout engine's logprobs
    and the trainer's for the same sampled tokens, for each sampler dtype x trainer precision: the
    main job's prompts (built-in arithmetic under the chat template) on ``--gap-model``'s real weights."""
    from trinity_like.explorer.engines import build_rollout_engine
    from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks
    from trinity_like.models.chat import render_prompt
    from trinity_like.models.resolve import load_tokenizer, resolve_model_path

    path = str(resolve_model_path(args.gap_model))
    tokenizer = load_tokenizer(path)
    tasks = arithmetic_tasks(ArithmeticParams(), "train", args.prompts, seed=args.seed)
    prompts = [render_prompt(tokenizer, t.messages()) for t in tasks]
    trainers = {}
    for name, compute in PRECISIONS.items():
        trainers[name] = LocalEngine(
            ModelParams(path=path, dtype="float32", micro_batch_size=args.micro_batch, forward_only=True)
        )
        trainers[name].compute_dtype = compute  # as in the update above: the mixed path on any CPU
    out = {}
    for sampler_name, dtype in ROLLOUT_DTYPES.items():
        engine = build_rollout_engine("native", path, device="cpu", dtype=dtype)
        sp = SamplingParams(n=args.group, max_new_tokens=args.response_tokens, temperature=1.0, seed=args.seed)
        rows = [
            Experience(tokens=list(prompt) + s.token_ids, prompt_length=len(prompt), logprobs=s.logprobs)
            for prompt, group in zip(prompts, engine.generate(prompts, sp), strict=True)
            for s in group
        ]
        batch = experience_batch(rows, tokenizer.pad_token_id)
        for trainer_name, trainer in trainers.items():
            logprob = trainer.compute_logprobs(batch)["logprob"]
            gap = sampler_gap(logprob, batch["rollout_logprob"], batch["response_mask"], batch["is_expert"])
            out[f"{sampler_name} sampler, {trainer_name} trainer"] = gap
    return out


def rounds(contenders: dict, run, reps: int, what: str) -> dict[str, list[tuple[float, float]]]:
    """``reps`` interleaved rounds of ``run(contender)`` for each contender: (wall, cpu) seconds."""

    def one(name: str, rep: int) -> tuple[float, float]:
        wall, cpu = run(contenders[name])
        print(f"{what} {name} rep {rep}: {wall:.2f} wall, {cpu:.2f} cpu", file=sys.stderr)
        return wall, cpu

    return interleaved(one, list(contenders), reps)


def medians(samples: dict[str, list[tuple[float, float]]]) -> dict[str, dict[str, float]]:
    return {
        k: {"wall": statistics.median(w for w, _ in v), "cpu": statistics.median(c for _, c in v)}
        for k, v in samples.items()
    }


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tiny", action="store_true", help="the tiny test shape, 2 reps: a smoke run in seconds")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--prompt-tokens", type=int, default=48)
    parser.add_argument("--response-tokens", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument(
        "--threads", type=int, default=1, help="torch threads (1: CPU seconds are the work, whatever the load)"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--gap-model", default="smollm2-135m-instruct", help="real weights for the sampler gap")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    shape = "tiny" if args.tiny else "smollm2-135m"
    if args.tiny:
        args.reps, args.gap_model = min(args.reps, 2), "tiny-random"
    peaks = {"fp32": matmul_peak(torch.float32), "bf16": matmul_peak(torch.bfloat16)}
    with tempfile.TemporaryDirectory() as tmp:
        folder = str(shaped_folder(shape, Path(tmp) / shape))
        engines = {
            name: LocalEngine(
                ModelParams(path=folder, dtype="float32", micro_batch_size=args.micro_batch), OptimParams(lr=1e-6)
            )
            for name in PRECISIONS
        }
    for name, compute in PRECISIONS.items():
        # The mixed path whatever precision(cpu) picks here: what `model.dtype: auto` runs where it picks bf16.
        engines[name].compute_dtype = compute
    vocab = engines["fp32"].model.config.vocab_size
    batch = grpo_batch(args, vocab)
    for engine in engines.values():
        update(engine, batch)  # warm-up
    updates = rounds(engines, lambda e: update(e, batch), args.reps, "update")
    flops = update_flops(engines["fp32"].model, batch)
    profiles = {name: breakdown(engine, batch) for name, engine in engines.items()}
    del engines
    prompts = [torch.randint(3, vocab, (args.prompt_tokens,)).tolist() for _ in range(args.prompts)]
    samplers = {name: NativeEngine(shaped_model(shape, dtype=dtype)) for name, dtype in ROLLOUT_DTYPES.items()}
    for sampler in samplers.values():
        rollout(sampler, prompts[:1], args)  # warm-up
    rollouts = rounds(samplers, lambda e: rollout(e, prompts, args), args.reps, "rollout tok/s")
    del samplers
    gap = sampler_trainer_gap(args)
    meta = {
        "command": command("precision.py", argv),
        "commit": git_commit(),
        "when": utc_now(),
        "load": os.getloadavg()[0],
        "cpu": cpu_name(),
        "shape": shape,
        "rows": int(batch["input_ids"].shape[0]),
        "gflop": flops / 1e9,
        "peaks_gflops": peaks,
        **{k: v for k, v in vars(args).items() if k != "out"},
    }
    result = {
        "meta": meta,
        "update_s": medians(updates),
        "update_samples": updates,
        "profile_s": profiles,
        "rollout_tok_s": medians(rollouts),
        "rollout_samples": rollouts,
        "gap": gap,
    }
    print(write_results(args.out, result, markdown(result), indent=2), end="")
    return result


def markdown(result: dict) -> str:
    m = result["meta"]
    peaks = m["peaks_gflops"]
    groups = (*(g for g, _ in GROUPS), OPTIMISER, "element-wise")
    lines = [
        f"Command: `{m['command']}` (commit {m['commit']}, {m['when']}, load {m['load']:.1f}; {m['cpu']}; "
        f"{m['threads']} torch thread(s))",
        "",
        f"Shape {m['shape']} (random weights), {m['prompts']} prompts x {m['group']} samples ({m['rows']} rows), "
        f"prompts ~{m['prompt_tokens']} tokens, responses <= {m['response_tokens']}; micro-batch {m['micro_batch']}; "
        f"{m['gflop']:.0f} GFLOP per update (6 per weight per position). Matmul peak on {m['threads']} thread(s) "
        f"(2048^3, best of 5): fp32 {peaks['fp32']:.0f}, bf16 {peaks['bf16']:.0f} GFLOP per CPU s "
        f"({peaks['bf16'] / peaks['fp32']:.1f}x). Medians of {m['reps']}, A/B interleaved; CPU seconds are the "
        "process's (every thread), which other users' load does not inflate as it does wall time.",
        "",
    ]
    rows = []
    for name, u in result["update_s"].items():
        rate, r = m["gflop"] / u["cpu"] / m["threads"], result["rollout_tok_s"][name]
        rows.append([name, f"{u['wall']:.2f}", f"{u['cpu']:.2f}", f"{rate:.0f}", f"{rate / peaks[name]:.0%}"])
        rows[-1] += [f"{r['wall']:.0f}", f"{r['cpu']:.0f}"]
    header = ["precision", "update wall s", "update CPU s", "GFLOP per CPU s", "% of its matmul peak"]
    lines += md_table([*header, "rollout tok/s wall", "rollout tok per CPU s"], rows)
    lines += ["", "One profiled update (torch.profiler, self CPU seconds by op group, share of the total):", ""]
    rows = []
    for name, prof in result["profile_s"].items():
        total = sum(prof.values()) or 1.0
        rows.append([name, *(f"{prof.get(g, 0.0):.2f} ({prof.get(g, 0.0) / total:.0%})" for g in groups)])
    lines += md_table(["precision", *groups], rows)
    lines += [
        "",
        f"The sampler-trainer gap on `{m['gap_model']}` (its own weights, not random; the same {m['prompts']} x {m['group']} sampled "
        "responses per sampler dtype, the trainer's logprobs of the same tokens; expert rows none):",
        "",
    ]
    rows = [[combo, f"{g['train/sampler_kl_k3']:.2e}", f"{g['train/sampler_logprob_diff_max']:.3f}",
             f"{g['train/sampler_logprob_diff_mean']:.4f}"] for combo, g in result["gap"].items()]  # fmt: skip
    header = ["sampler, trainer", "KL k3 (mean)", "max abs logprob diff", "mean abs logprob diff"]
    return "\n".join([*lines, *md_table(header, rows)]) + "\n"


if __name__ == "__main__":
    main()
