#!/usr/bin/env python3
"""Write the state files of ``fixtures/ledger-faults/nodes/`` (the example of ``hetpatrol
ledger faults DIR`` in docs/slurm.md): two nodes' daemons, each one patrol of the
fixtures/nodes/xid-79 replay given a boot (tests/test_fault_events.py
``booted_replay``), GPU 6 holding job 101 on gpu-a01 and jobs 202 and 203 on gpu-a02
(a stand-in for ``squeue --json``, as in the tests). Each file is the daemon's own
state file, as an operator gathers them, one per node::

    python tests/record_fault_states.py [DEST]     # default fixtures/ledger-faults/nodes
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_fault_events import booted_replay, jobs_stand_in  # noqa: E402

from hetpatrol.config import load_config  # noqa: E402
from hetpatrol.daemon import Daemon  # noqa: E402


def main(argv: list[str]) -> int:
    dest = Path(argv[0] if argv else "fixtures/ledger-faults/nodes")
    dest.mkdir(parents=True, exist_ok=True)
    for node, jobs in (("gpu-a01", ("101",)), ("gpu-a02", ("202", "203"))):
        with tempfile.TemporaryDirectory() as tmp:
            replay = booted_replay(Path(tmp), int(time.time()) - 3600)
            state = Path(tmp) / "state.json"
            config = replace(load_config(), node=node, state_path=state, listen=None)
            d = Daemon(config, replay_dir=replay)
            d.patroller.card_jobs = jobs_stand_in(jobs)
            try:
                d.patrol_once()
            finally:
                d.shutdown()
            shutil.copyfile(state, dest / f"{node}.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
