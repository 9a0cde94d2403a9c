"""`hetpatrol status`: the operator's view, on a terminal (pty) and through a pipe."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pty_helpers
import pytest
from conftest import NODES
from test_end_to_end import HETPATROL, free_port, wait_for

from hetpatrol.config import load_config
from hetpatrol.exporters.state import write_state
from hetpatrol.node_view import render, use_color
from hetpatrol.patrol import Patroller
from hetpatrol.replay import load_scenario

ESC = "\x1b["


def make_state(tmp_path: Path, scenario: str, *, age: float = 0.0) -> Path:
    config = replace(load_config(), node=load_scenario(NODES / scenario)["node"])
    patroller = Patroller(config, replay_dir=NODES / scenario)
    try:
        report = patroller.run()
    finally:
        patroller.close()
    path = tmp_path / f"{scenario}.state.json"
    write_state(path, report, 10)
    if age:
        doc = json.loads(path.read_text())
        doc["finished"] -= age
        doc["finished_boot"] -= age  # written `age` seconds ago on either clock
        path.write_text(json.dumps(doc))
    return path


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    env["TERM"] = "xterm-256color"
    env.update(extra)
    return env


def run_on_pty(args: list[str], env: dict[str, str]) -> tuple[int, str]:
    """Run ``hetpatrol`` with its stdout on a pseudo-terminal; (exit code, output)."""
    return pty_helpers.run_on_pty([*HETPATROL, *args], env, timeout=30)


def run_piped(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([*HETPATROL, *args], capture_output=True, text=True, env=env, timeout=30)


def test_terminal_gets_colour(tmp_path):
    state = make_state(tmp_path, "sick-mixed")
    rc, out = run_on_pty(["status", "--state-path", str(state)], clean_env())
    assert rc == 2  # the verdict's exit code: critical
    assert ESC in out
    assert "\x1b[1;31mCRITICAL\x1b[0m" in out  # the node verdict, bold red
    assert "\x1b[32mOK\x1b[0m" in out  # healthy cards green


def test_no_color_on_a_terminal(tmp_path):
    state = make_state(tmp_path, "sick-mixed")
    rc, out = run_on_pty(["status", "--state-path", str(state)], clean_env(NO_COLOR="1"))
    assert rc == 2 and ESC not in out and "CRITICAL" in out


def test_pipe_is_plain_and_complete(tmp_path):
    state = make_state(tmp_path, "sick-mixed")
    res = run_piped(["status", "--state-path", str(state)], clean_env())
    assert res.returncode == 2, res.stderr
    out = res.stdout
    assert ESC not in out and "\x1b" not in out
    lines = out.splitlines()
    assert lines[0].startswith("node mixed-sick-01  CRITICAL   action reboot_node   patrol 1, ")
    # the age is the seconds since make_state wrote it: 0 or 1, more on a loaded machine
    assert re.search(r"verdict \d{1,2} s old \(every 10 s\)$", lines[0])
    assert lines[1] == "12 cards: 9 ok, 3 critical   drivers: ascend 25.2.0, nvidia 555.42.02"
    # grouped by vendor and card type, a row per card, findings under their card
    assert "ascend 910b (gres ascend)  8 cards: 7 ok, 1 critical" in lines
    row5 = next(i for i, x in enumerate(lines) if x.split()[:3] == ["5", "0", "CRITICAL"])
    assert lines[row5].split() == [
        *("5", "0", "CRITICAL", "watch", "38", "C", "97.2", "W", "0%", "3.3/64.0", "GiB"),
        *("0000:02:00.0", "910B3"),
    ]
    assert lines[row5 + 1] == "      critical vendor_health: vendor health is Alarm"
    # a critical card left in service says so, with the action's reason
    assert lines[row5 + 2] == (
        "      action watch: kept in service and watched, no drain (vendor health 'Alarm')"
    )
    # NPU 2 holds the 37 GiB process of the recording (pid 1333928, no name in the
    # container's PID namespace): listed under its card
    row2 = next(i for i, x in enumerate(lines) if x.split()[:3] == ["2", "0", "OK"])
    assert "40.1/64.0 GiB" in lines[row2]
    assert lines[row2 + 1] == "      pid 1333928  36.8 GiB"
    assert (
        "      critical remapped_rows_pending: remapped rows pending: the GPU needs a reset"
        in lines
    )
    assert any("GPU is lost (fell off the bus)" in x for x in lines)
    # a value that could not be read is said as such, not as a severity word
    assert "      not read nvmlDeviceGetHandleByIndex: GpuIsLost" in lines
    # (the other shipped plugins follow, absent: config/hetpatrol.yaml enables them all)
    at = lines.index("collectors:")
    assert lines[at + 1].startswith("  nvidia ok (4 cards, ")
    assert lines[at + 2].startswith("  ascend ok (8")


def test_once_and_status_print_the_same_view(tmp_path):
    state = make_state(tmp_path, "nvlink-storm")
    status = run_piped(["status", "--state-path", str(state), "-v"], clean_env())
    once = run_piped(["once", "--replay", str(NODES / "nvlink-storm"), "-v"], clean_env())
    assert (status.returncode, once.returncode) == (2, 2)

    # the same cards, findings and collectors below the header (timings masked)
    def body(text):
        lines = [x for x in text.splitlines()[1:] if not x.startswith("state file:")]
        lines = [re.sub(r"\d+\.\d{3} s\)", "T s)", x) for x in lines]
        return [
            x
            for x in lines
            if not x.startswith(("kernel log events", "  critical xid", "  warning xid"))
            # the daemon's kept fault events: status only (once lists this patrol's)
            and not x.startswith("recent card faults")
            and not re.match(r"  \S+ \S+ ago  ", x)
        ]

    assert body(status.stdout) == body(once.stdout)
    assert (
        once.stdout.splitlines()[0] == "node nvlink-storm-01  CRITICAL   action reset_card   exit 2"
    )


def test_info_findings_are_hidden_unless_verbose(tmp_path):
    # every idle H100 of nvlink-storm reports HW slowdown + power brake (mask 0x88) as
    # info: no work is slowed, nothing to alarm an operator with
    plain = run_piped(["once", "--replay", str(NODES / "nvlink-storm")], clean_env()).stdout
    assert "clock_event_reasons" not in plain
    # 8 clock findings and the census one (the scenario has no PCI census recording)
    assert plain.splitlines()[-1] == "9 info findings hidden (-v)"
    verbose = run_piped(["once", "--replay", str(NODES / "nvlink-storm"), "-v"], clean_env())
    assert verbose.stdout.count("info clock_event_reasons: clocks slowed by HW slowdown") == 8
    assert "hidden (-v)" not in verbose.stdout
    # an NVLink error finding reads as words, not a Python dict
    assert (
        "nvlink_errors: 286 NVLink DL errors since driver load (most on link 7: replay 31, "
        "recovery 12, crc_flit 240, crc_data 3)" in plain
    )


def test_findings_wrap_to_the_terminal_width(tmp_path):
    state = make_state(tmp_path, "nvlink-storm")
    rc, out = run_on_pty(
        ["status", "--state-path", str(state), "--color", "never"], clean_env(COLUMNS="80")
    )
    assert rc == 2
    lines = out.splitlines()
    findings = [x for x in lines if x.startswith("      ")]
    assert findings and all(len(x) <= 80 for x in findings)
    xid = next(i for i, x in enumerate(lines) if x.startswith("      critical xid: kernel log"))
    # the continuation lines hang under the text, not under the severity word
    assert lines[xid + 1].startswith("               ") and "XID 149" in " ".join(
        x.strip() for x in lines[xid : xid + 6]
    )


def test_json_for_scripts(tmp_path):
    state = make_state(tmp_path, "healthy-mixed")
    res = run_piped(["status", "--state-path", str(state), "--json"], clean_env())
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert doc["health"] == "ok" and doc["stale"] is False and doc["age_seconds"] < 30
    assert doc["state_path"] == str(state)
    assert len(doc["cards"]) == 16
    npu4 = next(c for c in doc["cards"] if c["vendor"] == "ascend" and c["index"] == 4)
    assert npu4["temperature_celsius"] == 39.0  # npu-smi Temp(C) of NPU 4


def test_stale_verdict_is_unknown(tmp_path):
    state = make_state(tmp_path, "healthy-mixed", age=3600)
    res = run_piped(["status", "--state-path", str(state)], clean_env())
    assert res.returncode == 3
    assert "60 min old" in res.stdout and "STALE" in res.stdout
    res = run_piped(["status", "--state-path", str(state), "--json"], clean_env())
    assert json.loads(res.stdout)["stale"] is True and res.returncode == 3


def test_a_stop_mark_wraps_on_a_line_of_its_own_on_a_narrow_terminal(tmp_path):
    """At 80 columns (a tmux pane) the STOPPED note of a stopped daemon goes under the
    verdict's age, wrapped at spaces: it was left whole after it and the terminal cut
    its time in two (``... stopped at 202`` / ``6-12-01T...``). In a pipe it stays on
    the first line, as `check` and scripts read it."""
    from hetpatrol.healthcheck import utc_text

    state = make_state(tmp_path, "healthy-mixed")
    doc = json.loads(state.read_text())
    at = doc["finished"]
    doc["stopped"] = {"at": at, "reason": "SIGTERM", "pid": 4242}
    said = f"STOPPED: the daemon was stopped at {utc_text(at)} (SIGTERM), the verdict is from then"
    for width in (80, 70):
        lines = render(doc, width=width).splitlines()
        assert all(len(x) <= width for x in lines[:4]), "\n".join(lines[:4])
        assert lines[0].startswith("node mixed-ok-01  OK   patrol 1, verdict ")
        assert lines[0].endswith("(every 10 s)")
        assert lines[1].startswith("  STOPPED: ") and utc_text(at) in lines[1]
        assert lines[2].startswith("    ") and " ".join(x.strip() for x in lines[1:3]) == said
    first = render(doc, width=None).splitlines()[0]
    assert first.startswith("node mixed-ok-01  OK   patrol 1, verdict ")
    assert first.endswith("(every 10 s)  " + said)
    assert render(doc, width=200).splitlines()[0] == first  # it fits: as in the pipe


def test_missing_state_file(tmp_path):
    res = run_piped(["status", "--state-path", str(tmp_path / "nope.json")], clean_env())
    assert res.returncode == 3
    assert "cannot read the state file" in res.stderr and res.stdout == ""


@pytest.mark.parametrize(
    ("mode", "isatty", "env", "expected"),
    [
        ("auto", True, {}, True),
        ("auto", False, {}, False),
        ("auto", True, {"NO_COLOR": "1"}, False),
        ("auto", True, {"NO_COLOR": ""}, True),  # NO_COLOR only counts when non-empty
        ("auto", True, {"TERM": "dumb"}, False),
        ("always", False, {"NO_COLOR": "1"}, True),
        ("never", True, {}, False),
    ],
)
def test_use_color(mode, isatty, env, expected):
    class Stream:
        def isatty(self):
            return isatty

    assert use_color(Stream(), mode, env) is expected  # type: ignore[arg-type]


def test_render_without_cards():
    doc = {
        "node": "n1",
        "seq": 1,
        "finished": time.time(),
        "interval_seconds": 10,
        "health": "unknown",
        "collectors": {"ascend": {"state": "failed", "cards": 0, "error": "DCMI -8005"}},
        "findings": [
            {"check": "collector_failed", "severity": "unknown", "message": "ascend: DCMI -8005"}
        ],
        "cards": [],
    }
    lines = render(doc).splitlines()
    assert lines[0].startswith("node n1  UNKNOWN   patrol 1, verdict 0 s old")
    assert lines[1] == "no card was read"
    assert "IDX" not in "".join(lines)  # no empty table header
    # the DCMI error is said once: in the node finding, not again on the collector
    assert lines[-4:] == [
        "collectors:",
        "  ascend failed (0 cards, 0.000 s): see the node findings",
        "node findings:",
        "  unknown collector_failed: ascend: DCMI -8005",
    ]


def test_status_of_a_running_daemon_reads_the_configs_state_path(tmp_path):
    """Without --state-path, status reads the state_path of the config the daemon runs."""
    config = tmp_path / "hetpatrol.yaml"
    text = Path(load_config().source).read_text()
    config.write_text(
        "\n".join(
            f'state_path: "{tmp_path}/state.json"' if x.startswith("state_path:") else x
            for x in text.splitlines()
        )
        + "\n"
    )
    env = clean_env(XDG_STATE_HOME=str(tmp_path / "xdg"))
    proc = subprocess.Popen(
        [
            *HETPATROL,
            "run",
            "--config",
            str(config),
            "--replay",
            str(NODES / "ascend-a3-only"),
            "--listen",
            f"127.0.0.1:{free_port()}",
            "--interval",
            "0.5",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        wait_for((tmp_path / "state.json").exists, proc=proc)
        rc, out = run_on_pty(["status", "--config", str(config)], env)
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    assert proc.returncode == 0, err
    assert rc == 0, out
    assert "node a3-01  \x1b[32mOK\x1b[0m" in out
    assert "16 chips on 8 cards: \x1b[32m16 ok\x1b[0m   drivers: ascend " in out
    assert "\x1b[1mascend 910_93 (gres ascend)\x1b[0m  16 chips on 8 cards: \x1b[32m16 ok" in out
    assert "error" not in out.replace("errors", "")  # chip 1 has no power: no news


def test_control_characters_from_a_vendor_string_are_printed_escaped(tmp_path):
    """A model name and a collector error carrying ANSI escapes and a newline (a garbled
    tool output kept in the state file): shown as escapes, never sent to the terminal."""
    path = make_state(tmp_path, "healthy-mixed")
    doc = json.loads(path.read_text())
    doc["cards"][0]["model"] = "A100\x1b[2J\x1b]0;owned\x07"
    doc["collectors"]["ascend"]["error"] = "npu-smi said:\nline two\x9b31m"
    path.write_text(json.dumps(doc))
    proc = run_piped(["status", "--state-path", str(path), "--color", "always"], clean_env())
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "A100\\x1b[2J\\x1b]0;owned\\x07" in out
    assert "npu-smi said:\\nline two\\x9b31m" in out
    # the only escapes left are the view's own colours (ESC [ digits m)
    assert all(c == "\n" or c.isprintable() for c in re.sub(r"\x1b\[[0-9;]*m", "", out))


def test_bidi_controls_are_printed_escaped():
    """Unicode bidi controls (a Trojan Source reordering) are escaped like C0/C1
    controls; other non-ASCII text is kept."""
    from hetpatrol.node_view import printable as _printable

    bidi = "\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
    doc = {"key\u202e": [f"a{bidi}b", "caf\u00e9 \u4e2d\x1b[2J", 3.5]}
    assert _printable(doc) == {
        "key\\u202e": [
            "a\\u200e\\u200f\\u202a\\u202b\\u202c\\u202d\\u202e\\u2066\\u2067\\u2068\\u2069b",
            "caf\u00e9 \u4e2d\\x1b[2J",
            3.5,
        ]
    }


def test_the_drivers_line_says_a_vendor_that_reports_no_driver_version():
    from hetpatrol.node_view import _drivers

    cards = [
        {"vendor": "nvidia", "driver_version": "555.42.02"},
        {"vendor": "hygon", "driver_version": None},
        {"vendor": "ascend", "driver_version": "25.2.0"},
        {"vendor": "ascend", "driver_version": "25.3.0"},
        {"vendor": "nvidia", "driver_version": "555.42.02"},
    ]
    assert _drivers(cards) == "ascend 25.2.0 / 25.3.0, hygon not reported, nvidia 555.42.02"


def test_a_state_file_others_may_write_is_not_shown_as_the_verdict(tmp_path):
    """As ``check``: a state file everyone may write is someone else's word."""
    state = make_state(tmp_path, "healthy-mixed")
    state.chmod(0o666)
    res = run_piped(["status", "--state-path", str(state)], clean_env())
    assert (res.returncode, res.stdout) == (3, "")
    assert f"untrusted state file {state}: " in res.stderr
    assert "is writable by everyone (mode 666)" in res.stderr
