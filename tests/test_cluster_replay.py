"""The cluster commands on a recorded cluster (``--replay fixtures/cluster/mixed``,
recorded from the real test stack by tests/record_cluster_sample.py): ``fleet``,
``audit-slurm`` and ``ledger audit`` read scontrol's recorded output and Prometheus's
recorded answers with the same parsers as live.

Values asserted are read off the recording: scontrol-d-o-show-node.txt (hp-gpu01
Gres=gpu:a100:8,ascend:910b:8 with GresUsed=gpu:a100:2; gn[001-002]
Gres=gpu:a100:4,ascend:910b:8, gn002 drained "disk replaced"; an01 Gres=ascend:910b:8
drained "hetpatrol: vendor_health ascend/3") and prometheus.json (hp-gpu01 8 + 8 cards,
gn001 3 A100 + 8 910B of sick-mixed, an01 16 chips 910_93, ghost01 not in Slurm).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess

from conftest import HETPATROL, REPO
from pty_helpers import run_on_pty

MIXED = REPO / "fixtures" / "cluster" / "mixed"


def hp(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*HETPATROL, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )


def on_terminal(argv: list[str], columns: int = 80, stream: str = "stdout") -> tuple[int, str]:
    """(exit code, what ``stream`` showed) with that stream on a pseudo-terminal
    ``columns`` wide (COLUMNS set, as a shell does) and the other a pipe."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env.update(COLUMNS=str(columns), NO_COLOR="1")
    return run_on_pty([*HETPATROL, *argv], env, timeout=120, stream=stream)


def _cls(doc: dict, vendor: str, card_type: str) -> dict:
    (found,) = [c for c in doc["classes"] if (c["vendor"], c["card_type"]) == (vendor, card_type)]
    return found


def test_fleet_on_the_recorded_cluster():
    out = hp("fleet", "--replay", str(MIXED), "--json")
    assert out.returncode == 2, out.stderr  # gn001 (sick-mixed) has critical cards
    doc = json.loads(out.stdout)
    assert doc["sources"] == {"slurm": "text", "prometheus": f"recording {MIXED}"}
    assert doc["nodes"] == 5  # hp-gpu01 gn001 gn002 an01 + ghost01 (Prometheus only)
    a100 = _cls(doc, "nvidia", "a100")
    # gn001: 3 A100 read plus GPU 3, lost from the bus (its type unknown: an untyped
    # nvidia series in prometheus.json, counted under the node's only NVIDIA class)
    assert (a100["cards_slurm"], a100["cards_seen"]) == (8 + 4 + 4, 8 + 3 + 1)
    assert a100["health"] == {"ok": 10, "warning": 0, "critical": 2, "unknown": 0}
    (debug,) = [p for p in a100["partitions"] if p["partition"] == "debug"]
    assert (debug["allocated"], debug["idle"]) == (2, 6)  # GresUsed=gpu:a100:2(IDX:0-1)
    npu = _cls(doc, "ascend", "910b")
    assert (npu["cards_slurm"], npu["cards_seen"], npu["drained_hetpatrol"]) == (32, 16, 1)
    assert doc["prometheus_only"]["hosts"] == "ghost01"
    assert doc["slurm_only"]["hosts"] == "gn002"


def test_fleet_replay_fits_80_columns_on_a_terminal_and_a_pipe_keeps_lines_whole():
    code, shown = on_terminal(["fleet", "--replay", str(MIXED)], 80)
    assert code == 2
    lines = shown.splitlines()
    assert [line for line in lines if len(line) > 80] == []
    assert "nvidia a100  gres gpu" in lines  # the narrow layout: the label alone
    assert lines[-1] == "fleet: 5 nodes, CRITICAL (exit 2)"
    piped = hp("fleet", "--replay", str(MIXED)).stdout.splitlines()
    assert max(len(line) for line in piped) > 80  # the wide table, whole
    assert piped[-1] == lines[-1]


def test_audit_slurm_replay_fits_80_columns_on_a_terminal():
    code, shown = on_terminal(["audit-slurm", "--replay", str(MIXED)], 80)
    assert code == 2
    lines = shown.splitlines()
    assert [line for line in lines if len(line) > 80] == []
    assert lines[-1] == "audit: 4 nodes, 5 errors, 4 warnings, 2 notes (exit 2)"


def test_audit_slurm_and_ledger_audit_on_the_recorded_cluster():
    out = hp("audit-slurm", "--replay", str(MIXED), "--json")
    assert out.returncode == 2, out.stderr
    found = {(f["check"], f["where"]) for f in json.loads(out.stdout)["findings"]}
    # an01: 16 chips of 910_93 found, Slurm registers ascend:910b:8 (prometheus.json)
    assert ("gres_vs_daemons", "node an01") in found
    # hp-gpu01's daemon reports library_path_mix (the recorded runtime query's answer)
    assert ("mixed_node", "node hp-gpu01") in found
    # the recorded gres.conf is read, not the recording machine's SLURM_CONF directory
    assert ("gres_conf_count", "nodes gn[001-002]") in found
    # nodes read live have no slurm.conf line to point at: the fix names their NodeName=
    fixes = [
        f["fix"] for f in json.loads(out.stdout)["findings"] if f["check"] == "gres_conf_count"
    ]
    assert fixes == [
        f"make Gres= on the slurm.conf NodeName= line(s) of {hosts} and {MIXED}/gres.conf agree "
        "(name, type, count)"
        for hosts in ("an01,gn[001-002]", "gn[001-002]")
    ]
    led = hp("ledger", "audit", "--replay", str(MIXED))
    assert led.returncode == 2, led.stderr
    # scontrol-show-config.txt: AccountingStorageTRES = cpu,mem,energy,node,billing,...
    assert "AccountingStorageTRES lacks gres/ascend:910b, gres/gpu:a100" in led.stdout


def test_a_damaged_or_incomplete_recording_is_a_clear_error(tmp_path):
    out = hp("fleet", "--replay", str(tmp_path))
    assert out.returncode == 3
    assert "no commands.json: not a recorded cluster" in out.stderr
    (tmp_path / "commands.json").write_text("[1, 2")
    out = hp("fleet", "--replay", str(tmp_path))
    assert out.returncode == 3
    assert "commands.json: not JSON" in out.stderr
    # the node list recorded, no Prometheus answer: the query named, exit 3
    rec = tmp_path / "rec"
    shutil.copytree(MIXED, rec)
    (rec / "prometheus.json").write_text('{"answers": {}}')
    out = hp("fleet", "--replay", str(rec))
    assert out.returncode == 3
    assert "not_recorded: query not in the recording" in out.stderr
    # a recorded stdout that names a path outside the recording, or no file: named
    cmds = json.loads((MIXED / "commands.json").read_text())
    for c in cmds["commands"]:
        if c["argv"] == ["scontrol", "-d", "-o", "show", "node"]:
            c["stdout"] = "../../etc/passwd"
    (rec / "commands.json").write_text(json.dumps(cmds))
    out = hp("fleet", "--replay", str(rec))
    assert out.returncode == 3
    assert "recorded stdout '../../etc/passwd': not a file name in" in out.stderr
    (rec / "scontrol-show-config.txt").unlink()
    out = hp("audit-slurm", "--replay", str(rec))
    assert out.returncode == 3
    assert "scontrol-show-config.txt: No such file or directory" in out.stderr
    # no scontrol output recorded: scontrol's place says so
    (rec / "commands.json").write_text('{"commands": []}')
    out = hp("ledger", "audit", "--replay", str(rec))
    assert out.returncode == 69, out.stderr  # EX_UNAVAILABLE, as a failing scontrol
    assert "scontrol show config: not in the recording" in out.stderr
    both = hp("fleet", "--replay", str(MIXED), "--prometheus", "http://127.0.0.1:1")
    assert both.returncode == 64  # a usage error, as every other
    assert "argument --prometheus: not allowed with argument --replay" in both.stderr
    neither = hp("fleet")
    assert neither.returncode == 64
    assert "one of the arguments --prometheus --replay is required" in neither.stderr


def test_progress_shows_on_a_terminal_only():
    code, err = on_terminal(["fleet", "--replay", str(MIXED)], stream="stderr")
    assert code == 2
    assert "hetpatrol fleet: reading Slurm's nodes..." in err
    assert err.endswith("\r\033[K")  # erased: the table starts on a clean line
    code, err = on_terminal(["fleet", "--replay", str(MIXED), "--json"], stream="stderr")
    assert (code, err) == (2, "")  # --json: no progress
    piped = hp("fleet", "--replay", str(MIXED))
    assert piped.stderr == ""  # a pipe: nothing
    code, err = on_terminal(["ledger", "audit", "--replay", str(MIXED)], stream="stderr")
    assert code == 2
    assert "hetpatrol ledger audit: reading Slurm..." in err
    code, err = on_terminal(["audit-slurm", "--replay", str(MIXED)], stream="stderr")
    assert "hetpatrol audit-slurm: reading Slurm's nodes..." in err
    assert "hetpatrol audit-slurm: querying Prometheus..." in err


def test_ledger_usage_counts_the_records_read_on_a_terminal_only(tmp_path):
    from test_ledger import line

    saved = tmp_path / "sacct.txt"
    saved.write_text("".join(line(job=str(i)) + "\n" for i in range(1, 2501)))
    argv = ["ledger", "usage", "--sacct-file", str(saved), "--no-node-types",
            "--start", "2026-01-01T10:30:00", "--end", "2026-01-01T12:00:00"]  # fmt: skip
    code, err = on_terminal(argv, stream="stderr")
    assert code == 0
    # every 1000 records: 1000 and 2000 of the 2500, then the line erased
    assert "hetpatrol ledger usage: reading sacct: 1000 records" in err
    assert "hetpatrol ledger usage: reading sacct: 2000 records" in err
    assert "3000 records" not in err and err.endswith("\r\033[K")
    code, err = on_terminal([*argv, "--format", "json"], stream="stderr")
    assert (code, err) == (0, "")
