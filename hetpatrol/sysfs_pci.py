"""Where a card sits on the host, from sysfs: its NUMA node, the CPUs local to it, its DRM
render node, and the CPUs' cores as Slurm numbers them.

The one place hetpatrol reads per-PCI-function placement from sysfs (a fuller PCI census
can join it here). Every path is under ``root`` (``/`` on a node; a replay's ``root/``
tree, see docs/testing.md), so a test can build the tree. Files read (Linux
``Documentation/ABI/testing/sysfs-bus-pci`` and ``sysfs-devices-system-cpu``):

- ``sys/bus/pci/devices/<bus id>/numa_node``: the NUMA node, ``-1`` when the firmware
  names none;
- ``sys/bus/pci/devices/<bus id>/local_cpulist``: the CPUs of that node (``0-23,48-71``);
- ``sys/bus/pci/devices/<bus id>/drm/renderD<N>``: the function's DRM render node;
- ``sys/devices/system/cpu/cpu<N>/topology/{physical_package_id,core_id}``.

Nothing here raises for a missing or garbled file: the value is None and ``error`` says
which file and why (a card whose placement cannot be read is said, never guessed).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

#: at most this much of one sysfs attribute is read (they are one short line)
_MAX_READ = 4096
#: a cpulist naming more CPUs than this is refused as garbled
_MAX_CPUS = 65536
_RENDER_RE = re.compile(r"renderD([0-9]+)")


@dataclass(frozen=True)
class PciPlace:
    """Placement of one PCI function (``bus_id`` as ``0000:18:00.0``).

    ``numa_node``: the node number, None when sysfs says ``-1`` or could not be read;
    ``local_cpus``: OS CPU numbers, sorted, None when unread; ``render_minor``: N of
    ``/dev/dri/renderD<N>``, None when the function has none; ``error``: why a value is
    None (the first file that could not be read), else None.
    """

    bus_id: str
    numa_node: int | None = None
    local_cpus: tuple[int, ...] | None = None
    render_minor: int | None = None
    error: str | None = None


def _read(path: Path) -> str:
    with open(path, "rb") as handle:
        return handle.read(_MAX_READ).decode("ascii", "replace").strip()


def parse_cpulist(text: str) -> tuple[int, ...]:
    """``"0-3,8,10-11"`` -> ``(0, 1, 2, 3, 8, 10, 11)``. ``ValueError`` naming the text when
    it is not a cpulist (the kernel's ``%*pbl`` format) or names more than 65,536 CPUs."""
    cpus: set[int] = set()
    if not text:
        return ()
    for part in text.split(","):
        lo, sep, hi = part.partition("-")
        if not lo.isdigit() or (sep and not hi.isdigit()):
            raise ValueError(f"not a cpulist: {text[:80]!r}")
        first, last = int(lo), int(hi) if sep else int(lo)
        if last < first or last - first + len(cpus) >= _MAX_CPUS:
            raise ValueError(f"not a cpulist: {text[:80]!r}")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def read_place(root: str | Path, bus_id: str) -> PciPlace:
    """The placement of ``bus_id`` under ``root`` (see the module doc for the files)."""
    base = Path(root) / "sys" / "bus" / "pci" / "devices" / bus_id
    if not base.is_dir():
        return PciPlace(bus_id, error=f"{base}: no such PCI function in sysfs")
    numa = cpus = render = None
    errors = []
    try:
        value = int(_read(base / "numa_node"))
        numa = value if value >= 0 else None
        if value < 0:
            errors.append(f"{base / 'numa_node'}: -1 (the firmware names no NUMA node)")
    except (OSError, ValueError) as exc:
        errors.append(f"{base / 'numa_node'}: {_why(exc)}")
    try:
        cpus = parse_cpulist(_read(base / "local_cpulist"))
    except (OSError, ValueError) as exc:
        errors.append(f"{base / 'local_cpulist'}: {_why(exc)}")
    try:
        names = sorted(p.name for p in (base / "drm").iterdir())
    except OSError:
        names = []
    for name in names:
        m = _RENDER_RE.fullmatch(name)
        if m:
            render = int(m.group(1))
            break
    return PciPlace(bus_id, numa, cpus, render, errors[0] if errors else None)


def _why(exc: BaseException) -> str:
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return str(exc)


def read_cpu_cores(root: str | Path) -> dict[int, tuple[int, int]]:
    """OS CPU number -> (``physical_package_id``, ``core_id``), for every CPU whose
    topology could be read (an empty dict when none)."""
    out: dict[int, tuple[int, int]] = {}
    base = Path(root) / "sys" / "devices" / "system" / "cpu"
    try:
        entries = list(base.iterdir())
    except OSError:
        return out
    for entry in entries:
        m = re.fullmatch(r"cpu([0-9]+)", entry.name)
        if not m:
            continue
        try:
            package = int(_read(entry / "topology" / "physical_package_id"))
            core = int(_read(entry / "topology" / "core_id"))
        except (OSError, ValueError):
            continue
        out[int(m.group(1))] = (package, core)
    return out


def slurm_cores(cpus: tuple[int, ...], topology: dict[int, tuple[int, int]]) -> tuple[int, ...]:
    """The logical core indices Slurm's ``gres.conf`` ``Cores=`` wants for ``cpus``.

    gres.conf(5), Cores: "a logical core index must be specified instead of the physical
    core index ... Core 0 will be the first core on the first socket, while core 1 will
    be the second core on the first socket" (hwloc's ``Core L#``). Cores are numbered
    here in (package, core_id) order over every CPU ``topology`` knows; hyperthreads of
    one core give one index. ``ValueError`` when a CPU of ``cpus`` is not in
    ``topology``."""
    order = {pc: i for i, pc in enumerate(sorted(set(topology.values())))}
    missing = [c for c in cpus if c not in topology]
    if missing:
        raise ValueError(f"cpu{missing[0]}: no topology in sysfs")
    return tuple(sorted({order[topology[c]] for c in cpus}))


def format_ranges(numbers: tuple[int, ...] | list[int]) -> str:
    """``(0, 1, 2, 5)`` -> ``"0-2,5"`` (the cpulist / Slurm range form)."""
    parts: list[str] = []
    items = sorted(set(numbers))
    i = 0
    while i < len(items):
        j = i
        while j + 1 < len(items) and items[j + 1] == items[j] + 1:
            j += 1
        parts.append(str(items[i]) if i == j else f"{items[i]}-{items[j]}")
        i = j + 1
    return ",".join(parts)
