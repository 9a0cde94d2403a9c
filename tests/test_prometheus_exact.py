"""Exact exposition of a scenario: every series of the card families, value by value.

The expected values are read off the recorded samples of fixtures/nodes/sick-mixed
(4 x A100-SXM4-80GB in nvidia-smi-q.xml, GPU 3 lost by the scenario's fault; 8 x 910B3
in npu-smi-info.txt, NPU 5 in Alarm), not off hetpatrol's output:

- GPU 0/1/2: ``gpu_temp`` 25/22/23 C, ``power_draw`` 59.77/60.31/58.78 W,
  ``current_power_limit`` 500 W, ``sm_clock`` 210 MHz, PCIe gen 4 x16 (max 4 x16),
  ``fb_memory_usage`` total 81920 MiB, used 1 + reserved 763 MiB (NVML's v1 ``used``),
  ``gpu_util`` 0 %; GPU 1: volatile ``dram_correctable`` 353, uncorrectable 0,
  Remapped Rows Pending yes; no processes;
- NPU 0..7: Temp(C) 34 32 32 32 37 38 36 37, Power(W) 97.9 89.5 92.3 92.4 95.6 97.2 91.0
  95.4, HBM-Usage(MB) 3408 3408 41052 3390 3403 3400 3401 3400 of 65536, AICore 0 %;
  NPU 2 holds one process (pid 1333928, 37709 MB).

Absent values leave their label out (no ``chip=""`` on a GPU, no ``uuid=""`` on an NPU).
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from conftest import NODES
from fakes import Scripted, make_patroller
from prometheus_client.parser import text_string_to_metric_families

from hetpatrol.config import SlurmSettings, load_config
from hetpatrol.exporters.prometheus import (
    Exposition,
    process_memory_metric,
)
from hetpatrol.patrol import Patroller
from hetpatrol.schema import CardRecord, Finding, ProcessInfo

SICK = NODES / "sick-mixed"
MIB = 1024 * 1024
GPU_UUIDS = (
    "GPU-5f85f1a0-0f31-6cca-d888-053e295d69f1",
    "GPU-31a005b2-0756-4b05-30d1-3494a65b19d7",
    "GPU-f9f366a0-9600-5673-329e-3b9004c43b27",
)
NPU_TEMP = (34, 32, 32, 32, 37, 38, 36, 37)
NPU_POWER = (97.9, 89.5, 92.3, 92.4, 95.6, 97.2, 91.0, 95.4)
NPU_HBM_USED = (3408, 3408, 41052, 3390, 3403, 3400, 3401, 3400)


def series(body: bytes) -> dict[tuple[str, frozenset], float]:
    """Every sample of an exposition by (name, labels); a duplicate series fails."""
    out: dict[tuple[str, frozenset], float] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            key = (s.name, frozenset(s.labels.items()))
            assert key not in out, f"duplicate series {key}"
            out[key] = s.value
    return out


def family(found: dict, name: str) -> dict[frozenset, float]:
    return {labels: v for (n, labels), v in found.items() if n == name}


def gpu(i: int, **extra: str) -> frozenset:
    base = {"vendor": "nvidia", "index": str(i)}
    if i < 3:  # GPU 3 was lost before anything of it was read: no type, no UUID
        base |= {"card_type": "a100", "uuid": GPU_UUIDS[i]}
    return frozenset((base | extra).items())


def npu(i: int, **extra: str) -> frozenset:
    base = {"vendor": "ascend", "card_type": "910b", "index": str(i), "chip": "0"}
    return frozenset((base | extra).items())


def _sick_report(config=None):
    config = config or replace(load_config(), node="mixed-sick-01")
    patroller = Patroller(config, replay_dir=SICK)
    try:
        return patroller.run()
    finally:
        patroller.close()


@pytest.fixture(scope="module")
def sick() -> dict:
    return series(Exposition(["nvidia", "ascend"]).update(_sick_report(), 1))


def test_sick_mixed_card_gauges_exactly(sick):
    gpus = range(3)
    expected = {
        "hetpatrol_card_temperature_celsius": {gpu(0): 25, gpu(1): 22, gpu(2): 23}
        | {npu(i): t for i, t in enumerate(NPU_TEMP)},
        "hetpatrol_card_power_watts": {gpu(0): 59.77, gpu(1): 60.31, gpu(2): 58.78}
        | {npu(i): p for i, p in enumerate(NPU_POWER)},
        # NVML's enforced limit (current_power_limit), never the draw; npu-smi has none
        "hetpatrol_card_power_limit_watts": {gpu(i): 500 for i in gpus},
        "hetpatrol_card_memory_used_bytes": {gpu(i): 764 * MIB for i in gpus}
        | {npu(i): u * MIB for i, u in enumerate(NPU_HBM_USED)},
        "hetpatrol_card_memory_total_bytes": {gpu(i): 81920 * MIB for i in gpus}
        | {npu(i): 65536 * MIB for i in range(8)},
        "hetpatrol_card_utilization_ratio": {gpu(i): 0 for i in gpus}
        | {npu(i): 0 for i in range(8)},
        "hetpatrol_card_clock_sm_hertz": {gpu(i): 210e6 for i in gpus},
        "hetpatrol_card_pcie_link_generation": {gpu(i): 4 for i in gpus},
        "hetpatrol_card_pcie_link_width": {gpu(i): 16 for i in gpus},
        "hetpatrol_card_remapped_rows_pending": {gpu(0): 0, gpu(1): 1, gpu(2): 0},
        "hetpatrol_card_remapped_rows_failure": {gpu(i): 0 for i in gpus},
        "hetpatrol_card_ecc_errors_total": {
            gpu(0, type="corrected"): 0,
            gpu(0, type="uncorrected"): 0,
            gpu(1, type="corrected"): 353,
            gpu(1, type="uncorrected"): 0,
            gpu(2, type="corrected"): 0,
            gpu(2, type="uncorrected"): 0,
        },
        # the lost GPU's process list was never read: no series, not a made-up 0
        "hetpatrol_card_processes": {gpu(i): 0 for i in gpus}
        | {npu(i): 1 if i == 2 else 0 for i in range(8)},
        # replayed pids are not looked up: no job, no user -> those labels left out
        "hetpatrol_card_process_memory_bytes": {npu(2): 37709 * MIB},
        "hetpatrol_card_health_code": {gpu(0): 0, gpu(1): 2, gpu(2): 0, gpu(3): 2}
        | {npu(i): 2 if i == 5 else 0 for i in range(8)},
        "hetpatrol_card_finding": {
            gpu(1, check="remapped_rows_pending", severity="critical"): 1,
            gpu(3, check="vendor_health", severity="critical"): 1,
            npu(5, check="vendor_health", severity="critical"): 1,
        },
        "hetpatrol_cards": {
            frozenset({"vendor": "nvidia", "card_type": "a100", "health": "ok"}.items()): 2,
            frozenset({"vendor": "nvidia", "card_type": "a100", "health": "critical"}.items()): 1,
            frozenset({"vendor": "nvidia", "health": "critical"}.items()): 1,
            frozenset({"vendor": "ascend", "card_type": "910b", "health": "ok"}.items()): 7,
            frozenset({"vendor": "ascend", "card_type": "910b", "health": "critical"}.items()): 1,
        },
    }
    for name, want in expected.items():
        assert family(sick, name) == pytest.approx(want), name
    assert sick[("hetpatrol_node_health_code", frozenset())] == 2
    assert family(sick, "hetpatrol_node_finding") == {}


def test_no_series_has_an_empty_label_value(sick):
    for name, labels in sick:
        assert all(v != "" for _k, v in labels), (name, dict(labels))


def test_gres_registration_up_says_whether_slurm_could_be_read(tmp_path):
    """With the registration in a gres.conf: up 1 and its counts; with neither
    scontrol nor gres.conf: up 0 and no counts (the check was skipped)."""
    base = replace(load_config(), node="mixed-sick-01")
    missing = str(tmp_path / "no-scontrol")
    conf = tmp_path / "gres.conf"
    conf.write_text(
        "NodeName=mixed-sick-01 Name=gpu Type=a100 File=/dev/nvidia[0-3]\n"
        "NodeName=mixed-sick-01 Name=ascend Type=910b File=/dev/davinci[0-7]\n"
    )
    for gres_conf, up in ((conf, 1), (tmp_path / "absent.conf", 0)):
        slurm = SlurmSettings(enabled=True, scontrol=(missing,), gres_conf=str(gres_conf))
        found = series(Exposition().update(_sick_report(replace(base, slurm=slurm)), 1))
        assert found[("hetpatrol_gres_registration_up", frozenset())] == up
        configured = family(found, "hetpatrol_gres_configured")
        if up:
            a100 = frozenset({"gres": "gpu", "gres_type": "a100"}.items())
            b910 = frozenset({"gres": "ascend", "gres_type": "910b"}.items())
            untyped = frozenset({"gres": "gpu"}.items())  # the lost GPU: type unknown
            assert configured == {a100: 4, b910: 8, untyped: 0}
            assert family(found, "hetpatrol_gres_found") == {a100: 3, b910: 8, untyped: 1}
            assert family(found, "hetpatrol_gres_healthy") == {a100: 2, b910: 7, untyped: 0}
        else:
            assert configured == {}


def test_unreadable_cards_carry_identity_and_verdict_only(base_config):
    """A collector that fails after a good patrol: its cards stay with their identity
    and ``unknown``, but no value series and no process series (never a fake 0)."""
    c = Scripted()
    c.temps = [40.0, 41.0]
    p = make_patroller(base_config, {"ascend": c})
    p.run()
    c.mode = "fail"
    found = series(Exposition(["ascend"]).update(p.run(), 2))
    assert family(found, "hetpatrol_card_health_code") == {npu(0): 3, npu(1): 3}
    assert family(found, "hetpatrol_card_finding") == {
        npu(0, check="collector_failed", severity="unknown"): 1,
        npu(1, check="collector_failed", severity="unknown"): 1,
    }
    for name in (
        "hetpatrol_card_processes",
        "hetpatrol_card_process_memory_bytes",
        "hetpatrol_card_temperature_celsius",
    ):
        assert family(found, name) == {}, name


def test_two_findings_of_one_check_are_one_series(base_config):
    c = Scripted()
    c.temps = [40.0]
    report = make_patroller(base_config, {"ascend": c}).run()
    card = report.cards[0]
    for port in (0, 1):  # two RoCE ports down: one check, one severity
        card.findings.append(Finding("roce_link_down", "critical", f"port {port} down"))
    # two GRES mismatches (gpu:a100 and ascend:910b): one node check, one severity
    report = replace(
        report,
        node_findings=tuple(
            Finding("gres_mismatch", "critical", f"{g}: Slurm has 8 registered, 0 found")
            for g in ("gpu:a100", "ascend:910b")
        ),
    )
    found = series(Exposition(["ascend"]).update(report, 1))  # asserts no duplicate
    assert family(found, "hetpatrol_card_finding") == {
        npu(0, check="roce_link_down", severity="critical"): 1
    }
    assert family(found, "hetpatrol_node_finding") == {
        frozenset({"check": "gres_mismatch", "severity": "critical"}.items()): 1
    }


def test_process_memory_top_five_per_card_and_the_rest_summed():
    """Seven jobs on one card: the five largest by memory, the two smallest summed
    into ``slurm_job="other", user="other"``; a process outside any job has no
    ``slurm_job`` label; an unreadable card has no series; a second card with one small
    job is ranked on its own (per card, not across the node)."""
    procs = [
        ProcessInfo(pid=100 + j, memory_bytes=(j + 1) * MIB, user="alice", job_id=str(7000 + j))
        for j in range(7)
    ] + [ProcessInfo(pid=99, memory_bytes=64 * MIB, user="bob")]
    card = CardRecord(vendor="nvidia", index=0, card_type="a100", uuid="GPU-x", processes=procs)
    gone = CardRecord(vendor="nvidia", index=1, processes=procs[:1], read_ok=False)
    small = CardRecord(
        vendor="nvidia",
        index=2,
        card_type="a100",
        uuid="GPU-y",
        processes=[ProcessInfo(pid=500, memory_bytes=MIB // 2, user="carol", job_id="8000")],
    )
    fam = process_memory_metric([card, gone, small])  # samples: empty labels left out
    got = {frozenset(s.labels.items()): s.value for s in fam.samples}
    card_l = {"vendor": "nvidia", "card_type": "a100", "index": "0", "uuid": "GPU-x"}
    assert got == {
        frozenset((card_l | {"user": "bob"}).items()): 64 * MIB,
        frozenset((card_l | {"slurm_job": "7006", "user": "alice"}).items()): 7 * MIB,
        frozenset((card_l | {"slurm_job": "7005", "user": "alice"}).items()): 6 * MIB,
        frozenset((card_l | {"slurm_job": "7004", "user": "alice"}).items()): 5 * MIB,
        frozenset((card_l | {"slurm_job": "7003", "user": "alice"}).items()): 4 * MIB,
        frozenset((card_l | {"slurm_job": "other", "user": "other"}).items()): (1 + 2 + 3) * MIB,
        frozenset(
            {
                "vendor": "nvidia",
                "card_type": "a100",
                "index": "2",
                "uuid": "GPU-y",
                "slurm_job": "8000",
                "user": "carol",
            }.items()
        ): MIB // 2,
    }


def test_user_and_job_labels_can_be_switched_off(tmp_path):
    """``metrics_user_labels: false``: no ``user`` nor ``slurm_job`` in the exposition,
    one process-memory series per card with all its processes' memory; the key is
    checked like any other and reaches the daemon's exposition (and a reload)."""
    from hetpatrol.config import ConfigError
    from hetpatrol.daemon import Daemon

    procs = [
        ProcessInfo(pid=4242, memory_bytes=3 * MIB, user="alice", job_id="7000"),
        ProcessInfo(pid=4243, memory_bytes=5 * MIB, user="bob", job_id="7001"),
        ProcessInfo(pid=4244, memory_bytes=None, user="carol", job_id="7002"),
    ]
    card = CardRecord(vendor="nvidia", index=0, card_type="a100", uuid="GPU-x", processes=procs)
    card.health = "ok"
    report = replace(_sick_report(), cards=(card,))
    on = Exposition(["nvidia"]).update(report, 1).decode()
    assert 'slurm_job="7001",user="bob"' in on
    off = Exposition(["nvidia"], user_labels=False).update(report, 1).decode()
    assert "user=" not in off and "slurm_job=" not in off
    found = series(off.encode())
    assert family(found, "hetpatrol_card_process_memory_bytes") == {
        frozenset(
            {"vendor": "nvidia", "card_type": "a100", "index": "0", "uuid": "GPU-x"}.items()
        ): 8 * MIB
    }

    config = tmp_path / "hetpatrol.yaml"
    config.write_text("node: n1\nmetrics_user_labels: false\n")
    assert load_config(config).metrics_user_labels is False
    assert load_config().metrics_user_labels is True  # the shipped config: on
    with pytest.raises(ConfigError, match="metrics_user_labels: 'no' is not of type 'boolean'"):
        load_config("bad.yaml", text='metrics_user_labels: "no"\n')
    daemon = Daemon(
        load_config(config),
        config_path=config,
        replay_dir=SICK,
        overrides={"listen": "127.0.0.1:0", "jsonl_path": None, "state_path": None},
    )
    try:
        assert daemon.exposition.user_labels is False
        config.write_text("node: n1\nmetrics_user_labels: true\n")
        assert daemon.reload()
        assert daemon.exposition.user_labels is True
    finally:
        daemon.shutdown()
