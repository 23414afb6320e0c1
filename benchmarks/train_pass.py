"""The training pass alone, forward + backward over one GRPO batch, by how the model is run.

One batch in the README main job's shape (P prompts x G samples of the built-in arithmetic
task under SmolLM2's chat template, sampled once by our rollout engine, up to N new tokens,
advantage = reward - group mean), the same weights, loss (GRPO's token-mean clipped
surrogate, on-policy) and micro-batch size for every variant; each variant is one way of
computing the response logprobs:

- ``full-logits``: the padded ``[B, P+R]`` batch, logits and ``log_softmax`` at every
  position (what a trainer that scores the whole sequence does: verl's forward step);
- ``padded``: the padded batch, the head only on the R positions that predict response
  tokens (TRL's ``logits_to_keep``; our engines before sharing);
- ``packed``: our forward (:mod:`trinity_like.trainer.forward`) with ``share_prompts=False``:
  each row its own sequence, no padding inside;
- ``shared``: our forward as the engines run it: each group's prompt once.

Every variant does the same work for the loss -- the same logprobs (checked to 1e-4) and
the same gradient; what differs is how many tokens the backbone runs and how many the
head scores. Rounds alternate the order; medians of forward + backward seconds are
reported with the positions each variant ran and its share of the machine's fp32 matmul
peak: 6 FLOPs per weight per position (forward 2, backward 4) over the positions run,
padding included, the LM head's weights only over the positions it scores. Run::

    python benchmarks/train_pass.py --model tiny-random --reps 2                 # smoke
    python benchmarks/train_pass.py --model smollm2-135m-instruct --reps 5
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

from trinity_like.experience import Experience  # noqa: E402
from trinity_like.explorer.engine import NativeEngine, SamplingParams  # noqa: E402
from trinity_like.explorer.rewards import exact_match  # noqa: E402
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks  # noqa: E402
from trinity_like.models.chat import render_prompt  # noqa: E402
from trinity_like.models.resolve import load_model  # noqa: E402
from trinity_like.pipeline.batching import experience_batch  # noqa: E402
from trinity_like.trainer.base import micro_batches, with_normalisers  # noqa: E402
from trinity_like.trainer.forward import model_outputs, pack, padded_outputs  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from harness import command, git_commit, interleaved, matmul_peak_gflops, md_table, utc_now, write_results  # noqa: E402

OUT = Path(__file__).parent / "results"
VARIANTS = ("full-logits", "padded", "packed", "shared")


def grpo_batch(model, tokenizer, args) -> dict[str, torch.Tensor]:
    """The batch every variant trains on: sampled once, advantages = reward - group mean."""
    tasks = arithmetic_tasks(ArithmeticParams(), "train", args.prompts, seed=args.seed)
    prompts = [render_prompt(tokenizer, t.messages()) for t in tasks]
    groups = NativeEngine(model, tokenizer).generate(
        prompts, SamplingParams(n=args.group, max_new_tokens=args.max_tokens, seed=args.seed)
    )
    rows = []
    for prompt, group, task in zip(prompts, groups, tasks, strict=True):
        rewards = [
            exact_match(response=tokenizer.decode(s.token_ids, skip_special_tokens=True), answer=task.answer)
            for s in group
        ]
        mean = sum(rewards) / len(rewards)
        rows += [
            Experience(
                tokens=list(prompt) + s.token_ids,
                prompt_length=len(prompt),
                logprobs=s.logprobs,
                advantages=[r - mean] * len(s.token_ids),
            )
            for s, r in zip(group, rewards, strict=True)
        ]
    batch = with_normalisers(experience_batch(rows, tokenizer.pad_token_id))
    batch["old_logprob"] = batch["rollout_logprob"]
    return batch


def full_logits_outputs(model, batch) -> dict[str, torch.Tensor]:
    """Logits and log-softmax at every position of the padded batch, then the response columns."""
    logits = model(
        input_ids=batch["input_ids"],
        attention_mask=batch["attention_mask"],
        position_ids=batch["position_ids"],
        use_cache=False,
    ).logits.float()
    response_len = batch["response_mask"].shape[1]
    logp = torch.log_softmax(logits, dim=-1)[:, -response_len - 1 : -1]
    return {"logprob": logp.gather(-1, batch["input_ids"][:, -response_len:].unsqueeze(-1)).squeeze(-1)}


def outputs_of(variant: str, model, mb) -> dict[str, torch.Tensor]:
    if variant == "full-logits":
        return full_logits_outputs(model, mb)
    if variant == "padded":
        return padded_outputs(model, mb, "lm", need_entropy=False)
    return model_outputs(model, mb, "lm", share_prompts=variant == "shared")


def grpo_loss(outputs, mb) -> torch.Tensor:
    """GRPO's clipped surrogate, token-mean over the whole batch (ratio 1 on-policy)."""
    ratio = torch.exp(outputs["logprob"] - mb["old_logprob"])
    adv = mb["advantages"]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.28) * adv)
    return -(surrogate * mb["response_mask"]).sum() / mb["num_tokens"]


def train_pass(variant: str, model, batch, micro: int) -> torch.Tensor:
    """Forward + backward over every micro-batch; returns the logprobs (for the equality check)."""
    model.zero_grad(set_to_none=True)
    kept = []
    for mb in micro_batches(batch, micro):
        out = outputs_of(variant, model, mb)
        grpo_loss(out, mb).backward()
        kept.append(out["logprob"].detach())
    return torch.cat(kept)


def tokens_run(variant: str, batch, micro: int) -> tuple[int, float]:
    """Positions the backbone runs (padding included) and padding's share of them."""
    if variant in ("full-logits", "padded"):
        grid = int(batch["input_ids"].numel())
        return grid, 1 - int(batch["attention_mask"].sum()) / grid
    packings = [pack(mb, share_prompts=variant == "shared") for mb in micro_batches(batch, micro)]
    grid = sum(p.segment.numel() for p in packings)
    return grid, 1 - sum(p.tokens for p in packings) / grid


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--micro-batch", type=int, default=16)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=OUT / "train_pass")
    args = parser.parse_args(argv)

    model, tokenizer = load_model(args.model)
    model.float().train()
    batch = grpo_batch(model, tokenizer, args)
    params = sum(p.numel() for p in model.parameters())
    reference = train_pass("padded", model, batch, args.micro_batch)
    where = batch["response_mask"] > 0
    for variant in VARIANTS:
        got = train_pass(variant, model, batch, args.micro_batch)
        torch.testing.assert_close(got[where], reference[where], rtol=1e-4, atol=1e-4)

    def run(variant: str, _rep: int) -> float:
        start = time.perf_counter()
        train_pass(variant, model, batch, args.micro_batch)
        return time.perf_counter() - start

    times = interleaved(run, VARIANTS, args.reps)
    peak = matmul_peak_gflops()
    rows = {}
    head = model.get_output_embeddings().weight.numel()  # tied to the input embedding, which costs no FLOPs
    scored = int(batch["attention_mask"][:, -batch["response_mask"].shape[1] :].sum())
    for variant in VARIANTS:
        median = statistics.median(times[variant])
        tokens, padding = tokens_run(variant, batch, args.micro_batch)
        head_positions = tokens if variant == "full-logits" else scored
        flops = 6 * (params - head) * tokens + 6 * head * head_positions  # forward 2, backward 4 per weight
        rows[variant] = {
            "median_s": median,
            "tokens_run": tokens,
            "padded_fraction": padding,
            "gflop": flops / 1e9,
            "peak_fraction": flops / median / 1e9 / peak,
            "times": times[variant],
        }
    real = int(batch["attention_mask"].sum())
    meta = {
        "command": command("train_pass.py", argv),
        "commit": git_commit(),
        "when": utc_now(),
        "load": os.getloadavg()[0],
        "peak_gflops": peak,
        "rows": int(batch["input_ids"].shape[0]),
        "real_tokens": real,
        "grid": list(batch["input_ids"].shape),
        "params": params,
        **vars(args),
    }
    meta["out"] = str(args.out)
    print(write_results(args.out, {"meta": meta, "variants": rows}, markdown(rows, meta), indent=2), end="")


def markdown(rows: dict, meta: dict) -> str:
    base = rows["full-logits"]["median_s"]
    lines = [
        f"Command: `{meta['command']}` (commit {meta['commit']}, {meta['when']}, load {meta['load']:.1f})",
        "",
        f"{meta['model']}, {meta['prompts']} prompts x {meta['group']} samples, up to {meta['max_tokens']} new "
        f"tokens: {meta['rows']} rows, padded grid {meta['grid'][0]} x {meta['grid'][1]}, {meta['real_tokens']} real "
        f"tokens; micro-batch {meta['micro_batch']}, fp32, forward + backward, median of {meta['reps']} "
        f"(order alternating). Machine fp32 matmul peak: {meta['peak_gflops']:.1f} GFLOP/s.",
        "",
    ]
    header = ["variant", "seconds", "vs full-logits", "positions the backbone ran", "of which padding", "GFLOP"]
    cells = [[v, f"{r['median_s']:.2f}", f"{base / r['median_s']:.2f}x", r["tokens_run"], f"{r['padded_fraction']:.1%}",
              f"{r['gflop']:.0f}", f"{r['peak_fraction']:.0%}"] for v, r in rows.items()]  # fmt: skip
    return "\n".join([*lines, *md_table([*header, "% of fp32 peak"], cells)]) + "\n"


if __name__ == "__main__":
    main()
