"""Writes the small data files the example recipes use (deterministic; re-run to regenerate).

    python scripts/make_example_data.py

- examples/data/sft_arith.jsonl        chat SFT rows: calculator system prompt, question, the bare right answer
- examples/data/sft_arith_eval.jsonl   the same shape, from the held-out split (never trained on)
- examples/data/mix_arith.jsonl        MIX expert rows: the same 256 questions answered "a + b = c"
- examples/data/mix_hard_arith.jsonl   MIX expert rows for 2-digit + 2-digit addition (mix_hard recipe), "a + b = c"
- examples/data/pairs_arith.jsonl      preference pairs: the right answer vs a near-miss wrong one
- examples/data/pairs_arith_eval.jsonl held-out pairs
- examples/data/pairs_tiny.jsonl       the 4-pair example of the `rm` recipe
Train rows come from the arithmetic generator's train split, eval rows from its eval split,
so no eval problem is ever trained on.

Why two answer styles: the exact-match reward reads the *last number* of a response, and
GRPO alone teaches SmolLM2 to restate the sum (``"60 + 1 = 61"``). MIX's expert rows pull
the policy towards their own answers, so they should show the answer style that earns the
reward -- the restated sum -- not fight it (see examples/mix.yaml and mix_bare_answers.yaml).
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from trinity_like.explorer.tasks import ArithmeticParams, arithmetic_tasks

OUT = Path(__file__).resolve().parents[1] / "examples" / "data"


def near_miss(answer: int, rng: random.Random) -> int:
    """A plausible wrong answer: off by one or ten, or a carry dropped."""
    wrong = answer + rng.choice([-10, -1, 1, 10])
    return wrong if wrong != answer and wrong >= 0 else answer + 1


# 2-digit + 2-digit addition: the harder task of examples/mix_hard.yaml (keep the two in step).
HARD = ArithmeticParams(ranges=((10, 99), (10, 99)))


def chat_rows(tasks: list, answer) -> list[dict]:
    """``{"messages": [system, user, assistant]}`` rows with ``answer(task)`` as the assistant's reply."""
    return [
        {
            "messages": [
                {"role": "system", "content": t.system_prompt},
                {"role": "user", "content": t.prompt},
                {"role": "assistant", "content": answer(t)},
            ]
        }
        for t in tasks
    ]


def restated(task) -> str:
    """The worked answer GRPO converges to: ``"60 + 1 = 61"`` (the reward reads the last number)."""
    return f"{task.info['expression']} = {task.answer}"


def write(name: str, rows: list[dict]) -> None:
    with open(OUT / name, "w", encoding="utf-8") as fh:
        for row in rows:
            fh.write(json.dumps(row) + "\n")


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    params = ArithmeticParams()
    rng = random.Random(0)
    for split, count, suffix in (("train", 256, ""), ("eval", 64, "_eval")):
        tasks = arithmetic_tasks(params, split=split, count=count)
        write(f"sft_arith{suffix}.jsonl", chat_rows(tasks, lambda t: t.answer))
        write(
            f"pairs_arith{suffix}.jsonl",
            [
                {
                    "prompt": [{"role": "system", "content": t.system_prompt}, {"role": "user", "content": t.prompt}],
                    "chosen": t.answer,
                    "rejected": str(near_miss(int(t.answer), rng)),
                }
                for t in tasks
            ],
        )
    write("mix_arith.jsonl", chat_rows(arithmetic_tasks(params, split="train", count=256), restated))
    write("mix_hard_arith.jsonl", chat_rows(arithmetic_tasks(HARD, split="train", count=256), restated))
    write(
        "pairs_tiny.jsonl",
        [
            {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"},
            {"prompt": "What is 3+5?", "chosen": "8", "rejected": "7"},
            {"prompt": "What is 10-4?", "chosen": "6", "rejected": "14"},
            {"prompt": "What is 6*7?", "chosen": "42", "rejected": "36"},
        ],
    )


if __name__ == "__main__":
    main()
