"""How fast `trinity-like view` opens one step's rollouts in a run of 100k experiences.

Run from the repository root (the exact command is also written into the results)::

    python benchmarks/view.py              # about a minute: most of it writes the buffer

It writes a synthetic run directory through the real SQLite buffer (``SqliteStorage``):
``--rows`` experiences of the main job's shape (8 prompts x 8 samples per step, so 100k
rows are ~1,560 steps; 42 prompt + 64 response tokens of SmolLM2's vocabulary, sampler
logprobs, 0/1 rewards), each step's rows claimed, given a training record (advantages and
trainer logprobs) and committed as a run's trainer does, plus a metrics.jsonl of one row per step. Then it starts the real
server (``trinity_like.view.server``, uvicorn in a thread) and times, over HTTP as the page
asks for them, medians over ``--repeats`` steps picked at random:

- the step list (``/versions``: one row count per step, read once when the tab opens);
- one step's page (``/rollouts?version=v``: 64 samples, text and per-token logprobs);
- the same with a text filter (every sample of the step decoded to match it);
- the whole metrics file (``/metrics``: what the curves load first);
- in headless Chromium, where one is installed (scripts/setup.sh): from the click on a step
  to its samples drawn on the page.

The tokenizer loads on the first rollout request (once per server); that first request is
reported apart. Target: a step's page under 1 s.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from harness import RESULTS, git_commit, md_table, write_results  # noqa: E402

from trinity_like.buffer.rows import TrainedRecord  # noqa: E402
from trinity_like.buffer.sqlite_storage import SqliteParams, SqliteStorage  # noqa: E402
from trinity_like.experience import Experience  # noqa: E402
from trinity_like.models.resolve import load_tokenizer  # noqa: E402

MODEL = "smollm2-135m-instruct"
PROMPT, RESPONSE, GROUP, GROUPS = 42, 64, 8, 8  # tokens; samples per prompt, prompts per step


def write_run(run_dir: Path, rows: int, vocab: int, seed: int = 0) -> float:
    """A run directory of ``rows`` experiences in the real buffer; returns the seconds it took."""
    rng = random.Random(seed)
    run_dir.mkdir(parents=True)
    buffer = {"experience": {"storage": "sqlite", "args": {}}}
    (run_dir / "config.json").write_text(json.dumps({"name": "synthetic", "model": {"path": MODEL}, "buffer": buffer}))
    t0 = time.perf_counter()
    steps = -(-rows // (GROUP * GROUPS))
    with SqliteStorage(params=SqliteParams(), run_dir=run_dir) as buf, open(run_dir / "metrics.jsonl", "w") as fh:
        for step in range(steps):
            batch = []
            for g in range(min(GROUPS, -(-(rows - step * GROUP * GROUPS) // GROUP))):
                prompt = [rng.randrange(vocab) for _ in range(PROMPT)]
                for _ in range(GROUP):
                    response = [rng.randrange(vocab) for _ in range(RESPONSE)]
                    batch.append(
                        Experience(
                            tokens=prompt + response,
                            prompt_length=PROMPT,
                            logprobs=[-rng.random() * 3 for _ in response],
                            reward=float(rng.random() < 0.3),
                            group_id=f"{step}-{g}",
                            task_id=f"task-{step}-{g}",
                            model_version=step,
                            finish_reason=rng.choice(("stop", "length")),
                        )
                    )
            buf.put(batch[: rows - step * GROUP * GROUPS])
            # the trainer's half: claim, record what the step computed (advantages and its own
            # logprobs: what the colour toggle reads), commit -- as a real run leaves the buffer
            trained = buf.claim(len(batch), timeout=0)
            buf.record_trained(
                step + 1,
                [
                    TrainedRecord(
                        r.eid,
                        {"advantages": [r.reward - 0.3] * RESPONSE, "trainer_logprob": [x + 0.01 for x in r.logprobs]},
                    )
                    for r in trained
                ],
            )
            buf.commit(step + 1)
            row = {"step": step + 1, "reward/mean": rng.random(), "loss": rng.random(), "time/step": 10.0}
            fh.write(json.dumps({**row, "throughput/tokens_per_s": 100.0}) + "\n")
    return time.perf_counter() - t0


def start_server(run_dir: Path) -> str:
    import socket

    import uvicorn

    from trinity_like.view.run import Run
    from trinity_like.view.server import build_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(
        uvicorn.Config(build_app([Run.open(run_dir)]), host="127.0.0.1", port=port, log_level="warning")
    )
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    return f"http://127.0.0.1:{port}"


def timed_get(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url) as r:
        body = r.read()
    return time.perf_counter() - t0, len(body)


def browser_times(url: str, versions: list[int]) -> list[float] | None:
    """Seconds from the click on each step to its samples on the page, in headless Chromium (None: no browser)."""
    import shutil

    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    exe = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
    if exe is None:
        return None
    times = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=exe, args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url)
        page.click("text=Rollouts")
        page.wait_for_selector(".sample")
        for v in versions:
            t0 = time.perf_counter()
            page.click(f".step[data-version='{v}']")
            page.wait_for_function(f"document.querySelector('#summary').textContent.startsWith('step {v}:')")
            times.append(time.perf_counter() - t0)
        browser.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=100_000, help="experiences in the synthetic buffer")
    parser.add_argument("--repeats", type=int, default=20, help="steps timed (medians)")
    parser.add_argument("--out", default=str(RESULTS / "view"), help="results prefix (.json, .md)")
    args = parser.parse_args()
    vocab = len(load_tokenizer(MODEL))
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        write_s = write_run(run_dir, args.rows, vocab)
        db_mb = (run_dir / "buffer.sqlite").stat().st_size / 2**20
        print(f"wrote {args.rows} experiences in {write_s:.1f} s ({db_mb:.0f} MB)", flush=True)
        root = start_server(run_dir)
        base = root + "/api/runs/0"
        versions_s, _ = timed_get(f"{base}/versions")
        steps = json.loads(urllib.request.urlopen(f"{base}/versions").read())
        rng = random.Random(1)
        first_s, _ = timed_get(f"{base}/rollouts?version={steps[0]['version']}")  # loads the tokenizer
        picks = [rng.choice(steps)["version"] for _ in range(args.repeats)]
        page = [timed_get(f"{base}/rollouts?version={v}") for v in picks]
        text = [timed_get(f"{base}/rollouts?version={v}&text=the") for v in picks]
        metrics = [timed_get(f"{base}/metrics") for _ in range(5)]
        clicks = browser_times(root + "/", picks)
    result = {
        "command": "python benchmarks/view.py" + (f" --rows {args.rows}" if args.rows != 100_000 else ""),
        "commit": git_commit(),
        "rows": args.rows,
        "steps": len(steps),
        "rows_per_step": GROUP * GROUPS,
        "buffer_mb": round(db_mb, 1),
        "write_s": round(write_s, 1),
        "versions_s": round(versions_s, 4),
        "first_page_s": round(first_s, 3),
        "page_s_median": round(statistics.median(t for t, _ in page), 4),
        "page_s_max": round(max(t for t, _ in page), 4),
        "page_kb": round(statistics.median(n for _, n in page) / 1024, 1),
        "text_filter_s_median": round(statistics.median(t for t, _ in text), 4),
        "metrics_s_median": round(statistics.median(t for t, _ in metrics), 4),
        "browser_click_to_page_s_median": round(statistics.median(clicks), 3) if clicks else None,
        "browser_click_to_page_s_max": round(max(clicks), 3) if clicks else None,
    }
    print(json.dumps(result, indent=1))
    write_results(args.out, result, markdown(result, args, first_s, clicks))


def markdown(r: dict, args: argparse.Namespace, first_s: float, clicks: list[float] | None) -> list[str]:
    def ms(seconds: float) -> str:
        return f"{seconds * 1e3:.0f} ms"

    rows = [
        ["step list (`/versions`)", ms(r["versions_s"])],
        [f"one step's page (`/rollouts`, {r['page_kb']:.0f} kB)", f"{ms(r['page_s_median'])} (max {ms(r['page_s_max'])})"],
        ["same, text filter", ms(r["text_filter_s_median"])],
        ["first page (loads the tokenizer)", ms(first_s)],
        ["metrics file (`/metrics`)", ms(r["metrics_s_median"])],
        ["headless Chromium: click on a step to its 64 samples drawn", f"{ms(statistics.median(clicks))} (max {ms(max(clicks))})"]
        if clicks
        else ["headless Chromium", "not installed: not measured"],
    ]  # fmt: skip
    return [
        f"Command: `{r['command']}` (commit {r['commit']})",
        "",
        f"{args.rows:,} experiences, {r['steps']:,} steps of {GROUP * GROUPS}, buffer {r['buffer_mb']:.0f} MB; "
        f"medians of {args.repeats} random steps over HTTP",
        "",
        *md_table(["request", "time"], rows),
    ]


if __name__ == "__main__":
    main()
