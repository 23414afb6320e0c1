"""Reward code that hangs, raises, or returns NaN, None or a string: rejected per call, retried,
then the task is skipped and counted -- and the run goes on."""

from __future__ import annotations

import ctypes
import json
import os
import textwrap
import time

import psutil
import pytest
from _lib.faultlib import RECIPE, TINY, record

from trinity_like.config import load_plan
from trinity_like.errors import TrinityError
from trinity_like.explorer.reward_isolation import RewardProcessError
from trinity_like.explorer.rewards import build_reward_fn, score_with_retries
from trinity_like.plugins import ENV_VAR as PLUGINS_ENV
from trinity_like.registry import REWARD_FN
from trinity_like.runner import run_plan

BAD_RETURNS = {"none": None, "text": "1.0", "nan": float("nan"), "inf": float("-inf"), "list": [1.0, 0.0]}
for _key, _value in BAD_RETURNS.items():
    REWARD_FN.register_module(f"faulttest_returns_{_key}", module=lambda *, response, _v=_value: _v, force=True)


@pytest.mark.parametrize("key", BAD_RETURNS)
def test_a_reward_that_is_not_a_finite_number_is_rejected_and_retried(key):
    fn = build_reward_fn(f"faulttest_returns_{key}")
    out = score_with_retries(fn, {"response": "4"}, retries=2, timeout_s=5)
    assert out.reward is None and out.attempts == 3
    if key in ("nan", "inf"):
        assert out.error.startswith("non-finite reward")
    else:
        assert out.error.startswith(f"RewardTypeError: reward function 'faulttest_returns_{key}' returned "), out.error
        assert out.error.endswith("not a number")


PLUGIN = textwrap.dedent('''
    import time
    from trinity_like.registry import REWARD_FN

    CALLS = {"n": 0}
    MISBEHAVE = ["hang", "raise", "nan", "none", "text"]  # the first five calls, in order; then honest

    @REWARD_FN.register_module("faulttest_misbehaving")
    def misbehaving(*, response):
        """Test: each way a reward function goes wrong, once."""
        CALLS["n"] += 1
        how = MISBEHAVE[CALLS["n"] - 1] if CALLS["n"] <= len(MISBEHAVE) else "ok"
        if how == "hang":
            time.sleep(3600)
        if how == "raise":
            raise RuntimeError("reward server unreachable")
        return {"nan": float("nan"), "none": None, "text": "one", "ok": float(any(c.isdigit() for c in response))}[how]
''')


def test_a_run_survives_every_kind_of_bad_reward_call(tmp_path, record_property, monkeypatch):
    monkeypatch.setenv(PLUGINS_ENV, os.environ.get(PLUGINS_ENV, ""))  # loading the plugin exports it: undone after
    plugin = tmp_path / "misbehaving_reward.py"
    plugin.write_text(PLUGIN)
    plan = load_plan(
        RECIPE,
        [
            f"run_root={tmp_path}",
            *TINY,
            "explorer.batch_size=4",
            "buffer.train_batch_size=8",
            "explorer.reward_fn=faulttest_misbehaving",
            "explorer.reward_args={}",
            "explorer.reward_timeout_s=0.5",
            "explorer.reward_retries=1",
            "trainer.total_steps=2",
        ],
        plugins=[str(plugin)],
    )
    t0 = time.monotonic()
    assert run_plan(plan) == 0
    rows = [json.loads(line) for line in (tmp_path / "grpo_arith" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r["step"] == 1 and "workflow/skipped_tasks" in r)
    # calls 1+2 (hang, then raise on retry) skip task 1; 3+4 (NaN, then None) skip task 2;
    # call 5 returns a string, its retry is honest: task 3 is kept.
    assert first["workflow/skipped_tasks"] == 2.0
    assert first["workflow/reward_timeouts"] == 0.0 and first["workflow/reward_errors"] == 2.0  # last attempt of each
    assert first["workflow/reward_retries"] == 3.0
    assert [r["step"] for r in rows if "time/rollout" in r] == [1, 2]
    record(
        record_property,
        "reward fn hangs / raises / returns NaN, None, a string",
        "survived: each call timed out or rejected, retried, 2 tasks skipped and counted",
        f"not needed (run finished in {time.monotonic() - t0:.0f} s)",
        "not counted by this test",
    )


# -- a reward fn that allocates without bound, run by the `isolated` reward ------------------------
HOG_MB, LIMIT_MB = (
    512,
    256,
)  # what the fn tries to allocate (in 32 MB steps), what it may: never more than this is touched

REWARD_FN.register_module(
    "faulttest_hog", module=lambda *, response: len([bytearray(32 << 20) for _ in range(HOG_MB // 32)]), force=True
)
REWARD_FN.register_module("faulttest_hang", module=lambda *, response: time.sleep(3600), force=True)


MEMORY_ERROR = f"MemoryError: allocated more than memory_mb={LIMIT_MB} MB"


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def test_an_isolated_reward_that_allocates_without_bound_fails_in_its_child_not_in_the_explorer():
    fn = build_reward_fn("isolated", {"fn": "faulttest_hog", "memory_mb": LIMIT_MB})
    before = rss_mb()
    out = score_with_retries(fn, {"response": "4"}, retries=1, timeout_s=10)
    assert out.reward is None and out.attempts == 2
    # the child's own MemoryError, or (a rare race at the limit) the parent's watch killing it
    assert out.error.startswith(f"RewardProcessError: faulttest_hog: {MEMORY_ERROR}"), out.error
    assert rss_mb() - before < 32, "the allocation happened in the explorer's process"
    # the same fn with room enough answers (the bound is the limit, not a refusal)
    assert (
        score_with_retries(
            build_reward_fn("isolated", {"fn": "faulttest_hog", "memory_mb": HOG_MB + 256}),
            {"response": "4"},
            retries=0,
            timeout_s=10,
        ).reward
        == HOG_MB // 32
    )


LIBC = ctypes.CDLL(None)
LIBC.malloc.restype, LIBC.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
LIBC.free.argtypes = [ctypes.c_void_p]
BLOCK = 30 << 20  # glibc raises its mmap threshold to a freed mmapped block's size, up to 32 MB


def heap_hog(*, response: str) -> float:
    """Test: 11 blocks of 30 MB from malloc, each written (what a C extension's buffers do)."""
    blocks = [LIBC.malloc(BLOCK) for _ in range(11)]
    for block in blocks:
        ctypes.memset(block, 2, BLOCK)
    return float(len(blocks))


REWARD_FN.register_module("faulttest_heap_hog", module=heap_hog, force=True)


def test_an_isolated_reward_cannot_allocate_past_its_limit_by_reusing_the_explorers_free_heap():
    # glibc keeps freed blocks mapped and resident for reuse: an explorer that freed 330 MB holds
    # them in its heap, the child inherits them, and the fn filling them again grows neither its
    # address space (RLIMIT_AS) nor its RssAnon (the pages were there: it copies them). CI met this
    # in a worker that had run many tests. The child gives them up first; the parent's watch on
    # its RssAnon then stops it.
    LIBC.free(LIBC.malloc(BLOCK))  # a freed mmapped block raises the threshold: the next come from the heap
    blocks = [LIBC.malloc(BLOCK) for _ in range(11)]
    for block in blocks:
        ctypes.memset(block, 1, BLOCK)
    pin = LIBC.malloc(1 << 20)  # above them: the heap's top is not given back
    try:
        for block in blocks:
            LIBC.free(block)
        fn = build_reward_fn("isolated", {"fn": "faulttest_heap_hog", "memory_mb": LIMIT_MB})
        # called here, not through score_with_retries' thread: a thread allocates from an arena of its own
        with pytest.raises(RewardProcessError, match=f"^faulttest_heap_hog: {MEMORY_ERROR}"):
            fn({"response": "4"})
    finally:
        LIBC.free(pin)


def test_an_isolated_reward_that_hangs_is_killed_not_abandoned():
    # children this worker had before (a test before may leave one alive: wandb's service lives as long as
    # the process that started it) are not the reward's
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    fn = build_reward_fn("isolated", {"fn": "faulttest_hang", "wall_s": 0.5})
    t0 = time.monotonic()
    out = score_with_retries(fn, {"response": "4"}, retries=0, timeout_s=5)
    assert out.error == "RewardProcessError: faulttest_hang: no result within wall_s=0.5 s (child killed)"
    assert time.monotonic() - t0 < 3
    left = psutil.Process().children(recursive=True)
    assert not [p for p in left if p.pid not in before and p.status() != psutil.STATUS_ZOMBIE]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "isolated: fn is empty"),
        ({"fn": "no_such_reward"}, "isolated.fn: "),
        ({"fn": "format", "args": {"patern": "x"}}, "isolated.fn: reward_fn.format.patern: unknown parameter"),
        ({"fn": "exact_match", "memory_mb": 0}, "isolated: memory_mb and cpu_s must be >= 1"),
    ],
)
def test_isolated_reward_args_are_checked_when_built(args, message):
    with pytest.raises(TrinityError) as info:
        build_reward_fn("isolated", args)
    assert str(info.value).startswith(message), str(info.value)


HOG_PLUGIN = textwrap.dedent(f'''
    import os
    import signal
    from pathlib import Path
    from trinity_like.registry import REWARD_FN

    @REWARD_FN.register_module("faulttest_hog_then_honest")
    def hog_then_honest(*, response):
        """Test: calls 1 and 2 allocate {HOG_MB} MB in 32 MB steps, call 3 kills its own process; then honest."""
        calls = Path(os.environ["FAULTTEST_CALLS_FILE"])  # each call appends a line: the children share no memory
        with calls.open("a") as f:
            f.write("call\\n")
        n = len(calls.read_text().splitlines())
        if n <= 2:
            hoard = [bytearray(32 << 20) for _ in range({HOG_MB // 32})]
            return float(len(hoard))
        if n == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        return float(any(c.isdigit() for c in response))
''')


def test_a_run_survives_a_reward_that_allocates_without_bound(tmp_path, record_property, monkeypatch):
    plugin = tmp_path / "hog_reward.py"
    plugin.write_text(HOG_PLUGIN)
    monkeypatch.setenv("FAULTTEST_CALLS_FILE", str(tmp_path / "calls.txt"))
    monkeypatch.setenv(PLUGINS_ENV, os.environ.get(PLUGINS_ENV, ""))  # loading the plugin exports it: undone after
    plan = load_plan(
        RECIPE,
        [
            f"run_root={tmp_path}",
            *TINY,
            "explorer.batch_size=4",
            "buffer.train_batch_size=8",
            "explorer.reward_fn=isolated",
            f"explorer.reward_args={{fn: faulttest_hog_then_honest, memory_mb: {LIMIT_MB}, wall_s: 5}}",
            "explorer.reward_retries=1",
            "trainer.total_steps=2",
        ],
        plugins=[str(plugin)],
    )
    t0 = time.monotonic()
    before = rss_mb()
    assert run_plan(plan) == 0
    rows = [json.loads(line) for line in (tmp_path / "grpo_arith" / "metrics.jsonl").read_text().splitlines()]
    first = next(r for r in rows if r["step"] == 1 and "workflow/skipped_tasks" in r)
    # calls 1+2 (MemoryError twice) skip task 1; call 3 (its process killed) is retried by call 4: task 2 is kept
    assert first["workflow/skipped_tasks"] == 1.0
    assert first["workflow/reward_errors"] == 1.0 and first["workflow/reward_retries"] == 2.0
    assert [r["step"] for r in rows if "time/rollout" in r] == [1, 2]
    grown = rss_mb() - before
    record(
        record_property,
        f"reward fn allocates {HOG_MB} MB, wrapped in `isolated` (memory_mb={LIMIT_MB})",
        "survived: the allocation failed in the reward's child (MemoryError), retried, 1 task skipped and counted; "
        "a reward process killed mid-call retried",
        f"not needed (run finished in {time.monotonic() - t0:.0f} s)",
        "not counted by this test",
    )
    assert grown < HOG_MB / 2, f"the run's process grew {grown:.0f} MB"
