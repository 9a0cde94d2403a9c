"""The Slurm entry points the audit recommends, in one place: the wrappers the Debian and
RPM packages install in ``/usr/libexec/hetpatrol/`` (``packaging/slurm/``; a manual install
puts the same files there, docs/deploy.md), and the ``slurm.conf`` lines of
``/usr/share/hetpatrol/slurm/slurm.conf``.

``healthcheck`` runs ``hetpatrol check`` (one line from the daemon's last verdict; it never
drains: the daemon drains by its own policy); ``prolog`` / ``epilog`` run ``hetpatrol
prolog`` / ``hetpatrol epilog`` (a non-zero Prolog drains the node and requeues the job,
slurm.conf(5) Prolog, so the Prolog fails only where the job must not start; ``hetpatrol
check`` exits 1 on a warning and is no Prolog).
"""

from __future__ import annotations

#: slurm.conf HealthCheckProgram (it runs ``hetpatrol check``), and its interval in seconds
HEALTHCHECK_PROGRAM = "/usr/libexec/hetpatrol/healthcheck"
HEALTHCHECK_INTERVAL = 60
#: slurm.conf Prolog / Epilog (``hetpatrol prolog`` / ``hetpatrol epilog``)
PROLOG_PROGRAM = "/usr/libexec/hetpatrol/prolog"
EPILOG_PROGRAM = "/usr/libexec/hetpatrol/epilog"
#: what names hetpatrol in a configured program path
PROGRAM_MARK = "hetpatrol"


def healthcheck_fix() -> str:
    return (
        f"HealthCheckProgram={HEALTHCHECK_PROGRAM} (runs `hetpatrol check`), "
        f"HealthCheckInterval={HEALTHCHECK_INTERVAL}, HealthCheckNodeState=ANY"
    )


def prolog_fix() -> str:
    return (
        f"Prolog={PROLOG_PROGRAM} and Epilog={EPILOG_PROGRAM} "
        "(run `hetpatrol prolog` / `hetpatrol epilog`)"
    )
