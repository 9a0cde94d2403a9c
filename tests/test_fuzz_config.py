"""Property-based tests of the configuration loader (hypothesis).

Whatever the file holds (random nested YAML structures, the bundled config with keys
deleted, renamed, retyped or added, lines of it edited, arbitrary text or bytes), the
loader either returns a usable :class:`Config` or raises :class:`ConfigError` naming a
key path or a line. Never any other exception, and the CLI exits 0 or 78.

``HETPATROL_FUZZ_EXAMPLES`` scales the example counts (default: the CI budget).
"""

from __future__ import annotations

import contextlib
import io
import math
import os
import re
import tempfile
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hetpatrol.cli import main as cli_main
from hetpatrol.collector import discover
from hetpatrol.config import EX_CONFIG, Config, ConfigError, bundled_config_path, load_config

SCALE = float(os.environ.get("HETPATROL_FUZZ_EXAMPLES", "1"))
BUNDLED_TEXT = bundled_config_path().read_text(encoding="utf-8")
BUNDLED = yaml.safe_load(BUNDLED_TEXT)


def fuzz(n: int):
    return settings(
        max_examples=max(1, int(n * SCALE)),
        derandomize=True,  # the same examples in every run: CI never meets a new one
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )


def _key_names(data, out: set) -> set:
    if isinstance(data, dict):
        for k, v in data.items():
            out.add(str(k))
            _key_names(v, out)
    elif isinstance(data, list):
        for v in data:
            _key_names(v, out)
    return out


KNOWN_KEYS = sorted(_key_names(BUNDLED, set()))

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(max_size=16)
    | st.sampled_from(["", "0", "-1", "1e400", ".nan", "127.0.0.1:9477", "[::1]:99999", "x.prom"])
)
keys = st.sampled_from(KNOWN_KEYS) | st.text(min_size=1, max_size=12) | st.integers(-3, 3)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=16,
)


def dump(data) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True)


def check(text: str | None = None, path: Path | None = None) -> Config | None:
    """Load; assert the outcome is a sane config or a ConfigError that says where."""
    try:
        config = load_config(path, text=text)
    except ConfigError as exc:
        message = str(exc)
        assert exc.key is not None or exc.line is not None, message
        if exc.key is not None:
            assert f": {exc.key}: " in message, message
        if exc.line is not None:
            source = text if text is not None else path.read_bytes().decode("utf-8", "replace")
            assert 1 <= exc.line <= source.count("\n") + 2, (exc.line, message)
            assert re.search(rf":{exc.line}: ", message), message
        return None
    assert isinstance(config, Config)
    assert math.isfinite(config.interval_seconds) and config.interval_seconds > 0
    assert config.recovery_patrols >= 1
    for collector in config.collectors:
        assert isinstance(collector.name, str)
        assert math.isfinite(collector.timeout_seconds) and collector.timeout_seconds > 0
    for profile in config.profiles:
        for threshold in profile.checks["card_thresholds"].thresholds.values():
            for level in (threshold.warning, threshold.critical):
                assert level is None or (math.isfinite(level) and level >= 0)
    return config


def test_the_bundled_config_is_accepted():
    assert check(BUNDLED_TEXT) is not None


@fuzz(200)
@given(st.dictionaries(keys, values, max_size=6))
def test_random_structures(data):
    check(dump(data))


@fuzz(60)
@given(values)
def test_random_top_level_values(data):
    check(dump(data))


# ------------------------------------------------------------- mutations of the bundled


def _paths(data, prefix=()):
    yield prefix
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(data, list):
        for i, v in enumerate(data):
            yield from _paths(v, (*prefix, i))


PATHS = [p for p in _paths(BUNDLED) if p]


def _copy(data):
    return yaml.safe_load(dump(data))


def _parent(data, path):
    for part in path[:-1]:
        data = data[part]
    return data


@st.composite
def mutated_bundled(draw):
    data = _copy(BUNDLED)
    for _ in range(draw(st.integers(1, 3))):
        path = draw(st.sampled_from(PATHS))
        try:
            parent = _parent(data, path)
            parent[path[-1]]  # noqa: B018 - still there after an earlier mutation?
        except (KeyError, IndexError, TypeError):
            continue
        op = draw(st.sampled_from(["delete", "retype", "rename", "add"]))
        if op == "delete":
            del parent[path[-1]]
        elif op == "retype":
            parent[path[-1]] = draw(values)
        elif op == "rename" and isinstance(parent, dict):
            parent[draw(keys)] = parent.pop(path[-1])
        elif op == "add" and isinstance(parent[path[-1]], dict):
            parent[path[-1]][draw(keys)] = draw(values)
    return dump(data)


@fuzz(80)
@given(mutated_bundled())
def test_mutations_of_the_bundled_config(text):
    check(text)


LINES = BUNDLED_TEXT.splitlines(keepends=True)


@st.composite
def edited_lines(draw):
    """The bundled file with lines edited in place (comments and numbering kept)."""
    lines = list(LINES)
    for _ in range(draw(st.integers(1, 3))):
        i = draw(st.integers(0, len(lines) - 1))
        op = draw(st.sampled_from(["value", "delete", "duplicate", "indent", "insert"]))
        line = lines[i]
        if op == "value" and ":" in line:
            head = line.split(":", 1)[0]
            lines[i] = f"{head}: {draw(st.text(max_size=12))}\n"
        elif op == "delete":
            del lines[i]
        elif op == "duplicate":
            lines.insert(i, line)
        elif op == "indent":
            lines[i] = " " * draw(st.integers(0, 5)) + line.lstrip(" ")
        else:
            lines.insert(i, draw(st.text(max_size=30)) + "\n")
        if not lines:
            break
    return "".join(lines)


@fuzz(150)
@given(edited_lines())
def test_line_edits_of_the_bundled_file(text):
    check(text)


# ------------------------------------------------------------------- text and bytes


@fuzz(150)
@given(st.text(max_size=200))
def test_arbitrary_text(text):
    check(text)


@st.composite
def corrupted_bytes(draw):
    data = bytearray(BUNDLED_TEXT.encode())
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert"]))
        pos = draw(st.integers(0, len(data) - 1))
        if op == "flip":
            data[pos] = draw(st.integers(0, 255))
        elif op == "truncate":
            del data[pos:]
        else:
            data[pos:pos] = draw(st.binary(min_size=1, max_size=4))
        if not data:
            break
    return bytes(data)


@fuzz(120)
@given(corrupted_bytes())
def test_corrupted_files_through_validate_config(data):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hetpatrol.yaml"
        path.write_bytes(data)
        config = check(path=path)
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = cli_main(["validate-config", str(path)])
        # validate-config also refuses an enabled collector no plugin is installed for
        # (a key corrupted to "a scend": the daemon would report it failed every patrol),
        # which load_config leaves to the patrol
        installed = discover()
        refused = config is None or any(
            c.enabled and c.name not in installed for c in config.collectors
        )
        assert code == (EX_CONFIG if refused else 0), err.getvalue()
        if code == EX_CONFIG:
            assert err.getvalue().startswith(f"hetpatrol: configuration error: {path}:")


def test_examples_that_once_escaped():
    """Each of these raised something other than ConfigError, or named no line."""
    for text in (
        "1: a\nb: c\n",  # mixed key types: TypeError while sorting unknown keys
        "a: " + "[" * 5000 + "]" * 5000 + "\n",  # RecursionError in the composer
        "a: &x [*x]\n",  # recursive alias: RecursionError
        "node: a\x00b\n",  # reader error: no line
        "interval_seconds: .nan\n",  # accepted: the schedule would break
        "collectors:\n  ascend:\n    timeout_seconds: .inf\n",  # accepted: OverflowError
        "collectors:\n  1: {enabled: true}\n",  # accepted: a collector named 1
    ):
        assert check(text) is None, text
    assert check("defaults:\n  temperature_celsius: {warning: .nan}\n") is None
