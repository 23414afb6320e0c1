"""Buffer throughput: experiences/s written and read by the `sqlite` and `memory` storages.

Run from the repository root (the exact command is also written into the results)::

    python benchmarks/buffer.py            # about a minute on 2 busy cores

What is measured, all in one process and one run, medians over ``--repeats``:

- write: ``put`` of experiences of 512 tokens (64 prompt + 448 response, with logprobs,
  mask and reward), batch size 1 and 64; a fresh storage per repeat.
- read: the trainer's cycle on a full storage -- ``claim(batch)`` then ``commit(step)`` --
  batch size 1 and 64. It includes decoding rows back into ``Experience`` objects.
- explorer: experiences/s that our rollout engine (``trinity_like.explorer.engine``)
  produces on the tiny model (``trinity_like.models.tiny``, a 0.1 M-parameter Qwen2) on
  this CPU: a GRPO-shaped call of 16 prompts x 8 samples, up to 64 new tokens. The tiny
  model is the fastest explorer this framework can run on CPU, so the ratio to it is the
  conservative one (SmolLM2-135M produces far fewer experiences per second).

Target: the SQLite path sustains at least 20x the explorer's experience rate.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from trinity_like.buffer.memory_storage import MemoryParams, MemoryStorage
from trinity_like.buffer.sqlite_storage import SqliteParams, SqliteStorage
from trinity_like.experience import Experience

RESULTS = Path(__file__).parent / "results"
PROMPT, RESPONSE = 64, 448  # 512 tokens per experience
COMMAND = "python benchmarks/buffer.py"


def make_rows(n: int, seed: int = 0) -> list[Experience]:
    rng = random.Random(seed)
    return [
        Experience(
            tokens=[rng.randrange(150_000) for _ in range(PROMPT + RESPONSE)],
            prompt_length=PROMPT,
            logprobs=[-rng.random() * 5 for _ in range(RESPONSE)],
            action_mask=[1] * RESPONSE,
            reward=rng.random(),
            group_id=f"g{i // 8}",
            task_id=f"t{i // 8}",
            model_version=i // 64,
            finish_reason="stop",
        )
        for i in range(n)
    ]


def open_storage(kind: str, folder: Path, capacity: int) -> SqliteStorage | MemoryStorage:
    if kind == "sqlite":
        return SqliteStorage(params=SqliteParams(path=str(folder / f"b{time.monotonic_ns()}.sqlite")))
    return MemoryStorage(params=MemoryParams(capacity=capacity))


def time_write(kind: str, rows: list[Experience], batch: int, folder: Path) -> float:
    storage = open_storage(kind, folder, capacity=len(rows))
    start = time.perf_counter()
    for i in range(0, len(rows), batch):
        storage.put(rows[i : i + batch])
    elapsed = time.perf_counter() - start
    storage.close()
    return len(rows) / elapsed


def time_read(kind: str, rows: list[Experience], batch: int, folder: Path) -> float:
    storage = open_storage(kind, folder, capacity=len(rows))
    storage.put(rows)
    start = time.perf_counter()
    got, step = 0, 0
    while got < len(rows):
        got += len(storage.claim(batch, timeout=0))
        step += 1
        storage.commit(step)
    elapsed = time.perf_counter() - start
    storage.close()
    return len(rows) / elapsed


def median_rate(fn: Callable[[], float], repeats: int) -> float:
    return statistics.median(fn() for _ in range(repeats))


def explorer_rate(repeats: int) -> dict[str, float | int | str]:
    """Experiences/s of our rollout engine on the tiny model: 16 prompts x 8 samples, 64 new tokens."""
    from trinity_like.explorer.engine import RolloutEngine, SamplingParams
    from trinity_like.models.tiny import build_tiny_model

    model, tok = build_tiny_model(seed=0)
    engine = RolloutEngine(model, tok)
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"What is {a} + {a % 7}?"}],
                                       tokenize=False, add_generation_prompt=True) for a in range(16)]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    sampling = SamplingParams(n=8, max_new_tokens=64, seed=1)
    rates, lengths = [], []
    for r in range(repeats):
        start = time.perf_counter()
        groups = engine.generate(ids, SamplingParams(**{**sampling.__dict__, "seed": r}))
        elapsed = time.perf_counter() - start
        samples = [s for g in groups for s in g]
        rates.append(len(samples) / elapsed)
        lengths += [len(s.token_ids) for s in samples]
    return {
        "engine": "trinity_like.explorer.engine.RolloutEngine on trinity_like.models.tiny (Qwen2, hidden 64, 2 layers)",
        "workload": "16 prompts x 8 samples, max 64 new tokens, T=1.0",
        "experiences_per_s": statistics.median(rates),
        "mean_response_tokens": statistics.fmean(lengths),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5, help="repetitions per cell (median reported)")
    parser.add_argument("--rows", type=int, default=1024, help="experiences per repetition at batch 64")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = make_rows(args.rows)
    cells = []
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        for kind in ("sqlite", "memory"):
            for batch in (1, 64):
                n = rows if batch == 64 else rows[: max(64, len(rows) // 4)]
                write = median_rate(lambda: time_write(kind, n, batch, folder), args.repeats)
                read = median_rate(lambda: time_read(kind, n, batch, folder), args.repeats)
                cells.append({"storage": kind, "batch": batch, "rows": len(n), "write_per_s": write, "read_per_s": read})
                print(f"{kind:7s} batch {batch:3d}: write {write:9.0f}/s  read {read:9.0f}/s", flush=True)
    explorer = explorer_rate(args.repeats)
    print(f"explorer: {explorer['experiences_per_s']:.1f} experiences/s", flush=True)
    slowest_sqlite = min(min(c["write_per_s"], c["read_per_s"]) for c in cells if c["storage"] == "sqlite")
    report = {
        "command": COMMAND + (f" --repeats {args.repeats}" if args.repeats != 5 else "")
        + (f" --rows {args.rows}" if args.rows != 1024 else ""),
        "tokens_per_experience": PROMPT + RESPONSE,
        "machine": f"{platform.machine()}, {platform.processor() or '?'}, python {sys.version.split()[0]}, torch threads 1",
        "cells": cells,
        "explorer": explorer,
        "sqlite_slowest_over_explorer": slowest_sqlite / explorer["experiences_per_s"],
        "target": "sqlite >= 20x explorer",
    }
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / "buffer.json").write_text(json.dumps(report, indent=2) + "\n")
    (RESULTS / "buffer.md").write_text(markdown(report))
    print(f"sqlite slowest cell / explorer = {report['sqlite_slowest_over_explorer']:.0f}x")


def markdown(report: dict) -> str:
    lines = [
        "# Buffer throughput (experiences/s, 512 tokens each)",
        "",
        f"Command: `{report['command']}` (medians; one run, one process; {report['machine']}).",
        "",
        "| storage | batch | write /s | read (claim + commit) /s |",
        "|---|---|---|---|",
    ]
    for c in report["cells"]:
        lines.append(f"| {c['storage']} | {c['batch']} | {c['write_per_s']:,.0f} | {c['read_per_s']:,.0f} |")
    e = report["explorer"]
    lines += [
        "",
        f"Explorer: {e['experiences_per_s']:.1f} experiences/s -- {e['engine']}, {e['workload']} "
        f"(mean response {e['mean_response_tokens']:.0f} tokens).",
        "",
        f"Slowest SQLite cell / explorer rate: **{report['sqlite_slowest_over_explorer']:.0f}x** "
        f"(target {report['target']}).",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
