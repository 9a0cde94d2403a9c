"""Hostile input to ``hetpatrol fleet`` and ``hetpatrol audit-slurm``: each case from the
tester's report, against a stub Prometheus (tests/prom_stub.py) or files in tmp_path."""

from __future__ import annotations

import json
import os
import threading

import pytest
from prom_stub import StubPrometheus, fleet_answer, vector

from hetpatrol.cli import main
from hetpatrol.cluster.audit import AuditInput, audit
from hetpatrol.cluster.fleet import build_fleet, daemon_nodes
from hetpatrol.cluster.fleet_view import render
from hetpatrol.cluster.hostlist import hostlist_problem
from hetpatrol.cluster.prom_query import PrometheusClient, PrometheusError, Sample
from hetpatrol.cluster.slurm_conf import INCLUDE_MAX, parse_slurm_conf
from hetpatrol.cluster.slurm_nodes import parse_nodes_json, parse_nodes_text
from hetpatrol.cluster.sources import READ_MAX

NODE_LINE = "NodeName=gn001 State=IDLE Gres=gpu:H100:1 Partitions=batch\n"


@pytest.fixture
def prom():
    with StubPrometheus() as stub:
        stub.respond = fleet_answer()
        yield stub


def _fleet(prom, *args: str) -> int:
    return main(["fleet", "--prometheus", prom.url, "--color", "never", *args])


# ---------------------------------------------------------------- 1: no nodes is no source
@pytest.mark.parametrize(
    "content",
    [b"garbage line\n\x00\x01\n", b"", b"\n\n", b'{"nodes":[]}'],
    ids=["garbage", "empty", "blank", "json-no-nodes"],
)
def test_fleet_slurm_input_without_nodes_is_unreadable(prom, tmp_path, capsys, content):
    path = tmp_path / "n4"
    path.write_bytes(content)
    assert _fleet(prom, "--slurm-nodes", str(path)) == 3
    captured = capsys.readouterr()
    assert "OK" not in captured.out
    assert str(path) in captured.err


def test_fleet_scontrol_printing_nothing_is_unreadable(prom, capsys):
    assert _fleet(prom, "--scontrol", "/bin/true") == 3
    assert "no node could be read" in capsys.readouterr().err


def test_fleet_a_file_over_the_bound_is_refused_unread(prom, tmp_path, capsys):
    path = tmp_path / "huge"
    with path.open("wb") as fh:  # sparse: no disk used
        fh.truncate(READ_MAX + 1)
    assert _fleet(prom, "--slurm-nodes", str(path)) == 3
    assert f"larger than {READ_MAX} bytes" in capsys.readouterr().err


def test_fleet_good_file_still_reads(prom, tmp_path, capsys):
    path = tmp_path / "nodes"
    path.write_text(NODE_LINE)
    assert _fleet(prom, "--slurm-nodes", str(path)) == 0
    assert "fleet: 1 nodes, OK (exit 0)" in capsys.readouterr().out


# ---------------------------------------------------------------- 2: host lists
def _audit_conf(tmp_path, text: str):
    path = tmp_path / "slurm.conf"
    path.write_text("GresTypes=gpu\n" + text)
    return path, audit(AuditInput(conf=parse_slurm_conf(path)))


def test_audit_host_list_over_the_limit_is_an_error_naming_the_line(tmp_path):
    path, report = _audit_conf(tmp_path, "NodeName=gn[000000-070000] Gres=gpu:8\n")
    bad = [f for f in report.findings if f.check == "hostlist"]
    assert [(f.severity, f.where) for f in bad] == [("error", f"{path}:2")]
    assert "70001 names" in bad[0].message
    assert report.exit_code == 2


@pytest.mark.parametrize(
    "names", ["gn[1-", "an[5-3x]", "gn[a-b]", "gn[3-1]", "gn[1,,2]", "gn[[1-2]]"]
)
def test_audit_malformed_host_list_is_a_finding_not_a_node(tmp_path, names):
    path, report = _audit_conf(tmp_path, f"NodeName={names} Gres=gpu:8\n")
    assert [f.where for f in report.findings if f.check == "hostlist"] == [f"{path}:2"]
    assert report.nodes == 0


def test_audit_malformed_partition_nodes_is_a_finding(tmp_path):
    path, report = _audit_conf(
        tmp_path, "NodeName=gn[1-2] Gres=gpu:8\nPartitionName=p Nodes=gn[1-\n"
    )
    assert [f.where for f in report.findings if f.check == "hostlist"] == [f"{path}:3"]


def test_hostlist_problem_accepts_what_slurm_reads():
    # as `scontrol show hostnames` of Slurm 22.05 reads them (gn]1 is a name there)
    for good in ("gn[001-040,042]", "r[1-2]n[1-2]", "login", "gn1,gn2", "gn[09-10]x", "gn]1"):
        assert hostlist_problem(good) is None, good


# ---------------------------------------------------------------- 8: deadline and size
def test_prometheus_slow_drip_is_cut_at_the_deadline():
    with StubPrometheus() as stub:
        stub.drip = (100000, 200, 0.05)  # bounded: 200 bytes, 10 s at most
        with pytest.raises(PrometheusError, match=r"no complete answer within 0\.5 s"):
            PrometheusClient(stub.url, timeout=0.5).query("up")
        assert not stub.drip_done.is_set()  # cut off, not read to the end


def test_prometheus_answer_over_the_bound_is_refused():
    with StubPrometheus() as stub:
        stub.respond = lambda q: (200, vector(*[({"node": f"n{i}"}, "1") for i in range(200)]))
        with pytest.raises(PrometheusError, match="11957 bytes is larger than 1000 bytes"):
            PrometheusClient(stub.url, timeout=5, max_bytes=1000).query("up")
        stub.declared_length = -1  # no Content-Length: stopped while reading
        with pytest.raises(PrometheusError, match="answer larger than 1000 bytes: not read"):
            PrometheusClient(stub.url, timeout=5, max_bytes=1000).query("up")
        stub.declared_length = 2 * 1024**3  # a 2 GB answer announced: not read at all
        with pytest.raises(PrometheusError, match=r"2147483648 bytes is larger than"):
            PrometheusClient(stub.url, timeout=5).query("up")


# ---------------------------------------------------------------- 9: Include fan-out
def test_audit_include_loop_is_a_problem_not_a_fan_out(tmp_path):
    path = tmp_path / "slurm.conf"
    path.write_text("ClusterName=c\n" + "Include slurm.conf\n" * 3)
    conf = parse_slurm_conf(path)
    assert [p for p in conf.problems if "loop" in p] == [
        f"{path}:{n}: Include {path} is a loop (it includes this file): not followed"
        for n in (2, 3, 4)
    ]
    assert conf.includes == 0


def test_audit_include_fan_out_without_loop_is_capped(tmp_path):
    for level in range(5):  # a0 includes a1 four times, ... : 4 + 16 + 64 + 256 Includes
        text = f"Key{level}=v\n" + (f"Include a{level + 1}.conf\n" * 4 if level < 4 else "")
        (tmp_path / f"a{level}.conf").write_text(text)
    conf = parse_slurm_conf(tmp_path / "a0.conf")
    assert conf.includes == INCLUDE_MAX + 1
    assert [p for p in conf.problems if "Includes" in p][0].endswith(
        f"more than {INCLUDE_MAX} Includes: the rest not followed"
    )


# ---------------------------------------------------------------- 10: FIFOs and devices
def _with_fifo(tmp_path, name="f"):
    path = tmp_path / name
    os.mkfifo(path)
    return path


def _no_hang(fn):
    """Run ``fn`` in a thread; a FIFO that blocks it is unblocked by a writer after 10 s
    (so the test ends either way) and the test fails."""
    result: dict = {}
    t = threading.Thread(target=lambda: result.setdefault("rc", fn()), daemon=True)
    t.start()
    t.join(10)
    return t.is_alive(), result.get("rc")


def test_fleet_slurm_nodes_fifo_refused(prom, tmp_path, capsys):
    fifo = _with_fifo(tmp_path)
    hung, rc = _no_hang(lambda: _fleet(prom, "--slurm-nodes", str(fifo)))
    if hung:
        with open(fifo, "wb"):
            pass
    assert not hung and rc == 3
    assert "a FIFO, not a regular file" in capsys.readouterr().err


def test_fleet_slurm_nodes_device_refused(prom, capsys):
    assert _fleet(prom, "--slurm-nodes", "/dev/zero") == 3
    assert "a device, not a regular file" in capsys.readouterr().err


@pytest.mark.parametrize("option", ["--slurm-conf", "--gres-conf", "--cgroup-conf", "include"])
def test_audit_fifo_inputs_refused(tmp_path, capsys, option):
    fifo = _with_fifo(tmp_path, "fifo.conf")
    conf = tmp_path / "slurm.conf"
    conf.write_text("GresTypes=gpu\nNodeName=gn1 Gres=gpu:1\n")
    if option == "include":
        conf.write_text(conf.read_text() + "Include fifo.conf\n")
        argv = ["--slurm-conf", str(conf)]
    elif option == "--slurm-conf":
        argv = ["--slurm-conf", str(fifo)]
    else:
        argv = ["--slurm-conf", str(conf), option, str(fifo)]
    hung, rc = _no_hang(lambda: main(["audit-slurm", "--color", "never", "--json", *argv]))
    if hung:
        with open(fifo, "wb"):
            pass
    assert not hung
    out = capsys.readouterr()
    if option == "include":  # an unreadable Include is a finding, the rest is read
        doc = json.loads(out.out)
        assert any("a FIFO, not a regular file" in f["message"] for f in doc["findings"])
    else:
        assert rc == 3
        assert "a FIFO, not a regular file" in out.err


def test_audit_device_refused(tmp_path, capsys):
    assert main(["audit-slurm", "--slurm-conf", "/dev/zero"]) == 3
    assert "a device, not a regular file" in capsys.readouterr().err


# ---------------------------------------------------------------- 13: answer shapes
@pytest.mark.parametrize(
    "body",
    [
        b"[1,2,3]",
        b'"success"',
        b'{"status":"success","data":[1]}',
        b'{"status":"success","data":{"resultType":"vector","result":"abc"}}',
        b'{"status":"success","data":{"resultType":"vector","result":[[1,2]]}}',
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{"node":5},'
        b'"value":[1,"1"]}]}}',
        b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":5}]}}',
        b"[" * 100000 + b"]" * 100000,
    ],
    ids=[
        "list",
        "string",
        "data-list",
        "result-str",
        "result-item-list",
        "label-int",
        "value-int",
        "deep",
    ],
)
def test_prometheus_wrong_shapes_are_a_clear_error(body, capsys):
    with StubPrometheus() as stub:
        stub.respond = lambda q: (200, body)
        with pytest.raises(PrometheusError, match="Prometheus answered an unexpected shape"):
            PrometheusClient(stub.url, timeout=5).query("up")
        assert main(["fleet", "--prometheus", stub.url, "--scontrol", "/bin/false"]) == 3


@pytest.mark.parametrize("value", ["+Inf", "-Inf", "NaN", None])
def test_non_finite_counts_are_ignored_with_a_note(prom, tmp_path, capsys, value):
    prom.respond = fleet_answer(cards=value, health=value)
    path = tmp_path / "nodes"
    path.write_text(NODE_LINE)
    rc = _fleet(prom, "--slurm-nodes", str(path))
    out = capsys.readouterr().out
    assert "not a count, ignored" in out
    assert rc == 3  # the card registered in Slurm is not seen: unknown


def test_daemon_nodes_skip_infinite_counts():
    notes: list[str] = []
    lab = {"node": "gn1", "vendor": "nvidia", "card_type": "H100", "gres": "gpu"}
    d = daemon_nodes({"cards": [Sample(lab, float("inf"))]}, "node", notes)
    assert sum(d["gn1"].cards.values()) == 0 and len(notes) == 1


# ---------------------------------------------------------------- 15: JSON node types
def test_json_nodes_of_wrong_types_are_unreadable_others_kept():
    doc = {
        "nodes": [
            {"name": ["a"], "state": {"x": 1}, "gres": 5, "partitions": 7},
            {"name": "b", "state": "idle", "state_flags": 5},
            {"name": "c", "state": {"x": 1}},
            {"name": "d", "partitions": 7},
            "e",
            {"name": "gn001", "state": ["IDLE"], "gres": "gpu:H100:1", "partitions": ["p"]},
        ]
    }
    nodes = parse_nodes_json(json.dumps(doc))
    assert [n.name for n in nodes] == ["gn001"]
    assert [u[0] for u in nodes.unreadable] == ["nodes[0]", "b", "c", "d", "nodes[4]"]
    assert "state_flags is a int" in nodes.unreadable[1][1]
    report = build_fleet(nodes, {})
    assert report.exit_code == 3
    assert "Slurm node b unreadable: state_flags" in render(report.to_json())


def test_json_nested_too_deep_is_refused():
    with pytest.raises(ValueError, match="nested too deep"):
        parse_nodes_json('{"nodes": ' + "[" * 200000 + "]" * 200000 + "}")


# ---------------------------------------------------------------- 18: --timeout
@pytest.mark.parametrize("value", ["inf", "1e999", "nan", "-1", "0", "x"])
@pytest.mark.parametrize("command", ["fleet", "audit-slurm"])
def test_timeout_out_of_range_is_a_usage_error(command, value, capsys):
    argv = [command, "--timeout", value]
    if command == "fleet":
        argv += ["--prometheus", "http://127.0.0.1:1"]
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 64
    assert "--timeout" in capsys.readouterr().err


# ---------------------------------------------------------------- 21: escapes
def test_lone_surrogate_node_name_is_escaped_in_the_table():
    nodes = parse_nodes_json('{"nodes": [{"name": "gn\\ud800x", "state": "idle"}]}')
    text = render(build_fleet(nodes, {}).to_json())
    assert "gn\\ud800x" in text
    text.encode("utf-8")  # printable everywhere


def test_prometheus_error_body_is_escaped_on_stderr(tmp_path, capsys):
    hostile = "\x1b]0;owned\x07\x1b[2J"
    with StubPrometheus() as stub:
        stub.respond = lambda q: (
            500,
            json.dumps({"status": "error", "errorType": hostile, "error": hostile}).encode(),
        )
        path = tmp_path / "nodes"
        path.write_text(NODE_LINE)
        assert main(["fleet", "--prometheus", stub.url, "--slurm-nodes", str(path)]) == 3
        err = capsys.readouterr().err
    assert "\x1b" not in err and "\x07" not in err
    assert "\\x1b]0;owned\\x07" in err


def test_an_exporter_instead_of_prometheus_is_named(tmp_path, capsys):
    with StubPrometheus() as stub:
        stub.respond = lambda q: (404, b"404 page not found\n")
        with pytest.raises(PrometheusError, match="the Prometheus server, not an exporter"):
            PrometheusClient(stub.url, timeout=5).query("up")


# ---------------------------------------------------------------- 22: duplicates, names
def test_duplicate_node_counted_once_and_said(prom, tmp_path, capsys):
    path = tmp_path / "nodes"
    path.write_text(NODE_LINE * 2)
    assert _fleet(prom, "--slurm-nodes", str(path)) == 1
    out = capsys.readouterr().out
    assert "listed twice by Slurm (counted once): gn001" in out
    assert "fleet: 1 nodes, WARNING (exit 1)" in out


def test_empty_node_name_is_an_unreadable_line():
    nodes = parse_nodes_text("NodeName= State=IDLE\n" + NODE_LINE)
    assert [n.name for n in nodes] == ["gn001"]
    assert nodes.unreadable == [("(empty NodeName=)", "a node line with an empty NodeName=")]
    assert build_fleet(nodes, {}).exit_code == 3


def test_cards_seen_but_not_registered_is_not_ok(prom, tmp_path, capsys):
    path = tmp_path / "nodes"
    path.write_text("NodeName=gn001 State=IDLE Gres=(null) Partitions=batch\n")
    assert _fleet(prom, "--slurm-nodes", str(path)) == 1
    out = capsys.readouterr().out
    assert "cards seen but not registered in Slurm Gres=: 1 node: gn001" in out


# ------------------------------------------------- issue 21 item 10: bounded answers, one deadline
def test_fleet_timeout_is_one_deadline_for_every_query(tmp_path, capsys):
    """`fleet --timeout 1` against a Prometheus that takes 0.4 s per answer: four queries
    took 1.6 s and more (each had its own 1 s; a 200 MB answer took 85 s under
    `--timeout 10`). The whole command now stops at its --timeout.

    Here each answer takes 1.5 s under `--timeout 2`: a timeout per query lets all four
    through (6 s); one deadline stops at 2 s. The bound, 4 s, lies between the two with
    room for a loaded machine either side."""
    import time

    slow = fleet_answer()

    def respond(query: str) -> tuple[int, bytes]:
        time.sleep(1.5)
        return slow(query)

    nodes = tmp_path / "nodes"
    nodes.write_text(NODE_LINE)
    with StubPrometheus() as stub:
        stub.respond = respond
        start = time.monotonic()
        rc = main(["fleet", "--prometheus", stub.url, "--slurm-nodes", str(nodes),
                   "--timeout", "2", "--color", "never"])  # fmt: skip
        took = time.monotonic() - start
    assert rc == 3
    assert took < 4, (took, capsys.readouterr().err)


def test_prometheus_answer_bound_fits_a_fleet_not_a_flood():
    """A 20 MB answer (the hostile trial sent 200 MB: 7.4 GB of memory once parsed) is
    refused unread; the bound is 16 MiB, some three times a 10,000-node fleet's answer."""
    from hetpatrol.cluster.prom_query import ANSWER_MAX

    assert ANSWER_MAX == 16 * 1024 * 1024
    with StubPrometheus() as stub:
        big = vector(*[({"node": f"n{i:07d}", "instance": f"n{i:07d}:9477"}, "1")
                       for i in range(250_000)])  # fmt: skip
        assert len(big) > 20_000_000
        stub.respond = lambda q: (200, big)
        with pytest.raises(PrometheusError, match=r"larger than 16777216 bytes"):
            PrometheusClient(stub.url, timeout=10).query("up")


def _script(tmp_path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(0o755)
    return str(path)


def test_scontrol_answer_over_the_bound_is_refused_not_parsed(tmp_path, monkeypatch):
    """scontrol's answer was read whole, however large. Past the bound scontrol is killed
    and the answer refused (the bound made small here: 1 MB, a 3 MB answer)."""
    from hetpatrol.cluster import slurm_nodes
    from hetpatrol.cluster.slurm_nodes import SlurmReadError, read_nodes

    monkeypatch.setattr(slurm_nodes, "SCONTROL_OUTPUT_MAX", 1024 * 1024)
    line = NODE_LINE.strip()
    flood = _script(
        tmp_path, "scontrol", f'[ "$1" = --json ] && exit 1\nyes "{line}" | head -c 3000000\n'
    )
    with pytest.raises(SlurmReadError, match=r"printed more than 1048576 bytes: killed"):
        read_nodes([flood], timeout=10)


def test_scontrol_timeout_covers_both_of_its_calls(tmp_path):
    """read_nodes runs `scontrol --json show node`, then the text form: each had the whole
    timeout, so a slow scontrol took twice --timeout."""
    import time

    from hetpatrol.cluster.slurm_nodes import SlurmReadError, read_nodes

    # the JSON call fails after 3 s of the 4 s: one deadline ends at 4 s, a timeout per
    # call at 7 s; the bound lies between the two with room for a loaded machine
    slow = _script(tmp_path, "scontrol", '[ "$1" = --json ] && { sleep 3; exit 1; }\nsleep 60\n')
    start = time.monotonic()
    with pytest.raises(SlurmReadError, match="no answer within"):
        read_nodes([slow], timeout=4.0)
    assert time.monotonic() - start < 5.5


def test_ledger_scontrol_answer_is_bounded(tmp_path, monkeypatch):
    """The ledger's scontrol reads (audit, node types) read the whole answer: capped now."""
    from hetpatrol.ledger import slurm_state

    monkeypatch.setattr(slurm_state, "OUTPUT_MAX", 1024 * 1024)
    flood = _script(tmp_path, "scontrol", "yes NodeName=x | head -c 3000000\n")
    with pytest.raises(slurm_state.SlurmQueryError, match="printed more than 1048576 bytes"):
        slurm_state.run([flood, "show", "node", "-o"])
    hang = _script(tmp_path, "hang", "sleep 30\n")
    with pytest.raises(slurm_state.SlurmQueryError, match="no answer within 0.5 s: killed"):
        slurm_state.run([hang], timeout=0.5)
