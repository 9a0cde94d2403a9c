#!/usr/bin/env python3
"""The ledger at scale: ``hetpatrol ledger usage`` over a generated sacct output of
1,000,000 job runs (goal: under 10 s and under 100 MB peak RSS on a 2-core machine).

Run from the repository root (``tests/bench/run.py`` runs it too)::

    python tests/bench/ledger.py [--jobs N] [--json]

The records are written once to a temp file in the exact ``sacct -P -n --noconvert -X -D
-o <FIELDS>`` shape (500 nodes ``gpu[0001-0500]`` with A100, H100 or 910B, 200 users in
20 accounts, 3 partitions, 30 days; 1 % requeued runs, 0.5 % still running, 2 % pending,
5 % untyped ``gres/gpu=N`` requests). Not timed: the generation.

Timed: a fresh ``hetpatrol ledger usage --by account,user --format json`` process that
reads them the way it reads a real sacct, through a pipe from a child process (a ``sh``
stand-in for sacct that ``exec``\\ s ``cat`` of the file), with the nodes' GRES types
from a stand-in ``scontrol show node -o``. Wall seconds from start to exit, and the
process's peak RSS (``ru_maxrss`` from ``wait4``, the ``cat`` child not included).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta
from pathlib import Path

GOAL_S, GOAL_MB = 10.0, 100.0
NODES = 500
TYPES = [("gpu", "a100"), ("gpu", "h100"), ("ascend", "910b")]


def node_type(i: int) -> tuple[str, str]:
    return TYPES[i % len(TYPES)]


def generate(path: Path, jobs: int, seed: int = 7) -> None:
    rnd = random.Random(seed)
    t0 = datetime(2026, 1, 1)
    span = 30 * 86400
    with open(path, "w", buffering=1 << 20) as out:
        for j in range(1, jobs + 1):
            n = rnd.randrange(NODES)
            name, gtype = node_type(n)
            cards = rnd.choice((1, 1, 2, 4, 8))
            submit = t0 + timedelta(seconds=rnd.randrange(span))
            start = submit + timedelta(seconds=rnd.randrange(3600))
            end = start + timedelta(seconds=rnd.randrange(60, 6 * 3600))
            r = rnd.random()
            state = "COMPLETED" if r > 0.05 else "FAILED"
            st, en = start.isoformat(), end.isoformat()
            if r < 0.02:
                state, st, en = "PENDING", "Unknown", "Unknown"
            elif r < 0.025:
                state, en = "RUNNING", "Unknown"
            elif r < 0.035:
                state = "REQUEUED"
            if rnd.random() < 0.05 and name == "gpu":
                tres = f"billing={cards},cpu={cards * 8},gres/gpu={cards},mem=64000M,node=1"
            else:
                tres = (
                    f"billing={cards},cpu={cards * 8},gres/{name}:{gtype}={cards},"
                    f"gres/{name}={cards},mem=64000M,node=1"
                )
            user = rnd.randrange(200)
            elapsed = 0 if st == "Unknown" else int((end - start).total_seconds())
            out.write(
                f"{j}|{j}|user{user:03d}|acct{user % 20:02d}|part{user % 3}|normal|"
                f"gpu{n + 1:04d}|{submit.isoformat()}|{st}|{en}|{elapsed}|{state}|{tres}\n"
            )


def scontrol_nodes(path: Path) -> None:
    with open(path, "w") as out:
        for i in range(NODES):
            name, gtype = node_type(i)
            out.write(f"NodeName=gpu{i + 1:04d} State=IDLE Gres={name}:{gtype}:8\n")


def run(jobs: int = 1_000_000) -> dict:
    """Generate, then time one ledger process; the figures as a dict."""
    with tempfile.TemporaryDirectory(prefix="hetpatrol-ledger-bench-") as tmp:
        data, nodes = Path(tmp) / "sacct.txt", Path(tmp) / "nodes.txt"
        t = time.perf_counter()
        generate(data, jobs)
        scontrol_nodes(nodes)
        gen_s = time.perf_counter() - t
        sacct = f"sh -c {shlex.quote('exec cat ' + shlex.quote(str(data)))} sacct"
        scontrol = f"sh -c {shlex.quote('exec cat ' + shlex.quote(str(nodes)))} scontrol"
        argv = [sys.executable, "-m", "hetpatrol.cli", "ledger", "usage", "--by",
                "account,user", "--format", "json", "--start", "2026-01-03T00:00:00",
                "--end", "2026-01-28T00:00:00", "--sacct", sacct,
                "--scontrol", scontrol]  # fmt: skip
        out_path = Path(tmp) / "out.json"
        with open(out_path, "w") as out:
            t = time.perf_counter()
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.PIPE)
            _pid, status, usage = os.wait4(proc.pid, 0)
            wall = time.perf_counter() - t
        proc.returncode = os.waitstatus_to_exitcode(status)
        err = proc.stderr.read().decode() if proc.stderr else ""
        if proc.returncode != 0:
            raise RuntimeError(f"ledger exited {proc.returncode}: {err[-2000:]}")
        doc = json.loads(out_path.read_text())
        return {
            "ledger_jobs": jobs,
            "ledger_seconds": round(wall, 3),
            "ledger_peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "ledger_records_read": doc["records"],
            "ledger_rows": len(doc["rows"]),
            "ledger_records_per_s": round(doc["records"] / wall),
            "ledger_generate_s": round(gen_s, 1),
            "ledger_data_mb": round(os.path.getsize(data) / 2**20, 1),
        }


def print_table(res: dict) -> None:
    s_ok = "met" if res["ledger_seconds"] < GOAL_S else "MISSED"
    m_ok = "met" if res["ledger_peak_rss_mb"] < GOAL_MB else "MISSED"
    print(f"ledger over {res['ledger_jobs']:,} sacct records ({res['ledger_data_mb']} MB, "
          f"streamed through a pipe): {res['ledger_records_read']:,} read, "
          f"{res['ledger_rows']} rows")  # fmt: skip
    print(f"  {'ledger_seconds':32} {res['ledger_seconds']:>10.2f}   < {GOAL_S:g}    {s_ok}")
    print(
        f"  {'ledger_peak_rss_mb':32} {res['ledger_peak_rss_mb']:>10.1f}   < {GOAL_MB:g}   {m_ok}"
    )  # noqa: E501
    print(f"  {'ledger_records_per_s':32} {res['ledger_records_per_s']:>10,}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=1_000_000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    res = run(args.jobs)
    if args.json:
        print(json.dumps(res, indent=2))
    else:
        print_table(res)
    return 0


if __name__ == "__main__":
    sys.exit(main())
