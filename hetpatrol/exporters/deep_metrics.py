"""Prometheus families of the deep health checks: XIDs, the kernel log, links, fabric.

Rendered from the report like every other family (nothing is read on a scrape). Labels
stay bounded: the card labels plus ``xid`` (a number), ``kind``/``link`` (at most 18
NVLink links per GPU, one RoCE port per NPU chip), the fabric state set (three states
per GPU with a fabric).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

from hetpatrol.checks.kernel_events import card_xid_totals
from hetpatrol.exporters.labels import CARD_LABELS, card_labels
from hetpatrol.exporters.text_format import (
    CounterFamily,
    Family,
    GaugeFamily,
    StateSetFamily,
)
from hetpatrol.schema import FABRIC_STATES

if TYPE_CHECKING:
    from hetpatrol.report import PatrolReport


def deep_metrics(report: PatrolReport) -> Iterable[Family]:
    snapshot = report.kernel_log
    if snapshot is not None:
        up = GaugeFamily(
            "hetpatrol_kernel_log_up",
            "1 while the kernel log (/dev/kmsg, or kmsg.txt of a replay) is read; 0 when it "
            "cannot be (no such file, no permission: XIDs are not seen).",
        )
        up.add_metric([], 1 if snapshot.state == "ok" else 0)
        yield up
        xids = CounterFamily(
            "hetpatrol_card_xid_events",
            "NVIDIA XID records in the kernel log per card and XID since the daemon started "
            "(the ring buffer read at start-up included).",
            labels=[*CARD_LABELS, "xid"],
        )
        for card, xid, total in card_xid_totals(snapshot, report.cards):
            xids.add_metric([*card_labels(card), xid], total)
        yield xids
    link_up = GaugeFamily(
        "hetpatrol_card_link_up",
        "Interconnect link state: 1 up, 0 down (NVLink per link; Ascend RoCE port per chip).",
        labels=[*CARD_LABELS, "kind", "link"],
    )
    link_errors = CounterFamily(
        "hetpatrol_card_nvlink_errors",
        "NVLink DL error counters since driver load, summed over the card's links.",
        labels=[*CARD_LABELS, "counter"],
    )
    for card in report.cards:
        labels = card_labels(card)
        sums: dict[str, int] = {}
        for link in card.links:
            if link.get("state") in ("up", "down"):
                link_up.add_metric(
                    [*labels, str(link.get("kind")), str(link.get("link"))],
                    1 if link["state"] == "up" else 0,
                )
            if link.get("kind") == "nvlink":
                for name, value in (link.get("counters") or {}).items():
                    sums[name] = sums.get(name, 0) + int(value)
        for name, value in sorted(sums.items()):
            link_errors.add_metric([*labels, name], value)
    yield link_up
    yield link_errors
    yield fabric_state(report)


#: the fabric states a GPU with a fabric can be in (``Not Supported``: no series)
_FABRIC_SET = {state: state.lower().replace(" ", "_") for state in FABRIC_STATES[1:]}


def fabric_state(report: PatrolReport) -> Family:
    """``hetpatrol_card_fabric_state``: a state set (``not_started``, ``in_progress``,
    ``completed``) per GPU whose fabric registration was read with one of those states
    (the record's ``fabric.state``); no series for a card without a fabric."""
    family = StateSetFamily(
        "hetpatrol_card_fabric_state",
        "GPU fabric registration state (NVSwitch systems; nvmlDeviceGetGpuFabricInfoV): "
        "CUDA work waits for completed.",
        labels=list(CARD_LABELS),
    )
    for card in report.cards:
        state = (card.fabric or {}).get("state")
        if state in _FABRIC_SET:
            family.add_metric(card_labels(card), {v: k == state for k, v in _FABRIC_SET.items()})
    return family
