"""The privileged drain path: a minimal root helper for ``scontrol``, reached over a socket.

The daemon runs as the unprivileged user ``hetpatrol`` with ``NoNewPrivileges=yes`` (so
no sudo), but draining a node (``scontrol update NodeName=N State=DRAIN``) needs root or
the SlurmUser. Instead of running the whole daemon as root, a deployment points the
config's ``slurm.scontrol`` argv prefix at the client of this module::

    slurm:
      scontrol: ["/usr/local/bin/hetpatrol-scontrol"]

The client forwards its arguments over ``/run/hetpatrol-scontrol.sock`` (a systemd socket
unit, mode 0660, group ``hetpatrol``; ``Accept=yes``), and systemd starts one root
``hetpatrol-scontrol@.service`` per connection that runs this module with ``--serve``: it
reads one request, checks it, runs the real ``scontrol`` and sends back its exit code,
stdout and stderr, so the caller sees exactly what ``scontrol`` would have printed.

The helper accepts only what hetpatrol needs, whatever the caller asks:

- read-only: ``show node[s] [NAME]`` (with ``-o``/``--oneliner``/``-d``), ``ping``,
  ``--version``;
- ``update NodeName=<this node> State=DRAIN Reason=hetpatrol:...``: only this node
  (``slurm.node_name``, else ``node`` of ``/etc/hetpatrol/hetpatrol.yaml``), only with
  hetpatrol's reason prefix, and only while the node has no reason of anyone else's
  (and is not drained without a reason);
- ``update NodeName=<this node> State=UNDRAIN``: only while the node is drained with a
  reason that starts with hetpatrol's prefix;
- ``reboot ASAP nextstate=DOWN reason=hetpatrol:... <this node>`` (``slurm.drain.reboot``):
  under the drain's rules (no reason of anyone else's, a state the table drains in);
- ``update JobId=<n> AdminComment=<v>`` (``slurm.admin_comment``): only for a job that
  ran on this node, and only when ``v`` keeps the job's current AdminComment and appends
  one ``hetpatrol:`` note (both read from the job alone: ``squeue --jobs=<n>
  --Format=JobID:|,NodeList:|,admin_comment:0``, one single-job RPC);
- ``update NodeName=<this node> State=RESUME``: only while the node is DOWN, with no
  flag, after a reboot hetpatrol asked for (its reason ends in Slurm's ``: reboot
  complete``; :func:`hetpatrol.slurm.states.rebooted_by_us`). ``RESUME`` of any other
  node is refused: it would bring up a node Slurm or an admin set DOWN.

Both also only in a Slurm state the daemon would act in (:mod:`hetpatrol.slurm.states`):
the helper applies the daemon's rules itself, for every request, reading the node's
state and reason (``scontrol -o show node``) right before the update. So neither a bug
nor a compromised ``hetpatrol`` user can replace or clear an admin's drain.

What is left: ``scontrol update`` has no conditional form (no "only if the reason is
still X"; ``update_node()`` in 22.05), so a reason an admin sets in the moment between
that read and the update (one ``scontrol`` round trip, milliseconds) is replaced by a
drain, or cleared by an undrain. ``UNDRAIN`` rather than
``RESUME`` keeps even that to the DRAIN flag: ``RESUME`` would also clear FAIL and the
REBOOT flags and bring a DOWN node up (``update_node()`` in Slurm's
``src/slurmctld/node_mgr.c``).

Anything else is refused (exit code 2, nothing run): also an argument with a control
character (CR, ESC, DEL, C1, bidi controls: anything :meth:`str.isprintable` refuses) or
longer than :data:`MAX_ARG_CHARS`, more than :data:`MAX_ARGS` arguments, and a request
that is not one UTF-8 JSON object ``{"argv": [...]}`` of at most :data:`MAX_REQUEST`
bytes (nested too deep, a key twice, other keys, wrong types). Requests are one JSON line
``{"argv": [...]}``; answers one JSON line ``{"rc", "stdout", "stderr"}``. Every request,
answered or refused, gets one audit line on stderr (the journal): peer credentials, the
request's first 300 bytes escaped, the exit code and, when refused, why.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hetpatrol.slurm.gres import NodeInfo

DEFAULT_SOCKET = "/run/hetpatrol-scontrol.sock"
DEFAULT_CONFIG = "/etc/hetpatrol/hetpatrol.yaml"
DEFAULT_SCONTROL = "/usr/bin/scontrol"
MAX_REQUEST = 64 * 1024
#: most arguments a request may have (``-o show node NAME`` and ``update NodeName=
#: State= Reason=`` take four)
MAX_ARGS = 8
#: most characters one argument may have (the daemon's reasons are 200: REASON_MAX)
MAX_ARG_CHARS = 1024
EXIT_REFUSED = 2
EXIT_UNREACHABLE = 1

_READ_FLAGS = {"-o", "--oneliner", "-d", "--details", "-a", "--all"}
_DRAIN_STATES = {"DRAIN"}
_RESUME_STATES = {"UNDRAIN"}
#: RESUME only for a node DOWN after the reboot hetpatrol asked for (check_node)
_REBOOT_RESUME_STATES = {"RESUME"}


class Refused(Exception):
    """A request the helper does not run; ``str()`` says why."""


def printable(text: str) -> str:
    """``text`` with every character :meth:`str.isprintable` refuses (C0 and C1 controls
    such as CR and ESC, DEL, bidi and other format characters, line separators,
    surrogates) written as a Python escape (``\\x1b``): safe in the journal and in an
    answer shown on a terminal."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def check_argument(index: int, arg: str) -> None:
    """Refuse an argument slurmctld would store or print as sent, but nobody should see
    raw: any character :meth:`str.isprintable` refuses (a CR or ESC in a reason rewrites
    the line ``scontrol show node`` and ``sinfo -R`` print on an admin's terminal; a
    newline forges a second line; a lone surrogate cannot even be passed to ``exec``),
    or one longer than :data:`MAX_ARG_CHARS`. Raises :class:`Refused` naming the
    argument and the first such character."""
    if len(arg) > MAX_ARG_CHARS:
        raise Refused(f"argument {index + 1} has {len(arg)} characters: at most {MAX_ARG_CHARS}")
    bad = next((c for c in arg if not c.isprintable()), None)
    if bad is not None:
        raise Refused(
            f"argument {index + 1} holds the control character {repr(bad)[1:-1]} "
            f"(U+{ord(bad):04X}): {printable(arg)!r}"
        )


def check_request(argv: Sequence[str], nodes: Sequence[str]) -> tuple[str, str | None]:
    """Classify ``argv`` (scontrol arguments). Returns (kind, node) with kind ``read``,
    ``drain`` or ``resume``; raises :class:`Refused` for anything else: wrong types, more
    than :data:`MAX_ARGS` arguments, control characters (:func:`check_argument`),
    another command or node."""
    if not isinstance(argv, list | tuple) or not all(isinstance(a, str) for a in argv):
        raise Refused("argv must be a list of strings")
    if len(argv) > MAX_ARGS:
        raise Refused(f"{len(argv)} arguments: at most {MAX_ARGS}")
    for i, arg in enumerate(argv):
        check_argument(i, arg)
    words = [a for a in argv if a not in _READ_FLAGS]
    flags = [a for a in argv if a in _READ_FLAGS]
    if words in (["--version"], ["-V"], ["ping"]) and not flags:
        return "read", None
    if len(words) in (2, 3) and words[0] == "show" and words[1] in ("node", "nodes"):
        return "read", None
    if words and words[0] == "reboot" and not flags:
        return _check_reboot(words, nodes)
    if len(words) == 3 and words[0] == "update" and not flags:
        key, _, job = words[1].partition("=")
        akey, asep, _value = words[2].partition("=")
        if key.lower() == "jobid" and akey.lower() == "admincomment" and asep:
            if not (job.isascii() and job.isdigit()):
                raise Refused(f"JobId={job!r} is not a job number")
            return "admin_comment", job
    if not words or words[0] != "update" or flags:
        raise Refused(f"only 'show node', 'ping' and drain/resume of this node: {list(argv)}")
    fields: dict[str, str] = {}
    for word in words[1:]:
        key, sep, value = word.partition("=")
        key = key.lower()
        if not sep or key not in ("nodename", "state", "reason") or key in fields:
            raise Refused(f"update takes NodeName=, State= and Reason= once each: {word!r}")
        fields[key] = value
    node = fields.get("nodename")
    if not node or node not in nodes:
        known = ", ".join(printable(n) for n in nodes) or "none known"
        raise Refused(f"NodeName={node} is not this node ({known})")
    state = fields.get("state", "").upper()
    if state in _DRAIN_STATES:
        from hetpatrol.slurm.states import REASON_PREFIX

        if not fields.get("reason", "").startswith(REASON_PREFIX):
            raise Refused(f"a drain reason must start with {REASON_PREFIX!r}")
        return "drain", node
    if state in _RESUME_STATES | _REBOOT_RESUME_STATES:
        if "reason" in fields:
            raise Refused("a resume takes no Reason=")
        return ("resume" if state in _RESUME_STATES else "resume_reboot"), node
    raise Refused(f"State={fields.get('state')} is neither DRAIN, UNDRAIN nor RESUME")


def _check_reboot(words: Sequence[str], nodes: Sequence[str]) -> tuple[str, str | None]:
    """The one reboot form the daemon sends (:func:`hetpatrol.slurm.drain.reboot_args`):
    ``reboot ASAP nextstate=DOWN reason=hetpatrol:... <this node>``; anything else
    (``ALL``, another node, ``nextstate=RESUME``, no ``ASAP``, a reason not ours) is
    refused."""
    from hetpatrol.slurm.states import REASON_PREFIX

    if len(words) != 5 or words[1] != "ASAP" or words[2] != "nextstate=DOWN":
        raise Refused(f"a reboot must be 'reboot ASAP nextstate=DOWN reason=... NODE': {words}")
    key, _, reason = words[3].partition("=")
    if key != "reason" or not reason.startswith(REASON_PREFIX):
        raise Refused(f"a reboot reason must be reason={REASON_PREFIX}...")
    node = words[4]
    if node not in nodes:
        known = ", ".join(printable(n) for n in nodes) or "none known"
        raise Refused(f"reboot of {node} is not of this node ({known})")
    return "reboot", node


def allowed_nodes(config_path: str | None) -> list[str]:
    """This node's Slurm NodeName from the hetpatrol config (``slurm.node_name`` or
    ``node``, which defaults to the short host name)."""
    from hetpatrol.config import load_config

    config = load_config(config_path)
    slurm = getattr(config, "slurm", None)
    name = getattr(slurm, "node_name", None) if slurm is not None else None
    return [name or config.node]


def _run(cmd: list[str], timeout: float) -> dict[str, Any]:
    try:
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        return {"rc": 124, "stdout": "", "stderr": f"{cmd[0]}: timed out after {timeout:g} s\n"}
    except OSError as exc:
        return {"rc": 127, "stdout": "", "stderr": f"{cmd[0]}: {exc}\n"}
    return {"rc": res.returncode, "stdout": res.stdout, "stderr": res.stderr}


def _current(scontrol: str, node: str, timeout: float) -> NodeInfo:
    """The node's state and reason as slurmctld has them now."""
    from hetpatrol.slurm.gres import find_node

    res = _run([scontrol, "-o", "show", "node", node], timeout)
    if res["rc"] != 0:
        raise Refused(f"cannot read the node's state and reason: {res['stderr'].strip()}")
    info = find_node(res["stdout"], node)
    if info is None:
        raise Refused(f"scontrol does not know node {node}")
    return info


def check_node(kind: str, info: NodeInfo) -> None:
    """The daemon's rules, on the node as it is now: :class:`Refused` when ``kind``
    (``drain`` or ``resume``) would replace or clear a reason hetpatrol did not set, or
    act in a Slurm state hetpatrol does not act in."""
    from hetpatrol.slurm.states import DRAIN, RESUME, foreign_reason, may, ours, rebooted_by_us

    if kind == "resume_reboot":
        why = rebooted_by_us(info)
        if why is not None:
            raise Refused(f"node {info.name}: not DOWN after hetpatrol's reboot ({why}): no RESUME")
        return
    if kind in ("drain", "reboot"):
        why = foreign_reason(info)
        if why is not None:
            raise Refused(f"node {info.name}: {why}")
    elif not (info.drained and ours(info.reason)):
        raise Refused(
            f"node {info.name} state {info.state} reason {info.reason!r} is not a drain of "
            "hetpatrol's: not resumed"
        )
    why = may(info, DRAIN if kind in ("drain", "reboot") else RESUME)
    if why is not None:
        raise Refused(f"node {info.name}: {why}")


def _check_admin_comment(
    scontrol: str, job: str, value: str, nodes: Sequence[str], timeout: float
) -> None:
    """:class:`Refused` unless ``job`` ran on this node and ``value`` is its current
    AdminComment with one hetpatrol note appended: the job read alone (one
    ``REQUEST_JOB_INFO_SINGLE``: :func:`hetpatrol.slurm.admin_comment.job_on_node_argv`,
    its number, host list and AdminComment only), judged by
    :func:`hetpatrol.slurm.admin_comment.check_append`."""
    from hetpatrol.slurm.admin_comment import check_append, job_on_node_argv, parse_job_note

    res = _run(job_on_node_argv(scontrol, job), timeout)
    if res["rc"] != 0:
        raise Refused(f"cannot read job {job}: {res['stderr'].strip()[-300:]}")
    record = parse_job_note(res["stdout"], job)
    if isinstance(record, str):
        raise Refused(f"job {job}: {record}")
    reasons = [check_append(record, n, value) for n in nodes]
    if not nodes or all(r is not None for r in reasons):
        why = next((r for r in reasons if r), "no node known")
        raise Refused(f"AdminComment of job {job}: {why}")


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise Refused("a key appears twice in the request")
    return dict(pairs)


def parse_request(request: bytes) -> list[str]:
    """The argv of one request: the bytes of one JSON line ``{"argv": [...]}``, at most
    :data:`MAX_REQUEST` bytes, UTF-8, an object with that one key. Raises
    :class:`Refused` saying what is wrong (also for JSON nested too deep, which makes
    the decoder raise RecursionError)."""
    if len(request) > MAX_REQUEST:
        raise Refused(f"request longer than {MAX_REQUEST} bytes")
    try:
        text = request.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(f"request is not UTF-8 (byte {exc.start})") from None
    try:
        doc = json.loads(text, object_pairs_hook=_unique_keys)
    except RecursionError:
        raise Refused("request is nested too deep") from None
    except ValueError as exc:
        raise Refused(f"request is not JSON: {exc}") from None
    if not isinstance(doc, dict) or set(doc) != {"argv"}:
        raise Refused('the request must be {"argv": [...]}, and nothing else')
    argv = doc["argv"]
    if not isinstance(argv, list):
        raise Refused("argv must be a list of strings")
    return argv


def _refused(why: str) -> dict[str, Any]:
    return {"rc": EXIT_REFUSED, "stdout": "", "stderr": f"hetpatrol-scontrol: refused: {why}\n"}


def handle(
    request: bytes, *, nodes: Sequence[str], scontrol: str, timeout: float = 30.0
) -> dict[str, Any]:
    """Answer one request (the bytes of one JSON line, see :func:`parse_request`).
    Never raises: a request that is refused, or that the helper fails on, is answered
    with exit code :data:`EXIT_REFUSED` and nothing run."""
    try:
        argv = parse_request(request)
        kind, node = check_request(argv, nodes)
        if kind == "admin_comment":
            assert node is not None  # the job id
            _check_admin_comment(scontrol, node, argv[-1].partition("=")[2], nodes, timeout)
        if kind in ("drain", "resume", "reboot", "resume_reboot"):
            assert node is not None
            check_node(kind, _current(scontrol, node, timeout))
    except Refused as exc:
        return _refused(printable(str(exc)))
    except Exception as exc:  # noqa: BLE001 - a request must never crash the helper unheard
        return _refused(f"internal error on this request: {type(exc).__name__}")
    return _run([scontrol, *argv], timeout)


def _peer(sock: socket.socket) -> str:
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        pid, uid, gid = struct.unpack("3i", creds)
        return f"pid={pid} uid={uid} gid={gid}"
    except OSError:
        return "peer unknown"


def serve(args: Sequence[str]) -> int:
    """Root side (``--serve``): stdin/stdout are the connection systemd accepted."""
    import argparse

    p = argparse.ArgumentParser(prog="hetpatrol-scontrol --serve")
    p.add_argument("--config", default=DEFAULT_CONFIG)
    p.add_argument("--scontrol", default=DEFAULT_SCONTROL)
    p.add_argument("--node", action="append", default=None, help="allowed NodeName")
    p.add_argument("--timeout", type=float, default=30.0)
    opts = p.parse_args(args)
    conn = socket.socket(fileno=os.dup(0))
    data = b""
    answer = _refused("no request read")
    try:
        try:
            while b"\n" not in data and len(data) <= MAX_REQUEST:
                chunk = conn.recv(4096)
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            answer = _refused(f"reading the request failed: {exc.strerror or exc}")
        else:
            line = data.split(b"\n", 1)[0]
            if len(line) > MAX_REQUEST:  # read no further: refused without a decode
                answer = _refused(f"request longer than {MAX_REQUEST} bytes")
            else:
                try:
                    nodes = opts.node or allowed_nodes(opts.config)
                except Exception as exc:  # noqa: BLE001 - answer the caller, log the cause
                    nodes = []
                    print(
                        f"hetpatrol-scontrol: cannot read {opts.config}: {printable(str(exc))}",
                        file=sys.stderr,
                    )
                answer = handle(line, nodes=nodes, scontrol=opts.scontrol, timeout=opts.timeout)
    finally:
        # the audit line, for every request, whatever became of it: the peer, the
        # request's first bytes (repr: no raw control byte reaches the journal), the
        # exit code, and why it was refused
        print(
            f"hetpatrol-scontrol: {_peer(conn)} request={data[:300]!r} rc={answer['rc']}"
            + (f" {answer['stderr'].strip()}" if answer["rc"] == EXIT_REFUSED else ""),
            file=sys.stderr,
            flush=True,
        )
    try:
        conn.sendall(json.dumps(answer).encode() + b"\n")
        conn.shutdown(socket.SHUT_WR)
    except OSError:  # the caller has gone: the audit line is written already
        pass
    finally:
        conn.close()
    return 0


def client(argv: Sequence[str], socket_path: str | None = None) -> int:
    """Unprivileged side: forward ``argv`` and behave like scontrol (same rc and output)."""
    path = socket_path or os.environ.get("HETPATROL_SCONTROL_SOCKET") or DEFAULT_SOCKET
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(120)
            s.connect(path)
            s.sendall(json.dumps({"argv": list(argv)}).encode() + b"\n")
            data = b""
            while chunk := s.recv(65536):
                data += chunk
        answer = json.loads(data.decode())
    except (OSError, ValueError) as exc:
        print(f"hetpatrol-scontrol: {path}: {exc}", file=sys.stderr)
        return EXIT_UNREACHABLE
    sys.stdout.write(answer.get("stdout", ""))
    sys.stderr.write(answer.get("stderr", ""))
    return int(answer.get("rc", EXIT_UNREACHABLE))


def main(argv: Sequence[str] | None = None) -> int:
    """``hetpatrol-scontrol [--socket=PATH] SCONTROL-ARGS...`` or ``--serve [...]``."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--serve"]:
        return serve(args[1:])
    socket_path = None
    if args and args[0].startswith("--socket="):
        socket_path = args.pop(0).split("=", 1)[1]
    return client(args, socket_path)


if __name__ == "__main__":
    sys.exit(main())
