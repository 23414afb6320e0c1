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

:class:`RequestBatcher` is the sampling side's queue: requests waiting together that can
share one engine call run as one (each still gets its own answer).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

from trinity_like.trainer.lora import BASE_MODEL_FILE

T = TypeVar("T")


def checkpoint_path(value: Any, call: str, saved_by: str = "save_state") -> str:
    """``value`` as the checkpoint folder a ``call`` (``"load_state"``, ...) takes: a ``str`` or
    ``os.PathLike``. The SDK takes the path string only (its requests validate ``path: str``),
    so a future or a response in its place is one ``TypeError`` line saying what to pass::

        checkpoint_path(training.save_state("s1"), "load_state")
        # TypeError: load_state: path must be the checkpoint's path (a str), got a future
        #   (AwaitableConcurrentFuture); pass save_state(...).result().path
    """
    if isinstance(value, str | os.PathLike):
        return os.fspath(value)
    name = type(value).__name__
    if callable(getattr(value, "result", None)):
        got = f"a future ({name})"
    elif isinstance(getattr(value, "path", None), str):
        got = f"a {name} (its .path is the path)"
    else:
        got = f"{name} {value!r}"[:120]
    raise TypeError(
        f"{call}: path must be the checkpoint's path (a str), got {got}; pass {saved_by}(...).result().path"
    )


def sampler_weights_path(value: Any, call: str) -> str:
    """:func:`checkpoint_path` of ``save_weights_for_sampler``'s folder; a ``save_state`` folder
    (training state: an adapter, the optimiser) is one ``ValueError`` line saying what to use."""
    path = checkpoint_path(value, call, "save_weights_for_sampler")
    if (Path(path) / BASE_MODEL_FILE).is_file():
        raise ValueError(
            f"model_path {path} is a save_state checkpoint (training state): sample from "
            "save_weights_for_sampler(name).result().path, or create_training_client_from_state(path)"
            ".save_weights_and_get_sampling_client()"
        )
    return path


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


@dataclass
class Job:
    """A request waiting to run: ``run(jobs)`` runs it together with the others of its ``key``
    (None: alone) and returns one result per job."""

    key: Any
    run: Callable[[list[Job]], list[Any]]
    args: tuple
    future: Future = field(default_factory=Future)


class RequestBatcher:
    """One worker thread; requests that wait together and can share an engine call share one.

    Tinker code sends one ``sample`` per prompt and reads the futures later; run one by one,
    each would decode only its own group. Here every sample request queued while the engine
    was busy, with the same client weights and sampling settings, joins one continuous-batching
    run (each keeps its own seeds, so its samples are the ones it would get alone). An error
    in a shared run is retried request by request, so it stays with the request that caused it.
    """

    def __init__(self) -> None:
        self._ready = threading.Condition()
        self._pending: list[Job] = []
        threading.Thread(target=self._loop, name="trinity-like-sampling", daemon=True).start()

    def submit(self, key: Any, run: Callable[[list[Job]], list[Any]], *args: Any) -> AwaitableConcurrentFuture:
        job = Job(key, run, args)
        with self._ready:
            self._pending.append(job)
            self._ready.notify()
        return AwaitableConcurrentFuture(job.future)

    def _loop(self) -> None:
        while True:
            with self._ready:
                while not self._pending:
                    self._ready.wait()
                jobs, self._pending = self._pending, []
            groups: dict[Any, list[Job]] = {}
            for i, job in enumerate(jobs):
                groups.setdefault(("alone", i) if job.key is None else job.key, []).append(job)
            for group in groups.values():
                self._run(group)

    @staticmethod
    def _run(group: list[Job]) -> None:
        live = [job for job in group if job.future.set_running_or_notify_cancel()]
        if not live:
            return
        try:
            results = live[0].run(live)
        except BaseException as exc:  # noqa: BLE001 -- handed to the request's future, never swallowed
            if len(live) > 1:
                for job in live:  # find the request that fails; the others still get their answer
                    _rerun(job)
                return
            live[0].future.set_exception(exc)
            return
        for job, result in zip(live, results, strict=True):
            job.future.set_result(result)


def _rerun(job: Job) -> None:
    """Run ``job`` alone into its existing future (already marked running)."""
    try:
        job.future.set_result(job.run([job])[0])
    except BaseException as exc:  # noqa: BLE001 -- handed to the request's future
        job.future.set_exception(exc)


# -- futures over Ray object references (``ServiceClient(backend="ray")``) -----------------------
def unwrap_ray_error(exc: BaseException) -> BaseException:
    """The exception a remote call raised, as the caller would have seen it in-process: Ray
    wraps it (``RayTaskError``, with the remote traceback); its ``cause`` is the original."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) and type(exc).__name__.startswith("RayTaskError") else exc


def ray_future(
    ref: Any,
    *,
    then: Callable[[Any], Any] | None = None,
    error: Callable[[BaseException], BaseException] = unwrap_ray_error,
) -> AwaitableConcurrentFuture:
    """A future of a Ray ``ObjectRef``'s value (``then(value)`` if given), resolved when the
    object is ready; an exception is passed through ``error`` first. ``.result()`` / ``await``
    as every other client future::

        fut = ray_future(actor.optim_step.remote(params), then=lambda out: out[0])
        fut.result(timeout=60)
    """
    out: Future = Future()

    def done(ready: Future) -> None:
        try:
            value = ready.result()
            out.set_result(then(value) if then is not None else value)
        except BaseException as exc:  # noqa: BLE001 -- handed to the caller's future, never swallowed
            out.set_exception(error(exc))

    ref.future().add_done_callback(done)
    return AwaitableConcurrentFuture(out)


def wait_all(futures: Any, timeout: float | None = None) -> list[Any]:
    """Every future's result, in order, within ``timeout`` seconds in all (None: no limit).

    The first failed future raises its exception (the others keep running); past the
    deadline, ``TimeoutError``. Works for any future with ``.result(timeout)``, in-process or Ray::

        results = wait_all([sampler.sample(p, 4, params) for p in prompts], timeout=300)
    """
    import time

    deadline = None if timeout is None else time.monotonic() + timeout
    results = []
    for future in futures:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        results.append(future.result(timeout=left))
    return results
