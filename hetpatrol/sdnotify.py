"""systemd's notify protocol (``Type=notify``) and a liveness-gated watchdog.

The protocol is one datagram per message to the ``AF_UNIX`` socket named by
``$NOTIFY_SOCKET`` (a path, or an abstract name written with a leading ``@``), holding
newline-separated ``KEY=VALUE`` fields: ``READY=1``, ``WATCHDOG=1``, ``STOPPING=1``,
``RELOADING=1``, ``STATUS=...``. Without ``$NOTIFY_SOCKET`` every call is a no-op, so
the daemon behaves the same outside systemd.

:class:`Watchdog` sends ``WATCHDOG=1`` at half of ``$WATCHDOG_USEC`` from its own thread,
but only while the patrol loop says it is alive: the loop promises "I will be back by
time T" (:meth:`Watchdog.alive_until`) before every patrol and every wait. A loop that
stops keeping its promise (blocked on a hung NFS write, a deadlock) stops the pings, and
systemd restarts the service after ``WatchdogSec``.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Mapping

from hetpatrol.logs import get_logger

log = get_logger("hetpatrol.sdnotify")


def _address(name: str) -> str | bytes | None:
    """The ``sendto`` address of a ``$NOTIFY_SOCKET`` value; None if unsupported."""
    if name.startswith("@"):
        return b"\0" + name[1:].encode()  # abstract namespace
    if name.startswith("/"):
        return name
    return None  # e.g. vsock:... (VMs): not used on a compute node


class Notifier:
    """Sends notify messages to ``$NOTIFY_SOCKET``; a no-op when it is unset.

    ``environ`` defaults to :data:`os.environ`, read once here. ``watchdog_seconds`` is
    ``$WATCHDOG_USEC`` in seconds when the watchdog is meant for this process (``None``
    otherwise; ``$WATCHDOG_PID``, when set, must be our pid).
    """

    def __init__(self, environ: Mapping[str, str] | None = None):
        env = os.environ if environ is None else environ
        self.socket_name = env.get("NOTIFY_SOCKET") or None
        self._address = _address(self.socket_name) if self.socket_name else None
        if self.socket_name and self._address is None:
            log.warning("notify_socket_unsupported", notify_socket=self.socket_name)
        self.watchdog_seconds: float | None = None
        usec = env.get("WATCHDOG_USEC", "")
        pid = env.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not pid or pid == str(os.getpid())):
            self.watchdog_seconds = int(usec) / 1e6
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()
        self._failing = False
        self.sent = 0

    @property
    def enabled(self) -> bool:
        return self._address is not None

    def notify(self, *fields: str) -> bool:
        """Send ``fields`` as one datagram. True if sent; never raises."""
        if self._address is None:
            return False
        data = "\n".join(fields).encode()
        with self._lock:
            try:
                if self._sock is None:
                    self._sock = socket.socket(
                        socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC
                    )
                self._sock.sendto(data, self._address)
            except OSError as exc:
                if not self._failing:
                    log.warning("notify_failed", notify_socket=self.socket_name, error=str(exc))
                    self._failing = True
                return False
            self._failing = False
            self.sent += 1
            return True

    def ready(self, status: str | None = None) -> bool:
        return self.notify("READY=1", *([f"STATUS={status}"] if status else []))

    def reloading(self) -> bool:
        # MONOTONIC_USEC lets systemd >= 253 (Type=notify-reload) match the reload.
        usec = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
        return self.notify("RELOADING=1", f"MONOTONIC_USEC={usec}")

    def stopping(self) -> bool:
        return self.notify("STOPPING=1")

    def status(self, text: str) -> bool:
        return self.notify(f"STATUS={text}")

    def close(self) -> None:
        with self._lock:
            if self._sock is not None:
                self._sock.close()
                self._sock = None


class Watchdog:
    """Pings ``WATCHDOG=1`` every ``watchdog_seconds / 2`` while the loop is alive.

    Inactive (``start`` does nothing) when the notifier has no watchdog. The patrol
    loop calls :meth:`alive_until` with the monotonic time by which it will call again;
    pings stop once that time has passed. Time this thread itself did not run (the
    process stopped by SIGSTOP and resumed by SIGCONT, or frozen by a debugger or the
    cgroup freezer: ``time.monotonic`` goes on meanwhile) is not held against the loop:
    its deadline moves by as much, until it calls :meth:`alive_until` again.
    """

    def __init__(self, notifier: Notifier):
        self.notifier = notifier
        self.period = notifier.watchdog_seconds / 2 if notifier.watchdog_seconds else None
        self._deadline = 0.0
        self._grace = 0.0  # seconds the process was stopped since the last alive_until
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.pings = 0

    @property
    def active(self) -> bool:
        return self.period is not None and self.notifier.enabled

    def alive_until(self, deadline: float) -> None:
        """The loop promises to report again before ``deadline`` (time.monotonic)."""
        self._deadline = deadline
        self._grace = 0.0

    def alive_for(self, seconds: float) -> None:
        self.alive_until(time.monotonic() + seconds)

    def start(self) -> None:
        if not self.active or self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="sd-watchdog", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        assert self.period is not None
        late = False
        last = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            # a wait of one period that took a second or more longer: this process was
            # not run (stopped, frozen); nor was the loop, so the gap is not its lateness
            stopped = now - last - self.period
            last = now
            if stopped > max(self.period, 1.0):
                self._grace += stopped
                log.info("watchdog_process_was_stopped", seconds=round(stopped, 3))
            if now <= self._deadline + self._grace:
                if self.notifier.notify("WATCHDOG=1"):
                    self.pings += 1
                late = False
            elif not late:
                log.error(
                    "watchdog_withheld",
                    reason="the patrol loop is past its deadline; systemd will restart us",
                )
                late = True
            self._stop.wait(self.period)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
