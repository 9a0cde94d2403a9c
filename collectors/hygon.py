"""Hygon DCUs (K100, K100_AI, Z100...) through DTK's ``rocm-smi`` (or ``hy-smi``), one
record per DCU.

DTK ships its own build of AMD's ``rocm-smi``. The default command asks for the JSON
form (``rocm-smi ... --json``); the plain table (``DCU Temp AvgPwr Fan Perf PwrCap VRAM%
DCU%``) is read too when a site configures the bare command, and so is ``hy-smi`` where
it prints the same. Both are parsed by :func:`hetpatrol.collectors.rocm_family.
parse_rocm_smi` (keys and columns by name and unit; see that module for where the
Hygon and AMD forms differ).

Value sources (rocm-smi JSON key -> :class:`~hetpatrol.schema.CardRecord` field):

=========================================  ================================================
``cardN``                                  ``index`` (N)
``Card Series``                            ``model``; :func:`card_type_for` -> ``card_type``
``Serial Number`` / ``Unique ID``          ``serial`` / ``uuid`` (``N/A`` -> None)
``Temperature (Sensor junction) (C)``      ``temperature_celsius`` (junction only)
``Average Graphics Package Power (W)``     ``power_watts``
``DCU use (%)``                            ``utilization_ratio`` (/100)
``vram Total (Used) Memory (MiB)``         ``memory_total_bytes`` / ``memory_used_bytes``
table ``PwrCap``                           ``power_limit_watts``
=========================================  ================================================

The same program name is installed by AMD's ROCm: only cards that say they are Hygon's
(``DCU`` keys or table heading, ``Chengdu Haiguang`` vendor string) are this plugin's; an
output with none is an absent Hygon stack (the ``amd`` plugin reads those cards).
rocm-smi prints no health word and this read lists no processes: ``vendor_health`` is
None and the processes are unknown (an error entry says so), never "none".
"""

from __future__ import annotations

import re
from typing import ClassVar

from hetpatrol.collector import (
    STATE_ABSENT,
    CollectorError,
    CollectResult,
    DeviceNode,
    GresDevice,
    VendorInfo,
)
from hetpatrol.collectors.rocm_family import HYGON, ROCM_SMI_COMMAND, parse_rocm_smi, to_record
from hetpatrol.collectors.smi_tool import SmiToolCollector, problem_result
from hetpatrol.pci_census import CLASS_DISPLAY_OTHER, PciCards

#: the recorded DTK 24.04.3 fixture was read with this (gpustack tests/detectors/rocm_smi)
DEFAULT_COMMAND = ROCM_SMI_COMMAND


def card_type_for(model: str | None) -> str:
    """``card_type`` from the ``Card Series`` text: ``K100_AI`` -> ``"k100_ai"``,
    ``K100`` -> ``"k100"``, ``Z100L`` -> ``"z100l"``, ``Z100`` -> ``"z100"``; anything
    else (masked ``DCU xxxx``, no model) -> ``"dcu"``."""
    s = (model or "").upper()
    for pattern, kind in (
        (r"K100[_ -]?AI", "k100_ai"),
        (r"K100", "k100"),
        (r"Z100L", "z100l"),
        (r"Z100", "z100"),
    ):
        if re.search(pattern, s):
            return kind
    return "dcu"


class HygonCollector(SmiToolCollector):
    """Hygon DCUs through ``rocm-smi --json`` (DTK). Options (``collectors.hygon``):
    ``command`` (argv list or string; default :data:`DEFAULT_COMMAND`),
    ``timeout_seconds`` (default 10)."""

    name: ClassVar[str] = "hygon"
    default_command: ClassVar[tuple[str, ...]] = DEFAULT_COMMAND
    vendor_info: ClassVar[VendorInfo] = VendorInfo(
        # the DTK is the ROCm stack: /dev/kfd (compute) and the DRM render nodes, as
        # containers are started on DCU nodes (docker run --device=/dev/kfd
        # --device=/dev/dri, Hygon DTK / PaddlePaddle docs hardware_support/dcu)
        # /dev/kfd is major "kfd" (amdkfd kfd_chardev.c: register_chrdev(0, kfd_dev_name)
        # with kfd_dev_name "kfd"); the render nodes /dev/dri/renderD128.. are major "drm"
        # (drm_drv.c: register_chrdev(DRM_MAJOR, "drm", ...)): the unit allows both majors
        device_nodes=(
            DeviceNode("/dev/kfd", "rw", "rocm-smi", "kfd"),
            DeviceNode("/dev/dri", "rw", "rocm-smi", "drm"),
        ),
        # gres.conf: File=/dev/dri/renderD<N> of the card's PCI function (sysfs
        # .../<bus id>/drm/renderD<N>). Slurm's AutoDetect=rsmi needs AMD's ROCm SMI
        # library and does not list Hygon; DTK's HIP reads HIP_VISIBLE_DEVICES as ROCm's
        # does (ROCm "GPU isolation techniques",
        # https://rocm.docs.amd.com/en/latest/conceptual/gpu-isolation.html), device
        # indices in rocm-smi's order
        gres=GresDevice(
            "/dev/dri/renderD{n}",
            number="drm_render",
            visible_env=("HIP_VISIBLE_DEVICES",),
            visible_id="index",
            visible_doc="https://rocm.docs.amd.com/en/latest/conceptual/gpu-isolation.html",
            note="a GRES named gpu also gets Slurm's own ROCR_VISIBLE_DEVICES",
        ),
        # rocm-smi: DTK's bin (/opt/dtk, linked as /opt/rocm on DTK nodes) or AMD's ROCm; the
        # same tuple in the amd plugin (host_access keys tool directories by program name)
        tool_dirs={
            "rocm-smi": ("/opt/rocm/bin", "/opt/dtk/bin", "/opt/hyhal/bin"),
            "hy-smi": ("/opt/hyhal/bin",),
        },
        # PCI: vendor 1d94 (Chengdu Haiguang), which the Hygon CPU's own host functions
        # share (Root Complex 1450, bridges 1452/1453, PSP/CCP [1080]); a DCU is a
        # Display controller [0380] (real `lspci -nn`, tests/fixtures/lspci/). Device ids:
        # Z100L 55b7, K100 62b7, K100_AI 6210 (Sugon DCU docs, same fixture); pci.ids
        # (c1c12547) names 6211 K100_AI.
        pci=PciCards(
            vendor_ids=(0x1D94,),
            classes=(CLASS_DISPLAY_OTHER,),
            device_types={0x55B7: "z100l", 0x62B7: "k100", 0x6210: "k100_ai", 0x6211: "k100_ai"},
        ),
    )

    def result(self, text: str) -> CollectResult:
        """One record per Hygon card of the command's output.

        ``absent`` when it lists no Hygon card (the program missing: ``absent`` from
        :meth:`collect`). Raises :class:`CollectorError` (raw kept) when it printed no card.
        """
        read = parse_rocm_smi(text)
        tool = "rocm-smi" if read.source != "rocm-smi table" else "rocm-smi table"
        cards = [c for c in read.cards if c.family == HYGON]
        if not cards:
            return CollectResult(
                self.name,
                state=STATE_ABSENT,
                error=f"{self.command[0]} lists no Hygon DCU (AMD cards only)",
            )
        records = [to_record(c, self.name, card_type_for(c.model), tool) for c in cards]
        note = f"{tool} output truncated" if read.truncated else tool
        return problem_result(self.name, text, records, read.problems, note, read.truncated)


__all__ = ["CollectorError", "HygonCollector", "card_type_for"]
