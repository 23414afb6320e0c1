"""Requests that return at once: one client's requests run one at a time, in call order.

Every client call hands back a future at once (the SDK's own ``AwaitableConcurrentFuture``,
so ``tinker.APIFuture`` checks hold): ``.result(timeout=None)`` blocks, ``await future`` and
``await future.result_async()`` work in asyncio. Because one client's requests run in the
order they were made, a loop may submit ``optim_step`` before reading ``forward_backward``'s
result, as Tinker code does::

    queue = RequestQueue("training")
    fwd = queue.submit(engine.forward_backward, batch, loss)
    opt = queue.submit(engine.optim_step)          # runs after fwd, whenever fwd is read
    fwd.result(); opt.result()

An exception inside a request is raised by that request's ``.result()`` and nowhere else:
later requests still run.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

T = TypeVar("T")


class RequestQueue:
    """A single worker thread: requests run one after another, in submission order."""

    def __init__(self, name: str) -> None:
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"trinity-like-{name}")

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> AwaitableConcurrentFuture[T]:
        """Queue ``fn(*args, **kwargs)``; its future is returned before it runs."""
        return AwaitableConcurrentFuture(self._pool.submit(fn, *args, **kwargs))

    def close(self) -> None:
        """Finish the queued requests, then stop the worker."""
        self._pool.shutdown(wait=True)
