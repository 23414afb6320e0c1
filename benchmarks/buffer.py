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
import multiprocessing
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, cpu_name, md_table, write_results  # noqa: E402

from trinity_like.buffer.memory_storage import MemoryParams, MemoryStorage  # noqa: E402
from trinity_like.buffer.sqlite_storage import SqliteParams, SqliteStorage  # noqa: E402
from trinity_like.experience import Experience  # noqa: E402

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


class Clock:
    """Wall time and this process's CPU time of a block: the machine is shared, so CPU
    time (what the work costs) is reported beside wall time (what it took under load)."""

    def __enter__(self) -> Clock:
        self.wall, self.cpu = time.perf_counter(), time.process_time()
        return self

    def __exit__(self, *exc: object) -> None:
        self.wall, self.cpu = time.perf_counter() - self.wall, time.process_time() - self.cpu

    def rates(self, n: int) -> tuple[float, float]:
        return n / self.wall, n / self.cpu


def time_write(kind: str, rows: list[Experience], batch: int, folder: Path) -> tuple[float, float]:
    storage = open_storage(kind, folder, capacity=len(rows))
    with Clock() as clock:
        for i in range(0, len(rows), batch):
            storage.put(rows[i : i + batch])
    storage.close()
    return clock.rates(len(rows))


def time_read(kind: str, rows: list[Experience], batch: int, folder: Path) -> tuple[float, float]:
    storage = open_storage(kind, folder, capacity=len(rows))
    storage.put(rows)
    got, step = 0, 0
    with Clock() as clock:
        while got < len(rows):
            got += len(storage.claim(batch, timeout=0))
            step += 1
            storage.commit(step)
    storage.close()
    return clock.rates(len(rows))


def _write_all(path: str, rows: list[Experience], batch: int) -> None:
    storage = SqliteStorage(params=SqliteParams(path=path))
    for i in range(0, len(rows), batch):
        storage.put(rows[i : i + batch])
    storage.close()


def time_concurrent(rows: list[Experience], batch: int, folder: Path) -> tuple[float, float]:
    """An explorer process writing while this (trainer) process claims and commits: rows/s end to end.

    The CPU rate counts this process only (the reader), so it is not comparable; the wall
    rate is the end-to-end throughput of the pair.
    """
    path = str(folder / f"c{time.monotonic_ns()}.sqlite")
    reader = SqliteStorage(params=SqliteParams(path=path))
    writer = multiprocessing.get_context("fork").Process(target=_write_all, args=(path, rows, batch))
    got, step = 0, 0
    with Clock() as clock:
        writer.start()
        while got < len(rows):
            claimed = reader.claim(batch, timeout=1.0)
            got += len(claimed)
            if claimed:
                step += 1
                reader.commit(step)
        writer.join()
    reader.close()
    if writer.exitcode != 0:
        raise RuntimeError(f"writer process failed with exit code {writer.exitcode}")
    return clock.rates(len(rows))


def contention(repeats: int) -> float:
    """Wall time over CPU time of a pure Python loop: how much other processes slow this one now."""
    ratios = []
    for _ in range(repeats):
        with Clock() as clock:
            sum(range(2_000_000))
        ratios.append(clock.wall / clock.cpu)
    return statistics.median(ratios)


def median_rates(fn: Callable[[], tuple[float, float]], repeats: int) -> tuple[float, float]:
    """Median wall rate and median CPU rate over ``repeats`` runs."""
    runs = [fn() for _ in range(repeats)]
    return statistics.median(r[0] for r in runs), statistics.median(r[1] for r in runs)


def explorer_rate(repeats: int) -> dict[str, float | int | str]:
    """Experiences/s of our rollout engine on the tiny model: 16 prompts x 8 samples, 64 new tokens."""
    from trinity_like.explorer.engine import NativeEngine, SamplingParams
    from trinity_like.models.tiny import build_tiny_model

    model, tok = build_tiny_model(seed=0)
    engine = NativeEngine(model, tok)
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"What is {a} + {a % 7}?"}], tokenize=False, add_generation_prompt=True
        )
        for a in range(16)
    ]
    ids = [tok(p, add_special_tokens=False)["input_ids"] for p in prompts]
    sampling = SamplingParams(n=8, max_new_tokens=64, seed=1)
    rates, lengths = [], []
    for r in range(repeats):
        with Clock() as clock:
            groups = engine.generate(ids, SamplingParams(**{**sampling.__dict__, "seed": r}))
        samples = [s for g in groups for s in g]
        rates.append(clock.rates(len(samples)))
        lengths += [len(s.token_ids) for s in samples]
    return {
        "engine": "trinity_like.explorer.engine.NativeEngine on trinity_like.models.tiny (Qwen2, hidden 64, 2 layers)",
        "workload": "16 prompts x 8 samples, max 64 new tokens, T=1.0",
        "experiences_per_s": statistics.median(r[0] for r in rates),
        "experiences_per_cpu_s": statistics.median(r[1] for r in rates),
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
                write = median_rates(
                    lambda kind=kind, n=n, batch=batch: time_write(kind, n, batch, folder), args.repeats
                )
                read = median_rates(lambda kind=kind, n=n, batch=batch: time_read(kind, n, batch, folder), args.repeats)
                cells.append(
                    {
                        "storage": kind,
                        "batch": batch,
                        "rows": len(n),
                        "write_per_s": write[0],
                        "write_per_cpu_s": write[1],
                        "read_per_s": read[0],
                        "read_per_cpu_s": read[1],
                    }
                )
                print(
                    f"{kind:7s} batch {batch:3d}: write {write[0]:9.0f}/s ({write[1]:9.0f}/cpu-s)"
                    f"  read {read[0]:9.0f}/s ({read[1]:9.0f}/cpu-s)",
                    flush=True,
                )
        both = median_rates(lambda: time_concurrent(rows, 64, folder), args.repeats)
        concurrent = {"storage": "sqlite", "batch": 64, "rows": len(rows), "end_to_end_per_s": both[0]}
        print(f"sqlite  writer process + reader process, batch 64: {both[0]:9.0f}/s end to end", flush=True)
    explorer = explorer_rate(args.repeats)
    print(
        f"explorer: {explorer['experiences_per_s']:.1f} experiences/s ({explorer['experiences_per_cpu_s']:.1f}/cpu-s)",
        flush=True,
    )
    sqlite = [c for c in cells if c["storage"] == "sqlite"]
    ratios = {
        f"batch_{b}_{unit}": min(c[f"write_per_{unit}"], c[f"read_per_{unit}"]) / explorer[f"experiences_per_{unit}"]
        for b in (1, 64)
        for unit in ("s", "cpu_s")
        for c in sqlite
        if c["batch"] == b
    }
    report = {
        "command": COMMAND
        + (f" --repeats {args.repeats}" if args.repeats != 5 else "")
        + (f" --rows {args.rows}" if args.rows != 1024 else ""),
        "tokens_per_experience": PROMPT + RESPONSE,
        "machine": f"{cpu_name()}, python {sys.version.split()[0]}, torch threads 1",
        "cells": cells,
        "concurrent": concurrent,
        "explorer": explorer,
        "sqlite_over_explorer": ratios,  # min(write, read) of a batch size / explorer rate
        "target": "sqlite >= 20x explorer",
        "load_average_1m": os.getloadavg()[0],
        "contention_wall_over_cpu": contention(args.repeats),
    }
    write_results(RESULTS / "buffer", report, markdown(report), indent=2)
    print("sqlite min(write, read) / explorer:", {k: round(v, 1) for k, v in ratios.items()})


def markdown(report: dict) -> str:
    e, r = report["explorer"], report["sqlite_over_explorer"]
    lines = [
        "# Buffer throughput (experiences/s, 512 tokens each)",
        "",
        f"Command: `{report['command']}` -- medians, one run, one process; {report['machine']}; "
        f"1-minute load average {report['load_average_1m']:.1f} on a shared 2-core machine, where a pure "
        f"Python loop took {report['contention_wall_over_cpu']:.1f}x its CPU time in wall time: each rate is "
        "given per wall second and per CPU second of this process (what the work costs).",
        "",
    ]
    rates = ("write_per_s", "write_per_cpu_s", "read_per_s", "read_per_cpu_s")
    rows = [[c["storage"], c["batch"], *(f"{c[k]:,.0f}" for k in rates)] for c in report["cells"]]
    lines += md_table(["storage", "batch", "write /s", "write /CPU-s", "read (claim + commit) /s", "read /CPU-s"], rows)
    c = report["concurrent"]
    lines += [
        "",
        f"Concurrent: an explorer process writing while the trainer process claims and commits "
        f"(sqlite, batch {c['batch']}, {c['rows']} rows): **{c['end_to_end_per_s']:,.0f} experiences/s** end to end (wall).",
        "",
        f"Explorer: {e['experiences_per_s']:.1f} experiences/s ({e['experiences_per_cpu_s']:.1f} per CPU-s) -- "
        f"{e['engine']}, {e['workload']} (mean response {e['mean_response_tokens']:.0f} tokens).",
        "",
        "SQLite min(write, read) over the explorer rate (target: at least 20x):",
        "",
        *md_table(
            ["batch", "wall", "CPU"],
            ([b, f"{r[f'batch_{b}_s']:.0f}x", f"{r[f'batch_{b}_cpu_s']:.0f}x"] for b in (1, 64)),
        ),
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
