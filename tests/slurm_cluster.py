"""A real single-node Slurm cluster for the tests: munged, slurmctld and slurmd on loopback.

Everything lives in one temporary directory: munge key and private socket, slurm.conf and
gres.conf, state and spool dirs, logs, and plain files standing in for ``/dev/nvidia*``
and ``/dev/davinci*`` (``File=``: without it slurmd reports 0 GPUs and the node goes
INVALID). slurmctld and slurmd listen on free ports; the Slurm commands find the cluster
through ``SLURM_CONF`` (see :attr:`SlurmCluster.env`, or the argv prefix
:attr:`SlurmCluster.scontrol_argv` that hetpatrol's config takes) and munge through
``AuthInfo=socket=...``. Nothing touches /etc, /run or the default ports.

The daemons are stopped by pid at the end of the session. Without the Debian packages
(``munge slurmctld slurmd slurm-client``) or root the tests skip, except under
``CI=true``, where they fail.

Also here: :func:`make_replay`, which builds an NVIDIA + Ascend replay directory with N
healthy A100s out of the bundled ``sick-mixed`` recordings.
"""

from __future__ import annotations

import contextlib
import copy
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
NODES = REPO / "fixtures" / "nodes"
BINARIES = ("munged", "mungekey", "slurmctld", "slurmd", "scontrol", "sinfo", "sbatch", "scancel")
NODE_NAME = "hp-gpu01"  # deliberately not the host name: slurm.node_name maps it
GPUS, NPUS = 8, 8
START_TIMEOUT = 60.0  # a ceiling: readiness is polled, never slept


def _fail_or_skip(message: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"Slurm test cannot run under CI=true: {message}")
    pytest.skip(message)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class CommandFailed(subprocess.CalledProcessError):
    """A Slurm command of a test failed: its message holds the command, its exit code,
    its own stderr and stdout, and the end of every daemon's log (a bare "returned
    non-zero exit status 1" told nothing of why sbatch refused a job under load)."""

    def __init__(self, proc: subprocess.CompletedProcess, logs: str):
        super().__init__(proc.returncode, proc.args, proc.stdout, proc.stderr)
        self.logs = logs

    def __str__(self) -> str:
        cmd = " ".join(map(str, self.cmd))
        return (
            f"{cmd} exited with {self.returncode}\n"
            f"stderr: {(self.stderr or '').strip()[-2000:] or '(none)'}\n"
            f"stdout: {(self.stdout or '').strip()[-1000:] or '(none)'}\n"
            f"{self.logs}"
        )


class CommandTimedOut(subprocess.TimeoutExpired):
    """A Slurm command of a test did not answer in time; the daemons' logs with it."""

    def __init__(self, exc: subprocess.TimeoutExpired, logs: str):
        super().__init__(exc.cmd, exc.timeout, exc.output, exc.stderr)
        self.logs = logs

    def __str__(self) -> str:
        return f"{super().__str__()}\n{self.logs}"


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    gres_conf: Path
    node: str
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    @property
    def scontrol_argv(self) -> list[str]:
        """The ``slurm.scontrol`` argv prefix that reaches this cluster."""
        return ["env", f"SLURM_CONF={self.conf}", shutil.which("scontrol") or "scontrol"]

    def run(
        self, *argv: str, check: bool = True, timeout: float = 60
    ) -> subprocess.CompletedProcess:
        """Run a command against this cluster. With ``check``, a failure raises
        :class:`CommandFailed` (its stderr and the daemons' logs in the message); a
        command not done in ``timeout`` seconds raises :class:`CommandTimedOut`."""
        try:
            proc = subprocess.run(
                list(argv), env=self.env, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.TimeoutExpired as exc:
            raise CommandTimedOut(exc, self.logs(1500)) from None
        if check and proc.returncode != 0:
            raise CommandFailed(proc, self.logs(1500))
        return proc

    @contextlib.contextmanager
    def install_hook(self, name: str, text: str):
        """Make ``name`` (``prolog`` or ``epilog``) run the script ``text`` while in the
        block; removed after it, so other tests see a Prolog that passes."""
        hook = self.root / f"{name}.hook"
        hook.write_text(text)
        hook.chmod(0o755)
        try:
            yield hook
        finally:
            hook.unlink(missing_ok=True)

    def scontrol(self, *args: str) -> str:
        return self.run("scontrol", *args).stdout

    def sinfo(self) -> str:
        """``sinfo -o "%n %T %E"`` for our node: ``hp-gpu01 drained hetpatrol: ...``."""
        out = self.run("sinfo", "-h", "-N", "-n", self.node, "-o", "%n %T %E").stdout
        return out.strip()

    def state(self) -> str:
        return self.sinfo().split(" ", 2)[1]

    def reason(self) -> str:
        """sinfo's ``%E``: ``none`` without a reason, empty for a blank one."""
        parts = self.sinfo().split(" ", 2)
        return parts[2] if len(parts) > 2 else ""

    def wait_for(self, predicate, timeout: float = 60.0, what: str = "") -> str:
        """Poll ``sinfo`` (our node's line) until ``predicate(line)``; the line. ``timeout``
        is a ceiling for a loaded machine (two suites at once), never a wait: past it an
        AssertionError with the last line and the end of the daemons' own logs."""
        deadline = time.monotonic() + timeout
        line = ""
        while time.monotonic() < deadline:
            try:
                line = self.sinfo()
            except subprocess.SubprocessError:
                line = ""
            if line and predicate(line):
                return line
            time.sleep(0.1)
        raise AssertionError(
            f"timed out waiting for {what or predicate}: last {line!r}\n{self.logs(1500)}"
        )

    def node_state(self) -> str:
        """``State=`` of ``scontrol show node`` (``IDLE+PLANNED``): flags sinfo hides."""
        out = self.scontrol("show", "node", "-o", self.node)
        return out.split(" State=", 1)[1].split()[0]

    @contextlib.contextmanager
    def planned(self, timeout: float = 20.0):
        """The node ``IDLE+PLANNED``, the way Slurm 22.05 gets there: a reservation on it
        starts in 2 minutes, so a 5-minute job cannot start now and the backfill scheduler
        (``bf_interval=1``) earmarks the node for it after the reservation. The job and
        the reservation are removed at the end."""
        name = "hetpatrol_test_planned"
        self.scontrol(
            "create",
            "reservation",
            f"ReservationName={name}",
            "StartTime=now+120",
            "Duration=10",
            f"Nodes={self.node}",
            "Users=root",
            "Flags=IGNORE_JOBS",
        )
        job = None
        try:
            out = self.run(
                "sbatch", "--parsable", "-t", "5", "-N1", "-o", "/dev/null", "--wrap", "sleep 1"
            ).stdout
            job = out.strip().split(";")[0]
            deadline = time.monotonic() + timeout
            while "PLANNED" not in self.node_state():
                if time.monotonic() > deadline:
                    raise AssertionError(f"node never PLANNED: {self.node_state()}")
                time.sleep(0.2)
            yield job
        finally:
            if job:
                self.run("scancel", job, check=False)
            self.run("scontrol", "delete", f"ReservationName={name}", check=False)

    def admin_drain(self, reason: str) -> None:
        self.scontrol("update", f"NodeName={self.node}", "State=DRAIN", f"Reason={reason}")

    def make_idle(self) -> None:
        """Undo any drain (as an admin would) and wait until the node is idle again."""
        if "drain" in self.state():
            self.scontrol("update", f"NodeName={self.node}", "State=RESUME")
        self.wait_for(lambda line: line.split(" ")[1] == "idle", what="node idle")

    @contextlib.contextmanager
    def explain(self):
        """Print the daemons' logs (captured, shown with the failure) if the block fails."""
        try:
            yield self
        except BaseException:
            print(f"slurm: {self.sinfo() if self.procs else '(stopped)'}")
            print(self.logs())
            raise

    def logs(self, tail: int = 4000) -> str:
        """The last ``tail`` characters of every daemon's log."""
        out = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace")
            out.append(f"----- {path.name} (last {tail} chars)\n{text[-tail:]}")
        return "\n".join(out)

    def stop(self) -> None:
        extra = [n for n in reversed(self.procs) if n not in ("slurmd", "slurmctld", "munged")]
        for name in ("slurmd", "slurmctld", *extra, "munged"):
            proc = self.procs.pop(name, None)
            if proc is None or proc.poll() is not None:
                continue
            os.kill(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def _write_configs(
    root: Path,
    node: str,
    overrides: dict[str, str] | None = None,
    extra_conf: str = "",
    node_gres: str | None = None,
    gres_conf_text: str | None = None,
    cgroup_conf: str | None = None,
) -> tuple[Path, Path]:
    host = socket.gethostname().split(".")[0]
    dev = root / "dev"
    dev.mkdir()
    for i in range(GPUS):
        (dev / f"nvidia{i}").touch()
    for i in range(NPUS):
        (dev / f"davinci{i}").touch()
    for d in ("state", "spool", "log", "run"):
        (root / d).mkdir()
    gres_conf = root / "gres.conf"
    gres_conf.write_text(
        f"# generated by tests/slurm_cluster.py\n"
        f"NodeName={node} Name=gpu Type=a100 File={dev}/nvidia[0-{GPUS - 1}]\n"
        f"NodeName={node} Name=ascend Type=910b File={dev}/davinci[0-{NPUS - 1}]\n"
        if gres_conf_text is None
        else gres_conf_text.replace("{dev}", str(dev)).replace("{node}", node)
    )
    (root / "plugstack.conf").write_text("")
    if cgroup_conf is not None:  # read from slurm.conf's directory (cgroup.conf(5))
        (root / "cgroup.conf").write_text(cgroup_conf)
    # Prolog/Epilog: run a test's hook when one is installed (see install_hook), else pass
    for name in ("prolog", "epilog"):
        script = root / name
        script.write_text(
            f'#!/bin/sh\n[ -x "{root}/{name}.hook" ] && exec "{root}/{name}.hook"\nexit 0\n'
        )
        script.chmod(0o755)
    conf = root / "slurm.conf"
    gres = f"Gres={f'gpu:a100:{GPUS},ascend:910b:{NPUS}' if node_gres is None else node_gres}"
    if node_gres == "":
        gres = ""  # no Gres= at all
    conf.write_text(
        f"""# generated by tests/slurm_cluster.py
ClusterName=hetpatroltest
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={_free_port()}
SlurmdPort={_free_port()}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge.socket
SlurmUser=root
SlurmdUser=root
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool
SlurmctldPidFile={root}/run/slurmctld.pid
SlurmdPidFile={root}/run/slurmd.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd.log
PlugStackConfig={root}/plugstack.conf
Prolog={root}/prolog
Epilog={root}/epilog
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SchedulerType=sched/backfill
# backfill every second: it sets the PLANNED flag (tests of the drain state table)
SchedulerParameters=bf_interval=1
# a loaded 2-core machine (two suite runs at once) may keep slurmctld from answering an
# RPC within the default 10 s: the client (sbatch, scontrol) then fails with "Socket
# timed out on send/recv operation" (slurm.conf(5), MessageTimeout)
MessageTimeout=30
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
GresTypes=gpu,ascend
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 State=UNKNOWN {gres}
PartitionName=debug Nodes={node} Default=YES MaxTime=INFINITE State=UP
{extra_conf}"""
    )
    if overrides:  # replace a key's line (or add it before NodeName=) in slurm.conf
        lines = conf.read_text().splitlines()
        for key, value in overrides.items():
            line = f"{key}={value.replace('{root}', str(root))}"
            hits = [i for i, ln in enumerate(lines) if ln.split("=", 1)[0] == key]
            if hits:
                lines[hits[0]] = line
            else:
                lines.insert(
                    next(i for i, ln in enumerate(lines) if ln.startswith("NodeName=")), line
                )
        conf.write_text("\n".join(lines) + "\n")
    return conf, gres_conf


def start_cluster(
    overrides: dict[str, str] | None = None,
    after_munge: Callable[[SlurmCluster], None] | None = None,
    extra_conf: str = "",
    node_gres: str | None = None,
    gres_conf_text: str | None = None,
    wait_idle: bool = True,
    cgroup_conf: str | None = None,
    node: str = NODE_NAME,
) -> SlurmCluster:
    """Start munged, slurmctld, slurmd; return once the node is idle. Raises on failure.

    ``overrides``: slurm.conf keys to replace or add (``{"AccountingStorageType": ...}``;
    ``{root}`` in a value is the temp dir);
    ``after_munge(cluster)`` runs once munged is up and before slurmctld starts (e.g. to
    start slurmdbd, whose process it may add to ``cluster.procs``: those are stopped after
    slurmctld, in reverse order of start);
    ``extra_conf``: slurm.conf lines appended as they are (more ``NodeName=`` lines for
    nodes without a slurmd, which Slurm lists all the same, and their partitions).
    ``node_gres``: the node's ``Gres=`` value ("": none); ``gres_conf_text``: the whole gres.conf
    (``{dev}`` is the directory of the stand-in device files, ``{node}`` the node name);
    ``wait_idle=False`` returns once the node has registered in any state (a test of
    what Slurm makes of a config reads it then). ``cgroup_conf``: the text of a
    cgroup.conf beside slurm.conf (with ``ProctrackType=proctrack/cgroup`` in
    ``overrides``: the job cgroups of tests/test_stray_process.py); ``node``: the NodeName
    (Slurm's v1 cgroups sit under ``/slurm_<NodeName>`` in Debian's build: a name of its
    own keeps two runs apart). All default to the plain cluster.
    """
    root = Path(tempfile.mkdtemp(prefix="hetpatrol-slurm-"))
    root.chmod(0o755)  # munged: every directory above its socket must be searchable
    conf, gres_conf = _write_configs(
        root, node, overrides, extra_conf, node_gres, gres_conf_text, cgroup_conf
    )
    cluster = SlurmCluster(root, conf, gres_conf, node)
    log = root / "log"
    try:
        key = root / "munge.key"
        subprocess.run(["mungekey", "-c", "-k", str(key)], check=True, capture_output=True)
        sock = root / "munge.socket"

        def spawn(name: str, argv: list[str]) -> None:
            with open(log / f"{name}.out", "wb") as out:
                cluster.procs[name] = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    env=cluster.env,
                    start_new_session=True,
                )

        spawn(
            "munged",
            [
                "munged",
                "-F",
                f"--socket={sock}",
                f"--key-file={key}",
                f"--pid-file={root}/run/munged.pid",
                f"--seed-file={root}/munged.seed",
                f"--log-file={log}/munged.log",
            ],
        )
        deadline = time.monotonic() + START_TIMEOUT
        while not sock.exists():
            if cluster.procs["munged"].poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("munged did not create its socket")
            time.sleep(0.05)
        if after_munge is not None:
            after_munge(cluster)
        spawn("slurmctld", ["slurmctld", "-D", "-i", "-f", str(conf)])
        spawn("slurmd", ["slurmd", "-D", "-N", node, "-f", str(conf)])
        state = ""

        def exited() -> None:
            for name, proc in cluster.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}")

        while time.monotonic() < deadline:
            exited()
            try:
                out = subprocess.run(
                    ["sinfo", "-h", "-N", "-n", node, "-o", "%T"],
                    env=cluster.env,
                    capture_output=True,
                    text=True,
                    timeout=10,
                )
            except subprocess.TimeoutExpired:
                # a slurmctld that exits (a fatal config) leaves sinfo waiting for it:
                # the daemon's own exit is the answer, else keep waiting for readiness
                exited()
                continue
            state = out.stdout.strip()
            if set(state.split()) == {"idle"}:  # one line per partition of the node
                return cluster
            if not wait_idle and state and "unknown" not in state and "*" not in state:
                return cluster
            time.sleep(0.1)
        raise RuntimeError(f"node {node} not idle after {START_TIMEOUT:.0f} s: {state!r}")
    except BaseException as exc:
        logs = cluster.logs()
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)
        raise RuntimeError(f"Slurm test cluster did not start: {exc}\n{logs}") from exc


@pytest.fixture(scope="session")
def slurm_cluster():
    missing = [b for b in BINARIES if shutil.which(b) is None]
    if missing:
        _fail_or_skip(f"not installed: {', '.join(missing)} (Debian: munge slurmctld slurmd)")
    if os.geteuid() != 0:
        _fail_or_skip("the Slurm test cluster runs SlurmUser=root: run as root")
    try:
        cluster = start_cluster()
    except RuntimeError as exc:
        pytest.fail(str(exc))
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(cluster.root, ignore_errors=True)


@pytest.fixture
def slurm_node(slurm_cluster):
    """The cluster with its node idle and without a reason, before and after the test."""
    slurm_cluster.make_idle()
    yield slurm_cluster
    slurm_cluster.make_idle()


# ------------------------------------------------------------------------ replays
def make_replay(dest: Path, gpus: int, node: str = "replay-a100") -> Path:
    """A replay dir with ``gpus`` healthy A100s and 8 healthy 910B NPUs.

    The GPUs are copies of GPU 0 of ``fixtures/nodes/sick-mixed/nvidia-smi-q.xml`` (a
    healthy A100-SXM4-80GB as recorded) with their own bus id, UUID, serial and minor
    number; the NPUs are ``fixtures/nodes/healthy-mixed/npu-smi-info.txt`` (8 x 910B4).
    """
    dest.mkdir(parents=True, exist_ok=True)
    tree = ET.parse(NODES / "sick-mixed" / "nvidia-smi-q.xml")
    root = tree.getroot()
    template = root.findall("gpu")[0]
    for gpu in root.findall("gpu"):
        root.remove(gpu)
    root.find("attached_gpus").text = str(gpus)
    for i in range(gpus):
        gpu = copy.deepcopy(template)
        bus = f"00000000:{0x18 + 0x10 * i:02X}:00.0"
        gpu.set("id", bus)
        gpu.find("pci/pci_bus_id").text = bus
        gpu.find("uuid").text = f"GPU-00000000-0000-4000-8000-{i:012d}"
        gpu.find("serial").text = f"16320084559{i:02d}"
        gpu.find("minor_number").text = str(i)
        root.append(gpu)
    tree.write(dest / "nvidia-smi-q.xml", encoding="utf-8", xml_declaration=True)
    shutil.copy(NODES / "healthy-mixed" / "npu-smi-info.txt", dest / "npu-smi-info.txt")
    (dest / "scenario.yaml").write_text(
        f"node: {node}\ndescription: {gpus} x A100-SXM4-80GB + 8 x 910B4, all healthy\n"
    )
    return dest
