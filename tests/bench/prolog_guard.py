#!/usr/bin/env python3
"""Wall time of the job-start guard from exec to exit (issue 13 goal: <= 50 ms with the
verdict cached). Not a pytest module; to be folded into tests/bench/run.py.

Runs ``python -c 'guard(...)'`` (the same work ``hetpatrol prolog`` will do) ``--runs``
times against a fresh state file of 8 GPUs + 8 NPUs, all fine (the common path: no
scontrol), and prints min / p50 / p95 in ms, with a bare ``python -c pass`` beside it
(the interpreter's own start-up, which the guard cannot go below).

    python tests/bench/prolog_guard.py [--runs 30] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

GOAL_MS = 50.0
GUARD = (
    "import os, sys\n"
    "from hetpatrol.slurm.jobguard import guard\n"
    "sys.exit(guard(os.environ, sys.argv[1]).exit_code)\n"
)


def _state(path: Path) -> None:
    cards = [
        {"vendor": "nvidia", "index": i, "chip": None, "gres": "gpu", "action": "none"}
        for i in range(8)
    ] + [
        {"vendor": "ascend", "index": i, "chip": 0, "gres": "ascend", "action": "none"}
        for i in range(8)
    ]
    doc = {
        "schema": "hetpatrol.state/1",
        "node": "bench",
        "seq": 1,
        "finished": time.time(),
        "interval_seconds": 3600,
        "health": "ok",
        "exit_code": 0,
        "collectors": {},
        "findings": [],
        "cards": cards,
    }
    path.write_text(json.dumps(doc))


def _time(argv: list[str], env: dict[str, str], runs: int) -> list[float]:
    out = []
    for _ in range(runs):
        t = time.perf_counter()
        subprocess.run(argv, env=env, check=True)
        out.append((time.perf_counter() - t) * 1000)
    return out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp) / "state.json"
        _state(state)
        env = {"SLURM_JOB_ID": "1", "SLURMD_NODENAME": "bench", "SLURM_JOB_GPUS": "0,1"}
        env["PATH"] = "/usr/bin:/bin"
        guard = _time([sys.executable, "-c", GUARD, str(state)], env, args.runs)
        bare = _time([sys.executable, "-c", "pass"], env, args.runs)

    def stats(xs: list[float]) -> dict[str, float]:
        xs = sorted(xs)
        return {
            "min": round(xs[0], 1),
            "p50": round(statistics.median(xs), 1),
            "p95": round(xs[min(len(xs) - 1, int(0.95 * len(xs)))], 1),
        }

    result = {"prolog_guard_ms": stats(guard), "python_start_ms": stats(bare), "goal_ms": GOAL_MS}
    if args.json:
        print(json.dumps(result))
    else:
        g, b = result["prolog_guard_ms"], result["python_start_ms"]
        print(f"prolog guard exec->exit ms: min {g['min']} p50 {g['p50']} p95 {g['p95']}")
        print(f"python -c pass          ms: min {b['min']} p50 {b['p50']} p95 {b['p95']}")
        print(f"goal: p50 <= {GOAL_MS:g} ms -> {'met' if g['p50'] <= GOAL_MS else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
