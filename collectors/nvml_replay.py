"""A fake ``pynvml`` module that answers NVML calls from an ``nvidia-smi -q -x`` dump.

This is the ``--replay`` boundary of the NVIDIA collector: the collector code that runs
in production talks to :class:`ReplayNvml` exactly as it talks to the real ``pynvml``
(same function names, arguments and return shapes), so the code under test is the
production code.

Where the dump says ``N/A``, ``[N/A]``, ``Not Supported`` or the element is missing,
the call raises the REAL ``pynvml.NVMLError_NotSupported``. Error texts that nvidia-smi
prints in place of a value raise the class that fits: ``[Unknown Error]``/``ERR!`` ->
``NVMLError_Unknown``, ``[GPU is lost]`` -> ``NVMLError_GpuIsLost``, ``[GPU requires
reset]`` -> ``NVMLError_ResetRequired``, ``[Insufficient Permissions]`` ->
``NVMLError_NoPermission``. A value that is present but cannot be parsed raises
:class:`ReplayFormatError` (a ``ValueError``): the replay never invents a number.

Two calls answer ``NVMLError_FunctionNotFound`` when the dump comes from a driver that
predates them, so the collector's fallbacks run on real recordings:

- ``nvmlDeviceGetMemoryInfo(h, version=nvmlMemory_v2)`` when ``fb_memory_usage`` has no
  ``reserved`` element (drivers before the v2 memory API);
- ``nvmlDeviceGetCurrentClocksEventReasons`` when the dump still says
  ``clocks_throttle_reasons`` (the element was renamed ``clocks_event_reasons`` with the
  v12/v13 DTDs, driver 535).

Device count is the number of ``<gpu>`` elements: a dump can say ``attached_gpus`` 4
and hold one ``<gpu>`` (the published A100 v12 MIG dump does); the replay cannot answer
for GPUs that were not recorded, and does not invent them.

Faults (the ``nvml:`` section of a replay scenario, see :func:`load_replay_nvml`)::

    init_error: DriverNotLoaded | LibRmVersionMismatch | LibraryNotFound | <any NVMLError_ suffix>
    errors: {nvmlSystemGetDriverVersion: Unknown}      # node-level calls
    gpus:
      3: {lost: true}                   # nvmlDeviceGetHandleByIndex(3) raises GpuIsLost
      4: {lost: true, handle_ok: true}  # handle returned, every call on it raises GpuIsLost
      5: {reset_required: true}         # handle returned, every call raises ResetRequired
      1: {remapped_rows: {correctable: 0, uncorrectable: 2, pending: true, failure: false}}
      2: {retired_pages_pending: true}
      6: {errors: {nvmlDeviceGetPowerUsage: NotSupported}}
      7: {xml_overrides: {"temperature/gpu_temp": "95 C", "utilization/gpu_util": null}}
      0: {hang_seconds: 2.5}            # every call on this GPU sleeps first (a dying GPU)
      2: {nvlink: {links: 18, down: [7], errors: {7: {crc_flit: 240}}}}
      1: {nvlink: {links: 18, down: [0, 1], down_patrols: 3}}  # links 0 and 1 down in the
                                        # first 3 reads of the GPU's links, then up (links
                                        # training late after a boot)
      3: {recovery_action: reset}       # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (none, reset,
                                        # reboot, drain_p2p, drain_and_reset... or a number)
      0: {mig_devices: {0: {uuid: MIG-..., profile: 1g.20gb, slices: 1}}}  # what -q -x
                                        # does not record of a <mig_device> (MIG calls)
      0: {processes: [{pid: 81123, gpu_instance_id: 4, compute_instance_id: 0,
                       process_name: python3, used_memory: 10 MiB}]}  # <process_info>
    nvlink: {links: 18}                 # every GPU: 18 NVLink links up (else NotSupported)
    binding_lacks: [nvmlDeviceGetTemperature]  # an nvidia-ml-py without these functions
    driver_lacks: [nvmlDeviceGetComputeRunningProcesses_v3]  # a driver without the symbols:
                                        # FunctionNotFound (NVMLLibraryMismatchError for
                                        # the unversioned processes call, as pynvml raises)

Each call reads its own element: ``nvmlDeviceGetEnforcedPowerLimit`` the current
(enforced) limit, ``nvmlDeviceGetPowerManagementLimit`` the requested (software) limit,
``nvmlDeviceGetEccMode`` current and pending ECC mode apart, so ``xml_overrides`` can give
them distinct values. The recovery action comes from ``<gpu_recovery_action>`` (v13 dumps
say ``None``) unless the scenario's ``recovery_action`` says otherwise; a dump without it
answers that field NotSupported.

A lost GPU fails at ``nvmlDeviceGetHandleByIndex`` by default because that is what real
NVML does: ``nvmlDeviceGetHandleByIndex_v2`` documents ``NVML_ERROR_GPU_IS_LOST``, and
nvidia-smi on such a node prints ``Unable to determine the device handle for GPU...: GPU
is lost`` (see the vendor sample). ``nvmlDeviceGetCount`` still counts it.
``handle_ok: true`` models a GPU that falls off the bus after its handle was obtained.
"""

from __future__ import annotations

import copy
import io
import re
import time
import uuid as uuid_lib
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pynvml

__all__ = [
    "ReplayFormatError",
    "ReplayMigHandle",
    "ReplayNvml",
    "load_replay_nvml",
    "nvml_error_class",
    "parse_replay_nvml",
]

#: How much of an unreadable dump is kept for the collector's ``raw``.
RAW_LIMIT = 64 * 1024
#: A real dump nests 5 elements deep; far deeper is refused while parsing.
MAX_XML_DEPTH = 64

_MIB = 1024 * 1024
_NA_UINT = 0xFFFFFFFF  # what NVML puts in gpuInstanceId/computeInstanceId without MIG


class ReplayFormatError(ValueError):
    """The dump (or the fault section) cannot be used; ``raw`` keeps the dump's text."""

    def __init__(self, message: str, raw: str | None = None):
        super().__init__(message)
        self.raw = raw


def _error_classes() -> dict[str, type[pynvml.NVMLError]]:
    out: dict[str, type[pynvml.NVMLError]] = {}
    for name in dir(pynvml):
        if name.startswith("NVMLError_"):
            cls = getattr(pynvml, name)
            if isinstance(cls, type) and issubclass(cls, pynvml.NVMLError):
                out[name[len("NVMLError_") :].lower()] = cls
    return out


_ERROR_CLASSES = _error_classes()


def nvml_error_class(name: str) -> type[pynvml.NVMLError]:
    """The real ``pynvml.NVMLError_*`` class for a short name (``NotSupported``,
    ``GpuIsLost``, ``NVMLError_Unknown``...), case-insensitive. ``ValueError`` if unknown."""
    key = str(name).strip()
    if key.startswith("NVMLError_"):
        key = key[len("NVMLError_") :]
    cls = _ERROR_CLASSES.get(key.lower())
    if cls is None:
        raise ValueError(f"unknown NVML error name {name!r}")
    return cls


#: nvidia-smi's printed status texts in place of a value, and the NVML error behind them.
_STATUS_TEXT = {
    "": pynvml.NVMLError_NotSupported,
    "n/a": pynvml.NVMLError_NotSupported,
    "[n/a]": pynvml.NVMLError_NotSupported,
    "not supported": pynvml.NVMLError_NotSupported,
    "[not supported]": pynvml.NVMLError_NotSupported,
    "requested functionality has been deprecated": pynvml.NVMLError_NotSupported,
    "unknown error": pynvml.NVMLError_Unknown,
    "[unknown error]": pynvml.NVMLError_Unknown,
    "err!": pynvml.NVMLError_Unknown,
    "[gpu is lost]": pynvml.NVMLError_GpuIsLost,
    "gpu is lost": pynvml.NVMLError_GpuIsLost,
    "[gpu requires reset]": pynvml.NVMLError_ResetRequired,
    "[gpu requires restart]": pynvml.NVMLError_ResetRequired,
    "[insufficient permissions]": pynvml.NVMLError_NoPermission,
}

# "(?a)": ASCII digits only; "٩٩ C" is garbage, not 99 (float() would read it).
_NUM_RE = re.compile(r"(?a)^(-?\d+(?:\.\d+)?)\s*([A-Za-z%/]*)$")

#: Suffix of the ``clocks_event_reason_*`` / ``clocks_throttle_reason_*`` elements -> bit.
_REASON_BITS = {
    "gpu_idle": pynvml.nvmlClocksEventReasonGpuIdle,
    "applications_clocks_setting": pynvml.nvmlClocksEventReasonApplicationsClocksSetting,
    "sw_power_cap": pynvml.nvmlClocksEventReasonSwPowerCap,
    "hw_slowdown": pynvml.nvmlClocksEventReasonHwSlowdown,
    "sync_boost": pynvml.nvmlClocksEventReasonSyncBoost,
    "sw_thermal_slowdown": pynvml.nvmlClocksEventReasonSwThermalSlowdown,
    "hw_thermal_slowdown": pynvml.nvmlClocksEventReasonHwThermalSlowdown,
    "hw_power_brake_slowdown": pynvml.nvmlClocksEventReasonHwPowerBrakeSlowdown,
    "display_clocks_setting": pynvml.nvmlClocksEventReasonDisplayClockSetting,
}

_CLOCK_TAGS = {
    pynvml.NVML_CLOCK_GRAPHICS: "graphics_clock",
    pynvml.NVML_CLOCK_SM: "sm_clock",
    pynvml.NVML_CLOCK_MEM: "mem_clock",
    pynvml.NVML_CLOCK_VIDEO: "video_clock",
}

_FAULT_KEYS = {
    "lost",
    "handle_ok",
    "reset_required",
    "remapped_rows",
    "retired_pages_pending",
    "errors",
    "xml_overrides",
    "hang_seconds",
    "nvlink",
    "recovery_action",
    "mig_devices",
    "processes",
}

#: ``nvmlDeviceGpuRecoveryAction_t`` (nvml.h; nvidia-ml-py pynvml.py
#: ``NVML_GPU_RECOVERY_ACTION_NONE = 0`` ... ``_SYSTEM_REBOOT = 7``; NVIDIA, "Error
#: Recovery and Response Flags", https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/
#: error-recovery-and-response-flags.html) by the name a scenario or a dump's
#: ``<gpu_recovery_action>`` (v13 DTD: ``None``) gives it, lower case, ``_`` for spaces.
RECOVERY_ACTIONS = {
    "none": 0,
    "reset": 1,
    "gpu_reset": 1,
    "reboot": 2,
    "node_reboot": 2,
    "drain_p2p": 3,
    "drain_and_reset": 4,
    "recover_imex_domain": 5,
    "bus_reset": 6,
    "system_reboot": 7,
}
_FAULT_ALIAS = {"nvmlDeviceGetTemperatureV": "nvmlDeviceGetTemperature"}
_FI_RECOVERY_ACTION = 230  # NVML_FI_DEV_GET_GPU_RECOVERY_ACTION (nvml.h, pynvml.py)


def _recovery_action(value: Any, where: str) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 0xFFFFFFFF:
        return value
    key = re.sub(r"[\s\-]+", "_", str(value).strip().lower())
    if key not in RECOVERY_ACTIONS:
        raise ReplayFormatError(
            f"{where}: recovery action {value!r} is not one of {sorted(RECOVERY_ACTIONS)}"
        )
    return RECOVERY_ACTIONS[key]


@dataclass
class _GpuFault:
    lost: bool = False
    handle_ok: bool = False
    reset_required: bool = False
    remapped_rows: dict[str, Any] | None = None
    retired_pages_pending: bool | None = None
    errors: dict[str, type[pynvml.NVMLError]] = field(default_factory=dict)
    xml_overrides: dict[str, Any] = field(default_factory=dict)
    hang_seconds: float = 0.0
    nvlink: dict[str, Any] | None = None
    recovery_action: int | None = None
    mig_devices: dict[int, dict[str, Any]] = field(default_factory=dict)


@dataclass(frozen=True)
class ReplayHandle:
    """Device handle of the replay (real NVML gives an opaque ``c_nvmlDevice_t``)."""

    index: int


@dataclass(frozen=True)
class ReplayMigHandle:
    """Handle of one MIG device (``nvmlDeviceGetMigDeviceHandleByIndex``): the parent
    GPU's index and the MIG device index (``<mig_device><index>``)."""

    index: int
    mig: int


def _status(text: str | None) -> type[pynvml.NVMLError] | None:
    if text is None:
        return pynvml.NVMLError_NotSupported
    return _STATUS_TEXT.get(text.strip().lower())


def _bool_feature(text: str) -> int:
    value = text.strip().lower()
    if value in ("yes", "enabled", "active"):
        return 1
    if value in ("no", "disabled", "not active"):
        return 0
    raise ReplayFormatError(f"expected Yes/No/Enabled/Disabled, got {text!r}")


class _Gpu:
    """One ``<gpu>`` element and the helpers that turn its texts into NVML values."""

    def __init__(self, element: ET.Element):
        self.el = element
        # path -> element (or None). ElementPath lookups dominate the replay's cost; the
        # tree is not changed once calls start (xml_overrides are applied when the
        # ReplayNvml is built, before any call), so each path is looked up once.
        self._found: dict[str, ET.Element | None] = {}

    def find(self, *paths: str) -> ET.Element | None:
        found = self._found
        for path in paths:
            try:
                node = found[path]
            except KeyError:
                node = found[path] = self.el.find(path)
            if node is not None:
                return node
        return None

    def text(self, *paths: str) -> str:
        """Text of the first existing path; raises the NVML error the text stands for."""
        node = self.find(*paths)
        if node is None:
            raise pynvml.NVMLError_NotSupported()
        text = (node.text or "").strip()
        cls = _status(text)
        if cls is not None:
            raise cls()
        return text

    def number(self, *paths: str, unit: str | None = None) -> float:
        text = self.text(*paths)
        m = _NUM_RE.match(text)
        if not m or (unit is not None and m.group(2) and m.group(2).lower() != unit.lower()):
            what = unit or "number"
            raise ReplayFormatError(f"cannot read {'/'.join(paths)} = {text!r} as {what}")
        return float(m.group(1))

    def integer(self, *paths: str, unit: str | None = None) -> int:
        return int(round(self.number(*paths, unit=unit)))

    def mib(self, *paths: str) -> int:
        return int(round(self.number(*paths, unit="MiB") * _MIB))

    def milliwatts(self, *paths: str) -> int:
        return int(round(self.number(*paths, unit="W") * 1000))

    def link_width(self, path: str) -> int:
        text = self.text(path)
        m = re.match(r"(?a)^(\d+)x$", text)
        if not m:
            raise ReplayFormatError(f"cannot read {path} = {text!r} as a link width")
        return int(m.group(1))


#: what a scenario may say of a MIG device that ``nvidia-smi -q -x`` does not record
#: (its ``<mig_device>`` has index, GI/CI ids, memory and engine counts, no UUID and no
#: profile): ``uuid`` (``MIG-...``), ``profile`` (``1g.20gb``), ``slices`` (GPU instance
#: slices, ``nvmlDeviceAttributes_t.gpuInstanceSliceCount``)
_MIG_KEYS = frozenset({"uuid", "profile", "slices"})
#: a scenario's ``processes``: the ``<process_info>`` children nvidia-smi -q -x writes
_PROCESS_KEYS = frozenset(
    {"pid", "type", "process_name", "used_memory", "gpu_instance_id", "compute_instance_id"}
)
_PROCESSES_KEY = "\x00processes"


def _add_processes(gpu: ET.Element, procs: Sequence[Mapping[str, Any]]) -> None:
    node = gpu.find("processes")
    if node is None:
        node = ET.SubElement(gpu, "processes")
    for proc in procs:
        info = ET.SubElement(node, "process_info")
        for tag in (
            "gpu_instance_id",
            "compute_instance_id",
            "pid",
            "type",
            "process_name",
            "used_memory",
        ):
            if tag in proc:
                ET.SubElement(info, tag).text = str(proc[tag])
        if "type" not in proc:
            ET.SubElement(info, "type").text = "C"


def _apply_overrides(gpu: ET.Element, overrides: Mapping[str, Any]) -> None:
    """Set (or with ``None`` remove) elements under ``gpu`` by ``a/b/c`` path."""
    for path, value in overrides.items():
        if path == _PROCESSES_KEY:
            _add_processes(gpu, value)
            continue
        parts = [p for p in str(path).split("/") if p]
        if not parts:
            raise ReplayFormatError(f"empty xml_overrides path {path!r}")
        parent = gpu
        for part in parts[:-1]:
            child = parent.find(part)
            if child is None:
                if value is None:
                    break
                child = ET.SubElement(parent, part)
            parent = child
        else:
            node = parent.find(parts[-1])
            if value is None:
                if node is not None:
                    parent.remove(node)
                continue
            if node is None:
                node = ET.SubElement(parent, parts[-1])
            for sub in list(node):
                node.remove(sub)
            node.text = str(value)


def _parse_faults(faults: Mapping[str, Any] | None) -> tuple[Any, dict, dict[int, _GpuFault]]:
    if not faults:
        return None, {}, {}
    if not isinstance(faults, Mapping):
        raise ReplayFormatError(f"nvml faults must be a mapping, got {type(faults).__name__}")
    unknown = set(faults) - {
        "init_error",
        "errors",
        "gpus",
        "nvlink",
        "binding_lacks",
        "driver_lacks",
    }
    if unknown:
        raise ReplayFormatError(f"unknown nvml fault keys: {sorted(unknown)}")
    init_error = faults.get("init_error")
    init_cls = nvml_error_class(init_error) if init_error else None
    sys_errors = {fn: nvml_error_class(err) for fn, err in (faults.get("errors") or {}).items()}
    gpus: dict[int, _GpuFault] = {}
    for key, spec in (faults.get("gpus") or {}).items():
        if isinstance(key, bool) or not isinstance(key, int) or key < 0:
            raise ReplayFormatError(f"nvml fault gpu key {key!r} is not an NVML index (0, 1, ...)")
        index = key
        spec = spec or {}
        if not isinstance(spec, Mapping):
            raise ReplayFormatError(f"gpu {index}: faults must be a mapping")
        for flag in ("lost", "handle_ok", "reset_required"):
            if not isinstance(spec.get(flag, False), bool):
                raise ReplayFormatError(f"gpu {index}: {flag} must be true or false")
        hang = spec.get("hang_seconds", 0.0) or 0.0
        if isinstance(hang, bool) or not isinstance(hang, int | float) or not 0 <= hang <= 3600:
            raise ReplayFormatError(f"gpu {index}: hang_seconds must be 0..3600")
        bad = set(spec) - _FAULT_KEYS
        if bad:
            raise ReplayFormatError(f"unknown fault keys for gpu {index}: {sorted(bad)}")
        rr = spec.get("remapped_rows")
        if rr is not None and not isinstance(rr, Mapping):
            raise ReplayFormatError(f"gpu {index}: remapped_rows must be a mapping")
        overrides = spec.get("xml_overrides") or {}
        if not isinstance(overrides, Mapping):
            raise ReplayFormatError(f"gpu {index}: xml_overrides must be a mapping")
        migs = spec.get("mig_devices") or {}
        if not isinstance(migs, Mapping) or not all(
            isinstance(k, int)
            and not isinstance(k, bool)
            and isinstance(v, Mapping)
            and set(v) <= _MIG_KEYS
            for k, v in migs.items()
        ):
            raise ReplayFormatError(
                f"gpu {index}: mig_devices must map MIG device indices to "
                f"{{{', '.join(sorted(_MIG_KEYS))}}}"
            )
        procs = spec.get("processes") or []
        if not isinstance(procs, list) or not all(
            isinstance(p, Mapping) and set(p) <= _PROCESS_KEYS and "pid" in p for p in procs
        ):
            raise ReplayFormatError(
                f"gpu {index}: processes must list {{{', '.join(sorted(_PROCESS_KEYS))}}} "
                "mappings with a pid"
            )
        if procs:  # added as <process_info> elements, the shape nvidia-smi -q -x writes
            overrides = {**overrides, _PROCESSES_KEY: list(procs)}
        gpus[index] = _GpuFault(
            lost=bool(spec.get("lost", False)),
            handle_ok=bool(spec.get("handle_ok", False)),
            reset_required=bool(spec.get("reset_required", False)),
            remapped_rows=dict(rr) if rr is not None else None,
            retired_pages_pending=spec.get("retired_pages_pending"),
            errors={fn: nvml_error_class(err) for fn, err in (spec.get("errors") or {}).items()},
            xml_overrides=dict(overrides),
            hang_seconds=float(hang),
            nvlink=_parse_nvlink(spec.get("nvlink"), f"gpu {index}: nvlink"),
            recovery_action=None
            if spec.get("recovery_action") is None
            else _recovery_action(spec["recovery_action"], f"gpu {index}"),
            mig_devices={k: dict(v) for k, v in migs.items()},
        )
    return init_cls, sys_errors, gpus


_NVLINK_COUNTERS = {
    pynvml.NVML_NVLINK_ERROR_DL_REPLAY: "replay",
    pynvml.NVML_NVLINK_ERROR_DL_RECOVERY: "recovery",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT: "crc_flit",
    pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA: "crc_data",
}


def _parse_nvlink(spec: Any, where: str) -> dict[str, Any] | None:
    """``{links: N, down: [link...], down_patrols: n, errors: {link: {replay|recovery|
    crc_flit|crc_data: n}}}``."""
    if spec is None:
        return None
    if not isinstance(spec, Mapping) or set(spec) - {"links", "down", "errors", "down_patrols"}:
        raise ReplayFormatError(
            f"{where}: expected {{links, down, down_patrols, errors}}, got {spec!r}"
        )
    try:
        down_patrols = spec.get("down_patrols")
        down_patrols = None if down_patrols is None else int(down_patrols)
        links = int(spec.get("links", 0))
        down = {int(x) for x in spec.get("down") or ()}
        errors = {
            int(k): {str(n): int(v) for n, v in (c or {}).items()}
            for k, c in (spec.get("errors") or {}).items()
        }
    except (TypeError, ValueError, AttributeError) as exc:
        raise ReplayFormatError(f"{where}: {exc}") from None
    bad = {n for c in errors.values() for n in c} - set(_NVLINK_COUNTERS.values())
    if bad or not 0 <= links <= pynvml.NVML_NVLINK_MAX_LINKS:
        raise ReplayFormatError(f"{where}: bad links or counters {sorted(bad) or links}")
    return {"links": links, "down": down, "errors": errors, "down_patrols": down_patrols}


def _absent(name: str) -> property:
    def get(self: Any) -> Any:
        raise AttributeError(f"{name}: not in this nvidia-ml-py (scenario binding_lacks)")

    return property(get)


class ReplayNvml:
    """The replay "module": pynvml's functions answered from one dump plus faults.

    Constants and error classes are the real ones from ``pynvml`` (attribute access
    falls through to ``pynvml`` for anything that is not a function). ``calls`` counts
    every NVML function called, by name, so tests can bound the work of a patrol.
    """

    def __init__(
        self,
        root: ET.Element,
        faults: Mapping[str, Any] | None = None,
        *,
        source: str = "<memory>",
    ):
        init_cls, sys_errors, gpu_faults = _parse_faults(faults)
        self.source = source
        root = copy.deepcopy(root)  # overrides must not touch the caller's tree
        self._root = root
        self._gpus = [_Gpu(el) for el in root.findall("gpu")]
        self._init_error = init_cls
        self._sys_errors = sys_errors
        self._faults = gpu_faults
        self._nvlink_default = _parse_nvlink((faults or {}).get("nvlink"), "nvlink")
        #: reads of link 0's state per GPU index (a patrol reads its links from link 0)
        self._nvlink_reads: dict[int, int] = {}
        self._refcount = 0
        self.calls: dict[str, int] = {}
        lacks = (faults or {}).get("binding_lacks") or []
        if not isinstance(lacks, list) or not all(
            isinstance(n, str) and n.startswith("nvml") and callable(getattr(ReplayNvml, n, None))
            for n in lacks
        ):
            raise ReplayFormatError(
                f"binding_lacks must list NVML functions the replay answers, got {lacks!r}"
            )
        if lacks:  # an nvidia-ml-py without these functions (removed after deprecation)
            self.__class__ = type("ReplayNvml", (ReplayNvml,), {n: _absent(n) for n in lacks})
        driver_lacks = (faults or {}).get("driver_lacks") or []
        if not isinstance(driver_lacks, list) or not all(
            isinstance(n, str) and n.startswith("nvml") for n in driver_lacks
        ):
            raise ReplayFormatError(f"driver_lacks must list NVML symbols, got {driver_lacks!r}")
        self._driver_lacks = frozenset(driver_lacks)
        for index, fault in gpu_faults.items():
            if index >= len(self._gpus):
                raise ReplayFormatError(
                    f"nvml fault for gpu {index} but the dump has {len(self._gpus)} GPU(s)"
                )
            _apply_overrides(self._gpus[index].el, fault.xml_overrides)

    # -- plumbing ----------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Constants (NVML_*, nvmlMemory_v2, nvmlClocksEventReason*) and error classes
        # come from the real module. Functions the replay does not implement do not
        # fall through: calling the real library from a replay would be a bug.
        value = getattr(pynvml, name, None)
        if value is None:
            raise AttributeError(name)
        if isinstance(value, type) and issubclass(value, BaseException):
            return value
        if isinstance(value, (int, float, str, bytes)):
            return value
        raise AttributeError(f"ReplayNvml does not implement {name}")

    def _count(self, fname: str) -> None:
        self.calls[fname] = self.calls.get(fname, 0) + 1

    def _system(self, fname: str) -> None:
        self._count(fname)
        if self._refcount <= 0:
            raise pynvml.NVMLError_Uninitialized()
        cls = self._sys_errors.get(fname)
        if cls is not None:
            raise cls()

    def _device(self, fname: str, handle: Any) -> _Gpu:
        self._system(fname)
        if fname in self._driver_lacks:  # the driver's library has no such symbol
            raise pynvml.NVMLError_FunctionNotFound()
        if not isinstance(handle, ReplayHandle) or not 0 <= handle.index < len(self._gpus):
            raise pynvml.NVMLError_InvalidArgument()
        fault = self._faults.get(handle.index)
        if fault is not None:
            if fault.hang_seconds > 0:
                time.sleep(fault.hang_seconds)
            if fault.lost:
                raise pynvml.NVMLError_GpuIsLost()
            if fault.reset_required:
                raise pynvml.NVMLError_ResetRequired()
            # a fault on nvmlDeviceGetMemoryInfo applies to its _v2 form too (and one on
            # nvmlDeviceGetTemperature to nvmlDeviceGetTemperatureV)
            cls = fault.errors.get(fname) or fault.errors.get(
                _FAULT_ALIAS.get(fname, fname.removesuffix("_v2"))
            )
            if cls is not None:
                raise cls()
        return self._gpus[handle.index]

    # -- library -----------------------------------------------------------------

    def nvmlInit(self) -> None:
        self._count("nvmlInit")
        if self._init_error is not None:
            raise self._init_error()
        self._refcount += 1

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.nvmlInit()

    def nvmlShutdown(self) -> None:
        self._count("nvmlShutdown")
        if self._refcount <= 0:
            raise pynvml.NVMLError_Uninitialized()
        self._refcount -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._system("nvmlSystemGetDriverVersion")
        node = self._root.find("driver_version")
        text = (node.text or "").strip() if node is not None else None
        cls = _status(text)
        if cls is not None:
            raise cls()
        return text  # type: ignore[return-value]

    def nvmlSystemGetProcessName(self, pid: int) -> str:
        self._system("nvmlSystemGetProcessName")
        for gpu in self._gpus:
            for proc in gpu.el.findall("processes/process_info"):
                if (proc.findtext("pid") or "").strip() == str(pid):
                    name = (proc.findtext("process_name") or "").strip()
                    if name:
                        return name
        raise pynvml.NVMLError_NotFound()

    def nvmlDeviceGetCount(self) -> int:
        self._system("nvmlDeviceGetCount")
        return len(self._gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> ReplayHandle:
        self._system("nvmlDeviceGetHandleByIndex")
        if not isinstance(index, int) or not 0 <= index < len(self._gpus):
            raise pynvml.NVMLError_InvalidArgument()
        fault = self._faults.get(index)
        if fault is not None:
            if fault.hang_seconds > 0:
                time.sleep(fault.hang_seconds)
            if fault.lost and not fault.handle_ok:
                raise pynvml.NVMLError_GpuIsLost()
            cls = fault.errors.get("nvmlDeviceGetHandleByIndex")
            if cls is not None:
                raise cls()
        return ReplayHandle(index)

    # -- identity ----------------------------------------------------------------

    def nvmlDeviceGetName(self, handle: Any) -> str:
        """On a MIG handle: ``<product_name> MIG <profile>`` (how NVML names a MIG
        device: ``nvidia-smi -L`` prints ``MIG 1g.5gb Device 0``), the profile from the
        scenario (NotSupported without one)."""
        if isinstance(handle, ReplayMigHandle):
            gpu, _el, spec = self._mig("nvmlDeviceGetName", handle)
            if not spec.get("profile"):
                raise pynvml.NVMLError_NotSupported()
            return f"{gpu.text('product_name')} MIG {spec['profile']}"
        return self._device("nvmlDeviceGetName", handle).text("product_name")

    def nvmlDeviceGetUUID(self, handle: Any) -> str:
        if isinstance(handle, ReplayMigHandle):
            _gpu, _el, spec = self._mig("nvmlDeviceGetUUID", handle)
            if not spec.get("uuid"):
                raise pynvml.NVMLError_NotSupported()
            return str(spec["uuid"])
        return self._device("nvmlDeviceGetUUID", handle).text("uuid")

    def nvmlDeviceGetSerial(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetSerial", handle).text("serial")

    def nvmlDeviceGetVbiosVersion(self, handle: Any) -> str:
        return self._device("nvmlDeviceGetVbiosVersion", handle).text("vbios_version")

    def nvmlDeviceGetMinorNumber(self, handle: Any) -> int:
        return self._device("nvmlDeviceGetMinorNumber", handle).integer("minor_number")

    def nvmlDeviceGetPciInfo(self, handle: Any) -> SimpleNamespace:
        """``busId`` from ``pci/pci_bus_id``, else the ``<gpu id=...>`` attribute (which
        nvidia-smi sets to the same bus id; the TRIMMED dump has only the attribute)."""
        gpu = self._device("nvmlDeviceGetPciInfo", handle)
        node = gpu.find("pci/pci_bus_id")
        bus_id = (node.text or "").strip() if node is not None else (gpu.el.get("id") or "")
        cls = _status(bus_id)
        if cls is not None:
            raise cls()
        m = re.match(r"^([0-9A-Fa-f]+):([0-9A-Fa-f]{2}):([0-9A-Fa-f]{2})\.([0-7])$", bus_id)
        if not m:
            raise ReplayFormatError(f"cannot read PCI bus id {bus_id!r}")
        domain, bus, dev = int(m.group(1), 16), int(m.group(2), 16), int(m.group(3), 16)

        def _hex(path: str) -> int:
            text = (gpu.el.findtext(path) or "").strip()
            return int(text, 16) if re.fullmatch(r"[0-9A-Fa-f]+", text) else 0

        return SimpleNamespace(
            busId=bus_id,
            busIdLegacy=f"{domain:04X}:{bus:02X}:{dev:02X}.{m.group(4)}",
            domain=domain,
            bus=bus,
            device=dev,
            pciDeviceId=_hex("pci/pci_device_id"),
            pciSubSystemId=_hex("pci/pci_sub_system_id"),
        )

    # -- readings ----------------------------------------------------------------

    def nvmlDeviceGetMemoryInfo(self, handle: Any, version: int | None = None) -> SimpleNamespace:
        """v1 (``version`` unset): ``used`` is reserved + allocated, as NVML documents.
        v2: ``used`` and ``reserved`` apart; FunctionNotFound for a pre-v2 dump."""
        fname = "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo"
        if isinstance(handle, ReplayMigHandle):  # the MIG device's own memory
            gpu = _Gpu(self._mig(fname, handle)[1])
        else:
            gpu = self._device(fname, handle)
        if version:
            if version != pynvml.nvmlMemory_v2:
                raise pynvml.NVMLError_ArgumentVersionMismatch()
            memory = gpu.find("fb_memory_usage")
            if memory is not None and memory.find("reserved") is None:
                raise pynvml.NVMLError_FunctionNotFound()
        total = gpu.mib("fb_memory_usage/total")
        used = gpu.mib("fb_memory_usage/used")
        free = gpu.mib("fb_memory_usage/free")
        try:
            reserved = gpu.mib("fb_memory_usage/reserved")
        except pynvml.NVMLError_NotSupported:
            reserved = 0
        if version:
            return SimpleNamespace(
                version=version, total=total, reserved=reserved, free=free, used=used
            )
        return SimpleNamespace(total=total, free=free, used=used + reserved)

    def nvmlDeviceGetUtilizationRates(self, handle: Any) -> SimpleNamespace:
        gpu = self._device("nvmlDeviceGetUtilizationRates", handle)
        util = gpu.integer("utilization/gpu_util", unit="%")
        try:
            mem: int | None = gpu.integer("utilization/memory_util", unit="%")
        except pynvml.NVMLError_NotSupported:
            mem = None
        return SimpleNamespace(gpu=util, memory=mem)

    def nvmlDeviceGetTemperature(self, handle: Any, sensor: int) -> int:
        gpu = self._device("nvmlDeviceGetTemperature", handle)
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.integer("temperature/gpu_temp", unit="C")

    def nvmlDeviceGetTemperatureV(
        self, handle: Any, sensor: int, version: int | None = None
    ) -> int:
        """The versioned call (``nvmlTemperature_v1``) that replaces the deprecated
        ``nvmlDeviceGetTemperature`` in nvidia-ml-py 13: the same reading."""
        gpu = self._device("nvmlDeviceGetTemperatureV", handle)
        if version not in (None, getattr(pynvml, "nvmlTemperature_v1", None)):
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.integer("temperature/gpu_temp", unit="C")

    def nvmlDeviceGetPowerUsage(self, handle: Any) -> int:
        """mW. v13 dumps split ``power_draw`` into average/instant; NVML's
        ``nvmlDeviceGetPowerUsage`` is the 1 s average on newer GPUs, so that one."""
        gpu = self._device("nvmlDeviceGetPowerUsage", handle)
        return gpu.milliwatts(
            "gpu_power_readings/average_power_draw",
            "gpu_power_readings/power_draw",
            "power_readings/power_draw",
        )

    # nvidia-smi --help-query-gpu (vendor-samples nvidia-smi--help-query-gpu_590.48.01.txt):
    # "enforced.power.limit" or "gpu.power.current_limit" is "the power management
    # algorithm's power ceiling ... the minimum of various power limiters" (NVML's
    # enforced limit); "power.limit" or "gpu.power.requested_limit" is "the software power
    # limit ... set by software like nvidia-smi" (nvmlDeviceGetPowerManagementLimit). The
    # v12+ dumps name them current_power_limit / requested_power_limit, older ones
    # enforced_power_limit / power_limit: each call reads its own element.

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetEnforcedPowerLimit", handle)
        return gpu.milliwatts(
            "gpu_power_readings/current_power_limit",
            "power_readings/enforced_power_limit",
        )

    def nvmlDeviceGetPowerManagementLimit(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetPowerManagementLimit", handle)
        return gpu.milliwatts(
            "gpu_power_readings/requested_power_limit", "power_readings/power_limit"
        )

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetPowerManagementDefaultLimit", handle)
        return gpu.milliwatts(
            "gpu_power_readings/default_power_limit", "power_readings/default_power_limit"
        )

    def nvmlDeviceGetClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._device("nvmlDeviceGetClockInfo", handle)
        tag = _CLOCK_TAGS.get(clock_type)
        if tag is None:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.integer(f"clocks/{tag}", unit="MHz")

    def nvmlDeviceGetMaxClockInfo(self, handle: Any, clock_type: int) -> int:
        gpu = self._device("nvmlDeviceGetMaxClockInfo", handle)
        tag = _CLOCK_TAGS.get(clock_type)
        if tag is None:
            raise pynvml.NVMLError_InvalidArgument()
        return gpu.integer(f"max_clocks/{tag}", unit="MHz")

    def nvmlDeviceGetPerformanceState(self, handle: Any) -> int:
        text = self._device("nvmlDeviceGetPerformanceState", handle).text("performance_state")
        m = re.fullmatch(r"P(\d+)", text)
        if not m:
            raise ReplayFormatError(f"cannot read performance_state {text!r}")
        return int(m.group(1))

    def _reasons(self, gpu: _Gpu, container: ET.Element) -> int:
        mask = 0
        for child in container:
            suffix = re.sub(r"^clocks_(?:event|throttle)_reason_", "", child.tag)
            bit = _REASON_BITS.get(suffix)
            if bit is None:
                continue
            text = (child.text or "").strip()
            if _status(text) is not None:
                continue
            if _bool_feature(text):
                mask |= bit
        return mask

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetCurrentClocksEventReasons", handle)
        node = gpu.find("clocks_event_reasons")
        if node is None:
            if gpu.find("clocks_throttle_reasons") is not None:
                raise pynvml.NVMLError_FunctionNotFound()  # driver before the rename
            raise pynvml.NVMLError_NotSupported()
        return self._reasons(gpu, node)

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetCurrentClocksThrottleReasons", handle)
        node = gpu.find("clocks_throttle_reasons")
        if node is None:
            node = gpu.find("clocks_event_reasons")
        if node is None:
            raise pynvml.NVMLError_NotSupported()
        return self._reasons(gpu, node)

    # -- PCIe --------------------------------------------------------------------

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetCurrPcieLinkGeneration", handle)
        return gpu.integer("pci/pci_gpu_link_info/pcie_gen/current_link_gen")

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetMaxPcieLinkGeneration", handle)
        return gpu.integer("pci/pci_gpu_link_info/pcie_gen/max_link_gen")

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetCurrPcieLinkWidth", handle)
        return gpu.link_width("pci/pci_gpu_link_info/link_widths/current_link_width")

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: Any) -> int:
        gpu = self._device("nvmlDeviceGetMaxPcieLinkWidth", handle)
        return gpu.link_width("pci/pci_gpu_link_info/link_widths/max_link_width")

    # -- memory errors -----------------------------------------------------------

    def nvmlDeviceGetEccMode(self, handle: Any) -> list[int]:
        """``[current, pending]`` from ``ecc_mode/current_ecc`` and ``pending_ecc``, each
        its own element (a mode change waits for the next reboot: they differ then); a
        dump without one of them answers NotSupported, nothing is copied across."""
        gpu = self._device("nvmlDeviceGetEccMode", handle)
        current = _bool_feature(gpu.text("ecc_mode/current_ecc"))
        pending = _bool_feature(gpu.text("ecc_mode/pending_ecc"))
        return [current, pending]

    def nvmlDeviceGetFieldValues(
        self, handle: Any, field_ids: Sequence[Any]
    ) -> list[SimpleNamespace]:
        """Shaped like pynvml's ``c_nvmlFieldValue_t`` array: per field ``fieldId``,
        ``scopeId``, ``nvmlReturn`` (a per-field status: the call itself succeeds),
        ``valueType`` and ``value`` (``uiVal``...). Only
        ``NVML_FI_DEV_GET_GPU_RECOVERY_ACTION`` (230) is answered: from the scenario's
        ``recovery_action``, else the dump's ``<gpu_recovery_action>`` (v13 DTD), else
        ``NVML_ERROR_NOT_SUPPORTED``; every other field is NOT_SUPPORTED."""
        gpu = self._device("nvmlDeviceGetFieldValues", handle)
        fault = self._faults.get(handle.index)
        out = []
        for item in field_ids:
            field_id, scope = item if isinstance(item, tuple) else (item, 0)
            ret, value = pynvml.NVML_ERROR_NOT_SUPPORTED, 0
            if field_id == _FI_RECOVERY_ACTION:
                if fault is not None and fault.recovery_action is not None:
                    ret, value = pynvml.NVML_SUCCESS, fault.recovery_action
                else:
                    try:
                        text = gpu.text("gpu_recovery_action")
                    except pynvml.NVMLError as exc:
                        ret = exc.value
                    else:
                        ret, value = pynvml.NVML_SUCCESS, _recovery_action(text, self.source)
            out.append(
                SimpleNamespace(
                    fieldId=field_id,
                    scopeId=scope,
                    timestamp=0,
                    latencyUsec=0,
                    valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                    nvmlReturn=ret,
                    value=SimpleNamespace(uiVal=value),
                )
            )
        return out

    def nvmlDeviceGetTotalEccErrors(self, handle: Any, error_type: int, counter_type: int) -> int:
        """Sum of the dump's counters of that kind: ``single_bit|double_bit/total``
        (old layout) or SRAM + DRAM (``sram_uncorrectable`` or, from 535 on, its
        ``_parity`` + ``_secded`` halves). All ``N/A`` -> NotSupported."""
        gpu = self._device("nvmlDeviceGetTotalEccErrors", handle)
        section = {pynvml.NVML_VOLATILE_ECC: "volatile", pynvml.NVML_AGGREGATE_ECC: "aggregate"}
        part = section.get(counter_type)
        if part is None or error_type not in (
            pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED,
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
        ):
            raise pynvml.NVMLError_InvalidArgument()
        corrected = error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED
        if gpu.find(f"ecc_errors/{part}/single_bit") is not None:
            paths = [f"ecc_errors/{part}/{'single_bit' if corrected else 'double_bit'}/total"]
        elif corrected:
            paths = [f"ecc_errors/{part}/sram_correctable", f"ecc_errors/{part}/dram_correctable"]
        else:
            paths = [
                f"ecc_errors/{part}/sram_uncorrectable",
                f"ecc_errors/{part}/sram_uncorrectable_parity",
                f"ecc_errors/{part}/sram_uncorrectable_secded",
                f"ecc_errors/{part}/dram_uncorrectable",
            ]
        total: int | None = None
        first_error: type[pynvml.NVMLError] | None = None
        for path in paths:
            if gpu.find(path) is None:
                continue
            try:
                value = gpu.integer(path)
            except pynvml.NVMLError as exc:
                first_error = first_error or type(exc)
                continue
            total = (total or 0) + value
        if total is None:
            raise (first_error or pynvml.NVMLError_NotSupported)()
        return total

    def nvmlDeviceGetRemappedRows(self, handle: Any) -> tuple[int, int, int, int]:
        """``(corrRows, uncRows, isPending, failureOccurred)``."""
        gpu = self._device("nvmlDeviceGetRemappedRows", handle)
        fault = self._faults.get(handle.index)
        if fault is not None and fault.remapped_rows is not None:
            rr = fault.remapped_rows
            return (
                int(rr.get("correctable", 0)),
                int(rr.get("uncorrectable", 0)),
                int(bool(rr.get("pending", False))),
                int(bool(rr.get("failure", False))),
            )
        node = gpu.find("remapped_rows")
        if node is None or len(node) == 0:
            cls = _status(node.text if node is not None else None)
            if cls is None:
                raise ReplayFormatError(f"cannot read remapped_rows {node!r}")
            raise cls()
        return (
            gpu.integer("remapped_rows/remapped_row_corr"),
            gpu.integer("remapped_rows/remapped_row_unc"),
            _bool_feature(gpu.text("remapped_rows/remapped_row_pending")),
            _bool_feature(gpu.text("remapped_rows/remapped_row_failure")),
        )

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: Any) -> int:
        """NVML_FEATURE_ENABLED when ``pending_retirement`` or ``pending_blacklist`` (the
        older name of the same flag) says Yes; NotSupported when both are N/A."""
        gpu = self._device("nvmlDeviceGetRetiredPagesPendingStatus", handle)
        fault = self._faults.get(handle.index)
        if fault is not None and fault.retired_pages_pending is not None:
            return int(bool(fault.retired_pages_pending))
        values = []
        for tag in ("pending_retirement", "pending_blacklist"):
            try:
                values.append(_bool_feature(gpu.text(f"retired_pages/{tag}")))
            except pynvml.NVMLError_NotSupported:
                continue
        if not values:
            raise pynvml.NVMLError_NotSupported()
        return pynvml.NVML_FEATURE_ENABLED if any(values) else pynvml.NVML_FEATURE_DISABLED

    # -- processes ---------------------------------------------------------------

    def _processes(self, fname: str, handle: Any, kind: str) -> list[SimpleNamespace]:
        gpu = self._device(fname, handle)
        node = gpu.find("processes")
        if node is None:
            raise pynvml.NVMLError_NotSupported()
        out = []
        for proc in node.findall("process_info"):
            ptype = (proc.findtext("type") or "").strip().upper()
            if kind not in ptype:
                continue
            pid_text = (proc.findtext("pid") or "").strip()
            if not pid_text.isdigit():
                raise ReplayFormatError(f"cannot read process pid {pid_text!r}")
            mem_text = (proc.findtext("used_memory") or "").strip()
            if _status(mem_text) is not None:
                used: int | None = None  # pynvml maps NVML_VALUE_NOT_AVAILABLE to None
            else:
                m = _NUM_RE.match(mem_text)
                if not m or m.group(2) != "MiB":
                    raise ReplayFormatError(f"cannot read process memory {mem_text!r}")
                used = int(round(float(m.group(1)) * _MIB))

            def _uint(tag: str, p: ET.Element = proc) -> int:
                text = (p.findtext(tag) or "").strip()
                return int(text) if text.isdigit() else _NA_UINT

            out.append(
                SimpleNamespace(
                    pid=int(pid_text),
                    usedGpuMemory=used,
                    gpuInstanceId=_uint("gpu_instance_id"),
                    computeInstanceId=_uint("compute_instance_id"),
                )
            )
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        """Processes whose ``type`` contains ``C`` (``C``, ``C+G``, ``M+C``).

        nvidia-ml-py's unversioned call is ``@throwOnVersionMismatch`` around the ``_v3``
        symbol (pynvml.py): a driver without ``nvmlDeviceGetComputeRunningProcesses_v3``
        (before R510; ``driver_lacks`` in a scenario) raises ``NVMLLibraryMismatchError``,
        which is not an ``NVMLError``."""
        fname = "nvmlDeviceGetComputeRunningProcesses"
        if fname + "_v3" in self._driver_lacks:
            self._system(fname)
            raise pynvml.NVMLLibraryMismatchError(
                f"{fname}_v3 is not in this driver (scenario driver_lacks)"
            )
        return self._processes(fname, handle, "C")

    def nvmlDeviceGetComputeRunningProcesses_v2(self, handle: Any) -> list[SimpleNamespace]:
        """The older versioned call (drivers from R470): the same processes."""
        return self._processes("nvmlDeviceGetComputeRunningProcesses_v2", handle, "C")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: Any) -> list[SimpleNamespace]:
        """Processes whose ``type`` contains ``G``."""
        return self._processes("nvmlDeviceGetGraphicsRunningProcesses", handle, "G")

    # -- NVLink ------------------------------------------------------------------
    # nvidia-smi -q -x has no NVLink section, so the links come from the scenario's
    # ``nvlink`` faults (reference: `nvidia-smi nvlink -s` shows 18 links per H100, 12
    # per A100); without them every GPU answers NotSupported, like a PCIe card.

    def _nvlink(self, fname: str, handle: Any, link: int) -> dict[str, Any]:
        self._device(fname, handle)
        fault = self._faults.get(handle.index)
        spec = (fault.nvlink if fault is not None else None) or self._nvlink_default
        if spec is None or spec["links"] == 0:
            raise pynvml.NVMLError_NotSupported()
        if not isinstance(link, int) or not 0 <= link < pynvml.NVML_NVLINK_MAX_LINKS:
            raise pynvml.NVMLError_InvalidArgument()
        if link >= spec["links"]:
            raise pynvml.NVMLError_NotSupported()
        return spec

    def nvmlDeviceGetNvLinkState(self, handle: Any, link: int) -> int:
        spec = self._nvlink("nvmlDeviceGetNvLinkState", handle, link)
        if link == 0:
            self._nvlink_reads[handle.index] = self._nvlink_reads.get(handle.index, 0) + 1
        trained = (
            spec["down_patrols"] is not None
            and self._nvlink_reads.get(handle.index, 0) > spec["down_patrols"]
        )
        if link in spec["down"] and not trained:
            return pynvml.NVML_FEATURE_DISABLED
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: Any, link: int, counter: int) -> int:
        spec = self._nvlink("nvmlDeviceGetNvLinkErrorCounter", handle, link)
        name = _NVLINK_COUNTERS.get(counter)
        if name is None:
            raise pynvml.NVMLError_InvalidArgument()
        return int(spec["errors"].get(link, {}).get(name, 0))

    # -- MIG ---------------------------------------------------------------------
    # The parent GPU's <mig_devices> gives each MIG device's index, GPU/compute instance
    # ids and memory; the scenario's ``mig_devices`` what the dump does not record
    # (UUID, profile, slices). A call on a MIG handle reads its <mig_device>.

    def _mig(self, fname: str, handle: Any) -> tuple[_Gpu, ET.Element, dict[str, Any]]:
        if not isinstance(handle, ReplayMigHandle):
            raise pynvml.NVMLError_InvalidArgument()
        gpu = self._device(fname, ReplayHandle(handle.index))
        for el in gpu.el.findall("mig_devices/mig_device"):
            if (el.findtext("index") or "").strip() == str(handle.mig):
                fault = self._faults.get(handle.index)
                spec = fault.mig_devices.get(handle.mig, {}) if fault is not None else {}
                return gpu, el, spec
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: Any) -> int:
        """7 on a MIG-capable GPU (the most MIG devices one GPU holds: 7 GPU instances
        on A100/H100, NVIDIA MIG user guide); NotSupported without ``<mig_mode>``."""
        gpu = self._device("nvmlDeviceGetMaxMigDeviceCount", handle)
        gpu.text("mig_mode/current_mig")
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: Any, index: int) -> ReplayMigHandle:
        """NotFound for an index no ``<mig_device>`` has (as NVML answers an index with
        no MIG device behind it)."""
        gpu = self._device("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if _bool_feature(gpu.text("mig_mode/current_mig")) != 1:
            raise pynvml.NVMLError_NotFound()
        for el in gpu.el.findall("mig_devices/mig_device"):
            if (el.findtext("index") or "").strip() == str(index):
                return ReplayMigHandle(handle.index, index)
        raise pynvml.NVMLError_NotFound()

    def nvmlDeviceIsMigDeviceHandle(self, handle: Any) -> int:
        self._system("nvmlDeviceIsMigDeviceHandle")
        return 1 if isinstance(handle, ReplayMigHandle) else 0

    def nvmlDeviceGetGpuInstanceId(self, handle: Any) -> int:
        _gpu, el, _spec = self._mig("nvmlDeviceGetGpuInstanceId", handle)
        return _Gpu(el).integer("gpu_instance_id")

    def nvmlDeviceGetComputeInstanceId(self, handle: Any) -> int:
        _gpu, el, _spec = self._mig("nvmlDeviceGetComputeInstanceId", handle)
        return _Gpu(el).integer("compute_instance_id")

    def nvmlDeviceGetAttributes(self, handle: Any) -> SimpleNamespace:
        """``nvmlDeviceAttributes_t`` of a MIG device: ``multiprocessorCount`` and the
        engine counts from ``device_attributes/shared``, ``memorySizeMB`` from its
        ``fb_memory_usage/total`` (MiB), ``gpuInstanceSliceCount`` from the scenario."""
        _gpu, el, spec = self._mig("nvmlDeviceGetAttributes", handle)
        mig = _Gpu(el)
        slices = spec.get("slices")
        if slices is None:
            raise pynvml.NVMLError_NotSupported()
        return SimpleNamespace(
            multiprocessorCount=mig.integer("device_attributes/shared/multiprocessor_count"),
            sharedCopyEngineCount=mig.integer("device_attributes/shared/copy_engine_count"),
            sharedDecoderCount=mig.integer("device_attributes/shared/decoder_count"),
            sharedEncoderCount=mig.integer("device_attributes/shared/encoder_count"),
            gpuInstanceSliceCount=int(slices),
            memorySizeMB=mig.integer("fb_memory_usage/total", unit="MiB"),
        )

    def _fabric(self, fname: str, handle: Any, info: Any, version: str) -> int:
        """Fill a ``c_nvmlGpuFabricInfo*`` struct (passed as pynvml's callers pass it,
        ``byref(struct)``, or the struct itself) from ``<fabric>``. No ``<fabric>``, or a
        state of ``N/A`` (the PCIe boards' dumps): NotSupported. A dump whose ``<fabric>``
        has no ``<cliqueId>`` (drivers before R550 print State and Status only) comes
        from a driver without ``nvmlDeviceGetGpuFabricInfoV``: FunctionNotFound; one
        without ``<health><summary>`` answers the v3 struct with
        ``ArgumentVersionMismatch``. Values a dump prints as ``N/A`` stay 0 (NVML leaves
        them unset until the state is Completed)."""
        gpu = self._device(fname, handle)
        node = gpu.find("fabric")
        if node is None:
            raise pynvml.NVMLError_NotSupported()
        if version != "v1" and node.find("cliqueId") is None:
            raise pynvml.NVMLError_FunctionNotFound()
        if version == "v3" and node.find("health/summary") is None:
            raise pynvml.NVMLError_ArgumentVersionMismatch()
        # "Not Supported" is a state NVML answers (NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
        # as gpud prints it for a GB200); N/A or no state: NotSupported
        state = (node.findtext("state") or "").strip()
        if state.lower() != "not supported":
            state = gpu.text("fabric/state")
        if state.lower() not in _FABRIC_STATE:
            raise ReplayFormatError(f"{self.source}: fabric state {state!r} is no NVML state")
        obj = getattr(info, "_obj", info)
        obj.state = _FABRIC_STATE[state.lower()]
        try:
            obj.status = _fabric_status(gpu.text("fabric/status"), self.source)
        except pynvml.NVMLError_NotSupported:
            obj.status = pynvml.NVML_SUCCESS
        try:
            obj.cliqueId = gpu.integer("fabric/cliqueId")
        except pynvml.NVMLError_NotSupported:
            obj.cliqueId = 0
        try:
            raw = uuid_lib.UUID(gpu.text("fabric/clusterUuid")).bytes
        except pynvml.NVMLError_NotSupported:
            raw = bytes(16)
        except ValueError:
            raise ReplayFormatError(f"{self.source}: fabric clusterUuid is no UUID") from None
        for i, byte in enumerate(raw):
            obj.clusterUuid[i] = byte
        if version == "v1":
            return pynvml.NVML_SUCCESS
        mask = 0
        bandwidth = gpu.find("fabric/health/bandwidth")
        if bandwidth is not None:
            mask |= _FABRIC_BANDWIDTH.get((bandwidth.text or "").strip().lower(), 0)
        obj.healthMask = mask << pynvml.NVML_GPU_FABRIC_HEALTH_MASK_SHIFT_DEGRADED_BW
        if version == "v3":
            summary = (node.findtext("health/summary") or "").strip().lower()
            obj.healthSummary = _FABRIC_SUMMARY.get(summary, 0)
        return pynvml.NVML_SUCCESS

    def nvmlDeviceGetGpuFabricInfoV(self, handle: Any, info: Any) -> int:
        obj = getattr(info, "_obj", info)
        version = "v3" if getattr(obj, "version", None) == pynvml.nvmlGpuFabricInfo_v3 else "v2"
        return self._fabric("nvmlDeviceGetGpuFabricInfoV", handle, info, version)

    def nvmlDeviceGetGpuFabricInfo(self, handle: Any, info: Any) -> int:
        return self._fabric("nvmlDeviceGetGpuFabricInfo", handle, info, "v1")

    def nvmlDeviceGetMigMode(self, handle: Any) -> list[int]:
        gpu = self._device("nvmlDeviceGetMigMode", handle)
        current = _bool_feature(gpu.text("mig_mode/current_mig"))
        try:
            pending = _bool_feature(gpu.text("mig_mode/pending_mig"))
        except pynvml.NVMLError_NotSupported:
            pending = current
        return [current, pending]


#: ``<fabric><state>`` as nvidia-smi writes it -> ``NVML_GPU_FABRIC_STATE_*``
_FABRIC_STATE = {"not supported": 0, "not started": 1, "in progress": 2, "completed": 3}
#: ``<fabric><health><summary>`` -> ``NVML_GPU_FABRIC_HEALTH_SUMMARY_*``
_FABRIC_SUMMARY = {"healthy": 1, "unhealthy": 2, "limited capacity": 3}
#: ``<fabric><health><bandwidth>`` -> ``NVML_GPU_FABRIC_HEALTH_MASK_DEGRADED_BW_*``
_FABRIC_BANDWIDTH = {"degraded": 1, "full": 2}


def _fabric_status(text: str, where: str) -> int:
    """nvidia-smi's word for a fabric status (``Success``, ``Insufficient Resources``,
    ``Unknown Error``: NVML's error strings) -> the ``nvmlReturn_t`` it prints; the
    error classes of pynvml name the codes (``NVMLError_InsufficientResources``)."""
    word = "".join(text.split())
    if word.lower() == "success":
        return pynvml.NVML_SUCCESS
    codes = {cls: code for code, cls in pynvml.NVMLError._valClassMapping.items()}
    for name in (word, word.removesuffix("Error")):
        try:
            return codes[nvml_error_class(name)]
        except (ValueError, KeyError):
            continue
    raise ReplayFormatError(f"{where}: fabric status {text!r} is no NVML status")


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="replace")


def parse_replay_nvml(
    data: bytes | str, faults: Mapping[str, Any] | None = None, *, source: str = "<memory>"
) -> ReplayNvml:
    """Build a :class:`ReplayNvml` from the text of a dump. See :func:`load_replay_nvml`."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8")
    depth, root = 0, None
    try:
        for event, element in ET.iterparse(io.BytesIO(raw), events=("start", "end")):
            depth += 1 if event == "start" else -1
            if depth > MAX_XML_DEPTH:  # the tree is deep-copied: C recursion, no guard
                raise ReplayFormatError(
                    f"{source}: nested deeper than {MAX_XML_DEPTH} elements: not an "
                    "nvidia-smi -q -x XML dump",
                    _decode(raw[:RAW_LIMIT]),
                )
            root = element
    except ET.ParseError as exc:
        raise ReplayFormatError(
            f"{source}: not an nvidia-smi -q -x XML dump ({exc})", _decode(raw[:RAW_LIMIT])
        ) from None
    assert root is not None  # a document without an element is a ParseError
    if root.tag != "nvidia_smi_log":
        raise ReplayFormatError(
            f"{source}: root element is <{root.tag}>, expected <nvidia_smi_log>",
            _decode(raw[:RAW_LIMIT]),
        )
    if root.find("gpu") is None:
        raise ReplayFormatError(
            f"{source}: dump has no <gpu> element (attached_gpus="
            f"{(root.findtext('attached_gpus') or 'missing').strip()})",
            _decode(raw[:RAW_LIMIT]),
        )
    return ReplayNvml(root, faults, source=source)


def load_replay_nvml(xml_path: Path | str, faults: Mapping[str, Any] | None = None) -> ReplayNvml:
    """Load an ``nvidia-smi -q -x`` dump (DTD v10-v13, with or without DOCTYPE) as a fake
    ``pynvml`` module.

    ``faults`` is the ``nvml:`` section of a replay scenario (see the module docstring).
    Raises :class:`ReplayFormatError` (with ``raw``) when the file is not such a dump or
    holds no ``<gpu>``, or when the faults are malformed; ``OSError`` when unreadable.
    """
    path = Path(xml_path)
    return parse_replay_nvml(path.read_bytes(), faults, source=str(path))
