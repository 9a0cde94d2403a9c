"""State across patrols follows the card (UUID, serial, bus id), never its index.

The scenario is the healthy-mixed node's 8 x H100 recording (fixtures/nodes/healthy-mixed/
nvidia-smi-q.xml) read through the production NVIDIA collector and the NVML replay:

1. all 8 GPUs read and ok;
2. the daemon is reloaded (SIGHUP: new collector, new NVML session) and GPU 2 has
   fallen off the bus: ``nvmlDeviceGetHandleByIndex(2)`` answers GpuIsLost, so NVML
   gives nothing about it (the replay's ``lost: true`` fault);
3. the driver is reloaded without it and the daemon reloaded again: NVML enumerates 7
   GPUs, the ones after the lost GPU move down one index.

Values read off the XML: GPU 2 is ``GPU-6d33bd6a-6eac-013c-9c16-a880cab1362b`` at
``0000:4c:00.0``, GPU 3 ``GPU-26be5ab3-d1ac-3df1-48af-c327ce3f2f16``.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pynvml
from conftest import NODES

from hetpatrol.collectors.nvidia import NvidiaCollector
from hetpatrol.collectors.nvml_replay import load_replay_nvml
from hetpatrol.config import CollectorConfig
from hetpatrol.exporters.labels import card_labels
from hetpatrol.exporters.prometheus import Exposition
from hetpatrol.node_view import render
from hetpatrol.patrol import Patroller

XML = NODES / "healthy-mixed" / "nvidia-smi-q.xml"
LOST_UUID = "GPU-6d33bd6a-6eac-013c-9c16-a880cab1362b"
LOST_BUS = "0000:4c:00.0"


class _Reenumerated:
    """NVML after a driver reload without one GPU: the others, in bus order, from 0."""

    def __init__(self, inner, present: list[int]):
        self.inner = inner
        self.present = present

    def nvmlDeviceGetCount(self) -> int:  # noqa: N802 - pynvml's name
        return len(self.present)

    def nvmlDeviceGetHandleByIndex(self, index: int):  # noqa: N802
        return self.inner.nvmlDeviceGetHandleByIndex(self.present[index])

    def __getattr__(self, name):
        return getattr(self.inner, name)


def _patroller(config, nvml, previous: Patroller | None = None) -> Patroller:
    p = Patroller(config, collectors={"nvidia": NvidiaCollector({}, nvml=nvml)})
    if previous is not None:
        p.adopt(previous)  # what a SIGHUP reload does
        previous.close()
    return p


def test_a_lost_gpu_keeps_its_identity_and_its_hold_does_not_pass_to_its_index(base_config):
    config = replace(
        base_config,
        node="n1",
        recovery_patrols=3,
        collectors=(CollectorConfig("nvidia", timeout_seconds=10),),
    )
    p1 = _patroller(config, load_replay_nvml(XML))
    first = p1.run()
    assert [c.health for c in first.cards] == ["ok"] * 8
    assert (first.cards[2].uuid, first.cards[2].bus_id) == (LOST_UUID, LOST_BUS)
    uuid3 = first.cards[3].uuid
    assert uuid3 == "GPU-26be5ab3-d1ac-3df1-48af-c327ce3f2f16"

    # 2. reloaded; GPU 2 lost before this NVML session could read anything of it
    p2 = _patroller(config, load_replay_nvml(XML, {"gpus": {2: {"lost": True}}}), p1)
    second = p2.run()
    lost = second.cards[2]
    assert (lost.vendor_health, lost.health) == ("gpu_is_lost", "critical")
    # its last known identity, in the record ...
    assert (lost.uuid, lost.bus_id, lost.model, lost.card_type) == (
        LOST_UUID,
        LOST_BUS,
        "NVIDIA H100 80GB HBM3",
        "h100",
    )
    assert lost.errors == [{"source": "nvmlDeviceGetHandleByIndex", "error": "GpuIsLost"}]
    # ... in the metric labels ...
    assert card_labels(lost) == ["nvidia", "h100", "2", "", LOST_UUID]
    body = Exposition(["nvidia"]).update(second).decode()
    assert (
        'hetpatrol_card_health_code{card_type="h100",index="2",'
        f'uuid="{LOST_UUID}",vendor="nvidia"}} 2.0' in body
    )
    # ... and in the status row (bus id and model, not "-")
    doc = {
        "node": "n1",
        "seq": 2,
        "health": second.health,
        "cards": [json.loads(line) for line in second.card_lines],
    }
    row = next(line for line in render(doc).splitlines() if line.lstrip().startswith("2 "))
    # no CHIP column for GPUs: IDX HEALTH ACTION TEMP POWER UTIL MEMORY BUS MODEL
    assert row.split() == ["2", "CRITICAL", "reboot_node", "-", "-", "-", "-", LOST_BUS] + [
        "NVIDIA",
        "H100",
        "80GB",
        "HBM3",
    ]
    assert second.changes == (
        {"card": "nvidia/2", "uuid": LOST_UUID, "bus_id": LOST_BUS, "from": "ok", "to": "critical"},
    )

    # 3. the driver reloaded without it: 7 GPUs, GPU 3 is now index 2
    p3 = _patroller(config, _Reenumerated(load_replay_nvml(XML), [0, 1, 3, 4, 5, 6, 7]), p2)
    third = p3.run()
    assert len(third.cards) == 7
    moved = third.cards[2]
    assert moved.uuid == uuid3
    # the healthy GPU now at index 2 does not inherit the lost one's recovery hold
    assert moved.health == "ok"
    assert "recovering" not in [f.check for f in moved.findings]
    assert [c.health for c in third.cards] == ["ok"] * 7
    # the change list names the GPU that went, not the index that is no longer used
    assert third.changes == (
        {"card": "nvidia/2", "uuid": LOST_UUID, "bus_id": LOST_BUS, "from": "critical", "to": None},
    )
    # (one patrol's short list, no kernel log here to corroborate it: 1 of 3 patrols)
    assert [(f.check, f.severity) for f in third.node_findings] == [("card_missing", "warning")]
    assert third.node_findings[0].message.startswith(
        f"nvidia: 1 card(s) listed before no longer listed: nvidia/2 ({LOST_BUS}) 1 of 3 patrols"
    )
    assert third.health == "warning"
    p3.close()


class _LostAfterUuid:
    """GPU ``index`` answers its name and UUID, then GpuIsLost for every other call."""

    def __init__(self, inner, index: int):
        self.inner, self.index = inner, index

    def __getattr__(self, name):
        fn = getattr(self.inner, name)
        if name in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetHandleByIndex"):
            return fn
        if not name.startswith("nvmlDevice") or name == "nvmlDeviceGetCount":
            return fn

        def call(handle, *args, **kwargs):
            if getattr(handle, "index", None) == self.index:
                raise pynvml.NVMLError_GpuIsLost()
            return fn(handle, *args, **kwargs)

        return call


def test_a_lost_gpu_answering_only_its_uuid_gets_its_bus_id_back(base_config):
    """After a reload GPU 2 still answers nvmlDeviceGetName and nvmlDeviceGetUUID, then
    GpuIsLost: its whole identity comes from the earlier read (the collector keeps no
    part of an identity read cut short; the patroller matches it by position)."""
    config = replace(
        base_config, node="n1", collectors=(CollectorConfig("nvidia", timeout_seconds=10),)
    )
    p1 = _patroller(config, load_replay_nvml(XML))
    serial = p1.run().cards[2].serial
    assert serial
    p2 = _patroller(config, _LostAfterUuid(load_replay_nvml(XML), 2), p1)
    lost = p2.run().cards[2]
    p2.close()
    assert lost.vendor_health == "gpu_is_lost"
    assert lost.errors == [{"source": "nvmlDeviceGetSerial", "error": "GpuIsLost"}]
    assert (lost.uuid, lost.bus_id, lost.serial, lost.card_type) == (
        LOST_UUID,
        LOST_BUS,
        serial,
        "h100",
    )
