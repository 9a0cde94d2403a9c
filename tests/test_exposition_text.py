"""The exposition the daemon serves: the same bytes prometheus-client would write, from
label strings cached across patrols; gzip for the scrapers that ask (Prometheus does)."""

from __future__ import annotations

import gzip
import http.client
from dataclasses import replace

import pytest
from conftest import NODES
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from hetpatrol.config import load_config
from hetpatrol.exporters.prometheus import (
    ExporterStats,
    Exposition,
    MetricsServer,
    accepts_gzip,
    report_metrics,
)
from hetpatrol.exporters.text_format import TextRenderer
from hetpatrol.patrol import Patroller
from hetpatrol.replay import load_scenario

SCENARIOS = sorted(p.name for p in NODES.iterdir() if p.is_dir())


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


def test_escapes_help_and_label_values_and_keeps_created_samples():
    g = GaugeMetricFamily("hp_x", 'help with \\ and\nnewline "q"', labels=["b", "a"])
    g.add_metric(['back\\slash "quote"\nnew line', "é中"], 1.5)
    g.add_metric(["", "z"], float("nan"))
    c = CounterMetricFamily("hp_c", "a counter", labels=["k"], created=1700000000.5)
    c.add_metric(["v"], 3, created=1700000000.5)
    renderer = TextRenderer()
    for _ in range(2):
        assert renderer.render([g, c]) == _reference([g, c])
    text = renderer.render([g, c]).decode()
    assert 'hp_x{a="é中",b="back\\\\slash \\"quote\\"\\nnew line"} 1.5\n' in text
    assert '# TYPE hp_c_created gauge\nhp_c_created{k="v"} 1.7000000005e+09\n' in text


def test_the_label_cache_holds_only_the_last_renders_label_sets():
    renderer = TextRenderer()
    g = GaugeMetricFamily("hp_g", "g", labels=["card"])
    for i in range(100):
        g.add_metric([str(i)], i)
    renderer.render([g])
    h = GaugeMetricFamily("hp_g", "g", labels=["card"])
    h.add_metric(["0"], 0)
    renderer.render([h])
    assert list(renderer._labels) == [(("card", "0"),)]


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


def test_connections_past_the_cap_are_closed_and_scrapes_go_on():
    import socket
    import time

    exposition = Exposition(("nvidia",))
    server = MetricsServer("127.0.0.1", 0, exposition)
    server._httpd.max_connections = 4
    server._httpd._slots = __import__("threading").BoundedSemaphore(4)
    server.start()
    drips = []
    try:
        for _ in range(4):  # four slow peers that never finish their request
            s = socket.create_connection(("127.0.0.1", server.port), timeout=5)
            s.sendall(b"GET /metrics HTTP/1.1\r\n")
            drips.append(s)
        time.sleep(0.3)
        extra = socket.create_connection(("127.0.0.1", server.port), timeout=5)
        extra.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        assert extra.recv(100) == b""  # closed: no slot
        extra.close()
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
