#!/usr/bin/env python3
"""Record the capacity sample (``fixtures/ledger-sample/``) from the real test stack.

Run as root from the repository root (it starts MariaDB, slurmdbd, slurmctld and slurmd on
loopback, as tests/slurm_accounting.py does, runs :func:`scenario`, records what
``hetpatrol ledger capacity`` reads, and stops everything; ``ledger usage``, ``spans``
and ``quota`` read its sacct.txt and nodes.txt too, tests/test_ledger_cli.py)::

    python tests/record_ledger_sample.py [DEST]     # default fixtures/ledger-sample

The cluster: ``hp-gpu01`` (slurmd running, ``gpu:a100:8``, ``ascend:910b:8``) and
``hp-h100`` (``gpu:h100:4``, no slurmd: set DOWN by an admin), AccountingStorageTRES
tracking ``gres/gpu:a100`` and ``gres/ascend:910b`` but not ``gres/gpu:h100``.
tests/test_ledger_capacity.py runs the same scenario on its own stack.

Files written (each the exact output of the command named in ``commands.txt``):
``sacct.txt`` (``sacct -P -n --noconvert -X -D -a -o <capacity fields>``),
``nodes.txt`` (``scontrol show node -o``), ``events.txt`` (``sacctmgr -P -n show event``),
``config.txt`` (``scontrol show config``), ``window.txt`` (start and end, local time as
sacct prints it).
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import slurm_accounting as acct  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def extra_conf() -> str:
    """A node without a slurmd (its own port, where nothing listens: it never registers
    and stays DOWN), in its own partition; Slurm lists it all the same."""
    port = acct.base._free_port()
    return (
        f"NodeName=hp-h100 NodeAddr=127.0.0.1 Port={port} Gres=gpu:h100:4 State=UNKNOWN\n"
        "PartitionName=h100 Nodes=hp-h100 State=UP\n"
    )


#: the reason hetpatrol writes when it drains (hetpatrol/slurm/drain.py)
OUR_REASON = "hetpatrol: xid_critical gpu 3"
ADMIN_REASON = "bios update"
DOWN_REASON = "psu replaced"

#: (user, account, extra sbatch args, seconds) of the jobs that run
JOBS = [
    ("hpalice", "physics", ["--gres=gpu:a100:8"], 5),
    ("hpalice", "physics", ["--gres=gpu:6"], 4),  # any GPU: Slurm picks the A100s
    ("hpbob", "chemistry", ["--gres=gpu:a100:4"], 3),
    ("hpbob", "chemistry", ["--gres=ascend:910b:2"], 2),
    ("hpbob", "chemistry", ["--gres=ascend:1"], 2),
]
#: waits for the down H100 node at the end (pending card-hours: 2 cards x 60 minutes)
PENDING = ("hpalice", "physics", ["--partition=h100", "--gres=gpu:h100:2", "--time=60"], 5)


def sbatch(cluster, user: str, account: str, extra: list[str], seconds: int) -> str:
    out = cluster.run(
        "runuser", "-u", user, "--", "sbatch", "--parsable", f"--account={account}",
        "--chdir=/tmp", "--output=/dev/null", *extra, "--wrap", f"sleep {seconds}",
    )  # fmt: skip
    return out.stdout.strip().split(";")[0]


def _wait(predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise RuntimeError(f"timed out waiting for {what}")


def scenario(cluster) -> dict:
    """Run the capacity scenario; returns ``{"start", "end", "ids", "pending"}``.

    hp-h100 DOWN by an admin; hp-gpu01 drained by hetpatrol while :data:`JOBS` are
    submitted (so they wait), resumed, the jobs run one after the other (one CPU), then an
    admin drain for a few seconds; :data:`PENDING` stays pending at the end.
    """
    start = int(time.time()) - 1
    node = cluster.node
    cluster.scontrol("update", "NodeName=hp-h100", "State=DOWN", f"Reason={DOWN_REASON}")
    cluster.admin_drain(OUR_REASON)
    ids = [sbatch(cluster, *job) for job in JOBS]
    pending = sbatch(cluster, *PENDING)
    time.sleep(3)
    cluster.scontrol("update", f"NodeName={node}", "State=RESUME")

    def done() -> bool:
        out = cluster.run("sacct", "-a", "-X", "-n", "-P", "-o", "JobIDRaw,State",
                          "-S", "now-1hours").stdout  # fmt: skip
        states = dict(ln.split("|", 1) for ln in out.splitlines() if "|" in ln)
        return all(states.get(i) == "COMPLETED" for i in ids)

    _wait(done, 120, "every job COMPLETED in accounting")
    cluster.admin_drain(ADMIN_REASON)
    time.sleep(3)
    cluster.scontrol("update", f"NodeName={node}", "State=RESUME")
    cluster.wait_for(lambda line: line.split(" ")[1] == "idle", what="node idle")
    time.sleep(1)
    return {"start": start, "end": int(time.time()) + 1, "ids": ids, "pending": pending}


def record(cluster, dest: Path, window: dict) -> None:
    """Write the sample files for ``window`` (from :func:`scenario`) into ``dest``."""
    from datetime import datetime

    from hetpatrol.ledger.capacity import EVENT_FIELDS, capacity_sacct_argv, events_argv

    def local(ts: float) -> str:
        return datetime.fromtimestamp(ts).strftime("%Y-%m-%dT%H:%M:%S")

    s, e = local(window["start"]), local(window["end"])
    commands = {
        "sacct.txt": capacity_sacct_argv(s, e),
        "nodes.txt": ["scontrol", "show", "node", "-o"],
        "events.txt": events_argv(s, e),
        "config.txt": ["scontrol", "show", "config"],
    }
    dest.mkdir(parents=True, exist_ok=True)
    for name, argv in commands.items():
        (dest / name).write_text(cluster.run(*argv).stdout)
    (dest / "window.txt").write_text(f"{s} {e}\n")
    (dest / "commands.txt").write_text(
        "# recorded by tests/record_ledger_sample.py on the test stack "
        f"(Slurm {cluster.run('sinfo', '--version').stdout.split()[-1]}); "
        f"events fields {','.join(EVENT_FIELDS)}\n"
        + "".join(f"{n}: {' '.join(a)}\n" for n, a in commands.items())
    )


def main(argv: list[str]) -> int:
    dest = Path(argv[1]) if len(argv) > 1 else REPO / "fixtures" / "ledger-sample"
    cluster = acct.start_accounting_cluster(extra_conf())
    created: list[str] = []
    try:
        created = acct.add_users(cluster)
        with cluster.explain():
            window = scenario(cluster)
            record(cluster, dest, window)
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)
        acct.remove_users(created)
    print(f"recorded {dest}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
