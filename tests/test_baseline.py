"""Baseline drift: expected driver/firmware versions per card type, and `hetpatrol baseline`.

Versions were read off the recordings: 535.161.08 and VBIOS 96.00.74.00.0D (all 8 GPUs)
in nvidia-smi-q_H100-80GB-HBM3x8_535.161.08.txt (healthy-mixed's source), 550.90.07 in
nvidia-smi_H100-80GB-HBM3x8_550.90.07_table.txt (baseline-drift's source), 25.0.rc1.1
in the 910B4 npu-smi table of healthy-mixed.
"""

from __future__ import annotations

import io
from dataclasses import replace
from pathlib import Path

import pytest
import yaml
from conftest import NODES, require_program

from hetpatrol.checks.baseline import baseline_document, load_baseline_file
from hetpatrol.cli import main
from hetpatrol.config import ConfigError, load_config
from hetpatrol.patrol import Patroller
from hetpatrol.schema import CardRecord

DRIFT = NODES / "baseline-drift"


def patrol(name: str, config):
    p = Patroller(replace(config, node="n1"), replay_dir=NODES / name)
    try:
        return p.run()
    finally:
        p.close()


def with_baseline(text: str, tmp_path, extra: str = ""):
    path = tmp_path / "hetpatrol.yaml"
    bundled = load_config().source
    body = Path(bundled).read_text(encoding="utf-8").replace("baseline_file: null", text)
    path.write_text(body + extra)
    return load_config(path)


def test_drift_node_against_the_recorded_baseline(tmp_path):
    config = with_baseline("baseline_file: " + str(DRIFT / "baseline.yaml"), tmp_path)
    report = patrol("baseline-drift", config)
    assert report.exit_code == 1
    assert len(report.cards) == 8
    for card in report.cards:
        (f,) = [f for f in card.findings if f.check == "baseline_drift"]
        assert f.severity == "warning"
        assert f.value == {"driver_version": "550.90.07"}
        assert f.threshold == {"driver_version": "535.161.08"}
        assert "550.90.07" in f.message and "535.161.08" in f.message
        # the dump has no VBIOS: firmware is not compared, never "drift to None"
        assert card.firmware_version is None


def test_same_node_as_the_baseline_is_ok(tmp_path):
    config = with_baseline("baseline_file: " + str(DRIFT / "baseline.yaml"), tmp_path)
    report = patrol("healthy-mixed", config)
    assert report.exit_code == 0
    assert not [f for c in report.cards for f in c.findings if f.check == "baseline_drift"]


def test_baseline_file_relative_to_the_config(tmp_path):
    (tmp_path / "fleet").mkdir()
    (tmp_path / "fleet" / "b.yaml").write_text((DRIFT / "baseline.yaml").read_text())
    config = with_baseline("baseline_file: fleet/b.yaml", tmp_path)
    assert config.baseline_file == tmp_path / "fleet" / "b.yaml"
    assert config.top["baseline"][("nvidia", "h100")] == {
        "driver_version": ("535.161.08",),
        "firmware_version": ("96.00.74.00.0D",),
    }
    assert config.top["baseline"][("ascend", "910b")]["driver_version"] == ("25.0.rc1.1",)


def test_profile_baseline_firmware_drift_and_lists(tmp_path):
    # the profile wins over the file; a list accepts any of its versions
    extra = """
  - name: h100-pinned
    vendor: nvidia
    card_types: [h100]
    baseline: {driver_version: ["535.161.08", "550.90.07"], firmware_version: "96.00.74.00.0C"}
"""
    body = Path(load_config().source).read_text(encoding="utf-8")
    body += "\nprofiles:" + extra  # the profiles ship with the plugins: a site adds its own
    path = tmp_path / "c.yaml"
    path.write_text(body)
    config = load_config(path)
    report = patrol("healthy-mixed", config)
    gpus = [c for c in report.cards if c.vendor == "nvidia"]
    for card in gpus:
        (f,) = [f for f in card.findings if f.check == "baseline_drift"]
        assert f.value == {"firmware_version": "96.00.74.00.0D"}
        assert f.threshold == {"firmware_version": "96.00.74.00.0C"}
    assert report.exit_code == 1
    drift = patrol("baseline-drift", config)  # 550.90.07 is in the list
    assert not [f for c in drift.cards for f in c.findings if f.check == "baseline_drift"]


def test_null_checks_nothing(tmp_path):
    extra = """
  - name: h100-any
    vendor: nvidia
    card_types: [h100]
    baseline: {driver_version: null}
"""
    body = Path(load_config().source).read_text(encoding="utf-8")
    body = body.replace("baseline_file: null", "baseline_file: " + str(DRIFT / "baseline.yaml"))
    body += "\nprofiles:" + extra  # the profiles ship with the plugins: a site adds its own
    path = tmp_path / "c.yaml"
    path.write_text(body)
    assert patrol("baseline-drift", load_config(path)).exit_code == 0


def test_cli_baseline_write_then_once(tmp_path, capsys):
    out = tmp_path / "baseline.yaml"
    assert main(["baseline", "--replay", str(NODES / "healthy-mixed"), "--write", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert doc["node"] == "mixed-ok-01"
    assert doc["baseline"] == [
        {
            "vendor": "ascend",
            "card_type": "910b",
            "driver_version": "25.0.rc1.1",
            "firmware_version": None,
            "cards": 8,
        },
        {
            "vendor": "nvidia",
            "card_type": "h100",
            "driver_version": "535.161.08",
            "firmware_version": "96.00.74.00.0D",
            "cards": 8,
        },
    ]
    err = capsys.readouterr().err
    assert "nvidia h100: 8 cards, driver 535.161.08" in err
    code = main(["once", "--replay", str(DRIFT), "--baseline", str(out), "--format", "jsonl"])
    assert code == 1
    assert capsys.readouterr().out.count('"check":"baseline_drift"') == 8


def test_baseline_of_disagreeing_cards_keeps_every_version():
    cards = [
        CardRecord(vendor="nvidia", index=i, card_type="a100", driver_version=v)
        for i, v in enumerate(["535.54.03", "535.54.03", "550.54.14"])
    ]
    doc = baseline_document(cards, "n", "t")
    assert doc["baseline"] == [
        {
            "vendor": "nvidia",
            "card_type": "a100",
            "driver_version": ["535.54.03", "550.54.14"],
            "firmware_version": None,
            "cards": 3,
        }
    ]


def test_bad_baseline_files(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("baseline:\n  - vendor: nvidia\n")
    with pytest.raises(ValueError, match="card_type"):
        load_baseline_file(bad)
    with pytest.raises(ConfigError) as exc:
        with_baseline("baseline_file: bad.yaml", tmp_path)
    assert "baseline_file" in str(exc.value) and ":" in str(exc.value)
    assert main(["once", "--baseline", str(tmp_path / "missing.yaml")]) == 78


@pytest.mark.parametrize(
    "entry, message",
    [
        (
            "    driver_versoin: 550.90.07\n",
            "{bad}: baseline/0: Additional properties are not allowed "
            "('driver_versoin' was unexpected)",
        ),
        (
            "    driver_version: 550.90.07\n    driver_version: 535.1\n",
            "baseline file {bad}: line 5: baseline[0].driver_version: duplicate key",
        ),
        ("    driver_version: []\n", "{bad}: baseline/0/driver_version: [] should be non-empty"),
        (
            '    driver_version: "550.90\\0"\n',
            "{bad}: baseline/0/driver_version: '550.90\\x00' does not match",
        ),
    ],
    ids=["typo", "duplicate", "empty-list", "nul"],
)
def test_a_baseline_entry_that_would_check_nothing_is_refused(tmp_path, entry, message):
    """Each of these once switched the drift check off with exit 0: a misspelt key, a
    key given twice (the last one won), an empty list, a NUL byte in a version."""
    bad = tmp_path / "b.yaml"
    bad.write_text("baseline:\n  - vendor: nvidia\n    card_type: h100\n" + entry)
    with pytest.raises(ValueError) as exc:
        load_baseline_file(bad)
    assert str(exc.value).startswith(message.format(bad=bad)), str(exc.value)
    bad.write_text("baseline:\n  - vendor: Nvidia\n    card_type: h100\n")
    with pytest.raises(ValueError, match="baseline/0/vendor: 'Nvidia' does not match"):
        load_baseline_file(bad)


@pytest.mark.parametrize(
    "body, message",
    [
        ("baseline:\n  - " + "[" * 100_000 + "]" * 100_000 + "\n", "line 2: nested deeper"),
        (
            "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
            + "".join(
                f"{c}: &{c} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n"
                for p, c in zip("abcdef", "bcdefg", strict=True)
            )
            + "baseline: []\n",
            "line 1: the document expands to more than 100000 values",
        ),
        ("baseline: []\n# " + "x" * (5 * 1024 * 1024) + "\n", "larger than 4194304 bytes"),
        ("baseline:\n  - vendor: nvidia\n    card_type: \xff\n", None),
    ],
    ids=["deep", "alias-bomb", "huge", "latin-1"],
)
def test_hostile_baseline_files_are_refused_by_name(tmp_path, body, message):
    """Deep nesting, an alias bomb, a huge file and a non-UTF-8 byte: a ValueError naming
    the file (the config turns it into a ConfigError at baseline_file), no traceback."""
    bad = tmp_path / "bad.yaml"
    if message is None:
        bad.write_bytes(body.encode("latin-1"))
        message = "line 3: not UTF-8: invalid start byte"
    else:
        bad.write_text(body)
    with pytest.raises(ValueError) as exc:
        load_baseline_file(bad)
    assert str(exc.value).startswith(f"baseline file {bad}: {message}")


def test_card_info_carries_the_versions_for_fleet_queries():
    from prometheus_client.parser import text_string_to_metric_families

    from hetpatrol.exporters.prometheus import Exposition

    report = patrol("baseline-drift", load_config())
    text = Exposition(["nvidia"]).update(report, 1).decode()
    infos = [
        s
        for fam in text_string_to_metric_families(io.StringIO(text).read())
        for s in fam.samples
        if s.name == "hetpatrol_card_info"
    ]
    assert {(s.labels["card_type"], s.labels["driver_version"]) for s in infos} == {
        ("h100", "550.90.07")
    }


FLEET_QUERY = (
    "count by (instance, card_type, driver_version) (hetpatrol_card_info) unless on "
    "(card_type, driver_version) topk by (card_type) (1, count by (card_type, "
    "driver_version) (hetpatrol_card_info))"
)


def test_readme_fleet_query_finds_the_odd_node_out(tmp_path):
    """The query the README documents, run by promtool on three nodes' card_info."""
    import subprocess

    assert (
        FLEET_QUERY in Path(__file__).resolve().parents[1].joinpath("docs", "checks.md").read_text()
    )
    promtool = require_program("promtool", package="prometheus")
    (tmp_path / "r.yml").write_text(
        yaml.safe_dump(
            {"groups": [{"name": "t", "rules": [{"record": "odd", "expr": FLEET_QUERY}]}]}
        )
    )
    series = [
        ("n1", "h100", "0", "535.161.08"),
        ("n1", "h100", "1", "535.161.08"),
        ("n2", "h100", "0", "535.161.08"),
        ("n3", "h100", "0", "550.90.07"),  # the drift node
        ("n3", "910b", "0", "25.0.rc1.1"),
    ]
    test = {
        "rule_files": ["r.yml"],
        "tests": [
            {
                "interval": "1m",
                "input_series": [
                    {
                        "series": f'hetpatrol_card_info{{instance="{i}",card_type="{t}",'
                        f'index="{x}",driver_version="{d}"}}',
                        "values": "1",
                    }
                    for i, t, x, d in series
                ],
                "promql_expr_test": [
                    {
                        "expr": "odd",
                        "eval_time": "0m",
                        "exp_samples": [
                            {
                                "labels": 'odd{instance="n3",card_type="h100",'
                                'driver_version="550.90.07"}',
                                "value": 1,
                            }
                        ],
                    }
                ],
            }
        ],
    }
    (tmp_path / "t.yml").write_text(yaml.safe_dump(test))
    run = subprocess.run(
        [promtool, "test", "rules", "t.yml"], cwd=tmp_path, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stdout + run.stderr


def test_write_never_replaces_a_baseline_with_an_empty_one(tmp_path, capsys):
    target = tmp_path / "baseline.yaml"
    assert main(["baseline", "--replay", str(NODES / "healthy-mixed"), "--write", str(target)]) == 0
    good = target.read_text()
    assert "535.161.08" in good  # the H100 dump's driver version
    # a node whose only stack fails (npu-smi DCMI -8005) reads no card type
    assert (
        main(["baseline", "--replay", str(NODES / "ascend-dcmi-error"), "--write", str(target)])
        == 3
    )
    assert target.read_text() == good
    assert "no baseline written" in capsys.readouterr().err


def test_baseline_of_a_node_with_an_unread_card_needs_force(tmp_path, capsys):
    # sick-mixed: GPU 3 (0000:c2:00.0) answers GpuIsLost before its model is read, so a
    # baseline taken there would silently hold 3 A100s instead of 4
    target = tmp_path / "baseline.yaml"
    argv = ["baseline", "--replay", str(NODES / "sick-mixed"), "--write", str(target)]
    assert main(argv) == 3
    assert not target.exists()
    err = capsys.readouterr().err
    assert "could not read nvidia/3: the baseline would miss them" in err
    assert main([*argv, "--force"]) == 0
    rows = {r["card_type"]: r["cards"] for r in yaml.safe_load(target.read_text())["baseline"]}
    assert rows == {"a100": 3, "910b": 8}
