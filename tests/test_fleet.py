"""The fleet view's pieces: host list compression, Slurm's node JSON and text as recorded,
and the join of Slurm nodes with the daemons' Prometheus answers.

The join is also run for real (live slurmctld, live Prometheus) in test_fleet_real.py.
"""

from __future__ import annotations

import re

import pytest
from conftest import samples_dir
from hypothesis import given
from hypothesis import strategies as st

from hetpatrol.cluster.fleet import build_fleet, daemon_nodes, queries
from hetpatrol.cluster.fleet_view import render
from hetpatrol.cluster.hostlist import compress_hostlist, name_prefix
from hetpatrol.cluster.prom_query import Sample
from hetpatrol.cluster.slurm_nodes import parse_nodes, parse_nodes_json, parse_nodes_text
from hetpatrol.slurm.gres import GresEntry, expand_hostlist


# ------------------------------------------------------------------------ host lists
@pytest.mark.parametrize(
    ("names", "text"),
    [
        ([f"gn{i:03d}" for i in range(1, 41)] + ["gn042"], "gn[001-040,042]"),
        (["gn8", "gn9", "gn10", "gn11"], "gn[8-11]"),  # unpadded numbers of two widths
        (["gn09", "gn10"], "gn[09-10]"),  # 10 has no leading zero but the width of 09
        (["gn01", "gn1"], "gn1,gn01"),  # two different hosts, never merged
        (["login", "gn007"], "gn007,login"),  # one name: no brackets
        (["r1n01", "r1n02", "r2n01"], "r1n[01-02],r2n01"),  # trailing digits only
        (["a3", "a3", "a1"], "a[1,3]"),
        ([], ""),
    ],
)
def test_compress_hostlist(names, text):
    assert compress_hostlist(names) == text


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["gn", "an", "r1n", "x-"]),
            st.integers(0, 1200),
            st.sampled_from([0, 2, 3, 4]),
        ),
        max_size=60,
    )
)
def test_compress_expands_back_to_the_same_names(items):
    names = {f"{p}{str(n).zfill(w)}" for p, n, w in items}
    assert sorted(expand_hostlist(compress_hostlist(names))) == sorted(names)


def test_name_prefix():
    assert (name_prefix("gn001"), name_prefix("login"), name_prefix("r1n07")) == (
        "gn",
        "login",
        "r1n",
    )


# -------------------------------------------------------------------- Slurm, recorded
def test_slurmrestd_node_json_24_11():
    """slurmrestd v0.0.42 node object (the shape of `scontrol --json show node`, 24.11)."""
    text = (samples_dir("slurm") / "slurmrestd-v0.0.42-node.slurm24.11.json").read_text()
    # the man page's example has its "meta" object trimmed to a marker: JSON again
    text = re.sub(r'"meta": \{\s*<<< TRIMMED >>>\s*\}', '"meta": {}', text)
    (node,) = parse_nodes(text)
    assert node.name == "host1"
    assert node.state == "IDLE" and node.flags == frozenset()
    assert node.gres == (GresEntry("gpu", "fake1", 1), GresEntry("gpu", "fake2", 1))
    assert node.gres_used == (GresEntry("gpu", "fake1", 0), GresEntry("gpu", "fake2", 0))
    assert node.partitions == ("debug",)
    assert (node.hostname, node.address) == ("devhostname01", "localhost")
    assert node.reason is None and not node.drained


def test_sinfo_json_openapi_v0_0_37():
    text = (samples_dir("slurm") / "sinfo-json-openapi-v0.0.37.slurm21.08.json").read_text()
    (node,) = parse_nodes_json(text)
    assert node.name == "cs2.example.company.com"
    assert node.state == "MIXED"  # "state": "mixed", "state_flags": []
    assert node.gres == () and node.features == ()
    assert node.partitions == ("hw",)


def test_scontrol_text_17_11_four_nodes():
    text = (samples_dir("slurm") / "scontrol-show-node.slurm17.11.4nodes.txt").read_text()
    nodes = {n.name: n for n in parse_nodes_text(text)}
    assert list(nodes) == ["nodea-01", "nodebbbb-002", "nodecc-04", "noded"]
    a = nodes["nodea-01"]
    assert a.gres == (GresEntry("gpu", "m60", 8),)
    assert a.gres_used == (GresEntry("gpu", "m60", 8),)  # GresUsed=gpu:m60:8(IDX:0-7)
    assert a.partitions == ("short", "killable") and a.features == ("nodea",)
    cc = nodes["nodecc-04"]
    assert cc.state == "IDLE" and cc.drained and not cc.drained_by_hetpatrol
    assert (cc.reason, cc.reason_user) == ("memory issues?", "root")
    assert nodes["noded"].gres == (GresEntry("gpu", "quadro", 1), GresEntry("vmem", None, 2**31))


def test_not_json_is_a_clear_error():
    with pytest.raises(ValueError, match="not JSON"):
        parse_nodes_json("{nodes: oops")
    with pytest.raises(ValueError, match="without a 'nodes' list"):
        parse_nodes_json('{"jobs": []}')


# ------------------------------------------------------------------------- the join
def _answers(**rows):
    return {k: [Sample(labels, v) for labels, v in rows.get(k, [])] for k in queries()}


def _card(node, vendor, ctype, gres, n, driver="", fw=""):
    labels = {"node": node, "instance": f"{node}:9477", "vendor": vendor, "card_type": ctype}
    labels |= {"gres": gres, "driver_version": driver, "firmware_version": fw}
    return labels, n


def _health(node, vendor, ctype, health, n):
    labels = {"node": node, "instance": f"{node}:9477", "vendor": vendor, "card_type": ctype}
    return labels | {"hetpatrol_card_health": health}, n


SLURM_TEXT = """\
NodeName=gn001 State=MIXED Gres=gpu:a100:8 GresUsed=gpu:a100:3(IDX:0-2) Partitions=gpu
NodeName=gn002 State=IDLE+DRAIN Gres=gpu:a100:8 GresUsed=gpu:a100:0 Partitions=gpu \
Reason=hetpatrol: xid_79 nvidia/3 [root@2026-01-01T00:00:00]
NodeName=gn003 State=IDLE Gres=gpu:a100:8 GresUsed=gpu:a100:0 Partitions=gpu
NodeName=an01 State=IDLE Gres=npu:8 GresUsed=npu:0 Partitions=npu NodeHostName=an01.site
NodeName=login01 State=IDLE Gres=(null) Partitions=login
"""


def test_join_counts_per_class_partition_and_batch():
    nodes = parse_nodes_text(SLURM_TEXT.replace("\\\n", ""))
    answers = _answers(
        up=[({"node": n, "instance": f"{n}:9477"}, 1) for n in ("gn001", "gn002", "gn003")]
        + [({"node": "an01.site", "instance": "an01.site:9477"}, 0)]
        + [({"node": "stray", "instance": "stray:9477"}, 1)],
        cards=[
            _card("gn001", "nvidia", "a100", "gpu", 8, "550.54.15", "92.00.9E.00.02"),
            _card("gn002", "nvidia", "a100", "gpu", 7, "550.54.15", "92.00.9E.00.02"),
            _card("gn002", "nvidia", "", "gpu", 1, "550.54.15", ""),  # lost from the bus
            _card("gn003", "nvidia", "a100", "gpu", 8, "535.104.05", "92.00.9E.00.02"),
        ],
        health=[
            _health("gn001", "nvidia", "a100", "ok", 8),
            _health("gn002", "nvidia", "a100", "ok", 6),
            _health("gn002", "nvidia", "a100", "warning", 1),
            _health("gn002", "nvidia", "", "critical", 1),
            _health("gn003", "nvidia", "a100", "ok", 8),
        ],
        silent=[({"node": "gn003", "instance": "gn003:9477"}, 1)],
    )
    daemons = daemon_nodes(answers, "node")
    report = build_fleet(nodes, daemons, card_gres={"gpu", "npu"})
    doc = report.to_json()
    (a100, npu) = doc["classes"][0], doc["classes"][1]
    assert (a100["vendor"], a100["card_type"], a100["gres"]) == ("nvidia", "a100", "gpu")
    assert (a100["nodes"], a100["cards_slurm"], a100["cards_seen"]) == (3, 24, 24)
    assert a100["health"] == {"ok": 22, "warning": 1, "critical": 1, "unknown": 0}
    # idle: gn001 8 - 3 allocated, gn003 8; gn002 is drained: none of its cards is idle
    assert (a100["allocated"], a100["idle"]) == (3, 13)
    assert (a100["drained_hetpatrol"], a100["drained_other"], a100["silent"]) == (1, 0, 1)
    assert a100["hosts"] == "gn[001-003]"
    (gpu_part,) = a100["partitions"]
    assert [b["hosts"] for b in gpu_part["batches"]] == ["gn[001-003]"]
    assert a100["versions"] == [
        {"driver_version": "550.54.15", "firmware_version": "92.00.9E.00.02", "nodes": 2},
        {"driver_version": "535.104.05", "firmware_version": "92.00.9E.00.02", "nodes": 1},
    ]
    # an01: matched by NodeHostName; its daemon is down, its untyped npu GRES has no class
    assert (npu["vendor"], npu["card_type"], npu["gres"]) == ("", "", "npu")
    assert (npu["cards_slurm"], npu["cards_seen"], npu["silent"]) == (8, 0, 1)
    assert doc["silent"] == {"nodes": 2, "hosts": "an01,gn003"}
    assert doc["slurm_only"] == {"nodes": 1, "hosts": "login01", "with_card_gres": ""}
    assert doc["prometheus_only"] == {"nodes": 1, "hosts": "stray"}
    assert (doc["health"], doc["exit_code"]) == ("critical", 2)
    text = render(doc)
    assert "  driver 550.54.15  firmware 92.00.9E.00.02: 2 nodes  (drift)" in text
    assert "daemon silent (down, stale or not ready): 2 nodes: an01,gn003" in text


@pytest.mark.parametrize(
    ("health", "silent", "code"),
    [("ok", False, 0), ("warning", False, 1), ("ok", True, 3), ("critical", True, 2)],
)
def test_exit_codes(health, silent, code):
    nodes = parse_nodes_text("NodeName=gn001 State=IDLE Gres=gpu:a100:1 Partitions=p\n")
    answers = _answers(
        up=[({"node": "gn001"}, 1)],
        cards=[_card("gn001", "nvidia", "a100", "gpu", 1)],
        health=[_health("gn001", "nvidia", "a100", health, 1)],
        silent=[({"node": "gn001"}, 1)] if silent else [],
    )
    assert build_fleet(nodes, daemon_nodes(answers, "node")).exit_code == code


def test_node_label_missing_falls_back_to_instance_host():
    answers = _answers(up=[({"instance": "gn001:9477"}, 1), ({"instance": "[fd00::7]:9477"}, 1)])
    assert set(daemon_nodes(answers, "node")) == {"gn001", "fd00::7"}


def test_queries_aggregate_on_the_server():
    q = queries("slurm_node", "hp")
    assert q["cards"].startswith("count by (slurm_node, instance, vendor, card_type, gres,")
    assert 'hetpatrol_card_info{job="hp"}' in q["cards"]
    assert q["up"] == 'up{job="hp"}'
    assert set(q) == {"cards", "health", "up", "silent"}


def test_read_nodes_prefers_json_and_says_why_it_failed(tmp_path):
    """read_nodes runs `scontrol --json show node` first (Slurm >= 23.02), else
    `scontrol -d -o show node`; a stand-in script plays scontrol here (the real 22.05
    scontrol, which refuses --json, is run in test_fleet_real.py)."""
    from hetpatrol.cluster.slurm_nodes import SlurmReadError, read_nodes

    text = (samples_dir("slurm") / "slurmrestd-v0.0.42-node.slurm24.11.json").read_text()
    saved = tmp_path / "nodes.json"
    saved.write_text(re.sub(r'"meta": \{\s*<<< TRIMMED >>>\s*\}', '"meta": {}', text))
    script = tmp_path / "scontrol"
    script.write_text(f'#!/bin/sh\n[ "$1" = "--json" ] && exec cat {saved}\nexit 9\n')
    script.chmod(0o755)
    nodes, source = read_nodes([str(script)])
    assert (source, [n.name for n in nodes]) == ("json", ["host1"])
    script.write_text(
        '#!/bin/sh\necho "slurm_load_node error: Unable to contact slurm controller" >&2\nexit 1\n'
    )
    with pytest.raises(SlurmReadError) as err:
        read_nodes([str(script)])
    assert str(err.value) == (
        f"{script} -d -o show node: slurm_load_node error: Unable to contact slurm controller"
    )


def test_queries_refuse_a_bad_label_and_quote_the_job():
    with pytest.raises(ValueError, match="not a Prometheus label name"):
        queries('node"}) or vector(1', "hetpatrol")
    assert queries("node", 'a"b')["up"] == 'up{job="a\\"b"}'


def test_cards_without_a_verdict_are_unknown_and_slurm_only_classes_get_a_vendor():
    from hetpatrol.cluster.audit import vendor_of_gres
    from hetpatrol.config import load_config

    profiles = load_config().profiles
    nodes = parse_nodes_text(
        "NodeName=gn001 State=IDLE Gres=gpu:a100:8 Partitions=p\n"
        "NodeName=an01 State=IDLE Gres=ascend:910b:8 Partitions=q\n"
    )
    answers = _answers(
        up=[({"node": "gn001"}, 1)],
        cards=[_card("gn001", "nvidia", "a100", "gpu", 8)],
        health=[_health("gn001", "nvidia", "a100", "ok", 6)],  # 2 cards lack the series
    )
    report = build_fleet(
        nodes,
        daemon_nodes(answers, "node"),
        card_gres={"gpu", "ascend"},
        vendor_of=lambda n, t: vendor_of_gres(n, t, profiles),
    )
    doc = report.to_json()
    classes = {(c["vendor"], c["card_type"]): c for c in doc["classes"]}
    assert classes[("nvidia", "a100")]["health"] == {
        "ok": 6,
        "warning": 0,
        "critical": 0,
        "unknown": 2,
    }
    # an01 has no daemon: its class is named by the bundled profiles (910b is Ascend)
    assert classes[("ascend", "910b")]["cards_slurm"] == 8
    assert report.exit_code == 3


def test_an_unreadable_gres_keeps_the_node_and_says_why(monkeypatch):
    """A GRES string the parser refuses (newer parsers raise on text Slurm would not
    print): the node stays in the view, its error is listed, the fleet is unknown."""
    import hetpatrol.cluster.slurm_nodes as sn

    real = sn._parse_gres

    def strict(text):
        if text and "X" in text:
            raise ValueError(f"GRES item 'gpu:a100:X': not name[:type][:count] in {text!r}")
        return real(text)

    monkeypatch.setattr(sn, "_parse_gres", strict)
    nodes = sn.parse_nodes_text(
        "NodeName=gn001 State=IDLE Gres=gpu:a100:8 Partitions=p\n"
        "NodeName=gn002 State=IDLE Gres=gpu:a100:8 GresUsed=gpu:a100:X Partitions=p\n"
    )
    assert [n.name for n in nodes] == ["gn001", "gn002"]
    assert nodes[1].gres_error.startswith("GRES item 'gpu:a100:X'")
    assert nodes[1].gres == (GresEntry("gpu", "a100", 8),)  # Gres= itself was readable
    answers = _answers(
        up=[({"node": n}, 1) for n in ("gn001", "gn002")],
        cards=[_card(n, "nvidia", "a100", "gpu", 8) for n in ("gn001", "gn002")],
        health=[_health(n, "nvidia", "a100", "ok", 8) for n in ("gn001", "gn002")],
    )
    report = build_fleet(nodes, daemon_nodes(answers, "node"))
    doc = report.to_json()
    assert doc["gres_unreadable"] == [{"node": "gn002", "error": nodes[1].gres_error}]
    assert report.exit_code == 3
    assert "Slurm GRES of gn002 unreadable: GRES item" in render(doc)


def test_a_narrow_terminal_gets_each_label_on_its_own_line(tmp_path):
    """At 80 columns the wide table (111 here) does not fit: each label gets a line, its
    numbers the next under short headers; a pipe (no width) keeps the wide table."""
    nodes = parse_nodes_text(SLURM_TEXT.replace("\\\n", ""))
    answers = _answers(
        up=[({"node": "gn001", "instance": "gn001:9477"}, 1)],
        cards=[_card("gn001", "nvidia", "a100", "gpu", 8, "550.54.15", "92.00.9E.00.02")],
        health=[_health("gn001", "nvidia", "a100", "ok", 8)],
    )
    doc = build_fleet(nodes, daemon_nodes(answers, "node"), card_gres={"gpu", "npu"}).to_json()
    wide = render(doc).splitlines()
    assert max(len(line) for line in wide) > 80
    assert wide[0].split()[-3:] == ["drain-hp", "drain-other", "silent"]
    narrow = render(doc, width=80).splitlines()
    assert max(len(line) for line in narrow) <= 80, "\n".join(narrow)
    assert narrow[:2] == [
        "class / partition / nodes",
        "    nodes slurm seen ok warn crit unkn alloc idle down dr-hp dr-oth silent",
    ]
    at = narrow.index("nvidia a100  gres gpu")
    # 3 nodes, 24 cards in Slurm, 8 seen (gn001's daemon) and ok; 3 allocated (gn001's
    # GresUsed), gn002's 8 drained by hetpatrol, 13 idle, none down; gn002 and gn003 silent
    assert narrow[at + 1].split() == [
        *("3", "24", "8", "8", "0", "0", "0", "3", "13", "0", "1", "0", "2")
    ]


@pytest.mark.parametrize("command", ["fleet", "audit-slurm"])
def test_timeout_help_says_one_deadline_for_the_whole_command(command):
    """--timeout bounds scontrol and every query together (docs/fleet.md), not each."""
    import subprocess

    from conftest import HETPATROL

    out = subprocess.run(
        [*HETPATROL, command, "--help"], capture_output=True, text=True, timeout=60
    ).stdout
    text = " ".join(out.split())
    assert "one deadline in seconds for the whole command (scontrol and every" in text
    assert "per source" not in text


@pytest.mark.parametrize(
    "state", ["DOWN+NOT_RESPONDING", "DOWN", "IDLE+NOT_RESPONDING", "MIXED+FAIL", "DOWN+DRAIN"]
)
def test_a_down_nodes_cards_are_counted_down_not_idle(state):
    """gn003 out of service (sinfo(1) NODE STATE CODES: DOWN and FAIL "unavailable for
    use", not responding "will not be allocated any new work"): its 8 cards are in
    ``down``, not ``idle``; the 80-column layout still fits."""
    text = SLURM_TEXT.replace("NodeName=gn003 State=IDLE", f"NodeName=gn003 State={state}")
    nodes = parse_nodes_text(text.replace("\\\n", ""))
    answers = _answers(
        up=[({"node": "gn001", "instance": "gn001:9477"}, 1)],
        cards=[_card("gn001", "nvidia", "a100", "gpu", 8, "550.54.15", "92.00.9E.00.02")],
        health=[_health("gn001", "nvidia", "a100", "ok", 8)],
    )
    doc = build_fleet(nodes, daemon_nodes(answers, "node"), card_gres={"gpu", "npu"}).to_json()
    (cls,) = [c for c in doc["classes"] if c["gres"] == "gpu"]
    # gn001: 8 - 3 allocated idle; gn002 drained: neither; gn003: 8 down
    assert (cls["idle"], cls["down"], cls["allocated"]) == (5, 8, 3)
    narrow = render(doc, width=80).splitlines()
    assert max(len(line) for line in narrow) <= 80, "\n".join(narrow)
    at = narrow.index("nvidia a100  gres gpu")
    assert narrow[at + 1].split()[7:10] == ["3", "5", "8"]
    wide = render(doc).splitlines()
    assert wide[0].split()[-5:] == ["idle", "down", "drain-hp", "drain-other", "silent"]


def test_a_host_without_slurm_conf_gets_the_ledgers_hint(tmp_path):
    """``hetpatrol fleet`` on a host without a slurm.conf said scontrol's error and no
    hint, unlike ``ledger``: the same ``hint: no slurm.conf found`` line follows it, read
    off the real scontrol ("Could not establish a configuration source")."""
    import os
    import subprocess
    from pathlib import Path

    from conftest import HETPATROL, require_program

    require_program("scontrol", package="slurm-client")
    if Path("/etc/slurm/slurm.conf").exists():
        pytest.skip("this host has /etc/slurm/slurm.conf")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["HOME"] = str(tmp_path)
    res = subprocess.run(
        [*HETPATROL, "fleet", "--prometheus", "http://127.0.0.1:9", "--timeout", "60"],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    err = res.stderr.splitlines()
    assert res.returncode == 3, res.stderr
    assert err[0].startswith("hetpatrol fleet: scontrol -d -o show node: scontrol:"), err
    assert err[-1] == "hint: no slurm.conf found: set SLURM_CONF or pass --scontrol/--slurm-nodes"
