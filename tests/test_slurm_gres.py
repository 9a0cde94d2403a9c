"""Slurm parsers (scontrol show node, GRES strings, gres.conf, host lists) on the recorded
outputs in ../shared/vendor-samples/slurm (values read off each file), the GRES
registration check with a scripted scontrol, and the ``slurm:`` config section."""

from __future__ import annotations

import re
from dataclasses import replace

import jsonschema
import pytest
from conftest import samples_dir
from fakes import Scripted

from hetpatrol.collector import STATE_FAILED, STATE_OK
from hetpatrol.config import ConfigError, load_config
from hetpatrol.patrol import CollectorStatus, Patroller
from hetpatrol.schema import CardRecord, jsonl_json_schema
from hetpatrol.slurm.gres import (
    HOSTLIST_MAX,
    GresEntry,
    expand_hostlist,
    find_node,
    gres_conf_for_node,
    hostlist_contains,
    parse_gres,
    parse_gres_conf,
    parse_scontrol_nodes,
)
from hetpatrol.slurm.inventory import GresCheck, compare
from hetpatrol.slurm.settings import SlurmSettings
from hetpatrol.tool import ToolOutput

G = 1024**3


def entries(text: str | None) -> list[tuple]:
    return [(e.name, e.type, e.count) for e in parse_gres(text)]


# ------------------------------------------------------------------- GRES strings
@pytest.mark.parametrize(
    "text, expected",
    [
        ("gpu:a100:8(S:0-1),ascend:910b:8", [("gpu", "a100", 8), ("ascend", "910b", 8)]),
        ("gpu:8", [("gpu", None, 8)]),
        ("gpu", [("gpu", None, 1)]),
        ("gpu:(null):4(IDX:0-3)", [("gpu", None, 4)]),
        ("gpu:a100:4(S:0,2),gpu:h100:2", [("gpu", "a100", 4), ("gpu", "h100", 2)]),
        ("gpu:a100_3g.20gb:7", [("gpu", "a100_3g.20gb", 7)]),
        ("gpu:3090:2", [("gpu", "3090", 2)]),
        ("vmem:2G", [("vmem", None, 2 * G)]),
        ("gpu:no_consume:2", [("gpu", None, 2)]),
        ("(null)", []),
        ("", []),
        (None, []),
    ],
)
def test_parse_gres_strings(text, expected):
    assert entries(text) == expected


def test_host_lists_and_device_ranges():
    assert expand_hostlist("node[01-03,7],gpu1") == ["node01", "node02", "node03", "node7", "gpu1"]
    assert expand_hostlist("/dev/nvidia[0,2-3]") == ["/dev/nvidia0", "/dev/nvidia2", "/dev/nvidia3"]
    assert expand_hostlist("r[1-2]n[1-2]") == ["r1n1", "r1n2", "r2n1", "r2n2"]
    assert len(expand_hostlist("node[01-20]")) == 20
    assert expand_hostlist("node[01-20]")[-1] == "node20"


# ------------------------------------------------------------ recorded scontrol output
def test_scontrol_show_node_slurm17_four_nodes():
    text = (samples_dir("slurm") / "scontrol-show-node.slurm17.11.4nodes.txt").read_text()
    nodes = {n.name: n for n in parse_scontrol_nodes(text)}
    assert list(nodes) == ["nodea-01", "nodebbbb-002", "nodecc-04", "noded"]
    a = nodes["nodea-01"]
    assert (a.state, a.reason, a.drained) == ("ALLOCATED", None, False)
    assert [(e.name, e.type, e.count) for e in a.gres] == [("gpu", "m60", 8)]
    assert entries(a.fields["GresUsed"]) == [("gpu", "m60", 8)]
    assert [(e.name, e.type, e.count) for e in nodes["nodebbbb-002"].gres] == [
        ("gpu", "rtx2080", 4)
    ]
    c = nodes["nodecc-04"]
    assert (c.state, c.base_state, c.flags, c.drained) == (
        "IDLE+DRAIN",
        "IDLE",
        frozenset({"DRAIN"}),
        True,
    )
    assert c.gres == ()  # Gres=(null)
    assert (c.reason, c.reason_user, c.reason_time) == (
        "memory issues?",
        "root",
        "2019-01-29T10:42:12",
    )
    d = nodes["noded"]
    assert [(e.name, e.type, e.count) for e in d.gres] == [
        ("gpu", "quadro", 1),
        ("vmem", None, 2 * G),
    ]
    assert entries(d.fields["GresUsed"]) == [("gpu", "quadro", 0), ("vmem", None, 0)]


def test_scontrol_show_node_d_slurm21_k80():
    text = (samples_dir("slurm") / "scontrol-show-node-d.slurm21.08.k80-idle.txt").read_text()
    (node,) = parse_scontrol_nodes(text)  # the "$ scontrol ..." prompt line is ignored
    assert (node.name, node.state, node.reason) == ("c2180", "IDLE", None)
    assert [(e.name, e.type, e.count) for e in node.gres] == [("gpu", "k80", 7)]
    assert entries(node.fields["GresUsed"]) == [("gpu", "k80", 0)]
    assert entries(node.fields["GresDrain"]) == []  # N/A
    assert node.fields["CfgTRES"] == "cpu=28,mem=500G,billing=728,gres/gpu=7"


def test_scontrol_show_node_slurm24_drained_by_slurm_for_gres_count():
    name = "scontrol-show-node.slurm24.05.idle-drain-gres-count-mismatch.txt"
    node = find_node((samples_dir("slurm") / name).read_text(), "devhost-102-68")
    assert node is not None
    assert node.state == "IDLE+DRAIN" and node.drained
    assert [(e.name, e.type, e.count) for e in node.gres] == [("gpu", "nvidia-rtx-3090", 1)]
    assert node.reason == "gres/gpu count reported lower than configured (0 < 1)"
    assert (node.reason_user, node.reason_time) == ("slurm", "2024-12-19T11:03:34")


def test_scontrol_one_line_reason_with_brackets_and_equals():
    text = (
        "NodeName=n1 Arch=x86_64 Gres=gpu:a100:8(S:0-1),ascend:910b:8 State=MIXED+DRAIN "
        "OS=Linux 6.1 #1 SMP ExtSensorsTemp=n/s "
        "Reason=admin: see ticket=42 [x] [alice@2026-01-02T03:04:05] Comment=foo"
    )
    node = find_node(text, "n1")
    assert node.reason == "admin: see ticket=42 [x]"
    assert node.reason_user == "alice"
    assert node.fields["Comment"] == "foo"
    assert (node.base_state, node.flags) == ("MIXED", frozenset({"DRAIN"}))
    assert find_node(text, "n2") is None


def test_sinfo_and_restd_gres_fields():
    d = samples_dir("slurm")
    rows = (d / "sinfo-gresused-nodelist.txt").read_text().splitlines()[1:]
    used = {r.split()[1]: entries(r.split()[0]) for r in rows}
    assert used["labhostnam"] == [("gpu", "1080ti", 1), ("gpu", "980gtx", 1)]
    assert used["labdl09"] == [("gpu", "3090", 3)]
    assert used["labdl[04-05]"] == [("gpu", "titanx", 0)]
    assert expand_hostlist("labdl[04-05]") == ["labdl04", "labdl05"]

    text = (d / "sinfo-json-gres-fields.slurm22.txt").read_text()
    fields = dict(re.findall(r'"(gres\w*)": "([^"]*)"', text))
    assert entries(fields["gres"]) == [("gpu", None, 4)]
    assert entries(fields["gres_used"]) == [("gpu", None, 4)]
    assert entries(fields["gres_drained"]) == []

    text = (d / "slurmrestd-v0.0.42-node.slurm24.11.json").read_text()
    fields = dict(re.findall(r'"(gres\w*)": "([^"]*)"', text))
    assert entries(fields["gres"]) == [("gpu", "fake1", 1), ("gpu", "fake2", 1)]
    assert entries(fields["gres_used"]) == [("gpu", "fake1", 0), ("gpu", "fake2", 0)]


def test_node_lists_in_sinfo_add_up_to_the_node_counts():
    d = samples_dir("slurm")
    rows = (d / "sinfo-partition-states-drng-fail-maint.txt").read_text().splitlines()[1:]
    assert len(rows) == 9
    for row in rows:
        cols = row.split()
        assert len(expand_hostlist(cols[-1])) == int(cols[3]), row
    reasons = (d / "sinfo-list-reasons.txt").read_text().splitlines()
    assert expand_hostlist(reasons[-1].split()[-1]) == ["compute001", "compute002", "compute003"]


# -------------------------------------------------------------------------- gres.conf
def conf_entries(text: str, node: str) -> tuple[list[tuple], str | None]:
    conf = gres_conf_for_node(parse_gres_conf(text), node)
    return [(e.name, e.type, e.count) for e in conf.entries], conf.autodetect


def test_gres_conf_multinode_typed():
    text = (samples_dir("slurm") / "gres.conf.site-multinode-typed.conf").read_text()
    assert conf_entries(text, "gnode1") == ([("gpu", "m2070q", 4)], None)
    assert conf_entries(text, "gnode2") == ([("gpu", "m2070q", 4)], None)
    assert conf_entries(text, "gnode3") == ([], None)
    assert conf_entries(text, "viznode1") == ([("gpu", "gtx970", 1), ("gpu", "gtx1060", 1)], None)
    assert conf_entries(text, "viznode2") == ([("gpu", "rtx2080", 1)], None)
    assert conf_entries(text, "gnode9") == ([("gpu", "v100", 4)], None)


def test_gres_conf_single_line_sites():
    d = samples_dir("slurm")
    text = (d / "gres.conf.site-minimal-untyped.conf").read_text()
    assert conf_entries(text, "anynode") == ([("gpu", None, 10)], None)
    text = (d / "gres.conf.site-jetson-orin-dri.conf").read_text()
    assert conf_entries(text, "anynode") == ([("gpu", "orin", 1)], None)
    lines = parse_gres_conf(text)
    assert lines[0].files == ("/dev/dri/renderD128",)
    text = (d / "gres.conf.site-autodetect-nvml.conf").read_text()
    conf = gres_conf_for_node(parse_gres_conf(text), "anynode")
    assert (conf.entries, conf.autodetect, conf.complete) == ((), "nvml", False)


def test_gres_conf_manpage_examples():
    text = (samples_dir("slurm") / "gres.conf.schedmd-manpage-examples.conf").read_text()
    # the file holds six examples, each under a "####" banner
    examples = [e for e in re.split(r"(?m)^#{10,}\n# Slurm's Generic[^\n]*\n", text) if e.strip()]
    assert len(examples) == 6
    mps, explicit, positive, nvml_but_one, mixed, bandwidth = examples
    assert conf_entries(mps, "n") == (
        [("gpu", "gtx560", 1), ("gpu", "tesla", 1), ("mps", None, 200)],
        "nvml",
    )
    # nvidia2 commented out of service: tesla 2 + 1
    assert conf_entries(explicit, "n") == ([("gpu", "tesla", 3)], None)
    assert conf_entries(positive, "tux3") == ([("gpu", None, 3)], None)  # nvidia[0,2-3]
    assert conf_entries(positive, "tux0") == ([("gpu", None, 4)], None)
    assert conf_entries(positive, "tux15") == ([("gpu", None, 4)], None)
    assert conf_entries(positive, "tux16") == ([], None)
    assert conf_entries(nvml_but_one, "tux3") == ([("gpu", None, 4)], "off")
    conf = gres_conf_for_node(parse_gres_conf(nvml_but_one), "tux4")
    assert (conf.entries, conf.autodetect, conf.complete) == ((), "nvml", False)
    assert conf_entries(mixed, "tux5") == ([], "nvml")
    assert conf_entries(mixed, "tux9") == ([], "rsmi")
    assert conf_entries(mixed, "tux12") == ([("gpu", None, 4)], None)
    assert conf_entries(bandwidth, "tux7") == ([("bandwidth", "lustre", 4 * G)], None)
    assert conf_entries(bandwidth, "tux8") == ([], None)


def test_gres_conf_huge_nodename_range_is_matched_without_expanding():
    text = "NodeName=gpu[0000000-9999999] Name=gpu Type=a100 File=/dev/nvidia[0-3]\n"
    assert conf_entries(text, "gpu0004217") == ([("gpu", "a100", 4)], None)
    assert conf_entries(text, "gpu9999999") == ([("gpu", "a100", 4)], None)
    assert conf_entries(text, "gpu4217") == ([], None)  # width 7, as Slurm pads it
    assert conf_entries(text, "gpu10000000") == ([], None)
    assert conf_entries(text, "gpu000421x") == ([], None)


@pytest.mark.parametrize(
    "expr",
    ["node[01-03,7],gpu1", "r[1-2]n[1-2]", "n[10-8]", "a[0-12]0", "x[1,abc]y", "tux[0-15]", "q[]"],
)
def test_hostlist_contains_agrees_with_the_expansion(expr):
    names = set(expand_hostlist(expr))
    probes = names | {"node1", "node003", "node07", "r1n3", "n7", "a1", "a00", "a120", "tux016"}
    for name in sorted(probes):
        assert hostlist_contains(expr, name) == (name in names), name
    assert hostlist_contains("node[٠١-٠٣]", "node01") is False  # ASCII digits only


def test_expand_hostlist_refuses_a_list_over_the_cap(base_config, tmp_path):
    assert HOSTLIST_MAX == 65536
    assert len(expand_hostlist("n[1-65536]")) == 65536
    with pytest.raises(ValueError, match=r"expands to 65537 names \(limit 65536\)"):
        expand_hostlist("n[1-65537]")
    gres_conf = tmp_path / "gres.conf"
    gres_conf.write_text("NodeName=gpu07 Name=gpu Type=a100 File=/dev/nvidia[0-99999999]\n")
    fake = FakeScontrol(returncode=1, stderr="slurm_load_node: Unable to contact")
    result = GresCheck(fake).run([], statuses(), slurm_on(base_config, gres_conf=gres_conf))
    assert result.data["source"] is None
    assert result.data["error"] == (
        "sinfo exited 1: slurm_load_node: Unable to contact; "
        f"scontrol exited 1: slurm_load_node: Unable to contact; fallback {gres_conf}: "
        "line 1: host list '/dev/nvidia[0-99999999]' expands to 100000000 names "
        "(limit 65536)"
    )


# ------------------------------------------------------------------- comparison
def card(vendor: str, index: int, card_type: str | None, health: str = "ok", chip=None):
    model = {"a100": "NVIDIA A100-SXM4-80GB", "h100": "NVIDIA H100 80GB HBM3"}.get(
        card_type or "", "910B3" if vendor == "ascend" else None
    )
    rec = CardRecord(vendor=vendor, index=index, chip=chip, card_type=card_type, model=model)
    rec.health = health
    return rec


def test_compare_counts_healthy_cards_per_name_and_type(base_config):
    cards = [card("nvidia", i, "a100") for i in range(6)]
    cards += [card("nvidia", 6, "a100", "critical"), card("nvidia", 7, None, "critical")]
    cards += [card("ascend", i, "910b", "warning" if i == 0 else "ok", chip=0) for i in range(8)]
    reg = parse_gres("gpu:A100:8(S:0-1),ascend:910b:8,mps:200")
    counts, findings = compare(cards, reg, base_config)
    got = [(c.name, c.type, c.configured, c.found, c.healthy) for c in counts]
    assert got == [
        ("gpu", "A100", 8, 7, 6),  # case-insensitive; the lost GPU has no type: not found
        ("ascend", "910b", 8, 8, 8),  # a warm card is still healthy
        ("gpu", None, 0, 1, 0),  # the lost GPU, counted nowhere in Slurm
    ]
    (f,) = findings
    assert (f.check, f.severity, f.value, f.threshold) == ("gres_mismatch", "critical", 6, 8)
    assert f.message == "gpu:A100: Slurm has 8 registered, 6 healthy on the node (7 found)"


def test_compare_more_than_registered_is_a_warning_untyped_counts_all(base_config):
    cards = [card("nvidia", i, "h100") for i in range(8)]
    cards += [card("ascend", i, "910b", chip=0) for i in range(8)]
    counts, findings = compare(cards, parse_gres("gpu:4"), base_config)
    assert [(c.label, c.configured, c.healthy) for c in counts] == [
        ("gpu", 4, 8),
        ("ascend:910b", 0, 8),
    ]
    assert [(f.severity, f.message) for f in findings] == [
        ("warning", "gpu: 8 healthy on the node, Slurm has only 4 registered"),
        ("warning", "ascend:910b: 8 healthy on the node, Slurm has only 0 registered"),
    ]


def test_compare_profile_gres_type_and_unread_cards():
    config = load_config(
        "t.yaml",
        text="node: n1\nprofiles:\n"
        "  - {name: b4, vendor: ascend, card_types: ['910b'], gres: npu, gres_type: 910b4}\n",
    )
    cards = [card("ascend", i, "910b", chip=0) for i in range(7)]
    cards.append(card("ascend", 7, "910b", "unknown", chip=0))
    counts, findings = compare(cards, parse_gres("npu:910B4:8"), config)
    assert [(c.label, c.found, c.healthy) for c in counts] == [("npu:910B4", 8, 7)]
    (f,) = findings  # one card unread: not evidence of a lost card
    assert f.severity == "unknown" and "unread" in f.message
    counts, findings = compare(cards[:7], parse_gres("npu:910B4:8"), config, collectors_up=False)
    assert findings[0].severity == "unknown"


# ------------------------------------------------------------------ the node check
class FakeScontrol:
    """A scripted Slurm: answers ``scontrol show node -o N`` with ``text`` and the
    registration's one-node sinfo (``--Format=NodeList:|,Gres:0``) with the same node's
    ``NodeName|Gres`` line, as both print ``node_ptr->gres`` (``sinfo=False``: no sinfo
    installed); counts calls."""

    def __init__(self, text: str = "", returncode: int = 0, stderr: str = "", sinfo=True):
        self.text, self.returncode, self.stderr = text, returncode, stderr
        self.calls: list[list[str]] = []
        self.missing = False
        self.sinfo = sinfo

    def __call__(self, argv, timeout):
        self.calls.append(list(argv))
        is_sinfo = any(str(a).endswith("sinfo") for a in argv)
        if self.missing or (is_sinfo and not self.sinfo):
            raise FileNotFoundError(2, "No such file or directory", argv[0])
        text = self.text
        if is_sinfo:
            from hetpatrol.slurm.gres import parse_scontrol_nodes

            text = "".join(f"{n.name}|{n.fields.get('Gres')}\n" for n in parse_scontrol_nodes(text))
        return ToolOutput(tuple(argv), text, self.stderr, self.returncode, False, 0.01)


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def slurm_on(config, **kw):
    settings = dict(enabled=True, node_name="gpu07", gres_conf=None) | kw
    return replace(config, node="host07", slurm=SlurmSettings(**settings))


ONE_LINE = (
    "NodeName=gpu07 Arch=x86_64 CoresPerSocket=1 Gres=gpu:a100:8(S:0-1),ascend:910b:8 "
    "NodeAddr=10.0.0.7 State=IDLE ThreadsPerCore=1\n"
)


def statuses(state=STATE_OK):
    return [CollectorStatus("nvidia", state, 8, 0.1), CollectorStatus("ascend", STATE_OK, 8, 0.1)]


def test_gres_check_off_by_default(base_config):
    fake = FakeScontrol(ONE_LINE)
    assert GresCheck(fake).run([], statuses(), base_config) is None
    assert fake.calls == []


def test_gres_check_caches_the_registration(base_config):
    fake, clock = FakeScontrol(ONE_LINE), Clock()
    check = GresCheck(fake, clock)
    config = slurm_on(base_config, scontrol=("sudo", "-n", "scontrol"))
    cards = [card("nvidia", i, "a100") for i in range(8)]
    cards += [card("ascend", i, "910b", chip=0) for i in range(8)]
    result = check.run(cards, statuses(), config)
    assert result.findings == ()
    assert result.data["source"] == "sinfo" and result.data["slurm_node"] == "gpu07"
    # the one node alone (REQUEST_NODE_INFO_SINGLE), sinfo beside scontrol, same prefix
    one_node = ["--noheader", "--all", "--Node", "--nodes=gpu07", "--Format=NodeList:|,Gres:0"]
    assert fake.calls == [["sudo", "-n", "sinfo", *one_node]]
    clock.now += 299
    check.run(cards, statuses(), config)
    assert len(fake.calls) == 1
    clock.now += 2
    check.run(cards[:7], statuses(), config)
    assert len(fake.calls) == 2


def test_gres_check_falls_back_to_gres_conf(base_config, tmp_path):
    gres_conf = tmp_path / "gres.conf"
    gres_conf.write_text(
        "AutoDetect=off\n"
        "NodeName=gpu[01-20] Name=gpu Type=a100 File=/dev/nvidia[0-7]\n"
        "NodeName=gpu[01-20] Name=ascend Type=910b File=/dev/davinci[0-7]\n"
        "NodeName=cpu[01-04] Name=gpu Type=t4 Count=1\n"
    )
    fake, clock = FakeScontrol(returncode=1, stderr="slurm_load_node: Unable to contact"), Clock()
    check = GresCheck(fake, clock)
    config = slurm_on(base_config, gres_conf=gres_conf)
    cards = [card("nvidia", i, "a100") for i in range(6)]
    result = check.run(cards, statuses(), config)
    assert result.data["source"] == "gres.conf"
    assert "Unable to contact" in result.data["error"]
    assert [(e["type"], e["configured"], e["healthy"]) for e in result.data["entries"]] == [
        ("a100", 8, 6),
        ("910b", 8, 0),
    ]
    assert {f.severity for f in result.findings} == {"critical"}
    clock.now += 61  # a failed read is retried sooner than the cache time
    check.run(cards, statuses(), config)
    assert len(fake.calls) == 4  # sinfo, then scontrol, twice


def test_gres_check_without_any_registration_is_info_only(base_config, tmp_path):
    fake = FakeScontrol()
    fake.missing = True
    auto = tmp_path / "gres.conf"
    auto.write_text("AutoDetect=nvml\n")
    for gres_conf in (None, auto, tmp_path / "absent.conf"):
        result = GresCheck(fake).run([], statuses(), slurm_on(base_config, gres_conf=gres_conf))
        (f,) = result.findings
        assert (f.check, f.severity) == ("gres_registration", "info")
        assert "cannot run scontrol" in f.message
        assert result.data["source"] is None and result.data["entries"] == []


def test_gres_check_in_a_patrol(base_config):
    """Scripted 910B cards vs the registration: finding, patrol line and metrics."""
    from hetpatrol.exporters.prometheus import Exposition

    fake = FakeScontrol(ONE_LINE)
    scripted = Scripted("ascend")
    scripted.temps = [40.0] * 6
    config = slurm_on(base_config)
    patroller = Patroller(config, collectors={"ascend": scripted}, node_checks=[GresCheck(fake)])
    report = patroller.run()
    assert report.health == "critical"
    messages = sorted(f.message for f in report.node_findings)
    assert messages == [
        "ascend:910b: Slurm has 8 registered, 6 healthy on the node (6 found)",
        "gpu:a100: Slurm has 8 registered, 0 healthy on the node (0 found)",
    ]
    validator = jsonschema.Draft202012Validator(jsonl_json_schema())
    import json

    patrol = json.loads(report.patrol_line)
    validator.validate(patrol)
    assert patrol["gres"]["entries"][1] == {
        "name": "ascend",
        "type": "910b",
        "configured": 8,
        "found": 6,
        "healthy": 6,
    }
    body = Exposition(["ascend"]).update(report, 1).decode()
    assert 'hetpatrol_gres_configured{gres="ascend",gres_type="910b"} 8.0' in body
    assert 'hetpatrol_gres_found{gres="gpu",gres_type="a100"} 0.0' in body
    assert 'hetpatrol_gres_healthy{gres="ascend",gres_type="910b"} 6.0' in body
    assert "hetpatrol_gres_registration_up 1.0" in body

    scripted.mode = "fail"  # collector failed: the cards are unknown, not missing
    report = patroller.run()
    assert {f.severity for f in report.node_findings if f.check == "gres_mismatch"} == {"unknown"}
    patroller.close()


def test_patrol_line_gres_is_null_while_off(base_config):
    import json

    patroller = Patroller(base_config, collectors={"ascend": Scripted("ascend")})
    report = patroller.run()
    assert json.loads(report.patrol_line)["gres"] is None
    assert (
        "hetpatrol_gres"
        not in __import__("hetpatrol.exporters.prometheus", fromlist=["Exposition"])
        .Exposition([])
        .update(report, 1)
        .decode()
    )
    patroller.close()


def test_failed_collector_status_makes_shortfall_unknown(base_config):
    check = GresCheck(FakeScontrol(ONE_LINE))
    cards = [card("ascend", i, "910b", chip=0) for i in range(8)]
    result = check.run(cards, statuses(STATE_FAILED), slurm_on(base_config))
    assert [f.severity for f in result.findings] == ["unknown"]  # gpu:a100 unread, not lost


# --------------------------------------------------------------------------- config
def test_slurm_config_section():
    config = load_config(
        "s.yaml",
        text="node: host07\n"
        "slurm:\n"
        "  enabled: true\n"
        "  node_name: gpu07\n"
        '  scontrol: ["/usr/local/bin/hetpatrol-scontrol"]\n'
        "  timeout_seconds: 5\n"
        "  gres_conf: null\n"
        "  registration_cache_seconds: 60\n"
        "  drain: {enabled: true, dry_run: true, resume_after_patrols: 5}\n",
    )
    s = config.slurm
    assert (s.enabled, s.node_name, s.scontrol, s.timeout_seconds) == (
        True,
        "gpu07",
        ("/usr/local/bin/hetpatrol-scontrol",),
        5.0,
    )
    assert (s.gres_conf, s.registration_cache_seconds) == (None, 60.0)
    assert (s.drain.enabled, s.drain.dry_run, s.drain.resume_after_patrols) == (True, True, 5)
    assert s.slurm_node(config.node) == "gpu07"


def test_slurm_off_by_default_in_the_bundled_config(base_config):
    s = base_config.slurm
    assert (s.enabled, s.drain.enabled, s.drain.dry_run) == (False, False, False)
    assert s.scontrol == ("scontrol",) and str(s.gres_conf) == "/etc/slurm/gres.conf"
    assert (s.registration_cache_seconds, s.drain.resume_after_patrols) == (300.0, 3)


@pytest.mark.parametrize(
    "body, where",
    [
        ("slurm:\n  enabled: yes please\n", "bad.yaml:3: slurm.enabled: "),
        ("slurm:\n  scontrol: []\n", "bad.yaml:3: slurm.scontrol: "),
        ("slurm:\n  timeout_seconds: 0\n", "bad.yaml:3: slurm.timeout_seconds: "),
        ("slurm:\n  drain:\n    resume_after_patrols: 0\n", "bad.yaml:4: slurm.drain."),
        ("slurm:\n  drain:\n    dryrun: true\n", "bad.yaml:4: slurm.drain.dryrun: unknown key"),
        ("slurm:\n  node_name: two words\n", "bad.yaml:3: slurm.node_name: "),
    ],
)
def test_slurm_config_errors_name_key_and_line(body, where):
    with pytest.raises(ConfigError) as err:
        load_config("bad.yaml", text="node: n1\n" + body)
    assert str(err.value).startswith(where), str(err.value)


def test_gres_entry_helpers():
    e = GresEntry("gpu", "A100", 8)
    assert e.key == ("gpu", "a100") and e.label == "gpu:A100"
    assert GresEntry("gpu", None, 2).label == "gpu"


# --------------------------------------------- GRES types as Slurm matches them (#10 item 1)
def gpu(index: int, model: str, card_type: str | None, health: str = "ok") -> CardRecord:
    rec = CardRecord(vendor="nvidia", index=index, card_type=card_type, model=model)
    rec.health = health
    return rec


def test_autodetect_type_names_on_the_healthy_mixed_node(base_config):
    """``AutoDetect=nvml`` sites register the NVML name (``NVIDIA H100 80GB HBM3`` as
    Slurm writes it): the 8 H100s of fixtures/nodes/healthy-mixed are those 8."""
    from conftest import REPO

    line = ONE_LINE.replace("gpu:a100:8(S:0-1)", "gpu:nvidia_h100_80gb_hbm3:8(S:0-1)")
    config = slurm_on(base_config)
    patroller = Patroller(
        config,
        replay_dir=REPO / "fixtures" / "nodes" / "healthy-mixed",
        node_checks=[GresCheck(FakeScontrol(line))],
    )
    try:
        report = patroller.run()
    finally:
        patroller.close()
    assert report.health == "ok", report.node_findings
    assert [f for f in report.node_findings if f.check.startswith("gres")] == []
    assert report.node_checks["gres"]["entries"] == [
        {"name": "gpu", "type": "nvidia_h100_80gb_hbm3", "configured": 8, "found": 8, "healthy": 8},
        {"name": "ascend", "type": "910b", "configured": 8, "found": 8, "healthy": 8},
    ]


@pytest.mark.parametrize(
    "model, card_type, registered",
    [
        ("NVIDIA H100 80GB HBM3", "h100", "gpu:nvidia_h100_80gb_hbm3:4"),
        ("NVIDIA H100 80GB HBM3", "h100", "gpu:H100:4(S:0-1)"),
        ("NVIDIA H100 80GB HBM3", "h100", "gpu:NVIDIA_H100:4"),  # a substring, any case
        ("NVIDIA A100-SXM4-80GB", "a100", "gpu:nvidia_a100-sxm4-80gb:4"),
        ("NVIDIA A100-SXM4-80GB", "a100", "gpu:a100-sxm4:4"),
        ("Tesla V100-SXM2-16GB", "v100", "gpu:tesla_v100-sxm2-16gb:4"),
        ("Tesla V100-SXM2-16GB", "v100", "gpu:v100:4"),
        ("Tesla V100-SXM2-16GB", "v100", "gpu:4"),  # untyped
        ("Tesla V100-SXM2-16GB", "v100", "gpu:(null):4(IDX:0-3)"),  # 22.05's untyped
        ("NVIDIA A100-SXM4-80GB", "a100", "gpu:a100:2(S:0),gpu:a100:2(S:1)"),  # summed
    ],
)
def test_registered_type_names_a_card_as_slurm_matches_it(
    base_config, model, card_type, registered
):
    cards = [gpu(i, model, card_type) for i in range(4)]
    counts, findings = compare(cards, parse_gres(registered), base_config)
    assert findings == []
    assert [(c.configured, c.found, c.healthy) for c in counts] == [(4, 4, 4)]


def test_ascend_type_names(base_config):
    """910B4 chips (npu-smi "Name 910B4", card_type 910b): ``910b`` and ``910B4`` name
    them; ``910b3`` (another chip) does not."""
    cards = [card("ascend", i, "910b", chip=0) for i in range(8)]
    for rec in cards:
        rec.model = "910B4"
    for registered in ("ascend:910b:8", "ascend:910B4:8", "ascend:8"):
        assert compare(cards, parse_gres(registered), base_config)[1] == [], registered
    counts, findings = compare(cards, parse_gres("ascend:910b3:8"), base_config)
    (f,) = findings
    assert f.severity == "warning"


def test_several_types_of_one_name_each_take_their_cards(base_config):
    """Longest type first, each up to its count (Slurm's _normalize_sys_gres_types)."""
    cards = [gpu(i, "NVIDIA H100 80GB HBM3", "h100") for i in range(8)]
    counts, findings = compare(
        cards, parse_gres("gpu:h100:4,gpu:nvidia_h100_80gb_hbm3:4"), base_config
    )
    assert findings == []
    assert [(c.type, c.configured, c.found) for c in counts] == [
        ("h100", 4, 4),
        ("nvidia_h100_80gb_hbm3", 4, 4),
    ]
    cards[7].health = "critical"
    counts, findings = compare(
        cards, parse_gres("gpu:h100:4,gpu:nvidia_h100_80gb_hbm3:4"), base_config
    )
    (f,) = findings
    assert (f.severity, f.value, f.threshold) == ("critical", 3, 4)


def test_counts_agree_names_do_not_is_a_warning_naming_both(base_config):
    cards = [gpu(i, "NVIDIA H100 80GB HBM3", "h100") for i in range(8)]
    counts, findings = compare(cards, parse_gres("gpu:a100:8"), base_config)
    (f,) = findings
    assert (f.check, f.severity, f.value, f.threshold) == ("gres_mismatch", "warning", 0, 8)
    assert f.message == (
        "gpu:a100: Slurm has 8 registered, 0 healthy cards of that type; the node has 8 "
        "healthy gpu cards of type h100 (nvidia_h100_80gb_hbm3) that do not match it: "
        "the counts agree, the type names do not"
    )
    assert [(c.label, c.configured, c.found) for c in counts] == [
        ("gpu:a100", 8, 0),
        ("gpu:h100", 0, 8),
    ]
    # 6 A100s found healthy, 2 H100s: the counts agree, the names of two do not
    mixed = [gpu(i, "NVIDIA A100-SXM4-80GB", "a100") for i in range(6)] + cards[:2]
    _, findings = compare(mixed, parse_gres("gpu:a100:8"), base_config)
    assert [(f.severity, f.value) for f in findings] == [("warning", 6)]
    # ... but a sick A100 among them is a real shortfall, whatever the H100s
    mixed[0].health = "critical"
    mixed += cards[2:3]
    _, findings = compare(mixed, parse_gres("gpu:a100:8"), base_config)
    assert [(f.severity, f.message) for f in findings] == [
        ("critical", "gpu:a100: Slurm has 8 registered, 5 healthy on the node (6 found)"),
        ("warning", "gpu:h100: 3 healthy on the node, Slurm has only 0 registered"),
    ]
    # one card fewer than registered: the shortfall is real, critical as before
    cards[0].health = "critical"
    _, findings = compare(cards, parse_gres("gpu:a100:8"), base_config)
    assert [(f.severity, f.message) for f in findings] == [
        ("critical", "gpu:a100: Slurm has 8 registered, 0 healthy on the node (0 found)"),
        ("warning", "gpu:h100: 7 healthy on the node, Slurm has only 0 registered"),
    ]


@pytest.mark.parametrize(
    "text",
    ["gpu:a100:X(S:0-1)", "gpu:a:b:4", "gpu:a100:8(S:0-1", ":8", "gpu:a100:8,gpu:(x):2"],
)
def test_unparseable_gres_is_an_error_with_the_raw_text(text):
    from hetpatrol.slurm.gres import GresParseError

    with pytest.raises(GresParseError) as err:
        parse_gres(text)
    assert err.value.raw == text and repr(text) in str(err.value)


def test_unparseable_registration_is_unknown_never_critical(base_config):
    line = ONE_LINE.replace("gpu:a100:8(S:0-1)", "gpu:a100:X(S:0-1)")
    node = find_node(line, "gpu07")
    assert node.gres == () and "gpu:a100:X(S:0-1)" in node.gres_error
    cards = [card("ascend", i, "910b", chip=0) for i in range(8)]
    result = GresCheck(FakeScontrol(line)).run(cards, statuses(), slurm_on(base_config))
    (f,) = result.findings
    assert (f.check, f.severity) == ("gres_registration", "unknown")
    assert "Gres=gpu:a100:X(S:0-1),ascend:910b:8" in f.message
    assert result.data["source"] == "sinfo" and result.data["entries"] == []


def test_registration_without_sinfo_is_scontrol_and_a_hung_sinfo_asks_no_scontrol(base_config):
    """No sinfo to run (or one that cannot be read): scontrol show node -o, as before
    (the whole node table: the fallback only). A sinfo that hung: slurmctld would keep
    scontrol waiting too, so gres.conf, and the error says why."""
    fake = FakeScontrol(ONE_LINE, sinfo=False)
    result = GresCheck(fake).run([], statuses(), slurm_on(base_config))
    assert result.data["source"] == "scontrol"
    assert [c[0] for c in fake.calls] == ["sinfo", "scontrol"]
    assert result.data["error"] is None
    # the helper's client is no scontrol: the breaker's sinfo, as the daemon's user
    helper = slurm_on(base_config, scontrol=("/usr/local/bin/hetpatrol-scontrol",))
    fake = FakeScontrol(ONE_LINE)
    assert GresCheck(fake).run([], statuses(), helper).data["source"] == "sinfo"
    assert fake.calls[0][0] == "sinfo"

    def hung(argv, timeout):
        return ToolOutput(tuple(argv), "", "", None, True, timeout)

    result = GresCheck(hung).run([], statuses(), slurm_on(base_config))
    assert result.data["source"] is None
    assert result.data["error"].startswith("sinfo did not answer within its timeout")
    assert "scontrol" not in result.data["error"]


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "sinfo: no node named 'gpu07' in the answer"),
        ("gpu070|gpu:8\n", "sinfo: no node named 'gpu07'"),
        ("gpu07|gpu:8\ngpu07|gpu:4\n", "listed with different GRES ['gpu:4', 'gpu:8']"),
    ],
)
def test_sinfo_answers_that_are_not_the_node(text, why):
    from hetpatrol.slurm.inventory import parse_sinfo_gres

    with pytest.raises(ValueError, match=re.escape(why)):
        parse_sinfo_gres(text, "gpu07")
    # one line per partition of the node, the same GRES: read (recorded shape, 22.05)
    assert parse_sinfo_gres("gpu07|gpu:a100:8(S:0-1)\ngpu07|gpu:a100:8(S:0-1)\n", "gpu07") == (
        "gpu:a100:8(S:0-1)"
    )


def test_gres_conf_count_that_is_not_a_count_is_refused():
    with pytest.raises(ValueError, match=r"line 2: Count=lots is not a count"):
        parse_gres_conf("# x\nNodeName=n1 Name=gpu Type=a100 Count=lots\n")


# ------------------------------------------------ the GRES check and the PCI census (#23)
def test_gres_shortfall_says_how_many_cards_are_on_the_pci_bus(base_config):
    """fixtures/nodes/gpu-unlisted: NVML lists 8 H100, the bus holds 9 (0000:e8:00.0 lost
    by the driver); Slurm registered gpu:h100:9. The shortfall is critical as before and
    says 9 are on the bus; the entry carries on_bus."""
    from conftest import REPO

    from hetpatrol.patrol import Patroller as P

    line = ONE_LINE.replace("gpu:a100:8(S:0-1)", "gpu:h100:9(S:0-1)")
    patroller = P(slurm_on(base_config), replay_dir=REPO / "fixtures" / "nodes" / "gpu-unlisted")
    for check in patroller.node_checks:
        if isinstance(check, GresCheck):
            check.cache = GresCheck(FakeScontrol(line)).cache
    try:
        report = patroller.run()
    finally:
        patroller.close()
    gres = [f for f in report.node_findings if f.check == "gres_mismatch"]
    assert [(f.severity, f.value, f.threshold) for f in gres] == [("critical", 8, 9)]
    assert gres[0].message.endswith("; 9 on the PCI bus")
    assert report.node_checks["gres"]["entries"][0] == {
        "name": "gpu",
        "type": "h100",
        "configured": 9,
        "found": 8,
        "healthy": 8,
        "on_bus": 9,
    }
    assert report.node_checks["gres"]["entries"][1]["on_bus"] == 8  # ascend:910b:8
