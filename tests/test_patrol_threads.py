"""The daemon's fixed per-patrol cost (issue 17): one long-lived worker thread per
collector instead of a new thread per call, ``run_tool`` without reader threads, and
every JSONL line encoded once per patrol. The hang semantics are those of
``test_patrol.py`` / ``test_faults_hung.py``; here the threads themselves are checked."""

from __future__ import annotations

import gc
import json
import threading
import time

from conftest import NODES
from fakes import Scripted, make_patroller, waited_out

from hetpatrol.config import load_config
from hetpatrol.daemon import Daemon
from hetpatrol.schema import CardRecord


class Recording(Scripted):
    """A scripted collector that notes the thread of every call and its close."""

    def __init__(self, vendor: str = "ascend"):
        super().__init__(vendor)
        self.threads: list[threading.Thread] = []  # kept: no id reused by a new thread
        self.closed = threading.Event()

    def collect(self):
        self.threads.append(threading.current_thread())
        return super().collect()

    def close(self) -> None:
        self.closed.set()


def collect_threads() -> set[threading.Thread]:
    return {t for t in threading.enumerate() if t.name.startswith("collect-")}


def test_every_call_of_a_collector_runs_on_its_one_worker_and_threads_stay_constant(
    base_config,
):
    npu, gpu = Recording(), Recording(vendor="nvidia")
    p = make_patroller(base_config, {"ascend": npu, "nvidia": gpu})
    try:
        p.run()
        count = threading.active_count()
        for _ in range(50):
            report = p.run()
            assert {s.state for s in report.collectors} == {"ok"}
            assert threading.active_count() == count
        assert len(npu.threads) == len(gpu.threads) == 51
        # one thread per collector, the same for every call, never the patrol's own
        assert len(set(npu.threads)) == len(set(gpu.threads)) == 1
        assert npu.threads[0] is not gpu.threads[0]
        assert npu.threads[0].daemon and npu.threads[0].name == "collect-ascend"
        assert threading.current_thread() not in npu.threads
    finally:
        p.close()


def test_a_stuck_collector_keeps_its_one_worker_and_is_called_again_on_it(base_config):
    c = Recording()
    p = make_patroller(base_config, {"ascend": c}, timeout=0.1)
    try:
        p.run()
        count = threading.active_count()
        c.mode = "block"
        assert p.run().collectors[0].state == "hung"
        for _ in range(20):  # still stuck: reported at once, no new call, no new thread
            t0 = time.monotonic()
            report = p.run()
            assert time.monotonic() - t0 < waited_out(0.1)
            assert "still stuck in its previous call" in report.collectors[0].error
            assert threading.active_count() == count
        assert c.calls == 2
        c.mode = "ok"
        c.release.set()
        deadline = time.monotonic() + 10
        while p.run().collectors[0].state != "ok":
            assert time.monotonic() < deadline, "the collector never came back"
            time.sleep(0.05)
        assert c.calls == 3 and len(set(c.threads)) == 1  # the same worker goes on
        assert threading.active_count() == count
    finally:
        c.release.set()
        p.close()


def test_close_ends_an_idle_worker_at_once_and_a_stuck_one_after_its_call(base_config):
    idle, stuck = Recording(), Recording(vendor="nvidia")
    p = make_patroller(base_config, {"ascend": idle, "nvidia": stuck}, timeout=0.1)
    p.run()
    stuck.mode = "block"
    assert {s.name: s.state for s in p.run().collectors} == {"ascend": "ok", "nvidia": "hung"}
    idle_worker, stuck_worker = idle.threads[0], stuck.threads[0]
    t0 = time.monotonic()
    p.close()  # does not wait for the stuck call (which blocks until released, 30 s)
    assert time.monotonic() - t0 < 10
    assert idle.closed.is_set()
    idle_worker.join(5)
    assert not idle_worker.is_alive()
    # the stuck worker is still in the vendor call: its collector is not closed under it
    assert stuck_worker.is_alive() and not stuck.closed.is_set()
    stuck.release.set()  # the call returns: the worker closes the collector and ends
    assert stuck.closed.wait(5)
    stuck_worker.join(5)
    assert not stuck_worker.is_alive()


def test_a_patroller_dropped_without_close_leaves_no_worker(base_config):
    c = Recording()
    p = make_patroller(base_config, {"ascend": c})
    p.run()
    worker = c.threads[0]
    assert worker.is_alive()
    del p
    gc.collect()
    worker.join(5)
    assert not worker.is_alive()


def test_reloads_that_rebuild_the_collectors_leak_no_worker(tmp_path):
    path = tmp_path / "hetpatrol.yaml"

    def write(timeout: float) -> None:
        path.write_text(
            "node: reload-node\nlisten: null\njsonl: {path: null}\nstate_path: null\n"
            f"collectors:\n  nvidia: {{timeout_seconds: {timeout}}}\n"
            f"  ascend: {{timeout_seconds: {timeout}}}\n"
        )

    write(10)
    daemon = Daemon(load_config(path), config_path=path, replay_dir=NODES / "healthy-mixed")
    try:
        daemon.patrol_once()
        count = threading.active_count()
        for i in range(5):
            before = collect_threads()
            write(9 - i)  # a collector setting: the patroller and its collectors are new
            assert daemon.reload()
            report = daemon.patrol_once()
            states = {s.name: s.state for s in report.collectors}
            # the bundled config turns every plugin on: the replay has NVIDIA and Ascend
            assert {states.pop("nvidia"), states.pop("ascend")} == {"ok"}
            assert set(states.values()) <= {"absent"}, states
            now = collect_threads()
            for old in before - now:
                old.join(5)
            assert not any(t.is_alive() for t in before - now)
            # the plugins absent here are not started again after a reload (their
            # absent answer is kept): fewer workers, never more, and steady from then on
            if i == 0:
                assert threading.active_count() <= count
                count = threading.active_count()
            assert threading.active_count() == count
    finally:
        daemon.shutdown()


def test_run_tool_starts_no_thread(tmp_path, monkeypatch):
    from hetpatrol.tool import run_tool

    started = []
    real_start = threading.Thread.start

    def start(self):
        started.append(self.name)
        real_start(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    exe = tmp_path / "tool"
    exe.write_text("#!/bin/sh\necho out; echo err >&2; sleep 300\n")
    exe.chmod(0o755)
    ok = tmp_path / "ok"
    ok.write_text("#!/bin/sh\necho out; echo err >&2\n")
    ok.chmod(0o755)
    res = run_tool([str(ok)], 5)
    assert (res.stdout, res.stderr, res.returncode) == ("out\n", "err\n", 0)
    res = run_tool([str(exe)], 0.3)
    assert (res.stdout, res.stderr, res.hung) == ("out\n", "err\n", True)
    assert started == []


def test_each_jsonl_line_is_encoded_once_and_each_card_dict_built_once(tmp_path, monkeypatch):
    """Per patrol: one ``json.dumps`` per JSONL line (16 cards + the patrol line) and
    one for the state file's head (its card lines are the JSONL bytes, not re-encoded);
    no ``json.loads``; one ``CardRecord.to_dict`` per card."""
    path = tmp_path / "hetpatrol.yaml"
    path.write_text(
        f"node: n1\nlisten: null\njsonl: {{path: {tmp_path}/p.jsonl}}\n"
        f"state_path: {tmp_path}/state.json\n"
    )
    daemon = Daemon(load_config(path), config_path=path, replay_dir=NODES / "healthy-mixed")
    counts = {"dumps": 0, "loads": 0, "to_dict": 0}
    real_dumps, real_loads, real_to_dict = json.dumps, json.loads, CardRecord.to_dict

    def counted(name, real):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return real(*args, **kwargs)

        return wrapper

    try:
        daemon.patrol_once()  # first patrol: imports, first reads
        monkeypatch.setattr(json, "dumps", counted("dumps", real_dumps))
        monkeypatch.setattr(json, "loads", counted("loads", real_loads))
        monkeypatch.setattr(CardRecord, "to_dict", counted("to_dict", real_to_dict))
        report = daemon.patrol_once()
        monkeypatch.undo()
        assert len(report.cards) == 16 and report.event_lines == ()
        assert counts == {"dumps": 16 + 1 + 1, "loads": 0, "to_dict": 16}
        lines = (tmp_path / "p.jsonl").read_text().splitlines(keepends=True)
        assert lines[-17:] == list(report.jsonl_lines())
        state = json.loads((tmp_path / "state.json").read_text())
        assert state["cards"] == [json.loads(x) for x in report.card_lines]
    finally:
        daemon.shutdown()


class Exiting(Recording):
    """A plugin that calls ``sys.exit()`` once (a BaseException, not an Exception)."""

    def collect(self):
        if self.mode == "exit":
            self.mode = "ok"
            raise SystemExit(4)
        return super().collect()


def test_a_plugin_raising_system_exit_fails_that_patrol_only(base_config):
    """The call is settled as failed and the worker goes on; it was left unsettled (its
    thread ended), which read as "stuck in its previous call" for ever after."""
    c = Exiting()
    p = make_patroller(base_config, {"ascend": c})
    try:
        p.run()
        c.mode = "exit"
        t0 = time.monotonic()
        report = p.run()
        assert time.monotonic() - t0 < waited_out(0.5)  # settled, not waited out as hung
        status = report.collectors[0]
        assert (status.state, status.error) == ("failed", "SystemExit: 4")
        report = p.run()
        assert report.collectors[0].state == "ok"
        assert len(c.threads) == 2 and c.threads[0] is c.threads[1]
    finally:
        p.close()


def test_card_lines_are_the_record_fields_in_declaration_order():
    """``CardRecord.to_dict`` reads the fields through a cached getter: the line is still
    ``kind``, ``schema``, then every field but ``read_ok`` in declaration order, with
    processes, findings, errors and counters as plain copies (the JSONL bytes)."""
    import dataclasses

    from hetpatrol.patrol import Patroller

    names = [f.name for f in dataclasses.fields(CardRecord) if f.name != "read_ok"]
    seen = set()
    for scenario in ("healthy-mixed", "sick-mixed"):
        p = Patroller(load_config(), replay_dir=NODES / scenario, enrich_processes=False)
        try:
            for card in p.run().cards:
                line = card.to_dict()
                assert list(line) == ["kind", "schema", *names]
                for name in names:
                    value = getattr(card, name)
                    if name in ("processes", "findings", "errors", "counters"):
                        assert line[name] is not value  # a copy, not the record's own
                        if name in ("processes", "findings"):
                            value = [item.to_dict() for item in value]
                        if value:
                            seen.add(name)
                    assert line[name] == value, name
        finally:
            p.close()
    assert seen == {"processes", "findings", "errors", "counters"}  # all exercised


class _Unsayable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no message")


class Misbehaving(Recording):
    """A plugin bug: returns something that is not a CollectResult, or raises an
    exception whose message cannot be read."""

    def collect(self):
        if self.mode == "none":
            self.mode = "ok"
            self.threads.append(threading.current_thread())
            return None
        if self.mode == "unsayable":
            self.mode = "ok"
            self.threads.append(threading.current_thread())
            raise _Unsayable()
        return super().collect()


def test_a_plugin_returning_nonsense_fails_that_patrol_only(base_config):
    """Setting the result's fields raised in the worker, outside the plugin's call: the
    worker ended with the call unsettled, and the collector read as "stuck in its
    previous call" for ever after."""
    c = Misbehaving()
    p = make_patroller(base_config, {"ascend": c})
    try:
        p.run()
        for mode, error in (("none", "returned NoneType"), ("unsayable", "_Unsayable")):
            c.mode = mode
            t0 = time.monotonic()
            status = p.run().collectors[0]
            assert time.monotonic() - t0 < waited_out(0.5)  # settled, not waited out as hung
            assert status.state == "failed" and error in status.error
            assert p.run().collectors[0].state == "ok"
        assert len(set(c.threads)) == 1  # the same worker all along
    finally:
        p.close()


def test_a_reload_storm_while_a_call_is_stuck_starts_no_second_stuck_call():
    """Each reload that rebuilds the collectors closed the stuck one (its worker stays in
    the vendor call) and made a new one whose first call went into the same stuck
    library: one more stuck thread per reload. A collector name with a call still stuck
    from before the reload gets no new call until that one returns."""
    from hetpatrol.bounded import BoundedCollector

    release = threading.Event()
    calls = []

    class Stuck:
        name = "nvidia"

        def collect(self):
            calls.append(1)
            release.wait(30)
            from hetpatrol.collector import CollectResult

            return CollectResult("nvidia")

        def close(self):
            pass

    before = len(collect_threads())
    try:
        for _ in range(30):  # 30 SIGHUPs, each with a changed collector section
            bc = BoundedCollector("nvidia", Stuck(), 0.01)
            started = bc.start()
            result = bc.wait(time.monotonic() + 0.02, started)
            assert result.state == "hung"
            bc.close()
        assert len(calls) == 1
        assert "still stuck in its previous call" in result.error
        assert len(collect_threads()) - before <= 1
    finally:
        release.set()
    bc = BoundedCollector("nvidia", Stuck(), 5)
    deadline = time.monotonic() + 5
    while not bc.start():  # the stuck call returned: a new collector is called again
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert bc.wait(time.monotonic() + 5, True).state == "ok"
    bc.close()


class ExitingOnClose(Recording):
    def close(self) -> None:
        super().close()
        raise SystemExit(3)


def test_a_plugin_whose_close_calls_sys_exit_does_not_end_a_reload(base_config):
    """close() runs in the daemon's main loop (a reload replacing the collectors):
    SystemExit from a plugin there ended the daemon; it is logged like any error."""
    from hetpatrol.logs import capture_logs

    c = ExitingOnClose()
    p = make_patroller(base_config, {"ascend": c})
    p.run()
    with capture_logs() as events:
        p.close()
    assert c.closed.is_set()
    failed = [e for e in events if e["event"] == "collector_close_failed"]
    assert [(e["collector"], e["error"]) for e in failed] == [("ascend", "SystemExit: 3")]
