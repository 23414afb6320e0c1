"""RL on an environment with the client's reusable loop: SmolLM2 learns to use a calculator.

    python examples/client/rl_env.py                       # calculator env, importance_sampling
    python examples/client/rl_env.py --kl 0.01 --per-turn  # KL to the base as reward shaping, per-turn advantages
    python examples/client/rl_env.py --advantage rloo      # another ADVANTAGE_FN by name (grpo, a plugin's, ...)

The `calculator` env (cookbook/envs/calculator.py) asks "What is 123 + 456?"; the model
may write <calc>123+456</calc>, reads the result as the next message, then answers (reward 1
for the right number). `cookbook.rl.train.train` plays groups of episodes on a
SamplingClient, centres each episode's reward on its group's mean (the registered advantage fn
`group_centered`; --advantage names another), trains the policy's own
tokens with a TrainingClient, and evaluates greedily on held-out problems every
--eval-every iterations. Metrics go to <log-path>/metrics.jsonl (`trinity-like plot <log-path>`);
a rerun with the same --log-path resumes from its last checkpoint.

Measured (2 shared CPU cores, load 5-7): held-out greedy accuracy 54.7 % -> 100 % on 64
problems, calculator use 51.6 % -> 100 %, in 12 iterations and 13.3 min (docs/client.md).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import trinity_like.client as tinker
from cookbook.envs.calculator import calculator_tasks
from cookbook.rl.train import RLTrainConfig, train
from trinity_like.envs.dataset import build_env_factory
from trinity_like.monitor.sinks import read_jsonl_metrics


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--iterations", type=int, default=12)
    p.add_argument("--batch", type=int, default=8, help="problems (env groups) per iteration")
    p.add_argument("--group", type=int, default=8, help="episodes per problem")
    p.add_argument("--substeps", type=int, default=1, help="optimiser steps per iteration")
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--loss", default="importance_sampling", choices=["importance_sampling", "ppo"])
    p.add_argument("--kl", type=float, default=0.0, help="kl_penalty_coef: beta of the KL-to-base reward shaping")
    p.add_argument("--per-turn", action="store_true", help="per-turn advantages from returns-to-go")
    p.add_argument("--advantage", default="group_centered", help="ADVANTAGE_FN name: group_centered, rloo, grpo, ...")
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--eval", type=int, default=64, help="held-out problems")
    p.add_argument("--eval-every", type=int, default=6)
    p.add_argument("--log-path", default="runs/client_rl_env")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    config = RLTrainConfig(
        log_path=args.log_path,
        iterations=args.iterations,
        batch_size=args.batch,
        group_size=args.group,
        num_substeps=args.substeps,
        learning_rate=args.lr,
        loss_fn=args.loss,
        kl_penalty_coef=args.kl,
        advantage=args.advantage,
        advantage_per_turn=args.per_turn,
        eval_every=args.eval_every,
        save_every=args.eval_every,
        seed=args.seed,
    )
    with tinker.ServiceClient(log_dir=Path(args.log_path) / "client") as service:  # checkpoints in the run
        training = service.create_lora_training_client(args.model, rank=0, seed=args.seed)  # full fine-tune
        factory = build_env_factory("calculator", {"max_turns": args.max_turns}, tokenizer=training.get_tokenizer())
        train_tasks = calculator_tasks("train", args.iterations * args.batch, seed=args.seed)
        started = time.perf_counter()
        train(config, training, factory, train_tasks, calculator_tasks("eval", args.eval, seed=args.seed))
    logged = read_jsonl_metrics(Path(args.log_path) / "metrics.jsonl")  # a resumed run's earlier rows too
    evals = [row for row in logged if "eval/accuracy" in row]
    first, last = evals[0], evals[-1]
    print(
        f"held-out greedy accuracy: {first['eval/accuracy']:.1%} -> {last['eval/accuracy']:.1%} "
        f"(tool use {first['eval/env/used_tool']:.1%} -> {last['eval/env/used_tool']:.1%}) "
        f"after iteration {last['step']}, {(time.perf_counter() - started) / 60:.1f} min"
    )


if __name__ == "__main__":
    main()
