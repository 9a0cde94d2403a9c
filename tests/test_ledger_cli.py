"""``hetpatrol ledger`` as a new user meets it: the shipped sample
(fixtures/ledger-sample/, recorded by tests/record_ledger_sample.py) read by ``usage``,
``spans`` and ``quota`` as well as ``capacity``; saved sacct output read by its header;
errors of a host without Slurm's configuration; the wording of quota and capacity.

Figures read off the sample by hand (tests/test_ledger_capacity.py has the derivation):
A100 card-seconds physics 8 x 5 + 6 x 4 = 64, chemistry 4 x 4 = 16; 910B chemistry
2 x 2 + 1 x 2 = 6; six records (five jobs and the pending H100 job); drained by an admin
20:02:09..20:02:12 (3 s x 8 cards = 24 card-seconds, 0.007 h), by hetpatrol 4 s x 8 = 32
(0.009 h).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import HETPATROL, REPO, require_program

from hetpatrol.ledger.capacity import CAPACITY_FIELDS
from hetpatrol.ledger.sacct_stream import FIELDS

SAMPLE = REPO / "fixtures" / "ledger-sample"
START, END = (SAMPLE / "window.txt").read_text().split()
WINDOW = ["--start", START, "--end", END]
NODES = ["--nodes-file", str(SAMPLE / "nodes.txt")]


def ledger(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([*HETPATROL, "ledger", *args], capture_output=True, text=True,
                          timeout=120, env=env)  # fmt: skip


def usage_json(sacct: Path, *extra: str) -> dict:
    res = ledger("usage", "--sacct-file", str(sacct), *NODES, *WINDOW, "--format", "json",
                 *extra)  # fmt: skip
    assert res.returncode == 0, res.stderr
    return json.loads(res.stdout)


def seconds(doc: dict) -> dict[tuple[str, str], float]:
    return {(r["account"], r["gres"]): r["card_seconds"] for r in doc["rows"]}


def test_usage_reads_the_capacity_sample_and_its_node_list():
    doc = usage_json(SAMPLE / "sacct.txt")
    assert doc["records"] == 6
    assert seconds(doc) == {
        ("physics", "gpu:a100"): 64,
        ("chemistry", "gpu:a100"): 16,
        ("chemistry", "ascend:910b"): 6,
    }


def test_saved_sacct_is_read_by_its_header_in_any_order(tmp_path):
    # the sample's fields as `sacct -P -o <another order>` without -n prints them: the
    # header names the fields, the values move with it
    order = list(reversed(CAPACITY_FIELDS))
    at = [CAPACITY_FIELDS.index(f) for f in order]
    lines = [line.split("|") for line in (SAMPLE / "sacct.txt").read_text().splitlines()]
    saved = tmp_path / "sacct.txt"
    saved.write_text("\n".join("|".join(r) for r in [order, *([p[i] for i in at]
                               for p in lines)]) + "\n")  # fmt: skip
    assert seconds(usage_json(saved)) == seconds(usage_json(SAMPLE / "sacct.txt"))
    # a header without a field the ledger needs: said which, with the -o to use
    saved.write_text("JobIDRaw|User|Account\n1|u|a\n")
    res = ledger("usage", "--sacct-file", str(saved), "--no-node-types", *WINDOW)
    assert res.returncode == 65
    assert "a header without JobID,Partition,QOS,NodeList" in res.stderr
    assert f"-o {','.join(FIELDS)}" in res.stderr


def test_a_line_of_no_known_layout_says_what_is_expected(tmp_path):
    saved = tmp_path / "sacct.txt"
    saved.write_text("1|2|3\n")
    res = ledger("usage", "--sacct-file", str(saved), "--no-node-types", *WINDOW)
    assert res.returncode == 65
    assert "sacct line 1: 3 fields, expected 13 fields (JobIDRaw,JobID," in res.stderr
    assert "or 15 (those, ReqTRES,TimelimitRaw: ledger capacity's)" in res.stderr
    assert "or a header line naming them (sacct -P without -n)" in res.stderr


def test_spans_reads_the_sample():
    res = ledger("spans", "--sacct-file", str(SAMPLE / "sacct.txt"), *NODES, *WINDOW)
    assert (res.returncode, res.stdout) == (0, "ok: no job ran on nodes of two card classes\n")


def test_quota_shows_a_use_below_the_limit_below_it(tmp_path):
    qf = tmp_path / "q.yaml"
    qf.write_text("quotas:\n  - {account: physics, gres: gpu:a100, card_hours: 0.02}\n")
    res = ledger("quota", "--sacct-file", str(SAMPLE / "sacct.txt"), *NODES, *WINDOW,
                 "--quota-file", str(qf))  # fmt: skip
    assert res.returncode == 1, res.stderr  # 64 / 72 card-seconds: 89 %, a warning
    # used below the limit reads below it: 0.0178 card-hours is 0.018, not 0.02
    assert res.stdout.splitlines()[1].split() == [
        "physics", "-", "gpu:a100", "card_hours", "0.018", "0.02", "card_hours", "89%",
        "warning",
    ]  # fmt: skip


def test_quota_shows_a_small_use_above_zero(tmp_path):
    # chemistry's A100 time: 4 cards x 4 s = 16 card-seconds, 0.0044 card-hours, 89 % of
    # 0.005; two decimals read "0.00" beside "89%"
    qf = tmp_path / "q.yaml"
    qf.write_text("quotas:\n  - {account: chemistry, gres: gpu:a100, card_hours: 0.005}\n")
    res = ledger("quota", "--sacct-file", str(SAMPLE / "sacct.txt"), *NODES, *WINDOW,
                 "--quota-file", str(qf))  # fmt: skip
    assert res.returncode == 1, res.stderr
    assert res.stdout.splitlines()[1].split() == [
        "chemistry", "-", "gpu:a100", "card_hours", "0.004", "0.005", "card_hours", "89%",
        "warning",
    ]  # fmt: skip


def test_capacity_reads_a_header_in_its_own_order_and_refuses_another(tmp_path):
    saved = tmp_path / "sacct.txt"
    body = (SAMPLE / "sacct.txt").read_text()
    saved.write_text("|".join(CAPACITY_FIELDS) + "\n" + body)
    args = ["capacity", "--sacct-file", str(saved), *NODES, "--events-file",
            str(SAMPLE / "events.txt"), "--no-sreport", *WINDOW, "--format", "json"]  # fmt: skip
    res = ledger(*args)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["records"] == 6
    saved.write_text("|".join(reversed(CAPACITY_FIELDS)) + "\n" + body)
    res = ledger(*args)
    assert res.returncode == 65
    assert "a header other than JobIDRaw,JobID," in res.stderr


def test_capacity_names_drains_by_others():
    res = ledger("capacity", "--sacct-file", str(SAMPLE / "sacct.txt"), *NODES, "--events-file",
                 str(SAMPLE / "events.txt"), "--no-sreport", *WINDOW, "--by", "minute")  # fmt: skip
    assert res.returncode == 0, res.stderr
    lines = res.stdout.splitlines()
    assert "  down 0.000, drained by others 0.007, drained by hetpatrol 0.009 card-hours" in lines


def test_html_without_matplotlib_prints_the_table_and_says_how_to_install(tmp_path):
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"  # as an install without the extra
        "from hetpatrol.cli import main; sys.exit(main(sys.argv[1:]))\n"
    )
    page = tmp_path / "capacity.html"
    res = subprocess.run(
        [sys.executable, "-c", code, "ledger", "capacity", "--sacct-file",
         str(SAMPLE / "sacct.txt"), *NODES, "--events-file", str(SAMPLE / "events.txt"),
         "--no-sreport", *WINDOW, "--html", str(page)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert res.returncode == 69
    assert any(line.split()[:2] == ["gpu:h100", "4"] for line in res.stdout.splitlines())
    assert "pip install -e '.[report]'" in res.stderr
    assert "pip install 'hetpatrol[report]'" in res.stderr
    assert not page.exists()


#: what Debian 12's scontrol (Slurm 22.05.8) prints on a host with no slurm.conf and no
#: DNS SRV record (recorded on the project's build host)
NO_CONF = [
    "scontrol: error: resolve_ctls_from_dns_srv: res_nsearch error: Unknown host",
    "scontrol: error: fetch_config: DNS SRV lookup failed",
    "scontrol: error: _establish_config_source: failed to fetch config",
    "scontrol: fatal: Could not establish a configuration source",
]


def test_a_host_without_slurm_conf_gets_lines_and_a_hint(tmp_path):
    require_program("scontrol", package="slurm-client")
    if Path("/etc/slurm/slurm.conf").exists():
        pytest.skip("this host has /etc/slurm/slurm.conf")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env["HOME"] = str(tmp_path)
    res = ledger("usage", *WINDOW, env=env)
    assert res.returncode == 69
    err = res.stderr.splitlines()
    assert "\\n" not in res.stderr
    assert err[0].startswith("hetpatrol ledger: scontrol show node -o exited with 1: scontrol:")
    # each of scontrol's lines on its own line (the last is what every version prints)
    assert err[-2] == "  scontrol: fatal: Could not establish a configuration source"
    assert err[-1] == "hint: no slurm.conf found: set SLURM_CONF or pass --scontrol/--nodes-file"


def test_error_lines_stay_escaped(tmp_path):
    fake = tmp_path / "scontrol"  # stands in for the recorded answer, with a control added
    fake.write_text("#!/bin/sh\n" + "".join(f"echo '{line}' >&2\n" for line in NO_CONF)
                    + "printf 'evil \\033[2J\\n' >&2\nexit 1\n")  # fmt: skip
    fake.chmod(0o755)
    res = ledger("usage", "--scontrol", str(fake), *WINDOW)
    assert res.returncode == 69
    err = res.stderr.splitlines()
    assert err[1:5] == [f"  {line}" for line in NO_CONF[1:]] + ["  evil \\x1b[2J"]
    assert "\x1b" not in res.stderr
    assert err[-1].startswith("hint: no slurm.conf found")


def test_quota_without_slurm_conf_hints_at_sacctmgrs_flags(tmp_path):
    # sacctmgr fails as scontrol does on such a host (the same slurm_conf_init() lines,
    # "sacctmgr:" in front); the hint names what replaces sacctmgr, not scontrol's flags
    fake = tmp_path / "sacctmgr"
    fake.write_text("#!/bin/sh\n" + "".join(
        f"echo '{line.replace('scontrol:', 'sacctmgr:')}' >&2\n" for line in NO_CONF
    ) + "exit 1\n")  # fmt: skip
    fake.chmod(0o755)
    res = ledger("quota", "--sacctmgr", str(fake), "--sacct-file", str(SAMPLE / "sacct.txt"),
                 *NODES, *WINDOW)  # fmt: skip
    assert res.returncode == 69
    err = res.stderr.splitlines()
    assert err[0].startswith(f"hetpatrol ledger: {fake} -n -P show assoc ")
    assert err[-2] == "  sacctmgr: fatal: Could not establish a configuration source"
    assert err[-1] == "hint: no slurm.conf found: set SLURM_CONF or pass --sacctmgr/--quota-file"


def test_a_user_named_like_a_field_does_not_make_a_header(tmp_path):
    lines = (SAMPLE / "sacct.txt").read_text().splitlines()
    first = lines[0].split("|")
    first[2] = "JobIDRaw"  # a user name is chosen by people
    saved = tmp_path / "sacct.txt"
    saved.write_text("\n".join(["|".join(first), *lines[1:]]) + "\n")
    doc = usage_json(saved, "--by", "user")
    assert {(r["user"], r["gres"]): r["card_seconds"] for r in doc["rows"]} == {
        ("JobIDRaw", "gpu:a100"): 40,  # job 1: 8 A100 x 5 s
        ("hpalice", "gpu:a100"): 24,
        ("hpbob", "gpu:a100"): 16,
        ("hpbob", "ascend:910b"): 6,
    }


def test_a_saved_file_that_cannot_be_opened_is_named_by_its_own_option(tmp_path):
    res = ledger("usage", "--sacct-file", str(SAMPLE / "sacct.txt"), "--nodes-file",
                 str(tmp_path / "none.txt"), *WINDOW)  # fmt: skip
    assert res.returncode == 64
    assert f"--nodes-file {tmp_path / 'none.txt'}: No such file or directory" in res.stderr
    res = ledger("spans", "--sacct-file", str(SAMPLE / "sacct.txt"), "--nodes-file",
                 str(tmp_path), *WINDOW)  # fmt: skip
    assert res.returncode == 64
    assert f"--nodes-file {tmp_path}: a directory (save the command's output" in res.stderr


@pytest.mark.parametrize("value", ["nan", "-0.1", "1.5", "x"])
def test_efficiency_idle_below_is_a_ratio(value):
    # nan was taken: every "efficiency < nan" is false, so no job read as idle
    res = ledger("efficiency", "--prometheus", "http://127.0.0.1:1", "--idle-below", value)
    assert res.returncode == 64
    assert f"argument --idle-below: {value!r}: not a ratio from 0 to 1" in res.stderr
