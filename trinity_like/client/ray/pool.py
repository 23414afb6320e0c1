"""The controller's side of the sampler actors: backpressure, restarts and retries.

Every sampling request goes into one queue here and returns a future at once. A request
is handed to a live sampler with fewer than ``max_in_flight`` requests of ours in its
mailbox (the least loaded; the lowest index on a tie); the others wait here, however many
there are. Nothing blocks: completions arrive as callbacks on the requests' object
references, and each completion hands the next waiting request out. So a learner slower
than the samplers leaves requests waiting in this queue, and samplers slower than the
learner leave the learner's calls untouched: the two never wait on each other except
where the caller reads a result.

A sampler whose process dies (a SIGKILL, an OOM) fails its requests with a Ray actor
error: each is put back at the head of the queue and runs again elsewhere, or on the same
sampler once Ray has restarted it (``max_restarts``; a probe call tells when it is back).
A request runs again with the same seed, so its answer is the one it would have had; it
gives up after ``max_retries`` failures of that kind. Every request's future is resolved
exactly once.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

import ray
from ray.exceptions import RayActorError
from tinker.lib.public_interfaces.api_future import AwaitableConcurrentFuture

from trinity_like.client.futures import unwrap_ray_error
from trinity_like.errors import TrinityError

RESTART_TIMEOUT_S = 300.0  # a sampler not back this long after it died counts as gone for good
PROBE_EVERY_S = 1.0  # between probes of a restarting sampler


@dataclass
class _Request:
    method: str  # a SamplerActor method
    args: tuple
    future: Future = field(default_factory=Future)
    failures: int = 0  # times its sampler died under it


@dataclass
class _Sampler:
    index: int
    handle: Any  # the actor handle
    in_flight: dict = field(default_factory=dict)  # ObjectRef -> _Request
    up: bool = True  # takes requests (False while Ray restarts it)
    gone: bool = False  # not back within RESTART_TIMEOUT_S: never used again
    down_since: float = 0.0  # time.monotonic() when it was seen dead
    peak: int = 0  # most requests of ours it held at once
    served: int = 0  # requests it answered
    pid: int | None = None


class SamplerPool:
    """Dispatches requests over sampler actors; see the module docstring.

    ``pool.submit("sample", weights, prompt, ...)`` -> a future of the sampler's answer.
    """

    def __init__(self, handles: list[Any], *, max_in_flight: int, max_retries: int) -> None:
        self._lock = threading.RLock()
        self._samplers = [_Sampler(i, h) for i, h in enumerate(handles)]
        self._waiting: deque[_Request] = deque()
        self._max_in_flight = max_in_flight
        self._max_retries = max_retries
        self._closed = False
        self.restarts = 0  # samplers that died and came back
        self.retried = 0  # requests run again after their sampler died
        for s, pid in zip(self._samplers, ray.get([h.pid.remote() for h in handles]), strict=True):
            s.pid = pid  # also: every sampler started (an error here, not mid-run)

    # -- what the clients call ---------------------------------------------------------------
    def submit(self, method: str, *args: Any) -> AwaitableConcurrentFuture:
        request = _Request(method, args)
        with self._lock:
            if self._closed:
                raise TrinityError("this ServiceClient is closed: its samplers are gone")
            self._waiting.append(request)
            self._dispatch()
        return AwaitableConcurrentFuture(request.future)

    def size(self) -> int:
        return len(self._samplers)

    def pids(self) -> list[int | None]:
        """The process id of each sampler as last seen (a restarted one: its new process)."""
        with self._lock:
            return [s.pid for s in self._samplers]

    def stats(self) -> dict[str, Any]:
        """Counters for tests and logs: restarts, retried requests, per-sampler peak and served."""
        with self._lock:
            return {
                "restarts": self.restarts,
                "retried": self.retried,
                "waiting": len(self._waiting),
                "peak_in_flight": [s.peak for s in self._samplers],
                "served": [s.served for s in self._samplers],
            }

    def close(self) -> None:
        """Fail what still waits, and end the actors (they are never restarted after this)."""
        with self._lock:
            self._closed = True
            waiting, self._waiting = list(self._waiting), deque()
        for request in waiting:
            request.future.set_exception(TrinityError("the ServiceClient was closed before this request ran"))
        for s in self._samplers:
            ray.kill(s.handle, no_restart=True)

    # -- dispatch ------------------------------------------------------------------------------
    def _dispatch(self) -> None:
        """Hand waiting requests to samplers with room (called with the lock held)."""
        while self._waiting and not self._closed:
            free = [s for s in self._samplers if s.up and len(s.in_flight) < self._max_in_flight]
            if not free:
                if all(s.gone for s in self._samplers):
                    self._fail_all(
                        TrinityError(
                            f"every sampler actor died and did not come back "
                            f"(restarts so far: {self.restarts}); start a new ServiceClient"
                        )
                    )
                return
            sampler = min(free, key=lambda s: (len(s.in_flight), s.index))
            request = self._waiting.popleft()
            ref = getattr(sampler.handle, request.method).remote(*request.args)
            sampler.in_flight[ref] = request
            sampler.peak = max(sampler.peak, len(sampler.in_flight))
            ref.future().add_done_callback(lambda ready, s=sampler, r=ref: self._finished(s, r, ready))

    def _finished(self, sampler: _Sampler, ref: Any, ready: Future) -> None:
        try:
            value = ready.result()
        except RayActorError as exc:  # its process died: run the request again
            with self._lock:
                request = sampler.in_flight.pop(ref)
                request.failures += 1
                if self._closed:  # close() ended the actor under it
                    request.future.set_exception(TrinityError("the ServiceClient was closed while this request ran"))
                    return
                if request.failures > self._max_retries:
                    request.future.set_exception(
                        TrinityError(
                            f"a sampling request failed {request.failures} times because its sampler died; "
                            f"last: {str(exc).splitlines()[0]}"
                        )
                    )
                else:
                    self.retried += 1
                    self._waiting.appendleft(request)
                if sampler.up:
                    sampler.up, sampler.down_since = False, time.monotonic()
                    self._probe(sampler)
                self._dispatch()
            return
        except BaseException as exc:  # noqa: BLE001 -- the request's own error, handed to its future
            error: BaseException | None = unwrap_ray_error(exc)
        else:
            error = None
        with self._lock:
            request = sampler.in_flight.pop(ref)
            sampler.served += 1
            self._dispatch()
        if error is None:
            request.future.set_result(value)
        else:
            request.future.set_exception(error)

    # -- restarts ------------------------------------------------------------------------------
    def _probe(self, sampler: _Sampler) -> None:
        """Ask the (restarting) actor for its pid: the answer comes once Ray has brought it back."""
        if self._closed:
            return
        ref = sampler.handle.pid.remote()
        ref.future().add_done_callback(lambda ready: self._probed(sampler, ready))

    def _probed(self, sampler: _Sampler, ready: Future) -> None:
        with self._lock:
            try:
                pid = ready.result()
            except RayActorError:  # still restarting, or gone (Ray's max_restarts used up)
                if time.monotonic() - sampler.down_since > RESTART_TIMEOUT_S:
                    sampler.gone = True
                    self._dispatch()
                else:
                    timer = threading.Timer(PROBE_EVERY_S, self._probe, args=(sampler,))
                    timer.daemon = True
                    timer.start()
                return
            sampler.up = True
            if pid != sampler.pid:
                self.restarts += 1
                sampler.pid = pid
            self._dispatch()

    def _fail_all(self, error: TrinityError) -> None:
        waiting, self._waiting = list(self._waiting), deque()
        for request in waiting:
            request.future.set_exception(error)
