"""The daemon's config check in a child process: the same answers as
``load_config``, and ``jsonschema`` never in the daemon's memory."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import NODES

from hetpatrol.config import ConfigError, load_config
from hetpatrol.config_check import load_config_isolated
from hetpatrol.daemon import Daemon

BASELINE = NODES / "baseline-drift" / "baseline.yaml"


def _site(tmp_path, body: str):
    path = tmp_path / "site.yaml"
    path.write_text(body)
    return path


def test_the_daemon_process_never_imports_jsonschema(tmp_path):
    site = _site(tmp_path, f"baseline_file: {BASELINE}\ninterval_seconds: 7\n")
    code = (
        "import sys\n"
        "from hetpatrol.config_check import load_config_isolated\n"
        f"c = load_config_isolated({str(site)!r})\n"
        f"c = load_config_isolated({str(site)!r})  # a reload: the bundled file is cached\n"
        "print(c.interval_seconds, c.baseline_file is not None,\n"
        "      sorted(m for m in sys.modules if m.startswith(('jsonschema', 'referencing'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["7.0", "True", "[]"]


def test_the_same_config_as_in_process(tmp_path):
    site = _site(tmp_path, f"baseline_file: {BASELINE}\ninterval_seconds: 7\n")
    assert load_config_isolated(site) == load_config(site)
    assert load_config_isolated(None) == load_config(None)


@pytest.mark.parametrize(
    "body",
    [
        "interval_seconds: -3\n",  # a schema error: the child finds it
        "collectors:\n  nvidia:\n    timeout_seconds: 5\n    bogus: 1\n",  # unknown key
        "profiles:\n  - name: x\n    vendor: nvidia\n    model: '(unclosed'\n",  # past the schema
        "interval_seconds: [\n",  # not YAML
        f"baseline_file: {NODES}/no-such-baseline.yaml\n",  # a file that cannot be read
    ],
)
def test_errors_name_file_line_and_key_as_in_process(tmp_path, body):
    site = _site(tmp_path, body)
    with pytest.raises(ConfigError) as here:
        load_config(site)
    with pytest.raises(ConfigError) as child:
        load_config_isolated(site)
    assert str(child.value) == str(here.value)
    assert (child.value.line, child.value.key) == (here.value.line, here.value.key)


def test_a_child_that_cannot_run_checks_in_process(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-such-python"))
    site = _site(tmp_path, "interval_seconds: 7\n")
    assert load_config_isolated(site).interval_seconds == 7.0
    bad = _site(tmp_path, "interval_seconds: -3\n")
    with pytest.raises(ConfigError, match="interval_seconds"):
        load_config_isolated(bad)


def test_a_reload_through_the_child_keeps_the_running_config_when_bad(tmp_path):
    site = _site(tmp_path, "interval_seconds: 7\n")
    daemon = Daemon(
        load_config(site),
        config_path=site,
        config_loader=load_config_isolated,
        overrides={"listen": "", "jsonl_path": tmp_path / "p.jsonl"},
    )
    try:
        site.write_text("interval_seconds: 3\n")
        assert daemon.reload() and daemon.config.interval_seconds == 3.0
        site.write_text("interval_seconds: -1\n")
        assert not daemon.reload()
        assert daemon.config.interval_seconds == 3.0
        assert daemon.stats.config_reload_failures == 1
    finally:
        daemon.shutdown()


def _events_of_a_reload(daemon, wait: float, change=None, then: float = 0.6) -> list[dict]:
    """Run ``daemon`` here; ``wait`` s in, call ``change()`` (when given) and ask for a
    reload (as SIGHUP does), stop it ``then`` s later; the events it logged."""
    import threading
    import time

    from hetpatrol.logs import capture_logs

    def drive():
        time.sleep(wait)
        if change is not None:
            change()
        daemon._reload = True
        daemon._wake.poke()
        time.sleep(then)
        daemon._stop_requested = True
        daemon._wake.poke()

    with capture_logs() as events:
        threading.Thread(target=drive, daemon=True).start()
        assert daemon.run() == 0
    return events


def test_time_spent_in_a_reload_is_not_reported_as_a_patrol_overrun(tmp_path):
    """A reload's config check (a child process) can take longer than a short interval:
    the slots it skips are said at info, and ``patrol_overran`` stays for patrols that
    really took longer than the interval."""
    import time as _time  # (the daemon's module imports time too)

    site = _site(tmp_path, f"interval_seconds: 0.02\nstate_path: {tmp_path}/s.json\n")

    def slow_loader(path):
        _time.sleep(0.3)
        return load_config(path)

    daemon = Daemon(
        load_config(site),
        config_path=site,
        config_loader=slow_loader,
        # no HTTP server, the log in tmp_path (an override wins on every reload)
        overrides={"listen": "", "jsonl_path": tmp_path / "p.jsonl"},
    )

    events = _events_of_a_reload(daemon, 0.2)
    names = [e["event"] for e in events]
    assert "config_reloaded" in names
    skipped = [e for e in events if e["event"] == "patrol_slots_skipped"]
    after_reload = max(skipped, key=lambda e: e["missed_slots"])
    assert after_reload["missed_slots"] >= 10
    overran = {e["seq"] for e in events if e["event"] == "patrol_overran"}
    assert after_reload["seq"] not in overran  # (a slow first patrol may overrun, honestly)


def test_a_reload_that_shortens_the_interval_starts_a_new_schedule(tmp_path):
    """7 s -> 5 s by SIGHUP made the loop count the slots of the new interval since the
    daemon started as missed (``patrol_slots_skipped`` on a daemon that kept up)."""

    site = _site(tmp_path, f"interval_seconds: 0.4\nstate_path: {tmp_path}/s.json\n")
    daemon = Daemon(
        load_config(site),
        config_path=site,
        overrides={"listen": "", "jsonl_path": tmp_path / "p.jsonl"},
    )

    new = f"interval_seconds: 0.1\nstate_path: {tmp_path}/s.json\n"
    events = _events_of_a_reload(daemon, 1.0, lambda: site.write_text(new))  # past 2 patrols
    names = [e["event"] for e in events]
    assert "config_reloaded" in names
    assert names.count("patrol_changes") + names.count("first_patrol") >= 1
    skipped = [e for e in events if e["event"] in ("patrol_slots_skipped", "patrol_overran")]
    assert all(e["missed_slots"] <= 1 for e in skipped), skipped  # never the whole history
    assert daemon.patrols >= 6  # 0.1 s patrols after the reload


def test_a_baseline_file_changed_after_the_childs_check_is_checked_again(tmp_path, monkeypatch):
    """The config's text is handed to the child, but the baseline file it names is read
    by each process: one replaced between the child's check and the parent's read must
    not pass unchecked (the parent skips the schema), it gets load_config's answer."""
    from hetpatrol import config_check

    baseline = tmp_path / "baseline.yaml"
    baseline.write_text(BASELINE.read_text())
    site = _site(tmp_path, f"baseline_file: {baseline}\n")
    real_ask = config_check._ask_child

    def ask_then_replace(path, text):
        answer = real_ask(path, text)
        assert answer is not None and answer.get("ok") is True  # the child saw a good file
        baseline.write_text("baseline: 5\n")  # e.g. `hetpatrol baseline --write` racing
        return answer

    monkeypatch.setattr(config_check, "_ask_child", ask_then_replace)
    with pytest.raises(ConfigError) as child:
        load_config_isolated(site)
    with pytest.raises(ConfigError) as here:
        load_config(site)
    assert str(child.value) == str(here.value) and child.value.key == "baseline_file"


def test_the_child_never_imports_from_the_working_directory(tmp_path, monkeypatch):
    """``python -m`` puts the working directory first on sys.path: a ``hetpatrol``
    package (another checkout, a planted file in a shared directory) there would run as
    the config check. The child imports the parent's hetpatrol, never the cwd's."""
    planted = tmp_path / "cwd" / "hetpatrol"
    planted.mkdir(parents=True)
    marker = tmp_path / "planted-ran"
    (planted / "__init__.py").write_text("")
    (planted / "config_check.py").write_text(
        f"open({str(marker)!r}, 'w').close()\nprint('{{\"ok\": true, \"reads\": []}}')\n"
    )
    site = _site(tmp_path, "collectors:\n  nvidia:\n    timeout_seconds: 5\n    bogus: 1\n")
    monkeypatch.chdir(planted.parent)
    with pytest.raises(ConfigError, match="bogus"):
        load_config_isolated(site)
    assert not marker.exists()


def test_a_stalled_child_cannot_hold_a_reload_past_the_watchdogs_allowance(tmp_path, monkeypatch):
    """During a reload the watchdog is vouched for the patrol budget only (at least the
    slack + the hang margin): a child check that stalls must give up, and the parent
    check in its own process, well within it (it waited 60 s: the daemon was killed by
    systemd's watchdog instead of keeping or applying the config)."""
    from hetpatrol import config_check
    from hetpatrol.bounded import HANG_MARGIN_SECONDS

    site = _site(tmp_path, "interval_seconds: 7\n")
    daemon = Daemon(
        load_config(site),
        config_path=site,
        overrides={"listen": "", "jsonl_path": tmp_path / "p.jsonl"},
    )
    try:
        allowance = daemon.watchdog_slack_seconds + HANG_MARGIN_SECONDS
    finally:
        daemon.shutdown()
    # the in-process check after a timeout takes about as long as the child: half is left
    assert allowance / 2 >= config_check.CHILD_TIMEOUT_SECONDS
    stall = tmp_path / "python"
    stall.write_text("#!/bin/sh\nexec sleep 30\n")
    stall.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(stall))
    monkeypatch.setattr(config_check, "CHILD_TIMEOUT_SECONDS", 0.3)
    assert load_config_isolated(site).interval_seconds == 7.0


def _counting_child(monkeypatch):
    """Count the children asked (the real ones answer); no "ok" kept from before."""
    from hetpatrol import config_check

    asked = []
    real_ask = config_check._ask_child

    def ask(path, text):
        asked.append(path)
        return real_ask(path, text)

    monkeypatch.setattr(config_check, "_ask_child", ask)
    monkeypatch.setattr(config_check, "_last_ok", None, raising=False)
    return asked


def test_a_reload_of_unchanged_bytes_starts_no_child(tmp_path, monkeypatch):
    """The SIGHUP storm's cost: an interpreter start per reload of the same file. The
    same bytes (a touch, a rewrite of the same text) ask no child; one byte more does."""
    import os

    asked = _counting_child(monkeypatch)
    site = _site(tmp_path, "interval_seconds: 7\n")
    assert load_config_isolated(site).interval_seconds == 7.0
    assert load_config_isolated(site).interval_seconds == 7.0
    site.write_text("interval_seconds: 7\n")  # the same bytes, a new mtime
    os.utime(site, (1, 1))
    assert load_config_isolated(site).interval_seconds == 7.0
    assert len(asked) == 1
    site.write_text("interval_seconds: 7 \n")  # a byte more: checked again
    assert load_config_isolated(site).interval_seconds == 7.0
    assert len(asked) == 2
    site.write_text("interval_seconds: -7\n")  # refused by the child, every time
    for _ in range(2):
        with pytest.raises(ConfigError, match="interval_seconds"):
            load_config_isolated(site)
    assert len(asked) == 4
    site.write_text("interval_seconds: 7 \n")  # back to the last checked bytes: no child
    assert load_config_isolated(site).interval_seconds == 7.0
    assert len(asked) == 4


def test_a_changed_baseline_file_is_checked_again_though_the_config_is_not(tmp_path, monkeypatch):
    """The config's bytes are unchanged but the baseline file it names is not: the
    child checks again (and refuses what the schema refuses)."""
    asked = _counting_child(monkeypatch)
    baseline = tmp_path / "baseline.yaml"
    baseline.write_text(BASELINE.read_text())
    site = _site(tmp_path, f"baseline_file: {baseline}\n")
    good = load_config_isolated(site)
    assert load_config_isolated(site) == good
    assert len(asked) == 1
    # what only the schema refuses (vendors are written in lower case): the build here,
    # schema skipped, would take it
    baseline.write_text(BASELINE.read_text().replace("vendor: nvidia", "vendor: NVIDIA"))
    with pytest.raises(ConfigError) as child:
        load_config_isolated(site)
    with pytest.raises(ConfigError) as here:
        load_config(site)
    assert str(child.value) == str(here.value) and child.value.key == "baseline_file"
    assert len(asked) == 2


def test_a_plugins_profiles_are_parsed_again_when_replaced_whatever_their_mtime(
    tmp_path, monkeypatch
):
    """Parsed once while its bytes stay; a package upgrade renames a new file in,
    maybe of the same size and mtime (``install -p``, rsync -t), and a file written in
    place has new bytes: each is parsed again."""
    import os

    from hetpatrol import config

    path = tmp_path / "demo_profiles.yaml"
    body = "profiles:\n  - {name: demo-a, vendor: demo}\n"
    path.write_text(body)
    monkeypatch.setattr(config, "_plugin_documents", {})
    first = config._plugin_document(path)
    assert config._plugin_document(path) is not None
    assert config._plugin_document(path)[0] is first[0]  # parsed once
    st = path.stat()
    new = tmp_path / "demo_profiles.yaml.new"
    new.write_text(body.replace("demo-a", "demo-b"))  # the same size
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))  # and mtime
    os.replace(new, path)
    assert config._plugin_document(path)[0]["profiles"][0]["name"] == "demo-b"
    with path.open("r+") as fh:  # in place, the same size: a new mtime
        fh.write(body.replace("demo-a", "demo-c"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1))
    assert config._plugin_document(path)[0]["profiles"][0]["name"] == "demo-c"
    assert len(config._plugin_documents) == 1  # one parse kept per file


def test_a_plugins_profiles_written_in_place_with_the_same_size_and_mtime_are_read(
    tmp_path, monkeypatch
):
    """A file written in place keeps its inode, and two writes within one tick of the
    kernel's coarse file clock (or ``cp -p``/``touch -r`` onto it) keep its mtime: with
    the same size too, the stat stamp was unchanged and the old parse was used, so a
    reload said config_reloaded with the profile's old thresholds. The bytes tell it."""
    import os

    from hetpatrol import config

    path = tmp_path / "demo_profiles.yaml"
    body = "profiles:\n  - {name: demo-a, vendor: demo}\n"
    path.write_text(body)
    st = path.stat()
    monkeypatch.setattr(config, "_plugin_documents", {})
    first = config._plugin_document(path)
    with path.open("r+") as fh:  # in place, the same size, the same mtime
        fh.write(body.replace("demo-a", "demo-d"))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (path.stat().st_ino, path.stat().st_size) == (st.st_ino, st.st_size)
    assert config._plugin_document(path)[0]["profiles"][0]["name"] == "demo-d"
    with path.open("r+") as fh:  # back to the first bytes: the first parse again
        fh.write(body)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert config._plugin_document(path)[0]["profiles"][0]["name"] == "demo-a"
    assert first is not None
