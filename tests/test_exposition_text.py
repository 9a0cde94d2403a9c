"""The exposition the daemon serves: the same bytes prometheus-client would write, from
label strings cached across patrols; gzip for the scrapers that ask (Prometheus does)."""

from __future__ import annotations

import gzip
import http.client
import subprocess
import sys
from dataclasses import replace

import pytest
from conftest import NODES
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.utils import floatToGoString

from hetpatrol.config import load_config
from hetpatrol.exporters.http_server import MetricsServer, accepts_gzip
from hetpatrol.exporters.prometheus import (
    ExporterStats,
    Exposition,
    report_metrics,
)
from hetpatrol.exporters.text_format import (
    CounterFamily,
    GaugeFamily,
    InfoFamily,
    StateSetFamily,
    TextRenderer,
    format_value,
)
from hetpatrol.patrol import Patroller
from hetpatrol.replay import (
    load_scenario,
    scenario_boots,  # noqa: E402
)

# every scenario, a multi-boot one by each of its boots (its own directory reads no card)
SCENARIOS = [
    b.relative_to(NODES).as_posix() if boots else p.name
    for p in sorted(x for x in NODES.iterdir() if x.is_dir())
    for boots in [scenario_boots(p)]
    for b in (boots or [p])
]


def _report(name: str):
    config = replace(load_config(), node=load_scenario(NODES / name).get("node") or "n1")
    patroller = Patroller(config, replay_dir=NODES / name)
    try:
        return [patroller.run(), patroller.run()]
    finally:
        patroller.close()


class _Families:
    def __init__(self, families):
        self.families = families

    def collect(self):
        return iter(self.families)


def _reference(families) -> bytes:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_Families(families))  # type: ignore[arg-type]
    return generate_latest(registry)


@pytest.mark.parametrize("scenario", SCENARIOS)
def test_the_same_bytes_as_prometheus_client_on_every_scenario(scenario):
    renderer = TextRenderer()
    stats = ExporterStats(jsonl_lines_written=7, interval_seconds=10.0)
    for patrols, report in enumerate(_report(scenario), start=1):
        families = list(report_metrics(report, stats, ("nvidia", "ascend"), patrols))
        # twice with one renderer: the second render comes from the cached label strings
        assert renderer.render(families) == _reference(families)


def test_escapes_help_and_label_values_and_leaves_empty_labels_out():
    g = GaugeFamily("hp_x", 'help with \\ and\nnewline "q"', labels=["b", "a"])
    g.add_metric(['back\\slash "quote"\nnew line', "é中"], 1.5)
    g.add_metric(["", "z"], float("nan"))
    g.add_metric(["", ""], float("inf"))
    c = CounterFamily("hp_c_total", "a counter", labels=["k"])
    c.add_metric(["v"], 3)
    i = InfoFamily("hp_i", "info", labels=["k"])
    i.add_metric(["v"], {"version": "1.2", "empty": ""})
    st = StateSetFamily("hp_s", "states", labels=["k"])
    st.add_metric(["v"], {"warning": False, "ok": True})
    big = GaugeFamily("hp_big", "big", value=85899345920)
    renderer = TextRenderer()
    for _ in range(2):
        assert renderer.render([g, c, i, st, big]) == _reference([g, c, i, st, big])
    text = renderer.render([g, c, i, st, big]).decode()
    assert 'hp_x{a="é中",b="back\\\\slash \\"quote\\"\\nnew line"} 1.5\n' in text
    assert 'hp_x{a="z"} NaN\nhp_x +Inf\n' in text
    assert '# HELP hp_x help with \\\\ and\\nnewline "q"\n# TYPE hp_x gauge\n' in text
    assert '# TYPE hp_c_total counter\nhp_c_total{k="v"} 3.0\n' in text
    assert '# TYPE hp_i_info gauge\nhp_i_info{k="v",version="1.2"} 1.0\n' in text
    assert 'hp_s{hp_s="ok",k="v"} 1.0\nhp_s{hp_s="warning",k="v"} 0.0\n' in text
    assert "hp_big 8.589934592e+10\n" in text


@pytest.mark.parametrize(
    "value",
    [0, 1, -1, 0.5, 1e-9, 999999.0, 1000000.0, 4294967296, 85899345920, 1e16, 1.5e300,
     -1e12, 123456789.125, float("inf"), float("-inf"), float("nan"), True, 2**53 + 1],
)  # fmt: skip
def test_values_are_written_as_prometheus_client_writes_them(value):
    assert format_value(value) == floatToGoString(value)


def test_a_series_with_the_wrong_label_count_is_refused():
    g = GaugeFamily("hp_g", "g", labels=["a", "b"])
    with pytest.raises(ValueError, match="hp_g"):
        g.add_metric(["only-one"], 1)


def test_the_label_cache_holds_only_the_last_renders_label_sets():
    renderer = TextRenderer()
    g = GaugeFamily("hp_g", "g", labels=["card"])
    for i in range(100):
        g.add_metric([str(i)], i)
    renderer.render([g])
    h = GaugeFamily("hp_g", "g", labels=["card"])
    h.add_metric(["0"], 0)
    renderer.render([h])
    assert list(renderer._labels) == [(("card",), ("0",))]


def test_the_daemon_renders_without_prometheus_client():
    """The exporter modules the daemon imports do not import prometheus-client (its
    package is ~10 MB of resident memory); the tests use it as the reference only."""
    code = (
        "import sys, hetpatrol.exporters.prometheus, hetpatrol.daemon\n"
        "print(sorted(m for m in sys.modules if m.startswith('prometheus_client')))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(
    ("header", "gzip_ok"),
    [
        ("gzip", True),
        ("gzip, deflate", True),
        ("deflate, GZIP;q=0.5", True),
        ("*", True),
        ("gzip;q=0", False),
        ("gzip;q=0.0, identity", False),
        ("identity", False),
        ("", False),
        (None, False),
        ("x-gzip-not", False),
        ("gzip;q=0, *", False),  # gzip refused by name: * does not bring it back
        ("*;q=0", False),
        ("gzip;level=1;q=0", False),
        ("gzip;q=nan", False),
        ("gzip;q=1e999", False),
        ("gzip;q=abc", False),
        ("identity, " * 100 + "gzip", False),  # past the 64 codings looked at
        ("x-gzip", True),
    ],
)
def test_accept_encoding(header, gzip_ok):
    assert accepts_gzip(header) is gzip_ok


def test_metrics_served_gzip_to_who_asks_and_plain_to_others():
    exposition = Exposition(("nvidia", "ascend"))
    body = exposition.update(_report("healthy-mixed")[0], patrols_total=1)
    server = MetricsServer("127.0.0.1", 0, exposition)
    server.start()
    try:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        resp = conn.getresponse()
        zipped = resp.read()
        assert resp.getheader("Content-Encoding") == "gzip"
        assert resp.getheader("Vary") == "Accept-Encoding"
        assert gzip.decompress(zipped) == body
        assert len(zipped) * 5 < len(body)  # 16 cards: ~47 KB of text, a few KB gzipped
        conn.request("GET", "/metrics")  # the same keep-alive connection, no gzip asked
        resp = conn.getresponse()
        assert resp.read() == body and resp.getheader("Content-Encoding") is None
        conn.close()
    finally:
        server.stop()


def test_connections_past_the_cap_evict_the_oldest_unanswered_and_scrapes_go_on():
    import socket
    import time

    exposition = Exposition(("nvidia",))
    server = MetricsServer("127.0.0.1", 0, exposition)
    server.max_connections = 4
    server.start()
    drips = []
    try:
        for _ in range(4):  # four slow peers that never finish their request
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            drips.append(s)
            time.sleep(0.02)  # accepted in this order
        time.sleep(0.3)
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        extra.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert extra.recv(100).startswith(b"HTTP/1.1 200 OK")  # served: the oldest drip made room
        extra.close()
        assert drips[0].recv(10) == b""  # closed by the server
        assert server.connections <= 4
        for s in drips:
            s.close()
        time.sleep(0.3)
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=10)
        conn.request("GET", "/metrics")
        assert conn.getresponse().status == 200  # the slots came back
        conn.close()
    finally:
        for s in drips:
            s.close()
        server.stop()


def test_cached_values_keep_the_sign_of_zero_and_hold_only_the_last_render():
    """Values are formatted once per render and kept for the next (0 and -0.0 are equal
    as keys: each zero is written by its sign, never looked up)."""
    g = GaugeFamily("hp_z", "zeros", labels=["k"])
    for i, v in enumerate((0.0, -0.0, 0, False, True, 1, 2.5, float("nan"), -0.0, 0.0)):
        g.add_metric([str(i)], v)
    renderer = TextRenderer()
    for _ in range(3):
        assert renderer.render([g]) == _reference([g])
    h = GaugeFamily("hp_z", "zeros", labels=["k"])
    h.add_metric(["0"], 7.5)
    renderer.render([h])
    assert renderer._values == {7.5: "7.5"}


def test_a_full_server_of_clients_trickling_their_headers_still_serves_a_scrape():
    """Slow-loris: clients sending their request a byte at a time never finish it; when
    the server is full, one of them (quiet since its accept, nothing unread) gives way."""
    import socket
    import threading
    import time

    exposition = Exposition(("nvidia",))
    server = MetricsServer("127.0.0.1", 0, exposition)
    server.max_connections = 4
    server.start()
    stop = threading.Event()
    drips = [socket.create_connection(("127.0.0.1", server.port), timeout=5) for _ in range(4)]

    def trickle():
        for i in range(200):  # bounded: 20 s at most
            if stop.is_set():
                return
            for s in drips:
                try:
                    s.send(b"X-Header-%d: y\r\n" % i)
                except OSError:
                    pass
            time.sleep(0.1)

    t = threading.Thread(target=trickle, daemon=True)
    t.start()
    try:
        time.sleep(0.5)
        started = time.monotonic()
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=20)
        extra.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert extra.recv(100).startswith(b"HTTP/1.1 200 OK")
        # a dripper gave way at once: not served only once one hit the 10 s idle timeout
        assert time.monotonic() - started < server.idle_timeout_seconds / 2
        extra.close()
    finally:
        stop.set()
        t.join(5)
        for s in drips:
            s.close()
        server.stop()
