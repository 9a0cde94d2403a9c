"""Every JSONL line carries the run id of the daemon that wrote it: `seq` starts at 1
again with each start, so two runs appended to one log are told apart by `run_id`; a
reload (SIGHUP) is the same run."""

from __future__ import annotations

import json

import jsonschema
from conftest import NODES

from hetpatrol.config import load_config
from hetpatrol.patrol import Patroller
from hetpatrol.schema import jsonl_json_schema

VALIDATOR = jsonschema.Draft202012Validator(jsonl_json_schema())


def test_each_run_has_its_own_id_on_every_line_and_a_reload_keeps_it():
    config = load_config()
    first = Patroller(config, replay_dir=NODES / "xid-79")
    second = Patroller(config, replay_dir=NODES / "xid-79")
    try:
        lines = [json.loads(x) for x in first.run().jsonl_lines()]
        assert {x["kind"] for x in lines} == {"card", "event", "patrol"}
        assert {x["run_id"] for x in lines} == {first.run_id}
        for line in lines:
            VALIDATOR.validate(line)
        assert json.loads(second.run().patrol_line)["run_id"] == second.run_id != first.run_id
        reloaded = Patroller(config, replay_dir=NODES / "xid-79")
        reloaded.adopt(first)
        patrol = json.loads(reloaded.run().patrol_line)
        assert (patrol["run_id"], patrol["seq"]) == (first.run_id, 2)
        reloaded.close()
    finally:
        first.close()
        second.close()
