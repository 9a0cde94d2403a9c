"""The unified card record (schema ``hetpatrol.card/1``) and the JSON Schema of the JSONL lines.

Every collector fills :class:`CardRecord` objects; the checks (:mod:`hetpatrol.checks`)
add findings and the verdict; the exporters serialise them. Field names are a contract
read by operators' tooling: fields may be added, none renamed.

Conventions:
- every value carries its unit in its name (``_bytes``, ``_celsius``, ``_watts``,
  ``_hertz``, ``_ratio`` in 0..1);
- ``None`` (JSON ``null``) means "not available"; the reason is in ``errors``. A value is
  never faked as 0;
- bus ids are normalised to the lower-case ``dddd:bb:dd.f`` form (see
  :func:`normalize_bus_id`).
"""

from __future__ import annotations

import dataclasses
import operator
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

# The verdict words, their order and exit codes live in hetpatrol.verdict (imported by
# `check` alone); re-exported here, where the record's readers look for them.
from hetpatrol.actions.vocabulary import ACTIONS
from hetpatrol.verdict import (  # noqa: F401
    _RANK,
    EXIT_CODES,
    HEALTH_CRITICAL,
    HEALTH_OK,
    HEALTH_STATES,
    HEALTH_UNKNOWN,
    HEALTH_WARNING,
    SEVERITIES,
    SEVERITY_INFO,
    worst,
)

CARD_SCHEMA = "hetpatrol.card/1"
PATROL_SCHEMA = "hetpatrol.patrol/1"
EVENT_SCHEMA = "hetpatrol.event/1"


def rfc3339(ts: float) -> str:
    """RFC 3339 UTC timestamp with milliseconds: ``2026-11-29T16:30:54.123Z``."""
    return datetime.fromtimestamp(ts, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


_BUS_ID_RE = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{4,8}):)?(?P<bus>[0-9a-fA-Fx]{2}):(?P<dev>[0-9a-fA-F]{2})\.(?P<fn>[0-7])$"
)


def normalize_bus_id(raw: str | None) -> str | None:
    """Normalise a PCI bus id to ``dddd:bb:dd.f`` lower case.

    Accepts NVML's 8-digit domain form (``00000000:3B:00.0``), the 4-digit form, and a
    bare ``bb:dd.f``. ``NA``, ``-``, ``N/A`` and empty give ``None``. A masked id such as
    ``0000:xx:00.0`` (seen in published npu-smi output) is kept as written, lower case.
    Anything else unparseable is returned lower-cased and stripped, never dropped.
    """
    if raw is None:
        return None
    text = raw.strip()
    if text in ("", "NA", "N/A", "-", "--"):
        return None
    m = _BUS_ID_RE.match(text)
    if not m:
        return text.lower()
    domain = (m.group("domain") or "0000")[-4:]
    return f"{domain}:{m.group('bus')}:{m.group('dev')}.{m.group('fn')}".lower()


#: Ranges a real card's values fall in (anything outside is a broken read).
_PLAUSIBLE: dict[str, tuple[float, float]] = {
    "utilization_ratio": (0.0, 1.0),
    "temperature_celsius": (-60.0, 250.0),
    "power_watts": (0.0, 10_000.0),
    "power_limit_watts": (0.0, 10_000.0),
    "memory_used_bytes": (0, 2**50),
    "memory_total_bytes": (0, 2**50),
    "clock_sm_hertz": (0.0, 1e11),
    "ecc_corrected_total": (0, 2**63),
    "ecc_uncorrected_total": (0, 2**63),
    "pcie_link_gen": (1, 16),
    "pcie_link_gen_max": (1, 16),
    "pcie_link_width": (1, 64),
    "pcie_link_width_max": (1, 64),
    "hugepages_used": (0, 2**40),
    "hugepages_total": (0, 2**40),
}


@dataclass(frozen=True)
class Levels:
    """A warning and a critical level of a count or a measure (``None``: that level off)."""

    warning: float | None = None
    critical: float | None = None

    def severity(self, value: float) -> str | None:
        """``critical`` or ``warning`` when ``value`` reaches that level, else None."""
        if self.critical is not None and value >= self.critical:
            return HEALTH_CRITICAL
        if self.warning is not None and value >= self.warning:
            return HEALTH_WARNING
        return None


@dataclass
class Finding:
    """One judgement about a card (or the node).

    ``check`` names the rule (``temperature``, ``vendor_health``, ``remapped_rows_pending``,
    ``collector_hung``...), ``value`` the observed value, ``threshold`` the level it was
    compared against (``None`` for state checks).
    """

    check: str
    severity: str
    message: str
    value: Any = None
    threshold: Any = None
    #: what to do about it, a word of :data:`hetpatrol.actions.vocabulary.ACTIONS`
    #: (set by the patrol: :func:`hetpatrol.actions.apply.judge_card`)
    action: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "check": self.check,
            "severity": self.severity,
            "value": self.value,
            "threshold": self.threshold,
            "message": self.message,
            "action": self.action,
        }


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    """The dataclass fields of ``cls`` in order, looked up once per class."""
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in dataclasses.fields(cls))
    return names


@dataclass
class ProcessInfo:
    """A process holding memory on a card.

    ``pid`` is as the vendor tool reports it (host PID namespace for NVML and npu-smi on
    the host). ``user`` and ``job_id`` are filled from psutil and the cgroup path when
    readable, else ``None``. ``memory_bytes`` is ``None`` when the vendor does not say.
    """

    pid: int
    name: str | None = None
    memory_bytes: int | None = None
    user: str | None = None
    job_id: str | None = None
    pid_in_container: int | None = None
    #: the ``index`` of the card's partition (:class:`PartitionInfo`: MIG device, vNPU)
    #: the process runs in; None on a whole card or when the vendor does not say
    partition: int | None = None

    def to_dict(self) -> dict[str, Any]:
        # every field is a scalar: a plain dict of them is what dataclasses.asdict gives,
        # without its recursive copy (~10x the cost, once per process per patrol)
        return {name: getattr(self, name) for name in _field_names(ProcessInfo)}


#: partition kinds: an NVIDIA MIG device, an Ascend vNPU
PARTITION_KINDS = ("mig", "vnpu")


@dataclass
class PartitionInfo:
    """One partition of a card (a MIG device of a GPU in MIG mode, a vNPU of an Ascend
    chip), listed under its parent card's record; the parent keeps the card's own health
    (ECC, XIDs, temperature), a partition has no verdict of its own.

    - ``kind``: ``"mig"`` or ``"vnpu"``; ``index``: the MIG device index
      (``nvmlDeviceGetMigDeviceHandleByIndex``) or the vNPU id (``npu-smi info -t
      info-vnpu``: ``Vnpu ID``);
    - ``uuid``: the MIG device's own UUID (``MIG-...``, ``nvmlDeviceGetUUID`` on its
      handle); None for a vNPU (npu-smi prints none);
    - ``profile``: the MIG profile (``1g.20gb``, from ``nvmlDeviceGetName`` of the MIG
      device, ``... MIG 1g.20gb``) or the vNPU template (``vir02``);
    - ``gpu_instance_id``, ``compute_instance_id``: MIG GI/CI ids (vNPU: its vGroup id
      as ``gpu_instance_id``); ``slices``: MIG GPU instance slices
      (``nvmlDeviceGetAttributes().gpuInstanceSliceCount``), vNPU AI cores;
    - ``memory_total_bytes``, ``memory_used_bytes``: the partition's memory
      (``nvmlDeviceGetMemoryInfo`` on the MIG handle; the vNPU template's memory);
    - ``memory_size_mib``: the MIG device's memory as NVML's device attributes give it
      (``nvmlDeviceGetAttributes().memorySizeMB``, which Slurm names the type by);
    - ``device_files``: the device nodes a job needs for it (MIG:
      ``/dev/nvidia-caps/nvidia-cap<N>`` of its GPU and compute instance, from
      ``/proc/driver/nvidia-caps/mig-minors``), empty when unknown;
    - ``status``: the vNPU's npu-smi status; ``errors``: ``{source, error}`` as on a card.
    """

    kind: str
    index: int
    uuid: str | None = None
    profile: str | None = None
    gpu_instance_id: int | None = None
    compute_instance_id: int | None = None
    slices: int | None = None
    memory_total_bytes: int | None = None
    memory_used_bytes: int | None = None
    memory_size_mib: int | None = None
    device_files: list[str] = field(default_factory=list)
    status: str | None = None
    errors: list[dict[str, str]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        out = {name: getattr(self, name) for name in _field_names(PartitionInfo)}
        out["device_files"] = list(self.device_files)
        out["errors"] = [dict(e) for e in self.errors]
        return out


@dataclass
class CardRecord:
    """One card (or one chip of a multi-chip card) as read in one patrol.

    Sources of each value are documented by the collector that fills it
    (``hetpatrol.collectors.nvidia`` for NVML calls, ``hetpatrol.collectors.ascend`` for
    the ``npu-smi info`` columns).
    """

    vendor: str
    index: int
    model: str | None = None
    card_type: str | None = None
    chip: int | None = None
    node: str | None = None
    ts: str | None = None
    gres: str | None = None
    uuid: str | None = None
    serial: str | None = None
    bus_id: str | None = None
    #: the number of the card's own device node (``/dev/nvidia<N>``: NVML's minor
    #: number; ``/dev/davinci<N>``: the chip's physical id), where the plugin reads one
    device_number: int | None = None
    driver_version: str | None = None
    firmware_version: str | None = None
    vendor_health: str | None = None
    health: str = HEALTH_UNKNOWN
    utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    memory_kind: str | None = None
    temperature_celsius: float | None = None
    power_watts: float | None = None
    power_limit_watts: float | None = None
    clock_sm_hertz: float | None = None
    ecc_corrected_total: int | None = None
    ecc_uncorrected_total: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failure: bool | None = None
    pcie_link_gen: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    hugepages_used: int | None = None
    hugepages_total: int | None = None
    processes: list[ProcessInfo] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    errors: list[dict[str, str]] = field(default_factory=list)
    counters: dict[str, int] = field(default_factory=dict)
    #: interconnect links: NVLink (``kind: "nvlink"``) or the Ascend RoCE port
    #: (``kind: "roce"``), see :func:`link_json_schema`
    links: list[dict[str, Any]] = field(default_factory=list)
    #: the GPU's registration with its NVLink fabric (NVSwitch systems), see
    #: :func:`fabric_json_schema`; None when the plugin read none (a GPU or driver
    #: without it, another vendor)
    fabric: dict[str, Any] | None = None
    #: ``npu-smi info -t health``: {status, codes, info, ts}; None when not read
    health_detail: dict[str, Any] | None = None
    #: the card's partitions (MIG devices, vNPUs), see :class:`PartitionInfo`; empty on
    #: a whole card
    partitions: list[PartitionInfo] = field(default_factory=list)
    #: what to do about the card (its findings' highest action, raised by escalation):
    #: the word, where it came from (``xid``, ``check``, ``escalation``...), the code
    #: (``xid:79``, ``check:remapped_rows_pending``) and why
    action: str | None = None
    action_source: str | None = None
    action_code: str | None = None
    action_reason: str | None = None
    read_ok: bool = True

    def add_error(self, source: str, error: str) -> None:
        """Record why a value is missing: ``source`` is the NVML call or npu-smi column."""
        self.errors.append({"source": source, "error": error})

    def drop_implausible(self) -> None:
        """Replace values no real card can report by ``None``, with an error naming them.

        A garbled vendor output must not become a healthy-looking card: -300 C, a
        negative power or 1 TB used on an 80 GB card are a broken read, not a reading.
        """
        for name, (low, high) in _PLAUSIBLE.items():
            value = getattr(self, name)
            if value is not None and not (low <= value <= high):
                setattr(self, name, None)
                self.add_error(name, f"implausible value {value!r} dropped")
        used, total = self.memory_used_bytes, self.memory_total_bytes
        if used is not None and total is not None and used > total * 1.05:
            self.memory_used_bytes = None
            self.add_error("memory_used_bytes", f"implausible: {used} used of {total}")

    def identity(self, *, read_ok: bool = True) -> CardRecord:
        """A new record with only this card's identity (no values, findings or errors)."""
        return CardRecord(
            vendor=self.vendor,
            index=self.index,
            chip=self.chip,
            model=self.model,
            card_type=self.card_type,
            uuid=self.uuid,
            serial=self.serial,
            bus_id=self.bus_id,
            device_number=self.device_number,
            gres=self.gres,
            read_ok=read_ok,
        )

    @property
    def key(self) -> tuple[str, int, int | None]:
        """Stable identity inside one node: (vendor, index, chip)."""
        return (self.vendor, self.index, self.chip)

    def to_dict(self) -> dict[str, Any]:
        """The JSONL ``kind: "card"`` line as a dict (schema ``hetpatrol.card/1``)."""
        out: dict[str, Any] = {"kind": "card", "schema": CARD_SCHEMA}
        # every field in declaration order, then the containers replaced by copies in
        # place (a key set again keeps its position): the order of the line's keys
        out.update(zip(_CARD_LINE_FIELDS, _card_line_values(self), strict=True))
        out["processes"] = [item.to_dict() for item in self.processes]
        out["findings"] = [item.to_dict() for item in self.findings]
        out["errors"] = [dict(item) for item in self.errors]
        out["counters"] = dict(self.counters)
        out["partitions"] = [item.to_dict() for item in self.partitions]
        if self.fabric is not None:
            out["fabric"] = dict(self.fabric)
        return out


#: the fields of a card line after ``kind`` and ``schema``, in declaration order
#: (``read_ok`` is the patrol's own bookkeeping, not part of the line)
_CARD_LINE_FIELDS = tuple(f.name for f in dataclasses.fields(CardRecord) if f.name != "read_ok")
_card_line_values = operator.attrgetter(*_CARD_LINE_FIELDS)


def _nullable(kind: str | list[str]) -> dict[str, Any]:
    kinds = [kind] if isinstance(kind, str) else list(kind)
    return {"type": [*kinds, "null"]}


def card_json_schema() -> dict[str, Any]:
    """JSON Schema (draft 2020-12) of a ``kind: "card"`` JSONL line."""
    num = _nullable("number")
    integer = _nullable("integer")
    string = _nullable("string")
    boolean = _nullable("boolean")
    finding = {
        "type": "object",
        "required": ["check", "severity", "message"],
        "properties": {
            "check": {"type": "string"},
            "severity": {"enum": list(SEVERITIES)},
            "message": {"type": "string"},
            "value": {},
            "threshold": {},
            "action": {"enum": [*ACTIONS, None]},
        },
    }
    process = {
        "type": "object",
        "required": ["pid"],
        "properties": {
            "pid": {"type": "integer"},
            "name": string,
            "memory_bytes": {**integer, "minimum": 0},
            "user": string,
            "job_id": string,
            "pid_in_container": integer,
            "partition": integer,
        },
    }
    partition = {
        "type": "object",
        "required": ["kind", "index"],
        "properties": {
            "kind": {"enum": list(PARTITION_KINDS)},
            "index": {"type": "integer"},
            "uuid": string,
            "profile": string,
            "gpu_instance_id": integer,
            "compute_instance_id": integer,
            "slices": {**integer, "minimum": 0},
            "memory_total_bytes": {**integer, "minimum": 0},
            "memory_used_bytes": {**integer, "minimum": 0},
            "memory_size_mib": {**integer, "minimum": 0},
            "device_files": {"type": "array", "items": {"type": "string"}},
            "status": string,
            "errors": {"type": "array", "items": {"type": "object"}},
        },
    }
    props: dict[str, Any] = {
        "kind": {"const": "card"},
        "schema": {"const": CARD_SCHEMA},
        "run_id": {"type": "string", "pattern": "^[0-9a-f]{12}$"},
        "ts": {"type": "string"},
        "node": {"type": "string"},
        "vendor": {"type": "string"},
        "card_type": string,
        "gres": string,
        "model": string,
        "index": {"type": "integer"},
        "chip": integer,
        "uuid": string,
        "serial": string,
        "bus_id": string,
        "device_number": {**integer, "minimum": 0},
        "driver_version": string,
        "firmware_version": string,
        "vendor_health": string,
        "health": {"enum": list(HEALTH_STATES)},
        "utilization_ratio": {**num, "minimum": 0, "maximum": 1},
        "memory_used_bytes": {**integer, "minimum": 0},
        "memory_total_bytes": {**integer, "minimum": 0},
        "memory_kind": {"enum": ["hbm", "ddr", "gddr", "fb", None]},
        "temperature_celsius": num,
        "power_watts": {**num, "minimum": 0},
        "power_limit_watts": {**num, "minimum": 0},
        "clock_sm_hertz": {**num, "minimum": 0},
        "ecc_corrected_total": {**integer, "minimum": 0},
        "ecc_uncorrected_total": {**integer, "minimum": 0},
        "retired_pages_pending": boolean,
        "remapped_rows_pending": boolean,
        "remapped_rows_failure": boolean,
        "pcie_link_gen": integer,
        "pcie_link_gen_max": integer,
        "pcie_link_width": integer,
        "pcie_link_width_max": integer,
        "hugepages_used": integer,
        "hugepages_total": integer,
        "processes": {"type": "array", "items": process},
        "findings": {"type": "array", "items": finding},
        "action": {"enum": [*ACTIONS, None]},
        "action_source": string,
        "action_code": string,
        "action_reason": string,
        "errors": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["source", "error"],
                "properties": {"source": {"type": "string"}, "error": {"type": "string"}},
            },
        },
        "counters": {"type": "object", "additionalProperties": {"type": "integer"}},
        "links": {"type": "array", "items": link_json_schema()},
        "fabric": fabric_json_schema(),
        "partitions": {"type": "array", "items": partition},
        "health_detail": {
            "type": ["object", "null"],
            "properties": {
                "status": {"type": ["string", "null"]},
                "codes": {"type": "array", "items": {"type": "string"}},
                "info": {"type": "array", "items": {"type": "string"}},
                "ts": {"type": "string"},
            },
        },
    }
    return {
        "type": "object",
        "required": [
            "kind",
            "schema",
            "ts",
            "node",
            "vendor",
            "index",
            "health",
            "findings",
            "errors",
            "processes",
        ],
        "properties": props,
    }


def patrol_json_schema() -> dict[str, Any]:
    """JSON Schema of the ``kind: "patrol"`` summary line (one per patrol)."""
    collector = {
        "type": "object",
        "required": ["up", "state", "cards", "duration_seconds"],
        "properties": {
            "up": {"type": "boolean"},
            "state": {"enum": ["ok", "absent", "failed", "hung", "disabled"]},
            "cards": {"type": "integer", "minimum": 0},
            "duration_seconds": {"type": "number", "minimum": 0},
            "error": {"type": ["string", "null"]},
            "raw": {
                "description": "an excerpt of the tool's output when it was not understood: "
                "at most the first 3072 and the last 1024 characters, the rest replaced by "
                "'[... N bytes left out ...]' (hetpatrol.collector.bound_raw)",
                "type": ["string", "null"],
                "maxLength": 3072 + 1024 + 64,
            },
            "raw_bytes": {
                "description": "size of the whole output, UTF-8 bytes",
                "type": ["integer", "null"],
                "minimum": 0,
            },
            "raw_sha256": {
                "description": "SHA-256 of the whole output (hex)",
                "type": ["string", "null"],
                "pattern": "^[0-9a-f]{64}$",
            },
        },
    }
    return {
        "type": "object",
        "required": [
            "kind",
            "schema",
            "ts",
            "node",
            "seq",
            "health",
            "exit_code",
            "duration_seconds",
            "cards",
            "collectors",
            "findings",
            "changes",
        ],
        "properties": {
            "kind": {"const": "patrol"},
            "schema": {"const": PATROL_SCHEMA},
            "run_id": {"type": "string", "pattern": "^[0-9a-f]{12}$"},
            "ts": {"type": "string"},
            "node": {"type": "string"},
            "seq": {"type": "integer", "minimum": 1},
            "health": {"enum": list(HEALTH_STATES)},
            "exit_code": {"enum": [0, 1, 2, 3]},
            "action": {"enum": list(ACTIONS)},
            "duration_seconds": {"type": "number", "minimum": 0},
            "cards": {
                "type": "object",
                "additionalProperties": {"type": "integer", "minimum": 0},
            },
            "collectors": {"type": "object", "additionalProperties": collector},
            "findings": {"type": "array"},
            "changes": {"type": "array"},
            "gres": gres_json_schema(),
            "kernel_log": {
                "description": "the kernel-log reader: where it read and what it found",
                "type": "object",
                "properties": {
                    "state": {"type": "string"},
                    "error": {"type": ["string", "null"]},
                    "source": {"type": ["string", "null"]},
                    "new_events": {"type": "integer", "minimum": 0},
                    "window_events": {"type": "integer", "minimum": 0},
                    #: records read again that a kept fault event already names (a
                    #: restarted daemon): no event line, no escalation count
                    "reread_events": {"type": "integer", "minimum": 1},
                },
            },
            "pci_census": {
                "description": "the PCI census (hetpatrol.checks.pci_census): where the bus "
                "was read (error: why not), its cards per vendor and card type, and each "
                "card no collector lists; null while it is switched off",
                "type": ["object", "null"],
                "properties": {
                    "source": {"type": "string"},
                    "error": {"type": ["string", "null"]},
                    "cards": {"type": "integer", "minimum": 0},
                    "types": {"type": "array", "items": {"type": "object"}},
                    "unwatched": {"type": "array", "items": {"type": "object"}},
                },
            },
            "environment": {
                "description": "the library-path crosstalk check (ok, absent, ...); null "
                "while it is switched off",
                "type": ["object", "null"],
                "properties": {"state": {"type": "string"}, "root": {"type": ["string", "null"]}},
            },
            "boot": {
                "description": "the boot this patrol ran in (hetpatrol.boot): the kernel's "
                "boot id and boot time (null when unread, error says why), the patrols of "
                "this boot, the links each card had up in its first healthy patrol of it, "
                "and per PCI bus id the patrols in a row its tool did not list the card "
                "there (pci_unwatched); per card key the cards gone from their collector's "
                "list with the patrols in a row (card_missing), and per bus id the kernel "
                "log's event of this boot that says its card left the bus",
                "type": "object",
                "properties": {
                    "boot_id": {"type": ["string", "null"]},
                    "boot_time": {"type": ["number", "null"]},
                    "patrols": {"type": "integer", "minimum": 0},
                    "error": {"type": ["string", "null"]},
                    "learned_links": {"type": "object"},
                    "unlisted_patrols": {
                        "type": "object",
                        "additionalProperties": {"type": "integer", "minimum": 1},
                    },
                    "missing_cards": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "required": ["collector", "vendor", "index", "patrols"],
                            "properties": {
                                "collector": {"type": "string"},
                                "vendor": {"type": "string"},
                                "index": {"type": "integer"},
                                "chip": {"type": ["integer", "null"]},
                                "uuid": {"type": ["string", "null"]},
                                "serial": {"type": ["string", "null"]},
                                "bus_id": {"type": ["string", "null"]},
                                "gres": {"type": ["string", "null"]},
                                "patrols": {"type": "integer", "minimum": 1},
                                "severity": {"type": "string"},
                            },
                        },
                    },
                    "off_bus": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            },
        },
    }


def gres_json_schema() -> dict[str, Any]:
    """The ``gres`` key of the patrol line: Slurm GRES registration vs the cards.

    ``null`` while ``slurm.enabled`` is off. ``source`` is where the registration was
    read (``sinfo``, ``scontrol``, ``gres.conf``; ``null`` when it could not be read, ``error``
    says why). One entry per (GRES name, type): registered, found, found and healthy.
    """
    count = {"type": "integer", "minimum": 0}
    entry = {
        "type": "object",
        "required": ["name", "type", "configured", "found", "healthy"],
        "properties": {
            "name": {"type": "string"},
            "type": {"type": ["string", "null"]},
            "configured": count,
            "found": count,
            "healthy": count,
            "on_bus": {
                "type": ["integer", "null"],
                "description": "cards of this name and type on the PCI bus (the census); "
                "null when the registered type is none the census names",
            },
        },
    }
    return {
        "type": ["object", "null"],
        "required": ["slurm_node", "source", "error", "entries"],
        "properties": {
            "slurm_node": {"type": "string"},
            "source": {"enum": ["sinfo", "scontrol", "gres.conf", None]},
            "error": {"type": ["string", "null"]},
            "read_at": {"type": "number"},
            "entries": {"type": "array", "items": entry},
            "order": {
                "type": "object",
                "required": ["names", "gres_conf_lines", "gres_conf"],
                "description": "GRES names of several registered types only: their IDX "
                "order (hetpatrol.slurm.inventory.gres_order), also the state file's "
                "gres_order",
                "properties": {
                    "names": {
                        "type": "object",
                        "additionalProperties": {
                            "type": "object",
                            "required": ["types", "error"],
                            "properties": {
                                "types": {"type": "array", "items": {"type": "object"}},
                                "error": {"type": ["string", "null"]},
                            },
                        },
                    },
                    "gres_conf_lines": {"type": ["boolean", "null"]},
                    "gres_conf": {"type": "string"},
                },
            },
        },
    }


#: class of a kernel-log event (the judge in hetpatrol.checks.kernel_events sets it)
CLASS_DRAIN = "drain"
CLASS_APPLICATION = "application"
CLASS_INFO = "informational"
CLASS_OTHER = "other"

#: ``event`` of a kernel-log line: an NVIDIA XID, or a failure that prints no Xid
KERNEL_EVENTS = ("xid", "kernel")
KERNEL_EVENT_REQUIRED = ("severity", "class", "xid", "bus_id", "count", "message", "raw")


def kernel_event_properties() -> dict[str, Any]:
    """Properties of a ``kind: "event"`` line with ``event`` ``xid`` or ``kernel`` (merged
    into :func:`event_json_schema`; ``seq`` is the patrol's)."""
    string = {"type": ["string", "null"]}
    integer = {"type": ["integer", "null"]}
    return {
        "severity": {"enum": [SEVERITY_INFO, HEALTH_WARNING, HEALTH_CRITICAL]},
        "class": {"enum": [CLASS_DRAIN, CLASS_APPLICATION, CLASS_INFO, CLASS_OTHER]},
        "xid": integer,
        "reason": string,
        "name": string,
        "bus_id": string,
        "vendor": string,
        "index": integer,
        "chip": integer,
        "uuid": string,
        "pid": integer,
        "process": string,
        "user": string,
        "job_id": string,
        #: the Slurm jobs on the card when the fault was read: its allocation (squeue
        #: --json) and the jobs of the processes on it; null when not known
        "jobs": {"type": ["array", "null"], "items": {"type": "string"}},
        #: why ``jobs`` is null for a record older than what the daemon can know (read
        #: at its start from before its first read of the cards' jobs); absent otherwise
        "jobs_unknown": string,
        "nvlink_unit": string,
        "fatal": {"type": ["boolean", "null"]},
        "link": integer,
        "nvlink_action": {"enum": ["RESET_GPU", "XID_154_EVAL", "IGNORE", None]},
        "recovery_action": string,
        "count": {"type": "integer", "minimum": 1},
        "window_count": {"type": "integer", "minimum": 0},
        "in_window": {"type": "boolean"},
        "message": {"type": "string"},
        "log_time": string,
        "kmsg_seq": integer,
        #: a text kernel log's name for a record without ``kmsg_seq``: ``<device>.<inode>
        #: of the file>:<sha256 of raw, 16 hex>:<place among equal records>``
        "log_record": {"type": "string", "maxLength": 128},
        #: the boot the record was read in (/proc/sys/kernel/random/boot_id; null when
        #: not read): with ``kmsg_seq``, the kernel record itself
        "boot_id": string,
        "raw": {"type": "string"},
    }


def event_json_schema() -> dict[str, Any]:
    """JSON Schema of a ``kind: "event"`` line: a Slurm drain/resume decision.

    ``event``: ``drain``, ``resume`` (done, or only logged when ``dry_run``),
    ``drain_skipped`` / ``resume_skipped`` (someone else's reason, a state hetpatrol does
    not act on, Slurm unreachable: ``detail`` says which), ``drain_failed`` /
    ``resume_failed`` (scontrol update failed). ``reason`` is the drain reason set (or
    that would be set), or why the node is resumed; ``slurm_state`` / ``slurm_reason``
    are the node's state and reason in Slurm when the decision was made; ``command`` the
    scontrol argv run (or that a dry run would run).

    ``event`` ``xid`` / ``kernel``: a GPU fault read from the kernel log (an NVIDIA XID,
    or a failure that prints no Xid), judged; its fields are those of
    :func:`kernel_event_properties`.
    """
    nullable_string = {"type": ["string", "null"]}
    decisions = [
        "drain",
        "resume",
        "drain_skipped",
        "drain_held",
        "resume_skipped",
        "drain_failed",
        "resume_failed",
    ]
    return {
        "type": "object",
        "required": ["kind", "schema", "ts", "node", "seq", "event"],
        "allOf": [
            {
                "if": {"properties": {"event": {"enum": decisions}}},
                "then": {"required": ["slurm_node", "health", "reason", "detail", "dry_run"]},
            },
            {
                "if": {"properties": {"event": {"enum": list(KERNEL_EVENTS)}}},
                "then": {"required": list(KERNEL_EVENT_REQUIRED)},
            },
        ],
        "properties": {
            **kernel_event_properties(),
            "kind": {"const": "event"},
            "schema": {"const": EVENT_SCHEMA},
            "run_id": {"type": "string", "pattern": "^[0-9a-f]{12}$"},
            "ts": {"type": "string"},
            "node": {"type": "string"},
            "slurm_node": {"type": "string"},
            # 0: no patrol's (an operator's command: history_clear)
            "seq": {"type": "integer", "minimum": 0},
            "health": {"enum": list(HEALTH_STATES)},
            "event": {"enum": [*decisions, *KERNEL_EVENTS, "history_clear"]},
            "reason": nullable_string,
            "detail": nullable_string,
            "dry_run": {"type": "boolean"},
            "slurm_state": nullable_string,
            "slurm_reason": nullable_string,
            "command": {"type": ["array", "null"], "items": {"type": "string"}},
        },
    }


def fault_event_json_schema() -> dict[str, Any]:
    """JSON Schema of one entry of the state file's ``fault_events``: a card fault event
    kept with its jobs (:mod:`hetpatrol.actions.fault_events`, which reads them back by
    hand with the same rules: the daemon never imports ``jsonschema``). Fields that are
    null are left out but ``ts``, ``boot_id``, ``event``, ``severity`` and ``jobs``;
    ``xid`` or ``reason`` names the fault; ``run_id`` and ``seq`` are the JSONL line's.
    """
    text = {"type": "string", "maxLength": 128}
    return {
        "type": "object",
        "required": ["ts", "boot_id", "event", "severity", "jobs"],
        "additionalProperties": False,
        "anyOf": [{"required": ["xid"]}, {"required": ["reason"]}],
        "properties": {
            "ts": text,
            "boot_id": {"type": ["string", "null"], "maxLength": 128},
            "event": {"enum": list(KERNEL_EVENTS)},
            "run_id": text,
            "seq": {"type": "integer"},
            "xid": {"type": "integer"},
            "reason": text,
            "severity": {"enum": [SEVERITY_INFO, HEALTH_WARNING, HEALTH_CRITICAL]},
            "uuid": text,
            "bus_id": text,
            "vendor": text,
            "index": {"type": "integer"},
            "chip": {"type": "integer"},
            "kmsg_seq": {"type": "integer"},
            "log_record": text,
            "jobs": {"type": ["array", "null"], "items": text, "maxItems": 64},
            "jobs_more": {"type": "integer", "minimum": 1},
            "jobs_unknown": text,
        },
    }


def link_json_schema() -> dict[str, Any]:
    """One entry of a card's ``links``: an NVLink link or the Ascend RoCE port.

    ``state`` ``up``/``down`` (``null`` when not read); NVLink ``counters`` are the DL
    error counters since driver load (``replay``, ``recovery``, ``crc_flit``,
    ``crc_data``); RoCE: ``net_health`` (hccn_tool ``-net_health``), ``link_up_count``
    and ``link_down_times`` (``-link_stat``), ``optical`` (``-optical``), ``ts`` of the
    read (detail commands run at a slower cadence than the patrol). ``kind`` is the
    plugin's word for the link (``nvlink``, ``roce``; ``VendorInfo.link_kinds``).
    """
    return {
        "type": "object",
        "required": ["kind", "link", "state"],
        "properties": {
            "kind": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
            "link": {"type": "integer"},
            "state": {"enum": ["up", "down", None]},
            "counters": {"type": "object", "additionalProperties": {"type": "integer"}},
            "net_health": {"type": ["string", "null"]},
            "link_up_count": {"type": ["integer", "null"]},
            "link_down_times": {"type": "array", "items": {"type": "number"}},
            "optical": {"type": ["object", "null"]},
            "ts": {"type": "string"},
            "errors": {"type": "array"},
        },
    }


#: the registration states of a GPU with its fabric, as nvidia-smi prints them (NVML
#: ``NVML_GPU_FABRIC_STATE_NOT_SUPPORTED`` 0 .. ``_COMPLETED`` 3)
FABRIC_STATES = ("Not Supported", "Not Started", "In Progress", "Completed")


def fabric_json_schema() -> dict[str, Any]:
    """A card's ``fabric`` object (or null): its registration with the NVLink fabric.

    ``state``: one of :data:`FABRIC_STATES` (null when not read); ``status``: the
    registration's error status, ``Success`` or the NVML error name
    (``InsufficientResources``, ``Unknown``...), null unless ``state`` is ``Completed``
    (NVML: "Must be checked only if Probe state returns complete"); ``clique_id`` and
    ``cluster_uuid``: the fabric clique and cluster (null unless completed);
    ``health_summary`` (``Healthy``, ``Unhealthy``, ``Limited Capacity``) and
    ``bandwidth`` (``Full``, ``Degraded``), null where the driver does not say.
    """
    text = {"type": ["string", "null"]}
    return {
        "type": ["object", "null"],
        "properties": {
            "state": {"enum": [*FABRIC_STATES, None]},
            "status": text,
            "clique_id": {"type": ["integer", "null"], "minimum": 0},
            "cluster_uuid": text,
            "health_summary": text,
            "bandwidth": text,
        },
    }


def jsonl_json_schema() -> dict[str, Any]:
    """JSON Schema of any hetpatrol JSONL line: a card, patrol or event line."""
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "https://hetpatrol.invalid/schema/jsonl-1.json",
        "title": "hetpatrol JSONL line",
        "oneOf": [card_json_schema(), patrol_json_schema(), event_json_schema()],
    }
