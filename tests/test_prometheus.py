"""Prometheus exposition: names, labels and values, rendered once per patrol."""

from __future__ import annotations

import urllib.request

from fakes import Scripted, make_patroller
from prometheus_client.parser import text_string_to_metric_families

from hetpatrol.exporters.http_server import MetricsServer
from hetpatrol.exporters.prometheus import Exposition


def samples(body: bytes) -> dict[str, list]:
    out: dict[str, list] = {}
    for fam in text_string_to_metric_families(body.decode()):
        for s in fam.samples:
            out.setdefault(s.name, []).append(s)
    return out


def one(found, name, **labels):
    hits = [s for s in found[name] if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(hits) == 1, (name, labels, found.get(name))
    return hits[0].value


def test_before_first_patrol_says_no_data_yet():
    exp = Exposition(["nvidia", "ascend"])
    found = samples(exp.body)
    assert one(found, "hetpatrol_up") == 1
    assert one(found, "hetpatrol_patrol_ready") == 0
    assert one(found, "hetpatrol_collector_up", collector="nvidia") == 0
    assert (
        one(
            found,
            "hetpatrol_collector_state",
            collector="ascend",
            hetpatrol_collector_state="pending",
        )
        == 1
    )
    assert "hetpatrol_card_info" not in found


def test_card_series(base_config):
    c = Scripted()
    c.temps = [40.0, 91.0]
    report = make_patroller(base_config, {"ascend": c}).run()
    exp = Exposition(["ascend"])
    found = samples(exp.update(report, patrols_total=1))
    labels0 = {"vendor": "ascend", "card_type": "910b", "index": "0", "chip": "0"}
    assert one(found, "hetpatrol_card_temperature_celsius", **labels0) == 40.0
    assert one(found, "hetpatrol_card_temperature_celsius", index="1") == 91.0
    assert one(found, "hetpatrol_card_info", index="0", model="910B3", gres="ascend") == 1
    assert one(found, "hetpatrol_card_health", index="1", hetpatrol_card_health="critical") == 1
    assert one(found, "hetpatrol_card_health", index="1", hetpatrol_card_health="ok") == 0
    assert one(found, "hetpatrol_card_health_code", index="1") == 2
    assert (
        one(found, "hetpatrol_card_finding", index="1", check="temperature", severity="critical")
        == 1
    )
    assert one(found, "hetpatrol_cards", vendor="ascend", card_type="910b", health="ok") == 1
    assert one(found, "hetpatrol_node_health_code") == 2
    assert one(found, "hetpatrol_collector_up", collector="ascend") == 1
    assert one(found, "hetpatrol_patrols_total") == 1
    assert one(found, "hetpatrol_patrol_ready") == 1
    assert one(found, "hetpatrol_last_patrol_timestamp_seconds") == report.finished
    # values that are not available produce no series, never a fake 0
    assert "hetpatrol_card_power_watts" not in found
    # per-card series carry only the small stable label set; an absent value (these
    # NPUs have no UUID) leaves its label out, never uuid=""
    for s in found["hetpatrol_card_temperature_celsius"]:
        assert set(s.labels) == {"vendor", "card_type", "index", "chip"}


def test_server_serves_the_rendered_bytes(base_config):
    report = make_patroller(base_config, {"ascend": Scripted()}).run()
    exp = Exposition(["ascend"])
    body = exp.update(report, 1)
    server = MetricsServer("127.0.0.1", 0, exp)
    server.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics") as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("text/plain")
            assert resp.read() == body
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{server.port}/nope")
        except urllib.error.HTTPError as exc:
            assert exc.code == 404
        else:
            raise AssertionError("expected 404")
    finally:
        server.stop()
