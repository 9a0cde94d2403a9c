"""AMD Instinct / Radeon GPUs through ``amd-smi`` (``static`` and ``metric``, JSON), with
``rocm-smi --json`` as the fallback for older ROCm (before amd-smi shipped), one record
per GPU.

Each patrol runs ``amd-smi metric --json`` once (use, power, temperatures, VRAM, ECC in
total and per block); ``amd-smi static --json`` (model, serial, bus id, driver, VBIOS,
power limit) is read at the first patrol and again every ``static_interval_seconds``
(default 300) or when metric lists a GPU it did not, within the same
``timeout_seconds``; the two are joined on the ``gpu`` index
(:func:`hetpatrol.collectors.amd_smi.amd_smi_cards`). When
``amd-smi`` is not installed, ``rocm-smi ... --json`` is run once instead
(:func:`~hetpatrol.collectors.rocm_family.parse_rocm_smi`; the byte-valued ``VRAM ...
(B)`` keys). The human ``KEY: value`` form of amd-smi is read as well (a site may set
``static_command``/``metric_command`` without ``--json``).

Value sources (amd-smi key -> :class:`~hetpatrol.schema.CardRecord` field):

=====================================================  =====================================
``gpu``                                                ``index``
``asic.market_name``                                   ``model``; :func:`card_type_for`
``asic.asic_serial``                                   ``serial``
``bus.bdf``                                            ``bus_id``
``driver.version`` / ``vbios.version``                 ``driver_version`` / ``firmware_version``
``limit.max_power``                                    ``power_limit_watts``
``usage.gfx_activity`` (%)                             ``utilization_ratio`` (/100)
``power.socket_power`` (W)                             ``power_watts``
``temperature.hotspot`` (°C; edge is no stand-in)      ``temperature_celsius``
``mem_usage.total_vram`` / ``used_vram`` (MB = MiB)    ``memory_total_bytes`` / ``..._used_...``
``ecc.total_(un)correctable_count``                    ``ecc_(un)corrected_total``
``ecc_blocks.<BLOCK>.*_count``                         ``counters["ecc_uncorrected_<block>"]``...
=====================================================  =====================================

A Hygon DCU listed by a shared ``rocm-smi`` is left to the ``hygon`` plugin. amd-smi's
``metric`` prints no health word; vendor_health stays None and the processes are unknown.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

from hetpatrol.collector import (
    STATE_ABSENT,
    Collector,
    CollectorError,
    CollectResult,
    DeviceNode,
    GresDevice,
    VendorInfo,
)
from hetpatrol.collectors.amd_smi import amd_smi_cards, parse_amd_smi_tree
from hetpatrol.collectors.rocm_family import AMD, ROCM_SMI_COMMAND, parse_rocm_smi, to_record
from hetpatrol.collectors.smi_tool import (
    Absent,
    argv_option,
    default_runner,
    problem_result,
    run_once,
)
from hetpatrol.pci_census import ACCELERATOR_CLASSES, PciCards

STATIC_COMMAND = ("amd-smi", "static", "--json")
METRIC_COMMAND = ("amd-smi", "metric", "--json")


def card_type_for(model: str | None) -> str:
    """``card_type`` from the model name: ``MI300X`` -> ``"mi300x"`` (any ``MI<digits>
    [letter]``, e.g. ``Aqua Vanjaram [Instinct MI300A]`` -> ``"mi300a"``), Radeon / Navi
    -> ``"radeon"``, anything else -> ``"amd"``."""
    s = model or ""
    m = re.search(r"\bMI\s?([0-9]{3})([A-Z]?)\b", s, re.IGNORECASE)
    if m:
        return f"mi{m[1]}{m[2].lower()}"
    if re.search(r"radeon|navi", s, re.IGNORECASE):
        return "radeon"
    return "amd"


class AmdCollector(Collector):
    """AMD GPUs through amd-smi (rocm-smi when amd-smi is absent). Options
    (``collectors.amd``): ``static_command``, ``metric_command``, ``rocm_smi_command``
    (argv lists or strings), ``timeout_seconds`` (default 10, for the whole read),
    ``static_interval_seconds`` (default 300)."""

    name: ClassVar[str] = "amd"
    vendor_info: ClassVar[VendorInfo] = VendorInfo(
        # ROCm containers get /dev/kfd and /dev/dri (rocm.docs.amd.com, "Running ROCm
        # Docker containers": --device=/dev/kfd --device=/dev/dri)
        # (majors "kfd" and "drm", see hetpatrol.collectors.hygon: the unit allows both)
        device_nodes=(
            DeviceNode("/dev/kfd", "rw", "amd-smi", "kfd"),
            DeviceNode("/dev/dri", "rw", "amd-smi", "drm"),
        ),
        # gres.conf: File=/dev/dri/renderD<N> of the card's PCI function (sysfs
        # .../<bus id>/drm/renderD<N>); Slurm finds AMD GPUs itself with AutoDetect=rsmi
        # and its gpu plugin sets ROCR_VISIBLE_DEVICES (gres.conf(5); gres_common.c)
        gres=GresDevice("/dev/dri/renderD{n}", number="drm_render", autodetect="rsmi"),
        # the same rocm-smi tuple as the hygon plugin's (one program name, one entry)
        tool_dirs={
            "amd-smi": ("/opt/rocm/bin",),
            "rocm-smi": ("/opt/rocm/bin", "/opt/dtk/bin", "/opt/hyhal/bin"),
        },
        # PCI: vendor 1002 (AMD/ATI; AMD's CPU and chipset functions are 1022). A card is
        # a VGA [0300], 3D [0302], Display [0380] or Processing accelerator [1200]
        # function; the HDMI audio functions [0403] are not.
        pci=PciCards(
            vendor_ids=(0x1002,),
            classes=ACCELERATOR_CLASSES,
        ),
    )

    def __init__(self, options: Mapping[str, Any], *, replay_dir: Path | None = None):
        super().__init__(options, replay_dir=replay_dir)
        self.static_command = argv_option(self.options, "static_command", STATIC_COMMAND)
        self.metric_command = argv_option(self.options, "metric_command", METRIC_COMMAND)
        self.rocm_smi_command = argv_option(self.options, "rocm_smi_command", ROCM_SMI_COMMAND)
        self.timeout_seconds = float(self.options.get("timeout_seconds", 10))
        self.static_interval_seconds = float(self.options.get("static_interval_seconds", 300))
        self.runner = default_runner(self.replay_dir)
        self._static: tuple[float, list[dict]] | None = None  # (read at, parsed entries)

    def _static_entries(self, metric: list[dict], deadline: float) -> list[dict]:
        """``amd-smi static`` entries: re-read when older than ``static_interval_seconds``
        or when metric lists a GPU the last read did not (the identity does not change
        between two reads of a running card; the values come from metric every patrol).
        Raises what :func:`run_once` and :func:`parse_amd_smi_tree` raise."""
        now = time.monotonic()
        known = {e.get("gpu") for e in self._static[1]} if self._static else set()
        fresh = self._static is not None and now - self._static[0] < self.static_interval_seconds
        if not fresh or any(e.get("gpu") not in known for e in metric):
            left = max(deadline - now, 0.5)
            self._static = (
                now,
                parse_amd_smi_tree(run_once(self.runner, self.static_command, left)),
            )
        return self._static[1]

    def collect(self) -> CollectResult:
        """One record per AMD GPU; ``absent`` when neither amd-smi nor rocm-smi exists
        (or rocm-smi lists only Hygon DCUs). Raises :class:`CollectorError` (raw kept)
        when the metric read hung, failed or printed no GPU."""
        deadline = time.monotonic() + self.timeout_seconds
        try:
            metric_text = run_once(self.runner, self.metric_command, self.timeout_seconds)
        except Absent:
            return self._rocm_smi()
        metric = parse_amd_smi_tree(metric_text)
        static = None
        note = None
        try:
            static = self._static_entries(metric, deadline)
        except (Absent, CollectorError) as exc:  # identity missing, values still good
            self._static = None
            note = f"amd-smi static not read: {exc}"
        cards = amd_smi_cards(static, metric)
        records = [to_record(c, self.name, card_type_for(c.model), "amd-smi") for c in cards]
        if note:
            for rec in records:
                rec.add_error("amd-smi static", note)
        return CollectResult(self.name, records=records, error=note)

    def _rocm_smi(self) -> CollectResult:
        try:
            text = run_once(self.runner, self.rocm_smi_command, self.timeout_seconds)
        except Absent as exc:
            return CollectResult(self.name, state=STATE_ABSENT, error=str(exc))
        read = parse_rocm_smi(text)
        cards = [c for c in read.cards if c.family == AMD]
        if not cards:
            return CollectResult(
                self.name, state=STATE_ABSENT, error="rocm-smi lists no AMD GPU (Hygon DCUs only)"
            )
        tool = "rocm-smi table" if read.source == "rocm-smi table" else "rocm-smi"
        records = [to_record(c, self.name, card_type_for(c.model), tool) for c in cards]
        return problem_result(self.name, text, records, read.problems, tool, read.truncated)


__all__ = ["AmdCollector", "card_type_for"]
