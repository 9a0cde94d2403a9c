"""PCI census: every accelerator on the node's bus, read from sysfs, whatever the vendor
tools answer.

A vendor tool lists the cards its driver still manages; a GPU the driver lost, a card
whose driver never loaded, or a vendor nobody enabled is not in its answer. The census
reads the bus itself: for every function in ``/sys/bus/pci/devices/*`` the ``vendor``,
``device`` and ``class`` files, and for the accelerators among them ``numa_node``,
``current_link_speed``/``max_link_speed``, ``current_link_width``/``max_link_width``,
the ``driver`` link and ``local_cpulist`` (Linux
``Documentation/ABI/testing/sysfs-bus-pci``). Which functions are accelerators each
vendor plugin declares in its
:class:`hetpatrol.collector.VendorInfo` (``pci``: a :class:`PciCards`): a vendor id alone
is not a card (NVIDIA's NVSwitch bridges and HDMI audio functions, Huawei's Hi1822 NICs,
Hygon's and AMD's CPU host functions share their vendor's id), so a function is a card
only when its class (and, where the vendor says so, its device id) is one the plugin
lists.

A replay directory stands in for sysfs with ``lspci-Dnn-vmm.txt`` (or
``lspci_-Dnn_-vmm.txt``, the argv-named form), the output of ``lspci -Dnn -vmm -k``
(``-k`` adds ``Driver:``; ``-v`` adds ``NUMANode:``), or a ``root/sys/bus/pci/devices``
tree. Plain ``lspci -Dnn`` lines are read too. :func:`read_census` reads once;
:class:`CensusReader` re-reads at most every ``interval_seconds``.

This module reads only; the census check (:mod:`hetpatrol.checks.pci_census`) judges.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: where the kernel lists every PCI function (sysfs-bus-pci ABI)
SYSFS_PCI_DEVICES = "sys/bus/pci/devices"
#: the replay file names of ``lspci -Dnn -vmm -k`` output (the second is the argv-named
#: form :func:`hetpatrol.tool.replay_file_name` gives)
REPLAY_LSPCI_FILES = ("lspci-Dnn-vmm.txt", "lspci_-Dnn_-vmm.txt", "lspci_-Dnn_-vmm_-k.txt")
#: at most this many PCI functions are read: PCI's own bound for one domain (256 buses x
#: 32 devices x 8 functions). A real server has a few hundred; SR-IOV adds thousands
#: (8 NICs x 2 ports x 256 VFs is 4096). Past it the census is unknown, never cut (the
#: first 4096 names in order left a GPU at 0000:ff:00.0 out of a known census).
MAX_FUNCTIONS = 65536
#: most bytes of a sysfs attribute read: the kernel's own bound (a sysfs file is one
#: page); an interleaved local_cpulist of 112 CPUs ("0,2,4,...,222") is 400 bytes
MAX_ATTRIBUTE = 4096

# PCI class codes, upper 16 bits of the 24-bit class (PCI Code and ID Assignment
# Specification r1.15, sections 1.4 and 1.19; pci.ids "C 03" and "C 12"):
CLASS_VGA = 0x0300  #: display controller: VGA compatible
CLASS_3D = 0x0302  #: display controller: 3D controller
CLASS_DISPLAY_OTHER = 0x0380  #: display controller: other
CLASS_PROCESSING_ACCELERATOR = 0x1200  #: processing accelerators
#: every display and processing-accelerator class (a vendor that makes nothing else)
ACCELERATOR_CLASSES = (CLASS_VGA, CLASS_3D, CLASS_DISPLAY_OTHER, CLASS_PROCESSING_ACCELERATOR)


@dataclass(frozen=True)
class PciCards:
    """Which PCI functions of a vendor are its accelerator cards (declared by a plugin in
    :attr:`hetpatrol.collector.VendorInfo.pci`).

    - ``vendor_ids``: PCI vendor ids (``0x10de``);
    - ``classes``: class codes (upper 16 bits: base class and subclass, ``0x0302``) a
      card has; a function of another class (a bridge, an audio function, a NIC) is not
      a card;
    - ``device_types``: device id -> card type (``0x2330: "h100"``) where the vendor's
      ids are published; a card whose id is not there has card type None;
    - ``listed_only``: True when only the ids in ``device_types`` are cards (a vendor
      whose other devices share the accelerator class: Huawei's Kunpeng ZIP/SEC/HPRE
      engines are processing accelerators too).
    """

    vendor_ids: tuple[int, ...]
    classes: tuple[int, ...]
    device_types: Mapping[int, str] = field(default_factory=dict)
    listed_only: bool = False

    def card_type(self, vendor_id: int, device_id: int, class_code: int) -> tuple[bool, str | None]:
        """``(is_card, card_type)`` of one function."""
        if vendor_id not in self.vendor_ids or class_code not in self.classes:
            return False, None
        kind = self.device_types.get(device_id)
        if kind is None and self.listed_only:
            return False, None
        return True, kind


@dataclass(frozen=True)
class PciFunction:
    """One PCI function as sysfs (or ``lspci``) shows it.

    ``bus_id`` is ``dddd:bb:dd.f`` lower case; ``vendor_id``/``device_id`` 16-bit ids;
    ``class_code`` the upper 16 bits of the class; ``numa_node`` None when the kernel
    says -1 or it was not read; link speeds as sysfs writes them (``"16.0 GT/s PCIe"``),
    widths in lanes; ``driver`` the bound driver's name, None when none is bound;
    ``local_cpulist`` the CPUs near the device as sysfs writes them (``"0-31,64-95"``;
    sysfs only, None from lspci).
    """

    bus_id: str
    vendor_id: int
    device_id: int
    class_code: int
    numa_node: int | None = None
    driver: str | None = None
    current_link_speed: str | None = None
    max_link_speed: str | None = None
    current_link_width: int | None = None
    max_link_width: int | None = None
    local_cpulist: str | None = None

    @property
    def pci_id(self) -> str:
        """``vvvv:dddd`` as lspci prints it."""
        return f"{self.vendor_id:04x}:{self.device_id:04x}"


@dataclass(frozen=True)
class CensusCard:
    """A function one plugin's :class:`PciCards` says is its card."""

    function: PciFunction
    plugin: str
    card_type: str | None

    def to_dict(self) -> dict[str, Any]:
        f = self.function
        return {
            "bus_id": f.bus_id,
            "plugin": self.plugin,
            "card_type": self.card_type,
            "pci_id": f.pci_id,
            "class": f"{f.class_code:04x}",
            "numa_node": f.numa_node,
            "driver": f.driver,
            "current_link_speed": f.current_link_speed,
            "max_link_speed": f.max_link_speed,
            "current_link_width": f.current_link_width,
            "max_link_width": f.max_link_width,
        }


@dataclass(frozen=True)
class Census:
    """One read of the bus: ``functions`` (every function read), ``source`` (the sysfs
    directory or replay file), ``error`` (None when the bus was read; else why not: the
    census is then unknown, never "no card")."""

    source: str
    functions: tuple[PciFunction, ...] = ()
    error: str | None = None
    read_at: float = 0.0

    @property
    def known(self) -> bool:
        return self.error is None

    def cards(self, rules: Mapping[str, PciCards | None]) -> tuple[CensusCard, ...]:
        """The functions that are cards, each with the plugin whose rules claim it (the
        first in ``rules`` order; ``rules`` maps plugin name -> its :class:`PciCards`)."""
        out = []
        for fn in self.functions:
            for plugin, rule in rules.items():
                if rule is None:
                    continue
                is_card, kind = rule.card_type(fn.vendor_id, fn.device_id, fn.class_code)
                if is_card:
                    out.append(CensusCard(fn, plugin, kind))
                    break
        return tuple(out)


def _hex(text: str) -> int | None:
    try:
        return int(text.strip(), 16)
    except ValueError:
        return None


def _read(path: Path) -> str | None:
    try:
        with open(path, encoding="ascii", errors="replace") as fh:
            return fh.read(MAX_ATTRIBUTE).strip()
    except OSError:
        return None


def _int(text: str | None) -> int | None:
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _speed(text: str | None) -> str | None:
    # "Unknown" is what the kernel writes for a link it cannot read (pci-sysfs.c)
    return None if not text or text.lower().startswith("unknown") else text


def read_sysfs(root: Path | str = "/", vendor_ids: Iterable[int] = ()) -> Census:
    """Read every function under ``root``/sys/bus/pci/devices.

    ``vendor_ids``: the functions of these vendors get their details read (NUMA node,
    links, driver); the others only vendor, device and class (three small reads each).
    Never raises: an unreadable directory gives a :class:`Census` with ``error``; an
    unreadable file of one function leaves that function out (its id unknown) or that
    value None.
    """
    base = Path(root) / SYSFS_PCI_DEVICES
    wanted = set(vendor_ids)
    try:
        names = sorted(os.listdir(base))
    except OSError as exc:
        return Census(str(base), error=f"{base}: {exc.strerror or exc}", read_at=time.time())
    if len(names) > MAX_FUNCTIONS:
        return Census(
            str(base),
            error=f"{base}: {len(names)} entries, more than PCI's {MAX_FUNCTIONS}: not read",
            read_at=time.time(),
        )
    out: list[PciFunction] = []
    for name in names:
        d = base / name
        vendor, device, klass = (_read(d / f) for f in ("vendor", "device", "class"))
        v, dv, c = (_hex(x) if x is not None else None for x in (vendor, device, klass))
        if v is None or dv is None or c is None:
            continue
        bus_id = name.lower()
        if v not in wanted:
            out.append(PciFunction(bus_id, v, dv, c >> 8))
            continue
        numa = _int(_read(d / "numa_node"))
        try:
            driver: str | None = os.path.basename(os.readlink(d / "driver"))
        except OSError:
            driver = None
        out.append(
            PciFunction(
                bus_id,
                v,
                dv,
                c >> 8,
                numa_node=numa if numa is not None and numa >= 0 else None,
                driver=driver,
                current_link_speed=_speed(_read(d / "current_link_speed")),
                max_link_speed=_speed(_read(d / "max_link_speed")),
                current_link_width=_int(_read(d / "current_link_width")) or None,
                max_link_width=_int(_read(d / "max_link_width")) or None,
                local_cpulist=_read(d / "local_cpulist") or None,
            )
        )
    return Census(str(base), tuple(out), read_at=time.time())


# `lspci -nn` prints names with the id in brackets at the end: "3D controller [0302]",
# "NVIDIA Corporation [10de]" (lspci(8): -nn "show PCI vendor and device codes as both
# numbers and names"; -vmm "machine readable", "Tag:<TAB>value" records split by a
# blank line; -D "always show domain numbers").
_TRAILING_ID = re.compile(r"\[([0-9a-fA-F]{4})\]\s*$")
_LINE_FORM = re.compile(
    r"^(?P<slot>(?:[0-9a-fA-F]{4,8}:)?[0-9a-fA-F]{2}:[0-9a-fA-F]{2}\.[0-7])\s+"
    r".*?\[(?P<class>[0-9a-fA-F]{4})\]:\s.*\[(?P<vendor>[0-9a-fA-F]{4}):(?P<device>[0-9a-fA-F]{4})\]"
)


def _bus(slot: str) -> str:
    parts = slot.strip().lower().split(":")
    if len(parts) == 2:
        parts.insert(0, "0000")
    parts[0] = parts[0][-4:].rjust(4, "0")
    return ":".join(parts)


def parse_lspci(text: str) -> tuple[list[PciFunction], list[str]]:
    """``(functions, problems)`` of ``lspci -Dnn -vmm [-k] [-v]`` output, or of plain
    ``lspci -Dnn`` lines. A record without a readable slot, class, vendor or device id
    is left out and named in ``problems``."""
    functions: list[PciFunction] = []
    problems: list[str] = []
    if "Slot:" not in text:
        for line in text.splitlines():
            m = _LINE_FORM.match(line.strip())
            if m:
                functions.append(
                    PciFunction(
                        _bus(m["slot"]),
                        int(m["vendor"], 16),
                        int(m["device"], 16),
                        int(m["class"], 16),
                    )
                )
        return functions, problems
    for block in re.split(r"\n\s*\n", text):
        tags: dict[str, str] = {}
        for line in block.splitlines():
            key, sep, value = line.partition(":")
            if sep and key.strip() and key.strip() not in tags:
                tags[key.strip()] = value.strip()
        if not tags:
            continue
        slot = tags.get("Slot")
        ids = []
        for key in ("Class", "Vendor", "Device"):
            m = _TRAILING_ID.search(tags.get(key, ""))
            ids.append(int(m.group(1), 16) if m else None)
        if not slot or None in ids:
            problems.append(f"record {slot or '(no Slot)'}: no Class/Vendor/Device id")
            continue
        klass, vendor, device = ids
        numa = _int(tags.get("NUMANode"))
        functions.append(
            PciFunction(
                _bus(slot),
                vendor,  # type: ignore[arg-type]
                device,  # type: ignore[arg-type]
                klass,  # type: ignore[arg-type]
                numa_node=numa if numa is not None and numa >= 0 else None,
                driver=tags.get("Driver") or None,
            )
        )
    return functions, problems


def replay_source(directory: Path) -> Path | None:
    """The census recording of a replay directory (an lspci file or a ``root`` sysfs
    tree), None when it has none."""
    for name in REPLAY_LSPCI_FILES:
        if (directory / name).is_file():
            return directory / name
    if (directory / "root" / SYSFS_PCI_DEVICES).is_dir():
        return directory / "root"
    return None


def read_census(
    root: Path | str = "/", *, replay_dir: Path | None = None, vendor_ids: Iterable[int] = ()
) -> Census:
    """One census: of sysfs under ``root``, or of the replay directory's recording (a
    replay without one gives a census with ``error``: unknown, never "no card")."""
    if replay_dir is None:
        return read_sysfs(root, vendor_ids)
    src = replay_source(Path(replay_dir))
    if src is None:
        return Census(
            str(replay_dir),
            error=f"{replay_dir} has no PCI census "
            f"({REPLAY_LSPCI_FILES[0]} or root/{SYSFS_PCI_DEVICES})",
            read_at=time.time(),
        )
    if src.name == "root":
        return read_sysfs(src, vendor_ids)
    try:
        text = src.read_text(encoding="utf-8", errors="replace")
    except OSError as exc:
        return Census(str(src), error=f"{src}: {exc.strerror or exc}", read_at=time.time())
    functions, problems = parse_lspci(text)
    if not functions:
        why = "; ".join(problems[:3]) or "no PCI function in it"
        return Census(str(src), error=f"{src}: {why}", read_at=time.time())
    return Census(str(src), tuple(functions), read_at=time.time())


class CensusReader:
    """The census, re-read at most every ``interval_seconds`` (a replay: once).

    The bus changes rarely (a hot-plug, a driver bound or unbound, a link retrained), and
    one read is a few hundred small sysfs reads: once a minute keeps a card that fell
    off or lost its driver visible within a minute at well under a millisecond a patrol.
    """

    def __init__(
        self,
        root: Path | str = "/",
        *,
        replay_dir: Path | None = None,
        interval_seconds: float = 60.0,
        vendor_ids: Iterable[int] = (),
        clock: Callable[[], float] = time.monotonic,
    ):
        self.root = root
        self.replay_dir = replay_dir
        self.interval_seconds = interval_seconds
        self.vendor_ids = tuple(vendor_ids)
        self.clock = clock
        self._census: Census | None = None
        self._at = 0.0
        #: how many times the bus was read (tests, the benchmark)
        self.reads = 0

    def get(self) -> Census:
        now = self.clock()
        if self._census is not None and (
            self.replay_dir is not None or now - self._at < self.interval_seconds
        ):
            return self._census
        self._census = read_census(
            self.root, replay_dir=self.replay_dir, vendor_ids=self.vendor_ids
        )
        self._at = now
        self.reads += 1
        return self._census


__all__ = [
    "ACCELERATOR_CLASSES",
    "CLASS_3D",
    "CLASS_DISPLAY_OTHER",
    "CLASS_PROCESSING_ACCELERATOR",
    "CLASS_VGA",
    "Census",
    "CensusCard",
    "CensusReader",
    "PciCards",
    "PciFunction",
    "parse_lspci",
    "read_census",
    "read_sysfs",
]
