"""Client futures: returned at once, run in call order, errors stay with their request."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import tinker

from trinity_like.client.futures import RequestQueue


def test_requests_run_in_call_order_and_return_at_once():
    queue, order, gate = RequestQueue("t"), [], threading.Event()

    def slow(tag):
        gate.wait(5)
        order.append(tag)
        return tag

    t0 = time.perf_counter()
    futures = [queue.submit(slow, "forward_backward"), queue.submit(order.append, "optim_step")]
    assert time.perf_counter() - t0 < 1.0 and not futures[0].future().done()  # nothing waited for
    gate.set()
    assert futures[1].result(timeout=5) is None and futures[0].result(timeout=5) == "forward_backward"
    assert order == ["forward_backward", "optim_step"]
    assert isinstance(futures[0], tinker.APIFuture)
    queue.close()


def test_an_error_surfaces_from_its_own_result_and_later_requests_still_run():
    queue = RequestQueue("t")

    def bad():
        raise ValueError("datum 3: loss_fn_inputs['weights'] has length 5, model_input 6")

    failed, ok = queue.submit(bad), queue.submit(lambda: 42)
    with pytest.raises(ValueError, match="datum 3"):
        failed.result()
    assert ok.result() == 42 and queue.submit(lambda: 7).result() == 7
    queue.close()


def test_futures_are_awaitable_and_time_out():
    queue, gate = RequestQueue("t"), threading.Event()

    async def main():
        assert await queue.submit(lambda: 1) == 1
        assert await queue.submit(lambda: 2).result_async() == 2
        with pytest.raises(TimeoutError):
            await queue.submit(gate.wait, 5).result_async(timeout=0.05)

    asyncio.run(main())
    with pytest.raises(TimeoutError):
        queue.submit(lambda: None).result(timeout=0.01)  # still behind the waiting request
    gate.set()
    queue.close()
