"""NVIDIA collector: every GPU of the node through NVML (``nvidia-ml-py``'s ``pynvml``).

Where each :class:`~hetpatrol.schema.CardRecord` field comes from (one NVML call each):

======================================  ====================================================
field                                   NVML call
======================================  ====================================================
``index``                               ``nvmlDeviceGetHandleByIndex(i)`` (NVML index)
``model``                               ``nvmlDeviceGetName``
``card_type``, ``memory_kind``          derived from the name (:func:`card_type_from_name`);
                                        ``None`` when the name could not be read
``uuid``                                ``nvmlDeviceGetUUID``
``serial``                              ``nvmlDeviceGetSerial``
``bus_id``                              ``nvmlDeviceGetPciInfo().busId``, normalised
``device_number``                       ``nvmlDeviceGetMinorNumber`` (N of ``/dev/nvidiaN``)
``driver_version``                      ``nvmlSystemGetDriverVersion``
``firmware_version``                    ``nvmlDeviceGetVbiosVersion`` (VBIOS)
``utilization_ratio``                   ``nvmlDeviceGetUtilizationRates().gpu`` / 100
``counters["memory_activity_percent"]`` ``nvmlDeviceGetUtilizationRates().memory`` (%)
``memory_used_bytes``                   ``nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)``
                                        ``used + reserved``; v1 ``used`` on older drivers
``memory_total_bytes``                  same call, ``total``
``temperature_celsius``                 ``nvmlDeviceGetTemperatureV(h, NVML_TEMPERATURE_GPU)``;
                                        ``nvmlDeviceGetTemperature`` (deprecated) where the
                                        binding or the driver lacks the V call
``power_watts``                         ``nvmlDeviceGetPowerUsage`` (mW) / 1000
``power_limit_watts``                   ``nvmlDeviceGetEnforcedPowerLimit`` (mW) / 1000 (the
                                        enforced limit, not the software
                                        ``nvmlDeviceGetPowerManagementLimit``)
``clock_sm_hertz``                      ``nvmlDeviceGetClockInfo(h, NVML_CLOCK_SM)`` x 1e6
``ecc_corrected_total``                 ``nvmlDeviceGetTotalEccErrors(h, CORRECTED, VOLATILE)``
``ecc_uncorrected_total``               ``nvmlDeviceGetTotalEccErrors(h, UNCORRECTED, VOLATILE)``
``remapped_rows_pending``/``_failure``  ``nvmlDeviceGetRemappedRows`` (Ampere and newer)
``retired_pages_pending``               ``nvmlDeviceGetRetiredPagesPendingStatus`` (only
                                        when remapped rows are not supported: pre-Ampere)
``pcie_link_gen``/``_max``              ``nvmlDeviceGetCurrPcieLinkGeneration`` / ``Max...``
``pcie_link_width``/``_max``            ``nvmlDeviceGetCurrPcieLinkWidth`` / ``Max...``
``processes``                           ``nvmlDeviceGetComputeRunningProcesses`` (pid,
                                        ``usedGpuMemory``; ``_v2`` on drivers before R510);
                                        name from psutil
``fabric``                              ``nvmlDeviceGetGpuFabricInfoV`` (v3, else v2 struct),
                                        else ``nvmlDeviceGetGpuFabricInfo``: state,
                                        status, clique, cluster UUID, health summary and
                                        bandwidth (:func:`fabric_from_info`); absent where
                                        NotSupported (PCIe boards)
``counters``                            ``ecc_corrected_aggregate``/``ecc_uncorrected_aggregate``
                                        (``NVML_AGGREGATE_ECC``), ``remapped_rows_correctable``
                                        /``_uncorrectable``, ``clocks_event_reasons`` (bitmask of
                                        ``nvmlDeviceGetCurrentClocksEventReasons``),
                                        ``gpu_recovery_action`` (``nvmlDeviceGetFieldValues``
                                        ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``: 0 none,
                                        1 GPU reset, 2 node reboot, 3 drain P2P, 4 drain and
                                        reset...; absent where NotSupported)
======================================  ====================================================

Error mapping (DESIGN section 4):

- ``NVMLError_LibraryNotFound`` at init: no NVIDIA stack, collector ``absent``.
- ``NVMLError_DriverNotLoaded`` / ``NVMLError_LibRmVersionMismatch`` at init (or at
  ``nvmlDeviceGetCount``): collector ``failed`` with a critical node finding
  ``nvml_driver``; no card is invented.
- Per call, ``NotSupported``: value ``None`` and ``{"source": <call>, "error":
  "NotSupported"}``; never unhealthy.
- ``GpuIsLost`` / ``ResetRequired``: an error entry and a marker in ``vendor_health``
  that the checks turn into critical (``vendor_info.health_words``). After either no
  further call is made on that GPU in this patrol (each may block for seconds); identity
  already read is kept.
- ``Unknown`` on a core call (:data:`CORE_CALLS`: the handle, the memory read; or UUID,
  serial and PCI info all at once): marker ``unknown_error``, critical. ``Unknown`` on any
  other call reads one field: that value is ``None`` with the error entry and the card
  gets a ``nvml_field_error`` finding, a warning; critical once the same call answered
  Unknown in ``collectors.nvidia.field_error_patrols`` (3) consecutive patrols of that
  card (counted per card identity: UUID, serial, bus id; DESIGN section 4 "persistent
  Unknown").
- No handle (``nvmlDeviceGetHandleByIndex`` fails with any error: ``NoPermission``,
  ``Timeout``, ``IrqIssue``...): ``read_ok=False`` with the error, so the card is judged
  ``unknown``, never ``ok`` (unless a ``vendor_health`` marker below already makes it
  critical). ``InsufficientPower`` (on the handle or any call) also marks
  ``vendor_health`` ``insufficient_power``, which the thresholds make critical: the card
  lacks its external power and cannot work, whatever else it reports.
- A card from which no value at all could be read (every call failed or answered
  NotSupported) is ``read_ok=False`` too: no data is not "healthy".
- A call missing from the driver (``FunctionNotFound``, or ``NVMLLibraryMismatchError``
  from nvidia-ml-py's versioned wrappers) or from this nvidia-ml-py (no such attribute):
  the older call is used (memory v2 -> v1, temperature V -> the deprecated call, clocks
  event reasons -> throttle reasons, processes v3 -> v2, remapped rows -> retired pages),
  logged once per NVML session (``nvml_fallback``: info when the older call is there, a
  warning when it is missing too); with no call left the error entry
  says so. Every function is looked up inside that guard: a binding that dropped a
  deprecated name never fails the collector.
- Anything else: ``{"source": <call>, "error": <NVML error name or exception text>}``.

ECC counters, remapped rows and retired pages are read only when
``nvmlDeviceGetEccMode`` says ECC is enabled (consumer cards answer remapped rows with
zeros); otherwise they are ``None`` with an ``nvmlDeviceGetEccMode`` error entry
(``NotSupported`` or ``EccDisabled``).

Bounded work: ``nvmlInit`` once for the collector's life; the device handles, per GPU
the identity calls (name, UUID, serial, PCI info, VBIOS, max PCIe link) and the driver
version are read once per NVML session and cached, so a steady patrol costs
``1 + 17 x GPUs`` calls at most (ECC enabled, recovery action supported, no fallback),
one more per GPU whose fabric registration is read (NVSwitch systems), ``1 + 11 x
GPUs`` for consumer cards without ECC (the recovery action and the fabric info
NotSupported are asked once per NVML session). A lost GPU costs one call per patrol.

NVLink (``links``): ``nvmlDeviceGetNvLinkState`` and four
``nvmlDeviceGetNvLinkErrorCounter`` calls (DL replay, recovery, CRC flit, CRC data) per
link, at most every ``collectors.nvidia.nvlink_interval_seconds`` (60; the last read is
attached in between; ``nvlink: false`` switches it off). A GPU whose link 0 answers
NotSupported (PCIe cards) costs one call per NVML session.
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import sys
import threading
import time
import uuid as uuid_lib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import psutil
import pynvml

from hetpatrol.collector import (
    SECONDS_SCHEMA,
    STATE_ABSENT,
    STATE_FAILED,
    STATE_OK,
    Collector,
    CollectorError,
    CollectResult,
    DeviceNode,
    GresDevice,
    JobEnvVar,
    VendorInfo,
)
from hetpatrol.collectors.nvidia_actions import ACTIONS as NVIDIA_ACTIONS
from hetpatrol.collectors.nvidia_kmsg import NVRM
from hetpatrol.logs import get_logger
from hetpatrol.pci_census import CLASS_3D, CLASS_VGA, PciCards
from hetpatrol.replay import load_scenario
from hetpatrol.schema import (
    FABRIC_STATES,
    HEALTH_CRITICAL,
    HEALTH_WARNING,
    SEVERITY_INFO,
    CardRecord,
    Finding,
    PartitionInfo,
    ProcessInfo,
    normalize_bus_id,
)

# The NVML replay (and the XML parser under it) is imported only when a replay is used:
# a daemon on a real node never loads it.
_REPLAY_MODULE = __name__.rpartition(".")[0] + ".nvml_replay"

__all__ = [
    "CORE_CALLS",
    "FI_DEV_GET_GPU_RECOVERY_ACTION",
    "NOT_IN_BINDING",
    "RECOVERY_ACTION_SOURCE",
    "VENDOR_HEALTH",
    "VH_GPU_IS_LOST",
    "VH_RESET_REQUIRED",
    "VH_UNKNOWN_ERROR",
    "NvidiaCollector",
    "card_type_from_name",
    "memory_kind_for",
]

#: ``vendor_health`` markers set by this collector (``None`` when NVML raised none of
#: these: NVML has no overall health verdict of its own). ``vendor_info.health_words``
#: makes a card with any of them critical.
VH_GPU_IS_LOST = "gpu_is_lost"  #: NVMLError_GpuIsLost: fell off the bus
VH_RESET_REQUIRED = "reset_required"  #: NVMLError_ResetRequired: needs a GPU reset
VH_UNKNOWN_ERROR = "unknown_error"  #: NVMLError_Unknown on some call
VH_INSUFFICIENT_POWER = "insufficient_power"  #: NVMLError_InsufficientPower
VENDOR_HEALTH = (VH_GPU_IS_LOST, VH_RESET_REQUIRED, VH_UNKNOWN_ERROR, VH_INSUFFICIENT_POWER)
_VH_RANK = {
    None: 0,
    VH_UNKNOWN_ERROR: 1,
    VH_INSUFFICIENT_POWER: 2,
    VH_RESET_REQUIRED: 3,
    VH_GPU_IS_LOST: 4,
}

#: Record fields read from the card itself: a card with none of them was not read.
_CARD_VALUES = (
    "model",
    "uuid",
    "serial",
    "bus_id",
    "firmware_version",
    "utilization_ratio",
    "memory_used_bytes",
    "memory_total_bytes",
    "temperature_celsius",
    "power_watts",
    "power_limit_watts",
    "clock_sm_hertz",
    "ecc_corrected_total",
    "ecc_uncorrected_total",
    "pcie_link_gen",
    "pcie_link_gen_max",
    "pcie_link_width",
    "pcie_link_width_max",
)

REPLAY_XML = "nvidia-smi-q.xml"
#: the NVIDIA driver's table of MIG capability device minors (procfs, nvidia-caps)
MIG_MINORS = "/proc/driver/nvidia-caps/mig-minors"
_MIG_MINORS_LIMIT = 1 << 20  # 8 GPUs x 135 lines of ~25 bytes: 27 KiB
_MIG_NAME_RE = re.compile(r"\bMIG\s+(\S+)\s*$")

#: NVLink DL error counters read per link (name in the record, NVML counter).
_NVLINK_COUNTERS = (
    ("replay", pynvml.NVML_NVLINK_ERROR_DL_REPLAY),
    ("recovery", pynvml.NVML_NVLINK_ERROR_DL_RECOVERY),
    ("crc_flit", pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT),
    ("crc_data", pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
)

_MISSING = object()

log = get_logger("hetpatrol.collectors.nvidia")

#: ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``: field id 230 in nvml.h and nvidia-ml-py
#: (pynvml.py: ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230``); older bindings lack the
#: constant, the number is what the driver is asked for.
FI_DEV_GET_GPU_RECOVERY_ACTION = getattr(pynvml, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", 230)
RECOVERY_ACTION_SOURCE = "nvmlDeviceGetFieldValues(NVML_FI_DEV_GET_GPU_RECOVERY_ACTION)"

#: The source named in a fabric read's error entries.
FABRIC_SOURCE = "nvmlDeviceGetGpuFabricInfoV"
#: The fabric info calls, newest first: (struct version, NVML function, pynvml struct).
#: ``nvmlGpuFabricInfo_v3_t`` adds ``healthSummary`` to v2's ``healthMask``; a driver
#: that predates a version answers ``ArgumentVersionMismatch``, one that predates
#: ``nvmlDeviceGetGpuFabricInfoV`` has only the deprecated ``nvmlDeviceGetGpuFabricInfo``
#: (pynvml.py: "DEPRECATED: Use nvmlDeviceGetGpuFabricInfoV instead").
_FABRIC_CALLS = (
    ("v3", "nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v3_t"),
    ("v2", "nvmlDeviceGetGpuFabricInfoV", "c_nvmlGpuFabricInfo_v2_t"),
    ("v1", "nvmlDeviceGetGpuFabricInfo", "c_nvmlGpuFabricInfo_t"),
)
#: ``NVML_GPU_FABRIC_HEALTH_SUMMARY_*`` (1 healthy, 2 unhealthy, 3 limited capacity; 0
#: not supported) as nvidia-smi prints them
_FABRIC_SUMMARY = {1: "Healthy", 2: "Unhealthy", 3: "Limited Capacity"}
#: ``NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_*`` (1 true, 2 false; 0 not supported)
_FABRIC_BANDWIDTH = {1: "Degraded", 2: "Full"}
_FABRIC_COMPLETED = 3  # NVML_GPU_FABRIC_STATE_COMPLETED

#: ``nvmlFieldValue_t.valueType`` (``NVML_VALUE_TYPE_*``) -> member of the value union.
_FIELD_VALUE_MEMBER = {
    0: "dVal",
    1: "uiVal",
    2: "ulVal",
    3: "ullVal",
    4: "sllVal",
    5: "siVal",
    6: "usVal",
}

# ---------------------------------------------------------------------------------------
# card type


_NOISE_WORDS = re.compile(r"\b(?:nvidia|geforce|generation|workstation|edition|gpu)\b", re.I)
_DC_RE = re.compile(r"^(?:(?:nvidia|tesla|grid)\s+)*([a-z]{1,2}\d{1,4}[a-z]?)(?=$|[\s\-])", re.I)
_CONSUMER_RE = re.compile(r"\b(?:geforce|quadro|rtx|gtx|gt|titan)\b", re.I)
_HBM_TYPES = frozenset(
    {
        "p100", "v100", "titanv", "a100", "a800", "a30", "h100", "h800", "h200", "h20",
        "gh200", "b100", "b200", "b300", "gb200", "gb300",
    }
)  # fmt: skip


def card_type_from_name(name: str | None) -> str:
    """Normalised card type from ``nvmlDeviceGetName``.

    Data-centre names give the bare model: ``NVIDIA A100-SXM4-80GB`` -> ``a100``,
    ``NVIDIA H100 80GB HBM3``/``NVIDIA H100 NVL`` -> ``h100``, ``NVIDIA L40S`` -> ``l40s``,
    ``Tesla T4`` -> ``t4``, ``NVIDIA A10G`` -> ``a10g``, ``GRID P4-1Q`` (a vGPU slice) ->
    ``p4``. GeForce/Quadro/RTX/TITAN names give a compact lower-case name without
    ``NVIDIA``/``GeForce``/``Generation``/``Workstation Edition``/``GPU``:
    ``rtx4090``, ``rtxa5000``, ``quadrop2000``, ``rtx3060laptop``. Anything else
    (``Graphics Device`` from old drivers, ``None``) -> ``nvidia``.
    """
    if not name:
        return "nvidia"
    text = name.strip()
    m = _DC_RE.match(text)
    if m:
        return m.group(1).lower()
    if _CONSUMER_RE.search(text):
        compact = re.sub(r"[^a-z0-9]", "", _NOISE_WORDS.sub(" ", text).lower())
        if compact:
            return compact
    return "nvidia"


def memory_kind_for(card_type: str | None) -> str | None:
    """``hbm`` for HBM parts (P100, V100, TITAN V, A100/A800/A30, H100/H200/GH200,
    Blackwell B/GB), ``gddr`` for any other recognised card, ``None`` when unknown."""
    if not card_type or card_type == "nvidia":
        return None
    return "hbm" if card_type in _HBM_TYPES else "gddr"


# ---------------------------------------------------------------------------------------
# per-call error handling


def _error_name(exc: BaseException) -> str:
    if isinstance(exc, pynvml.NVMLError):
        name = type(exc).__name__
        if name.startswith("NVMLError_"):
            return name[len("NVMLError_") :]
        return f"NVMLError {getattr(exc, 'value', '?')}"
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class _CardGone(Exception):
    """Stop reading this GPU for this patrol (lost, reset required, no handle)."""


class _Fallback(Exception):
    """The call is not there: missing from this ``nvidia-ml-py`` (no such attribute), from
    the driver's library (``FunctionNotFound``), or a versioned wrapper whose symbol the
    driver lacks (``NVMLLibraryMismatchError``). The caller uses the older call."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _text(value: Any) -> str:
    return value.decode(errors="replace") if isinstance(value, bytes) else str(value)


#: Errors a missing call raises: ``FunctionNotFound`` (an NVML return code) and, from
#: ``nvidia-ml-py``'s ``@throwOnVersionMismatch`` wrappers (pynvml.py:
#: ``nvmlDeviceGetComputeRunningProcesses`` calls the ``_v3`` symbol, which drivers before
#: R510 lack), ``NVMLLibraryMismatchError``, which is NOT an ``NVMLError``.
_MISSING_CALL_ERRORS: tuple[type[BaseException], ...] = tuple(
    cls
    for cls in (
        pynvml.NVMLError_FunctionNotFound,
        getattr(pynvml, "NVMLLibraryMismatchError", None),
    )
    if cls is not None
)

#: Error text of a call this ``nvidia-ml-py`` does not have at all.
NOT_IN_BINDING = "FunctionNotFound (not in this nvidia-ml-py)"

#: Core calls: without them nothing about the card can be trusted, so ``Unknown`` on one
#: of them makes the card critical at once (``vendor_health`` ``unknown_error``). Every
#: other call reads one field: ``Unknown`` there makes that field null with the reason,
#: a warning, and critical only when it persists (``field_error_patrols``).
CORE_CALLS = frozenset({"nvmlDeviceGetHandleByIndex", "nvmlDeviceGetMemoryInfo"})
_IDENTITY_CALLS = frozenset({"nvmlDeviceGetUUID", "nvmlDeviceGetSerial", "nvmlDeviceGetPciInfo"})


class _Reader:
    """Calls NVML for one card and maps every failure onto the record.

    Every function is looked up by name INSIDE the guard: a function this
    ``nvidia-ml-py`` lacks (removed after a deprecation) is an error entry or a fallback,
    never an ``AttributeError`` that fails the whole collector.
    """

    def __init__(self, nvml: Any, record: CardRecord):
        self.nvml = nvml
        self.record = record
        self.called: set[str] = set()  # sources asked in this patrol
        self.unknown: set[str] = set()  # non-core sources that answered Unknown

    def error(self, source: str, error: str) -> None:
        entry = {"source": source, "error": error}
        if entry not in self.record.errors:  # e.g. both ECC counters NotSupported
            self.record.add_error(source, error)

    def mark(self, marker: str) -> None:
        if _VH_RANK[marker] > _VH_RANK.get(self.record.vendor_health, 0):
            self.record.vendor_health = marker

    def call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        """Value of ``nvml.<name>(*args)``, or ``_MISSING`` with an error entry (the
        source is ``name`` unless ``source=`` says otherwise). Raises ``_CardGone`` after
        GpuIsLost/ResetRequired. With ``fallback=True`` a missing call raises
        :class:`_Fallback` so the caller can use the older one; ``quiet`` names
        exceptions the caller handles itself."""
        source = kwargs.pop("source", name)
        fallback = kwargs.pop("fallback", False)
        quiet = kwargs.pop("quiet", ())  # exceptions the caller handles itself
        self.called.add(source)
        fn = getattr(self.nvml, name, None)
        if fn is None:
            if fallback:
                raise _Fallback(f"{name} is not in this nvidia-ml-py")
            self.error(source, NOT_IN_BINDING)
            return _MISSING
        try:
            return fn(*args, **kwargs)
        except quiet:
            raise
        except _MISSING_CALL_ERRORS as exc:
            if fallback:
                raise _Fallback(f"{name}: {_error_name(exc)}") from None
            self.fail(source, exc)
        except Exception as exc:  # noqa: BLE001 - every failure becomes an error entry
            self.fail(source, exc)
        return _MISSING

    def lacks(self, source: str, since: int) -> bool:
        """Whether an error entry from the ``since``-th on says the call ``source`` is
        missing (from this nvidia-ml-py, the driver: :data:`_MISSING_CALL_ERRORS`), i.e.
        an older call stood in for nothing."""
        # the entries fail() writes for them: _error_name's "FunctionNotFound", and
        # "NVMLLibraryMismatchError: <text>" (not an NVMLError)
        missing = (NOT_IN_BINDING, "FunctionNotFound", "NVMLLibraryMismatchError")
        return any(
            e["source"] == source and str(e["error"]).startswith(missing)
            for e in self.record.errors[since:]
        )

    def fail(self, source: str, exc: BaseException) -> None:
        """Map one failed call (or one field of ``nvmlDeviceGetFieldValues``)."""
        if isinstance(exc, pynvml.NVMLError_GpuIsLost):
            self.error(source, "GpuIsLost")
            self.mark(VH_GPU_IS_LOST)
            raise _CardGone from None
        if isinstance(exc, pynvml.NVMLError_ResetRequired):
            self.error(source, "ResetRequired")
            self.mark(VH_RESET_REQUIRED)
            raise _CardGone from None
        if isinstance(exc, pynvml.NVMLError_Unknown):
            self.error(source, "Unknown")
            if source in CORE_CALLS:
                self.mark(VH_UNKNOWN_ERROR)
            else:
                self.unknown.add(source)
        elif isinstance(exc, pynvml.NVMLError_InsufficientPower):
            self.error(source, "InsufficientPower")
            self.mark(VH_INSUFFICIENT_POWER)
        else:
            self.error(source, _error_name(exc))


class _UnknownStreaks:
    """Consecutive patrols in which a non-core NVML call answered ``Unknown``, per card.

    Kept per card IDENTITY, never per NVML index (an index moves when a GPU drops out):
    an entry holds the UUID, serial and bus id last read and matches a card that shares
    one of them and contradicts none (so a patrol in which the UUID itself answered
    Unknown still finds the card by serial or bus id). A call asked and answered well
    ends its streak; a call not asked in a patrol (NVLink between its reads) keeps it.
    Entries of cards not read in a patrol are dropped, so memory is bounded by the GPUs.
    """

    def __init__(self) -> None:
        self._cards: list[tuple[dict[str, str], dict[str, int]]] = []
        self._seen: list[tuple[dict[str, str], dict[str, int]]] = []

    def begin(self) -> None:
        self._seen = []

    def end(self) -> None:
        self._cards = self._seen

    def update(
        self, identity: dict[str, str], called: set[str], unknown: set[str]
    ) -> dict[str, int]:
        """Streak of every call still failing on this card (asked now or earlier)."""
        if not identity:  # nothing identifies the card: this patrol alone counts
            return {source: 1 for source in unknown}
        entry = None
        for ident, streaks in self._cards:
            shared = [k for k in identity if k in ident]
            if any(ident[k] != identity[k] for k in shared):
                continue
            if shared:
                entry = (ident, streaks)
                break
        if entry is None:
            entry = ({}, {})
        else:
            self._cards.remove(entry)
        entry[0].update(identity)
        streaks = entry[1]
        for source in called:
            if source in unknown:
                streaks[source] = streaks.get(source, 0) + 1
            else:
                streaks.pop(source, None)
        self._seen.append(entry)
        return dict(streaks)


def _is_replay(nvml: Any) -> bool:
    """True when ``nvml`` is a :class:`~hetpatrol.collectors.nvml_replay.ReplayNvml`
    (never when the replay module was not even imported)."""
    replay = sys.modules.get(_REPLAY_MODULE)
    return replay is not None and isinstance(nvml, replay.ReplayNvml)


def _psutil_process_name(pid: int) -> str | None:
    """Name of a local process, ``None`` when it is gone or cannot be read."""
    try:
        return psutil.Process(pid).name()
    except (psutil.Error, OSError):
        return None


def fabric_from_info(info: Any, version: str, reader: _Reader | None = None) -> dict[str, Any]:
    """The record's ``fabric`` from an ``nvmlGpuFabricInfo`` struct (``version`` v1, v2
    or v3), each value on its own (:func:`hetpatrol.schema.fabric_json_schema`):

    - ``state``: ``NVML_GPU_FABRIC_STATE_*`` (0 Not Supported, 1 Not Started, 2 In
      Progress, 3 Completed) in nvidia-smi's words; a number NVML does not define is
      None with an error entry naming it;
    - ``status``, ``clique_id``, ``cluster_uuid`` only when completed (nvml.h: the status
      "Must be checked only if Probe state returns complete"): ``Success`` or the NVML
      error name of ``status`` (``InsufficientResources``, ``Unknown``...);
      ``clusterUuid``'s 16 bytes as a dashed UUID;
    - ``bandwidth`` (v2, v3: ``healthMask`` bits ``DEGRADED_BW``) and ``health_summary``
      (v3: ``healthSummary``): None where the driver says "not supported".
    """
    state_n = int(info.state)
    out: dict[str, Any] = dict.fromkeys(
        ("state", "status", "clique_id", "cluster_uuid", "health_summary", "bandwidth")
    )
    if 0 <= state_n < len(FABRIC_STATES):
        out["state"] = FABRIC_STATES[state_n]
    elif reader is not None:
        reader.error(FABRIC_SOURCE, f"fabric state {state_n} is not one NVML defines")
    if state_n == _FABRIC_COMPLETED:
        status = int(info.status)
        out["status"] = (
            "Success" if status == pynvml.NVML_SUCCESS else _error_name(pynvml.NVMLError(status))
        )
        out["clique_id"] = int(info.cliqueId)
        out["cluster_uuid"] = str(uuid_lib.UUID(bytes=bytes(info.clusterUuid)))
    if version in ("v2", "v3"):
        mask = int(info.healthMask)
        shift = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
        width = pynvml.NVML_GPU_FABRIC_HEALTH_MASK_WIDTH_DEGRADED_BW
        out["bandwidth"] = _FABRIC_BANDWIDTH.get((mask >> shift) & width)
    if version == "v3":
        out["health_summary"] = _FABRIC_SUMMARY.get(int(info.healthSummary))
    return out


#: /dev/nvidiaN per GPU: an HGX/DGX board carries 8; 16 leaves room (the device group
#: allows them all anyway).
NVIDIA_MAX_GPUS = 16


class NvidiaCollector(Collector):
    """Reads every NVIDIA GPU through NVML.

    ``nvml`` is the module answering NVML calls: the real ``pynvml`` in production; with
    ``replay_dir`` a :class:`~hetpatrol.collectors.nvml_replay.ReplayNvml` built from
    ``replay_dir/nvidia-smi-q.xml`` and the ``nvml:`` faults of
    ``replay_dir/scenario.yaml`` (no XML there = a node without NVIDIA: ``absent``);
    tests may pass any object with pynvml's functions. ``process_namer(pid)`` names a
    process: psutil by default, the dump's recorded names when replaying (pids of a
    recording mean nothing on this host).
    """

    name = "nvidia"
    vendor_info = VendorInfo(
        # the vendor_health markers this collector sets when a call raised
        health_words={
            VH_GPU_IS_LOST: (
                HEALTH_CRITICAL,
                "GPU is lost (fell off the bus): NVML answers GpuIsLost",
            ),
            VH_RESET_REQUIRED: (
                HEALTH_CRITICAL,
                "GPU requires a reset: NVML answers ResetRequired",
            ),
            VH_UNKNOWN_ERROR: (
                HEALTH_CRITICAL,
                "NVML answers Unknown error for a core call of this GPU (handle, "
                "memory, or its whole identity)",
            ),
            VH_INSUFFICIENT_POWER: (
                HEALTH_CRITICAL,
                "GPU has insufficient power (external power cable?): NVML answers "
                "InsufficientPower",
            ),
        },
        # nvmlClocksEventReasons bits (nvml.h: nvmlClocksEventReasonSwThermalSlowdown
        # 0x20, HwThermalSlowdown 0x40, HwPowerBrakeSlowdown 0x80, HwSlowdown 0x8)
        clock_event_reason_bits={
            "hw_slowdown": 0x8,
            "sw_thermal": 0x20,
            "hw_thermal": 0x40,
            "hw_power_brake": 0x80,
        },
        link_kinds=("nvlink",),
        kernel_log=NVRM,  # XIDs and "fallen off the bus" (hetpatrol.collectors.nvidia_kmsg)
        # NVML: /dev/nvidiactl (195:255) and /dev/nvidiaN (195:N) share the major the
        # NVIDIA kernel module registers as "nvidia-frontend"; nvidia-uvm and nvidia-caps
        # (/dev/nvidia-caps/nvidia-capN, MIG) have majors of their own. (nvidia-modprobe(1);
        # NVIDIA driver README "Installing the NVIDIA Driver", device files)
        device_nodes=(
            DeviceNode("/dev/nvidiactl", "rw", "NVML", "nvidia-frontend"),
            DeviceNode("/dev/nvidia{n}", "rw", "NVML", "nvidia-frontend", NVIDIA_MAX_GPUS),
            DeviceNode("/dev/nvidia-uvm", "rw", "NVML", "nvidia-uvm"),
            DeviceNode("/dev/nvidia-caps/nvidia-cap{n}", "r", "NVML (MIG)", "nvidia-caps", 2),
        ),
        # gres.conf: File=/dev/nvidia<minor number> (NVML's nvmlDeviceGetMinorNumber, not
        # the NVML index: the two differ when the PCI order is not the minor order).
        # Slurm's gpu plugin sets CUDA_VISIBLE_DEVICES itself (gres_common.c,
        # gres_common_gpu_set_env) and finds the cards with AutoDetect=nvml (gres.conf(5))
        gres=GresDevice("/dev/nvidia{n}", number="device_number", autodetect="nvml"),
        # PCI (pci.ids, pciutils/pciids c1c12547, 2026-08-22): vendor 10de; a GPU is a
        # VGA [0300] or 3D controller [0302]. NVSwitch (1af1 A100, 22a3 H100: Bridge
        # [0680]) and the HDMI audio functions (Audio device [0403]) share the vendor id
        # and are not cards (see tests/fixtures/lspci/).
        pci=PciCards(
            vendor_ids=(0x10DE,),
            classes=(CLASS_VGA, CLASS_3D),
            device_types={
                **dict.fromkeys((0x20B0, 0x20B1, 0x20B2, 0x20B3, 0x20B5, 0x20F1), "a100"),
                **dict.fromkeys((0x20BD, 0x20F3, 0x20F5, 0x20F6), "a800"),
                **dict.fromkeys((0x2330, 0x2331, 0x2336, 0x2337, 0x2338, 0x2339, 0x233D), "h100"),
                **dict.fromkeys((0x2335, 0x233B), "h200"),
                **dict.fromkeys((0x2322, 0x2324), "h800"),
                **dict.fromkeys((0x2329, 0x232C, 0x230C, 0x230E), "h20"),
                0x26B9: "l40s",
                0x26B5: "l40",
                0x27B8: "l4",
                0x1EB8: "t4",
                0x2236: "a10",
                0x2237: "a10g",
            },
        ),
        # XID catalog, NVRM reasons, NVML recovery action -> action words
        actions=NVIDIA_ACTIONS,
        # the job's cards: CUDA_VISIBLE_DEVICES lists GPU indexes or UUIDs ("GPU-...",
        # MIG devices "MIG-...": CUDA C++ Programming Guide, "CUDA Environment
        # Variables"); it is not set in the Prolog, and in a step cgroup device
        # constraints may renumber it, so its numbers (the gpu GRES IDX) are read only
        # when Slurm's SLURM_JOB_GPUS / SLURM_STEP_GPUS is not there; UUIDs are exact
        job_env=(
            JobEnvVar(
                "CUDA_VISIBLE_DEVICES",
                ids="gres_idx",
                gres="gpu",
                uuid_prefixes=("GPU-", "MIG-"),
                doc="https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#env-vars",
            ),
        ),
    )

    #: ``collectors.nvidia``: NVML is a library, so no ``command``
    options_schema = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "enabled": {"type": "boolean"},
            "timeout_seconds": SECONDS_SCHEMA,
            "nvlink": {"type": "boolean"},
            "nvlink_interval_seconds": {"type": "number", "minimum": 0, "maximum": 86400},
            # consecutive patrols an NVML field read may answer Unknown before the card is
            # critical; one patrol's Unknown is a warning
            "field_error_patrols": {"type": "integer", "minimum": 1, "maximum": 1000},
        },
    }

    def __init__(
        self,
        options: Mapping[str, Any] | None = None,
        *,
        replay_dir: Path | None = None,
        nvml: Any = None,
        process_namer: Callable[[int], str | None] | None = None,
    ):
        super().__init__(options or {}, replay_dir=replay_dir)
        self.nvml: Any = nvml
        self._nvml_given = nvml is not None
        self._process_namer = process_namer
        self._nvlink_on = bool(self.options.get("nvlink", True))
        self._nvlink_interval = float(self.options.get("nvlink_interval_seconds", 60))
        patrols = self.options.get("field_error_patrols", 3)
        if isinstance(patrols, bool) or not isinstance(patrols, int) or patrols < 1:
            raise ValueError(
                f"collectors.nvidia.field_error_patrols must be an integer >= 1, got {patrols!r}"
            )
        self._field_error_patrols = patrols
        self._streaks = _UnknownStreaks()  # per card identity, across patrols and sessions
        self._lock = threading.Lock()
        self._initialized = False
        self._reset_session()

    # -- session -------------------------------------------------------------------

    def _reset_session(self) -> None:
        self._handles: dict[int, Any] = {}
        self._identity: dict[int, tuple[dict[str, Any], list[dict[str, str]]]] = {}
        self._driver_version: Any = _MISSING
        self._driver_error: str | None = None
        self._memory_v1 = False  # nvmlDeviceGetMemoryInfo_v2 not in this driver
        self._throttle_reasons = False  # nvmlDeviceGetCurrentClocksEventReasons missing
        self._no_remap_fn = False  # nvmlDeviceGetRemappedRows missing
        self._temperature_v0 = False  # nvmlDeviceGetTemperatureV missing: the old call
        self._processes_v2 = False  # ..._v3 missing (driver before R510): the _v2 call
        self._processes_reason = ""
        self._fallbacks_said: set[str] = set()
        self._no_recovery_action: set[int] = set()  # field NotSupported on this GPU
        self._nvlink_cache: dict[int, tuple[float, list[dict[str, Any]]]] = {}
        self._no_nvlink: set[int] = set()  # link 0 NotSupported: no NVLink on this GPU
        self._fabric_call = 0  # index in _FABRIC_CALLS of the call this driver answers
        self._no_fabric: set[int] = set()  # fabric info NotSupported on this GPU
        # (GPU instance id, compute instance id) of each process last read, in order
        self._proc_instances: list[tuple[Any, Any]] = []

    def _load_replay(self) -> CollectResult | None:
        from .nvml_replay import ReplayFormatError, load_replay_nvml

        assert self.replay_dir is not None
        xml = self.replay_dir / REPLAY_XML
        if not xml.is_file():
            return CollectResult(
                self.name, state=STATE_ABSENT, error=f"no {REPLAY_XML} in {self.replay_dir}"
            )
        try:
            faults = load_scenario(self.replay_dir).get("nvml")
        except ValueError as exc:
            raise CollectorError(str(exc)) from None
        try:
            self.nvml = load_replay_nvml(xml, faults)
        except ReplayFormatError as exc:
            raise CollectorError(str(exc), raw=exc.raw) from None
        except OSError as exc:
            raise CollectorError(f"{xml}: {exc}") from None
        return None

    def _driver_failure(self, exc: BaseException, when: str) -> CollectResult:
        kind = _error_name(exc)
        if isinstance(exc, pynvml.NVMLError_LibRmVersionMismatch):
            why = (
                "NVML library and kernel driver versions differ (driver upgraded "
                "without reloading the module or rebooting)"
            )
        else:
            why = "NVIDIA kernel driver is not loaded"
        message = f"{when}: {kind}: {why}"
        return CollectResult(
            self.name,
            state=STATE_FAILED,
            error=message,
            node_findings=[Finding("nvml_driver", HEALTH_CRITICAL, message, value=kind)],
        )

    def _ensure_init(self) -> CollectResult | None:
        """``nvmlInit`` once; a result to return instead of reading when it failed."""
        if self._initialized:
            return None
        if self.nvml is None:
            if self.replay_dir is not None:
                absent = self._load_replay()
                if absent is not None:
                    return absent
            else:
                self.nvml = pynvml
        try:
            self.nvml.nvmlInit()
        except pynvml.NVMLError_LibraryNotFound as exc:
            return CollectResult(
                self.name,
                state=STATE_ABSENT,
                error=f"nvmlInit: {_error_name(exc)}: no NVIDIA driver library on this node",
            )
        except (pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_LibRmVersionMismatch) as exc:
            return self._driver_failure(exc, "nvmlInit")
        except Exception as exc:  # noqa: BLE001
            return CollectResult(
                self.name, state=STATE_FAILED, error=f"nvmlInit: {_error_name(exc)}"
            )
        self._initialized = True
        self._reset_session()
        return None

    def close(self) -> None:
        """``nvmlShutdown`` when ``nvmlInit`` succeeded. A replay is reloaded on the
        next collect. When a read is still stuck inside NVML, nothing is shut down under
        it (the process is going away anyway)."""
        if not self._lock.acquire(timeout=1.0):
            return
        try:
            if self._initialized:
                with contextlib.suppress(Exception):  # shutting down anyway
                    self.nvml.nvmlShutdown()
            self._initialized = False
            self._reset_session()
            if not self._nvml_given and self.replay_dir is not None:
                self.nvml = None
        finally:
            self._lock.release()

    # -- patrol ----------------------------------------------------------------------

    def collect(self) -> CollectResult:
        """One read of every GPU (``nvmlDeviceGetCount``, then per index).

        Raises ``CollectorError(hung=True)`` at once when the previous read has not
        returned yet (a call stuck in NVML on a dying GPU): no second thread piles up
        behind it.
        """
        start = time.monotonic()
        if not self._lock.acquire(blocking=False):
            raise CollectorError("previous NVML read has not returned yet", hung=True)
        try:
            result = self._collect()
        finally:
            self._lock.release()
        result.duration_seconds = time.monotonic() - start
        return result

    def _collect(self) -> CollectResult:
        failed = self._ensure_init()
        if failed is not None:
            return failed
        nvml = self.nvml
        try:
            count = nvml.nvmlDeviceGetCount()
        except (pynvml.NVMLError_DriverNotLoaded, pynvml.NVMLError_LibRmVersionMismatch) as exc:
            self._initialized = False  # re-init on the next patrol
            return self._driver_failure(exc, "nvmlDeviceGetCount")
        except Exception as exc:  # noqa: BLE001
            return CollectResult(
                self.name, state=STATE_FAILED, error=f"nvmlDeviceGetCount: {_error_name(exc)}"
            )
        if self._driver_version is _MISSING:
            try:
                self._driver_version = _text(nvml.nvmlSystemGetDriverVersion())
                self._driver_error = None
            except pynvml.NVMLError_NotSupported:
                self._driver_version, self._driver_error = None, "NotSupported"
            except Exception as exc:  # noqa: BLE001 - retried next patrol
                self._driver_error = _error_name(exc)
        namer = self._process_namer
        if namer is None:
            namer = self._replay_namer if _is_replay(nvml) else _psutil_process_name
        self._streaks.begin()
        records = [self._read_card(nvml, index, namer) for index in range(count)]
        self._streaks.end()
        return CollectResult(self.name, records=records, state=STATE_OK)

    def _replay_namer(self, pid: int) -> str | None:
        try:
            return _text(self.nvml.nvmlSystemGetProcessName(pid))
        except Exception:  # noqa: BLE001
            return None

    def _read_card(self, nvml: Any, index: int, namer: Callable[[int], str | None]) -> CardRecord:
        rec = CardRecord(vendor="nvidia", index=index)
        driver = self._driver_version
        rec.driver_version = None if driver is _MISSING else driver
        if self._driver_error is not None:
            rec.add_error("nvmlSystemGetDriverVersion", self._driver_error)
        reader = _Reader(nvml, rec)
        try:
            handle = self._handles.get(index, _MISSING)
            if handle is _MISSING:
                handle = reader.call("nvmlDeviceGetHandleByIndex", index)
                if handle is _MISSING:
                    # no handle: nothing about this card is known (a marker such as
                    # gpu_is_lost already makes it critical and says why)
                    rec.read_ok = rec.vendor_health is not None
                    raise _CardGone
                self._handles[index] = handle  # valid until nvmlShutdown
            self._read_identity(handle, reader)
            self._read_state(handle, reader, namer)
        except _CardGone:
            cached = self._identity.get(index)
            if cached is not None:  # identity read earlier in this NVML session
                for name, value in cached[0].items():
                    if getattr(rec, name) is None:
                        setattr(rec, name, value)
        if rec.vendor_health is None and all(getattr(rec, f, None) is None for f in _CARD_VALUES):
            rec.read_ok = False  # every call failed or answered NotSupported
        # A card whose name could not be read (lost before its first read) has no type.
        rec.card_type = card_type_from_name(rec.model) if rec.model is not None else None
        rec.memory_kind = memory_kind_for(rec.card_type)
        self._field_errors(reader)
        return rec

    def _field_errors(self, reader: _Reader) -> None:
        """Judge ``Unknown`` answers of non-core calls (DESIGN section 4: "persistent
        Unknown = card critical"). One patrol's Unknown on a field read is a warning
        (``nvml_field_error``) with the value null and the reason in ``errors``; the same
        call answering Unknown in ``field_error_patrols`` consecutive patrols of this card
        is critical. A card whose UUID, serial and PCI info all answer Unknown cannot even
        say which card it is: that is a core failure (``unknown_error``) at once."""
        rec = reader.record
        if reader.unknown >= _IDENTITY_CALLS and not (rec.uuid or rec.serial or rec.bus_id):
            reader.mark(VH_UNKNOWN_ERROR)  # the vendor_health finding says it: critical
            return
        identity = {
            k: v
            for k, v in (("uuid", rec.uuid), ("serial", rec.serial), ("bus_id", rec.bus_id))
            if v
        }
        streaks = self._streaks.update(identity, reader.called, reader.unknown)
        if not streaks:
            return
        limit = self._field_error_patrols
        longest = max(streaks.values())
        persistent = longest >= limit
        if not persistent and not rec.read_ok:
            return  # an unreadable card is unknown (card_unreadable), which says more
        ranked = sorted(streaks.items(), key=lambda item: (-item[1], item[0]))
        calls = ", ".join(
            f"{source} ({n} patrol{'s' if n > 1 else ''} in a row)" for source, n in ranked
        )
        if persistent:
            text = (
                f"NVML answers Unknown for {calls}: value null; {longest} consecutive "
                f"patrols reach collectors.nvidia.field_error_patrols ({limit})"
            )
        else:
            text = (
                f"NVML answers Unknown for {calls}: value null; critical after {limit} "
                "patrols in a row"
            )
        rec.findings.append(
            Finding(
                "nvml_field_error",
                HEALTH_CRITICAL if persistent else HEALTH_WARNING,
                text,
                value=longest,
                threshold=limit,
            )
        )

    def _note_fallback(self, key: str, reason: str, used: str, worked: bool = True) -> None:
        """Say once per NVML session that an older call stands in for a missing one: at
        info when it ``worked`` (the older call is there: nothing is lost, still in the
        JSONL and ``-v``), a warning when it is missing too (no call left: the value is
        not read)."""
        if key in self._fallbacks_said:
            return
        self._fallbacks_said.add(key)
        say = log.info if worked else log.warning
        say("nvml_fallback", call=key, reason=reason, used=used, worked=worked)

    def _read_identity(self, handle: Any, reader: _Reader) -> None:
        rec = reader.record
        cached = self._identity.get(rec.index)
        if cached is not None:
            values, errors = cached
            for name, value in values.items():
                setattr(rec, name, value)
            for err in errors:
                rec.add_error(err["source"], err["error"])
            return
        first_error = len(rec.errors)
        call = reader.call
        name = call("nvmlDeviceGetName", handle)
        uuid = call("nvmlDeviceGetUUID", handle)
        serial = call("nvmlDeviceGetSerial", handle)
        pci = call("nvmlDeviceGetPciInfo", handle)
        vbios = call("nvmlDeviceGetVbiosVersion", handle)
        gen_max = call("nvmlDeviceGetMaxPcieLinkGeneration", handle)
        width_max = call("nvmlDeviceGetMaxPcieLinkWidth", handle)
        minor = call("nvmlDeviceGetMinorNumber", handle)  # N of /dev/nvidiaN (nvml.h)
        values = {
            "model": None if name is _MISSING else _text(name),
            "uuid": None if uuid is _MISSING else _text(uuid),
            "serial": None if serial is _MISSING else _text(serial),
            "bus_id": None if pci is _MISSING else normalize_bus_id(_text(pci.busId)),
            "firmware_version": None if vbios is _MISSING else _text(vbios),
            "pcie_link_gen_max": None if gen_max is _MISSING else int(gen_max),
            "pcie_link_width_max": None if width_max is _MISSING else int(width_max),
            "device_number": None if minor is _MISSING else int(minor),
        }
        for field_name, value in values.items():
            setattr(rec, field_name, value)
        errors = [dict(e) for e in rec.errors[first_error:]]
        if all(e["error"] == "NotSupported" for e in errors):
            self._identity[rec.index] = (values, errors)  # static for this NVML session

    def _memory(self, handle: Any, reader: _Reader) -> None:
        rec = reader.record
        source = "nvmlDeviceGetMemoryInfo"
        # nvmlMemory_v2 (and the version argument) came with nvidia-ml-py 11.510; an
        # older binding has only v1
        version = getattr(self.nvml, "nvmlMemory_v2", None)
        fell: str | None = None
        if not self._memory_v1 and version is not None:
            try:
                mem = reader.call(source, handle, version=version, fallback=True)
            except _Fallback as exc:
                self._memory_v1 = True
                fell = exc.reason
            else:
                if mem is not _MISSING:
                    rec.memory_total_bytes = int(mem.total)
                    rec.memory_used_bytes = int(mem.used) + int(mem.reserved)
                return
        since = len(rec.errors)
        mem = reader.call(source, handle)
        if fell is not None:
            self._note_fallback(source + "_v2", fell, source, not reader.lacks(source, since))
        if mem is not _MISSING:
            rec.memory_total_bytes = int(mem.total)
            rec.memory_used_bytes = int(mem.used)

    def _temperature(self, handle: Any, reader: _Reader) -> None:
        """``nvmlDeviceGetTemperatureV`` (the versioned call; nvidia-ml-py 13 marks
        ``nvmlDeviceGetTemperature`` "DEPRECATED ... will be removed in CUDA 14.0",
        pynvml.py), else the old call when the binding or the driver lacks the new one."""
        value: Any = _MISSING
        source = "nvmlDeviceGetTemperature"
        sensor = pynvml.NVML_TEMPERATURE_GPU
        fell: str | None = None
        if not self._temperature_v0:
            try:
                value = reader.call("nvmlDeviceGetTemperatureV", handle, sensor, fallback=True)
            except _Fallback as exc:
                self._temperature_v0 = True
                fell = exc.reason
        if self._temperature_v0:
            since = len(reader.record.errors)
            value = reader.call(source, handle, sensor)
            if fell is not None:
                worked = not reader.lacks(source, since)
                self._note_fallback("nvmlDeviceGetTemperatureV", fell, source, worked)
        if value is not _MISSING:
            reader.record.temperature_celsius = float(value)

    def _clock_reasons(self, handle: Any, reader: _Reader) -> None:
        value: Any = _MISSING
        fell: str | None = None
        old = "nvmlDeviceGetCurrentClocksThrottleReasons"
        if not self._throttle_reasons:
            try:
                value = reader.call("nvmlDeviceGetCurrentClocksEventReasons", handle, fallback=True)
            except _Fallback as exc:
                self._throttle_reasons = True
                fell = exc.reason
        if self._throttle_reasons:
            since = len(reader.record.errors)
            value = reader.call(old, handle)
            if fell is not None:
                worked = not reader.lacks(old, since)
                self._note_fallback("nvmlDeviceGetCurrentClocksEventReasons", fell, old, worked)
        if value is not _MISSING:
            reader.record.counters["clocks_event_reasons"] = int(value)

    def _recovery_action(self, handle: Any, reader: _Reader) -> None:
        """``counters.gpu_recovery_action``: the action NVML says this GPU needs
        (``nvmlDeviceGetFieldValues`` with ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION``; values
        ``NVML_GPU_RECOVERY_ACTION_*``, judged by the thresholds). Drivers, bindings or
        GPUs without the field (NotSupported, an unknown field id, no
        ``nvmlDeviceGetFieldValues``) leave it absent without an error, and the GPU is not
        asked again in this NVML session."""
        rec = reader.record
        if rec.index in self._no_recovery_action:
            return
        quiet = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument)
        try:
            values = reader.call(
                "nvmlDeviceGetFieldValues",
                handle,
                (FI_DEV_GET_GPU_RECOVERY_ACTION,),
                source=RECOVERY_ACTION_SOURCE,
                fallback=True,
                quiet=quiet,
            )
        except (_Fallback, *quiet):
            self._no_recovery_action.add(rec.index)
            return
        if values is _MISSING:
            return
        field = values[0]
        ret = int(field.nvmlReturn)
        if ret in (pynvml.NVML_ERROR_NOT_SUPPORTED, pynvml.NVML_ERROR_INVALID_ARGUMENT):
            self._no_recovery_action.add(rec.index)  # a driver that predates the field
            return
        if ret != pynvml.NVML_SUCCESS:
            reader.fail(RECOVERY_ACTION_SOURCE, pynvml.NVMLError(ret))
            return
        member = _FIELD_VALUE_MEMBER.get(int(field.valueType), "uiVal")
        rec.counters["gpu_recovery_action"] = int(getattr(field.value, member))

    def _fabric(self, handle: Any, reader: _Reader) -> None:
        """``fabric``: the GPU's registration with the NVLink fabric, read every patrol
        (it moves from Not Started through In Progress to Completed after a boot) with
        ``nvmlDeviceGetGpuFabricInfoV`` (struct v3, else v2 on a driver answering
        ``ArgumentVersionMismatch``), else the deprecated ``nvmlDeviceGetGpuFabricInfo``;
        the call that works is kept for the NVML session and each fallback logged once.
        A GPU answering NotSupported (PCIe boards) is not asked again in this session and
        has no ``fabric``; with no call left (a driver before fabric info) there is none
        either. See :func:`fabric_from_info` for the values."""
        rec = reader.record
        if rec.index in self._no_fabric:
            return
        quiet = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_ArgumentVersionMismatch)
        fell: list[tuple[str, str, str]] = []  # said once the call that works is known
        try:
            self._fabric_chain(handle, reader, quiet, fell)
        finally:
            worked = self._fabric_call < len(_FABRIC_CALLS)
            for key, reason, used in fell:
                self._note_fallback(key, reason, used, worked)

    def _fabric_chain(
        self, handle: Any, reader: _Reader, quiet: tuple, fell: list[tuple[str, str, str]]
    ) -> None:
        """:meth:`_fabric`'s calls, newest first; each one missing goes into ``fell``."""
        rec = reader.record
        while self._fabric_call < len(_FABRIC_CALLS):
            version, fname, struct_name = _FABRIC_CALLS[self._fabric_call]
            struct = getattr(pynvml, struct_name, None)
            info = struct() if struct is not None else None
            try:
                if info is None:
                    raise _Fallback(f"{struct_name} is not in this nvidia-ml-py")
                got = reader.call(
                    fname, handle, ctypes.byref(info), source=FABRIC_SOURCE,
                    fallback=True, quiet=quiet,
                )  # fmt: skip
            except (_Fallback, pynvml.NVMLError_ArgumentVersionMismatch) as exc:
                self._fabric_call += 1
                reason = exc.reason if isinstance(exc, _Fallback) else _error_name(exc)
                left = self._fabric_call < len(_FABRIC_CALLS)
                used = _FABRIC_CALLS[self._fabric_call][1] if left else "none"
                fell.append((f"{fname} {version}", reason, used))
                continue
            except pynvml.NVMLError_NotSupported:
                self._no_fabric.add(rec.index)
                return
            if got is not _MISSING:
                rec.fabric = fabric_from_info(info, version, reader)
            return

    def _nvlink(self, handle: Any, reader: _Reader) -> None:
        """NVLink state and DL error counters of every link, at most every
        ``nvlink_interval_seconds`` (up to 18 links x 5 calls); the last read is attached
        to the record in between. A GPU whose link 0 answers NotSupported has no NVLink
        (PCIe cards): it is not asked again in this NVML session and gets no links."""
        rec = reader.record
        if not self._nvlink_on or rec.index in self._no_nvlink:
            return
        now = time.monotonic()
        cached = self._nvlink_cache.get(rec.index)
        if cached is not None and now - cached[0] < self._nvlink_interval:
            rec.links = [dict(link) for link in cached[1]]
            return
        quiet = (pynvml.NVMLError_NotSupported, pynvml.NVMLError_InvalidArgument)
        stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        links: list[dict[str, Any]] = []
        for link in range(pynvml.NVML_NVLINK_MAX_LINKS):
            try:
                state = reader.call("nvmlDeviceGetNvLinkState", handle, link, quiet=quiet)
            except quiet:
                break  # past the last link (or no NVLink at all)
            entry: dict[str, Any] = {
                "kind": "nvlink",
                "link": link,
                "state": None
                if state is _MISSING
                else ("up" if int(state) == pynvml.NVML_FEATURE_ENABLED else "down"),
                "ts": stamp,
            }
            counters: dict[str, int] = {}
            for name, counter in _NVLINK_COUNTERS:
                value = reader.call("nvmlDeviceGetNvLinkErrorCounter", handle, link, counter)
                if value is not _MISSING:
                    counters[name] = int(value)
            entry["counters"] = counters
            links.append(entry)
        if not links:
            self._no_nvlink.add(rec.index)
            return
        self._nvlink_cache[rec.index] = (now, links)
        rec.links = [dict(link) for link in links]

    def _memory_errors(self, handle: Any, reader: _Reader) -> None:
        rec = reader.record
        call = reader.call
        mode = call("nvmlDeviceGetEccMode", handle)
        if mode is _MISSING:
            return
        if int(mode[0]) != pynvml.NVML_FEATURE_ENABLED:
            reader.error("nvmlDeviceGetEccMode", "EccDisabled")
            return
        src = "nvmlDeviceGetTotalEccErrors"
        corrected = pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        uncorrected = pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        for attr, etype, ctype in (
            ("ecc_corrected_total", corrected, pynvml.NVML_VOLATILE_ECC),
            ("ecc_uncorrected_total", uncorrected, pynvml.NVML_VOLATILE_ECC),
            ("ecc_corrected_aggregate", corrected, pynvml.NVML_AGGREGATE_ECC),
            ("ecc_uncorrected_aggregate", uncorrected, pynvml.NVML_AGGREGATE_ECC),
        ):
            value = call(src, handle, etype, ctype)
            if value is _MISSING:
                continue
            if attr.endswith("_total"):
                setattr(rec, attr, int(value))
            else:
                rec.counters[attr] = int(value)
        fell: str | None = None
        if not self._no_remap_fn:
            try:
                rows = call("nvmlDeviceGetRemappedRows", handle, fallback=True)
            except _Fallback as exc:
                self._no_remap_fn = True
                fell = exc.reason
            else:
                if rows is not _MISSING:
                    corr, unc, pending, failure = rows
                    rec.remapped_rows_pending = bool(pending)
                    rec.remapped_rows_failure = bool(failure)
                    rec.counters["remapped_rows_correctable"] = int(corr)
                    rec.counters["remapped_rows_uncorrectable"] = int(unc)
                    return  # row remapping replaces page retirement: no retired pages
        since = len(rec.errors)
        pending = call("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        if fell is not None:
            old = "nvmlDeviceGetRetiredPagesPendingStatus"
            worked = not reader.lacks(old, since)
            self._note_fallback("nvmlDeviceGetRemappedRows", fell, old, worked)
        if pending is not _MISSING:
            rec.retired_pages_pending = int(pending) == pynvml.NVML_FEATURE_ENABLED

    def _processes(self, handle: Any, reader: _Reader, namer: Callable[[int], str | None]) -> None:
        """``nvmlDeviceGetComputeRunningProcesses`` (nvidia-ml-py calls the ``_v3`` symbol
        and raises ``NVMLLibraryMismatchError`` on drivers before R510, which lack it),
        else ``nvmlDeviceGetComputeRunningProcesses_v2``; the fallback is logged once per
        NVML session, and when neither can be read the error entry says why."""
        rec = reader.record
        source = "nvmlDeviceGetComputeRunningProcesses"
        procs: Any = _MISSING
        if not self._processes_v2:
            try:
                procs = reader.call(source, handle, fallback=True)
            except _Fallback as exc:
                self._processes_v2 = True
                self._processes_reason = exc.reason
        if self._processes_v2:
            reason = self._processes_reason
            try:
                procs = reader.call(source + "_v2", handle, source=source, fallback=True)
            except _Fallback as exc:
                self._note_fallback(source, reason, source + "_v2", worked=False)
                reader.error(source, f"{reason}; {exc.reason}: processes cannot be read")
            else:
                self._note_fallback(source, reason, source + "_v2")
        self._proc_instances = []
        if procs is _MISSING:
            return
        for proc in procs:
            pid = int(proc.pid)
            used = getattr(proc, "usedGpuMemory", None)
            self._proc_instances.append(
                (getattr(proc, "gpuInstanceId", None), getattr(proc, "computeInstanceId", None))
            )
            rec.processes.append(
                ProcessInfo(
                    pid=pid, name=namer(pid), memory_bytes=None if used is None else int(used)
                )
            )

    def _read_state(self, handle: Any, reader: _Reader, namer: Callable[[int], str | None]) -> None:
        rec = reader.record
        call = reader.call
        self._memory(handle, reader)
        util = call("nvmlDeviceGetUtilizationRates", handle)
        if util is not _MISSING:
            rec.utilization_ratio = int(util.gpu) / 100.0
            if getattr(util, "memory", None) is not None:
                # the share of the sample period device memory was read or written
                rec.counters["memory_activity_percent"] = int(util.memory)
        self._temperature(handle, reader)
        power = call("nvmlDeviceGetPowerUsage", handle)
        if power is not _MISSING:
            rec.power_watts = int(power) / 1000.0
        # the limit the power management algorithm enforces (the minimum of all limiters:
        # nvidia-smi's enforced.power.limit / gpu.power.current_limit), not the software
        # limit nvmlDeviceGetPowerManagementLimit gives (power.limit / requested_limit)
        limit = call("nvmlDeviceGetEnforcedPowerLimit", handle)
        if limit is not _MISSING:
            rec.power_limit_watts = int(limit) / 1000.0
        clock = call("nvmlDeviceGetClockInfo", handle, pynvml.NVML_CLOCK_SM)
        if clock is not _MISSING:
            rec.clock_sm_hertz = float(clock) * 1e6
        self._clock_reasons(handle, reader)
        self._memory_errors(handle, reader)
        self._recovery_action(handle, reader)
        self._fabric(handle, reader)
        self._nvlink(handle, reader)
        gen = call("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        if gen is not _MISSING:
            rec.pcie_link_gen = int(gen)
        width = call("nvmlDeviceGetCurrPcieLinkWidth", handle)
        if width is not _MISSING:
            rec.pcie_link_width = int(width)
        self._processes(handle, reader, namer)
        self._mig(handle, reader)

    # -- MIG -----------------------------------------------------------------------

    def _mig(self, handle: Any, reader: _Reader) -> None:
        """The MIG devices of a GPU in MIG mode, one :class:`PartitionInfo` each.

        ``nvmlDeviceGetMigMode`` current mode enabled (NotSupported: not MIG-capable,
        no error entry), then ``nvmlDeviceGetMaxMigDeviceCount`` and
        ``nvmlDeviceGetMigDeviceHandleByIndex(h, i)`` for each index (NotFound: no MIG
        device there); per MIG device ``nvmlDeviceGetUUID``, ``nvmlDeviceGetName``
        (``... MIG 1g.20gb``: the profile), ``nvmlDeviceGetGpuInstanceId``,
        ``nvmlDeviceGetComputeInstanceId``, ``nvmlDeviceGetAttributes``
        (``gpuInstanceSliceCount``), ``nvmlDeviceGetMemoryInfo``; the order and the calls
        are those of Slurm's AutoDetect (``_handle_mig()``, src/plugins/gpu/nvml/
        gpu_nvml.c, SchedMD/slurm). The device files are the GPU instance's and the
        compute instance's ``/dev/nvidia-caps/nvidia-cap<N>``, N from
        ``/proc/driver/nvidia-caps/mig-minors`` (``gpu<minor>/gi<G>/access`` and
        ``gpu<minor>/gi<G>/ci<C>/access``, keyed by the GPU's minor number, as Slurm's
        ``_nvml_get_mig_minor_numbers()`` and nvidia-container-toolkit read it). A
        process is mapped to the MIG device of its GPU/compute instance ids.
        """
        rec = reader.record
        fn = getattr(self.nvml, "nvmlDeviceGetMigMode", None)
        if fn is None:
            return
        try:
            current, pending = (int(v) for v in fn(handle)[:2])
        except pynvml.NVMLError_NotSupported:
            return  # not a MIG-capable GPU: nothing to say
        except Exception as exc:  # noqa: BLE001 - one error entry, the card goes on
            reader.fail("nvmlDeviceGetMigMode", exc)
            return
        rec.counters["mig_mode"] = current
        rec.counters["mig_mode_pending"] = pending
        if pending != current:
            # "current_mode will be changed to match pending_mode on the next activation
            # trigger (device unbind, device reset, or machine reboot)" (nvml.h, quoted
            # in Slurm's gpu_nvml.c _nvml_is_device_mig)
            word = "enabled" if pending == pynvml.NVML_DEVICE_MIG_ENABLE else "disabled"
            rec.findings.append(
                Finding(
                    "mig_layout",
                    SEVERITY_INFO,
                    f"MIG mode will be {word} at the next GPU reset (pending mode differs "
                    "from the current one)",
                    value=pending,
                    threshold=current,
                )
            )
        if current != pynvml.NVML_DEVICE_MIG_ENABLE:
            return
        count = reader.call("nvmlDeviceGetMaxMigDeviceCount", handle)
        if count is _MISSING:
            return
        minors, minors_error = self._mig_minors()
        for i in range(int(count)):
            try:
                mig = self.nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
            except pynvml.NVMLError_NotFound:
                continue  # no MIG device at this index
            except Exception as exc:  # noqa: BLE001
                reader.fail("nvmlDeviceGetMigDeviceHandleByIndex", exc)
                continue
            rec.partitions.append(self._mig_device(mig, i, rec, minors, minors_error))
        if not rec.partitions:
            rec.findings.append(
                Finding(
                    "mig_layout",
                    HEALTH_WARNING,
                    "MIG mode is enabled but the GPU has no MIG device: no job can use it, "
                    "and slurmd with AutoDetect=nvml does not start ('MIG mode is "
                    "enabled, but no MIG devices were found', gpu_nvml.c); create the "
                    "GPU and compute instances or disable MIG",
                    value=0,
                )
            )
        by_instance = {
            (p.gpu_instance_id, p.compute_instance_id): p.index
            for p in rec.partitions
            if p.gpu_instance_id is not None
        }
        for proc, ids in zip(rec.processes, self._proc_instances, strict=False):
            proc.partition = by_instance.get(ids)

    def _mig_device(
        self,
        mig: Any,
        index: int,
        rec: CardRecord,
        minors: dict[str, int],
        minors_error: str | None,
    ) -> PartitionInfo:
        part = PartitionInfo("mig", index)

        def call(name: str, *args: Any) -> Any:
            fn = getattr(self.nvml, name, None)
            if fn is None:
                part.errors.append({"source": name, "error": NOT_IN_BINDING})
                return _MISSING
            try:
                return fn(mig, *args)
            except Exception as exc:  # noqa: BLE001 - the partition keeps the reason
                part.errors.append({"source": name, "error": _error_name(exc)})
                return _MISSING

        uuid = call("nvmlDeviceGetUUID")
        part.uuid = None if uuid is _MISSING else _text(uuid)
        name = call("nvmlDeviceGetName")
        gi = call("nvmlDeviceGetGpuInstanceId")
        ci = call("nvmlDeviceGetComputeInstanceId")
        part.gpu_instance_id = None if gi is _MISSING else int(gi)
        part.compute_instance_id = None if ci is _MISSING else int(ci)
        attrs = call("nvmlDeviceGetAttributes")
        if attrs is not _MISSING:
            part.slices = int(attrs.gpuInstanceSliceCount)
            part.memory_size_mib = int(attrs.memorySizeMB)
        if name is not _MISSING:
            # NVML names a MIG device "<GPU name> MIG <profile>"
            m = _MIG_NAME_RE.search(_text(name))
            part.profile = m.group(1) if m else None
        mem = call("nvmlDeviceGetMemoryInfo")
        if mem is not _MISSING:
            part.memory_total_bytes = int(mem.total)
            part.memory_used_bytes = int(mem.used)
        if rec.device_number is None or gi is _MISSING or ci is _MISSING:
            return part
        if minors_error is not None:
            part.errors.append({"source": "mig-minors", "error": minors_error})
            return part
        keys = (
            f"gpu{rec.device_number}/gi{int(gi)}/access",
            f"gpu{rec.device_number}/gi{int(gi)}/ci{int(ci)}/access",
        )
        missing = [k for k in keys if k not in minors]
        if missing:
            part.errors.append(
                {"source": "mig-minors", "error": f"no line for {', '.join(missing)}"}
            )
            return part
        part.device_files = [f"/dev/nvidia-caps/nvidia-cap{minors[k]}" for k in keys]
        return part

    def _mig_minors(self) -> tuple[dict[str, int], str | None]:
        """``/proc/driver/nvidia-caps/mig-minors`` (a replay: under its ``root/``) as
        ``{capability name: minor}`` (lines ``gpu0/gi1/ci0/access 6``), or an error."""
        base = Path("/") if self.replay_dir is None else self.replay_dir / "root"
        path = base / MIG_MINORS.lstrip("/")
        try:
            with path.open("rb") as fh:
                data = fh.read(_MIG_MINORS_LIMIT + 1)
        except OSError as exc:  # named as the driver names it (a replay: under root/)
            return {}, f"{MIG_MINORS}: {exc.strerror or exc}"
        if len(data) > _MIG_MINORS_LIMIT:
            return {}, f"{MIG_MINORS}: larger than {_MIG_MINORS_LIMIT} bytes: not read"
        out: dict[str, int] = {}
        for line in data.decode("ascii", errors="replace").splitlines():
            parts = line.split()
            if len(parts) == 2 and parts[1].isascii() and parts[1].isdigit():
                out[parts[0]] = int(parts[1])
        return out, None
