"""Ascend detail: ``npu-smi info -t health`` fault codes and the RoCE port (``hccn_tool``).

The reading half, part of the Ascend plugin: parsers for ``npu-smi info -m`` (which chip
  has which logic id), ``npu-smi info -t health -i N -c C``, and ``hccn_tool -i ID
  -link -g`` / ``-net_health -g`` / ``-link_stat -g`` / ``-optical -g``; and
  :class:`DetailReader`, which runs them at a slower cadence than the patrol (every
  ``detail_interval_seconds``), and ``-t health`` at once for a chip whose Health is not
  OK, within a time budget per patrol, always under a timeout (:func:`run_tool`), and
  puts the last answers on the records (``health_detail``, ``links`` of kind ``roce``).

The judges are checks: fault codes in :mod:`hetpatrol.checks.fault_codes`, the RoCE port
in :mod:`hetpatrol.checks.interconnect`.
"""

from __future__ import annotations

import calendar
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from hetpatrol.schema import (
    CardRecord,
    PartitionInfo,
)

if TYPE_CHECKING:
    from hetpatrol.tool import ToolOutput


# ------------------------------------------------------------------------------ parsers

_KV_RE = re.compile(r"^\s*(?P<key>[^:]*?)\s*:\s?(?P<value>.*?)\s*$")
_CODE_RE = re.compile(r"^(?:0[xX])?(?P<code>[0-9A-Fa-f]{8})$")
#: Plain separators between error codes (``A4025021 8C03A000``, ``8C03A000,8C084E00``).
_CODE_SEP_RE = re.compile(r"[\s,;|/]+")
#: An ``Error Code`` value that means no code at all.
_NO_CODES = ("", "na", "n/a", "-", "none")
_PREFIX_RE = re.compile(r"^\[(?:devid|device)\s+\d+\]")
_RECORD_RE = re.compile(
    r"^\s*(?P<ts>[A-Z][a-z]{2}\s+[A-Z][a-z]{2}\s+\d{1,2}\s+\d\d:\d\d:\d\d\s+\d{4})\s+LINK\s+(?P<state>UP|DOWN)\s*$"
)


#: the column names of ``npu-smi info -m`` seen on the recorded generations: ``NPU ID
#: Chip ID Chip Logic ID Chip Name`` (310, 310P, 910, 910B), with ``Chip Phy-ID`` after
#: ``Chip Logic ID`` (910_93 / A3: xllm and vllm-ascend test data), and ``NPU ID Slot ID
#: Chip ID Chip Phy-ID Chip Name`` without a logic id (Ascend 950PR: swanlab's test data)
_MAP_COLUMNS = ("NPU ID", "Slot ID", "Chip ID", "Chip Logic ID", "Chip Phy-ID", "Chip Name")


@dataclass(frozen=True)
class ChipMap:
    """``npu-smi info -m`` read by its header: ``rows`` as (NPU ID, Chip ID, logic id or
    None for ``-``, Chip Name); ``logic_column`` names the column the logic id was read
    from (``Chip Logic ID``, or ``Chip Phy-ID`` where the generation prints no logic id);
    ``columns`` the header as printed; ``problems`` the rows not read, and why."""

    rows: tuple[tuple[int, int, int | None, str], ...]
    columns: tuple[str, ...]
    logic_column: str | None
    problems: tuple[str, ...] = ()


def _map_header(line: str) -> list[str] | None:
    """The column names of a ``-m`` header row, known names first (``Chip Logic ID`` is
    one name, not ``Chip`` + ``Logic ID``); None when the row names no ``NPU ID`` and
    ``Chip ID`` or holds a word that is no known column."""
    rest = " ".join(line.split())
    names: list[str] = []
    while rest:
        name = next((c for c in _MAP_COLUMNS if rest == c or rest.startswith(c + " ")), None)
        if name is None:
            return None
        names.append(name)
        rest = rest[len(name) :].strip()
    return names if "NPU ID" in names and "Chip ID" in names else None


def read_chip_map(text: str) -> ChipMap:
    """``npu-smi info -m`` read by its header row, on every recorded generation (tab- or
    space-indented, any column widths). Each row: one token per column before ``Chip
    Name``, which takes the rest (``Ascend 910A``). The logic id is ``Chip Logic ID`` where
    printed, else ``Chip Phy-ID`` (Ascend 950PR prints no logic id; its chips are
    addressed by the physical id, as the 950 layouts recorded by swanlab, xqueue and
    kernelx read it); ``-`` (the MCU rows) is None. Never raises: a text with no header
    row gives no rows and a problem saying what the output began with."""
    lines = text.splitlines()
    at = next((n for n, ln in enumerate(lines) if _map_header(ln)), None)
    if at is None:
        first = next((ln.strip() for ln in lines if ln.strip()), "")
        return ChipMap((), (), None, (f"no 'NPU ID ... Chip ID' header row: {first[:80]!r}",))
    names = _map_header(lines[at]) or []
    logic_column = next((c for c in ("Chip Logic ID", "Chip Phy-ID") if c in names), None)
    fixed = names[:-1] if names[-1] == "Chip Name" else names
    rows: list[tuple[int, int, int | None, str]] = []
    problems: list[str] = []
    for line in lines[at + 1 :]:
        toks = line.split()
        if not toks:
            continue
        if len(toks) < len(fixed) or (names[-1] == "Chip Name" and len(toks) == len(fixed)):
            problems.append(f"row {' '.join(toks)[:60]!r}: {len(toks)} values for {names}")
            continue
        values = dict(zip(fixed, toks, strict=False))
        name = " ".join(toks[len(fixed) :])
        npu, chip = values.get("NPU ID", ""), values.get("Chip ID", "")
        logic = values.get(logic_column or "", "-")
        if not (npu.isdigit() and chip.isdigit()) or not (logic.isdigit() or logic == "-"):
            problems.append(f"row {' '.join(toks)[:60]!r} not understood")
            continue
        rows.append((int(npu), int(chip), int(logic) if logic.isdigit() else None, name))
    return ChipMap(tuple(rows), tuple(names), logic_column, tuple(problems))


def parse_chip_map(text: str) -> list[tuple[int, int, int | None, str]]:
    """``npu-smi info -m``: (NPU ID, Chip ID, logic id or None for ``-``, name), read by
    the header's column names (:func:`read_chip_map`)."""
    return list(read_chip_map(text).rows)


@dataclass(frozen=True)
class HealthDetail:
    """``npu-smi info -t health``: status, 8-hex-digit error codes, error information
    (one entry per information line; the continuation lines start with spaces + ``:``).
    ``bad_codes``: the ``Error Code`` tokens that are not an 8-hex-digit code, as printed."""

    status: str | None
    codes: tuple[str, ...]
    info: tuple[str, ...]
    bad_codes: tuple[str, ...] = ()


def parse_health(text: str) -> HealthDetail:
    """Parse ``npu-smi info -t health -i N -c C``. ``ValueError`` when no Health Status."""
    status: str | None = None
    codes: list[str] = []
    bad: list[str] = []
    info: list[str] = []
    current = None
    for line in text.splitlines():
        if not line.strip():
            continue
        m = _KV_RE.match(line)
        if not m:
            continue
        key, value = m.group("key"), m.group("value")
        low = key.lower()
        if low == "health status":
            status, current = value or None, None
        elif low == "error code":
            codes, bad = [], []
            if value.strip().lower() not in _NO_CODES:
                for token in _CODE_SEP_RE.split(value.strip()):
                    code = _CODE_RE.match(token)
                    if code:
                        codes.append(code.group("code").upper())
                    elif token:
                        bad.append(token)
            current = None
        elif low == "error information":
            current = info
            if value and value.upper() != "NA":
                info.append(value)
        elif key == "" and current is not None and value:
            current.append(value)  # "                 : node type=..., event state=..."
    if status is None:
        raise ValueError("no 'Health Status' in npu-smi info -t health output")
    return HealthDetail(status, tuple(codes), tuple(info), tuple(bad))


def _value_after(text: str, key: str) -> str | None:
    for line in text.splitlines():
        m = _KV_RE.match(line)
        if m and m.group("key").lower() == key:
            return m.group("value")
    return None


def parse_link(text: str) -> str:
    """``hccn_tool -i N -link -g``: ``link status: UP`` -> ``up`` / ``down``."""
    value = _value_after(text, "link status")
    if value is None or value.upper() not in ("UP", "DOWN"):
        raise ValueError(f"no 'link status: UP|DOWN' in {text.strip()[:80]!r}")
    return value.lower()


def parse_net_health(text: str) -> str:
    """``hccn_tool -i N -net_health -g``: ``net health status: Success`` -> ``Success``."""
    value = _value_after(text, "net health status")
    if not value:
        raise ValueError(f"no 'net health status' in {text.strip()[:80]!r}")
    return value


def _ctime(text: str) -> float:
    return float(calendar.timegm(time.strptime(" ".join(text.split()), "%a %b %d %H:%M:%S %Y")))


@dataclass(frozen=True)
class LinkStat:
    """``hccn_tool -i N -link_stat -g``: the device's clock, up count, records newest
    first as (seconds on the device clock, ``UP``/``DOWN``)."""

    current_time: float | None
    up_count: int | None
    records: tuple[tuple[float, str], ...]

    def downs_within(self, seconds: float) -> list[float]:
        if self.current_time is None:
            return [t for t, s in self.records if s == "DOWN"]
        return [t for t, s in self.records if s == "DOWN" and self.current_time - t <= seconds]


def parse_link_stat(text: str) -> LinkStat:
    """Both prefixes (``[devid 0]`` and ``[device 0]``) are accepted."""
    current = up_count = None
    records: list[tuple[float, str]] = []
    for line in text.splitlines():
        body = _PREFIX_RE.sub("", line, count=1)
        rm = _RECORD_RE.match(body)
        if rm:
            records.append((_ctime(rm.group("ts")), rm.group("state")))
            continue
        m = _KV_RE.match(body)
        if not m:
            continue
        key = m.group("key").lower()
        if key == "current time" and m.group("value"):
            current = _ctime(m.group("value"))
        elif key == "link up count" and m.group("value").isdigit():
            up_count = int(m.group("value"))
    if current is None and up_count is None and not records:
        raise ValueError(f"not hccn_tool -link_stat output: {text.strip()[:80]!r}")
    return LinkStat(current, up_count, tuple(records))


_NUM_RE = re.compile(r"^(-?\d+(?:\.\d+)?)")


def _num(value: str | None) -> float | None:
    m = _NUM_RE.match(value or "")
    return float(m.group(1)) if m else None


def parse_optical(text: str) -> dict[str, Any]:
    """``hccn_tool -i N -optical -g``: presence, loss-of-signal flags, Rx powers (mW)
    per lane and the module's Rx power thresholds."""
    kv: dict[str, str] = {}
    for line in text.splitlines():
        m = _KV_RE.match(line)
        if m and m.group("key"):
            kv[m.group("key").lower()] = m.group("value")
    if not kv:
        raise ValueError(f"not hccn_tool -optical output: {text.strip()[:80]!r}")

    def flag(key: str) -> int | None:
        v = kv.get(key)
        try:
            return int(v, 16) if v else None
        except ValueError:
            return None

    lanes = sorted(
        (int(k[len("rx power") :]), _num(v))
        for k, v in kv.items()
        if re.fullmatch(r"rx power\d", k)
    )
    return {
        "present": kv.get("present"),
        "rx_los_flag": flag("rx los flag"),
        "tx_los_flag": flag("tx los flag"),
        "rx_power_mw": [v for _i, v in lanes],
        "rx_power_low_mw": _num(kv.get("rxpower low thres")),
        "rx_power_high_mw": _num(kv.get("rxpower high thres")),
        "temperature_celsius": _num(kv.get("temperature")),
    }


# ------------------------------------------------------------------------- the reader


Runner = Callable[[Sequence[str], float], "ToolOutput"]


#: ``npu-smi info -t info-vnpu`` table columns (npu-smi's own print of them: "Vnpu ID |
#: Vgroup ID | Container ID | Status | Template Name")
_VNPU_COLUMNS = ("Vnpu ID", "Vgroup ID", "Container ID", "Status", "Template Name")
_VNPU_TOTAL_RE = re.compile(r"Total number of vnpu:\s*(\d+)", re.IGNORECASE)
#: a vNPU template: "vir" + AI cores, then "_<n>c" AI CPUs, "_<n>g" memory in GB, and
#: words such as "ndvpp"/"m" (vir02, vir04_3c_ndvpp, vir10_3c_16g; Ascend, "Virtual NPU
#: templates": the number after vir is the AI Core count, before c the AI CPU count)
_TEMPLATE_RE = re.compile(r"^vir(?P<aicore>\d+)(?:_[0-9a-z]+)*$", re.IGNORECASE)
_TEMPLATE_MEM_RE = re.compile(r"_(?P<gb>\d+)g(?:_|$)", re.IGNORECASE)


@dataclass(frozen=True)
class VnpuRow:
    """One row of ``npu-smi info -t info-vnpu``: vNPU id, vGroup id, container id (as
    printed), status (as printed: ``0``, ``1``) and template name."""

    vnpu_id: int
    vgroup_id: int | None
    container_id: str
    status: str
    template: str

    def partition(self) -> PartitionInfo:
        """The row as a :class:`PartitionInfo`: AI cores (``slices``) and memory (the
        template's ``_<n>g``, GB = 2**30 bytes as npu-smi's GB column) from the template
        name, None where the name does not say."""
        m = _TEMPLATE_RE.match(self.template)
        mem = _TEMPLATE_MEM_RE.search(self.template)
        return PartitionInfo(
            "vnpu",
            self.vnpu_id,
            profile=self.template,
            gpu_instance_id=self.vgroup_id,
            slices=int(m.group("aicore")) if m else None,
            memory_total_bytes=int(mem.group("gb")) * 2**30 if mem else None,
            # the vNPU's own device node, /dev/vdavinci<vNPU id> (what a container is
            # given for it: `docker run --device=/dev/vdavinci100`)
            device_files=[f"/dev/vdavinci{self.vnpu_id}"],
            status=self.status,
        )


def parse_vnpu(text: str) -> list[VnpuRow]:
    """The vNPUs of one chip from ``npu-smi info -t info-vnpu -i N -c C``.

    Read by the header row's names (``Vnpu ID``, ``Vgroup ID``, ``Container ID``,
    ``Status``, ``Template Name``, cells between ``|``), each following row of as many
    cells whose first is a number a vNPU. ``ValueError`` when the output has neither the
    header nor ``Total number of vnpu``, or when the rows read are not that total."""
    header: list[str] | None = None
    rows: list[VnpuRow] = []
    total = None
    for line in text.splitlines():
        m = _VNPU_TOTAL_RE.search(line)
        if m:
            total = int(m.group(1))
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if header is None:
            if "Vnpu ID" in cells and "Template Name" in cells:
                header = cells
            continue
        if len(cells) != len(header) or not cells[0].isascii() or not cells[0].isdigit():
            continue
        row = dict(zip(header, cells, strict=True))
        group = row.get("Vgroup ID", "")
        rows.append(
            VnpuRow(
                int(row["Vnpu ID"]),
                int(group) if group.isascii() and group.isdigit() else None,
                row.get("Container ID", ""),
                row.get("Status", ""),
                row.get("Template Name", ""),
            )
        )
    if header is None and total is None:
        first = text.strip().splitlines()[:1]
        raise ValueError(
            f"not an info-vnpu answer: no vNPU table ({first[0][:120]!r})"
            if first
            else "empty output"
        )
    if total is not None and total != len(rows):
        raise ValueError(f"Total number of vnpu: {total}, but {len(rows)} vNPU rows read")
    return rows


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))


@dataclass
class _ChipDetail:
    health: dict[str, Any] | None = None
    roce: dict[str, Any] | None = None
    vnpus: list[VnpuRow] | None = None
    errors: list[dict[str, str]] = field(default_factory=list)


class _OutOfTime(Exception):
    """No time left in this patrol for one more command (it would risk the collector's
    own timeout): the rest waits for the next patrol."""


class DetailReader:
    """Runs the Ascend detail commands for the collector and keeps their last answers.

    Options (``collectors.ascend``): ``detail`` (on unless set to false),
    ``detail_interval_seconds``
    (300; 0 = every patrol), ``detail_timeout_seconds`` (5, per command),
    ``detail_budget_seconds`` (5: a sweep that runs out of time goes on where it stopped
    at the next patrol), ``hccn_tool`` (argv, ``["hccn_tool"]``).
    """

    def __init__(
        self,
        options: Mapping[str, Any],
        command: Sequence[str],
        runner: Runner,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ):
        self.enabled = bool(options.get("detail", True))
        self.interval = float(options.get("detail_interval_seconds", 300))
        self.timeout = float(options.get("detail_timeout_seconds", 5))
        self.budget = float(options.get("detail_budget_seconds", 5))
        hccn = options.get("hccn_tool", ["hccn_tool"])
        self.hccn = [hccn] if isinstance(hccn, str) else [str(p) for p in hccn]
        self.npu_smi = list(command)
        self.runner = runner
        self._clock = clock
        self._wall = wall
        self._logic: dict[tuple[int, int], int] | None = None  # only a usable -m answer
        self._map_errors: list[dict[str, str]] = []
        self._map_sweep: object = object()  # sweep of the last -m try
        self._details: dict[tuple[int, int], _ChipDetail] = {}
        self._queue: list[tuple[int, int]] = []
        self._last_sweep: float | None = None
        self._absent: set[str] = set()  # command kinds with no program / no recording
        self._deadline: float | None = None

    # -- running -------------------------------------------------------------------

    def _run(self, kind: str, argv: list[str], chip: _ChipDetail) -> str | None:
        """stdout of a successful run; None (with an error on the chip) otherwise."""
        if kind in self._absent:
            return None
        if self._deadline is not None and self._clock() + self.timeout > self._deadline:
            raise _OutOfTime
        source = " ".join(argv)
        try:
            out = self.runner(argv, self.timeout)
        except FileNotFoundError:
            self._absent.add(kind)  # no hccn_tool here (310P), or not recorded
            return None
        except OSError as exc:
            chip.errors.append({"source": source, "error": str(exc)})
            return None
        if out.hung:
            chip.errors.append(
                {"source": source, "error": f"hung: killed after {self.timeout:g} s"}
            )
            return None
        if getattr(out, "truncated", False):
            chip.errors.append({"source": source, "error": "output over the size cap: killed"})
            return None
        if out.returncode != 0:
            text = (out.stdout + out.stderr).strip().splitlines()
            chip.errors.append(
                {"source": source, "error": f"exit {out.returncode}: {text[0] if text else ''}"}
            )
            return None
        return out.stdout

    def _chip_map(self) -> dict[tuple[int, int], int]:
        """Chip -> logic id from ``npu-smi info -m``; only a usable answer is kept.

        A failed, hung or unusable answer is not cached: it is tried again at the next
        sweep (once per sweep, not per chip), and its error is kept in
        :attr:`_map_errors` for :meth:`_sweep_one` to put on every chip (the RoCE checks
        did not run)."""
        if self._logic is not None:
            return self._logic
        if self._map_sweep == self._last_sweep:
            return {}  # already failed in this sweep
        self._map_sweep = self._last_sweep
        holder = _ChipDetail()
        argv = [*self.npu_smi, "-m"]
        text = self._run("map", argv, holder)
        if text is None:
            # absent (a recording without -m): nothing to report; else the run's error
            self._map_errors = [
                {"source": e["source"], "error": f"{e['error']} (RoCE checks not run)"}
                for e in holder.errors
            ]
            return {}
        chip_map = read_chip_map(text)
        logic = {(n, c): lg for n, c, lg, _name in chip_map.rows if lg is not None}
        if not logic:
            first = text.strip().splitlines()[:1]
            seen = (
                f"header {' | '.join(chip_map.columns)}"
                if chip_map.columns
                else repr(first[0][:200] if first else "empty")
            )
            why = "; ".join(chip_map.problems[:2])
            self._map_errors = [
                {
                    "source": " ".join(argv),
                    "error": "no chip with a logic id in the output (RoCE checks not "
                    f"run): {seen}{': ' + why if why else ''}",
                }
            ]
            return {}
        self._map_errors = []
        self._logic = logic
        return logic

    def _read_health(self, key: tuple[int, int], chip: _ChipDetail) -> None:
        argv = [*self.npu_smi, "-t", "health", "-i", str(key[0]), "-c", str(key[1])]
        text = self._run("health", argv, chip)
        if text is None:
            return
        try:
            h = parse_health(text)
        except ValueError as exc:
            chip.errors.append({"source": " ".join(argv), "error": str(exc)})
            return
        source = f"{' '.join(argv)}: Error Code"
        for token in h.bad_codes[:8]:  # kept, not dropped: the card has a code we cannot read
            error = f"not an 8-hex-digit error code: {token[:80]!r}"
            chip.errors.append({"source": source, "error": error})
        if len(h.bad_codes) > 8:
            error = f"{len(h.bad_codes) - 8} more tokens that are not an error code"
            chip.errors.append({"source": source, "error": error})
        chip.health = {
            "status": h.status,
            "codes": list(h.codes),
            "info": list(h.info),
            "ts": _stamp(self._wall()),
        }

    def _read_roce(self, key: tuple[int, int], logic: int, chip: _ChipDetail) -> None:
        base = [*self.hccn, "-i", str(logic)]
        entry: dict[str, Any] = {"kind": "roce", "link": logic, "state": None}
        got = False
        for kind, args, parse, name in (
            ("link", ["-link", "-g"], parse_link, "state"),
            ("net_health", ["-net_health", "-g"], parse_net_health, "net_health"),
            ("link_stat", ["-link_stat", "-g"], parse_link_stat, "link_stat"),
            ("optical", ["-optical", "-g"], parse_optical, "optical"),
        ):
            text = self._run(kind, [*base, *args], chip)
            if text is None:
                continue
            try:
                value = parse(text)
            except ValueError as exc:
                chip.errors.append({"source": " ".join([*base, *args]), "error": str(exc)})
                continue
            got = True
            if isinstance(value, LinkStat):
                entry["link_up_count"] = value.up_count
                entry["link_down_times"] = [t for t, s in value.records if s == "DOWN"]
                entry["link_stat_time"] = value.current_time
            else:
                entry[name] = value
        if got:
            entry["ts"] = _stamp(self._wall())
            chip.roce = entry

    def _read_vnpu(self, key: tuple[int, int], chip: _ChipDetail) -> None:
        argv = [*self.npu_smi, "-t", "info-vnpu", "-i", str(key[0]), "-c", str(key[1])]
        holder = _ChipDetail()
        text = self._run("info-vnpu", argv, holder)
        if text is None:
            # a chip or driver without virtualisation answers with an error: not asked
            # again in this process (the chips of a node are of one kind), never an
            # error entry on every chip of every sweep; a hung run is said
            if any("hung" in e["error"] for e in holder.errors):
                chip.errors.extend(holder.errors)
            else:
                self._absent.add("info-vnpu")
            return
        try:
            chip.vnpus = parse_vnpu(text)
        except ValueError as exc:
            chip.errors.append({"source": " ".join(argv), "error": str(exc)})

    def _sweep_one(self, key: tuple[int, int]) -> None:
        chip = _ChipDetail()
        self._read_health(key, chip)
        self._read_vnpu(key, chip)
        logic = self._chip_map().get(key)
        if self._logic is None:
            chip.errors.extend(dict(e) for e in self._map_errors)
        elif logic is None:
            # a chip the map does not list (or lists without a logic id): its RoCE port is
            # not asked, and that is said, never skipped in silence
            chip.errors.append(
                {
                    "source": " ".join([*self.npu_smi, "-m"]),
                    "error": f"NPU {key[0]} chip {key[1]} has no logic id in the map "
                    "(RoCE checks not run)",
                }
            )
        if logic is not None:
            self._read_roce(key, logic, chip)
        self._details[key] = chip

    # -- per patrol ------------------------------------------------------------------

    def attach(self, records: Sequence[CardRecord], deadline: float | None = None) -> None:
        """Run what is due (within the budget, and never starting a command that could
        end after ``deadline`` on :attr:`clock`) and put the last answers on ``records``."""
        if not self.enabled or self.interval < 0:
            return
        start = self._clock()
        self._deadline = deadline
        keys = [(r.index, r.chip if r.chip is not None else 0) for r in records]
        sick = {
            (r.index, r.chip if r.chip is not None else 0)
            for r in records
            if r.vendor_health is not None and r.vendor_health.strip().lower() != "ok"
        }
        due = self._last_sweep is None or start - self._last_sweep >= self.interval
        if due and not self._queue:
            self._queue = list(keys)
            self._last_sweep = start
        try:
            for key in sorted(sick):  # on demand: a chip that is not OK tells why at once
                if key not in self._queue and self._clock() - start < self.budget:
                    chip = self._details.setdefault(key, _ChipDetail())
                    chip.errors = [e for e in chip.errors if "-t health" not in e["source"]]
                    self._read_health(key, chip)
            while self._queue and self._clock() - start < self.budget:
                self._sweep_one(self._queue[0])
                self._queue.pop(0)
        except _OutOfTime:
            pass  # the chip at the head of the queue is read first next time
        for rec, key in zip(records, keys, strict=True):
            chip = self._details.get(key)
            if chip is None:
                continue
            if chip.health is not None:
                rec.health_detail = dict(chip.health)
            if chip.roce is not None:
                rec.links.append(dict(chip.roce))
            if chip.vnpus:
                rec.partitions = [row.partition() for row in chip.vnpus]
            for err in chip.errors:
                rec.add_error(err["source"], err["error"])


__all__ = [
    "DetailReader",
    "HealthDetail",
    "LinkStat",
    "ChipMap",
    "parse_chip_map",
    "read_chip_map",
    "parse_health",
    "parse_link",
    "parse_link_stat",
    "parse_net_health",
    "parse_optical",
    "parse_vnpu",
    "VnpuRow",
]
