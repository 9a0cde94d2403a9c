"""A collector run in a worker thread, bounded in time: the patrol never waits longer
than ``timeout_seconds`` + :data:`HANG_MARGIN_SECONDS` for a vendor call."""

from __future__ import annotations

import threading
import time
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


class BoundedCollector:
    """A collector run in a worker thread, so a stuck vendor call cannot stop a patrol.

    Each call gets a daemon thread: a call stuck forever in a vendor library neither
    blocks the patrol nor the daemon's exit.
    """

    def __init__(self, name: str, collector: Collector, timeout_seconds: float):
        self.name = name
        self.collector = collector
        self.timeout_seconds = timeout_seconds
        self._future: Future[CollectResult] | None = None
        self._stuck_since: float | None = None

    def start(self) -> bool:
        """Start a collect unless the previous one is still stuck. True if started."""
        if self._future is not None and not self._future.done():
            return False
        future: Future[CollectResult] = Future()
        self._future = future
        threading.Thread(
            target=self._timed_collect, args=(future,), daemon=True, name=f"collect-{self.name}"
        ).start()
        return True

    def _timed_collect(self, future: Future[CollectResult]) -> None:
        future.set_result(self._collect_once())

    def _collect_once(self) -> CollectResult:
        t0 = time.monotonic()
        try:
            result = self.collector.collect()
        except CollectorError as exc:
            state = STATE_HUNG if exc.hung else STATE_FAILED
            result = CollectResult(self.name, state=state, error=str(exc), raw=exc.raw)
        except Exception as exc:  # noqa: BLE001 - a plugin bug must not stop the patrol
            result = CollectResult(
                self.name, state=STATE_FAILED, error=f"{type(exc).__name__}: {exc}"
            )
        result.collector = self.name
        result.duration_seconds = time.monotonic() - t0
        return result

    def wait(self, deadline: float, started_now: bool) -> CollectResult:
        assert self._future is not None
        if not started_now:
            stuck = time.monotonic() - (self._stuck_since or time.monotonic())
            return CollectResult(
                self.name,
                state=STATE_HUNG,
                duration_seconds=0.0,
                error=f"{self.name} collector still stuck in its previous "
                f"call for {stuck:.0f} s; no new call started",
            )
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
        if self._future is not None and not self._future.done():
            return  # still stuck inside the vendor library: closing it could block too
        try:
            self.collector.close()
        except Exception as exc:  # noqa: BLE001
            log.warning("collector_close_failed", collector=self.name, error=str(exc))
