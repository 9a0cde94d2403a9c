"""`validate-config` (and every config load) says every error at once, in the order of
the file's lines, each with the file, line and key the operator wrote, as compilers do;
the daemon's reload refusal and `run`'s start refusal say the same list (bounded).

The expected levels are read off the shipped profile file: collectors/nvidia_profiles.yaml
``a100`` (line 14: ``temperature_celsius: {warning: 83, critical: 90}``) and
``l40s-l4`` (line 34: ``{warning: 87, critical: 94}``)."""

from __future__ import annotations

import subprocess

import pytest
from conftest import HETPATROL

from hetpatrol import config as config_module
from hetpatrol.config import EX_CONFIG, ConfigError, load_config
from hetpatrol.config_check import load_config_isolated
from hetpatrol.config_file import MAX_REPORTED_ERRORS
from hetpatrol.daemon import Daemon
from hetpatrol.logs import capture_logs

#: a site file laid over the bundled config. Its profiles are not where the overlay puts
#: them: the new profile `mine` goes first, so the site's profiles[2] (l40s-l4) is the
#: laid config's profiles[3]
SITE = """\
node: a
profiles:
  - name: a100
    temperature_celsius: {warning: 95}
  - name: mine
    vendor: nvidia
    model: "(["
  - name: l40s-l4
    temperature_celsius: {critical: 80}
    bogus: 1
jsonl:
  path: /tmp/p.jsonl
  max_bytes: -1
interval_seconds: 0
"""


def _expected(src: str) -> list[str]:
    return [
        f"{src}:4: profiles[0].temperature_celsius.warning: warning 95 is above critical 90",
        f"{src}:7: profiles[1].model: invalid regular expression: unterminated character "
        "set at position 1",
        # the bundled warning 87 over the site's critical 80: the site's section
        f"{src}:9: profiles[2].temperature_celsius.warning: warning 87 is above critical 80",
        f"{src}:10: profiles[2].bogus: unknown key",
        f"{src}:13: jsonl.max_bytes: must be at least 0 (got -1)",
        f"{src}:14: interval_seconds: must be more than 0 (got 0)",
    ]


def test_every_error_is_said_in_line_order_at_the_site_files_lines(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    with pytest.raises(ConfigError) as info:
        load_config(site)
    exc = info.value
    assert [e.text for e in exc.errors] == _expected(str(site))
    assert exc.unshown == 0
    # the first one is the error's own message, line and key
    assert (exc.path, exc.line, exc.key) == (
        str(site),
        4,
        "profiles[0].temperature_celsius.warning",
    )
    assert str(exc) == "\n".join(_expected(str(site)))


def test_validate_config_prints_them_all_and_exits_78(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    res = subprocess.run([*HETPATROL, "validate-config", str(site)], capture_output=True, text=True)
    assert res.returncode == EX_CONFIG
    assert res.stderr == "".join(
        f"hetpatrol: configuration error: {t}\n" for t in _expected(str(site))
    )


def test_the_child_check_says_the_same_list(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    with pytest.raises(ConfigError) as info:
        load_config_isolated(site)
    assert [e.text for e in info.value.errors] == _expected(str(site))


def test_an_error_in_a_plugins_profile_file_names_that_file(tmp_path, monkeypatch):
    """A shipped profile laid under the site file: its error is at its own file and
    line, said after the site file's."""
    shipped = tmp_path / "gaudi_profiles.yaml"
    shipped.write_text('profiles:\n  - name: gaudi3\n    vendor: gaudi\n    model: "(["\n')
    real = config_module.plugin_profiles_path
    monkeypatch.setattr(
        config_module, "plugin_profiles_path", lambda n: shipped if n == "gaudi" else real(n)
    )
    site = tmp_path / "site.yaml"
    site.write_text("node: a\ncollectors:\n  gaudi: {}\nlisten: 'x:99999'\n")
    with pytest.raises(ConfigError) as info:
        load_config(site)
    assert [e.text for e in info.value.errors] == [
        f"{site}:4: listen: port 99999 is out of range",
        f"{shipped}:4: profiles[0].model: invalid regular expression: unterminated "
        "character set at position 1",
    ]


def test_at_most_the_cap_is_said_then_how_many_more(tmp_path):
    n = MAX_REPORTED_ERRORS + 5
    site = tmp_path / "site.yaml"
    site.write_text("".join(f"unknown{i:02d}: 1\n" for i in range(n)))
    with pytest.raises(ConfigError) as info:
        load_config(site)
    exc = info.value
    assert [e.line for e in exc.errors] == list(range(1, MAX_REPORTED_ERRORS + 1))
    assert exc.unshown == 5
    assert str(exc).splitlines()[-1] == "and 5 more errors"
    res = subprocess.run([*HETPATROL, "validate-config", str(site)], capture_output=True, text=True)
    assert res.returncode == EX_CONFIG
    lines = res.stderr.splitlines()
    assert len(lines) == MAX_REPORTED_ERRORS + 1
    assert lines[0] == f"hetpatrol: configuration error: {site}:1: unknown00: unknown key"
    assert lines[-1] == "hetpatrol: and 5 more configuration errors"


def test_one_key_refused_twice_is_said_once(tmp_path):
    """A control character is refused as written, and again by the schema's pattern
    (textfile_path must end in .prom): one error for that key; the section `actions`
    refused for its unknown key is not said again."""
    site = tmp_path / "site.yaml"
    site.write_text('textfile_path: "x\\n"\nactions:\n  drain_onn: [reset_card]\n')
    with pytest.raises(ConfigError) as info:
        load_config(site)
    assert [e.text for e in info.value.errors] == [
        f"{site}:1: textfile_path: contains a control character (U+000A)",
        f"{site}:3: actions.drain_onn: unknown key (did you mean 'drain_on'?)",
    ]


def test_a_refused_reload_logs_every_error(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("interval_seconds: 7\n")
    daemon = Daemon(
        load_config(site),
        config_path=site,
        config_loader=load_config_isolated,
        overrides={"listen": "", "jsonl_path": tmp_path / "p.jsonl"},
    )
    try:
        site.write_text(SITE)
        with capture_logs() as events:
            assert not daemon.reload()
        (event,) = [e for e in events if e["event"] == "config_reload_failed"]
        expected = _expected(str(site))
        assert event["error"] == expected[0]
        assert event["more_errors"] == expected[1:]
        assert "unshown" not in event
        assert daemon.config.interval_seconds == 7.0
        # bounded as validate-config is: the cap, then the count left out
        site.write_text("".join(f"unknown{i:02d}: 1\n" for i in range(MAX_REPORTED_ERRORS + 5)))
        with capture_logs() as events:
            assert not daemon.reload()
        (event,) = [e for e in events if e["event"] == "config_reload_failed"]
        assert event["error"] == f"{site}:1: unknown00: unknown key"
        assert len(event["more_errors"]) == MAX_REPORTED_ERRORS - 1
        assert event["more_errors"][-1] == f"{site}:20: unknown19: unknown key"
        assert event["unshown"] == 5
    finally:
        daemon.shutdown()


def test_run_refuses_to_start_with_every_error(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    res = subprocess.run(
        [*HETPATROL, "run", "--config", str(site)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == EX_CONFIG
    assert res.stderr == "".join(
        f"hetpatrol: configuration error: {t}\n" for t in _expected(str(site))
    )


def test_one_line_verdicts_say_the_first_and_how_many_more(tmp_path):
    """`check` answers a monitoring system in one line; the doctor bundle's effective
    config keeps every error inside its YAML comment."""
    from hetpatrol.doctor_bundle import _effective_config

    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    expected = _expected(str(site))
    res = subprocess.run(
        [*HETPATROL, "check", "--config", str(site)], capture_output=True, text=True
    )
    assert res.returncode == 3
    assert res.stdout == (
        f"HETPATROL UNKNOWN - configuration error: {expected[0]} (and 5 more errors)\n"
    )
    assert _effective_config(str(site)) == "# no effective config:\n" + "".join(
        f"#   {t}\n" for t in expected
    )
