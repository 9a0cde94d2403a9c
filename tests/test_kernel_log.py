"""Kernel log: every recorded dmesg / kmsg / syslog sample parsed, classified and judged.

Expected values (XID numbers, bus ids, pids, process names, NVLink units and links,
UUIDs) were read off the sample files by eye, not taken from the parser's output.
"""

from __future__ import annotations

import errno
import json
import os
import time
from dataclasses import replace

import jsonschema
import pytest
from conftest import NODES, samples_dir

from hetpatrol.checks.kernel_events import KernelLogRules, apply_kernel_log, classify
from hetpatrol.config import load_config
from hetpatrol.kernel_log import (
    KernelLog,
    KmsgReader,
    TextLogReader,
    parse_text,
)
from hetpatrol.patrol import Patroller
from hetpatrol.schema import CardRecord, jsonl_json_schema


def sample(name: str) -> str:
    return (samples_dir("nvidia") / name).read_text()


def brief(events):
    return [(e.kind, e.xid or e.reason, e.bus_id, e.pid, e.process) for e in events]


def rfc(ts: float) -> str:
    return f"T{ts:.0f}"


# ------------------------------------------------------------------ every sample parsed


def test_fallen_off_bus_multiline_without_xid():
    events = parse_text(sample("dmesg_fallen-off-bus_multiline_no-xid.txt"))
    # three lines, continuation lines indented: one event; "probe routine failed" and
    # the module banner name no GPU fault of their own
    assert brief(events) == [("kernel", "fallen_off_bus", "0000:b3:00.0", None, None)]
    assert events[0].log_time == "1843.308145"
    assert events[0].raw.count("\n") == 2  # the three lines kept as read


def test_xid_119_dmesg_ctime_with_uuid_line():
    events = parse_text(sample("dmesg_xid-119_gsp-rpc-timeout_H100.txt"))
    assert brief(events) == [
        ("xid", 119, "0000:9b:00.0", 2024380, "nvidia-smi"),
        ("xid", 119, "0000:9b:00.0", 2024380, "nvidia-smi"),
        ("xid", 119, "0000:9b:00.0", 2024380, "nvidia-smi"),
        ("xid", 119, "0000:9b:00.0", 1263500, "cache_mgr_main"),
        ("xid", 119, "0000:9b:00.0", 1240590, "gpud"),
    ]
    # "NVRM: GPU at PCI:0000:9b:00: GPU-f93d72bb-..." names the GPU of the later Xids
    assert {e.uuid for e in events} == {"GPU-f93d72bb-6655-1c83-50ef-7a089581ec38"}
    assert [e.log_time for e in events][:2] == [
        "Sun Feb 23 16:24:18 2025",
        "Sun Feb 23 16:24:24 2025",
    ]
    assert events[0].message.startswith(
        "Timeout after 6s of waiting for RPC response from GPU4 GSP!"
    )


def test_xid_13_unknown_pid_then_109():
    events = parse_text(sample("dmesg_xid-13-109_H100.txt"))
    # pid='<unknown>' (quoted) and name=<unknown> (unquoted) are "not known", not text
    assert brief(events) == [
        ("xid", 13, "0000:cb:00.0", None, None),
        ("xid", 13, "0000:cb:00.0", None, None),
        ("xid", 13, "0000:cb:00.0", None, None),
        ("xid", 109, "0000:cb:00.0", 1797828, "pt_main_thread"),
    ]
    assert events[3].message == "Ch 00000008, errorString CTX SWITCH TIMEOUT, Info 0x58005"


def test_old_xid_lines_without_pid_or_name():
    events = parse_text(sample("dmesg_xid-32-31_2015.txt"))
    assert brief(events) == [
        ("xid", 32, "0000:01:00.0", None, None),
        ("xid", 32, "0000:01:00.0", None, None),
        ("xid", 31, "0000:01:00.0", None, None),
    ]
    assert events[2].message == "Ch 00000003, engmask 00000101, intr 10000000"
    assert [e.clock for e in events][0] == ("boot", 24128.828315)


def test_bare_grep_line_xid_63():
    (ev,) = parse_text(sample("dmesg_xid-63_row-remapper.txt"))
    assert brief([ev]) == [("xid", 63, "0000:10:1c.0", 1896, None)]
    assert ev.log_time is None and ev.clock is None


def test_nvlink5_subcodes_and_nonzero_pci_domains():
    events = parse_text(sample("kmsg_xid-149-145-94_nvlink5-format.txt"))
    got = [(e.xid, e.bus_id, e.nvlink_unit, e.fatal, e.link, e.pid, e.process) for e in events]
    assert got == [
        (149, "0019:01:00.0", "NETIR", True, -1, None, None),
        (149, "0000:00:00.0", "NETIR_LINK_EVT", True, 0, None, None),
        (145, "0018:01:00.0", "RLW_RXPIPE", False, 13, None, None),
        (94, "0000:9b:00.0", None, None, None, 1234, "python3"),
    ]


def test_syslog_rm_init_adapter_and_xid_48_64():
    events = parse_text(sample("syslog_xid-48-dbe_xid-64_rminitadapter-failed.txt"))
    assert [(e.kind, e.xid or e.reason, e.bus_id) for e in events] == [
        ("kernel", "rm_init_adapter_failed", "0000:0a:00.0"),  # rm_init_adapter failed
        ("kernel", "rm_init_adapter_failed", "0000:0a:00.0"),  # RmInitAdapter failed!
        ("kernel", "rm_init_adapter_failed", "0000:0a:00.0"),
        ("xid", 48, "0000:07:00.0"),
        ("xid", 64, "0000:07:00.0"),
        ("kernel", "rm_init_adapter_failed", "0000:0a:00.0"),
        ("kernel", "rm_init_adapter_failed", "0000:0a:00.0"),
        ("kernel", "rm_init_adapter_failed", "0000:0a:00.0"),
        ("kernel", "rm_init_adapter_failed", "0000:0a:00.0"),
    ]
    # the syslog time and the dmesg stamp inside it: the dmesg stamp is the clock
    assert events[3].log_time == "219.470994"
    assert events[3].clock == ("boot", 219.470994)


# ------------------------------------------------------------------ other line shapes

XID_13 = (
    "NVRM: Xid (PCI:0000:cb:00): 13, pid='<unknown>', name=<unknown>, Graphics SM Warp "
    "Exception on (GPC 7, TPC 7, SM 0): Illegal Instruction Parameter"
)


@pytest.mark.parametrize(
    ("line", "log_time"),
    [
        (f"4,1234,5678901,-;{XID_13}", "5.678901"),  # /dev/kmsg record
        (
            f"kern: warning: [2024-08-30T11:43:09.123456789Z]: {XID_13}",
            "2024-08-30T11:43:09.123456789Z",
        ),  # Talos
        (
            f"2024-08-30T11:43:09.123456+00:00 node-01 kernel: {XID_13}",
            "2024-08-30T11:43:09.123456+00:00",
        ),
        (f"Aug 30 11:43:09 node-01 kernel: {XID_13}", "Aug 30 11:43:09"),
        (f"kernel: {XID_13}", None),
        (f"<4>[ 1843.308145] {XID_13}", "1843.308145"),  # dmesg -r
        (f"2024-08-30T11:43:09,123456+00:00 {XID_13}", "2024-08-30T11:43:09,123456+00:00"),
    ],
)
def test_prefix_shapes(line, log_time):
    (ev,) = parse_text(line + "\n")
    assert (ev.xid, ev.bus_id, ev.pid, ev.process, ev.log_time) == (
        13,
        "0000:cb:00.0",
        None,
        None,
        log_time,
    )


def test_non_ascii_digits_are_not_an_xid_or_a_pid():
    arabic = "NVRM: Xid (PCI:0000:9b:00): \u0667\u0669, pid=1, name=python3, GPU gone\n"
    assert parse_text(arabic) == []  # not Xid 79: an Xid line that does not parse
    (ev,) = parse_text("NVRM: Xid (PCI:0000:9b:00): 79, pid=\u0667, name=x, GPU gone\n")
    assert (ev.xid, ev.bus_id, ev.pid, ev.message) == (
        79,
        "0000:9b:00.0",
        None,
        "pid=\u0667, name=x, GPU gone",
    )


def test_kmsg_record_with_escaped_newlines_and_dictionary():
    text = (
        "3,2104,1843308160,-;NVRM: The NVIDIA GPU 0000:b3:00.0\\x0aNVRM: (PCI ID: 10de:26b5) "
        "installed in this system has\\x0aNVRM: fallen off the bus and is not responding to "
        "commands.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:b3:00.0\n"
    )
    (ev,) = parse_text(text)
    assert (ev.kind, ev.reason, ev.bus_id, ev.seq) == (
        "kernel",
        "fallen_off_bus",
        "0000:b3:00.0",
        2104,
    )


def test_reset_required_and_154_actions():
    events = parse_text(
        "NVRM: GPU 0000:3b:00.0: RmInitAdapter failed! (0x62:NV_ERR_RESET_REQUIRED:1696)\n"
        "NVRM: Xid (PCI:0000:3b:00): 154, GPU recovery action changed from 0x0 (None) to "
        "0x1 (GPU Reset Required)\n"
        "NVRM: Xid (PCI:0000:5d:00): 154, GPU recovery action changed from 0x1 (GPU Reset "
        "Required) to 0x0 (None)\n"
    )
    assert [(e.kind, e.xid or e.reason, e.recovery_action) for e in events] == [
        ("kernel", "reset_required", None),
        ("xid", 154, "GPU Reset Required"),
        ("xid", 154, "None"),
    ]
    rules = KernelLogRules()
    severities = [classify(_occ(e), 1, rules)[0] for e in events]
    assert severities == ["critical", "critical", "info"]


# ------------------------------------------------------------------ classification


def _occ(ev, count=1):
    from hetpatrol.kernel_log import KernelOccurrence

    return KernelOccurrence(1, ev, 0.0, 0.0, count)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("dmesg_fallen-off-bus_multiline_no-xid.txt", ["critical"]),
        ("dmesg_xid-119_gsp-rpc-timeout_H100.txt", ["critical"] * 5),
        ("dmesg_xid-13-109_H100.txt", ["warning", "warning", "warning", "critical"]),
        ("dmesg_xid-32-31_2015.txt", ["warning", "warning", "warning"]),  # 32 unlisted
        ("dmesg_xid-63_row-remapper.txt", ["info"]),
        ("kmsg_xid-149-145-94_nvlink5-format.txt", ["critical", "critical", "warning", "warning"]),
        (
            "syslog_xid-48-dbe_xid-64_rminitadapter-failed.txt",
            ["critical"] * 9,
        ),
    ],
)
def test_every_sample_classified(name, expected):
    rules = KernelLogRules()
    events = parse_text(sample(name))
    assert [classify(_occ(e), 1, rules)[0] for e in events] == expected


def test_xid_94_repeated_escalates_and_overrides():
    (ev,) = [e for e in parse_text(sample("kmsg_xid-149-145-94_nvlink5-format.txt")) if e.xid == 94]
    rules = KernelLogRules()
    assert classify(_occ(ev), 1, rules) == ("warning", "application")
    assert classify(_occ(ev), 3, rules) == ("critical", "drain")
    quiet = KernelLogRules(xid_severity={94: "info"}, repeat_critical={})
    assert classify(_occ(ev), 9, quiet) == ("info", "application")


# ------------------------------------------------------------------ the source


class _Clock:
    def __init__(self, t=1_000_000.0):
        self.t = t

    def __call__(self):
        return self.t


def test_burst_folding_window_and_totals(tmp_path):
    log = tmp_path / "kmsg.txt"
    log.write_text(sample("dmesg_xid-119_gsp-rpc-timeout_H100.txt"))
    clock = _Clock()
    src = KernelLog(TextLogReader(log), window_seconds=600, burst_seconds=10, clock=clock)
    snap = src.poll()
    # 16:24:18, :24, :30 chain within 10 s -> one episode of 3; 16:27:12; 16:30:13
    assert [o.count for o in snap.new] == [3, 1, 1]
    assert snap.window_counts == {("0000:9b:00.0", "xid", "119"): 5}
    assert snap.totals == {("0000:9b:00.0", "xid", "119"): 5}
    assert snap.uuids == {"0000:9b:00.0": "GPU-f93d72bb-6655-1c83-50ef-7a089581ec38"}
    # nothing new: no event; the window still holds them until it passes
    clock.t += 300
    again = src.poll()
    assert again.new == () and len(again.window) == 3
    clock.t += 301
    assert src.poll().window == ()
    # an appended line is read on the next poll (the file is followed)
    with log.open("a") as f:
        f.write(
            "[Sun Feb 23 17:30:13 2025] NVRM: Xid (PCI:0000:9b:00): 119, pid=1, name=x, Timeout\n"
        )
    snap = src.poll()
    assert [(o.event.xid, o.count) for o in snap.new] == [(119, 1)]
    assert snap.totals[("0000:9b:00.0", "xid", "119")] == 6


def test_text_reader_missing_file_is_absent(tmp_path):
    snap = KernelLog(TextLogReader(tmp_path / "kmsg.txt")).poll()
    assert (snap.state, snap.new) == ("absent", ())
    assert "kmsg.txt" in snap.error


class _FakeKmsg:
    """os.open/os.read for /dev/kmsg: one record per read, EAGAIN at the end."""

    def __init__(self, records, error=None):
        self.records = [r.encode() for r in records]
        self.error = error
        self.sizes = []

    def open(self, path, flags):
        if self.error:
            raise OSError(self.error, os.strerror(self.error))
        assert flags & os.O_NONBLOCK
        return 99

    #: what os.stat/os.fstat say of the fake /dev/kmsg: character device 1:11
    KMSG_STAT = os.stat_result((0o20444, 0, 0, 1, 0, 0, 0, 0, 0, 0), {"st_rdev": os.makedev(1, 11)})

    def stat(self, path, *args, real=os.stat, **kwargs):
        return self.KMSG_STAT if str(path) == "/dev/kmsg" else real(path, *args, **kwargs)

    def fstat(self, fd, real=os.fstat):
        return self.KMSG_STAT if fd == 99 else real(fd)

    def read(self, fd, size):
        self.sizes.append(size)
        if not self.records:
            raise BlockingIOError(errno.EAGAIN, "again")
        record = self.records.pop(0)
        if record == b"EPIPE":
            raise OSError(errno.EPIPE, "overwritten")
        return record


def test_kmsg_reader_one_record_per_read_and_boot_time(monkeypatch):
    body = sample("kmsg_xid-149-145-94_nvlink5-format.txt").splitlines()
    fake = _FakeKmsg(
        [
            f"4,{100 + i},{(50 + i) * 1_000_000},-;{line}\n SUBSYSTEM=pci\n"
            for i, line in enumerate(body)
        ]
        + ["EPIPE", "4,90,1000,-;NVRM: Xid (PCI:0000:9b:00): 79, old record seen again\n"]
    )
    import hetpatrol.kernel_log as kl

    monkeypatch.setattr(kl.os, "open", fake.open)
    monkeypatch.setattr(kl.os, "read", fake.read)
    monkeypatch.setattr(kl.os, "close", lambda fd: None)
    monkeypatch.setattr(kl.os, "stat", fake.stat)
    monkeypatch.setattr(kl.os, "fstat", fake.fstat)
    result = KmsgReader("/dev/kmsg").read()
    assert set(fake.sizes) == {8192}
    assert result.lost == 1
    # the record with an older sequence number than the last one read is skipped
    assert [(e.xid, e.seq) for e, _ in result.events] == [
        (149, 100),
        (149, 101),
        (145, 102),
        (94, 103),
    ]
    whens = [w for _, w in result.events]
    assert all(w is not None for w in whens) and whens[1] - whens[0] == pytest.approx(1.0)


def test_kmsg_reader_without_permission_says_so_once(monkeypatch):
    import hetpatrol.kernel_log as kl

    fake = _FakeKmsg([], error=errno.EACCES)
    monkeypatch.setattr(kl.os, "open", fake.open)
    snap = KernelLog(KmsgReader("/dev/kmsg")).poll()
    assert snap.state == "absent"
    assert snap.error.startswith("cannot read /dev/kmsg: Permission denied (")


def test_real_dev_kmsg_reads_without_blocking():
    if not os.access("/dev/kmsg", os.R_OK):
        pytest.skip("/dev/kmsg is not readable here")
    reader = KmsgReader("/dev/kmsg")
    try:
        first = reader.read()
        assert first.state == "ok"
        assert reader.read().state == "ok"  # nothing new: returns at once
    finally:
        reader.close()


# ------------------------------------------------------------------ judging onto cards


def _cards():
    return [
        CardRecord(vendor="nvidia", index=4, bus_id="0000:9b:00.0", uuid="GPU-a", health="ok"),
        CardRecord(vendor="nvidia", index=6, bus_id="0000:cb:00.0", uuid="GPU-b", health="ok"),
    ]


def test_findings_on_cards_and_node_and_event_lines(tmp_path):
    log = tmp_path / "kmsg.txt"
    log.write_text(
        sample("dmesg_xid-13-109_H100.txt")
        + sample("syslog_xid-48-dbe_xid-64_rminitadapter-failed.txt")
    )
    cards = _cards()
    rules = KernelLogRules()
    # a recording standing for the present (a replay's kmsg.txt)
    snap = KernelLog(TextLogReader(log), clock=_Clock(), replay=True).poll()
    lines, node = apply_kernel_log(snap, cards, rules, node="n1", seq=7, ts_format=rfc)
    gpu6 = cards[1]
    assert gpu6.health == "critical"  # XID 109
    (f,) = [f for f in gpu6.findings if f.check == "xid"]
    assert f.value == {"13": 3, "109": 1}
    # GPUs 0000:07:00.0 (XID 48, 64) and 0000:0a:00.0 (RmInitAdapter) are not cards
    assert sorted((x.check, x.severity) for x in node) == [
        ("kernel_fault", "critical"),
        ("xid", "critical"),
    ]
    assert "0000:07:00.0" in next(x.message for x in node if x.check == "xid")
    schema = jsonl_json_schema()
    for line in lines:
        jsonschema.validate(line, schema)
    by_xid = {(e["xid"], e["bus_id"]): e for e in lines if e["event"] == "xid"}
    e13 = by_xid[(13, "0000:cb:00.0")]
    assert (e13["severity"], e13["class"], e13["count"], e13["index"]) == (
        "warning",
        "application",
        3,
        6,
    )
    assert by_xid[(109, "0000:cb:00.0")]["pid"] == 1797828
    assert by_xid[(48, "0000:07:00.0")]["index"] is None
    assert cards[0].health == "ok" and cards[0].findings == []


def test_events_before_the_window_make_no_finding():
    ev = parse_text(sample("dmesg_xid-63_row-remapper.txt"))[0]
    ev79 = replace(ev, xid=79, message="GPU has fallen off the bus.", bus_id="0000:9b:00.0")

    class Reader:
        path = "x"

        def read(self):
            from hetpatrol.kernel_log import ReadResult

            return ReadResult(events=[(ev79, 1_000_000.0 - 7200)])  # two hours ago

        def close(self):
            pass

    snap = KernelLog(Reader(), window_seconds=3600, clock=_Clock()).poll()
    cards = _cards()
    lines, node = apply_kernel_log(snap, cards, KernelLogRules(), node="n", seq=1, ts_format=rfc)
    assert [(e["xid"], e["in_window"], e["window_count"]) for e in lines] == [(79, False, 0)]
    assert cards[0].health == "ok" and node == []


# ------------------------------------------------------------------ whole-node scenarios


def _once(name):
    config = replace(load_config(), node="n1")
    patroller = Patroller(config, replay_dir=NODES / name)
    try:
        return patroller.run()
    finally:
        patroller.close()


def test_xid_79_node():
    report = _once("xid-79")
    assert report.exit_code == 2
    gpu6 = next(c for c in report.cards if c.index == 6)
    assert gpu6.vendor_health == "gpu_is_lost"
    checks = {f.check: f.severity for f in gpu6.findings}
    assert checks == {"vendor_health": "critical", "xid": "critical", "kernel_fault": "critical"}
    events = [json.loads(line) for line in report.event_lines]
    assert [
        (e["event"], e["xid"], e["reason"], e["bus_id"], e["index"], e["uuid"]) for e in events
    ] == [
        ("xid", 79, None, "0000:cb:00.0", 6, "GPU-d7051dd7-616a-cb6a-4aaf-7901dc199334"),
        (
            "kernel",
            None,
            "fallen_off_bus",
            "0000:cb:00.0",
            6,
            "GPU-d7051dd7-616a-cb6a-4aaf-7901dc199334",
        ),
    ]
    assert [e["kmsg_seq"] for e in events] == [2103, 2104]
    others = [c.health for c in report.cards if c.index != 6]
    assert others == ["ok"] * 7
    # the JSONL sink writes cards, then events, then the patrol line
    kinds = [json.loads(line)["kind"] for line in report.jsonl_lines()]
    assert kinds == ["card"] * 8 + ["event", "event", "patrol"]
    patrol = json.loads(report.patrol_line)
    assert patrol["kernel_log"]["state"] == "ok" and patrol["kernel_log"]["new_events"] == 2


def test_nvlink_storm_node():
    report = _once("nvlink-storm")
    assert report.exit_code == 2
    health = {c.index: c.health for c in report.cards}
    assert health == {
        0: "warning",
        1: "warning",
        2: "critical",
        3: "warning",
        4: "ok",
        5: "ok",
        6: "ok",
        7: "ok",
    }
    events = [json.loads(line) for line in report.event_lines]
    assert [(e["xid"], e["index"], e["count"]) for e in events] == [
        (145, 0, 6), (145, 1, 6), (145, 2, 6), (145, 3, 6),
        (149, 2, 1),
        (45, 0, 1), (45, 1, 1), (45, 2, 1), (45, 3, 1),
    ]  # fmt: skip
    e149 = events[4]
    assert (e149["nvlink_unit"], e149["fatal"], e149["link"], e149["severity"]) == (
        "NETIR_LINK_EVT",
        True,
        7,
        "critical",
    )
    assert [(e["pid"], e["process"], e["class"]) for e in events[5:]] == [
        (48213, "python3", "application"),
        (48214, "python3", "application"),
        (48215, "python3", "application"),
        (48216, "python3", "application"),
    ]
    gpu0 = next(c for c in report.cards if c.index == 0)
    (xf,) = [f for f in gpu0.findings if f.check == "xid"]
    assert xf.value == {"145": 6, "45": 1}


def test_healthy_node_without_kernel_log_is_still_ok():
    report = _once("healthy-mixed")
    assert report.exit_code == 0
    assert report.event_lines == ()
    assert json.loads(report.patrol_line)["kernel_log"]["state"] == "absent"


def test_second_patrol_writes_no_event_again_but_keeps_the_finding():
    config = replace(load_config(), node="n1")
    patroller = Patroller(config, replay_dir=NODES / "xid-79")
    try:
        first, second = patroller.run(), patroller.run()
    finally:
        patroller.close()
    assert len(first.event_lines) == 2 and second.event_lines == ()
    gpu6 = next(c for c in second.cards if c.index == 6)
    assert {"xid", "kernel_fault"} <= {f.check for f in gpu6.findings}


def test_prometheus_xid_counter_and_kernel_log_up():
    from prometheus_client.parser import text_string_to_metric_families

    from hetpatrol.exporters.prometheus import Exposition

    report = _once("nvlink-storm")
    text = Exposition(["nvidia"]).update(report, 1).decode()
    samples = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            samples.setdefault(s.name, []).append(s)
    assert samples["hetpatrol_kernel_log_up"][0].value == 1
    got = {
        (s.labels["index"], s.labels["xid"]): s.value
        for s in samples["hetpatrol_card_xid_events_total"]
    }
    assert got[("2", "149")] == 1 and got[("0", "145")] == 6 and got[("3", "45")] == 1
    assert len(got) == 9


def test_a_fifo_as_recorded_kernel_log_is_refused_without_blocking(tmp_path):
    import os
    import signal

    from hetpatrol.kernel_log import TextLogReader

    fifo = tmp_path / "kmsg.txt"
    os.mkfifo(fifo)
    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError()))
    signal.alarm(10)
    try:
        result = TextLogReader(fifo).read()
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert result.state == "failed"
    assert "not a regular file" in result.error


def test_a_huge_text_log_is_read_from_its_tail_a_bounded_read_at_a_time(tmp_path, monkeypatch):
    """A 100 KB log with a 4 KB read bound: the first read takes only its last 4 KB
    (the XID there is seen, the one before is skipped and the skip said); 10 KB appended
    at once are read over three patrols; a line with no newline is never held whole."""
    import hetpatrol.kernel_log as kl

    monkeypatch.setattr(kl, "TEXT_READ_MAX", 4096)
    xid = "NVRM: Xid (PCI:0000:9b:00): {}, pid=1, name=x, Timeout\n"
    filler = "kernel: unrelated line padding the log to size.....\n"  # 52 bytes
    log = tmp_path / "kern.log"
    log.write_text(xid.format(13) + filler * 2000 + xid.format(119))
    size = log.stat().st_size
    reader = kl.TextLogReader(log)
    first = reader.read()
    assert first.state == "ok"
    assert [e.xid for e, _ in first.events] == [119]
    assert first.error == (
        f"{log} is {size} bytes: read from its last 4096 ({size - 4096} bytes at its start skipped)"
    )
    with log.open("a") as f:
        f.write(filler * 100 + xid.format(79) + filler * 100)  # 10,454 bytes
    seen = []
    for _ in range(3):
        got = reader.read()
        assert got.error is None
        seen += [e.xid for e, _ in got.events]
    assert seen == [79]
    assert reader.read().events == []
    with log.open("a") as f:
        f.write("x" * 9000)  # no newline: dropped once over the bound, not kept growing
    for _ in range(3):
        reader.read()
    assert len(reader._partial) <= 4096


@pytest.mark.parametrize("device", ["/dev/urandom", "/dev/null"])
def test_a_char_device_other_than_kmsg_is_refused_unread(device, monkeypatch):
    """``kernel_log.path: /dev/urandom`` is a character device but not /dev/kmsg (1:11):
    it is neither opened nor read, and the source says so."""
    import hetpatrol.kernel_log as kl

    if not os.path.exists(device):
        pytest.skip(f"{device} is missing here")
    opened = []
    real_open = os.open
    monkeypatch.setattr(kl.os, "open", lambda p, *a: opened.append(p) or real_open(p, *a))
    log = kl.open_kernel_log(True, device, window_seconds=3600.0, burst_seconds=5.0)
    assert isinstance(log.reader, KmsgReader)
    try:
        snap = log.poll()
        again = log.poll()
    finally:
        log.close()
    error = f"{device} is not the kernel log device (character device 1:11, /dev/kmsg): not read"
    assert (snap.state, snap.error, snap.new, snap.totals) == ("failed", error, (), {})
    assert (again.state, again.error) == ("failed", error)
    assert device not in opened


def test_a_device_swapped_in_after_the_check_is_closed_unread(monkeypatch):
    """The open file is checked too: a path that stat()s as /dev/kmsg but opens as
    /dev/null (swapped between the two) is closed without a read."""
    import hetpatrol.kernel_log as kl

    kmsg = os.stat_result((0o20444, 0, 0, 1, 0, 0, 0, 0, 0, 0), {"st_rdev": os.makedev(1, 11)})
    real_stat = os.stat
    monkeypatch.setattr(
        kl.os, "stat", lambda p, *a, **k: kmsg if p == "/dev/null" else real_stat(p, *a, **k)
    )
    reads = []
    monkeypatch.setattr(kl.os, "read", lambda fd, n: reads.append(fd) or b"")
    reader = KmsgReader("/dev/null")
    result = reader.read()
    assert (result.state, result.error) == (
        "failed",
        "/dev/null is not the kernel log device (character device 1:11, /dev/kmsg): not read",
    )
    assert reads == [] and reader._fd is None


XID79_EVENT = parse_text(
    "NVRM: Xid (PCI:0000:9b:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen off the bus.\n"
)[0]


def _one_event_snapshot(ev):
    class Reader:
        path = "x"

        def read(self):
            from hetpatrol.kernel_log import ReadResult

            return ReadResult(events=[(ev, None)])

        def close(self):
            pass

    return KernelLog(Reader(), window_seconds=3600, clock=_Clock()).poll()


def _blind(index, uuid=None):
    return CardRecord(vendor="nvidia", index=index, bus_id=None, uuid=uuid, health="ok")


@pytest.mark.parametrize(
    ("cards", "matched"),
    [
        ([_blind(4)], 4),  # the one GPU without a bus id: by elimination
        ([_blind(4), _blind(5)], None),  # two: either could be it
        ([_blind(4), _blind(5, uuid="GPU-e")], None),  # one has a UUID, still no bus id
        ([_blind(4, uuid="GPU-e")], None),  # another UUID than the event's
    ],
)
def test_an_xid_is_matched_by_elimination_only_to_the_one_gpu_it_can_be(cards, matched):
    """XID 79 on 0000:9b:00.0 (its UUID named by the log) while NVML reads some GPUs
    without a bus id: a card without one gets it only when it is the only such card of
    the vendor (and names no other UUID); else it is a node finding by bus id."""
    ev = replace(
        XID79_EVENT, bus_id="0000:9b:00.0", uuid="GPU-f93d72bb-6655-1c83-50ef-7a089581ec38"
    )
    cards = [*cards, CardRecord(vendor="nvidia", index=0, bus_id="0000:07:00.0", health="ok")]
    snap = _one_event_snapshot(ev)
    lines, node = apply_kernel_log(snap, cards, KernelLogRules(), node="n", seq=1, ts_format=rfc)
    assert lines[0]["index"] == matched
    bad = [c.index for c in cards if c.health == "critical"]
    assert bad == ([] if matched is None else [matched])
    assert [f.check for f in node] == ([] if matched is not None else ["xid"])


# ------------------------------------------------------------------ NVLink5 144-150 decode
# Expected buckets read by hand off NVIDIA's catalog sheet "XID 144-150 Decode"
# (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): the unit from
# IntrInfo (V1: bits 9:5 with bits 4:0 = XID - 143; V2: bits 6:0), then the row by Error
# Status, for NETIR_LINK_EVT by the sub-code in IntrInfo[25:20].
GPUD_PR_1160 = "https://github.com/leptonai/gpud/pull/1160 (description, 2025-12-01)"
GPUD_TEST = (
    "leptonai/gpud components/accelerator/nvidia/xid/health_state_test.go "
    "@4a8de33a3f02e207f39e9023d67125592d599731"
)
GPUD_KMSG = (
    "leptonai/gpud components/accelerator/nvidia/xid/kmsg.go (comment) "
    "@4a8de33a3f02e207f39e9023d67125592d599731"
)
WORDS = "0x00000000 0x00000000 0x00000000 0x00000000"
NVLINK5_LINES = [
    # (line, source, catalog bucket, severity)
    (
        "NVRM: Xid (PCI:0000:01:00): 144, SAW_MVB Nonfatal XC0 i0 Link 0 "
        f"(0x00000001 0x00000008 {WORDS})",
        GPUD_PR_1160,  # V2 unit 1 SAW_MVB, status 0x8: IGNORE
        "IGNORE",
        "warning",
    ),
    (
        "NVRM: Xid (PCI:0000:00:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 00 "
        f"(0x026001c6 0x00000000 {WORDS})",
        GPUD_PR_1160,  # V1 unit 14, sub-code 38 (100110): IGNORE, whatever it prints
        "IGNORE",
        "warning",
    ),
    (
        "NVRM: Xid (PCI:0008:06:00): 145, RLW_REMAP Nonfatal XC0 i0 Link 0 "
        f"(0x00000004 0x00000001 {WORDS})",
        GPUD_TEST,  # V2 unit 4 RLW_REMAP, status 0x1: XID_154_EVAL
        "XID_154_EVAL",
        "warning",
    ),
    (
        "NVRM: Xid (PCI:0018:01:00): 149, NETIR_LINK_EVT Fatal XC0 i0 Link 08 "
        f"(0x004505c6 0x00000000 {WORDS})",
        GPUD_KMSG,  # V1 unit 14, sub-code 4 (000100): RESET_GPU, INVESTIGATE_LINK_SI
        "RESET_GPU",
        "critical",
    ),
    (
        "NVRM: Xid (PCI:0000:04:00): 145, RLW_CTRL Nonfatal XC0 i0 Link 00 "
        "(0x00000003 0x80000000 0x00000000 0x00000000)",
        GPUD_TEST,  # V2 unit 3 RLW_CTRL, status 0x80000000: IGNORE
        "IGNORE",
        "warning",
    ),
]


@pytest.mark.parametrize(("line", "source", "bucket", "severity"), NVLINK5_LINES)
def test_nvlink5_xids_are_decoded_as_the_catalog_decodes_them(line, source, bucket, severity):
    (ev,) = parse_text(line + "\n")
    assert ev.nvlink_action == bucket, source
    assert classify(_occ(ev), 1, KernelLogRules())[0] == severity


def test_the_recorded_nvlink5_sample_is_decoded_by_intrinfo():
    """kmsg_xid-149-145-94_nvlink5-format.txt (gpud PR #1174): NETIR V1 unit 0 with
    sub-code 0 (0x000fe406), NETIR_LINK_EVT sub-code 37 (0x025001c6): RESET_GPU;
    RLW_RXPIPE (0x0409a0c2, bit 10 clear) with status 0x8: IGNORE."""
    events = parse_text(sample("kmsg_xid-149-145-94_nvlink5-format.txt"))
    got = [(e.xid, e.nvlink_unit, e.intr_info, e.error_status, e.nvlink_action) for e in events]
    assert got == [
        (149, "NETIR", 0x000FE406, 0, "RESET_GPU"),
        (149, "NETIR_LINK_EVT", 0x025001C6, 0, "RESET_GPU"),
        (145, "RLW_RXPIPE", 0x0409A0C2, 0x8, "IGNORE"),
        (94, None, None, None, None),
    ]


def test_nvlink5_decode_rules_beyond_the_recorded_lines():
    """Lines made from the recorded ones to reach the other rules of the sheet."""
    from hetpatrol.collectors.nvidia_kmsg import nvlink5_decode

    # RLW_RXPIPE 0x1 is IGNORE, RESET_GPU ("Action 2") with IntrInfo bit 10 (V1) / 7 (V2)
    assert nvlink5_decode(145, 0x0409A0C2, 0x1) == "IGNORE"
    assert nvlink5_decode(145, 0x0409A4C2, 0x1) == "RESET_GPU"
    assert nvlink5_decode(145, 0x00000086, 0x2) == "RESET_GPU"
    # a bitmask status: the worst of its bits; a bit the sheet does not list: undecoded
    assert nvlink5_decode(144, 0x1, 0x1 | 0x10) == "RESET_GPU"
    assert nvlink5_decode(144, 0x1, 0x40) is None
    # NETIR_LINK_EVT sub-code 40 (101000) is IGNORE, 42 RESET_GPU, 50 not in the sheet
    assert nvlink5_decode(149, (40 << 20) | 0x1C6, 0) == "IGNORE"
    assert nvlink5_decode(149, (42 << 20) | 0x11, 0) == "RESET_GPU"
    assert nvlink5_decode(149, (50 << 20) | 0x1C6, 0) is None
    # NETIR_MFDE_EVENT: a value, not a bitmask (0x3 IGNORE, 0x5 RESET_GPU)
    assert nvlink5_decode(149, 0x246, 0x3) == "IGNORE"
    assert nvlink5_decode(149, 0x14, 0x5) == "RESET_GPU"
    assert nvlink5_decode(149, 0x14, 0x2) is None
    assert nvlink5_decode(150, None, None) == "RESET_GPU"
    assert nvlink5_decode(146, None, None) is None


def test_nvlink5_lines_without_a_decode_go_by_the_printed_word():
    """No hex words (or a sub-code the sheet does not list): ``Nonfatal`` is a warning,
    ``Fatal`` and a line printing neither word are critical (never one ambiguous
    signal made ok)."""
    rules = KernelLogRules()
    cases = [
        ("146, TLW_CTRL Nonfatal XC0 i0 Link 3", False, 3, "warning"),
        ("146, TLW_CTRL Fatal XC0 i0 Link 3", True, 3, "critical"),
        ("146, TLW_CTRL XC0 i0 Link 3", None, 3, "critical"),
        ("149, NETIR_LINK_EVT XC 1 i 2 Link 01 [0x032001c6]", None, 1, "critical"),
        ("149, NETIR_LINK_EVT Nonfatal XC0 i0 Link 01 (0x032001c6 0x0)", False, 1, "warning"),
    ]
    for text, fatal, link, severity in cases:
        (ev,) = parse_text(f"NVRM: Xid (PCI:0000:04:00): {text}\n")
        assert (ev.nvlink_action, ev.fatal, ev.link) == (None, fatal, link), text
        assert classify(_occ(ev), 1, rules)[0] == severity, text


def test_a_unit_with_a_slash_and_a_bus_id_without_domain():
    """The sheet names units V1/V2 (``TLW_RX/TLW_RX_PIPE0``): a name with ``/`` is read
    whole; ``Xid (PCI:5f:00)`` has no PCI domain: domain 0000."""
    (ev,) = parse_text(
        "NVRM: Xid (PCI:5f:00): 146, TLW_RX/TLW_RX_PIPE0 Nonfatal XC0 i0 Link 03 "
        "(0x0000000a 0x00000004)\n"
    )
    assert (ev.bus_id, ev.nvlink_unit, ev.link, ev.nvlink_action) == (
        "0000:5f:00.0",
        "TLW_RX/TLW_RX_PIPE0",
        3,
        "RESET_GPU",
    )
    (ev,) = parse_text("NVRM: Xid (5f:00): 79, pid=1, name=x, GPU has fallen off the bus.\n")
    assert ev.bus_id == "0000:5f:00.0"


def test_a_fatal_word_the_catalog_ignores_makes_no_drain_action():
    """The XID finding of NETIR_LINK_EVT "Fatal" sub-code 38 is a warning with action
    watch; sub-code 37 is critical with reset_card."""
    from hetpatrol.actions.findings import finding_action
    from hetpatrol.collectors.nvidia_xid import xid_action

    for word, (line, *_rest) in (("38", NVLINK5_LINES[1]), ("4", NVLINK5_LINES[3])):
        log_cards = [CardRecord(vendor="nvidia", index=0, bus_id="0000:00:00.0", health="ok")]
        ev = parse_text(line.replace("PCI:0018:01:00", "PCI:0000:00:00") + "\n")[0]
        snap = _one_event_snapshot(ev)
        apply_kernel_log(snap, log_cards, KernelLogRules(), node="n", seq=1, ts_format=rfc)
        (f,) = log_cards[0].findings
        action = finding_action(f)
        want = ("warning", "watch") if word == "38" else ("critical", "reset_card")
        assert (f.severity, action.action) == want, word
    assert xid_action(149, fatal=False).action == "watch"


def test_no_intrinfo_fits_both_layouts_of_the_sheet():
    """V1 (bits 9:5, bits 4:0 = XID - 143) and V2 (bits 6:0) never both fit one IntrInfo
    with the sheet's unit codes, so IntrInfo alone names the unit."""
    from hetpatrol.collectors import nvidia_kmsg as k

    rows = [*k._NVLINK5_ROWS, (149, k._LINK_EVT[0], k._LINK_EVT[1], k._LINK_EVT[2], {}, None)]
    for xid in range(144, 150):
        mine = [r for r in rows if r[0] == xid]
        for intr in range(1 << 11):
            v1 = any(intr & 0x1F == xid - 143 and (intr >> 5) & 0x1F == r[2] for r in mine)
            v2 = any(intr & 0x7F == r[3] for r in mine)
            assert not (v1 and v2), (xid, hex(intr))


def test_ten_thousand_bus_ids_keep_bounded_tables_and_few_findings(tmp_path):
    """A log naming 10,000 distinct bus ids with 6 XIDs each gave 60,000 node findings
    (15.6 MB per patrol line) and kernel-log tables that grew for good (280 MB). The
    window's table holds MAX_KEYS keys (the rest are counted as untracked), unread bus ids
    past MAX_UNREAD_BUSES are one finding, and expired episodes leave the table."""
    from hetpatrol import kernel_log as kl
    from hetpatrol.checks.kernel_events import MAX_UNREAD_BUSES

    log = tmp_path / "kmsg.txt"
    with log.open("w") as f:
        for n in range(10_000):
            bus = f"{n // 256:02x}:{n % 256:02x}"
            for xid in (13, 31, 43, 45, 48, 79):
                f.write(
                    f"[Sun Feb 23 16:24:18 2025] NVRM: Xid (PCI:0000:{bus}:00): {xid}, "
                    "pid=1, name=x, flood\n"
                )
    clock = _Clock()
    src = KernelLog(
        TextLogReader(log), window_seconds=600, burst_seconds=10, clock=clock, replay=True
    )
    snap = src.poll()
    assert len(snap.window_counts) == kl.MAX_KEYS == len(snap.totals)
    assert snap.untracked == 60_000 - kl.MAX_KEYS
    assert len(snap.uuids) <= kl.MAX_KEYS
    lines, node = apply_kernel_log(snap, _cards(), KernelLogRules(), node="n", seq=1,
                                   ts_format=rfc)  # fmt: skip
    assert len(lines) == kl.MAX_KEYS
    buses = len({key[0] for key in snap.window_counts})
    assert buses == kl.MAX_KEYS // 6 + 1  # 170 whole buses and 4 XIDs of the next
    per_bus = [f for f in node if f.check != "kernel_fault_buses"]
    (rest,) = [f for f in node if f.check == "kernel_fault_buses"]
    assert len(per_bus) <= 2 * MAX_UNREAD_BUSES
    assert rest.value == {"buses": buses - MAX_UNREAD_BUSES, "records": kl.MAX_KEYS - sum(
        len(f.value) for f in per_bus)}  # fmt: skip
    assert rest.severity == "critical"  # XID 79 among them
    # the window passes: the tables empty, the memory is given back
    clock.t += 601
    later = src.poll()
    assert later.window == () and later.window_counts == {}
    assert src._episodes == {}


def test_a_flood_of_continuation_lines_is_cut_at_the_record_bound():
    from hetpatrol.kernel_log import MAX_RECORD_CHARS, parse_text

    text = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=x, GPU has fallen off the bus.\n"
    text += "  continued\n" * 100_000
    (ev,) = parse_text(text)
    assert len(ev.raw) <= MAX_RECORD_CHARS
    assert ev.xid == 79


def test_a_users_file_name_in_a_kernel_message_is_no_xid():
    """The kernel prints some text a user chose into its log: fs/exec.c
    ``setup_arg_pages()`` warns once per boot ``pr_warn_once("process '%pD4' started
    with executable stack\\n", bprm->file)``, the last four components of the program's
    path unescaped (``process 'usr/local/ilogtail/ilogtail_0.16.26' started with
    executable stack`` in a linux-kernel report). A user who runs a program with an
    executable stack from a directory named like an XID line (no ``/`` needed) put
    ``NVRM: Xid (PCI:0000:cb:00): 79, ...`` into the record, anywhere in its text: the
    pattern searched the whole record, so it read as XID 79 (drain class: critical) on
    that GPU, and drained the node. The NVIDIA module's records start with ``NVRM: ``
    (all 86 records of the recorded samples and fixtures do, their prefixes taken off)
    and each pattern must match from there."""
    forged = (
        "4,2210,1843400000,-;process 'tmp/NVRM: Xid (PCI:0000:cb:00): 79, pid=1, "
        "name=x, GPU has fallen off the bus./a.out' started with executable stack\n"
        "4,2211,1843400010,-;process 'tmp/NVRM: GPU 0000:cb:00.0: GPU has fallen off the "
        "bus./x' started with executable stack\n"
    )
    assert parse_text(forged) == []
    # arch/x86/mm/fault.c show_signal_msg(): "%s%s[%d]: segfault at %lx ip %p sp %p
    # error %lx" with the process's comm (15 characters its user sets) first, then
    # mm/memory.c print_vma_addr(" in ", ip): the name of the file it faulted in. A
    # process named "NVRM" faulting in a library named like a driver record
    segv = (
        "6,2212,1843400020,-;NVRM[4242]: segfault at 0 ip 00007f3a1c401126 sp "
        "00007ffd5d3f8f60 error 6 in NVRM: Xid (PCI:0000:cb:00): 79, pid=1, name=x, "
        "y.so[7f3a1c401000+1000]\n"
        "6,2213,1843400030,-;NVRM: [4243]: segfault at 0 ip 00007f3a1c401126 sp "
        "00007ffd5d3f8f60 error 6 in GPU 0000:cb:00.0: GPU has fallen off the bus."
        "so[7f3a1c401000+1000]\n"
        "6,2214,1843400040,-;NVRM: Xid (PCI[4244]: segfault at 0 ip 00007f3a1c401126 "
        "sp 00007ffd5d3f8f60 error 6 in 0000:cb:00): 79, x.so[7f3a1c401000+1000]\n"
    )
    assert parse_text(segv) == []
    # syslog and dmesg shapes of the same forged record
    syslog = "Dec  2 11:38:27 gpu01 kernel: [  199.234935] " + forged.split(";", 1)[1]
    assert parse_text(syslog) == []
    # the driver's own line still is one
    real = (
        "4,2103,1843308145,-;NVRM: Xid (PCI:0000:cb:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus.\n"
    )
    assert brief(parse_text(real)) == [("xid", 79, "0000:cb:00.0", None, None)]


def test_a_pid_used_again_since_the_record_is_not_attributed():
    """A restarted daemon reads the whole ring buffer again: an XID 13 written at 5 s
    after boot names pid 48213, which by then belongs to a process that started at
    9000 s (another user's, in another job). The user and job of that process were put
    on the event (and its job credited with the fault); a process that started before
    the record is still attributed, and one whose start is unknown as before."""
    (ev,) = parse_text(
        "4,100,5000000,-;NVRM: Xid (PCI:0000:9b:00): 13, pid=48213, name=python3, "
        "Graphics SM Warp Exception on (GPC 0, TPC 0)\n"
    )
    assert ev.clock == ("boot", 5.0) and ev.pid == 48213

    class Reader:
        path = "x"

        def read(self):
            from hetpatrol.kernel_log import ReadResult

            return ReadResult(events=[(ev, 1_000_000.0 - 60)])

        def close(self):
            pass

    def attributed(started: float | None):
        snap = KernelLog(Reader(), clock=_Clock()).poll()
        (line,) = apply_kernel_log(
            snap, _cards(), KernelLogRules(), node="n", seq=1, ts_format=rfc,
            lookup_process=lambda pid: ("bob", "9001"), started_at=lambda pid: started,
        )[0]  # fmt: skip
        return line["user"], line["job_id"]

    assert attributed(9000.0) == (None, None)  # started after the record: not its process
    assert attributed(4.2) == ("bob", "9001")  # started before it
    assert attributed(None) == ("bob", "9001")  # start unknown (gone, unreadable)


def test_started_boot_seconds_reads_field_22_after_the_name(tmp_path):
    """/proc/<pid>/stat's name may hold spaces and ')' (a user's choice): the fields are
    counted after the last ')'."""
    from hetpatrol.processes import started_boot_seconds

    (tmp_path / "77").mkdir()
    fields = ["S"] + ["0"] * 18 + ["123400"] + ["0"] * 30  # field 22: 123400 ticks
    (tmp_path / "77" / "stat").write_text("77 (a) b (c)) " + " ".join(fields) + "\n")
    assert started_boot_seconds(77, tmp_path) == 123400 / os.sysconf("SC_CLK_TCK")
    assert started_boot_seconds(78, tmp_path) is None
    here = started_boot_seconds(os.getpid())
    assert here is not None and 0 < here <= time.clock_gettime(time.CLOCK_BOOTTIME)


def test_stamp_time_reads_only_stamps_with_a_year_and_a_zone():
    """journalctl ``-o short-iso`` (``+0000``), ``short-iso-precise`` (microseconds),
    rsyslog's RFC 3339 ``RSYSLOG_FileFormat`` and Talos (``Z``) say when; a syslog stamp
    without a year, ``dmesg -T``'s local ctime, a zone-less ISO stamp and ``[secs]`` do not."""
    from hetpatrol.kernel_log import stamp_time

    t = 1_714_566_896.0  # 2024-05-01T12:34:56Z
    assert stamp_time("2024-05-01T12:34:56+0000") == t
    assert stamp_time("2024-05-01T14:34:56.250000+02:00") == t + 0.25
    assert stamp_time("2024-05-01T12:34:56.789123456Z") == pytest.approx(t + 0.789123)
    for text in ("May  1 12:34:56", "Wed May  1 12:34:56 2024", "2024-05-01T12:34:56",
                 "199.234935", "", None):  # fmt: skip
        assert stamp_time(text) is None
