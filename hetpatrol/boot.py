"""Which boot a patrol runs in: the kernel's boot id and boot time, and the patrols since.

Read every patrol (two small files, no tool): ``/proc/sys/kernel/random/boot_id`` (proc(5):
"a random UUID ... generated anew at each boot") and the ``btime`` line of ``/proc/stat``
(proc(5): "btime ... boot time, in seconds since the Epoch"). A replay directory stands in
for ``/`` (``<replay>/proc/sys/kernel/random/boot_id``, ``<replay>/proc/stat``), so a
scenario says "boot N" by giving each boot its own directory with its own boot id; a
replay without them has no boot (``boot_id`` null, said in ``error``), as a host whose
``/proc`` cannot be read.

:class:`BootWatch` counts the patrols of the current boot (the post-boot grace of the
interconnect checks is counted on it) and keeps, per card identity, the link count of the
first healthy patrol after boot (the expected links of a card class whose profile gives
none), and, per PCI bus id, the patrols in a row its tool did not list a card the bus
holds (``unlisted_patrols``, counted by :mod:`hetpatrol.checks.pci_census`); per card
identity, the cards its collector listed before and no longer lists, with the patrols in
a row it has not (``missing_cards``, the ``card_missing`` count of
:mod:`hetpatrol.patrol`); and per PCI bus id the kernel log's events of this boot that say
the card there left the bus (``off_bus``: XID 79...). All start again when the boot id
changes (a card's count never crosses a reboot); a daemon
restarted within one boot goes on from the state file (:meth:`BootWatch.restore`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BOOT_ID_FILE = "proc/sys/kernel/random/boot_id"
STAT_FILE = "proc/stat"
#: most bytes read of /proc/stat (the btime line is near its top; a 1024-CPU host has
#: 1025 cpu lines of ~100 bytes before it)
STAT_READ_MAX = 256 * 1024
#: most links of one kind a card may have learned (the ``nvlink.expected_links`` bound)
MAX_LINKS = 64
#: most cards whose learned links a state file may give back
MAX_CARDS = 4096


@dataclass(frozen=True)
class BootInfo:
    """This boot as read: ``boot_id`` (the kernel's UUID text, lower case), ``boot_time``
    (seconds since the epoch, ``btime`` of ``/proc/stat``), each None when it could not
    be read, with ``error`` saying why."""

    boot_id: str | None = None
    boot_time: float | None = None
    error: str | None = None


def read_boot(root: Path | str = "/") -> BootInfo:
    """The boot id and boot time under ``root`` (``/`` or a replay directory). Never
    raises: what cannot be read is None, with the reason in ``error``."""
    root = Path(root)
    errors = []
    boot_id = None
    try:
        with open(root / BOOT_ID_FILE, encoding="ascii", errors="replace") as f:
            text = f.read(64).strip().lower()
        if len(text) == 36 and all(c in "0123456789abcdef-" for c in text):
            boot_id = text
        else:
            errors.append(f"{root / BOOT_ID_FILE}: not a boot id: {text[:40]!r}")
    except OSError as exc:
        errors.append(f"{root / BOOT_ID_FILE}: {exc.strerror or exc}")
    boot_time = None
    try:
        with open(root / STAT_FILE, encoding="ascii", errors="replace") as f:
            for line in f.read(STAT_READ_MAX).splitlines():
                if line.startswith("btime "):
                    boot_time = float(int(line.split()[1]))
                    break
            else:
                errors.append(f"{root / STAT_FILE}: no btime line")
    except (OSError, ValueError, IndexError) as exc:
        errors.append(f"{root / STAT_FILE}: {getattr(exc, 'strerror', None) or exc}")
    return BootInfo(boot_id, boot_time, "; ".join(errors) or None)


@dataclass
class BootWatch:
    """Patrols of the current boot and the link counts learned in it (see the module
    docstring). ``patrols`` is 1 in the first patrol of a boot."""

    boot_id: str | None = None
    boot_time: float | None = None
    patrols: int = 0
    #: card identity -> {link kind: links up in the first healthy patrol of this boot}
    learned_links: dict[str, dict[str, int]] = field(default_factory=dict)
    #: PCI bus id -> patrols in a row its tool did not list the card there (the
    #: ``pci_unwatched`` count of :mod:`hetpatrol.checks.pci_census`)
    unlisted_patrols: dict[str, int] = field(default_factory=dict)
    #: card key (:func:`hetpatrol.patrol.missing_key`) -> the card its collector no
    #: longer lists: ``collector``, ``vendor``, ``index``, ``chip``, ``uuid``,
    #: ``serial``, ``bus_id``, ``gres`` as last listed and ``patrols`` in a row not
    #: listed (the ``card_missing`` count); only the cards gone in the last patrol
    missing_cards: dict[str, dict[str, Any]] = field(default_factory=dict)
    #: PCI bus id -> what the kernel log said of it in this boot that means the card
    #: left the bus (``"xid 79"``, ``"kernel_fault fallen_off_bus"``; at most
    #: :data:`MAX_OFF_BUS` bus ids)
    off_bus: dict[str, str] = field(default_factory=dict)
    error: str | None = None

    def note(self, info: BootInfo) -> int:
        """Count one patrol in the boot ``info`` names; a new boot id starts the count
        (and the learned links) again. A boot that cannot be read counts on as the last
        one read. Returns the patrols of this boot so far."""
        self.error = info.error
        if info.boot_id is not None and info.boot_id != self.boot_id:
            self.boot_id = info.boot_id
            self.patrols = 0
            self.learned_links = {}
            self.unlisted_patrols = {}
            self.missing_cards = {}
            self.off_bus = {}
        if info.boot_time is not None:
            self.boot_time = info.boot_time
        self.patrols += 1
        return self.patrols

    def summary(self) -> dict[str, Any]:
        """The ``boot`` object of the patrol line and the state file: ``boot_id``,
        ``boot_time`` (epoch seconds), ``patrols`` (of this boot), ``error``,
        ``learned_links`` (card identity -> {link kind: links up}) and
        ``unlisted_patrols`` (bus id -> patrols in a row its tool did not list it; only
        the bus ids unlisted in the last patrol, so no more than the census's cards),
        ``missing_cards`` (card key -> the card gone from its collector's list and
        ``patrols``, the patrols in a row; only the cards gone in the last patrol) and
        ``off_bus`` (bus id -> the kernel-log event of this boot that says its card left
        the bus)."""
        return {
            "boot_id": self.boot_id,
            "boot_time": self.boot_time,
            "patrols": self.patrols,
            "error": self.error,
            "learned_links": {k: dict(v) for k, v in sorted(self.learned_links.items())},
            "unlisted_patrols": dict(sorted(self.unlisted_patrols.items())),
            "missing_cards": {k: dict(v) for k, v in sorted(self.missing_cards.items())},
            "off_bus": dict(sorted(self.off_bus.items())),
        }

    def restore(self, doc: Any, info: BootInfo, streaks: bool = True) -> None:
        """Go on from a state file's ``boot`` object when it names the boot ``info``
        reads now (a daemon restarted within the boot); another boot, or a damaged
        object, leaves the counts at 0 (a damaged ``unlisted_patrols`` or
        ``missing_cards`` entry is left out: that card counts from 0 again).
        ``streaks`` False (the state file's verdict is stale: no daemon patrolled for
        longer than ``check`` allows) leaves out the patrols-in-a-row counts
        (``unlisted_patrols``; ``missing_cards`` keeps its cards, each at 0 patrols): a
        count frozen hours ago and this run's first patrol are no patrols in a row."""
        if not isinstance(doc, dict) or info.boot_id is None:
            return
        if doc.get("boot_id") != info.boot_id:
            return
        patrols = doc.get("patrols")
        if isinstance(patrols, int) and not isinstance(patrols, bool) and patrols >= 0:
            self.boot_id = info.boot_id
            self.patrols = patrols
        learned = doc.get("learned_links")
        if isinstance(learned, dict):
            # only counts a card can have (1..MAX_LINKS, no bool): a damaged or edited
            # file's 10**6 would be the links a healthy card must have up
            kept = {
                str(k): {
                    str(kind): n
                    for kind, n in v.items()
                    if type(n) is int and 0 < n <= MAX_LINKS  # type(): a bool is no count
                }
                for k, v in list(learned.items())[:MAX_CARDS]
                if isinstance(v, dict)
            }
            self.learned_links = {k: v for k, v in kept.items() if v}
        unlisted = doc.get("unlisted_patrols") if streaks else None
        if isinstance(unlisted, dict):
            self.unlisted_patrols = {
                str(bus): n
                for bus, n in unlisted.items()
                if isinstance(n, int) and not isinstance(n, bool) and n > 0
            }
        missing = doc.get("missing_cards")
        if isinstance(missing, dict):
            self.missing_cards = {
                str(key): dict(entry) for key, entry in missing.items() if _missing_entry(entry)
            }
            if not streaks:  # the cards gone are still known: each counts from 0 again
                for entry in self.missing_cards.values():
                    entry["patrols"] = 0
                    entry.pop("severity", None)
        off_bus = doc.get("off_bus")
        if isinstance(off_bus, dict):
            self.off_bus = {
                str(bus): what
                for bus, what in list(off_bus.items())[:MAX_OFF_BUS]
                if isinstance(what, str)
            }

    def note_off_bus(self, bus_id: str, what: str) -> None:
        """Keep that the kernel log said, in this boot, the card at ``bus_id`` left the
        bus (the first such event of each bus id; at most :data:`MAX_OFF_BUS` bus ids, a
        flood of others is not kept)."""
        if bus_id in self.off_bus or len(self.off_bus) >= MAX_OFF_BUS:
            return
        self.off_bus[bus_id] = what


#: most bus ids :attr:`BootWatch.off_bus` keeps (a node has a few dozen GPUs at most; a
#: garbled or forged log naming thousands must not grow the state file)
MAX_OFF_BUS = 64


def _missing_entry(entry: Any) -> bool:
    """Whether a state file's ``missing_cards`` entry is whole: a ``collector`` and
    ``vendor`` name, ``patrols`` a positive integer, identity values text or null."""
    if not isinstance(entry, dict):
        return False
    n = entry.get("patrols")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        return False
    if not all(isinstance(entry.get(k), str) and entry.get(k) for k in ("collector", "vendor")):
        return False
    index, chip = entry.get("index"), entry.get("chip")
    if not isinstance(index, int) or isinstance(index, bool):
        return False
    if chip is not None and (not isinstance(chip, int) or isinstance(chip, bool)):
        return False
    return all(
        entry.get(k) is None or isinstance(entry.get(k), str)
        for k in ("uuid", "serial", "bus_id", "gres")
    )


def learn_links(watch: BootWatch, identity: str, links: list[dict[str, Any]]) -> None:
    """Keep, for ``identity``, the links up per kind when every listed link of that kind
    is up (the card's first healthy patrol of this boot); a kind learned is kept for
    the boot."""
    by_kind: dict[str, list[str | None]] = {}
    for link in links:
        kind = link.get("kind")
        if isinstance(kind, str):
            by_kind.setdefault(kind, []).append(link.get("state"))
    known = watch.learned_links.get(identity, {})
    for kind, states in by_kind.items():
        if kind not in known and states and all(s == "up" for s in states):
            watch.learned_links.setdefault(identity, {})[kind] = len(states)
