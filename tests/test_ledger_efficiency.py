"""Per-job efficiency read back from a real Prometheus (``hetpatrol ledger efficiency``).

A real Prometheus (Debian ``prometheus``) scrapes, every second, an endpoint that serves
what a hetpatrol daemon exports for three cards, rendered by hetpatrol's own exporter
code (hetpatrol/exporters/prometheus.py): A100 ``GPU-...01`` 80 % busy with a process of
job 101 holding 10 GiB, A100 ``GPU-...02`` idle with no process, 910B4 ``NPU-...03`` 50 %
busy with a process of job 102 holding 4 GiB. The jobs come from a saved sacct file:
101 (2 x A100), 102 (1 x 910B), 103 (1 x A100, no process anywhere), 104 (an hour
before Prometheus had any data).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from datetime import datetime

import pytest
import yaml
from conftest import require_program
from prometheus_client import CollectorRegistry, start_http_server
from test_end_to_end import free_port
from test_prometheus_real import http_json, stop, wait

from hetpatrol.exporters.prometheus import _card_metrics, process_memory_metric
from hetpatrol.schema import CardRecord, ProcessInfo

pytestmark = pytest.mark.slow
GIB = 1024**3


def cards() -> list[CardRecord]:
    a = CardRecord(vendor="nvidia", index=0, card_type="A100-SXM4-80GB",
                   uuid="GPU-00000000-0000-4000-8000-000000000001", utilization_ratio=0.8,
                   processes=[ProcessInfo(pid=4242, memory_bytes=10 * GIB, user="hpalice",
                                          job_id="101")])  # fmt: skip
    b = CardRecord(vendor="nvidia", index=1, card_type="A100-SXM4-80GB",
                   uuid="GPU-00000000-0000-4000-8000-000000000002",
                   utilization_ratio=0.0)  # fmt: skip
    c = CardRecord(vendor="ascend", index=0, chip=0, card_type="910B4",
                   uuid="NPU-00000000-0000-4000-8000-000000000003", utilization_ratio=0.5,
                   processes=[ProcessInfo(pid=4343, memory_bytes=4 * GIB, user="hpbob",
                                          job_id="102")])  # fmt: skip
    return [a, b, c]


class _Cards:
    def collect(self):
        recs = cards()
        yield from _card_metrics(recs)
        yield process_memory_metric(recs)


@pytest.fixture(scope="module")
def prom(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("prom")
    prometheus = require_program("prometheus", package="prometheus")
    registry = CollectorRegistry()
    registry.register(_Cards())
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    prom_port = free_port()
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "scrape_configs": [
            {
                "job_name": "hetpatrol",
                "scrape_timeout": "1s",
                "static_configs": [{"targets": [f"127.0.0.1:{port}"]}],
            }  # fmt: skip
        ],
    }
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(config))
    log = open(tmp / "prometheus.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [prometheus, f"--config.file={tmp / 'prometheus.yml'}",
         f"--storage.tsdb.path={tmp / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}",
         "--log.level=warn"],
        stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip
    log.close()
    url = f"http://127.0.0.1:{prom_port}"
    try:

        def first_sample():
            q = "min(timestamp(hetpatrol_card_utilization_ratio))"
            res = http_json(f"{url}/api/v1/query?query={q}")["data"]["result"]
            return float(res[0]["value"][1]) if res else None

        t0 = wait(first_sample, what="Prometheus has scraped the cards")
        time.sleep(max(0.0, t0 + 8 - time.time()))  # 8 s of 1 s scrapes
        yield url, t0
    finally:
        stop(proc)
        server.shutdown()
        thread.join(5)


def local(ts: float) -> str:
    return datetime.fromtimestamp(ts).strftime("%Y-%m-%dT%H:%M:%S")


def sacct_line(job, user, start, end, tres) -> str:
    return "|".join([job, job, user, "physics", "debug", "normal", "hp-gpu01",
                     local(start), local(start), local(end), str(int(end - start)),
                     "COMPLETED", tres])  # fmt: skip


def test_efficiency_per_job_and_card_type(prom, tmp_path):
    url, t0 = prom
    s = math.ceil(t0) + 1
    e = s + 5
    saved = tmp_path / "sacct.txt"
    saved.write_text("\n".join([
        sacct_line("101", "hpalice", s, e, "cpu=1,gres/gpu:a100=2,gres/gpu=2"),
        sacct_line("102", "hpbob", s, e, "cpu=1,gres/ascend:910b=1,gres/ascend=1"),
        sacct_line("103", "hpalice", s, e, "cpu=1,gres/gpu:a100=1,gres/gpu=1"),
        sacct_line("104", "hpalice", s - 3600, s - 3000, "cpu=1,gres/gpu:a100=1,gres/gpu=1"),
        sacct_line("105", "hpbob", s, e, "cpu=4,mem=100M"),  # no cards: not listed
    ]) + "\n")  # fmt: skip
    res = subprocess.run(
        [sys.executable, "-m", "hetpatrol.cli", "ledger", "efficiency", "--prometheus", url,
         "--sacct-file", str(saved), "--start", local(s - 7200), "--end", local(e + 60),
         "--format", "json"],
        capture_output=True, text=True, timeout=60, env=dict(os.environ),
    )  # fmt: skip
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    jobs = {j["job_id"]: j for j in doc["jobs"]}
    assert list(jobs) == ["101", "102", "103", "104"]
    j = jobs["101"]
    # 2 A100 for 5 s allocated; one seen, 80 % busy: 0.8 x 5 of 10 card-seconds
    assert j["allocated"] == {"gpu:a100": 2}
    assert j["allocated_card_hours"] == pytest.approx(10 / 3600, abs=1e-6)
    assert j["busy_card_hours"] == pytest.approx(4 / 3600, abs=1e-6)
    assert (j["efficiency"], j["idle_cards"], j["status"]) == (0.4, 1, "ok")
    assert j["by_type"] == [{"vendor": "nvidia", "card_type": "A100-SXM4-80GB",
                             "cards_seen": 1, "mean_utilization": 0.8,
                             "mean_memory_bytes": 10 * GIB}]  # fmt: skip
    j = jobs["102"]
    assert (j["efficiency"], j["idle_cards"], j["status"]) == (0.5, 0, "ok")
    assert j["by_type"][0]["vendor"] == "ascend" and j["by_type"][0]["card_type"] == "910B4"
    assert j["by_type"][0]["mean_memory_bytes"] == 4 * GIB
    # cards held, hetpatrol reporting, no process of the job on any card
    assert (jobs["103"]["efficiency"], jobs["103"]["idle_cards"]) == (0.0, 1)
    assert jobs["103"]["status"] == "no_process"
    # Prometheus has nothing for that span: unknown, not zero
    assert (jobs["104"]["efficiency"], jobs["104"]["idle_cards"]) == (None, None)
    assert jobs["104"]["status"] == "no_data"
    assert doc["idle"] == ["103"]


def test_unreachable_prometheus_exits_69(tmp_path):
    saved = tmp_path / "sacct.txt"
    now = time.time()
    saved.write_text(sacct_line("1", "u", now - 60, now - 30, "gres/gpu:a100=1") + "\n")
    res = subprocess.run(
        [sys.executable, "-m", "hetpatrol.cli", "ledger", "efficiency", "--prometheus",
         f"http://127.0.0.1:{free_port()}", "--sacct-file", str(saved), "--start", "now-1hours"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert res.returncode == 69
    assert "Connection refused" in res.stderr
