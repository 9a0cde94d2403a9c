"""The privileged drain path: the root scontrol helper behind a unix socket.

The socket is served the way systemd does it with ``Accept=yes``: the test accepts each
connection and starts ``hetpatrol-scontrol --serve`` with the connection as stdin and
stdout. ``scontrol`` is a recording fake in most tests; the tests marked ``slurm`` run the
helper against the real slurmctld of tests/slurm_cluster.py.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading

import pytest
import slurm_cluster as cluster

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
        (["update", f"NodeName={NODE}", "State=UNDRAIN"], "resume"),
        (["update", f"NodeName={NODE}", "state=undrain"], "resume"),
        # reboot through Slurm (slurm.drain.reboot); RESUME is then checked on the node
        (["reboot", "ASAP", "nextstate=DOWN", "reason=hetpatrol: reboot_node x", NODE], "reboot"),
        (["update", f"NodeName={NODE}", "State=RESUME"], "resume_reboot"),
        # a fault note to a job's AdminComment (slurm.admin_comment), checked on the job
        (["update", "JobId=42", "AdminComment=hetpatrol: xid 79 nvidia/6 t"], "admin_comment"),
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
        ["update", f"NodeName={NODE}", "State=UNDRAIN", "Reason=hetpatrol: x"],
        ["update", f"NodeName={NODE}", "State=RESUME", "Reason=hetpatrol: x"],
        ["reboot", "ASAP", "nextstate=DOWN", "reason=hetpatrol: x", "ALL"],
        ["update", "JobId=42_1", "AdminComment=hetpatrol: x"],
        ["update", "JobId=42", "Comment=hetpatrol: x"],
        ["update", "JobId=42", "AdminComment=hetpatrol: x", "TimeLimit=1"],
        ["reboot", "ASAP", "nextstate=DOWN", "reason=hetpatrol: x", "other-node"],
        ["reboot", "ASAP", "nextstate=RESUME", "reason=hetpatrol: x", NODE],
        ["reboot", "nextstate=DOWN", "reason=hetpatrol: x", NODE],
        ["reboot", "ASAP", "nextstate=DOWN", "reason=admin: x", NODE],
        ["reboot", "ASAP", "nextstate=DOWN", NODE],
        ["reboot", "ASAP", "nextstate=DOWN", "reason=hetpatrol: x\rforged", NODE],
        ["update", f"NodeName={NODE}", "State=DRAIN", "Reason=hetpatrol: x", "Weight=1"],
        ["update", f"NodeName={NODE}", f"NodeName={NODE}", "State=UNDRAIN"],
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
    in the state held in state.txt, with the reason held in reason.txt (none if empty)."""
    script = tmp_path / "scontrol"
    script.write_text(
        "#!/bin/sh\n"
        f'echo "$*" >> "{tmp_path}/calls.log"\n'
        'if [ "$2" = show ]; then\n'
        f"  r=$(cat {tmp_path}/reason.txt)\n"
        f'  printf "NodeName={NODE} Arch=x86_64 State=%s Gres=gpu:a100:4" '
        f'"$(cat {tmp_path}/state.txt)"\n'
        '  [ -n "$r" ] && printf " Reason=%s [root@2026-11-29T16:30:54]" "$r"\n'
        '  echo " Weight=1"\n'
        "fi\n"
        "exit 0\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    (tmp_path / "reason.txt").write_text("hetpatrol: nvidia 1 gpu_is_lost")
    (tmp_path / "state.txt").write_text("IDLE+DRAIN")
    return script, tmp_path / "calls.log"


@contextlib.contextmanager
def serving(tmp_path, scontrol, *, node: str = NODE, env=None):
    """A listening socket served like systemd's Accept=yes does: each connection runs
    ``hetpatrol-scontrol --serve`` with it as stdin and stdout. Yields (path, served)."""
    path = str(tmp_path / "helper.sock")
    config = tmp_path / "hetpatrol.yaml"
    config.write_text(f"node: {node}\n")
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
                        [*HELPER, "--serve", "--config", str(config), "--scontrol", str(scontrol)],
                        stdin=conn.fileno(),
                        stdout=conn.fileno(),
                        stderr=subprocess.PIPE,
                        text=True,
                        timeout=30,
                        env=env,
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


@pytest.fixture
def helper_socket(tmp_path, fake_scontrol):
    script, _ = fake_scontrol
    with serving(tmp_path, script) as served:
        yield served


def call(path, *argv):
    return subprocess.run(
        [*HELPER, f"--socket={path}", *argv], capture_output=True, text=True, timeout=60
    )


def test_drain_and_resume_through_the_socket(helper_socket, fake_scontrol):
    path, served = helper_socket
    _, calls = fake_scontrol
    res = call(path, "update", f"NodeName={NODE}", "State=DRAIN", "Reason=hetpatrol: nvidia 1 lost")
    assert res.returncode == 0, res.stderr
    # the helper reads the node's state and reason first (ours here), then drains
    assert calls.read_text().splitlines() == [
        f"-o show node {NODE}",
        f"update NodeName={NODE} State=DRAIN Reason=hetpatrol: nvidia 1 lost",
    ]
    # the helper's stdout is the caller's: `show node` reads like scontrol itself
    res = call(path, "-o", "show", "node", NODE)
    assert res.returncode == 0 and res.stdout.startswith(f"NodeName={NODE} ")
    # resume: the helper reads the current reason first, then undrains
    res = call(path, "update", f"NodeName={NODE}", "State=UNDRAIN")
    assert res.returncode == 0, res.stderr
    assert calls.read_text().splitlines()[-2:] == [
        f"-o show node {NODE}",
        f"update NodeName={NODE} State=UNDRAIN",
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
    res = call(path, "update", f"NodeName={NODE}", "State=UNDRAIN")
    assert res.returncode == 2 and "not a drain of hetpatrol's" in res.stderr
    assert calls.read_text().splitlines() == [f"-o show node {NODE}"]
    assert "refused" in served[-1].stderr


@pytest.mark.parametrize(
    "state, reason, why",
    [
        (
            "IDLE+DRAIN",
            "admin: DIMM swap",
            "node already has a reason set by root: 'admin: DIMM swap'",
        ),
        ("IDLE+DRAIN", "", "drained without a reason"),
        ("DOWN", "Not responding", "node already has a reason set"),
        ("MIXED+MAINTENANCE", "", "no drain in MAINTENANCE"),
        ("IDLE+WHATEVER_NEXT", "", "unknown to hetpatrol: WHATEVER_NEXT"),
    ],
)
def test_drain_never_replaces_a_reason_it_did_not_set(
    helper_socket, fake_scontrol, tmp_path, state, reason, why
):
    """The daemon's rules, in the helper, on every request (a stand-in scontrol here;
    the real slurmctld in test_real_slurmctld_admin_drain_survives_the_helper)."""
    path, _ = helper_socket
    _, calls = fake_scontrol
    (tmp_path / "state.txt").write_text(state)
    (tmp_path / "reason.txt").write_text(reason)
    res = call(path, "update", f"NodeName={NODE}", "State=DRAIN", "Reason=hetpatrol: x")
    assert res.returncode == 2 and why in res.stderr, res.stderr
    assert calls.read_text().splitlines() == [f"-o show node {NODE}"]  # no update run


def test_drain_of_a_node_without_reason_is_run(helper_socket, fake_scontrol, tmp_path):
    path, _ = helper_socket
    _, calls = fake_scontrol
    for state in ("MIXED+PLANNED", "IDLE"):
        (tmp_path / "state.txt").write_text(state)
        (tmp_path / "reason.txt").write_text("")
        res = call(path, "update", f"NodeName={NODE}", "State=DRAIN", "Reason=hetpatrol: x")
        assert res.returncode == 0, res.stderr
        assert calls.read_text().splitlines()[-1] == (
            f"update NodeName={NODE} State=DRAIN Reason=hetpatrol: x"
        )


def test_unreachable_helper_fails_like_scontrol(tmp_path):
    res = call(str(tmp_path / "nobody.sock"), "ping")
    assert res.returncode == 1 and "nobody.sock" in res.stderr


# ---------------------------------------------- against the real slurmctld (marker slurm)
slurm_cluster = cluster.slurm_cluster
slurm_node = cluster.slurm_node


@pytest.fixture
def real_helper(slurm_node, tmp_path):
    """The helper in front of the real scontrol of the test cluster (node hp-gpu01)."""
    scontrol = shutil.which("scontrol")
    with serving(tmp_path, scontrol, node=slurm_node.node, env=slurm_node.env) as (path, _):
        yield path, slurm_node


@pytest.mark.slurm
def test_real_slurmctld_admin_drain_survives_the_helper(real_helper):
    """DRAIN then UNDRAIN through the helper used to take an admin's drain to IDLE."""
    path, slurm = real_helper
    node = slurm.node
    with slurm.explain():
        slurm.admin_drain("admin: DIMM swap")
        slurm.wait_for(lambda line: "drain" in line.split(" ")[1], what="admin drain")
        res = call(path, "update", f"NodeName={node}", "State=DRAIN", "Reason=hetpatrol: x")
        assert res.returncode == 2, res.stdout + res.stderr
        assert "node already has a reason set by root: 'admin: DIMM swap'" in res.stderr
        assert slurm.reason() == "admin: DIMM swap"
        res = call(path, "update", f"NodeName={node}", "State=UNDRAIN")
        assert res.returncode == 2 and "not a drain of hetpatrol's" in res.stderr
        res = call(path, "update", f"NodeName={node}", "State=RESUME")
        assert res.returncode == 2
        assert slurm.state() == "drained" and slurm.reason() == "admin: DIMM swap"


@pytest.mark.slurm
def test_real_slurmctld_drain_and_undrain_of_our_own(real_helper):
    """Our own drain goes through and comes back; an admin's reason put over ours in
    between makes it the admin's drain, which the helper then leaves alone."""
    path, slurm = real_helper
    node = slurm.node
    with slurm.explain():
        res = call(path, "update", f"NodeName={node}", "State=DRAIN", "Reason=hetpatrol: x 1")
        assert res.returncode == 0, res.stderr
        slurm.wait_for(lambda line: "drain" in line.split(" ")[1], what="drained")
        assert slurm.reason() == "hetpatrol: x 1"
        # a second drain of ours replaces our own reason: allowed
        res = call(path, "update", f"NodeName={node}", "State=DRAIN", "Reason=hetpatrol: x 2")
        assert res.returncode == 0, res.stderr
        assert slurm.reason() == "hetpatrol: x 2"
        res = call(path, "update", f"NodeName={node}", "State=UNDRAIN")
        assert res.returncode == 0, res.stderr
        slurm.wait_for(lambda line: "drain" not in line, what="undrained")
        assert slurm.reason() == "none"

        call(path, "update", f"NodeName={node}", "State=DRAIN", "Reason=hetpatrol: x 3")
        slurm.admin_drain("admin: keep it out")  # an admin takes the drain over
        res = call(path, "update", f"NodeName={node}", "State=UNDRAIN")
        assert res.returncode == 2, res.stderr
        assert "not a drain of hetpatrol's" in res.stderr
        assert slurm.reason() == "admin: keep it out"


@pytest.mark.slurm
def test_real_slurmctld_drain_without_reason_survives_the_helper(real_helper):
    path, slurm = real_helper
    node = slurm.node
    with slurm.explain():
        slurm.scontrol("update", f"NodeName={node}", "State=DRAIN", "Reason= ")
        res = call(path, "update", f"NodeName={node}", "State=DRAIN", "Reason=hetpatrol: x")
        assert res.returncode == 2 and "drained without a reason" in res.stderr
        res = call(path, "update", f"NodeName={node}", "State=UNDRAIN")
        assert res.returncode == 2
        assert slurm.node_state() == "IDLE+DRAIN"
        assert not slurm.reason().startswith("hetpatrol")


@pytest.mark.slurm
def test_real_slurmctld_keeps_control_characters_raw_so_the_helper_refuses_them(real_helper):
    """slurmctld stores a reason as sent and ``scontrol show node`` prints it raw: an ESC
    or CR in a drain reason reaches the admin's terminal (here set by root directly).
    Through the helper such a reason is refused and the node keeps its state."""
    path, slurm = real_helper
    node = slurm.node
    with slurm.explain():
        slurm.admin_drain("admin: \x1b[31mred\rfake")
        shown = slurm.scontrol("-o", "show", "node", node)  # text mode: the CR reads as \n
        assert "Reason=admin: \x1b[31mred\nfake [root@" in shown
        slurm.make_idle()
        for reason in ("hetpatrol: ok\r\x1b[2Kadmin: DIMM swap", "hetpatrol: \u202etxt"):
            res = call(path, "update", f"NodeName={node}", "State=DRAIN", f"Reason={reason}")
            assert res.returncode == 2 and "control character" in res.stderr, res.stderr
        assert slurm.state() == "idle" and slurm.reason() == "none"


# ------------------------------------- hostile requests (issue 21, item 4): the whole class
REASON = f"update NodeName={NODE} State=DRAIN".split()


@pytest.mark.parametrize(
    ("argv", "why"),
    [
        ([*REASON, "Reason=hetpatrol: x\rNodeName=b"], "control character \\r (U+000D)"),
        ([*REASON, "Reason=hetpatrol: \x1b[2Jok"], "control character \\x1b (U+001B)"),
        ([*REASON, "Reason=hetpatrol: x\x7f"], "(U+007F)"),
        ([*REASON, "Reason=hetpatrol: x\x9b31m"], "(U+009B)"),  # C1 CSI
        ([*REASON, "Reason=hetpatrol: \u202egol"], "(U+202E)"),  # bidi override
        ([*REASON, "Reason=hetpatrol: x\u2028y"], "(U+2028)"),  # line separator
        ([*REASON, "Reason=hetpatrol: x\ud800"], "(U+D800)"),  # lone surrogate
        ([*REASON, "Reason=hetpatrol: x\t"], "(U+0009)"),
        (["update", f"NodeName={NODE}\x1b", "State=UNDRAIN"], "argument 2 holds"),
        (["update", f"NodeName={NODE}", "State=UNDRAIN\r"], "argument 3 holds"),
        (["show", "node", "a\x1b]0;pwned\x07"], "argument 3 holds"),
        ([*REASON, "Reason=hetpatrol: " + "x" * 2000], "at most 1024"),
        (["-o"] * 9 + ["ping"], "10 arguments: at most 8"),
    ],
)
def test_control_characters_and_sizes_in_any_field_are_refused(argv, why):
    with pytest.raises(Refused) as caught:
        check_request(argv, [NODE])
    assert why in str(caught.value)
    assert str(caught.value).isprintable()  # said escaped, never raw


def answer_of(raw: bytes) -> dict:
    from hetpatrol.scontrol_helper import handle

    return handle(raw, nodes=[NODE], scontrol="/nonexistent/scontrol-never-run")


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"[" * 60_000, "nested too deep"),
        (b'{"argv": ' + b"[" * 30_000 + b"]" * 30_000 + b"}", "too deep"),
        (b'{"argv": ["ping"], "argv": ["shutdown"]}', "a key appears twice"),
        (b'{"argv": ["ping"], "run_as": "root"}', "and nothing else"),
        (b'["ping"]', "and nothing else"),
        (b'"ping"', "and nothing else"),
        (b"null", "and nothing else"),
        (b'{"argv": "ping"}', "argv must be a list of strings"),
        (b'{"argv": [1, 2]}', "argv must be a list of strings"),
        (b'{"argv": [["ping"]]}', "argv must be a list of strings"),
        (b'{"argv": ["ping\xff"]}', "not UTF-8 (byte 15)"),
        (b'{"argv": ["\\ud800"]}', "(U+D800)"),
        (b'{"argv": ["ping"]', "not JSON"),
        (b"", "not JSON"),
        (b'{"argv": ["' + b"x" * 70_000 + b'"]}', "longer than 65536 bytes"),
        (b'{"argv": [' + b'"ping",' * 5000 + b'"ping"]}', "5001 arguments"),
    ],
)
def test_malformed_requests_get_an_error_answer_and_run_nothing(raw, why):
    answer = answer_of(raw)
    assert answer["rc"] == 2 and answer["stdout"] == ""
    assert answer["stderr"].startswith("hetpatrol-scontrol: refused: ")
    assert why in answer["stderr"], answer["stderr"]


def test_an_unexpected_error_is_answered_not_raised(monkeypatch):
    import hetpatrol.scontrol_helper as helper

    def boom(argv, nodes):
        raise KeyError("surprise")

    monkeypatch.setattr(helper, "check_request", boom)
    assert answer_of(b'{"argv": ["ping"]}') == {
        "rc": 2,
        "stdout": "",
        "stderr": "hetpatrol-scontrol: refused: internal error on this request: KeyError\n",
    }


def raw_call(path: str, data: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(30)
        s.connect(path)
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = b""
        while chunk := s.recv(65536):
            out += chunk
    return out


@pytest.mark.parametrize(
    ("raw", "why"),
    [
        (b"[" * 60_000 + b"\n", "request is nested too deep"),  # crashed it, no audit line
        (b'{"argv": ["update", "NodeName=gpu-a01", "State=DRAIN", '
         b'"Reason=hetpatrol: ok\\r\\u001b[2Kadmin: DIMM swap"]}\n', "control character \\r"),
        (b"\xff\xfe\n", "request is not UTF-8 (byte 0)"),
        (b"x" * 70_000, "request longer than 65536 bytes"),
        (b"", "request is not JSON"),
    ],
)  # fmt: skip
def test_every_refused_request_is_answered_and_audited(helper_socket, fake_scontrol, raw, why):
    import json

    path, served = helper_socket
    _, calls = fake_scontrol
    answer = json.loads(raw_call(path, raw))
    assert answer["rc"] == 2 and why in answer["stderr"], answer
    deadline = 50
    while not served and deadline:  # the helper's process is reaped by the accept loop
        threading.Event().wait(0.1)
        deadline -= 1
    (audit,) = [line for line in served[-1].stderr.splitlines() if "request=" in line]
    assert f"uid={os.getuid()}" in audit and " rc=2 " in audit and why in audit
    assert audit.isprintable()  # no raw CR or ESC reaches the journal
    assert served[-1].returncode == 0
    assert not calls.exists()  # nothing run, not even the read of the node


@pytest.mark.parametrize(
    ("state", "reason", "allowed"),
    [
        # Slurm's reason after `scontrol reboot ... nextstate=DOWN` completed (22.05.8)
        ("DOWN", "hetpatrol: reboot_node x : reboot issued : reboot complete", True),
        ("DOWN", "hetpatrol: reboot_node x : reboot issued", False),  # not back yet
        ("DOWN+DRAIN+REBOOT_ISSUED", "hetpatrol: x : reboot issued", False),
        ("DOWN", "admin: PSU : reboot complete", False),  # an admin's DOWN
        ("DOWN*", "hetpatrol: x : reboot complete", False),  # not responding
        ("IDLE+DRAIN", "hetpatrol: x : reboot complete", False),  # not DOWN: UNDRAIN's job
        ("DOWN", None, False),
    ],
)
def test_resume_only_after_a_reboot_of_ours(state, reason, allowed):
    from hetpatrol.scontrol_helper import check_node
    from hetpatrol.slurm.gres import find_node

    line = f"NodeName={NODE} State={state}" + (
        f" Reason={reason} [root@2026-12-01T20:27:33]" if reason else ""
    )
    info = find_node(line + "\n", NODE)
    if allowed:
        check_node("resume_reboot", info)
    else:
        with pytest.raises(Refused):
            check_node("resume_reboot", info)


@pytest.mark.parametrize(
    ("state", "reason", "why"),
    [
        ("IDLE+DRAIN", "admin: DIMM swap", "node already has a reason set"),
        ("IDLE+DRAIN", None, "drained without a reason"),
        ("IDLE+RESERVED", None, "no drain in RESERVED"),
        ("DOWN", None, "no drain in DOWN"),
    ],
)
def test_reboot_follows_the_drain_rules(state, reason, why):
    from hetpatrol.scontrol_helper import check_node
    from hetpatrol.slurm.gres import find_node

    line = f"NodeName={NODE} State={state}" + (
        f" Reason={reason} [root@2026-12-01T20:27:33]" if reason else ""
    )
    with pytest.raises(Refused, match=why):
        check_node("reboot", find_node(line + "\n", NODE))
    check_node("reboot", find_node(f"NodeName={NODE} State=MIXED\n", NODE))
