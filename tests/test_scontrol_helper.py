"""The privileged drain path: the root scontrol helper behind a unix socket.

The socket is served the way systemd does it with ``Accept=yes``: the test accepts each
connection and starts ``hetpatrol-scontrol --serve`` with the connection as stdin and
stdout. ``scontrol`` is a recording fake, so nothing here needs Slurm.
"""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
import threading

import pytest

from hetpatrol.scontrol_helper import Refused, check_request

HELPER = [sys.executable, "-m", "hetpatrol.scontrol_helper"]
NODE = "gpu-a01"


@pytest.mark.parametrize(
    ("argv", "kind"),
    [
        (["show", "node", NODE], "read"),
        (["-o", "show", "node", NODE], "read"),
        (["show", "node", "--oneliner", NODE], "read"),
        (["show", "nodes"], "read"),
        (["ping"], "read"),
        (["--version"], "read"),
        (["update", f"NodeName={NODE}", "State=DRAIN", "Reason=hetpatrol: nvidia 1 lost"], "drain"),
        (["update", f"nodename={NODE}", "state=drain", "reason=hetpatrol: x"], "drain"),
        (["update", f"NodeName={NODE}", "State=RESUME"], "resume"),
        (["update", f"NodeName={NODE}", "State=UNDRAIN"], "resume"),
    ],
)
def test_allowed(argv, kind):
    assert check_request(argv, [NODE])[0] == kind


@pytest.mark.parametrize(
    "argv",
    [
        ["update", "NodeName=other-node", "State=DRAIN", "Reason=hetpatrol: x"],
        ["update", f"NodeName={NODE},other-node", "State=DRAIN", "Reason=hetpatrol: x"],
        ["update", f"NodeName={NODE}", "State=DRAIN", "Reason=maintenance"],
        ["update", f"NodeName={NODE}", "State=DOWN", "Reason=hetpatrol: x"],
        ["update", f"NodeName={NODE}", "State=RESUME", "Reason=hetpatrol: x"],
        ["update", f"NodeName={NODE}", "State=DRAIN", "Reason=hetpatrol: x", "Weight=1"],
        ["update", f"NodeName={NODE}", f"NodeName={NODE}", "State=RESUME"],
        ["update", "PartitionName=gpu", "State=DOWN"],
        ["update", "JobId=1", "TimeLimit=1"],
        ["shutdown"],
        ["reconfigure"],
        ["show", "config", "extra", "words"],
        ["create", "reservation"],
        ["update", f"NodeName={NODE}", "State=DRAIN", "Reason=hetpatrol: x\nNodeName=b"],
        [],
    ],
)
def test_refused(argv):
    with pytest.raises(Refused):
        check_request(argv, [NODE])


@pytest.fixture
def fake_scontrol(tmp_path):
    """A recording scontrol: appends its argv to calls.log; `show node` prints the node
    with the reason held in reason.txt."""
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{tmp_path}/calls.log"\n'
        'if [ "$2" = show ]; then\n'
        f'  echo "NodeName={NODE} Arch=x86_64 State=IDLE+DRAIN Gres=gpu:a100:4 '
        f'Reason=$(cat {tmp_path}/reason.txt) [root@2026-11-29T16:30:54]"\n'
        "fi\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "reason.txt").write_text("hetpatrol: nvidia 1 gpu_is_lost")
    return script, tmp_path / "calls.log"


@pytest.fixture
def helper_socket(tmp_path, fake_scontrol):
    """A listening socket served like systemd's Accept=yes does."""
    script, _ = fake_scontrol
    path = str(tmp_path / "helper.sock")
    config = tmp_path / "hetpatrol.yaml"
    config.write_text(f"node: {NODE}\n")
    lsock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    lsock.bind(path)
    lsock.listen(4)
    lsock.settimeout(0.2)
    stop = threading.Event()
    served: list[subprocess.CompletedProcess] = []

    def accept_loop():
        while not stop.is_set():
            try:
                conn, _ = lsock.accept()
            except TimeoutError:
                continue
            with conn:
                served.append(
                    subprocess.run(
                        [*HELPER, "--serve", "--config", str(config), "--scontrol", str(script)],
                        stdin=conn.fileno(),
                        stdout=conn.fileno(),
                        stderr=subprocess.PIPE,
                        text=True,
                        timeout=30,
                    )
                )

    thread = threading.Thread(target=accept_loop, daemon=True)
    thread.start()
    try:
        yield path, served
    finally:
        stop.set()
        thread.join(5)
        lsock.close()


def call(path, *argv):
    return subprocess.run(
        [*HELPER, f"--socket={path}", *argv], capture_output=True, text=True, timeout=60
    )


def test_drain_and_resume_through_the_socket(helper_socket, fake_scontrol):
    path, served = helper_socket
    _, calls = fake_scontrol
    res = call(path, "update", f"NodeName={NODE}", "State=DRAIN", "Reason=hetpatrol: nvidia 1 lost")
    assert res.returncode == 0, res.stderr
    assert calls.read_text().splitlines() == [
        f"update NodeName={NODE} State=DRAIN Reason=hetpatrol: nvidia 1 lost"
    ]
    # the helper's stdout is the caller's: `show node` reads like scontrol itself
    res = call(path, "-o", "show", "node", NODE)
    assert res.returncode == 0 and res.stdout.startswith(f"NodeName={NODE} ")
    # resume: the helper reads the current reason first, then resumes
    res = call(path, "update", f"NodeName={NODE}", "State=RESUME")
    assert res.returncode == 0, res.stderr
    assert calls.read_text().splitlines()[-2:] == [
        f"-o show node {NODE}",
        f"update NodeName={NODE} State=RESUME",
    ]
    # every request is logged with the peer's credentials (the journal, under systemd)
    assert f"uid={os.getuid()}" in served[0].stderr and "rc=0" in served[0].stderr


def test_refusals_run_nothing(helper_socket, fake_scontrol, tmp_path):
    path, served = helper_socket
    _, calls = fake_scontrol
    res = call(path, "update", "NodeName=other", "State=DRAIN", "Reason=hetpatrol: x")
    assert res.returncode == 2 and "refused" in res.stderr and "not this node" in res.stderr
    res = call(path, "shutdown")
    assert res.returncode == 2
    assert not calls.exists()
    # an admin's drain is never cleared
    (tmp_path / "reason.txt").write_text("bad DIMM, ticket 4711")
    res = call(path, "update", f"NodeName={NODE}", "State=RESUME")
    assert res.returncode == 2 and "not hetpatrol's" in res.stderr
    assert calls.read_text().splitlines() == [f"-o show node {NODE}"]
    assert "refused" in served[-1].stderr


def test_unreachable_helper_fails_like_scontrol(tmp_path):
    res = call(str(tmp_path / "nobody.sock"), "ping")
    assert res.returncode == 1 and "nobody.sock" in res.stderr
