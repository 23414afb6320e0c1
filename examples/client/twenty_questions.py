"""Two models, one game: SmolLM2 learns to play Twenty Questions against a frozen copy of itself.

    python examples/client/twenty_questions.py

The `twenty_questions` env (cookbook/envs/twenty_questions.py) shows the player a list of
6 words; the host holds one of them. Each turn the player asks a yes/no question -- answered
by the frozen answerer model, the built-in model prompted with the secret word, on its own
rollout engine -- or guesses ("Is it a lamp?", judged by rule). A right guess at turn t is
worth 1 - 0.1 (t - 1), a guess of a word already ruled out costs 0.2; after 4 turns the game is
lost. `cookbook.rl.train.train`
plays groups of games on a SamplingClient, centres each game's reward on its group's mean
and trains the player's own tokens (the host's words carry no loss).

Success rates are measured greedily before and after training, on games over the training
words (new lists) and on games over held-out words the player never saw in training.
Metrics go to <log-path>/metrics.jsonl; a rerun with the same --log-path resumes.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import trinity_like.client as tinker
from cookbook.envs.twenty_questions import (
    HELD_OUT_WORDS,
    TRAIN_WORDS,
    TwentyQuestionsTaskParams,
    twenty_questions_tasks,
)
from cookbook.rl.train import RLTrainConfig, evaluate, train
from trinity_like.envs.dataset import build_env_factory
from trinity_like.monitor.sinks import read_jsonl_metrics

EVAL_SEED = 1000  # the lists of evaluation games differ from the training games'


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct", help="the player (trained)")
    p.add_argument("--answerer", default="smollm2-135m-instruct", help="the host's model (frozen)")
    p.add_argument("--iterations", type=int, default=20)
    p.add_argument("--batch", type=int, default=8, help="games (env groups) per iteration")
    p.add_argument("--group", type=int, default=8, help="episodes per game")
    p.add_argument("--lr", type=float, default=2e-5)
    p.add_argument("--max-turns", type=int, default=4)
    p.add_argument("--candidates", type=int, default=6, help="words in a game's list")
    p.add_argument("--repeat-penalty", type=float, default=0.2, help="cost of guessing a word already ruled out")
    p.add_argument("--eval-games", type=int, default=2, help="evaluation games per word")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--log-path", default="runs/client_twenty_questions")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args()


def main() -> None:
    args = parse_args()
    log_path = Path(args.log_path)
    config = RLTrainConfig(
        log_path=str(log_path),
        iterations=args.iterations,
        batch_size=args.batch,
        group_size=args.group,
        learning_rate=args.lr,
        eval_every=args.eval_every,
        save_every=args.eval_every,
        seed=args.seed,
    )
    lists = TwentyQuestionsTaskParams(candidates=args.candidates)
    train_tasks = twenty_questions_tasks("train", args.iterations * args.batch, seed=args.seed, params=lists)
    seen_words = twenty_questions_tasks("train", args.eval_games * len(TRAIN_WORDS), seed=EVAL_SEED, params=lists)
    held_out = twenty_questions_tasks("eval", args.eval_games * len(HELD_OUT_WORDS), seed=EVAL_SEED, params=lists)
    started = time.perf_counter()
    with tinker.ServiceClient(log_dir=log_path / "client") as service:  # checkpoints in the run
        training = service.create_lora_training_client(args.model, rank=0, seed=args.seed)  # full fine-tune
        env_args = {"max_turns": args.max_turns, "answerer_model": args.answerer, "repeat_penalty": args.repeat_penalty}
        factory = build_env_factory("twenty_questions", env_args, tokenizer=training.get_tokenizer())
        before_file = log_path / "before_training_words.json"  # kept, so a resumed run reports the true start
        if not before_file.exists():
            log_path.mkdir(parents=True, exist_ok=True)
            before = evaluate(training.save_weights_and_get_sampling_client(), factory, seen_words, config)
            before_file.write_text(json.dumps(before))
        before = json.loads(before_file.read_text())
        train(config, training, factory, train_tasks, held_out)
        after = evaluate(training.save_weights_and_get_sampling_client(), factory, seen_words, config)
    evals = [row for row in read_jsonl_metrics(log_path / "metrics.jsonl") if "eval/accuracy" in row]
    first, last = evals[0], evals[-1]
    summary = {
        "training_words": {
            "before": before["eval/env/solved"],
            "after": after["eval/env/solved"],
            "games": len(seen_words),
        },
        "held_out_words": {
            "before": first["eval/env/solved"],
            "after": last["eval/env/solved"],
            "games": len(held_out),
        },
        "guesses_per_game": {"before": first["eval/env/guesses"], "after": last["eval/env/guesses"]},
        "questions_per_game": {"before": first["eval/env/questions"], "after": last["eval/env/questions"]},
        "repeats_per_game": {"before": first["eval/env/repeats"], "after": last["eval/env/repeats"]},
        "iterations": last["step"],
        "minutes": round((time.perf_counter() - started) / 60, 1),
    }
    (log_path / "summary.json").write_text(json.dumps(summary, indent=2))
    print(
        f"success, training words ({len(seen_words)} games): {before['eval/env/solved']:.1%} -> "
        f"{after['eval/env/solved']:.1%}; held-out words ({len(held_out)} games): {first['eval/env/solved']:.1%} -> "
        f"{last['eval/env/solved']:.1%}; after iteration {last['step']}, {summary['minutes']} min"
    )


if __name__ == "__main__":
    main()
