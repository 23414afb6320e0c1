"""Writes the small data files the example recipes use (deterministic; re-run to regenerate).

    python scripts/make_example_data.py

- examples/data/sft_arith.jsonl        chat SFT rows: calculator system prompt, question, the right answer
- examples/data/sft_arith_eval.jsonl   the same shape, from the held-out split (never trained on)
- examples/data/pairs_arith.jsonl      preference pairs: the right answer vs a near-miss wrong one
- examples/data/pairs_arith_eval.jsonl held-out pairs
- examples/data/pairs_tiny.jsonl       the 4-pair example of the `rm` recipe
Train rows come from the arithmetic generator's train split, eval rows from its eval split,
so no eval problem is ever trained on.
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
        write(f"sft_arith{suffix}.jsonl", [
            {"messages": [{"role": "system", "content": t.system_prompt}, {"role": "user", "content": t.prompt},
                          {"role": "assistant", "content": t.answer}]}
            for t in tasks
        ])
        write(f"pairs_arith{suffix}.jsonl", [
            {"prompt": [{"role": "system", "content": t.system_prompt}, {"role": "user", "content": t.prompt}],
             "chosen": t.answer, "rejected": str(near_miss(int(t.answer), rng))}
            for t in tasks
        ])
    write("pairs_tiny.jsonl", [
        {"prompt": "What is 2+2?", "chosen": "4", "rejected": "5"},
        {"prompt": "What is 3+5?", "chosen": "8", "rejected": "7"},
        {"prompt": "What is 10-4?", "chosen": "6", "rejected": "14"},
        {"prompt": "What is 6*7?", "chosen": "42", "rejected": "36"},
    ])


if __name__ == "__main__":
    main()
