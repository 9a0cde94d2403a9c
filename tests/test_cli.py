"""The command line against hostile input: a tool's escape sequences in ``once``'s
table, bad ``--listen`` flags, a reader that closes stdout early (``| head``)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest
from conftest import HETPATROL, NODES

from hetpatrol.cli import main
from hetpatrol.collector import discover
from hetpatrol.exporters.state import write_state
from hetpatrol.patrol import Patroller


def test_once_table_escapes_a_tools_control_and_bidi_characters(tmp_path):
    tool = tmp_path / "npu-smi"
    tool.write_text(r"#!/bin/sh" "\n" r'printf "\033]0;PWNED\007\033[2J\342\200\256x"' "\nexit 3\n")
    tool.chmod(0o755)
    config = tmp_path / "hetpatrol.yaml"
    config.write_text(
        f'node: n1\ncollectors:\n  nvidia: {{enabled: false}}\n  ascend: {{command: ["{tool}"]}}\n'
    )
    res = subprocess.run(
        [*HETPATROL, "once", "--config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 3, res.stderr
    shown = "\\x1b]0;PWNED\\x07\\x1b[2J\\u202ex"
    lines = [re.sub(r"\d+\.\d{3} s", "T s", line) for line in res.stdout.splitlines()]
    # the other shipped plugins (enabled in the bundled config) are absent on this host
    lines = [line for line in lines if " absent (0 cards" not in line]
    assert lines == [
        "node n1  UNKNOWN   action watch   exit 3",
        "no card was read",
        "",
        "collectors:",
        "  ascend failed (0 cards, T s): see the node findings",
        "  nvidia disabled (0 cards, T s)",
        "  absent: hygon, amd, cambricon, gaudi, iluvatar, kunlunxin, enflame (-v: why)",
        "node findings:",
        f"  unknown collector_failed: ascend: npu-smi info exited with code 3: "
        f"npu-smi info: output: {shown}",
        "    action watch: kept in service and watched, no drain",
    ]


@pytest.mark.parametrize(
    ("listen", "why"),
    [
        ("bogus", "'bogus' is not host:port"),
        ("127.0.0.1:99999", "port 99999 is out of range"),
    ],
)
def test_a_bad_listen_flag_is_a_usage_error(capsys, listen, why):
    with pytest.raises(SystemExit) as caught:
        main(["run", "--listen", listen])
    assert caught.value.code == 64
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"hetpatrol run: error: argument --listen: {why}"
    )


def test_a_bad_listen_in_the_config_file_stays_a_config_error(tmp_path, capsys):
    config = tmp_path / "hetpatrol.yaml"
    config.write_text("listen: 127.0.0.1:99999\n")
    assert main(["run", "--config", str(config)]) == 78


def _into_a_closed_pipe(*args: str) -> tuple[int, str]:
    """Run ``hetpatrol`` with stdout a pipe whose reader has already gone."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        res = subprocess.run(
            [*HETPATROL, *args], stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=60
        )
    finally:
        os.close(write_end)
    return res.returncode, res.stderr


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("schema",), 0),
        (("once", "--replay", str(NODES / "sick-mixed")), 2),
        (("once", "--replay", str(NODES / "sick-mixed"), "--format", "json"), 2),
        (("once", "--replay", str(NODES / "sick-mixed"), "--format", "jsonl"), 2),
    ],
)
def test_a_closed_stdout_keeps_the_commands_exit_code(args, code):
    assert _into_a_closed_pipe(*args) == (code, "")


def test_check_and_status_into_a_closed_stdout_keep_the_verdict(tmp_path, base_config):
    from dataclasses import replace

    patroller = Patroller(replace(base_config, node="n1"), replay_dir=NODES / "sick-mixed")
    try:
        report = patroller.run()
    finally:
        patroller.close()
    path = tmp_path / "state.json"
    write_state(path, report, 10)
    assert json.loads(path.read_text())["health"] == "critical"
    assert _into_a_closed_pipe("check", "--state-path", str(path)) == (2, "")
    assert _into_a_closed_pipe("status", "--state-path", str(path)) == (2, "")


def test_validate_config_refuses_a_collector_no_plugin_provides(tmp_path, capsys):
    """`nvidai` passed as ok; the daemon then reported it failed every patrol."""
    path = tmp_path / "hetpatrol.yaml"
    path.write_text("node: a\ncollectors:\n  nvidia: {}\n  nvidai: {}\n")
    assert main(["validate-config", str(path)]) == 78
    assert capsys.readouterr().err == (
        f"hetpatrol: configuration error: {path}:4: collectors.nvidai: no collector plugin "
        f"named 'nvidai' is installed (did you mean 'nvidia'?) "
        f"(installed: {', '.join(sorted(discover()))})\n"
    )
    path.write_text("node: a\ncollectors:\n  nvidia: {}\n  nvidai: {enabled: false}\n")
    assert main(["validate-config", str(path)]) == 0


def test_a_taken_metrics_port_exits_1_with_a_plain_message(tmp_path):
    """No "[Errno 98]" noise: the address and why, for the journal and the operator."""
    import socket

    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        proc = subprocess.run(
            [
                *HETPATROL,
                "run",
                "--replay",
                str(NODES / "healthy-mixed"),
                "--listen",
                f"127.0.0.1:{port}",
                "--jsonl-path",
                str(tmp_path / "patrol.jsonl"),
                "--state-path",
                str(tmp_path / "state.json"),
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert proc.returncode == 1
    assert proc.stderr.splitlines()[-1] == (
        f"hetpatrol: cannot serve metrics on 127.0.0.1:{port}: Address already in use"
    )


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "86401", "ten"])
def test_run_interval_out_of_range_is_runs_own_usage_error(value, capsys):
    with pytest.raises(SystemExit) as exc:
        main(["run", "--interval", value])
    assert exc.value.code == 64
    err = capsys.readouterr().err
    assert err.startswith("usage: hetpatrol run ")
    assert "argument --interval" in err and "(0, 86400]" in err


@pytest.mark.parametrize("command", [[], ["check"], ["status"], ["run"], ["once"]])
def test_help_is_plain_text_with_help_for_every_option(command, capsys):
    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "``" not in out and ":func:" not in out


def test_every_commands_help_is_plain_text():
    """Every command and subcommand: no reStructuredText markup (a docstring's ````x````,
    as ``epilog`` and ``gres-conf`` showed) in its ``--help``."""
    import argparse

    from hetpatrol.cli import build_parser

    def walk(parser, path):
        yield path, parser
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, p in a.choices.items():
                    yield from walk(p, [*path, name])

    for path, parser in walk(build_parser(), []):
        text = parser.format_help()
        assert "``" not in text and ":func:" not in text, f"hetpatrol {' '.join(path)} --help"
        # an installed package has docs/ and no source tree to read: the top-level help
        # sent the reader to hetpatrol/safe_files.py for the refused paths
        assert not re.search(r"\S+\.py\b", text), f"hetpatrol {' '.join(path)} --help"


def test_every_command_says_what_it_does_in_its_help(capsys):
    """``hetpatrol schema --help`` (and validate-config's, the ledger's usage, audit,
    quota, spans, efficiency, history show / clear) printed its usage and options alone:
    every command and subcommand has a description, as ``once`` has. ``prolog`` and
    ``task-prolog`` hand ``--help`` to their own parsers, which have theirs."""
    import argparse

    from hetpatrol.cli import build_parser

    def walk(parser, path):
        yield path, parser
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, p in a.choices.items():
                    yield from walk(p, [*path, name])

    bare = [
        " ".join(path)
        for path, parser in walk(build_parser(), [])
        if not parser.description and path not in (["prolog"], ["task-prolog"])
    ]
    assert bare == []
    for argv, said in (
        (["schema"], "Print the JSON Schema (draft 2020-12) that every line"),
        (["prolog"], "Slurm Prolog: fail (drain + requeue)"),
        (["task-prolog"], "Slurm TaskProlog: print 'export VAR=ids'"),
    ):
        from hetpatrol.entry import main as entry_main  # the installed command's

        try:
            entry_main([*argv, "--help"])
        except SystemExit as exc:
            assert exc.code == 0
        assert said in " ".join(capsys.readouterr().out.split()), argv


def test_audit_slurms_summary_says_its_exit_3():
    """The top-level list says audit-slurm's exit codes as its own --help does: 3 when a
    source cannot be read."""
    from hetpatrol.cli import build_parser

    top = " ".join(build_parser().format_help().split())
    assert "mixed cluster; exit 0/1/2/3" in top


def test_every_option_of_every_command_has_help():
    import argparse

    from hetpatrol.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, command in [("hetpatrol", parser), *sub.choices.items()]:
        for action in command._actions:
            if isinstance(action, argparse._SubParsersAction):
                continue
            assert action.help, f"{name} {action.option_strings or action.dest}: no help"


def test_every_help_fits_80_columns(monkeypatch):
    """``--help`` of every command and subcommand at COLUMNS=80: argparse wraps the
    descriptions (no single 300-character line), the paragraphs of the top level kept."""
    import argparse

    from hetpatrol.cli import build_parser

    def walk(parser, path):
        yield path, parser
        for a in parser._actions:
            if isinstance(a, argparse._SubParsersAction):
                for name, p in a.choices.items():
                    yield from walk(p, [*path, name])

    monkeypatch.setenv("COLUMNS", "80")  # argparse's width (shutil.get_terminal_size)
    commands = list(walk(build_parser(), []))
    assert len(commands) > 20  # every subcommand of ledger, too
    for path, parser in commands:
        long = [line for line in parser.format_help().splitlines() if len(line) > 80]
        assert not long, f"hetpatrol {' '.join(path)} --help: {long[0]!r}"
    top = commands[0][1].format_help()
    assert "command line.\n\nHealth, placement" in top  # the docstring's paragraphs


def test_version(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["--version"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("hetpatrol 0.")


def test_run_parses_without_importing_the_other_commands():
    """The daemon's memory holds what ``run`` needs: the fleet, audit, status, check,
    epilog and ledger modules are imported only for their own subcommands."""
    code = (
        "import sys\n"
        "from hetpatrol.cli import build_parser\n"
        "args = build_parser(only='run').parse_args(['run', '--interval', '5'])\n"
        "others = ('hetpatrol.cluster', 'hetpatrol.ledger', 'hetpatrol.status_view',\n"
        "          'hetpatrol.healthcheck', 'hetpatrol.slurm.epilog', 'hetpatrol.node_view')\n"
        "print(args.interval, sorted({m for m in sys.modules if m.startswith(others)}))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split(" ", 1) == ["5.0", "[]\n"]


def test_a_usage_error_of_run_lists_every_command():
    """``run`` parses with its own subcommand alone; its top-level usage errors are said
    with the full parser all the same (exit 64), and ``--help run`` is the full help."""
    res = subprocess.run(
        [sys.executable, "-m", "hetpatrol.cli", "run", "--bogus"], capture_output=True, text=True
    )
    assert res.returncode == 64
    assert res.stderr.startswith("usage: hetpatrol [-h]") and " COMMAND ..." in res.stderr
    assert res.stderr.rstrip().endswith("error: unrecognized arguments: --bogus")
    assert res.stderr.count("usage:") == 1
    res = subprocess.run(
        [sys.executable, "-m", "hetpatrol.cli", "--help", "run"], capture_output=True, text=True
    )
    assert res.returncode == 0 and "audit-slurm" in res.stdout
    # each command is listed once, in the commands section
    assert res.stdout.count("\n    audit-slurm ") == 1 and "Commands:" not in res.stdout
    res = subprocess.run(
        [sys.executable, "-m", "hetpatrol.cli", "bogus"], capture_output=True, text=True
    )
    assert res.returncode == 64
    assert "invalid choice: 'bogus' (choose from 'run', 'once'," in res.stderr
    assert "'audit-slurm'" in res.stderr and "'doctor'" in res.stderr
