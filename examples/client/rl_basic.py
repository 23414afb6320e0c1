"""The smallest RL loop on the Tinker-compatible client: SmolLM2 learns 2-digit + 1-digit sums.

    python examples/client/rl_basic.py                      # importance_sampling, full fine-tune
    python examples/client/rl_basic.py --loss ppo           # the clipped objective
    python examples/client/rl_basic.py --custom             # the same objective as a custom loss

Each iteration samples a group of answers per problem from the current weights, scores
them (1 if the final number is right), takes advantage = reward - group mean, skips
groups whose rewards are all equal (they teach nothing), and takes one optimiser step.
Held-out accuracy is greedy, on problems never trained on. Result on 2 CPU cores: see
the README ("The client"), which quotes this script's last line.
"""

from __future__ import annotations

import argparse
import time

import torch

import trinity_like.client as tinker
from trinity_like.client.renderers import get_renderer
from trinity_like.explorer.rewards import exact_match
from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks

types = tinker.types


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--batch", type=int, default=8, help="problems per step")
    p.add_argument("--group", type=int, default=8, help="samples per problem")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--rank", type=int, default=0, help="LoRA rank; 0 trains every weight")
    p.add_argument("--loss", default="importance_sampling", choices=["importance_sampling", "ppo"])
    p.add_argument("--custom", action="store_true", help="importance sampling written as a custom loss")
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--eval", type=int, default=200, help="held-out problems")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def importance_sampling(data: list[types.Datum], logprobs: list[torch.Tensor]):
    """-sum exp(lp - lp_sampler) * A, the built-in `importance_sampling`, in a few lines."""
    loss = sum(
        -(torch.exp(lp - d.loss_fn_inputs["logprobs"].to_torch()) * d.loss_fn_inputs["advantages"].to_torch()).sum()
        for d, lp in zip(data, logprobs, strict=True)
    )
    return loss, {}


def accuracy(sampler, renderer, tasks, max_tokens: int) -> float:
    """Share of ``tasks`` answered right by greedy decoding."""
    greedy = types.SamplingParams(max_tokens=max_tokens, temperature=0.0, stop=renderer.get_stop_sequences())
    futures = [sampler.sample(renderer.build_generation_prompt(t.messages()), 1, greedy) for t in tasks]
    right = [reward(renderer, f.result().sequences[0].tokens, t.answer) for f, t in zip(futures, tasks, strict=True)]
    return sum(right) / len(right)


def reward(renderer, tokens: list[int], answer: str) -> float:
    message, _ = renderer.parse_response(tokens)
    return exact_match(response=message["content"], answer=answer)


def main() -> None:
    args = parse_args()
    problems = ArithmeticParams()
    train = arithmetic_tasks(problems, "train", args.steps * args.batch, seed=args.seed)
    held_out = arithmetic_tasks(problems, "eval", args.eval, seed=args.seed)

    service = tinker.ServiceClient()
    training = service.create_lora_training_client(args.model, rank=args.rank, seed=args.seed)
    renderer = get_renderer("chatml", training.get_tokenizer())
    sampling = types.SamplingParams(max_tokens=args.max_tokens, stop=renderer.get_stop_sequences(), temperature=1.0)
    adam = types.AdamParams(learning_rate=args.lr, beta1=0.9, beta2=0.95, eps=1e-8, grad_clip_norm=1.0)

    sampler = training.save_weights_and_get_sampling_client()
    before = accuracy(sampler, renderer, held_out, args.max_tokens)
    print(f"held-out greedy accuracy before: {before:.1%}", flush=True)
    started = time.perf_counter()
    for step in range(args.steps):
        tasks = train[step * args.batch : (step + 1) * args.batch]
        prompts = [renderer.build_generation_prompt(t.messages()) for t in tasks]
        futures = [
            sampler.sample(p, args.group, sampling.model_copy(update={"seed": step * 1000 + i}))
            for i, p in enumerate(prompts)
        ]
        data, rewards = [], []
        for task, prompt, future in zip(tasks, prompts, futures, strict=True):
            group = future.result().sequences
            rewards_G = [reward(renderer, s.tokens, task.answer) for s in group]
            rewards += rewards_G
            mean = sum(rewards_G) / len(rewards_G)
            if all(r == mean for r in rewards_G):
                continue  # equal rewards: every advantage is 0
            ob = prompt.length - 1  # positions that predict prompt tokens carry no loss
            for seq, r in zip(group, rewards_G, strict=True):
                data.append(
                    types.Datum(
                        model_input=prompt.append(types.EncodedTextChunk(tokens=seq.tokens[:-1])),
                        loss_fn_inputs={
                            "target_tokens": [0] * ob + seq.tokens,
                            "logprobs": [0.0] * ob + seq.logprobs,
                            "advantages": [0.0] * ob + [r - mean] * len(seq.tokens),
                        },
                    )
                )
        if data:
            if args.custom:
                fwd = training.forward_backward_custom(data, importance_sampling)
            else:
                fwd = training.forward_backward(data, args.loss)
            opt = training.optim_step(adam)  # queued behind forward_backward
            fwd.result(), opt.result()
        sampler = training.save_weights_and_get_sampling_client()
        print(
            f"step {step + 1}/{args.steps}: reward {sum(rewards) / len(rewards):.3f}, "
            f"trained on {len(data)} sequences, {time.perf_counter() - started:.0f} s",
            flush=True,
        )

    after = accuracy(sampler, renderer, held_out, args.max_tokens)
    minutes = (time.perf_counter() - started) / 60
    print(f"held-out greedy accuracy: {before:.1%} -> {after:.1%} in {args.steps} steps, {minutes:.1f} min of training")
    service.close()


if __name__ == "__main__":
    main()
