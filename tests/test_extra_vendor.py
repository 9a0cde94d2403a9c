"""A new vendor is one plugin file plus its profile data (#11).

The test writes a temporary package holding only ``acme_collector.py`` (the plugin, with
its health words, link kind and kernel-log line), ``acme_collector_profiles.yaml`` (its
card type and GRES name) and the ``.dist-info`` that registers it in the ``hetpatrol.collectors``
entry-point group, as ``pip install`` would. Nothing in hetpatrol is edited: its cards
are judged by the plugin's profile (and its kernel-log line), exported in Prometheus and
JSONL, counted against the Slurm GRES registration and shown by ``hetpatrol status``.
"""

from __future__ import annotations

import importlib
import json
import sys
import textwrap

import jsonschema
import pytest

from hetpatrol.cli import main as cli_main
from hetpatrol.config import load_config
from hetpatrol.exporters.prometheus import Exposition
from hetpatrol.exporters.state import write_state
from hetpatrol.judge import vendor_info
from hetpatrol.patrol import Patroller
from hetpatrol.schema import jsonl_json_schema
from hetpatrol.slurm.gres import parse_gres
from hetpatrol.slurm.inventory import compare

PLUGIN = '''
"""Acme X1 accelerators (a third-party hetpatrol plugin: this file and its profiles)."""

import re

from hetpatrol.actions.vocabulary import REPLACE_CARD, WATCH, ActionVerdict
from hetpatrol.collector import STATE_OK, Collector, CollectResult, VendorActions, VendorInfo
from hetpatrol.kernel_log import KIND_KERNEL, KernelEvent, pci_bus_id
from hetpatrol.schema import HEALTH_OK, HEALTH_WARNING, CardRecord

_TRIP = re.compile(r"acme: (?P<bus>[0-9a-f:.]+) thermal trip")


class AcmeKernelLog:
    """What the acme driver prints in the kernel log."""

    vendor = "acme"
    cards_name = "Acme card"

    def events(self, lines):
        for line in lines:
            m = _TRIP.search(line.text)
            if m:
                yield KernelEvent(
                    kind=KIND_KERNEL,
                    bus_id=pci_bus_id(m.group("bus")),
                    raw=line.raw,
                    message=line.text,
                    reason="thermal_trip",
                    log_time=line.log_time,
                    clock=line.clock,
                )


def acme_fault(code, severity, message, levels, overrides):
    """acme-smi fault codes: E7 is a dead HBM stack, anything else is looked at."""
    if code == "E7":
        return ActionVerdict(REPLACE_CARD, "acme_fault", f"acme:{code}", "dead HBM stack")
    return ActionVerdict(WATCH, "unknown", f"acme:{code}", "code not known")


class AcmeCollector(Collector):
    name = "acme"
    vendor_info = VendorInfo(
        health_words={
            "good": (HEALTH_OK, None),
            "degraded": (HEALTH_WARNING, "acme-smi says degraded: reseat the card"),
        },
        link_kinds=("acmelink",),
        kernel_log=AcmeKernelLog(),
        actions=VendorActions(
            code_actions={"acme_fault": acme_fault},
            check_actions={"acme_link_flaps": {"critical": WATCH, "*": WATCH}},
        ),
    )

    def collect(self):
        cards = []
        for i, (temp, health) in enumerate([(41.0, "good"), (84.0, "good"), (45.0, "degraded")]):
            rec = CardRecord(
                vendor="acme",
                index=i,
                model="Acme X1",
                card_type="x1",
                uuid=f"ACME-X1-000{i}",
                bus_id=f"0000:0{i + 1}:00.0",
                driver_version="3.1.4",
                vendor_health=health,
                temperature_celsius=temp,
                memory_used_bytes=1 << 30,
                memory_total_bytes=32 << 30,
            )
            rec.links.append({"kind": "acmelink", "link": 0, "state": "up"})
            cards.append(rec)
        return CollectResult("acme", records=cards, state=STATE_OK)
'''

PROFILES = """
profiles:
  - name: acme-x1
    vendor: acme
    card_types: [x1]
    gres: acme
    temperature_celsius: {warning: 70, critical: 80}
"""

CONFIG = """
node: lab-07
listen: null
kernel_log: {{enabled: true, path: "{log}"}}
environment: {{enabled: false}}
"""
#: the node's kernel log, as dmesg prints it
KERNEL_LOG = "[ 1843.308145] acme: 0000:02:00.0 thermal trip\n"


@pytest.fixture
def acme(tmp_path, monkeypatch):
    """The temporary package on sys.path, registered as the ``acme`` collector."""
    pkg = tmp_path / "site"
    pkg.mkdir()
    (pkg / "acme_collector.py").write_text(textwrap.dedent(PLUGIN))
    (pkg / "acme_collector_profiles.yaml").write_text(PROFILES)
    info = pkg / "acme_collector-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-collector\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[hetpatrol.collectors]\nacme = acme_collector:AcmeCollector\n"
    )
    monkeypatch.syspath_prepend(str(pkg))
    importlib.invalidate_caches()
    vendor_info.cache_clear()
    yield pkg
    vendor_info.cache_clear()
    sys.modules.pop("acme_collector", None)


def test_new_vendor_is_one_plugin_file_and_its_profiles(acme, tmp_path, capsys):
    log = tmp_path / "kern.log"
    log.write_text("")  # its line is written after the first read (one there before: age unknown)
    config = load_config(text=CONFIG.format(log=log))
    # no `collectors:` section: every registered plugin runs, the new one included
    # (built-ins first, then every other registered plugin by name: amd, cambricon, gaudi...)
    names = [c.name for c in config.collectors]
    assert names[:2] == ["nvidia", "ascend"] and "acme" in names
    profile = config.profile_for("acme", "x1", "Acme X1")
    assert (profile.name, profile.gres) == ("acme-x1", "acme")

    patroller = Patroller(config)
    try:
        patroller.run()
        log.write_text(KERNEL_LOG)
        report = patroller.run()
    finally:
        patroller.close()
    cards = [c for c in report.cards if c.vendor == "acme"]
    assert [(c.index, c.gres, c.health) for c in cards] == [
        (0, "acme", "ok"),
        (1, "acme", "critical"),  # 84 C >= the profile's critical 80 C
        (2, "acme", "warning"),  # the plugin's word "degraded"
    ]
    hot, trip = cards[1].findings
    assert (hot.check, hot.value, hot.threshold) == ("temperature", 84.0, 80)
    # the plugin's kernel-log line, matched to the card by its bus id
    assert (trip.check, trip.severity) == ("kernel_fault", "critical")
    assert "kernel log, GPU 0000:02:00.0: thermal_trip x1" in trip.message
    (word,) = cards[2].findings
    assert (word.check, word.severity, word.message) == (
        "vendor_health",
        "warning",
        "acme-smi says degraded: reseat the card",
    )
    assert report.health == "critical"

    # JSONL: every line valid against the published schema (link kind "acmelink")
    schema = jsonl_json_schema()
    lines = [json.loads(x) for x in report.jsonl_lines()]
    for line in lines:
        jsonschema.validate(line, schema)
    acme_lines = [x for x in lines if x["kind"] == "card" and x["vendor"] == "acme"]
    assert [(x["card_type"], x["health"]) for x in acme_lines] == [
        ("x1", "ok"),
        ("x1", "critical"),
        ("x1", "warning"),
    ]
    assert acme_lines[0]["links"] == [{"kind": "acmelink", "link": 0, "state": "up"}]
    (event,) = [x for x in lines if x["kind"] == "event"]
    assert (event["event"], event["vendor"], event["index"], event["bus_id"]) == (
        "kernel",
        "acme",
        1,
        "0000:02:00.0",
    )

    # Prometheus
    body = Exposition([c.name for c in config.collectors]).update(report).decode()
    labels = 'card_type="x1",index="1",uuid="ACME-X1-0001",vendor="acme"'
    assert f"hetpatrol_card_health_code{{{labels}}} 2.0" in body
    assert f"hetpatrol_card_temperature_celsius{{{labels}}} 84.0" in body
    assert 'hetpatrol_collector_up{collector="acme"} 1.0' in body
    link = 'card_type="x1",index="1",kind="acmelink",link="0",uuid="ACME-X1-0001",vendor="acme"'
    assert f"hetpatrol_card_link_up{{{link}}} 1.0" in body

    # GRES: 3 x acme:x1 registered, 3 found, 2 healthy (the hot one is not)
    counts, findings = compare(report.cards, parse_gres("acme:x1:3"), config)
    assert [c.to_dict() for c in counts] == [
        {"name": "acme", "type": "x1", "configured": 3, "found": 3, "healthy": 2}
    ]
    assert [(f.check, f.severity, f.message) for f in findings] == [
        (
            "gres_mismatch",
            "critical",
            "acme:x1: Slurm has 3 registered, 2 healthy on the node (3 found)",
        )
    ]

    # status, from the state file the daemon would write
    state = tmp_path / "state.json"
    write_state(state, report, config.interval_seconds)
    code = cli_main(["status", "--state-path", str(state), "--color", "never"])
    assert code == 2
    out = capsys.readouterr().out
    assert "acme x1 (gres acme)  3 cards: 1 ok, 1 warning, 1 critical" in out
    assert "warning vendor_health: acme-smi says degraded: reseat the card" in out
    assert "acme ok (3 cards" in out


def test_new_vendor_declares_its_fault_tables_in_vendor_info(acme):
    """The plugin's VendorInfo.actions reach the core's finding -> action table without
    an edit there: a code finding takes the highest action of its codes."""
    from hetpatrol.actions import findings

    f = {"check": "acme_fault", "severity": "critical", "value": {"E1": 1, "E7": 2}}
    v = findings.finding_action(f)
    assert (v.action, v.source, v.code) == ("replace_card", "acme_fault", "acme:E7")
    v = findings.finding_action({"check": "acme_link_flaps", "severity": "critical"})
    assert (v.action, v.source) == ("watch", "finding")
    # the shipped plugins' tables are still there beside it
    assert findings.finding_action({"check": "xid", "value": {"79": 1}}).action == "reboot_node"
