#!/usr/bin/env python3
"""``hetpatrol fleet`` and ``hetpatrol audit-slurm`` on a synthetic 10,000-node mixed
cluster (wall time and peak RSS of the real command, goal: under 3 s and 200 MB).

Run from the repository root (``tests/bench/run.py`` runs it too)::

    python tests/bench/fleet.py [--nodes 10000] [--repeats 3] [--json]

The cluster: A100 nodes (8 GPUs), H100 nodes (8 GPUs), 910B nodes (8 NPUs) and mixed
nodes (4 A100 + 4 910B), each kind in its own partition, plus an ``all`` partition over
the GPU and NPU nodes; 1 % drained (half by hetpatrol), 0.5 % with a silent daemon, 0.2 %
without metrics, 3 lost GPUs per thousand, two driver versions on the A100s. Slurm's side
is generated as ``scontrol --json show node`` (Slurm >= 23.02) and as ``scontrol -d -o
show node`` text (22.05), answered by a stand-in ``scontrol`` script that prints the file;
Prometheus's side by a small HTTP server in this process (loopback) that answers the four
instant queries of :func:`hetpatrol.cluster.fleet.queries` with generated vectors, as
Prometheus would. The commands run as child processes (``python -m hetpatrol.cli``):
wall time from spawn to exit, peak RSS from ``wait4``'s ``ru_maxrss``. The audit reads a
generated slurm.conf (one ``NodeName`` line per kind and 1,000 nodes), gres.conf and
cgroup.conf, and the same Prometheus.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from hetpatrol.cluster.fleet import queries, runtime_query  # noqa: E402
from hetpatrol.cluster.hostlist import compress_hostlist  # noqa: E402

HETPATROL = [sys.executable, "-m", "hetpatrol.cli"]
GOAL_WALL_S = 3.0
GOAL_RSS_MB = 200.0

# kind -> (name prefix, share, partition, [(vendor, card_type, gres, cards)])
KINDS = {
    "a100": ("gpa", 0.4, "gpu-a100", [("nvidia", "a100", "gpu", 8)]),
    "h100": ("gph", 0.2, "gpu-h100", [("nvidia", "h100", "gpu", 8)]),
    "910b": ("npa", 0.3, "npu", [("ascend", "910b", "ascend", 8)]),
    "mixed": ("mx", 0.1, "mixed", [("nvidia", "a100", "gpu", 4), ("ascend", "910b", "ascend", 4)]),
}


def cluster(n: int) -> list[dict[str, Any]]:
    """The nodes: name, kind, partitions, classes, drained, silent, absent, lost, alloc."""
    nodes = []
    for kind, (prefix, share, part, classes) in KINDS.items():
        for i in range(1, int(n * share) + 1):
            k = len(nodes)
            parts = [part] + (["all"] if kind != "mixed" else [])
            nodes.append(
                {
                    "name": f"{prefix}{i:05d}",
                    "kind": kind,
                    "partitions": parts,
                    "classes": classes,
                    "drain": "hetpatrol" if k % 200 == 7 else "admin" if k % 200 == 9 else None,
                    "silent": k % 200 == 11,
                    "absent": k % 500 == 13,
                    "lost": k % 1000 == 17,
                    "alloc": (k * 7) % 9,
                    "driver": "550.54.15" if k % 10 else "535.104.05",
                }
            )
    return nodes


def _gres(classes, used: int | None = None) -> str:
    out = []
    for _vendor, ctype, gres, count in classes:
        if used is None:
            out.append(f"{gres}:{ctype}:{count}(S:0-1)")
        else:
            u = min(used, count)
            idx = f"IDX:0-{u - 1}" if u else "IDX:N/A"
            out.append(f"{gres}:{ctype}:{u}({idx})")
    return ",".join(out)


def slurm_json(nodes: list[dict[str, Any]]) -> str:
    """``scontrol --json show node`` of Slurm 24.11 (slurmrestd v0.0.42 node objects)."""
    out = []
    for nd in nodes:
        state = ["MIXED"] if nd["alloc"] else ["IDLE"]
        reason = ""
        if nd["drain"]:
            state.append("DRAIN")
            reason = "hetpatrol: xid_79 nvidia/3" if nd["drain"] == "hetpatrol" else "bad dimm"
        out.append(
            {
                "name": nd["name"],
                "hostname": nd["name"],
                "address": nd["name"],
                "state": state,
                "partitions": nd["partitions"],
                "features": [c[1] for c in nd["classes"]],
                "active_features": [c[1] for c in nd["classes"]],
                "gres": _gres(nd["classes"]),
                "gres_used": _gres(nd["classes"], nd["alloc"]),
                "gres_drained": "N/A",
                "reason": reason,
                "reason_set_by_user": "root" if reason else "",
                "cpus": 128,
                "real_memory": 1031000,
                "tres": "cpu=128,mem=1031000M,billing=128",
                "version": "24.11.0",
                "operating_system": "Linux 5.15.0-105-generic #115-Ubuntu SMP",
                "boot_time": {"set": True, "infinite": False, "number": 1722009794},
            }
        )
    return json.dumps({"nodes": out, "last_update": {"number": 0}, "errors": [], "warnings": []})


def slurm_text(nodes: list[dict[str, Any]]) -> str:
    """``scontrol -d -o show node`` of Slurm 22.05: one line per node."""
    lines = []
    for nd in nodes:
        state = "MIXED" if nd["alloc"] else "IDLE"
        reason = ""
        if nd["drain"]:
            state += "+DRAIN"
            text = "hetpatrol: xid_79 nvidia/3" if nd["drain"] == "hetpatrol" else "bad dimm"
            reason = f" Reason={text} [root@2026-12-01T07:00:00]"
        feats = ",".join(c[1] for c in nd["classes"])
        lines.append(
            f"NodeName={nd['name']} Arch=x86_64 CoresPerSocket=32 CPUAlloc=0 CPUEfctv=128 "
            f"CPUTot=128 CPULoad=1.00 AvailableFeatures={feats} ActiveFeatures={feats} "
            f"Gres={_gres(nd['classes'])} GresDrain=N/A "
            f"GresUsed={_gres(nd['classes'], nd['alloc'])} NodeAddr={nd['name']} "
            f"NodeHostName={nd['name']} Version=22.05.8 OS=Linux 5.15.0 #1 SMP "
            f"RealMemory=1031000 AllocMem=0 FreeMem=1000000 Sockets=2 Boards=1 State={state} "
            f"ThreadsPerCore=2 TmpDisk=0 Weight=1 Owner=N/A MCS_label=N/A "
            f"Partitions={','.join(nd['partitions'])} BootTime=2026-11-01T00:00:00 "
            f"SlurmdStartTime=2026-11-01T00:01:00 CfgTRES=cpu=128,mem=1031000M,billing=128 "
            f"AllocTRES= CapWatts=n/a CurrentWatts=0 AveWatts=0{reason}"
        )
    return "\n".join(lines) + "\n"


def prometheus_answers(nodes: list[dict[str, Any]]) -> dict[str, bytes]:
    """Query -> the JSON Prometheus would answer (instant vectors, aggregated by node)."""
    q = queries()
    now = time.time()
    cards, health, up, silent, runtime = [], [], [], [], []

    def vec(labels: dict[str, str], value: float) -> dict[str, Any]:
        return {"metric": labels, "value": [now, repr(value) if value % 1 else str(int(value))]}

    for nd in nodes:
        if nd["absent"]:
            continue
        base = {"node": nd["name"], "instance": f"{nd['name']}:9477"}
        up.append(vec({**base, "job": "hetpatrol", "__name__": "up"}, 1))
        if nd["silent"]:
            silent.append(vec({**base, "job": "hetpatrol"}, 9999))
        if nd["kind"] == "mixed" and nd["alloc"] == 3:  # CUDA and CANN in ld.so.conf
            runtime.append(vec({**base, "check": "library_path_mix"}, 1))
        for vendor, ctype, gres, count in nd["classes"]:
            fw = "92.00.9E.00.02" if vendor == "nvidia" else ""
            drv = nd["driver"] if vendor == "nvidia" else "25.2.0"
            lost = 1 if nd["lost"] and vendor == "nvidia" else 0
            labels = {**base, "vendor": vendor, "card_type": ctype, "gres": gres}
            cards.append(
                vec({**labels, "driver_version": drv, "firmware_version": fw}, count - lost)
            )
            hl = {**base, "vendor": vendor, "card_type": ctype}
            health.append(vec({**hl, "hetpatrol_card_health": "ok"}, count - lost))
            if lost:
                cards.append(
                    vec(
                        {
                            **base,
                            "vendor": vendor,
                            "card_type": "",
                            "gres": gres,
                            "driver_version": drv,
                            "firmware_version": "",
                        },
                        1,
                    )
                )
                health.append(
                    vec(
                        {
                            **base,
                            "vendor": vendor,
                            "card_type": "",
                            "hetpatrol_card_health": "critical",
                        },
                        1,
                    )
                )

    def doc(result: list) -> bytes:
        return json.dumps(
            {"status": "success", "data": {"resultType": "vector", "result": result}}
        ).encode()

    return {
        q["cards"]: doc(cards),
        q["health"]: doc(health),
        q["up"]: doc(up),
        q["silent"]: doc(silent),
        runtime_query(): doc(runtime),
    }


class StandInPrometheus:
    """``POST/GET /api/v1/query`` on loopback, answered from :func:`prometheus_answers`."""

    def __init__(self, answers: dict[str, bytes]):
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self, query: str) -> None:
                body = outer.answers.get(query)
                if body is None:
                    self.send_response(400)
                    body = json.dumps(
                        {"status": "error", "errorType": "bad_data", "error": "unknown query"}
                    ).encode()
                else:
                    self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", "0"))
                form = urllib.parse.parse_qs(self.rfile.read(length).decode())
                self._answer(form.get("query", [""])[0])

            def do_GET(self) -> None:  # noqa: N802
                form = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
                self._answer(form.get("query", [""])[0])

            def log_message(self, *args: Any) -> None:
                pass

        self.answers = answers
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def write_confs(tmp: Path, nodes: list[dict[str, Any]]) -> Path:
    """slurm.conf (one NodeName line per kind and 1,000 nodes), gres.conf, cgroup.conf."""
    lines = [
        "ClusterName=bench",
        "GresTypes=gpu,ascend",
        "TaskPlugin=task/cgroup,task/affinity",
        "AccountingStorageTRES=gres/gpu,gres/gpu:a100,gres/gpu:h100,gres/ascend,gres/ascend:910b",
        "HealthCheckProgram=/usr/local/sbin/hetpatrol-healthcheck",
        "HealthCheckInterval=60",
        "Prolog=/etc/slurm/prolog.d/hetpatrol-check.sh",
    ]
    gres = []
    by_part: dict[str, list[str]] = {}
    for kind in KINDS:
        members = [nd for nd in nodes if nd["kind"] == kind]
        for start in range(0, len(members), 1000):
            chunk = members[start : start + 1000]
            hl = compress_hostlist(nd["name"] for nd in chunk)
            classes = chunk[0]["classes"]
            feats = ",".join(c[1] for c in classes)
            lines.append(
                f"NodeName={hl} CPUs=128 Gres={_gres(classes).replace('(S:0-1)', '')} "
                f"Features={feats}"
            )
            for _v, ctype, name, count in classes:
                dev = "nvidia" if name == "gpu" else "davinci"
                gres.append(
                    f"NodeName={hl} Name={name} Type={ctype} File=/dev/{dev}[0-{count - 1}]"
                )
        for nd in members:
            for p in nd["partitions"]:
                by_part.setdefault(p, []).append(nd["name"])
    for part, names in by_part.items():
        weights = ""
        if part == "all":
            weights = (
                ' TRESBillingWeights="CPU=1.0,GRES/gpu:a100=8.0,GRES/gpu:h100=16.0,'
                'GRES/ascend:910b=6.0"'
            )
        lines.append(f"PartitionName={part} Nodes={compress_hostlist(names)}{weights}")
    (tmp / "slurm.conf").write_text("\n".join(lines) + "\n")
    (tmp / "gres.conf").write_text("\n".join(gres) + "\n")
    (tmp / "cgroup.conf").write_text("ConstrainCores=yes\nConstrainDevices=yes\n")
    return tmp / "slurm.conf"


def run_child(argv: list[str]) -> tuple[float, float, int, bytes]:
    """(wall s, peak RSS MB, exit code, stdout) of one run of ``argv``."""
    with tempfile.TemporaryFile() as out:
        start = time.perf_counter()
        pid = os.posix_spawn(
            argv[0],
            argv,
            {**os.environ, "NO_COLOR": "1"},
            file_actions=[(os.POSIX_SPAWN_DUP2, out.fileno(), 1)],
        )
        _pid, status, usage = os.wait4(pid, 0)
        wall = time.perf_counter() - start
        out.seek(0)
        return wall, usage.ru_maxrss / 1024, os.waitstatus_to_exitcode(status), out.read()


def bench(n: int, repeats: int) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="hetpatrol-bench-fleet-"))
    nodes = cluster(n)
    (tmp / "nodes.json").write_text(slurm_json(nodes))
    (tmp / "nodes.txt").write_text(slurm_text(nodes))
    for name, data in (("scontrol-json", "nodes.json"), ("scontrol-text", "nodes.txt")):
        script = tmp / name
        # --json answers only in the JSON stand-in, as scontrol 22.05 refuses the option
        json_branch = f"exec cat {tmp / data}" if data == "nodes.json" else "exit 1"
        script.write_text(
            f'#!/bin/sh\nif [ "$1" = "--json" ]; then {json_branch}; fi\nexec cat {tmp / data}\n'
        )
        script.chmod(0o755)
    conf = write_confs(tmp, nodes)
    prom = StandInPrometheus(prometheus_answers(nodes))
    results: dict[str, Any] = {
        "nodes": len(nodes),
        "cards": sum(c[3] for nd in nodes for c in nd["classes"]),
    }
    try:
        runs = {
            "fleet_json": [
                *HETPATROL,
                "fleet",
                "--prometheus",
                prom.url,
                "--scontrol",
                str(tmp / "scontrol-json"),
                "--json",
            ],
            "fleet_text": [
                *HETPATROL,
                "fleet",
                "--prometheus",
                prom.url,
                "--scontrol",
                str(tmp / "scontrol-text"),
            ],
            "audit": [
                *HETPATROL,
                "audit-slurm",
                "--slurm-conf",
                str(conf),
                "--prometheus",
                prom.url,
                "--json",
            ],
        }
        for key, argv in runs.items():
            walls, rss = [], []
            for _ in range(repeats):
                wall, peak, code, stdout = run_child(argv)
                if code not in (0, 1, 2):
                    raise RuntimeError(f"{key}: exit {code}: {stdout[-500:]!r}")
                walls.append(wall)
                rss.append(peak)
            results[key] = {
                "wall_s": statistics.median(walls),
                "wall_spread_s": [min(walls), statistics.median(walls), max(walls)],
                "peak_rss_mb": max(rss),
                "exit": code,
            }
            if key == "fleet_json":
                doc = json.loads(stdout)
                results["fleet_classes"] = [
                    f"{c['vendor']} {c['card_type'] or '?'}: {c['nodes']} nodes, "
                    f"{c['cards_slurm']}/{c['cards_seen']} cards"
                    for c in doc["classes"]
                ]
            if key == "audit":
                doc = json.loads(stdout)
                results["audit_findings"] = len(doc["findings"])
        results["slurm_json_mb"] = (tmp / "nodes.json").stat().st_size / 2**20
        results["prometheus_answer_mb"] = sum(len(b) for b in prom.answers.values()) / 2**20
    finally:
        prom.close()
        for p in tmp.iterdir():
            p.unlink()
        tmp.rmdir()
    return results


def print_table(r: dict[str, Any]) -> None:
    print(
        f"fleet / audit-slurm on {r['nodes']:,} nodes, {r['cards']:,} cards "
        f"(Slurm JSON {r['slurm_json_mb']:.1f} MB, Prometheus answers "
        f"{r['prometheus_answer_mb']:.1f} MB)"
    )
    print(f"{'command':34} {'wall s':>8} {'goal':>6} {'peak RSS MB':>12} {'goal':>6}")
    for key, label in (
        ("fleet_json", "fleet (scontrol --json)"),
        ("fleet_text", "fleet (scontrol -d -o, 22.05)"),
        ("audit", "audit-slurm (+ Prometheus)"),
    ):
        x = r[key]
        ok_w = "met" if x["wall_s"] < GOAL_WALL_S else "MISSED"
        ok_r = "met" if x["peak_rss_mb"] < GOAL_RSS_MB else "MISSED"
        print(
            f"{label:34} {x['wall_s']:8.2f} {ok_w:>6} {x['peak_rss_mb']:12.1f} {ok_r:>6}"
            f"   spread {' / '.join(f'{v:.2f}' for v in x['wall_spread_s'])}"
        )
    for line in r.get("fleet_classes", []):
        print(f"  {line}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    r = bench(args.nodes, args.repeats)
    if args.json:
        print(json.dumps(r, indent=2))
    else:
        print_table(r)
    return 0


if __name__ == "__main__":
    sys.exit(main())
