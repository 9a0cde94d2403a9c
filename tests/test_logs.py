"""hetpatrol.logs, the structured log that replaced structlog (issue 17): the console and
json lines, level filtering, one whole line per event from many threads, values that
would break a line, a stream that fails, the test capture, and the daemon's import graph
without asyncio or structlog.

The expected console lines were read off structlog 26.1's ``ConsoleRenderer(colors=False)``
for the same events (the format the daemon wrote before), e.g. ``[warning  ]`` (the level
padded to 9) and the event padded to 30."""

from __future__ import annotations

import io
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

import pytest

from hetpatrol import logs
from hetpatrol.cli import setup_logging
from hetpatrol.logs import capture_logs, get_logger

log = get_logger("tests.logs")
STAMP = r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z)"


class Writes(io.StringIO):
    """A stream that keeps each write() apart."""

    def __init__(self) -> None:
        super().__init__()
        self.writes: list[str] = []
        self.flushes = 0

    def write(self, s: str) -> int:
        self.writes.append(s)
        return super().write(s)

    def flush(self) -> None:
        self.flushes += 1


def configured(level: str = "debug", fmt: str = "console") -> Writes:
    stream = Writes()
    logs.configure(level, fmt, stream)  # conftest puts the configuration back afterwards
    return stream


# ------------------------------------------------------------------------------ console
def test_console_line_is_the_structlog_console_line():
    out = configured("info")
    before = datetime.now(timezone.utc)
    log.warning("patrol_overran", seq=67, missed_slots=1, seconds=0.014)
    (line,) = out.writes
    m = re.fullmatch(
        STAMP + r" \[warning  \] patrol_overran                 missed_slots=1 seconds=0.014"
        r" seq=67\n",
        line,
    )
    assert m, line
    when = datetime.strptime(m.group(1), "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=timezone.utc)
    assert abs((when - before).total_seconds()) < 5  # UTC, not local time
    assert out.flushes == 1  # journald sees the line at once


def test_console_values_quoted_as_structlog_did():
    out = configured()
    log.error(
        "config_reload_failed",
        error="bogus_key: unknown key",
        action="keeping running config",
        source="/etc/hetpatrol/hetpatrol.yaml",
    )
    log.info(
        "started",
        node="n1",
        collectors=["nvidia", "ascend"],
        interval_seconds=10.0,
        none=None,
        flag=True,
        empty="",
        eq="a=b",
        quote="it's",
        uni="温度",
        pair=(1, "x"),
    )
    log.info("stopped")
    log.critical("a_very_long_event_name_longer_than_thirty_chars", x=1)
    log.debug("d")
    tails = [re.sub("^" + STAMP + " ", "", w) for w in out.writes]
    assert tails == [
        "[error    ] config_reload_failed           action='keeping running config'"
        " error='bogus_key: unknown key' source=/etc/hetpatrol/hetpatrol.yaml\n",
        "[info     ] started                        collectors=['nvidia', 'ascend'] empty="
        " eq='a=b' flag=True interval_seconds=10.0 node=n1 none=None pair=(1, 'x')"
        ' quote="it\'s" uni=温度\n',
        "[info     ] stopped\n",  # no fields: no padding left at the end
        "[critical ] a_very_long_event_name_longer_than_thirty_chars x=1\n",
        "[debug    ] d\n",
    ]


def test_values_that_would_break_the_line_stay_on_one_line():
    class Multiline:
        def __repr__(self) -> str:
            return "first\nsecond\rthird"

    for fmt in ("console", "json"):
        out = configured(fmt=fmt)
        log.warning(
            "notify_failed",
            error="line one\nline two",
            tab="a\tb",
            escape="\x1b[31mred",
            sep="a\u2028b",
            obj=Multiline(),
            raw=b"\x00\n",
        )
        log.warning("event\nwith newline", x=1)
        assert len(out.writes) == 2
        for w in out.writes:
            assert w.endswith("\n") and w.count("\n") == 1 and "\r" not in w, (fmt, w)
            assert "\x1b" not in w and "\u2028" not in w, (fmt, w)
            assert w[:-1].isprintable(), (fmt, w)
        if fmt == "console":
            assert "error='line one\\nline two'" in out.writes[0]
            assert "escape='\\x1b[31mred'" in out.writes[0]
            assert "obj=first\\nsecond\\rthird" in out.writes[0]
        else:
            doc = json.loads(out.writes[0])
            assert doc["error"] == "line one\nline two"  # json escapes, the value is whole
            assert doc["obj"] == "first\nsecond\rthird"  # str() of a non-JSON value
            assert doc["raw"] == str(b"\x00\n")
            assert json.loads(out.writes[1])["event"] == "event\nwith newline"


# --------------------------------------------------------------------------------- json
def test_json_line_parses_with_event_level_timestamp_and_fields():
    out = configured("info", "json")
    log.warning(
        "jsonl_write_failed",
        path=Path("/var/lib/hetpatrol/patrol.jsonl"),
        lost=3,
        ratio=0.5,
        cards=["GPU-e94fa8ce-6e04-a49e-f637-ba3a7dc7019a"],
        none=None,
        level="caller's",
    )
    (line,) = out.writes
    assert line.endswith("}\n") and line.count("\n") == 1
    doc = json.loads(line)
    assert list(doc)[:3] == ["timestamp", "level", "event"]
    assert re.fullmatch(STAMP, doc.pop("timestamp"))
    assert doc == {
        "level": "warning",
        "event": "jsonl_write_failed",
        "path": "/var/lib/hetpatrol/patrol.jsonl",  # a Path: its str()
        "lost": 3,
        "ratio": 0.5,
        "cards": ["GPU-e94fa8ce-6e04-a49e-f637-ba3a7dc7019a"],
        "none": None,
        "field_level": "caller's",  # kept, not lost, not overwriting the level
    }
    assert line.isascii()


def test_json_values_json_cannot_encode_still_make_one_line():
    out = configured(fmt="json")
    loop: list = []
    loop.append(loop)
    log.error("odd", loop=loop, keyed={(1, 2): "tuple key"}, n=7)
    doc = json.loads(out.writes[0])
    assert (doc["event"], doc["level"], doc["n"]) == ("odd", "error", "7")
    assert doc["keyed"] == "{(1, 2): 'tuple key'}"
    assert doc["loop"] == "[[...]]"


# ------------------------------------------------------------------------------ levels
def test_level_filter():
    out = configured("warning")
    log.debug("d")
    log.info("i")
    log.warning("w")
    log.error("e")
    log.critical("c")
    assert [re.search(r"\[(\w+) *\] (\w+)", w).groups() for w in out.writes] == [
        ("warning", "w"),
        ("error", "e"),
        ("critical", "c"),
    ]
    out = configured("error", "json")
    log.warning("w")
    log.error("e")
    assert [json.loads(w)["event"] for w in out.writes] == ["e"]
    out = configured("debug", "json")
    log.debug("d", x=1)
    assert [json.loads(w)["level"] for w in out.writes] == ["debug"]


def test_setup_logging_takes_the_cli_choices_and_refuses_others():
    stream = Writes()
    logs.configure("info", "console", stream)
    setup_logging("json", "error")  # what `--log-format json --log-level error` sets
    config = logs.get_config()
    assert (config.level, config.fmt, config.stream) == (logs.ERROR, "json", None)
    with pytest.raises(ValueError, match="unknown log level 'loud'"):
        logs.configure("loud")
    with pytest.raises(ValueError, match="unknown log format 'xml'"):
        logs.configure("info", "xml")


def test_the_stream_is_stderr_at_write_time(capsys):
    setup_logging("console", "info")
    log.info("collector_state", collector="ascend", state="hung")
    err = capsys.readouterr().err
    assert re.fullmatch(
        STAMP + r" \[info     \] collector_state                collector=ascend state=hung\n",
        err,
    ), err


# ----------------------------------------------------------------------------- threads
def test_threads_each_line_whole_in_one_write(tmp_path):
    threads, per_thread = 8, 200
    path = tmp_path / "log"
    with path.open("w") as fh:
        logs.configure("info", "json", fh)
        start = threading.Barrier(threads)

        def worker(t: int) -> None:
            start.wait()
            for i in range(per_thread):
                log.info("tick", thread=t, i=i, text="x " * (i % 50), nl="a\nb")

        pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join()
    lines = path.read_text().splitlines()
    assert len(lines) == threads * per_thread
    docs = [json.loads(line) for line in lines]  # every line parses: none torn or glued
    for t in range(threads):
        assert [d["i"] for d in docs if d["thread"] == t] == list(range(per_thread))
    assert {d["nl"] for d in docs} == {"a\nb"}


def test_console_lines_from_threads_never_interleave():
    out = configured("info")

    def worker(t: int) -> None:
        for i in range(200):
            log.info("tick", thread=t, i=i, text="a b")

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(8)]
    for th in pool:
        th.start()
    for th in pool:
        th.join()
    assert len(out.writes) == 1600
    text = out.getvalue().splitlines()
    pattern = re.compile(STAMP + r" \[info     \] tick {27}i=\d+ text='a b' thread=\d")
    assert all(pattern.fullmatch(line) for line in text)


# ------------------------------------------------------------------------------ failure
def test_a_stream_that_fails_drops_the_line_and_never_raises():
    class Broken(io.StringIO):
        def write(self, s: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    before = logs.dropped_lines
    logs.configure("info", "console", Broken())
    log.error("drain_policy_failed", error="x")
    closed = io.StringIO()
    closed.close()
    logs.configure("info", "json", closed)
    log.warning("notify_failed")
    assert logs.dropped_lines == before + 2


# ------------------------------------------------------------------------------ capture
def test_capture_logs_collects_every_level_and_writes_nothing():
    out = configured("error")
    with capture_logs() as outer:
        log.debug("d", x=1)
        with capture_logs() as inner:
            log.warning("nvml_fallback", call="nvmlDeviceGetTemperatureV")
        log.info("i")
    log.info("after")  # filtered out again: the capture has ended
    assert out.writes == []
    assert inner == [
        {
            "event": "nvml_fallback",
            "level": "warning",
            "logger": "tests.logs",
            "call": "nvmlDeviceGetTemperatureV",
        }
    ]
    assert [(e["event"], e["level"]) for e in outer] == [("d", "debug"), ("i", "info")]


def test_a_filtered_out_call_costs_no_rendering():
    class Loud:
        def __repr__(self) -> str:
            raise AssertionError("rendered although filtered out")

    out = configured("warning")
    log.info("i", value=Loud())
    log.debug("d", value=Loud())
    assert out.writes == []


# --------------------------------------------------------------------- the import graph
def test_the_daemon_and_cli_import_none_of_the_heavy_packages():
    """What ``hetpatrol run`` imports (issue 17, resident memory): structlog imported
    asyncio, and rich and pygments where rich is installed (3 to 7 MB); ssl comes with
    http.client and http.server (~5 MB); prometheus-client ~10 MB (the exposition is
    rendered by hetpatrol.exporters.text_format); jsonschema ~6 MB (the config's schema is
    checked in a child, hetpatrol.config_check)."""
    code = (
        "import sys, json\n"
        "import hetpatrol.daemon, hetpatrol.cli\n"
        "heavy = ('asyncio', 'structlog', 'rich', 'pygments', 'ssl', 'prometheus_client',\n"
        "         'jsonschema', 'referencing', 'http')\n"
        "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules} & set(heavy))))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []


def test_a_fork_while_another_thread_logs_leaves_the_child_able_to_log(tmp_path):
    """The daemon's tests (and a supervisor) fork from processes whose threads log: a
    child born while the parent's log lock was held must not wait on it forever."""
    path = tmp_path / "child.log"
    with logs._lock:  # as if another thread were writing a line at the fork
        pid = os.fork()
        if pid == 0:
            try:
                with path.open("w") as fh:
                    logs.configure("info", "json", fh)
                    log.info("child_logged")
            finally:
                os._exit(0)
    deadline = time.monotonic() + 10
    while not os.waitpid(pid, os.WNOHANG)[0]:
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            pytest.fail("the child waited forever on the log lock")
        time.sleep(0.02)
    assert json.loads(path.read_text())["event"] == "child_logged"


# ------------------------------------------------------------------------------ hostile values
class _Unprintable:
    def __repr__(self) -> str:
        raise RuntimeError("repr failed")

    def __str__(self) -> str:
        raise RuntimeError("str failed")


def _nested(depth: int) -> list:
    value: list = []
    for _ in range(depth):
        value = [value]
    return value


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_a_value_that_cannot_be_rendered_never_raises_into_the_caller(fmt):
    stream = configured("info", fmt)
    log.warning("collector_failed", seq=3, error=_Unprintable(), deep=_nested(100_000))
    (line,) = stream.writes
    assert line.endswith("\n") and line.count("\n") == 1
    assert "<unprintable _Unprintable: RuntimeError>" in line
    assert "<unprintable list: RecursionError>" in line
    if fmt == "json":
        doc = json.loads(line)
        assert doc["event"] == "collector_failed" and doc["seq"] == "3"


@pytest.mark.parametrize("fmt", ["console", "json"])
def test_a_huge_value_is_cut_so_the_line_stays_under_journald_line_max(fmt):
    stream = configured("info", fmt)
    log.error("tool_failed", stderr="E" * 1_000_000, items=list(range(100_000)))
    (line,) = stream.writes
    assert len(line) < 48 * 1024  # journald.conf(5) LineMax= default: longer is split
    assert f"{'E' * logs.VALUE_MAX_CHARS}...[{1_000_000 - logs.VALUE_MAX_CHARS} more chars]" in line
    if fmt == "json":
        assert json.loads(line)["stderr"].startswith("EEE")


def test_stderr_none_drops_the_line_and_never_raises(monkeypatch):
    # a process started with fd 2 closed gets sys.stderr = None
    logs.configure("info", "json", None)
    monkeypatch.setattr(sys, "stderr", None)
    before = logs.dropped_lines
    log.error("drain_policy_failed", error="x")
    assert logs.dropped_lines == before + 1


def test_json_lines_stay_strict_json_with_nan_and_infinity():
    """``json.dumps`` writes NaN / Infinity by default: not JSON (RFC 8259 section 6); a
    strict parser (Go's encoding/json in a log shipper) refuses the whole line."""
    stream = configured("info", "json")
    log.warning("temperature_unreadable", celsius=float("nan"), limit=float("-inf"), seq=2)
    log.warning("power_samples", watts=[1.5, float("inf")])

    def refuse(constant: str):
        raise ValueError(f"not JSON: {constant}")

    first, second = (json.loads(w, parse_constant=refuse) for w in stream.writes)
    assert (first["celsius"], first["limit"], first["seq"]) == ("nan", "-inf", 2)
    assert second["watts"] == "[1.5, inf]"
