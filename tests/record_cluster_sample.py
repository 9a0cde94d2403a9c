#!/usr/bin/env python3
"""Record the cluster sample (``fixtures/cluster/mixed/``) from the real test stack.

Run as root from the repository root (it starts slurmctld, slurmd, Prometheus and four
hetpatrol daemons on loopback, exactly as tests/test_fleet_real.py does, records what
``hetpatrol fleet``, ``audit-slurm`` and ``ledger audit`` read, and stops everything)::

    python tests/record_cluster_sample.py [DEST]     # default fixtures/cluster/mixed

Written (the layout :mod:`hetpatrol.recorded` reads with ``--replay DEST``):
``commands.json`` (each scontrol command: argv, exit code, stderr, its stdout in a file
beside it), ``prometheus.json`` (Prometheus's JSON answer to each exact query of
:func:`hetpatrol.cluster.fleet.queries` and :func:`~hetpatrol.cluster.fleet.runtime_query`)
and the cluster's ``gres.conf``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import urllib.parse
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_fleet_real import fleet_stack  # noqa: E402

from hetpatrol.cluster.fleet import queries, runtime_query  # noqa: E402

REPO = Path(__file__).resolve().parents[1]

#: (file, the arguments after scontrol) of each recorded command: fleet's node read
#: (JSON first, Slurm 22.05 refuses it; then the text), audit-slurm's config, partitions
#: and nodes, ledger audit's nodes.
COMMANDS = [
    ("scontrol-json-show-node.json", ["--json", "show", "node"]),
    ("scontrol-d-o-show-node.txt", ["-d", "-o", "show", "node"]),
    ("scontrol-show-config.txt", ["show", "config"]),
    ("scontrol-show-partition-o.txt", ["show", "partition", "-o"]),
    ("scontrol-show-node-o.txt", ["show", "node", "-o"]),
]


def record(env, dest: Path) -> None:
    commands = []
    for name, args in COMMANDS:
        proc = subprocess.run(
            [*env.cluster.scontrol_argv, *args], capture_output=True, text=True, timeout=60
        )
        entry = {"argv": ["scontrol", *args], "returncode": proc.returncode,
                 "stdout": "", "stderr": proc.stderr}  # fmt: skip
        if proc.stdout:
            (dest / name).write_text(proc.stdout)
            entry["stdout"] = name
        commands.append(entry)
    (dest / "commands.json").write_text(json.dumps({"commands": commands}, indent=1) + "\n")
    answers = {}
    for expr in [*queries().values(), runtime_query()]:
        body = urllib.parse.urlencode({"query": expr}).encode()
        with urllib.request.urlopen(f"{env.prometheus}/api/v1/query", body, timeout=30) as r:
            answers[expr] = json.loads(r.read())
    (dest / "prometheus.json").write_text(json.dumps({"answers": answers}, indent=1) + "\n")
    shutil.copyfile(env.cluster.gres_conf, dest / "gres.conf")


def main() -> int:
    dest = Path(sys.argv[1]) if len(sys.argv) > 1 else REPO / "fixtures" / "cluster" / "mixed"
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="hp-record-") as tmp, fleet_stack(Path(tmp)) as env:
        record(env, dest)
    print(f"recorded into {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
