"""Partitioned cards: the MIG devices of a GPU in MIG mode (and the vNPUs of an Ascend
chip) are records under their parent card (``partitions[]``), in ``once``, JSONL,
``/metrics`` and the GRES check. Values asserted are read off the recordings:
fixtures/nodes/mig-a100 (telegraf's A100-SXM4-80GB MIG dump) and its scenario."""

from __future__ import annotations

import json
import subprocess

import pytest
from conftest import HETPATROL, NODES

from hetpatrol.collectors.nvidia import NvidiaCollector
from hetpatrol.collectors.nvml_replay import load_replay_nvml
from hetpatrol.replay import load_scenario

MIG = NODES / "mig-a100"
MIB = 2**20


def _mig_collect():
    faults = load_scenario(MIG)["nvml"]
    collector = NvidiaCollector(
        {}, replay_dir=MIG, nvml=load_replay_nvml(MIG / "nvidia-smi-q.xml", faults)
    )
    return collector.collect()


def test_each_mig_device_is_a_partition_under_its_gpu():
    (rec,) = _mig_collect().records
    # the parent keeps the card's identity and health values (XML: uuid, minor 1, 27 C)
    assert rec.uuid == "GPU-513536b6-7d19-9063-b049-1e69664bb298"
    assert rec.device_number == 1
    assert rec.temperature_celsius == 27
    assert rec.memory_total_bytes == 81920 * MIB
    parts = rec.partitions
    # <mig_device> index 0..3, gpu_instance_id 3..6, compute_instance_id 0
    assert [(p.kind, p.index, p.gpu_instance_id, p.compute_instance_id) for p in parts] == [
        ("mig", 0, 3, 0),
        ("mig", 1, 4, 0),
        ("mig", 2, 5, 0),
        ("mig", 3, 6, 0),
    ]
    # fb_memory_usage of each: total 19968 MiB, used 12 MiB (+ reserved 0)
    assert {p.memory_total_bytes for p in parts} == {19968 * MIB}
    assert {p.memory_used_bytes for p in parts} == {12 * MIB}
    assert [p.profile for p in parts] == ["1g.20gb"] * 4
    assert parts[1].uuid == "MIG-4b6b5a0c-3b5e-5b2a-9d1e-6a0f0e3c1a02"
    assert parts[0].slices == 1
    assert parts[0].memory_size_mib == 19968  # the replay's memorySizeMB: fb total
    # mig-minors: gpu1/gi3/access 165, gpu1/gi3/ci0/access 166; gi6: 192/193
    assert parts[0].device_files == [
        "/dev/nvidia-caps/nvidia-cap165",
        "/dev/nvidia-caps/nvidia-cap166",
    ]
    assert parts[3].device_files == [
        "/dev/nvidia-caps/nvidia-cap192",
        "/dev/nvidia-caps/nvidia-cap193",
    ]
    assert all(p.errors == [] for p in parts)


def test_a_process_is_mapped_to_the_mig_device_of_its_instance():
    (rec,) = _mig_collect().records
    # the process_info says gpu_instance_id 4, compute_instance_id 0: MIG device 1
    (proc,) = rec.processes
    assert (proc.pid, proc.partition, proc.memory_bytes) == (81123, 1, 10 * MIB)


def test_a_gpu_not_in_mig_mode_has_no_partitions():
    healthy = NODES / "healthy-mixed" / "nvidia-smi-q.xml"
    recs = NvidiaCollector({}, nvml=load_replay_nvml(healthy)).collect().records
    assert recs and all(r.partitions == [] for r in recs)
    assert all(p.partition is None for r in recs for p in r.processes)


def test_without_the_mig_minors_table_the_device_files_are_unknown_with_the_reason(tmp_path):
    for name in ("nvidia-smi-q.xml", "scenario.yaml"):
        (tmp_path / name).write_bytes((MIG / name).read_bytes())
    (rec,) = NvidiaCollector({}, replay_dir=tmp_path).collect().records
    assert len(rec.partitions) == 4
    assert rec.partitions[0].device_files == []
    (err,) = rec.partitions[0].errors
    assert err["source"] == "mig-minors" and "mig-minors" in err["error"]


def test_once_json_and_jsonl_carry_the_partitions():
    res = subprocess.run(
        [*HETPATROL, "once", "--replay", str(MIG), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    (card,) = json.loads(res.stdout)["cards"]
    assert [p["gpu_instance_id"] for p in card["partitions"]] == [3, 4, 5, 6]
    assert card["processes"][0]["partition"] == 1
    res = subprocess.run(
        [*HETPATROL, "once", "--replay", str(MIG), "--format", "jsonl"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = [json.loads(x) for x in res.stdout.splitlines()]
    (card,) = [x for x in lines if x["kind"] == "card"]
    assert card["partitions"][2]["memory_total_bytes"] == 19968 * MIB
    assert card["partitions"][2]["profile"] == "1g.20gb"


@pytest.mark.parametrize("bad", [{"0": {"uuid": "x"}}, {0: {"colour": "red"}}])
def test_a_malformed_mig_devices_spec_is_refused(bad):
    from hetpatrol.collectors.nvml_replay import ReplayFormatError

    with pytest.raises(ReplayFormatError, match="mig_devices"):
        load_replay_nvml(MIG / "nvidia-smi-q.xml", {"gpus": {0: {"mig_devices": bad}}})


# ----------------------------------------------------------------------------- GRES
def _mig_cards():
    recs = _mig_collect().records
    for rec in recs:
        rec.health = "ok"  # as the patrol judges it (`once` on mig-a100 exits 0)
    return recs


@pytest.mark.parametrize(
    "registered",
    [
        "gpu:1g.20gb:4",  # a site's gres.conf Type=1g.20gb
        "gpu:nvidia_a100_1g.20gb:4",  # what AutoDetect=nvml registers (gpu_nvml.c)
        "gpu:4",  # untyped
    ],
)
def test_the_gres_check_counts_mig_devices_not_the_gpu(registered, base_config):
    from hetpatrol.slurm.gres import parse_gres
    from hetpatrol.slurm.inventory import compare

    counts, findings = compare(_mig_cards(), parse_gres(registered), base_config)
    assert [(c.configured, c.found, c.healthy) for c in counts] == [(4, 4, 4)]
    assert findings == []


def test_seven_1g_registered_on_four_mig_devices_is_a_shortfall(base_config):
    from hetpatrol.slurm.gres import parse_gres
    from hetpatrol.slurm.inventory import compare

    counts, findings = compare(_mig_cards(), parse_gres("gpu:1g.20gb:7"), base_config)
    (f,) = findings
    assert f.check == "gres_mismatch" and f.severity == "critical"
    assert f.message.startswith("gpu:1g.20gb: Slurm has 7 registered, 4 healthy")


def test_slurm_names_a_mig_device_as_its_autodetect_does():
    from hetpatrol.slurm.inventory import slurm_mig_name

    part = _mig_cards()[0].partitions[0]
    # "NVIDIA A100-SXM4-80GB" cut at "-", 1 slice, 19968 MiB -> 19.5 GiB rounds to 20
    assert slurm_mig_name("NVIDIA A100-SXM4-80GB", part) == "nvidia_a100_1g.20gb"
    # Slurm names by memorySizeMB, not the memory info: an A100 80GB 3g.40gb, 39.25 GiB
    # in `nvidia-smi mig -lgip` (NVIDIA/mig-parted issue 97), is 3g.39gb to AutoDetect
    from dataclasses import replace

    big = replace(part, slices=3, memory_size_mib=40192, memory_total_bytes=40448 * MIB)
    assert slurm_mig_name("NVIDIA A100-SXM4-80GB", big) == "nvidia_a100_3g.39gb"
    # a name without "-" is kept whole (gpu_nvml.c cuts only at a "-")
    assert slurm_mig_name("NVIDIA H100 80GB HBM3", big) == "nvidia_h100_80gb_hbm3_3g.39gb"


def test_gres_conf_prints_one_multiplefiles_line_per_mig_device():
    res = subprocess.run(
        [*HETPATROL, "gres-conf", "--replay", str(MIG)], capture_output=True, text=True, timeout=120
    )
    lines = [x for x in res.stdout.splitlines() if x.startswith("NodeName=")]
    assert lines[0] == (
        "NodeName=mig-a100-01 Name=gpu Type=1g.20gb MultipleFiles=/dev/nvidia1,"
        "/dev/nvidia-caps/nvidia-cap165,/dev/nvidia-caps/nvidia-cap166"
    )
    assert lines[3].endswith("nvidia-cap192,/dev/nvidia-caps/nvidia-cap193")
    assert "NodeName=mig-a100-01 Gres=gpu:1g.20gb:4 Features=1g.20gb" in lines
    assert "is in MIG mode: one line per MIG device" in res.stdout


def test_gres_conf_check_accepts_the_mig_lines_and_finds_a_missing_one(base_config):
    from hetpatrol.slurm.gres_conf import build_plan, check_gres_conf

    plan = build_plan(_mig_cards(), base_config, "mig-a100-01", None)
    lines = [line for line, _cards in plan.lines()]
    assert len(lines) == 4
    assert check_gres_conf(plan, "\n".join(lines) + "\n", "gres.conf") == []
    diffs = check_gres_conf(plan, "\n".join(lines[:3]) + "\n", "gres.conf")
    assert [d.message for d in diffs] == [
        "nvidia/0/mig3 (gpu:1g.20gb): /dev/nvidia-caps/nvidia-cap192 is in no line"
    ]


def test_without_slices_the_profile_alone_names_the_mig_device(base_config):
    from hetpatrol.slurm.gres import parse_gres
    from hetpatrol.slurm.inventory import compare

    cards = _mig_cards()
    for part in cards[0].partitions:
        part.slices = None  # nvmlDeviceGetAttributes unread: no AutoDetect-style name
    counts, findings = compare(cards, parse_gres("gpu:1g.20gb:4"), base_config)
    assert [(c.type, c.found) for c in counts] == [("1g.20gb", 4)]
    assert findings == []


# -------------------------------------------------------------------------- metrics
def _metrics(scenario):
    from dataclasses import replace

    from prometheus_client.parser import text_string_to_metric_families

    from hetpatrol.config import load_config
    from hetpatrol.exporters.prometheus import Exposition
    from hetpatrol.patrol import Patroller

    report = Patroller(replace(load_config(), node="n1"), replay_dir=scenario).run()
    body = Exposition([c.name for c in report.collectors]).update(report, patrols_total=1)
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def test_metrics_have_a_series_per_mig_device_labelled_by_card_and_profile():
    found = _metrics(MIG)
    used = found["hetpatrol_card_partition_memory_bytes"]
    assert len(used) == 4
    parent = {
        "vendor": "nvidia",
        "card_type": "a100",
        "index": "0",
        "uuid": "GPU-513536b6-7d19-9063-b049-1e69664bb298",
    }
    for s in used:
        assert s.labels == {
            **parent,
            "partition": s.labels["partition"],
            "kind": "mig",
            "profile": "1g.20gb",
        }
        assert s.value == 12 * MIB
    totals = {
        s.labels["partition"]: s.value for s in found["hetpatrol_card_partition_memory_total_bytes"]
    }
    assert totals == {str(i): 19968.0 * MIB for i in range(4)}
    procs = {s.labels["partition"]: s.value for s in found["hetpatrol_card_partition_processes"]}
    assert procs == {"0": 0, "1": 1, "2": 0, "3": 0}


def test_whole_cards_have_no_partition_series():
    found = _metrics(NODES / "healthy-mixed")
    assert "hetpatrol_card_partition_memory_bytes" not in found


# ------------------------------------------------------------------------ node view
def test_the_node_view_nests_mig_devices_and_their_processes_under_the_gpu():
    env = {"COLUMNS": "160", "NO_COLOR": "1", "PATH": "/usr/bin:/bin"}
    res = subprocess.run(
        [*HETPATROL, "once", "--replay", str(MIG)], capture_output=True, text=True, env=env
    )
    lines = res.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if x.startswith("  0    OK"))
    assert lines[at + 1] == (
        "      mig 0  1g.20gb  GI 3 CI 0  0.0/19.5 GiB  MIG-4b6b5a0c-3b5e-5b2a-9d1e-6a0f0e3c1a01"
    )
    assert lines[at + 2].startswith("      mig 1  1g.20gb  GI 4 CI 0")
    assert lines[at + 3] == "        pid 81123  python3  0.0 GiB"  # its process, under it
    assert lines[at + 4].startswith("      mig 2")


# ---------------------------------------------------------------------------- vNPU
VNPU = NODES / "vnpu-910b4"


def test_parse_vnpu_reads_the_table_by_its_header():
    from hetpatrol.collectors.ascend_detail import parse_vnpu

    rows = parse_vnpu((VNPU / "npu-smi_info_-t_info-vnpu_-i_0_-c_0.txt").read_text())
    # |  100 | 0 | ffffffffffff | 1 | vir10_3c_16g |, |  101 | 1 | 000000000000 | 0 | ...
    assert [(r.vnpu_id, r.vgroup_id, r.container_id, r.status, r.template) for r in rows] == [
        (100, 0, "ffffffffffff", "1", "vir10_3c_16g"),
        (101, 1, "000000000000", "0", "vir10_3c_16g"),
    ]
    part = rows[0].partition()
    # vir10_3c_16g: 10 AI cores, 16 GB
    assert (part.kind, part.slices, part.memory_total_bytes) == ("vnpu", 10, 16 * 2**30)
    assert part.device_files == ["/dev/vdavinci100"]


def test_parse_vnpu_without_vnpus_and_garbage():
    from hetpatrol.collectors.ascend_detail import parse_vnpu

    text = (VNPU / "npu-smi_info_-t_info-vnpu_-i_0_-c_0.txt").read_text()
    empty = text.split("|  100")[0].replace("Total number of vnpu: 2", "Total number of vnpu: 0")
    assert parse_vnpu(empty) == []
    with pytest.raises(ValueError, match="Total number of vnpu: 2, but 1"):
        parse_vnpu(text.split("|  101")[0])
    with pytest.raises(ValueError, match="not an info-vnpu answer"):
        parse_vnpu("Error: the device does not support this command\n")


def test_once_shows_each_vnpu_under_its_chip():
    res = subprocess.run(
        [*HETPATROL, "once", "--replay", str(VNPU), "--format", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr
    cards = {(c["index"], c["chip"]): c for c in json.loads(res.stdout)["cards"]}
    assert len(cards) == 8
    # NPU N has vNPUs 100+16N and 101+16N (NPU 7: 212, 213)
    assert [p["index"] for p in cards[(7, 0)]["partitions"]] == [212, 213]
    p0 = cards[(0, 0)]["partitions"][0]
    assert (p0["profile"], p0["gpu_instance_id"], p0["status"]) == ("vir10_3c_16g", 0, "1")
    # the chip keeps its own health and values (npu-smi info: NPU 0 33 C, 87.2 W)
    assert (cards[(0, 0)]["temperature_celsius"], cards[(0, 0)]["power_watts"]) == (33, 87.2)
    assert cards[(0, 0)]["health"] == "ok"


def test_vnpu_metrics_and_gres_conf_note():
    found = _metrics(VNPU)
    totals = found["hetpatrol_card_partition_memory_total_bytes"]
    assert len(totals) == 16
    (s,) = [x for x in totals if x.labels["index"] == "3" and x.labels["partition"] == "149"]
    assert s.labels["kind"] == "vnpu" and s.labels["profile"] == "vir10_3c_16g"
    assert s.value == 16 * 2**30
    assert "hetpatrol_card_partition_memory_bytes" not in found  # npu-smi says no usage
    res = subprocess.run(
        [*HETPATROL, "gres-conf", "--replay", str(VNPU)], capture_output=True, text=True
    )
    # one note for the 8 chips (npu-smi: 2 vNPUs on each), not one each
    said = " ".join(res.stdout.replace("\n#   ", " ").split())
    assert said.count("split into vNPUs") == 1, res.stdout
    assert "ascend/0-7/0 are split into vNPUs (2 each): Slurm has no GRES model" in said
    # the whole chip keeps its line: vNPUs are not counted as GRES
    assert "Gres=ascend:910b:8" in res.stdout


def test_a_chip_without_vnpu_support_costs_one_try_and_no_error(tmp_path):
    from hetpatrol.collectors.ascend_detail import DetailReader
    from hetpatrol.schema import CardRecord
    from hetpatrol.tool import ToolOutput

    calls = []

    def runner(argv, timeout):
        calls.append(argv)
        if "info-vnpu" in argv:
            return ToolOutput(tuple(argv), "", "not supported\n", 255, False, 0.01)
        raise FileNotFoundError(argv[0])

    reader = DetailReader({"detail_interval_seconds": 0}, ["npu-smi", "info"], runner)
    recs = [CardRecord(vendor="ascend", index=i, chip=0) for i in range(3)]
    reader.attach(recs)
    assert sum("info-vnpu" in a for a in calls) == 1
    assert all(r.partitions == [] and r.errors == [] for r in recs)


# ------------------------------------------------------- the real slurmd -G on MIG
@pytest.mark.slow
@pytest.mark.slurm
def test_real_slurmd_registers_the_mig_lines(tmp_path):
    """slurmd -G (Slurm's own gres.conf reader) takes each MIG line's MultipleFiles= as
    one gpu:1g.20gb device: four devices, each with its three files."""
    import os
    import re

    from test_gres_conf import _need_slurmd

    from hetpatrol.config import load_config
    from hetpatrol.slurm.gres_conf import build_plan

    _need_slurmd()
    node = "hp-mig01"
    plan = build_plan(_mig_cards(), load_config(), node, None)
    dev = tmp_path / "dev"
    lines = []
    for line, cards in plan.lines():
        for f in cards[0].files:
            path = dev / f.removeprefix("/dev/")
            path.parent.mkdir(parents=True, exist_ok=True)
            if not path.exists():
                minor = int(re.search(r"(\d+)$", f).group(1))
                os.mknod(path, 0o600 | 0o020000, os.makedev(240, minor))  # S_IFCHR
        lines.append(line.replace("/dev/", f"{dev}/"))
    types, node_line = plan.slurm_conf()
    (tmp_path / "gres.conf").write_text("\n".join(lines) + "\n")
    host = subprocess.run(["hostname", "-s"], capture_output=True, text=True).stdout.strip()
    (tmp_path / "spool").mkdir()
    (tmp_path / "slurm.conf").write_text(
        f"ClusterName=gresmig\nSlurmctldHost={host}(127.0.0.1)\n{types}\n"
        f"SlurmdSpoolDir={tmp_path}/spool\nSlurmdPidFile={tmp_path}/slurmd.pid\n"
        f"SlurmdLogFile={tmp_path}/slurmd.log\nProctrackType=proctrack/linuxproc\n"
        "TaskPlugin=task/none\nSelectType=select/cons_tres\n"
        f"{node_line.replace(f'NodeName={node}', f'NodeName={node} NodeHostname={host}')} "
        f"CPUs={os.cpu_count()}\nPartitionName=p Nodes={node}\n"
    )
    done = subprocess.run(
        ["slurmd", "-G", "-N", node, "-f", str(tmp_path / "slurm.conf")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    output = done.stdout + done.stderr
    assert "error" not in output.lower(), output
    gres = [ln.split("Gres ", 1)[1] for ln in output.splitlines() if "Gres Name=" in ln]
    assert len(gres) == 4, output
    assert all("Name=gpu Type=1g.20gb Count=1" in g for g in gres), output
    # the GPU file and both nvidia-caps files of MIG device 0 on one device
    (first,) = [g for g in gres if f"{dev}/nvidia-caps/nvidia-cap165" in g]
    assert f"{dev}/nvidia1" in first and f"{dev}/nvidia-caps/nvidia-cap166" in first, first


@pytest.mark.parametrize("scenario", ["mig-a100", "vnpu-910b4"])
def test_the_card_lines_with_partitions_match_the_json_schema(scenario):
    import jsonschema

    from hetpatrol.schema import card_json_schema

    res = subprocess.run(
        [*HETPATROL, "once", "--replay", str(NODES / scenario), "--format", "jsonl"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    cards = [
        json.loads(x) for x in res.stdout.splitlines() if '"kind":"card"' in x.replace(" ", "")
    ]
    assert cards and any(c["partitions"] for c in cards)
    schema = card_json_schema()
    for card in cards:
        jsonschema.validate(card, schema)
    bad = {**cards[0], "partitions": [{**cards[0]["partitions"][0], "kind": "slice"}]}
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(bad, schema)


@pytest.mark.parametrize("text", ["", "|||", "| Vnpu ID | Template Name |\n| x | y |", "\x00" * 10])
def test_parse_vnpu_garbage_is_a_value_error_or_no_rows(text):
    from hetpatrol.collectors.ascend_detail import parse_vnpu

    try:
        assert parse_vnpu(text) == []
    except ValueError:
        pass


def test_mig_enabled_without_mig_devices_is_a_warning_and_a_pending_change_info():
    faults = {
        "gpus": {0: {"xml_overrides": {"mig_devices": None, "mig_mode/pending_mig": "Disabled"}}}
    }
    nvml = load_replay_nvml(MIG / "nvidia-smi-q.xml", faults)
    (rec,) = NvidiaCollector({}, nvml=nvml).collect().records
    assert rec.partitions == []
    assert (rec.counters["mig_mode"], rec.counters["mig_mode_pending"]) == (1, 0)
    found = {(f.check, f.severity) for f in rec.findings}
    assert found == {("mig_layout", "warning"), ("mig_layout", "info")}
    (warn,) = [f for f in rec.findings if f.severity == "warning"]
    assert "no MIG device" in warn.message
    # the recording itself: enabled, pending enabled, four MIG devices: nothing said
    (rec,) = _mig_collect().records
    assert [f for f in rec.findings if f.check == "mig_layout"] == []


@pytest.mark.slow
@pytest.mark.slurm
def test_the_gres_check_against_a_real_slurmctld_with_mig_lines(tmp_path):
    """A real slurmctld + slurmd whose node has the four MIG lines gres-conf writes
    (MultipleFiles=) and Gres=gpu:1g.20gb:4: the registration scontrol shows is what the
    GRES check counts the MIG devices against (no finding)."""
    import os
    import shutil

    import slurm_cluster as cluster
    from test_slurm_live import slurm_config

    from hetpatrol.patrol import Patroller

    if os.geteuid() != 0 or shutil.which("slurmctld") is None:
        pytest.skip("needs root and slurmctld/slurmd")
    minors = [(165, 166), (174, 175), (183, 184), (192, 193)]
    text = "".join(
        f"NodeName={{node}} Name=gpu Type=1g.20gb MultipleFiles={{dev}}/nvidia1,"
        f"{{dev}}/nvidia-cap{gi},{{dev}}/nvidia-cap{ci}\n"
        for gi, ci in minors
    )

    def caps(c):
        for gi, ci in minors:
            (c.root / "dev" / f"nvidia-cap{gi}").touch()
            (c.root / "dev" / f"nvidia-cap{ci}").touch()

    slurm = cluster.start_cluster(node_gres="gpu:1g.20gb:4", gres_conf_text=text, after_munge=caps)
    try:
        reg = slurm.scontrol("show", "node", "-o", slurm.node)
        assert "Gres=gpu:1g.20gb:4" in reg, reg
        config = slurm_config(slurm, tmp_path, drain=False)
        patroller = Patroller(config, replay_dir=MIG)
        try:
            report = patroller.run()
        finally:
            patroller.close()
        assert [f for f in report.node_findings if f.check == "gres_mismatch"] == []
        assert report.node_checks["gres"]["entries"] == [
            {"name": "gpu", "type": "1g.20gb", "configured": 4, "found": 4, "healthy": 4}
        ]
    finally:
        slurm.stop()
        shutil.rmtree(slurm.root, ignore_errors=True)
