"""The Slurm entry points the audit recommends, in one place (a deployment that installs
wrapper scripts changes them here only).

``hetpatrol check`` is the HealthCheckProgram (it drains a node whose cards failed);
``hetpatrol prolog`` / ``hetpatrol epilog`` are the Prolog / Epilog (a non-zero Prolog
drains the node and requeues the job, slurm.conf(5) Prolog, so the Prolog entry point
fails only where the job must not start; ``hetpatrol check`` exits 1 on a warning and
is not one).
"""

from __future__ import annotations

#: slurm.conf HealthCheckProgram, and its interval in seconds
HEALTHCHECK_PROGRAM = "hetpatrol check"
HEALTHCHECK_INTERVAL = 300
#: slurm.conf Prolog / Epilog
PROLOG_PROGRAM = "hetpatrol prolog"
EPILOG_PROGRAM = "hetpatrol epilog"
#: what names hetpatrol in a configured program path
PROGRAM_MARK = "hetpatrol"


def healthcheck_fix() -> str:
    return (
        f"HealthCheckProgram=<a script that runs `{HEALTHCHECK_PROGRAM}`>, "
        f"HealthCheckInterval={HEALTHCHECK_INTERVAL}"
    )


def prolog_fix() -> str:
    return f"Prolog=<a script that runs `{PROLOG_PROGRAM}`> (and Epilog: `{EPILOG_PROGRAM}`)"
