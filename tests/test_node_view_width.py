"""The node view (``once``, ``status``) fits the terminal: ``COLUMNS`` (or the tty's
width) is honoured, the least useful columns go first, and a pipe without ``COLUMNS``
gets every column whole. Values asserted here are the replays' recorded ones."""

from __future__ import annotations

import itertools
import os
import subprocess

import pytest
from conftest import HETPATROL, NODES
from pty_helpers import run_on_pty


def _scenarios() -> list[str]:
    """Every scenario, a multi-boot one by each of its boots (replayed one at a time)."""
    from hetpatrol.replay import scenario_boots

    out = []
    for p in sorted(x for x in NODES.iterdir() if x.is_dir()):
        boots = scenario_boots(p)
        out += [b.relative_to(NODES).as_posix() for b in boots] if boots else [p.name]
    return out


SCENARIOS = _scenarios()


def _once(scenario: str, columns: str | None, *extra: str) -> list[str]:
    """``once`` on a terminal ``columns`` wide (a pseudo-terminal, as in tmux), or in a
    pipe (None)."""
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    if columns:
        env["COLUMNS"] = columns
    env["NO_COLOR"] = "1"
    argv = [*HETPATROL, "once", "--replay", str(NODES / scenario), "-v", *extra]
    cfg = NODES / scenario / "hetpatrol.yaml"
    if cfg.exists():
        argv += ["--config", str(cfg)]
    if columns is None:
        res = subprocess.run(argv, capture_output=True, text=True, env=env)
        assert res.returncode in (0, 1, 2, 3), res.stderr
        return res.stdout.splitlines()
    code, out = run_on_pty(argv, env, timeout=60)
    assert code in (0, 1, 2, 3)
    return out.splitlines()


@pytest.mark.parametrize("scenario", SCENARIOS)
@pytest.mark.parametrize("columns", ["80", "160"])
def test_no_line_is_wider_than_the_terminal(scenario, columns):
    lines = _once(scenario, columns)
    wide = [line for line in lines if len(line) > int(columns)]
    assert wide == [], "\n".join(wide)


def test_at_80_columns_the_model_goes_above_the_table_and_bus_ids_stay_whole():
    lines = _once("sick-mixed", "80")
    at = lines.index("nvidia a100 (gres gpu)  3 cards: 2 ok, 1 critical")
    assert lines[at + 1] == "  model NVIDIA A100-SXM4-80GB"
    assert lines[at + 2].split() == [
        "IDX", "HEALTH", "ACTION", "TEMP", "POWER", "UTIL", "MEMORY", "BUS", "ID"
    ]  # fmt: skip
    # the row of GPU 1 as recorded: 22 C, 60.3 W, 0.7 of 80 GiB, bus 0000:9e:00.0
    assert lines[at + 4].split() == [
        "1", "CRITICAL", "reset_card", "22", "C", "60.3", "W", "0%", "0.7/80.0", "GiB",
        "0000:9e:00.0",
    ]  # fmt: skip
    # a long finding wraps under its own indent instead of running past 80
    assert lines[at + 5] == (
        "      critical remapped_rows_pending: remapped rows pending: the GPU needs a"
    )
    assert lines[at + 6] == "               reset"
    # so does the action line of the critical NPU kept in service: under its text too
    npu = lines.index("      critical vendor_health: vendor health is Alarm")
    assert lines[npu + 1 : npu + 3] == [
        "      action watch: kept in service and watched, no drain (vendor health",
        "             'Alarm')",
    ]


def test_at_160_columns_and_in_a_pipe_every_column_stays():
    for columns in ("160", None):
        lines = _once("sick-mixed", columns)
        header = next(line for line in lines if line.startswith("  IDX  HEALTH    ACTION"))
        assert header.split()[-3:] == ["BUS", "ID", "MODEL"], header
        row = next(line for line in lines if line.startswith("  1    CRITICAL"))
        assert row.endswith("0000:9e:00.0  NVIDIA A100-SXM4-80GB")


def test_a_narrow_terminal_drops_power_then_bus_id_never_health():
    lines = _once("healthy-mixed", "60")
    header = next(line for line in lines if line.startswith("  IDX  CHIP"))
    assert header.split() == ["IDX", "CHIP", "HEALTH", "TEMP", "UTIL", "MEMORY", "BUS", "ID"]
    header = next(line for line in _once("healthy-mixed", "50") if line.startswith("  IDX  CHIP"))
    assert header.split() == ["IDX", "CHIP", "HEALTH", "TEMP", "UTIL", "MEMORY"], header


@pytest.mark.parametrize("columns", ["60", None])
def test_a_node_finding_says_its_action(columns):
    """fixtures/nodes/gpu-unlisted: lspci lists an H100 at 0000:e8:00.0 that
    nvidia-smi does not. ``once`` is one patrol: the header says "action watch" and the
    node finding's own line says it is watched, no drain (pci_census.unlisted_patrols:
    critical only after 3 patrols in a row); the third patrol's view says
    "action reset_card" and names the card (the card tables are all ok)."""
    from dataclasses import replace

    from hetpatrol.cli import format_table
    from hetpatrol.config import load_config
    from hetpatrol.patrol import Patroller

    lines = _once("gpu-unlisted", columns)
    assert lines[0].startswith("node mixed-unlisted-01  WARNING   action watch")
    at = next(i for i, ln in enumerate(lines) if ln.startswith("  warning pci_unwatched: "))
    action = next(ln for ln in lines[at + 1 :] if not ln.startswith("          "))
    assert action == "    action watch: kept in service and watched, no drain"
    assert all(len(ln) <= int(columns or 1000) for ln in lines)
    config = replace(load_config(), node="mixed-unlisted-01")
    p = Patroller(config, replay_dir=NODES / "gpu-unlisted")
    try:
        report = [p.run() for _ in range(3)][-1]
    finally:
        p.close()
    width = int(columns) if columns else None
    lines = format_table(report, verbose=True, width=width).splitlines()
    assert lines[0].startswith("node mixed-unlisted-01  CRITICAL   action reset_card")
    at = next(i for i, ln in enumerate(lines) if ln.startswith("  critical pci_unwatched: "))
    action = next(ln for ln in lines[at + 1 :] if not ln.startswith("           "))
    assert action == "    action reset_card: the card at 0000:e8:00.0"
    assert all(len(ln) <= int(columns or 1000) for ln in lines)


ROCM_NAME = (
    "rocm-smi_-i_--showmeminfo_vram_--showpower_--showserial_--showuse_--showtemp_"
    "--showproductname_--showuniqueid_--json.txt"
)  # the recording the hygon and amd collectors look for (collectors/rocm_smi.py's argv)


@pytest.mark.parametrize("columns", ["80", "160"])
def test_a_missing_recordings_name_is_never_broken_across_lines(columns):
    """``once -v`` at 80 columns broke the missing recordings' 120-character names
    (``rocm-smi_-i_`` / ``--showmeminfo_vram_...``), first mid-word, then at each ``_``.
    A name wider than a whole line now goes on a line of its own, cut with ``...`` as a
    finding's message is; at 160 columns it is whole. ``--format json`` keeps it whole."""
    lines = _once("mig-a100", columns)
    at = next(i for i, x in enumerate(lines) if x.startswith("  hygon absent"))
    block = [lines[at]] + [
        x for x in itertools.takewhile(lambda x: x.startswith("    "), lines[at + 1 :])
    ]
    assert block[0].endswith(": rocm-smi not found: no recording"), block
    assert all(len(x) <= int(columns) for x in block), block
    if columns == "160":
        assert block[1].startswith(f"    {ROCM_NAME} in"), block
        return
    # 76 columns of room under the 4-space indent: 73 characters of the name, then ...
    assert block[1] == (
        "    rocm-smi_-i_--showmeminfo_vram_--showpower_--showserial_--showuse_--showt..."
    ), block
    assert block[2].startswith("    in "), block
    assert not any(x.endswith(("_", ",")) for x in block), block
    gaudi = next(x for x in lines if x.startswith("    hl-smi_-Q_"))
    assert gaudi == (  # 73 characters end in "memory." : the dot goes before the ...
        "    hl-smi_-Q_index,uuid,name,driver_version,memory.total,memory.used,memory..."
    )
    res = subprocess.run(
        [*HETPATROL, "once", "--replay", str(NODES / "mig-a100"), "--format", "json"],
        capture_output=True,
        text=True,
    )
    assert f"no recording {ROCM_NAME} in " in res.stdout


def test_words_wrap_at_spaces_then_path_separators():
    from hetpatrol.node_view import wrap_words

    path = "/var/lib/hetpatrol/replays/site-a/node-0042/rocm-smi_--showuse.txt"
    assert wrap_words(f"no recording in {path} today", 30, "", "  ") == [
        "no recording in /var/lib/",
        "  hetpatrol/replays/site-a/",
        "  node-0042/",
        "  rocm-smi_--showuse.txt today",
    ]
    # a piece still wider than a whole line is cut with ..., never broken
    assert wrap_words("x abcdefghijklmnopqrstuvwxyz", 10, "", "") == ["x", "abcdefg..."]
    assert wrap_words("see aaa_bbb_ccc_ddd_eee now", 12, "", "  ") == [
        "see",
        "  aaa_bbb...",
        "  now",
    ]


def test_a_number_stays_with_its_unit():
    """At 160 columns ``status -v`` printed ``asked again in 470`` / ``s or when one
    appears``: a number and its unit are one word to the wrapping."""
    from hetpatrol.node_view import wrap_words

    text = "no enflame card on the PCI bus: asked again in 470 s or when one appears"
    assert wrap_words(text, 51, "", "    ") == [
        "no enflame card on the PCI bus: asked again in",
        "    470 s or when one appears",
    ]
    assert wrap_words("used 36.8 GiB, at 38 C.", 12, "", "") == [
        "used",
        "36.8 GiB, at",
        "38 C.",
    ]


def test_a_label_stays_with_its_number():
    """At 80 columns ``once -v`` of nvlink-storm ended a line with ``... (warning) pid``
    and began the next with ``48213 python3``, and ``...; XID`` / ``149 (NVLink: ...``:
    a label and its number (pid, job, uid, XID, link...) are one word to the wrapping."""
    from hetpatrol.node_view import wrap_words

    lines = _once("nvlink-storm", "80")
    labels = ("pid", "job", "jobs", "uid", "XID", "xid", "link", "GI", "CI", "boot")
    ends = [ln for ln in lines if ln.rstrip().endswith(tuple(f" {w}" for w in labels))]
    assert ends == [], "\n".join(lines)
    # the NVRM line's process (kmsg.txt: "pid=48213, name=python3") on one line
    assert any(ln.lstrip().startswith("pid 48213 python3") for ln in lines), "\n".join(lines)
    text = "pid 4242 (alice, job 1234_7) on a card of job 77, (uid 0) xid 79."
    assert wrap_words(text, 14, "", "") == [
        "pid 4242",
        "(alice,",
        "job 1234_7) on",
        "a card of",
        "job 77,",
        "(uid 0)",
        "xid 79.",
    ]


def test_a_mig_device_line_keeps_its_two_space_gaps_when_wrapped():
    """At 80 columns the MIG device's line (mig-a100, telegraf's recording) is wrapped
    before its UUID; its parts stayed two spaces apart only when it fit (``mig 0
    1g.20gb GI 3 CI 0`` read as one run of words)."""
    lines = _once("mig-a100", "80")
    at = lines.index("      mig 0  1g.20gb  GI 3 CI 0  0.0/19.5 GiB")
    assert lines[at + 1] == "        MIG-4b6b5a0c-3b5e-5b2a-9d1e-6a0f0e3c1a01"
    assert "        pid 81123  python3  0.0 GiB" in lines
