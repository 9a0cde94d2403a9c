"""The default action of every finding hetpatrol makes (hetpatrol.actions.findings)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hetpatrol.actions import findings
from hetpatrol.actions.vocabulary import (
    ISOLATE_CARD,
    NONE,
    REBOOT_NODE,
    REPLACE_CARD,
    RESET_CARD,
    RESTART_JOB,
    WATCH,
)
from hetpatrol.config import load_config
from hetpatrol.judge import judge
from hetpatrol.schema import CardRecord, Finding

REPO = Path(__file__).resolve().parents[1]


def _checks_in_the_code() -> set[str]:
    """Every literal check name given to Finding(...) or ``check = "..."`` in the code,
    plus the names the card thresholds build in a loop / through _level."""
    names: set[str] = set()
    for path in list((REPO / "hetpatrol").rglob("*.py")) + list((REPO / "collectors").glob("*.py")):
        # the action tables themselves, and the cluster commands' audit findings (slurm.conf
        # checks with their own severities, not a card's or a node's patrol findings)
        if {"actions", "cluster", "ledger"} & set(path.parts):
            continue
        text = path.read_text(encoding="utf-8")
        names.update(re.findall(r'Finding\(\s*"([a-z_0-9]+)"', text))
        names.update(re.findall(r'check\s*=\s*"([a-z_0-9]+)"', text))
        for a, b in re.findall(r'check = "([a-z_]+)" if .* else "([a-z_]+)"', text):
            names.update((a, b))
        names.update(re.findall(r'_level\(\s*"([a-z_]+)"', text))
        names.update(re.findall(r'\(\s*"((?:remapped|retired)_[a-z_]+)",', text))
    return names


def test_every_check_in_the_code_has_a_row():
    found = _checks_in_the_code()
    # the scan must see the checks this table was written from
    assert {"card_missing", "collector_hung", "collector_failed", "card_unreadable"} <= found
    assert {"temperature", "ecc_uncorrected", "remapped_rows_failure", "xid"} <= found
    tables = findings.vendor_tables()  # the plugins' code and value checks
    declared = set(tables.code_actions) | set(tables.value_actions) | set(tables.check_actions)
    assert {"xid", "kernel_fault", "ascend_fault_code", "gpu_recovery_action"} <= declared
    missing = sorted(found - set(findings.CHECK_ACTIONS) - declared)
    assert missing == []


@pytest.mark.parametrize(
    ("check", "severity", "action"),
    [
        ("remapped_rows_pending", "critical", RESET_CARD),  # remap at the next reset
        ("retired_pages_pending", "critical", RESET_CARD),
        ("remapped_rows_failure", "critical", REPLACE_CARD),  # RMA condition
        ("ecc_uncorrected", "critical", RESET_CARD),
        ("ecc_uncorrected", "warning", WATCH),
        ("temperature", "critical", ISOLATE_CARD),
        ("temperature", "warning", WATCH),
        ("temperature", "info", NONE),
        ("card_missing", "critical", REBOOT_NODE),  # left the bus: as XID 79 RESTART_BM
        ("pci_unwatched", "critical", RESET_CARD),  # on the bus, driver bound, not listed
        ("pci_unwatched", "warning", WATCH),  # a plugin off, no driver bound
        ("card_missing", "unknown", WATCH),  # its collector failed: can't tell
        ("collector_hung", "unknown", WATCH),  # one hang is no proof (escalates)
        ("collector_failed", "unknown", WATCH),
        ("card_unreadable", "unknown", WATCH),
        ("nvml_driver", "critical", REBOOT_NODE),
        ("nvlink_down", "critical", RESET_CARD),
        ("pcie_downtrained", "critical", ISOLATE_CARD),
        ("roce_link_down", "critical", ISOLATE_CARD),
        ("memory_used", "critical", WATCH),
        ("gres_mismatch", "critical", WATCH),
        ("gres_check_failed", "unknown", WATCH),
        ("brand_new_check", "critical", WATCH),
    ],
)
def test_check_defaults(check, severity, action):
    assert findings.finding_action(Finding(check, severity, "m")).action == action


def test_unknown_check_keeps_its_name():
    v = findings.finding_action({"check": "brand_new_check", "severity": "warning"})
    assert (v.action, v.source, v.code) == (WATCH, "unknown", "check:brand_new_check")


def test_xid_finding_takes_the_highest_xid_action():
    f = Finding("xid", "critical", "kernel log: ...", value={"13": 2, "79": 1})
    v = findings.finding_action(f)
    assert (v.action, v.code) == (REBOOT_NODE, "xid:79")
    assert findings.finding_action(Finding("xid", "warning", "m", value={"13": 1})).action == (
        RESTART_JOB
    )
    # NVLink5 episodes judged warning are the Nonfatal ones (xid.classify)
    assert findings.finding_action(Finding("xid", "warning", "m", value={"145": 1})).action == WATCH
    assert findings.finding_action(Finding("xid", "critical", "m", value={"145": 1})).action == (
        RESET_CARD
    )


def test_xid_154_action_is_read_from_the_message_xid_py_writes():
    # the text hetpatrol.checks.kernel_events builds for an XID 154 episode
    msg = (
        "kernel log, GPU 0000:07:00.0: XID 154 (GPU Recovery Action Changed) -> Node Reboot "
        "Required x1 (critical) in the last 3600 s: drain the node and reset the GPU"
    )
    assert findings.finding_action(Finding("xid", "critical", msg, value={"154": 1})).action == (
        REBOOT_NODE
    )
    assert (
        findings.finding_action(Finding("xid", "critical", "?", value={"154": 1})).action == WATCH
    )


def test_kernel_fault_and_ascend_codes():
    kf = Finding("kernel_fault", "critical", "m", value={"fallen_off_bus": 1})
    assert findings.finding_action(kf).action == REBOOT_NODE
    codes = Finding(
        "ascend_fault_code", "critical", "m", value={"80E3A201": "critical", "A4025021": "info"}
    )
    v = findings.finding_action(codes)
    assert (v.action, v.code) == (ISOLATE_CARD, "ascend:80E3A201")
    # the table can be given (the prolog gives {}: unknown codes, no yaml import)
    assert findings.finding_action(codes, levels={}).action == WATCH
    assert findings.finding_action(Finding("xid", "critical", "m", value=None)).action == WATCH


def test_overrides():
    f = Finding("temperature", "critical", "m")
    assert findings.finding_action(f, overrides={"check:temperature": WATCH}).action == WATCH
    kf = Finding("kernel_fault", "critical", "m", value={"fallen_off_bus": 1})
    assert findings.finding_action(kf, overrides={"kernel:fallen_off_bus": RESET_CARD}).action == (
        RESET_CARD
    )


def test_card_action_of_real_threshold_findings():
    cfg = load_config()
    rec = CardRecord(vendor="nvidia", index=3, model="NVIDIA A100-SXM4-80GB")
    rec.remapped_rows_failure = True
    rec.remapped_rows_pending = True
    rec.temperature_celsius = 50.0
    found = judge(rec, cfg).findings
    assert {f.check for f in found} == {"remapped_rows_failure", "remapped_rows_pending"}
    v = findings.card_action(found)
    assert (v.action, v.code) == (REPLACE_CARD, "check:remapped_rows_failure")
    assert findings.card_action([]).action == NONE


def test_a_card_with_only_quiet_findings_names_its_first_finding():
    v = findings.card_action([Finding("temperature", "info", "m"), Finding("power", "ok", "m")])
    assert (v.action, v.code) == (NONE, "check:temperature")


@pytest.mark.parametrize(
    ("raw", "action"),
    [
        ("gpu_is_lost", REBOOT_NODE),  # NVML GPU is lost: fell off the bus (XID 79 RESTART_BM)
        ("reset_required", RESET_CARD),  # NVML_ERROR_RESET_REQUIRED
        ("insufficient_power", ISOLATE_CARD),  # power cable (XID 54 CHECK_MECHANICALS)
        ("Alarm", WATCH),  # npu-smi Health: the error codes carry the action
        ("Critical", RESET_CARD),  # npu-smi's urgent alarm: drains even without its codes
        ("unknown_error", RESET_CARD),  # NVML Unknown on a core call
        ("", WATCH),
    ],
)
def test_vendor_health_by_value(raw, action):
    from hetpatrol.collectors.ascend import AscendCollector
    from hetpatrol.collectors.nvidia import NvidiaCollector

    words = {**NvidiaCollector.vendor_info.health_words, **AscendCollector.vendor_info.health_words}
    severity = words.get(raw.lower(), ("unknown", None))[0]
    assert findings.finding_action(Finding("vendor_health", severity, "m", value=raw)).action == (
        action
    )


@pytest.mark.parametrize(
    ("value", "severity", "action"),
    [
        (1, "critical", RESET_CARD),  # GPU_RESET
        (2, "critical", REBOOT_NODE),  # NODE_REBOOT
        (3, "warning", RESTART_JOB),  # DRAIN_P2P
        (7, "critical", REBOOT_NODE),  # SYSTEM_REBOOT
        (99, "warning", WATCH),
    ],
)
def test_gpu_recovery_action_finding_by_value(value, severity, action):
    # the finding the card thresholds make from counters.gpu_recovery_action
    f = Finding("gpu_recovery_action", severity, "NVML recovery action ...", value=value)
    assert findings.finding_action(f).action == action
    # a field read failing Unknown patrol after patrol (critical) takes the card out; once
    # (a warning) it is only watched
    assert findings.finding_action(Finding("nvml_field_error", "critical", "m")).action == (
        RESET_CARD
    )
    assert findings.finding_action(Finding("nvml_field_error", "warning", "m")).action == WATCH
