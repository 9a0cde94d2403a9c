"""Interconnect: the PCIe link, NVLink and the Ascend RoCE port.

Judges ``pcie_link_*`` of a busy card (``pcie_downtrained``), the ``links`` of kind
``nvlink`` (``nvlink_down``, ``nvlink_errors``: DL error counters) and of kind ``roce``
(``roce_link_down``, ``roce_net_health``, ``roce_link_flaps`` within a window,
``roce_optical``: Rx LOS or Rx power below the module's low alarm), whichever vendor's
plugin wrote them.

Config section (each profile and ``defaults``): ``pcie_downtrained`` (severity),
``busy_utilization_ratio`` (shared with :mod:`hetpatrol.checks.clocks`), ``nvlink:
{link_down, errors_total: {warning, critical}, expected_links}``, ``roce: {link_down,
net_health, link_flaps: {warning, critical}, flap_window_seconds, optical,
expected_links}``, ``post_boot_grace_patrols``.

Links a card class has: ``nvlink.expected_links`` of its profile (0: a PCIe board with no
NVLink, which never gets an NVLink finding, whatever NVML answers), else the links up in
the card's first healthy patrol of this boot (:class:`hetpatrol.checks.facts.BootFacts`),
else the links NVML lists (a GPU answering NotSupported lists none: no finding). Fewer
links up than expected is ``nvlink_down`` (links listed down, and links no longer listed).

RoCE ports likewise: ``roce.expected_links`` of the profile (0: a card class without a
RoCE port, which never gets a RoCE finding), else the ports up in the card's first
healthy patrol of this boot (the Ascend plugin lists one port per chip, ``hccn_tool -i
<logic id>``), else the ports listed now. A port listed DOWN is ``roce_link_down`` as
before; a port no longer listed (every ``hccn_tool`` read of the chip failed: the
record's errors say why) is ``roce_link_down`` too, naming how many are missing.

Post-boot grace (``post_boot_grace_patrols``, per card class): links train after a boot
and the fabric manager starts late, so in the first N patrols of a boot a link-down
finding (``nvlink_down``, ``roce_link_down``) is at most ``warning`` ("post-boot grace k of
N" in its message); from patrol N+1 on it takes its configured severity. Motivation:
NVIDIA/NVSentinel issue #1701 (214 of 288 GB200 NVL72 nodes reported
``DCGM_FR_NVLINK_DOWN`` fatal after planned reboots, none faulty: "NVLink links are
briefly down after every node boot while they train"; the request is "N consecutive
polls" before publishing).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hetpatrol.checks.facts import BootFacts, CardFacts
from hetpatrol.config_file import LEVELS_SCHEMA, SEVERITY_OR_OFF, check_levels, merge_levels
from hetpatrol.schema import HEALTH_CRITICAL, HEALTH_WARNING, CardRecord, Finding, Levels

NAME = "interconnect"
#: ``net_health`` answers that mean healthy ("Init": a port never probed).
NET_HEALTH_OK = ("success", "init")
#: the link findings the post-boot grace holds below critical
GRACE_CHECKS = frozenset({"nvlink_down", "roce_link_down"})

PROFILE_SCHEMA: dict[str, Any] = {
    "busy_utilization_ratio": {"type": "number", "minimum": 0, "maximum": 1},
    "pcie_downtrained": SEVERITY_OR_OFF,
    "nvlink": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "link_down": SEVERITY_OR_OFF,
            "errors_total": LEVELS_SCHEMA,
            "expected_links": {"type": ["integer", "null"], "minimum": 0, "maximum": 64},
        },
    },
    "post_boot_grace_patrols": {"type": "integer", "minimum": 0, "maximum": 10000},
    "roce": {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "link_down": SEVERITY_OR_OFF,
            "net_health": SEVERITY_OR_OFF,
            "link_flaps": LEVELS_SCHEMA,
            "flap_window_seconds": {"type": "number", "exclusiveMinimum": 0},
            "optical": SEVERITY_OR_OFF,
            "expected_links": {"type": ["integer", "null"], "minimum": 0, "maximum": 64},
        },
    },
}


@dataclass(frozen=True)
class InterconnectSettings:
    """The interconnect settings of one profile (defaults merged in)."""

    busy_utilization_ratio: float = 0.5
    pcie_downtrained: str | None = HEALTH_WARNING
    nvlink_link_down: str | None = HEALTH_WARNING
    nvlink_errors_total: Levels = Levels(warning=100, critical=None)
    roce_link_down: str | None = HEALTH_CRITICAL
    roce_net_health: str | None = HEALTH_WARNING
    roce_link_flaps: Levels = Levels(warning=1, critical=None)
    roce_flap_window_seconds: float = 86400.0
    roce_optical: str | None = HEALTH_WARNING
    #: NVLink links of this card class (None: learned, see the module docstring; 0: none)
    nvlink_expected_links: int | None = None
    #: RoCE ports of this card class (None: learned, see the module docstring; 0: none)
    roce_expected_links: int | None = None
    #: patrols after a boot in which a link-down finding stays below critical
    post_boot_grace_patrols: int = 6


def build_profile(
    defaults: Mapping[str, Any], profile: Mapping[str, Any] | None, where: tuple
) -> InterconnectSettings:
    """Settings of a profile: built-in < ``defaults`` < the profile. ``SettingError`` for
    a warning level above the critical one (as written, then as merged)."""
    kw: dict[str, Any] = {}
    base = InterconnectSettings()
    for section in (defaults or {}, profile or {}):
        if "busy_utilization_ratio" in section:
            kw["busy_utilization_ratio"] = float(section["busy_utilization_ratio"])
        if "pcie_downtrained" in section:
            kw["pcie_downtrained"] = section["pcie_downtrained"]
        nv = section.get("nvlink") or {}
        if "link_down" in nv:
            kw["nvlink_link_down"] = nv["link_down"]
        if "expected_links" in nv:
            kw["nvlink_expected_links"] = nv["expected_links"]
        if "post_boot_grace_patrols" in section:
            kw["post_boot_grace_patrols"] = int(section["post_boot_grace_patrols"])
        if "errors_total" in nv:
            kw["nvlink_errors_total"] = merge_levels(
                nv["errors_total"], kw.get("nvlink_errors_total", base.nvlink_errors_total)
            )
        roce = section.get("roce") or {}
        for key in ("link_down", "net_health", "optical", "expected_links"):
            if key in roce:
                kw[f"roce_{key}"] = roce[key]
        if "link_flaps" in roce:
            kw["roce_link_flaps"] = merge_levels(
                roce["link_flaps"], kw.get("roce_link_flaps", base.roce_link_flaps)
            )
        if "flap_window_seconds" in roce:
            kw["roce_flap_window_seconds"] = float(roce["flap_window_seconds"])
    out = InterconnectSettings(**kw)
    written = profile if profile is not None else defaults or {}
    for group, key in (("nvlink", "errors_total"), ("roce", "link_flaps")):
        levels = getattr(out, f"{group}_{key}")
        check_levels(((written.get(group) or {}).get(key)), levels, (*where, group, key))
    return out


def _pcie_findings(record: CardRecord, th: InterconnectSettings) -> list[Finding]:
    if th.pcie_downtrained is None or record.utilization_ratio is None:
        return []
    if record.utilization_ratio < th.busy_utilization_ratio:
        return []  # idle links drop speed to save power: only a busy card is judged
    gen, gen_max = record.pcie_link_gen, record.pcie_link_gen_max
    width, width_max = record.pcie_link_width, record.pcie_link_width_max
    parts = []
    if gen is not None and gen_max is not None and gen < gen_max:
        parts.append(f"generation {gen} < {gen_max}")
    if width is not None and width_max is not None and width < width_max:
        parts.append(f"width x{width} < x{width_max}")
    if not parts:
        return []
    return [
        Finding(
            "pcie_downtrained",
            th.pcie_downtrained,
            "PCIe link " + ", ".join(parts) + f" at {record.utilization_ratio * 100:.0f}% "
            "utilization: reseat the card or check the riser/slot",
            value={"gen": record.pcie_link_gen, "width": record.pcie_link_width},
            threshold={"gen": record.pcie_link_gen_max, "width": record.pcie_link_width_max},
        )
    ]


def expected_links(
    record: CardRecord, kind: str, profile: int | None, boot: BootFacts, tool: str
) -> tuple[int, str]:
    """(links of ``kind`` the card should have up, where that number comes from): the
    profile's ``expected_links`` (``profile``), the first healthy patrol of this boot,
    or the links ``tool`` lists now."""
    if profile is not None:
        return profile, "its profile"
    learned = boot.learned_links.get(kind)
    listed = sum(1 for lk in record.links if lk.get("kind") == kind)
    if learned is not None and learned > listed:
        return learned, "its first healthy patrol of this boot"
    return listed, tool


def _nvlink_findings(
    record: CardRecord, th: InterconnectSettings, boot: BootFacts | None = None
) -> list[Finding]:
    boot = boot or BootFacts()
    if th.nvlink_expected_links == 0:
        return []  # a PCIe board: no NVLink to be down (NVSentinel PR #1481)
    links = [lk for lk in record.links if lk.get("kind") == "nvlink"]
    expected, source = expected_links(record, "nvlink", th.nvlink_expected_links, boot, "NVML")
    if not links and not expected:
        return []
    out = []
    down = [lk["link"] for lk in links if lk.get("state") == "down"]
    up = sum(1 for lk in links if lk.get("state") == "up")
    unknown = len(links) - up - len(down)
    unlisted = max(0, expected - len(links))
    if up + unknown < expected and th.nvlink_link_down is not None:
        parts = []
        if down:
            parts.append(f"link(s) {', '.join(map(str, down))} down")
        if unlisted:
            parts.append(f"{unlisted} link(s) not listed")
        out.append(
            Finding(
                "nvlink_down",
                th.nvlink_link_down,
                f"NVLink {up} of {expected} links up (expected from {source}): "
                + "; ".join(parts)
                + ": check the NVSwitch / fabric manager, reset the GPU",
                value=down,
                threshold=expected,
            )
        )
    total = sum(sum((lk.get("counters") or {}).values()) for lk in links)
    severity = th.nvlink_errors_total.severity(total)
    if severity is not None:
        level = (
            th.nvlink_errors_total.critical
            if severity == HEALTH_CRITICAL
            else th.nvlink_errors_total.warning
        )
        worst_link = max(links, key=lambda lk: sum((lk.get("counters") or {}).values()))
        counts = ", ".join(f"{k} {v}" for k, v in (worst_link.get("counters") or {}).items())
        out.append(
            Finding(
                "nvlink_errors",
                severity,
                f"{total} NVLink DL errors since driver load (most on link "
                f"{worst_link['link']}: {counts})",
                value=total,
                threshold=level,
            )
        )
    return out


def _roce_missing(record: CardRecord, th: InterconnectSettings, boot: BootFacts) -> list[Finding]:
    """``roce_link_down`` for ports no longer listed: fewer listed than expected."""
    if not record.read_ok or th.roce_link_down is None:
        return []
    ports = [lk for lk in record.links if lk.get("kind") == "roce"]
    expected, source = expected_links(record, "roce", th.roce_expected_links, boot, "hccn_tool")
    missing = expected - len(ports)
    if missing <= 0:
        return []
    up = sum(1 for lk in ports if lk.get("state") == "up")
    why = "; ".join(
        f"{e['source']}: {e['error']}" for e in record.errors if "hccn_tool" in e["source"]
    )
    return [
        Finding(
            "roce_link_down",
            th.roce_link_down,
            f"RoCE {up} of {expected} port(s) up (expected from {source}): {missing} "
            "port(s) no longer listed by hccn_tool"
            + (f" ({why[:200]})" if why else "")
            + ": check the NPU's network port, its driver and hccn_tool",
            value={"listed": len(ports), "up": up},
            threshold=expected,
        )
    ]


def _roce_findings(
    record: CardRecord, th: InterconnectSettings, boot: BootFacts | None = None
) -> list[Finding]:
    boot = boot or BootFacts()
    if th.roce_expected_links == 0:
        return []  # a card class without a RoCE port
    out: list[Finding] = _roce_missing(record, th, boot)
    for link in record.links:
        if link.get("kind") != "roce":
            continue
        port = f"RoCE port {link.get('link')}"
        if link.get("state") == "down" and th.roce_link_down is not None:
            out.append(
                Finding(
                    "roce_link_down",
                    th.roce_link_down,
                    f"{port} link is DOWN (hccn_tool -link): check the cable, optical module "
                    "and switch port",
                    value="down",
                )
            )
        health = link.get("net_health")
        if health and health.strip().lower() not in NET_HEALTH_OK and th.roce_net_health:
            out.append(
                Finding(
                    "roce_net_health",
                    th.roce_net_health,
                    f"{port} net health is {health!r} (Success or Init expected): the "
                    "detection IP does not answer",
                    value=health,
                )
            )
        downs = link.get("link_down_times") or []
        if downs:
            now = link.get("link_stat_time")
            window = th.roce_flap_window_seconds
            recent = [t for t in downs if now is None or now - t <= window]
            severity = th.roce_link_flaps.severity(len(recent))
            if severity is not None:
                level = (
                    th.roce_link_flaps.critical
                    if severity == HEALTH_CRITICAL
                    else th.roce_link_flaps.warning
                )
                out.append(
                    Finding(
                        "roce_link_flaps",
                        severity,
                        f"{port} went down {len(recent)} time(s) in the last {window:g} s "
                        f"(hccn_tool -link_stat; up count {link.get('link_up_count')})",
                        value=len(recent),
                        threshold=level,
                    )
                )
        optical = link.get("optical") or {}
        low = optical.get("rx_power_low_mw")
        weak = [
            i
            for i, p in enumerate(optical.get("rx_power_mw") or [])
            if p is not None and low is not None and p < low
        ]
        los = optical.get("rx_los_flag")
        if (los or weak) and th.roce_optical is not None:
            what = []
            if los:
                what.append(f"Rx LOS flag {los:#x}")
            if weak:
                powers = optical["rx_power_mw"]
                what.append(
                    "Rx power below "
                    f"{low} mW on lane(s) " + ", ".join(f"{i} ({powers[i]} mW)" for i in weak)
                )
            out.append(
                Finding(
                    "roce_optical",
                    th.roce_optical,
                    f"{port} optical module: "
                    + "; ".join(what)
                    + f" (present: {optical.get('present')}): clean or replace the fibre / module",
                    value={"rx_los_flag": los, "weak_lanes": weak},
                    threshold=low,
                )
            )
    return out


def evaluate(record: CardRecord, settings: InterconnectSettings, facts: CardFacts) -> list[Finding]:
    """PCIe and NVLink findings of a card that was read, then its RoCE port findings
    (ports listed down, and ports no longer listed of a card that was read)."""
    findings: list[Finding] = []
    if record.read_ok:
        findings += _pcie_findings(record, settings)
        findings += _nvlink_findings(record, settings, facts.boot)
    return post_boot_grace(
        findings + _roce_findings(record, settings, facts.boot), settings, facts.boot
    )


def post_boot_grace(
    findings: list[Finding], settings: InterconnectSettings, boot: BootFacts
) -> list[Finding]:
    """``findings`` with each critical link-down finding (:data:`GRACE_CHECKS`) held at
    ``warning`` while this boot has had at most ``post_boot_grace_patrols`` patrols
    (``boot.patrols`` 0: not counted, no grace)."""
    grace = settings.post_boot_grace_patrols
    if not 0 < boot.patrols <= grace:
        return findings
    for f in findings:
        if f.check in GRACE_CHECKS and f.severity == HEALTH_CRITICAL:
            f.severity = HEALTH_WARNING
            f.message += (
                f" (post-boot grace {boot.patrols} of {grace} patrols: links train after "
                "a boot; critical if still down after it)"
            )
    return findings
