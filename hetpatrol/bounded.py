"""A collector run in a worker thread, bounded in time: the patrol never waits longer
than ``timeout_seconds`` + :data:`HANG_MARGIN_SECONDS` for a vendor call."""

from __future__ import annotations

import queue
import threading
import time
import weakref
from concurrent.futures import Future

from hetpatrol.collector import (
    STATE_FAILED,
    STATE_HUNG,
    Collector,
    CollectorError,
    CollectResult,
)
from hetpatrol.logs import get_logger

log = get_logger("hetpatrol.patrol")

#: how long past its timeout a collector is waited for before it is called hung
HANG_MARGIN_SECONDS = 1.0

#: queue item telling a worker to end (the collector was closed, or is gone)
_STOP = None
#: queue item telling a worker to close its collector, then end: the collector was
#: closed while a call was stuck in it, so the worker closes it once that call returns
_CLOSE = object()

#: collector name -> (token, monotonic time since which it is stuck) for a call still
#: stuck in a BoundedCollector that was closed (a reload rebuilt the collectors): a new
#: BoundedCollector of that name starts no call until that one has returned, so a
#: reload storm while a vendor library is stuck adds no stuck thread per reload
_stuck_after_close: dict[str, tuple[object, float]] = {}


class BoundedCollector:
    """A collector run in a worker thread, so a stuck vendor call cannot stop a patrol.

    One long-lived daemon thread per collector (``collect-<name>``, started at the first
    :meth:`start`) makes the calls, one at a time, handed over through a queue; the
    patrol waits for each at most until its deadline. A call stuck forever in a vendor
    library therefore never blocks the patrol, and no second call is started into the
    collector while it stays stuck (:meth:`start` returns False; :meth:`wait` says
    "still stuck in its previous call for N s"). The worker is a daemon thread: a stuck
    call blocks neither the daemon's exit nor :meth:`close`. After :meth:`close` (a
    reload that replaced the collectors, shutdown) the worker ends: at once when idle,
    after its current call (then closing the collector) when stuck. Until that stuck call
    returns, a new BoundedCollector of the same name (a reload rebuilt the collectors)
    starts no call either: a reload storm while a vendor library is stuck leaves one
    stuck thread per collector name, not one per reload. A BoundedCollector dropped
    without :meth:`close` ends its worker when it is garbage collected. Every call is
    settled: a plugin that raises (even ``BaseException``, or an exception whose message
    cannot be read) or returns something that is not a ``CollectResult`` fails that
    patrol only.
    """

    def __init__(self, name: str, collector: Collector, timeout_seconds: float):
        self.name = name
        self.collector = collector
        self.timeout_seconds = timeout_seconds
        self._future: Future[CollectResult] | None = None
        self._stuck_since: float | None = None
        self._queue: queue.SimpleQueue | None = None
        self._worker: threading.Thread | None = None
        self._stop_worker: weakref.finalize | None = None

    @property
    def worker_tid(self) -> int | None:
        """The kernel thread id of the worker (None before its first call)."""
        return self._worker.native_id if self._worker is not None else None

    def start(self) -> bool:
        """Start a collect unless the previous one is still stuck. True if started."""
        if self._future is not None and not self._future.done():
            return False
        held = _stuck_after_close.get(self.name)
        if held is not None:  # a replaced collector's call is still stuck in the library
            self._stuck_since = held[1]
            return False
        future: Future[CollectResult] = Future()
        self._future = future
        if self._worker is None:
            self._start_worker()
        assert self._queue is not None
        self._queue.put(future)
        return True

    def _start_worker(self) -> None:
        q: queue.SimpleQueue = queue.SimpleQueue()
        # The worker holds the queue and the collector, never this object: when this
        # object is collected without close(), the finalizer ends the worker.
        worker = threading.Thread(
            target=_serve,
            args=(q, self.name, self.collector),
            daemon=True,
            name=f"collect-{self.name}",
        )
        self._stop_worker = weakref.finalize(self, q.put, _STOP)
        self._stop_worker.atexit = False
        self._queue, self._worker = q, worker
        worker.start()

    def wait(self, deadline: float, started_now: bool) -> CollectResult:
        if not started_now:
            stuck = time.monotonic() - (self._stuck_since or time.monotonic())
            return CollectResult(
                self.name,
                state=STATE_HUNG,
                duration_seconds=0.0,
                error=f"{self.name} collector still stuck in its previous "
                f"call for {stuck:.0f} s; no new call started",
            )
        assert self._future is not None
        remaining = max(0.0, deadline - time.monotonic())
        try:
            result = self._future.result(timeout=remaining)
        except TimeoutError:
            self._stuck_since = time.monotonic() - self.timeout_seconds
            return CollectResult(
                self.name,
                state=STATE_HUNG,
                duration_seconds=self.timeout_seconds,
                error=f"{self.name} collector did not return within {self.timeout_seconds:g} s",
            )
        self._stuck_since = None
        return result

    def close(self) -> None:
        """End the worker and close the collector. A call still stuck inside the vendor
        library is not waited for (closing the collector under it could block too): the
        worker closes the collector once that call returns, then ends."""
        stuck = self._future is not None and not self._future.done()
        if self._stop_worker is not None:
            self._stop_worker.detach()
            self._stop_worker = None
            assert self._queue is not None
            if stuck:
                token = object()
                since = self._stuck_since or time.monotonic()
                _stuck_after_close[self.name] = (token, since)
                self._queue.put((_CLOSE, token))
            else:
                self._queue.put(_STOP)
            self._queue = self._worker = None
        if not stuck:
            _close(self.name, self.collector)


def _serve(q: queue.SimpleQueue, name: str, collector: Collector) -> None:
    """A collector's worker: run each call handed over in ``q`` and settle its future,
    until told to end (``_STOP``) or to close the collector and end (``_CLOSE``)."""
    while True:
        item = q.get()
        if item is _STOP:
            return
        if isinstance(item, tuple):  # (_CLOSE, token): the stuck call has returned
            held = _stuck_after_close.get(name)
            if held is not None and held[0] is item[1]:
                del _stuck_after_close[name]
            _close(name, collector)
            return
        try:
            result = _collect(name, collector)
        except BaseException as exc:  # noqa: BLE001 - the call must be settled, always
            result = CollectResult(name, state=STATE_FAILED, error=_describe(exc))
        item.set_result(result)


def _describe(exc: BaseException) -> str:
    """``Type: message``; ``Type`` alone when the message cannot be read."""
    try:
        return f"{type(exc).__name__}: {exc}"
    except Exception:  # noqa: BLE001 - an exception whose __str__ raises
        return type(exc).__name__


def _collect(name: str, collector: Collector) -> CollectResult:
    """One ``collector.collect()``: its result, or a failed / hung result saying why."""
    t0 = time.monotonic()
    try:
        result = collector.collect()
    except CollectorError as exc:
        state = STATE_HUNG if exc.hung else STATE_FAILED
        try:
            error = str(exc)
        except Exception:  # noqa: BLE001 - a message that cannot be read
            error = type(exc).__name__
        result = CollectResult(name, state=state, error=error, raw=exc.raw)
    except BaseException as exc:  # noqa: BLE001 - a plugin bug, even sys.exit(), must
        # neither stop the patrol nor end the worker (the call would stay unsettled)
        result = CollectResult(name, state=STATE_FAILED, error=_describe(exc))
    if not isinstance(result, CollectResult):  # a plugin bug: None, a dict...
        result = CollectResult(
            name,
            state=STATE_FAILED,
            error=f"collect() returned {type(result).__name__}, not a CollectResult",
        )
    result.collector = name
    result.duration_seconds = time.monotonic() - t0
    return result


def _close(name: str, collector: Collector) -> None:
    try:
        collector.close()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - as in _collect: a plugin's sys.exit()
        # in close() must not end the daemon's reload (it is called from the main loop)
        log.warning("collector_close_failed", collector=name, error=_describe(exc))
