"""Configuration loading: the bundled file, profile matching, and errors with key and line."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from conftest import HETPATROL

from hetpatrol.checks.card_thresholds import Threshold
from hetpatrol.collector import discover
from hetpatrol.config import EX_CONFIG, ConfigError, load_config

LEVELS = "card_thresholds"  # the check family that holds the per-card levels

BAD_CONFIGS = [
    # (text, line, key path, words in the message)
    ("interval_seconds: -1\n", 1, "interval_seconds", "must be more than 0 (got -1)"),
    ("interval_seconds: fast\n", 1, "interval_seconds", "not of type"),
    ("node: a\njsonl:\n  pathh: /tmp/x\n", 3, "jsonl.pathh", "unknown key"),
    ("colectors: {}\n", 1, "colectors", "unknown key"),
    (
        "profiles:\n  - name: hot\n    vendor: nvidia\n"
        "    temperature_celsius: {warning: 95, critical: 90}\n",
        4,
        "profiles[0].temperature_celsius.warning",
        "above critical",
    ),
    (
        "profiles:\n  - name: x\n    vendor: nvidia\n    model: '(unclosed'\n",
        4,
        "profiles[0].model",
        "regular expression",
    ),
    ("profiles:\n  - vendor: nvidia\n", 2, "profiles[0]", "'name' is a required property"),
    (
        "collectors:\n  ascend:\n    command: npu-smi info\n",
        3,
        "collectors.ascend.command",
        "not of type 'array'",
    ),
    (
        "collectors:\n  ascend:\n    timeout_seconds: 0\n",
        3,
        "collectors.ascend.timeout_seconds",
        "must be more than 0 (got 0)",
    ),
    # the plugins' own option schemas (Collector.options_schema): NVML takes no command
    (
        "collectors:\n  nvidia:\n    command: [nvidia-smi]\n",
        3,
        "collectors.nvidia.command",
        "unknown key",
    ),
    (
        "collectors:\n  nvidia:\n    field_error_patrols: 0\n",
        3,
        "collectors.nvidia.field_error_patrols",
        "must be at least 1 (got 0)",
    ),
    (
        "collectors:\n  ascend:\n    detail: yes please\n",
        3,
        "collectors.ascend.detail",
        "not of type 'boolean'",
    ),
    (
        "collectors:\n  hygon:\n    timeout_seconds: 0\n",
        3,
        "collectors.hygon.timeout_seconds",
        "must be more than 0 (got 0)",
    ),
    ("listen: localhost\n", 1, "listen", "host:port"),
    ("node: a\nnode: b\n", 2, "node", "duplicate key"),
    ("recovery_patrols: 0\n", 1, "recovery_patrols", "must be at least 1 (got 0)"),
    (
        "defaults:\n  retired_pages_pending: fatal\n",
        2,
        "defaults.retired_pages_pending",
        "is not one of",
    ),
    ('jsonl:\n  path: "/var/log/a\\0b"\n', 2, "jsonl.path", "contains a NUL byte"),
    ('node: a\nstate_path: ""\n', 2, "state_path", "'' should be non-empty"),
    (
        "interval_seconds: 1e1\n",
        1,
        "interval_seconds",
        "'1e1' is not of type 'number' (YAML reads an exponent without a dot as text: "
        "write 1.0e+1)",
    ),
    (
        "profiles:\n  - name: a3\n    vendor: ascend\n    card_types: [910_93]\n",
        4,
        "profiles[0].card_types[0]",
        "91093 is not of type 'string' (YAML reads unquoted digits as a number, 910_93 as "
        "91093: quote it)",
    ),
    (
        'kernel_log:\n  xid_severity:\n    "0079": info\n    "79": critical\n',
        4,
        "kernel_log.xid_severity.79",
        "the same key as '0079' (both read as 79)",
    ),
    (
        "profiles:\n  - name: a\n    vendor: ascend\n    ascend_fault_codes:\n"
        "      overrides: {8c03a000: info, 8C03A000: critical}\n",
        5,
        "profiles[0].ascend_fault_codes.overrides.8C03A000",
        "the same key as '8c03a000' (both read as '8C03A000')",
    ),
    (
        'node: a\ntextfile_path: "/var/lib/node_exporter/hetpatrol.prom\\n"\n',
        2,
        "textfile_path",
        "contains a control character (U+000A)",
    ),
    (
        "profiles:\n  - name: a100\n    vendor: nvidai\n",
        3,
        "profiles[0].vendor",
        "unknown vendor 'nvidai' (did you mean 'nvidia'?): a collector's name, one of "
        + ", ".join(sorted(discover())),
    ),
    (
        "defaults:\n  memory_used_ratio: {warning: 0.9, critical: 95}\n",
        2,
        "defaults.memory_used_ratio.critical",
        "95 is above 1: a ratio (0.95 is 95 %)",
    ),
    (
        "defaults:\n  nvlink:\n    errors_total: {warning: 500, critical: 50}\n",
        3,
        "defaults.nvlink.errors_total.warning",
        "warning 500 is above critical 50",
    ),
    (
        "defaults:\n  roce:\n    link_flaps: {critical: 3}\n"
        "profiles:\n  - name: x\n    vendor: ascend\n"
        "    roce:\n      link_flaps: {warning: 5}\n",
        8,
        "profiles[0].roce.link_flaps",
        "warning 5 is above critical 3 (merged with the levels it inherits)",
    ),
]


def test_a_plugin_collector_names_a_vendor_for_profiles():
    text = "base: none\ncollectors:\n  gaudi: {}\nprofiles:\n  - name: g3\n    vendor: gaudi\n"
    assert [p.vendor for p in load_config("ok.yaml", text=text).profiles] == ["gaudi"]
    cfg = load_config("ok.yaml", text="defaults:\n  power_ratio: {warning: 1.05, critical: 1.2}\n")
    assert (
        cfg.profile_for("nvidia", "a100", None)
        .checks["card_thresholds"]
        .thresholds["power_ratio"]
        .critical
        == 1.2
    )


def test_a_card_no_profile_applies_to_is_judged_by_the_defaults_section():
    """A config without a catch-all profile: a new card type still gets the defaults'
    thresholds and deep settings, not none at all."""
    cfg = load_config(
        "ok.yaml",
        text="base: none\ndefaults:\n  temperature_celsius: {warning: 80, critical: 90}\n"
        "  retired_pages_pending: warning\n  nvlink:\n    errors_total: {warning: 3, critical: 7}\n"
        "profiles:\n  - name: a100\n    vendor: nvidia\n    card_types: [a100]\n",
    )
    p = cfg.profile_for("nvidia", "b300", "NVIDIA B300")
    assert (p.name, p.vendor, p.gres) == ("nvidia-defaults", "nvidia", None)
    assert p.checks[LEVELS].thresholds["temperature_celsius"] == Threshold(warning=80, critical=90)
    assert p.checks["card_thresholds"].state_checks["retired_pages_pending"] == "warning"
    assert p.checks["interconnect"].nvlink_errors_total.critical == 7
    assert cfg.profile_for("nvidia", "a100", None).name == "a100"


@pytest.mark.parametrize(("text", "line", "key", "words"), BAD_CONFIGS)
def test_bad_config_names_key_and_line(text, line, key, words):
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml", text=text)
    err = info.value
    assert err.line == line
    assert err.key == key
    assert words in str(err)
    assert str(err).startswith(f"bad.yaml:{line}: {key}: ")


#: typos an operator makes, one per level of the file: (text, line, key path, the
#: key suggested). Real typos: a letter left out, doubled, swapped, a singular for a
#: plural, another program's spelling (dryrun, timeout_secs).
TYPOS = [
    ("colectors: {}\n", 1, "colectors", "collectors"),  # a top section
    ("bse: none\n", 1, "bse", "base"),  # the layering switch, popped before the schema
    ("node: a\nintervall_seconds: 5\n", 2, "intervall_seconds", "interval_seconds"),
    ("node: a\njsonl:\n  pathh: /tmp/x\n", 3, "jsonl.pathh", "path"),
    # check settings: the defaults' levels, a check family's top section
    (
        "defaults:\n  temperature_celsius:\n    warnng: 80\n",
        3,
        "defaults.temperature_celsius.warnng",
        "warning",
    ),
    ("kernel_log:\n  xid_severty: {}\n", 2, "kernel_log.xid_severty", "xid_severity"),
    ("slurm:\n  drain:\n    dryrun: true\n", 3, "slurm.drain.dryrun", "dry_run"),
    ("actions:\n  drain_onn: [reset_card]\n", 2, "actions.drain_onn", "drain_on"),
    # profile keys
    (
        "profiles:\n  - name: a\n    vendr: nvidia\n",
        3,
        "profiles[0].vendr",
        "vendor",
    ),
    (
        "profiles:\n  - name: a\n    vendor: nvidia\n    card_type: [a100]\n",
        4,
        "profiles[0].card_type",
        "card_types",
    ),
    (
        "profiles:\n  - name: a\n    vendor: nvidia\n    temprature_celsius: {warning: 80}\n",
        4,
        "profiles[0].temprature_celsius",
        "temperature_celsius",
    ),
    # collector options
    (
        "collectors:\n  nvidia:\n    timeout_secs: 3\n",
        3,
        "collectors.nvidia.timeout_secs",
        "timeout_seconds",
    ),
    (
        "collectors:\n  ascend:\n    hccn_tools: [hccn_tool]\n",
        3,
        "collectors.ascend.hccn_tools",
        "hccn_tool",
    ),
]


@pytest.mark.parametrize(("text", "line", "key", "near"), TYPOS)
def test_an_unknown_key_says_the_nearest_known_one(text, line, key, near):
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml", text=text)
    # every error is said: `vendr` for `vendor` is also a missing vendor (line 2, first)
    (error,) = [e for e in info.value.errors if e.key == key]
    assert (error.line, error.key) == (line, key)
    assert error.text == f"bad.yaml:{line}: {key}: unknown key (did you mean {near!r}?)"


def test_an_unknown_key_near_no_known_one_says_none():
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml", text="node: a\nzebra: 1\n")
    assert str(info.value) == "bad.yaml:2: zebra: unknown key"


def test_a_hostile_key_is_shown_escaped_and_cut():
    """A key is text the file's writer chose: an error naming it (a terminal, a log line)
    shows its control characters escaped and at most 80 of its characters, whatever
    its length (a 1,000,000-character key was printed whole, an ESC raw)."""
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml", text='"interval_secondz\\e[2J\\n\\rx": 1\n')
    assert str(info.value) == (
        "bad.yaml:1: interval_secondz\\x1b[2J\\n\\rx: unknown key "
        "(did you mean 'interval_seconds'?)"
    )
    huge = "interval_second" + "s" * 1_000_000
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml", text=f'? "{huge}"\n: 1\n')
    assert str(info.value) == (f"bad.yaml:1: {huge[:80]}...({len(huge)} characters): unknown key")
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml", text='"a\\e[2Jb": 1\n"a\\e[2Jb": 2\n')
    assert str(info.value) == "bad.yaml:2: a\\x1b[2Jb: duplicate key"
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml", text=f"profiles:\n  - name: x\n    vendor: nv{'i' * 5000}\n")
    assert f"unknown vendor 'nv{'i' * 78}...(5002 characters)': a collector's" in str(info.value)


def test_validate_config_shows_a_hostile_collector_name_escaped_and_cut(tmp_path):
    bad = tmp_path / "bad.yaml"
    name = "nv\x1b[2J" + "i" * 100_000
    bad.write_text(f'collectors:\n  ? "{name.replace(chr(27), chr(92) + "e")}"\n  : {{}}\n')
    res = subprocess.run([*HETPATROL, "validate-config", str(bad)], capture_output=True, text=True)
    assert res.returncode == EX_CONFIG
    shown = "nv\\x1b[2J" + "i" * 74 + f"...({len(name)} characters)"
    assert res.stderr == (
        f"hetpatrol: configuration error: {bad}:2: collectors.{shown}: "
        f"no collector plugin named '{shown}' is installed (installed: "
        + ", ".join(sorted(discover()))
        + ")\n"
    )


def test_a_typo_in_a_plugins_profile_file_says_the_nearest_key(tmp_path, monkeypatch):
    """A plugin's shipped profiles are checked like the config's, with its own file
    and line."""
    from hetpatrol import config

    shipped = tmp_path / "gaudi_profiles.yaml"
    shipped.write_text("profiles:\n  - name: gaudi3\n    vendor: gaudi\n    modle: HL-325\n")
    real = config.plugin_profiles_path
    monkeypatch.setattr(
        config, "plugin_profiles_path", lambda n: shipped if n == "gaudi" else real(n)
    )
    with pytest.raises(ConfigError) as info:
        load_config("site.yaml", text="base: none\ncollectors:\n  gaudi: {}\n")
    assert str(info.value) == (
        f"{shipped}:4: profiles[0].modle: unknown key (did you mean 'model'?)"
    )


def test_validate_config_says_the_nearest_key_and_collector(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("node: a\ncollectors:\n  ascend:\n    timout_seconds: 5\n")
    res = subprocess.run([*HETPATROL, "validate-config", str(bad)], capture_output=True, text=True)
    assert res.returncode == EX_CONFIG
    assert res.stderr == (
        f"hetpatrol: configuration error: {bad}:4: collectors.ascend.timout_seconds: "
        "unknown key (did you mean 'timeout_seconds'?)\n"
    )
    bad.write_text("node: a\ncollectors:\n  nvidai: {}\n")  # a plugin section: any name
    res = subprocess.run([*HETPATROL, "validate-config", str(bad)], capture_output=True, text=True)
    assert res.returncode == EX_CONFIG
    assert (
        f"{bad}:3: collectors.nvidai: no collector plugin named 'nvidai' is installed "
        "(did you mean 'nvidia'?) (installed: " in res.stderr
    )


def test_yaml_syntax_error_has_line():
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml", text="node: a\nprofiles: [\n  {name: x\n")
    assert info.value.line is not None
    assert "invalid YAML" in str(info.value)


def test_top_level_must_be_mapping():
    with pytest.raises(ConfigError, match="mapping"):
        load_config("bad.yaml", text="- a\n- b\n")


def test_bundled_config_profiles_match_card_types(base_config):
    cfg = base_config
    cases = [
        ("nvidia", "a100", "NVIDIA A100-SXM4-80GB", "a100", 83, 90),
        ("nvidia", "h100", "NVIDIA H100 80GB HBM3", "h100-h200", 83, 90),
        ("nvidia", "h200", "NVIDIA H200", "h100-h200", 83, 90),
        ("nvidia", "l40s", "NVIDIA L40S", "l40s-l4", 87, 94),
        ("nvidia", "l4", "NVIDIA L4", "l40s-l4", 87, 94),
        ("nvidia", "t4", "Tesla T4", "t4-a10", 85, 92),
        ("nvidia", "a10g", "NVIDIA A10G", "t4-a10", 85, 92),
        ("nvidia", "rtx4090", "NVIDIA GeForce RTX 4090", "nvidia-default", 85, 92),
        ("ascend", "910", "910A", "ascend-910", 80, 90),
        ("ascend", "910b", "910B3", "ascend-910b", 80, 90),
        ("ascend", "910_93", "Ascend910", "ascend-910-93", 80, 90),
        ("ascend", "310p", "310P3", "ascend-310p", 75, 85),
        ("ascend", "310b", "310B4", "ascend-310b", 75, 85),
        ("ascend", "ascend", "xxx", "ascend-default", 85, 92),
    ]
    for vendor, card_type, model, name, warn, crit in cases:
        p = cfg.profile_for(vendor, card_type, model)
        assert p.name == name, (vendor, model)
        t = p.checks[LEVELS].thresholds["temperature_celsius"]
        assert (t.warning, t.critical) == (warn, crit), name
        assert p.gres == ("gpu" if vendor == "nvidia" else "ascend")


def test_bundled_default_paths_are_user_writable(monkeypatch):
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    cfg = load_config()
    state = Path.home() / ".local" / "state" / "hetpatrol"
    assert (cfg.jsonl_path, cfg.state_path) == (state / "patrol.jsonl", state / "state.json")


def test_xdg_state_home_expands(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    cfg = load_config()
    assert cfg.jsonl_path == tmp_path / "hetpatrol" / "patrol.jsonl"


def test_card_type_that_yaml_reads_as_number_is_refused():
    # YAML 1.1 reads 910_93 as the integer 91093: the error says where, not a traceback.
    text = "profiles:\n  - name: a3\n    vendor: ascend\n    card_types: [910_93]\n"
    with pytest.raises(ConfigError) as info:
        load_config("a3.yaml", text=text)
    assert info.value.key == "profiles[0].card_types[0]"
    assert info.value.line == 4


def test_validate_config_cli_exit_codes(tmp_path):
    good = subprocess.run(
        [
            *HETPATROL,
            "validate-config",
            str(Path(__file__).parents[1] / "config" / "hetpatrol.yaml"),
        ],
        capture_output=True,
        text=True,
    )
    assert good.returncode == 0, good.stderr
    assert "ok (25 profiles" in good.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("interval_seconds: 10\njsonl:\n  max_bytes: -5\n")
    res = subprocess.run(
        [*HETPATROL, "validate-config", str(bad)],
        capture_output=True,
        text=True,
    )
    assert res.returncode == EX_CONFIG
    assert f"{bad}:3: jsonl.max_bytes:" in res.stderr
    assert "Traceback" not in res.stderr


def test_no_collectors_section_means_the_built_in_collectors():
    # built-ins first, then the other registered plugins by name (the new vendors)
    cfg = load_config("min.yaml", text="base: none\nnode: x\n")
    assert [(c.name, c.enabled) for c in cfg.collectors] == [
        (name, True)
        for name in ("nvidia", "ascend", *sorted(set(discover()) - {"nvidia", "ascend"}))
    ]
    assert load_config("none.yaml", text="base: none\ncollectors: {}\n").collectors == ()


def test_usage_errors_exit_64_not_a_nagios_verdict():
    res = subprocess.run([*HETPATROL, "check", "--bogus"], capture_output=True, text=True)
    assert res.returncode == 64
    assert "unrecognized arguments: --bogus" in res.stderr


def test_a_profile_level_left_unset_comes_from_defaults():
    """`{warning: 95}` in a profile keeps the critical level of `defaults` (a card at
    120 °C is critical, not merely a warning); an explicit null switches it off."""
    cfg = load_config(
        "ok.yaml",
        text="defaults:\n  temperature_celsius: {warning: 85, critical: 98}\n"
        "profiles:\n  - name: hot\n    vendor: nvidia\n    card_types: [a]\n"
        "    temperature_celsius: {warning: 95}\n"
        "  - name: cool\n    vendor: nvidia\n    card_types: [b]\n"
        "    temperature_celsius: {critical: null}\n",
    )
    assert cfg.profile_for("nvidia", "a", None).checks["card_thresholds"].thresholds[
        "temperature_celsius"
    ] == Threshold(warning=95, critical=98)
    assert cfg.profile_for("nvidia", "b", None).checks["card_thresholds"].thresholds[
        "temperature_celsius"
    ] == Threshold(warning=85, critical=None)
    with pytest.raises(ConfigError) as info:
        load_config(
            "bad.yaml",
            text="defaults:\n  temperature_celsius: {warning: 85, critical: 92}\n"
            "profiles:\n  - name: hot\n    vendor: nvidia\n"
            "    temperature_celsius: {warning: 95}\n",
        )
    assert str(info.value) == (
        "bad.yaml:6: profiles[0].temperature_celsius.warning: warning 95 is above critical 92"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "node: 2024-13-45\n",
            "bad.yaml:1: invalid YAML: cannot read '2024-13-45' as "
            "timestamp: month must be in 1..12",
        ),
        (
            "node: a\ninterval_seconds: !!float abc\n",
            "bad.yaml:2: invalid YAML: cannot read "
            "'abc' as float: could not convert string to float: 'abc'",
        ),
        (
            "recovery_patrols: " + "9" * 5000 + "\n",
            "bad.yaml:1: invalid YAML: cannot read "
            "'" + "9" * 40 + "...' as int: Exceeds the limit (4300 digits)",
        ),
        (
            "collectors:\n  foo:\n"
            + "".join(
                f"    k{k}: &a{k} " + "[" * 28 + (f"*a{k - 1}" if k else "1") + "]" * 28 + "\n"
                for k in range(40)
            ),
            "bad.yaml:1: nested deeper than 32 levels once its YAML aliases are expanded",
        ),
    ],
    ids=["bad-date", "bad-float", "5000-digits", "alias-chain"],
)
def test_values_yaml_cannot_build_are_config_errors_with_a_line(text, message):
    """These escaped as a bare ValueError or a RecursionError (and a SIGHUP reload with
    them stopped the daemon)."""
    with pytest.raises(ConfigError) as info:
        load_config("bad.yaml", text=text)
    assert str(info.value).startswith(message)


def test_a_fifo_or_a_directory_as_config_is_refused_at_once(tmp_path):
    import os

    fifo = tmp_path / "hetpatrol.yaml"
    os.mkfifo(fifo)  # no writer: an open() that waits would never return
    with pytest.raises(ConfigError) as info:
        load_config(fifo)
    assert str(info.value) == f"{fifo}: not a regular file"
    with pytest.raises(ConfigError) as info:
        load_config(tmp_path)
    assert str(info.value) == f"{tmp_path}: a directory, not a file"


def test_a_site_file_is_laid_over_the_bundled_config_key_by_key(tmp_path):
    bundled = load_config()
    site = tmp_path / "site.yaml"
    site.write_text("interval_seconds: 5\n")
    cfg = load_config(site)
    assert cfg.interval_seconds == 5.0
    # every bundled profile and GRES name is still there (a one-line file used to drop them)
    assert [p.name for p in cfg.profiles] == [p.name for p in bundled.profiles]
    assert cfg.profile_for("nvidia", "h100", None).gres == "gpu"
    site.write_text(
        "profiles:\n"
        "  - name: a100\n"  # a bundled profile: only this key changes
        "    temperature_celsius: {warning: 70}\n"
        "  - name: ascend-310p\n"
        "    enabled: false\n"
        "  - name: site-h100\n"  # a new one: it comes first, so it matches first
        "    vendor: nvidia\n"
        "    card_types: [h100]\n"
        "    gres: gpu\n"
    )
    cfg = load_config(site)
    names = [p.name for p in cfg.profiles]
    assert names[0] == "site-h100" and "ascend-310p" not in names
    assert len(names) == len(bundled.profiles)
    a100 = cfg.profile_for("nvidia", "a100", None)
    bundled_a100 = bundled.profile_for("nvidia", "a100", None)
    t = a100.checks["card_thresholds"].thresholds["temperature_celsius"]
    t0 = bundled_a100.checks["card_thresholds"].thresholds["temperature_celsius"]
    assert (t.warning, t.critical) == (70, t0.critical)
    assert a100.gres == bundled_a100.gres
    assert cfg.profile_for("nvidia", "h100", None).name == "site-h100"


@pytest.mark.parametrize("value", ["flase", "0", "'no'", "null"])
def test_a_profile_switch_that_is_not_true_or_false_is_refused(tmp_path, value):
    # laying the site over the bundled config takes "enabled" out before the schema
    # check: "enabled: flase" left ascend-310p on and validate-config said ok
    site = tmp_path / "site.yaml"
    site.write_text(
        f"interval_seconds: 5\nprofiles:\n  - name: ascend-310p\n    enabled: {value}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(site)
    shown = {"flase": "'flase'", "0": "0", "'no'": "'no'", "null": "None"}[value]
    assert str(info.value) == (
        f"{site}:4: profiles[0].enabled: {shown} is not of type 'boolean' (true or false)"
    )


@pytest.mark.parametrize(
    "text, message",
    [
        # a section written as a value: its keys named; YAML's words, not Python's True
        (
            "slurm:\n  drain: true\n",
            "2: slurm.drain: true is not of type 'object', 'null' (a section: its keys go"
            " under it: breaker, dry_run, enabled, reboot, resume_after_patrols)",
        ),
        ("interval_seconds: true\n", "1: interval_seconds: true is not of type 'number'"),
        ("node: no\n", "1: node: false is not of type 'string', 'null'"),
        ("collectors:\n  nvidia: null\n", "2: collectors.nvidia: null is not of type 'object'"),
    ],
)
def test_a_wrong_type_says_it_in_yamls_words(tmp_path, text, message):
    site = tmp_path / "site.yaml"
    site.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(site)
    assert str(info.value) == f"{site}:{message}"


def test_base_none_makes_the_file_the_whole_config_and_errors_name_the_site_line(tmp_path):
    site = tmp_path / "site.yaml"
    site.write_text("base: none\ninterval_seconds: 5\n")
    # none of the bundled file's settings (its state path); the plugins' own profiles
    # still apply, NVIDIA's among them (they ship with the plugin, not in that file)
    cfg = load_config(site)
    assert load_config().state_path is not None and cfg.state_path is None
    assert "a100" in [p.name for p in cfg.profiles]
    site.write_text(
        "interval_seconds: 5\nprofiles:\n  - name: a100\n    temperature_celsius: {warning: 99}\n"
    )
    with pytest.raises(ConfigError) as info:
        load_config(site)
    assert str(info.value).startswith(f"{site}:4: profiles[")
    assert "warning 99 is above critical" in str(info.value)
    site.write_text("base: maybe\n")
    with pytest.raises(ConfigError, match=r"site.yaml:1: base: must be bundled or none"):
        load_config(site)


def test_validate_config_effective_says_where_each_value_came_from(tmp_path, capsys):
    from hetpatrol.cli import main

    site = tmp_path / "site.yaml"
    site.write_text(
        "interval_seconds: 5\nprofiles:\n  - name: a100\n    temperature_celsius: {warning: 70}\n"
    )
    assert main(["validate-config", "--effective", str(site)]) == 0
    rows = {
        line.split(":", 1)[0]: line.rsplit("# ", 1)[1]
        for line in capsys.readouterr().out.splitlines()
    }
    assert rows["interval_seconds"] == f"{site}:1"
    assert rows["profiles[a100].temperature_celsius.warning"] == f"{site}:4"
    assert rows["profiles[a100].temperature_celsius.critical"] == "bundled"
    assert rows["listen"] == "bundled"


def test_nvidia_and_ascend_profiles_ship_with_their_plugins_and_a_site_changes_them(tmp_path):
    """The vendors' profiles live in collectors/<vendor>_profiles.yaml, not in the bundled
    file; a site file still changes one by its name, and --effective lists it."""
    from hetpatrol.config import bundled_config_path, effective_settings, plugin_profiles_path

    bundled_file = bundled_config_path().read_text(encoding="utf-8")
    assert "\nprofiles:" not in bundled_file and "vendor: nvidia" not in bundled_file
    assert plugin_profiles_path("nvidia").name == "nvidia_profiles.yaml"
    assert plugin_profiles_path("ascend").name == "ascend_profiles.yaml"
    cfg = load_config()
    a100 = cfg.profile_for("nvidia", "a100", None)
    t = a100.checks["card_thresholds"].thresholds["temperature_celsius"]
    assert (a100.name, a100.gres, t.warning, t.critical) == ("a100", "gpu", 83, 90)
    site = tmp_path / "site.yaml"
    site.write_text("profiles:\n  - name: ascend-910b\n    gres: npu\n")
    p = load_config(site).profile_for("ascend", "910b", None)
    t = p.checks["card_thresholds"].thresholds["temperature_celsius"]
    assert (p.name, p.gres, t.warning, t.critical) == ("ascend-910b", "npu", 80, 90)
    rows = {k: (v, where) for k, v, where in effective_settings(site)}
    assert rows["profiles[ascend-910b].gres"] == ("npu", f"{site}:3")
    assert rows["profiles[ascend-910b].model"] == ("^910B", "bundled")
    assert rows["profiles[a100].temperature_celsius.warning"] == (83, "bundled")


def test_the_collector_option_schemas_are_the_plugins():
    """Each plugin declares the schema of its ``collectors.<name>`` section
    (Collector.options_schema); the config lays in those of the sections it has, and a
    section of ``enabled`` alone imports no plugin."""
    from hetpatrol import config as config_module
    from hetpatrol.collectors.ascend import AscendCollector
    from hetpatrol.collectors.nvidia import NvidiaCollector

    schema = config_module.config_schema({"nvidia": {"nvlink": True}, "ascend": {"detail": True}})
    declared = schema["properties"]["collectors"]["properties"]
    assert declared == {
        "nvidia": NvidiaCollector.options_schema,
        "ascend": AscendCollector.options_schema,
    }
    assert "nvlink_interval_seconds" in NvidiaCollector.options_schema["properties"]
    assert "hccn_tool" in AscendCollector.options_schema["properties"]
    assert config_module.config_schema({"nvidia": {"enabled": True}}) is config_module.CONFIG_SCHEMA
    assert "properties" not in config_module.CONFIG_SCHEMA["properties"]["collectors"]


@pytest.mark.parametrize(
    "text, message",
    [
        # jsonschema: "0 is less than or equal to the minimum of 0" (exclusiveMinimum)
        ("interval_seconds: 0\n", "interval_seconds: must be more than 0 (got 0)"),
        ("interval_seconds: 90000\n", "interval_seconds: must be at most 86400 (got 90000)"),
        ("recovery_patrols: -1\n", "recovery_patrols: must be at least 1 (got -1)"),
        ("missing_patrols: 1\n", "missing_patrols: must be at least 2 (got 1)"),
    ],
)
def test_a_value_out_of_bounds_says_the_bound_in_words(text, message):
    with pytest.raises(ConfigError) as info:
        load_config("site.yaml", text=text)
    assert message in str(info.value), str(info.value)
    assert "less than or equal" not in str(info.value) and "minimum of" not in str(info.value)
    assert info.value.line == 1
