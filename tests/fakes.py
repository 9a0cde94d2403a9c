"""Scripted collectors for tests: the accelerator mock, answering what the test says."""

from __future__ import annotations

import threading
from dataclasses import replace

from hetpatrol.bounded import HANG_MARGIN_SECONDS
from hetpatrol.collector import STATE_OK, Collector, CollectorError, CollectResult
from hetpatrol.config import CollectorConfig, Config
from hetpatrol.patrol import Patroller
from hetpatrol.schema import CardRecord


class Scripted(Collector):
    """A collector whose next answers are given by the test (the accelerator mock)."""

    name = "scripted"

    def __init__(self, vendor: str = "ascend"):
        super().__init__({})
        self.vendor = vendor
        self.temps = [40.0]
        self.mode = "ok"
        self.release = threading.Event()
        self.calls = 0

    def collect(self) -> CollectResult:
        self.calls += 1
        if self.mode == "raise":
            raise RuntimeError("plugin bug")
        if self.mode == "fail":
            raise CollectorError(
                "dcmi module initialize failed. ret is -8005",
                raw="dcmi module initialize failed. ret is -8005\n",
            )
        if self.mode == "block":
            self.release.wait(30)
        recs = [
            CardRecord(
                vendor=self.vendor,
                index=i,
                chip=0,
                model="910B3",
                card_type="910b",
                temperature_celsius=t,
                vendor_health="OK",
            )
            for i, t in enumerate(self.temps)
        ]
        return CollectResult(self.name, recs, STATE_OK)


def make_patroller(
    base_config: Config, collectors: dict, timeout: float = 0.5, recovery: int = 3
) -> Patroller:
    cfg = replace(
        base_config,
        node="n1",
        recovery_patrols=recovery,
        collectors=tuple(CollectorConfig(n, timeout_seconds=timeout) for n in collectors),
    )
    return Patroller(cfg, collectors=collectors)


def waited_out(timeout: float) -> float:
    """Seconds a patrol takes at the least when it waits out a collector's deadline
    (``timeout`` plus :data:`HANG_MARGIN_SECONDS`): the bound of "did not wait for the
    deadline" (a tool killed at its own timeout, a still-stuck collector or a failed call
    reported at once). A loaded machine's slowness stays under it; a patrol that waited
    reaches it always."""
    return timeout + HANG_MARGIN_SECONDS
