"""The view as a person sees it: a real headless Chromium (Debian's ``chromium``, driven by Playwright)
on the page ``trinity-like view`` serves for a tiny finished run, and on ``trinity-like report``'s file.

scripts/setup.sh installs the browser; where none is found these tests skip and say so.
Screenshots go to each test's temporary folder.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _lib.tiny_runs import run

from trinity_like.buffer.rows import unpack, unpack_floats
from trinity_like.models.resolve import load_tokenizer

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def find_browser() -> str | None:
    return os.environ.get("TRINITY_LIKE_CHROMIUM") or next(filter(None, map(shutil.which, BROWSERS)), None)


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="playwright is not installed (pip install -e '.[test]')"
    )
    executable = find_browser()
    if executable is None:
        pytest.skip(
            f"no Chromium found ({', '.join(BROWSERS)} on PATH, or $TRINITY_LIKE_CHROMIUM): "
            "scripts/setup.sh installs Debian's chromium"
        )
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=executable, args=["--no-sandbox"])
        yield b
        b.close()


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory) -> Path:
    """3 steps on the tiny model, evaluated at steps 0, 2 and 3."""
    return run(tmp_path_factory.mktemp("view"), "trainer.total_steps=3", "monitor.eval_interval=2")


def serve(*run_dirs: Path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen(
        [sys.executable, "-m", "trinity_like.cli", "view", *map(str, run_dirs), "--port", str(port)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 60
    while socket.socket().connect_ex(("127.0.0.1", port)) != 0:
        assert proc.poll() is None and time.monotonic() < deadline, (
            proc.stdout.read() if proc.poll() is not None else "no server"
        )
        time.sleep(0.1)
    return proc, f"http://127.0.0.1:{port}/"


@pytest.fixture(scope="module")
def server(tiny_run):
    proc, url = serve(tiny_run)
    yield url
    proc.terminate()
    proc.wait(timeout=10)


@pytest.fixture
def page(browser, tmp_path):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    pg.screenshot(path=str(tmp_path / "page.png"), full_page=True)
    context.close()
    assert not errors, errors


def metrics(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def stored_rows(run_dir: Path, version: int) -> list:
    """The buffer's rows of ``version``, read with plain sqlite3 (not the view's code)."""
    db = sqlite3.connect(f"file:{run_dir / 'buffer.sqlite'}?mode=ro", uri=True)
    got = db.execute(
        "SELECT kind, header, arrays FROM rows JOIN state USING (seq) WHERE model_version = ? ORDER BY seq", (version,)
    ).fetchall()
    db.close()
    return [unpack(*row) for row in got]


def points(pg, title: str) -> int:
    return int(pg.get_attribute(f".panel[data-title='{title}']", "data-points"))


def test_curves_render_one_point_per_logged_step(page, server, tiny_run):
    page.goto(server)
    page.wait_for_selector(".panel[data-title='reward'] canvas")
    rows = metrics(tiny_run)
    assert points(page, "reward") == sum("reward/mean" in r for r in rows) == 3
    assert points(page, "held-out accuracy (+- 1 s.e.)") == sum("eval/accuracy" in r for r in rows) == 3
    drawn = page.evaluate("viewer.charts['reward'].data")
    assert [y for y in drawn[1] if y is not None] == [r["reward/mean"] for r in rows if "reward/mean" in r]
    for title in ("loss", "response length (tokens)", "seconds per step, by phase", "tokens / s"):
        assert points(page, title) > 0, title


def test_a_step_shows_its_samples_coloured_by_logprob(page, server, tiny_run):
    tok = load_tokenizer("tiny-random")
    rows = stored_rows(tiny_run, 1)
    page.goto(server)
    page.click("text=Rollouts")
    page.click(".step[data-version='1']")
    page.wait_for_function("document.querySelector('#summary').textContent.startsWith('step 1:')")
    samples = page.query_selector_all(".sample")
    assert len(samples) == len(rows) == 16
    first = samples[0]
    assert first.query_selector(".response").inner_text() == "".join(
        tok.batch_decode([[t] for t in rows[0].response_tokens])
    )
    tokens = first.query_selector_all(".tok")
    assert len(tokens) == rows[0].response_length
    for span, logprob in zip(tokens, rows[0].logprobs):  # red in proportion to how unlikely the sampler found it
        colour = span.evaluate("el => getComputedStyle(el).backgroundColor")
        alpha = colour.rsplit(",", 1)[1].strip(" )") if colour.startswith("rgba") else "1"
        assert float(alpha) == pytest.approx(0.85 * (1 - math.exp(logprob)), abs=0.006)  # CSS keeps 2 decimals
    assert not page.is_disabled("input[value=ratio]") and not page.is_disabled(
        "input[value=advantage]"
    )  # step 2 trained them
    assert page.inner_text("#notes") == ""


def test_filter_by_reward(page, server, tiny_run):
    rows = stored_rows(tiny_run, 2)
    page.goto(server)
    page.click("text=Rollouts")
    page.click(".step[data-version='2']")
    page.fill("input[name=reward_min]", "1")
    page.click("#filters button[type=submit]")
    wanted = sum(r.reward >= 1 for r in rows)
    page.wait_for_function(f"document.querySelector('#summary').textContent.includes('{wanted} of 16')")
    shown = [float(s.get_attribute("data-reward")) for s in page.query_selector_all(".sample")]
    assert shown == [1.0] * wanted and 0 < wanted < 16


def test_a_tab_clicked_before_the_runs_arrive_opens_once_they_do(page, server):
    """A person clicks "Rollouts" the moment the page shows: the list of runs still on its way (held
    back here) must not swallow the click."""
    held = []
    page.route("**/api/runs", lambda route: held.append(route))
    page.goto(server)
    while not held:
        page.wait_for_timeout(20)
    page.click("text=Rollouts")
    held[0].continue_()
    page.click(".step[data-version='1']")
    page.wait_for_function("document.querySelector('#summary').textContent.startsWith('step 1:')")


def test_held_out_problems_followed_across_evaluations(page, server, tiny_run):
    page.goto(server)
    page.click("text=Held-out")
    page.wait_for_selector("table.evals")
    header = [th.inner_text() for th in page.query_selector_all("table.evals th")]
    assert header == ["problem", "reference", "step 0", "step 2", "step 3"]
    assert len(page.query_selector_all("table.evals tr[data-task]")) == 8
    # the whole prompt the model got, system prompt included, as evals.jsonl keeps it
    item = json.loads((tiny_run / "evals.jsonl").read_text().splitlines()[0])
    system, user = item["messages"]
    row = page.query_selector(f"table.evals tr[data-task='{item['task_id']}']")
    assert row.query_selector("td.problem").inner_text() == f"{system['role']}: {system['content']}\n{user['content']}"
    assert row.query_selector("td.reference").inner_text() == item["answer"] == item["reference"]
    page.fill("#ev-text", "What is")
    assert len(page.query_selector_all("table.evals tr[data-task]")) == 8


def test_several_runs_overlaid_live_and_a_run_without_buffer(browser, tiny_run, tmp_path):
    live = tmp_path / "live"
    shutil.copytree(tiny_run, live, ignore=shutil.ignore_patterns("checkpoints", "buffer.sqlite*"))
    proc, url = serve(tiny_run, live)
    try:
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.goto(url)
        pg.wait_for_selector(".panel[data-title='reward'] canvas")
        assert points(pg, "reward") == 6
        with open(live / "metrics.jsonl", "a") as fh:  # the run writes another step
            fh.write(json.dumps({"step": 4, "reward/mean": 0.75}) + "\n")
        pg.wait_for_function(
            "document.querySelector(\".panel[data-title='reward']\").dataset.points === '7'", timeout=10_000
        )
        pg.click("text=Rollouts")
        pg.select_option("#ro-run", "1")
        pg.wait_for_selector("#steps .message")
        assert "no buffer database" in pg.inner_text("#steps")
        pg.screenshot(path=str(tmp_path / "live.png"), full_page=True)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_report_is_one_file_that_shows_curves_and_rollouts(browser, tiny_run, tmp_path):
    out = tmp_path / "report.html"
    r = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "report", str(tiny_run), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0, r.stderr
    html = out.read_text()
    assert "static/" not in html.replace("view/static", "")  # nothing is fetched: every asset is inlined
    pg = browser.new_page()
    pg.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:") else route.continue_())
    pg.goto(out.as_uri())
    pg.wait_for_selector(".panel[data-title='reward'] canvas")
    assert points(pg, "reward") == 3
    pg.click("text=Rollouts")
    pg.wait_for_selector(".sample")
    assert len(pg.query_selector_all(".sample")) == 8  # the report keeps one group's worth per step
    pg.screenshot(path=str(tmp_path / "report.png"), full_page=True)


def trained_records(run_dir: Path, version: int) -> dict[str, dict]:
    """``eid -> {"row": ..., "advantages": [...], "trainer_logprob": [...]}`` of the trained rows of ``version``, read with plain sqlite3."""
    db = sqlite3.connect(f"file:{run_dir / 'buffer.sqlite'}?mode=ro", uri=True)
    got = db.execute(
        "SELECT r.kind, r.header, r.arrays, t.layout, t.arrays FROM rows r JOIN state s USING (seq) "
        "JOIN trained t USING (seq) WHERE s.model_version = ? ORDER BY seq",
        (version,),
    ).fetchall()
    db.close()
    return {
        row.eid: {"row": row, **unpack_floats(layout, blob)}
        for row, layout, blob in (
            (unpack(kind, header, blob), layout, t_blob) for kind, header, blob, layout, t_blob in got
        )
    }


def background(span) -> tuple[tuple[int, ...], float]:
    colour = span.evaluate("el => getComputedStyle(el).backgroundColor")
    parts = [float(x) for x in colour[colour.index("(") + 1 : -1].split(",")]
    return tuple(int(x) for x in parts[:3]), parts[3] if len(parts) == 4 else 1.0


def test_a_trained_step_is_coloured_by_logprob_ratio_and_advantage(page, server, tiny_run):
    """Version 0's rows were trained at step 1: each colouring against the values the trainer recorded."""
    records = trained_records(tiny_run, 0)
    assert records
    page.goto(server)
    page.click("text=Rollouts")
    page.click(".step[data-version='0']")
    page.wait_for_function("document.querySelector('#summary').textContent.startsWith('step 0:')")
    assert not page.is_disabled("input[value=ratio]") and not page.is_disabled("input[value=advantage]")
    checked = 0
    for mode in ("logprob", "ratio", "advantage"):
        page.check(f"input[value={mode}]")
        shown = {s.get_attribute("data-eid"): s for s in page.query_selector_all(".sample")}
        for eid, rec in records.items():
            row, spans = rec["row"], shown[eid].query_selector_all(".tok")
            assert len(spans) == row.response_length
            for t, span in enumerate(spans):
                rgb, alpha = background(span)
                if mode == "logprob":
                    want, colour = 0.85 * (1 - math.exp(row.logprobs[t])), (220, 38, 38)
                elif mode == "ratio":
                    d = row.logprobs[t] - rec["trainer_logprob"][t]
                    want, colour = min(1.0, abs(d) / 0.5) * 0.8, (37, 99, 235) if d >= 0 else (234, 88, 12)
                else:
                    a = rec["advantages"][t]
                    want, colour = min(1.0, abs(a) / 2) * 0.7, (22, 163, 74) if a >= 0 else (220, 38, 38)
                assert alpha == pytest.approx(want, abs=0.006), (mode, t)
                if want > 0.01:
                    assert rgb == colour, (mode, t)
                checked += 1
        if mode != "logprob":  # rows no step trained on (groups dropped by dynamic sampling) stay uncoloured
            for eid in set(shown) - set(records):
                assert all(background(span)[1] == 0 for span in shown[eid].query_selector_all(".tok"))
    assert checked > 0
    assert any(abs(a) > 0.1 for rec in records.values() for a in rec["advantages"])  # the advantage test saw colour


@pytest.fixture(scope="module")
def pair_runs(tmp_path_factory) -> list[Path]:
    """A tiny DPO run and a tiny reward-model run, 2 steps of 4 pairs each."""
    from _lib.tiny_runs import REPO

    from trinity_like.config import load_plan
    from trinity_like.runner import run_plan

    root, out = tmp_path_factory.mktemp("pairs"), []
    for recipe, extra in (("dpo.yaml", ["buffer.eval_tasks=null"]), ("rm_tiny.yaml", [])):
        plan = load_plan(
            REPO / "examples" / recipe,
            [
                f"run_root={root}",
                "model.path=tiny-random",
                "trainer.engine=local",
                "trainer.total_steps=2",
                "monitor.progress=false",
                "buffer.train_batch_size=4",
                "trainer.optimizer.lr=1e-3",
                *extra,
            ],
        )
        assert run_plan(plan) == 0
        out.append(Path(plan.stages[0].config.run_dir()))
    return out


@pytest.mark.parametrize("which, score, margin", [(0, "reward", "reward_margin"), (1, "scores", "margin")])
def test_dpo_and_rm_runs_show_chosen_vs_rejected_with_both_scores(browser, pair_runs, which, score, margin, tmp_path):
    run_dir = pair_runs[which]
    items = [json.loads(line) for line in (run_dir / "trained_pairs.jsonl").read_text().splitlines()]
    items = [it for it in items if it["step"] == 2]
    proc, url = serve(run_dir)
    try:
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.goto(url)
        pg.wait_for_selector("#runs span")  # the tabs' handlers attach in the same tick as this
        pg.click("text=Rollouts")
        pg.click(".step[data-version='2']")
        pg.wait_for_function("document.querySelector('#summary').textContent.startsWith('step 2:')")
        assert "4 of 4 training pairs" in pg.inner_text("#summary")
        shown = pg.query_selector_all("#groups .group[data-pair]")
        assert len(shown) == len(items) == 4
        for el, it in zip(shown, items):
            assert el.query_selector(".chosen").inner_text() == it["chosen"]
            assert el.query_selector(".rejected").inner_text() == it["rejected"]
            cells = [td.inner_text() for td in el.query_selector_all(f"tr[data-score='{score}'] td")]
            m = it["metrics"]
            assert cells == [score, f"{m[score + '_chosen']:.4f}", f"{m[score + '_rejected']:.4f}"]
            assert el.query_selector(f"tr[data-score='{margin}'] td:last-child").inner_text() == f"{m[margin]:.4f}"
        assert not pg.is_visible("#colour") and not pg.is_visible(
            "input[name=reward_min]"
        )  # pairs: no token colours, text filter only
        query = items[1]["chosen"].strip()
        wanted = [
            it["task_id"]
            for it in items
            if any(query.lower() in it[k].lower() for k in ("prompt", "chosen", "rejected"))
        ]
        pg.fill("input[name=text]", query)
        pg.click("#filters button[type=submit]")
        pg.wait_for_function(f"document.querySelector('#summary').textContent.includes('{len(wanted)} of 4')")
        assert [g.get_attribute("data-pair") for g in pg.query_selector_all("#groups .group[data-pair]")] == wanted
        pg.screenshot(path=str(tmp_path / "pairs.png"), full_page=True)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_flat_curves_get_a_range_and_an_explorer_process_curves_join_the_trainers(browser, tmp_path):
    """Split mode: explorer/metrics.jsonl beside metrics.jsonl. A curve of zeros is drawn on [-1, 1]
    (uPlot's own range for it is [0, 100]); other curves keep uPlot's range (a flat 5: [0, 10])."""
    run_dir = tmp_path / "split"
    (run_dir / "explorer").mkdir(parents=True)
    (run_dir / "config.json").write_text(json.dumps({"name": "split"}))
    trainer = [{"step": s, "reward/mean": 0.5, "kl": 0.0, "entropy": 5.0, "time/update": 1.0 + s} for s in (1, 2, 3)]
    explorer = [{"step": s, "reward/mean": 0.25 * s, "time/rollout": 2.0} for s in (1, 2, 3)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in trainer))
    (run_dir / "explorer" / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in explorer))
    proc, url = serve(run_dir)
    try:
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.goto(url)
        pg.wait_for_selector(".panel[data-title='KL'] canvas")
        assert pg.evaluate("[viewer.charts['KL'].scales.y.min, viewer.charts['KL'].scales.y.max]") == [-1, 1]
        low, high = pg.evaluate("[viewer.charts['entropy'].scales.y.min, viewer.charts['entropy'].scales.y.max]")
        assert (low, high) == (0, 10)
        labels = pg.evaluate("viewer.charts['reward'].series.map((s) => s.label)")
        assert labels[1:] == ["reward/mean", "explorer/reward/mean"]
        assert pg.evaluate("viewer.charts['reward'].data[2]") == [0.25, 0.5, 0.75]
        assert points(pg, "explorer process: seconds per step, by phase") == 3
        assert points(pg, "seconds per step, by phase") == 3
        pg.screenshot(path=str(tmp_path / "split.png"), full_page=True)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# -- hostile text: what a model wrote is data, never markup ----------------------------------------------
PWN = "window.pwned = (window.pwned || 0) + 1"
HOSTILE = [
    "<!--<script>",
    f"</script><script>{PWN}</script>",
    f"<script>{PWN}</script>",
    f'<img src=x onerror="{PWN}">',
    "]]> <![CDATA[ x ]]>",
    "line\u2028separator\u2029paragraph",
    "&lt;not an entity&gt; &amp;",
]


@pytest.fixture(scope="module")
def hostile_run(tmp_path_factory) -> Path:
    """A DPO-like run folder whose every text is hostile: run name, metric name, held-out answers, training pairs;
    and a damaged metrics line the page must name."""
    run_dir = tmp_path_factory.mktemp("hostile") / "run"
    run_dir.mkdir()
    (run_dir / "config.json").write_text(json.dumps({"name": HOSTILE[1], "algorithm": {"type": HOSTILE[0]}}))
    rows = [{"step": s, "reward/mean": s / 4, f"<script>{PWN}</script>": 1.0} for s in (1, 2, 3)]
    lines = [json.dumps(r) for r in rows]
    lines.insert(1, '{"step": 9, "reward/mean": 0.')  # a torn line: named in the page, the rest drawn
    (run_dir / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    answers = [
        {"step": 0, "kind": "answer", "task_id": f"t{i}", "prompt": t, "answer": t, "response": t, "reward": 1.0}
        for i, t in enumerate(HOSTILE)
    ]
    for a in answers:  # what the reward compared: shown beside the reference as written
        a["reference"] = a["answer"] + "#"
    (run_dir / "evals.jsonl").write_text("".join(json.dumps(a) + "\n" for a in answers))
    pairs = [
        {
            "step": 1,
            "kind": "pair",
            "task_id": f"p{i}",
            "prompt": t,
            "chosen": t,
            "rejected": t,
            "metrics": {"margin": 0.5},
        }
        for i, t in enumerate(HOSTILE)
    ]
    (run_dir / "trained_pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    return run_dir


def check_hostile_page(pg, run_dir: Path) -> None:
    """The page renders every part, shows every text exactly as written, and ran no script from the data."""
    dialogs: list[str] = []
    pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
    pg.wait_for_selector(".panel[data-title='reward'] canvas")
    assert points(pg, "reward") == 3
    assert pg.inner_text("#runs") == f"{HOSTILE[1]} ({HOSTILE[0]})"
    warnings = pg.inner_text("#warnings")
    assert f"{run_dir / 'metrics.jsonl'}:2: not JSON" in warnings
    pg.click("text=Held-out")
    pg.wait_for_selector("table.evals")
    cells = [td.inner_text() for td in pg.query_selector_all("table.evals tr[data-task] td:first-child")]
    assert cells == HOSTILE
    compared = [b.inner_text() for b in pg.query_selector_all("table.evals td.reference .compared b")]
    assert compared == [t + "#" for t in HOSTILE]
    pg.click("text=Rollouts")
    pg.click(".step[data-version='1']")
    pg.wait_for_function("document.querySelector('#summary').textContent.startsWith('step 1:')")
    assert [el.inner_text() for el in pg.query_selector_all("#groups .chosen")] == HOSTILE
    assert pg.evaluate("window.pwned") is None and not dialogs
    assert not pg.query_selector_all("img") and len(pg.query_selector_all("script")) == 3 + pg.evaluate(
        "!!window.REPORT"
    )


def test_hostile_text_is_shown_as_text_in_the_served_page(browser, hostile_run, tmp_path):
    proc, url = serve(hostile_run)
    try:
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        errors: list[str] = []
        pg.on("pageerror", lambda exc: errors.append(str(exc)))
        pg.goto(url)
        check_hostile_page(pg, hostile_run)
        pg.screenshot(path=str(tmp_path / "hostile.png"), full_page=True)
        assert not errors, errors
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_hostile_text_is_shown_as_text_in_the_report(browser, hostile_run, tmp_path):
    out = tmp_path / "report.html"
    r = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "report", str(hostile_run), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert r.returncode == 0 and "metrics.jsonl:2: not JSON" in r.stderr, r.stderr
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.route("**/*", lambda route: route.abort() if not route.request.url.startswith("file:") else route.continue_())
    pg.goto(out.as_uri())
    check_hostile_page(pg, hostile_run)
    pg.screenshot(path=str(tmp_path / "hostile_report.png"), full_page=True)
    assert not errors, errors


# -- a trinity-like compare folder: each entry's mean over seeds with its 95 % band ----------------------
BAND_PIXELS = """async ([key, k, colour]) => {
  // the chart's canvas after a redraw: for each pixel column, the rows painted in entry k's band colour
  // (the fill is the colour at alpha 0x33 over a transparent canvas); and where uPlot puts the values
  await new Promise((r) => setTimeout(r, 100));
  const u = viewer.compares[0].charts[key], c = u.ctx.canvas, px = u.ctx.getImageData(0, 0, c.width, c.height).data;
  const rgb = [1, 3, 5].map((i) => parseInt(colour.slice(i, i + 2), 16));
  const painted = (x, y) => { const i = 4 * (y * c.width + x);
    return Math.abs(px[i + 3] - 0x33) <= 2 && rgb.every((v, j) => Math.abs(px[i + j] - v) <= 3); };
  let n = 0; const top = {}, bottom = {};
  for (let x = 0; x < c.width; x++) for (let y = 0; y < c.height; y++) if (painted(x, y)) {
    n++; if (!(x in top)) top[x] = y; bottom[x] = y; }
  return {n, top, bottom, pos: u.data[0].map((s) => Math.round(u.valToPos(s, "x", true)))};
}"""


def test_a_comparison_draws_each_entrys_mean_and_band_beside_its_verdict(page, compare_dir):
    """The page of ``trinity-like view COMPARE_DIR``: one chart per metric, one colour per entry, each entry's
    line at its mean over seeds and its band between the interval's ends (the oracle's, from the runs' own
    metrics), its verdict line beside; a click on an entry's legend hides its line and its band."""
    from _lib.compare_oracle import oracle

    proc, url = serve(compare_dir)
    try:
        page.goto(url)
        page.wait_for_selector(".cmp-panel[data-key='reward/mean'] canvas")
        report = json.loads((compare_dir / "compare.json").read_text())
        verdicts = [b["line"] for b in report["comparisons"]["dr_grpo_add2"]]
        shown = page.inner_text(".verdicts li[data-entry='dr_grpo_add2']")
        assert len(verdicts) == 2 and all(line in shown for line in verdicts)
        assert "the baseline" in page.inner_text(".verdicts li[data-entry='grpo_add2']")
        labels = ["grpo_add2", "dr_grpo_add2"]
        colours = page.evaluate("COLORS.slice(0, 2)")
        for key in ("eval/accuracy", "reward/mean"):
            want = oracle(compare_dir, key)
            chart = f"viewer.compares[0].charts[{json.dumps(key)}]"
            names = page.evaluate(f"{chart}.series.map((s) => s.label)")
            assert names == ["step"] + [
                f"{label}{part}" for label in labels for part in (" (mean of 2 seeds)", " 95 % high", " 95 % low")
            ]
            shown = page.evaluate(
                f"[...{chart}.root.querySelectorAll('.u-legend .u-series')].filter((r) => r.style.display !== 'none')"
                ".map((r) => r.innerText.trim())"
            )
            assert shown == ["grpo_add2 (mean of 2 seeds)", "dr_grpo_add2 (mean of 2 seeds)"]
            data = page.evaluate(f"{chart}.data")
            steps = sorted({s for label in labels for s in want[label]})
            assert data[0] == steps
            for k, label in enumerate(labels):
                mean, high, low = data[1 + 3 * k : 4 + 3 * k]
                for j, step in enumerate(steps):
                    m, lo, hi, _ = want[label][step]
                    assert mean[j] == pytest.approx(m) and high[j] == pytest.approx(hi) and low[j] == pytest.approx(lo)
        # the reward bands, entry by entry: the other entry hidden by a click on its legend (line and band go)
        key = "reward/mean"
        want = oracle(compare_dir, key)
        legend = f".cmp-panel[data-key='{key}'] .u-legend .u-series"
        for k, label in enumerate(labels):
            other = 1 - k
            entry = page.locator(legend).filter(has_text=re.compile(rf"^{labels[other]} \(mean"))
            entry.click()
            alone = page.evaluate(BAND_PIXELS, [key, k, colours[k]])
            hidden = page.evaluate(BAND_PIXELS, [key, other, colours[other]])
            assert hidden["n"] == 0, "the hidden entry's band is still drawn"
            assert alone["n"] > 1000, f"{label}: no band drawn"
            (s0, s1) = sorted(want[label])[:2]
            (x0, x1) = alone["pos"][:2]
            # a column near the middle of the two steps that no grid line crosses: there the band's edges are
            # the interval's ends interpolated between the steps
            x = next(x for d in range(20) for x in ((x0 + x1) // 2 + d, (x0 + x1) // 2 - d) if str(x) in alone["top"])
            f = (x - x0) / (x1 - x0)
            ends = [(1 - f) * want[label][s0][i] + f * want[label][s1][i] for i in (2, 1)]  # high, low
            top, bottom = page.evaluate(
                f"(ends) => ends.map((v) => viewer.compares[0].charts[{json.dumps(key)}].valToPos(v, 'y', true))", ends
            )
            assert abs(alone["top"][str(x)] - top) <= 3 and abs(alone["bottom"][str(x)] - bottom) <= 3, label
            entry.click()  # shown again
        page.screenshot(path=str(compare_dir.parent / "compare_view.png"), full_page=True)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_a_comparisons_report_draws_the_same_bands(browser, compare_dir, tmp_path):
    from _lib.compare_oracle import oracle

    out = tmp_path / "compare.html"
    done = subprocess.run(
        [sys.executable, "-m", "trinity_like.cli", "report", str(compare_dir), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    pg = browser.new_page(viewport={"width": 1400, "height": 1000})
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    pg.goto(out.as_uri())
    pg.wait_for_selector(".cmp-panel[data-key='reward/mean'] canvas")
    want = oracle(compare_dir, "reward/mean")
    data = pg.evaluate("viewer.compares[0].charts['reward/mean'].data")
    bands = pg.evaluate("viewer.compares[0].charts['reward/mean'].bands.map((b) => b.series)")
    assert bands == [[2, 3], [5, 6]]  # each entry's band between its interval's ends
    for k, label in enumerate(["grpo_add2", "dr_grpo_add2"]):
        assert data[1 + 3 * k] == pytest.approx([want[label][s][0] for s in data[0]])
        assert data[2 + 3 * k] == pytest.approx([want[label][s][2] for s in data[0]])
    assert pg.locator(".verdicts li").count() == 2 and not errors, errors
    pg.screenshot(path=str(tmp_path / "compare_report.png"), full_page=True)
    pg.close()
